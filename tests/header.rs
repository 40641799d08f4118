//! The committed header must be exactly what cbindgen generates from the sources.

#[path = "../include/generate.rs"]
mod generate;

#[test]
fn committed_header_matches_cbindgen_output() {
    let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated = generate::generate_header(crate_dir, env!("CARGO_PKG_VERSION"));
    let path = crate_dir.join("include/kvtier.h");
    if std::env::var_os("KVTIER_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("include/kvtier.h is writable");
    }
    let committed = std::fs::read_to_string(&path).expect("include/kvtier.h is committed");
    assert!(
        generated == committed,
        "include/kvtier.h is stale: regenerate it with `KVTIER_UPDATE_HEADER=1 cargo test --release --test header` and commit it"
    );
}

/// `kvt_stats` in the header lists the counters of `STATS_FIELDS`, in order, each with
/// its help text as the comment above it.
#[test]
fn header_stats_struct_follows_the_counter_list() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kvtier.h")).unwrap();
    let start = committed
        .find("typedef struct kvt_stats {")
        .expect("the header defines kvt_stats");
    let end = start + committed[start..].find("} kvt_stats;").unwrap();
    let mut fields = Vec::new();
    let mut comment = String::new();
    for line in committed[start..end].lines().skip(1) {
        let line = line.trim();
        if let Some(text) = line.strip_prefix("//") {
            comment.push_str(if comment.is_empty() { "" } else { " " });
            comment.push_str(text.trim());
        } else if let Some(name) = line
            .strip_prefix("uint64_t ")
            .and_then(|l| l.strip_suffix(';'))
        {
            fields.push((name.to_string(), std::mem::take(&mut comment)));
        }
    }
    let expected: Vec<(String, String)> = kvtier_core::STATS_FIELDS
        .iter()
        .map(|f| (f.name.to_string(), f.help.to_string()))
        .collect();
    assert_eq!(fields, expected);
}

#[test]
fn header_version_macros_match_cargo_toml() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kvtier.h")).unwrap();
    for (macro_name, value) in [
        (
            "KVTIER_VERSION_MAJOR",
            env!("CARGO_PKG_VERSION_MAJOR").to_string(),
        ),
        (
            "KVTIER_VERSION_MINOR",
            env!("CARGO_PKG_VERSION_MINOR").to_string(),
        ),
        (
            "KVTIER_VERSION_PATCH",
            env!("CARGO_PKG_VERSION_PATCH").to_string(),
        ),
        (
            "KVTIER_VERSION",
            format!("\"{}\"", env!("CARGO_PKG_VERSION")),
        ),
    ] {
        let line = format!("#define {macro_name} {value}\n");
        assert!(committed.contains(&line), "header lacks `{}`", line.trim());
    }
    let version = unsafe { std::ffi::CStr::from_ptr(kvtier::kvt_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn every_exported_function_is_documented_in_the_header() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kvtier.h")).unwrap();
    let lines: Vec<&str> = committed.lines().collect();
    let mut functions = 0;
    for (i, line) in lines.iter().enumerate() {
        let is_decl =
            line.contains(" kvt_") && line.contains('(') && !line.trim_start().starts_with("//");
        if is_decl && !line.starts_with(' ') {
            functions += 1;
            assert!(
                i > 0 && lines[i - 1].trim_start().starts_with("//"),
                "function declared without documentation: {line}"
            );
        }
    }
    assert!(
        functions >= 10,
        "found only {functions} functions in the header"
    );
}

/// Every name the header declares carries the library's prefix (`kvt_` for types and
/// functions, `KVT_`/`KVTIER_` for macros and enumerators), and no Rust doc-link syntax
/// leaks into its comments.
#[test]
fn every_header_name_is_prefixed_and_comments_are_plain() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kvtier.h")).unwrap();
    let mut bad = Vec::new();
    let mut in_enum = false;
    for (i, line) in committed.lines().enumerate() {
        let trimmed = line.trim_start();
        let n = i + 1;
        if trimmed.starts_with("//") || trimmed.starts_with("/*") || trimmed.starts_with('*') {
            if trimmed.contains("[`") || trimmed.contains("`]") || trimmed.contains("](") {
                bad.push(format!("{n}: doc-link syntax in a comment: {line}"));
            }
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("#define ") {
            let name = rest.split_whitespace().next().unwrap_or("");
            if !(name.starts_with("KVT_") || name.starts_with("KVTIER_")) {
                bad.push(format!("{n}: macro {name} lacks the KVT_ prefix"));
            }
        }
        for keyword in ["typedef enum ", "typedef struct ", "enum ", "struct "] {
            if let Some(rest) = trimmed.strip_prefix(keyword) {
                let name = rest
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or("");
                if !name.is_empty() && !name.starts_with("kvt_") {
                    bad.push(format!("{n}: type {name} lacks the kvt_ prefix"));
                }
                break;
            }
        }
        if trimmed.starts_with("typedef enum ") {
            in_enum = true;
            continue;
        }
        if in_enum {
            if trimmed.starts_with('}') {
                in_enum = false;
            } else if let Some(name) = trimmed
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
            {
                if !name.is_empty() && !name.starts_with("KVT_") {
                    bad.push(format!("{n}: enumerator {name} lacks the KVT_ prefix"));
                }
            }
        }
        if !line.starts_with(' ') && line.contains('(') && line.trim_end().ends_with([',', ';']) {
            let before = &line[..line.find('(').unwrap()];
            let name = before
                .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("");
            if !name.is_empty() && !name.starts_with("kvt_") && !name.starts_with("KVT_") {
                bad.push(format!("{n}: function {name} lacks the kvt_ prefix"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "header names break the prefix rule:\n{}",
        bad.join("\n")
    );
}

/// Every function kvtier.h exports has a C++ wrapper in kvtier.hpp: a `kvtier_core::Api`
/// field (`decltype(&::kvt_x) field`), set in `Api::linked()`, resolved by name in
/// `Api::from_handle()`, required by `Api::complete()`, and called (`api_.field(` or
/// `api.field(`) by a wrapper outside the `Api` struct. Fails naming each function that
/// lacks any of these.
#[test]
fn every_exported_function_has_a_cpp_wrapper() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let header = std::fs::read_to_string(format!("{dir}/include/kvtier.h")).unwrap();
    let hpp = std::fs::read_to_string(format!("{dir}/include/kvtier.hpp")).unwrap();
    let mut functions = Vec::new();
    for line in header.lines() {
        let trimmed = line.trim_start();
        if line.starts_with(' ') || trimmed.starts_with("//") || trimmed.starts_with('#') {
            continue;
        }
        if trimmed.starts_with("typedef") {
            continue; // kvt_log_callback and the other types
        }
        let Some(paren) = line.find('(') else {
            continue;
        };
        let name = line[..paren]
            .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        if name.starts_with("kvt_") && !functions.iter().any(|f| f == name) {
            functions.push(name.to_string());
        }
    }
    assert!(
        functions.len() >= 20,
        "found only {} functions in kvtier.h: {functions:?}",
        functions.len()
    );
    // The Api struct's body, and the rest of the file (where the wrappers live).
    let api_start = hpp
        .find("struct Api {")
        .expect("kvtier.hpp defines struct Api");
    let api_end = api_start + hpp[api_start..].find("\n};").expect("struct Api ends");
    let api_body = &hpp[api_start..api_end];
    let wrappers = format!("{}{}", &hpp[..api_start], &hpp[api_end..]);
    let complete_start = api_body
        .find("bool complete()")
        .expect("Api::complete exists");
    let complete = &api_body[complete_start..][..api_body[complete_start..].find('}').unwrap()];
    let mut missing = Vec::new();
    for f in &functions {
        let decl = format!("decltype(&::{f}) ");
        let Some(at) = api_body.find(&decl) else {
            missing.push(format!(
                "{f}: no `decltype(&::{f})` field in kvtier_core::Api"
            ));
            continue;
        };
        let field: String = api_body[at + decl.len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let mut lacks = Vec::new();
        if !api_body.contains(&format!("a.{field} = &::{f};")) {
            lacks.push("not set in Api::linked()");
        }
        if !api_body.contains(&format!("resolve(handle, \"{f}\", a.{field});")) {
            lacks.push("not resolved in Api::from_handle()");
        }
        let in_complete = complete
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == field);
        if !in_complete {
            lacks.push("not required by Api::complete()");
        }
        if !wrappers.contains(&format!("api_.{field}("))
            && !wrappers.contains(&format!("api.{field}("))
        {
            lacks.push("no wrapper calls it");
        }
        if !lacks.is_empty() {
            missing.push(format!("{f} (Api::{field}): {}", lacks.join(", ")));
        }
    }
    assert!(
        missing.is_empty(),
        "kvtier.hpp does not wrap every export of kvtier.h:\n{}",
        missing.join("\n")
    );
}
