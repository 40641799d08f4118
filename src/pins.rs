//! Pins: blocks a host has promised a reader, which the tier's own eviction keeps.

use super::*;
use events::key_array;

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
/// `num_keys == 0` is OK. NULL `tier`, or NULL `keys` with `num_keys > 0`, is
/// KVT_STATUS_NULL_ARGUMENT; a wrong `key_len` (outside 5..68, or not the configured
/// `key_bytes`) or `num_keys` above KVT_MAX_KEYS_PER_JOB is KVT_STATUS_INVALID_ARGUMENT
/// and nothing is pinned; after shutdown KVT_STATUS_SHUT_DOWN. Does not block.
/// Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_pin(
    tier: *mut kvt_tier,
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
) -> Status {
    let body = |handle: &kvt_tier| {
        // SAFETY: the header's contract for `keys`.
        let keys = unsafe { key_array(keys, key_len, num_keys, "a pin") }?;
        handle.tier.pin_keys(&keys)
    };
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe { guard_tier("kvt_tier_pin", tier, Access::Work, body) }
}

/// Takes one pin from each of `num_keys` keys (`key_len` bytes each, back to back in
/// `keys`); a key not pinned is left alone. Arguments and errors as for kvt_tier_pin
/// (nothing is unpinned on error). Does not block. Thread-safe.
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
