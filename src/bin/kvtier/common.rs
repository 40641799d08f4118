//! Option groups and helpers shared by the subcommands: each subcommand flattens the
//! groups it needs (`#[command(flatten)]`) instead of declaring the options again.

use std::path::PathBuf;

use clap::Args;

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
    /// Tier configuration as JSON (e.g. an S3 store; see the README)
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
