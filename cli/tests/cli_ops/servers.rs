//! On each S3 server (s3s-fs, moto, Ceph RGW): probe's failing checks, gc while a tier
//! loads, verify of an object corrupted at rest; on RGW, a principal without
//! s3:ListBucket.

use kvtier_core::{JobKind, LookupResult, Status, Tier};
use object_store::ObjectStoreExt;
use serde_json::json;

use crate::backend::*;
use crate::support::cli::*;
use crate::support::*;

on_both_servers!(
    probe_names_the_failing_check,
    probe_names_an_untrusted_ca,
    gc_max_bytes_under_budget_while_a_tier_loads,
    verify_finds_an_object_corrupted_at_rest,
);

fn assert_no_secret(text: &str, srv: &Server) {
    for secret in [SECRET_KEY, srv.secret_key.as_str(), "wrong-secret-ZZ93kq"] {
        assert!(!text.contains(secret), "a secret leaked into: {text}");
    }
}

fn probe_names_the_failing_check(srv: &Server) {
    let bucket = srv.new_bucket();
    let report = json_run("probe", &config_of(srv.store_json(&bucket), NS_A), &[], 0);
    for id in [
        "endpoint",
        "credentials",
        "bucket",
        "missing_key",
        "put_get_delete",
    ] {
        assert_eq!(check(&report, id)["ok"], true, "{}: {report}", srv.name());
    }

    // A wrong secret: the credentials check fails, naming where they came from.
    let wrong = with(
        with(
            srv.store_json(&bucket),
            "secret_key",
            json!("wrong-secret-ZZ93kq"),
        ),
        "max_retries",
        json!(0),
    );
    let out = kvtier_with("probe", &config_of(wrong.clone(), NS_A), &["--json"]);
    assert_no_secret(&stdout(&out), srv);
    assert_no_secret(&stderr(&out), srv);
    if srv.checks_signatures() {
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let report = json_of(&out);
        assert_eq!(check(&report, "endpoint")["ok"], true, "{report}");
        assert_fatal(&report, "credentials", "store.access_key/store.secret_key");
    } else {
        // moto checks no signatures: the probe passes, as a tier would start.
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }

    // A missing bucket: the bucket check fails with the fix.
    let missing = with(
        srv.store_json("kvtier-no-such-bucket"),
        "max_retries",
        json!(0),
    );
    let report = json_run("probe", &config_of(missing, NS_A), &[], 1);
    assert_eq!(check(&report, "credentials")["ok"], true, "{report}");
    assert_fatal(&report, "bucket", "store.bucket");
}

/// The server behind a TLS-terminating relay whose certificate comes from the test CA:
/// with that CA in `store.ca_bundle` every check passes; without it the TLS check fails,
/// fatal, saying to set `store.ca_bundle`.
fn probe_names_an_untrusted_ca(srv: &Server) {
    let tls = Tls::generate();
    let relay = crate::support::tls_relay::TlsRelay::terminating(srv.port(), &tls.cert, &tls.key);
    let bucket = srv.new_bucket();
    let mut store = with(
        srv.store_json(&bucket),
        "endpoint_override",
        json!(relay.endpoint()),
    );
    store["scheme"] = json!("https");
    store["max_retries"] = json!(0);
    let mut trusted = store.clone();
    trusted["ca_bundle"] = json!(tls.ca.display().to_string());
    let report = json_run("probe", &config_of(trusted, NS_A), &[], 0);
    for id in ["tls", "credentials", "bucket", "put_get_delete"] {
        assert_eq!(check(&report, id)["ok"], true, "{}: {report}", srv.name());
    }

    let report = json_run("probe", &config_of(store, NS_A), &[], 1);
    assert_fatal(&report, "tls", "set store.ca_bundle");
}

/// `kvtier gc --max-bytes` runs while a tier loads every key of the namespace over and
/// over: each load of a key returns its exact bytes or fails alone as NotFound with
/// the slot untouched; afterwards the deleted keys (and only they) fail and turn MISS,
/// and the namespace is under the budget.
fn gc_max_bytes_under_budget_while_a_tier_loads(srv: &Server) {
    const N: u64 = 24;
    let bucket = srv.new_bucket();
    let config = config_of(srv.store_json(&bucket), NS_A);
    let tier = Tier::from_json(&config).unwrap();
    let mut pool = Pool::random_registered(&tier, 2 * N, BLOCK, 41);
    let ids: Vec<u64> = (0..N).collect();
    let stored: Vec<u64> = (0..N).collect();
    let r = run_job(&tier, JobKind::Store, 1, &stored, &ids);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    let originals: Vec<Vec<u8>> = (0..N).map(|i| pool.block(i).to_vec()).collect();
    let budget = N / 2 * BLOCK as u64;

    let gc_finished = std::sync::atomic::AtomicBool::new(false);
    let (rounds, missing) = std::thread::scope(|scope| {
        let loader = scope.spawn(|| {
            let targets: Vec<u64> = (N..2 * N).collect();
            let mut rounds = 0u64;
            loop {
                // Read before the round: the last round starts after gc finished.
                let last = gc_finished.load(std::sync::atomic::Ordering::SeqCst);
                pool.mem[N as usize * BLOCK..].fill(0);
                let job = 100 + rounds;
                let r = run_job(&tier, JobKind::Load, job, &targets, &ids);
                let mut missing = Vec::new();
                for (i, status) in r.key_status.iter().enumerate() {
                    let slot = pool.block(N + i as u64);
                    match status {
                        Status::Ok => assert!(
                            slot == &originals[i][..],
                            "round {rounds}: key {i} loaded wrong bytes"
                        ),
                        Status::NotFound => {
                            assert!(
                                slot.iter().all(|&b| b == 0),
                                "round {rounds}: key {i} failed but its slot was written"
                            );
                            missing.push(i as u64);
                        }
                        other => panic!("round {rounds}: key {i}: {other:?}: {}", r.message),
                    }
                }
                rounds += 1;
                if last {
                    return (rounds, missing);
                }
            }
        });
        let budget_text = budget.to_string();
        let done = json_run("gc", &config, &["--max-bytes", &budget_text], 0);
        gc_finished.store(true, std::sync::atomic::Ordering::SeqCst);
        let joined = loader.join().unwrap();
        assert_eq!(done["deleted_objects"], N - N / 2, "{done}");
        assert!(
            done["remaining_bytes"].as_u64().unwrap() <= budget,
            "{done}"
        );
        joined
    });
    assert!(rounds >= 1);
    assert_eq!(missing.len() as u64, N - N / 2, "after gc: {missing:?}");
    // The namespace is under budget: a second gc finds nothing to delete.
    let again = json_run(
        "gc",
        &config,
        &["--max-bytes", &budget.to_string(), "--dry-run"],
        0,
    );
    assert_eq!(again["selected_objects"], 0, "{again}");
    // A new request: the deleted keys are MISS, the others HIT.
    for i in 0..N {
        let want = if missing.contains(&i) {
            LookupResult::Miss
        } else {
            LookupResult::Hit
        };
        assert_eq!(resolve_lookup(&tier, 9_000 + i, &key(i)), want, "key {i}");
    }
}

fn verify_finds_an_object_corrupted_at_rest(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let names = put_blocks_in(&store, NS_A, &[1, 2, 3, 4], BLOCK);
    let config = config_of(store.clone(), NS_A);
    assert_eq!(json_run("verify", &config, &[], 0)["good"], 4);
    // Rewritten with one bit flipped and the original metadata (recorded checksum).
    block_on(async {
        let s = oob_store(&store).client().clone();
        let path = object_store::path::Path::from(names[1].as_str());
        let got = s.get(&path).await.unwrap();
        let attributes = got.attributes.clone();
        let mut bytes = got.bytes().await.unwrap().to_vec();
        bytes[BLOCK / 3] ^= 0x08;
        let options = object_store::PutOptions {
            attributes,
            ..Default::default()
        };
        s.put_opts(&path, bytes.into(), options).await.unwrap();
    });
    let found = json_run("verify", &config, &[], 1);
    assert_eq!(found["good"], 3, "{found}");
    assert_eq!(names_in(&found["corrupt"]), [names[1].clone()], "{found}");
    assert_eq!(found["corrupt"][0]["reason"], "checksum", "{found}");
}

/// A real principal without s3:ListBucket (an RGW user granted object access by a
/// bucket policy): the probe passes, and says missing keys answer 403 and why. Granted
/// s3:DeleteObject on the objects alone, its deletes (object_store sends multi-object
/// deletes, which RGW checks on the bucket) are refused: the probe says how to grant it.
#[test]
fn rgw_probe_of_a_principal_without_list_bucket() {
    let srv = Server::shared_rgw();
    let bucket = srv.new_bucket();
    let grant = |resources: Vec<String>| {
        let policy = json!({
            "Version": "2012-10-17",
            "Statement": [{
                "Effect": "Allow",
                "Principal": {"AWS": [format!("arn:aws:iam:::user/{RGW_NOLIST_USER}")]},
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": resources,
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
    };
    let mut store = srv.store_json(&bucket);
    store["access_key"] = json!(RGW_NOLIST_ACCESS_KEY);
    store["secret_key"] = json!(RGW_NOLIST_SECRET_KEY);
    let config = config_of(store, NS_A);

    grant(vec![format!("arn:aws:s3:::{bucket}/*")]);
    let report = json_run("probe", &config, &[], 0);
    let missing = check(&report, "missing_key");
    assert_eq!(missing["ok"], true, "{report}");
    assert_eq!(missing["label"], "missing key answers 403", "{report}");
    let detail = missing["detail"].as_str().unwrap();
    assert!(detail.contains("s3:ListBucket"), "{report}");
    let rw = check(&report, "put_get_delete");
    assert_eq!(
        (&rw["ok"], &rw["fatal"]),
        (&json!(false), &json!(false)),
        "{report}"
    );
    let detail = rw["detail"].as_str().unwrap();
    assert!(detail.starts_with("DELETE "), "{report}");
    assert!(detail.contains("arn:aws:s3:::BUCKET"), "{report}");

    grant(vec![
        format!("arn:aws:s3:::{bucket}/*"),
        format!("arn:aws:s3:::{bucket}"),
    ]);
    let report = json_run("probe", &config, &[], 0);
    assert_eq!(
        check(&report, "missing_key")["label"],
        "missing key answers 403"
    );
    assert_eq!(check(&report, "put_get_delete")["ok"], true, "{report}");
}
