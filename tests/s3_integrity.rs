//! Integrity and dedup on real S3 servers (s3s-fs and moto): checksums survive the store
//! as user metadata, tampering fails only the tampered key, and dedup is proven by
//! counting PUT requests at a proxy in front of the server.

#[macro_use]
mod support;

use kvtier_core::store::object_path;
use kvtier_core::{JobKind, LookupResult, Status, Tier};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::json;
use support::proxy::{Fault, Proxy};
use support::*;

const BLOCK: usize = 32 * 1024;

fn start(store: serde_json::Value, extra: serde_json::Value) -> Tier {
    Tier::from_json(&tier_json(store, extra)).unwrap_or_else(|e| panic!("tier start failed: {e}"))
}

/// A new bucket of `srv`, a proxy in front of the server, and the `store` section that
/// reaches the bucket through the proxy.
fn behind_a_proxy(srv: &Server) -> (String, Proxy, serde_json::Value) {
    let bucket = srv.new_bucket();
    let proxy = Proxy::start(srv.port());
    let store = with(
        srv.store_json(&bucket),
        "endpoint_override",
        json!(proxy.endpoint()),
    );
    (bucket, proxy, store)
}

fn run(tier: &Tier, kind: JobKind, id: u64, blocks: &[u64], ids: &[u64]) -> kvtier_core::JobResult {
    let _ = tier.submit(kind, id, blocks, keys(ids));
    wait_all(tier, 1).remove(&id).unwrap()
}

fn checksum_round_trips_as_metadata(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let tier = start(store.clone(), json!({}));
    let mut pool = Pool::new(4, BLOCK);
    pool.fill_random(3);
    pool.register(&tier);
    assert!(run(&tier, JobKind::Store, 1, &[0], &[1]).succeeded());
    let name = tier.layout().object_name(&key(1)).unwrap();
    let recorded = block_on(async {
        let s = oob_store(&store).client().clone();
        let got = s.get(&Path::from(name.as_str())).await.unwrap();
        got.attributes
            .get(&object_store::Attribute::Metadata(
                kvtier_core::CRC_METADATA.into(),
            ))
            .map(|v| v.to_string())
    });
    assert_eq!(
        recorded,
        Some(format!("{:08x}", crc32c::crc32c(pool.block(0)))),
        "{}",
        srv.name()
    );
    // The object's bytes are the block's bytes, unchanged: vLLM's tier can read them.
    assert_eq!(oob_get(&store, &name).unwrap(), pool.block(0));
}

/// Rewrites key 2's object out of band, once keeping kvtier's metadata (bit rot) and once
/// through a plain client that drops it; either way only that key fails.
fn tampered_object_fails_only_its_key(srv: &Server) {
    for keep_metadata in [true, false] {
        let bucket = srv.new_bucket();
        let store = srv.store_json(&bucket);
        let tier = start(store.clone(), json!({}));
        let mut pool = Pool::new(8, BLOCK);
        pool.fill_random(9);
        pool.register(&tier);
        assert!(run(&tier, JobKind::Store, 1, &[0, 1, 2], &[1, 2, 3]).succeeded());
        let name = tier.layout().object_name(&key(2)).unwrap();
        block_on(async {
            let s = oob_store(&store).client().clone();
            let path = Path::from(name.as_str());
            let got = s.get(&path).await.unwrap();
            let attributes = got.attributes.clone();
            let mut bytes = got.bytes().await.unwrap().to_vec();
            bytes[BLOCK / 2] ^= 0x40;
            let options = object_store::PutOptions {
                attributes: if keep_metadata {
                    attributes
                } else {
                    Default::default()
                },
                ..Default::default()
            };
            s.put_opts(&path, bytes.into(), options).await.unwrap();
        });
        let r = run(&tier, JobKind::Load, 2, &[4, 5, 6], &[1, 2, 3]);
        assert_eq!(
            r.key_status,
            vec![Status::Ok, Status::Corrupt, Status::Ok],
            "{} keep_metadata={keep_metadata}: {}",
            srv.name(),
            r.message
        );
        assert_eq!(pool.block(4), pool.block(0));
        assert_eq!(pool.block(6), pool.block(2));
        assert_eq!(tier.stats().corrupt_blocks, 1);
        // A new request gets MISS for the corrupt key without asking the store.
        let before = tier.stats().existence_checks;
        assert_eq!(resolve_lookup(&tier, 77, &key(2)), LookupResult::Miss);
        assert_eq!(resolve_lookup(&tier, 77, &key(1)), LookupResult::Hit);
        assert_eq!(
            tier.stats().existence_checks,
            before + 1,
            "only key 1 was asked"
        );
    }
}

/// Bit rot at rest under `on_corrupt: fail` (the default) in `conditional` dedup mode: the
/// key turns MISS for the request that held a HIT and for every later request, and the
/// next store of the key overwrites the object (neither skipped as known nor refused by
/// If-None-Match), after which it loads and answers HIT again.
fn corrupt_key_turns_miss_and_next_store_repairs_it(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let tier = start(store.clone(), json!({"dedup": "conditional"}));
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(12);
    pool.register(&tier);
    assert!(run(&tier, JobKind::Store, 1, &[0, 1], &[21, 22]).succeeded());
    assert_eq!(resolve_lookup(&tier, 5, &key(21)), LookupResult::Hit);
    let name = tier.layout().object_name(&key(21)).unwrap();
    block_on(async {
        let s = oob_store(&store).client().clone();
        let path = object_path(&name);
        let got = s.get(&path).await.unwrap();
        let attributes = got.attributes.clone();
        let mut bytes = got.bytes().await.unwrap().to_vec();
        bytes[7] ^= 0x01;
        s.put_opts(
            &path,
            bytes.into(),
            object_store::PutOptions {
                attributes,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    });
    let r = run(&tier, JobKind::Load, 2, &[4, 5], &[21, 22]);
    assert_eq!(
        r.key_status,
        vec![Status::Corrupt, Status::Ok],
        "{}: {}",
        srv.name(),
        r.message
    );
    assert_eq!(tier.stats().corrupt_blocks, 1);
    assert_eq!(
        tier.lookup(5, &key(21)).unwrap(),
        LookupResult::Miss,
        "the request that held HIT"
    );
    let checks = tier.stats().existence_checks;
    for request in [6, 7] {
        assert_eq!(
            resolve_lookup(&tier, request, &key(21)),
            LookupResult::Miss,
            "{}: request {request}",
            srv.name()
        );
    }
    assert_eq!(
        tier.stats().existence_checks,
        checks,
        "a key known corrupt is not asked for"
    );
    // The next store rewrites the object.
    let before = tier.stats();
    assert!(run(&tier, JobKind::Store, 3, &[0], &[21]).succeeded());
    let after = tier.stats();
    assert_eq!(
        (after.dedup_known, after.dedup_already_stored),
        (before.dedup_known, before.dedup_already_stored),
        "{after:?}"
    );
    assert_eq!(
        oob_get(&store, &name).as_deref(),
        Some(pool.block(0)),
        "{}: the object was not repaired",
        srv.name()
    );
    let r = run(&tier, JobKind::Load, 4, &[6], &[21]);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_eq!(pool.block(6), pool.block(0));
    for request in [5, 6, 7] {
        tier.request_finished(request); // their shared MISS verdict goes with them
    }
    assert_eq!(resolve_lookup(&tier, 8, &key(21)), LookupResult::Hit);
    // Repaired: a further store is deduplicated again.
    assert!(run(&tier, JobKind::Store, 5, &[0], &[21]).succeeded());
    assert_eq!(tier.stats().dedup_known, after.dedup_known + 1);
}

fn fail_and_delete_removes_corrupt_object(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let tier = start(store.clone(), json!({"on_corrupt": "fail_and_delete"}));
    let mut pool = Pool::new(4, BLOCK);
    pool.fill_random(5);
    pool.register(&tier);
    assert!(run(&tier, JobKind::Store, 1, &[0], &[4]).succeeded());
    let name = tier.layout().object_name(&key(4)).unwrap();
    oob_put(&store, &name, vec![0u8; BLOCK]);
    assert_eq!(
        run(&tier, JobKind::Load, 2, &[1], &[4]).status,
        Status::Corrupt
    );
    assert!(
        oob_get(&store, &name).is_none(),
        "{}: corrupt object not deleted",
        srv.name()
    );
    assert!(run(&tier, JobKind::Store, 3, &[0], &[4]).succeeded());
    assert!(run(&tier, JobKind::Load, 4, &[2], &[4]).succeeded());
    assert_eq!(pool.block(2), pool.block(0));
}

fn other_block_size_fails_by_length(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let a = start(store.clone(), json!({}));
    let mut pa = Pool::new(2, BLOCK);
    pa.fill_random(1);
    pa.register(&a);
    assert!(run(&a, JobKind::Store, 1, &[0], &[6]).succeeded());
    let b = start(store, json!({}));
    let mut pb = Pool::new(2, BLOCK * 2);
    pb.register(&b);
    assert_eq!(
        run(&b, JobKind::Load, 1, &[1], &[6]).status,
        Status::LengthMismatch
    );
}

/// N stores of one key from two tier instances, through a counting proxy: one upload.
fn dedup_uploads_once_across_tiers(srv: &Server) {
    let (bucket, proxy, store) = behind_a_proxy(srv);
    let name = {
        let probe = start(store.clone(), json!({}));
        probe.layout().object_name(&key(9)).unwrap()
    };
    let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = counted.clone();
    let object_path = format!("/{bucket}/{name}");
    proxy.set_rule(move |req| {
        if req.method == "PUT" && req.path.split('?').next() == Some(object_path.as_str()) {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Fault::Pass
    });
    let a = start(store.clone(), json!({}));
    let b = start(store.clone(), json!({}));
    let mut pa = Pool::new(4, BLOCK);
    pa.fill_random(2);
    pa.register(&a);
    let mut pb = Pool::new(4, BLOCK);
    pb.fill_random(2);
    pb.register(&b);
    let mut job = 0;
    for tier in [&a, &b, &a, &b] {
        for _ in 0..3 {
            job += 1;
            // One job stores the key twice (shared upload), and repeats come from both tiers.
            assert!(run(tier, JobKind::Store, job, &[0, 1], &[9, 9]).succeeded());
        }
    }
    let puts = counted.load(std::sync::atomic::Ordering::SeqCst);
    let sb = b.stats();
    // Tier a uploads once; tier b's first PUT is refused with 412 where the server honours
    // If-None-Match (counted at the proxy, but not an upload of new data) — both servers do.
    assert!(puts <= 2, "{}: {puts} PUTs of one key", srv.name());
    assert_eq!(puts, 1 + sb.dedup_already_stored, "{}: {sb:?}", srv.name());
    assert_eq!(oob_get(&store, &name).unwrap(), pa.block(0));
}

/// Uploads whose bodies a proxy damages on the way (one flipped byte), with default
/// settings. Where the start-up probe found that the server verifies the request's
/// checksum, no damaged body is ever reported stored: with the first attempt of every
/// object's PUT damaged, all 40 keys store (each refused once, then sent again) and load
/// byte-exact; with every attempt damaged, every key fails and no object exists. Where the
/// server does not verify (the probe says so), the documented behaviour: the key is
/// reported stored, and the first load finds the damage by its CRC32C, fails the key
/// `Corrupt`, and the key answers MISS.
fn upload_damaged_in_transit_is_never_reported_stored(srv: &Server) {
    // Overwriting PUTs, and the default (conditional PUTs where the server honours them).
    for dedup in [json!({"dedup": "off"}), json!({})] {
        upload_damaged_in_transit(srv, dedup);
    }
}

fn upload_damaged_in_transit(srv: &Server, dedup: serde_json::Value) {
    const KEYS: u64 = 40;
    let (bucket, proxy, store) = behind_a_proxy(srv);
    let ids: Vec<u64> = (0..KEYS).collect();
    let blocks: Vec<u64> = (0..KEYS).collect();
    let block_prefix = format!("/{bucket}/kv/");
    let damage_first_attempt = {
        let seen = std::sync::Mutex::new(std::collections::HashSet::new());
        let prefix = block_prefix.clone();
        move |req: &support::proxy::RequestInfo| {
            let path = req.path.split('?').next().unwrap_or_default().to_string();
            let block = req.method == "PUT"
                && path.starts_with(&prefix)
                && !path.contains("__kvtier_probe__");
            if block && seen.lock().unwrap().insert(path) {
                Fault::CorruptRequestBody
            } else {
                Fault::Pass
            }
        }
    };
    // The probe at start goes through the proxy undamaged.
    let tier = start(store.clone(), dedup);
    let verified = tier.upload_check() == kvtier_core::store::UploadCheck::Verified;
    eprintln!(
        "{}: {dedup_mode:?}, upload check {:?}",
        srv.name(),
        tier.upload_check(),
        dedup_mode = tier.dedup_mode()
    );
    let mut pool = Pool::new(2 * KEYS, BLOCK);
    pool.fill_random(44);
    pool.register(&tier);

    proxy.set_rule(damage_first_attempt);
    let r = run(&tier, JobKind::Store, 1, &blocks, &ids);
    let damaged = proxy.stats().faults("corrupt_request_body");
    assert_eq!(damaged, KEYS, "{}", srv.name());
    proxy.set_rule(|_| Fault::Pass);
    let loads: Vec<u64> = (KEYS..2 * KEYS).collect();
    if verified {
        assert!(r.succeeded(), "{}: {}", srv.name(), r.message);
        assert_eq!(tier.stats().damaged_uploads, KEYS, "{}", srv.name());
        let l = run(&tier, JobKind::Load, 2, &loads, &ids);
        assert!(l.succeeded(), "{}: {}", srv.name(), l.message);
        for i in 0..KEYS {
            assert_eq!(
                pool.block(KEYS + i),
                pool.block(i),
                "{}: key {i}",
                srv.name()
            );
        }
        // Every attempt damaged: every key fails, and nothing is stored.
        proxy.set_rule(move |req| {
            if req.method == "PUT" && req.path.starts_with(&block_prefix) {
                Fault::CorruptRequestBody
            } else {
                Fault::Pass
            }
        });
        let fresh: Vec<u64> = (1000..1000 + KEYS).collect();
        let r = run(&tier, JobKind::Store, 3, &blocks, &fresh);
        assert_eq!(
            r.key_status,
            vec![Status::Io; KEYS as usize],
            "{}: {}",
            srv.name(),
            r.message
        );
        assert!(
            r.message.contains("BadDigest") || r.message.contains("Mismatch"),
            "{}",
            r.message
        );
        proxy.set_rule(|_| Fault::Pass);
        for &i in &fresh {
            let name = tier.layout().object_name(&key(i)).unwrap();
            assert!(
                oob_get(&store, &name).is_none(),
                "{}: {name} was stored",
                srv.name()
            );
        }
    } else {
        // Reported stored, damaged in the store: found by the first load, never handed over.
        assert!(r.succeeded(), "{}: {}", srv.name(), r.message);
        let l = run(&tier, JobKind::Load, 2, &loads, &ids);
        assert_eq!(
            l.key_status,
            vec![Status::Corrupt; KEYS as usize],
            "{}: {}",
            srv.name(),
            l.message
        );
        assert_eq!(
            resolve_lookup(&tier, 9, &key(0)),
            LookupResult::Miss,
            "{}",
            srv.name()
        );
    }
}

on_both_servers!(
    upload_damaged_in_transit_is_never_reported_stored,
    checksum_round_trips_as_metadata,
    tampered_object_fails_only_its_key,
    fail_and_delete_removes_corrupt_object,
    corrupt_key_turns_miss_and_next_store_repairs_it,
    other_block_size_fails_by_length,
    dedup_uploads_once_across_tiers,
);

/// A server that refuses every PUT carrying the checksum header (one that does not know S3's
/// additional checksums, played by the proxy): the tier does not start, and says which
/// setting to change; with `req_checksum: "required"` it starts and stores.
#[test]
fn a_server_refusing_the_checksum_header_fails_the_start_with_the_fix() {
    let server = Server::s3s_fs();
    let (_bucket, proxy, store) = behind_a_proxy(&server);
    proxy.set_rule(|req| {
        let carries = req
            .header_names
            .iter()
            .any(|h| h == "x-amz-checksum-crc64nvme");
        if req.method == "PUT" && carries {
            Fault::Status(400)
        } else {
            Fault::Pass
        }
    });
    let Err(e) = Tier::from_json(&tier_json(store.clone(), json!({}))) else {
        panic!("the tier started on a server that refuses every PUT it sends");
    };
    assert_eq!(e.status, Status::Config, "{}", e.message);
    assert!(
        e.message.contains("x-amz-checksum-crc64nvme")
            && e.message.contains("store.req_checksum to \"required\""),
        "{}",
        e.message
    );
    let store = with(store, "req_checksum", json!("required"));
    let tier = start(store, json!({}));
    assert_eq!(
        tier.upload_check(),
        kvtier_core::store::UploadCheck::NotVerified
    );
    let mut pool = Pool::new(2, BLOCK);
    pool.fill_random(5);
    pool.register(&tier);
    assert!(run(&tier, JobKind::Store, 1, &[0], &[1]).succeeded());
    assert!(run(&tier, JobKind::Load, 2, &[1], &[1]).succeeded());
    assert_eq!(pool.block(0), pool.block(1));
}
