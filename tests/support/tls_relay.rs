//! A TCP relay on a loopback port in front of a real server, for the TLS tests: it either
//! terminates TLS (rustls, with a certificate of a test CA) and forwards the plaintext to a
//! plain-HTTP server such as s3s-fs, or passes the bytes through unchanged (in front of a
//! server that speaks TLS itself, such as moto's TLS mode). It counts the connections it
//! accepted (with TLS: handshakes), can swap its certificate, its upstream, and close every
//! open connection, as a server restart would.
//!
//! One thread with its own tokio runtime; dropping the relay ends it and its connections.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

struct Inner {
    upstream: Mutex<u16>,
    /// `None`: pass bytes through.
    acceptor: Mutex<Option<TlsAcceptor>>,
    accepted: AtomicU64,
    /// Bumped to close every open connection.
    generation: watch::Sender<u64>,
}

pub struct TlsRelay {
    port: u16,
    inner: Arc<Inner>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A rustls server configuration for the certificate chain and key in PEM files.
pub fn server_acceptor(cert: &Path, key: &Path) -> TlsAcceptor {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsAcceptor::from(Arc::new(config))
}

impl TlsRelay {
    /// Terminates TLS with `cert`/`key` and forwards plaintext to `127.0.0.1:upstream`.
    pub fn terminating(upstream: u16, cert: &Path, key: &Path) -> TlsRelay {
        Self::start(upstream, Some(server_acceptor(cert, key)))
    }

    /// Forwards bytes unchanged to `127.0.0.1:upstream`.
    pub fn passthrough(upstream: u16) -> TlsRelay {
        Self::start(upstream, None)
    }

    fn start(upstream: u16, acceptor: Option<TlsAcceptor>) -> TlsRelay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let inner = Arc::new(Inner {
            upstream: Mutex::new(upstream),
            acceptor: Mutex::new(acceptor),
            accepted: AtomicU64::new(0),
            generation: watch::channel(0).0,
        });
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = inner.clone();
        let thread = std::thread::Builder::new()
            .name("tls-relay".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).unwrap();
                    loop {
                        tokio::select! {
                            _ = &mut stopped => return,
                            accepted = listener.accept() => {
                                let Ok((client, _)) = accepted else { continue };
                                shared.accepted.fetch_add(1, Ordering::SeqCst);
                                tokio::spawn(relay(shared.clone(), client));
                            }
                        }
                    }
                });
            })
            .unwrap();
        TlsRelay {
            port,
            inner,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far (on a terminating relay, each one is a handshake).
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::SeqCst)
    }

    pub fn set_upstream(&self, port: u16) {
        *self.inner.upstream.lock().unwrap() = port;
    }

    /// New handshakes present this certificate (open connections keep theirs).
    pub fn set_identity(&self, cert: &Path, key: &Path) {
        *self.inner.acceptor.lock().unwrap() = Some(server_acceptor(cert, key));
    }

    /// Closes every open connection (without a TLS close_notify).
    pub fn close_connections(&self) {
        self.inner.generation.send_modify(|g| *g += 1);
    }
}

async fn relay(inner: Arc<Inner>, client: TcpStream) {
    let _ = client.set_nodelay(true);
    let mut closed = inner.generation.subscribe();
    let acceptor = inner.acceptor.lock().unwrap().clone();
    let upstream_port = *inner.upstream.lock().unwrap();
    let connect = move || async move {
        let upstream = TcpStream::connect(("127.0.0.1", upstream_port)).await?;
        let _ = upstream.set_nodelay(true);
        Ok::<TcpStream, std::io::Error>(upstream)
    };
    let work = async move {
        match acceptor {
            None => {
                let mut client = client;
                let mut upstream = connect().await?;
                tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
            }
            Some(acceptor) => {
                // The handshake first: a client that refuses the certificate never
                // reaches the upstream.
                let mut client = acceptor.accept(client).await?;
                let mut upstream = connect().await?;
                tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
            }
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::select! {
        _ = work => {}
        _ = closed.changed() => {}
    }
}

impl Drop for TlsRelay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
