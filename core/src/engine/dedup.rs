//! What the tier remembers about keys, so that a block is uploaded once: keys known to be
//! in the store, uploads in flight (later stores of the same key wait for them), keys
//! found corrupt, and the checksums of this tier's own uploads.
//!
//! Everything here but the uploads in flight is a hint about the store, never the truth:
//! other engines, `kvtier gc`, evictions and lifecycle rules delete blocks behind the
//! tier's back. So a hint lasts `known_keys_ttl_ms` at most, and whatever shows the store
//! without the key (a MISS, a load that finds nothing or the wrong length, a removal by this
//! tier) forgets it at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::config::DedupMode;
use crate::error::{Error, Result};
use crate::store::Store;

/// A store of a key that waits for the upload of the same key already in flight.
pub(crate) type UploadWaiter = oneshot::Receiver<Result<()>>;
/// Where the outcome of an upload goes for each store that waits for it.
type UploadWaiters = Vec<oneshot::Sender<Result<()>>>;

pub(crate) struct Dedup {
    /// Dedup mode in force (the configured one, or what the start-up probe allows).
    pub(crate) mode: DedupMode,
    /// Keys known to be in the store: not uploaded again while the hint lasts.
    known: Hints<()>,
    /// Keys whose objects two reads found corrupt: MISS for every lookup while the hint
    /// lasts, and the next store overwrites the object (no skip, no conditional PUT).
    corrupt: Hints<()>,
    /// Checksums of the blocks this tier uploaded, for objects that come back without
    /// their recorded checksum (rewritten by another client).
    uploaded_crc: Hints<u32>,
    /// Uploads in flight, with the stores of the same key waiting for them.
    uploads: Mutex<HashMap<Vec<u8>, UploadWaiters>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the hints' time comes from: the monotonic clock, or a test's own.
pub(crate) type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// Keys with a value and the time it was learnt, each good for `ttl`; a full map is
/// cleared (it is a cache, never a truth).
struct Hints<V> {
    capacity: usize,
    ttl: Duration,
    clock: Clock,
    map: Mutex<HashMap<Vec<u8>, (Instant, V)>>,
}

impl<V: Copy> Hints<V> {
    fn new(capacity: usize, ttl: Duration, clock: Clock) -> Self {
        Hints {
            capacity,
            ttl,
            clock,
            map: Mutex::default(),
        }
    }

    /// The key's value, unless it is unknown or older than the ttl (then it is dropped).
    fn get(&self, key: &[u8]) -> Option<V> {
        let mut map = lock(&self.map);
        let &(learnt, value) = map.get(key)?;
        if (self.clock)().saturating_duration_since(learnt) < self.ttl {
            return Some(value);
        }
        map.remove(key);
        None
    }

    fn insert_all<'a>(&self, entries: impl IntoIterator<Item = (&'a [u8], V)>) {
        if self.ttl.is_zero() || self.capacity == 0 {
            return;
        }
        let now = (self.clock)();
        let mut map = lock(&self.map);
        for (key, value) in entries {
            if map.len() >= self.capacity && !map.contains_key(key) {
                map.clear();
            }
            map.insert(key.to_vec(), (now, value));
        }
    }

    fn remove(&self, key: &[u8]) {
        self.remove_all([key]);
    }

    fn remove_all<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) {
        let mut map = lock(&self.map);
        for key in keys {
            map.remove(key);
        }
    }
}

impl Dedup {
    pub(crate) fn new(mode: DedupMode, capacity: usize, ttl: Duration) -> Self {
        Self::with_clock(mode, capacity, ttl, Arc::new(Instant::now))
    }

    /// A dedup whose hints age by `clock`.
    pub(crate) fn with_clock(
        mode: DedupMode,
        capacity: usize,
        ttl: Duration,
        clock: Clock,
    ) -> Self {
        Dedup {
            mode,
            known: Hints::new(capacity, ttl, clock.clone()),
            corrupt: Hints::new(capacity, ttl, clock.clone()),
            uploaded_crc: Hints::new(capacity, ttl, clock),
            uploads: Mutex::default(),
        }
    }

    /// Whether the store held the key, to this tier's knowledge, within the last ttl.
    pub(crate) fn is_known(&self, key: &[u8]) -> bool {
        self.known.get(key).is_some()
    }

    pub(crate) fn remember(&self, key: &[u8]) {
        self.remember_all([key]);
    }

    /// [`remember`](Self::remember) for several keys, under one lock.
    pub(crate) fn remember_all<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) {
        if self.mode == DedupMode::Off {
            return;
        }
        self.known.insert_all(keys.into_iter().map(|k| (k, ())));
    }

    /// The store was seen without the key (a MISS, a load that found nothing or the wrong
    /// length, a removal): nothing this tier remembered about its object holds any more.
    pub(crate) fn forget(&self, key: &[u8]) {
        self.forget_all([key]);
    }

    /// [`forget`](Self::forget) for several keys, under one lock per memory.
    pub(crate) fn forget_all<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]> + Clone) {
        self.known.remove_all(keys.clone());
        self.uploaded_crc.remove_all(keys);
    }

    pub(crate) fn mark_corrupt(&self, key: &[u8]) {
        self.known.remove(key);
        self.corrupt.insert_all([(key, ())]);
    }

    pub(crate) fn is_corrupt(&self, key: &[u8]) -> bool {
        self.corrupt.get(key).is_some()
    }

    pub(crate) fn repaired(&self, key: &[u8]) {
        self.corrupt.remove(key);
    }

    pub(crate) fn uploaded_crc(&self, key: &[u8]) -> Option<u32> {
        self.uploaded_crc.get(key)
    }

    pub(crate) fn remember_upload(&self, key: &[u8], crc: u32) {
        self.uploaded_crc.insert_all([(key, crc)]);
    }

    /// Registers an upload of `key`, or, if one is in flight, a waiter for its outcome.
    pub(crate) fn begin_upload(&self, key: &[u8]) -> Option<UploadWaiter> {
        let mut uploads = lock(&self.uploads);
        match uploads.get_mut(key) {
            Some(waiters) => {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                Some(rx)
            }
            None => {
                uploads.insert(key.to_vec(), Vec::new());
                None
            }
        }
    }

    /// Ends the upload of `key`, handing its outcome to every store that waited for it.
    pub(crate) fn end_upload(&self, key: &[u8], outcome: &Result<()>) {
        let waiters = lock(&self.uploads).remove(key).unwrap_or_default();
        for waiter in waiters {
            let _ = waiter.send(outcome.clone());
        }
    }
}

/// Decides the dedup mode: conditional PUT only where the store refuses a second create.
pub(crate) async fn choose_mode(
    store: &Store,
    probe_name: &str,
    configured: Option<DedupMode>,
) -> Result<DedupMode> {
    if let Some(mode @ (DedupMode::Off | DedupMode::SkipKnown)) = configured {
        return Ok(mode);
    }
    match (store.honours_conditional_put(probe_name).await, configured) {
        (true, _) => Ok(DedupMode::Conditional),
        (false, Some(DedupMode::Conditional)) => Err(Error::config(format!(
            "dedup is \"conditional\" but {} does not honour conditional PUT (If-None-Match: *); use \"skip_known\"",
            store.describe()
        ))),
        (false, _) => {
            log::info!("{} does not honour conditional PUT; dedup falls back to skip_known", store.describe());
            Ok(DedupMode::SkipKnown)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock the test moves by hand.
    fn manual_clock() -> (Arc<Mutex<Instant>>, Clock) {
        let now = Arc::new(Mutex::new(Instant::now()));
        let read = now.clone();
        (now, Arc::new(move || *read.lock().unwrap()))
    }

    #[test]
    fn a_hint_lasts_its_ttl_and_what_the_store_shows_ends_it() {
        let ttl = Duration::from_millis(100);
        let (now, clock) = manual_clock();
        let dedup = Dedup::with_clock(DedupMode::SkipKnown, 10, ttl, clock);
        dedup.remember(b"a");
        dedup.remember_upload(b"a", 7);
        assert!(dedup.is_known(b"a"));
        assert_eq!(dedup.uploaded_crc(b"a"), Some(7));
        // A MISS or a load that found nothing: forgotten at once, checksum included.
        dedup.forget(b"a");
        assert!(!dedup.is_known(b"a"));
        assert_eq!(dedup.uploaded_crc(b"a"), None);
        // Time alone ends a hint: known for the whole ttl, forgotten once it has passed.
        dedup.remember(b"b");
        dedup.mark_corrupt(b"c");
        *now.lock().unwrap() += ttl - Duration::from_millis(1);
        assert!(dedup.is_known(b"b"));
        assert!(dedup.is_corrupt(b"c"));
        *now.lock().unwrap() += Duration::from_millis(1);
        assert!(!dedup.is_known(b"b"));
        assert!(!dedup.is_corrupt(b"c"));
    }

    #[test]
    fn no_memory_when_off_or_with_a_zero_ttl() {
        let off = Dedup::new(DedupMode::Off, 10, Duration::from_secs(60));
        off.remember(b"a");
        assert!(!off.is_known(b"a"));
        let zero = Dedup::new(DedupMode::Conditional, 10, Duration::ZERO);
        zero.remember(b"a");
        zero.mark_corrupt(b"b");
        assert!(!zero.is_known(b"a"));
        assert!(!zero.is_corrupt(b"b"));
    }

    #[test]
    fn a_full_memory_starts_again() {
        let dedup = Dedup::new(DedupMode::SkipKnown, 2, Duration::from_secs(60));
        dedup.remember_all([&b"a"[..], b"b"]);
        dedup.remember(b"a"); // known already: no room needed
        assert!(dedup.is_known(b"a") && dedup.is_known(b"b"));
        dedup.remember(b"c");
        assert!(dedup.is_known(b"c"));
        assert!(!dedup.is_known(b"a") && !dedup.is_known(b"b"));
    }
}
