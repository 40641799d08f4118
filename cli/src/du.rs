//! `kvtier du`: the space the namespaces under a prefix take, as `du -s` prints it, and
//! the total.

use clap::Args;

use crate::common::{Failure, StoreArgs};
use crate::ls::{shown, summarise};
use crate::objects::human_bytes;

#[derive(Args, Debug, Clone)]
pub struct DuArgs {
    /// Sum the namespaces under this prefix; default: the
    /// configuration's prefix ("" for the whole store)
    #[arg(verbatim_doc_comment, long, value_name = "PREFIX")]
    pub prefix: Option<String>,

    /// Print exact byte counts instead of KiB/MiB/GiB
    #[arg(short = 'b', long)]
    pub bytes: bool,

    #[command(flatten)]
    pub store: StoreArgs,
}

pub fn run(args: &DuArgs) -> Result<(), Failure> {
    let summary = summarise(args.prefix.as_deref(), &args.store)?;
    if args.store.json() {
        println!("{}", summary.json());
        return Ok(());
    }
    let size = |bytes: u64| {
        if args.bytes {
            bytes.to_string()
        } else {
            human_bytes(bytes)
        }
    };
    for (ns, usage) in &summary.namespaces {
        println!(
            "{:>12}  {:>9} objects  {}",
            size(usage.bytes),
            usage.objects,
            shown(ns)
        );
    }
    println!(
        "{:>12}  {:>9} objects  total under {}",
        size(summary.total.bytes),
        summary.total.objects,
        summary.scope.describe()
    );
    Ok(())
}
