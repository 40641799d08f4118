//! The credential chain against s3s-fs, which checks every signature: explicit keys, then
//! the AWS environment variables, then the shared credentials/config files selected by
//! `AWS_PROFILE` (static keys, `credential_process`, assume-role through a real STS, moto's).
//! Also: secrets never reach errors, `Debug` output or the log.
//!
//! These tests change process-wide environment variables, so they live in their own test
//! binary and take one lock each. `AWS_EC2_METADATA_DISABLED=true` is set throughout so
//! that no case can fall through to the instance metadata service (a non-loopback
//! address).

mod support;

use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};

use kvtier_core::{JobKind, Status, Tier};
use serde_json::{json, Value};
use support::proxy::Proxy;
use support::*;

const BLOCK: usize = 16 * 1024;
const WRONG_SECRET: &str = "definitely-wrong-secret-Qx7";
const TOKEN: &str = "session-token-value-Lm55";

const AWS_VARS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_STS",
    "HOME",
];

/// Holds the environment lock; restores every variable it touched on drop.
struct Env {
    saved: Vec<(&'static str, Option<String>)>,
    _lock: MutexGuard<'static, ()>,
}

impl Env {
    /// Clears every AWS variable (HOME points at an empty directory) and applies `vars`.
    fn with(vars: &[(&str, &str)], empty_home: &Path) -> Env {
        static LOCK: Mutex<()> = Mutex::new(());
        let lock = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        install_logger();
        let saved = AWS_VARS
            .iter()
            .map(|&k| (k, std::env::var(k).ok()))
            .collect();
        for k in AWS_VARS {
            std::env::remove_var(k);
        }
        std::env::set_var("HOME", empty_home);
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
        Env { saved, _lock: lock }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for (k, v) in &self.saved {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}

// ------------------------------------------------------------------------------------
// A logger that keeps every record, to search it for secrets.

struct Capture;

fn captured() -> &'static Mutex<String> {
    static TEXT: OnceLock<Mutex<String>> = OnceLock::new();
    TEXT.get_or_init(Default::default)
}

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = format!("{} {} {}\n", record.level(), record.target(), record.args());
        captured().lock().unwrap().push_str(&line);
    }
    fn flush(&self) {}
}

fn install_logger() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        log::set_boxed_logger(Box::new(Capture)).unwrap();
        log::set_max_level(log::LevelFilter::Trace);
    });
}

fn assert_clean(what: &str, text: &str) {
    for secret in [SECRET_KEY, WRONG_SECRET, TOKEN] {
        assert!(!text.contains(secret), "a secret appears in {what}: {text}");
    }
}

// ------------------------------------------------------------------------------------

/// The store section without keys: the chain must find them.
fn keyless(srv: &Server, bucket: &str) -> Value {
    let mut store = srv.store_json(bucket);
    let o = store.as_object_mut().unwrap();
    o.remove("access_key");
    o.remove("secret_key");
    o.remove("region");
    store
}

fn start(store: Value) -> kvtier_core::Result<Tier> {
    Tier::from_json(&tier_json(store, json!({})))
}

fn start_ok(srv: &Server, store: Value) -> Tier {
    start(store).unwrap_or_else(|e| panic!("{e}\n--- {} log ---\n{}", srv.name(), srv.log_tail()))
}

/// Stores two blocks and loads them back into other slots.
fn round_trip(tier: &Tier) {
    let mut pool = Pool::new(4, BLOCK);
    pool.fill_random(17);
    pool.register(tier);
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[1, 2]))
        .unwrap();
    let r = wait_all(tier, 1).remove(&1).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    tier.submit(JobKind::Load, 2, &[3, 2], keys(&[1, 2]))
        .unwrap();
    let r = wait_all(tier, 1).remove(&2).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert!(pool.block(3) == pool.block(0) && pool.block(2) == pool.block(1));
}

#[test]
fn environment_variables() {
    let srv = Server::s3s_fs();
    let home = tempfile::tempdir().unwrap();
    {
        let _env = Env::with(
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ],
            home.path(),
        );
        round_trip(&start_ok(&srv, keyless(&srv, &srv.new_bucket())));
    }
    {
        let _env = Env::with(
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", WRONG_SECRET),
            ],
            home.path(),
        );
        let e = start(keyless(&srv, &srv.new_bucket()))
            .err()
            .expect("a wrong secret in the environment must fail");
        assert_eq!(e.status, Status::Auth, "{}", e.message);
        assert!(
            e.message
                .contains("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment variables"),
            "{}",
            e.message
        );
        assert_clean("the error", &e.message);
    }
    {
        // A session token from the environment rides along (x-amz-security-token, which
        // s3s-fs accepts and ignores) without breaking the signature.
        let _env = Env::with(
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                ("AWS_SESSION_TOKEN", TOKEN),
            ],
            home.path(),
        );
        round_trip(&start_ok(&srv, keyless(&srv, &srv.new_bucket())));
    }
    {
        let _env = Env::with(&[("AWS_ACCESS_KEY_ID", ACCESS_KEY)], home.path());
        let e = start(keyless(&srv, &srv.new_bucket()))
            .err()
            .expect("half a key pair must fail");
        assert_eq!(e.status, Status::Auth);
        assert!(e.message.contains("AWS_SECRET_ACCESS_KEY"), "{}", e.message);
    }
}

#[test]
fn explicit_keys_beat_the_environment_which_beats_the_profile() {
    let srv = Server::s3s_fs();
    let home = tempfile::tempdir().unwrap();
    let creds = home.path().join("creds");
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {WRONG_SECRET}\n"
        ),
    )
    .unwrap();
    let creds = creds.display().to_string();
    {
        // Wrong keys in the environment and the file; right keys in the configuration.
        let _env = Env::with(
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", WRONG_SECRET),
                ("AWS_SHARED_CREDENTIALS_FILE", &creds),
            ],
            home.path(),
        );
        round_trip(&start_ok(&srv, srv.store_json(&srv.new_bucket())));
    }
    {
        // Right keys in the environment, wrong ones in the file.
        let _env = Env::with(
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                ("AWS_SHARED_CREDENTIALS_FILE", &creds),
            ],
            home.path(),
        );
        round_trip(&start_ok(&srv, keyless(&srv, &srv.new_bucket())));
    }
    {
        // Only the file, with the wrong secret: rejected, and the message names the profile.
        let _env = Env::with(&[("AWS_SHARED_CREDENTIALS_FILE", &creds)], home.path());
        let e = start(keyless(&srv, &srv.new_bucket()))
            .err()
            .expect("the profile's wrong secret must fail");
        assert_eq!(e.status, Status::Auth, "{}", e.message);
        assert!(
            e.message.contains("profile [default]") && e.message.contains(&creds),
            "{}",
            e.message
        );
        assert_clean("the error", &e.message);
    }
}

#[test]
fn shared_files_and_aws_profile() {
    let srv = Server::s3s_fs();
    let home = tempfile::tempdir().unwrap();
    let aws = home.path().join(".aws");
    std::fs::create_dir_all(&aws).unwrap();
    std::fs::write(
        aws.join("credentials"),
        format!(
            "[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {WRONG_SECRET}\n\n\
             # the team's profile\n[kvt]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nregion = us-east-1\n[profile cfgonly]\nregion = us-east-1\naws_access_key_id = {ACCESS_KEY}\n\
             aws_secret_access_key = {SECRET_KEY}\n[profile sso]\nsso_session = corp\n"
        ),
    )
    .unwrap();
    {
        // ~/.aws/credentials under HOME, profile chosen by AWS_PROFILE.
        let _env = Env::with(&[("AWS_PROFILE", "kvt")], home.path());
        round_trip(&start_ok(&srv, keyless(&srv, &srv.new_bucket())));
    }
    {
        // A profile only in ~/.aws/config (`[profile cfgonly]`).
        let _env = Env::with(&[("AWS_PROFILE", "cfgonly")], home.path());
        round_trip(&start_ok(&srv, keyless(&srv, &srv.new_bucket())));
    }
    {
        // AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE elsewhere.
        let other = tempfile::tempdir().unwrap();
        let file = other.path().join("c");
        std::fs::copy(aws.join("credentials"), &file).unwrap();
        let file = file.display().to_string();
        let _env = Env::with(
            &[
                ("AWS_PROFILE", "kvt"),
                ("AWS_SHARED_CREDENTIALS_FILE", &file),
            ],
            other.path(),
        );
        round_trip(&start_ok(&srv, keyless(&srv, &srv.new_bucket())));
    }
    {
        // The default profile holds the wrong secret.
        let _env = Env::with(&[], home.path());
        let e = start(keyless(&srv, &srv.new_bucket()))
            .err()
            .expect("default profile has a wrong secret");
        assert_eq!(e.status, Status::Auth, "{}", e.message);
        assert_clean("the error", &e.message);
    }
    {
        let _env = Env::with(&[("AWS_PROFILE", "nosuch")], home.path());
        let e = start(keyless(&srv, &srv.new_bucket()))
            .err()
            .expect("unknown profile");
        assert_eq!(e.status, Status::Auth, "{}", e.message);
        assert!(e.message.contains("[nosuch]"), "{}", e.message);
    }
    {
        // SSO profiles are not resolved by kvtier: a clear error, not a silent IMDS call.
        let _env = Env::with(&[("AWS_PROFILE", "sso")], home.path());
        let e = start(keyless(&srv, &srv.new_bucket()))
            .err()
            .expect("sso profile");
        assert_eq!(e.status, Status::Auth, "{}", e.message);
        assert!(e.message.contains("sso_session"), "{}", e.message);
    }
}

/// An executable that prints `credential_process` output with these keys.
fn credential_process(dir: &Path, name: &str, access_key: &str, secret: &str) -> String {
    let script = dir.join(name);
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s' '{{\"Version\": 1, \"AccessKeyId\": \"{access_key}\", \"SecretAccessKey\": \"{secret}\"}}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script.display().to_string()
}

/// Starts a keyless tier under `vars`; it must fail with `Status::Auth` and a clean message.
fn auth_error(srv: &Server, vars: &[(&str, &str)], home: &Path, why: &str) -> kvtier_core::Error {
    let _env = Env::with(vars, home);
    let e = start(keyless(srv, &srv.new_bucket())).err().expect(why);
    assert_eq!(e.status, Status::Auth, "{}", e.message);
    assert_clean("the error", &e.message);
    e
}

#[test]
fn credential_process_profiles() {
    // s3s-fs checks every signature, so a round trip proves the process's keys were used.
    let srv = Server::s3s_fs();
    let home = tempfile::tempdir().unwrap();
    let right = credential_process(home.path(), "right.sh", ACCESS_KEY, SECRET_KEY);
    let wrong = credential_process(home.path(), "wrong.sh", ACCESS_KEY, WRONG_SECRET);
    let aws = home.path().join(".aws");
    std::fs::create_dir_all(&aws).unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[profile right]\ncredential_process = {right}\n[profile wrong]\ncredential_process = {wrong}\n\
             [profile failing]\ncredential_process = /bin/false\n"
        ),
    )
    .unwrap();
    {
        let _env = Env::with(&[("AWS_PROFILE", "right")], home.path());
        round_trip(&start_ok(&srv, keyless(&srv, &srv.new_bucket())));
    }
    {
        let e = auth_error(
            &srv,
            &[("AWS_PROFILE", "wrong")],
            home.path(),
            "the process's wrong secret must fail",
        );
        assert!(
            e.message.contains("profile [wrong] (credential_process)"),
            "{}",
            e.message
        );
    }
    {
        let e = auth_error(
            &srv,
            &[("AWS_PROFILE", "failing")],
            home.path(),
            "a failing process must fail the start",
        );
        assert!(
            e.message
                .contains("profile [failing] (credential_process) of")
                && e.message.contains("could not be resolved"),
            "{}",
            e.message
        );
    }
}

#[test]
fn assume_role_profile_through_sts() {
    // moto serves STS beside S3: the profile's role is assumed with the source profile's
    // keys (AssumeRole counted at a relay in front of the STS endpoint), and the store is
    // used with the temporary credentials.
    let srv = Server::moto();
    let sts = Proxy::start(srv.port());
    let home = tempfile::tempdir().unwrap();
    let aws = home.path().join(".aws");
    std::fs::create_dir_all(&aws).unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[profile base]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n\
             [profile role]\nrole_arn = arn:aws:iam::123456789012:role/kv-cache\nsource_profile = base\n\
             role_session_name = kvtier-test\nregion = us-east-1\n"
        ),
    )
    .unwrap();
    let sts_endpoint = format!("http://{}", sts.endpoint());
    {
        let _env = Env::with(
            &[
                ("AWS_PROFILE", "role"),
                ("AWS_ENDPOINT_URL_STS", &sts_endpoint),
            ],
            home.path(),
        );
        let tier = start_ok(&srv, keyless(&srv, &srv.new_bucket()));
        round_trip(&tier);
        let posts = sts.stats().by_method.get("POST").copied().unwrap_or(0);
        assert!(
            posts >= 1,
            "no AssumeRole request reached STS: {:?}",
            sts.stats()
        );
    }
    {
        // STS unreachable: the start fails naming the profile and its kind.
        let closed = format!("http://127.0.0.1:{}", free_port());
        let e = auth_error(
            &srv,
            &[("AWS_PROFILE", "role"), ("AWS_ENDPOINT_URL_STS", &closed)],
            home.path(),
            "no STS, no credentials",
        );
        assert!(
            e.message.contains("profile [role] (role_arn)"),
            "{}",
            e.message
        );
    }
}

#[test]
fn no_credentials_anywhere_is_a_clear_error_without_network() {
    let srv = Server::s3s_fs();
    let home = tempfile::tempdir().unwrap();
    let _env = Env::with(&[], home.path());
    let e = start(keyless(&srv, &srv.new_bucket()))
        .err()
        .expect("no credentials");
    assert_eq!(e.status, Status::Auth, "{}", e.message);
    assert!(
        e.message.contains("no S3 credentials found"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("AWS_EC2_METADATA_DISABLED"),
        "{}",
        e.message
    );
}

#[test]
fn secrets_never_in_errors_debug_or_log() {
    let srv = Server::s3s_fs();
    let home = tempfile::tempdir().unwrap();
    let _env = Env::with(&[], home.path());

    // Debug of a configuration with every secret set.
    let store = json!({"type":"s3","bucket":"b","endpoint_override":srv.endpoint(),"scheme":"http",
        "access_key":ACCESS_KEY,"secret_key":SECRET_KEY,"session_token":TOKEN});
    let config = kvtier_core::TierConfig::from_json(&tier_json(store, json!({}))).unwrap();
    assert_clean("Debug of the configuration", &format!("{config:?}"));

    // A probe failure with a wrong secret and a session token.
    let store = with(
        with(
            srv.store_json(&srv.new_bucket()),
            "secret_key",
            json!(WRONG_SECRET),
        ),
        "session_token",
        json!(TOKEN),
    );
    let e = start(store).err().expect("wrong secret");
    assert_eq!(e.status, Status::Auth, "{}", e.message);
    assert_clean("the probe error", &e.message);
    assert_clean("Display of the error", &e.to_string());

    // Data-path failures: the server dies under a working tier.
    let tier = start(with(
        srv.store_json(&srv.new_bucket()),
        "max_retries",
        json!(1),
    ))
    .unwrap();
    assert_clean("Debug of the tier's store", &format!("{:?}", tier.store()));
    let mut pool = Pool::new(4, BLOCK);
    pool.fill_random(1);
    pool.register(&tier);
    srv.kill();
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[1, 2]))
        .unwrap();
    tier.submit(JobKind::Load, 2, &[2, 3], keys(&[1, 2]))
        .unwrap();
    let results = wait_all(&tier, 2);
    for r in results.values() {
        assert!(!r.succeeded());
        assert_clean("a job message", &r.message);
        assert_clean("Debug of a job result", &format!("{r:?}"));
    }
    drop(tier);

    let log = captured().lock().unwrap().clone();
    assert!(
        !log.is_empty(),
        "the capturing logger saw nothing: the check would be vacuous"
    );
    assert_clean("the log", &log);
}
