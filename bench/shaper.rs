//! `shaper --upstream PORT [--round-trip-ms MS] [--connection-mbps N] [--total-mbps N]`:
//! makes a loopback link look like the path to a remote object store, in front of a server
//! on `127.0.0.1:PORT` (s3s-fs, the bench sink): every exchange waits a round trip (half
//! each way), a new connection's first request one more, and each connection (and,
//! optionally, all of them together) is paced to a rate, in MB/s (10^6 bytes) each way.
//! The same shaper the latency tests use (`tests/support/shaper.rs`).
//!
//! Prints `listening on 127.0.0.1:PORT` once ready. Each line read on standard input is
//! answered with one line of JSON: what crossed the link so far and the shaper's own CPU
//! time, so a benchmark can report it beside the client's; end of input ends it.

#[path = "../tests/support/shaper.rs"]
#[allow(dead_code)]
mod shaper;

use std::io::{BufRead, Write};
use std::time::Duration;

use clap::Parser;

#[derive(Parser)]
#[command(about = "A shaping proxy: round trip and bandwidth of a remote store, on loopback")]
struct Args {
    /// Port of the server on 127.0.0.1.
    #[arg(long)]
    upstream: u16,
    /// Round trip added to every exchange, in milliseconds.
    #[arg(long, default_value_t = 0)]
    round_trip_ms: u64,
    /// Rate of one connection in each direction, in MB/s; unlimited if absent.
    #[arg(long)]
    connection_mbps: Option<f64>,
    /// Rate of all connections together in each direction, in MB/s; unlimited if absent.
    #[arg(long)]
    total_mbps: Option<f64>,
}

fn bytes_per_s(mbps: Option<f64>) -> Option<u64> {
    mbps.map(|m| (m * 1e6).max(1.0) as u64)
}

/// CPU seconds (user + system) this process has used.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn main() {
    let args = Args::parse();
    let link = shaper::Link {
        round_trip: Duration::from_millis(args.round_trip_ms),
        per_connection: bytes_per_s(args.connection_mbps),
        total: bytes_per_s(args.total_mbps),
    };
    let shaper = shaper::Shaper::start(args.upstream, link);
    let mut out = std::io::stdout();
    let _ = writeln!(out, "listening on 127.0.0.1:{}", shaper.port());
    let _ = out.flush();
    for _ in std::io::stdin().lock().lines().map_while(Result::ok) {
        let t = shaper.traffic();
        let _ = writeln!(
            out,
            "{{\"accepted\": {}, \"open\": {}, \"most_open\": {}, \"bytes_up\": {}, \"bytes_down\": {}, \"cpu_s\": {:.3}}}",
            t.accepted,
            t.open,
            t.most_open,
            t.bytes_up,
            t.bytes_down,
            cpu_seconds()
        );
        let _ = out.flush();
    }
}
