//! `kvtier namespace`: vLLM's namespace string for a field set, as `kvt_vllm_namespace`
//! computes it, so that objects can be found (or named) without the engine running.

use std::path::PathBuf;

use clap::Args;

use crate::common::{Failure, OutputArgs};

#[derive(Args, Debug, Clone)]
pub struct NamespaceArgs {
    #[command(flatten)]
    pub fields: FieldsSource,

    /// Worker rank (pass 0 for parallel-agnostic layouts)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub rank: u32,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// The field set, given inline or in a file: exactly one of the two.
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct FieldsSource {
    /// The field set as a JSON object: model_name,
    /// tokens_per_hash, blocks_per_file, tp_size, pp_size,
    /// pcp_size, dcp_size, dtype, kv_cache_groups,
    /// inference_engine, and parallel_agnostic /
    /// replicated_layout where vLLM includes them
    #[arg(verbatim_doc_comment, long, value_name = "JSON")]
    pub fields: Option<String>,

    /// The field set read from a file
    #[arg(long, value_name = "PATH")]
    pub fields_file: Option<PathBuf>,
}

pub fn run(args: &NamespaceArgs) -> Result<(), Failure> {
    let (text, source) = match (&args.fields.fields, &args.fields.fields_file) {
        (Some(text), _) => (text.clone(), "--fields".to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
            (text, path.display().to_string())
        }
        // clap's group makes one of the two required.
        (None, None) => return Err(Failure::usage("--fields or --fields-file is needed")),
    };
    let fields: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Failure::run(format!("{source} is not JSON: {e}")))?;
    let namespace = kvtier_core::namespace::vllm_namespace(&fields, args.rank)
        .map_err(|e| Failure::run(e.to_string()))?;
    if args.output.json {
        println!("{}", serde_json::json!({ "namespace": namespace }));
    } else {
        println!("{namespace}");
    }
    Ok(())
}
