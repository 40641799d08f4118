//! The direct HTTP path of an S3 store: loads read the response body from the socket
//! straight into the destination block, stores write a block's pieces (the ranges it is
//! made of) from caller memory in one `writev`, and existence checks send a HEAD on a
//! pooled connection.
//!
//! Why: `object_store` (reqwest/hyper) hands a body over as `Bytes` chunks of hyper's read
//! buffer, so a load through it costs the kernel's copy into that buffer plus a user-space
//! copy into the block. Here the response head is read into a small buffer and the body is
//! read into the block itself, with its CRC32C computed while each piece is still in cache.
//! A HEAD skips the general client's request pipeline (retry wrapper, reqwest, hyper).
//! A store through `object_store` goes as hyper writes a body: at most 16 buffers per
//! `writev`, so a block of 64 ranges takes 4-5 calls where a contiguous one takes one; here
//! the head and every piece go in one call (up to 1024 buffers).
//!
//! Scope: http and https endpoints with path-style addressing, when `store.direct_http` is
//! on (the default). Virtual-hosted endpoints and endpoints with a path prefix always go
//! through `object_store`. On https the connection is rustls over TCP ([`conn`]), trusting
//! what the general client trusts (the platform's roots plus `store.ca_bundle`, verified by
//! the same platform verifier, the host name checked, SNI sent); rustls decrypts each record
//! into its own buffer, so a load costs that one copy into the block, where `object_store`
//! adds a second. A `ca_bundle` the direct path cannot read leaves the endpoint to
//! `object_store` (which reports it); a certificate that does not verify is a fallback, and
//! the general client then refuses it with its own error. Requests are signed with
//! SigV4 (UNSIGNED-PAYLOAD) by `object_store`'s own signer with the credential provider of
//! the `object_store` client ([`request`]); response heads are parsed by `httparse` and held
//! to strict framing rules ([`response`]).
//!
//! Failure policy: a 404 is answered directly; a body of the wrong length fails the key; a
//! PUT's answer goes to the caller as it is (`classify::direct_put_answer` reads it as the
//! general client's would be read); anything else unexpected (403, 5xx, a reset, a timeout, a malformed or ambiguously framed
//! response, a request that cannot be built) returns [`DirectError::Fallback`] and the caller
//! repeats the request through `object_store`, which owns retries, backoff and error
//! classification, within the same retry budget (`store/budget.rs`): the direct attempt
//! is the operation's first. A connection goes back to the pool only after an exchange that
//! left nothing unread on it.

mod conn;
mod exchange;
mod request;
mod response;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use http::Method;
use object_store::aws::{AwsCredential, AwsCredentialProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use conn::{Conn, Tls};

use super::answer::{ErrorAnswer, MAX_ERROR_BODY};
use super::classify::status_of_answer;
use crate::config::S3Config;
use crate::error::Status;
use crate::integrity;
use crate::memory::BlockSlot;

use super::link::{Direction, Lane, Link, Tag};
use exchange::{is_stale, Exchange, GetInto, GetOutcome, GetRead, Head, PutFrom};

/// Where a transfer's requests report what they got.
#[derive(Clone, Copy)]
struct Reporting<'a> {
    link: &'a Link,
    tag: Tag,
}
use request::{Target, Unusable};
use response::ResponseHead;

/// Largest response head accepted.
const MAX_RESPONSE_HEAD: usize = 16 << 10;
/// Bytes read per `read()` into the block: small enough that the CRC runs over cached data.
const READ_PIECE: usize = 512 << 10;
/// Body reads wake up once this many bytes are buffered (SO_RCVLOWAT), not per segment:
/// a server that sends in small pieces would otherwise cost a wake-up and a read() per
/// piece. On TLS, rustls reads about one record (16 KiB) per read(), so the read() count
/// stays, but the wake-ups still drop: 2 MiB loads over TLS cost 0.87-0.88 CPU-s/GiB with
/// it and 0.99-1.04 without (sink and s3s-fs behind a TLS relay, `bench/https_loads.py`).
const WAKE_BYTES: usize = 256 << 10;
/// On TLS, the part of the remaining body that SO_RCVLOWAT may not wait for: rustls may
/// already hold the first part of a record (at most 16 KiB + 2 KiB of ciphertext, TLS 1.2's
/// limit), and the socket then never receives all of the body's remaining bytes.
const TLS_WAKE_MARGIN: usize = 32 << 10;
/// Idle connections kept for reuse.
const MAX_IDLE_CONNECTIONS: usize = 1024;

/// Why a direct request did not produce an answer.
#[derive(Debug)]
pub(crate) enum DirectError {
    /// A definitive answer: the key fails with this status and detail.
    Final(Status, String),
    /// The object exists but its size is not the block size.
    WrongLength(u64),
    /// Transport trouble or an unexpected answer: repeat the request through `object_store`.
    Fallback(String),
}

pub(crate) struct DirectHttp {
    target: Target,
    credentials: AwsCredentialProvider,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// The TLS client of an https endpoint.
    tls: Option<Tls>,
    idle: Mutex<Vec<Conn>>,
    /// Loads of larger objects read parts of this size in parallel; 0: never; `None`: the
    /// link decides (`store/link.rs`).
    load_part_bytes: Option<usize>,
    /// Whether stores may take the direct path ([`DirectHttp::puts`]).
    puts: bool,
}

/// One PUT of a whole object on the direct path.
pub(crate) struct PutRequest<'a> {
    /// The object's bytes, piece after piece (views of caller memory, or a sealed copy).
    pub(crate) body: &'a object_store::PutPayload,
    /// The CRC32C to record as the object's metadata (`x-amz-meta-kvtier-crc32c`).
    pub(crate) recorded_crc: Option<u32>,
    /// The body's CRC64NVME, sent as `x-amz-checksum-crc64nvme` for the server to verify.
    pub(crate) upload_checksum: Option<u64>,
    /// Whether the server must refuse the PUT if the object exists (`If-None-Match: *`).
    pub(crate) create: bool,
}

/// Environment variables under which the general client's PUTs differ from the direct
/// path's: `object_store` (`AmazonS3Builder::from_env`) adds headers (server-side
/// encryption, requester pays, another checksum), or refuses or skips what the direct path
/// would send (conditional puts disabled, no signature). Under any of them, stores stay
/// with the general client.
const GENERAL_PUT_SETTINGS: [&str; 8] = [
    "AWS_SERVER_SIDE_ENCRYPTION",
    "AWS_SSE_KMS_KEY_ID",
    "AWS_SSE_BUCKET_KEY_ENABLED",
    "AWS_SSE_CUSTOMER_KEY_BASE64",
    "AWS_REQUEST_PAYER",
    "AWS_CHECKSUM_ALGORITHM",
    "AWS_CONDITIONAL_PUT",
    "AWS_SKIP_SIGNATURE",
];

/// Environment variables that send the general client's requests through a proxy. Where
/// one is set, the network may reach the store only through it (or the store may grant by
/// source address), so no request takes the direct path, which connects to the endpoint
/// itself: it would fail (a connect timeout on every request, then the fallback) or go
/// around the proxy.
const PROXY_SETTINGS: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

impl DirectHttp {
    /// The direct path of an S3 store, when its configuration allows one.
    pub(crate) fn new(
        s3: &S3Config,
        endpoint_url: &str,
        region: &str,
        credentials: AwsCredentialProvider,
    ) -> Option<Arc<Self>> {
        if !s3.direct_http || s3.use_virtual_addressing {
            return None;
        }
        if let Some(proxy) = PROXY_SETTINGS
            .iter()
            .find(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
        {
            log::info!(
                "s3 bucket {:?}: no direct HTTP path: {proxy} sends requests through a proxy",
                s3.bucket
            );
            return None;
        }
        let target = match Target::new(endpoint_url, &s3.bucket, region) {
            Ok(target) => target,
            Err(Unusable::NotApplicable(why)) => {
                log::debug!("s3 bucket {:?}: no direct HTTP path ({why})", s3.bucket);
                return None;
            }
            Err(Unusable::Invalid(why)) => {
                log::warn!(
                    "s3 bucket {:?}: direct HTTP path disabled: {why}",
                    s3.bucket
                );
                return None;
            }
        };
        if !target.tls && !s3.allow_http {
            return None;
        }
        let tls = if target.tls {
            match Tls::new(&target.host_name, &s3.ca_bundle) {
                Ok(tls) => Some(tls),
                Err(why) => {
                    log::warn!(
                        "s3 bucket {:?}: direct HTTP path disabled: {why}",
                        s3.bucket
                    );
                    return None;
                }
            }
        } else {
            None
        };
        Some(Arc::new(DirectHttp {
            target,
            credentials,
            connect_timeout: Duration::from_millis(s3.connect_timeout_ms),
            request_timeout: Duration::from_millis(s3.request_timeout_ms),
            tls,
            idle: Mutex::new(Vec::new()),
            load_part_bytes: s3
                .load_part_bytes
                .map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
            puts: !s3.payload_signing
                && GENERAL_PUT_SETTINGS
                    .iter()
                    .all(|name| std::env::var_os(name).is_none()),
        }))
    }

    /// Whether stores take the direct path: not when the payload is to be signed (its
    /// SHA-256 in the signature: `store.payload_signing`), nor under the environment's
    /// [`GENERAL_PUT_SETTINGS`].
    pub(crate) fn puts(&self) -> bool {
        self.puts
    }

    /// PUTs object `name` whole: the request head and every piece of the body in one
    /// `writev` on plain TCP, straight from where the pieces are. `Ok(Ok(()))` for a 2xx,
    /// `Ok(Err(answer))` for any other answer; no answer (a reset, a timeout, a malformed
    /// response) is [`DirectError::Fallback`].
    pub(crate) async fn put_from(
        &self,
        name: &str,
        put: PutRequest<'_>,
    ) -> Result<Result<(), ErrorAnswer>, DirectError> {
        let credential = self.credential().await?;
        let mut headers = Vec::with_capacity(4);
        if put.create {
            headers.push(("if-none-match".to_string(), "*".to_string()));
        }
        if let Some(crc64) = put.upload_checksum {
            let crc64 = base64::engine::general_purpose::STANDARD.encode(crc64.to_be_bytes());
            headers.push(("x-amz-checksum-crc64nvme".to_string(), crc64));
        }
        if let Some(crc) = put.recorded_crc {
            headers.push((
                format!("x-amz-meta-{}", integrity::CRC_METADATA),
                integrity::format_crc(crc),
            ));
        }
        let request = self
            .target
            .put_head(name, put.body.content_length(), headers, &credential)
            .map_err(DirectError::Fallback)?;
        let mut exchange = PutFrom { body: put.body };
        self.round_trip(&request, &mut exchange).await
    }

    /// GETs bytes `0..dest.len()` of object `name` into `dest`, piece after piece. Returns the CRC32C the
    /// object records (`x-amz-meta-kvtier-crc32c`) and, when `crc` is set, the CRC32C of
    /// the bytes read. On any error `dest` may hold partial data. The object is read whole
    /// or as parts in parallel ([`DirectHttp::get_parts_into`]) as `link` plans it for a
    /// transfer lane that looks like `lane` (or `load_part_bytes`, when configured); each
    /// request reports to `link` what it got.
    pub(crate) async fn get_into(
        &self,
        name: &str,
        dest: &mut BlockSlot,
        crc: bool,
        link: &Link,
        lane: Lane,
    ) -> Result<(Option<u32>, u32), DirectError> {
        if dest.len() == 0 {
            return Err(DirectError::Fallback("empty block".into()));
        }
        let credential = self.credential().await?;
        let plan = link.plan(Direction::Load, dest.len(), lane, self.load_part_bytes);
        let reporting = Reporting {
            link,
            tag: plan.tag,
        };
        if let Some(part_len) = plan.part_len {
            return self
                .get_parts_into(name, dest, crc, &credential, part_len, reporting)
                .await;
        }
        let object_len = dest.len();
        let got = self
            .get_part(name, dest, 0, object_len, crc, &credential, reporting)
            .await?;
        Ok((got.recorded_crc, got.crc))
    }

    /// One ranged GET: bytes `start..start + dest.len()` of object `name`, which must be
    /// `object_len` bytes long, into `dest`.
    #[allow(clippy::too_many_arguments)]
    async fn get_part(
        &self,
        name: &str,
        dest: &mut BlockSlot,
        start: usize,
        object_len: usize,
        crc: bool,
        credential: &AwsCredential,
        reporting: Reporting<'_>,
    ) -> GetOutcome {
        let request = self
            .target
            .head(Method::GET, name, Some((start, dest.len())), credential)
            .map_err(DirectError::Fallback)?;
        let timing = reporting.link.request(reporting.tag, dest.len());
        let mut exchange = GetInto {
            dest,
            crc,
            object_len,
            head_after: None,
        };
        let got = self.round_trip(&request, &mut exchange).await?;
        if let Some(head_after) = exchange.head_after {
            reporting.link.head_after(head_after);
        }
        if got.is_ok() {
            timing.done();
        }
        got
    }

    /// [`DirectHttp::get_into`] in parts of `part_len` bytes (the last one: the rest): each
    /// a ranged GET of its own, all in flight at once (a pooled connection each, or a new
    /// one), each read straight into its place in `dest`. A remote store caps what one
    /// connection moves; parts add up. The parts' checksums are combined into the whole
    /// block's, and every part must come from one version of the object (one ETag, one
    /// recorded checksum), else the load is asked again through `object_store` as one GET.
    async fn get_parts_into(
        &self,
        name: &str,
        dest: &mut BlockSlot,
        crc: bool,
        credential: &AwsCredential,
        part_len: usize,
        reporting: Reporting<'_>,
    ) -> Result<(Option<u32>, u32), DirectError> {
        let object_len = dest.len();
        // SAFETY of the parts (`BlockSlot::parts`): `dest` is not used until they are gone.
        let parts = dest.parts(part_len);
        let lens: Vec<usize> = parts.iter().map(BlockSlot::len).collect();
        let outcomes = futures::future::join_all(parts.into_iter().enumerate().map(
            |(i, mut part)| async move {
                self.get_part(
                    name,
                    &mut part,
                    i * part_len,
                    object_len,
                    crc,
                    credential,
                    reporting,
                )
                .await
            },
        ))
        .await;
        let mut first: Option<GetRead> = None;
        let mut sum = 0;
        for (outcome, len) in outcomes.into_iter().zip(lens) {
            let got = outcome?;
            match &first {
                None => {
                    sum = got.crc;
                    first = Some(got);
                }
                Some(first) => {
                    if got.etag != first.etag || got.recorded_crc != first.recorded_crc {
                        return Err(DirectError::Fallback(
                            "the object changed while its parts were read".into(),
                        ));
                    }
                    if crc {
                        sum = integrity::checksum_combine(sum, got.crc, len);
                    }
                }
            }
        }
        let first = first.ok_or_else(|| DirectError::Fallback("no parts".into()))?;
        Ok((first.recorded_crc, sum))
    }

    /// Whether object `name` exists, by HEAD: `Ok(true)` on 200, `Ok(false)` on 404, and
    /// on 403 when `missing_is_forbidden` (the start-up probe found that the credentials
    /// lack ListBucket, so the server answers 403 for a missing key: the general client
    /// would read it the same way, so it is not asked again). Anything else is
    /// `Fallback`, so that `object_store`'s rules apply (retries, classification).
    pub(crate) async fn exists(
        &self,
        name: &str,
        missing_is_forbidden: bool,
    ) -> Result<bool, DirectError> {
        let credential = self.credential().await?;
        let request = self
            .target
            .head(Method::HEAD, name, None, &credential)
            .map_err(DirectError::Fallback)?;
        match self.round_trip(&request, &mut Head).await? {
            200 => Ok(true),
            404 => Ok(false),
            403 if missing_is_forbidden => Ok(false),
            other => Err(DirectError::Fallback(format!("HEAD answered {other}"))),
        }
    }

    async fn credential(&self) -> Result<Arc<AwsCredential>, DirectError> {
        self.credentials
            .get_credential()
            .await
            .map_err(|e| DirectError::Fallback(e.to_string()))
    }

    /// Runs one request/response exchange on a pooled or new connection. A pooled
    /// connection the server closed while idle (keep-alive timeout) is replaced once by a
    /// fresh one.
    async fn round_trip<E: Exchange>(
        &self,
        request: &[u8],
        exchange: &mut E,
    ) -> Result<E::Outcome, DirectError> {
        let pooled = self.pooled();
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect().await?,
        };
        let mut outcome =
            tokio::time::timeout(self.request_timeout, exchange.run(&mut conn, request)).await;
        if reused && matches!(&outcome, Ok(Err(e)) if is_stale(e)) {
            conn = self.connect().await?;
            outcome =
                tokio::time::timeout(self.request_timeout, exchange.run(&mut conn, request)).await;
        }
        match outcome {
            Ok(Ok((value, reusable))) => {
                if reusable && conn.is_drained() {
                    let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                    if idle.len() < MAX_IDLE_CONNECTIONS {
                        idle.push(conn);
                    }
                }
                Ok(value)
            }
            Ok(Err(e)) => Err(DirectError::Fallback(e.to_string())),
            Err(_) => Err(DirectError::Fallback(format!(
                "no answer within {:?}",
                self.request_timeout
            ))),
        }
    }

    /// An idle connection with nothing waiting on it; the others are dropped.
    fn pooled(&self) -> Option<Conn> {
        loop {
            let mut conn = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
            if conn.is_drained() {
                return Some(conn);
            }
        }
    }

    /// A new connection, with the TLS handshake done on an https endpoint (within the
    /// connect timeout). A certificate that does not verify is a fallback like any other
    /// failure: the general client then meets the same certificate and reports it.
    async fn connect(&self) -> Result<Conn, DirectError> {
        let address = &self.target.address;
        let connect = async {
            let tcp = TcpStream::connect(address)
                .await
                .map_err(|e| format!("connect to {address}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            match &self.tls {
                None => Ok(Conn::Plain(tcp)),
                Some(tls) => tls
                    .handshake(tcp)
                    .await
                    .map_err(|e| format!("TLS handshake with {address}: {e}")),
            }
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| DirectError::Fallback(format!("connect to {address} timed out")))?
            .map_err(DirectError::Fallback)
    }
}

#[cfg(test)]
mod tests;
