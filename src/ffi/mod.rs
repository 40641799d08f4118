//! The C ABI. Only argument checking, conversion and the panic boundary live here;
//! the behaviour is the engine's.
//!
//! Conventions (also in the header preamble):
//! * every fallible function returns a `kvt_status`; details come from `kvt_last_error()`;
//! * out-parameters are written on success; on failure they are reset to NULL/0 where stated;
//! * no panic crosses the boundary: it becomes `KVT_STATUS_PANIC`.

#![allow(non_camel_case_types)]
// Every export's preconditions (NULL, handle liveness, buffer sizes, lifetimes) are the
// header's documentation, written for C callers in each function's comment and in the
// header's conventions; a Rust `# Safety` heading would only repeat them there.
#![allow(clippy::missing_safety_doc)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod abi;
mod boundary;
pub mod logs;

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use boundary::{c_text, current_pid, guard, guard_tier, guard_tier_or, set_last_error, Access};

use crate::config::Locality;
use crate::engine::{JobKind, KeyBatch, Tier};
use crate::error::{Error, Status};
use crate::memory::MemoryRange;
use abi::{kvt_eviction_report, kvt_job_kind, kvt_lookup_result, kvt_range, kvt_stats};

pub use boundary::kvt_last_error;

/// Bytes of the group index at the end of every key (big-endian).
pub const KVT_KEY_GROUP_BYTES: usize = 4;
/// Key length of vLLM's default (SHA-256) block hash plus the group index.
pub const KVT_DEFAULT_KEY_BYTES: usize = 36;
/// Most keys one job may carry; a larger `num_keys` is KVT_STATUS_INVALID_ARGUMENT.
pub const KVT_MAX_KEYS_PER_JOB: usize = 1 << 20;
/// Most ranges one key's object may be made of (`ranges_per_key`).
pub const KVT_MAX_RANGES_PER_KEY: usize = 4096;
/// Most ranges one job may carry, over all its keys.
pub const KVT_MAX_RANGES_PER_JOB: usize = 1 << 22;

// The header's constants are literals (cbindgen reads no paths); they are the engine's.
const _: () = assert!(KVT_MAX_KEYS_PER_JOB == crate::engine::MAX_KEYS_PER_JOB);
const _: () = assert!(KVT_MAX_RANGES_PER_KEY == crate::memory::MAX_RANGES_PER_KEY);
const _: () = assert!(KVT_MAX_RANGES_PER_JOB == crate::memory::MAX_RANGES_PER_JOB);

/// Tag of a live tier handle, checked on every call as a best effort (see `check_tier`);
/// cleared when the handle is freed.
const TIER_MAGIC: u64 = 0x6b76_7469_6572_0001;

/// A tier handle. Opaque to C (so not `repr(C)`: cbindgen declares it only).
pub struct kvt_tier {
    /// Read and cleared through volatile accesses, so the clearing store on free is kept.
    magic: u64,
    /// The process that created the tier: its threads exist only there.
    pid: u32,
    /// A call on this tier panicked: it refuses further work.
    failed: AtomicBool,
    tier: Tier,
    /// `Tier::location` as C text, made once at creation (`kvt_tier_location`).
    location: CString,
    /// Per-key statuses and messages of the last poll, kept alive until the next poll.
    last_poll: Mutex<PollScratch>,
    /// Events of the last `kvt_tier_take_events`, kept alive until the next call.
    last_events: Mutex<Vec<crate::engine::KvEvent>>,
}

/// Locality carried on events, from the configuration.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventLocality {
    /// Not configured.
    Unset = 0,
    Local = 1,
    Remote = 2,
}

/// A BlockStored event: the keys of one successful store job, in job order.
#[repr(C)]
pub struct kvt_event {
    /// The store job that stored the keys.
    pub job_id: u64,
    /// `num_keys` keys of `key_len` bytes, back to back. Owned by the tier; valid until
    /// the next `kvt_tier_take_events` or `kvt_tier_free` on this tier.
    pub keys: *const u8,
    pub key_len: usize,
    pub num_keys: usize,
    /// Always "STORAGE" (vLLM's Medium.STORAGE). Static.
    pub medium: *const c_char,
    pub locality: EventLocality,
}

/// A KV event: BlockStored (the keys of one successful store job, in job order) or
/// BlockRemoved (keys the tier deleted: by eviction, or a corrupt object deleted under
/// `on_corrupt = fail_and_delete`).
#[repr(C)]
pub struct kvt_kv_event {
    /// The keys, as in a BlockStored event; `job_id` is 0 for a removal.
    pub event: kvt_event,
    /// BlockRemoved (vLLM's `OffloadingEvent.removed`) rather than BlockStored.
    pub removed: bool,
}

impl kvt_event {
    fn of(event: &crate::engine::KvEvent) -> kvt_event {
        kvt_event {
            job_id: event.job_id,
            keys: event.keys.as_bytes().as_ptr(),
            key_len: event.keys.key_len(),
            num_keys: event.keys.len(),
            medium: c"STORAGE".as_ptr(),
            locality: match event.locality {
                None => EventLocality::Unset,
                Some(Locality::LOCAL) => EventLocality::Local,
                Some(Locality::REMOTE) => EventLocality::Remote,
            },
        }
    }
}

#[derive(Default)]
struct PollScratch {
    key_status: Vec<Vec<Status>>,
    messages: Vec<CString>,
}

/// One finished job, as returned by `kvt_tier_poll`.
#[repr(C)]
pub struct kvt_result {
    /// The id given at submission.
    pub job_id: u64,
    /// Store or load.
    pub kind: kvt_job_kind,
    /// KVT_STATUS_OK only if every key succeeded; otherwise the first failing key's status,
    /// or the reason the job was rejected at submission. Always check this first: a
    /// rejected job may carry no per-key statuses (`num_keys` 0).
    pub status: Status,
    /// Bytes moved by the keys that succeeded.
    pub bytes: u64,
    /// Seconds from submission to completion.
    pub seconds: f64,
    /// Number of keys in the job (the length of `key_status`).
    pub num_keys: usize,
    /// Number of keys whose status is not KVT_STATUS_OK.
    pub num_failed_keys: usize,
    /// Outcome of each key, in submission order. Owned by the tier; valid until the next
    /// `kvt_tier_poll` or `kvt_tier_free` on this tier.
    pub key_status: *const Status,
    /// Why the job failed ("" on success). Owned by the tier; same lifetime as `key_status`.
    pub message: *const c_char,
}

static VERSION_CSTR: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("version string has a NUL"),
    };

/// The library version, e.g. "0.1.0". Static storage: never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn kvt_version() -> *const c_char {
    VERSION_CSTR.as_ptr()
}

/// A short, static English description of a status code ("unknown status" for values
/// outside the enum). Never NULL; never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn kvt_status_str(status: c_int) -> *const c_char {
    let text: &'static CStr = match status_from_int(status) {
        Some(s) => s.as_cstr(),
        None => c"unknown status",
    };
    text.as_ptr()
}

/// The tier configuration's schema: every key `kvt_tier_new` accepts, as a JSON document
/// `{"version": "...", "store_types": [...], "keys": [{"key": "store.request_timeout_ms",
/// "store": "s3", "type": "integer", "required": false, "default": 30000, "allowed": null,
/// "doc": "..."}, ...]}`. `key` is the full dotted path; a key inside `store` is listed once
/// per store type that has it (`store` names the type, null elsewhere); `type` is one of
/// string, integer, number, boolean, object, array, any; `allowed` lists an enumerated
/// key's values; `default` is null where there is none (or it is decided at start-up);
/// `example` is a valid value of a key without a default. `kvtier config schema` prints the
/// same document.
///
/// Static storage: never NULL, never free it, valid for the life of the process.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kvt_config_schema() -> *const c_char {
    static SCHEMA: OnceLock<CString> = OnceLock::new();
    static_text(&SCHEMA, || crate::config::schema_json().to_string())
}

/// The counters of `kvt_stats`, in field order, as a JSON array
/// `[{"name": "keys_stored", "help": "Keys stored successfully."}, ...]`: the names and help
/// texts bindings and metric exporters use.
///
/// Static storage: never NULL, never free it, valid for the life of the process.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kvt_stats_fields() -> *const c_char {
    static FIELDS: OnceLock<CString> = OnceLock::new();
    static_text(&FIELDS, || {
        let fields: Vec<_> = crate::engine::STATS_FIELDS
            .iter()
            .map(|f| serde_json::json!({"name": f.name, "help": f.help}))
            .collect();
        serde_json::Value::from(fields).to_string()
    })
}

/// Parses and checks a tier configuration exactly as `kvt_tier_new` does, without
/// opening its store or probing it: what a configuration file's author or a binding
/// calls to validate before starting a tier.
///
/// `config_json`: NUL-terminated UTF-8 JSON, borrowed for the call only; NULL is
/// KVT_STATUS_NULL_ARGUMENT. Returns KVT_STATUS_OK, or KVT_STATUS_CONFIG with a message
/// (`kvt_last_error`) naming the key's full path (`store.request_timeout_ms`) and what was
/// expected. Messages never contain secrets. Works after fork. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_config_check(config_json: *const c_char) -> Status {
    guard("kvt_config_check", || {
        // SAFETY: NULL or a NUL-terminated string, by the header's contract.
        crate::config::TierConfig::from_json(unsafe { config_text(config_json) }?).map(drop)
    })
}

/// The configuration text a caller passed (`kvt_tier_new`, `kvt_config_check`).
///
/// # Safety
/// `config_json` is NULL or a NUL-terminated string that outlives the returned borrow.
unsafe fn config_text<'a>(config_json: *const c_char) -> crate::Result<&'a str> {
    if config_json.is_null() {
        return Err(Error::new(Status::NullArgument, "config_json is NULL"));
    }
    // SAFETY: non-NULL, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(config_json) }
        .to_str()
        .map_err(|_| Error::config("config_json is not valid UTF-8"))
}

/// A string made once and kept for the life of the process, for exports that return
/// static text.
fn static_text(cell: &'static OnceLock<CString>, make: impl FnOnce() -> String) -> *const c_char {
    // A NUL inside would be a library bug; the empty string still honours "never NULL".
    cell.get_or_init(|| c_text(make())).as_ptr()
}

fn status_from_int(value: c_int) -> Option<Status> {
    Status::from_code(value)
}

/// Creates a tier from a JSON configuration, builds its store and probes it.
///
/// The configuration is an object with a required `store` (`{"type":"local","path":...}`,
/// `{"type":"memory"}` or `{"type":"s3","bucket":...}`) and optional `prefix`,
/// `namespace`, `key_bytes` (default 36; 0 = any length), `runtime_threads`,
/// `max_inflight_transfers`, `max_inflight_lookups`, `enable_kv_events`, `locality`
/// and `shutdown_timeout_ms`; the README's configuration reference lists every key.
///
/// * `config_json`: NUL-terminated UTF-8 JSON, borrowed for the call only. NULL is
///   KVT_STATUS_NULL_ARGUMENT.
/// * `out_tier`: receives the new handle, which the caller owns and must release with
///   `kvt_tier_free` exactly once. On any error `*out_tier` is set to NULL (when
///   `out_tier` itself is not NULL).
///
/// Returns KVT_STATUS_CONFIG for malformed JSON, an unknown key (named in the message)
/// or a bad value; KVT_STATUS_CONNECT, _AUTH, _TLS, _BUCKET_NOT_FOUND or
/// _PERMISSION_DENIED when the connectivity probe fails. Messages never contain secrets.
/// Blocks for the probe. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_new(
    config_json: *const c_char,
    out_tier: *mut *mut kvt_tier,
) -> Status {
    logs::install();
    guard("kvt_tier_new", || {
        if out_tier.is_null() {
            return Err(Error::new(Status::NullArgument, "out_tier is NULL"));
        }
        // SAFETY: checked non-NULL above; the caller passes a writable pointer.
        unsafe { *out_tier = std::ptr::null_mut() };
        // SAFETY: NULL or a NUL-terminated string, by the header's contract.
        let tier = Tier::from_json(unsafe { config_text(config_json) }?)?;
        let handle = Box::new(kvt_tier {
            magic: TIER_MAGIC,
            pid: current_pid(),
            failed: AtomicBool::new(false),
            location: c_text(tier.location()),
            tier,
            last_poll: Mutex::new(PollScratch::default()),
            last_events: Mutex::new(Vec::new()),
        });
        // SAFETY: checked non-NULL above; the caller passes a writable pointer.
        unsafe { *out_tier = Box::into_raw(handle) };
        Ok(())
    })
}

/// Registers the caller's host pool: block `i` is the `block_bytes` bytes at
/// `base + i * block_bytes`, for `i < num_blocks`.
///
/// The memory stays owned by the caller, who must keep it valid until `kvt_tier_free`
/// (or `kvt_tier_shutdown`) returns. The library reads and writes nothing outside it,
/// and touches a block only while a job naming it is in flight. Allowed once per tier
/// (KVT_STATUS_STATE the second time). NULL `tier` or `base` is KVT_STATUS_NULL_ARGUMENT;
/// zero blocks or zero `block_bytes` is KVT_STATUS_INVALID_ARGUMENT. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_register_memory(
    tier: *mut kvt_tier,
    base: *mut u8,
    num_blocks: u64,
    block_bytes: usize,
) -> Status {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition; check_tier
    // verifies what it can). The pool contract (valid until free, not touched while a job
    // uses a block) is the caller's, stated in the header, and is what register_memory needs.
    unsafe {
        guard_tier("kvt_tier_register_memory", tier, Access::Work, |handle| {
            handle.tier.register_memory(base, num_blocks, block_bytes)
        })
    }
}

/// Registers `len` bytes at `base` as a region that range jobs
/// (`kvt_tier_submit_store_ranges`, `kvt_tier_submit_load_ranges`) name parts of, and
/// writes its id (never 0, never reused by this tier) to `*out_region`.
///
/// The memory stays owned by the caller, who must keep it valid until
/// `kvt_tier_remove_region` of this id returns KVT_STATUS_OK, or until `kvt_tier_free`
/// (or `kvt_tier_shutdown`) returns. A tier may have any number of regions, added at any
/// time, besides or instead of the pool of `kvt_tier_register_memory`; regions may overlap
/// each other and the pool (jobs hold memory by address, whichever region names it).
/// NULL `tier`, `base` or `out_region` is KVT_STATUS_NULL_ARGUMENT, `len` 0 or a region
/// past the end of the address space KVT_STATUS_INVALID_ARGUMENT, after
/// `kvt_tier_shutdown` KVT_STATUS_SHUT_DOWN, in a fork() child KVT_STATUS_FORKED; on any
/// error `*out_region` is 0 (when `out_region` is not NULL). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_add_region(
    tier: *mut kvt_tier,
    base: *mut u8,
    len: usize,
    out_region: *mut u64,
) -> Status {
    if !out_region.is_null() {
        // SAFETY: the caller passes a writable pointer or NULL.
        unsafe { *out_region = 0 };
    }
    // SAFETY: `tier` is NULL or a live handle (the header's precondition; check_tier
    // verifies what it can). The region's contract (valid until removed or freed, not
    // touched while a job uses it) is the caller's, stated above.
    unsafe {
        guard_tier("kvt_tier_add_region", tier, Access::Work, |handle| {
            if out_region.is_null() {
                return Err(Error::new(Status::NullArgument, "out_region is NULL"));
            }
            let id = handle.tier.add_region(base, len)?;
            *out_region = id;
            Ok(())
        })
    }
}

/// Forgets region `region`, after which the library never touches its memory and the
/// caller may free it. KVT_STATUS_BLOCK_BUSY while a job whose result has not been
/// returned by `kvt_tier_poll` holds a range of it (poll that job first; the region stays
/// registered); KVT_STATUS_INVALID_ARGUMENT for an id that is not registered (never
/// added, or removed already). Works after `kvt_tier_shutdown`. NULL `tier` is
/// KVT_STATUS_NULL_ARGUMENT; in a fork() child KVT_STATUS_FORKED. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_remove_region(tier: *mut kvt_tier, region: u64) -> Status {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier("kvt_tier_remove_region", tier, Access::Collect, |handle| {
            handle.tier.remove_region(region)
        })
    }
}

/// Where the memory of a job's keys is, as the caller passed it.
#[derive(Clone, Copy)]
enum JobMemory {
    /// One pool block per key.
    Blocks(*const u64),
    /// `per_key` ranges per key, key after key.
    Ranges {
        ranges: *const kvt_range,
        per_key: usize,
    },
}

// The C signature's arguments, passed through as they are.
#[allow(clippy::too_many_arguments)]
unsafe fn submit(
    what: &'static str,
    kind: JobKind,
    tier: *mut kvt_tier,
    job_id: u64,
    memory: JobMemory,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
) -> Status {
    let body = |handle: &kvt_tier| {
        let reject = |e: Error| Err(handle.tier.submit_rejected(kind, job_id, num_keys, e));
        if handle.failed.load(Ordering::Acquire) {
            return reject(Error::new(Status::Panic, "an earlier call on this tier panicked; it refuses further work: shut it down and free it"));
        }
        if num_keys > crate::engine::MAX_KEYS_PER_JOB {
            return reject(Error::invalid(format!(
                "num_keys is {num_keys}; a job has at most {} keys",
                crate::engine::MAX_KEYS_PER_JOB
            )));
        }
        let (memory_ptr_is_null, memory_name) = match memory {
            JobMemory::Blocks(ids) => (ids.is_null(), "block_ids"),
            JobMemory::Ranges { ranges, .. } => (ranges.is_null(), "ranges"),
        };
        if num_keys > 0 && (memory_ptr_is_null || keys.is_null()) {
            let which = if memory_ptr_is_null {
                memory_name
            } else {
                "keys"
            };
            return reject(Error::new(
                Status::NullArgument,
                format!("{which} is NULL with num_keys = {num_keys}"),
            ));
        }
        // Every size below comes from the caller: check it before it sizes a slice, a copy
        // or an allocation. A key is at most MAX_KEY_BYTES and a job at most
        // MAX_KEYS_PER_JOB keys, so the product cannot overflow once both hold; a job's
        // ranges are bounded the same way before they are read.
        if let Err(e) = crate::key::check_key_len(key_len) {
            return reject(e);
        }
        let Some(total) = key_len.checked_mul(num_keys) else {
            return reject(Error::invalid("key_len * num_keys overflows"));
        };
        let num_ranges = match memory {
            JobMemory::Blocks(_) => 0,
            JobMemory::Ranges { per_key, .. } => {
                if per_key == 0 || per_key > KVT_MAX_RANGES_PER_KEY {
                    return reject(Error::invalid(format!(
                        "ranges_per_key is {per_key}; a key's object is 1 to {KVT_MAX_RANGES_PER_KEY} ranges"
                    )));
                }
                match num_keys.checked_mul(per_key) {
                    Some(n) if n <= KVT_MAX_RANGES_PER_JOB => n,
                    _ => {
                        return reject(Error::invalid(format!(
                            "num_keys {num_keys} * ranges_per_key {per_key} is more than a job's {KVT_MAX_RANGES_PER_JOB} ranges"
                        )))
                    }
                }
            }
        };
        let key_bytes: &[u8] = if num_keys == 0 {
            &[]
        } else {
            // SAFETY: non-NULL (checked above) and, by the header's contract, an array of
            // `num_keys * key_len` key bytes, borrowed for this call only (KeyBatch copies).
            unsafe { std::slice::from_raw_parts(keys, total) }
        };
        let batch = KeyBatch::new(key_bytes, key_len)?;
        match memory {
            JobMemory::Blocks(block_ids) => {
                let ids: &[u64] = if num_keys == 0 {
                    &[]
                } else {
                    // SAFETY: non-NULL (checked above) and, by the header's contract, an
                    // array of `num_keys` ids, borrowed for this call only.
                    unsafe { std::slice::from_raw_parts(block_ids, num_keys) }
                };
                handle.tier.submit(kind, job_id, ids, batch)
            }
            JobMemory::Ranges { ranges, per_key } => {
                let ranges: Vec<MemoryRange> = if num_keys == 0 {
                    Vec::new()
                } else {
                    // SAFETY: non-NULL (checked above) and, by the header's contract, an
                    // array of `num_keys * ranges_per_key` ranges (bounded above), borrowed
                    // for this call only (copied here).
                    unsafe { std::slice::from_raw_parts(ranges, num_ranges) }
                        .iter()
                        .map(|&r| r.into())
                        .collect()
                };
                handle
                    .tier
                    .submit_ranges(kind, job_id, &ranges, per_key, batch)
            }
        }
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition; check_tier
    // verifies what it can).
    unsafe { guard_tier(what, tier, Access::Submit, body) }
}

/// Submits a job that stores block `block_ids[i]` under key `i` for `i < num_keys`.
///
/// * `keys`: `num_keys` keys of `key_len` bytes each, back to back. A key is a block hash
///   followed by a 4-byte big-endian group index: `key_len` is 5 to 68, and equals the
///   configured `key_bytes` unless that is 0. Any other `key_len`, however large, and a
///   `num_keys` above KVT_MAX_KEYS_PER_JOB are KVT_STATUS_INVALID_ARGUMENT (with the
///   job's one result); the arrays are not read then.
/// * `block_ids`, `keys`: borrowed for the call only (copied).
/// * The blocks themselves are read asynchronously: the caller must not modify them until
///   the job's result has been returned by `kvt_tier_poll`.
/// * A job holds its blocks until its result has been returned by `kvt_tier_poll`. Store
///   jobs may share blocks; a block held by a load job is KVT_STATUS_BLOCK_BUSY (with the
///   job's one result), so that no block is read while the library writes it.
///
/// Never blocks. With a valid tier (in its own process; KVT_STATUS_FORKED in a fork()
/// child, with no result) and a `job_id` that has no result pending, exactly one
/// result for `job_id` comes out of `kvt_tier_poll`, also when this call returns an error
/// (NULL arrays, zero keys, wrong key length, block id out of range, a block held by
/// another job, memory not registered, after shutdown or after a caught panic).
/// KVT_STATUS_DUPLICATE_JOB means the id already has a result pending;
/// no second result is produced. Thread-safe; may run concurrently with any function but
/// `kvt_tier_shutdown` and `kvt_tier_free`.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_submit_store(
    tier: *mut kvt_tier,
    job_id: u64,
    block_ids: *const u64,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
) -> Status {
    // SAFETY: the arguments are passed through under the same contract.
    unsafe {
        submit(
            "kvt_tier_submit_store",
            JobKind::Store,
            tier,
            job_id,
            JobMemory::Blocks(block_ids),
            keys,
            key_len,
            num_keys,
        )
    }
}

/// Submits a job that loads key `i` into block `block_ids[i]` for `i < num_keys`.
///
/// Same arguments, ownership and result guarantees as `kvt_tier_submit_store`. The blocks
/// are written asynchronously: the caller must not read or write them until the job's
/// result has been returned by `kvt_tier_poll`; after that the library never writes them
/// again. A block id may appear only once per load job, and a load job needs its blocks
/// alone: a block that another job (store or load) holds is KVT_STATUS_BLOCK_BUSY, with
/// the job's one result. A key whose object is missing, or
/// whose object length differs from the block size, fails alone; the other keys of the
/// job still load.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_submit_load(
    tier: *mut kvt_tier,
    job_id: u64,
    block_ids: *const u64,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
) -> Status {
    // SAFETY: the arguments are passed through under the same contract.
    unsafe {
        submit(
            "kvt_tier_submit_load",
            JobKind::Load,
            tier,
            job_id,
            JobMemory::Blocks(block_ids),
            keys,
            key_len,
            num_keys,
        )
    }
}

/// Submits a job that stores, under key `i` for `i < num_keys`, the object made of the
/// ranges `ranges[i * ranges_per_key .. (i + 1) * ranges_per_key]`, one after the other.
///
/// A range is `len` bytes at `offset` in region `region` (`kvt_tier_add_region`). The
/// object is the ranges' bytes concatenated, exactly the object a pool block holding the
/// same bytes gives: one name, one checksum, loadable either way. The ranges are sent as
/// they are, never gathered into a copy.
/// * `keys`, `key_len`, `num_keys`: as for `kvt_tier_submit_store`.
/// * `ranges`: `num_keys * ranges_per_key` ranges, borrowed for the call only (copied).
///   `ranges_per_key` is 1 to KVT_MAX_RANGES_PER_KEY, and a job has at most
///   KVT_MAX_RANGES_PER_JOB ranges; otherwise KVT_STATUS_INVALID_ARGUMENT, with the job's
///   one result, and the arrays are not read. A range of length 0, of an unknown region,
///   or reaching past its region's end is KVT_STATUS_INVALID_ARGUMENT with the job's one
///   result, before any I/O.
/// * The ranges' bytes are read asynchronously: the caller must not modify them until the
///   job's result has been returned by `kvt_tier_poll`.
/// * A job holds its ranges until then: store jobs may share bytes; bytes a load holds are
///   KVT_STATUS_BLOCK_BUSY (with the job's one result).
///
/// Result guarantees, threading, and behaviour after shutdown, after a caught panic and in
/// a fork() child as for `kvt_tier_submit_store`.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_submit_store_ranges(
    tier: *mut kvt_tier,
    job_id: u64,
    ranges: *const kvt_range,
    ranges_per_key: usize,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
) -> Status {
    // SAFETY: the arguments are passed through under the same contract.
    unsafe {
        submit(
            "kvt_tier_submit_store_ranges",
            JobKind::Store,
            tier,
            job_id,
            JobMemory::Ranges {
                ranges,
                per_key: ranges_per_key,
            },
            keys,
            key_len,
            num_keys,
        )
    }
}

/// Submits a job that loads key `i`, for `i < num_keys`, into the ranges
/// `ranges[i * ranges_per_key .. (i + 1) * ranges_per_key]`: the object's bytes fill them
/// one after the other, straight from the store (no staging copy).
///
/// Same arguments, ownership and result guarantees as `kvt_tier_submit_store_ranges`. The
/// ranges are written asynchronously: the caller must not read or write them until the
/// job's result has been returned by `kvt_tier_poll`; after that the library never writes
/// them again. A load needs its bytes alone: bytes that another job (store or load) holds
/// are KVT_STATUS_BLOCK_BUSY, and ranges of one load job that overlap each other are
/// KVT_STATUS_INVALID_ARGUMENT, both with the job's one result. A key whose object is
/// missing, or whose length differs from the sum of its ranges, fails alone.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_submit_load_ranges(
    tier: *mut kvt_tier,
    job_id: u64,
    ranges: *const kvt_range,
    ranges_per_key: usize,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
) -> Status {
    // SAFETY: the arguments are passed through under the same contract.
    unsafe {
        submit(
            "kvt_tier_submit_load_ranges",
            JobKind::Load,
            tier,
            job_id,
            JobMemory::Ranges {
                ranges,
                per_key: ranges_per_key,
            },
            keys,
            key_len,
            num_keys,
        )
    }
}

/// Takes up to `capacity` finished jobs into `out_results` and writes their number to
/// `*out_count`. Never blocks; 0 results is KVT_STATUS_OK.
///
/// Each job is returned exactly once. The `key_status` and `message` arrays inside the
/// results are owned by the tier and stay valid until the next `kvt_tier_poll` or
/// `kvt_tier_free` on this tier. NULL `tier`, `out_count`, or `out_results` with
/// `capacity > 0` is KVT_STATUS_NULL_ARGUMENT; on any error `*out_count` is 0 (when
/// `out_count` is not NULL). Works after `kvt_tier_shutdown`, to collect the last results.
/// Thread-safe, but not concurrently with itself on the same tier (the previous results'
/// arrays are released by the next poll).
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_poll(
    tier: *mut kvt_tier,
    out_results: *mut kvt_result,
    capacity: usize,
    out_count: *mut usize,
) -> Status {
    // SAFETY: `out_count` is NULL or writable (the header's contract).
    unsafe { reset_count(out_count) };
    let body = |handle: &kvt_tier| {
        check_outputs(out_results, capacity, out_count)?;
        let mut scratch = handle.last_poll.lock().unwrap_or_else(|p| p.into_inner());
        scratch.key_status.clear();
        scratch.messages.clear();
        let results = handle.tier.poll(capacity);
        for (i, r) in results.into_iter().enumerate() {
            let failed = r.key_status.iter().filter(|s| !s.is_ok()).count();
            let message = c_text(r.message.clone());
            let out = kvt_result {
                job_id: r.job_id,
                kind: r.kind.into(),
                status: r.status,
                bytes: r.bytes,
                seconds: r.seconds,
                num_keys: r.key_status.len(),
                num_failed_keys: failed,
                key_status: r.key_status.as_ptr(),
                message: message.as_ptr(),
            };
            // Moving the Vec and CString keeps their heap buffers where the pointers point.
            scratch.key_status.push(r.key_status);
            scratch.messages.push(message);
            // SAFETY: `out_results` is non-NULL (check_outputs) and holds `capacity`
            // elements by the header's contract; `i < capacity` as poll returns at most
            // `capacity` results. `out_count` is non-NULL (check_outputs).
            unsafe {
                out_results.add(i).write(out);
                *out_count = i + 1;
            }
        }
        Ok(())
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition; check_tier
    // verifies what it can).
    unsafe { guard_tier("kvt_tier_poll", tier, Access::Collect, body) }
}

/// A file descriptor that is readable while results wait to be polled, for epoll/poll
/// based hosts. Owned by the tier: do not close it or read from it. Valid until
/// `kvt_tier_free`. Returns -1 for a NULL or invalid tier, and in a fork() child of the
/// tier's process. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_event_fd(tier: *mut kvt_tier) -> c_int {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier_or("kvt_tier_event_fd", tier, Access::Collect, -1, |handle| {
            Ok(handle.tier.ready_fd())
        })
        .0
    }
}

/// Where the tier's objects are, in words, for logs and metric labels: the store's kind,
/// bucket or container or directory, its endpoint, and the prefix/namespace its objects
/// live under, e.g. `s3 bucket "kv" at http://127.0.0.1:9000, objects under
/// kv/model-a/`. Never holds a credential. The one definition of a tier's printable
/// location: bindings show this text rather than composing their own.
///
/// Owned by the tier: do not free it; valid until `kvt_tier_free` (also after
/// `kvt_tier_shutdown`). Returns NULL for a NULL or invalid tier, and in a fork() child of
/// the tier's process. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_location(tier: *const kvt_tier) -> *const c_char {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier_or(
            "kvt_tier_location",
            tier.cast_mut(),
            Access::Collect,
            std::ptr::null(),
            |handle| Ok(handle.location.as_ptr()),
        )
        .0
    }
}

/// Number of jobs submitted and not yet finished (results not yet queued).
/// Returns 0 for a NULL or invalid tier, and in a fork() child of the tier's process.
/// Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_jobs_in_flight(tier: *mut kvt_tier) -> usize {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier_or(
            "kvt_tier_jobs_in_flight",
            tier,
            Access::Collect,
            0,
            |handle| Ok(handle.tier.jobs_in_flight()),
        )
        .0
    }
}

/// Blocks until no job is in flight, or `timeout_ms` passes (KVT_STATUS_TIMEOUT). Results
/// stay queued for the next `kvt_tier_poll`. Nothing is cancelled. The tier stays usable.
/// Thread-safe; must not be called from a thread that other jobs' completion depends on.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_drain(tier: *mut kvt_tier, timeout_ms: u64) -> Status {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier("kvt_tier_drain", tier, Access::Work, |handle| {
            handle.tier.drain(Duration::from_millis(timeout_ms))
        })
    }
}

/// Shuts the tier down, in order:
/// 1. new submissions fail with KVT_STATUS_SHUT_DOWN (and still yield their result);
/// 2. transfers not yet started are cancelled and reported as KVT_STATUS_CANCELLED;
/// 3. transfers in progress are waited for, up to `shutdown_timeout_ms` of the config,
///    then abandoned (reported as KVT_STATUS_CANCELLED);
/// 4. the I/O threads are stopped and joined.
///
/// When it returns, the library no longer touches the host pool. Afterwards
/// `kvt_tier_poll`, `kvt_tier_take_events`, `kvt_tier_stats`, `kvt_tier_event_fd`,
/// `kvt_tier_jobs_in_flight`, `kvt_tier_shutdown` and `kvt_tier_free` keep working; the
/// submit calls return KVT_STATUS_SHUT_DOWN and still yield their result; every other
/// call returns KVT_STATUS_SHUT_DOWN. Idempotent. Blocks. Must not run concurrently with
/// other calls on the same tier.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_shutdown(tier: *mut kvt_tier) -> Status {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier("kvt_tier_shutdown", tier, Access::Collect, |handle| {
            handle.tier.shutdown();
            Ok(())
        })
    }
}

/// Shuts the tier down (as `kvt_tier_shutdown`) and releases the handle and everything it
/// owns, including unpolled results and the event fd. `tier` must not be used afterwards
/// and must not be freed twice (undefined behaviour). NULL is a no-op. Blocks. Must not
/// run concurrently with other calls on the same tier.
///
/// In a fork() child of the process that created the tier, it returns at once: the
/// handle is retired without joining the tier's threads (they exist only in the parent)
/// and without touching locks, sockets or registrations shared with the parent; only the
/// child's copy of the event fd is closed, the rest of the tier's memory stays allocated
/// in the child.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_free(tier: *mut kvt_tier) {
    if tier.is_null() {
        set_last_error(None);
        return;
    }
    // SAFETY: non-NULL, and a handle from kvt_tier_new not yet freed (the header's
    // precondition): its memory is readable.
    let forked = unsafe {
        std::ptr::read_volatile(std::ptr::addr_of!((*tier).magic)) == TIER_MAGIC
            && (*tier).pid != current_pid()
    };
    if forked {
        // A forked child: the tier's threads exist only in the parent, its locks may be
        // held by them, and its sockets and epoll registrations are shared with the
        // parent. Releasing any of that would hang or disturb the parent, so the handle
        // is retired without running its destructor: only the child's copy of the event
        // fd is closed.
        // SAFETY: a live handle (as above); the child owns its copy of the event fd, which
        // nothing else in the child uses once the handle is retired.
        unsafe {
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*tier).magic), 0);
            libc::close((*tier).tier.ready_fd());
        }
        set_last_error(None);
        return;
    }
    // SAFETY: non-NULL and a handle from kvt_tier_new (the header's precondition).
    let (live, _) =
        unsafe { guard_tier_or("kvt_tier_free", tier, Access::Collect, false, |_| Ok(true)) };
    if !live {
        return;
    }
    // Separate steps: a panic while the handle is being released must not mark the
    // (by then freed) handle failed.
    let stopped = guard("kvt_tier_free", || {
        // SAFETY: check_tier found a live handle, and the caller runs nothing else on it.
        unsafe { (*tier).tier.shutdown() };
        Ok(())
    });
    let released = guard("kvt_tier_free", || {
        // SAFETY: the handle came from Box::into_raw in kvt_tier_new and is released once:
        // the tag is cleared first, so a second free is refused as a best effort.
        unsafe {
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*tier).magic), 0);
            drop(Box::from_raw(tier));
        }
        Ok(())
    });
    if stopped != Status::Ok && released == Status::Ok {
        set_last_error(Some(Error::new(
            stopped,
            "kvt_tier_free: the shutdown panicked; the handle was released",
        )));
    }
}

/// Answers whether the tier holds `key` for request `req_id`, in `*out_result`:
/// KVT_LOOKUP_RESULT_HIT, _MISS, or _RETRY when not known yet.
///
/// Never blocks and never does I/O on the caller's thread: an unknown key answers RETRY
/// and is checked after the next `kvt_tier_schedule_end`; ask again in a later step.
/// Verdicts are shared by every request that asked for the key and kept until the last of
/// them is finished with `kvt_tier_request_finished`. A load job that fails turns only its
/// failed keys into MISS for the requests holding them. `key` is borrowed for the call.
/// NULL `tier`, `key` or `out_result` is KVT_STATUS_NULL_ARGUMENT; a wrong key length
/// (outside 5..68, or not the configured `key_bytes`) is KVT_STATUS_INVALID_ARGUMENT and
/// `key` is not read; `*out_result` is written only on success. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_lookup(
    tier: *mut kvt_tier,
    req_id: u64,
    key: *const u8,
    key_len: usize,
    out_result: *mut kvt_lookup_result,
) -> Status {
    let body = |handle: &kvt_tier| {
        if key.is_null() || out_result.is_null() {
            return Err(Error::new(
                Status::NullArgument,
                if key.is_null() {
                    "key is NULL"
                } else {
                    "out_result is NULL"
                },
            ));
        }
        crate::key::check_key_len(key_len)?;
        // SAFETY: non-NULL (checked above) and `key_len` readable bytes by the header's
        // contract; `key_len` is at most MAX_KEY_BYTES (check_key_len).
        let key = unsafe { std::slice::from_raw_parts(key, key_len) };
        let verdict = handle.tier.lookup(req_id, key)?;
        // SAFETY: non-NULL (checked above) and writable by the header's contract.
        unsafe { *out_result = verdict.into() };
        Ok(())
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier("kvt_tier_lookup", tier, Access::Work, body) }
}

/// Ends a scheduler step: sends the lookups asked since the last call, deduplicated
/// across requests, as one batch of concurrent existence checks on the lookup lane
/// (separate from transfers). Never blocks. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_schedule_end(tier: *mut kvt_tier) -> Status {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier("kvt_tier_schedule_end", tier, Access::Work, |handle| {
            handle.tier.schedule_end()
        })
    }
}

/// Tells the tier that request `req_id` will not look anything up again; verdicts held
/// only by it are dropped (one still being checked is dropped when its answer arrives).
/// Unknown ids are ignored. Never blocks. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_request_finished(tier: *mut kvt_tier, req_id: u64) -> Status {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier("kvt_tier_request_finished", tier, Access::Work, |handle| {
            handle.tier.request_finished(req_id);
            Ok(())
        })
    }
}

/// Checks `num_keys` keys (`key_len` bytes each, back to back in `keys`) in the store now
/// and writes one verdict per key to `out_results[0..num_keys]`: KVT_LOOKUP_RESULT_HIT or
/// _MISS as the store answered, _RETRY where the check failed or had not answered within
/// `timeout_ms` (the late answer is dropped; nothing is written after the call returns).
///
/// Unlike `kvt_tier_lookup`, this blocks: for engines whose existence call must answer
/// before it returns (SGLang's `batch_exists`). The keys are checked all at once on the
/// lookup lane (up to `max_inflight_lookups` in flight), so a batch takes about one
/// round trip; the calling thread only waits. It shares no state with the per-request
/// lookups; its answers renew or drop the tier's hints as theirs do. `keys` is borrowed
/// for the call.
///
/// `num_keys == 0` is OK (nothing is read or written). NULL `tier`, or NULL `keys` or
/// `out_results` with `num_keys > 0`, is KVT_STATUS_NULL_ARGUMENT; a wrong `key_len`
/// (outside 5..68, or not the configured `key_bytes`) or `num_keys` above
/// KVT_MAX_KEYS_PER_JOB is KVT_STATUS_INVALID_ARGUMENT and `keys` is not read; after
/// shutdown (also one on another thread during the call) KVT_STATUS_SHUT_DOWN; called on
/// one of the tier's own threads (a log callback), KVT_STATUS_INVALID_ARGUMENT. On any
/// error `out_results` is not written. Thread-safe; must not run concurrently with
/// `kvt_tier_shutdown` or `kvt_tier_free` of the same tier.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_check_now(
    tier: *mut kvt_tier,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
    timeout_ms: u64,
    out_results: *mut kvt_lookup_result,
) -> Status {
    let body = |handle: &kvt_tier| {
        if num_keys == 0 {
            return Ok(());
        }
        if keys.is_null() || out_results.is_null() {
            return Err(Error::new(
                Status::NullArgument,
                if keys.is_null() {
                    format!("keys is NULL with num_keys = {num_keys}")
                } else {
                    format!("out_results is NULL with num_keys = {num_keys}")
                },
            ));
        }
        crate::key::check_key_len(key_len)?;
        if num_keys > crate::engine::MAX_KEYS_PER_JOB {
            return Err(Error::invalid(format!(
                "num_keys is {num_keys}; a check has at most {} keys",
                crate::engine::MAX_KEYS_PER_JOB
            )));
        }
        // SAFETY: non-NULL (checked above) and `key_len * num_keys` readable bytes by the
        // header's contract; both are bounded (checked above), so the product fits.
        let bytes = unsafe { std::slice::from_raw_parts(keys, key_len * num_keys) };
        let keys: Vec<&[u8]> = bytes.chunks_exact(key_len).collect();
        let verdicts = handle
            .tier
            .check_now(&keys, Duration::from_millis(timeout_ms))?;
        // SAFETY: non-NULL (checked above) and `num_keys` writable results by the header's
        // contract; `verdicts` has one per key.
        let out = unsafe { std::slice::from_raw_parts_mut(out_results, num_keys) };
        for (slot, verdict) in out.iter_mut().zip(verdicts) {
            *slot = verdict.into();
        }
        Ok(())
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier("kvt_tier_check_now", tier, Access::Work, body) }
}

/// Takes up to `capacity` BlockStored events into `out_events`, oldest first, and writes
/// their number to `*out_count`; the rest wait for the next call.
///
/// With `enable_kv_events` in the configuration, each store job whose result
/// `kvt_tier_poll` has returned as successful yields exactly one event holding the job's
/// keys in order. Failed stores and loads yield none. The key buffers are owned by the
/// tier and valid until the next `kvt_tier_take_events` or `kvt_tier_free`. NULL `tier`,
/// `out_count`, or `out_events` with `capacity > 0` is KVT_STATUS_NULL_ARGUMENT; on error
/// `*out_count` is 0. Not concurrently with itself on one tier.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_take_events(
    tier: *mut kvt_tier,
    out_events: *mut kvt_event,
    capacity: usize,
    out_count: *mut usize,
) -> Status {
    // SAFETY: the arguments are passed through under the same contract.
    unsafe {
        take_events(
            "kvt_tier_take_events",
            tier,
            out_events,
            capacity,
            out_count,
            true,
            kvt_event::of,
        )
    }
}

/// Takes up to `capacity` KV events, BlockStored and BlockRemoved, into `out_events`,
/// oldest first, and writes their number to `*out_count`; the rest wait for the next call.
///
/// With `enable_kv_events`, BlockStored events are those of `kvt_tier_take_events`, and
/// every block the tier deletes yields a BlockRemoved event (`removed` true, `job_id` 0):
/// eviction (the `eviction` configuration) and corrupt objects deleted under
/// `on_corrupt = fail_and_delete`. Use this function or `kvt_tier_take_events` on a tier,
/// not both: the latter drops BlockRemoved events it meets. Ownership, NULL rules and
/// thread-safety as `kvt_tier_take_events`; the key buffers stay valid until the next
/// call of either function or `kvt_tier_free`.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_take_kv_events(
    tier: *mut kvt_tier,
    out_events: *mut kvt_kv_event,
    capacity: usize,
    out_count: *mut usize,
) -> Status {
    let make = |e: &crate::engine::KvEvent| kvt_kv_event {
        event: kvt_event::of(e),
        removed: e.removed,
    };
    // SAFETY: the arguments are passed through under the same contract.
    unsafe {
        take_events(
            "kvt_tier_take_kv_events",
            tier,
            out_events,
            capacity,
            out_count,
            false,
            make,
        )
    }
}

/// Runs one eviction round now and waits for it: lists the tier's namespace and deletes
/// the oldest blocks past `eviction.max_bytes` and every block older than
/// `eviction.max_age_s` (the background task does the same every
/// `eviction.interval_ms`). Each deleted block yields a BlockRemoved event. Writes what
/// it found and did to `*out_report` (zeroed on error). KVT_STATUS_STATE if the
/// configuration has no `eviction`; NULL `tier` or `out_report` is
/// KVT_STATUS_NULL_ARGUMENT. Blocks for the listing and deletes. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_evict_now(
    tier: *mut kvt_tier,
    out_report: *mut kvt_eviction_report,
) -> Status {
    // SAFETY: the header's contract for `tier` and `out_report`.
    unsafe { eviction_round("kvt_tier_evict_now", tier, out_report, |t| t.evict_now()) }
}

/// Runs an eviction round (`round`) for an export and writes its report to `*out_report`,
/// zeroed first so that it holds zeros on any error.
///
/// # Safety
/// `tier` is NULL or a live handle; `out_report` is NULL or writable.
unsafe fn eviction_round(
    name: &str,
    tier: *mut kvt_tier,
    out_report: *mut kvt_eviction_report,
    round: impl FnOnce(&Tier) -> crate::error::Result<crate::engine::EvictionReport>,
) -> Status {
    if !out_report.is_null() {
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe { out_report.write(Default::default()) };
    }
    let body = |handle: &kvt_tier| {
        if out_report.is_null() {
            return Err(Error::new(Status::NullArgument, "out_report is NULL"));
        }
        let report = round(&handle.tier)?;
        // SAFETY: non-NULL (checked above) and writable (the caller's contract).
        unsafe { out_report.write(report.into()) };
        Ok(())
    };
    // SAFETY: `tier` is NULL or a live handle (the caller's contract).
    unsafe { guard_tier(name, tier, Access::Work, body) }
}

/// Deletes every block of the tier's namespace (the objects under its `prefix` and
/// `namespace` that have a block's name; nothing else there) and waits for it: an
/// eviction round that keeps nothing, whether or not `eviction` is configured. Each
/// deleted block yields a BlockRemoved event and is forgotten (a later store uploads it
/// again). Blocks other tiers stored into the same namespace go too; with an empty prefix
/// and namespace that is every block of the bucket. Writes what it found and did to
/// `*out_report` (zeroed on error). NULL `tier` or `out_report` is
/// KVT_STATUS_NULL_ARGUMENT; after shutdown KVT_STATUS_SHUT_DOWN. Blocks for the listing
/// and deletes. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_clear(
    tier: *mut kvt_tier,
    out_report: *mut kvt_eviction_report,
) -> Status {
    // SAFETY: the header's contract for `tier` and `out_report`.
    unsafe { eviction_round("kvt_tier_clear", tier, out_report, |t| t.clear()) }
}

/// Fills a caller's event array.
///
/// # Safety
/// The contract of `kvt_tier_take_events`.
unsafe fn take_events<T>(
    name: &str,
    tier: *mut kvt_tier,
    out_events: *mut T,
    capacity: usize,
    out_count: *mut usize,
    stored_only: bool,
    make: impl Fn(&crate::engine::KvEvent) -> T,
) -> Status {
    // SAFETY: `out_count` is NULL or writable (the header's contract).
    unsafe { reset_count(out_count) };
    let body = |handle: &kvt_tier| {
        check_outputs(out_events, capacity, out_count)?;
        let mut kept = handle.last_events.lock().unwrap_or_else(|p| p.into_inner());
        *kept = if stored_only {
            handle.tier.take_stored_events(capacity)
        } else {
            handle.tier.take_events(capacity)
        };
        for (i, event) in kept.iter().enumerate() {
            let event = make(event);
            // SAFETY: `out_events` is non-NULL (check_outputs) and holds `capacity`
            // elements by the header's contract; at most `capacity` events were taken.
            unsafe {
                out_events.add(i).write(event);
                *out_count = i + 1;
            }
        }
        Ok(())
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier(name, tier, Access::Collect, body) }
}

/// Copies the tier's counters into `*out_stats`, writing at most `stats_size` bytes:
/// pass `sizeof(kvt_stats)`. Counters are only ever appended, so a caller built against
/// an older header gets the counters it knows and nothing is written past its struct.
/// NULL `tier` or `out_stats` is KVT_STATUS_NULL_ARGUMENT. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_stats(
    tier: *mut kvt_tier,
    out_stats: *mut kvt_stats,
    stats_size: usize,
) -> Status {
    let body = |handle: &kvt_tier| {
        if out_stats.is_null() {
            return Err(Error::new(Status::NullArgument, "out_stats is NULL"));
        }
        let stats = kvt_stats::from(handle.tier.stats());
        let n = stats_size.min(std::mem::size_of::<kvt_stats>());
        // SAFETY: `out_stats` is non-NULL and holds `stats_size` writable bytes by the
        // header's contract; `n` is at most that and at most the snapshot's size.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &stats as *const kvt_stats as *const u8,
                out_stats as *mut u8,
                n,
            )
        };
        Ok(())
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier("kvt_tier_stats", tier, Access::Collect, body) }
}

/// Writes the tier's metrics in the Prometheus text exposition format (version 0.0.4)
/// into `out_buf` (`capacity` bytes), NUL-terminated, and their length without the NUL to
/// `*out_len`: every counter of `kvt_stats` as `kvtier_<field>_total` (same values as
/// `kvt_tier_stats` at the same moment), `kvtier_failed_keys_total{status=...}`, the gauges
/// `kvtier_jobs_in_flight` and `kvtier_lookups_tracked`, and the histograms
/// `kvtier_job_seconds{kind="store"|"load"}`, `kvtier_existence_check_seconds` and
/// `kvtier_object_bytes`. When `capacity` is too small, returns
/// KVT_STATUS_INVALID_ARGUMENT with `*out_len` set to the length needed (call again with
/// at least `*out_len + 1` bytes; the text may grow slightly between calls). NULL `tier`
/// or `out_len`, or NULL `out_buf` with `capacity > 0`, is KVT_STATUS_NULL_ARGUMENT. Works
/// after `kvt_tier_shutdown`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_metrics(
    tier: *mut kvt_tier,
    out_buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> Status {
    let body = |handle: &kvt_tier| {
        if out_len.is_null() || (out_buf.is_null() && capacity > 0) {
            return Err(Error::new(
                Status::NullArgument,
                "out_len or out_buf is NULL",
            ));
        }
        // SAFETY: checked non-NULL above; sized by the caller as the header states.
        unsafe { write_text(&handle.tier.metrics(), out_buf, capacity, out_len) }
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier("kvt_tier_metrics", tier, Access::Collect, body) }
}

/// Routes the library's log records (its own, and those of the storage client it uses,
/// retry messages among them) to `callback`, called with `userdata`, a level, the
/// record's target (a Rust module path) and its message; both strings are NUL-terminated
/// and valid only during the call. Records more verbose than `max_level` are dropped
/// before they are formatted. NULL `callback` restores the default: records go to stderr,
/// filtered by the `RUST_LOG` environment variable (default `warn`). No record carries a
/// credential.
///
/// Process-wide: one callback for every tier. The callback may be called from any of
/// the library's threads, several at once, and must not block for long, unwind, or call
/// `kvt_set_log_callback`; other kvt_ calls from within it are allowed (their own records
/// then go to stderr). When this function returns, the previous callback is not running
/// and is never called again, so its `userdata` may be freed. Never fails: returns
/// KVT_STATUS_OK, or KVT_STATUS_INVALID_ARGUMENT for a `max_level` outside the enum.
/// Thread-safe. (A Rust program that installed its own `log` logger before the first
/// kvt_ call keeps it, and callbacks are not called.)
#[no_mangle]
pub unsafe extern "C" fn kvt_set_log_callback(
    callback: logs::LogCallback,
    userdata: *mut std::ffi::c_void,
    max_level: c_int,
) -> Status {
    guard("kvt_set_log_callback", || {
        use logs::LogLevel;
        let level = [
            LogLevel::Off,
            LogLevel::Error,
            LogLevel::Warn,
            LogLevel::Info,
            LogLevel::Debug,
            LogLevel::Trace,
        ]
        .into_iter()
        .find(|l| *l as c_int == max_level)
        .ok_or_else(|| {
            Error::invalid(format!(
                "max_level {max_level} is not a kvt_log_level (0..5)"
            ))
        })?;
        logs::set_callback(callback, userdata, level);
        Ok(())
    })
}

/// Computes vLLM's namespace string
/// `<model_name with / replaced by _>_<first 12 hex of SHA-256 of the field set>_r<rank>`
/// from `fields_json`, the JSON object of hashed fields (model_name, tokens_per_hash,
/// blocks_per_file, tp_size, pp_size, pcp_size, dcp_size, dtype, kv_cache_groups,
/// inference_engine, and parallel_agnostic / replicated_layout where vLLM includes them),
/// so that objects are named as vLLM's tiers name them.
///
/// Writes the NUL-terminated string into `out_buf` (`capacity` bytes) and its length
/// without the NUL to `*out_len`. When `capacity` is too small, returns
/// KVT_STATUS_INVALID_ARGUMENT with `*out_len` set to the length needed. NULL
/// `fields_json` or `out_len`, or NULL `out_buf` with `capacity > 0`, is
/// KVT_STATUS_NULL_ARGUMENT. Needs no tier. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_vllm_namespace(
    fields_json: *const c_char,
    rank: u32,
    out_buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> Status {
    guard("kvt_vllm_namespace", || {
        if fields_json.is_null() || out_len.is_null() || (out_buf.is_null() && capacity > 0) {
            return Err(Error::new(
                Status::NullArgument,
                "fields_json, out_len or out_buf is NULL",
            ));
        }
        // SAFETY: non-NULL (checked above), a NUL-terminated string by the header's contract.
        let text = unsafe { CStr::from_ptr(fields_json) }
            .to_str()
            .map_err(|_| Error::invalid("fields_json is not UTF-8"))?;
        let fields: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid(format!("fields_json is not JSON: {e}")))?;
        let namespace = crate::namespace::vllm_namespace(&fields, rank)?;
        // SAFETY: the output arguments were checked non-NULL above and are sized by the
        // caller as the header states.
        unsafe { write_text(&namespace, out_buf, capacity, out_len) }
    })
}

/// Writes `text` and a NUL into `out_buf` and its length (without the NUL) to
/// `*out_len`; when it does not fit, only `*out_len` is written, and the error says how
/// many bytes are needed.
///
/// # Safety
/// `out_len` is non-NULL and writable; `out_buf` holds `capacity` writable bytes (and is
/// non-NULL when `capacity > 0`).
unsafe fn write_text(
    text: &str,
    out_buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> crate::Result<()> {
    // SAFETY: the function's contract.
    unsafe { *out_len = text.len() };
    if text.len() + 1 > capacity {
        return Err(Error::invalid(format!(
            "out_buf holds {capacity} bytes; {} needed",
            text.len() + 1
        )));
    }
    // SAFETY: `out_buf` holds `capacity` writable bytes and the text plus its NUL fits
    // (checked just above); it is non-NULL as capacity > 0.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), out_buf as *mut u8, text.len());
        *out_buf.add(text.len()) = 0;
    }
    Ok(())
}

/// `*out_count` reads 0 on every error of a function that fills a caller array.
unsafe fn reset_count(out_count: *mut usize) {
    if !out_count.is_null() {
        // SAFETY: non-NULL, and writable by the caller's contract.
        unsafe { *out_count = 0 };
    }
}

/// Checks the output arguments of a function that fills a caller array.
fn check_outputs<T>(out: *mut T, capacity: usize, out_count: *mut usize) -> crate::Result<()> {
    if out_count.is_null() {
        return Err(Error::new(Status::NullArgument, "out_count is NULL"));
    }
    if out.is_null() && capacity > 0 {
        return Err(Error::new(
            Status::NullArgument,
            "the output array is NULL with capacity > 0",
        ));
    }
    Ok(())
}

pub(crate) fn status_of(result: crate::Result<()>) -> Status {
    match result {
        Ok(()) => {
            set_last_error(None);
            Status::Ok
        }
        Err(e) => {
            let status = e.status;
            set_last_error(Some(e));
            status
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn header_constants_match_the_engine() {
        assert_eq!(KVT_KEY_GROUP_BYTES, crate::key::GROUP_BYTES);
        assert_eq!(KVT_DEFAULT_KEY_BYTES, crate::config::DEFAULT_KEY_BYTES);
        assert_eq!(KVT_MAX_KEYS_PER_JOB, crate::engine::MAX_KEYS_PER_JOB);
    }

    fn memory_tier() -> *mut kvt_tier {
        let mut tier = std::ptr::null_mut();
        let status =
            // SAFETY: a NUL-terminated literal and a valid out-pointer.
            unsafe { kvt_tier_new(c"{\"store\":{\"type\":\"memory\"}}".as_ptr(), &mut tier) };
        assert_eq!(status, Status::Ok);
        tier
    }

    fn last_error() -> String {
        // SAFETY: kvt_last_error returns a NUL-terminated string owned by this thread, valid until its next call.
        unsafe { CStr::from_ptr(kvt_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_marks_the_tier_failed_and_every_job_still_gets_its_result() {
        let tier = memory_tier();
        let mut pool = vec![0u8; 4096];
        let key = [7u8; KVT_DEFAULT_KEY_BYTES];
        let block = [0u64];
        // SAFETY: `tier` is live and `pool` is 4096 bytes that outlive the tier's jobs; the key and block arrays are live for each call.
        unsafe {
            assert_eq!(
                kvt_tier_register_memory(tier, pool.as_mut_ptr(), 1, 4096),
                Status::Ok
            );
            let status = guard_tier("test_call", tier, Access::Work, |_| panic!("deliberate"));
            assert_eq!(status, Status::Panic);
            let message = last_error();
            assert!(
                message.contains("test_call: deliberate") && message.contains("ffi/mod.rs"),
                "{message}"
            );
            // Work is refused: submits with their one result, other calls outright.
            assert_eq!(
                kvt_tier_submit_store(tier, 1, block.as_ptr(), key.as_ptr(), key.len(), 1),
                Status::Panic
            );
            let mut verdict = kvt_lookup_result::Retry;
            assert_eq!(
                kvt_tier_lookup(tier, 1, key.as_ptr(), key.len(), &mut verdict),
                Status::Panic
            );
            assert_eq!(kvt_tier_schedule_end(tier), Status::Panic);
            assert_eq!(kvt_tier_drain(tier, 0), Status::Panic);
            // Collecting still works.
            let mut results: [std::mem::MaybeUninit<kvt_result>; 4] =
                [const { std::mem::MaybeUninit::uninit() }; 4];
            let mut n = 9;
            assert_eq!(
                kvt_tier_poll(tier, results.as_mut_ptr() as *mut kvt_result, 4, &mut n),
                Status::Ok
            );
            assert_eq!(n, 1);
            let r = results[0].assume_init_read();
            assert_eq!((r.job_id, r.status, r.num_keys), (1, Status::Panic, 1));
            let mut stats = kvt_stats::default();
            assert_eq!(
                kvt_tier_stats(tier, &mut stats, std::mem::size_of::<kvt_stats>()),
                Status::Ok
            );
            assert_eq!(kvt_tier_shutdown(tier), Status::Ok);
            kvt_tier_free(tier);
        }
    }

    #[test]
    fn panics_inside_calls_do_not_reach_the_previous_hook() {
        use std::sync::atomic::AtomicUsize;
        static PRINTED: AtomicUsize = AtomicUsize::new(0);
        // The hook in place before the library's: it counts the panics of this test's
        // threads that would have been printed.
        // (Set directly: tests share the process, so the library's one-time install may
        // already have happened.)
        boundary::install_panic_hook();
        let previous = std::panic::take_hook();
        std::panic::set_hook(boundary::silencing_hook(Box::new(move |info| {
            if std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("hook-test-"))
            {
                PRINTED.fetch_add(1, Ordering::SeqCst);
            } else {
                previous(info);
            }
        })));
        let inside = std::thread::Builder::new()
            .name("hook-test-inside".into())
            .spawn(|| guard("test_call", || panic!("inside a call")))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(inside, Status::Panic);
        assert_eq!(
            PRINTED.load(Ordering::SeqCst),
            0,
            "a panic inside a kvt_ call reached the host's hook"
        );
        let outside = std::thread::Builder::new()
            .name("hook-test-outside".into())
            .spawn(|| panic!("host's own"))
            .unwrap()
            .join();
        assert!(outside.is_err());
        assert_eq!(
            PRINTED.load(Ordering::SeqCst),
            1,
            "a panic outside the library must reach the host's hook"
        );
    }

    #[test]
    fn every_status_has_a_string_and_round_trips() {
        for v in 0..21 {
            let s = status_from_int(v).expect("contiguous codes");
            assert_eq!(s as c_int, v);
            // SAFETY: kvt_status_str returns a static NUL-terminated string for any code.
            let text = unsafe { CStr::from_ptr(kvt_status_str(v)) }
                .to_str()
                .unwrap();
            assert_eq!(text, s.as_str());
        }
        assert!(status_from_int(22).is_none());
        assert_eq!(
            // SAFETY: kvt_status_str returns a static NUL-terminated string for any code.
            unsafe { CStr::from_ptr(kvt_status_str(-1)) }
                .to_str()
                .unwrap(),
            "unknown status"
        );
    }
}
