//! Faults between kvtier and real S3 servers (s3s-fs, moto and Ceph RGW), injected by the
//! project's own proxy (`support::proxy`): dropped and reset connections, delays and
//! stalls, 500/503 answers, cut, short and corrupted bodies, a server ignoring Range, and
//! (on s3s-fs) the server killed mid-job and restarted.
//!
//! Every test counts: each job yields exactly one result (none lost, none twice), and no
//! key reports success with wrong bytes. Every test but the killed server runs on all three
//! servers.

#[macro_use]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvtier_core::{JobKind, JobResult, LookupResult, Status, Tier};
use serde_json::json;
use support::proxy::{Fault, Proxy, RequestInfo};
use support::*;

const BLOCK: usize = 32 * 1024;

struct Rig {
    srv: Server,
    proxy: Proxy,
    bucket: String,
}

impl Rig {
    fn new() -> Rig {
        let srv = Server::s3s_fs();
        let proxy = Proxy::start(srv.port());
        let bucket = srv.new_bucket();
        Rig { srv, proxy, bucket }
    }

    /// A tier talking to the server through the proxy.
    fn tier(&self, store_extra: serde_json::Value, top_extra: serde_json::Value) -> Tier {
        let mut store = with(
            self.srv.store_json(&self.bucket),
            "endpoint_override",
            json!(self.proxy.endpoint()),
        );
        for (k, v) in store_extra.as_object().unwrap() {
            store[k] = v.clone();
        }
        Tier::from_json(&tier_json(store, top_extra)).unwrap_or_else(|e| panic!("tier start: {e}"))
    }

    fn restart_server(&self) {
        self.srv.start();
        self.proxy.set_upstream(self.srv.port());
    }
}

/// A deterministic "1 in n" choice by request number (a hash of it, so faults spread).
fn one_in(n: u64, salt: u64) -> impl Fn(&RequestInfo) -> bool {
    move |r: &RequestInfo| {
        r.seq > 0 && ((r.seq ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32).is_multiple_of(n)
    }
}

/// Checks every successful load key against the block it was stored from.
fn assert_loaded_bytes(pool: &Pool, r: &JobResult, slots: &[u64], sources: &[u64]) {
    assert_eq!(r.key_status.len(), slots.len(), "one status per key");
    for ((status, slot), source) in r.key_status.iter().zip(slots).zip(sources) {
        if status.is_ok() {
            assert!(
                pool.block(*slot) == pool.block(*source),
                "key of block {source} succeeded with wrong bytes in slot {slot}"
            );
        }
    }
}

fn one_percent_5xx_and_slowdown_all_jobs_succeed(srv: &Server) {
    let rig = Front::new(srv);
    let pick = one_in(100, 7);
    rig.proxy.set_rule(move |r| {
        if pick(r) {
            Fault::Status(if r.seq % 2 == 0 { 500 } else { 503 })
        } else {
            Fault::Pass
        }
    });
    let tier = rig.tier(
        json!({"max_retries": 4}),
        json!({"max_inflight_transfers": 16}),
    );
    let mut pool = Pool::new(256, BLOCK);
    pool.fill_random(42);
    pool.register(&tier);
    // 32 store jobs of 4 keys, then 32 load jobs into the other half of the pool.
    for job in 0..32u64 {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        tier.submit(JobKind::Store, job, &ids, keys(&ids)).unwrap();
    }
    let stores = wait_all(&tier, 32);
    for (id, r) in &stores {
        assert_eq!(
            r.status,
            Status::Ok,
            "store job {id} failed despite retries: {}",
            r.message
        );
    }
    for job in 0..32u64 {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        let slots: Vec<u64> = ids.iter().map(|i| 255 - i).collect();
        tier.submit(JobKind::Load, 100 + job, &slots, keys(&ids))
            .unwrap();
    }
    let loads = wait_all(&tier, 32);
    for job in 0..32u64 {
        let r = &loads[&(100 + job)];
        assert_eq!(
            r.status,
            Status::Ok,
            "load job {job} failed despite retries: {}",
            r.message
        );
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        let slots: Vec<u64> = ids.iter().map(|i| 255 - i).collect();
        assert_loaded_bytes(&pool, r, &slots, &ids);
    }
    let stats = rig.proxy.stats();
    assert!(
        stats.faults("status") >= 2,
        "too few faults injected to prove anything: {stats:?}"
    );
    assert!(stats.requests >= 256, "{stats:?}");
}

fn connection_resets_and_cut_bodies_are_retried(srv: &Server) {
    let rig = Front::new(srv);
    let (drop_pick, cut_pick) = (one_in(40, 3), one_in(40, 11));
    rig.proxy.set_rule(move |r| {
        if drop_pick(r) {
            Fault::DropRequest
        } else if r.method == "GET" && cut_pick(r) {
            Fault::CutResponse
        } else {
            Fault::Pass
        }
    });
    let tier = rig.tier(
        json!({"max_retries": 4}),
        json!({"max_inflight_transfers": 8}),
    );
    let mut pool = Pool::new(128, BLOCK);
    pool.fill_random(5);
    pool.register(&tier);
    for job in 0..16u64 {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        tier.submit(JobKind::Store, job, &ids, keys(&ids)).unwrap();
    }
    for (id, r) in wait_all(&tier, 16) {
        assert_eq!(r.status, Status::Ok, "store job {id}: {}", r.message);
    }
    for job in 0..16u64 {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        let slots: Vec<u64> = ids.iter().map(|i| 127 - i).collect();
        tier.submit(JobKind::Load, 100 + job, &slots, keys(&ids))
            .unwrap();
    }
    let loads = wait_all(&tier, 16);
    for job in 0..16u64 {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        let slots: Vec<u64> = ids.iter().map(|i| 127 - i).collect();
        let r = &loads[&(100 + job)];
        assert_eq!(r.status, Status::Ok, "load job {job}: {}", r.message);
        assert_loaded_bytes(&pool, r, &slots, &ids);
    }
    let stats = rig.proxy.stats();
    assert!(
        stats.faults("drop_request") >= 1 && stats.faults("cut_response") >= 1,
        "{stats:?}"
    );
}

fn truncated_bodies_fail_their_key_and_never_succeed(srv: &Server) {
    let rig = Front::new(srv);
    let tier = rig.tier(json!({"max_retries": 2}), json!({}));
    let mut pool = Pool::new(16, BLOCK);
    pool.fill_random(9);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2, 3], keys(&[0, 1, 2, 3]))
        .unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    let short = tier.layout().object_name(&key(1)).unwrap();
    let cut = tier.layout().object_name(&key(2)).unwrap();
    rig.proxy.set_rule(move |r| {
        if r.method != "GET" {
            Fault::Pass
        } else if r.path.ends_with(&short) {
            Fault::ShortResponse // a well-framed answer with half the bytes, every time
        } else if r.path.ends_with(&cut) {
            Fault::CutResponse // the connection dies mid-body, every time
        } else {
            Fault::Pass
        }
    });
    let slots = [8, 9, 10, 11];
    let started = Instant::now();
    tier.submit(JobKind::Load, 2, &slots, keys(&[0, 1, 2, 3]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(r.key_status[0], Status::Ok, "{}", r.message);
    assert_eq!(
        r.key_status[1],
        Status::LengthMismatch,
        "a short body must be a length mismatch: {}",
        r.message
    );
    assert!(
        !r.key_status[2].is_ok(),
        "a body cut on every attempt must fail: {}",
        r.message
    );
    assert_eq!(r.key_status[3], Status::Ok, "{}", r.message);
    assert_eq!(r.bytes, 2 * BLOCK as u64);
    assert_loaded_bytes(&pool, &r, &slots, &[0, 1, 2, 3]);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    let stats = rig.proxy.stats();
    assert_eq!(
        stats.faults("short_response"),
        1,
        "a clean short answer is not retried: {stats:?}"
    );
    assert!(
        stats.faults("cut_response") >= 3,
        "a cut body is retried (1 + 2 retries): {stats:?}"
    );
}

fn slow_server_times_out_without_hanging(srv: &Server) {
    let rig = Front::new(srv);
    let tier = rig.tier(
        json!({"max_retries": 1, "request_timeout_ms": 400}),
        json!({}),
    );
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(4);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[0, 1]))
        .unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());

    rig.proxy.set_rule(|_| Fault::Delay(Duration::from_secs(4)));
    let started = Instant::now();
    tier.submit(JobKind::Load, 2, &[4, 5], keys(&[0, 1]))
        .unwrap();
    tier.submit(JobKind::Store, 3, &[2, 3], keys(&[2, 3]))
        .unwrap();
    let results = wait_all(&tier, 2);
    let elapsed = started.elapsed();
    for (id, r) in &results {
        assert!(
            !r.succeeded(),
            "job {id} succeeded against a server slower than the timeout"
        );
        assert!(
            r.key_status.iter().all(|s| *s == Status::Timeout),
            "job {id}: {:?} {}",
            r.key_status,
            r.message
        );
        assert!(
            r.message.contains("timed out") || r.message.contains("imeout"),
            "{}",
            r.message
        );
    }
    // Bounded by the timeouts, not by the server: two 0.4 s attempts plus backoff.
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");

    // The same tier works again once the server is fast.
    rig.proxy.set_rule(|_| Fault::Pass);
    tier.submit(JobKind::Load, 4, &[6, 7], keys(&[0, 1]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&4).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_loaded_bytes(&pool, &r, &[6, 7], &[0, 1]);
}

/// The blocking existence check answers RETRY for what the server has not answered by its
/// timeout, returns at that timeout (not the server's pace), and answers again once the
/// server is fast.
fn check_now_gives_up_at_its_timeout(srv: &Server) {
    let rig = Front::new(srv);
    let tier = rig.tier(json!({}), json!({}));
    let mut pool = Pool::new(4, BLOCK);
    pool.fill_random(5);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0], keys(&[0])).unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    let asked = [key(0), key(1)];
    assert_eq!(
        tier.check_now(&asked, Duration::from_secs(30)).unwrap(),
        [LookupResult::Hit, LookupResult::Miss]
    );

    rig.proxy
        .set_rule(|_| Fault::Delay(Duration::from_secs(20)));
    let started = Instant::now();
    let late = tier.check_now(&asked, Duration::from_millis(300)).unwrap();
    let waited = started.elapsed();
    assert_eq!(late, [LookupResult::Retry, LookupResult::Retry]);
    assert!(
        waited >= Duration::from_millis(300),
        "returned after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(15),
        "waited for the server: {waited:?}"
    );

    rig.proxy.set_rule(|_| Fault::Pass);
    assert_eq!(
        tier.check_now(&asked, Duration::from_secs(30)).unwrap(),
        [LookupResult::Hit, LookupResult::Miss]
    );
}

#[test]
fn server_killed_mid_job_then_restarted() {
    let rig = Rig::new();
    let tier = rig.tier(
        json!({"max_retries": 2, "connect_timeout_ms": 1000, "request_timeout_ms": 5000}),
        json!({"max_inflight_transfers": 4}),
    );
    let mut pool = Pool::new(128, BLOCK);
    pool.fill_random(77);
    pool.register(&tier);
    // Every request takes 150 ms: a 32-key job needs 8 rounds of 4, so a kill once the
    // fifth PUT has reached the proxy lands mid-job whatever the machine's load.
    rig.proxy
        .set_rule(|_| Fault::Delay(Duration::from_millis(150)));
    let ids: Vec<u64> = (0..32).collect();
    let puts = || rig.proxy.stats().by_method.get("PUT").copied().unwrap_or(0);
    let puts_before = puts();
    tier.submit(JobKind::Store, 1, &ids, keys(&ids)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while puts() < puts_before + 5 {
        assert!(
            Instant::now() < deadline,
            "the store job never reached the server"
        );
        std::thread::sleep(Duration::from_millis(1)); // a polling interval, not a wait for the job
    }
    rig.srv.kill();
    rig.proxy.close_connections();
    // A job submitted while the server is down fails too, per key.
    tier.submit(JobKind::Load, 2, &[100, 101], keys(&[0, 1]))
        .unwrap();
    let results = wait_all(&tier, 2);
    let store = &results[&1];
    assert_eq!(store.key_status.len(), 32);
    let failed: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|&i| !store.key_status[i as usize].is_ok())
        .collect();
    assert!(
        !failed.is_empty(),
        "the kill landed after the job: {:?}",
        store.key_status
    );
    assert!(!store.succeeded());
    for s in &store.key_status {
        assert!(
            matches!(
                s,
                Status::Ok | Status::Io | Status::Connect | Status::Timeout
            ),
            "unexpected key status {s:?}: {}",
            store.message
        );
    }
    assert_eq!(store.bytes, (32 - failed.len()) as u64 * BLOCK as u64);
    let down = &results[&2];
    assert!(
        down.key_status.iter().all(|s| !s.is_ok()),
        "{:?}",
        down.key_status
    );

    // Restart the server (same data, new port behind the same proxy): later jobs succeed.
    rig.restart_server();
    rig.proxy.set_rule(|_| Fault::Pass);
    // Keys the first job reported stored are there with the right bytes.
    let slots: Vec<u64> = ids.iter().map(|i| 64 + i).collect();
    tier.submit(JobKind::Load, 3, &slots, keys(&ids)).unwrap();
    let r = wait_all(&tier, 1).remove(&3).unwrap();
    let mut outcome: HashMap<Status, usize> = HashMap::new();
    for (i, s) in r.key_status.iter().enumerate() {
        *outcome.entry(*s).or_default() += 1;
        if store.key_status[i].is_ok() {
            assert_eq!(
                *s,
                Status::Ok,
                "key {i} was reported stored but does not load: {}",
                r.message
            );
        } else {
            // A failed store either never landed or landed whole (PUTs are atomic).
            assert!(
                matches!(s, Status::Ok | Status::NotFound),
                "key {i}: {s:?}: {}",
                r.message
            );
        }
    }
    assert_loaded_bytes(&pool, &r, &slots, &ids);
    // Storing the failed keys again works, and then every key loads.
    tier.submit(JobKind::Store, 4, &failed, keys(&failed))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&4).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    pool.mem[64 * BLOCK..96 * BLOCK].fill(0);
    tier.submit(JobKind::Load, 5, &slots, keys(&ids)).unwrap();
    let r = wait_all(&tier, 1).remove(&5).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_loaded_bytes(&pool, &r, &slots, &ids);
    assert!(outcome.values().sum::<usize>() == 32);
}

fn direct_requests_fall_back_to_the_general_client(srv: &Server) {
    // The first PUT, GET and HEAD of every object answer 503: that is the direct path's
    // attempt (stores, loads and lookups try it first). Each is repeated through the
    // general client, which the proxy lets pass. A 404 is final: no second request.
    let rig = Front::new(srv);
    let tier = rig.tier(json!({"max_retries": 0}), json!({}));
    let mut pool = Pool::new(16, BLOCK);
    pool.fill_random(77);
    pool.register(&tier);
    let seen = std::sync::Mutex::new(std::collections::HashSet::new());
    rig.proxy.set_rule(move |r| {
        let first = seen
            .lock()
            .unwrap()
            .insert((r.method.clone(), r.path.clone()));
        if first && ["PUT", "GET", "HEAD"].contains(&r.method.as_str()) && r.path.ends_with(".bin")
        {
            Fault::Status(503)
        } else {
            Fault::Pass
        }
    });
    let ids: Vec<u64> = (0..6).collect();
    tier.submit(JobKind::Store, 1, &ids, keys(&ids)).unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    let stats = tier.stats();
    assert_eq!(
        (stats.direct_requests, stats.direct_fallbacks),
        (6, 6),
        "{stats:?}"
    );
    let slots: Vec<u64> = (8..14).collect();
    tier.submit(JobKind::Load, 2, &slots, keys(&ids)).unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(r.key_status, vec![Status::Ok; 6], "{}", r.message);
    assert_loaded_bytes(&pool, &r, &slots, &ids);
    let stats = tier.stats();
    assert_eq!(
        (stats.direct_requests, stats.direct_fallbacks),
        (12, 12),
        "{stats:?}"
    );

    let answers: Vec<_> = [0u64, 1, 40]
        .iter()
        .map(|&i| resolve_lookup(&tier, 9, &key(i)))
        .collect();
    use kvtier_core::LookupResult::{Hit, Miss};
    assert_eq!(answers, vec![Hit, Hit, Miss]);
    let stats = tier.stats();
    assert_eq!(
        (stats.direct_requests, stats.direct_fallbacks),
        (15, 15),
        "{stats:?}"
    );

    // A missing key: the direct GET's 404 is the answer.
    rig.proxy.set_rule(|_| Fault::Pass);
    let before = rig.proxy.stats().requests;
    tier.submit(JobKind::Load, 3, &[15], keys(&[41])).unwrap();
    let r = wait_all(&tier, 1).remove(&3).unwrap();
    assert_eq!(r.key_status, vec![Status::NotFound], "{}", r.message);
    assert_eq!(
        rig.proxy.stats().requests - before,
        1,
        "a 404 is not asked twice"
    );
    assert_eq!(tier.stats().direct_fallbacks, 15);
}

// ------------------------------------------------------------------------------------
// Faults on both servers

/// A load read as parts (`load_part_bytes`, 4 parts of 1 MiB here): a server that ignores
/// Range, and a part whose answer is cut, send the whole load to the general client, which
/// reads it byte-exact; an object of another length fails its key alone as a length
/// mismatch. Every GET goes through the proxy.
fn parts_of_a_large_load_fall_back_or_fail_alone(srv: &Server) {
    const LARGE: usize = 4 << 20;
    let rig = Front::new(srv);
    let tier = rig.tier(
        json!({"load_part_bytes": 1 << 20, "max_retries": 1}),
        json!({}),
    );
    let mut pool = Pool::new(6, LARGE);
    pool.fill_random(91);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[0, 1]))
        .unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    // An object of 5 MiB under key 2, written behind the tier's back.
    oob_put(
        &rig.store(json!({})),
        &tier.layout().object_name(&key(2)).unwrap(),
        random_bytes(5 << 20, 92),
    );

    for (what, fault, job) in [
        ("Range ignored", Fault::IgnoreRange, 2),
        ("one part cut", Fault::CutResponse, 3),
    ] {
        let before = tier.stats();
        let gets = std::sync::atomic::AtomicU64::new(0);
        rig.proxy.set_rule(move |r| {
            if r.method != "GET" {
                return Fault::Pass;
            }
            let n = gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match fault {
                // Only the third of the four parts.
                Fault::CutResponse if n != 2 => Fault::Pass,
                fault => fault,
            }
        });
        tier.submit(JobKind::Load, job, &[2, 3], keys(&[0, 1]))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&job).unwrap();
        assert_eq!(r.key_status, vec![Status::Ok; 2], "{what}: {}", r.message);
        assert_loaded_bytes(&pool, &r, &[2, 3], &[0, 1]);
        let after = tier.stats();
        assert!(
            after.direct_fallbacks > before.direct_fallbacks,
            "{what}: no load went to the general client: {after:?}"
        );
        pool.block_mut(2).fill(0);
        pool.block_mut(3).fill(0);
    }

    rig.proxy.set_rule(|_| Fault::Pass);
    tier.submit(JobKind::Load, 4, &[4, 5], keys(&[2, 0]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&4).unwrap();
    assert_eq!(
        r.key_status,
        vec![Status::LengthMismatch, Status::Ok],
        "{}",
        r.message
    );
    assert_loaded_bytes(&pool, &r, &[4, 5], &[2, 0]);
}

/// A proxy in front of a server the test does not own (a fresh s3s-fs or the shared moto).
struct Front<'a> {
    srv: &'a Server,
    proxy: Proxy,
    bucket: String,
}

impl<'a> Front<'a> {
    fn new(srv: &'a Server) -> Front<'a> {
        let proxy = Proxy::start(srv.port());
        let bucket = srv.new_bucket();
        Front { srv, proxy, bucket }
    }

    /// The `store` section through the proxy, with `extra` keys set.
    fn store(&self, extra: serde_json::Value) -> serde_json::Value {
        let mut store = with(
            self.srv.store_json(&self.bucket),
            "endpoint_override",
            json!(self.proxy.endpoint()),
        );
        for (k, v) in extra.as_object().unwrap() {
            store[k] = v.clone();
        }
        store
    }

    fn tier(&self, store_extra: serde_json::Value, top_extra: serde_json::Value) -> Tier {
        Tier::from_json(&tier_json(self.store(store_extra), top_extra))
            .unwrap_or_else(|e| panic!("{}: tier start: {e}", self.srv.name()))
    }
}

/// Faults the first request of each block object with `method` gets; later ones pass.
fn first_of_each_object(method: &'static str, fault: Fault) -> impl Fn(&RequestInfo) -> Fault {
    let seen = std::sync::Mutex::new(std::collections::HashSet::new());
    move |r: &RequestInfo| {
        if r.method == method
            && r.path.contains(".bin")
            && seen.lock().unwrap().insert(r.path.clone())
        {
            fault
        } else {
            Fault::Pass
        }
    }
}

/// Stores 16 keys while the first PUT of every one of them is reset (RST) or closed before
/// the server sees it, closed after the server stored it, or stalled past the request
/// timeout after the server stored it; in `conditional` mode (If-None-Match: *, which
/// object_store does not repeat by itself) and in `skip_known` mode (plain overwrites).
/// Every key must end up stored and loadable, and a repeat the server answers 412 counts
/// as stored.
fn interrupted_puts_are_retried_in_every_dedup_mode(srv: &Server) {
    let cases = [
        ("conditional", Fault::ResetRequest),
        ("conditional", Fault::DropRequest),
        ("conditional", Fault::DropResponse),
        ("conditional", Fault::StallResponse(Duration::from_secs(3))),
        ("skip_known", Fault::DropRequest),
        ("skip_known", Fault::StallResponse(Duration::from_secs(3))),
    ];
    let front = Front::new(srv);
    for (case, (mode, fault)) in cases.into_iter().enumerate() {
        let what = format!("{} dedup={mode} fault={fault:?}", srv.name());
        front.proxy.set_rule(|_| Fault::Pass);
        let tier = front.tier(
            json!({"max_retries": 3, "request_timeout_ms": 1000}),
            json!({"dedup": mode}),
        );
        let mut pool = Pool::new(64, BLOCK);
        pool.fill_random(100 + case as u64);
        pool.register(&tier);
        front.proxy.set_rule(first_of_each_object("PUT", fault));
        let faults_before = front.proxy.stats().requests;
        let ids: Vec<u64> = (0..16).map(|i| case as u64 * 100 + i).collect();
        for job in 0..8u64 {
            let blocks = [job * 2, job * 2 + 1];
            let ks = [ids[blocks[0] as usize], ids[blocks[1] as usize]];
            tier.submit(JobKind::Store, job, &blocks, keys(&ks))
                .unwrap();
        }
        for (id, r) in wait_all(&tier, 8) {
            assert_eq!(
                r.key_status,
                vec![Status::Ok; 2],
                "{what}: store job {id}: {}",
                r.message
            );
        }
        let stats = tier.stats();
        assert_eq!(stats.keys_stored, 16, "{what}: {stats:?}");
        assert!(
            front.proxy.stats().requests - faults_before >= 32,
            "{what}: every key needed a second PUT"
        );
        if mode == "conditional" && fault == Fault::DropResponse {
            // The server stored every block before the reset: every repeat finds it.
            assert_eq!(stats.dedup_already_stored, 16, "{what}: {stats:?}");
        }
        front.proxy.set_rule(|_| Fault::Pass);
        let slots: Vec<u64> = (32..48).collect();
        tier.submit(JobKind::Load, 100, &slots, keys(&ids)).unwrap();
        let r = wait_all(&tier, 1).remove(&100).unwrap();
        assert_eq!(r.key_status, vec![Status::Ok; 16], "{what}: {}", r.message);
        let sources: Vec<u64> = (0..16).collect();
        assert_loaded_bytes(&pool, &r, &slots, &sources);
    }
}

/// Stores in parts (blocks of 12 MiB, parts of 5 MiB: two each, of 5 and 7 MiB) through
/// faults. The
/// first PUT of every part reset before the server sees it, or its answer lost after the
/// server stored it, is sent again, and every block loads byte-exact. With every part
/// refused, the job fails with one result, the upload is aborted (its parts are not left
/// in the store), and the key stays absent. A store that does not do multipart uploads
/// (501) gets one PUT per object instead.
fn a_store_in_parts_survives_faults_or_fails_whole(srv: &Server) {
    const LARGE: usize = 12 << 20;
    let front = Front::new(srv);
    let store_extra = json!({"store_part_bytes": 5 << 20, "max_retries": 3});
    let is_part = |r: &RequestInfo| r.method == "PUT" && r.path.contains("partNumber=");
    for (case, fault) in [Fault::ResetRequest, Fault::DropResponse]
        .into_iter()
        .enumerate()
    {
        let what = format!("{} fault={fault:?}", srv.name());
        front.proxy.set_rule(|_| Fault::Pass);
        let tier = front.tier(store_extra.clone(), json!({}));
        let mut pool = Pool::new(4, LARGE);
        pool.fill_random(500 + case as u64);
        pool.register(&tier);
        let seen = std::sync::Mutex::new(std::collections::HashSet::new());
        front.proxy.set_rule(move |r| {
            if is_part(r) && seen.lock().unwrap().insert(r.path.clone()) {
                fault
            } else {
                Fault::Pass
            }
        });
        let ids = [900 + case as u64 * 10, 901 + case as u64 * 10];
        tier.submit(JobKind::Store, 1, &[0, 1], keys(&ids)).unwrap();
        let r = wait_all(&tier, 1).remove(&1).unwrap();
        assert_eq!(r.key_status, vec![Status::Ok; 2], "{what}: {}", r.message);
        assert_eq!(
            front.proxy.stats().faults(fault.name()),
            4,
            "{what}: every part's first PUT faulted"
        );
        front.proxy.set_rule(|_| Fault::Pass);
        tier.submit(JobKind::Load, 2, &[2, 3], keys(&ids)).unwrap();
        let r = wait_all(&tier, 1).remove(&2).unwrap();
        assert_loaded_bytes(&pool, &r, &[2, 3], &[0, 1]);
    }

    let tier = front.tier(store_extra, json!({}));
    let mut pool = Pool::new(1, LARGE);
    pool.fill_random(520);
    pool.register(&tier);
    let aborts = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = aborts.clone();
    front.proxy.set_rule(move |r| {
        if is_part(r) {
            return Fault::Status(500);
        }
        if r.method == "DELETE" && r.path.contains("uploadId=") {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Fault::Pass
    });
    tier.submit(JobKind::Store, 3, &[0], keys(&[950])).unwrap();
    let r = wait_all(&tier, 1).remove(&3).unwrap();
    assert_ne!(
        r.key_status,
        vec![Status::Ok],
        "{}: refused parts stored",
        srv.name()
    );
    assert_eq!(
        aborts.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "{}: the failed upload was not aborted",
        srv.name()
    );
    front.proxy.set_rule(|_| Fault::Pass);
    assert_eq!(
        tier.check_now(&[key(950)], Duration::from_secs(60))
            .unwrap(),
        vec![LookupResult::Miss],
        "{}",
        srv.name()
    );

    // A store (or gateway) without multipart uploads: the first large store is sent as one
    // PUT instead, and later ones go straight to one PUT.
    let tier = front.tier(json!({"store_part_bytes": 5 << 20}), json!({}));
    let mut pool = Pool::new(4, LARGE);
    pool.fill_random(530);
    pool.register(&tier);
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = asked.clone();
    front.proxy.set_rule(move |r| {
        if r.method == "POST" && r.path.contains("uploads") {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Fault::Answer {
                status: 501,
                code: "NotImplemented",
                in_header: false,
            };
        }
        Fault::Pass
    });
    // (The client repeats a 5xx answer as it would any other before it gives up on it.)
    let mut asked_after = Vec::new();
    for job in 0..2u64 {
        tier.submit(JobKind::Store, 10 + job, &[job], keys(&[960 + job]))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&(10 + job)).unwrap();
        assert_eq!(
            r.key_status,
            vec![Status::Ok],
            "{}: {}",
            srv.name(),
            r.message
        );
        asked_after.push(asked.load(std::sync::atomic::Ordering::SeqCst));
    }
    assert!(
        asked_after[0] >= 1,
        "{}: no multipart upload asked for",
        srv.name()
    );
    assert_eq!(
        asked_after[1],
        asked_after[0],
        "{}: multipart uploads asked for after the store refused them",
        srv.name()
    );
    tier.submit(JobKind::Load, 12, &[2, 3], keys(&[960, 961]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&12).unwrap();
    assert_loaded_bytes(&pool, &r, &[2, 3], &[0, 1]);
}

/// The first GET of every object comes back with one byte flipped by the proxy while the
/// stored objects stay intact (corruption in transit). Under `fail_and_delete` the
/// mismatch is read again, reads clean, and the load succeeds with verified bytes; no
/// object is deleted. With every read corrupted (each elsewhere) the keys fail and still
/// no object is deleted. On the direct path and on the general client.
fn in_transit_corruption_never_deletes(srv: &Server) {
    let front = Front::new(srv);
    for (run, direct) in [(0u64, true), (1, false)] {
        let what = format!("{} direct_http={direct}", srv.name());
        front.proxy.set_rule(|_| Fault::Pass);
        let tier = front.tier(
            json!({"direct_http": direct}),
            json!({"on_corrupt": "fail_and_delete"}),
        );
        let mut pool = Pool::new(16, BLOCK);
        pool.fill_random(200 + run);
        pool.register(&tier);
        let ids: Vec<u64> = (0..4).map(|i| 300 + run * 10 + i).collect();
        tier.submit(JobKind::Store, 1, &[0, 1, 2, 3], keys(&ids))
            .unwrap();
        assert!(wait_all(&tier, 1)[&1].succeeded(), "{what}");
        let corrupted_before = front.proxy.stats().faults("corrupt_body");
        front
            .proxy
            .set_rule(first_of_each_object("GET", Fault::CorruptBody));
        tier.submit(JobKind::Load, 2, &[8, 9, 10, 11], keys(&ids))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&2).unwrap();
        assert_eq!(r.key_status, vec![Status::Ok; 4], "{what}: {}", r.message);
        assert_loaded_bytes(&pool, &r, &[8, 9, 10, 11], &[0, 1, 2, 3]);
        assert_eq!(
            front.proxy.stats().faults("corrupt_body") - corrupted_before,
            4,
            "{what}"
        );
        assert_eq!(tier.stats().corrupt_blocks, 0, "{what}: {:?}", tier.stats());
        let direct_store = front.srv.store_json(&front.bucket);
        for (i, id) in ids.iter().enumerate() {
            let name = tier.layout().object_name(&key(*id)).unwrap();
            assert_eq!(
                oob_get(&direct_store, &name).as_deref(),
                Some(pool.block(i as u64)),
                "{what}: object {name}"
            );
        }
        // Every read corrupted, each one elsewhere: the keys fail, and still nothing is
        // deleted (two reads with different bytes are not corruption in the store).
        front.proxy.set_rule(|r| {
            if r.method == "GET" && r.path.contains(".bin") {
                Fault::CorruptBody
            } else {
                Fault::Pass
            }
        });
        tier.submit(JobKind::Load, 3, &[12, 13, 14, 15], keys(&ids))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&3).unwrap();
        assert_eq!(
            r.key_status,
            vec![Status::Corrupt; 4],
            "{what}: {}",
            r.message
        );
        front.proxy.set_rule(|_| Fault::Pass);
        for (i, id) in ids.iter().enumerate() {
            let name = tier.layout().object_name(&key(*id)).unwrap();
            assert_eq!(
                oob_get(&direct_store, &name).as_deref(),
                Some(pool.block(i as u64)),
                "{what}: object {name} deleted"
            );
        }
    }
}

/// A server that ignores Range answers a load's GET with `200 OK` and the whole object:
/// when that is the block size, the load succeeds on both paths. When the object is
/// shorter (a `200` with half the bytes), both paths say `LengthMismatch`.
fn server_ignoring_range(srv: &Server) {
    let front = Front::new(srv);
    for (run, direct) in [(0u64, true), (1, false)] {
        let what = format!("{} direct_http={direct}", srv.name());
        front.proxy.set_rule(|_| Fault::Pass);
        let tier = front.tier(json!({"direct_http": direct, "max_retries": 1}), json!({}));
        let mut pool = Pool::new(16, BLOCK);
        pool.fill_random(400 + run);
        pool.register(&tier);
        let ids: Vec<u64> = (0..3).map(|i| 500 + run * 10 + i).collect();
        tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&ids))
            .unwrap();
        assert!(wait_all(&tier, 1)[&1].succeeded(), "{what}");
        let short = tier.layout().object_name(&key(ids[2])).unwrap();
        front.proxy.set_rule(move |r| match r.method.as_str() {
            "GET" if r.path.ends_with(&short) => Fault::Short200,
            "GET" => Fault::IgnoreRange,
            _ => Fault::Pass,
        });
        tier.submit(JobKind::Load, 2, &[8, 9, 10], keys(&ids))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&2).unwrap();
        assert_eq!(
            r.key_status,
            vec![Status::Ok, Status::Ok, Status::LengthMismatch],
            "{what}: {}",
            r.message
        );
        assert_loaded_bytes(&pool, &r, &[8, 9, 10], &[0, 1, 2]);
        assert_eq!(
            front.proxy.stats().faults("short_200"),
            run + 1,
            "{what}: a clean short answer is asked once"
        );
        let stats = tier.stats();
        assert_eq!(stats.direct_fallbacks, 0, "{what}: {stats:?}");
    }
}

on_both_servers!(
    parts_of_a_large_load_fall_back_or_fail_alone,
    one_percent_5xx_and_slowdown_all_jobs_succeed,
    connection_resets_and_cut_bodies_are_retried,
    truncated_bodies_fail_their_key_and_never_succeed,
    slow_server_times_out_without_hanging,
    check_now_gives_up_at_its_timeout,
    direct_requests_fall_back_to_the_general_client,
    interrupted_puts_are_retried_in_every_dedup_mode,
    a_store_in_parts_survives_faults_or_fails_whole,
    in_transit_corruption_never_deletes,
    server_ignoring_range,
);

// ------------------------------------------------------------------------------------
// The fault matrix

/// One cell of the fault matrix: what happened to its jobs.
#[derive(Default)]
struct Cell {
    jobs: u64,
    /// A job (or lookup) reported OK with wrong bytes, or HIT for an absent key.
    wrong: u64,
    lost: u64,
    duplicated: u64,
    /// Jobs that succeeded (lookups: answered correctly) despite the fault.
    recovered: u64,
}

/// Half of the requests with `method` to block objects (a hash of the request number) get
/// `fault`; the rest pass.
fn half_of(method: &'static str, fault: Fault, salt: u64) -> impl Fn(&RequestInfo) -> Fault {
    let pick = one_in(2, salt);
    move |r: &RequestInfo| {
        if r.method == method && r.path.contains(".bin") && pick(r) {
            fault
        } else {
            Fault::Pass
        }
    }
}

/// Every result of `n` jobs numbered `first..first + n`: lost and duplicated ones counted.
fn collect(tier: &Tier, first: u64, n: u64, cell: &mut Cell) -> HashMap<u64, JobResult> {
    tier.drain(Duration::from_secs(300))
        .expect("jobs did not finish within 300 s");
    let mut seen = HashMap::new();
    for r in tier.poll(usize::MAX) {
        let id = r.job_id;
        if seen.insert(id, r).is_some() {
            cell.duplicated += 1;
        }
    }
    cell.lost += (first..first + n)
        .filter(|id| !seen.contains_key(id))
        .count() as u64;
    seen
}

/// Runs every fault against every operation and path on s3s-fs, 40 one-key jobs (or
/// lookups) per cell with the fault on half of the cell's requests, and writes the table
/// to `target/test-logs/fault-matrix.md` (the README's reliability section quotes it).
/// Asserts what must hold whatever the machine's load: no wrong success, no lost or
/// duplicated job, and conditional stores recovering as well as overwriting ones.
#[test]
fn fault_matrix() {
    const N: u64 = 40;
    let srv = Server::s3s_fs();
    let front = Front::new(&srv);
    let stall = Fault::StallResponse(Duration::from_secs(3));
    let store_faults = [
        ("reset", Fault::ResetRequest),
        ("closed before the server", Fault::DropRequest),
        ("closed after the server", Fault::DropResponse),
        ("stall after the server", stall),
        ("500", Fault::Status(500)),
        ("503 SlowDown", Fault::Status(503)),
    ];
    let load_faults = [
        ("reset", Fault::ResetRequest),
        ("closed before the server", Fault::DropRequest),
        ("stall", stall),
        ("500", Fault::Status(500)),
        ("503 SlowDown", Fault::Status(503)),
        ("body cut", Fault::CutResponse),
        ("short 206 body", Fault::ShortResponse),
        ("short 200 body", Fault::Short200),
        ("corrupted in transit", Fault::CorruptBody),
        ("Range ignored", Fault::IgnoreRange),
    ];
    let lookup_faults = [
        ("reset", Fault::ResetRequest),
        ("closed before the server", Fault::DropRequest),
        ("stall", stall),
        ("500", Fault::Status(500)),
        ("503 SlowDown", Fault::Status(503)),
    ];
    let store_extra =
        |direct: bool| json!({"max_retries": 3, "request_timeout_ms": 1000, "direct_http": direct});
    let mut rows: Vec<(String, &str, &str, Cell)> = Vec::new();
    let mut salt = 0u64;
    let mut base = 0u64;
    for (name, fault) in store_faults {
        for mode in ["conditional", "skip_known"] {
            salt += 1;
            base += 1000;
            let mut cell = Cell {
                jobs: N,
                ..Default::default()
            };
            front.proxy.set_rule(|_| Fault::Pass);
            let tier = front.tier(store_extra(true), json!({"dedup": mode}));
            let mut pool = Pool::new(N, BLOCK);
            pool.fill_random(base);
            pool.register(&tier);
            front.proxy.set_rule(half_of("PUT", fault, salt));
            for i in 0..N {
                tier.submit(JobKind::Store, i, &[i], keys(&[base + i]))
                    .unwrap();
            }
            let results = collect(&tier, 0, N, &mut cell);
            front.proxy.set_rule(|_| Fault::Pass);
            let direct_store = srv.store_json(&front.bucket);
            for (id, r) in &results {
                if r.succeeded() {
                    cell.recovered += 1;
                    let name = tier.layout().object_name(&key(base + id)).unwrap();
                    if oob_get(&direct_store, &name).as_deref() != Some(pool.block(*id)) {
                        cell.wrong += 1;
                    }
                }
            }
            rows.push((
                name.to_string(),
                if mode == "conditional" {
                    "store (conditional)"
                } else {
                    "store (skip_known)"
                },
                "general",
                cell,
            ));
        }
    }
    for (name, fault) in load_faults {
        for direct in [true, false] {
            salt += 1;
            base += 1000;
            let mut cell = Cell {
                jobs: N,
                ..Default::default()
            };
            front.proxy.set_rule(|_| Fault::Pass);
            let tier = front.tier(store_extra(direct), json!({}));
            let mut pool = Pool::new(2 * N, BLOCK);
            pool.fill_random(base);
            pool.register(&tier);
            let ids: Vec<u64> = (0..N).collect();
            let stored: Vec<u64> = ids.iter().map(|i| base + i).collect();
            tier.submit(JobKind::Store, 0, &ids, keys(&stored)).unwrap();
            assert!(
                wait_all(&tier, 1)[&0].succeeded(),
                "{name}: setup store failed"
            );
            front.proxy.set_rule(half_of("GET", fault, salt));
            for i in 0..N {
                tier.submit(JobKind::Load, 1 + i, &[N + i], keys(&[base + i]))
                    .unwrap();
            }
            for (id, r) in collect(&tier, 1, N, &mut cell) {
                if r.succeeded() {
                    cell.recovered += 1;
                    if pool.block(N + id - 1) != pool.block(id - 1) {
                        cell.wrong += 1;
                    }
                }
            }
            rows.push((
                name.to_string(),
                "load",
                if direct { "direct" } else { "general" },
                cell,
            ));
        }
    }
    for (name, fault) in lookup_faults {
        for direct in [true, false] {
            salt += 1;
            base += 1000;
            let mut cell = Cell {
                jobs: N,
                ..Default::default()
            };
            front.proxy.set_rule(|_| Fault::Pass);
            let tier = front.tier(store_extra(direct), json!({}));
            let mut pool = Pool::new(N, BLOCK);
            pool.fill_random(base);
            pool.register(&tier);
            // Even keys are stored, odd ones are not.
            let present: Vec<u64> = (0..N).step_by(2).map(|i| base + i).collect();
            let blocks: Vec<u64> = (0..present.len() as u64).collect();
            tier.submit(JobKind::Store, 0, &blocks, keys(&present))
                .unwrap();
            assert!(
                wait_all(&tier, 1)[&0].succeeded(),
                "{name}: setup store failed"
            );
            // A fresh tier, so that no key is known from the store.
            drop(tier);
            let tier = front.tier(store_extra(direct), json!({}));
            front.proxy.set_rule(half_of("HEAD", fault, salt));
            // One request per key (a failed check fails only its own request's group), all
            // in one step, so that the checks run concurrently.
            for i in 0..N {
                tier.lookup(i, &key(base + i)).unwrap();
            }
            tier.schedule_end().unwrap();
            for i in 0..N {
                let found =
                    resolve_lookup(&tier, i, &key(base + i)) == kvtier_core::LookupResult::Hit;
                let truth = i % 2 == 0;
                if found && !truth {
                    cell.wrong += 1;
                }
                if found == truth {
                    cell.recovered += 1;
                }
            }
            rows.push((
                name.to_string(),
                "lookup",
                if direct { "direct" } else { "general" },
                cell,
            ));
        }
    }
    let mut table = String::from(
        "| fault (on half the requests) | operation | path | jobs | wrong successes | lost | duplicated | recovered |\n\
         |---|---|---|---:|---:|---:|---:|---:|\n",
    );
    for (fault, op, path, c) in &rows {
        table.push_str(&format!(
            "| {fault} | {op} | {path} | {} | {} | {} | {} | {} |\n",
            c.jobs, c.wrong, c.lost, c.duplicated, c.recovered
        ));
    }
    let out = manifest_dir().join("target/test-logs");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("fault-matrix.md"), &table).unwrap();
    println!("{table}");
    for (fault, op, path, c) in &rows {
        assert_eq!(
            (c.wrong, c.lost, c.duplicated),
            (0, 0, 0),
            "{fault} / {op} / {path}\n{table}"
        );
    }
    // Interrupted conditional PUTs are repeated like overwriting ones.
    for pair in rows.chunks(2).take(store_faults.len()) {
        let (conditional, skip_known) = (&pair[0].3, &pair[1].3);
        assert!(
            conditional.recovered + N / 4 >= skip_known.recovered,
            "{}: conditional stores recover less\n{table}",
            pair[0].0
        );
    }
}
