//! The committed header must be exactly what cbindgen generates from the sources.

#[test]
fn committed_header_matches_cbindgen_output() {
    let generated = std::fs::read_to_string(concat!(env!("OUT_DIR"), "/kvtier.h")).expect("build.rs writes the header");
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kvtier.h"))
        .expect("include/kvtier.h is committed");
    assert!(
        generated == committed,
        "include/kvtier.h is stale: regenerate it with `KVTIER_UPDATE_HEADER=1 cargo build` and commit it"
    );
}

#[test]
fn header_version_macros_match_cargo_toml() {
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kvtier.h")).unwrap();
    for (macro_name, value) in [
        ("KVTIER_VERSION_MAJOR", env!("CARGO_PKG_VERSION_MAJOR").to_string()),
        ("KVTIER_VERSION_MINOR", env!("CARGO_PKG_VERSION_MINOR").to_string()),
        ("KVTIER_VERSION_PATCH", env!("CARGO_PKG_VERSION_PATCH").to_string()),
        ("KVTIER_VERSION", format!("\"{}\"", env!("CARGO_PKG_VERSION"))),
    ] {
        let line = format!("#define {macro_name} {value}\n");
        assert!(committed.contains(&line), "header lacks `{}`", line.trim());
    }
    let version = unsafe { std::ffi::CStr::from_ptr(kvtier::ffi::kvt_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn every_exported_function_is_documented_in_the_header() {
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kvtier.h")).unwrap();
    let lines: Vec<&str> = committed.lines().collect();
    let mut functions = 0;
    for (i, line) in lines.iter().enumerate() {
        let is_decl = line.contains(" kvt_") && line.contains('(') && !line.trim_start().starts_with("//");
        if is_decl && !line.starts_with(' ') {
            functions += 1;
            assert!(
                i > 0 && lines[i - 1].trim_start().starts_with("//"),
                "function declared without documentation: {line}"
            );
        }
    }
    assert!(functions >= 10, "found only {functions} functions in the header");
}
