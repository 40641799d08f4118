//! `kvtier gc`: deletes a tier's objects by age and/or down to a byte budget, oldest
//! first.
//!
//! Safe while engines serve: a load of a key deleted under it fails alone (not found) and
//! its lookups turn MISS; a load never returns another object's bytes, because gc only
//! ever deletes whole objects and the library checks every object it reads.

use clap::{ArgGroup, Args};
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
    /// a number and s, m, h, d or w (e.g. 7d, 12h, 30m)
    #[arg(verbatim_doc_comment, long, value_name = "AGE", value_parser = parse_age, conflicts_with = "before")]
    pub older_than: Option<i64>,

    /// Delete objects last modified before TIME: RFC 3339
    /// (2025-05-01T12:00:00Z) or @<seconds since the epoch>
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

/// Why an object goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Age,
    Budget,
}

impl Reason {
    fn name(self) -> &'static str {
        match self {
            Reason::Age => "age",
            Reason::Budget => "budget",
        }
    }
}

/// The objects to delete, oldest first, each with its reason: those modified before
/// `cutoff_us`, then the oldest of the rest until at most `max_bytes` remain. Ties in
/// LastModified are broken by name, so a plan is the same for the same listing.
pub fn plan(
    mut objects: Vec<Object>,
    cutoff_us: Option<i64>,
    max_bytes: Option<u64>,
) -> Vec<(Object, Reason)> {
    objects.sort_by(|a, b| {
        a.modified_us
            .cmp(&b.modified_us)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut remaining: u64 = objects.iter().map(|o| o.bytes).sum();
    let mut chosen = Vec::new();
    for object in objects {
        let reason = if cutoff_us.is_some_and(|cutoff| object.modified_us < cutoff) {
            Reason::Age
        } else if max_bytes.is_some_and(|max| remaining > max) {
            Reason::Budget
        } else {
            // Sorted oldest first: every later object is newer still, and the budget is met.
            break;
        };
        remaining -= object.bytes;
        chosen.push((object, reason));
    }
    chosen
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
        let listed = objects::list(&store, &scope).await?;
        let listed_objects = listed.len() as u64;
        let listed_bytes: u64 = listed.iter().map(|o| o.bytes).sum();
        let chosen = plan(listed, cutoff_us, args.max_bytes);
        let chosen_bytes: u64 = chosen.iter().map(|(o, _)| o.bytes).sum();
        let deleted = if args.dry_run {
            None
        } else {
            let names: Vec<String> = chosen.iter().map(|(o, _)| o.name.clone()).collect();
            Some(objects::delete(&store, &names, "gc").await)
        };
        let is_gone = |name: &str| deleted.as_ref().is_some_and(|d| d.gone.contains(name));
        let gone: Vec<&Object> = chosen
            .iter()
            .map(|(o, _)| o)
            .filter(|o| is_gone(&o.name))
            .collect();
        let gone_bytes: u64 = gone.iter().map(|o| o.bytes).sum();
        let failed = deleted.as_ref().map_or(&[][..], |d| &d.failed[..]);

        if args.store.json() {
            let objects: Vec<Value> = chosen
                .iter()
                .map(|(o, reason)| {
                    let mut v = json!({
                        "name": o.name,
                        "bytes": o.bytes,
                        "last_modified": format_time(o.modified_us),
                        "reason": reason.name(),
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
                })
            );
        } else if args.dry_run {
            for (o, reason) in &chosen {
                println!(
                    "would delete  {}  {:>12}  {:<6}  {}",
                    format_time(o.modified_us),
                    o.bytes,
                    reason.name(),
                    o.name
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
                chosen.len()
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

    fn names(plan: &[(Object, Reason)]) -> Vec<(&str, Reason)> {
        plan.iter().map(|(o, r)| (o.name.as_str(), *r)).collect()
    }

    #[test]
    fn plans_by_age_then_budget_oldest_first() {
        let listing = vec![
            object("c", 10, 30),
            object("a", 10, 10),
            object("b2", 10, 20),
            object("b1", 10, 20),
            object("d", 10, 40),
        ];
        assert_eq!(
            names(&plan(listing.clone(), Some(20), None)),
            [("a", Reason::Age)]
        );
        assert_eq!(
            names(&plan(listing.clone(), None, Some(25))),
            [
                ("a", Reason::Budget),
                ("b1", Reason::Budget),
                ("b2", Reason::Budget)
            ]
        );
        assert_eq!(
            names(&plan(listing.clone(), Some(21), Some(20))),
            [
                ("a", Reason::Age),
                ("b1", Reason::Age),
                ("b2", Reason::Age),
                ("c", Reason::Budget)
            ]
        );
        assert!(plan(listing.clone(), Some(0), Some(50)).is_empty());
        assert_eq!(plan(listing, None, Some(0)).len(), 5);
    }
}
