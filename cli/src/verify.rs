//! `kvtier verify`: reads a tier's objects (all, or an even sample) and checks each one's
//! length and recorded checksum, as a load would; reports the corrupt ones and, with
//! `--delete-corrupt`, deletes them. With an `encryption` configuration, each object read
//! is also opened with the keyring: one that does not open (tampered with, copied under
//! another name, or sealed with a key not in the ring) is reported apart, as
//! undecryptable, and never deleted (the keyring may merely lack its key). Without an
//! `encryption` configuration, an encrypted object (told by its header) is not judged at
//! all: its bytes and length are not the block's. Verify names such objects, fails, and
//! deletes nothing in that run.
//!
//! The length a namespace's objects must have is `--block-bytes` (the blocks' length: an
//! encrypted object's is compared by the block it holds), or else the size most of them
//! share (one engine configuration writes one block size per namespace). Lengths are
//! checked for every listed object (the listing has them; a listed length that the
//! encryption's overhead explains is never called wrong); checksums for the objects read.

use std::collections::{BTreeMap, HashMap};

use clap::Args;
use futures::StreamExt;
use kvtier_core::store::{object_path, Store};
use kvtier_core::{
    encrypted_block_len, encrypted_object_len, is_encrypted_object, ObjectOpener, Status,
};
use serde_json::{json, Value};

use crate::common::{parse_positive, runtime, Failure, StoreArgs};
use crate::objects::{self, human_bytes, parse_bytes, Object, Scope, ScopeArgs};

#[derive(Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Read N objects, chosen evenly over the scope by name,
    /// instead of all of them (lengths are still checked for all)
    #[arg(verbatim_doc_comment, long, value_name = "N", value_parser = parse_positive)]
    pub sample: Option<usize>,

    /// The length every block must have (K, M, G suffixes; an encrypted
    /// object holds a block of this length); default: the size most
    /// objects of the namespace share
    #[arg(verbatim_doc_comment, long, value_name = "SIZE", value_parser = parse_bytes)]
    pub block_bytes: Option<u64>,

    /// Delete the corrupt objects found (wrong length or checksum);
    /// nothing is deleted where encrypted objects are met without the keyring
    #[arg(long, visible_alias = "delete")]
    pub delete_corrupt: bool,

    /// Objects read at once
    #[arg(long, value_name = "N", default_value = "16", value_parser = parse_positive)]
    pub concurrency: usize,

    #[command(flatten)]
    pub scope: ScopeArgs,

    #[command(flatten)]
    pub store: StoreArgs,
}

/// What one object's read found.
enum Read {
    /// Bytes read and the checksum recorded with the object, if any, and computed.
    Done {
        bytes: u64,
        recorded: Option<u32>,
        computed: u32,
        /// Whether the object is an encrypted one (its header says so).
        encrypted: bool,
        /// With a keyring: whether the object opened, or why not.
        opened: Option<Result<(), String>>,
    },
    /// Deleted since the listing (by gc or an engine): nothing to check.
    Gone,
    Failed(String),
}

/// A corrupt object and why.
struct Corrupt {
    name: String,
    reason: &'static str,
    detail: String,
}

/// The length a namespace's blocks have: `Ok(size)`, or `Err(sizes and counts)` when no
/// size is shared by more objects than any other.
fn common_size(objects: &[&Object]) -> Result<u64, BTreeMap<u64, usize>> {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for o in objects {
        *counts.entry(o.bytes).or_default() += 1;
    }
    let most = counts.values().copied().max().unwrap_or(0);
    let mut leaders = counts.iter().filter(|(_, n)| **n == most);
    match (leaders.next(), leaders.next()) {
        (Some((size, _)), None) => Ok(*size),
        _ => Err(counts),
    }
}

/// `n` indices spread evenly over `0..len`.
fn even_sample(len: usize, n: usize) -> Vec<usize> {
    if n >= len {
        return (0..len).collect();
    }
    (0..n).map(|i| i * len / n).collect()
}

/// Objects up to this size are read whole into memory, where the keyring opens them;
/// without a keyring, larger ones (no block is that large) are streamed through the
/// checksum, and only their first bytes read apart, to tell an encrypted object.
const READ_WHOLE_AT_MOST: u64 = 256 << 20;
/// The first bytes read of an object streamed: more than an encrypted object's header.
const FIRST_BYTES: u64 = 4096;

/// Reads one object through the library, which checksums it as a load does, tells whether
/// it is encrypted, and opens it with the keyring when there is one.
async fn read(store: &Store, name: &str, listed_bytes: u64, opener: Option<&ObjectOpener>) -> Read {
    let path = object_path(name);
    let read = if opener.is_some() || listed_bytes <= READ_WHOLE_AT_MOST {
        store
            .read_checked_object(&path)
            .await
            .map(|(mut bytes, check)| {
                let encrypted = is_encrypted_object(&bytes);
                let opened = opener.map(|opener| opener.open(name, &mut bytes).map(|_| ()));
                (check, encrypted, opened)
            })
    } else {
        match store.check_object(&path).await {
            Ok(check) => first_bytes(store, &path)
                .await
                .map(|start| (check, is_encrypted_object(&start), None)),
            Err(e) => Err(e),
        }
    };
    match read {
        Ok((check, encrypted, opened)) => Read::Done {
            bytes: check.bytes,
            recorded: check.recorded,
            computed: check.computed,
            encrypted,
            opened,
        },
        Err(e) if e.status == Status::NotFound => Read::Gone,
        Err(e) => Read::Failed(e.message),
    }
}

/// The first [`FIRST_BYTES`] of the object at `path` (fewer if it is shorter).
async fn first_bytes(
    store: &Store,
    path: &object_store::path::Path,
) -> kvtier_core::Result<bytes::Bytes> {
    use object_store::ObjectStoreExt;
    store
        .client()
        .get_range(path, 0..FIRST_BYTES)
        .await
        .map_err(|e| match e {
            object_store::Error::NotFound { .. } => {
                kvtier_core::Error::new(Status::NotFound, format!("{path}: gone"))
            }
            e => kvtier_core::Error::new(Status::Io, format!("read the start of {path}: {e}")),
        })
}

pub fn run(args: &VerifyArgs) -> Result<(), Failure> {
    let config = args.store.tier_config()?;
    let scope = Scope::of_args(&config, &args.scope)?;
    let rt = runtime()?;
    rt.block_on(async {
        let store = crate::common::open_store(&config)?;
        let opener = match &config.encryption {
            Some(encryption) => Some(ObjectOpener::new(encryption).map_err(|e| Failure::run(e.message))?),
            None => None,
        };
        let mut listed = objects::list(&store, &scope).await?;
        listed.sort_by(|a, b| a.name.cmp(&b.name));

        // The length each namespace's objects must have.
        let mut by_namespace: BTreeMap<&str, Vec<&Object>> = BTreeMap::new();
        for o in &listed {
            by_namespace.entry(scope.namespace_of(&o.name)).or_default().push(o);
        }
        let mut expected: HashMap<&str, u64> = HashMap::new();
        let mut namespaces_json = Vec::new();
        let mut ambiguous = Vec::new();
        for (ns, members) in &by_namespace {
            let size = match args.block_bytes {
                Some(size) => Ok(size),
                None => common_size(members),
            };
            let mut v = json!({"namespace": ns, "objects": members.len()});
            match size {
                Ok(size) => {
                    expected.insert(ns, size);
                    v["block_bytes"] = json!(size);
                }
                Err(counts) => {
                    let sizes: Vec<String> = counts.iter().map(|(s, n)| format!("{n} of {s} bytes")).collect();
                    ambiguous.push(format!(
                        "namespace {}: no size is shared by most objects ({}); pass --block-bytes",
                        crate::ls::shown(ns),
                        sizes.join(", ")
                    ));
                    v["block_bytes"] = Value::Null;
                    v["sizes"] = json!(counts.iter().map(|(s, n)| (s.to_string(), *n)).collect::<BTreeMap<_, _>>());
                }
            }
            namespaces_json.push(v);
        }
        let expected_of = |name: &str| expected.get(scope.namespace_of(name)).copied();
        // What is wrong with an object's length, if anything: `--block-bytes` is the
        // blocks' length, so an encrypted object is judged by the block it holds.
        let wrong_length = |name: &str, bytes: u64, encrypted: bool| -> Option<String> {
            let want = expected_of(name)?;
            if args.block_bytes.is_some() && encrypted {
                return match encrypted_block_len(bytes) {
                    Some(len) if len == want => None,
                    Some(len) => Some(format!("holds an encrypted block of {len} bytes; the namespace's blocks are {want} bytes")),
                    None => Some(format!("holds {bytes} bytes, which no encrypted block has")),
                };
            }
            (bytes != want).then(|| format!("holds {bytes} bytes; the namespace's blocks are {want} bytes"))
        };

        // Reads.
        let chosen: Vec<&Object> = match args.sample {
            Some(n) => even_sample(listed.len(), n).into_iter().map(|i| &listed[i]).collect(),
            None => listed.iter().collect(),
        };
        let mut progress = crate::common::Progress::new("verify");
        let reads = futures::stream::iter(chosen.iter().map(|o| {
            let (store, opener) = (&store, opener.as_ref());
            async move { (*o, read(store, &o.name, o.bytes, opener).await) }
        }))
        .buffer_unordered(args.concurrency);
        futures::pin_mut!(reads);
        let mut corrupt: Vec<Corrupt> = Vec::new();
        // Objects that do not open with the keyring: never deleted.
        let mut undecryptable: Vec<(String, String)> = Vec::new();
        // Encrypted objects met without a keyring: not judged.
        let mut not_judged: Vec<String> = Vec::new();
        let mut errors: Vec<(String, String)> = Vec::new();
        let (mut read_count, mut bytes_read, mut good, mut unverified, mut gone) = (0usize, 0u64, 0usize, 0usize, 0usize);
        let mut read_names = std::collections::HashSet::new();
        while let Some((object, outcome)) = reads.next().await {
            read_count += 1;
            read_names.insert(object.name.as_str());
            match outcome {
                Read::Gone => gone += 1,
                Read::Failed(why) => errors.push((object.name.clone(), why)),
                Read::Done { bytes, encrypted: true, opened: None, .. } => {
                    bytes_read += bytes;
                    not_judged.push(object.name.clone());
                }
                Read::Done { bytes, recorded, computed, encrypted, opened } => {
                    bytes_read += bytes;
                    match (wrong_length(&object.name, bytes, encrypted), recorded) {
                        (Some(detail), _) => corrupt.push(Corrupt {
                            name: object.name.clone(),
                            reason: "length",
                            detail,
                        }),
                        (_, Some(recorded)) if recorded != computed => corrupt.push(Corrupt {
                            name: object.name.clone(),
                            reason: "checksum",
                            detail: format!("recorded CRC32C {recorded:08x}, the bytes read give {computed:08x}"),
                        }),
                        // Damage the checksum would have caught is corruption; past it, the
                        // keyring's verdict: an object that opens is authenticated, with or
                        // without a recorded checksum.
                        _ => match opened {
                            Some(Err(why)) => undecryptable.push((object.name.clone(), why)),
                            Some(Ok(())) => good += 1,
                            None if recorded.is_none() => unverified += 1,
                            None => good += 1,
                        },
                    }
                }
            }
            progress.tick(|| format!("read {read_count} of {} objects, {} corrupt", chosen.len(), corrupt.len()));
        }
        progress.finish();
        // Objects not read: their length, from the listing, never called wrong where it is
        // an encrypted block's of the length asked for.
        for o in listed.iter().filter(|o| !read_names.contains(o.name.as_str())) {
            let sealed = |want: u64| args.block_bytes.is_some() && encrypted_object_len(want) == o.bytes;
            if let Some(want) = expected_of(&o.name).filter(|want| *want != o.bytes && !sealed(*want)) {
                corrupt.push(Corrupt {
                    name: o.name.clone(),
                    reason: "length",
                    detail: format!("holds {} bytes (listed); the namespace's blocks are {want} bytes", o.bytes),
                });
            }
        }
        corrupt.sort_by(|a, b| a.name.cmp(&b.name));
        undecryptable.sort();
        not_judged.sort();
        errors.sort();

        // Without the keyring nothing is deleted: the namespace holds encrypted objects,
        // whose lengths and bytes this run cannot judge.
        let deleted = if args.delete_corrupt && !corrupt.is_empty() && not_judged.is_empty() {
            let names: Vec<String> = corrupt.iter().map(|c| c.name.clone()).collect();
            Some(objects::delete(&store, &names, "verify").await)
        } else {
            None
        };
        let was_deleted = |name: &str| deleted.as_ref().is_some_and(|d| d.gone.contains(name));
        let delete_failures = deleted.as_ref().map_or(&[][..], |d| &d.failed[..]);

        if args.store.json() {
            let corrupt_json: Vec<Value> = corrupt
                .iter()
                .map(|c| json!({"name": c.name, "reason": c.reason, "detail": c.detail, "deleted": was_deleted(&c.name)}))
                .collect();
            let mut all_errors: Vec<Value> = errors.iter().map(|(n, e)| json!({"name": n, "error": e})).collect();
            all_errors.extend(delete_failures.iter().map(|(n, e)| json!({"name": n, "error": format!("delete: {e}")})));
            println!(
                "{}",
                json!({
                    "scope": scope.path(),
                    "namespaces": namespaces_json,
                    "listed": listed.len(),
                    "read": read_count,
                    "bytes_read": bytes_read,
                    "good": good,
                    "without_checksum": unverified,
                    "gone": gone,
                    "corrupt": corrupt_json,
                    "undecryptable": undecryptable.iter().map(|(n, why)| json!({"name": n, "detail": why})).collect::<Vec<_>>(),
                    "encrypted": not_judged.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
                    "errors": all_errors,
                    "problems": ambiguous,
                })
            );
        } else {
            for c in &corrupt {
                let fate = if was_deleted(&c.name) { "  (deleted)" } else { "" };
                println!("CORRUPT  {}  {}: {}{fate}", c.name, c.reason, c.detail);
            }
            for (name, why) in &undecryptable {
                println!("UNDECRYPTABLE  {name}  {why}");
            }
            for name in &not_judged {
                println!("ENCRYPTED  {name}  not judged: verify it with the keyring");
            }
            for (name, why) in &errors {
                println!("ERROR    {name}  cannot read: {why}");
            }
            for (name, why) in delete_failures {
                println!("ERROR    {name}  cannot delete: {why}");
            }
            for problem in &ambiguous {
                println!("PROBLEM  {problem}");
            }
            println!(
                "{} objects under {}, {} read ({}): {} good, {} corrupt{}, {} undecryptable, {} encrypted (not judged without the keyring), {} without a checksum (length checked only), {} gone since the listing, {} unreadable",
                listed.len(),
                scope.describe(),
                read_count,
                human_bytes(bytes_read),
                good,
                corrupt.len(),
                deleted.as_ref().map_or(String::new(), |d| format!(" ({} deleted)", corrupt.iter().filter(|c| d.gone.contains(&c.name)).count())),
                undecryptable.len(),
                not_judged.len(),
                unverified,
                gone,
                errors.len()
            );
        }
        let mut problems = Vec::new();
        if !corrupt.is_empty() {
            problems.push(format!("{} corrupt objects", corrupt.len()));
        }
        if !undecryptable.is_empty() {
            problems.push(format!("{} objects do not open with the keyring", undecryptable.len()));
        }
        if !not_judged.is_empty() {
            problems.push(format!(
                "{} objects are encrypted and were not judged: pass the tier's configuration with its \
                 `encryption` section (the keyring) to verify them{}",
                not_judged.len(),
                if args.delete_corrupt { "; nothing was deleted" } else { "" }
            ));
        }
        if !errors.is_empty() {
            problems.push(format!("{} objects could not be read", errors.len()));
        }
        if !delete_failures.is_empty() {
            problems.push(format!("{} corrupt objects could not be deleted", delete_failures.len()));
        }
        if !ambiguous.is_empty() {
            problems.push(format!("{} namespaces without a common block size", ambiguous.len()));
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(Failure::run(problems.join(", "))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_even_and_common_sizes_unique() {
        assert_eq!(even_sample(10, 3), [0, 3, 6]);
        assert_eq!(even_sample(2, 5), [0, 1]);
        let o = |bytes| Object {
            name: String::new(),
            bytes,
            modified_us: 0,
        };
        let (a, b, c) = (o(4096), o(4096), o(100));
        assert_eq!(common_size(&[&a, &b, &c]), Ok(4096));
        assert!(common_size(&[&a, &c]).is_err());
        assert_eq!(common_size(&[&c]), Ok(100));
    }
}
