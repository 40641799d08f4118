//! Answers with the wrong bytes: bodies short or cut on every attempt, corrupted in
//! transit (never a reason to delete the stored object), and a server that ignores Range.

use std::time::{Duration, Instant};

use kvtier_core::{JobKind, Status};
use serde_json::json;

use crate::common::*;
use crate::support::proxy::Fault;
use crate::support::*;

pub fn truncated_bodies_fail_their_key_and_never_succeed(srv: &Server) {
    let rig = Front::new(srv);
    let tier = rig.tier(json!({"max_retries": 2}), json!({}));
    let pool = Pool::random_registered(&tier, 16, BLOCK, 9);
    assert!(run_job(&tier, JobKind::Store, 1, &[0, 1, 2, 3], &[0, 1, 2, 3]).succeeded());
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
    let r = run_job(&tier, JobKind::Load, 2, &slots, &[0, 1, 2, 3]);
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

/// The first GET of every object comes back with one byte flipped by the proxy while the
/// stored objects stay intact (corruption in transit). Under `fail_and_delete` the
/// mismatch is read again, reads clean, and the load succeeds with verified bytes; no
/// object is deleted. With every read corrupted (each elsewhere) the keys fail and still
/// no object is deleted. On the direct path and on the general client.
pub fn in_transit_corruption_never_deletes(srv: &Server) {
    let front = Front::new(srv);
    for (run, direct) in [(0u64, true), (1, false)] {
        let what = format!("{} direct_http={direct}", srv.name());
        front.proxy.set_rule(|_| Fault::Pass);
        let tier = front.tier(
            json!({"direct_http": direct}),
            json!({"on_corrupt": "fail_and_delete"}),
        );
        let pool = Pool::random_registered(&tier, 16, BLOCK, 200 + run);
        let ids: Vec<u64> = (0..4).map(|i| 300 + run * 10 + i).collect();
        assert!(
            run_job(&tier, JobKind::Store, 1, &[0, 1, 2, 3], &ids).succeeded(),
            "{what}"
        );
        let corrupted_before = front.proxy.stats().faults("corrupt_body");
        front
            .proxy
            .set_rule(first_of_each_object("GET", Fault::CorruptBody));
        let r = run_job(&tier, JobKind::Load, 2, &[8, 9, 10, 11], &ids);
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
        let r = run_job(&tier, JobKind::Load, 3, &[12, 13, 14, 15], &ids);
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
pub fn server_ignoring_range(srv: &Server) {
    let front = Front::new(srv);
    for (run, direct) in [(0u64, true), (1, false)] {
        let what = format!("{} direct_http={direct}", srv.name());
        front.proxy.set_rule(|_| Fault::Pass);
        let tier = front.tier(json!({"direct_http": direct, "max_retries": 1}), json!({}));
        let pool = Pool::random_registered(&tier, 16, BLOCK, 400 + run);
        let ids: Vec<u64> = (0..3).map(|i| 500 + run * 10 + i).collect();
        assert!(
            run_job(&tier, JobKind::Store, 1, &[0, 1, 2], &ids).succeeded(),
            "{what}"
        );
        let short = tier.layout().object_name(&key(ids[2])).unwrap();
        front.proxy.set_rule(move |r| match r.method.as_str() {
            "GET" if r.path.ends_with(&short) => Fault::Short200,
            "GET" => Fault::IgnoreRange,
            _ => Fault::Pass,
        });
        let r = run_job(&tier, JobKind::Load, 2, &[8, 9, 10], &ids);
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
