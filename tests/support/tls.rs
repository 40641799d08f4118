//! TLS material for the TLS tests, made with `openssl` in a temporary directory: a private
//! CA, a server certificate it signed for `localhost` and `127.0.0.1`, and a second CA that
//! signed nothing (or an impostor certificate).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::tools::find_in_path;

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
