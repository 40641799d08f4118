//! Pinned blocks: keys a host has promised a reader (LMCache's "lookup and lock"), which
//! this tier's own eviction keeps until they are unpinned.
//!
//! A pin is a promise of this tier alone. The bucket is shared, so other tiers, other
//! processes' eviction and `kvtier gc` do not see it, and `clear`/`delete` (explicit
//! requests of the host) do not honour it: a pinned block deleted by any of them still
//! loads as NotFound, never as other bytes.

use std::sync::Mutex;

use rustc_hash::FxHashMap;

use super::Tier;
use crate::error::{Error, Result, Status};

/// Pinned keys and how many pins each holds.
#[derive(Default)]
pub(crate) struct Pins {
    counts: Mutex<FxHashMap<Vec<u8>, u64>>,
}

impl Pins {
    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<Vec<u8>, u64>> {
        // A panic while holding it left nothing half-done (each change is one map call).
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pin(&self, keys: &[&[u8]]) {
        let mut counts = self.lock();
        for key in keys {
            *counts.entry(key.to_vec()).or_insert(0) += 1;
        }
    }

    /// Takes one pin from each key; a key not pinned is left alone. Returns how many keys
    /// were not pinned.
    fn unpin(&self, keys: &[&[u8]]) -> usize {
        let mut counts = self.lock();
        let mut unknown = 0;
        for key in keys {
            match counts.get_mut(*key) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    counts.remove(*key);
                }
                None => unknown += 1,
            }
        }
        unknown
    }

    /// Whether eviction must keep `key`.
    pub(crate) fn holds(&self, key: &[u8]) -> bool {
        let counts = self.lock();
        !counts.is_empty() && counts.contains_key(key)
    }

    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }
}

impl Tier {
    /// Pins `keys` (one pin each; pins count, so a key pinned twice needs two unpins):
    /// this tier's eviction keeps their blocks until they are unpinned, though a pinned
    /// block still counts towards the byte budget. Nothing is asked of the store: pinning
    /// an absent key is allowed. See the module doc for what a pin does not hold against.
    pub fn pin_keys<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<()> {
        let keys = self.checked_pin_keys(keys)?;
        self.shared.pins.pin(&keys);
        Ok(())
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
        pins.pin(&[a, a, b]);
        assert!(pins.holds(a) && pins.holds(b));
        assert_eq!(pins.unpin(&[a, b]), 0);
        assert!(pins.holds(a) && !pins.holds(b));
        assert_eq!(pins.unpin(&[a, b]), 1);
        assert!(!pins.holds(a));
        assert_eq!(pins.count(), 0);
    }
}
