//! Tier configuration, parsed from JSON.
//!
//! The structs below are the one statement of the configuration: serde parses it from
//! them, and `schema` publishes their keys, types, defaults and doc comments (the first
//! paragraph of each is the key's user documentation) to the C ABI, the command line,
//! the Python package and docs/configuration.md. Errors name the key's full path
//! (`store.request_timeout_ms`). Secrets never appear in error messages or `Debug` output.

pub(crate) mod endpoint;
mod schema;
mod stores;

use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::redact::Secret;
use endpoint::parse_endpoint;
pub(crate) use endpoint::Endpoint;
use stores::parse_store;
pub(crate) use stores::ClientSettings;
pub use stores::{
    AzureConfig, ChecksumPolicy, FsyncPolicy, GcsConfig, LocalConfig, MemoryConfig, S3Config,
    StoreConfig,
};

pub use schema::{
    config_keys, markdown_tables, schema_json, store_types, ConfigKey, CONFIG_TABLE_BEGIN,
    CONFIG_TABLE_END,
};

/// Key length used when the configuration does not say: a SHA-256 block hash plus the
/// 4-byte group index, vLLM's default.
pub const DEFAULT_KEY_BYTES: usize = 36;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TierConfig {
    /// The store where blocks live: `type` names it; the other keys are that type's.
    pub store: StoreConfig,
    /// Leading path segments of every object name.
    #[serde(default)]
    pub prefix: String,
    /// Namespace segment, e.g. vLLM's `<model>_<digest>_r<rank>` (see `namespace`).
    #[serde(default)]
    pub namespace: String,
    /// Exact length of every key in bytes (hash + 4-byte group); 0 accepts any length from
    /// 5 to 68 (vLLM takes hashes of any length).
    #[serde(default = "default_key_bytes")]
    pub key_bytes: usize,
    /// Worker threads of the tier's I/O runtime. Concurrency comes from in-flight
    /// requests, not threads.
    #[serde(default = "default_runtime_threads")]
    pub runtime_threads: usize,
    /// Blocks stored and loaded at once, and the connections their parts may keep busy
    /// together: each block a request, or parts on connections of their own where one
    /// connection cannot fill the link (`store.load_part_bytes`, `store.store_part_bytes`).
    #[serde(default = "default_inflight_transfers")]
    pub max_inflight_transfers: usize,
    /// Threads that run blocking file I/O (the local store's reads and writes, DNS
    /// lookups): a fixed bound, whatever the load, so the host process keeps a small
    /// number of threads.
    #[serde(default = "default_file_io_threads")]
    pub file_io_threads: usize,
    /// Existence checks in flight at once; a separate budget so lookups never queue
    /// behind bulk transfers. The default lets a scheduler step's batch of 256 keys go out
    /// at once: against a remote store each check costs a round trip, so checks sent in
    /// waves cost a round trip per wave. Each check in flight holds a connection (a file
    /// descriptor) of its own.
    #[serde(default = "default_inflight_lookups")]
    pub max_inflight_lookups: usize,
    /// S3, Azure and GCS stores: existence checks run on their own I/O thread and HTTP
    /// connections, so that under saturating transfers they neither queue behind transfer
    /// tasks nor wait for a pooled connection. Costs one thread.
    #[serde(default = "default_true", deserialize_with = "bool_or_word")]
    #[schemars(with = "bool")]
    pub separate_lookup_lane: bool,
    /// Nice value (0..=19) of the transfer threads: above 0, the engine's own threads and
    /// the lookup lane win the CPU when a host is saturated, at some cost in transfer
    /// throughput there. Linux only lets a thread lower its own priority, so no
    /// privilege is needed.
    #[serde(default)]
    pub transfer_thread_nice: i32,
    /// Record a BlockStored event for every successful store job.
    #[serde(default)]
    pub enable_kv_events: bool,
    /// Locality carried on events: `LOCAL`, `REMOTE`, or absent (anything else is an
    /// error).
    #[serde(default)]
    pub locality: Option<Locality>,
    /// How long shutdown waits for operations already in progress before abandoning them
    /// (reported cancelled). Shutdown returns within this plus about 1 s, even while a
    /// local-store read hangs in the kernel or a keyring command hangs: those are left
    /// behind, and an abandoned read never reaches the caller's memory.
    #[serde(default = "default_shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
    /// Record a CRC32C of every stored block (in object metadata, or an extended
    /// attribute on the local store) and verify it on load.
    #[serde(default = "default_true", deserialize_with = "bool_or_word")]
    #[schemars(with = "bool")]
    pub checksums: bool,
    /// What a load does with a block whose bytes fail its checksum on two reads: `fail` the
    /// key, or `fail_and_delete` to also delete the object when both reads returned the same
    /// bytes. Either way the key answers MISS and its next store rewrites the object.
    #[serde(default)]
    pub on_corrupt: OnCorrupt,
    /// How stores avoid uploading a block the store already holds. Default: `conditional`
    /// where the store honours conditional PUT (probed at start), else `skip_known`.
    #[serde(default)]
    pub dedup: Option<DedupMode>,
    /// Keys remembered as present for `skip_known` dedup; the memory is forgotten whole when full.
    #[serde(default = "default_known_keys")]
    pub known_keys_capacity: usize,
    /// Milliseconds a key stays remembered as in the store (after its store, or a lookup
    /// that found it) and a key found corrupt stays MISS without asking the store. The
    /// store is the truth: another engine, `kvtier gc`, an eviction or a lifecycle rule may
    /// delete a block at any time, and a tier that skips uploads of keys it remembers would
    /// otherwise report them stored for ever. Within the window a deletion by someone else
    /// is not seen by a store that skips; after it, the next store uploads (or, with
    /// `conditional` dedup, asks the store with `If-None-Match`). 0: never remember.
    #[serde(default = "default_known_keys_ttl_ms")]
    pub known_keys_ttl_ms: u64,
    /// Keeps the tier's namespace (`prefix/namespace`, which must not be empty) within a
    /// byte budget and/or an age: every `interval_ms` a background task lists it and deletes
    /// the oldest blocks past `max_bytes` and every block older than `max_age_s`, each with
    /// a BlockRemoved event. Off when absent.
    #[serde(default)]
    #[schemars(example = serde_json::json!({"max_bytes": 100_000_000_000_u64}))]
    pub eviction: Option<EvictionConfig>,
    /// Encrypts every block at rest with AES-256-GCM, bound to its object's name, under
    /// keys from a keyring (a file, an environment variable or a command; never this
    /// configuration). Off when absent. Objects are then 64 bytes plus 16 a 64 KiB segment
    /// longer than their blocks, and a tier with encryption on refuses plain objects (and
    /// one without refuses encrypted ones) by their length.
    #[serde(default)]
    #[schemars(example = serde_json::json!({"keyring_file": "/etc/kvtier/keyring.json"}))]
    pub encryption: Option<EncryptionConfig>,
}

/// Where the keys of encryption at rest come from: exactly one of `keyring_file`,
/// `keyring_env` and `keyring_command`, each giving a keyring as JSON:
/// `{"write": "ID", "keys": {"ID": "32 bytes in base64", …}}`. New blocks are sealed with
/// the `write` key; blocks sealed with any key of the ring load. A block whose key is not
/// in the ring fails alone (UNDECRYPTABLE) and answers MISS; its next store rewrites it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EncryptionConfig {
    /// A file holding the keyring.
    #[serde(default)]
    pub keyring_file: Option<PathBuf>,
    /// The name of an environment variable holding the keyring.
    #[serde(default)]
    pub keyring_env: Option<String>,
    /// A command, as program and arguments (no shell), that prints the keyring on its
    /// standard output and exits 0 within 30 s. Its standard error is discarded.
    #[serde(default)]
    #[schemars(example = serde_json::json!(["/usr/local/bin/kvtier-keyring", "--tier", "prod"]))]
    pub keyring_command: Option<Vec<String>>,
    /// Seconds between two reads of `keyring_file` or runs of `keyring_command`, so that a
    /// rotated keyring takes effect without a restart (a failed read keeps the keyring it
    /// had, with a warning); 0 reads it once, at start.
    #[serde(default = "default_keyring_refresh_s")]
    pub refresh_s: u64,
}

fn default_keyring_refresh_s() -> u64 {
    300
}

/// A byte budget and/or a maximum age for the objects of the tier's namespace
/// (`prefix/namespace`), enforced by a background task that lists them every
/// `interval_ms` and deletes the oldest past the budget and every object past the age.
/// Each deleted block yields a BlockRemoved event.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EvictionConfig {
    /// Bytes the namespace may hold; the oldest objects go first.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Seconds an object may live (by its last-modified time).
    #[serde(default)]
    pub max_age_s: Option<u64>,
    /// Milliseconds between two rounds.
    #[serde(default = "default_eviction_interval_ms")]
    pub interval_ms: u64,
}

fn default_eviction_interval_ms() -> u64 {
    60_000
}

fn default_known_keys() -> usize {
    1_000_000
}

fn default_known_keys_ttl_ms() -> u64 {
    60_000
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnCorrupt {
    /// Fail the key; the object stays until the key's next store overwrites it.
    #[default]
    Fail,
    /// Fail the key and delete the object when two reads returned the same wrong bytes
    /// (corrupt in the store, not in transit).
    FailAndDelete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DedupMode {
    /// Skip keys known present, share concurrent uploads of one key, and PUT with
    /// `If-None-Match: *` so that a key another replica stored is not rewritten.
    Conditional,
    /// Skip keys known present and share concurrent uploads; PUTs overwrite.
    SkipKnown,
    /// Upload every store.
    Off,
}

impl DedupMode {
    /// The configuration's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            DedupMode::Conditional => "conditional",
            DedupMode::SkipKnown => "skip_known",
            DedupMode::Off => "off",
        }
    }
}

fn default_key_bytes() -> usize {
    DEFAULT_KEY_BYTES
}
fn default_runtime_threads() -> usize {
    2
}
fn default_inflight_transfers() -> usize {
    64
}
fn default_file_io_threads() -> usize {
    16
}
fn default_inflight_lookups() -> usize {
    256
}
fn default_shutdown_timeout_ms() -> u64 {
    30_000
}

#[allow(clippy::upper_case_acronyms)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum Locality {
    LOCAL,
    REMOTE,
}

/// Smallest `load_part_bytes` (other than 0): smaller parts cost more requests than their
/// parallelism gains.
pub(crate) const MIN_LOAD_PART_BYTES: u64 = 1 << 20;

/// Smallest `store_part_bytes` (other than 0): S3 refuses smaller parts (but the last).
pub(crate) const MIN_STORE_PART_BYTES: u64 = 5 << 20;

fn default_true() -> bool {
    true
}

/// Accepts JSON booleans and the words vLLM/NIXL users write (`"true"`, `"yes"`, `"1"`...).
fn bool_or_word<'de, D: Deserializer<'de>>(deserializer: D) -> std::result::Result<bool, D::Error> {
    struct BoolOrWord;
    impl de::Visitor<'_> for BoolOrWord {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a boolean (or true/false, yes/no, on/off, 1/0 as a string)")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<bool, E> {
            match v.to_ascii_lowercase().as_str() {
                "true" | "yes" | "y" | "on" | "1" | "enable" => Ok(true),
                "false" | "no" | "n" | "off" | "0" | "disable" => Ok(false),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
    }
    deserializer.deserialize_any(BoolOrWord)
}

/// A path-tracked parse error, as a configuration error naming the key's full path.
fn key_error(under: &str, e: serde_path_to_error::Error<serde_json::Error>) -> Error {
    let path = e.path().to_string();
    let key = match (under, path.as_str()) {
        (_, ".") => under.to_string(),
        ("", _) => path,
        _ => format!("{under}.{path}"),
    };
    let inner = e.into_inner();
    if key.is_empty() {
        Error::config(format!("invalid configuration: {inner}"))
    } else {
        Error::config(format!("invalid configuration: {key}: {inner}"))
    }
}

impl TierConfig {
    /// Parses and validates a JSON document.
    pub fn from_json(json: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| Error::config(format!("invalid configuration: not JSON: {e}")))?;
        // The store on its own first, so that an error inside it names `store.<key>`
        // (inside the whole document, its parse reports the path `store` alone).
        if let Some(store) = value.get("store") {
            parse_store(store.clone())?;
        }
        let config: TierConfig =
            serde_path_to_error::deserialize(value).map_err(|e| key_error("", e))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<()> {
        if self.key_bytes != 0 && crate::key::check_key_len(self.key_bytes).is_err() {
            return Err(Error::config(format!(
                "key_bytes is {}; it must be 0 (any) or {}..={} (a {}..={} byte hash plus the {}-byte group)",
                self.key_bytes,
                crate::key::MIN_KEY_BYTES,
                crate::key::MAX_KEY_BYTES,
                crate::key::MIN_HASH_BYTES,
                crate::key::MAX_HASH_BYTES,
                crate::key::GROUP_BYTES
            )));
        }
        for (name, value, max) in [
            ("runtime_threads", self.runtime_threads, 256),
            ("max_inflight_transfers", self.max_inflight_transfers, 4096),
            ("file_io_threads", self.file_io_threads, 256),
            ("max_inflight_lookups", self.max_inflight_lookups, 4096),
        ] {
            if value == 0 || value > max {
                return Err(Error::config(format!(
                    "{name} is {value}; it must be 1..={max}"
                )));
            }
        }
        if !(0..=19).contains(&self.transfer_thread_nice) {
            return Err(Error::config(format!(
                "transfer_thread_nice is {}; it must be 0..=19",
                self.transfer_thread_nice
            )));
        }
        match &self.store {
            StoreConfig::S3(s3) => s3.validate()?,
            StoreConfig::Azure(azure) => azure.validate()?,
            StoreConfig::Gcs(gcs) => gcs.validate()?,
            StoreConfig::Local(_) | StoreConfig::Memory(_) => {}
        }
        if let Some(eviction) = &self.eviction {
            if eviction.max_bytes.is_none() && eviction.max_age_s.is_none() {
                return Err(Error::config("eviction needs max_bytes, max_age_s or both"));
            }
            if eviction.interval_ms == 0 {
                return Err(Error::config(
                    "eviction.interval_ms is 0; it must be at least 1",
                ));
            }
            if self.prefix.trim_matches('/').is_empty()
                && self.namespace.trim_matches('/').is_empty()
            {
                return Err(Error::config(
                    "eviction needs a prefix or namespace: it deletes objects under them, never a whole bucket",
                ));
            }
        }
        if let Some(encryption) = &self.encryption {
            encryption.validate()?;
        }
        crate::key::KeyLayout::new(&self.prefix, &self.namespace)?;
        Ok(())
    }
}

impl EncryptionConfig {
    pub fn validate(&self) -> Result<()> {
        let sources = usize::from(self.keyring_file.is_some())
            + usize::from(self.keyring_env.is_some())
            + usize::from(self.keyring_command.is_some());
        if sources != 1 {
            return Err(Error::config(
                "encryption needs exactly one of keyring_file, keyring_env and keyring_command",
            ));
        }
        if self
            .keyring_env
            .as_ref()
            .is_some_and(|name| name.is_empty())
        {
            return Err(Error::config("encryption.keyring_env is empty"));
        }
        if self
            .keyring_command
            .as_ref()
            .is_some_and(|argv| argv.first().is_none_or(|program| program.is_empty()))
        {
            return Err(Error::config(
                "encryption.keyring_command needs a program (its first element)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
