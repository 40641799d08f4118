//! Link settings of the shared library. The C header is not generated here: it is
//! committed in `include/`, and `tests/header.rs` keeps it in step with the sources.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    // Consumers link against libkvtier.so.<major>; dlclose() must not unmap a library
    // whose threads and thread-locals may still be alive.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvtier.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // Export the kvt_ API only: object_store's crc-fast dependency builds its C API (a
    // default feature that cannot be turned off from here), whose crc_fast_* functions
    // rustc would otherwise export too (its own version script names them).
    let manifest_dir =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    if linked_by_zig() {
        // The release wheels (scripts/build-wheel.sh) are linked by `zig cc` against an old
        // glibc. zig refuses --exclude-libs, and of several version scripts it keeps the
        // last: this one, listed after rustc's, is the export list.
        let map = manifest_dir.join("src/exports.map");
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
            map.display()
        );
        println!("cargo:rerun-if-changed={}", map.display());
    } else {
        // GNU ld and lld merge version scripts (rustc's list would still export
        // crc_fast_*), so here symbols from dependency archives become local instead.
        println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
    }
    let include = manifest_dir.join("include");
    println!("cargo:include={}", include.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
}

/// Whether the library is linked by `zig cc` (cargo-zigbuild names its linker wrapper
/// `zigcc-<target>-….sh` and hands it to cargo as the target's linker).
fn linked_by_zig() -> bool {
    std::env::var("RUSTC_LINKER")
        .map(|linker| {
            std::path::Path::new(&linker)
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("zigcc"))
        })
        .unwrap_or(false)
}
