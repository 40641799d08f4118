//! `kvtier bench`'s options and their parsing.

use super::*;

pub(super) const PHASES: [&str; 4] = ["store", "exists", "load", "verify"];

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Blocks per phase
    #[arg(long, value_name = "N", default_value = "256", value_parser = parse_positive)]
    pub blocks: usize,

    /// Bytes per block, with optional K/M/G suffix
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_block_size)]
    pub block_size: usize,

    /// Keys per store/load job
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_positive)]
    pub keys_per_job: usize,

    /// Jobs in flight at once; also the tier's
    /// max_inflight_transfers unless the configuration sets it
    #[arg(verbatim_doc_comment, long, value_name = "N", default_value = "16", value_parser = parse_positive)]
    pub concurrency: usize,

    /// Comma-separated phases, in order, from: store, exists,
    /// load, verify; load and verify need a store phase first
    #[arg(verbatim_doc_comment, long, value_name = "LIST", default_value = "store,exists,load,verify", value_parser = parse_workload)]
    pub workload: Workload,

    /// Run the phases N times with fresh keys
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_positive)]
    pub repeat: usize,

    /// Keep running rounds (at least --repeat) until SECS have
    /// passed: a soak; reports resident memory after the first
    /// round and at the end
    #[arg(verbatim_doc_comment, long, value_name = "SECS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,

    /// Rounds cycle over N sets of keys instead of a fresh set
    /// per round, so a soak's store does not grow without bound
    /// (pair it with dedup set to off in --config to rewrite
    /// every round)
    #[arg(verbatim_doc_comment, long, value_name = "N")]
    pub key_sets: Option<usize>,

    /// Each block as N ranges in N regions, as a layer-first
    /// engine pool keeps it (block b's piece j at b * size/N in
    /// region j), moved by the range calls; 1 is the contiguous pool
    #[arg(verbatim_doc_comment, long, value_name = "N", default_value = "1", value_parser = parse_positive)]
    pub ranges_per_block: usize,

    /// Where a block's ranges lie: apart, one per region, as a
    /// layer-first pool keeps them, or one after the other in a
    /// single region (the same ranges without the scattered memory:
    /// what the ranges themselves cost)
    #[arg(verbatim_doc_comment, long, value_name = "LAYOUT", value_enum, default_value_t = RangeLayout::LayerFirst)]
    pub range_layout: RangeLayout,

    /// Turn off CRC32C checksums (to measure their cost)
    #[arg(long = "no-checksums", action = ArgAction::SetFalse)]
    pub checksums: bool,

    #[command(flatten)]
    pub store: StoreArgs,
}

/// Where the `--ranges-per-block` pieces of a block lie in the bench's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RangeLayout {
    /// Piece j of every block in region j: block b's piece j at b * size/N in it.
    LayerFirst,
    /// A block's pieces one after the other, at b * size in one region.
    Adjacent,
}

impl RangeLayout {
    /// The name `--range-layout` takes.
    pub(super) fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map_or_else(String::new, |value| value.get_name().to_string())
    }
}

/// The phases of one round, in order, each one of [`PHASES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload(pub Vec<String>);

fn parse_block_size(text: &str) -> Result<usize, String> {
    match parse_size(text)? {
        0 => Err("must be positive".into()),
        n => Ok(n),
    }
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| "needs a number of seconds".into())
}

fn parse_workload(text: &str) -> Result<Workload, String> {
    let phases: Vec<String> = text.split(',').map(|s| s.trim().to_string()).collect();
    for phase in &phases {
        if !PHASES.contains(&phase.as_str()) {
            return Err(format!(
                "unknown phase {phase:?} (phases: {})",
                PHASES.join(", ")
            ));
        }
    }
    let first_store = phases.iter().position(|p| p == "store");
    for needs in ["load", "verify"] {
        if let Some(i) = phases.iter().position(|p| p == needs) {
            if first_store.is_none_or(|s| s > i) {
                return Err(format!("phase {needs} needs a store phase before it"));
            }
        }
    }
    Ok(Workload(phases))
}
