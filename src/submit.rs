//! Submitting jobs: stores and loads of pool blocks or of ranges of registered memory.
//! Every submit call yields exactly one result, also when the call itself fails.

use super::*;

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
        if num_keys > kvtier_core::MAX_KEYS_PER_JOB {
            return reject(Error::invalid(format!(
                "num_keys is {num_keys}; a job has at most {} keys",
                kvtier_core::MAX_KEYS_PER_JOB
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
        if let Err(e) = kvtier_core::key::check_key_len(key_len) {
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
