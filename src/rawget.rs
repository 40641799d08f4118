//! Loads without a user-space copy: a minimal HTTP/1.1 GET that reads the response body
//! straight from the socket into the destination block; and cheap existence checks (HEAD)
//! on the same connections and cached signing key.
//!
//! `object_store` (reqwest/hyper) hands a body over as `Bytes` chunks of hyper's read buffer,
//! so a load costs the kernel's copy into that buffer plus a second, user-space copy into
//! the block. Here the response head is read into a small buffer and the body with `read()`
//! into the block itself: the kernel's copy is the only one, as in a plain socket read.
//!
//! Scope: plain-http endpoints with path-style addressing (loopback and in-cluster S3
//! servers). Requests are signed with SigV4 (UNSIGNED-PAYLOAD) from the same credential
//! provider `object_store` uses; the signing key is cached per (secret, day). Anything
//! unexpected (a 5xx, a reset, a malformed head) makes the caller fall back to the
//! `object_store` path, which has the retries; 404/403/416 are answered directly.
//! `KVTIER_RAW_GET=0` turns it off.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use object_store::aws::{AwsCredential, AwsCredentialProvider};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{Error, Status};

/// Largest response head accepted.
const MAX_HEAD: usize = 16 << 10;
/// Bytes read per `read()` call into the block (also the CRC granule, still in cache).
const PIECE: usize = 512 << 10;
/// Idle connections kept.
const MAX_IDLE: usize = 1024;

/// Outcome of a raw GET that did not load the block.
pub enum RawError {
    /// Definitive answer from the server (missing key, length mismatch, refused...).
    Final(Error),
    /// Transport trouble or an unexpected answer: retry through `object_store`.
    Fallback(String),
}

pub struct RawGet {
    /// `host[:port]` for the Host header and the connection.
    host: String,
    /// `/<bucket>/`, percent-encoded.
    base: String,
    region: String,
    credentials: AwsCredentialProvider,
    timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
    signing_key: Mutex<Option<(String, String, [u8; 32])>>, // (secret, date, key)
}

impl RawGet {
    /// A raw GET path for an S3 store, when its endpoint allows one.
    pub fn new(endpoint_url: &str, bucket: &str, virtual_hosted: bool, region: &str,
               credentials: AwsCredentialProvider, timeout: Duration) -> Option<Arc<RawGet>> {
        if std::env::var("KVTIER_RAW_GET").is_ok_and(|v| v == "0") || virtual_hosted {
            return None;
        }
        let rest = endpoint_url.strip_prefix("http://")?;
        let host = rest.split('/').next()?.to_string();
        if host.is_empty() || rest.trim_end_matches('/') != host {
            return None; // an endpoint with a path prefix: leave it to object_store
        }
        Some(Arc::new(RawGet {
            host,
            base: format!("/{}/", encode(bucket, false)),
            region: region.to_string(),
            credentials,
            timeout,
            idle: Mutex::new(Vec::new()),
            signing_key: Mutex::new(None),
        }))
    }

    /// GETs bytes `0..dest.len()` of object `name` into `dest`. Returns the recorded CRC32C
    /// (`x-amz-meta-kvtier-crc32c`) and, when `crc` is set, the CRC32C of what was read.
    pub async fn get_into(&self, name: &str, dest: &mut [u8], crc: bool) -> Result<(Option<u32>, u32), RawError> {
        let credential = self.credentials.get_credential().await.map_err(|e| RawError::Fallback(e.to_string()))?;
        let head = self.request_head(name, dest.len(), &credential);
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect().await?,
        };
        let mut outcome = tokio::time::timeout(self.timeout, exchange(&mut conn, &head, dest, crc)).await;
        if reused && matches!(&outcome, Ok(Err(e)) if is_stale(e)) {
            // The server closed the idle connection (keep-alive timeout): once more, fresh.
            conn = self.connect().await?;
            outcome = tokio::time::timeout(self.timeout, exchange(&mut conn, &head, dest, crc)).await;
        }
        match outcome {
            Ok(Ok((result, reusable))) => {
                if reusable {
                    let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                    if idle.len() < MAX_IDLE {
                        idle.push(conn);
                    }
                }
                result
            }
            Ok(Err(e)) => Err(RawError::Fallback(e.to_string())),
            Err(_) => Err(RawError::Fallback("raw GET timed out".into())),
        }
    }

    async fn connect(&self) -> Result<TcpStream, RawError> {
        let c = TcpStream::connect(&self.host).await.map_err(|e| RawError::Fallback(e.to_string()))?;
        let _ = c.set_nodelay(true);
        Ok(c)
    }

    fn request_head(&self, name: &str, len: usize, credential: &AwsCredential) -> Vec<u8> {
        self.signed_head("GET", name, Some(len), credential)
    }

    /// A signed request head: `GET` with `Range: bytes=0-(len-1)`, or `HEAD` without.
    fn signed_head(&self, method: &str, name: &str, len: Option<usize>, credential: &AwsCredential) -> Vec<u8> {
        let path = format!("{}{}", self.base, encode(name, true));
        let range = len.map(|len| format!("bytes=0-{}", len - 1));
        let (date, datetime) = utc_now();
        let token = credential.token.as_deref();
        let mut canonical = format!("{method}\n{path}\n\nhost:{}\n", self.host);
        let mut signed = "host;".to_string();
        if let Some(r) = &range {
            canonical.push_str(&format!("range:{r}\n"));
            signed.push_str("range;");
        }
        canonical.push_str(&format!("x-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:{datetime}\n"));
        signed.push_str("x-amz-content-sha256;x-amz-date");
        if let Some(t) = token {
            canonical.push_str(&format!("x-amz-security-token:{t}\n"));
            signed.push_str(";x-amz-security-token");
        }
        canonical.push_str(&format!("\n{signed}\nUNSIGNED-PAYLOAD"));
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let to_sign = format!("AWS4-HMAC-SHA256\n{datetime}\n{scope}\n{}", hex(&Sha256::digest(canonical.as_bytes())));
        let key = self.signing_key(&credential.secret_key, &date);
        let signature = hex(&hmac(&key, to_sign.as_bytes()));
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.host);
        if let Some(r) = &range {
            head.push_str(&format!("range: {r}\r\n"));
        }
        head.push_str(&format!(
            "x-amz-content-sha256: UNSIGNED-PAYLOAD\r\nx-amz-date: {datetime}\r\nauthorization: AWS4-HMAC-SHA256 \
             Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}\r\n",
            credential.key_id
        ));
        if let Some(t) = token {
            head.push_str(&format!("x-amz-security-token: {t}\r\n"));
        }
        head.push_str("\r\n");
        head.into_bytes()
    }

    /// Whether object `name` exists, by HEAD: `Ok(true)` on 200, `Ok(false)` on 404.
    /// Anything else (403, 5xx, transport trouble) is `Fallback`, for the `object_store`
    /// path and its rules (retries, 403-as-absent without ListBucket).
    pub async fn exists(&self, name: &str) -> Result<bool, RawError> {
        let credential = self.credentials.get_credential().await.map_err(|e| RawError::Fallback(e.to_string()))?;
        let head = self.signed_head("HEAD", name, None, &credential);
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect().await?,
        };
        let mut outcome = tokio::time::timeout(self.timeout, head_exchange(&mut conn, &head)).await;
        if reused && matches!(&outcome, Ok(Err(e)) if is_stale(e)) {
            conn = self.connect().await?;
            outcome = tokio::time::timeout(self.timeout, head_exchange(&mut conn, &head)).await;
        }
        match outcome {
            Ok(Ok((status, reusable))) => {
                if reusable {
                    let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                    if idle.len() < MAX_IDLE {
                        idle.push(conn);
                    }
                }
                match status {
                    200 => Ok(true),
                    404 => Ok(false),
                    other => Err(RawError::Fallback(format!("HEAD answered {other}"))),
                }
            }
            Ok(Err(e)) => Err(RawError::Fallback(e.to_string())),
            Err(_) => Err(RawError::Fallback("raw HEAD timed out".into())),
        }
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

/// Sends a HEAD request head and reads the response head (a HEAD response has no body,
/// whatever its Content-Length says). Returns the status and whether the connection can
/// be reused.
async fn head_exchange(conn: &mut TcpStream, head: &[u8]) -> std::io::Result<(u16, bool)> {
    conn.write_all(head).await?;
    let mut buf = vec![0u8; 4096];
    let mut have = 0usize;
    let end = loop {
        if have == buf.len() {
            if buf.len() >= MAX_HEAD {
                return Err(std::io::Error::other("response head too large"));
            }
            buf.resize(buf.len() * 2, 0);
        }
        let n = conn.read(&mut buf[have..]).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        have += n;
        if let Some(p) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let text = std::str::from_utf8(&buf[..end]).map_err(std::io::Error::other)?;
    let mut lines = text.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("malformed status line"))?;
    let close = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| k.eq_ignore_ascii_case("connection") && v.trim().eq_ignore_ascii_case("close"))
    });
    // Bytes after the head would belong to no request: do not reuse such a connection.
    Ok((status, !close && have == end))
}

/// A failure that a reused keep-alive connection shows when the server had closed it.
fn is_stale(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted)
}

type Exchange = (Result<(Option<u32>, u32), RawError>, bool);

/// Sends the request head, reads the response head, then the body into `dest`.
/// The bool says whether the connection can be reused.
async fn exchange(conn: &mut TcpStream, head: &[u8], dest: &mut [u8], crc: bool) -> std::io::Result<Exchange> {
    conn.write_all(head).await?;
    let mut buf = vec![0u8; 4096];
    let mut have = 0usize;
    let end = loop {
        if have == buf.len() {
            if buf.len() >= MAX_HEAD {
                return Err(std::io::Error::other("response head too large"));
            }
            buf.resize(buf.len() * 2, 0);
        }
        let n = conn.read(&mut buf[have..]).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        have += n;
        if let Some(p) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let text = std::str::from_utf8(&buf[..end]).map_err(std::io::Error::other)?;
    let mut lines = text.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("malformed status line"))?;
    let (mut length, mut total, mut recorded, mut close) = (None, None, None, false);
    for line in lines {
        let Some((k, v)) = line.split_once(':') else { continue };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            length = v.parse::<usize>().ok();
        } else if k.eq_ignore_ascii_case("content-range") {
            total = v.rsplit('/').next().and_then(|t| t.parse::<u64>().ok());
        } else if k.eq_ignore_ascii_case("x-amz-meta-kvtier-crc32c") {
            recorded = u32::from_str_radix(v, 16).ok();
        } else if k.eq_ignore_ascii_case("connection") {
            close = v.eq_ignore_ascii_case("close");
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            return Err(std::io::Error::other("chunked response")); // not for a ranged GET; fall back
        }
    }
    let length = length.ok_or_else(|| std::io::Error::other("no content-length"))?;
    let early = have - end;
    if !(status == 200 || status == 206) {
        // Read (and drop) the error body so the connection stays usable.
        let mut body = buf[end..have].to_vec();
        if length > 64 << 10 {
            return Err(std::io::Error::other(format!("HTTP {status} with a large body")));
        }
        while body.len() < length {
            let mut more = vec![0u8; length - body.len()];
            let n = conn.read(&mut more).await?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "error body cut short"));
            }
            body.extend_from_slice(&more[..n]);
        }
        let text = String::from_utf8_lossy(&body);
        let code = crate::store::s3_error_code(&text).unwrap_or("");
        let result = match (status, code) {
            (404, "NoSuchBucket") => RawError::Final(Error::new(Status::BucketNotFound, format!("HTTP 404 {code}"))),
            (404, _) => RawError::Final(Error::new(Status::NotFound, format!("HTTP 404 {code}"))),
            (416, _) => RawError::Final(Error::new(Status::LengthMismatch, "HTTP 416: object shorter than the block")),
            _ => RawError::Fallback(format!("HTTP {status} {code}")),
        };
        return Ok((Err(result), !close));
    }
    let object_size = total.unwrap_or(length as u64);
    if length != dest.len() || object_size != dest.len() as u64 {
        // Do not drain a body of the wrong size into the block: drop the connection.
        let msg = format!("object is {object_size} bytes, the block {} bytes", dest.len());
        return Ok((Err(RawError::Final(Error::new(Status::LengthMismatch, msg))), false));
    }
    let early = early.min(dest.len());
    dest[..early].copy_from_slice(&buf[end..end + early]);
    let mut sum = if crc { crc32c::crc32c(&dest[..early]) } else { 0 };
    let mut filled = early;
    while filled < dest.len() {
        let piece = (dest.len() - filled).min(PIECE);
        let n = conn.read(&mut dest[filled..filled + piece]).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "body cut short"));
        }
        if crc {
            sum = crc32c::crc32c_append(sum, &dest[filled..filled + n]);
        }
        filled += n;
    }
    Ok((Ok((recorded, sum)), !close))
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
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(data);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// (`YYYYMMDD`, `YYYYMMDDTHHMMSSZ`) now, in UTC.
fn utc_now() -> (String, String) {
    let secs = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
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
}
