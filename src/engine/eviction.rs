//! Bounded namespaces: a background task lists the tier's namespace every interval and
//! deletes the oldest objects past the byte budget and every object past the maximum age.
//! Each deleted block becomes a BlockRemoved event and is forgotten by dedup, so a later
//! store uploads it again. A block deleted under a lookup is simply a MISS later: its
//! load fails alone with NotFound, never with wrong bytes.
//!
//! "Oldest" is by last-modified time: an approximate LRU needs something to refresh it
//! (not built; S3 lifecycle rules are the alternative for pure age limits).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;

use super::events::KvEvent;
use super::jobs::KeyBatch;
use super::Shared;
use crate::config::EvictionConfig;
use crate::error::{Error, Result, Status};
use crate::store::object_path;

/// What one eviction round found and did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionReport {
    /// Blocks of the namespace and their bytes before the round.
    pub objects: u64,
    pub bytes: u64,
    /// Blocks deleted and their bytes.
    pub deleted: u64,
    pub deleted_bytes: u64,
}

/// One block of the namespace.
struct Listed {
    name: object_store::path::Path,
    size: u64,
    modified: SystemTime,
}

/// Runs rounds every `interval_ms` until the tier shuts down (its runtime drops the task).
pub(crate) async fn run(shared: Arc<Shared>, config: EvictionConfig) {
    let mut ticks = tokio::time::interval(Duration::from_millis(config.interval_ms));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate: the first round waits one interval
    loop {
        ticks.tick().await;
        if shared.closing.load(Ordering::Acquire) {
            return;
        }
        match round(&shared, &config).await {
            Ok(report) if report.deleted > 0 => log::info!(
                "eviction: deleted {} of {} blocks ({} of {} bytes)",
                report.deleted,
                report.objects,
                report.deleted_bytes,
                report.bytes
            ),
            Ok(_) => {}
            Err(e) => log::warn!("eviction round failed: {}", e.message),
        }
    }
}

/// One round: list, choose, delete, report.
pub(crate) async fn round(shared: &Shared, config: &EvictionConfig) -> Result<EvictionReport> {
    let base = object_path(shared.layout.base());
    let store = &shared.lookup_store;
    let mut listing = store.client().list(Some(&base));
    let mut blocks = Vec::new();
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|e| {
            Error::new(
                crate::store::classify(&e),
                format!("eviction: list {base}: {e}"),
            )
        })?;
        // Only blocks of this layout: never probe objects or anything else under the base.
        if shared.layout.key_of(meta.location.as_ref()).is_some() {
            blocks.push(Listed {
                name: meta.location,
                size: meta.size,
                modified: meta.last_modified.into(),
            });
        }
    }
    // Oldest first; the name breaks ties, so a round's choice does not depend on listing order.
    blocks.sort_by(|a, b| {
        a.modified
            .cmp(&b.modified)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut report = EvictionReport {
        objects: blocks.len() as u64,
        bytes: blocks.iter().map(|b| b.size).sum(),
        ..Default::default()
    };
    let now = SystemTime::now();
    let too_old = |b: &Listed| {
        config.max_age_s.is_some_and(|age| {
            now.duration_since(b.modified).unwrap_or_default() > Duration::from_secs(age)
        })
    };
    let mut remaining = report.bytes;
    let mut doomed = Vec::new();
    for block in &blocks {
        let over_budget = config.max_bytes.is_some_and(|max| remaining > max);
        if !(over_budget || too_old(block)) {
            continue;
        }
        remaining -= block.size;
        doomed.push(block);
    }
    let mut removed = Vec::new();
    for block in doomed {
        match store.delete(&block.name).await {
            Ok(()) => {}
            // Deleted by someone else meanwhile (another tier, `kvtier gc`): gone either way.
            Err(e) if e.status == Status::NotFound => {}
            Err(e) => {
                log::warn!("eviction: {}", e.message);
                continue;
            }
        }
        report.deleted += 1;
        report.deleted_bytes += block.size;
        if let Some(key) = shared.layout.key_of(block.name.as_ref()) {
            shared.dedup.forget(&key);
            removed.push(key);
        }
    }
    shared
        .stats
        .evicted_blocks
        .fetch_add(report.deleted, Ordering::Relaxed);
    shared
        .stats
        .evicted_bytes
        .fetch_add(report.deleted_bytes, Ordering::Relaxed);
    emit_removed(shared, &removed);
    Ok(report)
}

/// BlockRemoved events for `keys` (when the tier records events).
pub(crate) fn emit_removed(shared: &Shared, keys: &[Vec<u8>]) {
    if !shared.config.enable_kv_events || keys.is_empty() {
        return;
    }
    // Keys of one layout may differ in length (key_bytes = 0): one event per length.
    let mut by_length: std::collections::BTreeMap<usize, Vec<&[u8]>> = Default::default();
    for key in keys {
        by_length.entry(key.len()).or_default().push(key);
    }
    for (_, group) in by_length {
        if let Ok(batch) = KeyBatch::from_keys(&group) {
            shared.events.push(KvEvent {
                job_id: 0,
                keys: batch,
                locality: shared.config.locality,
                removed: true,
            });
        }
    }
}
