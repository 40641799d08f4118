//! A tier's start: `kvt_tier_new`, and the memory its jobs may name (the host pool and
//! regions).

use super::*;

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
