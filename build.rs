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
    // would otherwise be exported too. Symbols from dependency archives become local.
    println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
    let include = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("include");
    println!("cargo:include={}", include.display());
    println!("cargo:rerun-if-changed=build.rs");
}
