//! Where the tests find what they run: the repository, the `kvtier` command line of this
//! build, and the server binaries and scripts (`tools/`, `$KVTIER_…`, `PATH`). A missing one
//! fails the test with a message naming the install script; it is never a silent skip.

use std::path::{Path, PathBuf};

/// The repository's root (the workspace's), whichever of its crates runs the test.
pub fn manifest_dir() -> PathBuf {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .find(|dir| dir.join("scripts/test.sh").is_file())
        .unwrap_or(&crate_dir)
        .to_path_buf()
}

/// The `kvtier` command line of this build (`target/<profile>/kvtier`, beside the test's own
/// `deps/` directory). The README's test command (`cargo test --workspace`) builds it with
/// the command line's own tests before any test runs; a test of another crate run alone
/// needs `cargo build -p kvtier-cli` first, and is told so.
pub fn kvtier_cli() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("tests run from target/<profile>/deps");
    let cli = profile_dir.join("kvtier");
    assert!(
        cli.is_file(),
        "{} not found: build the command line first (`cargo build --release -p kvtier-cli`), \
         or run the whole workspace's tests (`cargo test --release --workspace`)",
        cli.display()
    );
    cli
}

/// `scripts/ceph-rgw.sh`, which sets up and runs a small Ceph cluster (three memstore OSDs, two
/// radosgw gateways).
pub fn ceph_rgw_script() -> PathBuf {
    let script = manifest_dir().join("scripts/ceph-rgw.sh");
    for binary in ["radosgw", "ceph-mon", "ceph-osd", "radosgw-admin"] {
        assert!(
            find_in_path(binary).is_some(),
            "{binary} not found in PATH: run `{} install` or {} (the RGW tests need a real Ceph RGW and never skip)",
            script.display(),
            install_hint()
        );
    }
    script
}

/// What to run when a server binary is missing.
pub(super) fn install_hint() -> String {
    format!(
        "run `{}/scripts/install-tools.sh` (the S3 tests need real servers and never skip)",
        manifest_dir().display()
    )
}

/// The s3s-fs binary: `$KVTIER_S3S_FS`, else `tools/bin/s3s-fs`.
pub fn s3s_fs_bin() -> PathBuf {
    if let Some(p) = from_env("KVTIER_S3S_FS") {
        return p;
    }
    let p = manifest_dir().join("tools/bin/s3s-fs");
    assert!(
        p.is_file(),
        "s3s-fs not found at {} (nor $KVTIER_S3S_FS); {}",
        p.display(),
        install_hint()
    );
    p
}

/// The moto_server binary: `$KVTIER_MOTO_SERVER`, else `tools/venv/bin/moto_server`, else `PATH`.
/// The Python that runs moto_server: `$KVTIER_MOTO_PYTHON`, else the interpreter named by
/// moto_server's `#!` line, else `python3` on PATH.
pub fn moto_python() -> PathBuf {
    if let Some(p) = from_env("KVTIER_MOTO_PYTHON") {
        return p;
    }
    let script = std::fs::read_to_string(moto_bin()).unwrap_or_default();
    if let Some(interpreter) = script
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("#!"))
        .map(str::trim)
        .filter(|path| path.contains("python") && !path.contains(' '))
    {
        return PathBuf::from(interpreter);
    }
    find_in_path("python3").unwrap_or_else(|| panic!("no python3 to run moto_server with"))
}

pub fn moto_bin() -> PathBuf {
    if let Some(p) = from_env("KVTIER_MOTO_SERVER") {
        return p;
    }
    let venv = manifest_dir().join("tools/venv/bin/moto_server");
    if venv.is_file() {
        return venv;
    }
    if let Some(p) = find_in_path("moto_server") {
        return p;
    }
    panic!(
        "moto_server not found (looked at $KVTIER_MOTO_SERVER, {}, PATH); {}",
        venv.display(),
        install_hint()
    );
}

/// The binary an environment variable names, if it is set; it must then be a file.
fn from_env(variable: &str) -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var(variable).ok()?);
    assert!(
        p.is_file(),
        "{variable}={} is not a file; {}",
        p.display(),
        install_hint()
    );
    Some(p)
}

pub fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}
