//! A failed request's status comes from what the store answered (its HTTP status and its
//! error code, from an `x-ms-error-code` header or an XML `<Error><Code>`), read where the
//! response is seen: real s3s-fs answers, and answers the test proxy gives in the server's
//! place, through the general client and the direct path alike.

#[macro_use]
mod support;

use bytes::Bytes;
use kvtier_core::store::{object_path, ProbeOutcome, Store};
use kvtier_core::{JobKind, Status};
use serde_json::{json, Value};
use support::proxy::{Fault, Proxy};
use support::*;

const BLOCK: usize = 16 * 1024;

/// A fresh s3s-fs with a bucket, and the `store` section of it through a proxy.
fn behind_a_proxy(srv: &Server, extra: Value) -> (Proxy, Value) {
    let bucket = srv.new_bucket();
    let proxy = Proxy::start(srv.port());
    let mut store = with(
        srv.store_json(&bucket),
        "endpoint_override",
        json!(proxy.endpoint()),
    );
    for (k, v) in extra.as_object().unwrap() {
        store[k] = v.clone();
    }
    (proxy, store)
}

/// Every request with `method` gets `status` with `code` in an XML error body.
fn answer(
    method: &'static str,
    status: u16,
    code: &'static str,
) -> impl Fn(&support::proxy::RequestInfo) -> Fault {
    move |r| {
        if r.method == method {
            Fault::Answer {
                status,
                code,
                in_header: false,
            }
        } else {
            Fault::Pass
        }
    }
}

/// The status `check_object` of `name` fails with.
fn status_of_get(store: &Value, name: &str) -> Status {
    block_on(async {
        let s = oob_store(store);
        s.check_object(&object_path(name))
            .await
            .expect_err("the GET must fail")
            .status
    })
}

#[test]
fn real_answers_tell_a_missing_bucket_from_a_missing_key() {
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    assert_eq!(status_of_get(&store, "kv/absent"), Status::NotFound);
    // s3s-fs answers a GET in a missing bucket NoSuchKey: the probe's listing settles it.
    let gone = with(store, "bucket", json!("kvtier-no-such-bucket"));
    let probed = block_on(async {
        oob_store(&gone)
            .probe("kv/__kvtier_probe__/connectivity_test")
            .await
    });
    let e = probed.expect_err("a missing bucket fails the probe");
    assert_eq!(e.status, Status::BucketNotFound, "{}", e.message);
}

#[test]
fn the_error_code_decides_where_the_http_status_alone_cannot() {
    let srv = Server::s3s_fs();
    let (proxy, store) = behind_a_proxy(&srv, json!({"max_retries": 0}));
    for (status, code, expected) in [
        (404, "NoSuchKey", Status::NotFound),
        (404, "NoSuchBucket", Status::BucketNotFound),
        (403, "AccessDenied", Status::PermissionDenied),
        (403, "SignatureDoesNotMatch", Status::Auth),
        (400, "ExpiredToken", Status::Auth),
        (400, "RequestTimeout", Status::Timeout),
        (416, "InvalidRange", Status::LengthMismatch),
        (404, "ContainerNotFound", Status::BucketNotFound),
        (403, "AuthenticationFailed", Status::Auth),
        // Codes that settle nothing: the HTTP status (as object_store reads it) decides.
        (404, "SomethingElse", Status::NotFound),
        (403, "SomethingElse", Status::PermissionDenied),
        (400, "InvalidArgument", Status::Io),
    ] {
        proxy.set_rule(answer("GET", status, code));
        assert_eq!(
            status_of_get(&store, "kv/x"),
            expected,
            "HTTP {status} {code}"
        );
    }
}

#[test]
fn an_error_code_in_a_header_alone_is_read() {
    // Azure answers a HEAD with no body: the code is in x-ms-error-code only.
    let srv = Server::s3s_fs();
    let (proxy, store) = behind_a_proxy(&srv, json!({"max_retries": 0, "direct_http": false}));
    let exists = |store: &Value| {
        block_on(async { oob_store(store).exists(&object_path("kv/x"), false).await })
    };
    proxy.set_rule(|r| match r.method.as_str() {
        "HEAD" => Fault::Answer {
            status: 404,
            code: "ContainerNotFound",
            in_header: true,
        },
        _ => Fault::Pass,
    });
    let e = exists(&store).expect_err("a missing container is no answer about the key");
    assert_eq!(e.status, Status::BucketNotFound, "{}", e.message);
    proxy.set_rule(|r| match r.method.as_str() {
        "HEAD" => Fault::Answer {
            status: 404,
            code: "BlobNotFound",
            in_header: true,
        },
        _ => Fault::Pass,
    });
    assert!(!exists(&store).unwrap(), "a missing blob is absent");
}

#[test]
fn a_body_refused_as_damaged_is_sent_again_by_its_code() {
    let srv = Server::s3s_fs();
    let (proxy, store) = behind_a_proxy(&srv, json!({"max_retries": 2}));
    proxy.set_rule(answer("PUT", 400, "BadDigest"));
    let e = block_on(async {
        oob_store(&store)
            .put_block(&object_path("kv/a"), Bytes::from_static(b"block"))
            .await
    })
    .expect_err("every attempt is refused");
    assert!(e.message.contains("BadDigest"), "{}", e.message);
    let puts = *proxy.stats().by_method.get("PUT").unwrap_or(&0);
    assert_eq!(puts, 3, "the first attempt and two repeats");

    // Another 400 is final: no repeat.
    proxy.set_rule(answer("PUT", 400, "InvalidArgument"));
    let before = *proxy.stats().by_method.get("PUT").unwrap_or(&0);
    let e = block_on(async {
        oob_store(&store)
            .put_block(&object_path("kv/b"), Bytes::from_static(b"block"))
            .await
    })
    .expect_err("refused");
    assert_eq!(e.status, Status::Io, "{}", e.message);
    let puts = *proxy.stats().by_method.get("PUT").unwrap_or(&0);
    assert_eq!(puts - before, 1);
}

/// A 409 (a conflicting write in flight, which may never complete) fails the store, on the
/// direct path and on the general client (which reads a 409 as "already exists"): a block
/// is never reported stored on it.
#[test]
fn a_conflict_fails_a_store() {
    let srv = Server::s3s_fs();
    for direct in [true, false] {
        let (proxy, store) = behind_a_proxy(&srv, json!({"max_retries": 0, "direct_http": direct}));
        proxy.set_rule(answer("PUT", 409, "OperationAborted"));
        let e = block_on(async {
            oob_store(&store)
                .put_block(&object_path("kv/c"), Bytes::from_static(b"block"))
                .await
        })
        .expect_err("a conflict is no store");
        assert!(e.message.contains("409"), "direct {direct}: {}", e.message);
        proxy.set_rule(|_| Fault::Pass);
        assert!(
            !block_on(async { oob_store(&store).exists(&object_path("kv/c"), false).await })
                .unwrap(),
            "direct {direct}: nothing was stored"
        );
    }
}

#[test]
fn the_probe_reads_access_denied_from_the_code() {
    let srv = Server::s3s_fs();
    let (proxy, store) = behind_a_proxy(&srv, json!({"max_retries": 0}));
    let probe = |store: &Value| {
        block_on(async {
            oob_store(store)
                .probe("kv/__kvtier_probe__/connectivity_test")
                .await
        })
    };
    // A missing key answered 403 AccessDenied: a principal without ListBucket.
    proxy.set_rule(|r| match r.method.as_str() {
        "HEAD" | "GET" => Fault::Answer {
            status: 403,
            code: "AccessDenied",
            in_header: false,
        },
        _ => Fault::Pass,
    });
    assert_eq!(probe(&store).unwrap(), ProbeOutcome::ReadyWithoutList);
    // A 403 with another code is refused credentials, whatever the status says.
    proxy.set_rule(|r| match r.method.as_str() {
        "HEAD" | "GET" => Fault::Answer {
            status: 403,
            code: "InvalidAccessKeyId",
            in_header: false,
        },
        _ => Fault::Pass,
    });
    let e = probe(&store).expect_err("refused credentials fail the probe");
    assert_eq!(e.status, Status::Auth, "{}", e.message);
    assert!(e.message.contains("(InvalidAccessKeyId)"), "{}", e.message);
}

#[test]
fn the_direct_path_reads_its_answers_as_the_client_does() {
    let srv = Server::s3s_fs();
    let (proxy, store) = behind_a_proxy(&srv, json!({"max_retries": 0}));
    let tier = kvtier_core::Tier::from_json(&tier_json(store, json!({})))
        .unwrap_or_else(|e| panic!("tier start: {e}"));
    let mut pool = Pool::new(2, BLOCK);
    pool.register(&tier);
    for (id, code, expected) in [
        (1, "NoSuchKey", Status::NotFound),
        (2, "NoSuchBucket", Status::BucketNotFound),
    ] {
        proxy.set_rule(answer("GET", 404, code));
        let before = tier.stats().direct_requests;
        tier.submit(JobKind::Load, id, &[0], keys(&[id])).unwrap();
        let r = wait_all(&tier, 1).remove(&id).unwrap();
        assert_eq!(r.key_status, vec![expected], "{code}: {}", r.message);
        let stats = tier.stats();
        assert_eq!(
            (stats.direct_requests - before, stats.direct_fallbacks),
            (1, 0),
            "{code}: answered on the direct path, {stats:?}"
        );
    }
}

#[test]
fn deletes_of_many_objects_say_which_failed() {
    let srv = Server::s3s_fs();
    let (proxy, store) = behind_a_proxy(&srv, json!({"max_retries": 0}));
    let names: Vec<String> = (0..5).map(|i| format!("kv/ns/o{i}")).collect();
    block_on(async {
        let s: Store = oob_store(&store);
        for name in &names[..4] {
            s.write_object(&object_path(name), Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        // Batches: every name is gone (kv/ns/o4 never existed).
        let outcomes = s.delete_objects(&names).await;
        let asked: Vec<&str> = outcomes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(asked, names.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(outcomes.iter().all(|(_, r)| r.is_ok()), "{outcomes:?}");
        assert_eq!(names_under(&s, "kv/ns").await, Vec::<String>::new());

        // A batch refused whole (403 to the first DeleteObjects): each object is then
        // deleted alone, and from then on.
        for name in &names[..3] {
            s.write_object(&object_path(name), Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        let refused_first = std::sync::atomic::AtomicBool::new(false);
        proxy.set_rule(move |r| {
            if r.method == "POST" && !refused_first.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                Fault::Answer {
                    status: 403,
                    code: "AccessDenied",
                    in_header: false,
                }
            } else {
                Fault::Pass
            }
        });
        let posts = || *proxy.stats().by_method.get("POST").unwrap_or(&0);
        let before = posts();
        let outcomes = s.delete_objects(&names[..3]).await;
        assert!(outcomes.iter().all(|(_, r)| r.is_ok()), "{outcomes:?}");
        assert_eq!(
            posts() - before,
            1 + 3,
            "the refused batch, then one per object"
        );
        assert_eq!(names_under(&s, "kv/ns").await, Vec::<String>::new());

        // Each object refused: each failure names its object, with the store's status.
        s.write_object(&object_path(&names[0]), Bytes::from_static(b"x"))
            .await
            .unwrap();
        proxy.set_rule(answer("POST", 403, "AccessDenied"));
        let outcomes = s.delete_objects(&names[..2]).await;
        let failed: Vec<(&str, Status)> = outcomes
            .iter()
            .filter_map(|(n, r)| r.as_ref().err().map(|e| (n.as_str(), e.status)))
            .collect();
        assert_eq!(
            failed,
            vec![
                ("kv/ns/o0", Status::PermissionDenied),
                ("kv/ns/o1", Status::PermissionDenied)
            ],
            "{outcomes:?}"
        );
        assert_eq!(names_under(&s, "kv/ns").await, vec!["kv/ns/o0"]);
    });
}

/// The names under `prefix`, sorted.
async fn names_under(store: &Store, prefix: &str) -> Vec<String> {
    use futures::TryStreamExt;
    let mut names: Vec<String> = store
        .list(prefix)
        .map_ok(|o| o.name)
        .try_collect()
        .await
        .expect("listing");
    names.sort();
    names
}

/// A store without multipart uploads answers their start 501 NotImplemented. Sending it
/// again would get the same answer, so it is not repeated: the tier knows the store for
/// one without them at its first answer (it used to repeat it for the whole retry budget),
/// stores the block as one PUT, and sends no upload again. Both blocks load byte-exact.
#[test]
fn a_store_without_multipart_uploads_is_known_at_its_first_answer() {
    const LARGE: usize = 24 << 20;
    let srv = Server::s3s_fs();
    let (proxy, store) = behind_a_proxy(
        &srv,
        json!({"store_part_bytes": 8 << 20, "retry_budget_ms": 60_000}),
    );
    proxy.set_rule(|r| {
        if r.method == "POST" && r.path.contains("uploads") {
            Fault::Answer {
                status: 501,
                code: "NotImplemented",
                in_header: false,
            }
        } else {
            Fault::Pass
        }
    });
    let mut pool = Pool::new(4, LARGE);
    pool.fill_random(41);
    let tier = kvtier_core::Tier::from_json(&tier_json(store.clone(), json!({"checksums": true})))
        .unwrap();
    pool.register(&tier);
    for (job, slot) in [(1, 0), (2, 1)] {
        tier.submit(JobKind::Store, job, &[slot], keys(&[slot]))
            .unwrap();
        let r = wait_all(&tier, 1).remove(&job).unwrap();
        assert!(r.succeeded(), "store {job}: {}", r.message);
        // Every upload start gets the rule's answer (the probe's own POSTs pass).
        let upload_starts = proxy.stats().faults("answer");
        assert_eq!(
            upload_starts, 1,
            "after store {job}: one refused upload start, neither repeated nor tried again"
        );
    }
    tier.submit(JobKind::Load, 3, &[2, 3], keys(&[0, 1]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&3).unwrap();
    assert!(r.succeeded(), "{}", r.message);
    assert!(
        pool.block(2) == pool.block(0),
        "the first block read back other bytes"
    );
    assert!(
        pool.block(3) == pool.block(1),
        "the second block read back other bytes"
    );
}
