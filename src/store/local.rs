//! The local-directory store: object names are file paths under a root directory.

use std::path::Path as FsPath;
use std::sync::Arc;

use object_store::local::LocalFileSystem;

use super::DynStore;
use crate::error::{Error, Result, Status};

/// A client for the directory `root`, created if missing. Writes publish atomically by
/// rename, so a crash never leaves a partial block under an object's name.
pub(super) fn open(root: &FsPath) -> Result<DynStore> {
    std::fs::create_dir_all(root)
        .map_err(|e| Error::config(format!("cannot create local store directory {}: {e}", root.display())))?;
    let fs = LocalFileSystem::new_with_prefix(root)
        .map_err(|e| Error::config(format!("local store {}: {e}", root.display())))?
        .with_automatic_cleanup(true);
    Ok(Arc::new(fs))
}

/// A local store must take new files: found at start, not by the first store job.
pub(super) fn check_writable(root: &FsPath) -> Result<()> {
    use std::io::Write;
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    // A name no object can have (object names never start with a dot).
    let probe = root.join(format!(".kvtier-write-probe-{}-{nonce}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut file| file.write_all(b"kvtier"));
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| {
        let denied = matches!(e.kind(), std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem);
        let status = if denied { Status::PermissionDenied } else { Status::Config };
        Error::new(status, format!("local store directory {} is not writable: {e}", root.display()))
    })
}
