//! KV events (BlockStored, BlockRemoved) and the deletions that make the removed ones:
//! eviction rounds and `kvt_tier_clear`.

use super::*;

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
    let make = |e: &kvtier_core::KvEvent| kvt_kv_event {
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
    round: impl FnOnce(&Tier) -> kvtier_core::Result<kvtier_core::EvictionReport>,
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

/// Deletes every block under the tier's `prefix` and `namespace`, at any depth, and waits
/// for it: an eviction round that keeps nothing, whether or not `eviction` is configured.
/// A block is an object whose name is a block's name (`<h[0:3]>/<h[3:5]>_g<group>/<h>.bin`
/// after a namespace); nothing else there is touched (probe objects, temporary files,
/// other objects). That is the namespace's blocks, also those other tiers stored, and the
/// blocks of the namespaces below it: with an empty `namespace`, every namespace under
/// the prefix; with an empty prefix and namespace, every block of the bucket. Each deleted
/// block of the tier's own namespace yields a BlockRemoved event and is forgotten (a later
/// store uploads it again); those of other namespaces are counted in the report only.
/// Writes what it found and did to `*out_report` (zeroed on error). NULL `tier` or
/// `out_report` is KVT_STATUS_NULL_ARGUMENT; after shutdown KVT_STATUS_SHUT_DOWN. Blocks
/// for the listing and deletes. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_clear(
    tier: *mut kvt_tier,
    out_report: *mut kvt_eviction_report,
) -> Status {
    // SAFETY: the header's contract for `tier` and `out_report`.
    unsafe { eviction_round("kvt_tier_clear", tier, out_report, |t| t.clear()) }
}

/// Deletes the blocks of `num_keys` keys (`key_len` bytes each, back to back in `keys`)
/// and waits for it, for hosts whose own eviction names the blocks to drop (LMCache's L2
/// eviction). Each block whose object is gone afterwards, deleted or absent already,
/// yields a BlockRemoved event and is forgotten (a later store uploads it again); a block
/// whose delete failed stays and is not counted. Writes to `*out_report` the blocks asked
/// (`objects`) and gone (`deleted`); its byte counts are 0, sizes not being known without
/// a listing (zeroed on error). Another tier's load of a deleted block fails that key
/// alone with KVT_STATUS_NOT_FOUND. `num_keys == 0` is OK. NULL `tier` or `out_report`,
/// or NULL `keys` with `num_keys > 0`, is KVT_STATUS_NULL_ARGUMENT; a wrong `key_len`
/// (outside 5..68, or not the configured `key_bytes`) or `num_keys` above
/// KVT_MAX_KEYS_PER_JOB is KVT_STATUS_INVALID_ARGUMENT and nothing is deleted; after
/// shutdown KVT_STATUS_SHUT_DOWN. Blocks for the deletes. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_delete(
    tier: *mut kvt_tier,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
    out_report: *mut kvt_eviction_report,
) -> Status {
    let delete = |t: &Tier| {
        // SAFETY: the header's contract for `keys`.
        let keys = unsafe { key_array(keys, key_len, num_keys, "a delete") }?;
        if keys.is_empty() {
            return Ok(Default::default());
        }
        t.delete_keys(&keys)
    };
    // SAFETY: the header's contract for `tier`, `keys` and `out_report`.
    unsafe { eviction_round("kvt_tier_delete", tier, out_report, delete) }
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
    make: impl Fn(&kvtier_core::KvEvent) -> T,
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
