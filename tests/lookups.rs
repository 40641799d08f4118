//! Lookups, events and per-key failure marking through the engine.

mod support;

use std::time::Duration;

use kvtier_core::key::make_key;
use kvtier_core::{JobKind, KeyBatch, LookupResult, Status, Tier};
use support::resolve_lookup as resolve;

const BLOCK: usize = 4096;

fn key(i: u64) -> Vec<u8> {
    let mut hash = [0x5au8; 32];
    hash[..8].copy_from_slice(&i.to_be_bytes());
    make_key(&hash, 0)
}

fn batch(ids: &[u64]) -> KeyBatch {
    KeyBatch::from_keys(&ids.iter().map(|&i| key(i)).collect::<Vec<_>>()).unwrap()
}

fn tier(extra: &str) -> (Tier, Vec<u8>) {
    let tier = Tier::from_json(&format!(r#"{{"store":{{"type":"memory"}}{extra}}}"#)).unwrap();
    let mut mem = vec![7u8; 16 * BLOCK];
    unsafe { tier.register_memory(mem.as_mut_ptr(), 16, BLOCK).unwrap() };
    (tier, mem)
}

fn run(
    tier: &Tier,
    kind: JobKind,
    id: u64,
    blocks: &[u64],
    keys: &[u64],
) -> kvtier_core::JobResult {
    let _ = tier.submit(kind, id, blocks, batch(keys));
    tier.drain(Duration::from_secs(30)).unwrap();
    let mut results = tier.poll(usize::MAX);
    assert_eq!(results.len(), 1);
    results.pop().unwrap()
}

#[test]
fn retry_then_verdict_and_repeated_lookups_issue_no_new_checks() {
    // One I/O thread: batches of checks start in the order schedule_end sends them, so a
    // later key's answer proves that every earlier batch has counted its checks.
    let (tier, _mem) = tier(r#","runtime_threads":1"#);
    assert!(run(&tier, JobKind::Store, 1, &[0], &[1]).succeeded());
    assert_eq!(tier.lookup(10, &key(1)).unwrap(), LookupResult::Retry);
    assert_eq!(tier.lookup(10, &key(2)).unwrap(), LookupResult::Retry);
    tier.schedule_end().unwrap();
    assert_eq!(resolve(&tier, 10, &key(1)), LookupResult::Hit);
    assert_eq!(resolve(&tier, 10, &key(2)), LookupResult::Miss);
    let checks = tier.stats().existence_checks;
    assert_eq!(checks, 2);
    for _ in 0..10 {
        tier.lookup(10, &key(1)).unwrap();
        tier.lookup(10, &key(2)).unwrap();
        tier.schedule_end().unwrap();
    }
    assert_eq!(resolve(&tier, 10, &key(3)), LookupResult::Miss);
    assert_eq!(
        tier.stats().existence_checks,
        checks + 1,
        "resolved keys are not checked again"
    );
}

#[test]
fn two_requests_share_one_check_until_both_finish() {
    let (tier, _mem) = tier("");
    tier.lookup(1, &key(5)).unwrap();
    tier.lookup(2, &key(5)).unwrap();
    tier.schedule_end().unwrap();
    assert_eq!(resolve(&tier, 1, &key(5)), LookupResult::Miss);
    assert_eq!(tier.lookup(2, &key(5)).unwrap(), LookupResult::Miss);
    assert_eq!(tier.stats().existence_checks, 1);
    tier.request_finished(1);
    assert_eq!(tier.tracked_lookup_keys(), 1);
    tier.request_finished(2);
    assert_eq!(tier.tracked_lookup_keys(), 0);
    // A later request checks again (and now sees the block once stored).
    assert!(run(&tier, JobKind::Store, 1, &[0], &[5]).succeeded());
    assert_eq!(resolve(&tier, 3, &key(5)), LookupResult::Hit);
    assert_eq!(tier.stats().existence_checks, 2);
}

#[test]
fn failed_load_marks_only_failed_keys_miss() {
    let (tier, _mem) = tier("");
    assert!(run(&tier, JobKind::Store, 1, &[0, 1], &[1, 2]).succeeded());
    for k in [1, 2, 3] {
        tier.lookup(7, &key(k)).unwrap();
    }
    tier.schedule_end().unwrap();
    assert_eq!(resolve(&tier, 7, &key(1)), LookupResult::Hit);
    assert_eq!(resolve(&tier, 7, &key(2)), LookupResult::Hit);
    // Delete key 2 behind the tier's back; its load fails, key 1's succeeds.
    let store = tier.store().client().clone();
    let name = object_store::path::Path::from(tier.layout().object_name(&key(2)).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        object_store::ObjectStoreExt::delete(&*store, &name)
            .await
            .unwrap()
    });
    let r = run(&tier, JobKind::Load, 2, &[4, 5], &[1, 2]);
    assert_eq!(r.key_status, vec![Status::Ok, Status::NotFound]);
    assert_eq!(tier.lookup(7, &key(1)).unwrap(), LookupResult::Hit);
    assert_eq!(tier.lookup(7, &key(2)).unwrap(), LookupResult::Miss);
}

#[test]
fn events_only_for_successful_stores_in_key_order() {
    let (tier, _mem) = tier(r#","enable_kv_events":true,"locality":"REMOTE""#);
    assert!(run(&tier, JobKind::Store, 1, &[0, 1, 2], &[3, 1, 2]).succeeded());
    assert!(!run(&tier, JobKind::Store, 2, &[99], &[4]).succeeded());
    assert!(run(&tier, JobKind::Load, 3, &[5], &[3]).succeeded());
    assert!(!run(&tier, JobKind::Load, 4, &[6], &[42]).succeeded());
    let events = tier.take_events(usize::MAX);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].job_id, 1);
    assert_eq!(events[0].keys, batch(&[3, 1, 2]));
    assert_eq!(
        events[0].locality,
        Some(kvtier_core::config::Locality::REMOTE)
    );
    assert!(
        tier.take_events(usize::MAX).is_empty(),
        "take_events drains"
    );
}

#[test]
fn events_disabled_by_default() {
    let (tier, _mem) = tier("");
    assert!(run(&tier, JobKind::Store, 1, &[0], &[1]).succeeded());
    assert!(tier.take_events(usize::MAX).is_empty());
}

#[test]
fn lookup_rejects_bad_keys_and_calls_after_shutdown() {
    let (tier, _mem) = tier("");
    assert_eq!(
        tier.lookup(1, &[1, 2, 3]).unwrap_err().status,
        Status::InvalidArgument
    );
    tier.shutdown();
    assert_eq!(
        tier.lookup(1, &key(1)).unwrap_err().status,
        Status::ShutDown
    );
}

/// A local store (checked in shares, two I/O workers) holding keys `0..200` for which
/// `stored` holds, and a key whose check fails: its shard directory is a file.
struct DamagedLocalStore {
    tier: Tier,
    damaged: Vec<u8>,
    // Dropped after the tier, which uses both until then.
    _mem: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl DamagedLocalStore {
    fn new(stored: impl Fn(u64) -> bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            r#"{{"store":{{"type":"local","path":{:?}}},"runtime_threads":2}}"#,
            dir.path()
        );
        let tier = Tier::from_json(&config).unwrap();
        let mut mem = vec![7u8; 16 * BLOCK];
        unsafe { tier.register_memory(mem.as_mut_ptr(), 16, BLOCK).unwrap() };
        let keys: Vec<u64> = (0..200).filter(|&i| stored(i)).collect();
        for (job, keys) in keys.chunks(16).enumerate() {
            let blocks: Vec<u64> = (0..keys.len() as u64).collect();
            assert!(run(&tier, JobKind::Store, job as u64 + 1, &blocks, keys).succeeded());
        }
        let mut hash = [0x5au8; 32];
        hash[0] = 0xff;
        let damaged = make_key(&hash, 0);
        let name = tier.layout().object_name(&damaged).unwrap();
        let shard = name.rsplitn(3, '/').nth(2).unwrap();
        std::fs::create_dir_all(dir.path().join(shard).parent().unwrap()).unwrap();
        std::fs::write(dir.path().join(shard), b"not a directory").unwrap();
        DamagedLocalStore {
            tier,
            damaged,
            _mem: mem,
            _dir: dir,
        }
    }
}

/// The blocking check answers every key in order, as the store has it, and refuses what
/// a lookup refuses.
#[test]
fn check_now_answers_each_key_in_order() {
    let (tier, _mem) = tier("");
    assert!(run(&tier, JobKind::Store, 1, &[0, 1], &[0, 2]).succeeded());
    let asked: Vec<Vec<u8>> = (0..4).map(key).collect();
    let before = tier.stats().existence_checks;
    assert_eq!(
        tier.check_now(&asked, Duration::from_secs(30)).unwrap(),
        [
            LookupResult::Hit,
            LookupResult::Miss,
            LookupResult::Hit,
            LookupResult::Miss
        ]
    );
    assert_eq!(tier.stats().existence_checks, before + 4);
    // It shares nothing with the per-request lookups.
    assert_eq!(tier.tracked_lookup_keys(), 0);
    assert!(tier
        .check_now(&[] as &[Vec<u8>], Duration::ZERO)
        .unwrap()
        .is_empty());
    assert_eq!(
        tier.check_now(&[vec![1u8, 2, 3]], Duration::from_secs(1))
            .unwrap_err()
            .status,
        Status::InvalidArgument
    );
    tier.shutdown();
    assert_eq!(
        tier.check_now(&asked, Duration::from_secs(1))
            .unwrap_err()
            .status,
        Status::ShutDown
    );
}

/// On the local store (checked in shares, one per worker) a key whose check fails answers
/// RETRY alone; every other key answers as the store has it.
#[test]
fn check_now_on_a_local_store_fails_only_the_failed_key() {
    let store = DamagedLocalStore::new(|i| i.is_multiple_of(3));
    let (tier, damaged) = (&store.tier, store.damaged.clone());

    let mut asked: Vec<Vec<u8>> = (0..200).map(key).collect();
    asked.insert(120, damaged);
    let verdicts = tier.check_now(&asked, Duration::from_secs(30)).unwrap();
    assert_eq!(verdicts.len(), 201);
    assert_eq!(verdicts[120], LookupResult::Retry, "the damaged key");
    for (i, verdict) in verdicts.iter().enumerate().filter(|(i, _)| *i != 120) {
        let id = if i < 120 { i } else { i - 1 } as u64;
        let want = if id.is_multiple_of(3) {
            LookupResult::Hit
        } else {
            LookupResult::Miss
        };
        assert_eq!(*verdict, want, "key {id}");
    }
}

/// The local store checks a batch in shares, one per I/O worker; a group (one request's
/// keys) still fails as a whole when one of its keys fails in another share, and every
/// other verdict is the store's.
#[test]
fn local_batches_split_across_workers_keep_group_verdicts() {
    let store = DamagedLocalStore::new(|i| i.is_multiple_of(2));
    let (tier, damaged) = (&store.tier, store.damaged.clone());
    let stored_verdict = |i: u64| {
        if i.is_multiple_of(2) {
            LookupResult::Hit
        } else {
            LookupResult::Miss
        }
    };

    // Request 2 asks first: its 150 keys and the damaged one end in the second share
    // (201 keys in two shares of 101); request 1's 50 keys follow.
    for i in 0..150 {
        tier.lookup(2, &key(i)).unwrap();
    }
    tier.lookup(2, &damaged).unwrap();
    for i in 150..200 {
        tier.lookup(1, &key(i)).unwrap();
    }
    tier.schedule_end().unwrap();
    for i in 0..150 {
        assert_eq!(resolve(tier, 2, &key(i)), LookupResult::Miss, "key {i}");
    }
    assert_eq!(resolve(tier, 2, &damaged), LookupResult::Miss);
    for i in 150..200 {
        assert_eq!(resolve(tier, 1, &key(i)), stored_verdict(i), "key {i}");
    }
    let stats = tier.stats();
    assert_eq!(stats.existence_checks, 201);
    assert_eq!(stats.existence_check_errors, 1);
    // Without the damaged key, request 2's stored keys are found.
    tier.request_finished(2);
    for i in 0..150 {
        tier.lookup(3, &key(i)).unwrap();
    }
    tier.schedule_end().unwrap();
    for i in 0..150 {
        assert_eq!(resolve(tier, 3, &key(i)), stored_verdict(i), "key {i}");
    }
}
