//! The server killed mid-job and restarted (s3s-fs, behind the proxy): the job fails per
//! key, nothing reported stored is lost, and the same tier works again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvtier_core::{JobKind, Status};
use serde_json::json;

use crate::common::*;
use crate::support::proxy::Fault;
use crate::support::*;

pub fn server_killed_mid_job_then_restarted() {
    let srv = Server::s3s_fs();
    let rig = Front::new(&srv);
    let tier = rig.tier(
        json!({"max_retries": 2, "connect_timeout_ms": 1000, "request_timeout_ms": 5000}),
        json!({"max_inflight_transfers": 4}),
    );
    let mut pool = Pool::random_registered(&tier, 128, BLOCK, 77);
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
    srv.kill();
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
    srv.start();
    rig.follow_restart();
    rig.proxy.set_rule(|_| Fault::Pass);
    // Keys the first job reported stored are there with the right bytes.
    let slots: Vec<u64> = ids.iter().map(|i| 64 + i).collect();
    let r = run_job(&tier, JobKind::Load, 3, &slots, &ids);
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
    let r = run_job(&tier, JobKind::Store, 4, &failed, &failed);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    pool.mem[64 * BLOCK..96 * BLOCK].fill(0);
    let r = run_job(&tier, JobKind::Load, 5, &slots, &ids);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_loaded_bytes(&pool, &r, &slots, &ids);
    assert!(outcome.values().sum::<usize>() == 32);
}
