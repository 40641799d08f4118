//! What `kvtier bench` shows: progress while it runs, and each phase's throughput,
//! latency and CPU at the end (text or JSON).

use super::*;

pub(super) struct Progress {
    pub(super) label: String,
    pub(super) total: usize,
    pub(super) enabled: bool,
    pub(super) last: Instant,
}

impl Progress {
    pub(super) fn new(label: &str, total: usize, quiet: bool) -> Self {
        Progress {
            label: label.to_string(),
            total,
            enabled: !quiet && std::io::stderr().is_terminal(),
            last: Instant::now(),
        }
    }
    pub(super) fn update(&mut self, done: usize) {
        if !self.enabled || (self.last.elapsed() < Duration::from_millis(100) && done < self.total)
        {
            return;
        }
        self.last = Instant::now();
        let width = 30;
        let filled = done * width / self.total.max(1);
        eprint!(
            "\r  {:<8} [{}{}] {done}/{}",
            self.label,
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.total
        );
        let _ = std::io::stderr().flush();
    }
    pub(super) fn finish(&self) {
        if self.enabled {
            eprint!("\r{}\r", " ".repeat(60));
        }
    }
}

#[derive(Default, Clone)]
pub(super) struct PhaseResult {
    pub(super) name: String,
    pub(super) ops: usize,
    pub(super) bytes: u64,
    pub(super) seconds: f64,
    pub(super) cpu_seconds: f64,
    /// CPU the caller's thread spent inside submit and poll.
    pub(super) caller_seconds: f64,
    pub(super) keys: usize,
    pub(super) latencies_ms: Vec<f64>,
}

impl PhaseResult {
    fn caller_us_per_key(&self) -> Option<f64> {
        (self.keys > 0).then(|| self.caller_seconds * 1e6 / self.keys as f64)
    }

    pub(super) fn merge(&mut self, other: PhaseResult) {
        self.name = other.name;
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.seconds += other.seconds;
        self.cpu_seconds += other.cpu_seconds;
        self.caller_seconds += other.caller_seconds;
        self.keys += other.keys;
        self.latencies_ms.extend(other.latencies_ms);
    }
    fn mib_s(&self) -> f64 {
        self.bytes as f64 / (1024.0 * 1024.0) / self.seconds.max(1e-9)
    }
    fn cpu_per_gib(&self) -> Option<f64> {
        (self.bytes > 0)
            .then(|| self.cpu_seconds / (self.bytes as f64 / (1024.0 * 1024.0 * 1024.0)))
    }
}

pub(super) fn print_report(
    o: &BenchArgs,
    phases: &[PhaseResult],
    verified: usize,
    (peak_rss_start, peak_rss_end): (u64, u64),
    soak: &Soak,
    tier: &Tier,
    checksum_cpu_per_gib: (f64, f64, f64),
) {
    let stats = tier.stats();
    if o.store.json() {
        let rows: Vec<serde_json::Value> = phases
            .iter()
            .map(|p| {
                serde_json::json!({
                    "phase": p.name, "ops": p.ops, "bytes": p.bytes, "seconds": p.seconds,
                    "mib_s": p.mib_s(), "ops_s": p.ops as f64 / p.seconds.max(1e-9),
                    "p50_ms": percentile(&p.latencies_ms, 0.5), "p90_ms": percentile(&p.latencies_ms, 0.9),
                    "p99_ms": percentile(&p.latencies_ms, 0.99), "cpu_seconds": p.cpu_seconds,
                    "cpu_s_per_gib": p.cpu_per_gib(), "caller_us_per_key": p.caller_us_per_key(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "blocks": o.blocks, "block_bytes": o.block_size, "keys_per_job": o.keys_per_job,
                "ranges_per_block": o.ranges_per_block,
                "range_layout": if o.ranges_per_block == 1 { "contiguous".to_string() } else { o.range_layout.name() },
                "concurrency": o.concurrency, "repeat": o.repeat, "checksums": o.checksums,
                "phases": rows, "verified_blocks": verified,
                "peak_rss_kib_after_setup": peak_rss_start, "peak_rss_kib_end": peak_rss_end,
                "rounds": soak.rounds, "seconds": soak.seconds,
                "rss_kib_after_first_round": soak.resident_after_first_round, "rss_kib_end": soak.resident_end,
                "latency_samples_kib": soak.samples_kib,
                "corrupt_blocks": stats.corrupt_blocks, "existence_checks": stats.existence_checks,
                "dedup_mode": tier.dedup_mode().name(), "dedup_known": stats.dedup_known,
                "dedup_joined": stats.dedup_joined, "dedup_already_stored": stats.dedup_already_stored,
                "direct_requests": stats.direct_requests, "direct_fallbacks": stats.direct_fallbacks,
                "checksum_cpu_s_per_gib_cold": checksum_cpu_per_gib.0,
                "upload_checksum_cpu_s_per_gib": checksum_cpu_per_gib.2,
                "checksum_cpu_s_per_gib_in_cache": checksum_cpu_per_gib.1,
            })
        );
        return;
    }
    println!(
        "kvtier bench: {} blocks of {} KiB{} x {} round(s), {} key(s) per job, {} jobs in flight, checksums {}",
        o.blocks,
        o.block_size / 1024,
        match o.ranges_per_block {
            1 => String::new(),
            n if o.range_layout == RangeLayout::LayerFirst => format!(" as {n} ranges apart"),
            n => format!(" as {n} adjacent ranges"),
        },
        soak.rounds,
        o.keys_per_job,
        o.concurrency,
        if o.checksums { "on" } else { "off" }
    );
    println!(
        "  {:<7} {:>6} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10} {:>12}",
        "phase",
        "ops",
        "MiB/s",
        "ops/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "CPU-s/GiB",
        "caller us/key"
    );
    for p in phases {
        let mib = if p.bytes > 0 {
            format!("{:.1}", p.mib_s())
        } else {
            "-".into()
        };
        let cpu = p.cpu_per_gib().map_or("-".into(), |c| format!("{c:.3}"));
        let caller = p
            .caller_us_per_key()
            .map_or("-".into(), |c| format!("{c:.2}"));
        println!(
            "  {:<7} {:>6} {:>9} {:>9.1} {:>8.2} {:>8.2} {:>8.2} {:>10} {:>12}",
            p.name,
            p.ops,
            mib,
            p.ops as f64 / p.seconds.max(1e-9),
            percentile(&p.latencies_ms, 0.5),
            percentile(&p.latencies_ms, 0.9),
            percentile(&p.latencies_ms, 0.99),
            cpu,
            caller
        );
    }
    println!("  caller us/key: CPU of the calling thread inside submit + poll, per key moved (less the cost of reading the thread's CPU clock, measured at start)");
    if phases.iter().any(|p| p.name == "exists") {
        println!("  exists: one op = a batch of up to 256 keys (half present), latency to the last verdict");
    }
    println!(
        "  peak RSS: {} MiB after setup, {} MiB at the end",
        peak_rss_start / 1024,
        peak_rss_end / 1024
    );
    if soak.rounds > 1 {
        println!(
            "  resident: {:.1} MiB after round 1, {:.1} MiB after round {} ({:.0} s); the bench's own latency samples hold {:.1} MiB",
            soak.resident_after_first_round as f64 / 1024.0,
            soak.resident_end as f64 / 1024.0,
            soak.rounds,
            soak.seconds,
            soak.samples_kib as f64 / 1024.0
        );
    }
    println!(
        "  checksum cost (CRC32C{}): {:.3} CPU-s/GiB over cold memory (store), {:.3} in cache (load)",
        if o.checksums { "" } else { ", off in this run" },
        checksum_cpu_per_gib.0,
        checksum_cpu_per_gib.1
    );
    println!(
        "  upload checksum (CRC64NVME, x-amz-checksum-crc64nvme, S3 stores): {:.3} CPU-s/GiB, \
         in one pass with the CRC32C; damaged uploads refused: {}",
        checksum_cpu_per_gib.2, stats.damaged_uploads
    );
    println!(
        "  dedup: {} (known {}, joined {}, already stored {}); direct path: {} requests, {} fallbacks",
        tier.dedup_mode().name(),
        stats.dedup_known,
        stats.dedup_joined,
        stats.dedup_already_stored,
        stats.direct_requests,
        stats.direct_fallbacks
    );
    if verified > 0 {
        println!("  verified: {verified} of {verified} blocks byte-exact after the round trip");
    }
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
