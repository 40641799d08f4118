//! `kvtier probe`: every check passing and leaving nothing behind, a missing bucket, an
//! unreachable endpoint, TLS with and without the CA, and no store at all.

use serde_json::json;

use crate::backend::*;
use crate::support::cli::*;
use crate::support::*;

pub fn probe_passes_every_check_and_leaves_nothing_behind(b: &Backend) {
    let config = b.config(NS_A);
    let report = json_run("probe", &config, &[], 0);
    for id in [
        "missing_key",
        "put_get_delete",
        "conditional_put",
        "checksum_metadata",
        "latency",
    ] {
        assert_eq!(check(&report, id)["ok"], true, "{id}: {report}");
    }
    assert!(check(&report, "latency")["detail"]
        .as_str()
        .unwrap()
        .contains("median"));
    match b {
        Backend::Local(_) => assert_eq!(check(&report, "directory")["ok"], true),
        Backend::S3 { .. } => {
            for id in ["endpoint", "credentials", "bucket"] {
                assert_eq!(check(&report, id)["ok"], true, "{id}: {report}");
            }
            // s3s-fs serves plain http.
            assert_eq!(check(&report, "tls")["skipped"], true, "{report}");
        }
    }
    // Text: one line per check, and the verdict.
    let out = kvtier_with("probe", &config, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("probe of "), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("OK    put/get/delete allowed")),
        "{text}"
    );
    assert!(!text.contains("FAIL"), "{text}");
    assert_eq!(lines.last(), Some(&"a tier would start"), "{text}");
    // The probe's objects are not the tier's: nothing to list.
    let listing = json_run("ls", &config, &[], 0);
    assert_eq!(listing["total"]["objects"], 0, "{listing}");
}

pub fn probe_of_a_missing_bucket_fails_with_the_fix() {
    let server = Server::s3s_fs();
    let store = with(server.store_json("no-such-bucket"), "max_retries", json!(0));
    let config = config_of(store, NS_A);
    let report = json_run("probe", &config, &[], 1);
    assert_eq!(check(&report, "endpoint")["ok"], true, "{report}");
    assert_eq!(check(&report, "credentials")["ok"], true, "{report}");
    assert_fatal(&report, "bucket", "create it or fix store.bucket");
    // The checks that need the bucket are skipped, not failed.
    assert_eq!(
        check(&report, "put_get_delete")["skipped"],
        true,
        "{report}"
    );
    let out = kvtier_with("probe", &config, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out)
            .lines()
            .any(|l| l.starts_with("FAIL  bucket exists:")),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("a tier would not start"),
        "{}",
        stderr(&out)
    );
}

pub fn probe_of_an_unreachable_endpoint_fails() {
    // A port nothing listens on.
    let store = json!({
        "type": "s3",
        "bucket": "kv",
        "endpoint_override": format!("127.0.0.1:{}", free_port()),
        "scheme": "http",
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": "us-east-1",
        "connect_timeout_ms": 2000,
        "request_timeout_ms": 5000,
        "max_retries": 0,
    });
    let config = json!({"store": store}).to_string();
    let report = json_run("probe", &config, &[], 1);
    let endpoint = check(&report, "endpoint");
    assert_eq!(endpoint["ok"], false, "{report}");
    assert!(
        endpoint["detail"]
            .as_str()
            .unwrap()
            .contains("endpoint is unreachable"),
        "{report}"
    );
    assert_eq!(check(&report, "latency")["skipped"], true, "{report}");
}

pub fn probe_verifies_tls_against_the_ca_bundle_and_says_how_to_fix_it() {
    let server = Server::moto_tls(std::sync::Arc::new(Tls::generate()));
    let bucket = server.new_bucket();
    let trusted = server.store_json(&bucket);
    assert!(trusted["ca_bundle"].is_string());
    let config = config_of(trusted, NS_A);
    let report = json_run("probe", &config, &[], 0);
    let tls = check(&report, "tls");
    assert_eq!(tls["ok"], true, "{report}");
    assert!(
        tls["detail"].as_str().unwrap().contains("store.ca_bundle"),
        "{report}"
    );

    // Without the CA: the system roots do not know the server's issuer.
    let mut untrusted = server.store_json(&bucket);
    untrusted.as_object_mut().unwrap().remove("ca_bundle");
    let untrusted = with(untrusted, "max_retries", json!(0));
    let config = config_of(untrusted, NS_A);
    let report = json_run("probe", &config, &[], 1);
    assert_fatal(&report, "tls", "set store.ca_bundle");
    assert_eq!(check(&report, "conditional_put")["skipped"], true);
}

pub fn probe_without_a_store_is_a_usage_error() {
    let out = kvtier(&["probe"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--config"), "{}", stderr(&out));
}
