//! Observability: counters, Prometheus metrics and the log callback.

use super::*;

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
/// Process-wide: one callback for every tier. It is called on the library's log thread
/// for the records of the tiers' I/O threads (and of kvt_ calls while they wait on them),
/// and on the calling thread for those of other kvt_ calls; several calls may run at once.
/// It is never called on a tier's I/O threads, so every kvt_ call except
/// `kvt_set_log_callback` may be made from within it, with its usual statuses and
/// blocking: `kvt_tier_new`, `kvt_tier_clear`, `kvt_tier_check_now`, and
/// `kvt_tier_shutdown` and `kvt_tier_free` of any tier, also the one whose record it is
/// handling (their own records then go to stderr). It must not unwind, call
/// `kvt_set_log_callback`, or block for long: up to 4096 records of the I/O threads wait
/// for it, further ones are dropped and a later record says how many. When this function
/// returns, the records queued before it have reached the previous callback (waiting at
/// most 5 s for them), that callback is not running and is never called again, so its
/// `userdata` may be freed. Never fails: returns
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
