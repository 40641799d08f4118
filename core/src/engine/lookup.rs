//! Asynchronous existence lookups with vLLM's sharing rules.
//!
//! `lookup` never blocks and never does I/O: an unknown key answers `Retry` and joins the
//! step's batch; `flush` (at schedule end) sends the batch, deduplicated across requests,
//! to the lookup lane of the I/O runtime; answers are applied on later calls.
//!
//! Rules (vLLM's async lookup manager, with its fixes):
//! * a verdict is shared by every request that asked for the key and kept until the last
//!   of them finishes;
//! * every entry has a generation, so an answer for an entry that was dropped and
//!   re-created is ignored;
//! * an entry whose check is in flight is kept until its answer arrives, then dropped if
//!   no request holds it any more;
//! * a failed existence check makes every key of that request's group MISS;
//! * `mark_miss` (failed loads) turns only the named keys into MISS.

use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use hashbrown::HashTable;
use rustc_hash::{FxBuildHasher, FxHashMap};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// Answer to a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LookupResult {
    /// The tier does not hold the key.
    Miss = 0,
    /// The tier holds the key.
    Hit = 1,
    /// Not known yet: ask again in a later step.
    Retry = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Pending,
    InFlight,
    Resolved,
}

/// A key as the lookup state holds it: shared by its slot, its probe and the check that
/// answers it, so that asking for it allocates once.
pub(crate) type SharedKey = Arc<[u8]>;

/// The requests holding an entry: almost always one (a few when requests share a prefix),
/// so the first is kept in the slot itself and only a second allocates.
#[derive(Debug, Default)]
struct Holders {
    /// None only when nobody holds the entry (then `rest` is empty too).
    first: Option<u64>,
    rest: Vec<u64>,
}

impl Holders {
    fn contains(&self, request: u64) -> bool {
        self.first == Some(request) || self.rest.contains(&request)
    }

    fn add(&mut self, request: u64) {
        match self.first {
            None => self.first = Some(request),
            Some(_) => self.rest.push(request),
        }
    }

    fn remove(&mut self, request: u64) {
        if self.first == Some(request) {
            self.first = self.rest.pop();
        } else {
            self.rest.retain(|&r| r != request);
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}

/// One key's state. Slots live in one array and are found by number, so that finishing a
/// request, applying an answer or flushing a batch reads the slot alone: no key is hashed
/// again and no pointer is followed to find it (these calls run on the engine's scheduler
/// thread, whose caches the engine's own work has emptied between two calls; a cache
/// miss per pointer was most of their cost).
#[derive(Debug)]
struct Slot {
    key: SharedKey,
    /// The key's hash in `index`, kept so that the slot leaves it without hashing again.
    hash: u64,
    /// Unique over the table's life; 0 for a free slot (no answer carries 0).
    generation: u64,
    phase: Phase,
    found: Option<bool>,
    requests: Holders,
}

/// One key to check, with the slot and generation its answer must match.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub key: SharedKey,
    pub slot: u32,
    pub generation: u64,
}

/// The keys one request asked for in a step; checked together.
#[derive(Debug, Clone)]
pub(crate) struct ProbeGroup {
    pub probes: Vec<Probe>,
}

/// A key's existence as the store answered it, for the slot and generation of its probe:
/// `found` is false also for the keys of a group whose check failed.
#[derive(Debug, Clone)]
pub(crate) struct Existence {
    pub slot: u32,
    pub generation: u64,
    pub found: bool,
}

/// The lookup state. Owned by whoever calls `lookup` (the scheduler); the I/O side
/// only sees [`ProbeGroup`]s and sends back [`Existence`]s.
///
/// `lookup` runs once per key per scheduler step, so for a key already asked it is one hash
/// of the key and no allocation, and a new key is allocated once. Everything after the
/// first ask goes by slot number: a request's list, the step's batch and each answer name
/// their slots, so `request_finished`, `flush` and `apply` never hash a key and leave the
/// index by the stored hash.
///
/// The index hashes with FxHash, not a keyed hash: the keys are the engine's own block
/// hashes (the pins' table hashes them the same way), and a keyed hash cost as much as
/// the rest of a lookup.
#[derive(Debug, Default)]
pub(crate) struct LookupTable {
    index: HashTable<u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Each request's slots, with the generation it joined (a slot is only freed once no
    /// request holds it, so the generation still matches when the request finishes).
    by_request: FxHashMap<u64, Vec<(u32, u64)>>,
    /// New entries of this step: (slot, first request, generation).
    batch: Vec<(u32, u64, u64)>,
    next_generation: u64,
}

impl LookupTable {
    pub(crate) fn lookup(&mut self, request: u64, key: &[u8]) -> LookupResult {
        let hash = FxBuildHasher.hash_one(key);
        let number = match self.find(key, hash) {
            Some(n) => n,
            None => self.insert(request, key, hash),
        };
        let slot = &mut self.slots[number as usize];
        let verdict = match slot.found {
            Some(true) => LookupResult::Hit,
            Some(false) => LookupResult::Miss,
            None => LookupResult::Retry,
        };
        if !slot.requests.contains(request) {
            slot.requests.add(request);
            self.by_request
                .entry(request)
                .or_default()
                .push((number, slot.generation));
        }
        verdict
    }

    /// The slot holding `key`, whose hash is `hash`.
    fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(hash, |&n| {
                slots[n as usize].hash == hash && *slots[n as usize].key == *key
            })
            .copied()
    }

    /// A new pending entry for `key`, in the step's batch; its slot's number.
    fn insert(&mut self, request: u64, key: &[u8], hash: u64) -> u32 {
        self.next_generation += 1;
        let generation = self.next_generation;
        let slot = Slot {
            key: key.into(),
            hash,
            generation,
            phase: Phase::Pending,
            found: None,
            requests: Holders::default(),
        };
        let number = match self.free.pop() {
            Some(n) => {
                self.slots[n as usize] = slot;
                n
            }
            None => {
                self.slots.push(slot);
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 keys tracked")
            }
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash, number, |&n| slots[n as usize].hash);
        self.batch.push((number, request, generation));
        number
    }

    /// Frees a slot nobody holds: it leaves the index by its stored hash.
    fn release(&mut self, number: u32) {
        let slot = &mut self.slots[number as usize];
        slot.generation = 0;
        if let Ok(found) = self.index.find_entry(slot.hash, |&n| n == number) {
            found.remove();
        }
        self.free.push(number);
    }

    /// Takes the step's batch: entries still pending become in flight. Grouped by the
    /// request that first asked, in order.
    pub(crate) fn flush(&mut self) -> Vec<ProbeGroup> {
        let mut groups: Vec<ProbeGroup> = Vec::new();
        let mut index: FxHashMap<u64, usize> = FxHashMap::default();
        for (number, request, generation) in std::mem::take(&mut self.batch) {
            let slot = &mut self.slots[number as usize];
            if slot.generation != generation || slot.phase != Phase::Pending {
                continue;
            }
            slot.phase = Phase::InFlight;
            let at = *index.entry(request).or_insert_with(|| {
                groups.push(ProbeGroup { probes: Vec::new() });
                groups.len() - 1
            });
            groups[at].probes.push(Probe {
                key: slot.key.clone(),
                slot: number,
                generation,
            });
        }
        groups
    }

    pub(crate) fn apply(&mut self, answers: impl IntoIterator<Item = Existence>) {
        for answer in answers {
            let Some(slot) = self.slots.get_mut(answer.slot as usize) else {
                continue;
            };
            if slot.generation != answer.generation {
                continue;
            }
            if slot.requests.is_empty() {
                self.release(answer.slot);
                continue;
            }
            slot.found = Some(answer.found);
            slot.phase = Phase::Resolved;
        }
    }

    /// Failed loads: these keys are absent for everyone holding them.
    pub(crate) fn mark_miss<'a>(&mut self, keys: impl IntoIterator<Item = &'a [u8]>) {
        for key in keys {
            if let Some(n) = self.find(key, FxBuildHasher.hash_one(key)) {
                let slot = &mut self.slots[n as usize];
                slot.found = Some(false);
                slot.phase = Phase::Resolved;
            }
        }
    }

    pub(crate) fn request_finished(&mut self, request: u64) {
        let Some(held) = self.by_request.remove(&request) else {
            return;
        };
        for (number, generation) in held {
            let slot = &mut self.slots[number as usize];
            if slot.generation != generation {
                continue;
            }
            slot.requests.remove(request);
            if slot.requests.is_empty() && slot.phase != Phase::InFlight {
                self.release(number);
            }
        }
    }

    /// Keys with state (for tests and stats).
    pub(crate) fn tracked_keys(&self) -> usize {
        self.index.len()
    }
}

/// Starts checking every group's keys on `lane`; the answers go to `answers_tx` when all
/// are in. A group (one request's keys of one step) whose check fails anywhere answers
/// MISS for all its keys. Called on the caller's thread (`schedule_end`).
pub(crate) fn start_checks(shared: &Arc<super::TierState>, groups: Vec<ProbeGroup>, lane: &Handle) {
    let keys: Vec<SharedKey> = groups
        .iter()
        .flat_map(|g| g.probes.iter().map(|p| p.key.clone()))
        .collect();
    let answers_of = shared.clone();
    spawn_checks(shared, keys, lane, move |verdicts| {
        let _ = answers_of
            .answers_tx
            .send(answers(&answers_of, groups, verdicts));
    });
}

/// Checks `keys` on `lane`, all at once (up to `max_inflight_lookups` over the network),
/// and hands their verdicts, in order, to `done` when all are in. Called outside the
/// runtime (`schedule_end`, `check_now`).
pub(crate) fn spawn_checks(
    shared: &Arc<super::TierState>,
    keys: Vec<SharedKey>,
    lane: &Handle,
    done: impl FnOnce(Vec<Verdict>) + Send + 'static,
) {
    let shared = shared.clone();
    if shared.lookup_store.checks_in_place().is_none() {
        lane.spawn(async move { done(check_remote(&shared, &keys).await) });
        return;
    }
    // Spawned here, outside the runtime, each share goes to the runtime's shared queue,
    // where any idle worker can take it; a task spawned from inside a worker would land
    // in that worker's LIFO slot, which no other worker takes from.
    let shares = check_in_place(&shared, keys, lane);
    lane.spawn(async move {
        let mut verdicts = Vec::new();
        for (share, len) in shares {
            match share.await {
                Ok(share) => verdicts.extend(share),
                // The runtime is shutting down: the share's keys fail.
                Err(_) => verdicts.extend(std::iter::repeat_n(Err(()), len)),
            }
        }
        done(verdicts)
    });
}

/// What the store answered replaces what the tier remembered: a HIT renews the key's
/// hint, a MISS forgets it (deleted behind the tier's back), a failed check neither.
pub(crate) fn learn<'a>(
    shared: &super::TierState,
    checked: impl Iterator<Item = (&'a [u8], &'a Verdict)> + Clone,
) {
    shared.dedup.remember_all(
        checked
            .clone()
            .filter(|(_, v)| **v == Ok(true))
            .map(|(k, _)| k),
    );
    shared
        .dedup
        .forget_all(checked.filter(|(_, v)| **v == Ok(false)).map(|(k, _)| k));
}

/// The groups' answers from their keys' verdicts, in order.
fn answers(
    shared: &super::TierState,
    groups: Vec<ProbeGroup>,
    verdicts: Vec<Verdict>,
) -> Vec<Existence> {
    let mut verdicts = verdicts.into_iter();
    let mut answers = Vec::new();
    for group in groups {
        let checks: Vec<Verdict> = verdicts.by_ref().take(group.probes.len()).collect();
        let group_failed = checks.len() < group.probes.len() || checks.iter().any(|c| c.is_err());
        learn(
            shared,
            group.probes.iter().map(|p| &*p.key).zip(checks.iter()),
        );
        let mut checks = checks.into_iter();
        answers.extend(group.probes.into_iter().map(|probe| Existence {
            found: !group_failed && checks.next() == Some(Ok(true)),
            slot: probe.slot,
            generation: probe.generation,
        }));
    }
    answers
}

/// One key's check: found or not, or failed (logged where it failed).
pub(crate) type Verdict = std::result::Result<bool, ()>;

/// The checks of a store asked over the network: every key's request in flight at once, up
/// to `max_inflight_lookups`.
async fn check_remote(shared: &super::TierState, keys: &[SharedKey]) -> Vec<Verdict> {
    let missing_is_forbidden = shared.probe == crate::store::ProbeOutcome::ReadyWithoutList;
    futures::future::join_all(keys.iter().map(|key| async move {
        if shared.dedup.is_corrupt(key) {
            return Ok(false); // the object is corrupt until this tier stores the key again
        }
        let _permit = shared.lookup_permits.acquire().await.map_err(|_| ())?;
        shared
            .stats
            .existence_checks
            .fetch_add(1, Ordering::Relaxed);
        let name = crate::store::object_path(&shared.layout.object_name(key).map_err(|_| ())?);
        let started = Instant::now();
        let found = shared
            .lookup_store
            .exists_for_lookup(&name, missing_is_forbidden)
            .await;
        check_done(shared, started, found)
    }))
    .await
}

/// Starts the checks of a store whose check is a system call on the calling thread (the
/// local store's `stat`, a few microseconds): no task or permit per key, which would cost
/// as much as the call, and the keys split in shares, one per I/O runtime worker, so that
/// on an idle machine a batch takes the time of its share on one core. Returns each
/// share's task with its number of keys.
fn check_in_place(
    shared: &Arc<super::TierState>,
    keys: Vec<SharedKey>,
    lane: &Handle,
) -> Vec<(JoinHandle<Vec<Verdict>>, usize)> {
    // Below this many keys a share is cheaper to run than to hand to another worker.
    const MIN_KEYS_PER_SHARE: usize = 32;
    let shares = shared
        .config
        .runtime_threads
        .min(keys.len().div_ceil(MIN_KEYS_PER_SHARE))
        .max(1);
    let per_share = keys.len().div_ceil(shares).max(1);
    let mut keys = keys.into_iter();
    (0..shares)
        .map(|_| {
            let share: Vec<SharedKey> = keys.by_ref().take(per_share).collect();
            let len = share.len();
            let shared = shared.clone();
            let task = lane.spawn(async move {
                let Some(mut checks) = shared.lookup_store.checks_in_place() else {
                    return vec![Err(()); share.len()]; // never: chosen for such a store only
                };
                share
                    .iter()
                    .map(|key| check_now(&shared, &mut checks, key))
                    .collect::<Vec<Verdict>>()
            });
            (task, len)
        })
        .collect()
}

fn check_now(
    shared: &super::TierState,
    checks: &mut crate::store::ExistenceChecks<'_>,
    key: &[u8],
) -> Verdict {
    if shared.dedup.is_corrupt(key) {
        return Ok(false); // the object is corrupt until this tier stores the key again
    }
    if shared.lookup_permits.is_closed() {
        return Err(()); // the tier is shutting down
    }
    shared
        .stats
        .existence_checks
        .fetch_add(1, Ordering::Relaxed);
    let name = shared.layout.object_name(key).map_err(|_| ())?;
    let started = Instant::now();
    let found = checks.exists(&name);
    check_done(shared, started, found)
}

/// A check's verdict, with its time recorded and a failure counted and logged.
fn check_done(
    shared: &super::TierState,
    started: Instant,
    found: crate::error::Result<bool>,
) -> Verdict {
    shared
        .metrics
        .existence_checked(started.elapsed().as_secs_f64());
    found.map_err(|e| {
        shared
            .stats
            .existence_check_errors
            .fetch_add(1, Ordering::Relaxed);
        log::warn!("existence check failed: {}", e.message);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use LookupResult::*;

    fn answer_all(table: &mut LookupTable, groups: Vec<ProbeGroup>, found: bool) {
        let answers: Vec<Existence> = groups
            .into_iter()
            .flat_map(|g| g.probes)
            .map(|p| Existence {
                slot: p.slot,
                generation: p.generation,
                found,
            })
            .collect();
        table.apply(answers);
    }

    #[test]
    fn retry_then_verdict_and_no_second_check() {
        let mut t = LookupTable::default();
        assert_eq!(t.lookup(1, b"k"), Retry);
        assert_eq!(t.lookup(1, b"k"), Retry);
        let groups = t.flush();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].probes.len(), 1);
        answer_all(&mut t, groups, true);
        assert_eq!(t.lookup(1, b"k"), Hit);
        assert!(t.flush().is_empty(), "a resolved key is not checked again");
    }

    #[test]
    fn two_requests_share_one_check_and_verdict_lives_until_both_finish() {
        let mut t = LookupTable::default();
        t.lookup(1, b"k");
        t.lookup(2, b"k");
        let groups = t.flush();
        assert_eq!(groups.iter().map(|g| g.probes.len()).sum::<usize>(), 1);
        answer_all(&mut t, groups, false);
        t.request_finished(1);
        assert_eq!(t.lookup(2, b"k"), Miss);
        t.request_finished(2);
        assert_eq!(t.tracked_keys(), 0);
    }

    #[test]
    fn in_flight_entry_survives_cleanup_and_late_answer_is_dropped() {
        let mut t = LookupTable::default();
        t.lookup(1, b"k");
        let groups = t.flush();
        t.request_finished(1);
        assert_eq!(t.tracked_keys(), 1, "kept while in flight");
        answer_all(&mut t, groups, true);
        assert_eq!(
            t.tracked_keys(),
            0,
            "dropped when the answer arrives unreferenced"
        );
    }

    #[test]
    fn stale_generation_never_lands_on_a_recreated_entry() {
        let mut t = LookupTable::default();
        t.lookup(1, b"k");
        t.request_finished(1); // pending, not in flight: dropped now
        let stale = Existence {
            slot: 0,
            generation: 1,
            found: true,
        };
        assert_eq!(t.lookup(2, b"k"), Retry);
        t.apply([stale]);
        assert_eq!(
            t.lookup(2, b"k"),
            Retry,
            "generation 1 answer ignored by generation 2 entry"
        );
        let groups = t.flush();
        assert_eq!(groups[0].probes[0].generation, 2);
    }

    #[test]
    fn holders_leave_in_any_order_and_freed_slots_are_reused() {
        let mut t = LookupTable::default();
        for request in [1, 2, 3] {
            t.lookup(request, b"k");
        }
        let groups = t.flush();
        answer_all(&mut t, groups, true);
        t.request_finished(1); // the first holder leaves first: the others keep the verdict
        assert_eq!(t.lookup(3, b"k"), Hit);
        t.request_finished(3);
        assert_eq!(t.lookup(2, b"k"), Hit);
        t.request_finished(2);
        assert_eq!(t.tracked_keys(), 0);
        // the freed slot serves a new key, which starts over and answers only for itself
        assert_eq!(t.lookup(4, b"other"), Retry);
        assert_eq!(t.slots.len(), 1, "the slot was reused");
        assert_eq!(t.lookup(4, b"k"), Retry, "a dropped verdict is asked again");
        let probes: Vec<_> = t.flush().into_iter().flat_map(|g| g.probes).collect();
        assert_eq!(probes.len(), 2);
        assert_eq!(&*probes[0].key, b"other");
        assert_eq!(&*probes[1].key, b"k");
    }

    #[test]
    fn mark_miss_only_touches_named_keys() {
        let mut t = LookupTable::default();
        t.lookup(1, b"a");
        t.lookup(1, b"b");
        let groups = t.flush();
        answer_all(&mut t, groups, true);
        t.mark_miss([&b"a"[..], &b"zzz"[..]]);
        assert_eq!(t.lookup(1, b"a"), Miss);
        assert_eq!(t.lookup(1, b"b"), Hit);
    }
}
