//! The `kvtier` command line run as a process, as an operator runs it: its output as text
//! or as the one JSON document `--json` prints.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

use super::tools::kvtier_cli;

/// The built `kvtier`: the path Cargo gives the command line's own tests, else (a test of
/// another crate) the one beside the test ([`kvtier_cli`]).
pub fn kvtier_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_kvtier") {
        Some(path) => PathBuf::from(path),
        None => kvtier_cli(),
    }
}

/// Runs the built `kvtier` with `args`.
pub fn kvtier(args: &[&str]) -> Output {
    Command::new(kvtier_bin())
        .args(args)
        .output()
        .expect("the kvtier binary runs")
}

/// Runs `kvtier SUBCOMMAND --config CONFIG ARGS…`.
pub fn kvtier_with(sub: &str, config: &str, args: &[&str]) -> Output {
    let mut all = vec![sub, "--config", config];
    all.extend_from_slice(args);
    kvtier(&all)
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// The one JSON document on stdout.
pub fn json_of(out: &Output) -> Value {
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
            stdout(out),
            stderr(out)
        )
    })
}

/// Runs `sub` with `--json`, expects exit status `code`, and returns the parsed output.
pub fn json_run(sub: &str, config: &str, args: &[&str], code: i32) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = kvtier_with(sub, config, &all);
    assert_eq!(
        out.status.code(),
        Some(code),
        "kvtier {sub} {args:?}\nstdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    json_of(&out)
}
