//! KV events: what the tier stored and what it removed, for the engine's KV-event stream.

use std::sync::{Mutex, MutexGuard};

use super::job::KeyBatch;
use crate::config::Locality;

/// A BlockStored event (one per successful store job, keys in job order) or a
/// BlockRemoved event (keys the tier deleted: by eviction, or a corrupt object deleted
/// under `fail_and_delete`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvEvent {
    /// The store job's id; 0 for removals.
    pub job_id: u64,
    pub keys: KeyBatch,
    pub locality: Option<Locality>,
    /// BlockRemoved rather than BlockStored.
    pub removed: bool,
}

/// Medium of every event this tier emits (vLLM's `Medium.STORAGE`).
pub const EVENT_MEDIUM: &str = "STORAGE";

/// The events not yet taken, oldest first.
#[derive(Default)]
pub(crate) struct EventQueue {
    events: Mutex<Vec<KvEvent>>,
}

impl EventQueue {
    fn lock(&self) -> MutexGuard<'_, Vec<KvEvent>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, event: KvEvent) {
        self.lock().push(event);
    }

    /// Takes up to `max` events, oldest first; with `stored_only`, removals are dropped
    /// on the way (for hosts of the BlockStored-only interface).
    pub(crate) fn take(&self, max: usize, stored_only: bool) -> Vec<KvEvent> {
        let mut events = self.lock();
        if stored_only {
            events.retain(|e| !e.removed);
        }
        let n = max.min(events.len());
        events.drain(..n).collect()
    }
}
