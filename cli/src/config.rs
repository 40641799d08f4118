//! `kvtier config`: the configuration's published schema, and checking a configuration
//! without starting a tier.

use clap::{Args, Subcommand};

use crate::common::{Failure, StoreArgs};

#[derive(Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print every configuration key: type, default, allowed values and meaning
    ///
    /// JSON by default (the document kvt_config_schema returns); --markdown prints the
    /// configuration tables of docs/configuration.md.
    #[command(verbatim_doc_comment)]
    Schema(SchemaArgs),

    /// Check a configuration as kvt_tier_new does, without opening its store
    ///
    /// Prints "ok" and exits 0, or names the key at fault and exits 2.
    #[command(verbatim_doc_comment)]
    Check(StoreArgs),
}

#[derive(Args, Debug)]
struct SchemaArgs {
    /// Markdown tables instead of JSON
    #[arg(long)]
    markdown: bool,
}

pub fn run(args: &ConfigArgs) -> Result<(), Failure> {
    match &args.command {
        ConfigCommand::Schema(schema) => {
            if schema.markdown {
                println!("{}", kvtier_core::config::markdown_tables());
            } else {
                println!("{}", kvtier_core::config::schema_json());
            }
            Ok(())
        }
        ConfigCommand::Check(store) => {
            // The library's check, which kvt_config_check answers with: the keys and their
            // limits, and the keyring read as a tier's start reads it.
            let text = store.config_text()?.ok_or_else(|| {
                Failure::usage("a store is needed: pass --config JSON or --config-file PATH")
            })?;
            kvtier_core::check_config(&text).map_err(|e| Failure::usage(e.message))?;
            if store.json() {
                println!("{}", serde_json::json!({"ok": true}));
            } else {
                println!("ok");
            }
            Ok(())
        }
    }
}
