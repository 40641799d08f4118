//! A fault-injecting HTTP/1.1 proxy for the S3 tests.
//!
//! It sits between kvtier and a real server on loopback, understands request and response
//! framing (Content-Length and chunked), keeps connections alive like a real server, and
//! asks a rule what to do with each request: pass it, delay it, answer an error itself,
//! drop the connection mid-request, drop or stall the answer after the server acted,
//! corrupt the request body, cut, shorten or corrupt the response body, answer as a server that ignores Range, or
//! turn the server's 404 into a 403 AccessDenied (a principal without ListBucket).
//!
//! Threads, not async: one per connection, all of them ended by dropping the proxy.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the proxy does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward unchanged.
    Pass,
    /// Wait, then forward.
    Delay(Duration),
    /// Answer this HTTP status with an S3 error body, without asking the server.
    Status(u16),
    /// Answer this HTTP status with this error code, without asking the server: in an XML
    /// error body (`<Error><Code>`, as S3, Azure and GCS's XML API send it), or only in an
    /// `x-ms-error-code` header (as Azure answers a HEAD) when `in_header`.
    Answer {
        status: u16,
        code: &'static str,
        in_header: bool,
    },
    /// Read the request head and half its body, then close the connection.
    DropRequest,
    /// Read the request head and half its body, then reset the connection (RST, as a
    /// crashing middlebox or a dropped NAT entry does): the client sees ECONNRESET.
    ResetRequest,
    /// Forward; send the response head and half the body, then close the connection
    /// (the client sees a body shorter than its Content-Length).
    CutResponse,
    /// Forward; send half the body with a Content-Length that says so (Content-Range
    /// still claims the whole range): a well-framed response that is simply too short.
    ShortResponse,
    /// Forward; answer 403 AccessDenied wherever the server answers 404.
    Forbid404,
    /// Forward (the server acts on the request), then close the connection without
    /// sending the answer: a reset after the fact.
    DropResponse,
    /// Forward (the server acts on the request), then answer this HTTP status with an S3
    /// error body instead of the server's answer, and close the connection: a gateway
    /// that failed after its server stored the object.
    StatusAfter(u16),
    /// Forward (the server acts on the request), then hold the answer back for this long
    /// and close the connection: a stall the client times out on.
    StallResponse(Duration),
    /// Forward; flip one byte of the response body, at an offset that differs from request
    /// to request (in-transit corruption; the stored object is intact).
    CorruptBody,
    /// Flip one byte of the request body on its way to the server, at an offset that
    /// differs from request to request (an upload damaged in transit).
    CorruptRequestBody,
    /// Forward; answer a 206 as a server that ignores Range would: `200 OK` without
    /// Content-Range, same body (true to life when the range covers the whole object).
    IgnoreRange,
    /// Forward; answer `200 OK` without Content-Range and with half the body, its
    /// Content-Length saying so: a server that ignores Range, for an object half the size.
    Short200,
}

impl Fault {
    pub fn name(&self) -> &'static str {
        match self {
            Fault::Pass => "pass",
            Fault::Delay(_) => "delay",
            Fault::Status(_) => "status",
            Fault::Answer { .. } => "answer",
            Fault::DropRequest => "drop_request",
            Fault::ResetRequest => "reset_request",
            Fault::CutResponse => "cut_response",
            Fault::ShortResponse => "short_response",
            Fault::Forbid404 => "forbid_404",
            Fault::DropResponse => "drop_response",
            Fault::StatusAfter(_) => "status_after",
            Fault::StallResponse(_) => "stall_response",
            Fault::CorruptBody => "corrupt_body",
            Fault::CorruptRequestBody => "corrupt_request_body",
            Fault::IgnoreRange => "ignore_range",
            Fault::Short200 => "short_200",
        }
    }
}

/// The request a rule decides on.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    pub method: String,
    pub path: String,
    /// 0 for the first request through the proxy, then 1, 2...
    pub seq: u64,
    /// The request's header names, lower case.
    pub header_names: Vec<String>,
}

pub type Rule = Arc<dyn Fn(&RequestInfo) -> Fault + Send + Sync>;

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub requests: u64,
    /// Requests per fault name ("pass", "status", ...).
    pub by_fault: std::collections::HashMap<&'static str, u64>,
    /// Requests per method.
    pub by_method: std::collections::HashMap<String, u64>,
}

impl Stats {
    pub fn faults(&self, name: &str) -> u64 {
        self.by_fault.get(name).copied().unwrap_or(0)
    }
}

struct Inner {
    upstream: Mutex<SocketAddr>,
    rule: RwLock<Rule>,
    stop: AtomicBool,
    seq: AtomicU64,
    stats: Mutex<Stats>,
    connections: Mutex<Vec<TcpStream>>,
}

pub struct Proxy {
    port: u16,
    inner: Arc<Inner>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free loopback port forwarding to `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let inner = Arc::new(Inner {
            upstream: Mutex::new(SocketAddr::from(([127, 0, 0, 1], upstream_port))),
            rule: RwLock::new(Arc::new(|_: &RequestInfo| Fault::Pass)),
            stop: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            stats: Mutex::new(Stats::default()),
            connections: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("proxy-accept".into())
                .spawn(move || {
                    for stream in listener.incoming() {
                        if inner.stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let Ok(stream) = stream else { continue };
                        if let Ok(clone) = stream.try_clone() {
                            let mut conns = inner.connections.lock().unwrap();
                            conns.retain(|c| c.peer_addr().is_ok());
                            conns.push(clone);
                        }
                        let inner = inner.clone();
                        let _ = std::thread::Builder::new().name("proxy-conn".into()).spawn(
                            move || {
                                let closer = stream.try_clone();
                                let outcome = serve(&inner, stream);
                                if outcome.as_ref().is_err_and(|e| {
                                    e.kind() == std::io::ErrorKind::ConnectionReset
                                        && e.to_string() == RESET
                                }) {
                                    // Close every descriptor of the socket (SO_LINGER 0 is set):
                                    // the kernel answers with RST instead of FIN.
                                    if let Ok(c) = closer {
                                        let peer = c.peer_addr().ok();
                                        inner
                                            .connections
                                            .lock()
                                            .unwrap()
                                            .retain(|k| k.peer_addr().ok() != peer);
                                    }
                                    return;
                                }
                                // Whatever ended the exchange, the client must see the close
                                // (the registry holds a clone that would keep it open).
                                if let Ok(c) = closer {
                                    let _ = c.shutdown(Shutdown::Both);
                                }
                            },
                        );
                    }
                })
                .unwrap()
        };
        Proxy {
            port,
            inner,
            acceptor: Some(acceptor),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Points the proxy at another server port (after a restart).
    pub fn set_upstream(&self, port: u16) {
        *self.inner.upstream.lock().unwrap() = SocketAddr::from(([127, 0, 0, 1], port));
    }

    pub fn set_rule(&self, rule: impl Fn(&RequestInfo) -> Fault + Send + Sync + 'static) {
        *self.inner.rule.write().unwrap() = Arc::new(rule);
    }

    pub fn stats(&self) -> Stats {
        self.inner.stats.lock().unwrap().clone()
    }

    /// Closes every open connection (both directions), as a crashing server would.
    pub fn close_connections(&self) {
        for c in self.inner.connections.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        self.close_connections();
    }
}

// ------------------------------------------------------------------------------------
// HTTP framing

struct Head {
    raw: Vec<u8>,
    first_line: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn content_length(&self) -> Option<u64> {
        self.header("content-length")
            .and_then(|v| v.trim().parse().ok())
    }
    fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }
    fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// Reads a message head; `None` on a clean EOF before any byte.
fn read_head(r: &mut impl BufRead) -> std::io::Result<Option<Head>> {
    let mut raw = Vec::new();
    loop {
        let before = raw.len();
        let n = r.read_until(b'\n', &mut raw)?;
        if n == 0 {
            if raw.is_empty() {
                return Ok(None);
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "EOF inside a message head",
            ));
        }
        let line = &raw[before..];
        if line == b"\r\n" || line == b"\n" {
            break;
        }
        if raw.len() > 64 * 1024 {
            return Err(std::io::Error::other("message head too long"));
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let mut lines = text.split("\r\n");
    let first_line = lines.next().unwrap_or_default().to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Some(Head {
        raw,
        first_line,
        headers,
    }))
}

/// How a body is delimited.
#[derive(Clone, Copy)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

fn request_framing(h: &Head) -> Framing {
    if h.chunked() {
        Framing::Chunked
    } else {
        match h.content_length() {
            Some(n) if n > 0 => Framing::Length(n),
            _ => Framing::None,
        }
    }
}

fn response_framing(h: &Head, status: u16, head_request: bool) -> Framing {
    if head_request || status == 204 || status == 304 || (100..200).contains(&status) {
        Framing::None
    } else if h.chunked() {
        Framing::Chunked
    } else {
        match h.content_length() {
            Some(0) => Framing::None,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    }
}

fn copy_exact(r: &mut impl Read, w: &mut (impl Write + ?Sized), mut n: u64) -> std::io::Result<()> {
    let mut buf = [0u8; 64 * 1024];
    while n > 0 {
        let want = (buf.len() as u64).min(n) as usize;
        let got = r.read(&mut buf[..want])?;
        if got == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "peer closed mid-body",
            ));
        }
        w.write_all(&buf[..got])?;
        n -= got as u64;
    }
    Ok(())
}

/// Copies a body; `None` as writer discards it.
fn copy_body(r: &mut impl BufRead, w: &mut dyn Write, framing: Framing) -> std::io::Result<()> {
    match framing {
        Framing::None => Ok(()),
        Framing::Length(n) => copy_exact(r, w, n),
        Framing::UntilClose => {
            std::io::copy(r, w)?;
            Ok(())
        }
        Framing::Chunked => loop {
            let mut line = Vec::new();
            r.read_until(b'\n', &mut line)?;
            w.write_all(&line)?;
            let text = String::from_utf8_lossy(&line);
            let size = u64::from_str_radix(text.trim().split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size line {text:?}")))?;
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    let mut t = Vec::new();
                    r.read_until(b'\n', &mut t)?;
                    w.write_all(&t)?;
                    if t == b"\r\n" || t == b"\n" || t.is_empty() {
                        return Ok(());
                    }
                }
            }
            copy_exact(r, w, size + 2)?;
        },
    }
}

fn s3_code(status: u16) -> &'static str {
    match status {
        403 => "AccessDenied",
        404 => "NoSuchKey",
        400 => "InvalidArgument",
        500 => "InternalError",
        503 => "SlowDown",
        _ => "InjectedError",
    }
}

fn write_error(w: &mut impl Write, status: u16, head_request: bool) -> std::io::Result<()> {
    write_answer(w, status, ErrorCode::Body(s3_code(status)), head_request)
}

/// Where an injected answer carries its error code.
enum ErrorCode {
    Body(&'static str),
    Header(&'static str),
}

fn write_answer(
    w: &mut impl Write,
    status: u16,
    code: ErrorCode,
    head_request: bool,
) -> std::io::Result<()> {
    let (body, header) = match code {
        ErrorCode::Body(code) => (
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected by the kvtier test proxy</Message></Error>"
            ),
            String::new(),
        ),
        ErrorCode::Header(code) => (String::new(), format!("x-ms-error-code: {code}\r\n")),
    };
    let reason = match status {
        403 => "Forbidden",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    };
    write!(
        w,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/xml\r\n{header}content-length: {}\r\n\r\n",
        body.len()
    )?;
    if !head_request {
        w.write_all(body.as_bytes())?;
    }
    w.flush()
}

/// The response head with Content-Length claiming `len` bytes; every other header
/// (Content-Range included) is left as the server sent it, so only the byte count tells.
fn shortened_head(h: &Head, len: u64) -> Vec<u8> {
    rewritten_head(h, &h.first_line, len, false)
}

/// The response head with another status line and Content-Length, optionally without
/// Content-Range, and `connection: close`.
fn rewritten_head(h: &Head, first_line: &str, len: u64, drop_content_range: bool) -> Vec<u8> {
    let mut out = format!("{first_line}\r\n");
    for (k, v) in &h.headers {
        if k.eq_ignore_ascii_case("content-length") {
            out.push_str(&format!("{k}: {len}\r\n"));
        } else if k.eq_ignore_ascii_case("connection")
            || (drop_content_range && k.eq_ignore_ascii_case("content-range"))
        {
            continue;
        } else {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    out.push_str("connection: close\r\n\r\n");
    out.into_bytes()
}

/// The error `serve` returns when the connection is to be reset, not closed.
const RESET: &str = "proxy: reset the client connection";

/// SO_LINGER with a zero timeout: closing the socket sends RST.
fn set_linger_zero(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor and a properly sized option value.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn serve(inner: &Inner, client: TcpStream) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    client.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut from_client = BufReader::new(client.try_clone()?);
    let mut to_client = client;
    let mut upstream: Option<(BufReader<TcpStream>, TcpStream)> = None;
    loop {
        let Some(request) = read_head(&mut from_client)? else {
            return Ok(());
        };
        let mut parts = request.first_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let head_request = method == "HEAD";
        let info = RequestInfo {
            method: method.clone(),
            path,
            seq: inner.seq.fetch_add(1, Ordering::SeqCst),
            header_names: request
                .headers
                .iter()
                .map(|(k, _)| k.to_ascii_lowercase())
                .collect(),
        };
        let rule = inner.rule.read().unwrap().clone();
        let fault = rule(&info);
        {
            let mut stats = inner.stats.lock().unwrap();
            stats.requests += 1;
            *stats.by_fault.entry(fault.name()).or_default() += 1;
            *stats.by_method.entry(method.clone()).or_default() += 1;
        }
        let framing = request_framing(&request);
        match fault {
            Fault::Status(code) => {
                copy_body(&mut from_client, &mut std::io::sink(), framing)?;
                write_error(&mut to_client, code, head_request)?;
                continue;
            }
            Fault::Answer {
                status,
                code,
                in_header,
            } => {
                copy_body(&mut from_client, &mut std::io::sink(), framing)?;
                let how = if in_header {
                    ErrorCode::Header(code)
                } else {
                    ErrorCode::Body(code)
                };
                write_answer(&mut to_client, status, how, head_request)?;
                continue;
            }
            Fault::ResetRequest => {
                if let Framing::Length(n) = framing {
                    copy_exact(&mut from_client, &mut std::io::sink(), n / 2)?;
                }
                set_linger_zero(&to_client);
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    RESET,
                ));
            }
            Fault::DropRequest => {
                if let Framing::Length(n) = framing {
                    copy_exact(&mut from_client, &mut std::io::sink(), n / 2)?;
                }
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            Fault::Delay(d) => std::thread::sleep(d),
            _ => {}
        }
        // The whole request body, so it can be sent again on a fresh connection if the
        // server had closed the idle one (a proxy artefact, not a fault to inject).
        let mut body = Vec::new();
        copy_body(&mut from_client, &mut body, framing)?;
        if fault == Fault::CorruptRequestBody && !body.is_empty() {
            let at = (info.seq as usize).wrapping_mul(7919) % body.len();
            body[at] ^= 0x5a;
        }
        let mut attempt = 0;
        let response = loop {
            attempt += 1;
            let reused = upstream.is_some();
            if upstream.is_none() {
                let addr = *inner.upstream.lock().unwrap();
                // A dead server: the client sees its connection closed, as with a crash.
                let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(Duration::from_secs(120)))?;
                upstream = Some((BufReader::new(stream.try_clone()?), stream));
            }
            let (from_server, to_server) = upstream.as_mut().unwrap();
            let sent = to_server
                .write_all(&request.raw)
                .and_then(|_| to_server.write_all(&body))
                .and_then(|_| to_server.flush());
            let answer = sent.and_then(|_| {
                read_head(from_server)?.ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "server closed")
                })
            });
            match answer {
                Ok(head) => break head,
                Err(_) if reused && attempt == 1 => upstream = None,
                Err(e) => return Err(e),
            }
        };
        let (from_server, _) = upstream.as_mut().unwrap();
        let status: u16 = response
            .first_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let rframing = response_framing(&response, status, head_request);
        let close = response.wants_close()
            || request.wants_close()
            || matches!(rframing, Framing::UntilClose);
        match (fault, rframing) {
            (Fault::CutResponse, Framing::Length(n)) => {
                to_client.write_all(&response.raw)?;
                copy_exact(from_server, &mut to_client, n / 2)?;
                to_client.flush()?;
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            (Fault::ShortResponse, Framing::Length(n)) => {
                let half = n / 2;
                to_client.write_all(&shortened_head(&response, half))?;
                copy_exact(from_server, &mut to_client, half)?;
                to_client.flush()?;
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            (Fault::DropResponse, _) => {
                copy_body(from_server, &mut std::io::sink(), rframing)?;
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            (Fault::StatusAfter(code), _) => {
                copy_body(from_server, &mut std::io::sink(), rframing)?;
                write_error(&mut to_client, code, head_request)?;
                to_client.flush()?;
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            (Fault::StallResponse(d), _) => {
                copy_body(from_server, &mut std::io::sink(), rframing)?;
                std::thread::sleep(d);
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            (Fault::CorruptBody, Framing::Length(n)) if (200..300).contains(&status) => {
                let mut body = Vec::with_capacity(n as usize);
                copy_exact(from_server, &mut body, n)?;
                body[(n / 2 + info.seq.wrapping_mul(7919)) as usize % n as usize] ^= 0x20;
                to_client.write_all(&response.raw)?;
                to_client.write_all(&body)?;
                to_client.flush()?;
            }
            (Fault::IgnoreRange, Framing::Length(n)) if status == 206 => {
                to_client.write_all(&rewritten_head(&response, "HTTP/1.1 200 OK", n, true))?;
                copy_exact(from_server, &mut to_client, n)?;
                to_client.flush()?;
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            (Fault::Short200, Framing::Length(n)) if status == 200 || status == 206 => {
                let half = n / 2;
                to_client.write_all(&rewritten_head(&response, "HTTP/1.1 200 OK", half, true))?;
                copy_exact(from_server, &mut to_client, half)?;
                to_client.flush()?;
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            (Fault::Forbid404, _) if status == 404 => {
                copy_body(from_server, &mut std::io::sink(), rframing)?;
                write_error(&mut to_client, 403, head_request)?;
            }
            _ => {
                to_client.write_all(&response.raw)?;
                copy_body(from_server, &mut to_client, rframing)?;
                to_client.flush()?;
            }
        }
        if close {
            let _ = to_client.shutdown(Shutdown::Both);
            return Ok(());
        }
    }
}
