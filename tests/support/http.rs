//! Single HTTP requests the tests send themselves, outside the library: plain, with a body,
//! signed with SigV4 (servers that check every request, such as Ceph RGW), and over HTTPS
//! through object_store's own client. Each opens a fresh connection and returns the
//! answer's status and body.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

/// One plain-HTTP request without a body over a fresh connection; returns the status and body.
pub fn http_plain(port: u16, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    loopback_request(port, method, path, "", b"", Duration::from_secs(20))
}

/// One plain-HTTP request with a body over a fresh connection; returns the status and body.
pub fn http_with_body(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let headers = format!("Content-Type: {content_type}\r\n");
    loopback_request(port, method, path, &headers, body, Duration::from_secs(20))
}

/// Sends `method target` to `127.0.0.1:port` with `headers` (each line ending in CRLF)
/// between `Host` and `Content-Length`, then `body`, and reads the answer to the end
/// (`Connection: close`), waiting at most `read_timeout` for each read.
pub(super) fn loopback_request(
    port: u16,
    method: &str,
    target: &str,
    headers: &str,
    body: &[u8],
    read_timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )?;
    s.set_read_timeout(Some(read_timeout))?;
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
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
    let hex = |b: &[u8]| kvtier_core::key::to_hex(b);
    let now = Utc::now();
    let datetime = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        now.year, now.month, now.day, now.hour, now.minute, now.second
    );
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
    let mut key = hmac_sha256(format!("AWS4{secret_key}").as_bytes(), date.as_bytes());
    for part in [&b"us-east-1"[..], b"s3", b"aws4_request"] {
        key = hmac_sha256(&key, part);
    }
    let signature = hex(&hmac_sha256(&key, to_sign.as_bytes()));
    let headers = format!(
        "x-amz-content-sha256: {payload}\r\nx-amz-date: {datetime}\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, \
         Signature={signature}\r\n"
    );
    loopback_request(port, method, path, &headers, body, Duration::from_secs(60))
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

/// HMAC-SHA256 (RFC 2104), for the request signatures the tests compute themselves.
pub(super) fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
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

/// The current time in UTC, in the calendar's fields, for request dates.
pub(super) struct Utc {
    /// Days since 1970-01-01.
    pub days: i64,
    pub year: i64,
    /// 1 to 12.
    pub month: i64,
    pub day: i64,
    pub hour: u64,
    pub minute: u64,
    pub second: u64,
}

impl Utc {
    pub fn now() -> Utc {
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
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        Utc {
            days,
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
        }
    }
}
