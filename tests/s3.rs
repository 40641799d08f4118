//! The S3 store against real servers: s3s-fs (checks SigV4 signatures) and moto_server
//! (does not), both started on free loopback ports by the tests themselves. Every test
//! body runs once per server (`on_both_servers!`); the TLS tests need moto's TLS mode.
//!
//! Server differences pinned here (asserted, not assumed):
//! * moto accepts any credentials, so a wrong secret key starts fine on moto and is
//!   `Status::Auth` on s3s-fs.

#[macro_use]
mod support;

use std::sync::Arc;

use kvtier_core::store::ProbeOutcome;
use kvtier_core::{JobKind, LookupResult, Status, Tier};
use object_store::path::Path;
use serde_json::json;
use support::proxy::{Fault, Proxy};
use support::*;

const BLOCK: usize = 64 * 1024;

fn tier(store: serde_json::Value) -> Tier {
    Tier::from_json(&tier_json(store, json!({})))
        .unwrap_or_else(|e| panic!("tier start failed: {e}"))
}

fn tier_err(store: serde_json::Value) -> kvtier_core::Error {
    match Tier::from_json(&tier_json(store, json!({}))) {
        Ok(_) => panic!("the tier started but should have failed"),
        Err(e) => e,
    }
}

fn assert_no_secret(text: &str, srv: &Server) {
    for secret in [SECRET_KEY, srv.secret_key.as_str(), "wrong-secret-ZZ93kq"] {
        assert!(!text.contains(secret), "a secret leaked into: {text}");
    }
}

// ------------------------------------------------------------------------------------
// Bodies, run once per server

fn round_trip_non_identity_slots(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let tier = tier(store.clone());
    let mut pool = Pool::new(64, BLOCK);
    pool.fill_random(7);
    pool.register(&tier);
    let ids: Vec<u64> = (0..32).collect();
    tier.submit(JobKind::Store, 1, &ids, keys(&ids)).unwrap();
    let r = wait_all(&tier, 1).remove(&1).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_eq!(r.bytes, 32 * BLOCK as u64);
    assert_eq!(r.key_status, vec![Status::Ok; 32]);

    // Objects sit under vLLM's effective key layout, one per key, block-sized.
    let name = tier.layout().object_name(&key(5)).unwrap();
    assert!(name.starts_with("kv/m_0123456789ab_r0/"), "{name}");
    assert_eq!(
        oob_get(&store, &name).unwrap(),
        pool.block(5),
        "object bytes differ from the stored block"
    );

    // Load key i into slot 32 + (i * 7) % 32: a non-identity mapping.
    let slots: Vec<u64> = ids.iter().map(|i| 32 + (i * 7) % 32).collect();
    tier.submit(JobKind::Load, 2, &slots, keys(&ids)).unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_eq!(r.key_status, vec![Status::Ok; 32]);
    assert_eq!(r.bytes, 32 * BLOCK as u64);
    for (i, slot) in ids.iter().zip(&slots) {
        assert!(
            pool.block(*i) == pool.block(*slot),
            "block {i} differs after loading into slot {slot}"
        );
    }
}

fn large_blocks_and_many_jobs(srv: &Server) {
    // 1 MiB blocks stream in several chunks; 6 jobs of 4 keys run at once.
    const BIG: usize = 1 << 20;
    let bucket = srv.new_bucket();
    let tier = tier(srv.store_json(&bucket));
    let mut pool = Pool::new(48, BIG);
    pool.fill_random(99);
    pool.register(&tier);
    for job in 0..6u64 {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        tier.submit(JobKind::Store, job, &ids, keys(&ids)).unwrap();
    }
    for (id, r) in wait_all(&tier, 6) {
        assert_eq!(r.status, Status::Ok, "store job {id}: {}", r.message);
    }
    for job in 0..6u64 {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        let slots: Vec<u64> = ids.iter().map(|i| 47 - i).collect();
        tier.submit(JobKind::Load, 100 + job, &slots, keys(&ids))
            .unwrap();
    }
    for (id, r) in wait_all(&tier, 6) {
        assert_eq!(r.status, Status::Ok, "load job {id}: {}", r.message);
        assert_eq!(r.bytes, 4 * BIG as u64);
    }
    for i in 0..24u64 {
        assert!(
            pool.block(i) == pool.block(47 - i),
            "block {i} differs after a 1 MiB round trip"
        );
    }
}

fn signed_payload_and_checksum_headers(srv: &Server) {
    // payload_signing hashes the body into the signature (s3s-fs verifies it);
    // req_checksum "supported" sends x-amz-checksum-sha256 (the server verifies it).
    let bucket = srv.new_bucket();
    let store = with(
        with(srv.store_json(&bucket), "payload_signing", json!(true)),
        "req_checksum",
        json!("supported"),
    );
    let tier = tier(store);
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(3);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&[10, 11, 12]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&1).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    tier.submit(JobKind::Load, 2, &[5, 6, 7], keys(&[10, 11, 12]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert!(
        pool.block(5) == pool.block(0)
            && pool.block(6) == pool.block(1)
            && pool.block(7) == pool.block(2)
    );
}

fn missing_key_fails_alone(srv: &Server) {
    let bucket = srv.new_bucket();
    let tier = tier(srv.store_json(&bucket));
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(3);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&[10, 11, 12]))
        .unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    let before = pool.block(5).to_vec();
    tier.submit(JobKind::Load, 2, &[4, 5, 6, 7], keys(&[10, 99, 11, 12]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(r.status, Status::NotFound, "{}", r.message);
    assert_eq!(
        r.key_status,
        vec![Status::Ok, Status::NotFound, Status::Ok, Status::Ok]
    );
    assert_eq!(r.bytes, 3 * BLOCK as u64);
    assert!(r.message.contains("1 of 4 keys failed"), "{}", r.message);
    assert!(
        pool.block(4) == pool.block(0)
            && pool.block(6) == pool.block(1)
            && pool.block(7) == pool.block(2)
    );
    assert!(
        pool.block(5) == &before[..],
        "the missing key's slot was written"
    );
}

fn wrong_length_objects_fail_alone(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let tier = tier(store.clone());
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(5);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0], keys(&[4])).unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    // Out of band, with a separate client: one short, one long, one empty object.
    let name = |i| tier.layout().object_name(&key(i)).unwrap();
    oob_put(&store, &name(1), random_bytes(BLOCK - 1, 1));
    oob_put(&store, &name(2), random_bytes(BLOCK + 1, 2));
    oob_put(&store, &name(3), Vec::new());
    tier.submit(JobKind::Load, 2, &[4, 5, 6, 7], keys(&[1, 2, 3, 4]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(
        r.key_status,
        vec![
            Status::LengthMismatch,
            Status::LengthMismatch,
            Status::LengthMismatch,
            Status::Ok
        ],
        "{}",
        r.message
    );
    assert_eq!(r.bytes, BLOCK as u64);
    assert!(pool.block(7) == pool.block(0));
}

fn probe_reports_missing_bucket(srv: &Server) {
    let e = tier_err(srv.store_json("kvt-no-such-bucket"));
    assert_eq!(e.status, Status::BucketNotFound, "{}", e.message);
    assert!(
        e.message.contains("kvt-no-such-bucket"),
        "names the bucket: {}",
        e.message
    );
    assert!(
        e.message.contains("create it or fix store.bucket"),
        "{}",
        e.message
    );
    assert_no_secret(&e.message, srv);
}

fn probe_with_wrong_secret(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = with(
        srv.store_json(&bucket),
        "secret_key",
        json!("wrong-secret-ZZ93kq"),
    );
    let result = Tier::from_json(&tier_json(store, json!({})));
    if srv.checks_signatures() {
        let e = result
            .err()
            .expect("a wrong secret key must fail the probe on a server that checks signatures");
        assert_eq!(e.status, Status::Auth, "{}", e.message);
        assert!(e.message.contains("SignatureDoesNotMatch"), "{}", e.message);
        assert!(
            e.message.contains("credentials were rejected"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("store.access_key/store.secret_key"),
            "names the credential source: {}",
            e.message
        );
        assert_no_secret(&e.message, srv);
    } else {
        // moto: no signature checks, so the tier starts and works.
        let tier = result.unwrap_or_else(|e| panic!("moto does not check signatures, yet: {e}"));
        assert!(!tier.missing_keys_are_forbidden());
    }
}

fn probe_with_unknown_access_key(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = with(
        srv.store_json(&bucket),
        "access_key",
        json!("AKIAUNKNOWNKEY0000"),
    );
    let result = Tier::from_json(&tier_json(store, json!({})));
    if srv.checks_signatures() {
        let e = result
            .err()
            .expect("an unknown access key must fail the probe");
        assert_eq!(e.status, Status::Auth, "{}", e.message);
        assert!(
            !e.message.contains("AKIAUNKNOWNKEY0000"),
            "access key id echoed: {}",
            e.message
        );
        assert_no_secret(&e.message, srv);
    } else {
        assert!(result.is_ok());
    }
}

fn exists_helper(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    oob_put(&store, "kv/present.bin", vec![1, 2, 3]);
    block_on(async {
        let s = oob_store(&store);
        assert!(s
            .exists(&Path::from("kv/present.bin"), false)
            .await
            .unwrap());
        assert!(!s.exists(&Path::from("kv/absent.bin"), false).await.unwrap());
        assert!(!s.exists(&Path::from("kv/absent.bin"), true).await.unwrap());
        // Batched and concurrent, as the lookup lane uses it.
        let names: Vec<Path> = (0..32)
            .map(|i| {
                Path::from(if i % 4 == 0 {
                    "kv/present.bin".to_string()
                } else {
                    format!("kv/x{i}")
                })
            })
            .collect();
        let found = futures::future::join_all(names.iter().map(|n| s.exists(n, false))).await;
        for (i, f) in found.into_iter().enumerate() {
            assert_eq!(f.unwrap(), i % 4 == 0, "key {i}");
        }
    });
}

fn exists_and_tier_without_list_permission(srv: &Server) {
    // The proxy turns every 404 into 403 AccessDenied: a principal without s3:ListBucket.
    let bucket = srv.new_bucket();
    let proxy = Proxy::start(srv.port());
    proxy.set_rule(|_| Fault::Forbid404);
    let store = with(
        srv.store_json(&bucket),
        "endpoint_override",
        json!(proxy.endpoint()),
    );
    oob_put(&store, "kv/present.bin", vec![1, 2, 3]);
    block_on(async {
        let s = oob_store(&store);
        assert!(s.exists(&Path::from("kv/present.bin"), true).await.unwrap());
        assert!(!s.exists(&Path::from("kv/absent.bin"), true).await.unwrap());
        let e = s
            .exists(&Path::from("kv/absent.bin"), false)
            .await
            .unwrap_err();
        assert_eq!(e.status, Status::PermissionDenied, "{}", e.message);
        let probe = s
            .probe("kv/__kvtier_probe__/connectivity_test")
            .await
            .unwrap();
        assert_eq!(probe, ProbeOutcome::ReadyWithoutList);
    });
    let tier = tier(store);
    assert!(
        tier.missing_keys_are_forbidden(),
        "the probe must detect 403-for-missing"
    );
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(8);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[1, 2]))
        .unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    tier.submit(JobKind::Load, 2, &[4, 5, 6], keys(&[1, 77, 2]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(
        r.key_status,
        vec![Status::Ok, Status::PermissionDenied, Status::Ok],
        "{}",
        r.message
    );
    assert!(pool.block(4) == pool.block(0) && pool.block(6) == pool.block(1));
    assert!(proxy.stats().faults("forbid_404") > 0);

    // Lookups: one HEAD per key. The direct HEAD's 403 means absent (the probe established
    // that), so it is not asked again through the general client.
    let heads = || proxy.stats().by_method.get("HEAD").copied().unwrap_or(0);
    let (heads_before, fallbacks_before) = (heads(), tier.stats().direct_fallbacks);
    let absent: Vec<u64> = (200..208).collect();
    for k in &absent {
        assert_eq!(
            resolve_lookup(&tier, 5, &key(*k)),
            LookupResult::Miss,
            "key {k}"
        );
    }
    assert_eq!(resolve_lookup(&tier, 5, &key(1)), LookupResult::Hit);
    assert_eq!(
        heads() - heads_before,
        absent.len() as u64 + 1,
        "{}: one HEAD per lookup",
        srv.name()
    );
    assert_eq!(
        tier.stats().direct_fallbacks,
        fallbacks_before,
        "{}: {:?}",
        srv.name(),
        tier.stats()
    );
}

fn tier_restarts_on_the_same_bucket(srv: &Server) {
    // An engine restart: a second tier on the same bucket finds what the first stored.
    // (Every start probes the bucket again, so start-up leftovers must not break a probe.)
    let bucket = srv.new_bucket();
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(31);
    {
        let tier = tier(srv.store_json(&bucket));
        pool.register(&tier);
        tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&[1, 2, 3]))
            .unwrap();
        assert!(wait_all(&tier, 1)[&1].succeeded());
    }
    for restart in 0..2u64 {
        let tier = Tier::from_json(&tier_json(srv.store_json(&bucket), json!({})))
            .unwrap_or_else(|e| panic!("restart {restart} on the same bucket failed: {e}"));
        pool.register(&tier);
        tier.submit(JobKind::Load, 2, &[5, 6, 7], keys(&[1, 2, 3]))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&2).unwrap();
        assert_eq!(r.status, Status::Ok, "{}", r.message);
        assert!(
            pool.block(5) == pool.block(0)
                && pool.block(6) == pool.block(1)
                && pool.block(7) == pool.block(2)
        );
        pool.mem[5 * BLOCK..8 * BLOCK].fill(0);
    }
}

fn direct_path_carries_stores_loads_and_lookups(srv: &Server) {
    // The same workload with the direct HTTP path on (the default for plain-http
    // endpoints), on with lookups sharing the transfer lane's connections, and off:
    // identical bytes and answers, and the counters say which path carried the requests.
    // On s3s-fs a wrong signature would be refused (and counted as a fallback), so zero
    // fallbacks there also proves the direct path's SigV4. Loads run twice, so pooled
    // connections are reused: a connection left waiting for a large read (SO_RCVLOWAT)
    // would time out on its next, small response head and count as a fallback.
    let bucket = srv.new_bucket();
    for (run, direct, separate_lane) in [(0u64, true, true), (1, true, false), (2, false, true)] {
        let store = with(srv.store_json(&bucket), "direct_http", json!(direct));
        let config = tier_json(store, json!({"separate_lookup_lane": separate_lane}));
        let tier = Tier::from_json(&config).unwrap_or_else(|e| panic!("tier start failed: {e}"));
        let case = format!("direct_http={direct} separate_lookup_lane={separate_lane}");
        let mut pool = Pool::new(16, BLOCK);
        pool.fill_random(30 + run);
        pool.register(&tier);
        let ids: Vec<u64> = (0..4).collect();
        let stored_keys: Vec<u64> = ids.iter().map(|i| run * 100 + i).collect();
        tier.submit(JobKind::Store, 1, &ids, keys(&stored_keys))
            .unwrap();
        assert!(wait_all(&tier, 1)[&1].succeeded());
        for (job, first_slot) in [(2u64, 8u64), (3, 12)] {
            let slots: Vec<u64> = (first_slot..first_slot + 4).collect();
            tier.submit(JobKind::Load, job, &slots, keys(&stored_keys))
                .unwrap();
            let r = wait_all(&tier, 1).remove(&job).unwrap();
            assert_eq!(r.key_status, vec![Status::Ok; 4], "{case}: {}", r.message);
            for (i, slot) in ids.iter().zip(&slots) {
                assert!(
                    pool.block(*i) == pool.block(*slot),
                    "{case}: block {i} differs in slot {slot}"
                );
            }
        }
        let absent = key(run * 100 + 50);
        for k in &stored_keys {
            assert_eq!(
                resolve_lookup(&tier, 7, &key(*k)),
                LookupResult::Hit,
                "{case}: key {k}"
            );
        }
        assert_eq!(
            resolve_lookup(&tier, 7, &absent),
            LookupResult::Miss,
            "{case}"
        );
        let stats = tier.stats();
        assert_eq!(stats.existence_checks, 5, "{case}: {stats:?}");
        if direct {
            assert_eq!(
                stats.direct_requests,
                4 + 8 + 5,
                "{case}: 4 stores, 8 loads and 5 HEADs go direct: {stats:?}"
            );
            assert_eq!(stats.direct_fallbacks, 0, "{case}: {stats:?}");
        } else {
            assert_eq!(stats.direct_requests, 0, "{case}: {stats:?}");
        }
    }
}

/// A namespace vLLM builds from a model name with non-ASCII letters (`modèle`): stores,
/// lookups and loads name the same object, on the direct path and on the general client
/// (which every HTTPS endpoint and every direct fallback uses).
fn non_ascii_names_hit_and_load_on_both_paths(srv: &Server) {
    let bucket = srv.new_bucket();
    non_ascii_round_trip(srv, &bucket, &[true, false]);
}

/// Stores, looks up and loads keys under a non-ASCII namespace with `direct_http` set to
/// each of `directs`; the object lands under its name encoded once.
fn non_ascii_round_trip(srv: &Server, bucket: &str, directs: &[bool]) {
    for (run, &direct) in directs.iter().enumerate() {
        let run = run as u64;
        let store = with(srv.store_json(bucket), "direct_http", json!(direct));
        let config = json!({"store": store, "prefix": "kv", "namespace": "modèle_0123456789ab_r0"})
            .to_string();
        let tier = Tier::from_json(&config).unwrap_or_else(|e| panic!("tier start failed: {e}"));
        let case = format!("{} direct_http={direct}", srv.name());
        let mut pool = Pool::new(8, BLOCK);
        pool.fill_random(60 + run);
        pool.register(&tier);
        let stored: Vec<u64> = (0..2).map(|i| 700 + run * 10 + i).collect();
        tier.submit(JobKind::Store, 1, &[0, 1], keys(&stored))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&1).unwrap();
        assert_eq!(r.status, Status::Ok, "{case}: {}", r.message);
        let name = tier.layout().object_name(&key(stored[0])).unwrap();
        assert!(name.starts_with("kv/modèle_0123456789ab_r0/"), "{name}");
        assert_eq!(
            oob_get(&store, &name).as_deref(),
            Some(pool.block(0)),
            "{case}: object not under its name"
        );
        for k in &stored {
            assert_eq!(
                resolve_lookup(&tier, 3, &key(*k)),
                LookupResult::Hit,
                "{case}: key {k}"
            );
        }
        assert_eq!(
            resolve_lookup(&tier, 3, &key(799)),
            LookupResult::Miss,
            "{case}"
        );
        tier.submit(JobKind::Load, 2, &[4, 5], keys(&stored))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&2).unwrap();
        assert_eq!(r.key_status, vec![Status::Ok; 2], "{case}: {}", r.message);
        assert!(
            pool.block(4) == pool.block(0) && pool.block(5) == pool.block(1),
            "{case}"
        );
        let stats = tier.stats();
        assert_eq!(stats.direct_fallbacks, 0, "{case}: {stats:?}");
    }
}

/// Start-up probes where the credentials may write but not delete: every start leaves the
/// same two probe objects behind (the conditional-PUT and the upload-check probes', fixed
/// names per prefix), and a leftover does not stop
/// the next start from finding that the store honours If-None-Match.
fn probe_leftovers_do_not_accumulate_when_delete_is_denied(srv: &Server) {
    count_probe_delete_warnings();
    let bucket = srv.new_bucket();
    let proxy = Proxy::start(srv.port());
    // object_store deletes with a bulk-delete POST (`?delete`); a plain DELETE is refused too.
    proxy.set_rule(|r| {
        if r.method == "DELETE" || (r.method == "POST" && r.path.contains("?delete")) {
            Fault::Status(403)
        } else {
            Fault::Pass
        }
    });
    let store = with(
        srv.store_json(&bucket),
        "endpoint_override",
        json!(proxy.endpoint()),
    );
    let mut probe_dir = String::new();
    for start in 0..3 {
        let config = tier_json(store.clone(), json!({"dedup": "conditional"}));
        let tier = Tier::from_json(&config)
            .unwrap_or_else(|e| panic!("{}: start {start}: {e}", srv.name()));
        probe_dir = tier
            .layout()
            .probe_name()
            .rsplit_once('/')
            .unwrap()
            .0
            .to_string();
    }
    assert!(
        proxy.stats().faults("status") >= 3,
        "{}: the deletes were not refused: {:?}",
        srv.name(),
        proxy.stats()
    );
    let leftovers = block_on(async {
        use futures::TryStreamExt;
        use object_store::ObjectStore;
        let s = oob_store(&srv.store_json(&bucket));
        let listed: Vec<_> = s
            .client()
            .list(Some(&Path::from(probe_dir.as_str())))
            .try_collect()
            .await
            .unwrap();
        listed
            .into_iter()
            .map(|m| m.location.to_string())
            .collect::<Vec<_>>()
    });
    let mut leftovers = leftovers;
    leftovers.sort();
    assert_eq!(
        leftovers,
        [
            format!("{probe_dir}/connectivity_test-conditional-put"),
            format!("{probe_dir}/connectivity_test-upload-check"),
        ],
        "{}",
        srv.name()
    );
    // Warned about once per process, whichever test's start was refused first.
    assert_eq!(
        PROBE_DELETE_WARNINGS.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "{}",
        srv.name()
    );
}

static PROBE_DELETE_WARNINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts the library's warnings about a probe object it could not delete.
fn count_probe_delete_warnings() {
    struct Counter;
    impl log::Log for Counter {
        fn enabled(&self, metadata: &log::Metadata) -> bool {
            metadata.level() <= log::Level::Warn
        }
        fn log(&self, record: &log::Record) {
            if record
                .args()
                .to_string()
                .contains("cannot delete the start-up probe object")
            {
                PROBE_DELETE_WARNINGS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        fn flush(&self) {}
    }
    static ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        log::set_boxed_logger(Box::new(Counter)).unwrap();
        log::set_max_level(log::LevelFilter::Warn);
    });
}

on_both_servers!(
    round_trip_non_identity_slots,
    large_blocks_and_many_jobs,
    signed_payload_and_checksum_headers,
    missing_key_fails_alone,
    wrong_length_objects_fail_alone,
    probe_reports_missing_bucket,
    probe_with_wrong_secret,
    probe_with_unknown_access_key,
    exists_helper,
    exists_and_tier_without_list_permission,
    tier_restarts_on_the_same_bucket,
    direct_path_carries_stores_loads_and_lookups,
    non_ascii_names_hit_and_load_on_both_paths,
    probe_leftovers_do_not_accumulate_when_delete_is_denied,
);

/// A real principal without s3:ListBucket: an RGW user granted object access to the bucket
/// by a bucket policy, nothing else. RGW answers 403 for its missing keys; the tier starts,
/// stores and loads, and a lookup of a missing key costs one HEAD (counted at a proxy), not a
/// direct HEAD plus a second one through the general client.
#[test]
fn rgw_principal_without_list_bucket() {
    let srv = Server::shared_rgw();
    let bucket = srv.new_bucket();
    let policy = json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"AWS": [format!("arn:aws:iam:::user/{RGW_NOLIST_USER}")]},
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
            "Resource": [format!("arn:aws:s3:::{bucket}/*")],
        }],
    });
    let (status, body) = signed_request(
        srv.port(),
        "PUT",
        &format!("/{bucket}?policy"),
        policy.to_string().as_bytes(),
        &srv.access_key,
        &srv.secret_key,
    )
    .unwrap();
    assert!(
        status == 200 || status == 204,
        "bucket policy: {status} {body}"
    );
    let proxy = Proxy::start(srv.port());
    let mut store = with(
        srv.store_json(&bucket),
        "endpoint_override",
        json!(proxy.endpoint()),
    );
    store["access_key"] = json!(RGW_NOLIST_ACCESS_KEY);
    store["secret_key"] = json!(RGW_NOLIST_SECRET_KEY);
    let tier = tier(store);
    assert!(
        tier.missing_keys_are_forbidden(),
        "RGW answers 403 for a missing key without ListBucket"
    );
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(88);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[1, 2]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&1).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    tier.submit(JobKind::Load, 2, &[4, 5], keys(&[1, 2]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert!(pool.block(4) == pool.block(0) && pool.block(5) == pool.block(1));
    let heads = || proxy.stats().by_method.get("HEAD").copied().unwrap_or(0);
    let (heads_before, fallbacks_before) = (heads(), tier.stats().direct_fallbacks);
    let absent: Vec<u64> = (300..316).collect();
    for k in &absent {
        assert_eq!(
            resolve_lookup(&tier, 5, &key(*k)),
            LookupResult::Miss,
            "key {k}"
        );
    }
    assert_eq!(resolve_lookup(&tier, 5, &key(1)), LookupResult::Hit);
    assert_eq!(
        heads() - heads_before,
        absent.len() as u64 + 1,
        "one HEAD per lookup"
    );
    assert_eq!(
        tier.stats().direct_fallbacks,
        fallbacks_before,
        "{:?}",
        tier.stats()
    );
}

// ------------------------------------------------------------------------------------
// Server-independent probe failures and TLS

#[test]
fn probe_unreachable_endpoint_is_connect() {
    let port = free_port(); // nobody listens here
    let store = json!({"type":"s3","bucket":"b","endpoint_override":format!("127.0.0.1:{port}"),"scheme":"http",
        "access_key":"AKIDUNREACH","secret_key":"unreachable-secret-77","max_retries":0,"connect_timeout_ms":1000});
    let e = tier_err(store);
    assert_eq!(e.status, Status::Connect, "{}", e.message);
    assert!(
        e.message.contains("unreachable") && e.message.contains("endpoint_override"),
        "{}",
        e.message
    );
    assert!(!e.message.contains("unreachable-secret-77"));
}

#[test]
fn tls_moto_with_and_without_ca_bundle() {
    let tls = Arc::new(Tls::generate());
    let srv = Server::moto_tls(tls.clone());
    let bucket = srv.new_bucket();

    // With the CA in ca_bundle: works end to end.
    let tier = tier(srv.store_json(&bucket));
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(21);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&[1, 2, 3]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&1).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    tier.submit(JobKind::Load, 2, &[7, 6, 5], keys(&[1, 2, 3]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert!(
        pool.block(7) == pool.block(0)
            && pool.block(6) == pool.block(1)
            && pool.block(5) == pool.block(2)
    );
    drop(tier);
    // A non-ASCII namespace over HTTPS (the direct path over TLS, and the general client).
    non_ascii_round_trip(&srv, &bucket, &[true]);

    // Without it: a TLS error that names the CA problem and the fix.
    let mut store = srv.store_json(&bucket);
    store.as_object_mut().unwrap().remove("ca_bundle");
    let e = tier_err(with(store.clone(), "max_retries", json!(0)));
    assert_eq!(e.status, Status::Tls, "{}", e.message);
    assert!(e.message.contains("unknown CA"), "{}", e.message);
    assert!(e.message.contains("store.ca_bundle"), "{}", e.message);
    assert!(
        e.message.contains("UnknownIssuer"),
        "keeps the TLS library's reason: {}",
        e.message
    );
    assert_no_secret(&e.message, &srv);

    // With a CA that did not sign the server's certificate: names the file.
    let other = tls.other_ca.display().to_string();
    let e = tier_err(with(
        with(store.clone(), "ca_bundle", json!(other)),
        "max_retries",
        json!(0),
    ));
    assert_eq!(e.status, Status::Tls, "{}", e.message);
    assert!(
        e.message.contains(&other),
        "names the ca_bundle file: {}",
        e.message
    );

    // https to a plain-HTTP port: the server does not speak TLS.
    let plain = Server::shared_moto();
    let e = tier_err(with(
        with(
            with(plain.store_json(&bucket), "scheme", json!("https")),
            "max_retries",
            json!(0),
        ),
        "ca_bundle",
        json!(tls.ca.display().to_string()),
    ));
    assert_eq!(e.status, Status::Tls, "{}", e.message);
    assert!(e.message.contains("does not speak TLS"), "{}", e.message);

    // A ca_bundle that is not PEM is a configuration error naming the file.
    let bogus = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bogus.path(), b"not a certificate").unwrap();
    let e = tier_err(with(
        store,
        "ca_bundle",
        json!(bogus.path().display().to_string()),
    ));
    assert_eq!(e.status, Status::Config, "{}", e.message);
    assert!(
        e.message.contains(&bogus.path().display().to_string()),
        "{}",
        e.message
    );
}

/// The tier's own sockets to a server port: (fd, TCP_NODELAY set).
fn client_sockets_to(port: u16) -> Vec<(i32, bool)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let rc =
            unsafe { libc::getpeername(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len) };
        if rc != 0
            || addr.sin_family != libc::AF_INET as libc::sa_family_t
            || u16::from_be(addr.sin_port) != port
        {
            continue;
        }
        let mut flag: libc::c_int = 0;
        let mut flen = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                &mut flag as *mut _ as *mut libc::c_void,
                &mut flen,
            )
        };
        assert_eq!(rc, 0);
        out.push((fd, flag != 0));
    }
    out
}

#[test]
fn many_http1_connections_all_with_tcp_nodelay() {
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let tier = tier(srv.store_json(&bucket));
    let mut pool = Pool::new(32, BLOCK);
    pool.fill_random(12);
    pool.register(&tier);
    let ids: Vec<u64> = (0..32).collect();
    tier.submit(JobKind::Store, 1, &ids, keys(&ids)).unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    // The pooled connections stay open after the job: inspect them.
    let sockets = client_sockets_to(srv.port());
    assert!(
        sockets.len() > 1,
        "32 concurrent PUTs should use several HTTP/1.1 connections, saw {}",
        sockets.len()
    );
    for (fd, nodelay) in &sockets {
        assert!(nodelay, "connection fd {fd} to the store lacks TCP_NODELAY");
    }
}
