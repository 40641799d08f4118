//! Transient faults, retried until they pass or bounded by the timeouts: 5xx answers and
//! SlowDown, connections dropped or cut mid-body, a server slower than the request timeout,
//! and the blocking existence check giving up at its own timeout.

use std::time::{Duration, Instant};

use kvtier_core::{JobKind, LookupResult, Status};
use serde_json::json;

use crate::common::*;
use crate::support::proxy::Fault;
use crate::support::*;

pub fn one_percent_5xx_and_slowdown_all_jobs_succeed(srv: &Server) {
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
    let pool = Pool::random_registered(&tier, 256, BLOCK, 42);
    // 32 store jobs of 4 keys, then 32 load jobs into the other half of the pool.
    store_and_load_in_fours(&tier, &pool, 32);
    let stats = rig.proxy.stats();
    assert!(
        stats.faults("status") >= 2,
        "too few faults injected to prove anything: {stats:?}"
    );
    assert!(stats.requests >= 256, "{stats:?}");
}

pub fn connection_resets_and_cut_bodies_are_retried(srv: &Server) {
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
    let pool = Pool::random_registered(&tier, 128, BLOCK, 5);
    store_and_load_in_fours(&tier, &pool, 16);
    let stats = rig.proxy.stats();
    assert!(
        stats.faults("drop_request") >= 1 && stats.faults("cut_response") >= 1,
        "{stats:?}"
    );
}

pub fn slow_server_times_out_without_hanging(srv: &Server) {
    let rig = Front::new(srv);
    let tier = rig.tier(
        json!({"max_retries": 1, "request_timeout_ms": 400}),
        json!({}),
    );
    let pool = Pool::random_registered(&tier, 8, BLOCK, 4);
    assert!(run_job(&tier, JobKind::Store, 1, &[0, 1], &[0, 1]).succeeded());

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
    let r = run_job(&tier, JobKind::Load, 4, &[6, 7], &[0, 1]);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_loaded_bytes(&pool, &r, &[6, 7], &[0, 1]);
}

/// The blocking existence check answers RETRY for what the server has not answered by its
/// timeout, returns at that timeout (not the server's pace), and answers again once the
/// server is fast.
pub fn check_now_gives_up_at_its_timeout(srv: &Server) {
    let rig = Front::new(srv);
    let tier = rig.tier(json!({}), json!({}));
    let _pool = Pool::random_registered(&tier, 4, BLOCK, 5);
    assert!(run_job(&tier, JobKind::Store, 1, &[0], &[0]).succeeded());
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
