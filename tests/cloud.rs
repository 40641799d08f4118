//! The Azure Blob and GCS stores against their emulators: Azurite (blob service) and
//! fake-gcs-server (behind `scripts/gcs-xml-put.py`, which turns object_store's XML-API
//! upload into the emulator's JSON-API upload). Every test body runs once per emulator
//! (`on_both_emulators!`), each on a fresh container or bucket of the test process's
//! shared emulator, and mirrors the S3 conformance tests (tests/s3.rs, tests/s3_integrity.rs).
//!
//! Emulator differences pinned here (asserted, not assumed):
//! * Azurite refuses a wrong shared key with 403 `AuthorizationFailure` (Azure itself says
//!   `AuthenticationFailed`); fake-gcs-server checks no credentials at all.
//! * fake-gcs-server answers a bare 404 for an object of a missing bucket (GCS says
//!   `NoSuchBucket`): the probe asks the JSON API for the bucket itself.
//! * Azure metadata names are C# identifiers: the checksum is `kvtier_crc32c` there.

#[macro_use]
mod support;

use kvtier_core::store::object_path;
use kvtier_core::{JobKind, LookupResult, Status, Tier};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::{json, Value};
use support::emulators::{Emulator, EmulatorKind, AZURITE_KEY};
use support::proxy::{Fault, Proxy};
use support::*;

const BLOCK: usize = 64 * 1024;

/// Defines each named test body (`fn(&Emulator)`) as two tests: one on the test binary's
/// shared Azurite, one on its shared fake-gcs-server.
macro_rules! on_both_emulators {
    ($($name:ident),* $(,)?) => {
        mod azurite {
            $( #[test] fn $name() { super::$name(super::Emulator::shared_azurite()); } )*
        }
        mod gcs {
            $( #[test] fn $name() { super::$name(super::Emulator::shared_gcs()); } )*
        }
    };
}

/// A fresh container or bucket's `store` section, with few retries: an emulator's error
/// would otherwise be repeated for seconds.
fn fresh_store(emu: &Emulator) -> Value {
    low_retries(emu.new_store_json())
}

fn low_retries(store: Value) -> Value {
    with(
        with(store, "max_retries", json!(1)),
        "connect_timeout_ms",
        json!(2000),
    )
}

fn start(store: Value, extra: Value) -> Tier {
    Tier::from_json(&tier_json(store, extra)).unwrap_or_else(|e| panic!("tier start failed: {e}"))
}

fn start_err(store: Value) -> kvtier_core::Error {
    match Tier::from_json(&tier_json(store, json!({}))) {
        Ok(_) => panic!("the tier started but should have failed"),
        Err(e) => e,
    }
}

fn run(tier: &Tier, kind: JobKind, id: u64, blocks: &[u64], ids: &[u64]) -> kvtier_core::JobResult {
    tier.submit(kind, id, blocks, keys(ids)).unwrap();
    wait_all(tier, 1).remove(&id).unwrap()
}

/// The metadata name the store records the checksum under.
fn crc_name(emu: &Emulator) -> &'static str {
    match emu.kind {
        EmulatorKind::Azurite => kvtier_core::CRC_METADATA_AZURE,
        EmulatorKind::Gcs => kvtier_core::CRC_METADATA,
    }
}

/// The endpoint of `store` with its port replaced by `port` (a proxy, or a closed port).
fn endpoint_on_port(emu: &Emulator, port: u16) -> String {
    emu.endpoint()
        .replace(&format!(":{}", emu.port), &format!(":{port}"))
}

fn assert_no_secret(text: &str) {
    for secret in [AZURITE_KEY, WRONG_AZURE_KEY] {
        assert!(!text.contains(secret), "a secret leaked into: {text}");
    }
}

/// A well-formed shared key that is not Azurite's (base64 of 64 bytes).
const WRONG_AZURE_KEY: &str =
    "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmc=";

// ------------------------------------------------------------------------------------
// Bodies, run once per emulator

fn round_trip_byte_exact(emu: &Emulator) {
    let store = fresh_store(emu);
    let tier = start(store.clone(), json!({}));
    let mut pool = Pool::new(32, BLOCK);
    pool.fill_random(7);
    pool.register(&tier);
    // 16 keys in 4 store jobs of 4 keys, running at once.
    for job in 0..4u64 {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        tier.submit(JobKind::Store, job, &ids, keys(&ids)).unwrap();
    }
    for (id, r) in wait_all(&tier, 4) {
        assert_eq!(r.status, Status::Ok, "store job {id}: {}", r.message);
        assert_eq!(r.key_status, vec![Status::Ok; 4]);
        assert_eq!(r.bytes, 4 * BLOCK as u64);
    }
    // Objects sit under vLLM's key layout, block-sized, their checksum beside them.
    let name = tier.layout().object_name(&key(5)).unwrap();
    assert!(name.starts_with("kv/m_0123456789ab_r0/"), "{name}");
    assert_eq!(
        oob_get(&store, &name).as_deref(),
        Some(pool.block(5)),
        "object bytes differ from the stored block"
    );
    let recorded = block_on(async {
        let got = oob_store(&store)
            .client()
            .get(&object_path(&name))
            .await
            .unwrap();
        got.attributes
            .get(&object_store::Attribute::Metadata(crc_name(emu).into()))
            .map(|v| v.to_string())
    });
    assert_eq!(
        recorded,
        Some(format!("{:08x}", crc32c::crc32c(pool.block(5)))),
        "{:?}",
        emu.kind
    );

    // Load key i into slot 16 + (i * 7) % 16 in 2 jobs of 8 keys: a non-identity mapping.
    let ids: Vec<u64> = (0..16).collect();
    let slots: Vec<u64> = ids.iter().map(|i| 16 + (i * 7) % 16).collect();
    tier.submit(JobKind::Load, 10, &slots[..8], keys(&ids[..8]))
        .unwrap();
    tier.submit(JobKind::Load, 11, &slots[8..], keys(&ids[8..]))
        .unwrap();
    for (id, r) in wait_all(&tier, 2) {
        assert_eq!(r.status, Status::Ok, "load job {id}: {}", r.message);
        assert_eq!(r.key_status, vec![Status::Ok; 8]);
        assert_eq!(r.bytes, 8 * BLOCK as u64);
    }
    for (i, slot) in ids.iter().zip(&slots) {
        assert!(
            pool.block(*i) == pool.block(*slot),
            "block {i} differs after loading into slot {slot}"
        );
    }
    // Lookups on the lookup lane: stored keys HIT, others MISS.
    for k in [0u64, 7, 15] {
        assert_eq!(
            resolve_lookup(&tier, 3, &key(k)),
            LookupResult::Hit,
            "key {k}"
        );
    }
    assert_eq!(resolve_lookup(&tier, 3, &key(99)), LookupResult::Miss);
    assert!(tier.stats().existence_checks >= 4, "{:?}", tier.stats());
}

fn large_blocks_stream_in_pieces(emu: &Emulator) {
    // 1 MiB blocks arrive in several chunks; 2 jobs of 2 keys each way.
    const BIG: usize = 1 << 20;
    let tier = start(fresh_store(emu), json!({}));
    let mut pool = Pool::new(8, BIG);
    pool.fill_random(99);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[1, 2]))
        .unwrap();
    tier.submit(JobKind::Store, 2, &[2, 3], keys(&[3, 4]))
        .unwrap();
    for (id, r) in wait_all(&tier, 2) {
        assert_eq!(r.status, Status::Ok, "store job {id}: {}", r.message);
    }
    tier.submit(JobKind::Load, 3, &[7, 6], keys(&[1, 2]))
        .unwrap();
    tier.submit(JobKind::Load, 4, &[5, 4], keys(&[3, 4]))
        .unwrap();
    for (id, r) in wait_all(&tier, 2) {
        assert_eq!(r.status, Status::Ok, "load job {id}: {}", r.message);
        assert_eq!(r.bytes, 2 * BIG as u64);
    }
    for i in 0..4u64 {
        assert!(
            pool.block(i) == pool.block(7 - i),
            "block {i} differs after a 1 MiB round trip"
        );
    }
}

fn missing_key_fails_alone(emu: &Emulator) {
    let tier = start(fresh_store(emu), json!({}));
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(3);
    pool.register(&tier);
    assert!(run(&tier, JobKind::Store, 1, &[0, 1, 2], &[10, 11, 12]).succeeded());
    let before = pool.block(5).to_vec();
    let r = run(&tier, JobKind::Load, 2, &[4, 5, 6, 7], &[10, 99, 11, 12]);
    assert_eq!(r.status, Status::NotFound, "{}", r.message);
    assert_eq!(
        r.key_status,
        vec![Status::Ok, Status::NotFound, Status::Ok, Status::Ok],
        "{}",
        r.message
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
    assert_eq!(resolve_lookup(&tier, 9, &key(99)), LookupResult::Miss);
    assert_eq!(resolve_lookup(&tier, 9, &key(10)), LookupResult::Hit);
    assert_eq!(tier.stats().existence_check_errors, 0, "{:?}", tier.stats());
}

fn wrong_length_objects_fail_alone(emu: &Emulator) {
    let store = fresh_store(emu);
    let tier = start(store.clone(), json!({}));
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(5);
    pool.register(&tier);
    assert!(run(&tier, JobKind::Store, 1, &[0], &[4]).succeeded());
    // Out of band, with a separate client: one short, one long, one empty object.
    let name = |i| tier.layout().object_name(&key(i)).unwrap();
    oob_put(&store, &name(1), random_bytes(BLOCK - 1, 1));
    oob_put(&store, &name(2), random_bytes(BLOCK + 1, 2));
    oob_put(&store, &name(3), Vec::new());
    let r = run(&tier, JobKind::Load, 2, &[4, 5, 6, 7], &[1, 2, 3, 4]);
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
    // A tier with another block size reads the same object as the wrong length.
    let other = start(store, json!({}));
    let mut big = Pool::new(2, BLOCK * 2);
    big.register(&other);
    assert_eq!(
        run(&other, JobKind::Load, 1, &[1], &[4]).status,
        Status::LengthMismatch
    );
}

/// Rewrites key 2's object out of band, once keeping kvtier's metadata (bit rot: the
/// recorded checksum no longer matches) and once without it (the tier's memory of its
/// own upload does); either way only that key fails, and turns MISS.
fn tampered_object_fails_only_its_key(emu: &Emulator) {
    for keep_metadata in [true, false] {
        let store = fresh_store(emu);
        let tier = start(store.clone(), json!({}));
        let mut pool = Pool::new(8, BLOCK);
        pool.fill_random(9);
        pool.register(&tier);
        assert!(run(&tier, JobKind::Store, 1, &[0, 1, 2], &[1, 2, 3]).succeeded());
        let name = tier.layout().object_name(&key(2)).unwrap();
        block_on(async {
            let s = oob_store(&store).client().clone();
            let path = object_path(&name);
            let got = s.get(&path).await.unwrap();
            let attributes = got.attributes.clone();
            assert!(
                attributes
                    .get(&object_store::Attribute::Metadata(crc_name(emu).into()))
                    .is_some(),
                "no checksum metadata: {attributes:?}"
            );
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
            "{:?} keep_metadata={keep_metadata}: {}",
            emu.kind,
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
        // The object keeps its tampered bytes under `on_corrupt: fail`.
        assert!(oob_get(&store, &name).is_some());
    }
}

/// A fresh tier (no memory of the upload) verifies by the recorded checksum alone.
fn recorded_checksum_alone_catches_bit_rot(emu: &Emulator) {
    let store = fresh_store(emu);
    let mut pool = Pool::new(4, BLOCK);
    pool.fill_random(13);
    let name = {
        let writer = start(store.clone(), json!({}));
        pool.register(&writer);
        assert!(run(&writer, JobKind::Store, 1, &[0, 1], &[5, 6]).succeeded());
        writer.layout().object_name(&key(6)).unwrap()
    };
    block_on(async {
        let s = oob_store(&store).client().clone();
        let path = object_path(&name);
        let got = s.get(&path).await.unwrap();
        let attributes = got.attributes.clone();
        let mut bytes = got.bytes().await.unwrap().to_vec();
        bytes[3] ^= 0x80;
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
    let reader = start(store, json!({}));
    pool.register(&reader);
    let r = run(&reader, JobKind::Load, 2, &[2, 3], &[5, 6]);
    assert_eq!(
        r.key_status,
        vec![Status::Ok, Status::Corrupt],
        "{:?}: {}",
        emu.kind,
        r.message
    );
    assert_eq!(pool.block(2), pool.block(0));
}

fn fail_and_delete_removes_corrupt_object(emu: &Emulator) {
    let store = fresh_store(emu);
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
        "{:?}: corrupt object not deleted",
        emu.kind
    );
    assert!(run(&tier, JobKind::Store, 3, &[0], &[4]).succeeded());
    assert!(run(&tier, JobKind::Load, 4, &[2], &[4]).succeeded());
    assert_eq!(pool.block(2), pool.block(0));
}

/// Two tiers on one container or bucket store the same keys: the store's own conditional
/// create (Azure `If-None-Match: *`, GCS `ifGenerationMatch=0`) keeps the first upload,
/// counted at a proxy in front of the emulator and by the object's ETag.
fn dedup_writes_once_across_tiers(emu: &Emulator) {
    let direct = fresh_store(emu);
    let proxy = Proxy::start(emu.port);
    let store = with(
        direct.clone(),
        "endpoint",
        json!(endpoint_on_port(emu, proxy.port())),
    );
    // "conditional" fails the start unless the probe found the condition honoured.
    let a = start(store.clone(), json!({"dedup": "conditional"}));
    let b = start(store.clone(), json!({"dedup": "conditional"}));
    let puts = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = puts.clone();
    proxy.set_rule(move |req| {
        if req.method == "PUT" {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Fault::Pass
    });
    let mut pa = Pool::new(4, BLOCK);
    pa.fill_random(2);
    pa.register(&a);
    let mut pb = Pool::new(4, BLOCK);
    pb.fill_random(2);
    pb.register(&b);
    assert!(run(&a, JobKind::Store, 1, &[0, 1], &[9, 10]).succeeded());
    let names: Vec<String> = [9, 10]
        .iter()
        .map(|&i| a.layout().object_name(&key(i)).unwrap())
        .collect();
    let etags = || {
        block_on(async {
            let s = oob_store(&direct);
            let mut tags = Vec::new();
            for name in &names {
                tags.push(s.client().head(&object_path(name)).await.unwrap().e_tag);
            }
            tags
        })
    };
    let first = etags();
    assert!(first.iter().all(|t| t.is_some()), "{first:?}");
    let mut job = 1;
    for tier in [&b, &a, &b] {
        for _ in 0..2 {
            job += 1;
            // One job stores each key twice (a shared upload), and repeats come from both tiers.
            assert!(run(tier, JobKind::Store, job, &[0, 1, 0, 1], &[9, 10, 9, 10]).succeeded());
        }
    }
    let sb = b.stats();
    assert_eq!(
        sb.dedup_already_stored, 2,
        "{:?}: b's first store of each key was refused: {sb:?}",
        emu.kind
    );
    let puts = puts.load(std::sync::atomic::Ordering::SeqCst);
    // a's two uploads, and b's two creates refused by the store.
    assert_eq!(puts, 2 + sb.dedup_already_stored, "{:?}: {sb:?}", emu.kind);
    assert_eq!(etags(), first, "{:?}: an object was rewritten", emu.kind);
    assert_eq!(oob_get(&direct, &names[0]).as_deref(), Some(pa.block(0)));
}

fn tier_restarts_on_the_same_store(emu: &Emulator) {
    // An engine restart: a second tier finds what the first stored, and the start-up
    // probes (conditional-create object included) leave nothing that breaks the next one.
    let store = fresh_store(emu);
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(31);
    {
        let tier = start(store.clone(), json!({}));
        pool.register(&tier);
        assert!(run(&tier, JobKind::Store, 1, &[0, 1, 2], &[1, 2, 3]).succeeded());
    }
    for restart in 0..2u64 {
        let tier = Tier::from_json(&tier_json(store.clone(), json!({"dedup": "conditional"})))
            .unwrap_or_else(|e| panic!("restart {restart} failed: {e}"));
        pool.register(&tier);
        let r = run(&tier, JobKind::Load, 2, &[5, 6, 7], &[1, 2, 3]);
        assert_eq!(r.status, Status::Ok, "{}", r.message);
        assert!(
            pool.block(5) == pool.block(0)
                && pool.block(6) == pool.block(1)
                && pool.block(7) == pool.block(2)
        );
        pool.mem[5 * BLOCK..8 * BLOCK].fill(0);
    }
    // Only the blocks are left under the prefix: the probe objects were deleted.
    let listed = block_on(async {
        use futures::TryStreamExt;
        let s = oob_store(&store);
        let listed: Vec<_> = s
            .client()
            .list(Some(&Path::from("kv")))
            .try_collect()
            .await
            .unwrap();
        listed
            .into_iter()
            .map(|m| m.location.to_string())
            .collect::<Vec<_>>()
    });
    assert_eq!(listed.len(), 3, "{:?}: {listed:?}", emu.kind);
}

/// A namespace vLLM builds from a model name with non-ASCII letters (`modèle`): stores,
/// lookups and loads name the same object, under its name encoded once.
fn non_ascii_names_round_trip(emu: &Emulator) {
    let store = fresh_store(emu);
    let config =
        json!({"store": store, "prefix": "kv", "namespace": "modèle_0123456789ab_r0"}).to_string();
    let tier = Tier::from_json(&config).unwrap_or_else(|e| panic!("tier start failed: {e}"));
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(60);
    pool.register(&tier);
    assert!(run(&tier, JobKind::Store, 1, &[0, 1], &[700, 701]).succeeded());
    let name = tier.layout().object_name(&key(700)).unwrap();
    assert!(name.starts_with("kv/modèle_0123456789ab_r0/"), "{name}");
    assert_eq!(
        oob_get(&store, &name).as_deref(),
        Some(pool.block(0)),
        "object not under its name"
    );
    assert_eq!(resolve_lookup(&tier, 3, &key(701)), LookupResult::Hit);
    assert_eq!(resolve_lookup(&tier, 3, &key(799)), LookupResult::Miss);
    let r = run(&tier, JobKind::Load, 2, &[4, 5], &[700, 701]);
    assert_eq!(r.key_status, vec![Status::Ok; 2], "{}", r.message);
    assert!(pool.block(4) == pool.block(0) && pool.block(5) == pool.block(1));
}

fn probe_reports_missing_container_or_bucket(emu: &Emulator) {
    let (key, word) = match emu.kind {
        EmulatorKind::Azurite => ("container", "store.container"),
        EmulatorKind::Gcs => ("bucket", "store.bucket"),
    };
    let store = low_retries(emu.store_json("kvt-no-such-store"));
    let started = std::time::Instant::now();
    let e = start_err(store.clone());
    assert_eq!(e.status, Status::BucketNotFound, "{}", e.message);
    assert!(
        e.message.contains("kvt-no-such-store"),
        "names the {key}: {}",
        e.message
    );
    assert!(
        e.message.contains(&format!("create it or fix {word}")),
        "{}",
        e.message
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_no_secret(&e.message);
    assert_eq!(store[key], "kvt-no-such-store");
}

fn probe_unreachable_endpoint_is_connect(emu: &Emulator) {
    let port = free_port(); // nobody listens here
    let store = with(
        fresh_store(emu),
        "endpoint",
        json!(endpoint_on_port(emu, port)),
    );
    let e = start_err(with(store, "max_retries", json!(0)));
    assert_eq!(e.status, Status::Connect, "{}", e.message);
    assert!(
        e.message.contains("unreachable") && e.message.contains("store.endpoint"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains(&format!("127.0.0.1:{port}")),
        "names the endpoint: {}",
        e.message
    );
    assert_no_secret(&e.message);
}

fn probe_https_to_a_plain_port_is_tls(emu: &Emulator) {
    let store = fresh_store(emu);
    let https = emu.endpoint().replacen("http://", "https://", 1);
    let e = start_err(with(
        with(store.clone(), "endpoint", json!(https)),
        "max_retries",
        json!(0),
    ));
    assert_eq!(e.status, Status::Tls, "{}", e.message);
    assert!(
        e.message.contains("does not speak TLS") && e.message.contains("store.endpoint"),
        "{}",
        e.message
    );
    assert_no_secret(&e.message);
    // A ca_bundle that is not PEM is a configuration error naming the file.
    let bogus = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bogus.path(), b"not a certificate").unwrap();
    let e = start_err(with(
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

/// Wrong credentials: Azurite refuses a wrong shared key; fake-gcs-server checks none, so
/// there a service-account file that cannot be read is the failure that names its key.
fn probe_with_wrong_credentials(emu: &Emulator) {
    match emu.kind {
        EmulatorKind::Azurite => {
            let store = with(fresh_store(emu), "access_key", json!(WRONG_AZURE_KEY));
            let e = start_err(store);
            assert!(
                matches!(e.status, Status::Auth | Status::PermissionDenied),
                "{:?}: {}",
                e.status,
                e.message
            );
            assert!(
                e.message.contains("store.access_key or store.sas"),
                "advice names the keys: {}",
                e.message
            );
            assert!(
                e.message.contains("AuthorizationFailure"),
                "keeps the server's code: {}",
                e.message
            );
            assert_no_secret(&e.message);
            // A key that is not base64 is a configuration error, without the key.
            let e = start_err(with(
                fresh_store(emu),
                "access_key",
                json!("not base64 secret-ZZ7!"),
            ));
            assert_eq!(e.status, Status::Config, "{}", e.message);
            assert!(!e.message.contains("secret-ZZ7"), "{}", e.message);
            // A SAS that signs nothing Azurite knows: refused, its signature never shown.
            let mut store = fresh_store(emu);
            store.as_object_mut().unwrap().remove("access_key");
            let sas = "sv=2023-11-03&ss=b&srt=sco&sp=rwdl&se=2099-01-01T00:00:00Z&sig=c2FzLXNpZ25hdHVyZS12YWx1ZQ%3D%3D";
            let e = start_err(with(store, "sas", json!(sas)));
            assert!(
                matches!(e.status, Status::Auth | Status::PermissionDenied),
                "{:?}: {}",
                e.status,
                e.message
            );
            assert!(
                e.message.contains("credentials from store.sas"),
                "{}",
                e.message
            );
            for form in ["c2FzLXNpZ25hdHVyZS12YWx1ZQ", "sig="] {
                assert!(
                    !e.message.contains(form),
                    "the SAS leaked ({form}): {}",
                    e.message
                );
            }
        }
        EmulatorKind::Gcs => {
            let store = with(
                fresh_store(emu),
                "service_account",
                json!("/nonexistent/kvtier-sa.json"),
            );
            let e = start_err(store);
            assert_eq!(e.status, Status::Config, "{}", e.message);
            assert!(
                e.message.contains("/nonexistent/kvtier-sa.json"),
                "{}",
                e.message
            );
        }
    }
}

fn exists_helper(emu: &Emulator) {
    let store = fresh_store(emu);
    oob_put(&store, "kv/present.bin", vec![1, 2, 3]);
    block_on(async {
        let s = oob_store(&store);
        assert!(s
            .exists(&Path::from("kv/present.bin"), false)
            .await
            .unwrap());
        assert!(!s.exists(&Path::from("kv/absent.bin"), false).await.unwrap());
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

on_both_emulators!(
    round_trip_byte_exact,
    large_blocks_stream_in_pieces,
    missing_key_fails_alone,
    wrong_length_objects_fail_alone,
    tampered_object_fails_only_its_key,
    recorded_checksum_alone_catches_bit_rot,
    fail_and_delete_removes_corrupt_object,
    dedup_writes_once_across_tiers,
    tier_restarts_on_the_same_store,
    non_ascii_names_round_trip,
    probe_reports_missing_container_or_bucket,
    probe_unreachable_endpoint_is_connect,
    probe_https_to_a_plain_port_is_tls,
    probe_with_wrong_credentials,
    exists_helper,
);
