//! Bounded namespaces: eviction keeps a tier's namespace under its byte budget, deletes
//! the oldest blocks first, and yields one BlockRemoved event per deleted key.

use std::collections::HashSet;
use std::path::Path;

use kvtier_core::key::make_key;
use kvtier_core::{JobKind, KeyBatch, Status, Tier};

const BLOCK: usize = 16 * 1024;

fn key(i: u64) -> Vec<u8> {
    make_key(&i.to_be_bytes().repeat(4), 0)
}

/// Bytes of the block files under `dir` (every file but temporaries and probes).
fn stored_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if path.is_dir() {
            total += stored_bytes(&path);
        } else if path.extension().is_some_and(|e| e == "bin") {
            total += entry.metadata().unwrap().len();
        }
    }
    total
}

fn store_all(tier: &Tier, first: u64, n: u64) {
    for i in 0..n {
        let id = first + i;
        tier.submit(
            JobKind::Store,
            id,
            &[id % 64],
            KeyBatch::from_keys(&[key(id)]).unwrap(),
        )
        .unwrap();
        // One at a time, polled: each block's file is older than the next one's.
        let mut results = Vec::new();
        while results.is_empty() {
            results = tier.poll(1);
            if results.is_empty() {
                let mut fds = libc::pollfd {
                    fd: tier.ready_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                unsafe { libc::poll(&mut fds, 1, 10_000) };
            }
        }
        assert_eq!(results[0].status, Status::Ok, "{}", results[0].message);
    }
}

#[test]
fn a_budget_is_kept_through_rounds_with_one_removed_event_per_deleted_key() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 10 * BLOCK as u64;
    let config = serde_json::json!({
        "store": {"type": "local", "path": dir.path()},
        "namespace": "m_0123456789ab_r0",
        "enable_kv_events": true,
        "dedup": "skip_known",
        "eviction": {"max_bytes": budget, "interval_ms": 3_600_000},
    });
    let tier = Tier::from_json(&config.to_string()).unwrap();
    let mut mem = vec![5u8; 64 * BLOCK];
    unsafe { tier.register_memory(mem.as_mut_ptr(), 64, BLOCK).unwrap() };
    let mut removed: Vec<Vec<u8>> = Vec::new();
    let mut stored = 0u64;
    for round in 0..5u64 {
        store_all(&tier, round * 100, 7);
        stored += 7;
        let report = tier.evict_now().unwrap();
        let on_disk = stored_bytes(dir.path());
        assert!(
            on_disk <= budget,
            "round {round}: {on_disk} bytes on disk, budget {budget}"
        );
        assert_eq!(
            report.bytes - report.deleted_bytes,
            on_disk,
            "round {round}: {report:?}"
        );
        for event in tier.take_events(usize::MAX) {
            if event.removed {
                assert_eq!(event.job_id, 0);
                removed.extend(event.keys.iter().map(<[u8]>::to_vec));
            }
        }
    }
    // Every key deleted once; exactly the ones past the budget; the last round's newest
    // block (written after every other) never. (Which of blocks written within one clock
    // tick goes first is the name's call: modification times tie there.)
    let distinct: HashSet<_> = removed.iter().cloned().collect();
    assert_eq!(
        distinct.len(),
        removed.len(),
        "a key was reported removed twice"
    );
    assert_eq!(removed.len() as u64, stored - budget / BLOCK as u64);
    for k in &removed {
        assert!(
            !dir.path()
                .join(tier.layout().object_name(k).unwrap())
                .exists(),
            "a removed key's file is still there"
        );
    }
    assert_eq!(tier.stats().evicted_blocks, removed.len() as u64);
    // A deleted key loads as NotFound, and a store of it uploads it again (dedup forgot it).
    let gone = removed[0].clone();
    tier.submit(
        JobKind::Load,
        9_000,
        &[63],
        KeyBatch::from_keys(std::slice::from_ref(&gone)).unwrap(),
    )
    .unwrap();
    let mut results = Vec::new();
    while results.is_empty() {
        results = tier.poll(1);
        if results.is_empty() {
            let mut fds = libc::pollfd {
                fd: tier.ready_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            unsafe { libc::poll(&mut fds, 1, 10_000) };
        }
    }
    assert_eq!(results[0].status, Status::NotFound);
    tier.shutdown();
    drop(tier);
    drop(mem);
}

#[test]
fn eviction_needs_a_bound_and_a_namespace() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, words) in [
        (
            serde_json::json!({"namespace": "n", "eviction": {}}),
            "max_bytes",
        ),
        (
            serde_json::json!({"eviction": {"max_bytes": 1}}),
            "prefix or namespace",
        ),
        (
            serde_json::json!({"namespace": "n", "eviction": {"max_bytes": 1, "interval_ms": 0}}),
            "interval_ms",
        ),
    ] {
        let mut config = serde_json::json!({"store": {"type": "local", "path": dir.path()}});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let e = Tier::from_json(&config.to_string()).err().expect("refused");
        assert_eq!(e.status, Status::Config);
        assert!(e.message.contains(words), "{}", e.message);
    }
    let tier =
        Tier::from_json(&serde_json::json!({"store": {"type": "memory"}}).to_string()).unwrap();
    assert_eq!(tier.evict_now().unwrap_err().status, Status::State);
}

#[test]
fn deleting_named_keys_removes_their_objects_with_one_removed_event_each() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "store": {"type": "local", "path": dir.path()},
        "namespace": "lmcache",
        "enable_kv_events": true,
        "dedup": "skip_known",
    });
    let tier = Tier::from_json(&config.to_string()).unwrap();
    let mut mem = vec![7u8; 64 * BLOCK];
    unsafe { tier.register_memory(mem.as_mut_ptr(), 64, BLOCK).unwrap() };
    store_all(&tier, 0, 4);
    let file = |k: &[u8]| dir.path().join(tier.layout().object_name(k).unwrap());
    let absent = key(99);
    let report = tier.delete_keys(&[key(0), key(2), absent.clone()]).unwrap();
    // An absent key is gone as well: deleted by someone else first, or never stored.
    assert_eq!((report.objects, report.deleted), (3, 3), "{report:?}");
    assert!(!file(&key(0)).exists() && !file(&key(2)).exists());
    assert!(file(&key(1)).exists() && file(&key(3)).exists());
    let removed: HashSet<Vec<u8>> = tier
        .take_events(usize::MAX)
        .into_iter()
        .filter(|e| e.removed)
        .flat_map(|e| e.keys.iter().map(<[u8]>::to_vec).collect::<Vec<_>>())
        .collect();
    assert_eq!(removed, HashSet::from([key(0), key(2), absent]));
    // Dedup forgot the deleted keys: a store uploads key 0 again.
    store_all(&tier, 0, 1);
    assert!(file(&key(0)).exists());
    // A key of the wrong length deletes nothing.
    let err = tier.delete_keys(&[vec![1u8; 9]]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(file(&key(1)).exists());
    tier.shutdown();
    drop(tier);
    drop(mem);
}

#[test]
fn pinned_blocks_stay_through_eviction_and_count_towards_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 4 * BLOCK as u64;
    let config = serde_json::json!({
        "store": {"type": "local", "path": dir.path()},
        "namespace": "m_0123456789ab_r0",
        "enable_kv_events": true,
        "eviction": {"max_bytes": budget, "interval_ms": 3_600_000},
    });
    let tier = Tier::from_json(&config.to_string()).unwrap();
    let mut mem = vec![7u8; 64 * BLOCK];
    unsafe { tier.register_memory(mem.as_mut_ptr(), 64, BLOCK).unwrap() };
    // Blocks 0..8, oldest first; the three oldest are pinned (one of them twice).
    store_all(&tier, 0, 8);
    let pinned = [key(0), key(1), key(2)];
    assert_eq!(tier.pin_keys(&pinned).unwrap(), [true; 3]);
    tier.pin_keys(&[key(0)]).unwrap();
    assert_eq!(tier.pinned_keys(), 3);

    let report = tier.evict_now().unwrap();
    // The pinned blocks stay and count: of the 5 others, 4 go to meet a budget of 4.
    assert_eq!((report.objects, report.deleted), (8, 4), "{report:?}");
    assert_eq!(stored_bytes(dir.path()), budget);
    let exists = |k: &Vec<u8>| {
        dir.path()
            .join(tier.layout().object_name(k).unwrap())
            .exists()
    };
    assert!(pinned.iter().all(exists), "a pinned block was evicted");
    assert!(exists(&key(7)), "the newest unpinned block was evicted");

    // Unpinned (key 0 keeps one pin; key 5 was never pinned), the oldest go next.
    assert_eq!(
        tier.unpin_keys(&[key(0), key(1), key(2), key(5)]).unwrap(),
        1
    );
    store_all(&tier, 8, 2);
    let report = tier.evict_now().unwrap();
    assert_eq!(report.deleted, 2, "{report:?}");
    assert!(exists(&key(0)) && !exists(&key(1)) && !exists(&key(2)));
    tier.unpin_keys(&[key(0)]).unwrap();
    assert_eq!(tier.pinned_keys(), 0);
    store_all(&tier, 10, 1);
    let report = tier.evict_now().unwrap();
    assert_eq!(report.deleted, 1, "{report:?}");
    assert!(!exists(&key(0)) && exists(&key(7)) && exists(&key(10)));

    // Pins are refused for a wrong key length and after shutdown, naming why.
    let err = tier.pin_keys(&[vec![1u8; 3]]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{}", err.message);
    tier.shutdown();
    assert_eq!(tier.pin_keys(&pinned).unwrap_err().status, Status::ShutDown);
    drop(tier);
    drop(mem);
}
