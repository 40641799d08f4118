//! Where a tier stores and how far its jobs are: location, jobs in flight, drain.

use super::*;

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
