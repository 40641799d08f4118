//! Bounded namespaces: a background task lists the tier's namespace every interval and
//! deletes the oldest objects past the byte budget and every object past the maximum age.
//! Each deleted block becomes a BlockRemoved event and is forgotten by dedup, so a later
//! store uploads it again. A block deleted under a lookup is simply a MISS later: its
//! load fails alone with NotFound, never with wrong bytes.
//!
//! Blocks the host pinned ([`super::Tier::pin_keys`]) stay, and count towards the budget.
//!
//! "Oldest" is by last-modified time: an approximate LRU needs something to refresh it
//! (not built; S3 lifecycle rules are the alternative for pure age limits).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;

use super::events::KvEvent;
use super::job::KeyBatch;
use super::TierState;
use super::{is_tier_thread, runtime, Tier, MAX_KEYS_PER_JOB};
use crate::config::EvictionConfig;
use crate::error::{Error, Result, Status};
use crate::store::object_path;

/// What one eviction round found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
// Every field is mirrored by the C ABI's kvt_eviction_report, which destructures it whole
// (a field added here fails its build until the header has it too): not non_exhaustive.
pub struct EvictionReport {
    /// Blocks of the namespace and their bytes before the round.
    pub objects: u64,
    pub bytes: u64,
    /// Blocks deleted and their bytes.
    pub deleted: u64,
    pub deleted_bytes: u64,
}

/// An object that eviction (or `kvtier gc`) may delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionCandidate {
    pub name: String,
    pub bytes: u64,
    pub modified: SystemTime,
}

/// Why [`choose_evictions`] chose an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionReason {
    /// Modified before the cutoff.
    Age,
    /// Among the oldest objects while the set holds more than the byte budget.
    Budget,
}

/// Sorts `objects` oldest first (the name breaks ties, so a choice does not depend on
/// listing order) and chooses which to delete: every object modified before `cutoff`,
/// then the oldest of the rest while more than `max_bytes` remain. Returns how many of
/// the sorted objects go (they are the first ones) and why each goes.
pub fn choose_evictions(
    objects: &mut [EvictionCandidate],
    cutoff: Option<SystemTime>,
    max_bytes: Option<u64>,
) -> Vec<EvictionReason> {
    choose_evictions_beside(objects, 0, cutoff, max_bytes)
}

/// [`choose_evictions`] among `objects` beside `kept_bytes` of objects that stay whatever
/// happens (pinned ones), which count towards `max_bytes` all the same.
fn choose_evictions_beside(
    objects: &mut [EvictionCandidate],
    kept_bytes: u64,
    cutoff: Option<SystemTime>,
    max_bytes: Option<u64>,
) -> Vec<EvictionReason> {
    objects.sort_by(|a, b| {
        a.modified
            .cmp(&b.modified)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut remaining: u64 = kept_bytes + objects.iter().map(|o| o.bytes).sum::<u64>();
    let mut reasons = Vec::new();
    for object in objects.iter() {
        let reason = if cutoff.is_some_and(|cutoff| object.modified < cutoff) {
            EvictionReason::Age
        } else if max_bytes.is_some_and(|max| remaining > max) {
            EvictionReason::Budget
        } else {
            // Oldest first: every later object is newer still, and the budget is met.
            break;
        };
        remaining -= object.bytes;
        reasons.push(reason);
    }
    reasons
}

/// Runs rounds every `interval_ms` until the tier shuts down (its runtime drops the task).
pub(crate) async fn run(shared: Arc<TierState>, config: EvictionConfig) {
    let mut ticks = tokio::time::interval(Duration::from_millis(config.interval_ms));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate: the first round waits one interval
    loop {
        ticks.tick().await;
        if shared.closing.load(Ordering::Acquire) {
            return;
        }
        match round(&shared, &config, Reach::Namespace).await {
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

/// Which blocks a round considers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// The blocks of the tier's namespace (eviction).
    Namespace,
    /// Every block under the tier's prefix and namespace, also those of the namespaces
    /// below it (clear): with an empty prefix and namespace, every block of the bucket.
    Below,
}

/// One round: list, choose, delete, report.
pub(crate) async fn round(
    shared: &TierState,
    config: &EvictionConfig,
    reach: Reach,
) -> Result<EvictionReport> {
    let base = shared.layout.base();
    let store = &shared.lookup_store;
    let mut listing = store.list(base);
    let mut blocks = Vec::new();
    let (mut pinned, mut pinned_bytes) = (0u64, 0u64);
    while let Some(object) = listing.next().await {
        let object = object
            .map_err(|e| Error::new(e.status, format!("eviction: list {base}: {}", e.message)))?;
        // Only blocks: never probe objects or anything else under the base.
        let block = match reach {
            Reach::Namespace => shared.layout.key_of(&object.name),
            Reach::Below => shared.layout.key_below(&object.name),
        };
        let Some(key) = block else { continue };
        // A pinned block of the tier's own namespace stays (clear keeps nothing).
        if reach == Reach::Namespace && shared.pins.holds(&key) {
            pinned += 1;
            pinned_bytes += object.bytes;
            continue;
        }
        blocks.push(EvictionCandidate {
            name: object.name,
            bytes: object.bytes,
            modified: object.modified,
        });
    }
    let mut report = EvictionReport {
        objects: blocks.len() as u64 + pinned,
        bytes: blocks.iter().map(|b| b.bytes).sum::<u64>() + pinned_bytes,
        ..Default::default()
    };
    let cutoff = config
        .max_age_s
        .and_then(|age| SystemTime::now().checked_sub(Duration::from_secs(age)));
    let chosen = choose_evictions_beside(&mut blocks, pinned_bytes, cutoff, config.max_bytes).len();
    let doomed = &blocks[..chosen];
    let mut removed = Vec::new();
    for block in doomed {
        // Pinned since the listing: it stays. Otherwise a pin taken while it is deleted
        // does not hold it (the host learns so from the pin).
        let own_key = match reach {
            Reach::Namespace => shared.layout.key_of(&block.name),
            Reach::Below => None,
        };
        if let Some(key) = &own_key {
            if !shared.pins.start_delete(key) {
                continue;
            }
        }
        let outcome = store.delete(&object_path(&block.name)).await;
        if let Some(key) = &own_key {
            shared.pins.deleted(key);
        }
        match outcome {
            Ok(()) => {}
            // Deleted by someone else meanwhile (another tier, `kvtier gc`): gone either way.
            Err(e) if e.status == Status::NotFound => {}
            Err(e) => {
                log::warn!("eviction: {}", e.message);
                continue;
            }
        }
        report.deleted += 1;
        report.deleted_bytes += block.bytes;
        // Events and dedup are about the tier's own keys: a block of a namespace below
        // it is another namespace's, whatever its key.
        if let Some(key) = shared.layout.key_of(&block.name) {
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

/// Deletes the named blocks (`names[i]` is the object of `keys[i]`), a few at a time: each
/// block whose object is gone afterwards (deleted, or absent already) is forgotten by dedup
/// and becomes a BlockRemoved event; a block whose delete failed stays (logged) and is not
/// counted. Bytes are not known without a listing: the report has `objects` = blocks asked
/// and `deleted` = blocks gone, its byte counts 0.
pub(crate) async fn delete_named(
    shared: &TierState,
    keys: Vec<Vec<u8>>,
    names: Vec<String>,
) -> Result<EvictionReport> {
    const AT_ONCE: usize = 16;
    let store = &shared.lookup_store;
    let outcomes: Vec<(Vec<u8>, bool)> = futures::stream::iter(keys.into_iter().zip(names))
        .map(|(key, name)| async move {
            let gone = match store.delete(&object_path(&name)).await {
                Ok(()) => true,
                Err(e) if e.status == Status::NotFound => true,
                Err(e) => {
                    log::warn!("delete: {}", e.message);
                    false
                }
            };
            (key, gone)
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    let mut report = EvictionReport {
        objects: outcomes.len() as u64,
        ..Default::default()
    };
    let mut removed = Vec::new();
    for (key, gone) in outcomes {
        if gone {
            shared.dedup.forget(&key);
            removed.push(key);
        }
    }
    report.deleted = removed.len() as u64;
    shared
        .stats
        .evicted_blocks
        .fetch_add(report.deleted, Ordering::Relaxed);
    emit_removed(shared, &removed);
    Ok(report)
}

/// BlockRemoved events for `keys` (when the tier records events).
pub(crate) fn emit_removed(shared: &TierState, keys: &[Vec<u8>]) {
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

/// The eviction calls of a tier: a round now, clear, and deletes named by the host.
impl Tier {
    /// Runs one eviction round now (the background task runs them every
    /// `eviction.interval_ms`) and waits for it. `State` if the tier has no `eviction`.
    pub fn evict_now(&self) -> Result<EvictionReport> {
        let Some(config) = self.shared.config.eviction.clone() else {
            return Err(Error::state("the tier has no eviction configured"));
        };
        let shared = self.shared.clone();
        self.with_runtime(|rt| {
            runtime::block_on_caller_thread(rt, async move {
                round(&shared, &config, Reach::Namespace).await
            })
        })
        .unwrap_or_else(|| Err(Error::new(Status::ShutDown, "evict_now after shutdown")))
    }

    /// Deletes every block under the tier's prefix and namespace, at any depth (the
    /// objects there whose name is a block's name; nothing else), as an eviction round
    /// with no byte budget: the namespace's blocks and those of the namespaces below it;
    /// with an empty prefix and namespace, every block of the bucket. Each deleted block of
    /// the tier's own namespace is a BlockRemoved event and is forgotten, so a later store
    /// uploads it again. Works with or without `eviction` configured.
    pub fn clear(&self) -> Result<EvictionReport> {
        let everything = crate::config::EvictionConfig {
            max_bytes: Some(0),
            max_age_s: None,
            interval_ms: 0,
        };
        let shared = self.shared.clone();
        self.with_runtime(|rt| {
            runtime::block_on_caller_thread(rt, async move {
                round(&shared, &everything, Reach::Below).await
            })
        })
        .unwrap_or_else(|| Err(Error::new(Status::ShutDown, "clear after shutdown")))
    }

    /// Deletes the blocks of `keys` now and waits for it (for hosts whose own eviction
    /// names the blocks to drop, as LMCache's does). Each block whose object is gone
    /// afterwards, deleted or absent already, is a BlockRemoved event and is forgotten, so
    /// a later store uploads it again; a block whose delete failed stays and is not
    /// counted. Reports `objects` (blocks asked) and `deleted` (blocks gone); its byte
    /// counts are 0 (sizes are not known without a listing). Other tiers' loads of a
    /// deleted block fail alone with NotFound.
    pub fn delete_keys<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<EvictionReport> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "delete after shutdown"));
        }
        if is_tier_thread(&std::thread::current()) {
            return Err(Error::invalid(
                "delete blocks, so it must not be called from one of the tier's threads",
            ));
        }
        if keys.len() > MAX_KEYS_PER_JOB {
            return Err(Error::invalid(format!(
                "a delete has at most {MAX_KEYS_PER_JOB} keys; this one has {}",
                keys.len()
            )));
        }
        let mut owned = Vec::with_capacity(keys.len());
        let mut names = Vec::with_capacity(keys.len());
        for key in keys {
            let key = key.as_ref();
            self.check_key(key)?;
            names.push(self.shared.layout.object_name(key)?);
            owned.push(key.to_vec());
        }
        let shared = self.shared.clone();
        self.with_runtime(|rt| {
            runtime::block_on_caller_thread(
                rt,
                async move { delete_named(&shared, owned, names).await },
            )
        })
        .unwrap_or_else(|| Err(Error::new(Status::ShutDown, "delete after shutdown")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, bytes: u64, modified_s: u64) -> EvictionCandidate {
        EvictionCandidate {
            name: name.into(),
            bytes,
            modified: SystemTime::UNIX_EPOCH + Duration::from_secs(modified_s),
        }
    }

    fn chosen(
        mut objects: Vec<EvictionCandidate>,
        cutoff_s: Option<u64>,
        max_bytes: Option<u64>,
    ) -> Vec<(String, EvictionReason)> {
        let cutoff = cutoff_s.map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        let reasons = choose_evictions(&mut objects, cutoff, max_bytes);
        objects
            .into_iter()
            .zip(reasons)
            .map(|(o, r)| (o.name, r))
            .collect()
    }

    #[test]
    fn age_then_budget_oldest_first_with_names_breaking_ties() {
        let listing = vec![
            object("c", 10, 30),
            object("a", 10, 10),
            object("b2", 10, 20),
            object("b1", 10, 20),
            object("d", 10, 40),
        ];
        let names = |v: Vec<(String, EvictionReason)>| {
            v.iter()
                .map(|(n, r)| format!("{n}:{r:?}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(names(chosen(listing.clone(), Some(20), None)), "a:Age");
        assert_eq!(
            names(chosen(listing.clone(), None, Some(25))),
            "a:Budget b1:Budget b2:Budget"
        );
        assert_eq!(
            names(chosen(listing.clone(), Some(21), Some(15))),
            "a:Age b1:Age b2:Age c:Budget"
        );
        assert!(chosen(listing.clone(), Some(0), Some(50)).is_empty());
        assert_eq!(chosen(listing, None, Some(0)).len(), 5);
    }
}
