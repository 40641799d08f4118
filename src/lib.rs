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
pub mod logs;
// The exports, one concern a room, declared in the header's order: cbindgen writes the
// functions in the order it reads the modules (a comment between each keeps rustfmt from
// sorting them).
// Version, status names, schema, counters' names, configuration check.
mod info;
// kvt_tier_new and memory registration.
mod setup;
// Submitting stores and loads.
mod submit;
// Results and the ready fd.
mod poll;
// Location, jobs in flight, drain.
mod progress;
// Shutdown and free.
mod teardown;
// Lookups and existence checks.
mod lookups;
// KV events, eviction rounds, clear.
mod events;
// Pins: blocks the tier's own eviction keeps.
mod pins;
// Counters, metrics, the log callback.
mod observe;
// vLLM's namespace string.
mod namespace;
// Out-parameters and statuses (no exports).
mod out;
// The panic boundary and kvt_last_error (last in the header).
mod boundary;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use boundary::{
    c_text, current_pid, guard, guard_tier, guard_tier_or, guard_value, set_last_error, Access,
};

use abi::{kvt_eviction_report, kvt_job_kind, kvt_lookup_result, kvt_range, kvt_stats};
use kvtier_core::config::Locality;
use kvtier_core::MemoryRange;
use kvtier_core::{Error, Status};
use kvtier_core::{JobKind, KeyBatch, Tier};

// The exports, also the Rust API of this crate (its tests call them as C would).
pub use boundary::kvt_last_error;
pub use events::*;
pub use info::*;
pub use lookups::*;
pub use namespace::*;
pub use observe::*;
pub use pins::*;
pub use poll::*;
pub use progress::*;
pub use setup::*;
pub use submit::*;
pub use teardown::*;

use info::config_text;
use out::{check_outputs, key_array, reset_count, status_of, write_text};

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

// The header's constants are literals (cbindgen reads no paths); they are the engine's,
// every one checked when the library is compiled.
const _: () = assert!(KVT_KEY_GROUP_BYTES == kvtier_core::key::GROUP_BYTES);
const _: () = assert!(KVT_DEFAULT_KEY_BYTES == kvtier_core::config::DEFAULT_KEY_BYTES);
const _: () = assert!(KVT_MAX_KEYS_PER_JOB == kvtier_core::MAX_KEYS_PER_JOB);
const _: () = assert!(KVT_MAX_RANGES_PER_KEY == kvtier_core::MAX_RANGES_PER_KEY);
const _: () = assert!(KVT_MAX_RANGES_PER_JOB == kvtier_core::MAX_RANGES_PER_JOB);

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
    last_events: Mutex<Vec<kvtier_core::KvEvent>>,
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
    fn of(event: &kvtier_core::KvEvent) -> kvt_event {
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
