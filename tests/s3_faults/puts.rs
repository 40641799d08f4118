//! Interrupted stores: PUTs reset, closed or stalled before or after the server acted, in
//! every dedup mode, and multipart uploads whose parts fault, are all refused, or are not
//! offered by the store.

use std::time::Duration;

use kvtier_core::{JobKind, LookupResult, Status};
use serde_json::json;

use crate::common::*;
use crate::support::proxy::{Fault, RequestInfo};
use crate::support::*;

/// Stores 16 keys while the first PUT of every one of them is reset (RST) or closed before
/// the server sees it, closed after the server stored it, or stalled past the request
/// timeout after the server stored it; in `conditional` mode (If-None-Match: *, which
/// object_store does not repeat by itself) and in `skip_known` mode (plain overwrites).
/// Every key must end up stored and loadable; a repeat the server answers 412 after an
/// attempt that may have stored the object is confirmed against it (`confirm.rs`).
pub fn interrupted_puts_are_retried_in_every_dedup_mode(srv: &Server) {
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
        let pool = Pool::random_registered(&tier, 64, BLOCK, 100 + case as u64);
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
            // The server stored every block before the reset: every repeat finds it (412),
            // looks at it, and reports it stored by this tier, not found.
            assert_eq!(stats.dedup_already_stored, 0, "{what}: {stats:?}");
        }
        front.proxy.set_rule(|_| Fault::Pass);
        let slots: Vec<u64> = (32..48).collect();
        let r = run_job(&tier, JobKind::Load, 100, &slots, &ids);
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
pub fn a_store_in_parts_survives_faults_or_fails_whole(srv: &Server) {
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
        let pool = Pool::random_registered(&tier, 4, LARGE, 500 + case as u64);
        let seen = std::sync::Mutex::new(std::collections::HashSet::new());
        front.proxy.set_rule(move |r| {
            if is_part(r) && seen.lock().unwrap().insert(r.path.clone()) {
                fault
            } else {
                Fault::Pass
            }
        });
        let ids = [900 + case as u64 * 10, 901 + case as u64 * 10];
        let r = run_job(&tier, JobKind::Store, 1, &[0, 1], &ids);
        assert_eq!(r.key_status, vec![Status::Ok; 2], "{what}: {}", r.message);
        assert_eq!(
            front.proxy.stats().faults(fault.name()),
            4,
            "{what}: every part's first PUT faulted"
        );
        front.proxy.set_rule(|_| Fault::Pass);
        let r = run_job(&tier, JobKind::Load, 2, &[2, 3], &ids);
        assert_loaded_bytes(&pool, &r, &[2, 3], &[0, 1]);
    }

    let tier = front.tier(store_extra, json!({}));
    let _pool = Pool::random_registered(&tier, 1, LARGE, 520);
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
    let r = run_job(&tier, JobKind::Store, 3, &[0], &[950]);
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
    let pool = Pool::random_registered(&tier, 4, LARGE, 530);
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
        let r = run_job(&tier, JobKind::Store, 10 + job, &[job], &[960 + job]);
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
    let r = run_job(&tier, JobKind::Load, 12, &[2, 3], &[960, 961]);
    assert_loaded_bytes(&pool, &r, &[2, 3], &[0, 1]);
}
