//! What the tier remembers about keys, so that a block is uploaded once: keys known to be
//! in the store, uploads in flight (later stores of the same key wait for them), keys
//! found corrupt, and the checksums of this tier's own uploads.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

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
    /// Most keys each set holds; a full set is cleared (it is a cache, never a truth).
    capacity: usize,
    /// Keys known to be in the store: not uploaded again.
    known: Mutex<HashSet<Vec<u8>>>,
    /// Keys whose objects two reads found corrupt: MISS for every lookup, and the next
    /// store overwrites the object (no skip, no conditional PUT).
    corrupt: Mutex<HashSet<Vec<u8>>>,
    /// Checksums of the blocks this tier uploaded, for objects that come back without
    /// their recorded checksum (rewritten by another client).
    uploaded_crc: Mutex<HashMap<Vec<u8>, u32>>,
    /// Uploads in flight, with the stores of the same key waiting for them.
    uploads: Mutex<HashMap<Vec<u8>, UploadWaiters>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn insert_bounded<K: std::hash::Hash + Eq, V>(
    map: &mut HashMap<K, V>,
    capacity: usize,
    key: K,
    value: V,
) {
    if map.len() >= capacity {
        map.clear();
    }
    map.insert(key, value);
}

impl Dedup {
    pub(crate) fn new(mode: DedupMode, capacity: usize) -> Self {
        Dedup {
            mode,
            capacity,
            known: Mutex::default(),
            corrupt: Mutex::default(),
            uploaded_crc: Mutex::default(),
            uploads: Mutex::default(),
        }
    }

    pub(crate) fn is_known(&self, key: &[u8]) -> bool {
        lock(&self.known).contains(key)
    }

    pub(crate) fn remember(&self, key: &[u8]) {
        self.remember_all([key]);
    }

    /// [`remember`](Self::remember) for several keys, under one lock.
    pub(crate) fn remember_all<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) {
        if self.mode == DedupMode::Off {
            return;
        }
        let mut known = lock(&self.known);
        for key in keys {
            if known.len() >= self.capacity {
                known.clear();
            }
            known.insert(key.to_vec());
        }
    }

    pub(crate) fn forget(&self, key: &[u8]) {
        lock(&self.known).remove(key);
    }

    pub(crate) fn mark_corrupt(&self, key: &[u8]) {
        self.forget(key);
        let mut corrupt = lock(&self.corrupt);
        if corrupt.len() >= self.capacity {
            corrupt.clear();
        }
        corrupt.insert(key.to_vec());
    }

    pub(crate) fn is_corrupt(&self, key: &[u8]) -> bool {
        lock(&self.corrupt).contains(key)
    }

    pub(crate) fn repaired(&self, key: &[u8]) {
        lock(&self.corrupt).remove(key);
    }

    pub(crate) fn uploaded_crc(&self, key: &[u8]) -> Option<u32> {
        lock(&self.uploaded_crc).get(key).copied()
    }

    pub(crate) fn remember_upload(&self, key: &[u8], crc: u32) {
        insert_bounded(
            &mut lock(&self.uploaded_crc),
            self.capacity,
            key.to_vec(),
            crc,
        );
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
