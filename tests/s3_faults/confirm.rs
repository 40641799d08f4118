//! A conditional store (If-None-Match: *) answered 412 after an earlier attempt that may
//! have stored the object (s3s-fs, behind the proxy): the object found is confirmed by its
//! length and recorded checksum before the key is reported stored, and overwritten when it
//! is not this store's.

use std::collections::HashSet;
use std::sync::Mutex;

use kvtier_core::{JobKind, Status};
use serde_json::json;

use crate::common::*;
use crate::support::proxy::Fault;
use crate::support::*;

const JOBS: u64 = 8;
const PER_JOB: u64 = 2;
const KEYS: u64 = JOBS * PER_JOB;

/// Stores `KEYS` keys (blocks `0..KEYS`) in jobs of `PER_JOB`, each job succeeding.
fn store_all(tier: &kvtier_core::Tier, what: &str) {
    for job in 0..JOBS {
        let ids: Vec<u64> = (job * PER_JOB..(job + 1) * PER_JOB).collect();
        tier.submit(JobKind::Store, job, &ids, keys(&ids)).unwrap();
    }
    for (id, r) in wait_all(tier, JOBS as usize) {
        assert_eq!(
            r.key_status,
            vec![Status::Ok; PER_JOB as usize],
            "{what}: store job {id}: {}",
            r.message
        );
    }
}

/// PUTs through the proxy so far (the tier's start-up checks send some).
fn puts(rig: &Front) -> u64 {
    rig.proxy.stats().by_method.get("PUT").copied().unwrap_or(0)
}

/// A fresh tier, straight to the server, loads every key with the bytes stored.
fn fresh_tier_loads(rig: &Front, pool: &Pool, what: &str) {
    let fresh =
        kvtier_core::Tier::from_json(&tier_json(rig.srv.store_json(&rig.bucket), json!({})))
            .unwrap();
    let mut read = Pool::new(KEYS, BLOCK);
    read.register(&fresh);
    let ids: Vec<u64> = (0..KEYS).collect();
    let r = run_job(&fresh, JobKind::Load, 1, &ids, &ids);
    assert_eq!(r.status, Status::Ok, "{what}: fresh load: {}", r.message);
    for i in 0..KEYS {
        assert!(
            read.block(i) == pool.block(i),
            "{what}: key {i} loads other bytes than were stored"
        );
    }
}

/// The first PUT of every object reaches the server, which stores it, and the proxy
/// answers the client 500 (or cuts the connection after the server answered): the repeat
/// finds the object (412), which is this store's. Each key is reported stored once, as a
/// store of its own (not "already stored"), after a HEAD that confirmed it; the events
/// say so once per job.
pub fn a_412_after_an_ambiguous_attempt_is_confirmed() {
    let srv = Server::s3s_fs();
    for (fault, direct) in [
        (Fault::StatusAfter(500), true),
        (Fault::StatusAfter(500), false),
        (Fault::DropResponse, true),
    ] {
        let what = format!("{fault:?} direct_http={direct}");
        let rig = Front::new(&srv);
        let tier = rig.tier(
            json!({"direct_http": direct, "request_timeout_ms": 2000}),
            json!({"dedup": "conditional", "enable_kv_events": true}),
        );
        let pool = Pool::random_registered(&tier, KEYS, BLOCK, 61);
        rig.proxy.set_rule(first_of_each_object("PUT", fault));
        let puts_before = puts(&rig);
        store_all(&tier, &what);
        let stats = tier.stats();
        assert_eq!(stats.keys_stored, KEYS, "{what}: {stats:?}");
        assert_eq!(
            stats.dedup_already_stored, 0,
            "{what}: a key its own attempt stored was counted as found: {stats:?}"
        );
        let proxy = rig.proxy.stats();
        assert_eq!(proxy.faults(fault.name()), KEYS, "{what}: {proxy:?}");
        assert!(
            proxy.by_method.get("HEAD").copied().unwrap_or(0) >= KEYS,
            "{what}: the objects found were not looked at: {proxy:?}"
        );
        // The faulted attempt and the repeat answered 412, and no overwrite: the object
        // found was confirmed as this store's by its length and checksum.
        assert_eq!(puts(&rig) - puts_before, 2 * KEYS, "{what}: {proxy:?}");
        let events = tier.take_events(usize::MAX);
        assert_eq!(events.len(), JOBS as usize, "{what}: one event per job");
        let mut job_ids: Vec<u64> = events.iter().map(|e| e.job_id).collect();
        job_ids.sort_unstable();
        assert_eq!(job_ids, (0..JOBS).collect::<Vec<_>>(), "{what}");
        assert!(events
            .iter()
            .all(|e| !e.removed && e.keys.len() == PER_JOB as usize));
        fresh_tier_loads(&rig, &pool, &what);
    }
}

/// Between the first attempt (answered 500 without reaching the server) and its repeat,
/// another client writes other bytes at the key: shorter ones, or as many bytes with
/// another content. The repeat's 412 is not taken as stored: the object is overwritten
/// with this store's bytes, which a fresh reader then loads.
pub fn a_412_over_other_bytes_after_an_ambiguous_attempt_overwrites() {
    let srv = Server::s3s_fs();
    for (case, other_bytes) in [
        ("shorter", random_bytes(BLOCK / 2, 5)),
        ("as long, other bytes", random_bytes(BLOCK, 6)),
    ] {
        let what = format!("other object {case}");
        let rig = Front::new(&srv);
        let tier = rig.tier(
            json!({"request_timeout_ms": 2000}),
            json!({"dedup": "conditional"}),
        );
        let pool = Pool::random_registered(&tier, KEYS, BLOCK, 62);
        let straight = srv.store_json(&rig.bucket);
        let prefix = format!("/{}/", rig.bucket);
        let seen = Mutex::new(HashSet::new());
        let other = other_bytes.clone();
        rig.proxy.set_rule(move |r| {
            if r.method != "PUT" || !r.path.contains(".bin") {
                return Fault::Pass;
            }
            let name = r.path.split('?').next().unwrap_or_default();
            let name = name.strip_prefix(&prefix).unwrap_or(name).to_string();
            if !seen.lock().unwrap().insert(name.clone()) {
                return Fault::Pass;
            }
            // Another writer, straight to the server, before the first attempt fails.
            oob_put(&straight, &name, other.clone());
            Fault::Status(500)
        });
        let puts_before = puts(&rig);
        store_all(&tier, &what);
        let proxy = rig.proxy.stats();
        assert_eq!(proxy.faults("status"), KEYS, "{what}");
        // The faulted attempt, the repeat answered 412, and the overwrite.
        assert_eq!(puts(&rig) - puts_before, 3 * KEYS, "{what}: {proxy:?}");
        fresh_tier_loads(&rig, &pool, &what);
        assert_eq!(tier.stats().dedup_already_stored, 0, "{what}");
    }
}
