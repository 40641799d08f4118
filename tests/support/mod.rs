//! Shared helpers of the S3 integration tests: real S3 servers (s3s-fs, moto_server plain
//! and TLS, and Ceph RGW) on free loopback ports, a host pool, keys, and result collection.
//!
//! A missing server binary fails the test with a message naming the install script; it is
//! never a silent skip. Servers are killed when their handle drops, and also when the test
//! process dies (PR_SET_PDEATHSIG), so no run leaves one behind.

#![allow(dead_code)]

pub mod emulators;
pub mod proxy;
pub mod shaper;
pub mod tls_relay;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kvtier_core::key::make_key;
use kvtier_core::{JobResult, KeyBatch, Tier};
use serde_json::{json, Value};

pub const ACCESS_KEY: &str = "kvtier-test-access";
pub const SECRET_KEY: &str = "kvtier-test-secret-Zq81mN2x";

/// How long a server may take to start on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The repository's root (the workspace's), whichever of its crates runs the test.
pub fn manifest_dir() -> PathBuf {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .find(|dir| dir.join("scripts/test.sh").is_file())
        .unwrap_or(&crate_dir)
        .to_path_buf()
}

/// The `kvtier` command line of this build (`target/<profile>/kvtier`, beside the test's own
/// `deps/` directory). The README's test command (`cargo test --workspace`) builds it with
/// the command line's own tests before any test runs; a test of another crate run alone
/// needs `cargo build -p kvtier-cli` first, and is told so.
#[allow(dead_code)]
pub fn kvtier_cli() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("tests run from target/<profile>/deps");
    let cli = profile_dir.join("kvtier");
    assert!(
        cli.is_file(),
        "{} not found: build the command line first (`cargo build --release -p kvtier-cli`), \
         or run the whole workspace's tests (`cargo test --release --workspace`)",
        cli.display()
    );
    cli
}

/// `scripts/ceph-rgw.sh`, which sets up and runs a one-node Ceph cluster with radosgw.
pub fn ceph_rgw_script() -> PathBuf {
    let script = manifest_dir().join("scripts/ceph-rgw.sh");
    for binary in ["radosgw", "ceph-mon", "ceph-osd", "radosgw-admin"] {
        assert!(
            find_in_path(binary).is_some(),
            "{binary} not found in PATH: run `{} install` or {} (the RGW tests need a real Ceph RGW and never skip)",
            script.display(),
            install_hint()
        );
    }
    script
}

fn install_hint() -> String {
    format!(
        "run `{}/scripts/install-tools.sh` (the S3 tests need real servers and never skip)",
        manifest_dir().display()
    )
}

/// The s3s-fs binary: `$KVTIER_S3S_FS`, else `tools/bin/s3s-fs`.
pub fn s3s_fs_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KVTIER_S3S_FS") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "KVTIER_S3S_FS={} is not a file; {}",
            p.display(),
            install_hint()
        );
        return p;
    }
    let p = manifest_dir().join("tools/bin/s3s-fs");
    assert!(
        p.is_file(),
        "s3s-fs not found at {} (nor $KVTIER_S3S_FS); {}",
        p.display(),
        install_hint()
    );
    p
}

/// The moto_server binary: `$KVTIER_MOTO_SERVER`, else `tools/venv/bin/moto_server`, else `PATH`.
pub fn moto_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KVTIER_MOTO_SERVER") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "KVTIER_MOTO_SERVER={} is not a file; {}",
            p.display(),
            install_hint()
        );
        return p;
    }
    let venv = manifest_dir().join("tools/venv/bin/moto_server");
    if venv.is_file() {
        return venv;
    }
    if let Some(p) = find_in_path("moto_server") {
        return p;
    }
    panic!(
        "moto_server not found (looked at $KVTIER_MOTO_SERVER, {}, PATH); {}",
        venv.display(),
        install_hint()
    );
}

pub fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// A port nobody listens on right now (the OS picks it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_killed_with_parent(cmd: &mut Command) -> std::io::Result<Child> {
    // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.stdin(Stdio::null()).spawn()
}

/// One plain-HTTP request over a fresh connection; returns the status and body.
pub fn http_plain(port: u16, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// One plain-HTTP request without a body, signed with SigV4 (region us-east-1), over a
/// fresh connection; returns the status and body. For servers that check signatures on
/// every request, such as Ceph RGW's bucket creation.
pub fn signed_plain(
    port: u16,
    method: &str,
    path: &str,
    access_key: &str,
    secret_key: &str,
) -> std::io::Result<(u16, String)> {
    signed_request(port, method, path, b"", access_key, secret_key)
}

/// [`signed_plain`] with a body; `path` may carry a query of bare names (`/bucket?policy`).
pub fn signed_request(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    access_key: &str,
    secret_key: &str,
) -> std::io::Result<(u16, String)> {
    use sha2::{Digest, Sha256};
    fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
        let mut block = [0u8; 64];
        if key.len() > 64 {
            block[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            block[..key.len()].copy_from_slice(key);
        }
        let inner = Sha256::new()
            .chain_update(block.map(|b| b ^ 0x36))
            .chain_update(data)
            .finalize();
        Sha256::new()
            .chain_update(block.map(|b| b ^ 0x5c))
            .chain_update(inner)
            .finalize()
            .into()
    }
    let hex = |b: &[u8]| kvtier_core::key::to_hex(b);
    let datetime = {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let (days, rem) = ((secs / 86400) as i64, secs % 86400);
        // Howard Hinnant's civil_from_days.
        let z = days + 719468;
        let era = z.div_euclid(146097);
        let doe = z - era * 146097;
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!(
            "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    };
    let date = &datetime[..8];
    let host = format!("127.0.0.1:{port}");
    let payload = hex(&Sha256::digest(body));
    let (uri, query) = path.split_once('?').unwrap_or((path, ""));
    let mut names: Vec<String> = query
        .split('&')
        .filter(|q| !q.is_empty())
        .map(|q| {
            if q.contains('=') {
                q.to_string()
            } else {
                format!("{q}=")
            }
        })
        .collect();
    names.sort();
    let query = names.join("&");
    let canonical = format!(
        "{method}\n{uri}\n{query}\nhost:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{datetime}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload}"
    );
    let scope = format!("{date}/us-east-1/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{datetime}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(format!("AWS4{secret_key}").as_bytes(), date.as_bytes());
    for part in [&b"us-east-1"[..], b"s3", b"aws4_request"] {
        key = hmac(&key, part);
    }
    let signature = hex(&hmac(&key, to_sign.as_bytes()));
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nx-amz-content-sha256: {payload}\r\nx-amz-date: {datetime}\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, \
         Signature={signature}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// One HTTPS request through object_store's own HTTP client, trusting `ca`.
pub fn https_request(
    port: u16,
    ca: &Path,
    method: &str,
    path: &str,
) -> Result<(u16, String), String> {
    use object_store::client::{HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector};
    let pem = std::fs::read(ca).map_err(|e| e.to_string())?;
    let mut options = object_store::ClientOptions::new().with_timeout(Duration::from_secs(20));
    for cert in object_store::Certificate::from_pem_bundle(&pem).map_err(|e| e.to_string())? {
        options = options.with_root_certificate(cert);
    }
    let client = ReqwestConnector::default()
        .connect(&options)
        .map_err(|e| e.to_string())?;
    let mut request = HttpRequest::new(HttpRequestBody::from(Vec::new()));
    *request.method_mut() = method.parse().map_err(|_| "bad method".to_string())?;
    *request.uri_mut() = format!("https://127.0.0.1:{port}{path}")
        .parse()
        .map_err(|_| "bad uri".to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let response = client
            .execute(request)
            .await
            .map_err(|e| kvtier_core::store::error_chain(&e))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .bytes()
            .await
            .map_err(|e| e.to_string())?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    })
}

// ------------------------------------------------------------------------------------
// TLS material

/// A private CA and a server certificate it signed for `localhost` and `127.0.0.1`.
pub struct Tls {
    dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// A second CA that signed nothing: a wrong `ca_bundle`.
    pub other_ca: PathBuf,
}

fn openssl(args: &[&str], dir: &Path) {
    let openssl = find_in_path("openssl")
        .unwrap_or_else(|| panic!("openssl not found in PATH: the TLS tests generate their certificates with it (apt-get install openssl)"));
    let out = Command::new(openssl)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A server certificate (for `localhost` and `127.0.0.1`) of a CA nobody trusts.
pub struct Impostor {
    _tls: Tls,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Tls {
    /// A server certificate signed by `other_ca`, whose name differs from `ca`'s: a
    /// client trusting `ca` finds no issuer for it (UnknownIssuer).
    pub fn signed_by_other_ca(self) -> Impostor {
        let d = self.dir.path();
        sign_server_certificate(d, "other-ca", "impostor.pem");
        Impostor {
            cert: d.join("impostor.pem"),
            key: self.key.clone(),
            _tls: self,
        }
    }

    pub fn generate() -> Tls {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for (name, cn) in [
            ("ca", "kvtier test CA"),
            ("other-ca", "kvtier unrelated CA"),
        ] {
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            let (key, pem, subj) = (
                format!("{name}.key"),
                format!("{name}.pem"),
                format!("/CN={cn}"),
            );
            args.extend(["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj]);
            args.extend([
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(&args, d);
        }
        let mut args = vec!["req"];
        args.extend(ec);
        args.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        openssl(&args, d);
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        sign_server_certificate(d, "ca", "server.pem");
        Tls {
            ca: d.join("ca.pem"),
            cert: d.join("server.pem"),
            key: d.join("server.key"),
            other_ca: d.join("other-ca.pem"),
            dir,
        }
    }
}

/// Signs `server.csr` in `dir` with the CA `<ca>.pem`/`<ca>.key` into `out`.
fn sign_server_certificate(dir: &Path, ca: &str, out: &str) {
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            out,
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
        dir,
    );
}

// ------------------------------------------------------------------------------------
// Servers

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    S3sFs,
    Moto,
    MotoTls,
    /// Ceph RGW 16 (radosgw, beast frontend) on a one-node memstore cluster.
    Rgw,
}

/// The RGW user that owns nothing (`scripts/ceph-rgw.sh`): a bucket policy can grant it
/// object access without s3:ListBucket.
pub const RGW_NOLIST_USER: &str = "kvtier-nolist";
pub const RGW_NOLIST_ACCESS_KEY: &str = "kvtier-rgw-nolist";
pub const RGW_NOLIST_SECRET_KEY: &str = "kvtier-rgw-nolist-secret-8sQw";

/// How long Ceph RGW may take to start (mon, OSD, radosgw and a user; 13-19 s idle).
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
        let server = Server {
            kind: Kind::S3sFs,
            port: AtomicU16::new(0),
            access_key: ACCESS_KEY.to_string(),
            secret_key: SECRET_KEY.to_string(),
            child: Mutex::new(None),
            root: Some(tempfile::tempdir().unwrap()),
            logs: tempfile::tempdir().unwrap(),
            tls: None,
        };
        server.start();
        server
    }

    /// A fresh moto_server (plain HTTP). moto accepts any credentials.
    pub fn moto() -> Server {
        Self::new_moto(Kind::Moto, None)
    }

    /// A fresh moto_server serving TLS with a certificate of the private CA in `tls`.
    pub fn moto_tls(tls: Arc<Tls>) -> Server {
        Self::new_moto(Kind::MotoTls, Some(tls))
    }

    fn new_moto(kind: Kind, tls: Option<Arc<Tls>>) -> Server {
        let server = Server {
            kind,
            port: AtomicU16::new(0),
            access_key: "moto-access".to_string(),
            secret_key: "moto-secret-Kp29vX".to_string(),
            child: Mutex::new(None),
            root: None,
            logs: tempfile::tempdir().unwrap(),
            tls,
        };
        server.start();
        server
    }

    /// A fresh one-node Ceph cluster with radosgw (`scripts/ceph-rgw.sh run`), its data in
    /// memory, killed with the test process.
    pub fn rgw() -> Server {
        let server = Server {
            kind: Kind::Rgw,
            port: AtomicU16::new(0),
            access_key: "kvtier-rgw-access".to_string(),
            secret_key: "kvtier-rgw-secret-Vb71qZ".to_string(),
            child: Mutex::new(None),
            root: None,
            logs: tempfile::tempdir().unwrap(),
            tls: None,
        };
        server.start();
        server
    }

    /// One moto_server per test binary, shared by its tests (each uses its own bucket).
    /// Started from a thread that never exits, so PR_SET_PDEATHSIG fires only when the
    /// test process does.
    pub fn shared_moto() -> &'static Server {
        static SHARED: OnceLock<&'static Server> = OnceLock::new();
        SHARED.get_or_init(|| Self::leak_from_parked_thread("shared-moto", Server::moto))
    }

    /// One Ceph RGW per test binary, shared by its tests (each uses its own bucket).
    pub fn shared_rgw() -> &'static Server {
        static SHARED: OnceLock<&'static Server> = OnceLock::new();
        SHARED.get_or_init(|| Self::leak_from_parked_thread("shared-rgw", Server::rgw))
    }

    fn leak_from_parked_thread(name: &str, start: fn() -> Server) -> &'static Server {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let server: &'static Server = Box::leak(Box::new(start()));
                tx.send(server).unwrap();
                loop {
                    std::thread::park();
                }
            })
            .unwrap();
        rx.recv()
            .unwrap_or_else(|_| panic!("{name} failed to start (see the panic above)"))
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
            for daemon in ["mon.a", "osd.0", "client.rgw.a"] {
                let log =
                    std::fs::read_to_string(self.ceph_dir().join(format!("log/ceph-{daemon}.log")))
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

/// A tier configuration: `store`, the vLLM-style prefix and namespace, plus `extra` keys.
pub fn tier_json(store: Value, extra: Value) -> String {
    let mut config = json!({"store": store, "prefix": "kv", "namespace": "m_0123456789ab_r0"});
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            config[k] = v;
        }
    }
    config.to_string()
}

/// Sets `key = value` in an object (for tweaking a `store` section).
pub fn with(mut value: Value, key: &str, v: Value) -> Value {
    value[key] = v;
    value
}

// ------------------------------------------------------------------------------------
// Host pool, keys, results

/// A host pool. Once registered with a tier, its memory is never freed: tests declare
/// the pool after the tier, so it is dropped first, and a test that fails with jobs in
/// flight would otherwise drop the memory those jobs still write into.
pub struct Pool {
    pub mem: Vec<u8>,
    pub blocks: u64,
    pub block_bytes: usize,
    registered: bool,
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.registered {
            std::mem::forget(std::mem::take(&mut self.mem));
        }
    }
}

impl Pool {
    pub fn new(blocks: u64, block_bytes: usize) -> Self {
        Pool {
            mem: vec![0u8; blocks as usize * block_bytes],
            blocks,
            block_bytes,
            registered: false,
        }
    }
    pub fn block(&self, i: u64) -> &[u8] {
        &self.mem[i as usize * self.block_bytes..(i as usize + 1) * self.block_bytes]
    }
    pub fn block_mut(&mut self, i: u64) -> &mut [u8] {
        &mut self.mem[i as usize * self.block_bytes..(i as usize + 1) * self.block_bytes]
    }
    pub fn fill_random(&mut self, seed: u64) {
        fill_random(&mut self.mem, seed);
    }
    pub fn register(&mut self, tier: &Tier) {
        self.registered = true;
        unsafe {
            tier.register_memory(self.mem.as_mut_ptr(), self.blocks, self.block_bytes)
                .unwrap()
        }
    }
}

pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
}

pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_random(&mut v, seed);
    v
}

/// A 36-byte vLLM key (SHA-256-sized hash + group) derived from `i`.
pub fn key(i: u64) -> Vec<u8> {
    let mut hash = [0u8; 32];
    hash[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
    hash[8..16].copy_from_slice(&i.to_le_bytes());
    make_key(&hash, (i % 3) as u32)
}

pub fn keys(ids: &[u64]) -> KeyBatch {
    KeyBatch::from_keys(&ids.iter().map(|&i| key(i)).collect::<Vec<_>>()).unwrap()
}

/// Waits for every job in flight and returns exactly `expected` results by job id,
/// failing on a duplicate or a missing result.
pub fn wait_all(tier: &Tier, expected: usize) -> HashMap<u64, JobResult> {
    tier.drain(Duration::from_secs(180))
        .expect("jobs did not finish within 180 s");
    let mut seen = HashMap::new();
    for r in tier.poll(usize::MAX) {
        let id = r.job_id;
        assert!(seen.insert(id, r).is_none(), "job {id} reported twice");
    }
    assert_eq!(
        seen.len(),
        expected,
        "expected {expected} results, got {}",
        seen.len()
    );
    seen
}

/// Runs a future on a throwaway runtime (for out-of-band store access in tests).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

// ------------------------------------------------------------------------------------
// Out-of-band store access (a separate client, as another writer of the bucket would be)

/// A store built from a `store` JSON section, for writing and reading objects behind the
/// tier's back. Build it inside the runtime that uses it.
pub fn oob_store(store: &Value) -> kvtier_core::store::Store {
    let config: kvtier_core::config::StoreConfig = serde_json::from_value(store.clone()).unwrap();
    kvtier_core::store::Store::open(&config).unwrap()
}

pub fn oob_put(store: &Value, name: &str, bytes: Vec<u8>) {
    use object_store::ObjectStoreExt;
    block_on(async {
        let s = oob_store(store);
        s.client()
            .put(&kvtier_core::store::object_path(name), bytes.into())
            .await
            .unwrap();
    })
}

/// The object's bytes, or `None` if it does not exist.
pub fn oob_get(store: &Value, name: &str) -> Option<Vec<u8>> {
    use object_store::ObjectStoreExt;
    block_on(async {
        let s = oob_store(store);
        match s.client().get(&kvtier_core::store::object_path(name)).await {
            Ok(r) => Some(r.bytes().await.unwrap().to_vec()),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("out-of-band get {name}: {e}"),
        }
    })
}

/// Calls lookup until it stops answering Retry, ending a step between calls.
pub fn resolve_lookup(tier: &Tier, request: u64, k: &[u8]) -> kvtier_core::LookupResult {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let v = tier.lookup(request, k).unwrap();
        if v != kvtier_core::LookupResult::Retry {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lookup never resolved"
        );
        tier.schedule_end().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Defines each named test body (`fn(&Server)`) as three tests: one on a fresh s3s-fs,
/// one on the test binary's shared moto_server, one on its shared Ceph RGW.
#[allow(unused_macros)]
macro_rules! on_both_servers {
    ($($name:ident),* $(,)?) => {
        mod s3s_fs {
            $( #[test] fn $name() { let server = super::Server::s3s_fs(); super::$name(&server); } )*
        }
        mod moto {
            $( #[test] fn $name() { super::$name(super::Server::shared_moto()); } )*
        }
        mod rgw {
            $( #[test] fn $name() { super::$name(super::Server::shared_rgw()); } )*
        }
    };
}

/// Whether process `pid` or one of its descendants (radosgw under its supervising script)
/// holds the socket listening on loopback port `port`, from /proc.
fn holds_listener(pid: u32, port: u16) -> bool {
    let listening: std::collections::HashSet<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|row| {
                    let fields: Vec<&str> = row.split_whitespace().collect();
                    let local_port = fields.get(1)?.rsplit(':').next()?;
                    let listens = fields.get(3) == Some(&"0A")
                        && u16::from_str_radix(local_port, 16) == Ok(port);
                    listens.then(|| fields.get(9).map(|inode| inode.to_string()))?
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // Every process with its parent, to find `pid`'s descendants.
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // The fields after the command name (which may hold spaces): state, parent.
            let parent = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((child, parent))
        })
        .collect();
    let mut family = vec![pid];
    let mut next = 0;
    while next < family.len() {
        let parent = family[next];
        family.extend(parents.iter().filter(|p| p.1 == parent).map(|p| p.0));
        next += 1;
    }
    family.iter().any(|member| {
        std::fs::read_dir(format!("/proc/{member}/fd"))
            .into_iter()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter_map(|target| {
                let target = target.to_str()?;
                Some(
                    target
                        .strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .to_string(),
                )
            })
            .any(|inode| listening.contains(&inode))
    })
}
