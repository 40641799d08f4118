//! `kvtier gc`: deletes a tier's objects by age and/or down to a byte budget, oldest
//! first.
//!
//! Safe while engines serve: a load of a key deleted under it fails alone (not found) and
//! its lookups turn MISS; a load never returns another object's bytes, because gc only
//! ever deletes whole objects and the library checks every object it reads.
//!
//! On a local store gc also deletes the temporary files of writes that never finished (a
//! crash between a block's write and its rename), once they are an hour old: no write of
//! a block takes that long, so a younger one may belong to a running engine.

use std::collections::HashMap;

use kvtier_core::config::StoreConfig;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{ArgGroup, Args};
use kvtier_core::{choose_evictions, EvictionCandidate, EvictionReason};
use serde_json::{json, Value};

use crate::common::{runtime, Failure, StoreArgs};
use crate::objects::{
    self, format_time, human_bytes, now_us, parse_age, parse_bytes, parse_time, Object, Scope,
    ScopeArgs,
};

#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("limit").required(true).multiple(true).args(["older_than", "before", "max_bytes"])))]
pub struct GcArgs {
    /// Delete objects last modified more than AGE ago:
    /// e.g. 7d, 12h, 30m, 1h 30m (0s: everything)
    #[arg(verbatim_doc_comment, long, value_name = "AGE", value_parser = parse_age, conflicts_with = "before")]
    pub older_than: Option<i64>,

    /// Delete objects last modified before TIME: RFC 3339
    /// in UTC (2025-05-01T12:00:00Z) or @<seconds since the epoch>
    #[arg(verbatim_doc_comment, long, value_name = "TIME", value_parser = parse_time)]
    pub before: Option<i64>,

    /// Then delete the oldest objects until the scope holds at
    /// most SIZE bytes (K, M, G, T suffixes: binary, e.g. 10G)
    #[arg(verbatim_doc_comment, long, value_name = "SIZE", value_parser = parse_bytes)]
    pub max_bytes: Option<u64>,

    /// Print what would be deleted, and delete nothing
    #[arg(long)]
    pub dry_run: bool,

    #[command(flatten)]
    pub scope: ScopeArgs,

    #[command(flatten)]
    pub store: StoreArgs,
}

/// A local store's temporary file older than this was left by a write that never finished.
const LEFTOVER_AGE_US: i64 = 3600 * 1_000_000;

fn reason_name(reason: EvictionReason) -> &'static str {
    match reason {
        EvictionReason::Age => "age",
        EvictionReason::Budget => "budget",
    }
}

fn system_time(micros: i64) -> SystemTime {
    let offset = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + offset
    } else {
        UNIX_EPOCH - offset
    }
}

/// The objects to delete, oldest first, each with its reason, as the library's eviction
/// chooses them: those modified before `cutoff_us`, then the oldest of the rest until at
/// most `max_bytes` remain.
pub fn plan(
    objects: Vec<Object>,
    cutoff_us: Option<i64>,
    max_bytes: Option<u64>,
) -> Vec<(Object, EvictionReason)> {
    let mut candidates: Vec<EvictionCandidate> = objects
        .iter()
        .map(|o| EvictionCandidate {
            name: o.name.clone(),
            bytes: o.bytes,
            modified: system_time(o.modified_us),
        })
        .collect();
    let reasons = choose_evictions(&mut candidates, cutoff_us.map(system_time), max_bytes);
    let mut by_name: HashMap<String, Object> =
        objects.into_iter().map(|o| (o.name.clone(), o)).collect();
    candidates
        .into_iter()
        .zip(reasons)
        .filter_map(|(c, reason)| by_name.remove(&c.name).map(|o| (o, reason)))
        .collect()
}

pub fn run(args: &GcArgs) -> Result<(), Failure> {
    let config = args.store.tier_config()?;
    let scope = Scope::of_args(&config, &args.scope)?;
    if scope.path().is_empty() && args.scope.prefix.is_none() {
        return Err(Failure::usage(
            "the configuration has no prefix or namespace, so gc would work on the whole store: \
             pass --namespace NAME, or --prefix '' to mean the whole store",
        ));
    }
    let cutoff_us = match (args.older_than, args.before) {
        (Some(age), _) => Some(now_us() - age),
        (None, before) => before,
    };
    let rt = runtime()?;
    rt.block_on(async {
        let store = crate::common::open_store(&config)?;
        let (listed, temps) = objects::list_with_temps(&store, &scope).await?;
        let listed_objects = listed.len() as u64;
        let listed_bytes: u64 = listed.iter().map(|o| o.bytes).sum();
        let chosen = plan(listed, cutoff_us, args.max_bytes);
        let chosen_bytes: u64 = chosen.iter().map(|(o, _)| o.bytes).sum();
        let leftovers: Vec<Object> = if matches!(config.store, StoreConfig::Local(_)) {
            let before = now_us() - LEFTOVER_AGE_US;
            temps
                .into_iter()
                .filter(|t| t.modified_us < before)
                .collect()
        } else {
            Vec::new() // only the local store writes temporary files
        };
        let deleted = if args.dry_run {
            None
        } else {
            let names: Vec<String> = chosen
                .iter()
                .map(|(o, _)| o)
                .chain(&leftovers)
                .map(|o| o.name.clone())
                .collect();
            Some(objects::delete(&store, &names, "gc").await)
        };
        let is_gone = |name: &str| deleted.as_ref().is_some_and(|d| d.gone.contains(name));
        let gone: Vec<&Object> = chosen
            .iter()
            .map(|(o, _)| o)
            .filter(|o| is_gone(&o.name))
            .collect();
        let gone_bytes: u64 = gone.iter().map(|o| o.bytes).sum();
        let leftovers_gone = leftovers.iter().filter(|o| is_gone(&o.name)).count();
        let failed = deleted.as_ref().map_or(&[][..], |d| &d.failed[..]);

        if args.store.json() {
            let objects: Vec<Value> = chosen
                .iter()
                .map(|(o, reason)| {
                    let mut v = json!({
                        "name": o.name,
                        "bytes": o.bytes,
                        "last_modified": format_time(o.modified_us),
                        "reason": reason_name(*reason),
                    });
                    if deleted.is_some() {
                        v["deleted"] = json!(is_gone(&o.name));
                    }
                    v
                })
                .collect();
            let failed: Vec<Value> = failed
                .iter()
                .map(|(name, why)| json!({"name": name, "error": why}))
                .collect();
            println!(
                "{}",
                json!({
                    "scope": scope.path(),
                    "dry_run": args.dry_run,
                    "cutoff": cutoff_us.map(format_time),
                    "max_bytes": args.max_bytes,
                    "listed_objects": listed_objects,
                    "listed_bytes": listed_bytes,
                    "selected_objects": chosen.len(),
                    "selected_bytes": chosen_bytes,
                    "deleted_objects": gone.len(),
                    "deleted_bytes": gone_bytes,
                    "remaining_objects": listed_objects - gone.len() as u64,
                    "remaining_bytes": listed_bytes - gone_bytes,
                    "failed": failed,
                    "objects": objects,
                    "leftover_temporary_files": leftovers
                        .iter()
                        .map(|o| {
                            let mut v = json!({
                                "name": o.name,
                                "bytes": o.bytes,
                                "last_modified": format_time(o.modified_us),
                            });
                            if deleted.is_some() {
                                v["deleted"] = json!(is_gone(&o.name));
                            }
                            v
                        })
                        .collect::<Vec<Value>>(),
                    "deleted_leftover_temporary_files": leftovers_gone,
                })
            );
        } else if args.dry_run {
            for (o, reason) in &chosen {
                println!(
                    "would delete  {}  {:>12}  {:<6}  {}",
                    format_time(o.modified_us),
                    o.bytes,
                    reason_name(*reason),
                    o.name
                );
            }
            for o in &leftovers {
                println!(
                    "would delete  {}  {:>12}  {:<6}  {}",
                    format_time(o.modified_us),
                    o.bytes,
                    "left",
                    o.name
                );
            }
            if !leftovers.is_empty() {
                println!(
                    "would delete {} temporary files of writes that never finished",
                    leftovers.len()
                );
            }
            println!(
                "would delete {} objects ({}) of {} ({}) under {}; {} objects ({}) would remain",
                chosen.len(),
                human_bytes(chosen_bytes),
                listed_objects,
                human_bytes(listed_bytes),
                scope.describe(),
                listed_objects - chosen.len() as u64,
                human_bytes(listed_bytes - chosen_bytes)
            );
        } else {
            for (name, why) in failed {
                eprintln!("kvtier gc: cannot delete {name}: {why}");
            }
            if !leftovers.is_empty() {
                println!(
                    "deleted {leftovers_gone} of {} temporary files of writes that never finished",
                    leftovers.len()
                );
            }
            println!(
                "deleted {} objects ({}) of {} ({}) under {}; {} objects ({}) remain",
                gone.len(),
                human_bytes(gone_bytes),
                listed_objects,
                human_bytes(listed_bytes),
                scope.describe(),
                listed_objects - gone.len() as u64,
                human_bytes(listed_bytes - gone_bytes)
            );
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Failure::run(format!(
                "{} of {} objects could not be deleted",
                failed.len(),
                chosen.len() + leftovers.len()
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, bytes: u64, modified_us: i64) -> Object {
        Object {
            name: name.into(),
            bytes,
            modified_us,
        }
    }

    #[test]
    fn plans_by_age_then_budget_oldest_first() {
        let listing = vec![
            object("c", 10, 30),
            object("a", 10, 10),
            object("b", 10, 20),
        ];
        let chosen: Vec<(String, EvictionReason)> = plan(listing, Some(15), Some(15))
            .into_iter()
            .map(|(o, r)| (o.name, r))
            .collect();
        assert_eq!(
            chosen,
            [
                ("a".to_string(), EvictionReason::Age),
                ("b".to_string(), EvictionReason::Budget)
            ]
        );
        assert_eq!(
            system_time(-1_500_000),
            UNIX_EPOCH - Duration::from_millis(1500)
        );
    }
}
