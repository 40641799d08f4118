//! Results: `kvt_tier_poll` and the fd that says one is ready.

use super::*;

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
        for (i, mut r) in results.into_iter().enumerate() {
            let failed = r.key_status.iter().filter(|s| !s.is_ok()).count();
            let message = c_text(std::mem::take(&mut r.message));
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
