//! `kvtier-bench-sink`: an in-memory S3 endpoint for measuring an S3 client's ceiling.
//!
//! Built on `s3s` for the S3 protocol (routing, XML errors, SigV4 for aws-chunked bodies),
//! with a store that does as little as possible per byte:
//!
//! * PutObject keeps the body as the list of `Bytes` chunks hyper read from the socket:
//!   no copy, no hash (the ETag is a sequence number, not an MD5), no disk.
//! * GetObject (with `Range`) answers with slices of those chunks: no copy either.
//! * HeadObject, CreateBucket, HeadBucket, DeleteObject; user metadata (`x-amz-meta-*`)
//!   round-trips; `If-None-Match: *` on PUT answers 412 when the key exists.
//! * Every accepted socket gets `TCP_NODELAY`.
//!
//! Authentication: any credentials are accepted. A request whose payload is not
//! aws-chunked has its `Authorization` header removed before `s3s` sees it, so no
//! signature is checked and no body is hashed (that would put SHA-256 on the server's
//! side of a 2-core box). aws-chunked bodies (`STREAMING-*`) need the signature context
//! to be decoded, so those keep it and are checked against the fixed pair given by
//! `--access-key`/`--secret-key` (defaults `kvtier`/`kvtier-secret`).
//!
//! Only for benchmarks: correctness tests never use it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{s3_error, Body, S3Request, S3Response, S3Result, S3};
use tokio::net::TcpListener;

struct Object {
    /// The body as received, chunk by chunk.
    chunks: Vec<Bytes>,
    len: u64,
    metadata: Option<Metadata>,
    content_type: Option<ContentType>,
    etag: String,
    last_modified: SystemTime,
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    gets: AtomicU64,
    heads: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

#[derive(Clone, Default)]
struct Sink {
    buckets: Arc<Mutex<HashMap<String, HashMap<String, Arc<Object>>>>>,
    seq: Arc<AtomicU64>,
    counters: Arc<Counters>,
}

impl Sink {
    fn object(&self, bucket: &str, key: &str) -> S3Result<Arc<Object>> {
        let buckets = self.buckets.lock().unwrap();
        let Some(objects) = buckets.get(bucket) else {
            return Err(s3_error!(NoSuchBucket));
        };
        objects.get(key).cloned().ok_or_else(|| s3_error!(NoSuchKey))
    }
}

/// The slices of `chunks` covering `range` (byte offsets into the concatenation).
fn slices(chunks: &[Bytes], range: std::ops::Range<u64>) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    for chunk in chunks {
        let end = offset + chunk.len() as u64;
        if end > range.start && offset < range.end {
            let from = range.start.saturating_sub(offset) as usize;
            let to = (range.end.min(end) - offset) as usize;
            out.push(chunk.slice(from..to));
        }
        offset = end;
        if offset >= range.end {
            break;
        }
    }
    out
}

#[async_trait::async_trait]
impl S3 for Sink {
    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        self.buckets.lock().unwrap().entry(req.input.bucket).or_default();
        Ok(S3Response::new(CreateBucketOutput::default()))
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        if self.buckets.lock().unwrap().contains_key(&req.input.bucket) {
            Ok(S3Response::new(HeadBucketOutput::default()))
        } else {
            Err(s3_error!(NoSuchBucket))
        }
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let mut buckets = self.buckets.lock().unwrap();
        let Some(objects) = buckets.get_mut(&req.input.bucket) else {
            return Err(s3_error!(NoSuchBucket));
        };
        objects.remove(&req.input.key);
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        if !self.buckets.lock().unwrap().contains_key(&input.bucket) {
            return Err(s3_error!(NoSuchBucket));
        }
        let create_only = input.if_none_match.as_ref().is_some_and(|c| c.is_any());
        let mut chunks = Vec::new();
        let mut len = 0u64;
        if let Some(mut body) = input.body {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| s3_error!(IncompleteBody, "body: {e}"))?;
                if !chunk.is_empty() {
                    len += chunk.len() as u64;
                    chunks.push(chunk);
                }
            }
        }
        if let Some(want) = input.content_length {
            if want >= 0 && want as u64 != len {
                return Err(s3_error!(IncompleteBody, "got {len} bytes, content-length {want}"));
            }
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let etag = format!("{seq:016x}{len:016x}");
        let object = Arc::new(Object {
            chunks,
            len,
            metadata: input.metadata,
            content_type: input.content_type,
            etag: etag.clone(),
            last_modified: SystemTime::now(),
        });
        {
            let mut buckets = self.buckets.lock().unwrap();
            let objects = buckets.get_mut(&input.bucket).ok_or_else(|| s3_error!(NoSuchBucket))?;
            if create_only && objects.contains_key(&input.key) {
                return Err(s3_error!(PreconditionFailed, "Object already exists"));
            }
            // The replaced object (if any) is dropped after the lock is released.
            let _old = objects.insert(input.key, object);
        }
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_in.fetch_add(len, Ordering::Relaxed);
        Ok(S3Response::new(PutObjectOutput { e_tag: Some(ETag::Strong(etag)), ..Default::default() }))
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let object = self.object(&input.bucket, &input.key)?;
        let (range, content_range) = match input.range {
            None => (0..object.len, None),
            Some(r) => {
                let range = r.check(object.len)?;
                let content_range = format!("bytes {}-{}/{}", range.start, range.end - 1, object.len);
                (range, Some(content_range))
            }
        };
        let content_length = range.end - range.start;
        let mut parts = slices(&object.chunks, range);
        let body = if parts.len() == 1 {
            StreamingBlob::from(Body::from(parts.pop().unwrap()))
        } else {
            StreamingBlob::wrap(futures::stream::iter(parts.into_iter().map(Ok::<_, Infallible>)))
        };
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_out.fetch_add(content_length, Ordering::Relaxed);
        Ok(S3Response::new(GetObjectOutput {
            body: Some(body),
            content_length: Some(content_length as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag: Some(ETag::Strong(object.etag.clone())),
            last_modified: Some(Timestamp::from(object.last_modified)),
            metadata: object.metadata.clone(),
            content_type: object.content_type.clone(),
            ..Default::default()
        }))
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        self.counters.heads.fetch_add(1, Ordering::Relaxed);
        let object = self.object(&input.bucket, &input.key)?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(object.len as i64),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(ETag::Strong(object.etag.clone())),
            last_modified: Some(Timestamp::from(object.last_modified)),
            metadata: object.metadata.clone(),
            content_type: object.content_type.clone(),
            ..Default::default()
        }))
    }
}

/// Lets every authenticated request through (the default check is already satisfied by
/// any valid signature; anonymous requests are the ones whose header was stripped).
struct AllowAll;

#[async_trait::async_trait]
impl s3s::access::S3Access for AllowAll {
    async fn check(&self, _cx: &mut s3s::access::S3AccessContext<'_>) -> S3Result<()> {
        Ok(())
    }
}

struct Options {
    host: String,
    port: u16,
    threads: usize,
    access_key: String,
    secret_key: String,
    buckets: Vec<String>,
}

const USAGE: &str = "usage: kvtier-bench-sink [--host 127.0.0.1] [--port 0] [--threads N] \
[--access-key K] [--secret-key S] [--bucket NAME]...

In-memory S3 endpoint for benchmarks. Prints `listening on HOST:PORT` once ready
(--port 0 picks a free port). Accepts any credentials (see the source for details).
Stops on SIGINT/SIGTERM, printing request and byte counters.";

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        host: "127.0.0.1".into(),
        port: 0,
        threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
        access_key: "kvtier".into(),
        secret_key: "kvtier-secret".into(),
        buckets: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if name == "-h" || name == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let mut value = || inline.clone().or_else(|| args.next()).ok_or_else(|| format!("{name} needs a value"));
        match name.as_str() {
            "--host" => o.host = value()?,
            "--port" => o.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--threads" => o.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--access-key" => o.access_key = value()?,
            "--secret-key" => o.secret_key = value()?,
            "--bucket" => o.buckets.push(value()?),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if o.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok(o)
}

/// True when the request body is aws-chunked and so needs the signature context.
fn is_streaming_payload(headers: &http::HeaderMap) -> bool {
    headers
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"))
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("kvtier-bench-sink: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(serve(opts));
}

async fn serve(opts: Options) {
    let sink = Sink::default();
    for b in &opts.buckets {
        sink.buckets.lock().unwrap().entry(b.clone()).or_default();
    }
    let service = {
        let mut b = S3ServiceBuilder::new(sink.clone());
        b.set_auth(SimpleAuth::from_single(opts.access_key.clone(), opts.secret_key.clone()));
        b.set_access(AllowAll);
        b.build()
    };
    let listener = match TcpListener::bind((opts.host.as_str(), opts.port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kvtier-bench-sink: cannot listen on {}:{}: {e}", opts.host, opts.port);
            std::process::exit(1);
        }
    };
    let local: SocketAddr = listener.local_addr().expect("local addr");
    println!("listening on {local}");
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let http = ConnBuilder::new(TokioExecutor::new());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let (socket, _) = tokio::select! {
            res = listener.accept() => match res {
                Ok(c) => c,
                Err(e) => { eprintln!("accept: {e}"); continue; }
            },
            _ = term.recv() => break,
            _ = int.as_mut() => break,
        };
        let _ = socket.set_nodelay(true);
        let service = service.clone();
        let svc = hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            if !is_streaming_payload(req.headers()) {
                // Any credentials: no signature check, no payload hash.
                req.headers_mut().remove(http::header::AUTHORIZATION);
            }
            let service = service.clone();
            async move { service.call(req.map(Body::from)).await }
        });
        let conn = http.serve_connection(TokioIo::new(socket), svc).into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    let c = &sink.counters;
    eprintln!(
        "kvtier-bench-sink: {} PUT ({} bytes), {} GET ({} bytes), {} HEAD",
        c.puts.load(Ordering::Relaxed),
        c.bytes_in.load(Ordering::Relaxed),
        c.gets.load(Ordering::Relaxed),
        c.bytes_out.load(Ordering::Relaxed),
        c.heads.load(Ordering::Relaxed)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_ranges() {
        let chunks = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"defg"), Bytes::from_static(b"hi")];
        let cat = |v: Vec<Bytes>| v.iter().flat_map(|b| b.iter().copied()).collect::<Vec<u8>>();
        assert_eq!(cat(slices(&chunks, 0..9)), b"abcdefghi");
        assert_eq!(cat(slices(&chunks, 2..5)), b"cde");
        assert_eq!(cat(slices(&chunks, 3..7)), b"defg");
        assert_eq!(cat(slices(&chunks, 8..9)), b"i");
        assert_eq!(slices(&chunks, 3..7).len(), 1);
    }
}
