//! A tier's end is bounded by its grace period, and leaves the caller's memory alone, also
//! when what it waits for never returns: local-store reads held in the kernel (a FUSE file
//! system served by the test, whose READs wait for the test's word, as a hung NFS mount's
//! do) and a keyring command that hangs on its refresh; and a tier's start is bounded when
//! its keyring file's read is held the same way. Through the C ABI, as an engine opens and
//! closes a tier.

#[path = "shutdown/held_files.rs"]
mod held_files;

use std::ffi::CString;
use std::path::Path;
use std::time::{Duration, Instant};

use held_files::HeldFiles;
use kvtier::{
    kvt_config_check, kvt_last_error, kvt_result, kvt_tier, kvt_tier_free, kvt_tier_new,
    kvt_tier_poll, kvt_tier_register_memory, kvt_tier_shutdown, kvt_tier_submit_load,
};
use kvtier_core::key::{make_key, KeyLayout};
use kvtier_core::{Status, TierConfig};
use serde_json::json;

const GRACE: Duration = Duration::from_millis(500);
/// What the header promises past the grace period is 1 s; one more for a busy machine.
/// Far below how long the reads are held (until the test lets them go).
const BOUND: Duration = Duration::from_millis(500 + 2000);
/// Waits for conditions that hold within milliseconds on an idle machine.
const SLOW: Duration = Duration::from_secs(30);
const KEYS: u64 = 4;
const BLOCK: usize = 64 << 10;
const SENTINEL: u8 = 0x5A;

fn key(i: u64) -> Vec<u8> {
    make_key(&(i + 1).to_be_bytes().repeat(4), 0)
}

fn new_tier(config: &serde_json::Value) -> *mut kvt_tier {
    let json = CString::new(config.to_string()).unwrap();
    let mut tier = std::ptr::null_mut();
    // SAFETY: a NUL-terminated configuration and a writable out-pointer.
    let status = unsafe { kvt_tier_new(json.as_ptr(), &mut tier) };
    assert_eq!(status, Status::Ok, "kvt_tier_new");
    tier
}

/// How a test ends its tier.
#[derive(Clone, Copy, PartialEq)]
enum End {
    Free,
    Shutdown,
}

/// Runs `end` on `tier` on a thread of its own; how long it took, or `None` past `bound`
/// (it is still running then).
fn timed(end: End, tier: *mut kvt_tier, bound: Duration) -> (Option<Duration>, impl FnOnce()) {
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let address = tier as usize;
    let started = Instant::now();
    std::thread::spawn(move || {
        let tier = address as *mut kvt_tier;
        // SAFETY: a live handle, used by this thread alone until it returns.
        unsafe {
            match end {
                End::Free => kvt_tier_free(tier),
                End::Shutdown => assert_eq!(kvt_tier_shutdown(tier), Status::Ok),
            }
        }
        done_tx.send(started.elapsed()).unwrap();
    });
    let took = done_rx.recv_timeout(bound).ok();
    let wait_rest = move || {
        done_rx
            .recv_timeout(SLOW)
            .expect("the tier's end never returned, even with the reads let go");
    };
    (took, wait_rest)
}

/// Loads whose reads the kernel holds, then `end` past the grace period: it returns within
/// the bound; the caller's pool, overwritten with a sentinel right after, stays so when the
/// held reads are let go and their threads have gone on past them.
fn held_loads_then(end: End, o_direct: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (store, mount) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir_all(&mount).unwrap();
    let held = HeldFiles::mount(&mount, KEYS, BLOCK);
    let config = json!({
        "store": {"type": "local", "path": store, "o_direct": o_direct},
        "shutdown_timeout_ms": GRACE.as_millis() as u64,
        "file_io_threads": KEYS + 2,
    });
    // Each key's object is a link into the held file system.
    let parsed = TierConfig::from_json(&config.to_string()).unwrap();
    let layout = KeyLayout::new(&parsed.prefix, &parsed.namespace).unwrap();
    for i in 0..KEYS {
        let object = store.join(layout.object_name(&key(i)).unwrap());
        std::fs::create_dir_all(object.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(held.file(i), &object).unwrap();
    }
    let tier = new_tier(&config);
    // The pool outlives everything the tier could do with it: leaked. Page-aligned, so that
    // with `o_direct` the reads go O_DIRECT.
    let layout = std::alloc::Layout::from_size_align(KEYS as usize * BLOCK, 4096).unwrap();
    // SAFETY: a layout of non-zero size; the allocation is never freed, and is used only as
    // this one slice.
    let pool: &mut [u8] = unsafe {
        let base = std::alloc::alloc_zeroed(layout);
        assert!(!base.is_null());
        std::slice::from_raw_parts_mut(base, layout.size())
    };
    // SAFETY: a live handle and a pool of KEYS blocks of BLOCK bytes that is never freed.
    unsafe {
        assert_eq!(
            kvt_tier_register_memory(tier, pool.as_mut_ptr(), KEYS, BLOCK),
            Status::Ok
        );
        for i in 0..KEYS {
            let k = key(i);
            let status = kvt_tier_submit_load(tier, 100 + i, &i, k.as_ptr(), k.len(), 1);
            assert_eq!(status, Status::Ok, "load {i}");
        }
    }
    held.wait_held(KEYS as usize, SLOW);

    let (took, wait_rest) = timed(end, tier, BOUND);
    let Some(took) = took else {
        held.release();
        wait_rest();
        panic!(
            "{} did not return within {BOUND:?} (grace {GRACE:?}) while reads were held",
            if end == End::Free {
                "kvt_tier_free"
            } else {
                "kvt_tier_shutdown"
            }
        );
    };
    // The caller takes its memory back the moment the call returns.
    pool.fill(SENTINEL);
    if end == End::Shutdown {
        // Every load yields exactly one result: cancelled, its read abandoned.
        let mut results: Vec<kvt_result> = Vec::with_capacity(2 * KEYS as usize);
        let mut got = 0usize;
        // SAFETY: a shut-down handle (polling still works) and room for 2 * KEYS results.
        unsafe {
            assert_eq!(
                kvt_tier_poll(tier, results.as_mut_ptr(), 2 * KEYS as usize, &mut got),
                Status::Ok
            );
            results.set_len(got);
        }
        let mut jobs: Vec<u64> = results.iter().map(|r| r.job_id).collect();
        jobs.sort();
        assert_eq!(jobs, (100..100 + KEYS).collect::<Vec<_>>());
        assert!(
            results.iter().all(|r| r.status == Status::Cancelled),
            "held loads are reported cancelled"
        );
    }
    held.release();
    held.wait_closed(KEYS as usize, SLOW);
    let landed = pool.iter().filter(|&&b| b != SENTINEL).count();
    assert_eq!(
        landed, 0,
        "{landed} bytes of held reads landed in the caller's pool after the tier's end returned"
    );
    if end == End::Shutdown {
        let (took_free, _) = timed(End::Free, tier, BOUND);
        assert!(
            took_free.is_some(),
            "kvt_tier_free after shutdown took long"
        );
    }
    assert!(
        took >= GRACE,
        "returned after {took:?}, before the grace period: held reads were not waited for"
    );
    eprintln!("held reads: the tier's end returned after {took:?} (grace {GRACE:?})");
}

#[test]
fn free_returns_within_the_grace_while_reads_are_held_and_they_never_land() {
    held_loads_then(End::Free, false);
}

#[test]
fn free_returns_within_the_grace_while_direct_reads_are_held_and_they_never_land() {
    held_loads_then(End::Free, true);
}

#[test]
fn shutdown_returns_within_the_grace_while_reads_are_held_and_reports_each_load_once() {
    held_loads_then(End::Shutdown, false);
}

/// A keyring command that answers the tier's start and hangs on its first refresh: free
/// returns within the bound, and the command does not outlive the tier.
#[test]
fn free_returns_within_the_grace_while_a_keyring_command_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let keyring = dir.path().join("keyring.json");
    std::fs::write(
        &keyring,
        r#"{"write": "a", "keys": {"a": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}}"#,
    )
    .unwrap();
    let (answered, hanging) = (dir.path().join("answered"), dir.path().join("hanging"));
    let script = dir.path().join("keyring.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ -e {answered} ]; then echo $$ > {hanging}.tmp; mv {hanging}.tmp {hanging}; exec sleep 600; fi\n\
             touch {answered}\nexec cat {keyring}\n",
            answered = answered.display(),
            hanging = hanging.display(),
            keyring = keyring.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tier = new_tier(&json!({
        "store": {"type": "memory"},
        "shutdown_timeout_ms": GRACE.as_millis() as u64,
        "encryption": {"keyring_command": [script], "refresh_s": 1},
    }));
    // The first refresh runs a second after the start, and hangs.
    let deadline = Instant::now() + SLOW;
    let pid = loop {
        if let Ok(pid) = std::fs::read_to_string(&hanging) {
            break pid.trim().parse::<libc::pid_t>().unwrap();
        }
        assert!(Instant::now() < deadline, "the keyring refresh never ran");
        wait_for_file(&hanging, deadline);
    };
    let (took, wait_rest) = timed(End::Free, tier, BOUND);
    if took.is_none() {
        // SAFETY: kill(2) of the test's own hanging command, so that the free ends.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_rest();
        panic!("kvt_tier_free did not return within {BOUND:?} while a keyring command hung");
    }
    // The command was ended: it does not outlive the tier by its own timeout.
    assert!(
        process_ends(pid, SLOW),
        "the hanging keyring command {pid} outlived the tier"
    );
    eprintln!(
        "hanging keyring command: kvt_tier_free returned after {:?}",
        took.unwrap()
    );
}

/// A keyring file on a file system whose reads hang (as a hung NFS mount's do):
/// `kvt_tier_new` and `kvt_config_check` fail in time, naming the file, rather than wait
/// for ever; the reads let go afterwards land nowhere.
#[test]
fn a_keyring_file_whose_read_hangs_fails_the_start_in_time() {
    /// The library abandons a keyring file's read after 10 s; a busy machine adds some.
    const KEYRING_BOUND: Duration = Duration::from_secs(10 + 10);
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("held");
    std::fs::create_dir(&mount).unwrap();
    let held = HeldFiles::mount(&mount, 1, 4096);
    let config = json!({
        "store": {"type": "memory"},
        "encryption": {"keyring_file": held.file(0)},
    })
    .to_string();
    let calls: Vec<_> = ["kvt_tier_new", "kvt_config_check"]
        .into_iter()
        .map(|call| {
            let (done_tx, done_rx) = crossbeam_channel::bounded(1);
            let config = CString::new(config.clone()).unwrap();
            std::thread::spawn(move || {
                let mut tier = std::ptr::null_mut();
                // SAFETY: a NUL-terminated configuration and a writable out-pointer.
                let status = unsafe {
                    if call == "kvt_tier_new" {
                        kvt_tier_new(config.as_ptr(), &mut tier)
                    } else {
                        kvt_config_check(config.as_ptr())
                    }
                };
                // SAFETY: this thread's last error, copied before its next kvt_ call.
                let message = unsafe { std::ffi::CStr::from_ptr(kvt_last_error()) }
                    .to_string_lossy()
                    .into_owned();
                if !tier.is_null() {
                    // SAFETY: a tier this thread created and nothing else uses.
                    unsafe { kvt_tier_free(tier) };
                }
                done_tx.send((status, message)).unwrap();
            });
            (call, done_rx)
        })
        .collect();
    held.wait_held(1, SLOW);
    for (call, done_rx) in calls {
        let answer = done_rx.recv_timeout(KEYRING_BOUND);
        let Ok((status, message)) = answer else {
            held.release();
            panic!("{call} still waited for a held keyring read after {KEYRING_BOUND:?}");
        };
        assert_ne!(
            status,
            Status::Ok,
            "{call} accepted a keyring it could not read"
        );
        assert!(
            message.contains("did not finish") && message.contains("keyring file"),
            "{call}: {message}"
        );
    }
    held.release();
    held.wait_closed(2, SLOW);
}

/// Waits (bounded by `deadline`) for `file` to appear, through inotify on its directory.
fn wait_for_file(file: &Path, deadline: Instant) {
    let dir = CString::new(file.parent().unwrap().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: plain inotify calls on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_CLOEXEC);
        assert!(fd >= 0);
        libc::inotify_add_watch(fd, dir.as_ptr(), libc::IN_MOVED_TO | libc::IN_CREATE);
        if !file.exists() {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fds = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            libc::poll(&mut fds, 1, left.as_millis().min(i32::MAX as u128) as i32);
        }
        libc::close(fd);
    }
}

/// Whether process `pid` ends (or has ended) within `bound`, watched through a pidfd.
fn process_ends(pid: libc::pid_t, bound: Duration) -> bool {
    // SAFETY: pidfd_open(2) and poll(2) on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as libc::c_int;
        if fd < 0 {
            return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        }
        let mut fds = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ready = libc::poll(&mut fds, 1, bound.as_millis() as i32);
        libc::close(fd);
        ready == 1
    }
}
