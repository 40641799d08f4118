//! `kvtier probe`: checks a store the way a starting tier does, and a little more, one
//! line per check, each `OK` or `FAIL` with what to do about it (or `SKIP`, with why).
//!
//! The first checks (endpoint, TLS, credentials, bucket, what a missing key answers) are
//! the library's own start-up probe, read by the status it classifies the failure as;
//! conditional PUT is the library's own test too. The exit status is 1 exactly when
//! `kvt_tier_new` would fail with this configuration; other failed checks (a store that
//! drops checksum metadata, credentials that may not write) are reported but a tier
//! would still start.

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use kvtier_core::config::{DedupMode, StoreConfig};
use kvtier_core::key::KeyLayout;
use kvtier_core::store::{object_path, ProbeOutcome, Store, UploadCheck, PROBE_SEGMENT};
use kvtier_core::{Status, TierConfig};
use serde_json::json;

use crate::common::{runtime, Failure, StoreArgs};

/// HEAD requests timed for the latency check.
const LATENCY_SAMPLES: usize = 10;

#[derive(Args, Debug, Clone)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ok,
    Fail,
    Skip,
}

/// One line of the report.
#[derive(Debug, Clone)]
struct Check {
    /// Stable name, for `--json` readers.
    id: &'static str,
    /// What was checked, in words.
    label: &'static str,
    state: State,
    detail: String,
    /// A failure here means a tier with this configuration would not start.
    fatal: bool,
}

/// The report, built check by check; once a check fails fatally, the rest are skipped.
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn failed_fatally(&self) -> Option<&Check> {
        self.checks
            .iter()
            .find(|c| c.state == State::Fail && c.fatal)
    }

    fn push(
        &mut self,
        id: &'static str,
        label: &'static str,
        outcome: Result<String, (String, bool)>,
    ) {
        let check = match (self.failed_fatally(), outcome) {
            (Some(failed), _) => Check {
                id,
                label,
                state: State::Skip,
                detail: format!("not checked: {} failed", failed.label),
                fatal: false,
            },
            (None, Ok(detail)) => Check {
                id,
                label,
                state: State::Ok,
                detail,
                fatal: false,
            },
            (None, Err((detail, fatal))) => Check {
                id,
                label,
                state: State::Fail,
                detail,
                fatal,
            },
        };
        self.checks.push(check);
    }

    fn ok(&mut self, id: &'static str, label: &'static str, detail: impl Into<String>) {
        self.push(id, label, Ok(detail.into()));
    }

    /// A failure that stops a tier from starting.
    fn fatal(&mut self, id: &'static str, label: &'static str, detail: impl Into<String>) {
        self.push(id, label, Err((detail.into(), true)));
    }

    fn skip(&mut self, id: &'static str, label: &'static str, why: impl Into<String>) {
        self.checks.push(Check {
            id,
            label,
            state: State::Skip,
            detail: why.into(),
            fatal: false,
        });
    }
}

/// A name under the probe directory, beside the library's own probe objects, unique to
/// this run.
fn scratch_name(probe_name: &str, what: &str) -> String {
    let dir = probe_name.rsplit_once('/').map_or("", |(dir, _)| dir);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("cli-{what}-{}-{nonce}", std::process::id());
    if dir.is_empty() {
        format!("{PROBE_SEGMENT}/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

pub fn run(args: &ProbeArgs) -> Result<(), Failure> {
    let config = args.store.tier_config()?;
    let layout =
        KeyLayout::new(&config.prefix, &config.namespace).map_err(|e| Failure::usage(e.message))?;
    let rt = runtime()?;
    let (describe, report) = rt.block_on(async {
        match crate::common::open_store(&config) {
            Ok(store) => {
                let report = probe(&store, &config, &layout.probe_name()).await;
                (store.describe().to_string(), report)
            }
            Err(failure) => {
                let mut report = Report { checks: Vec::new() };
                report.fatal("client", "store client built", failure.message);
                ("the configured store".to_string(), report)
            }
        }
    });
    if args.store.json() {
        let checks: Vec<_> = report
            .checks
            .iter()
            .map(|c| {
                json!({
                    "check": c.id,
                    "ok": c.state == State::Ok,
                    "skipped": c.state == State::Skip,
                    "fatal": c.fatal,
                    "label": c.label,
                    "detail": c.detail,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(checks));
    } else {
        let base = layout.base();
        println!(
            "probe of {describe}{}",
            if base.is_empty() {
                String::new()
            } else {
                format!(", under {base}/")
            }
        );
        for c in &report.checks {
            let word = match c.state {
                State::Ok => "OK",
                State::Fail => "FAIL",
                State::Skip => "SKIP",
            };
            println!("{word:<4}  {}: {}", c.label, c.detail);
        }
    }
    let other_failures = report
        .checks
        .iter()
        .filter(|c| c.state == State::Fail && !c.fatal)
        .count();
    match report.failed_fatally() {
        Some(failed) => Err(Failure::run(format!(
            "a tier would not start: {} failed",
            failed.label
        ))),
        None => {
            if !args.store.json() {
                match other_failures {
                    0 => println!("a tier would start"),
                    n => println!("a tier would start, but {n} check(s) failed"),
                }
            }
            Ok(())
        }
    }
}

async fn probe(store: &Store, config: &TierConfig, probe_name: &str) -> Report {
    let mut report = Report { checks: Vec::new() };
    // The library's start-up probe.
    let outcome = store.probe(probe_name).await;
    let missing_is_forbidden = matches!(outcome, Ok(ProbeOutcome::ReadyWithoutList));
    match &config.store {
        StoreConfig::S3(s3) => {
            let remote = Remote {
                tls: store.uses_tls(),
                ca_bundle: &s3.ca_bundle,
                credentials: match (s3.access_key.is_empty(), s3.session_token.is_empty()) {
                    (true, _) => "signed requests accepted (credentials from the default chain: environment, profile, web identity or instance role)",
                    (false, true) => "signed requests accepted (credentials from store.access_key/store.secret_key)",
                    (false, false) => "signed requests accepted (temporary credentials from store.access_key/secret_key/session_token)",
                },
                container: format!("bucket {:?}", s3.bucket),
            };
            start_up_checks(&mut report, store, &remote, &outcome)
        }
        StoreConfig::Azure(azure) => {
            let remote = Remote {
                tls: store.uses_tls(),
                ca_bundle: &azure.ca_bundle,
                credentials: "requests accepted (store.access_key, store.sas or the AZURE_* chain)",
                container: format!("container {:?}", azure.container),
            };
            start_up_checks(&mut report, store, &remote, &outcome)
        }
        StoreConfig::Gcs(gcs) => {
            let remote = Remote {
                tls: store.uses_tls(),
                ca_bundle: &gcs.ca_bundle,
                credentials: "requests accepted (store.service_account or the application default credentials)",
                container: format!("bucket {:?}", gcs.bucket),
            };
            start_up_checks(&mut report, store, &remote, &outcome)
        }
        StoreConfig::Local(local) => match &outcome {
            Ok(_) => report.ok(
                "directory",
                "directory writable",
                format!("{} takes new files", local.path.display()),
            ),
            Err(e) => report.fatal("directory", "directory writable", &e.message),
        },
        StoreConfig::Memory(_) => {}
    }
    match &outcome {
        Ok(ProbeOutcome::Ready) => report.ok(
            "missing_key",
            "missing key answers 404",
            "a key that does not exist reads as absent (404 Not Found)",
        ),
        Ok(ProbeOutcome::ReadyWithoutList) => report.ok(
            "missing_key",
            "missing key answers 403",
            "403 AccessDenied for a key that does not exist: the credentials lack s3:ListBucket. \
             A tier starts and reads 403 on existence checks as absent (one HEAD per check); \
             grant s3:ListBucket on the bucket to get plain 404s",
        ),
        Ok(other) => report.ok(
            "missing_key",
            "missing key answers 404",
            format!("the store is ready ({other:?})"),
        ),
        Err(e) if report.failed_fatally().is_none() => {
            report.fatal("missing_key", "missing key answers 404", &e.message)
        }
        Err(_) => report.push("missing_key", "missing key answers 404", Ok(String::new())),
    }
    let scratch = report.failed_fatally().is_none();
    report.push(
        "put_get_delete",
        "put/get/delete allowed",
        put_get_delete(store, probe_name, scratch).await,
    );
    report.push(
        "conditional_put",
        "conditional PUT honoured",
        conditional_put(store, config, probe_name, scratch).await,
    );
    let checksums = checksum_recorded(store, probe_name, scratch).await;
    report.push(
        "checksum_metadata",
        "checksum metadata round-trips",
        checksums,
    );
    report.push(
        "upload_check",
        "damaged uploads refused",
        upload_check(store, config, probe_name, scratch).await,
    );
    report.push(
        "latency",
        "small-request latency",
        latency(store, probe_name, missing_is_forbidden, scratch).await,
    );
    report
}

/// What the start-up checks of a remote store say about its configuration.
struct Remote<'a> {
    tls: bool,
    ca_bundle: &'a str,
    /// The credentials check's OK line.
    credentials: &'static str,
    /// "bucket \"kv\"" or "container \"kv\"".
    container: String,
}

/// Endpoint, TLS, credentials and bucket, from the library probe's outcome: a failure's
/// status says which step failed, and the steps before it passed.
fn start_up_checks(
    report: &mut Report,
    store: &Store,
    remote: &Remote<'_>,
    outcome: &kvtier_core::Result<ProbeOutcome>,
) {
    let failed = outcome.as_ref().err();
    let status = failed.map(|e| e.status);
    let message = failed.map_or("", |e| e.message.as_str());
    let trusted = match remote.ca_bundle {
        "" => "the system roots (store.ca_bundle is not set)".to_string(),
        path => format!("the system roots plus store.ca_bundle {path}"),
    };
    let endpoint_failed = !matches!(
        status,
        None | Some(Status::Tls | Status::Auth | Status::PermissionDenied | Status::BucketNotFound)
    );
    if endpoint_failed {
        report.fatal("endpoint", "endpoint reachable", message);
    } else {
        report.ok(
            "endpoint",
            "endpoint reachable",
            format!("{} answered", store.describe()),
        );
    }
    if !remote.tls {
        report.skip("tls", "TLS verified", "plain http endpoint: no TLS");
    } else if status == Some(Status::Tls) {
        report.fatal("tls", "TLS verified", message);
    } else {
        report.ok(
            "tls",
            "TLS verified",
            format!("the server's certificate chains to {trusted}"),
        );
    }
    if matches!(status, Some(Status::Auth | Status::PermissionDenied)) {
        report.fatal("credentials", "credentials accepted", message);
    } else {
        report.ok("credentials", "credentials accepted", remote.credentials);
    }
    if status == Some(Status::BucketNotFound) {
        report.fatal("bucket", "bucket exists", message);
    } else {
        report.ok(
            "bucket",
            "bucket exists",
            format!("{} answers", remote.container),
        );
    }
}

type Outcome = Result<String, (String, bool)>;

/// A failure that does not stop a tier from starting.
fn problem(detail: String) -> Outcome {
    Err((detail, false))
}

async fn put_get_delete(store: &Store, probe_name: &str, run: bool) -> Outcome {
    if !run {
        return Ok(String::new());
    }
    let name = scratch_name(probe_name, "rw");
    let path = object_path(&name);
    let body: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
    if let Err(e) = store.write_object(&path, Bytes::from(body.clone())).await {
        return problem(format!(
            "PUT {name} failed: {} — stores will fail: the credentials need s3:PutObject on the prefix",
            e.message
        ));
    }
    let read = store.read_object(&path).await;
    let read_problem = match read {
        Ok(bytes) if bytes.as_ref() == body.as_slice() => None,
        Ok(bytes) => Some(format!("GET {name} returned {} bytes that differ from the {} written", bytes.len(), body.len())),
        Err(e) => Some(format!(
            "GET {name} failed: {} — loads will fail: the credentials need s3:GetObject on the prefix",
            e.message
        )),
    };
    let deleted = store.delete(&path).await;
    if let Some(p) = read_problem {
        return problem(p);
    }
    match deleted {
        Ok(()) => Ok(format!("wrote, read back and deleted a {}-byte object ({name})", body.len())),
        Err(e) => problem(format!(
            "DELETE {name} failed: {} — the object stays; gc, eviction and on_corrupt \"fail_and_delete\" need s3:DeleteObject, granted on the bucket itself (arn:aws:s3:::BUCKET) as well as on its objects where the server checks multi-object deletes (POST ?delete) on the bucket, as Ceph RGW does",
            e.message
        )),
    }
}

async fn conditional_put(
    store: &Store,
    config: &TierConfig,
    probe_name: &str,
    run: bool,
) -> Outcome {
    if !run {
        return Ok(String::new());
    }
    let honoured = store.honours_conditional_put(probe_name).await;
    match (honoured, config.dedup) {
        (true, Some(DedupMode::Conditional) | None) => {
            Ok("a second create of one object was refused (412): dedup \"conditional\" (If-None-Match: *) is used".into())
        }
        (true, Some(_)) => Ok("a second create of one object was refused (412); the configuration sets dedup itself".into()),
        (false, Some(DedupMode::Conditional)) => Err((
            format!(
                "{} does not refuse a second create (If-None-Match: *), and the configuration asks for dedup \"conditional\": \
                 use \"skip_known\"",
                store.describe()
            ),
            true,
        )),
        (false, None) => problem(
            "a second create of one object was not refused (If-None-Match: * ignored, or PUT denied): dedup falls back \
             to \"skip_known\", so a block another replica stored may be uploaded again"
                .into(),
        ),
        (false, Some(_)) => problem(
            "a second create of one object was not refused; the configuration does not use conditional dedup".into(),
        ),
    }
}

/// Whether the server refuses an upload whose body was damaged in transit.
async fn upload_check(store: &Store, config: &TierConfig, probe_name: &str, run: bool) -> Outcome {
    if !run {
        return Ok(String::new());
    }
    let signed = matches!(&config.store, StoreConfig::S3(s3) if s3.payload_signing);
    match store.checks_uploads(probe_name).await {
        UploadCheck::Verified => Ok(format!(
            "a PUT whose body was damaged on the way was refused ({}): such an upload is sent again, never stored",
            if signed { "payload_signing: the body's SHA-256" } else { "the body's checksum, x-amz-checksum-crc64nvme" }
        )),
        UploadCheck::NotVerified => problem(
            "a PUT whose body was damaged on the way was stored: this server verifies neither the request's checksum \
             nor its payload hash, so a block damaged in transit is stored and found only by a later load's CRC32C \
             check (the key then fails Corrupt and answers MISS)"
                .into(),
        ),
        UploadCheck::NoNetwork => Ok("no network between tier and store".into()),
        UploadCheck::HeaderRefused(answer) => Err((
            format!(
                "the server refuses a PUT that carries x-amz-checksum-crc64nvme ({answer}): if it does not support \
                 S3's additional checksums, set store.req_checksum to \"required\""
            ),
            true,
        )),
        other => problem(format!("the upload check answered {other:?}")),
    }
}

/// A block written as a store job writes it comes back with its checksum recorded
/// (object metadata; an extended attribute on the local store).
async fn checksum_recorded(store: &Store, probe_name: &str, run: bool) -> Outcome {
    if !run {
        return Ok(String::new());
    }
    let name = scratch_name(probe_name, "crc");
    let path = object_path(&name);
    let body = Bytes::from_static(b"kvtier checksum metadata probe");
    if let Err(e) = store.put_block(&path, body).await {
        return problem(format!("writing {name} as a block failed: {}", e.message));
    }
    let checked = store.check_object(&path).await;
    let _ = store.delete(&path).await;
    match checked {
        Ok(c) if c.recorded == Some(c.computed) => {
            Ok("a block's checksum came back as written: loads verify every byte".to_string())
        }
        Ok(c) if c.recorded.is_some() => problem(format!(
            "the recorded checksum came back as {:08x}, not {:08x}: loads would fail as corrupt",
            c.recorded.unwrap_or_default(),
            c.computed
        )),
        Ok(_) => problem(
            "the store dropped the recorded checksum (object metadata, or the extended attribute \
             user.kvtier.crc32c on a local directory): blocks load with the length check only"
                .to_string(),
        ),
        Err(e) => problem(format!("reading {name} back failed: {}", e.message)),
    }
}

async fn latency(
    store: &Store,
    probe_name: &str,
    missing_is_forbidden: bool,
    run: bool,
) -> Outcome {
    if !run {
        return Ok(String::new());
    }
    let path = object_path(probe_name);
    let mut times = Vec::with_capacity(LATENCY_SAMPLES);
    for _ in 0..LATENCY_SAMPLES {
        let start = Instant::now();
        if let Err(e) = store.exists(&path, missing_is_forbidden).await {
            return problem(format!("an existence check failed: {}", e.message));
        }
        times.push(start.elapsed());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(format!(
        "median {:.3} ms over {LATENCY_SAMPLES} existence checks of a missing key (min {:.3}, max {:.3})",
        ms(times[times.len() / 2]),
        ms(times[0]),
        ms(times[times.len() - 1])
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fatal_failure_skips_the_rest() {
        let mut report = Report { checks: Vec::new() };
        report.ok("a", "first", "fine");
        report.push("b", "second", problem("meh".into()));
        report.fatal("c", "third", "broken");
        report.ok("d", "fourth", "fine");
        let states: Vec<State> = report.checks.iter().map(|c| c.state).collect();
        assert_eq!(states, [State::Ok, State::Fail, State::Fail, State::Skip]);
        assert_eq!(report.failed_fatally().unwrap().id, "c");
        assert!(report.checks[3].detail.contains("third failed"));
    }
}
