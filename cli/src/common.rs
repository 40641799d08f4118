//! Option groups and helpers shared by the subcommands: each subcommand flattens the
//! groups it needs (`#[command(flatten)]`) instead of declaring the options again.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use kvtier_core::store::Store;
use kvtier_core::TierConfig;

/// Output format: `--json`.
#[derive(Args, Debug, Clone, Default)]
pub struct OutputArgs {
    /// Print the results as one JSON object
    #[arg(long)]
    pub json: bool,
}

/// Which store to use (`--config JSON` or `--config-file PATH`, at most one) and the
/// output format (`--json`): the options of every subcommand that opens a tier.
#[derive(Args, Debug, Clone, Default)]
pub struct StoreArgs {
    /// Tier configuration as JSON (e.g. an S3 store; see docs/configuration.md)
    #[arg(long, value_name = "JSON", conflicts_with = "config_file")]
    pub config: Option<String>,

    /// Tier configuration read from a file
    #[arg(long, value_name = "PATH")]
    pub config_file: Option<PathBuf>,

    #[command(flatten)]
    pub output: OutputArgs,
}

impl StoreArgs {
    /// The configuration text given, if any: `--config` as is, or the contents of
    /// `--config-file`. The error names the file.
    pub fn config_text(&self) -> Result<Option<String>, Failure> {
        match (&self.config, &self.config_file) {
            (Some(text), _) => Ok(Some(text.clone())),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map(Some)
                .map_err(|e| Failure::usage(format!("{}: {e}", path.display()))),
            (None, None) => Ok(None),
        }
    }

    pub fn json(&self) -> bool {
        self.output.json
    }

    /// The tier configuration, which the operator subcommands need: `--config` or
    /// `--config-file`, parsed and checked as `kvt_tier_new` does.
    pub fn tier_config(&self) -> Result<TierConfig, Failure> {
        let text = self.config_text()?.ok_or_else(|| {
            Failure::usage("a store is needed: pass --config JSON or --config-file PATH")
        })?;
        TierConfig::from_json(&text).map_err(|e| Failure::usage(e.message))
    }
}

/// A small I/O runtime for one subcommand run: two workers, timers and sockets.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("kvtier-cli")
        .enable_all()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the I/O runtime: {e}")))
}

/// Opens the configuration's store; call it inside the runtime that will use it.
pub fn open_store(config: &TierConfig) -> Result<Store, Failure> {
    Store::open(&config.store).map_err(|e| Failure::run(e.message))
}

/// A counter line on stderr for long runs: printed at most every two seconds, and only
/// once the run has taken that long, so short runs stay quiet.
pub struct Progress {
    label: &'static str,
    started: Instant,
    last: Instant,
    printed: bool,
    terminal: bool,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(2);

    pub fn new(label: &'static str) -> Self {
        let now = Instant::now();
        Progress {
            label,
            started: now,
            last: now,
            printed: false,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// Reports `what` (e.g. "deleted 1200 of 5000 objects") if it is time to.
    pub fn tick(&mut self, what: impl FnOnce() -> String) {
        if self.last.elapsed() < Self::EVERY {
            return;
        }
        self.last = Instant::now();
        self.printed = true;
        let secs = self.started.elapsed().as_secs();
        if self.terminal {
            eprint!("\r\x1b[2Kkvtier {}: {} ({secs} s)", self.label, what());
        } else {
            eprintln!("kvtier {}: {} ({secs} s)", self.label, what());
        }
    }

    /// Ends the counter line (on a terminal, it is overwritten in place).
    pub fn finish(&self) {
        if self.printed && self.terminal {
            eprintln!();
        }
    }
}

/// Why a subcommand failed, and the exit status for it: 2 for a bad invocation (as
/// clap's own usage errors), 1 for a failure while running.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub status: i32,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            status: 2,
        }
    }

    pub fn run(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            status: 1,
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::run(message)
    }
}

/// A byte count with an optional K, M or G suffix (binary: K = 1024), e.g. `64K`, `2M`.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let (digits, scale) = match text.chars().last() {
        Some('k' | 'K') => (&text[..text.len() - 1], 1024),
        Some('m' | 'M') => (&text[..text.len() - 1], 1024 * 1024),
        Some('g' | 'G') => (&text[..text.len() - 1], 1024 * 1024 * 1024),
        _ => (text, 1),
    };
    let n = digits
        .parse::<usize>()
        .map_err(|_| format!("not a size: {text}"))?;
    n.checked_mul(scale)
        .ok_or_else(|| format!("too large a size: {text}"))
}

/// A whole number greater than zero.
pub fn parse_positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be positive".into()),
        Ok(n) => Ok(n),
        Err(_) => Err("needs a number".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64K"), Ok(64 * 1024));
        assert_eq!(parse_size("2m"), Ok(2 * 1024 * 1024));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("3Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("-1K").is_err());
        assert!(parse_size(&format!("{}G", usize::MAX)).is_err());
    }

    #[test]
    fn positive_numbers() {
        assert_eq!(parse_positive("3"), Ok(3));
        assert!(parse_positive("0").is_err());
        assert!(parse_positive("x").is_err());
    }
}
