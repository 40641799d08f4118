//! KV events: what the tier stored, for the engine's KV-event stream.

use super::jobs::KeyBatch;
use crate::config::Locality;

/// A BlockStored event: one per successful store job, keys in job order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub job_id: u64,
    pub keys: KeyBatch,
    pub locality: Option<Locality>,
}

/// Medium of every event this tier emits (vLLM's `Medium.STORAGE`).
pub const EVENT_MEDIUM: &str = "STORAGE";
