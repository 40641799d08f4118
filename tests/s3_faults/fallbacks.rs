//! The direct HTTP path and loads in parts, falling back to the general client: a direct
//! request answered 503, a server ignoring Range, a part cut; an object of another length
//! fails its key alone.

use kvtier_core::{JobKind, Status};
use serde_json::json;

use crate::common::*;
use crate::support::proxy::Fault;
use crate::support::*;

pub fn direct_requests_fall_back_to_the_general_client(srv: &Server) {
    // The first PUT, GET and HEAD of every object answer 503: that is the direct path's
    // attempt (stores, loads and lookups try it first). Each is repeated through the
    // general client, which the proxy lets pass. A 404 is final: no second request.
    let rig = Front::new(srv);
    let tier = rig.tier(json!({"max_retries": 0}), json!({}));
    let pool = Pool::random_registered(&tier, 16, BLOCK, 77);
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
    assert!(run_job(&tier, JobKind::Store, 1, &ids, &ids).succeeded());
    let stats = tier.stats();
    assert_eq!(
        (stats.direct_requests, stats.direct_fallbacks),
        (6, 6),
        "{stats:?}"
    );
    let slots: Vec<u64> = (8..14).collect();
    let r = run_job(&tier, JobKind::Load, 2, &slots, &ids);
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
    let r = run_job(&tier, JobKind::Load, 3, &[15], &[41]);
    assert_eq!(r.key_status, vec![Status::NotFound], "{}", r.message);
    assert_eq!(
        rig.proxy.stats().requests - before,
        1,
        "a 404 is not asked twice"
    );
    assert_eq!(tier.stats().direct_fallbacks, 15);
}

/// A load read as parts (`load_part_bytes`, 4 parts of 1 MiB here): a server that ignores
/// Range, and a part whose answer is cut, send the whole load to the general client, which
/// reads it byte-exact; an object of another length fails its key alone as a length
/// mismatch. Every GET goes through the proxy.
pub fn parts_of_a_large_load_fall_back_or_fail_alone(srv: &Server) {
    const LARGE: usize = 4 << 20;
    let rig = Front::new(srv);
    let tier = rig.tier(
        json!({"load_part_bytes": 1 << 20, "max_retries": 1}),
        json!({}),
    );
    let mut pool = Pool::random_registered(&tier, 6, LARGE, 91);
    assert!(run_job(&tier, JobKind::Store, 1, &[0, 1], &[0, 1]).succeeded());
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
        let r = run_job(&tier, JobKind::Load, job, &[2, 3], &[0, 1]);
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
    let r = run_job(&tier, JobKind::Load, 4, &[4, 5], &[2, 0]);
    assert_eq!(
        r.key_status,
        vec![Status::LengthMismatch, Status::Ok],
        "{}",
        r.message
    );
    assert_loaded_bytes(&pool, &r, &[4, 5], &[2, 0]);
}
