//! Files whose reads the kernel holds until the test lets them go: a FUSE file system served
//! by the test itself through /dev/fuse (the kernel's protocol, no libfuse), mounted with
//! mount(2). A read of one of its files waits in the kernel for the server's answer, as a
//! read of a hung NFS mount or a failing disk waits; the server holds every READ until
//! [`HeldFiles::release`], then answers it (and every later one) with the files' bytes.
//!
//! Needs root and /dev/fuse (the project's CI machines have both). Where either is missing
//! the test fails, saying which: a hold that cannot be made is never a silent pass.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_RELEASE: u32 = 18;
const FUSE_GETXATTR: u32 = 22;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_BATCH_FORGET: u32 = 42;
/// fuse_init_out's FUSE_ASYNC_READ: reads of several files go out at once.
const FUSE_ASYNC_READ: u32 = 1;
/// fuse_open_out's FOPEN_DIRECT_IO: every read reaches the server (no page cache).
const FOPEN_DIRECT_IO: u32 = 1;
/// Largest READ the kernel sends (its default max_pages of 32).
const MAX_READ: usize = 128 << 10;
const ROOT: u64 = 1;

/// What the server has seen, and whether reads are let go.
#[derive(Default)]
struct Seen {
    released: bool,
    /// READs answered by nobody yet: (unique, bytes asked, node, offset).
    held: Vec<(u64, u32, u64, u64)>,
    /// Every READ that reached the server, held or not.
    reads: usize,
    /// Files closed (RELEASE): a reader that got its answer and went on.
    closes: usize,
}

/// The mounted file system: `files` files `0`, `1`, … of `file_bytes` bytes, each byte of
/// file `i` equal to `fill(i)`.
pub struct HeldFiles {
    mount: PathBuf,
    fuse: Arc<File>,
    seen: Arc<(Mutex<Seen>, Condvar)>,
    file_bytes: usize,
}

pub fn fill(file: u64) -> u8 {
    0xA0 + file as u8
}

impl HeldFiles {
    /// Mounts the file system on `mount` (an empty directory).
    pub fn mount(mount: &Path, files: u64, file_bytes: usize) -> HeldFiles {
        let fuse = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap_or_else(|e| {
                panic!("this test holds reads in the kernel through FUSE and needs /dev/fuse: {e}")
            });
        let target = CString::new(mount.as_os_str().as_encoded_bytes()).unwrap();
        let options = CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            fuse.as_raw_fd()
        ))
        .unwrap();
        // SAFETY: NUL-terminated strings alive for the call.
        let rc = unsafe {
            libc::mount(
                c"kvtier-held".as_ptr(),
                target.as_ptr(),
                c"fuse.kvtier-held".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mounting the test's FUSE file system needs root (CAP_SYS_ADMIN): {}",
            std::io::Error::last_os_error()
        );
        let held = HeldFiles {
            mount: mount.to_path_buf(),
            fuse: Arc::new(fuse),
            seen: Arc::default(),
            file_bytes,
        };
        let (fuse, seen) = (held.fuse.clone(), held.seen.clone());
        std::thread::Builder::new()
            .name("held-files".into())
            .spawn(move || serve(&fuse, &seen, files, file_bytes))
            .unwrap();
        held
    }

    /// The path of file `i`.
    pub fn file(&self, i: u64) -> PathBuf {
        self.mount.join(i.to_string())
    }

    /// Waits until `reads` READs are held by the server; panics after `bound`.
    pub fn wait_held(&self, reads: usize, bound: Duration) {
        self.wait(bound, |s| s.held.len() >= reads, "reads held");
    }

    /// Answers every held READ, and every later one at once.
    pub fn release(&self) {
        let held = {
            let mut seen = self.seen.0.lock().unwrap();
            seen.released = true;
            std::mem::take(&mut seen.held)
        };
        for (unique, size, node, offset) in held {
            answer_read(&self.fuse, unique, size, node, offset, self.file_bytes);
        }
    }

    /// Waits until `closes` files were closed after their reads (the readers went on past
    /// their answers); panics after `bound`.
    pub fn wait_closed(&self, closes: usize, bound: Duration) {
        self.wait(bound, |s| s.closes >= closes, "files closed");
    }

    fn wait(&self, bound: Duration, done: impl Fn(&Seen) -> bool, what: &str) {
        let deadline = Instant::now() + bound;
        let (lock, changed) = &*self.seen;
        let mut seen = lock.lock().unwrap();
        while !done(&seen) {
            let now = Instant::now();
            assert!(
                now < deadline,
                "{what}: not within {bound:?} ({} reads seen, {} held, {} files closed)",
                seen.reads,
                seen.held.len(),
                seen.closes
            );
            seen = changed.wait_timeout(seen, deadline - now).unwrap().0;
        }
    }
}

impl Drop for HeldFiles {
    fn drop(&mut self) {
        self.release();
        let target = CString::new(self.mount.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path alive for the call. Detached: the file system goes
        // when its last file closes, and the server's read then ends with ENODEV.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn serve(fuse: &File, seen: &(Mutex<Seen>, Condvar), files: u64, file_bytes: usize) {
    let mut buffer = vec![0u8; MAX_READ + (1 << 20)];
    loop {
        let n = match (&*fuse).read(&mut buffer) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            // ENODEV: unmounted.
            Err(_) => return,
        };
        let request = &buffer[..n];
        let opcode = u32_at(request, 4);
        let unique = u64_at(request, 8);
        let node = u64_at(request, 16);
        let body = &request[40..];
        match opcode {
            FUSE_INIT => {
                let mut out = [0u8; 64];
                out[0..4].copy_from_slice(&7u32.to_ne_bytes());
                out[4..8].copy_from_slice(&31u32.to_ne_bytes());
                out[8..12].copy_from_slice(&(MAX_READ as u32).to_ne_bytes());
                out[12..16].copy_from_slice(&FUSE_ASYNC_READ.to_ne_bytes());
                out[16..18].copy_from_slice(&16u16.to_ne_bytes()); // max_background
                out[18..20].copy_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
                out[20..24].copy_from_slice(&(MAX_READ as u32).to_ne_bytes()); // max_write
                reply(fuse, unique, 0, &out);
            }
            FUSE_LOOKUP => {
                let name = std::str::from_utf8(&body[..body.len().saturating_sub(1)]).unwrap_or("");
                match name.parse::<u64>() {
                    Ok(i) if node == ROOT && i < files => {
                        let mut out = Vec::with_capacity(128);
                        out.extend_from_slice(&(i + 2).to_ne_bytes()); // nodeid
                        out.extend_from_slice(&0u64.to_ne_bytes()); // generation
                        out.extend_from_slice(&60u64.to_ne_bytes()); // entry_valid
                        out.extend_from_slice(&60u64.to_ne_bytes()); // attr_valid
                        out.extend_from_slice(&[0u8; 8]); // their nanoseconds
                        out.extend_from_slice(&attr(i + 2, file_bytes));
                        reply(fuse, unique, 0, &out);
                    }
                    _ => reply(fuse, unique, -libc::ENOENT, &[]),
                }
            }
            FUSE_GETATTR => {
                let mut out = Vec::with_capacity(104);
                out.extend_from_slice(&60u64.to_ne_bytes());
                out.extend_from_slice(&[0u8; 8]);
                out.extend_from_slice(&attr(node, file_bytes));
                reply(fuse, unique, 0, &out);
            }
            FUSE_OPEN => {
                let mut out = [0u8; 16];
                out[0..8].copy_from_slice(&node.to_ne_bytes());
                out[8..12].copy_from_slice(&FOPEN_DIRECT_IO.to_ne_bytes());
                reply(fuse, unique, 0, &out);
            }
            FUSE_READ => {
                let offset = u64_at(body, 8);
                let size = u32_at(body, 16);
                let (lock, changed) = seen;
                let mut s = lock.lock().unwrap();
                s.reads += 1;
                if s.released {
                    drop(s);
                    answer_read(fuse, unique, size, node, offset, file_bytes);
                } else {
                    s.held.push((unique, size, node, offset));
                    drop(s);
                }
                changed.notify_all();
            }
            FUSE_RELEASE => {
                reply(fuse, unique, 0, &[]);
                let (lock, changed) = seen;
                lock.lock().unwrap().closes += 1;
                changed.notify_all();
            }
            FUSE_FLUSH => reply(fuse, unique, 0, &[]),
            // No extended attributes: the block's checksum is not recorded.
            FUSE_GETXATTR => reply(fuse, unique, -libc::ENODATA, &[]),
            // No answer is owed; a held READ stays held.
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => {}
            _ => reply(fuse, unique, -libc::ENOSYS, &[]),
        }
    }
}

/// fuse_attr of a regular file (or the root directory) of `file_bytes` bytes.
fn attr(node: u64, file_bytes: usize) -> Vec<u8> {
    let (mode, size) = if node == ROOT {
        (libc::S_IFDIR | 0o755, 0)
    } else {
        (libc::S_IFREG | 0o444, file_bytes as u64)
    };
    let mut out = Vec::with_capacity(88);
    out.extend_from_slice(&node.to_ne_bytes()); // ino
    out.extend_from_slice(&size.to_ne_bytes());
    out.extend_from_slice(&size.div_ceil(512).to_ne_bytes()); // blocks
    out.extend_from_slice(&[0u8; 24 + 12]); // times and their nanoseconds
    out.extend_from_slice(&mode.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes()); // nlink
    out.extend_from_slice(&[0u8; 8]); // uid, gid
    out.extend_from_slice(&0u32.to_ne_bytes()); // rdev
    out.extend_from_slice(&4096u32.to_ne_bytes()); // blksize
    out.extend_from_slice(&0u32.to_ne_bytes()); // flags
    out
}

fn answer_read(fuse: &File, unique: u64, size: u32, node: u64, offset: u64, file_bytes: usize) {
    let end = (offset as usize + size as usize).min(file_bytes);
    let len = end.saturating_sub(offset as usize);
    reply(fuse, unique, 0, &vec![fill(node - 2); len]);
}

fn reply(fuse: &File, unique: u64, error: i32, body: &[u8]) {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    out.extend_from_slice(&error.to_ne_bytes());
    out.extend_from_slice(&unique.to_ne_bytes());
    out.extend_from_slice(body);
    // An answer to a request the kernel dropped (interrupted) is refused with ENOENT.
    let _ = (&*fuse).write_all(&out);
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
}
