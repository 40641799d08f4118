//! Pins: blocks a host has promised a reader, which the tier's own eviction keeps.

use super::*;

/// Pins the blocks of `num_keys` keys (`key_len` bytes each, back to back in `keys`): the
/// tier's own eviction (the `eviction` rounds and kvt_tier_evict_now) keeps them until
/// they are unpinned, while they still count towards its byte budget. Pins count: a key
/// pinned twice stays pinned until unpinned twice. Nothing is asked of the store, and an
/// absent key may be pinned.
///
/// A pin holds against this tier alone. The bucket is shared: other tiers' eviction,
/// `kvtier gc` (another process), and kvt_tier_clear and kvt_tier_delete (explicit
/// requests) do not honour it. A pinned block deleted by any of them loads as
/// KVT_STATUS_NOT_FOUND, never as other bytes. For LMCache's "lookup and lock".
///
/// `out_held` (NULL, or `num_keys` bytes) receives for each key 1 when the pin holds it,
/// 0 when this tier's eviction was deleting that block at that moment (it is pinned all
/// the same; unpin it as the others). So pin first, then ask the store whether the keys
/// are there (kvt_tier_check_now): a key found present whose pin holds stays until
/// unpinned, as far as this tier's eviction goes.
///
/// `num_keys == 0` is OK. NULL `tier`, or NULL `keys` with `num_keys > 0`, is
/// KVT_STATUS_NULL_ARGUMENT; a wrong `key_len` (outside 5..68, or not the configured
/// `key_bytes`) or `num_keys` above KVT_MAX_KEYS_PER_JOB is KVT_STATUS_INVALID_ARGUMENT
/// and nothing is pinned; after shutdown KVT_STATUS_SHUT_DOWN. `out_held` is written only
/// on success. Does not block. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_pin(
    tier: *mut kvt_tier,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
    out_held: *mut u8,
) -> Status {
    let body = |handle: &kvt_tier| {
        // SAFETY: the header's contract for `keys`.
        let keys = unsafe { key_array(keys, key_len, num_keys, "a pin") }?;
        let held = handle.tier.pin_keys(&keys)?;
        if !out_held.is_null() {
            for (i, h) in held.into_iter().enumerate() {
                // SAFETY: `out_held` holds `num_keys` writable bytes (the header's
                // contract), and there is one answer per key.
                unsafe { out_held.add(i).write(u8::from(h)) };
            }
        }
        Ok(())
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier("kvt_tier_pin", tier, Access::Work, body) }
}

/// Takes one pin from each of `num_keys` keys (`key_len` bytes each, back to back in
/// `keys`); a key not pinned is left alone. Arguments and errors as for kvt_tier_pin
/// (nothing is unpinned on error), without `out_held`. Does not block. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_unpin(
    tier: *mut kvt_tier,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
) -> Status {
    let body = |handle: &kvt_tier| {
        // SAFETY: the header's contract for `keys`.
        let keys = unsafe { key_array(keys, key_len, num_keys, "an unpin") }?;
        handle.tier.unpin_keys(&keys).map(|_| ())
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier("kvt_tier_unpin", tier, Access::Work, body) }
}
