//! `tls-relay UPSTREAM_PORT CERT_PEM KEY_PEM`: terminates TLS (rustls, aws-lc-rs) on a free
//! loopback port and forwards the plaintext to `127.0.0.1:UPSTREAM_PORT`. Prints
//! `listening on 127.0.0.1:PORT` once ready and runs until killed. The same relay the TLS
//! tests put in front of s3s-fs (`tests/support/tls_relay.rs`); `bench/https_loads.py`
//! puts it in front of the bench sink and s3s-fs, which serve plain HTTP only.

#[path = "../tests/support/tls_relay.rs"]
#[allow(dead_code)]
mod tls_relay;

use std::io::Write;
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [upstream, cert, key] = &args[..] else {
        eprintln!("usage: tls-relay UPSTREAM_PORT CERT_PEM KEY_PEM");
        std::process::exit(2);
    };
    let upstream: u16 = upstream.parse().unwrap_or_else(|_| {
        eprintln!("UPSTREAM_PORT {upstream:?} is not a port");
        std::process::exit(2);
    });
    let relay = tls_relay::TlsRelay::terminating(upstream, Path::new(cert), Path::new(key));
    println!("listening on {}", relay.endpoint());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}
