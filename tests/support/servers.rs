//! Real S3 servers on free loopback ports: s3s-fs, moto_server (plain and TLS) and Ceph
//! RGW, each started fresh or shared by a test binary's tests, waited for until it answers
//! on a port it holds itself, and killed when its handle drops (and with the test process).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::http::{http_plain, https_request, signed_plain};
use super::process::{
    free_port, holds_listener, leak_from_parked_thread, spawn_killed_with_parent, READY_TIMEOUT,
};
use super::tls::Tls;
use super::tools::{ceph_rgw_script, install_hint, moto_bin, moto_python, s3s_fs_bin};

/// The key pair a fresh s3s-fs checks signatures against.
pub const ACCESS_KEY: &str = "kvtier-test-access";
pub const SECRET_KEY: &str = "kvtier-test-secret-Zq81mN2x";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    S3sFs,
    Moto,
    MotoTls,
    /// Ceph RGW 16 (radosgw, beast frontend) on a three-OSD memstore cluster (its first
    /// gateway).
    Rgw,
}

/// The RGW user that owns nothing (`scripts/ceph-rgw.sh`): a bucket policy can grant it
/// object access without s3:ListBucket.
pub const RGW_NOLIST_USER: &str = "kvtier-nolist";
pub const RGW_NOLIST_ACCESS_KEY: &str = "kvtier-rgw-nolist";
pub const RGW_NOLIST_SECRET_KEY: &str = "kvtier-rgw-nolist-secret-8sQw";

/// The key pairs of moto (which accepts any) and of the RGW user `scripts/ceph-rgw.sh`
/// creates.
const MOTO_KEYS: (&str, &str) = ("moto-access", "moto-secret-Kp29vX");
const RGW_KEYS: (&str, &str) = ("kvtier-rgw-access", "kvtier-rgw-secret-Vb71qZ");

/// moto_server's own start (`moto.server.main`), with buckets created in its backend
/// before it listens. Arguments: host, port, bucket names.
const MOTO_WITH_BUCKETS: &str = r#"
import sys
from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.s3.models import s3_backends
from werkzeug.serving import run_simple
host, port, buckets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for bucket in buckets:
    s3_backends[DEFAULT_ACCOUNT_ID]["aws"].create_bucket(bucket, "us-east-1")
run_simple(host, port, DomainDispatcherApplication(create_backend_app), threaded=True)
"#;

/// How long Ceph RGW may take to start (mon, three OSDs, two gateways and the users; 5-6 s
/// on a quiet machine, 11-13 s on a busy one).
const RGW_READY_TIMEOUT: Duration = Duration::from_secs(240);

/// A real S3 server on a loopback port, killed on drop.
pub struct Server {
    pub kind: Kind,
    port: AtomicU16,
    pub access_key: String,
    pub secret_key: String,
    child: Mutex<Option<Child>>,
    /// s3s-fs: the data root (a bucket is a directory in it).
    root: Option<tempfile::TempDir>,
    logs: tempfile::TempDir,
    pub tls: Option<Arc<Tls>>,
}

static BUCKETS: AtomicU64 = AtomicU64::new(0);

impl Server {
    /// A fresh s3s-fs that checks SigV4 signatures against its one key pair.
    pub fn s3s_fs() -> Server {
        let root = tempfile::tempdir().unwrap();
        Self::launch(Kind::S3sFs, (ACCESS_KEY, SECRET_KEY), Some(root), None)
    }

    /// A fresh moto_server (plain HTTP). moto accepts any credentials.
    pub fn moto() -> Server {
        Self::launch(Kind::Moto, MOTO_KEYS, None, None)
    }

    /// A fresh moto_server serving TLS with a certificate of the private CA in `tls`.
    pub fn moto_tls(tls: Arc<Tls>) -> Server {
        Self::launch(Kind::MotoTls, MOTO_KEYS, None, Some(tls))
    }

    /// A fresh Ceph cluster (`scripts/ceph-rgw.sh run`: three memstore OSDs, two gateways)
    /// reached through its first gateway, its data in memory, killed with the test process.
    pub fn rgw() -> Server {
        Self::launch(Kind::Rgw, RGW_KEYS, None, None)
    }

    /// A server of `kind` with this key pair, started and answering.
    fn launch(
        kind: Kind,
        (access_key, secret_key): (&str, &str),
        root: Option<tempfile::TempDir>,
        tls: Option<Arc<Tls>>,
    ) -> Server {
        let server = Server {
            kind,
            port: AtomicU16::new(0),
            access_key: access_key.to_string(),
            secret_key: secret_key.to_string(),
            child: Mutex::new(None),
            root,
            logs: tempfile::tempdir().unwrap(),
            tls,
        };
        server.start();
        server
    }

    /// One moto_server per test binary, shared by its tests (each uses its own bucket).
    /// Started from a thread that never exits, so PR_SET_PDEATHSIG fires only when the
    /// test process does.
    pub fn shared_moto() -> &'static Server {
        static SHARED: OnceLock<&'static Server> = OnceLock::new();
        SHARED.get_or_init(|| leak_from_parked_thread("shared-moto", Server::moto))
    }

    /// One Ceph RGW per test binary, shared by its tests (each uses its own bucket).
    pub fn shared_rgw() -> &'static Server {
        static SHARED: OnceLock<&'static Server> = OnceLock::new();
        SHARED.get_or_init(|| leak_from_parked_thread("shared-rgw", Server::rgw))
    }

    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::S3sFs => "s3s-fs",
            Kind::Moto => "moto",
            Kind::MotoTls => "moto-tls",
            Kind::Rgw => "ceph-rgw",
        }
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    pub fn scheme(&self) -> &'static str {
        if self.kind == Kind::MotoTls {
            "https"
        } else {
            "http"
        }
    }

    /// Whether the server checks request signatures (moto does not by default).
    pub fn checks_signatures(&self) -> bool {
        matches!(self.kind, Kind::S3sFs | Kind::Rgw)
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_ref().map(|r| r.path())
    }

    fn log_path(&self) -> PathBuf {
        self.logs.path().join("server.log")
    }

    /// Where `scripts/ceph-rgw.sh run` keeps the cluster (RGW only).
    fn ceph_dir(&self) -> PathBuf {
        self.logs.path().join("ceph")
    }

    pub fn log_tail(&self) -> String {
        let mut text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        if self.kind == Kind::Rgw {
            for daemon in ["mon.a", "osd.0", "osd.1", "osd.2", "client.rgw.1"] {
                let log =
                    std::fs::read_to_string(self.ceph_dir().join(format!("log/{daemon}.log")))
                        .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                text.push_str(&format!("\n--- {daemon} ---\n"));
                text.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
            }
        }
        let start = text.len().saturating_sub(3000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    fn command(&self, port: u16) -> Command {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let mut cmd;
        match self.kind {
            Kind::S3sFs => {
                cmd = Command::new(s3s_fs_bin());
                cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
                    .args([
                        "--access-key",
                        &self.access_key,
                        "--secret-key",
                        &self.secret_key,
                    ])
                    .arg(self.root().unwrap());
            }
            Kind::Moto | Kind::MotoTls => {
                cmd = Command::new(moto_bin());
                cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
                if let Some(tls) = &self.tls {
                    cmd.arg("--ssl-cert")
                        .arg(&tls.cert)
                        .arg("--ssl-key")
                        .arg(&tls.key);
                }
            }
            Kind::Rgw => {
                cmd = Command::new(ceph_rgw_script());
                cmd.arg("run").arg(self.ceph_dir()).arg(port.to_string());
                cmd.env("RGW_ACCESS_KEY", &self.access_key)
                    .env("RGW_SECRET_KEY", &self.secret_key);
                cmd.env("RGW_NOLIST_ACCESS_KEY", RGW_NOLIST_ACCESS_KEY)
                    .env("RGW_NOLIST_SECRET_KEY", RGW_NOLIST_SECRET_KEY);
            }
        }
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        cmd
    }

    /// Starts (or restarts) the server on a fresh free port and waits until it answers.
    pub fn start(&self) {
        let mut last = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            let mut child = spawn_killed_with_parent(&mut self.command(port)).unwrap_or_else(|e| {
                panic!("cannot start {}: {e}; {}", self.name(), install_hint())
            });
            match self.wait_ready(&mut child, port) {
                Ok(()) => {
                    self.port.store(port, Ordering::SeqCst);
                    *self.child.lock().unwrap() = Some(child);
                    return;
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = e;
                }
            }
        }
        panic!(
            "{} did not start: {last}\n--- server log ---\n{}",
            self.name(),
            self.log_tail()
        );
    }

    fn wait_ready(&self, child: &mut Child, port: u16) -> Result<(), String> {
        let timeout = if self.kind == Kind::Rgw {
            RGW_READY_TIMEOUT
        } else {
            READY_TIMEOUT
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Err(format!("exited with {status} (port {port} taken?)"));
            }
            let answered = match self.kind {
                Kind::S3sFs | Kind::Moto => http_plain(port, "GET", "/").is_ok(),
                Kind::MotoTls => {
                    https_request(port, &self.tls.as_ref().unwrap().ca, "GET", "/").is_ok()
                }
                // The script writes `env` once the user exists, after radosgw answered.
                Kind::Rgw => {
                    self.ceph_dir().join("env").is_file() && http_plain(port, "GET", "/").is_ok()
                }
            };
            if answered {
                // Another process may own the port (two picks of the same free port): the
                // answer then came from it while our server failed to bind.
                if holds_listener(child.id(), port) {
                    return Ok(());
                }
                return Err(format!(
                    "port {port} answered, but another process listens on it"
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("no answer on port {port} within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the server (SIGKILL), reaps it, and checks that its port now refuses
    /// connections: an outage begins. [`Server::start_again`] ends it.
    pub fn stop(&self) {
        self.kill();
        let refused = std::net::TcpStream::connect(("127.0.0.1", self.port()))
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        assert!(
            refused,
            "{}: port {} still answers after the kill",
            self.name(),
            self.port()
        );
    }

    /// Starts the server again on the port it had, after [`Server::stop`], and waits until
    /// it answers. s3s-fs serves the same directory, so its objects survive. moto keeps its
    /// state in memory and has no way to save it (5.2), so it comes back empty: `buckets`
    /// are created before it listens (a store retried between the port opening and a bucket
    /// created afterwards would meet NoSuchBucket, which is final).
    pub fn start_again(&self, buckets: &[&str]) {
        let port = self.port();
        let mut command = match self.kind {
            Kind::S3sFs => self.command(port),
            Kind::Moto => {
                let mut command = Command::new(moto_python());
                command
                    .args(["-c", MOTO_WITH_BUCKETS, "127.0.0.1", &port.to_string()])
                    .args(buckets);
                command.stdout(self.log_file()).stderr(self.log_file());
                command
            }
            other => panic!("{other:?} is not restarted on its port by the tests"),
        };
        let mut child = spawn_killed_with_parent(&mut command)
            .unwrap_or_else(|e| panic!("cannot start {} again: {e}", self.name()));
        if let Err(e) = self.wait_ready(&mut child, port) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} did not start again on port {port}: {e}\n--- server log ---\n{}",
                self.name(),
                self.log_tail()
            );
        }
        *self.child.lock().unwrap() = Some(child);
    }

    fn log_file(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap()
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// Creates a bucket with a name unique in this process and returns the name.
    pub fn new_bucket(&self) -> String {
        let name = format!(
            "kvt-{}-{}",
            std::process::id(),
            BUCKETS.fetch_add(1, Ordering::SeqCst)
        );
        self.create_bucket(&name);
        name
    }

    pub fn create_bucket(&self, name: &str) {
        match self.kind {
            Kind::S3sFs => std::fs::create_dir_all(self.root().unwrap().join(name)).unwrap(),
            Kind::Moto => {
                let (status, body) = http_plain(self.port(), "PUT", &format!("/{name}")).unwrap();
                assert_eq!(status, 200, "moto create bucket {name}: {body}");
            }
            Kind::MotoTls => {
                let (status, body) = https_request(
                    self.port(),
                    &self.tls.as_ref().unwrap().ca,
                    "PUT",
                    &format!("/{name}"),
                )
                .unwrap();
                assert_eq!(status, 200, "moto create bucket {name}: {body}");
            }
            Kind::Rgw => {
                let (status, body) = signed_plain(
                    self.port(),
                    "PUT",
                    &format!("/{name}"),
                    &self.access_key,
                    &self.secret_key,
                )
                .unwrap();
                assert_eq!(status, 200, "RGW create bucket {name}: {body}");
            }
        }
    }

    /// The `store` section of a tier configuration for `bucket` on this server.
    pub fn store_json(&self, bucket: &str) -> Value {
        let mut store = json!({
            "type": "s3",
            "bucket": bucket,
            "endpoint_override": self.endpoint(),
            "scheme": self.scheme(),
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": "us-east-1",
            "connect_timeout_ms": 5000,
            "request_timeout_ms": 30000,
            "max_retries": 3,
        });
        if let Some(tls) = &self.tls {
            store["ca_bundle"] = json!(tls.ca.display().to_string());
        }
        store
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
