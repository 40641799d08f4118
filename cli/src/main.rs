//! The `kvtier` command line: one module per subcommand, option groups shared between
//! them in `common`.

mod bench;
mod common;
mod completions;
mod config;
mod du;
mod gc;
mod ls;
mod namespace;
mod objects;
mod probe;
mod verify;

use clap::{Parser, Subcommand};

use crate::common::Failure;

/// kvtier: a secondary KV-cache tier on object storage for LLM serving engines.
#[derive(Parser, Debug)]
#[command(name = "kvtier", version = kvtier_core::VERSION, arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a simulated serving workload through the library and print a summary
    ///
    /// The default workload stores blocks from a host pool, checks their existence (and
    /// that of as many absent keys), loads them into other slots, verifies every byte,
    /// and prints throughput, latency, client CPU per GiB and peak RSS. Without --config
    /// it uses a local directory store in a temporary directory, removed afterwards.
    #[command(verbatim_doc_comment)]
    Bench(bench::BenchArgs),

    /// Check a store as a starting tier would: one line per check, OK or FAIL with the fix
    ///
    /// Checks the endpoint, TLS, credentials and bucket (the library's start-up probe),
    /// what a missing key answers (404, or 403 without s3:ListBucket), put/get/delete of
    /// a small object under the probe prefix, conditional PUT, checksum metadata, and the
    /// latency of small requests. Exits 1 when a tier would not start with this
    /// configuration.
    #[command(verbatim_doc_comment)]
    Probe(probe::ProbeArgs),

    /// List the namespaces under a prefix: objects, bytes, oldest and newest, and totals
    Ls(ls::LsArgs),

    /// Show the space the namespaces under a prefix take, and the total
    Du(du::DuArgs),

    /// Delete objects by age and/or down to a byte budget, oldest first
    ///
    /// Works on a namespace (--namespace), everything under a prefix (--prefix), or by
    /// default the configuration's prefix and namespace. Safe while engines serve: a load
    /// of a deleted key fails alone (not found) and its lookups turn MISS. On a local
    /// store it also deletes the temporary files of writes that never finished (a crash
    /// before the rename) once they are an hour old.
    #[command(verbatim_doc_comment)]
    Gc(gc::GcArgs),

    /// Read objects and check their length and recorded checksum; report the corrupt ones
    Verify(verify::VerifyArgs),

    /// The configuration: print its schema, or check a configuration
    Config(config::ConfigArgs),

    /// Print vLLM's namespace string for a field set, as kvt_vllm_namespace does
    ///
    /// The namespace is <model_name with / replaced by _>_<first 12 hex digits of the
    /// SHA-256 of the field set>_r<rank>, the field set serialized as Python's
    /// json.dumps(fields, sort_keys=True, separators=(",", ":")) does, so objects are
    /// named as vLLM's tiers name them.
    #[command(verbatim_doc_comment)]
    Namespace(namespace::NamespaceArgs),

    /// Print a shell completion script
    ///
    /// For example: kvtier completions bash > ~/.local/share/bash-completion/completions/kvtier
    #[command(verbatim_doc_comment)]
    Completions(completions::CompletionsArgs),

    /// Print the version
    Version,
}

impl Command {
    fn name(&self) -> &'static str {
        match self {
            Command::Bench(_) => "bench",
            Command::Probe(_) => "probe",
            Command::Ls(_) => "ls",
            Command::Du(_) => "du",
            Command::Gc(_) => "gc",
            Command::Verify(_) => "verify",
            Command::Config(_) => "config",
            Command::Namespace(_) => "namespace",
            Command::Completions(_) => "completions",
            Command::Version => "version",
        }
    }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result: Result<(), Failure> = match &cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Probe(args) => probe::run(args),
        Command::Ls(args) => ls::run(args),
        Command::Du(args) => du::run(args),
        Command::Gc(args) => gc::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Config(args) => config::run(args),
        Command::Namespace(args) => namespace::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Version => {
            println!("kvtier {}", kvtier_core::VERSION);
            Ok(())
        }
    };
    if let Err(failure) = result {
        eprintln!("kvtier {}: {}", cli.command.name(), failure.message);
        std::process::exit(failure.status);
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
