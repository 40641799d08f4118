//! Experiment behind issue #6's "loads cost ~2.5x the socket floor": the client CPU per GiB
//! of four ways to GET blocks from an S3 endpoint into a pre-faulted host pool, measured in
//! one process, interleaved, with the same keys, bytes and concurrency.
//!
//! * `collect`: `object_store` `get_opts(..).bytes()` then copy into the pool. This is the
//!   prototype's path: `collect_bytes` allocates a fresh `Vec` of the block size per request
//!   and copies every hyper chunk into it (copy 1), then the caller copies it into the pool
//!   (copy 2). The fresh multi-MiB allocation is served by mmap/brk and page-faulted.
//! * `stream`: `object_store` `get_opts` and the body stream copied chunk by chunk into the
//!   pool (kvtier's current `load_block`): one user-space copy (hyper's read buffer -> pool).
//! * `raw`: a minimal HTTP/1.1 client on tokio `TcpStream` (keep-alive, one connection per
//!   in-flight request, SigV4 header auth with a cached signing key, UNSIGNED-PAYLOAD): the
//!   response head is read into a small buffer, then the body is `read()` straight into the
//!   pool slot: zero user-space copies (the kernel's copy is the floor's copy).
//! * `raw-crc`: `raw` plus a CRC32C of each piece right after it lands (still in cache).
//!
//! Keys and bytes: bench/driver_kvtier.c's (store them first with it, same prefix/seed).
//! Every loaded byte is verified after each point. Prints one JSON line per point.
//!
//!   kvtier-bench-getpath --endpoint 127.0.0.1:PORT --bucket kvbench --prefix kvbench \
//!       --block-size 2097152 --blocks 256 --concurrency 16 --reps 3 [--paths collect,stream,raw,raw-crc]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use hmac::{Hmac, Mac};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

fn object_name(prefix: &str, key_seed: u64, index: u64) -> String {
    let mut hash = Vec::with_capacity(32);
    for k in 0..4u64 {
        hash.extend_from_slice(&mix((key_seed << 32) ^ (index * 4 + k)).to_le_bytes());
    }
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}/{}/{}_g0/{hex}.bin", &hex[0..3], &hex[3..5])
}

fn block_ok(data: &[u8], data_seed: u64, block: u64) -> bool {
    let base = (data_seed << 56) | (block << 28);
    data.chunks_exact(8)
        .enumerate()
        .all(|(j, w)| u64::from_le_bytes(w.try_into().unwrap()) == mix(base | j as u64))
}

struct Opts {
    endpoint: String,
    bucket: String,
    prefix: String,
    block: usize,
    blocks: usize,
    conc: usize,
    reps: usize,
    paths: Vec<String>,
    threads: usize,
}

fn parse() -> Opts {
    let mut o = Opts {
        endpoint: String::new(),
        bucket: "kvbench".into(),
        prefix: "kvbench".into(),
        block: 2 << 20,
        blocks: 256,
        conc: 16,
        reps: 3,
        paths: vec!["collect".into(), "stream".into(), "raw".into(), "raw-crc".into()],
        threads: 2,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < args.len() {
        let v = args[i + 1].clone();
        match args[i].as_str() {
            "--endpoint" => o.endpoint = v,
            "--bucket" => o.bucket = v,
            "--prefix" => o.prefix = v,
            "--block-size" => o.block = v.parse().expect("--block-size"),
            "--blocks" => o.blocks = v.parse().expect("--blocks"),
            "--concurrency" => o.conc = v.parse().expect("--concurrency"),
            "--reps" => o.reps = v.parse().expect("--reps"),
            "--threads" => o.threads = v.parse().expect("--threads"),
            "--paths" => o.paths = v.split(',').map(String::from).collect(),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    assert!(!o.endpoint.is_empty(), "--endpoint HOST:PORT is required");
    o
}

/// The pool: a pre-faulted buffer shared with the tasks as a raw address (each task owns
/// its block while it loads it, as in kvtier).
struct Pool {
    ptr: *mut u8,
    len: usize,
}
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}
impl Pool {
    fn new(len: usize) -> Pool {
        let mut v = vec![0xA5u8; len].into_boxed_slice();
        let ptr = v.as_mut_ptr();
        std::mem::forget(v);
        Pool { ptr, len }
    }
    #[allow(clippy::mut_from_ref)]
    fn slot(&self, block: usize, size: usize) -> &mut [u8] {
        assert!((block + 1) * size <= self.len);
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(block * size), size) }
    }
    fn clear(&self) {
        unsafe { std::ptr::write_bytes(self.ptr, 0xA5, self.len) }
    }
}

fn rusage() -> (f64, f64, i64) {
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    (t(r.ru_utime), t(r.ru_stime), r.ru_minflt)
}

// ------------------------------------------------------------------------------------------
// Minimal SigV4 (header auth, UNSIGNED-PAYLOAD) with the signing key cached per day.

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).unwrap();
    m.update(data);
    m.finalize().into_bytes().into()
}

fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

struct Signer {
    access_key: String,
    region: String,
    date: String,     // YYYYMMDD
    datetime: String, // YYYYMMDDTHHMMSSZ (fixed for the run; fine for a benchmark)
    key: [u8; 32],
}

impl Signer {
    fn new(access_key: &str, secret_key: &str, region: &str) -> Signer {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let (y, mo, d, h, mi, s) = civil(secs);
        let date = format!("{y:04}{mo:02}{d:02}");
        let datetime = format!("{date}T{h:02}{mi:02}{s:02}Z");
        let k = hmac(format!("AWS4{secret_key}").as_bytes(), date.as_bytes());
        let k = hmac(&k, region.as_bytes());
        let k = hmac(&k, b"s3");
        let key = hmac(&k, b"aws4_request");
        Signer { access_key: access_key.into(), region: region.into(), date, datetime, key }
    }

    /// The Authorization header for a GET of `path` with `host` and `range`.
    fn authorization(&self, path: &str, host: &str, range: &str) -> String {
        let canonical = format!(
            "GET\n{path}\n\nhost:{host}\nrange:{range}\nx-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:{}\n\nhost;range;x-amz-content-sha256;x-amz-date\nUNSIGNED-PAYLOAD",
            self.datetime
        );
        let scope = format!("{}/{}/s3/aws4_request", self.date, self.region);
        let to_sign = format!("AWS4-HMAC-SHA256\n{}\n{scope}\n{}", self.datetime, hex(&Sha256::digest(canonical.as_bytes())));
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature={}",
            self.access_key,
            hex(&hmac(&self.key, to_sign.as_bytes()))
        )
    }
}

/// UTC calendar fields of a Unix time (Howard Hinnant's civil_from_days).
fn civil(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d, (rem / 3600) as u32, (rem % 3600 / 60) as u32, (rem % 60) as u32)
}

/// GET `path` into `dest` over `conn` (keep-alive). Returns the CRC32C when `crc`.
async fn raw_get(
    conn: &mut TcpStream,
    head: &mut Vec<u8>,
    signer: &Signer,
    host: &str,
    path: &str,
    dest: &mut [u8],
    crc: bool,
) -> std::io::Result<u32> {
    let range = format!("bytes=0-{}", dest.len() - 1);
    let auth = signer.authorization(path, host, &range);
    head.clear();
    use std::io::Write;
    write!(
        head,
        "GET {path} HTTP/1.1\r\nhost: {host}\r\nrange: {range}\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\nx-amz-date: {}\r\nauthorization: {auth}\r\n\r\n",
        signer.datetime
    )?;
    conn.write_all(head).await?;
    // Response head: read small pieces until the blank line; what follows it is body.
    let mut buf = [0u8; 4096];
    let mut have = 0usize;
    let end = loop {
        let n = conn.read(&mut buf[have..]).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
        }
        have += n;
        if let Some(p) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if have == buf.len() {
            return Err(std::io::Error::other("response head too large"));
        }
    };
    let text = std::str::from_utf8(&buf[..end]).map_err(std::io::Error::other)?;
    let status: u16 = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let length: usize = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or(usize::MAX);
    if !(status == 200 || status == 206) || length != dest.len() {
        return Err(std::io::Error::other(format!("status {status}, length {length}")));
    }
    let early = (have - end).min(dest.len());
    dest[..early].copy_from_slice(&buf[end..end + early]);
    let mut filled = early;
    let mut sum = if crc { crc32c::crc32c(&dest[..early]) } else { 0 };
    while filled < dest.len() {
        let piece = (dest.len() - filled).min(512 << 10);
        let n = conn.read(&mut dest[filled..filled + piece]).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "body cut short"));
        }
        if crc {
            sum = crc32c::crc32c_append(sum, &dest[filled..filled + n]);
        }
        filled += n;
    }
    Ok(sum)
}

async fn run_point(o: &Arc<Opts>, path_kind: &str, store: &Arc<dyn ObjectStore>, pool: &Arc<Pool>) -> String {
    let names: Arc<Vec<String>> = Arc::new((0..o.blocks).map(|i| object_name(&o.prefix, 1, i as u64)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    pool.clear();
    let signer = Arc::new(Signer::new("kvtier", "kvtier-secret", "us-east-1"));
    // Raw connections are opened before the clock starts (object_store's pool is warm too).
    let mut conns = Vec::new();
    if path_kind.starts_with("raw") {
        for _ in 0..o.conc {
            let c = TcpStream::connect(&o.endpoint).await.expect("connect");
            c.set_nodelay(true).unwrap();
            conns.push(c);
        }
    }
    let (u0, s0, f0) = rusage();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..o.conc {
        let (o, names, next, failures, pool, store, signer) =
            (o.clone(), names.clone(), next.clone(), failures.clone(), pool.clone(), store.clone(), signer.clone());
        let kind = path_kind.to_string();
        let mut conn = if kind.starts_with("raw") { Some(conns.remove(0)) } else { None };
        let _ = w;
        tasks.push(tokio::spawn(async move {
            let mut head = Vec::with_capacity(1024);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= o.blocks {
                    break;
                }
                let dest = pool.slot(i, o.block);
                let ok = match kind.as_str() {
                    "collect" | "stream" => {
                        let opts = GetOptions { range: Some(GetRange::Bounded(0..o.block as u64)), ..Default::default() };
                        match store.get_opts(&Path::from(names[i].as_str()), opts).await {
                            Ok(got) if kind == "collect" => match got.bytes().await {
                                Ok(b) if b.len() == dest.len() => {
                                    dest.copy_from_slice(&b);
                                    true
                                }
                                _ => false,
                            },
                            Ok(got) => {
                                let mut s = got.into_stream();
                                let mut filled = 0;
                                let mut ok = true;
                                while let Some(chunk) = s.next().await {
                                    match chunk {
                                        Ok(c) if filled + c.len() <= dest.len() => {
                                            dest[filled..filled + c.len()].copy_from_slice(&c);
                                            filled += c.len();
                                        }
                                        _ => {
                                            ok = false;
                                            break;
                                        }
                                    }
                                }
                                ok && filled == dest.len()
                            }
                            Err(_) => false,
                        }
                    }
                    _ => {
                        let c = conn.as_mut().unwrap();
                        let p = format!("/{}/{}", o.bucket, names[i]);
                        raw_get(c, &mut head, &signer, &o.endpoint, &p, dest, kind == "raw-crc").await.is_ok()
                    }
                };
                if !ok {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    let (u1, s1, f1) = rusage();
    let bad = (0..o.blocks).filter(|&b| !block_ok(pool.slot(b, o.block), 1, b as u64)).count();
    let gib = (o.blocks * o.block) as f64 / (1u64 << 30) as f64;
    let cpu = (u1 - u0) + (s1 - s0);
    format!(
        "{{\"path\":\"{path_kind}\",\"block_bytes\":{},\"blocks\":{},\"concurrency\":{},\"mib_s\":{:.1},\"cpu_s_per_gib\":{:.4},\"user_s_per_gib\":{:.4},\"sys_s_per_gib\":{:.4},\"minor_faults_per_block\":{:.1},\"failures\":{},\"bad_blocks\":{},\"verified\":{}}}",
        o.block,
        o.blocks,
        o.conc,
        gib * 1024.0 / wall,
        cpu / gib,
        (u1 - u0) / gib,
        (s1 - s0) / gib,
        (f1 - f0) as f64 / o.blocks as f64,
        failures.load(Ordering::Relaxed),
        bad,
        bad == 0 && failures.load(Ordering::Relaxed) == 0
    )
}

fn main() {
    let o = Arc::new(parse());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(o.threads).enable_all().build().unwrap();
    rt.block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(
            AmazonS3Builder::new()
                .with_bucket_name(&o.bucket)
                .with_endpoint(format!("http://{}", o.endpoint))
                .with_allow_http(true)
                .with_region("us-east-1")
                .with_access_key_id("kvtier")
                .with_secret_access_key("kvtier-secret")
                .with_unsigned_payload(true)
                .with_client_options(ClientOptions::new().with_http1_only().with_allow_http(true).with_pool_max_idle_per_host(1024))
                .build()
                .expect("store"),
        );
        let pool = Arc::new(Pool::new(o.blocks * o.block));
        // Warm up object_store's connection pool and the server.
        let _ = run_point(&o, "stream", &store, &pool).await;
        for rep in 0..o.reps {
            let mut order = o.paths.clone();
            let n = order.len().max(1);
            order.rotate_left(rep % n);
            for p in &order {
                println!("{}", run_point(&o, p, &store, &pool).await);
            }
        }
    });
}
