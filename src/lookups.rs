//! "Do you have this block?": asynchronous lookups answered without blocking the caller,
//! and the batched existence check.

use super::*;

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
        kvtier_core::key::check_key_len(key_len)?;
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

/// Answers `num_keys` lookups at once, as `kvt_tier_lookup` called for each in turn would:
/// key `i` (`key_len` bytes at `keys + i * key_len`) for request `req_ids[i]`, its verdict
/// in `out_results[i]`. For hosts that gather a scheduler step's lookups and hand them over
/// in one call instead of one call per key; the sharing rules, RETRY for an unknown key and
/// its check after the next `kvt_tier_schedule_end` are those of `kvt_tier_lookup`.
///
/// `num_keys == 0` is OK (nothing is read or written). NULL `tier`, or NULL `req_ids`,
/// `keys` or `out_results` with `num_keys > 0`, is KVT_STATUS_NULL_ARGUMENT; a wrong
/// `key_len` (outside 5..68, or not the configured `key_bytes`) or `num_keys` above
/// KVT_MAX_KEYS_PER_JOB is KVT_STATUS_INVALID_ARGUMENT and nothing is looked up; after
/// shutdown KVT_STATUS_SHUT_DOWN. `out_results` is written only on success. The arrays are
/// borrowed for the call. Never blocks. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_lookup_batch(
    tier: *mut kvt_tier,
    req_ids: *const u64,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
    out_results: *mut kvt_lookup_result,
) -> Status {
    let body = |handle: &kvt_tier| {
        if num_keys == 0 {
            return Ok(());
        }
        if req_ids.is_null() || out_results.is_null() {
            let what = if req_ids.is_null() {
                "req_ids"
            } else {
                "out_results"
            };
            return Err(Error::new(
                Status::NullArgument,
                format!("{what} is NULL with num_keys = {num_keys}"),
            ));
        }
        // SAFETY: the header's contract for `keys`.
        let keys = unsafe { key_array(keys, key_len, num_keys, "a lookup batch") }?;
        // SAFETY: non-NULL (checked above) and `num_keys` readable ids by the header's
        // contract; `num_keys` is bounded (key_array checked it).
        let requests = unsafe { std::slice::from_raw_parts(req_ids, num_keys) };
        let verdicts = handle.tier.lookup_batch(requests, &keys)?;
        // SAFETY: non-NULL (checked above) and `num_keys` writable results by the header's
        // contract; `verdicts` has one per key.
        let out = unsafe { std::slice::from_raw_parts_mut(out_results, num_keys) };
        for (slot, verdict) in out.iter_mut().zip(verdicts) {
            *slot = verdict.into();
        }
        Ok(())
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier("kvt_tier_lookup_batch", tier, Access::Work, body) }
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
/// shutdown (also one on another thread during the call) KVT_STATUS_SHUT_DOWN. On any
/// error `out_results` is not written. Allowed in a log callback. Thread-safe; must not run concurrently with
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
        if out_results.is_null() {
            return Err(Error::new(
                Status::NullArgument,
                format!("out_results is NULL with num_keys = {num_keys}"),
            ));
        }
        // SAFETY: the header's contract for `keys`.
        let keys = unsafe { key_array(keys, key_len, num_keys, "a check") }?;
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
