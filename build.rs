//! Generates the C header into OUT_DIR (the committed `include/kvtier.h` is checked against
//! it by the tests) and sets the shared library's SONAME.

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
    let patch = std::env::var("CARGO_PKG_VERSION_PATCH").unwrap_or_default();
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();

    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    config.after_includes = Some(format!(
        "\n#define KVTIER_VERSION_MAJOR {major}\n#define KVTIER_VERSION_MINOR {minor}\n#define KVTIER_VERSION_PATCH {patch}\n#define KVTIER_VERSION \"{version}\"\n"
    ));
    let header = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    header.write_to_file(out_dir.join("kvtier.h"));
    if std::env::var_os("KVTIER_UPDATE_HEADER").is_some() {
        header.write_to_file(crate_dir.join("include/kvtier.h"));
    }

    // Consumers link against libkvtier.so.<major>; dlclose() must not unmap a library
    // whose threads and thread-locals may still be alive.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvtier.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // Export the kvt_ API only: object_store's crc-fast dependency builds its C API (a
    // default feature that cannot be turned off from here), whose crc_fast_* functions
    // would otherwise be exported too. Symbols from dependency archives become local.
    println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
    println!("cargo:include={}", crate_dir.join("include").display());
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=KVTIER_UPDATE_HEADER");
}
