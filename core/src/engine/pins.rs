//! Pinned blocks: keys a host has promised a reader (LMCache's "lookup and lock"), which
//! this tier's own eviction keeps until they are unpinned.
//!
//! A pin is a promise of this tier alone. The bucket is shared, so other tiers, other
//! processes' eviction and `kvtier gc` do not see it, and `clear`/`delete` (explicit
//! requests of the host) do not honour it: a pinned block deleted by any of them still
//! loads as NotFound, never as other bytes.

use std::sync::Mutex;

use rustc_hash::{FxHashMap, FxHashSet};

use super::Tier;
use crate::error::{Error, Result, Status};

/// Pinned keys and how many pins each holds, and the keys this tier's eviction is deleting
/// now; one lock for both, so that a key is never both pinned and being deleted unseen.
#[derive(Default)]
pub(crate) struct Pins {
    state: Mutex<PinState>,
}

#[derive(Default)]
struct PinState {
    counts: FxHashMap<Vec<u8>, u64>,
    deleting: FxHashSet<Vec<u8>>,
}

impl Pins {
    fn lock(&self) -> std::sync::MutexGuard<'_, PinState> {
        // A panic while holding it left nothing half-done (each change is one map call).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pins each key; returns for each whether the pin holds it, which is false only for
    /// a key this tier's eviction is deleting at this moment (pinned all the same, so
    /// that unpinning stays symmetric).
    fn pin(&self, keys: &[&[u8]]) -> Vec<bool> {
        let mut state = self.lock();
        keys.iter()
            .map(|key| {
                *state.counts.entry(key.to_vec()).or_insert(0) += 1;
                !state.deleting.contains(*key)
            })
            .collect()
    }

    /// Takes one pin from each key; a key not pinned is left alone. Returns how many keys
    /// were not pinned.
    fn unpin(&self, keys: &[&[u8]]) -> usize {
        let mut state = self.lock();
        let mut unknown = 0;
        for key in keys {
            match state.counts.get_mut(*key) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    state.counts.remove(*key);
                }
                None => unknown += 1,
            }
        }
        unknown
    }

    /// Whether eviction must keep `key`.
    pub(crate) fn holds(&self, key: &[u8]) -> bool {
        let state = self.lock();
        !state.counts.is_empty() && state.counts.contains_key(key)
    }

    /// Eviction is about to delete `key`: false (keep it) when it is pinned; else it is
    /// marked as being deleted until [`Pins::deleted`].
    pub(crate) fn start_delete(&self, key: &[u8]) -> bool {
        let mut state = self.lock();
        if state.counts.contains_key(key) {
            return false;
        }
        state.deleting.insert(key.to_vec());
        true
    }

    pub(crate) fn deleted(&self, key: &[u8]) {
        self.lock().deleting.remove(key);
    }

    pub(crate) fn count(&self) -> usize {
        self.lock().counts.len()
    }
}

impl Tier {
    /// Pins `keys` (one pin each; pins count, so a key pinned twice needs two unpins):
    /// this tier's eviction keeps their blocks until they are unpinned, though a pinned
    /// block still counts towards the byte budget. Nothing is asked of the store: pinning
    /// an absent key is allowed. See the module doc for what a pin does not hold against.
    ///
    /// Returns for each key whether the pin holds it: false for a key this tier's eviction
    /// is deleting at that moment (a host then treats it as absent). Pin before asking the
    /// store whether a key is there, and a key found present and held stays.
    pub fn pin_keys<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<bool>> {
        let keys = self.checked_pin_keys(keys)?;
        Ok(self.shared.pins.pin(&keys))
    }

    /// Takes one pin from each of `keys`; keys not pinned are ignored. Returns how many of
    /// them were not pinned.
    pub fn unpin_keys<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<usize> {
        let keys = self.checked_pin_keys(keys)?;
        Ok(self.shared.pins.unpin(&keys))
    }

    /// How many distinct keys are pinned.
    pub fn pinned_keys(&self) -> usize {
        self.shared.pins.count()
    }

    fn checked_pin_keys<'k, K: AsRef<[u8]>>(&self, keys: &'k [K]) -> Result<Vec<&'k [u8]>> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "pin or unpin after shutdown"));
        }
        keys.iter()
            .map(|key| {
                let key = key.as_ref();
                self.check_key(key)?;
                Ok(key)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Pins;

    #[test]
    fn pins_count_and_unknown_unpins_are_reported() {
        let pins = Pins::default();
        let (a, b): (&[u8], &[u8]) = (b"key-a", b"key-b");
        assert_eq!(pins.pin(&[a, a, b]), [true, true, true]);
        assert!(pins.holds(a) && pins.holds(b));
        assert_eq!(pins.unpin(&[a, b]), 0);
        assert!(pins.holds(a) && !pins.holds(b));
        assert_eq!(pins.unpin(&[a, b]), 1);
        assert!(!pins.holds(a));
        assert_eq!(pins.count(), 0);
    }

    #[test]
    fn a_key_being_deleted_is_not_held_and_a_pinned_one_is_not_deleted() {
        let pins = Pins::default();
        let (a, b): (&[u8], &[u8]) = (b"key-a", b"key-b");
        assert!(pins.start_delete(a));
        assert_eq!(pins.pin(&[a, b]), [false, true]);
        assert!(!pins.start_delete(b));
        pins.deleted(a);
        assert_eq!(pins.pin(&[a]), [true]);
    }
}
