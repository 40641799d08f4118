//! How `include/kvtier.h` is made from the sources: cbindgen with `cbindgen.toml`, plus
//! the version macros from Cargo.toml. Used by `tests/header.rs`, which fails when the
//! committed header differs and rewrites it when `KVTIER_UPDATE_HEADER` is set. Building
//! the crate never runs cbindgen.

use std::path::Path;

/// The header text cbindgen generates for the crate at `crate_dir`, version `version`
/// (`major.minor.patch`).
pub fn generate_header(crate_dir: &Path, version: &str) -> String {
    let mut parts = version.split('.');
    let mut part = || parts.next().unwrap_or("0").to_string();
    let (major, minor, patch) = (part(), part(), part());
    let mut config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    config.after_includes = Some(format!(
        "\n#define KVTIER_VERSION_MAJOR {major}\n#define KVTIER_VERSION_MINOR {minor}\n#define KVTIER_VERSION_PATCH {patch}\n#define KVTIER_VERSION \"{version}\"\n"
    ));
    let header = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    header.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}
