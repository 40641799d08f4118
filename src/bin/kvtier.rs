//! `kvtier` command line. `kvtier bench` runs a simulated serving workload through the
//! library and prints a summary.

use std::time::{Duration, Instant};

use kvtier::key::make_key;
use kvtier::{JobKind, KeyBatch, LookupResult, Tier};

const USAGE: &str = "\
usage: kvtier bench [options]

Runs a simulated serving workload through the library: stores blocks from a host pool,
looks them up (plus as many absent keys), loads them into other slots, verifies every
byte, and prints a summary.

options:
  --blocks N          blocks to store and load (default 256)
  --block-size SIZE   bytes per block, with optional K/M suffix (default 1M)
  --keys-per-job N    keys per store/load job (default 4)
  --config JSON       tier configuration (default: a local directory store in a
                      temporary directory, removed afterwards)
  --config-file PATH  tier configuration read from a file
  --json              print the summary as one JSON object
  -h, --help          this help
";

struct Options {
    blocks: usize,
    block_size: usize,
    keys_per_job: usize,
    config: Option<String>,
    json: bool,
}

fn parse_size(text: &str) -> Result<usize, String> {
    let (digits, scale) = match text.chars().last() {
        Some('k' | 'K') => (&text[..text.len() - 1], 1024),
        Some('m' | 'M') => (&text[..text.len() - 1], 1024 * 1024),
        Some('g' | 'G') => (&text[..text.len() - 1], 1024 * 1024 * 1024),
        _ => (text, 1),
    };
    digits.parse::<usize>().map(|n| n * scale).map_err(|_| format!("not a size: {text}"))
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut o = Options { blocks: 256, block_size: 1024 * 1024, keys_per_job: 4, config: None, json: false };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--blocks" => o.blocks = value("--blocks")?.parse().map_err(|_| "--blocks needs a number")?,
            "--block-size" => o.block_size = parse_size(&value("--block-size")?)?,
            "--keys-per-job" => {
                o.keys_per_job = value("--keys-per-job")?.parse().map_err(|_| "--keys-per-job needs a number")?
            }
            "--config" => o.config = Some(value("--config")?),
            "--config-file" => {
                let path = value("--config-file")?;
                o.config = Some(std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?);
            }
            "--json" => o.json = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.blocks == 0 || o.block_size == 0 || o.keys_per_job == 0 {
        return Err("--blocks, --block-size and --keys-per-job must be positive".into());
    }
    Ok(o)
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("bench") => match parse_options(&args[1..]) {
            Ok(options) => match bench(&options) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("kvtier bench: {e}");
                    1
                }
            },
            Err(e) if e.is_empty() => {
                print!("{USAGE}");
                0
            }
            Err(e) => {
                eprintln!("kvtier bench: {e}\n\n{USAGE}");
                2
            }
        },
        Some("version" | "--version" | "-V") => {
            println!("kvtier {}", kvtier::VERSION);
            0
        }
        _ => {
            eprint!("{USAGE}");
            2
        }
    };
    std::process::exit(code);
}

fn key_for(i: u64, salt: u64) -> Vec<u8> {
    let mut hash = [0u8; 32];
    let mut x = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt;
    for chunk in hash.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    make_key(&hash, 0)
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

struct Phase {
    seconds: f64,
    latencies_ms: Vec<f64>,
}

fn run_jobs(tier: &Tier, kind: JobKind, jobs: &[(u64, Vec<u64>, KeyBatch)]) -> Result<Phase, String> {
    let start = Instant::now();
    for (id, blocks, keys) in jobs {
        tier.submit(kind, *id, blocks, keys.clone()).map_err(|e| e.to_string())?;
    }
    let mut latencies = Vec::with_capacity(jobs.len());
    let deadline = Instant::now() + Duration::from_secs(600);
    while latencies.len() < jobs.len() {
        for r in tier.poll(usize::MAX) {
            if !r.succeeded() {
                return Err(format!("{:?} job {} failed: {}", kind, r.job_id, r.message));
            }
            latencies.push(r.seconds * 1e3);
        }
        if Instant::now() > deadline {
            return Err("jobs did not finish within 10 minutes".into());
        }
        let mut pfd = libc::pollfd { fd: tier.ready_fd(), events: libc::POLLIN, revents: 0 };
        unsafe { libc::poll(&mut pfd, 1, 100) };
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort_by(|a, b| a.total_cmp(b));
    Ok(Phase { seconds, latencies_ms: latencies })
}

fn bench(o: &Options) -> Result<(), String> {
    let temp_dir;
    let config = match &o.config {
        Some(c) => c.clone(),
        None => {
            temp_dir = std::env::temp_dir().join(format!("kvtier-bench-{}", std::process::id()));
            serde_json::json!({"store": {"type": "local", "path": temp_dir}}).to_string()
        }
    };
    let result = bench_with(o, &config);
    if o.config.is_none() {
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("kvtier-bench-{}", std::process::id())));
    }
    result
}

fn bench_with(o: &Options, config: &str) -> Result<(), String> {
    let tier = Tier::from_json(config).map_err(|e| e.to_string())?;
    let n = o.blocks;
    let bs = o.block_size;
    let mut pool = vec![0u8; 2 * n * bs];
    fill(&mut pool[..n * bs], 0x5eed);
    unsafe { tier.register_memory(pool.as_mut_ptr(), 2 * n as u64, bs) }.map_err(|e| e.to_string())?;
    let salt = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let keys: Vec<Vec<u8>> = (0..n as u64).map(|i| key_for(i, salt)).collect();

    // Store blocks 0..n.
    let jobs: Vec<(u64, Vec<u64>, KeyBatch)> = (0..n)
        .step_by(o.keys_per_job)
        .enumerate()
        .map(|(j, first)| {
            let ids: Vec<u64> = (first..(first + o.keys_per_job).min(n)).map(|b| b as u64).collect();
            let batch = KeyBatch::from_keys(&ids.iter().map(|&b| keys[b as usize].clone()).collect::<Vec<_>>()).unwrap();
            (j as u64, ids, batch)
        })
        .collect();
    let store = run_jobs(&tier, JobKind::Store, &jobs)?;

    // Look up every stored key and as many absent ones: one request, one step.
    let absent: Vec<Vec<u8>> = (0..n as u64).map(|i| key_for(i, !salt)).collect();
    let lookup_start = Instant::now();
    for k in keys.iter().chain(&absent) {
        tier.lookup(1, k).map_err(|e| e.to_string())?;
    }
    tier.schedule_end().map_err(|e| e.to_string())?;
    let (mut hits, mut misses) = (0usize, 0usize);
    let mut pending: Vec<&Vec<u8>> = keys.iter().chain(&absent).collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for k in pending {
            match tier.lookup(1, k).map_err(|e| e.to_string())? {
                LookupResult::Hit => hits += 1,
                LookupResult::Miss => misses += 1,
                LookupResult::Retry => still.push(k),
            }
        }
        pending = still;
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
        if lookup_start.elapsed() > Duration::from_secs(120) {
            return Err("lookups did not resolve within 2 minutes".into());
        }
    }
    let lookup_ms = lookup_start.elapsed().as_secs_f64() * 1e3;
    tier.request_finished(1);
    if hits != n || misses != n {
        return Err(format!("lookups: {hits} hits and {misses} misses; expected {n} of each"));
    }

    // Load key i into slot n + (i * 7919) % n (a permutation when gcd(7919, n) = 1, else shifted).
    let slot_of = |i: usize| -> usize { n + if n % 7919 == 0 { i } else { (i * 7919) % n } };
    let load_jobs: Vec<(u64, Vec<u64>, KeyBatch)> = jobs
        .iter()
        .map(|(j, ids, batch)| (j + jobs.len() as u64, ids.iter().map(|&b| slot_of(b as usize) as u64).collect(), batch.clone()))
        .collect();
    let load = run_jobs(&tier, JobKind::Load, &load_jobs)?;
    let mut bad = 0;
    for i in 0..n {
        let s = slot_of(i);
        if pool[i * bs..(i + 1) * bs] != pool[s * bs..(s + 1) * bs] {
            bad += 1;
        }
    }
    if bad > 0 {
        return Err(format!("{bad} of {n} blocks differ after the round trip"));
    }
    tier.shutdown();

    let mib = (n * bs) as f64 / (1024.0 * 1024.0);
    let mut all: Vec<f64> = store.latencies_ms.iter().chain(&load.latencies_ms).copied().collect();
    all.sort_by(|a, b| a.total_cmp(b));
    if o.json {
        println!(
            "{}",
            serde_json::json!({
                "blocks": n, "block_bytes": bs, "keys_per_job": o.keys_per_job, "mib": mib,
                "store_mib_s": mib / store.seconds, "load_mib_s": mib / load.seconds,
                "store_p50_ms": percentile(&store.latencies_ms, 0.5), "store_p99_ms": percentile(&store.latencies_ms, 0.99),
                "load_p50_ms": percentile(&load.latencies_ms, 0.5), "load_p99_ms": percentile(&load.latencies_ms, 0.99),
                "lookup_keys": 2 * n, "lookup_ms": lookup_ms, "verified_blocks": n,
            })
        );
    } else {
        println!("kvtier bench: {n} blocks of {} KiB ({mib:.0} MiB), {} keys per job", bs / 1024, o.keys_per_job);
        println!("  phase    MiB/s    job p50 ms  job p99 ms");
        for (name, phase) in [("store", &store), ("load", &load)] {
            println!(
                "  {name:<6} {:>8.1}  {:>10.2}  {:>10.2}",
                mib / phase.seconds,
                percentile(&phase.latencies_ms, 0.5),
                percentile(&phase.latencies_ms, 0.99)
            );
        }
        println!("  all jobs: p50 {:.2} ms, p99 {:.2} ms", percentile(&all, 0.5), percentile(&all, 0.99));
        println!("  lookups: {} keys ({hits} hit, {misses} miss) resolved in {lookup_ms:.1} ms", 2 * n);
        println!("  verified: {n} of {n} blocks byte-exact after the round trip");
    }
    Ok(())
}
