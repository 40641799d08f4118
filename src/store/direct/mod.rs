//! The direct HTTP path of an S3 store: loads read the response body from the socket
//! straight into the destination block, and existence checks send a HEAD on a pooled
//! connection with a cached signing key.
//!
//! Why: `object_store` (reqwest/hyper) hands a body over as `Bytes` chunks of hyper's read
//! buffer, so a load through it costs the kernel's copy into that buffer plus a user-space
//! copy into the block. Here the response head is read into a small buffer and the body is
//! read into the block itself, with its CRC32C computed while each piece is still in cache.
//! A HEAD through `object_store` re-derives the SigV4 signing key and builds a full request
//! each time; here the key is derived once a day.
//!
//! Scope: plain-http endpoints with path-style addressing (loopback and in-cluster S3
//! servers), when `store.direct_http` is on (the default). HTTPS, virtual-hosted and
//! endpoints with a path prefix always go through `object_store`. Requests are signed with
//! SigV4 (UNSIGNED-PAYLOAD) using the credential provider of the `object_store` client.
//!
//! Failure policy: a 404 is answered directly; a body of the wrong length fails the key;
//! anything else unexpected (403, 5xx, a reset, a timeout, a malformed response) returns
//! [`DirectError::Fallback`] and the caller repeats the request through `object_store`,
//! which owns retries, backoff and error classification.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use object_store::aws::{AwsCredential, AwsCredentialProvider};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::S3Config;
use crate::error::Status;

/// Largest response head accepted.
const MAX_RESPONSE_HEAD: usize = 16 << 10;
/// Largest error body read to keep a connection reusable.
const MAX_ERROR_BODY: usize = 64 << 10;
/// Bytes read per `read()` into the block: small enough that the CRC runs over cached data.
const READ_PIECE: usize = 512 << 10;
/// Body reads wake up once this many bytes are buffered (SO_RCVLOWAT), not per segment:
/// a server that sends in small pieces would otherwise cost a wake-up and a read() per
/// piece.
const WAKE_BYTES: usize = 256 << 10;
/// Idle connections kept for reuse.
const MAX_IDLE_CONNECTIONS: usize = 1024;

/// Why a direct request did not produce an answer.
#[derive(Debug)]
pub enum DirectError {
    /// A definitive answer: the key fails with this status and detail.
    Final(Status, String),
    /// The object exists but its size is not the block size.
    WrongLength(u64),
    /// Transport trouble or an unexpected answer: repeat the request through `object_store`.
    Fallback(String),
}

pub struct DirectHttp {
    /// `host[:port]` as in the endpoint URL: the Host header and the signed host.
    host: String,
    /// `host:port` to connect to.
    address: String,
    /// `/<bucket>/`, percent-encoded.
    bucket_path: String,
    region: String,
    credentials: AwsCredentialProvider,
    connect_timeout: Duration,
    request_timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
    /// (secret, date, key): the SigV4 signing key changes once a day.
    signing_key: Mutex<Option<(String, String, [u8; 32])>>,
}

/// What a response head says.
struct ResponseHead {
    status: u16,
    content_length: Option<usize>,
    /// The object's full size, from `Content-Range: bytes a-b/size`.
    object_size: Option<u64>,
    recorded_crc: Option<u32>,
    close: bool,
    chunked: bool,
}

impl DirectHttp {
    /// The direct path of an S3 store, when its configuration allows one.
    pub fn new(s3: &S3Config, endpoint_url: &str, region: &str, credentials: AwsCredentialProvider) -> Option<Arc<Self>> {
        if !s3.direct_http || s3.use_virtual_addressing || !s3.allow_http {
            return None;
        }
        let rest = endpoint_url.strip_prefix("http://")?;
        let host = rest.trim_end_matches('/');
        if host.is_empty() || host.contains('/') {
            return None; // an endpoint with a path prefix: leave it to object_store
        }
        let has_port = match host.strip_prefix('[') {
            Some(v6) => v6.contains("]:"),
            None => host.contains(':'),
        };
        Some(Arc::new(DirectHttp {
            host: host.to_string(),
            address: if has_port { host.to_string() } else { format!("{host}:80") },
            bucket_path: format!("/{}/", encode(&s3.bucket, false)),
            region: region.to_string(),
            credentials,
            connect_timeout: Duration::from_millis(s3.connect_timeout_ms),
            request_timeout: Duration::from_millis(s3.request_timeout_ms),
            idle: Mutex::new(Vec::new()),
            signing_key: Mutex::new(None),
        }))
    }

    /// GETs bytes `0..dest.len()` of object `name` into `dest`. Returns the CRC32C the
    /// object records (`x-amz-meta-kvtier-crc32c`) and, when `crc` is set, the CRC32C of
    /// the bytes read. On any error `dest` may hold partial data.
    pub async fn get_into(&self, name: &str, dest: &mut [u8], crc: bool) -> Result<(Option<u32>, u32), DirectError> {
        if dest.is_empty() {
            return Err(DirectError::Fallback("empty block".into()));
        }
        let credential = self.credential().await?;
        let request = self.request_head("GET", name, Some(dest.len()), &credential, utc_now(), "UNSIGNED-PAYLOAD");
        self.round_trip(&request, &mut GetInto { dest, crc }).await?
    }

    /// Whether object `name` exists, by HEAD: `Ok(true)` on 200, `Ok(false)` on 404, and
    /// on 403 when `missing_is_forbidden` (the start-up probe found that the credentials
    /// lack ListBucket, so the server answers 403 for a missing key: the general client
    /// would read it the same way, so it is not asked again). Anything else is
    /// `Fallback`, so that `object_store`'s rules apply (retries, classification).
    pub async fn exists(&self, name: &str, missing_is_forbidden: bool) -> Result<bool, DirectError> {
        let credential = self.credential().await?;
        let request = self.request_head("HEAD", name, None, &credential, utc_now(), "UNSIGNED-PAYLOAD");
        match self.round_trip(&request, &mut Head).await? {
            200 => Ok(true),
            404 => Ok(false),
            403 if missing_is_forbidden => Ok(false),
            other => Err(DirectError::Fallback(format!("HEAD answered {other}"))),
        }
    }

    async fn credential(&self) -> Result<Arc<AwsCredential>, DirectError> {
        self.credentials.get_credential().await.map_err(|e| DirectError::Fallback(e.to_string()))
    }

    /// Runs one request/response exchange on a pooled or new connection. A pooled
    /// connection the server closed while idle (keep-alive timeout) is replaced once by a
    /// fresh one.
    async fn round_trip<E: Exchange>(&self, request: &[u8], exchange: &mut E) -> Result<E::Answer, DirectError> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect().await?,
        };
        let mut outcome = tokio::time::timeout(self.request_timeout, exchange.run(&mut conn, request)).await;
        if reused && matches!(&outcome, Ok(Err(e)) if is_stale(e)) {
            conn = self.connect().await?;
            outcome = tokio::time::timeout(self.request_timeout, exchange.run(&mut conn, request)).await;
        }
        match outcome {
            Ok(Ok((value, reusable))) => {
                if reusable {
                    let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                    if idle.len() < MAX_IDLE_CONNECTIONS {
                        idle.push(conn);
                    }
                }
                Ok(value)
            }
            Ok(Err(e)) => Err(DirectError::Fallback(e.to_string())),
            Err(_) => Err(DirectError::Fallback(format!("no answer within {:?}", self.request_timeout))),
        }
    }

    async fn connect(&self) -> Result<TcpStream, DirectError> {
        let conn = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.address))
            .await
            .map_err(|_| DirectError::Fallback(format!("connect to {} timed out", self.address)))?
            .map_err(|e| DirectError::Fallback(format!("connect to {}: {e}", self.address)))?;
        let _ = conn.set_nodelay(true);
        Ok(conn)
    }

    /// A SigV4-signed request head: `GET` with `Range: bytes=0-(len-1)`, or `HEAD`.
    fn request_head(
        &self,
        method: &str,
        name: &str,
        range_len: Option<usize>,
        credential: &AwsCredential,
        (date, datetime): (String, String),
        payload_hash: &str,
    ) -> Vec<u8> {
        let path = format!("{}{}", self.bucket_path, encode(name, true));
        let range = range_len.map(|len| format!("bytes=0-{}", len - 1));
        let token = credential.token.as_deref();
        // Canonical headers, sorted by name.
        let mut headers: Vec<(&str, &str)> = vec![("host", &self.host)];
        if let Some(r) = &range {
            headers.push(("range", r));
        }
        headers.push(("x-amz-content-sha256", payload_hash));
        headers.push(("x-amz-date", &datetime));
        if let Some(t) = token {
            headers.push(("x-amz-security-token", t));
        }
        let signed_names = headers.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(";");
        let mut canonical = format!("{method}\n{path}\n\n");
        for (k, v) in &headers {
            canonical.push_str(&format!("{k}:{v}\n"));
        }
        canonical.push_str(&format!("\n{signed_names}\n{payload_hash}"));
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let to_sign = format!("AWS4-HMAC-SHA256\n{datetime}\n{scope}\n{}", hex(&Sha256::digest(canonical.as_bytes())));
        let key = self.signing_key(&credential.secret_key, &date);
        let signature = hex(&hmac(&key, to_sign.as_bytes()));
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        for (k, v) in &headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!(
            "authorization: AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_names}, \
             Signature={signature}\r\n\r\n",
            credential.key_id
        ));
        head.into_bytes()
    }

    fn signing_key(&self, secret: &str, date: &str) -> [u8; 32] {
        let mut cached = self.signing_key.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((s, d, k)) = cached.as_ref() {
            if s == secret && d == date {
                return *k;
            }
        }
        let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
        let k = hmac(&k, self.region.as_bytes());
        let k = hmac(&k, b"s3");
        let k = hmac(&k, b"aws4_request");
        *cached = Some((secret.to_string(), date.to_string(), k));
        k
    }
}

/// One request/response exchange on a connection: what it reads, and into where.
trait Exchange {
    type Answer;
    /// Returns the answer and whether the connection can be reused.
    async fn run(&mut self, conn: &mut TcpStream, request: &[u8]) -> io::Result<(Self::Answer, bool)>;
}

/// A ranged GET whose body goes into `dest`.
struct GetInto<'a> {
    dest: &'a mut [u8],
    crc: bool,
}

impl Exchange for GetInto<'_> {
    type Answer = GetOutcome;
    async fn run(&mut self, conn: &mut TcpStream, request: &[u8]) -> io::Result<(GetOutcome, bool)> {
        get_exchange(conn, request, self.dest, self.crc).await
    }
}

/// A HEAD: the answer is the status.
struct Head;

impl Exchange for Head {
    type Answer = u16;
    async fn run(&mut self, conn: &mut TcpStream, request: &[u8]) -> io::Result<(u16, bool)> {
        head_exchange(conn, request).await
    }
}

/// A failure that a reused keep-alive connection shows when the server had closed it.
fn is_stale(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(e.kind(), UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted)
}

fn eof(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, what.to_string())
}

/// Sends `request` and reads the response head into `buf`. Returns the parsed head, the
/// offset where the body starts in `buf`, and how many bytes of `buf` were filled.
async fn send_and_read_head(conn: &mut TcpStream, request: &[u8], buf: &mut Vec<u8>) -> io::Result<(ResponseHead, usize, usize)> {
    conn.write_all(request).await?;
    buf.resize(4096, 0);
    let mut filled = 0usize;
    let body_start = loop {
        if filled == buf.len() {
            if buf.len() >= MAX_RESPONSE_HEAD {
                return Err(io::Error::other("response head too large"));
            }
            buf.resize(buf.len() * 2, 0);
        }
        let n = conn.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(eof("connection closed before the response head"));
        }
        let searched_from = filled.saturating_sub(3);
        filled += n;
        if let Some(p) = buf[searched_from..filled].windows(4).position(|w| w == b"\r\n\r\n") {
            break searched_from + p + 4;
        }
    };
    let text = std::str::from_utf8(&buf[..body_start]).map_err(io::Error::other)?;
    Ok((parse_head(text)?, body_start, filled))
}

fn parse_head(text: &str) -> io::Result<ResponseHead> {
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .filter(|l| l.starts_with("HTTP/1."))
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("malformed status line"))?;
    let mut head =
        ResponseHead { status, content_length: None, object_size: None, recorded_crc: None, close: false, chunked: false };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            head.content_length = Some(value.parse().map_err(|_| io::Error::other("malformed content-length"))?);
        } else if name.eq_ignore_ascii_case("content-range") {
            head.object_size = value.rsplit('/').next().and_then(|t| t.parse().ok());
        } else if name.eq_ignore_ascii_case(crate::integrity::CRC_HEADER) {
            head.recorded_crc = crate::integrity::parse_crc(value);
        } else if name.eq_ignore_ascii_case("connection") {
            head.close = value.eq_ignore_ascii_case("close");
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = true;
        }
    }
    Ok(head)
}

type GetOutcome = Result<(Option<u32>, u32), DirectError>;

/// One GET exchange: the body goes straight into `dest`. Returns the outcome and whether
/// the connection can be reused.
async fn get_exchange(conn: &mut TcpStream, request: &[u8], dest: &mut [u8], crc: bool) -> io::Result<(GetOutcome, bool)> {
    let mut buf = Vec::new();
    let (head, body_start, filled) = send_and_read_head(conn, request, &mut buf).await?;
    if head.chunked {
        return Err(io::Error::other("chunked response to a ranged GET"));
    }
    let length = head.content_length.ok_or_else(|| io::Error::other("response without content-length"))?;
    let early = &buf[body_start..filled];
    if !(head.status == 200 || head.status == 206) {
        return error_answer(conn, &head, length, early).await;
    }
    let object_size = head.object_size.unwrap_or(length as u64);
    if length != dest.len() || object_size != dest.len() as u64 || early.len() > dest.len() {
        // Never drain a body of the wrong size into the block; the connection is dropped.
        return Ok((Err(DirectError::WrongLength(object_size)), false));
    }
    dest[..early.len()].copy_from_slice(early);
    let mut sum = if crc { crc32c::crc32c(early) } else { 0 };
    let mut done = early.len();
    let mut wake_at = 1;
    while done < dest.len() {
        let want = (dest.len() - done).min(WAKE_BYTES);
        if want != wake_at {
            set_receive_low_water(conn, want);
            wake_at = want;
        }
        let piece = (dest.len() - done).min(READ_PIECE);
        let n = conn.read(&mut dest[done..done + piece]).await?;
        if n == 0 {
            return Err(eof("body cut short"));
        }
        if crc {
            sum = crc32c::crc32c_append(sum, &dest[done..done + n]);
        }
        done += n;
    }
    if wake_at != 1 {
        // A pooled connection must wake on its next response's first byte.
        set_receive_low_water(conn, 1);
    }
    Ok((Ok((head.recorded_crc, sum)), !head.close))
}

/// Sets SO_RCVLOWAT: readiness is reported once `bytes` are buffered (or at EOF). Best
/// effort: where it fails, reads simply wake up more often.
fn set_receive_low_water(conn: &TcpStream, bytes: usize) {
    use std::os::fd::AsRawFd;
    let value = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: a valid socket descriptor owned by `conn`, and a c_int option value.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Reads a non-2xx answer's (small) body so the connection stays usable, and classifies
/// it: 404s are final, the rest fall back to `object_store`.
async fn error_answer(conn: &mut TcpStream, head: &ResponseHead, length: usize, early: &[u8]) -> io::Result<(GetOutcome, bool)> {
    if length > MAX_ERROR_BODY || early.len() > length {
        return Err(io::Error::other(format!("HTTP {} with an unexpected body", head.status)));
    }
    let mut body = vec![0u8; length];
    body[..early.len()].copy_from_slice(early);
    conn.read_exact(&mut body[early.len()..]).await?;
    let text = String::from_utf8_lossy(&body);
    let code = super::classify::s3_error_code(&text).unwrap_or("");
    let outcome = match head.status {
        // A missing bucket or key, by the store's own reading of the error code.
        404 => {
            let status = match super::classify::status_of_s3_code(code) {
                Some(Status::BucketNotFound) => Status::BucketNotFound,
                _ => Status::NotFound,
            };
            DirectError::Final(status, format!("HTTP 404 {code}"))
        }
        status => DirectError::Fallback(format!("HTTP {status} {code}")),
    };
    Ok((Err(outcome), !head.close))
}

/// One HEAD exchange (a HEAD response has no body, whatever its Content-Length says).
/// Returns the status and whether the connection can be reused.
async fn head_exchange(conn: &mut TcpStream, request: &[u8]) -> io::Result<(u16, bool)> {
    let mut buf = Vec::new();
    let (head, body_start, filled) = send_and_read_head(conn, request, &mut buf).await?;
    // Bytes after the head would belong to no request: do not reuse such a connection.
    Ok((head.status, !head.close && filled == body_start))
}

/// Percent-encodes for an S3 path (SigV4 canonical URI): unreserved bytes stay, and `/`
/// when `keep_slash`.
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    crate::key::to_hex(bytes)
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(data);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// (`YYYYMMDD`, `YYYYMMDDTHHMMSSZ`) now, in UTC.
fn utc_now() -> (String, String) {
    let secs = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    utc_stamp(secs)
}

fn utc_stamp(secs: u64) -> (String, String) {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
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
    let date = format!("{y:04}{m:02}{d:02}");
    let datetime = format!("{date}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60);
    (date, datetime)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::StaticCredentialProvider;

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        let mac = hmac(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex(&mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn encoding_keeps_unreserved_and_slashes() {
        assert_eq!(encode("a/b_c-d.e~f", true), "a/b_c-d.e~f");
        assert_eq!(encode("a=b+c@d,e", true), "a%3Db%2Bc%40d%2Ce");
        assert_eq!(encode("a/b", false), "a%2Fb");
    }

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), ("19700101".into(), "19700101T000000Z".into()));
        assert_eq!(utc_stamp(1369353600), ("20130524".into(), "20130524T000000Z".into()));
        assert_eq!(utc_stamp(1709251199), ("20240229".into(), "20240229T235959Z".into()));
    }

    fn s3(endpoint: &str) -> S3Config {
        serde_json::from_value(serde_json::json!({"bucket": "examplebucket", "endpoint_override": endpoint})).unwrap()
    }

    fn provider(key_id: &str, secret: &str) -> AwsCredentialProvider {
        let credential = AwsCredential { key_id: key_id.into(), secret_key: secret.into(), token: None };
        Arc::new(StaticCredentialProvider::new(credential))
    }

    /// The "GET Object" example of AWS's SigV4 documentation for S3 (header-based auth).
    #[test]
    fn signature_matches_the_aws_get_object_example() {
        let mut direct = DirectHttp::new(
            &s3("http://examplebucket.s3.amazonaws.com"),
            "http://examplebucket.s3.amazonaws.com",
            "us-east-1",
            provider("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        )
        .unwrap();
        Arc::get_mut(&mut direct).unwrap().bucket_path = "/".into(); // the example is virtual-hosted
        let credential = AwsCredential {
            key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            token: None,
        };
        let empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let head = direct.request_head("GET", "test.txt", Some(10), &credential, utc_stamp(1369353600), empty_sha256);
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("GET /test.txt HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("range: bytes=0-9\r\n"), "{head}");
        assert!(
            head.contains(
                "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
                 SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
                 Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
            ),
            "{head}"
        );
    }

    #[test]
    fn only_plain_http_path_style_endpoints_take_the_direct_path() {
        let make = |endpoint: &str, edit: &dyn Fn(&mut S3Config)| {
            let mut config = s3(endpoint);
            edit(&mut config);
            DirectHttp::new(&config, endpoint, "us-east-1", provider("a", "b")).map(|d| d.address.clone())
        };
        let none = |_: &mut S3Config| {};
        assert_eq!(make("http://127.0.0.1:9000", &none).as_deref(), Some("127.0.0.1:9000"));
        assert_eq!(make("http://minio/", &none).as_deref(), Some("minio:80"));
        assert_eq!(make("http://[::1]", &none).as_deref(), Some("[::1]:80"));
        assert_eq!(make("http://[::1]:9000", &none).as_deref(), Some("[::1]:9000"));
        assert_eq!(make("https://127.0.0.1:9000", &none), None);
        assert_eq!(make("http://gateway:8080/s3", &none), None);
        assert_eq!(make("http://127.0.0.1:9000", &|c| c.direct_http = false), None);
        assert_eq!(make("http://127.0.0.1:9000", &|c| c.use_virtual_addressing = true), None);
    }

    #[test]
    fn response_heads_parse() {
        let head = parse_head(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\ncontent-range: bytes 0-9/44\r\n\
             x-amz-meta-kvtier-crc32c: 0000beef\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (head.status, head.content_length, head.object_size, head.recorded_crc, head.close, head.chunked),
            (206, Some(10), Some(44), Some(0xbeef), true, false)
        );
        assert!(parse_head("garbage\r\n\r\n").is_err());
        assert!(parse_head("HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n").is_err());
    }
}
