//! Storage emulators for the Azure Blob and GCS tests: Azurite (blob service) and
//! fake-gcs-server, started by `scripts/emulators.sh run` on free loopback ports, data in
//! memory, one of each per test process (shared by its tests, each with its own container
//! or bucket).
//!
//! As with the S3 servers, a missing emulator fails the test with a message naming the
//! install script, never a silent skip, and an emulator dies with the test process: the
//! script is started with PR_SET_PDEATHSIG from a thread that never exits, and starts the
//! emulator itself with a parent-death signal.
//!
//! What object_store needs (proved against both emulators with object_store 0.14.2):
//! - Azure: `MicrosoftAzureBuilder::new().with_account("devstoreaccount1")
//!   .with_access_key(KEY).with_container_name(C).with_endpoint("http://127.0.0.1:PORT/devstoreaccount1")
//!   .with_allow_http(true)`. object_store creates no container: [`Emulator::new_container`]
//!   does, with a SharedKey-signed Create Container request.
//! - GCS: `GoogleCloudStorageBuilder::new().with_service_account_path(FILE).with_bucket_name(B)`
//!   where FILE holds `gcs_base_url` (the emulator) and `disable_oauth: true` (plus empty
//!   `client_email`, `private_key`, `private_key_id`, which object_store requires);
//!   `with_base_url` would override the URL. Buckets come from the JSON API
//!   (`POST /storage/v1/b`), see [`Emulator::new_bucket`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub use super::http::http_with_body;
use super::http::{hmac_sha256, loopback_request, Utc};
use super::process::{free_port, leak_from_parked_thread, spawn_killed_with_parent, READY_TIMEOUT};
use super::tools::manifest_dir;

/// Azurite's well-known development account and key (published by Microsoft).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmulatorKind {
    /// Azurite's blob service.
    Azurite,
    /// fake-gcs-server, behind `scripts/gcs-xml-put.py` (object_store's uploads).
    Gcs,
}

impl EmulatorKind {
    pub fn name(self) -> &'static str {
        match self {
            EmulatorKind::Azurite => "azurite",
            EmulatorKind::Gcs => "gcs",
        }
    }
}

/// A running emulator, killed on drop (the shared ones live as long as the test process).
pub struct Emulator {
    pub kind: EmulatorKind,
    pub port: u16,
    /// `KEY=value` lines of `DIR/env`, written by the script once the emulator answered.
    pub env: HashMap<String, String>,
    child: Mutex<Option<Child>>,
    dir: tempfile::TempDir,
}

static NAMES: AtomicU64 = AtomicU64::new(0);

fn install_hint() -> String {
    format!(
        "run `{0}/scripts/emulators.sh install` or `{0}/scripts/install-tools.sh` (the emulator tests need the real emulators and never skip)",
        manifest_dir().display()
    )
}

impl Emulator {
    /// One Azurite per test process.
    pub fn shared_azurite() -> &'static Emulator {
        static SHARED: OnceLock<&'static Emulator> = OnceLock::new();
        SHARED.get_or_init(|| {
            leak_from_parked_thread("shared-azurite", || Emulator::start(EmulatorKind::Azurite))
        })
    }

    /// One fake-gcs-server per test process.
    pub fn shared_gcs() -> &'static Emulator {
        static SHARED: OnceLock<&'static Emulator> = OnceLock::new();
        SHARED.get_or_init(|| {
            leak_from_parked_thread("shared-gcs", || Emulator::start(EmulatorKind::Gcs))
        })
    }

    /// A fresh emulator on a free port; waits until it answers. A port that another process
    /// took in the meantime makes the script fail: it is retried on another port.
    pub fn start(kind: EmulatorKind) -> Emulator {
        let script = manifest_dir().join("scripts/emulators.sh");
        let mut last = String::new();
        for _attempt in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let log = std::fs::File::create(dir.path().join("script.log")).unwrap();
            let mut cmd = Command::new("bash");
            cmd.arg(&script)
                .args(["run", kind.name()])
                .arg(dir.path().join("run"))
                .arg(port.to_string());
            cmd.stdout(log.try_clone().unwrap()).stderr(log);
            let mut child = spawn_killed_with_parent(&mut cmd).unwrap_or_else(|e| {
                panic!("cannot run {}: {e}; {}", script.display(), install_hint())
            });
            match wait_for_env(&mut child, &dir.path().join("run/env")) {
                Ok(env) => {
                    return Emulator {
                        kind,
                        port,
                        env,
                        child: Mutex::new(Some(child)),
                        dir,
                    };
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log =
                        std::fs::read_to_string(dir.path().join("script.log")).unwrap_or_default();
                    if log.contains("not installed") {
                        panic!(
                            "{} emulator not installed: {log}\n{}",
                            kind.name(),
                            install_hint()
                        );
                    }
                    last = format!(
                        "{e}\n--- scripts/emulators.sh run {} ---\n{log}",
                        kind.name()
                    );
                }
            }
        }
        panic!("{} emulator did not start: {last}", kind.name());
    }

    /// The base URL object_store takes: Azure's account URL
    /// (`http://127.0.0.1:PORT/devstoreaccount1`), or the GCS base URL.
    pub fn endpoint(&self) -> String {
        let key = match self.kind {
            EmulatorKind::Azurite => "AZURITE_ENDPOINT",
            EmulatorKind::Gcs => "GCS_ENDPOINT",
        };
        self.env[key].clone()
    }

    /// GCS: the service-account file that points object_store at this emulator.
    pub fn service_account(&self) -> PathBuf {
        assert_eq!(self.kind, EmulatorKind::Gcs);
        PathBuf::from(&self.env["GCS_SERVICE_ACCOUNT"])
    }

    /// The script's log and the emulator's, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut text =
            std::fs::read_to_string(self.dir.path().join("script.log")).unwrap_or_default();
        if let Ok(entries) = std::fs::read_dir(self.dir.path().join("run/log")) {
            for entry in entries.flatten() {
                let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                text.push_str(&format!(
                    "\n--- {} ---\n",
                    entry.file_name().to_string_lossy()
                ));
                text.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
            }
        }
        text
    }

    /// A name unique in this process, valid as a container and as a bucket name.
    fn unique_name() -> String {
        format!(
            "kvt-{}-{}",
            std::process::id(),
            NAMES.fetch_add(1, Ordering::SeqCst)
        )
    }

    /// Azurite: creates a container with a fresh name and returns the name.
    pub fn new_container(&self) -> String {
        assert_eq!(self.kind, EmulatorKind::Azurite);
        let name = Self::unique_name();
        let path = format!("/{AZURITE_ACCOUNT}/{name}");
        let (status, body) = azure_shared_key_request(
            self.port,
            "PUT",
            &path,
            &[("restype", "container")],
            AZURITE_KEY,
        )
        .unwrap_or_else(|e| panic!("Azurite create container {name}: {e}\n{}", self.log_tail()));
        assert_eq!(status, 201, "Azurite create container {name}: {body}");
        name
    }

    /// fake-gcs-server: creates a bucket with a fresh name and returns the name.
    pub fn new_bucket(&self) -> String {
        assert_eq!(self.kind, EmulatorKind::Gcs);
        let name = Self::unique_name();
        let body = json!({ "name": name }).to_string();
        let (status, answer) = http_with_body(
            self.port,
            "POST",
            "/storage/v1/b",
            "application/json",
            body.as_bytes(),
        )
        .unwrap_or_else(|e| {
            panic!(
                "fake-gcs-server create bucket {name}: {e}\n{}",
                self.log_tail()
            )
        });
        assert_eq!(
            status, 200,
            "fake-gcs-server create bucket {name}: {answer}"
        );
        name
    }

    /// A fresh container or bucket, and the `store` section of a tier configuration for it.
    pub fn new_store_json(&self) -> Value {
        match self.kind {
            EmulatorKind::Azurite => self.store_json(&self.new_container()),
            EmulatorKind::Gcs => self.store_json(&self.new_bucket()),
        }
    }

    /// The `store` section for an existing container or bucket `name`.
    pub fn store_json(&self, name: &str) -> Value {
        match self.kind {
            EmulatorKind::Azurite => json!({
                "type": "azure",
                "container": name,
                "account": AZURITE_ACCOUNT,
                "access_key": AZURITE_KEY,
                "endpoint": self.endpoint(),
            }),
            EmulatorKind::Gcs => json!({
                "type": "gcs",
                "bucket": name,
                "service_account": self.service_account().display().to_string(),
                "endpoint": self.endpoint(),
            }),
        }
    }

    /// Kills the emulator (its script, whose children follow by their parent-death signal).
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until the script has written `env` (it does once the emulator answered HTTP).
fn wait_for_env(
    child: &mut Child,
    env: &std::path::Path,
) -> Result<HashMap<String, String>, String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("the script exited with {status}"));
        }
        if let Ok(text) = std::fs::read_to_string(env) {
            return Ok(text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect());
        }
        if Instant::now() > deadline {
            return Err(format!("not ready within {READY_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// One request without a body to Azurite, signed with SharedKey for the development account
/// (Azurite checks the signature of every request). `path` starts with `/devstoreaccount1`;
/// `query` is sent and signed as given.
pub fn azure_shared_key_request(
    port: u16,
    method: &str,
    path: &str,
    query: &[(&str, &str)],
    key_base64: &str,
) -> std::io::Result<(u16, String)> {
    let date = rfc1123_now();
    let version = "2023-11-03";
    let mut sorted: Vec<_> = query.to_vec();
    sorted.sort();
    // Verb, then Content-Encoding, -Language, -Length (empty for none), -MD5, -Type, Date,
    // If-Modified-Since, If-Match, If-None-Match, If-Unmodified-Since, Range, all empty; the
    // x-ms- headers; the resource with its query parameters.
    let mut to_sign = format!(
        "{method}{}x-ms-date:{date}\nx-ms-version:{version}\n/{AZURITE_ACCOUNT}{path}",
        "\n".repeat(12)
    );
    for (k, v) in &sorted {
        to_sign.push_str(&format!("\n{k}:{v}"));
    }
    let key = base64_decode(key_base64);
    let signature = base64_encode(&hmac_sha256(&key, to_sign.as_bytes()));
    let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let target = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", query.join("&"))
    };
    let headers = format!(
        "x-ms-date: {date}\r\nx-ms-version: {version}\r\n\
         Authorization: SharedKey {AZURITE_ACCOUNT}:{signature}\r\n"
    );
    loopback_request(
        port,
        method,
        &target,
        &headers,
        b"",
        Duration::from_secs(20),
    )
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = B64.iter().position(|&b| b == c).expect("not base64") as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// Now as an HTTP date (`Tue, 01 Dec 2026 11:11:28 GMT`).
fn rfc1123_now() -> String {
    let now = Utc::now();
    let weekday =
        ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][now.days.rem_euclid(7) as usize];
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][now.month as usize - 1];
    format!(
        "{weekday}, {:02} {month} {} {:02}:{:02}:{:02} GMT",
        now.day, now.year, now.hour, now.minute, now.second
    )
}
