//! Metrics in the Prometheus text exposition format: the counters of [`STATS_FIELDS`],
//! gauges of work in progress, and histograms of job latency, existence-check latency and
//! object sizes, plus failed keys by status.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::job::JobKind;
use super::stats::{StatsSnapshot, STATS_FIELDS};
use crate::error::Status;

/// Upper bounds (seconds) of the latency buckets: 100 µs to 60 s.
const SECONDS_BOUNDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];
/// Upper bounds (bytes) of the object-size buckets: 4 KiB to 256 MiB, by powers of 4.
const BYTES_BOUNDS: &[f64] = &[
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
];
/// Statuses a key can fail with are numbered below this (the status enum only grows).
const STATUS_SLOTS: usize = 32;

/// A histogram with fixed bucket bounds; the sum is kept in millionths of the unit.
struct Histogram {
    bounds: &'static [f64],
    /// `buckets[i]` counts observations `<= bounds[i]` that fit no smaller bucket; the
    /// last slot counts those above every bound.
    buckets: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    fn observe(&self, value: f64) {
        let slot = self
            .bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(self.bounds.len());
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((value.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }

    /// Writes the `_bucket`, `_sum` and `_count` lines, with `labels` (`k="v"` pairs,
    /// comma-separated, or empty).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}"
        );
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}

/// What the engine records besides the counters.
pub(crate) struct Metrics {
    store_job_seconds: Histogram,
    load_job_seconds: Histogram,
    existence_check_seconds: Histogram,
    object_bytes: Histogram,
    failed_keys: Vec<AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            store_job_seconds: Histogram::new(SECONDS_BOUNDS),
            load_job_seconds: Histogram::new(SECONDS_BOUNDS),
            existence_check_seconds: Histogram::new(SECONDS_BOUNDS),
            object_bytes: Histogram::new(BYTES_BOUNDS),
            failed_keys: (0..STATUS_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// Work in progress at the time of a scrape.
pub(crate) struct Gauges {
    pub(crate) jobs_in_flight: usize,
    pub(crate) lookups_tracked: usize,
}

impl Metrics {
    /// A finished job: its latency, and the status of each key that failed.
    pub(crate) fn job_finished(&self, kind: JobKind, seconds: f64, key_status: &[Status]) {
        match kind {
            JobKind::Store => self.store_job_seconds.observe(seconds),
            JobKind::Load => self.load_job_seconds.observe(seconds),
        }
        for status in key_status.iter().filter(|s| !s.is_ok()) {
            if let Some(slot) = self.failed_keys.get(*status as usize) {
                slot.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// One object moved (stored or loaded) of `bytes` bytes.
    pub(crate) fn object_moved(&self, bytes: usize) {
        self.object_bytes.observe(bytes as f64);
    }

    pub(crate) fn existence_checked(&self, seconds: f64) {
        self.existence_check_seconds.observe(seconds);
    }

    /// The exposition text: `# HELP`/`# TYPE` and samples, every name prefixed `kvtier_`.
    pub(crate) fn render(&self, stats: &StatsSnapshot, gauges: &Gauges) -> String {
        let mut out = String::new();
        for (field, value) in STATS_FIELDS.iter().zip(stats.values()) {
            let name = format!("kvtier_{}_total", field.name);
            let _ = writeln!(out, "# HELP {name} {}", escape_help(field.help));
            let _ = writeln!(out, "# TYPE {name} counter\n{name} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP kvtier_failed_keys_total Keys of store or load jobs that failed, by status."
        );
        let _ = writeln!(out, "# TYPE kvtier_failed_keys_total counter");
        for (code, slot) in self.failed_keys.iter().enumerate() {
            let count = slot.load(Ordering::Relaxed);
            if count > 0 {
                let _ = writeln!(
                    out,
                    "kvtier_failed_keys_total{{status=\"{}\"}} {count}",
                    status_label(code)
                );
            }
        }
        for (name, help, value) in [
            (
                "kvtier_jobs_in_flight",
                "Jobs submitted and not yet finished.",
                gauges.jobs_in_flight,
            ),
            (
                "kvtier_lookups_tracked",
                "Keys with lookup state (asked and not yet released).",
                gauges.lookups_tracked,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP kvtier_job_seconds Seconds from a job's submission to its result, by kind."
        );
        let _ = writeln!(out, "# TYPE kvtier_job_seconds histogram");
        self.store_job_seconds
            .render(&mut out, "kvtier_job_seconds", "kind=\"store\"");
        self.load_job_seconds
            .render(&mut out, "kvtier_job_seconds", "kind=\"load\"");
        let _ = writeln!(out, "# HELP kvtier_existence_check_seconds Seconds one existence check took on the lookup lane.");
        let _ = writeln!(out, "# TYPE kvtier_existence_check_seconds histogram");
        self.existence_check_seconds
            .render(&mut out, "kvtier_existence_check_seconds", "");
        let _ = writeln!(
            out,
            "# HELP kvtier_object_bytes Sizes of the objects stored and loaded."
        );
        let _ = writeln!(out, "# TYPE kvtier_object_bytes histogram");
        self.object_bytes
            .render(&mut out, "kvtier_object_bytes", "");
        out
    }
}

/// The status's name as in the C enum, lower case: `not_found`, `corrupt`...
fn status_label(code: usize) -> String {
    Status::from_code(code as i32).map_or_else(|| format!("status_{code}"), Status::name)
}

/// HELP text escaping of the exposition format: backslash and newline.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.5, 1.7, 9.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "k=\"v\"");
        assert!(out.contains("x_bucket{k=\"v\",le=\"1\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{k=\"v\",le=\"2\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{k=\"v\",le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_count{k=\"v\"} 4\n"), "{out}");
        assert!(out.contains("x_sum{k=\"v\"} 12.7\n"), "{out}");
    }
}
