//! Connections of the direct path: plain TCP, or TLS (rustls) over TCP, and the one rule
//! that decides whether a connection may be reused.
//!
//! Trust on TLS is the general client's: reqwest (as `object_store` configures it) verifies
//! servers with `rustls-platform-verifier`, which on Linux checks the chain with webpki
//! against the platform's roots plus the extra roots of `store.ca_bundle`, and checks the
//! certificate's name against the endpoint host. The direct path builds the same verifier
//! from the same PEM file with the same crypto provider (aws-lc-rs), sends the endpoint
//! host as SNI and offers only `http/1.1` by ALPN.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Most buffers one `writev` is given (Linux's IOV_MAX).
const MAX_WRITE_SLICES: usize = 1024;

/// The TLS side of a direct path: the client configuration and the name to verify.
pub(super) struct Tls {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl Tls {
    /// The TLS client for `host` (a DNS name or an IP address), trusting the platform's
    /// roots plus the certificates of `ca_bundle` (a PEM file; none when empty). An `Err`
    /// says why the direct path cannot be set up; the general client reports the same
    /// problem on its own when it meets it.
    pub(super) fn new(host: &str, ca_bundle: &str) -> Result<Tls, String> {
        let server_name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("host {host:?} is not a TLS server name: {e}"))?;
        let extra_roots = if ca_bundle.is_empty() {
            Vec::new()
        } else {
            super::super::http_options::read_ca_bundle(ca_bundle).map_err(|e| e.message)?
        };
        // The provider reqwest picks: a process-wide default if one was installed, else
        // aws-lc-rs.
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let verifier =
            rustls_platform_verifier::Verifier::new_with_extra_roots(extra_roots, provider.clone())
                .map_err(|e| format!("TLS certificate verifier: {e}"))?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))?
            // `dangerous` only names the hook for a verifier of one's own: the verifier is
            // the platform verifier reqwest uses, which checks chain and host name.
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    /// The TLS handshake on a fresh TCP connection, the server's certificate verified.
    pub(super) async fn handshake(&self, tcp: TcpStream) -> io::Result<Conn> {
        let wire = Wire {
            tcp,
            records: Records::default(),
        };
        let stream = self
            .connector
            .connect(self.server_name.clone(), wire)
            .await?;
        Ok(Conn::Tls(Box::new(stream)))
    }
}

/// A connection of the direct path.
pub(super) enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<Wire>>),
}

impl Conn {
    /// The TCP socket underneath (for socket options).
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(tcp) => tcp,
            Conn::Tls(tls) => &tls.get_ref().0.tcp,
        }
    }

    pub(super) fn is_tls(&self) -> bool {
        matches!(self, Conn::Tls(_))
    }

    /// Reads into several buffers at once: one readv on plain TCP, so that a block of many
    /// small ranges costs no more reads than one contiguous block. On TLS, rustls hands out
    /// about one record per read anyway: the first buffer only.
    pub(super) async fn read_vectored(
        &mut self,
        bufs: &mut [io::IoSliceMut<'_>],
    ) -> io::Result<usize> {
        match self {
            Conn::Plain(tcp) => loop {
                tcp.readable().await?;
                match tcp.try_read_vectored(bufs) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    other => return other,
                }
            },
            Conn::Tls(tls) => match bufs.first_mut() {
                Some(first) => tokio::io::AsyncReadExt::read(tls.as_mut(), first).await,
                None => Ok(0),
            },
        }
    }

    /// Writes `pieces` (a request head, then a body's pieces) whole. On plain TCP as few
    /// `writev` calls as the socket takes, up to [`MAX_WRITE_SLICES`] buffers each, so that a
    /// body of many ranges costs no more system calls than a contiguous one. On TLS piece
    /// after piece into rustls (which seals records of its own size anyway), then a flush.
    pub(super) async fn write_all_pieces(&mut self, pieces: &[&[u8]]) -> io::Result<()> {
        match self {
            Conn::Plain(tcp) => {
                let mut slices: Vec<io::IoSlice<'_>> = pieces
                    .iter()
                    .filter(|piece| !piece.is_empty())
                    .map(|piece| io::IoSlice::new(piece))
                    .collect();
                let mut left = &mut slices[..];
                while !left.is_empty() {
                    tcp.writable().await?;
                    let batch = left.len().min(MAX_WRITE_SLICES);
                    match tcp.try_write_vectored(&left[..batch]) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => io::IoSlice::advance_slices(&mut left, n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Conn::Tls(tls) => {
                use tokio::io::AsyncWriteExt;
                for piece in pieces {
                    tls.write_all(piece).await?;
                }
                tls.flush().await
            }
        }
    }

    /// Whether nothing at all is left to read on the connection and the peer has not
    /// closed it: the condition for putting it back in the pool, and for taking it out.
    ///
    /// On plain TCP that is a quiet socket. On TLS a quiet socket is not enough: rustls
    /// reads the socket in bulk, so bytes the server sent after the response may already
    /// sit in rustls, either decrypted (plaintext not yet read) or as the first part of a
    /// record whose rest has not arrived. A connection is reused only when rustls holds no
    /// plaintext, has not seen the peer's close_notify, every byte read from the socket
    /// belongs to a complete record (counted by [`Wire`]) and the socket itself is quiet.
    /// A TLS message that is not data (a late session ticket, a key update) also makes a
    /// connection fail this; that only costs a new connection.
    pub(super) fn is_drained(&mut self) -> bool {
        match self {
            Conn::Plain(tcp) => is_quiet(tcp),
            Conn::Tls(tls) => {
                let (wire, session) = tls.get_mut();
                let Ok(state) = session.process_new_packets() else {
                    return false;
                };
                state.plaintext_bytes_to_read() == 0
                    && !state.peer_has_closed()
                    && wire.records.at_boundary()
                    && is_quiet(&wire.tcp)
            }
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Conn::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_write(cx, data),
            Conn::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Conn::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Conn::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The TCP stream under a TLS session, counting TLS record boundaries in what rustls reads
/// from it: [`Conn::is_drained`] needs to know whether rustls holds part of a record.
pub(super) struct Wire {
    tcp: TcpStream,
    records: Records,
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.records.feed(&buf.filled()[before..]);
        }
        polled
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// Where a byte stream stands in its TLS records (5-byte header: type, version, length).
#[derive(Debug, Default)]
struct Records {
    header: [u8; 5],
    header_len: usize,
    body_left: usize,
}

impl Records {
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(data.len());
                self.body_left -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.header_len).min(data.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
            self.header_len += n;
            data = &data[n..];
            if self.header_len == 5 {
                self.body_left = u16::from_be_bytes([self.header[3], self.header[4]]) as usize;
                self.header_len = 0;
            }
        }
    }

    /// Whether every byte fed belongs to a complete record.
    fn at_boundary(&self) -> bool {
        self.header_len == 0 && self.body_left == 0
    }
}

/// Whether nothing waits to be read on `conn` and the peer has not closed it: a
/// non-blocking peek finds no byte.
pub(super) fn is_quiet(conn: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // SAFETY: a valid socket descriptor owned by `conn`, and a one-byte buffer that
    // outlives the call; MSG_PEEK leaves the byte queued, MSG_DONTWAIT never blocks.
    let n = unsafe {
        libc::recv(
            conn.as_raw_fd(),
            (&mut byte as *mut u8).cast::<libc::c_void>(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_boundaries_are_tracked_across_reads() {
        let mut r = Records::default();
        assert!(r.at_boundary());
        // A record of 3 bytes, then a record of 0, then the start of a third.
        let stream = [
            23, 3, 3, 0, 3, b'a', b'b', b'c', 23, 3, 3, 0, 0, 23, 3, 3, 1, 0, b'x',
        ];
        for split in 0..=stream.len() {
            let mut r = Records::default();
            r.feed(&stream[..split]);
            r.feed(&stream[split..]);
            assert!(!r.at_boundary(), "split at {split}");
        }
        r.feed(&stream[..13]);
        assert!(r.at_boundary());
        for cut in [1, 4, 5, 7] {
            let mut r = Records::default();
            r.feed(&stream[..cut]);
            assert!(!r.at_boundary(), "{cut}");
        }
        let mut r = Records::default();
        r.feed(&[23, 3, 3, 1, 0]);
        r.feed(&[0u8; 255]);
        assert!(!r.at_boundary());
        r.feed(&[0u8]);
        assert!(r.at_boundary());
    }

    #[test]
    fn a_bad_ca_bundle_gives_no_tls_client() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = Tls::new("localhost", missing.to_str().unwrap())
            .err()
            .unwrap();
        assert!(err.contains("store.ca_bundle"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let err = Tls::new("localhost", empty.to_str().unwrap())
            .err()
            .unwrap();
        assert!(err.contains("holds no certificate"), "{err}");
        assert!(Tls::new("localhost", "").is_ok());
        assert!(Tls::new("127.0.0.1", "").is_ok());
    }
}
