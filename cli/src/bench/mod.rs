//! `kvtier bench`: runs a simulated serving workload through the library and prints a
//! summary table (or one JSON object).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::{ArgAction, Args};
use kvtier_core::key::make_key;
use kvtier_core::{JobKind, KeyBatch, LookupResult, MemoryRange, Tier};

use crate::common::{parse_positive, parse_size, Failure, StoreArgs};

mod args;
mod report;

pub use args::{BenchArgs, RangeLayout};
use report::{print_report, PhaseResult, Progress};

/// Runs the benchmark; the default store is a local directory under the system's
/// temporary directory, removed afterwards.
pub fn run(o: &BenchArgs) -> Result<(), Failure> {
    let config = o.store.config_text()?;
    bench(o, config.as_deref()).map_err(Failure::run)
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

/// CPU seconds used by the calling thread alone.
fn thread_cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// What one [`thread_cpu`] read costs the thread that reads it: a system call where the
/// kernel offers no vDSO for the thread's CPU clock (about 0.5 µs in some VMs). A window
/// between two reads holds about one read's cost, which the caller column leaves out, so
/// that it counts the library's calls and not the bench's clock.
fn thread_cpu_read_cost() -> f64 {
    const READS: u32 = 2000;
    let first = thread_cpu();
    let mut last = first;
    for _ in 0..READS {
        last = thread_cpu();
    }
    ((last - first) / f64::from(READS)).max(0.0)
}

/// Rounds run and resident memory over them, for soaks.
struct Soak {
    rounds: usize,
    seconds: f64,
    resident_after_first_round: u64,
    resident_end: u64,
    samples_kib: u64,
}

/// Resident memory now, in KiB (VmRSS), 0 where /proc is unavailable.
fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .map(|v| v.trim().trim_end_matches("kB").trim().to_string())
            })
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Client CPU seconds (user + system) and peak RSS in KiB, from getrusage.
fn rusage() -> (f64, u64) {
    // SAFETY: rusage is plain old data; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid rusage to write.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        secs(usage.ru_utime) + secs(usage.ru_stime),
        usage.ru_maxrss as u64,
    )
}

/// One job of a phase: its id, its blocks (as pool block ids, and as ranges when
/// `--ranges-per-block` is above 1) and its keys.
struct BenchJob {
    id: u64,
    blocks: Vec<u64>,
    ranges: Vec<MemoryRange>,
    keys: KeyBatch,
}

/// Block `b` as ranges: piece `j` in `regions[j]` (a region id and where the region
/// starts in the pool), at `at(b, j)` in the pool.
fn block_ranges(
    regions: &[(u64, usize)],
    block: usize,
    piece: usize,
    at: &dyn Fn(usize, usize) -> usize,
) -> Vec<MemoryRange> {
    regions
        .iter()
        .enumerate()
        .map(|(j, &(region, start))| MemoryRange {
            region,
            offset: (at(block, j) - start) as u64,
            len: piece as u64,
        })
        .collect()
}

/// Runs jobs with at most `concurrency` in flight, refilling as results arrive.
fn run_jobs(
    tier: &Tier,
    kind: JobKind,
    jobs: &[BenchJob],
    o: &BenchArgs,
    label: &str,
) -> Result<PhaseResult, String> {
    let (cpu0, _) = rusage();
    let start = Instant::now();
    let mut submitted = 0;
    let mut latencies = Vec::with_capacity(jobs.len());
    let mut bytes = 0u64;
    let mut progress = Progress::new(label, jobs.len(), o.store.json());
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut caller_seconds = 0.0;
    let clock_cost = thread_cpu_read_cost();
    while latencies.len() < jobs.len() {
        let t0 = thread_cpu();
        while submitted < jobs.len() && submitted - latencies.len() < o.concurrency {
            let job = &jobs[submitted];
            // A rejected job still yields its failed result below.
            let _ = if job.ranges.is_empty() {
                tier.submit(kind, job.id, &job.blocks, job.keys.clone())
            } else {
                let per_key = job.ranges.len() / job.blocks.len();
                tier.submit_ranges(kind, job.id, &job.ranges, per_key, job.keys.clone())
            };
            submitted += 1;
        }
        let results = tier.poll(usize::MAX);
        caller_seconds += (thread_cpu() - t0 - clock_cost).max(0.0);
        for r in results {
            if !r.succeeded() {
                return Err(format!("{label} job {} failed: {}", r.job_id, r.message));
            }
            bytes += r.bytes;
            latencies.push(r.seconds * 1e3);
        }
        progress.update(latencies.len());
        if latencies.len() == jobs.len() {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{label} jobs did not finish within an hour"));
        }
        let mut pfd = libc::pollfd {
            fd: tier.ready_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 100) };
    }
    progress.finish();
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort_by(|a, b| a.total_cmp(b));
    Ok(PhaseResult {
        name: label.into(),
        ops: jobs.len(),
        bytes,
        seconds,
        cpu_seconds: rusage().0 - cpu0,
        caller_seconds,
        keys: jobs.iter().map(|j| j.keys.len()).sum(),
        latencies_ms: latencies,
    })
}

/// Checks `present` and `absent` keys as one request, in batches of 256 per step; an op
/// is one batch, its latency from the first lookup to the last verdict.
fn run_exists(
    tier: &Tier,
    present: &[Vec<u8>],
    absent: &[Vec<u8>],
    request: u64,
) -> Result<PhaseResult, String> {
    let (cpu0, _) = rusage();
    let start = Instant::now();
    let mut latencies = Vec::new();
    let all: Vec<(&Vec<u8>, bool)> = present
        .iter()
        .map(|k| (k, true))
        .chain(absent.iter().map(|k| (k, false)))
        .collect();
    for chunk in all.chunks(256) {
        let t = Instant::now();
        for (k, _) in chunk {
            tier.lookup(request, k).map_err(|e| e.to_string())?;
        }
        tier.schedule_end().map_err(|e| e.to_string())?;
        // Asks again from the first key still unresolved and stops at the next `Retry`:
        // a poll costs one lookup while the batch is out, not one per key (the calling
        // thread would otherwise take CPU from the checks it waits for).
        let mut resolved = 0;
        while resolved < chunk.len() {
            let (key, present) = chunk[resolved];
            match tier.lookup(request, key).map_err(|e| e.to_string())? {
                LookupResult::Retry => {
                    std::thread::sleep(Duration::from_micros(20));
                    if t.elapsed() > Duration::from_secs(120) {
                        return Err("lookups did not resolve within 2 minutes".into());
                    }
                }
                LookupResult::Hit if present => resolved += 1,
                LookupResult::Miss if !present => resolved += 1,
                other => {
                    return Err(format!(
                        "lookup answered {other:?} for a key that is {}",
                        if present { "present" } else { "absent" }
                    ))
                }
            }
        }
        latencies.push(t.elapsed().as_secs_f64() * 1e3);
    }
    tier.request_finished(request);
    latencies.sort_by(|a, b| a.total_cmp(b));
    Ok(PhaseResult {
        name: "exists".into(),
        ops: latencies.len(),
        bytes: 0,
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: rusage().0 - cpu0,
        caller_seconds: 0.0,
        keys: 0,
        latencies_ms: latencies,
    })
}

fn bench(o: &BenchArgs, given_config: Option<&str>) -> Result<(), String> {
    let temp_dir = std::env::temp_dir().join(format!("kvtier-bench-{}", std::process::id()));
    let mut config: serde_json::Value = match given_config {
        Some(c) => serde_json::from_str(c).map_err(|e| format!("--config is not JSON: {e}"))?,
        None => serde_json::json!({"store": {"type": "local", "path": temp_dir}}),
    };
    let object = config
        .as_object_mut()
        .ok_or("--config must be a JSON object")?;
    object
        .entry("max_inflight_transfers")
        .or_insert(serde_json::json!(o.concurrency.max(1)));
    if !o.checksums {
        object.insert("checksums".into(), serde_json::json!(false));
    }
    let result = bench_with(o, &config.to_string());
    if given_config.is_none() {
        let _ = std::fs::remove_dir_all(&temp_dir);
    }
    result
}

fn bench_with(o: &BenchArgs, config: &str) -> Result<(), String> {
    let n = o.blocks;
    let bs = o.block_size;
    // The pool is declared before the tier so that it is dropped after it: on every early
    // return below, dropping the tier shuts it down (waiting for or abandoning its jobs)
    // while the memory those jobs write into is still allocated.
    let mut pool = vec![0u8; 2 * n * bs];
    fill(&mut pool, 0x5eed);
    let tier = Tier::from_json(config).map_err(|e| e.to_string())?;
    let layers = o.ranges_per_block;
    // Contiguous: block b at b * bs. Layer-first: the pool is `layers` regions one after
    // the other, block b's piece j at b * (bs / layers) in region j. Adjacent: block b's
    // piece j at b * bs + j * (bs / layers) of one region, the pool.
    let piece = bs / layers;
    let layer_first = o.range_layout == RangeLayout::LayerFirst;
    let at = |block: usize, j: usize| {
        if layer_first {
            j * 2 * n * piece + block * piece
        } else {
            block * bs + j * piece
        }
    };
    let regions: Vec<(u64, usize)> = if layers == 1 {
        // SAFETY: `pool` holds exactly 2n blocks of `bs` bytes and is dropped after the tier (declared first).
        unsafe { tier.register_memory(pool.as_mut_ptr(), 2 * n as u64, bs) }
            .map_err(|e| e.to_string())?;
        Vec::new()
    } else {
        if !bs.is_multiple_of(layers) {
            return Err(format!(
                "--block-size {bs} does not divide into {layers} ranges"
            ));
        }
        if layer_first {
            (0..layers)
                .map(|j| {
                    // SAFETY: each region lies inside `pool`, dropped after the tier.
                    unsafe { tier.add_region(pool.as_mut_ptr().add(at(0, j)), 2 * n * piece) }
                        .map(|id| (id, at(0, j)))
                        .map_err(|e| e.to_string())
                })
                .collect::<Result<_, _>>()?
        } else {
            // SAFETY: the region is `pool`, dropped after the tier.
            let id = unsafe { tier.add_region(pool.as_mut_ptr(), pool.len()) }
                .map_err(|e| e.to_string())?;
            vec![(id, 0); layers]
        }
    };
    let (_, peak_rss_start) = rusage();
    let slot_of = |i: usize| -> usize { n + (i * 7919 + 13) % n };
    let mut phases: Vec<PhaseResult> = Vec::new();
    let mut verified = 0usize;
    let mut job_id = 0u64;
    let started = Instant::now();
    let base_salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut resident_after_first_round = 0u64;
    let mut round = 0usize;
    while round < o.repeat || o.duration.is_some_and(|d| started.elapsed() < d) {
        let salt = base_salt ^ o.key_sets.map_or(round, |sets| round % sets.max(1)) as u64;
        let keys: Vec<Vec<u8>> = (0..n as u64).map(|i| key_for(i, salt)).collect();
        let mut make_jobs = |slot: &dyn Fn(usize) -> usize| -> Vec<BenchJob> {
            (0..n)
                .step_by(o.keys_per_job)
                .map(|first| {
                    let range = first..(first + o.keys_per_job).min(n);
                    let blocks: Vec<u64> = range.clone().map(|b| slot(b) as u64).collect();
                    let ranges = if regions.is_empty() {
                        Vec::new()
                    } else {
                        blocks
                            .iter()
                            .flat_map(|&b| block_ranges(&regions, b as usize, piece, &at))
                            .collect()
                    };
                    let keys = KeyBatch::from_keys(&keys[range]).expect("keys have one length");
                    job_id += 1;
                    BenchJob {
                        id: job_id,
                        blocks,
                        ranges,
                        keys,
                    }
                })
                .collect()
        };
        let store_jobs = make_jobs(&|i| i);
        let load_jobs = make_jobs(&slot_of);
        for (index, phase) in o.workload.0.iter().enumerate() {
            let result = match phase.as_str() {
                "store" => run_jobs(&tier, JobKind::Store, &store_jobs, o, "store")?,
                "load" => {
                    for (b, j) in (n..2 * n).flat_map(|b| (0..layers).map(move |j| (b, j))) {
                        pool[at(b, j)..at(b, j) + piece].fill(0);
                    }
                    run_jobs(&tier, JobKind::Load, &load_jobs, o, "load")?
                }
                "exists" => {
                    let absent: Vec<Vec<u8>> = (0..n as u64).map(|i| key_for(i, !salt)).collect();
                    run_exists(&tier, &keys, &absent, (round * 100 + index) as u64)?
                }
                _ => {
                    for i in 0..n {
                        let s = slot_of(i);
                        let same = (0..layers).all(|j| {
                            pool[at(i, j)..at(i, j) + piece] == pool[at(s, j)..at(s, j) + piece]
                        });
                        if !same {
                            return Err(format!(
                                "block {i} differs from slot {s} after the round trip"
                            ));
                        }
                    }
                    verified += n;
                    continue;
                }
            };
            match phases.iter_mut().find(|p| p.name == result.name) {
                Some(existing) => existing.merge(result),
                None => phases.push(result),
            }
        }
        if round == 0 {
            resident_after_first_round = resident_kib();
        }
        round += 1;
    }
    let (_, peak_rss_end) = rusage();
    let soak = Soak {
        rounds: round,
        seconds: started.elapsed().as_secs_f64(),
        resident_after_first_round,
        resident_end: resident_kib(),
        samples_kib: phases
            .iter()
            .map(|p| p.latencies_ms.len() * 8)
            .sum::<usize>() as u64
            / 1024,
    };
    tier.shutdown();
    // The checksum's own price, on this thread: a cold pass over the stored bytes (as a
    // store pays), and passes over 64 KiB chunks already in cache (as a load pays: it
    // checksums each chunk right after copying it into the slot).
    let gib = |bytes: usize| bytes as f64 / (1u64 << 30) as f64;
    let t0 = thread_cpu();
    std::hint::black_box(crc_fast::crc32_iscsi(&pool[..n * bs]));
    let cold = (thread_cpu() - t0) / gib(n * bs);
    let chunk = &pool[..(64 * 1024).min(n * bs)];
    let rounds = (n * bs / chunk.len()).max(1);
    // CPU-s/GiB of `crc` over the same 64 KiB again and again, in cache.
    let in_cache = |crc: &dyn Fn(&[u8]) -> u64| {
        let t0 = thread_cpu();
        for _ in 0..rounds {
            std::hint::black_box(crc(std::hint::black_box(chunk)));
        }
        (thread_cpu() - t0) / gib(rounds * chunk.len())
    };
    let hot = in_cache(&|bytes| u64::from(crc_fast::crc32_iscsi(bytes)));
    // The upload checksum S3 servers verify (CRC64NVME): a store on the direct path computes
    // it with the CRC32C in one pass, over each 64 KiB while it is in cache; its price is
    // the in-cache one.
    let upload = in_cache(&|bytes| crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, bytes));
    let checksum_cpu_per_gib = (cold, hot, upload);
    for p in &mut phases {
        p.latencies_ms.sort_by(|a, b| a.total_cmp(b));
    }
    print_report(
        o,
        &phases,
        verified,
        (peak_rss_start, peak_rss_end),
        &soak,
        &tier,
        checksum_cpu_per_gib,
    );
    Ok(())
}
