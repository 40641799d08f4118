//! kvt_ calls from inside the host's log callback, as the header allows them, for a record
//! made on a tier's I/O thread (a corrupt block's load warns there): on another tier, and
//! on the tier whose record it is, which stays usable, or is shut down and freed from
//! there. All through the C ABI; its own binary, as the callback is process-wide.

#[macro_use]
mod support;

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use kvtier::abi::{kvt_eviction_report, kvt_lookup_result};
use kvtier::logs::LogLevel;
use kvtier::*;
use kvtier_core::{JobKind, Status};
use serde_json::json;
use support::c_tier::{last_error, CTier};
use support::*;

const BLOCK: usize = 16 * 1024;
const BLOCKS: u64 = 8;
/// Every wait of the test: generous, for a busy machine.
const BOUND: Duration = Duration::from_secs(60);

/// What the callback does when the next corrupt block's warning arrives.
const IDLE: u8 = 0;
/// Works on a new tier and on the tier whose record it is, which stays usable.
const USE_BOTH: u8 = 1;
/// Shuts down and frees the tier whose record it is.
const FREE_OWN: u8 = 2;
static PLAN: AtomicU8 = AtomicU8::new(IDLE);
/// The tier whose load warns.
static OWN: AtomicPtr<kvt_tier> = AtomicPtr::new(std::ptr::null_mut());
/// A configuration for the tier the callback makes, and a stored key of the own tier.
static OTHER_CONFIG: Mutex<Option<CString>> = Mutex::new(None);
/// A call the callback made: its name, status and `kvt_last_error`.
type Call = (&'static str, Status, String);
/// Each call the callback made, with its status and message; set when it is done.
static CALLS: Mutex<Option<Vec<Call>>> = Mutex::new(None);
static CALLS_DONE: Condvar = Condvar::new();

unsafe extern "C" fn on_record(
    _userdata: *mut c_void,
    _level: LogLevel,
    _target: *const c_char,
    message: *const c_char,
) {
    // SAFETY: the library passes a NUL-terminated string valid for the call.
    let message = unsafe { CStr::from_ptr(message) }.to_string_lossy();
    if !message.contains("reading it again") {
        return;
    }
    let plan = PLAN.swap(IDLE, Ordering::AcqRel);
    if plan == IDLE {
        return;
    }
    let own = OWN.load(Ordering::Acquire);
    let mut calls = Vec::new();
    let mut note = |name: &'static str, status: Status| calls.push((name, status, last_error()));
    // SAFETY: `own` is a live tier the test's thread leaves alone until the calls are
    // done; every pointer passed is valid for its call.
    unsafe {
        match plan {
            USE_BOTH => {
                let config = OTHER_CONFIG.lock().unwrap().clone().unwrap();
                note("kvt_config_check", kvt_config_check(config.as_ptr()));
                let mut other = std::ptr::null_mut();
                note("kvt_tier_new", kvt_tier_new(config.as_ptr(), &mut other));
                for (tier, whose) in [(other, "other"), (own, "own")] {
                    let k = key(1);
                    let mut verdict = kvt_lookup_result::Retry;
                    let looked = kvt_tier_lookup(tier, 7, k.as_ptr(), k.len(), &mut verdict);
                    note(
                        if whose == "own" {
                            "lookup own"
                        } else {
                            "lookup other"
                        },
                        looked,
                    );
                    let mut verdicts = [kvt_lookup_result::Retry];
                    let checked = kvt_tier_check_now(
                        tier,
                        k.as_ptr(),
                        k.len(),
                        1,
                        30_000,
                        verdicts.as_mut_ptr(),
                    );
                    let hit = verdicts[0] == kvt_lookup_result::Hit;
                    note(
                        match (whose, hit) {
                            ("own", true) => "check_now own: hit",
                            ("own", false) => "check_now own: not a hit",
                            _ => "check_now other",
                        },
                        checked,
                    );
                    let mut report = std::mem::zeroed::<kvt_eviction_report>();
                    let cleared = kvt_tier_clear(tier, &mut report);
                    note(
                        if whose == "own" {
                            "clear own"
                        } else {
                            "clear other"
                        },
                        cleared,
                    );
                }
                note("kvt_tier_shutdown other", kvt_tier_shutdown(other));
                kvt_tier_free(other);
                note("kvt_tier_free other", Status::Ok);
            }
            FREE_OWN => {
                note("kvt_tier_shutdown own", kvt_tier_shutdown(own));
                let (ids, k) = ([0u64], key(2));
                let refused = kvt_tier_submit_store(own, 9, ids.as_ptr(), k.as_ptr(), k.len(), 1);
                note("submit after shutdown", refused);
                kvt_tier_free(own);
                let freed = if last_error().is_empty() {
                    Status::Ok
                } else {
                    Status::Panic
                };
                note("kvt_tier_free own", freed);
            }
            _ => unreachable!(),
        }
    }
    *CALLS.lock().unwrap() = Some(calls);
    CALLS_DONE.notify_all();
}

/// The calls the callback made, once it has made them.
fn wait_for_calls() -> Vec<Call> {
    let deadline = Instant::now() + BOUND;
    let mut calls = CALLS.lock().unwrap();
    while calls.is_none() {
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("the log callback ran its calls within the bound");
        calls = CALLS_DONE.wait_timeout(calls, left).unwrap().0;
    }
    calls.take().unwrap()
}

fn new_tier(dir: &Path) -> CTier {
    let store = json!({"type": "local", "path": dir});
    let tier = CTier::new(&tier_json(store, json!({"checksums": true})));
    tier.register_pool(BLOCKS, BLOCK, 11);
    tier
}

/// Stores or loads pool block `i` under `key(i)`, and waits for its result.
fn run(tier: &CTier, kind: JobKind, job: u64, i: u64) -> (Status, String) {
    tier.run(kind, job, &[i], &[key(i)])
}

/// Flips a byte in the middle of every block file under `dir`.
fn corrupt_blocks(dir: &Path) {
    let mut flipped = 0;
    for entry in walk(dir) {
        let mut bytes = std::fs::read(&entry).unwrap();
        if bytes.len() == BLOCK {
            bytes[BLOCK / 2] ^= 0xff;
            std::fs::write(&entry, bytes).unwrap();
            flipped += 1;
        }
    }
    assert!(flipped > 0, "no block file under {}", dir.display());
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn calls_from_the_log_callback_work_on_any_tier() {
    let own_dir = tempfile::tempdir().unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other_store = json!({"type": "local", "path": other_dir.path()});
    *OTHER_CONFIG.lock().unwrap() = Some(CString::new(tier_json(other_store, json!({}))).unwrap());
    // SAFETY: a function of the callback's signature; no userdata.
    let set = unsafe { kvt_set_log_callback(Some(on_record), std::ptr::null_mut(), 2) };
    assert_eq!(set, Status::Ok);

    // The tier whose I/O thread warns, and which stays usable.
    let own = new_tier(own_dir.path());
    for i in 0..2 {
        assert_eq!(run(&own, JobKind::Store, 10 + i, i).0, Status::Ok);
    }
    corrupt_blocks(own_dir.path());
    OWN.store(own.ptr, Ordering::Release);
    PLAN.store(USE_BOTH, Ordering::Release);
    let (status, message) = run(&own, JobKind::Load, 20, 0);
    let calls = wait_for_calls();
    let names: Vec<_> = calls.iter().map(|c| c.0).collect();
    assert_eq!(
        names,
        [
            "kvt_config_check",
            "kvt_tier_new",
            "lookup other",
            "check_now other",
            "clear other",
            "lookup own",
            "check_now own: hit",
            "clear own",
            "kvt_tier_shutdown other",
            "kvt_tier_free other",
        ],
        "{calls:#?}"
    );
    for (name, status, message) in &calls {
        assert_eq!(*status, Status::Ok, "{name}: {message}");
    }
    assert!(
        [Status::Corrupt, Status::NotFound].contains(&status),
        "the corrupt block's load: {status:?} {message}"
    );
    // The tier is usable: the cleared block is stored again and loads.
    assert_eq!(run(&own, JobKind::Store, 30, 1).0, Status::Ok);
    assert_eq!(run(&own, JobKind::Load, 31, 1).0, Status::Ok);

    // A tier shut down and freed from the callback, for its own record.
    let last_dir = tempfile::tempdir().unwrap();
    let last = new_tier(last_dir.path());
    assert_eq!(run(&last, JobKind::Store, 40, 0).0, Status::Ok);
    corrupt_blocks(last_dir.path());
    // The callback frees it.
    let last = std::mem::ManuallyDrop::new(last);
    OWN.store(last.ptr, Ordering::Release);
    PLAN.store(FREE_OWN, Ordering::Release);
    let (ids, k) = ([0u64], key(0));
    // SAFETY: a live tier (the callback frees it; the test does not touch it again).
    let submitted =
        unsafe { kvt_tier_submit_load(last.ptr, 41, ids.as_ptr(), k.as_ptr(), k.len(), 1) };
    assert_eq!(submitted, Status::Ok, "{}", last_error());
    let calls = wait_for_calls();
    let got: Vec<_> = calls.iter().map(|c| (c.0, c.1)).collect();
    assert_eq!(
        got,
        [
            ("kvt_tier_shutdown own", Status::Ok),
            ("submit after shutdown", Status::ShutDown),
            ("kvt_tier_free own", Status::Ok),
        ],
        "{calls:#?}"
    );

    drop(own);
    // SAFETY: NULL restores stderr.
    let unset = unsafe { kvt_set_log_callback(None, std::ptr::null_mut(), 0) };
    assert_eq!(unset, Status::Ok);
}
