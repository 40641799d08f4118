//! `kvtier ls`: the namespaces under a prefix, with their objects, bytes, and oldest and
//! newest objects; and the totals. `du` prints the same summary as sizes.

use std::collections::BTreeMap;

use clap::Args;
use serde_json::{json, Value};

use crate::common::{runtime, Failure, StoreArgs};
use crate::objects::{self, format_time, Object, Scope};

#[derive(Args, Debug, Clone)]
pub struct LsArgs {
    /// List the namespaces under this prefix; default: the
    /// configuration's prefix ("" for the whole store)
    #[arg(verbatim_doc_comment, long, value_name = "PREFIX")]
    pub prefix: Option<String>,

    #[command(flatten)]
    pub store: StoreArgs,
}

/// Objects, bytes and the LastModified range of a set of objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub objects: u64,
    pub bytes: u64,
    /// Oldest and newest LastModified (microseconds), if there is an object.
    pub oldest_us: Option<i64>,
    pub newest_us: Option<i64>,
}

impl Usage {
    pub fn add(&mut self, object: &Object) {
        self.objects += 1;
        self.bytes += object.bytes;
        let t = object.modified_us;
        self.oldest_us = Some(self.oldest_us.map_or(t, |o| o.min(t)));
        self.newest_us = Some(self.newest_us.map_or(t, |n| n.max(t)));
    }

    pub fn json(&self) -> Value {
        json!({
            "objects": self.objects,
            "bytes": self.bytes,
            "oldest": self.oldest_us.map(format_time),
            "newest": self.newest_us.map(format_time),
        })
    }
}

/// Usage per namespace (sorted by name) and in total.
pub struct Summary {
    pub scope: Scope,
    pub namespaces: BTreeMap<String, Usage>,
    pub total: Usage,
}

impl Summary {
    pub fn of(scope: Scope, objects: &[Object]) -> Summary {
        let mut namespaces: BTreeMap<String, Usage> = BTreeMap::new();
        let mut total = Usage::default();
        for object in objects {
            let ns = scope.namespace_of(&object.name).to_string();
            namespaces.entry(ns).or_default().add(object);
            total.add(object);
        }
        Summary {
            scope,
            namespaces,
            total,
        }
    }

    pub fn json(&self) -> Value {
        let namespaces: Vec<Value> = self
            .namespaces
            .iter()
            .map(|(ns, usage)| {
                let mut v = usage.json();
                v["namespace"] = json!(ns);
                v
            })
            .collect();
        json!({
            "prefix": self.scope.prefix,
            "namespaces": namespaces,
            "total": self.total.json(),
        })
    }
}

/// Lists the objects under the prefix of `args` and summarises them.
pub fn summarise(prefix: Option<&str>, store_args: &StoreArgs) -> Result<Summary, Failure> {
    let config = store_args.tier_config()?;
    let scope = Scope::of_prefix(&config, prefix)?;
    let rt = runtime()?;
    let objects = rt.block_on(async {
        let store = crate::common::open_store(&config)?;
        objects::list(&store, &scope).await
    })?;
    Ok(Summary::of(scope, &objects))
}

/// How a namespace is shown: objects directly under the prefix have none.
pub fn shown(namespace: &str) -> &str {
    if namespace.is_empty() {
        "(no namespace)"
    } else {
        namespace
    }
}

pub fn run(args: &LsArgs) -> Result<(), Failure> {
    let summary = summarise(args.prefix.as_deref(), &args.store)?;
    if args.store.json() {
        println!("{}", summary.json());
        return Ok(());
    }
    let time = |t: Option<i64>| t.map_or_else(|| "-".to_string(), format_time);
    let width = summary
        .namespaces
        .keys()
        .map(|ns| shown(ns).len())
        .max()
        .unwrap_or(0)
        .max("NAMESPACE".len());
    println!(
        "{:<width$}  {:>9}  {:>14}  {:<24}  NEWEST",
        "NAMESPACE", "OBJECTS", "BYTES", "OLDEST"
    );
    let rows = summary.namespaces.iter().map(|(ns, u)| (shown(ns), u));
    for (name, u) in rows.chain(std::iter::once(("TOTAL", &summary.total))) {
        println!(
            "{name:<width$}  {:>9}  {:>14}  {:<24}  {}",
            u.objects,
            u.bytes,
            time(u.oldest_us),
            time(u.newest_us)
        );
    }
    Ok(())
}
