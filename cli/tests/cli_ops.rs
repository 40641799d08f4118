//! The operator subcommands (`probe`, `ls`, `du`, `gc`, `verify`) run as processes, the
//! built `kvtier` binary, against a local directory and against a real S3 server
//! (s3s-fs). Objects are written through the library as a store job writes them
//! (checksum recorded beside the bytes); ages are set on the files that hold them (the
//! local store's, and s3s-fs's own data root), so no test waits for time to pass.
//! Also `kvtier bench` on s3s-fs with a proxy in its environment.

#[macro_use]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use kvtier_core::key::KeyLayout;
use kvtier_core::store::object_path;
use serde_json::{json, Value};
use support::proxy::Proxy;
use support::*;

const NS_A: &str = "m_0123456789ab_r0";
const NS_B: &str = "m_ba9876543210_r1";
const BLOCK: usize = 4096;

/// Where the objects live: a local directory, or a bucket of a real s3s-fs.
enum Backend {
    Local(tempfile::TempDir),
    S3 { server: Server, bucket: String },
}

impl Backend {
    fn local() -> Backend {
        Backend::Local(tempfile::tempdir().unwrap())
    }

    fn s3s_fs() -> Backend {
        let server = Server::s3s_fs();
        let bucket = server.new_bucket();
        Backend::S3 { server, bucket }
    }

    /// The `store` section of a configuration.
    fn store(&self) -> Value {
        match self {
            Backend::Local(dir) => json!({"type": "local", "path": dir.path()}),
            Backend::S3 { server, bucket } => server.store_json(bucket),
        }
    }

    /// A tier configuration with the `kv` prefix and `namespace`.
    fn config(&self, namespace: &str) -> String {
        json!({"store": self.store(), "prefix": "kv", "namespace": namespace}).to_string()
    }

    /// The file holding object `name`: the local store's own, or the one s3s-fs keeps.
    fn file(&self, name: &str) -> PathBuf {
        match self {
            Backend::Local(dir) => dir.path().join(name),
            Backend::S3 { server, bucket } => server.root().unwrap().join(bucket).join(name),
        }
    }

    /// Whether object `name` exists, asked through the store.
    fn exists(&self, name: &str) -> bool {
        oob_get(&self.store(), name).is_some()
    }

    /// Writes blocks `ids` of `namespace` (under `kv`) as a store job would, each
    /// `bytes` long, and returns their object names in the order of `ids`.
    fn put_blocks(&self, namespace: &str, ids: &[u64], bytes: usize) -> Vec<String> {
        put_blocks_in(&self.store(), namespace, ids, bytes)
    }

    /// Makes object `name` look `age` old: its file's modification time.
    fn set_age(&self, name: &str, age: Duration) {
        let file = std::fs::File::options()
            .write(true)
            .open(self.file(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        file.set_modified(SystemTime::now() - age).unwrap();
    }
}

/// Writes blocks `ids` of `namespace` (under `kv`) into `store` as a store job would,
/// each `bytes` long, and returns their object names in the order of `ids`.
fn put_blocks_in(store: &Value, namespace: &str, ids: &[u64], bytes: usize) -> Vec<String> {
    let layout = KeyLayout::new("kv", namespace).unwrap();
    let names: Vec<String> = ids
        .iter()
        .map(|&i| layout.object_name(&key(i)).unwrap())
        .collect();
    block_on(async {
        let s = oob_store(store);
        for (name, &i) in names.iter().zip(ids) {
            s.put_block(&object_path(name), random_bytes(bytes, i).into())
                .await
                .unwrap();
        }
    });
    names
}

/// Runs the built `kvtier` with `args`.
fn kvtier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(args)
        .output()
        .expect("the kvtier binary runs")
}

/// Runs `kvtier SUBCOMMAND --config CONFIG ARGS…`.
fn kvtier_with(sub: &str, config: &str, args: &[&str]) -> Output {
    let mut all = vec![sub, "--config", config];
    all.extend_from_slice(args);
    kvtier(&all)
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// The one JSON document on stdout.
fn json_of(out: &Output) -> Value {
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
            stdout(out),
            stderr(out)
        )
    })
}

/// Runs `sub` with `--json`, expects exit status `code`, and returns the parsed output.
fn json_run(sub: &str, config: &str, args: &[&str], code: i32) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = kvtier_with(sub, config, &all);
    assert_eq!(
        out.status.code(),
        Some(code),
        "kvtier {sub} {args:?}\nstdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    json_of(&out)
}

/// Names in a JSON array of objects with a `name` field, sorted.
fn names_in(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

fn sorted(names: &[String]) -> Vec<String> {
    let mut v = names.to_vec();
    v.sort();
    v
}

/// The check of a `probe --json` report with this id.
fn check<'a>(report: &'a Value, id: &str) -> &'a Value {
    report
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {report}"))
}

/// A test for each backend.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod local {
            $( #[test] fn $name() { super::$name(&super::Backend::local()); } )*
        }
        mod s3s_fs {
            $( #[test] fn $name() { super::$name(&super::Backend::s3s_fs()); } )*
        }
    };
}

on_both_backends!(
    probe_passes_every_check_and_leaves_nothing_behind,
    ls_and_du_sum_each_namespace_and_the_total,
    gc_older_than_deletes_exactly_the_old_objects_and_dry_run_none,
    gc_max_bytes_deletes_the_oldest_first_in_one_namespace_only,
    gc_older_than_zero_empties_a_prefix_and_nothing_else,
    verify_finds_the_corrupt_object_and_deletes_it_on_request,
    verify_reports_a_wrong_length_and_samples,
    verify_tells_undecryptable_objects_from_corrupt_ones,
);

// ------------------------------------------------------------------------------------
// probe

fn probe_passes_every_check_and_leaves_nothing_behind(b: &Backend) {
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

/// `kvtier bench` on `config` (8 blocks of 64 KiB stored, loaded and verified), with
/// `env` added to its environment; its JSON report.
fn bench_report(config: &str, env: &[(&str, String)]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["bench", "--json", "--config", config, "--blocks", "8"])
        .args(["--block-size", "64K", "--workload", "store,load,verify"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("the kvtier binary runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let report = json_of(&out);
    assert_eq!(report["verified_blocks"], 8, "{report}");
    report
}

#[test]
fn a_proxy_in_the_environment_carries_every_request() {
    // The project's proxy in front of s3s-fs, named only by the environment: the network
    // of a host whose store is reachable through a proxy alone.
    let server = Server::s3s_fs();
    let proxy = Proxy::start(server.port());
    let config = json!({"store": server.store_json(&server.new_bucket())}).to_string();
    // Without it, the direct path carries the blocks, straight to the server.
    let report = bench_report(&config, &[]);
    assert!(
        report["direct_requests"].as_u64().unwrap() >= 16,
        "{report}"
    );
    assert_eq!(proxy.stats().requests, 0);
    // With it, every request goes through the proxy, none on the direct path.
    for variable in ["HTTP_PROXY", "all_proxy"] {
        let before = proxy.stats().requests;
        let report = bench_report(
            &config,
            &[(variable, format!("http://{}", proxy.endpoint()))],
        );
        assert_eq!(report["direct_requests"], 0, "{variable}: {report}");
        let through = proxy.stats().requests - before;
        assert!(
            through >= 16,
            "{variable}: {through} requests through the proxy"
        );
    }
}

#[test]
fn probe_of_a_missing_bucket_fails_with_the_fix() {
    let server = Server::s3s_fs();
    let store = with(server.store_json("no-such-bucket"), "max_retries", json!(0));
    let config = json!({"store": store, "prefix": "kv", "namespace": NS_A}).to_string();
    let report = json_run("probe", &config, &[], 1);
    assert_eq!(check(&report, "endpoint")["ok"], true, "{report}");
    assert_eq!(check(&report, "credentials")["ok"], true, "{report}");
    let bucket = check(&report, "bucket");
    assert_eq!(bucket["ok"], false, "{report}");
    assert_eq!(bucket["fatal"], true, "{report}");
    assert!(
        bucket["detail"]
            .as_str()
            .unwrap()
            .contains("create it or fix store.bucket"),
        "{report}"
    );
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

#[test]
fn probe_of_an_unreachable_endpoint_fails() {
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

#[test]
fn probe_verifies_tls_against_the_ca_bundle_and_says_how_to_fix_it() {
    let server = Server::moto_tls(std::sync::Arc::new(Tls::generate()));
    let bucket = server.new_bucket();
    let trusted = server.store_json(&bucket);
    assert!(trusted["ca_bundle"].is_string());
    let config = json!({"store": trusted, "prefix": "kv", "namespace": NS_A}).to_string();
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
    let config = json!({"store": untrusted, "prefix": "kv", "namespace": NS_A}).to_string();
    let report = json_run("probe", &config, &[], 1);
    let tls = check(&report, "tls");
    assert_eq!(tls["ok"], false, "{report}");
    assert_eq!(tls["fatal"], true, "{report}");
    assert!(
        tls["detail"]
            .as_str()
            .unwrap()
            .contains("set store.ca_bundle"),
        "{report}"
    );
    assert_eq!(check(&report, "conditional_put")["skipped"], true);
}

#[test]
fn probe_without_a_store_is_a_usage_error() {
    let out = kvtier(&["probe"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--config"), "{}", stderr(&out));
}

// ------------------------------------------------------------------------------------
// ls and du

fn ls_and_du_sum_each_namespace_and_the_total(b: &Backend) {
    let a = b.put_blocks(NS_A, &[1, 2, 3], BLOCK);
    b.put_blocks(NS_B, &[4, 5], 2 * BLOCK);
    // Outside the prefix, and the library's probe leftover: neither counts.
    oob_put(&b.store(), "other/x.bin", vec![1; 10]);
    oob_put(
        &b.store(),
        &format!("kv/{NS_A}/__kvtier_probe__/connectivity_test-conditional-put"),
        b"kvtier".to_vec(),
    );
    b.set_age(&a[0], Duration::from_secs(3 * 3600));
    let config = b.config(NS_A);
    let listing = json_run("ls", &config, &[], 0);
    assert_eq!(listing["prefix"], "kv");
    let namespaces = listing["namespaces"].as_array().unwrap();
    assert_eq!(namespaces.len(), 2, "{listing}");
    assert_eq!(namespaces[0]["namespace"], NS_A);
    assert_eq!(namespaces[0]["objects"], 3);
    assert_eq!(namespaces[0]["bytes"], 3 * BLOCK);
    assert_eq!(namespaces[1]["namespace"], NS_B);
    assert_eq!(namespaces[1]["objects"], 2);
    assert_eq!(namespaces[1]["bytes"], 4 * BLOCK);
    assert_eq!(listing["total"]["objects"], 5);
    assert_eq!(listing["total"]["bytes"], 7 * BLOCK);
    // The aged object is the oldest, hours before the newest.
    let time = |v: &Value| humantime::parse_rfc3339(v.as_str().unwrap()).unwrap();
    let (oldest, newest) = (
        time(&namespaces[0]["oldest"]),
        time(&namespaces[0]["newest"]),
    );
    let gap = newest.duration_since(oldest).unwrap();
    assert!(gap > Duration::from_secs(2 * 3600), "{listing}");
    assert_eq!(listing["total"]["oldest"], namespaces[0]["oldest"]);

    // The whole store: `kv` and `other` are its namespaces.
    let whole = json_run("ls", &config, &["--prefix", ""], 0);
    let names: Vec<&str> = whole["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kv", "other"], "{whole}");
    assert_eq!(whole["total"]["objects"], 6);

    // du: the same numbers, as sizes; -b for exact bytes.
    let du = json_run("du", &config, &[], 0);
    assert_eq!(du["total"], listing["total"]);
    let out = kvtier_with("du", &config, &["-b"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with(&format!("{}  ", 7 * BLOCK))
                && l.ends_with("total under kv/")),
        "{text}"
    );
    let out = kvtier_with("ls", &config, &[]);
    let text = stdout(&out);
    assert!(text.starts_with("NAMESPACE"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("TOTAL") && l.contains(&(7 * BLOCK).to_string())),
        "{text}"
    );
}

// ------------------------------------------------------------------------------------
// gc

fn gc_older_than_deletes_exactly_the_old_objects_and_dry_run_none(b: &Backend) {
    let names = b.put_blocks(NS_A, &[1, 2, 3, 4, 5, 6, 7], BLOCK);
    let (old, new) = names.split_at(4);
    for name in old {
        b.set_age(name, Duration::from_secs(3 * 3600));
    }
    let config = b.config(NS_A);

    let dry = json_run("gc", &config, &["--older-than", "2h", "--dry-run"], 0);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["listed_objects"], 7);
    assert_eq!(dry["selected_objects"], 4, "{dry}");
    assert_eq!(dry["deleted_objects"], 0);
    assert_eq!(names_in(&dry["objects"]), sorted(old));
    assert!(dry["objects"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["reason"] == "age"));
    assert!(names.iter().all(|n| b.exists(n)), "a dry run deleted");

    let out = kvtier_with("gc", &config, &["--older-than", "2h", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Deleted in batches (s3s-fs takes DeleteObjects), not one by one after a refusal.
    assert!(!stderr(&out).contains("refused"), "{}", stderr(&out));
    let done = json_of(&out);
    assert_eq!(done["deleted_objects"], 4, "{done}");
    assert_eq!(done["deleted_bytes"], 4 * BLOCK);
    assert_eq!(done["remaining_objects"], 3);
    assert_eq!(done["failed"], json!([]));
    for name in old {
        assert!(!b.exists(name), "{name} was kept");
    }
    for name in new {
        assert!(b.exists(name), "{name} was deleted");
    }
    // Again: nothing left that old.
    let again = json_run("gc", &config, &["--older-than", "2h"], 0);
    assert_eq!(again["deleted_objects"], 0);
    assert_eq!(again["listed_objects"], 3);
}

/// A crash between a block's write and its rename leaves a temporary file beside the
/// blocks; gc deletes those an hour old (never a younger one, which may be a running
/// engine's write in progress) and no object that its limits keep.
#[test]
fn gc_deletes_temporary_files_of_writes_that_never_finished() {
    let b = Backend::local();
    let names = b.put_blocks(NS_A, &[1, 2, 3], BLOCK);
    let shard = std::path::Path::new(&names[0]).parent().unwrap();
    let old = shard
        .join(".kvtier-tmp-7-18c2f3a1b2c3d4e5-0-0")
        .display()
        .to_string();
    let young = shard
        .join(".kvtier-tmp-7-18c2f3a1b2c3d4e5-0-1")
        .display()
        .to_string();
    for temp in [&old, &young] {
        std::fs::write(b.file(temp), vec![1u8; 100]).unwrap();
    }
    b.set_age(&old, Duration::from_secs(2 * 3600));
    b.set_age(&young, Duration::from_secs(10 * 60));
    let config = b.config(NS_A);

    let dry = json_run("gc", &config, &["--older-than", "7d", "--dry-run"], 0);
    assert_eq!(
        names_in(&dry["leftover_temporary_files"]),
        vec![old.clone()]
    );
    assert_eq!(dry["deleted_leftover_temporary_files"], 0);
    assert!(b.file(&old).exists(), "a dry run deleted");

    let done = json_run("gc", &config, &["--older-than", "7d"], 0);
    assert_eq!(done["deleted_objects"], 0, "{done}");
    assert_eq!(done["deleted_leftover_temporary_files"], 1, "{done}");
    assert_eq!(done["leftover_temporary_files"][0]["deleted"], true);
    assert!(!b.file(&old).exists(), "the old temporary file was kept");
    assert!(
        b.file(&young).exists(),
        "a temporary file under an hour old was deleted"
    );
    assert!(names.iter().all(|n| b.exists(n)), "a block was deleted");
    // Temporary files are never counted as the tier's objects.
    assert_eq!(done["listed_objects"], 3);
}

fn gc_max_bytes_deletes_the_oldest_first_in_one_namespace_only(b: &Backend) {
    let names = b.put_blocks(NS_A, &[1, 2, 3, 4, 5], BLOCK);
    // names[0] is the oldest (5 h), names[4] the newest (1 h).
    for (i, name) in names.iter().enumerate() {
        b.set_age(name, Duration::from_secs((5 - i as u64) * 3600));
    }
    let other = b.put_blocks(NS_B, &[6, 7], BLOCK);
    for name in &other {
        b.set_age(name, Duration::from_secs(10 * 3600));
    }
    // The configuration names NS_B; --namespace picks NS_A.
    let config = b.config(NS_B);
    let done = json_run(
        "gc",
        &config,
        &["--namespace", NS_A, "--max-bytes", &(2 * BLOCK).to_string()],
        0,
    );
    assert_eq!(done["scope"], format!("kv/{NS_A}"));
    assert_eq!(done["deleted_objects"], 3, "{done}");
    assert_eq!(done["remaining_bytes"], 2 * BLOCK);
    let reasons: Vec<&str> = done["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["budget"; 3]);
    // Oldest first, in the order they were listed for deletion.
    let chosen: Vec<&str> = done["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(chosen, [&names[0], &names[1], &names[2]]);
    for name in &names[..3] {
        assert!(!b.exists(name), "{name} was kept");
    }
    for name in names[3..].iter().chain(&other) {
        assert!(b.exists(name), "{name} was deleted");
    }
    // "4K" is read as 4096 bytes: one block stays.
    let done = json_run(
        "gc",
        &config,
        &["--namespace", NS_A, "--max-bytes", "4K"],
        0,
    );
    assert_eq!(done["deleted_objects"], 1);
    assert!(!b.exists(&names[3]) && b.exists(&names[4]));
}

fn gc_older_than_zero_empties_a_prefix_and_nothing_else(b: &Backend) {
    let a = b.put_blocks(NS_A, &[1, 2], BLOCK);
    let bb = b.put_blocks(NS_B, &[3], BLOCK);
    oob_put(&b.store(), "other/x.bin", vec![1; 10]);
    let config = b.config(NS_A);
    // Without a limit, gc refuses to run.
    let out = kvtier_with("gc", &config, &["--prefix", "kv"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(b.exists(&a[0]));

    let out = kvtier_with("gc", &config, &["--prefix", "kv", "--older-than", "0s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("deleted 3 objects"),
        "{}",
        stdout(&out)
    );
    for name in a.iter().chain(&bb) {
        assert!(!b.exists(name), "{name} was kept");
    }
    assert!(b.exists("other/x.bin"), "gc went outside its prefix");
    let listing = json_run("ls", &config, &[], 0);
    assert_eq!(listing["total"]["objects"], 0, "{listing}");
}

#[test]
fn gc_refuses_bad_limits() {
    let b = Backend::local();
    let config = b.config(NS_A);
    for (args, option) in [
        (&["--older-than", "7"][..], "--older-than"),
        (&["--max-bytes", "lots"], "--max-bytes"),
        (&["--before", "yesterday"], "--before"),
    ] {
        let out = kvtier_with("gc", &config, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(option), "{args:?}: {}", stderr(&out));
    }
    // A configuration without prefix and namespace would mean the whole store.
    let bare = json!({"store": b.store()}).to_string();
    let out = kvtier_with("gc", &bare, &["--older-than", "0s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--prefix ''"), "{}", stderr(&out));
}

// ------------------------------------------------------------------------------------
// verify

/// Flips one byte in the middle of the file that holds `name`; its length and recorded
/// checksum stay as they were.
fn corrupt(b: &Backend, name: &str) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(b.file(name))
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, 1000).unwrap();
    byte[0] ^= 0x40;
    file.write_all_at(&byte, 1000).unwrap();
}

fn verify_finds_the_corrupt_object_and_deletes_it_on_request(b: &Backend) {
    let names = b.put_blocks(NS_A, &[1, 2, 3, 4, 5, 6], BLOCK);
    let config = b.config(NS_A);
    let clean = json_run("verify", &config, &[], 0);
    assert_eq!(clean["read"], 6);
    assert_eq!(clean["good"], 6, "{clean}");
    assert_eq!(clean["without_checksum"], 0);

    corrupt(b, &names[2]);
    let found = json_run("verify", &config, &[], 1);
    assert_eq!(found["good"], 5, "{found}");
    assert_eq!(names_in(&found["corrupt"]), [names[2].clone()]);
    assert_eq!(found["corrupt"][0]["reason"], "checksum");
    assert_eq!(found["corrupt"][0]["deleted"], false);
    assert!(b.exists(&names[2]), "verify alone deleted");

    let out = kvtier_with("verify", &config, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out)
            .lines()
            .any(|l| l.starts_with("CORRUPT") && l.contains(&names[2])),
        "{}",
        stdout(&out)
    );

    let deleted = json_run("verify", &config, &["--delete"], 1);
    assert_eq!(deleted["corrupt"][0]["deleted"], true, "{deleted}");
    assert!(!b.exists(&names[2]), "the corrupt object stayed");
    for (i, name) in names.iter().enumerate() {
        if i != 2 {
            assert!(b.exists(name), "{name} was deleted");
        }
    }
    let after = json_run("verify", &config, &[], 0);
    assert_eq!(after["good"], 5, "{after}");
    assert_eq!(after["corrupt"], json!([]));
}

fn verify_reports_a_wrong_length_and_samples(b: &Backend) {
    let names = b.put_blocks(NS_A, &[1, 2, 3, 4, 5, 6, 7, 8], BLOCK);
    // One object shorter than the namespace's blocks, with a matching checksum.
    let short = b.put_blocks(NS_A, &[9], BLOCK / 2);
    let config = b.config(NS_A);
    let report = json_run("verify", &config, &[], 1);
    assert_eq!(report["namespaces"][0]["block_bytes"], BLOCK);
    assert_eq!(names_in(&report["corrupt"]), short);
    assert_eq!(report["corrupt"][0]["reason"], "length");
    assert_eq!(report["good"], 8);

    // A sample reads only N objects; lengths are still checked from the listing.
    let sample = json_run("verify", &config, &["--sample", "3"], 1);
    assert_eq!(sample["listed"], 9);
    assert_eq!(sample["read"], 3, "{sample}");
    assert_eq!(names_in(&sample["corrupt"]), short);

    // With the short object deleted, a sample of the clean namespace passes.
    let deleted = json_run("verify", &config, &["--delete"], 1);
    assert_eq!(deleted["corrupt"][0]["deleted"], true, "{deleted}");
    assert!(!b.exists(&short[0]));
    assert!(names.iter().all(|n| b.exists(n)));
    let clean = json_run("verify", &config, &["--sample", "2"], 0);
    assert_eq!(clean["read"], 2);
    assert_eq!(clean["corrupt"], json!([]));
}

/// Encrypted blocks: one corrupted at rest (its recorded checksum fails), one tampered
/// with and rewritten without a checksum, one overwritten with another block's object:
/// verify with the keyring reports the first as corrupt and the other two apart, as
/// undecryptable, and deletes only the corrupt one; without the keyring it sees no
/// undecryptable objects (it cannot tell).
fn verify_tells_undecryptable_objects_from_corrupt_ones(b: &Backend) {
    use kvtier_core::{JobKind, Tier};
    let ring_dir = tempfile::tempdir().unwrap();
    let ring = ring_dir.path().join("keyring.json");
    std::fs::write(
        &ring,
        r#"{"write": "v1", "keys": {"v1": "MDEyMzQ1Njc4OWFiY2RlZmdoaWprbG1ub3BxcnN0dXY="}}"#,
    )
    .unwrap();
    let mut with_keys: Value = serde_json::from_str(&b.config(NS_A)).unwrap();
    with_keys["encryption"] = json!({"keyring_file": ring});
    let with_keys = with_keys.to_string();
    let block = 100_000;
    let tier = Tier::from_json(&with_keys).unwrap();
    let mut pool = Pool::new(4, block);
    pool.fill_random(11);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2, 3], keys(&[1, 2, 3, 4]))
        .unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    drop(tier);
    let layout = KeyLayout::new("kv", NS_A).unwrap();
    let names: Vec<String> = (1..=4)
        .map(|i| layout.object_name(&key(i)).unwrap())
        .collect();
    let clean = json_run("verify", &with_keys, &[], 0);
    assert_eq!(
        (clean["good"].as_u64(), clean["read"].as_u64()),
        (Some(4), Some(4)),
        "{clean}"
    );

    corrupt(b, &names[0]);
    let mut tampered = oob_get(&b.store(), &names[1]).unwrap();
    tampered[5000] ^= 0x01;
    oob_put(&b.store(), &names[1], tampered);
    oob_put(
        &b.store(),
        &names[2],
        oob_get(&b.store(), &names[3]).unwrap(),
    );

    let found = json_run("verify", &with_keys, &[], 1);
    assert_eq!(found["good"], 1, "{found}");
    assert_eq!(names_in(&found["corrupt"]), [names[0].clone()], "{found}");
    assert_eq!(
        names_in(&found["undecryptable"]),
        sorted(&names[1..3]),
        "{found}"
    );
    let out = kvtier_with("verify", &with_keys, &[]);
    let undecryptable_lines = stdout(&out)
        .lines()
        .filter(|l| l.starts_with("UNDECRYPTABLE") && l.contains("failed authentication"))
        .count();
    assert_eq!(undecryptable_lines, 2, "{}", stdout(&out));

    let deleted = json_run("verify", &with_keys, &["--delete"], 1);
    assert_eq!(deleted["corrupt"][0]["deleted"], true, "{deleted}");
    assert!(!b.exists(&names[0]));
    assert!(
        names[1..].iter().all(|n| b.exists(n)),
        "an undecryptable object was deleted"
    );

    // Without keys: lengths and checksums only.
    let without_keys = json_run("verify", &b.config(NS_A), &[], 0);
    assert_eq!(without_keys["undecryptable"], json!([]), "{without_keys}");
    assert_eq!(without_keys["read"], 3);
}

// ------------------------------------------------------------------------------------
// On each S3 server (s3s-fs, moto, Ceph RGW): probe's failing checks, gc while a tier
// loads, verify of an object corrupted at rest

mod servers {
    use super::*;
    use kvtier_core::{JobKind, LookupResult, Status, Tier};
    use object_store::ObjectStoreExt;

    on_both_servers!(
        probe_names_the_failing_check,
        probe_names_an_untrusted_ca,
        gc_max_bytes_under_budget_while_a_tier_loads,
        verify_finds_an_object_corrupted_at_rest,
    );

    fn config_of(store: Value) -> String {
        json!({"store": store, "prefix": "kv", "namespace": NS_A}).to_string()
    }

    fn assert_no_secret(text: &str, srv: &Server) {
        for secret in [SECRET_KEY, srv.secret_key.as_str(), "wrong-secret-ZZ93kq"] {
            assert!(!text.contains(secret), "a secret leaked into: {text}");
        }
    }

    fn probe_names_the_failing_check(srv: &Server) {
        let bucket = srv.new_bucket();
        let report = json_run("probe", &config_of(srv.store_json(&bucket)), &[], 0);
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
        let out = kvtier_with("probe", &config_of(wrong.clone()), &["--json"]);
        assert_no_secret(&stdout(&out), srv);
        assert_no_secret(&stderr(&out), srv);
        if srv.checks_signatures() {
            assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
            let report = json_of(&out);
            assert_eq!(check(&report, "endpoint")["ok"], true, "{report}");
            let credentials = check(&report, "credentials");
            assert_eq!(credentials["ok"], false, "{report}");
            assert_eq!(credentials["fatal"], true, "{report}");
            let detail = credentials["detail"].as_str().unwrap();
            assert!(
                detail.contains("store.access_key/store.secret_key"),
                "{report}"
            );
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
        let report = json_run("probe", &config_of(missing), &[], 1);
        assert_eq!(check(&report, "credentials")["ok"], true, "{report}");
        let b = check(&report, "bucket");
        assert_eq!(
            (&b["ok"], &b["fatal"]),
            (&json!(false), &json!(true)),
            "{report}"
        );
        assert!(
            b["detail"].as_str().unwrap().contains("store.bucket"),
            "{report}"
        );
    }

    /// The server behind a TLS-terminating relay whose certificate comes from the test CA:
    /// with that CA in `store.ca_bundle` every check passes; without it the TLS check fails,
    /// fatal, saying to set `store.ca_bundle`.
    fn probe_names_an_untrusted_ca(srv: &Server) {
        let tls = Tls::generate();
        let relay = support::tls_relay::TlsRelay::terminating(srv.port(), &tls.cert, &tls.key);
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
        let report = json_run("probe", &config_of(trusted), &[], 0);
        for id in ["tls", "credentials", "bucket", "put_get_delete"] {
            assert_eq!(check(&report, id)["ok"], true, "{}: {report}", srv.name());
        }

        let report = json_run("probe", &config_of(store), &[], 1);
        let check_tls = check(&report, "tls");
        assert_eq!(
            (&check_tls["ok"], &check_tls["fatal"]),
            (&json!(false), &json!(true)),
            "{}: {report}",
            srv.name()
        );
        assert!(
            check_tls["detail"]
                .as_str()
                .unwrap()
                .contains("set store.ca_bundle"),
            "{report}"
        );
    }

    /// `kvtier gc --max-bytes` runs while a tier loads every key of the namespace over and
    /// over: each load of a key returns its exact bytes or fails alone as NotFound with
    /// the slot untouched; afterwards the deleted keys (and only they) fail and turn MISS,
    /// and the namespace is under the budget.
    fn gc_max_bytes_under_budget_while_a_tier_loads(srv: &Server) {
        const N: u64 = 24;
        let bucket = srv.new_bucket();
        let config = config_of(srv.store_json(&bucket));
        let tier = Tier::from_json(&config).unwrap();
        let mut pool = Pool::new(2 * N, BLOCK);
        pool.fill_random(41);
        pool.register(&tier);
        let ids: Vec<u64> = (0..N).collect();
        let stored: Vec<u64> = (0..N).collect();
        tier.submit(JobKind::Store, 1, &stored, keys(&ids)).unwrap();
        let r = wait_all(&tier, 1).remove(&1).unwrap();
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
                    tier.submit(JobKind::Load, job, &targets, keys(&ids))
                        .unwrap();
                    let r = wait_all(&tier, 1).remove(&job).unwrap();
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
        let config = config_of(store.clone());
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
        let config = config_of(store);

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
}
