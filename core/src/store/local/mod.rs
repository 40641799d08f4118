//! The local-directory store: an object is the file `<root>/<object name>`, holding
//! exactly the block's bytes (so that other tools, and vLLM's own file tiers, read the
//! same files), with its checksum in the extended attribute `user.kvtier.crc32c`.
//!
//! Why not a trailer for the checksum: a file that is exactly the block stays readable by
//! anything that reads blocks as files; on file systems without user xattrs (tmpfs before
//! Linux 6.6) a block loads with the length check and the checksums this tier remembers
//! of its own writes, which is said once in the log.
//!
//! A write goes to a temporary file in the target directory (positional writes of the
//! whole block, the checksum set on the open file) and is published by an atomic rename:
//! a crash never shows a partial block under an object's name. A conditional create
//! publishes with `renameat2(RENAME_NOREPLACE)` (or `link`, where the file system lacks
//! it), so of two writers of one key exactly one publishes. Directories are created once
//! and remembered. A read is `pread` into the file I/O thread's own buffer, piece by
//! piece, each checksummed while in cache and copied into the block inside the tier's fence
//! (a read held in the kernel past shutdown never lands in caller memory). Existence is a `stat` (a lookup batch's relative to the
//! namespace's directory, see [`ExistenceChecks`]). Writes and reads block: the store runs
//! them on the runtime's bounded pool of file I/O threads (`file_io_threads`); a `stat` takes
//! microseconds and runs where it is asked.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use object_store::local::LocalFileSystem;
use object_store::PutPayload;

use super::{DynStore, ReadBlock, WriteOutcome};
use crate::config::{FsyncPolicy, LocalConfig};
use crate::error::{Error, Result, Status};
use crate::integrity;
use crate::memory::{BlockSlot, CallerMemoryFence};
use buffer::with_io_buffer;

/// Bytes per buffered `pread`/`pwrite` of a block: small enough that the CRC and the
/// kernel's copy of a piece meet it in the core's cache (L2), so the bytes come from
/// memory once.
const PIECE: usize = 256 << 10;
/// Bytes of a file I/O thread's buffer: one O_DIRECT request, or four buffered pieces'
/// room (a buffered read or write uses PIECE of it). One per thread that has read or
/// written, so at most `file_io_threads` of them (16 MiB at the default 16).
const IO_BUFFER: usize = 1 << 20;
/// Alignment O_DIRECT needs of memory, offsets and lengths (the largest logical block
/// size in common use).
const DIRECT_ALIGN: usize = 4096;
/// Directories remembered as existing; forgotten whole when full (a cache, never a truth).
const MAX_REMEMBERED_DIRS: usize = 65_536;
/// Temporary files start with this: a [`super::TEMPORARY_START`] name, which no object has.
pub(crate) const TEMP_PREFIX: &str = ".kvtier-tmp-";
/// The start-up writability check's file starts with this, a [`super::TEMPORARY_START`] name.
const WRITE_PROBE_PREFIX: &str = ".kvtier-write-probe-";

/// The file operations of one local store.
pub(super) struct LocalFiles {
    root: PathBuf,
    o_direct: bool,
    fsync: FsyncPolicy,
    made_dirs: Mutex<HashSet<PathBuf>>,
    /// Temporary files are `<temp_stem><n>`: the prefix, this process's id, the time of this
    /// store's start and its number in the process, so that two stores of one process never
    /// pick the same name, nor a process that got a crashed one's id (as a container's
    /// processes usually do).
    temp_stem: String,
    next_temp: AtomicU64,
    /// The tier's fence on caller memory: every copy between a block and a thread's buffer
    /// happens inside it.
    caller_memory: Arc<CallerMemoryFence>,
}

/// An `object_store` client for the directory (listing, and tools that want one) and the
/// store's own file operations. The directory is created if missing.
pub(super) fn open(config: &LocalConfig) -> Result<(DynStore, Arc<LocalFiles>)> {
    let root = &config.path;
    std::fs::create_dir_all(root).map_err(|e| {
        Error::config(format!(
            "cannot create local store directory {}: {e}",
            root.display()
        ))
    })?;
    let fs = LocalFileSystem::new_with_prefix(root)
        .map_err(|e| Error::config(format!("local store {}: {e}", root.display())))?
        .with_automatic_cleanup(true);
    let files = LocalFiles {
        root: root.clone(),
        o_direct: config.o_direct,
        fsync: config.fsync,
        made_dirs: Mutex::new(HashSet::new()),
        temp_stem: format!(
            "{TEMP_PREFIX}{}-{:x}-{}-",
            std::process::id(),
            start_nonce(),
            STORES_OPENED.fetch_add(1, Ordering::Relaxed)
        ),
        next_temp: AtomicU64::new(0),
        caller_memory: Arc::default(),
    };
    Ok((Arc::new(fs), Arc::new(files)))
}

/// Local stores this process has opened (a part of their temporary files' names).
static STORES_OPENED: AtomicU64 = AtomicU64::new(0);

/// Nanoseconds of the wall clock at a store's start (0 if the clock is before 1970).
fn start_nonce() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A local store must take new files: found at start, not by the first store job.
pub(super) fn check_writable(root: &FsPath) -> Result<()> {
    use std::io::Write;
    let nonce = start_nonce();
    // A name no object can have (object names never start with a dot).
    let probe = root.join(format!(
        "{WRITE_PROBE_PREFIX}{}-{nonce}",
        std::process::id()
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut file| file.write_all(b"kvtier"));
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| {
        let denied = matches!(
            e.kind(),
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
        );
        let status = if denied {
            Status::PermissionDenied
        } else {
            Status::Config
        };
        Error::new(
            status,
            format!(
                "local store directory {} is not writable: {e}",
                root.display()
            ),
        )
    })
}

fn aligned(ptr: *const u8, len: usize) -> bool {
    (ptr as usize).is_multiple_of(DIRECT_ALIGN) && len.is_multiple_of(DIRECT_ALIGN) && len > 0
}

fn io_error(op: &str, name: &str, e: &io::Error) -> Error {
    let status = match e.kind() {
        io::ErrorKind::NotFound => Status::NotFound,
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            Status::PermissionDenied
        }
        _ => Status::Io,
    };
    Error::new(status, format!("{op} {name}: {e}"))
}

fn c_path(path: &FsPath) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

impl LocalFiles {
    pub(super) fn root(&self) -> &FsPath {
        &self.root
    }

    pub(super) fn caller_memory_fence(&self) -> Arc<CallerMemoryFence> {
        self.caller_memory.clone()
    }

    fn file_path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Creates `dir` (and its parents) unless this store already did.
    ///
    /// Top-down from the nearest directory known to exist: a new key's two layout
    /// directories cost two `mkdir`s, not the three of `create_dir_all` (which tries the
    /// deepest first and fails with ENOENT). `known_missing`: `dir` was removed under the
    /// cache (by `kvtier gc`, or by hand), so no cached ancestor is trusted either.
    fn ensure_dir(&self, dir: &FsPath, known_missing: bool) -> io::Result<()> {
        let missing: Vec<&FsPath> = {
            let made = self.made_dirs.lock().unwrap_or_else(|p| p.into_inner());
            dir.ancestors()
                .take_while(|d| *d != self.root && (known_missing || !made.contains(*d)))
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        if known_missing {
            make_dir(&self.root, dir)?;
        } else {
            // A cached ancestor that was removed makes its child's mkdir fail with ENOENT:
            // make_dir then makes the chain.
            for d in missing.iter().rev() {
                make_dir(&self.root, d)?;
            }
        }
        let mut made = self.made_dirs.lock().unwrap_or_else(|p| p.into_inner());
        if made.len() + missing.len() > MAX_REMEMBERED_DIRS {
            made.clear();
        }
        made.extend(missing.iter().map(|d| d.to_path_buf()));
        Ok(())
    }

    /// Opens a new temporary file beside `target`, with O_DIRECT when asked and allowed.
    fn create_temp(&self, target: &FsPath, direct: bool) -> io::Result<(File, PathBuf, bool)> {
        // A name taken anyway (a file left by something else) costs another number, a few
        // times at most.
        const ATTEMPTS: usize = 8;
        let dir = target.parent().unwrap_or(&self.root);
        self.ensure_dir(dir, false)?;
        let mut attempt = 0;
        loop {
            let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
            let temp = dir.join(format!("{}{n}", self.temp_stem));
            let open = |direct: bool| {
                let mut options = std::fs::OpenOptions::new();
                options.write(true).create_new(true).mode(0o644);
                if direct {
                    options.custom_flags(libc::O_DIRECT);
                }
                options.open(&temp)
            };
            let mut opened = open(direct);
            // The directory was removed under the cache (by `kvtier gc` or an eviction
            // emptying it, or by hand), maybe again right after it was made.
            for _ in 0..ATTEMPTS {
                match &opened {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        self.ensure_dir(dir, true)?;
                        opened = open(direct);
                    }
                    _ => break,
                }
            }
            return match opened {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt + 1 < ATTEMPTS => {
                    attempt += 1;
                    continue;
                }
                // The file system refuses O_DIRECT (tmpfs): buffered instead.
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    warn_no_direct(&e);
                    Ok((open(false)?, temp, false))
                }
                Ok(file) => Ok((file, temp, direct)),
                Err(e) => Err(e),
            };
        }
    }

    /// Writes one block under `name`; see the module comment. With `checksum`, its CRC32C
    /// is computed here, piece by piece just before each piece is written (while it is in
    /// cache), recorded on the file, and returned. Blocks the calling thread.
    pub(super) fn write(
        &self,
        name: &str,
        body: &PutPayload,
        checksum: bool,
        create: bool,
    ) -> Result<(WriteOutcome, Option<u32>)> {
        let target = self.file_path(name);
        let direct = self.o_direct && body.iter().all(|p| aligned(p.as_ptr(), p.len()));
        let (file, temp, _) = self
            .create_temp(&target, direct)
            .map_err(|e| io_error("store", name, &e))?;
        let published =
            fill(&file, body, checksum, direct, &self.caller_memory, name).and_then(|crc| {
                self.publish_filled(&file, &temp, &target, crc, create)
                    .map(|outcome| (outcome, crc))
                    .map_err(|e| io_error("store", name, &e))
            });
        if !matches!(published, Ok((WriteOutcome::Stored, _))) {
            let _ = std::fs::remove_file(&temp);
        }
        published
    }

    /// Records `crc` on the filled temporary file, syncs as configured, and publishes it.
    fn publish_filled(
        &self,
        file: &File,
        temp: &FsPath,
        target: &FsPath,
        crc: Option<u32>,
        create: bool,
    ) -> io::Result<WriteOutcome> {
        if let Some(crc) = crc {
            integrity::set_file_checksum_fd(file, crc);
        }
        if self.fsync != FsyncPolicy::None {
            file.sync_data()?;
        }
        let outcome = if create {
            publish_new(temp, target)?
        } else {
            publish(temp, target)?
        };
        if outcome == WriteOutcome::Stored && self.fsync == FsyncPolicy::Full {
            File::open(target.parent().unwrap_or(&self.root))?.sync_all()?;
        }
        Ok(outcome)
    }

    /// Reads the block stored under `name` into `dest`, which the file must fill exactly.
    /// Blocks the calling thread.
    ///
    /// The file is read into this thread's own buffer ([`with_io_buffer`]) a piece at a
    /// time, each piece checksummed there while it is in cache and then copied into `dest`
    /// inside the tier's fence ([`BlockSlot::copy_in`]): a read the kernel holds (a hung
    /// NFS mount, a failing disk) past shutdown's grace period lands in the thread's buffer
    /// when it returns, never in the caller's memory. The copy costs a memcpy of data in
    /// cache (docs/reliability.md#shutdown).
    pub(super) fn read(
        &self,
        name: &str,
        dest: &mut BlockSlot,
        checksum: bool,
    ) -> Result<ReadBlock> {
        let path = self.file_path(name);
        // As documented for `o_direct`: blocks whose memory and size are aligned (the reads
        // themselves go to the thread's buffer, which always is).
        let direct = self.o_direct && dest.aligned(DIRECT_ALIGN);
        let open = |direct: bool| {
            let mut options = std::fs::OpenOptions::new();
            options.read(true);
            if direct {
                options.custom_flags(libc::O_DIRECT);
            }
            options.open(&path)
        };
        let (file, direct) = match open(direct) {
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                warn_no_direct(&e);
                (open(false), false)
            }
            other => (other, direct),
        };
        let file = file.map_err(|e| io_error("load", name, &e))?;
        let size = file
            .metadata()
            .map_err(|e| io_error("load", name, &e))?
            .len();
        if size != dest.len() as u64 {
            return Err(Error::new(
                Status::LengthMismatch,
                format!(
                    "load {name}: object holds {size} bytes but blocks are {} bytes",
                    dest.len()
                ),
            ));
        }
        let recorded = integrity::file_checksum(&file);
        // O_DIRECT reads IO_BUFFER bytes per request (the device is the bottleneck, and
        // the requests stay aligned: the buffer is, and so is the block's length); buffered
        // reads go PIECE by PIECE, each checksummed and copied while it is in cache.
        let piece_len = if direct { IO_BUFFER } else { PIECE };
        let total = dest.len();
        let crc = with_io_buffer(|buffer| {
            let mut crc = 0u32;
            let mut done = 0usize;
            while done < total {
                let want = piece_len.min(total - done);
                let n = match file.read_at(&mut buffer[..want], done as u64) {
                    Ok(0) => {
                        return Err(Error::new(
                            Status::LengthMismatch,
                            format!("load {name}: object shorter than {total} bytes"),
                        ))
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io_error("load", name, &e)),
                };
                if checksum {
                    crc = integrity::checksum_append(crc, &buffer[..n]);
                }
                dest.copy_in(done, &buffer[..n]).map_err(|_| {
                    Error::new(
                        Status::Cancelled,
                        format!("load {name}: the tier shut down during the read"),
                    )
                })?;
                done += n;
            }
            Ok(crc)
        })?;
        Ok(ReadBlock {
            recorded,
            computed: checksum.then_some(crc),
        })
    }

    /// Existence checks of one lookup batch (see [`ExistenceChecks`]).
    pub(super) fn existence_checks(&self) -> ExistenceChecks<'_> {
        ExistenceChecks {
            files: self,
            dirs: HashMap::new(),
        }
    }

    /// Whether a block is stored under `name`: a `stat`, microseconds on a warm dentry
    /// cache, so it runs inline rather than paying a thread hop.
    pub(super) fn exists(&self, name: &str) -> Result<bool> {
        match std::fs::metadata(self.file_path(name)) {
            Ok(meta) => Ok(meta.is_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            // A file where a directory of the layout should be: the store is damaged, which
            // is neither "found" nor "absent" (the check fails, and its request's keys MISS).
            Err(e) => Err(io_error("exists", name, &e)),
        }
    }

    /// Deletes the block stored under `name`.
    pub(super) fn delete(&self, name: &str) -> Result<()> {
        std::fs::remove_file(self.file_path(name)).map_err(|e| io_error("delete", name, &e))
    }
}

/// The existence checks of one lookup batch. A key's `stat` is relative to its namespace's
/// directory (the one holding the `hex[:3]` shards), opened once per batch with `O_PATH`:
/// the kernel then walks the two shard levels and the file name instead of the whole path,
/// which is most of a `stat`'s cost (256 keys, half present: 0.94 ms by absolute path, 0.58
/// ms relative, medians on this machine). Opened per batch and closed with it, never
/// cached, so a directory removed and made again under the store (`kvtier gc`, by hand) is
/// never looked at through a stale descriptor. A missing namespace directory answers
/// "absent" for all its keys without a further call.
pub(crate) struct ExistenceChecks<'a> {
    files: &'a LocalFiles,
    /// Per namespace directory (relative to the root): open, missing (`None`), or failing
    /// to open (the error's `errno`).
    dirs: HashMap<String, std::result::Result<Option<OwnedFd>, i32>>,
}

impl ExistenceChecks<'_> {
    /// Whether a block is stored under `name`, as [`LocalFiles::exists`] answers it.
    pub(crate) fn exists(&mut self, name: &str) -> Result<bool> {
        // A block is `<namespace>/<shard>/<shard>_g<group>/<file>`; the namespace may be
        // empty (the root) or several levels.
        let mut parts = name.rsplitn(4, '/');
        let (file, shard2, shard1) = (parts.next(), parts.next(), parts.next());
        let (Some(file), Some(shard2), Some(shard1)) = (file, shard2, shard1) else {
            return self.files.exists(name);
        };
        let namespace = parts.next().unwrap_or("");
        let relative = &name[name.len() - file.len() - shard2.len() - shard1.len() - 2..];
        let root = &self.files.root;
        let dir = self
            .dirs
            .entry(namespace.to_owned())
            .or_insert_with(|| open_dir(&root.join(namespace)));
        let fd = match dir {
            Ok(Some(fd)) => fd.as_raw_fd(),
            Ok(None) => return Ok(false),
            Err(errno) => {
                return Err(io_error(
                    "exists",
                    name,
                    &io::Error::from_raw_os_error(*errno),
                ))
            }
        };
        let relative = c_path(FsPath::new(relative)).map_err(|e| io_error("exists", name, &e))?;
        // SAFETY: `stat` is plain old data that `fstatat` fills; `fd` is an open directory
        // this batch owns and `relative` a NUL-terminated path, both alive for the call.
        let (found, st) = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            let rc = libc::fstatat(fd, relative.as_ptr(), &mut st, 0);
            (rc == 0, st)
        };
        if found {
            return Ok(st.st_mode & libc::S_IFMT == libc::S_IFREG);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::NotFound => Ok(false),
            // A file where a directory of the layout should be: the store is damaged, which
            // is neither "found" nor "absent" (the check fails, and its request's keys MISS).
            _ => Err(io_error("exists", name, &e)),
        }
    }
}

/// `dir` opened for path lookups only: `None` if it does not exist.
fn open_dir(dir: &FsPath) -> std::result::Result<Option<OwnedFd>, i32> {
    let path = c_path(dir).map_err(|_| libc::EINVAL)?;
    // SAFETY: `path` is NUL-terminated and alive for the call; a descriptor it returns is
    // owned by the `OwnedFd` alone.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: `fd` was just opened and nothing else holds it.
        return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::NotFound => Ok(None),
        _ => Err(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// Writes `body` at the start of `file`, its pieces one after the other; with `checksum`,
/// returns its CRC32C. The pieces are gathered into this thread's buffer (inside the tier's
/// fence: a write the kernel holds past shutdown reads that buffer, never the caller's
/// memory) and written from it, PIECE by PIECE when buffered (each checksummed there while
/// in cache), IO_BUFFER bytes per request with O_DIRECT (the device reads them by DMA).
/// Once shutdown has closed the fence, the write stops (`Cancelled`).
fn fill(
    file: &File,
    body: &PutPayload,
    checksum: bool,
    direct: bool,
    fence: &CallerMemoryFence,
    name: &str,
) -> Result<Option<u32>> {
    let step = if direct { IO_BUFFER } else { PIECE };
    with_io_buffer(|buffer| {
        let write = |bytes: &[u8], at: u64| {
            file.write_all_at(bytes, at)
                .map_err(|e| io_error("store", name, &e))
        };
        let mut crc = 0u32;
        let (mut at, mut held) = (0u64, 0usize);
        for piece in body.iter().flat_map(|part| part.chunks(step)) {
            if held + piece.len() > step {
                write(&buffer[..held], at)?;
                at += held as u64;
                held = 0;
            }
            let gathered = &mut buffer[held..held + piece.len()];
            {
                let _inside = fence.enter().ok_or_else(|| {
                    Error::new(
                        Status::Cancelled,
                        format!("store {name}: the tier shut down during the write"),
                    )
                })?;
                gathered.copy_from_slice(piece);
            }
            if checksum {
                crc = integrity::checksum_append(crc, gathered);
            }
            held += piece.len();
        }
        if held > 0 {
            write(&buffer[..held], at)?;
        }
        Ok(checksum.then_some(crc))
    })
}

/// Publishes `temp` as `target`, replacing what was there.
fn publish(temp: &FsPath, target: &FsPath) -> io::Result<WriteOutcome> {
    std::fs::rename(temp, target)?;
    Ok(WriteOutcome::Stored)
}

/// Publishes `temp` as `target` unless `target` exists.
fn publish_new(temp: &FsPath, target: &FsPath) -> io::Result<WriteOutcome> {
    let (from, to) = (c_path(temp)?, c_path(target)?);
    // SAFETY: two NUL-terminated paths that outlive the call; AT_FDCWD with absolute or
    // cwd-relative paths, as `rename` would use them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(WriteOutcome::Stored);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => Ok(WriteOutcome::AlreadyStored),
        // No RENAME_NOREPLACE on this file system: a hard link refuses an existing name
        // just as atomically.
        Some(libc::EINVAL | libc::ENOSYS) => {
            let linked = std::fs::hard_link(temp, target);
            let _ = std::fs::remove_file(temp);
            match linked {
                Ok(()) => Ok(WriteOutcome::Stored),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    Ok(WriteOutcome::AlreadyStored)
                }
                Err(e) => Err(e),
            }
        }
        _ => Err(e),
    }
}

fn warn_no_direct(e: &io::Error) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        log::warn!("the local store's file system refuses O_DIRECT ({e}); using buffered I/O")
    });
}

impl std::fmt::Debug for LocalFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalFiles")
            .field("root", &self.root)
            .field("o_direct", &self.o_direct)
            .finish()
    }
}

/// Makes `dir` and whatever ancestors below `root` it lacks. Other processes delete
/// directories here at any moment (`kvtier gc` and eviction remove a directory they empty),
/// so a directory found existing may be gone the next instant, and a parent just made may
/// be removed before its child is: each such loss is made good again, a few times at most.
fn make_dir(root: &FsPath, dir: &FsPath) -> io::Result<()> {
    const ATTEMPTS: usize = 8;
    let mut last = None;
    for _ in 0..ATTEMPTS {
        match std::fs::create_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if dir.is_dir() {
                    return Ok(());
                }
                last = Some(e); // removed between the mkdir and the check, or not a directory
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match dir.parent().filter(|p| *p != root && p.starts_with(root)) {
                    Some(parent) => make_dir(root, parent)?,
                    None => return Err(e), // the root itself is missing
                }
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("the directory could not be made")))
}

mod buffer;
#[cfg(test)]
mod tests;
