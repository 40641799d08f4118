//! What the operator subcommands share about the objects of a tier: where to look (a
//! prefix, or a prefix and a namespace), which objects are the tier's (not the start-up
//! probe's, not the local store's temporary files), listing them, deleting them in
//! batches, and printing sizes and times.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use futures::StreamExt;
use kvtier_core::key::KeyLayout;
use kvtier_core::store::{ObjectKind, Store};
use kvtier_core::TierConfig;

use crate::common::{Failure, Progress};

/// `--prefix` and `--namespace`: which objects a subcommand works on.
#[derive(Args, Debug, Clone, Default)]
pub struct ScopeArgs {
    /// Work on this namespace (the path segment after the prefix);
    /// default: the configuration's namespace, unless --prefix is given
    #[arg(verbatim_doc_comment, long, value_name = "NAME")]
    pub namespace: Option<String>,

    /// Work on everything under this prefix (all its namespaces,
    /// or --namespace under it); default: the configuration's prefix
    #[arg(verbatim_doc_comment, long, value_name = "PREFIX")]
    pub prefix: Option<String>,
}

/// A normalised place in the store: `prefix` (segments joined by `/`, no leading or
/// trailing slash; may be empty: the whole bucket or directory) and an optional namespace
/// under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub prefix: String,
    pub namespace: Option<String>,
}

impl Scope {
    /// `prefix` as given (or the configuration's), without a namespace: for `ls` and `du`.
    pub fn of_prefix(config: &TierConfig, prefix: Option<&str>) -> Result<Scope, Failure> {
        let prefix = normalise("prefix", prefix.unwrap_or(&config.prefix))?;
        Ok(Scope {
            prefix,
            namespace: None,
        })
    }

    /// `--namespace` under `--prefix` (or the configuration's prefix); `--prefix` alone is
    /// everything under it; neither is the configuration's prefix and namespace.
    pub fn of_args(config: &TierConfig, args: &ScopeArgs) -> Result<Scope, Failure> {
        let prefix = normalise("prefix", args.prefix.as_deref().unwrap_or(&config.prefix))?;
        let namespace = match (&args.namespace, &args.prefix) {
            (Some(ns), _) => Some(ns.as_str()),
            (None, Some(_)) => None,
            (None, None) => Some(config.namespace.as_str()),
        };
        let namespace = match namespace.map(|ns| normalise("namespace", ns)).transpose()? {
            Some(ns) if ns.is_empty() => None,
            other => other,
        };
        if namespace.as_deref().is_some_and(|ns| ns.contains('/')) {
            return Err(Failure::usage(
                "a namespace is one path segment; use --prefix for deeper places",
            ));
        }
        Ok(Scope { prefix, namespace })
    }

    /// The path listed: `prefix/namespace`, `prefix`, or empty for the whole store.
    pub fn path(&self) -> String {
        match &self.namespace {
            Some(ns) if self.prefix.is_empty() => ns.clone(),
            Some(ns) => format!("{}/{ns}", self.prefix),
            None => self.prefix.clone(),
        }
    }

    /// The scope in words, for messages.
    pub fn describe(&self) -> String {
        match self.path() {
            p if p.is_empty() => "the whole store (no prefix)".to_string(),
            p => format!("{p}/"),
        }
    }

    /// The namespace of an object name under this scope's prefix: the first segment
    /// after the prefix ("" for an object directly under the prefix).
    pub fn namespace_of<'a>(&self, name: &'a str) -> &'a str {
        let rest = strip_prefix(name, &self.prefix);
        match rest.split_once('/') {
            Some((ns, _)) => ns,
            None => "",
        }
    }
}

/// Joins the non-empty segments of `value`, rejecting what no object name may hold.
fn normalise(what: &str, value: &str) -> Result<String, Failure> {
    let layout = match what {
        "namespace" => KeyLayout::new("", value),
        _ => KeyLayout::new(value, ""),
    };
    layout
        .map(|l| l.base().to_string())
        .map_err(|e| Failure::usage(format!("--{what}: {}", e.message)))
}

fn strip_prefix<'a>(name: &'a str, prefix: &str) -> &'a str {
    if prefix.is_empty() {
        return name;
    }
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(name)
}

/// One object of the tier, as a listing shows it.
#[derive(Debug, Clone)]
pub struct Object {
    pub name: String,
    pub bytes: u64,
    /// LastModified, in microseconds since the Unix epoch.
    pub modified_us: i64,
}

/// Lists the tier's objects under `scope`, in the store's order, skipping the probe's
/// objects and temporary files.
pub async fn list(store: &Store, scope: &Scope) -> Result<Vec<Object>, Failure> {
    Ok(list_with_temps(store, scope).await?.0)
}

/// Lists under `scope` the tier's objects and, apart, the local store's temporary files
/// (both in the store's order); the probe's objects are skipped.
pub async fn list_with_temps(
    store: &Store,
    scope: &Scope,
) -> Result<(Vec<Object>, Vec<Object>), Failure> {
    let mut listing = store.list(&scope.path());
    let (mut objects, mut temps) = (Vec::new(), Vec::new());
    let mut progress = Progress::new("list");
    while let Some(info) = listing.next().await {
        let info = info.map_err(|e| {
            Failure::run(format!(
                "listing {} of {}: {}",
                scope.describe(),
                store.describe(),
                e.message
            ))
        })?;
        let object = Object {
            bytes: info.bytes,
            modified_us: micros_of(info.modified),
            name: info.name,
        };
        match info.kind {
            ObjectKind::Temporary => temps.push(object),
            ObjectKind::Block => objects.push(object),
            _ => {}
        }
        progress.tick(|| format!("listed {} objects", objects.len()));
    }
    progress.finish();
    Ok((objects, temps))
}

/// What a batched delete did.
#[derive(Debug, Default)]
pub struct Deleted {
    /// Names now gone (deleted by this run, or already gone).
    pub gone: HashSet<String>,
    /// Names that could not be deleted, with why.
    pub failed: Vec<(String, String)>,
}

/// Objects asked of the store at a time, between two progress lines.
const BATCH: usize = 1000;

/// Deletes `names` through the store (in batches where it takes them), with a counter on
/// stderr for long runs. "Not found" counts as gone.
pub async fn delete(store: &Store, names: &[String], label: &'static str) -> Deleted {
    let mut deleted = Deleted::default();
    let mut progress = Progress::new(label);
    for chunk in names.chunks(BATCH) {
        for (name, outcome) in store.delete_objects(chunk).await {
            match outcome {
                Ok(()) => {
                    deleted.gone.insert(name);
                }
                Err(e) => deleted.failed.push((name, e.message)),
            }
        }
        progress.tick(|| progress_line(&deleted, names.len()));
    }
    progress.finish();
    deleted
}

fn progress_line(deleted: &Deleted, total: usize) -> String {
    format!(
        "deleted {} of {total} objects ({} failed)",
        deleted.gone.len(),
        deleted.failed.len()
    )
}

// ------------------------------------------------------------------------------------
// Sizes and times

/// Bytes in binary units, for people: `512 B`, `1.5 KiB`, `10.0 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A byte count with an optional K, M, G or T suffix (binary), e.g. `10G`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let (digits, shift) = match text.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&text[..text.len() - 1], 10),
        Some('M') => (&text[..text.len() - 1], 20),
        Some('G') => (&text[..text.len() - 1], 30),
        Some('T') => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let n = digits
        .parse::<u64>()
        .map_err(|_| format!("not a size: {text:?} (e.g. 10G, 512M, 4096)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("too large a size: {text}"))
}

/// An age, as humantime reads it (`7d`, `12h`, `30m`, `1h 30m`, `0s`), in microseconds.
pub fn parse_age(text: &str) -> Result<i64, String> {
    let age = humantime::parse_duration(text)
        .map_err(|e| format!("not an age: {text:?} ({e}; e.g. 7d, 12h, 30m)"))?;
    i64::try_from(age.as_micros()).map_err(|_| format!("too long an age: {text}"))
}

fn micros_of(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_micros() as i64,
        Err(before) => -(before.duration().as_micros() as i64),
    }
}

/// A point in time: RFC 3339 in UTC (`2025-05-01T12:00:00Z`, `2025-05-01 12:00:00.5`) or
/// `@` and seconds since the Unix epoch (`@1746100800.25`), in microseconds.
pub fn parse_time(text: &str) -> Result<i64, String> {
    let bad = || {
        format!(
            "not a time: {text:?} (RFC 3339 in UTC, e.g. 2025-05-01T12:00:00Z, or @<unix seconds>)"
        )
    };
    if let Some(epoch) = text.strip_prefix('@') {
        let seconds: f64 = epoch.parse().map_err(|_| bad())?;
        if !seconds.is_finite() {
            return Err(bad());
        }
        return Ok((seconds * 1e6).round() as i64);
    }
    humantime::parse_rfc3339_weak(text)
        .map(micros_of)
        .map_err(|_| bad())
}

/// A time as RFC 3339 in UTC with milliseconds: `2025-05-01T12:00:00.250Z`.
pub fn format_time(micros: i64) -> String {
    let offset = Duration::from_micros(micros.unsigned_abs());
    let time = if micros >= 0 {
        UNIX_EPOCH + offset
    } else {
        UNIX_EPOCH - offset
    };
    humantime::format_rfc3339_millis(time).to_string()
}

/// Now, in microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    micros_of(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(prefix: &str, namespace: &str) -> TierConfig {
        let json = serde_json::json!({"store": {"type": "memory"}, "prefix": prefix, "namespace": namespace});
        TierConfig::from_json(&json.to_string()).unwrap()
    }

    #[test]
    fn scopes() {
        let c = config("/kv/", "m_0123456789ab_r0");
        let scope = |ns: Option<&str>, prefix: Option<&str>| {
            let args = ScopeArgs {
                namespace: ns.map(Into::into),
                prefix: prefix.map(Into::into),
            };
            Scope::of_args(&c, &args).unwrap().path()
        };
        assert_eq!(scope(None, None), "kv/m_0123456789ab_r0");
        assert_eq!(scope(Some("other"), None), "kv/other");
        assert_eq!(scope(None, Some("a/b")), "a/b");
        assert_eq!(scope(Some("n"), Some("")), "n");
        assert_eq!(scope(None, Some("")), "");
        assert!(Scope::of_args(
            &c,
            &ScopeArgs {
                namespace: Some("a/b".into()),
                prefix: None
            }
        )
        .is_err());
        assert!(Scope::of_args(
            &c,
            &ScopeArgs {
                namespace: Some("x%y".into()),
                prefix: None
            }
        )
        .is_err());
        let s = Scope::of_prefix(&c, None).unwrap();
        assert_eq!(s.namespace_of("kv/ns1/abc/de_g0/abcdef.bin"), "ns1");
        assert_eq!(s.namespace_of("kv/loose.bin"), "");
        let root = Scope::of_prefix(&config("", ""), None).unwrap();
        assert_eq!(root.namespace_of("ns/abc/de_g0/abcdef.bin"), "ns");
    }

    #[test]
    fn sizes_ages_and_times() {
        assert_eq!(parse_bytes("10G"), Ok(10 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2t"), Ok(2 << 40));
        assert!(parse_bytes("1.5G").is_err());
        assert_eq!(parse_age("7d"), Ok(7 * 86_400 * 1_000_000));
        assert_eq!(parse_age("30m"), Ok(1_800_000_000));
        assert_eq!(parse_age("0s"), Ok(0));
        assert_eq!(parse_age("1h 30m"), Ok(5_400_000_000));
        assert!(parse_age("7").is_err() && parse_age("d").is_err() && parse_age("-1h").is_err());
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(10 << 30), "10.0 GiB");
        let t = parse_time("2025-05-01T12:00:00Z").unwrap();
        assert_eq!(t, 1_746_100_800_000_000);
        assert_eq!(parse_time("2025-05-01 12:00:00.25"), Ok(t + 250_000));
        assert_eq!(parse_time("@1746100800.25"), Ok(t + 250_000));
        assert_eq!(format_time(t + 250_000), "2025-05-01T12:00:00.250Z");
        assert_eq!(parse_time(&format_time(t + 250_000)), Ok(t + 250_000));
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        for bad in ["2025-05-01", "2025-13-01T00:00:00Z", "@x", "yesterday"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }
}
