//! Outages ridden out by the retry budget: the S3 server really stops (killed; its port
//! refuses connections) for 0.5, 2 and 5 s and starts again on the same port while a tier
//! has many stores and loads in flight, with the default `retry_budget_ms` (20 s). No job
//! fails, every loaded byte is verified, and every key reported stored loads, with the
//! right bytes, in a fresh tier afterwards. Then what the budget bounds: a store whose
//! server stays down past the budget fails with `KVT_STATUS_CONNECT`, and a shutdown cuts
//! the retries of a job waiting out an outage short.
//!
//! s3s-fs comes back on the same directory, so blocks stored before the outage are loaded
//! across it. moto keeps its objects in memory (5.2 cannot save them), so it comes back
//! empty, its bucket created before it listens: its tier's stores are submitted while it
//! is down, and must all succeed and load afterwards.

mod support;

use std::time::{Duration, Instant};

use kvtier_core::{JobKind, Status, Tier};
use serde_json::{json, Value};

use support::*;

const BLOCK: usize = 64 * 1024;
/// Keys per job, and jobs of each kind in flight across an outage.
const PER_JOB: u64 = 4;
const JOBS: u64 = 12;
const KEYS: u64 = PER_JOB * JOBS;

/// The server's store section with the retry defaults (the shared one sets `max_retries`).
fn store(srv: &Server, bucket: &str) -> Value {
    let mut store = with_all(
        srv.store_json(bucket),
        json!({"connect_timeout_ms": 1000, "request_timeout_ms": 5000}),
    );
    store.as_object_mut().unwrap().remove("max_retries");
    store
}

fn tier(store: Value, extra: Value) -> Tier {
    Tier::from_json(&tier_json(
        store,
        with_all(json!({"max_inflight_transfers": 16}), extra),
    ))
    .unwrap_or_else(|e| panic!("tier start: {e}"))
}

fn ids(range: std::ops::Range<u64>) -> Vec<u64> {
    range.collect()
}

/// Submits `JOBS` jobs of `kind`, each of `PER_JOB` keys `first_key + ..` from (or into)
/// blocks `first_block + ..`, with job ids from `first_job`.
fn submit_jobs(tier: &Tier, kind: JobKind, first_job: u64, first_block: u64, first_key: u64) {
    for job in 0..JOBS {
        let at = job * PER_JOB;
        let blocks = ids(first_block + at..first_block + at + PER_JOB);
        let keys_of = ids(first_key + at..first_key + at + PER_JOB);
        tier.submit(kind, first_job + job, &blocks, keys(&keys_of))
            .unwrap();
    }
}

/// Every block `slot_base + i` holds the bytes of block `source_base + i`, for `count` blocks.
fn assert_same_blocks(pool: &Pool, slot_base: u64, source_base: u64, count: u64) {
    for i in 0..count {
        assert!(
            pool.block(slot_base + i) == pool.block(source_base + i),
            "block {} loaded the wrong bytes (source block {})",
            slot_base + i,
            source_base + i
        );
    }
}

/// Loads keys `first_key..first_key + KEYS` in a fresh tier into a pool of their own and
/// checks them against `source` (blocks `source_base..`).
fn fresh_tier_loads(store: Value, source: &Pool, source_base: u64, first_key: u64) {
    let fresh = tier(store, json!({}));
    let mut pool = Pool::new(KEYS, BLOCK);
    pool.register(&fresh);
    let r = run_job(
        &fresh,
        JobKind::Load,
        1,
        &ids(0..KEYS),
        &ids(first_key..first_key + KEYS),
    );
    assert_eq!(
        r.status,
        Status::Ok,
        "a key reported stored does not load in a fresh tier: {}",
        r.message
    );
    for i in 0..KEYS {
        assert!(
            pool.block(i) == source.block(source_base + i),
            "key {} loads the wrong bytes in a fresh tier",
            first_key + i
        );
    }
}

fn assert_all_ok(results: &std::collections::HashMap<u64, kvtier_core::JobResult>, what: &str) {
    for (id, r) in results {
        assert_eq!(
            r.status,
            Status::Ok,
            "{what}: job {id} failed across the outage: {:?}: {}",
            r.key_status,
            r.message
        );
    }
}

/// s3s-fs down for `outage`: loads of blocks stored before it and stores of new ones, half
/// submitted before the kill and half while the port refuses connections.
fn s3s_fs_restart(outage: Duration) {
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let store = store(&srv, &bucket);
    let tier = tier(store.clone(), json!({}));
    // Blocks 0..KEYS: stored first; KEYS..3*KEYS: stored across the outage (two rounds);
    // 3*KEYS..5*KEYS: where the first ones load (two rounds). A job holds its blocks.
    let pool = Pool::random_registered(&tier, 5 * KEYS, BLOCK, 1234);
    let r = run_job(&tier, JobKind::Store, 1, &ids(0..KEYS), &ids(0..KEYS));
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    let retries_before = tier.stats().retries;

    // Half of each kind in flight at the kill, half submitted while the server is down.
    submit_jobs(&tier, JobKind::Store, 100, KEYS, 1000);
    submit_jobs(&tier, JobKind::Load, 200, 3 * KEYS, 0);
    srv.stop();
    let down = Instant::now();
    submit_jobs(&tier, JobKind::Store, 300, 2 * KEYS, 2000);
    submit_jobs(&tier, JobKind::Load, 400, 4 * KEYS, 0);
    std::thread::sleep(outage); // the outage itself: the fault under test
    srv.start_again(&[]);
    let down_for = down.elapsed();
    let results = wait_all(&tier, 4 * JOBS as usize);
    assert_all_ok(&results, &format!("s3s-fs down {down_for:?}"));
    assert_same_blocks(&pool, 3 * KEYS, 0, KEYS);
    assert_same_blocks(&pool, 4 * KEYS, 0, KEYS);
    assert!(
        tier.stats().retries > retries_before,
        "no request was repeated: the outage was not met"
    );
    eprintln!(
        "s3s-fs down {down_for:?} (outage {outage:?}): {} jobs ok, {} retries",
        results.len(),
        tier.stats().retries - retries_before
    );
    drop(tier);
    fresh_tier_loads(store.clone(), &pool, KEYS, 1000);
    fresh_tier_loads(store, &pool, 2 * KEYS, 2000);
}

/// moto down for `outage`: stores submitted while it is down; it comes back empty with its
/// bucket, and every store succeeds and loads afterwards.
fn moto_restart(outage: Duration) {
    let srv = Server::moto();
    let bucket = srv.new_bucket();
    let store = store(&srv, &bucket);
    let tier = tier(store.clone(), json!({}));
    let pool = Pool::random_registered(&tier, 2 * KEYS, BLOCK, 4321);
    srv.stop();
    let down = Instant::now();
    submit_jobs(&tier, JobKind::Store, 100, 0, 0);
    std::thread::sleep(outage); // the outage itself: the fault under test
    srv.start_again(&[&bucket]);
    let down_for = down.elapsed();
    let results = wait_all(&tier, JOBS as usize);
    assert_all_ok(&results, &format!("moto down {down_for:?}"));
    assert!(
        tier.stats().retries > 0,
        "no request was repeated: the outage was not met"
    );
    eprintln!(
        "moto down {down_for:?} (outage {outage:?}): {} jobs ok, {} retries",
        results.len(),
        tier.stats().retries
    );
    // Loads in the same tier too, into the pool's other half.
    submit_jobs(&tier, JobKind::Load, 200, KEYS, 0);
    assert_all_ok(&wait_all(&tier, JOBS as usize), "loads after the restart");
    assert_same_blocks(&pool, KEYS, 0, KEYS);
    drop(tier);
    fresh_tier_loads(store, &pool, 0, 0);
}

#[test]
fn s3s_fs_down_half_a_second() {
    s3s_fs_restart(Duration::from_millis(500));
}

#[test]
fn s3s_fs_down_two_seconds() {
    s3s_fs_restart(Duration::from_secs(2));
}

#[test]
fn s3s_fs_down_five_seconds() {
    s3s_fs_restart(Duration::from_secs(5));
}

#[test]
fn moto_down_half_a_second() {
    moto_restart(Duration::from_millis(500));
}

#[test]
fn moto_down_two_seconds() {
    moto_restart(Duration::from_secs(2));
}

#[test]
fn moto_down_five_seconds() {
    moto_restart(Duration::from_secs(5));
}

/// A server down past the budget: the store fails with the status of its last attempt (a
/// refused connection), after the budget and not long after it.
#[test]
fn a_store_past_its_budget_fails_with_connect() {
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let store = with(store(&srv, &bucket), "retry_budget_ms", json!(1500));
    let tier = tier(store, json!({}));
    let _pool = Pool::random_registered(&tier, 4, BLOCK, 9);
    srv.stop();
    let started = Instant::now();
    let r = run_job(&tier, JobKind::Store, 1, &[0, 1], &[0, 1]);
    let took = started.elapsed();
    assert!(
        r.key_status.iter().all(|s| *s == Status::Connect),
        "{:?}: {}",
        r.key_status,
        r.message
    );
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "the budget of 1.5 s ended the store after {took:?}"
    );
}

/// A job waiting out an outage does not hold a shutdown past its grace: the runtime drops
/// the task in its backoff, and the job is reported cancelled, once.
#[test]
fn shutdown_cuts_retries_short() {
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let tier = tier(store(&srv, &bucket), json!({"shutdown_timeout_ms": 300}));
    let _pool = Pool::random_registered(&tier, 4, BLOCK, 10);
    srv.stop();
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[0, 1]))
        .unwrap();
    let started = Instant::now();
    tier.shutdown();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "shutdown took {took:?} with a 300 ms grace"
    );
    let results = tier.poll(usize::MAX);
    assert_eq!(results.len(), 1, "one result per job");
    assert_eq!(
        results[0].status,
        Status::Cancelled,
        "{}",
        results[0].message
    );
}

/// A lookup during an outage: its check repeats for at most 2 s (not the 20 s budget of
/// jobs), then answers MISS, never HIT; once the server is back, a new lookup finds the
/// key. The key was stored by another tier, so this one knows nothing of it.
#[test]
fn a_lookup_during_an_outage_answers_miss_within_its_budget() {
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let store = store(&srv, &bucket);
    let writer = tier(store.clone(), json!({}));
    let _pool = Pool::random_registered(&writer, 1, BLOCK, 11);
    let r = run_job(&writer, JobKind::Store, 1, &[0], &[7]);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    let reader = tier(store, json!({}));
    srv.stop();
    let started = Instant::now();
    let verdict = resolve_lookup(&reader, 1, &key(7));
    let took = started.elapsed();
    assert_eq!(
        verdict,
        kvtier_core::LookupResult::Miss,
        "a lookup answered {verdict:?} while the store was down"
    );
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(8),
        "the lookup's 2 s budget ended its check after {took:?}"
    );
    assert_eq!(reader.stats().existence_check_errors, 1);
    reader.request_finished(1);
    srv.start_again(&[]);
    assert_eq!(
        resolve_lookup(&reader, 2, &key(7)),
        kvtier_core::LookupResult::Hit
    );
}

/// The other request kinds across an outage of 1 s: a block of two parts stored as a
/// multipart upload (HEAD, create, part PUTs, complete), a listing and a delete, all begun
/// while the port refuses connections: each succeeds once the server is back.
#[test]
fn every_request_kind_rides_out_a_restart() {
    use futures::StreamExt;
    const LARGE: usize = 10 << 20;
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let store = with(store(&srv, &bucket), "store_part_bytes", json!(5 << 20));
    oob_put(&store, "other/a.bin", vec![1; 100]);
    oob_put(&store, "other/b.bin", vec![2; 100]);
    let tier = tier(store.clone(), json!({}));
    let pool = Pool::random_registered(&tier, 1, LARGE, 12);
    srv.stop();
    tier.submit(JobKind::Store, 1, &[0], keys(&[5])).unwrap();
    let straight = store.clone();
    let listing_and_delete = std::thread::spawn(move || {
        block_on(async {
            let other = oob_store(&straight);
            let listed: Vec<_> = other.list("other").collect().await;
            let deleted = other
                .delete(&kvtier_core::store::object_path("other/b.bin"))
                .await;
            (listed, deleted)
        })
    });
    std::thread::sleep(Duration::from_secs(1)); // the outage itself: the fault under test
    srv.start_again(&[]);
    let stored = wait_all(&tier, 1).remove(&1).unwrap();
    assert_eq!(stored.status, Status::Ok, "{}", stored.message);
    let (listed, deleted) = listing_and_delete.join().unwrap();
    let names: Vec<String> = listed
        .into_iter()
        .map(|item| {
            item.unwrap_or_else(|e| panic!("listing across the outage: {e}"))
                .name
        })
        .collect();
    assert!(names.iter().any(|n| n == "other/a.bin"), "{names:?}");
    deleted.unwrap_or_else(|e| panic!("delete across the outage: {e}"));
    assert_eq!(oob_get(&store, "other/b.bin"), None);
    drop(tier);
    let fresh = tier_with_pool(store, LARGE);
    let r = run_job(&fresh.0, JobKind::Load, 1, &[0], &[5]);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert!(
        fresh.1.block(0) == pool.block(0),
        "the large block loads other bytes"
    );
}

fn tier_with_pool(store: Value, block: usize) -> (Tier, Pool) {
    let fresh = tier(store, json!({}));
    let mut pool = Pool::new(1, block);
    pool.register(&fresh);
    (fresh, pool)
}
