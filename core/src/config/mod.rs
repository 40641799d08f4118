//! Tier configuration, parsed from JSON.
//!
//! The structs below are the one statement of the configuration: serde parses it from
//! them, and `schema` publishes their keys, types, defaults and doc comments (the first
//! paragraph of each is the key's user documentation) to the C ABI, the command line,
//! the Python package and the README. Errors name the key's full path
//! (`store.request_timeout_ms`). Secrets never appear in error messages or `Debug` output.

pub(crate) mod endpoint;
mod schema;

use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::redact::Secret;
use endpoint::parse_endpoint;
pub(crate) use endpoint::Endpoint;

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
    /// Blocks stored and loaded at once (each a request, or the parts of a large object:
    /// `store.store_part_bytes`, `store.load_part_bytes`, which are used while a quarter of
    /// this or fewer are in flight).
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
    /// How long shutdown waits for operations already in progress before abandoning them.
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

/// A store: its `type`, and that type's keys. Parsed by `parse_store` (so that an error
/// inside names the key's path); the derived schema states the same tagging.
#[derive(Debug, Clone, JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
// One per tier, read at start-up: the size of the S3 variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum StoreConfig {
    /// A local directory: the embedded default. Writes publish atomically by rename.
    Local(LocalConfig),
    /// Process memory, private to the tier (for tests and trials: gone with the tier).
    Memory(MemoryConfig),
    /// S3 and S3-compatible stores.
    S3(S3Config),
    /// Azure Blob Storage (and Azurite).
    Azure(AzureConfig),
    /// Google Cloud Storage (and emulators of its XML API).
    Gcs(GcsConfig),
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LocalConfig {
    /// Root directory; created if missing.
    #[schemars(example = &"/var/cache/kvtier")]
    pub path: PathBuf,
    /// Read and write blocks with O_DIRECT (bypassing the page cache) where the block's
    /// memory and size are aligned to 4096 bytes and the file system allows it; other
    /// blocks, and file systems that refuse O_DIRECT (tmpfs), use buffered I/O.
    #[serde(default, deserialize_with = "bool_or_word")]
    #[schemars(with = "bool")]
    pub o_direct: bool,
    /// What survives a power loss. `none` (default): a block is published by an atomic
    /// rename, so a crash of the process never shows a partial block, but blocks written
    /// shortly before a power loss may be lost (or, on file systems without rename
    /// ordering, read as the wrong length and fail alone). `data`: each block's bytes are
    /// flushed (fdatasync) before it is published. `full`: also its directory entry
    /// (fsync of the directory), so a stored block survives a power loss.
    #[serde(default)]
    pub fsync: FsyncPolicy,
}

/// When the local store flushes to the device (see [`LocalConfig::fsync`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FsyncPolicy {
    #[default]
    None,
    Data,
    Full,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct MemoryConfig {}

/// S3 settings. Key names follow vLLM's `store_config`, so a vLLM user can paste theirs.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct S3Config {
    /// The bucket.
    #[schemars(example = &"kv-cache")]
    pub bucket: String,
    /// `host[:port]` or a full URL; empty means AWS.
    #[serde(default)]
    pub endpoint_override: String,
    /// `http` or `https`; a full URL's own scheme wins. Default `https`.
    #[serde(default)]
    #[schemars(example = &"https")]
    pub scheme: Option<String>,
    /// The region to sign for; empty: the `AWS_REGION` environment or profile, else `us-east-1`.
    #[serde(default)]
    pub region: String,
    /// Access key id; leave it and `secret_key` out to use the AWS credential chain
    /// (environment, `AWS_PROFILE` files, web identity, instance metadata).
    #[serde(default)]
    pub access_key: Secret,
    /// Secret access key, given with `access_key`.
    #[serde(default)]
    pub secret_key: Secret,
    /// Session token of temporary credentials, given with `access_key` and `secret_key`.
    #[serde(default)]
    pub session_token: Secret,
    /// PEM file of extra trusted CA certificates.
    #[serde(default)]
    pub ca_bundle: String,
    /// false (default): path-style requests, as MinIO, Ceph and most gateways need.
    #[serde(default, deserialize_with = "bool_or_word")]
    #[schemars(with = "bool")]
    pub use_virtual_addressing: bool,
    /// `supported` (the default) sends a CRC64NVME of every PUT's body
    /// (`x-amz-checksum-crc64nvme`) for the server to verify before it stores the object;
    /// `required` sends no checksum header (servers such as NooBaa reject them).
    #[serde(default)]
    pub req_checksum: Option<ChecksumPolicy>,
    /// Accepted for vLLM compatibility; responses are verified by kvtier's own checks.
    #[serde(default)]
    pub resp_checksum: Option<ChecksumPolicy>,
    /// Accepted for vLLM compatibility (NIXL's executor size); concurrency is set by
    /// `max_inflight_transfers`.
    #[serde(default)]
    #[schemars(example = &"8")]
    pub num_threads: Option<serde_json::Value>,
    /// Milliseconds a connection may take to open.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Milliseconds one request may take, its body included.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Retries per request for 5xx, throttling, timeouts and connection resets.
    #[serde(default = "default_max_retries")]
    pub max_retries: usize,
    /// Sign payloads (SHA-256 of the body). Off by default: integrity comes from TLS and
    /// kvtier's own checksums, and hashing every block costs CPU.
    #[serde(default, deserialize_with = "bool_or_word")]
    #[schemars(with = "bool")]
    pub payload_signing: bool,
    /// Allow plain http even to non-loopback endpoints.
    #[serde(default = "default_true", deserialize_with = "bool_or_word")]
    #[schemars(with = "bool")]
    pub allow_http: bool,
    /// Path-style http and https endpoints: loads read response bodies straight into the
    /// block (on https, from rustls's record buffer), stores send a block's pieces (the
    /// ranges it is made of) behind the request head in one `writev`, and existence checks
    /// send HEADs on pooled connections, instead of going through the general HTTP client
    /// (one copy and ~60 µs of CPU less per request). Unexpected answers are repeated
    /// through the general client; on https the direct path trusts what the general client
    /// trusts. Stores keep to the general client with `payload_signing`, and when the
    /// environment changes its PUTs (`AWS_SERVER_SIDE_ENCRYPTION`, `AWS_SSE_*`,
    /// `AWS_REQUEST_PAYER`, `AWS_CHECKSUM_ALGORITHM`, `AWS_CONDITIONAL_PUT`,
    /// `AWS_SKIP_SIGNATURE`). With a proxy in the environment (`HTTP_PROXY`, `HTTPS_PROXY`,
    /// `ALL_PROXY`, either case) no request takes the direct path: they all go through the
    /// proxy, as the general client sends them (`NO_PROXY` is not consulted here: an
    /// endpoint it exempts is reached directly, by the general client).
    #[serde(default = "default_true", deserialize_with = "bool_or_word")]
    #[schemars(with = "bool")]
    pub direct_http: bool,
    /// On the direct path, a load of an object larger than this many bytes reads it as
    /// parts of this size, each a ranged GET on its own connection, all in flight at once,
    /// each landing in its place in the block; the checksum is still checked over the whole
    /// block. A remote store caps what one connection moves, so a large object (vLLM chunks
    /// of several blocks) loads as fast as its parts' connections together. Parts are used
    /// while a quarter of `max_inflight_transfers` or fewer are in flight: beyond that the
    /// jobs already keep many connections busy. 0: one GET per object.
    #[serde(default = "default_load_part_bytes")]
    pub load_part_bytes: u64,
    /// A store of an object of at least twice this many bytes uploads it as a multipart
    /// upload of parts this size (the last one takes the remainder, so no part is small),
    /// all parts in flight at once on connections of their own, each sent straight from
    /// the block. A remote store caps what one connection moves, so a large object stores
    /// as fast as its parts' connections together; a smaller one stays one PUT (a
    /// multipart upload costs two requests more, and the server assembles it). With
    /// `dedup: "conditional"` such a store asks first whether the object is there (a
    /// multipart completion is not conditional: two tiers storing the same new block at
    /// once may both upload it). Parts are used while a quarter of `max_inflight_transfers`
    /// or fewer are in flight, as for loads. At least 5 MiB, S3's smallest part. 0: one PUT
    /// per object.
    #[serde(default = "default_store_part_bytes")]
    pub store_part_bytes: u64,
}

/// Smallest `load_part_bytes` (other than 0): smaller parts cost more requests than their
/// parallelism gains.
pub(crate) const MIN_LOAD_PART_BYTES: u64 = 1 << 20;

fn default_load_part_bytes() -> u64 {
    8 << 20
}

/// Smallest `store_part_bytes` (other than 0): S3 refuses smaller parts (but the last).
pub(crate) const MIN_STORE_PART_BYTES: u64 = 5 << 20;

/// Larger than `load_part_bytes`: a multipart upload costs the server more than ranged
/// GETs do (it assembles the parts), which on a nearby store outweighs what the parts gain
/// (s3s-fs on loopback: 16 MiB blocks as two parts stored at 0.57x one PUT's rate). Objects
/// under 32 MiB stay one PUT; vLLM chunks of 32 MiB and more go up in parts.
fn default_store_part_bytes() -> u64 {
    16 << 20
}

fn default_connect_timeout_ms() -> u64 {
    5_000
}
fn default_request_timeout_ms() -> u64 {
    30_000
}
fn default_max_retries() -> usize {
    5
}
fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ChecksumPolicy {
    Required,
    Supported,
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

/// The store types, by the name `store.type` gives them (as [`StoreConfig`]'s schema does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoreKind {
    Local,
    Memory,
    S3,
    Azure,
    Gcs,
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

/// The store object (`type` and that type's keys), with errors naming `store.<key>`.
fn parse_store(value: serde_json::Value) -> Result<StoreConfig> {
    fn typed<T: de::DeserializeOwned>(
        fields: serde_json::Map<String, serde_json::Value>,
    ) -> Result<T> {
        serde_path_to_error::deserialize(serde_json::Value::Object(fields))
            .map_err(|e| key_error("store", e))
    }
    let serde_json::Value::Object(mut fields) = value else {
        return Err(Error::config(
            "invalid configuration: store must be an object with a type and that store's keys",
        ));
    };
    let kind = fields.remove("type").ok_or_else(|| {
        Error::config(format!(
            "invalid configuration: store.type is missing: one of {}",
            store_types().join(", ")
        ))
    })?;
    let kind: StoreKind =
        serde_path_to_error::deserialize(kind).map_err(|e| key_error("store.type", e))?;
    Ok(match kind {
        StoreKind::Local => StoreConfig::Local(typed(fields)?),
        StoreKind::Memory => StoreConfig::Memory(typed(fields)?),
        StoreKind::S3 => StoreConfig::S3(typed(fields)?),
        StoreKind::Azure => StoreConfig::Azure(typed(fields)?),
        StoreKind::Gcs => StoreConfig::Gcs(typed(fields)?),
    })
}

/// Through [`parse_store`]: a derived tagged enum would parse it too, but would lose the
/// path of an error inside (it buffers the object before it knows the type).
impl<'de> Deserialize<'de> for StoreConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        parse_store(serde_json::Value::deserialize(deserializer)?)
            .map_err(|e| de::Error::custom(e.message))
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

impl S3Config {
    pub fn validate(&self) -> Result<()> {
        if self.bucket.is_empty() {
            return Err(Error::config("store.bucket is empty"));
        }
        if let Some(scheme) = &self.scheme {
            if scheme != "http" && scheme != "https" {
                return Err(Error::config(format!(
                    "store.scheme is {scheme:?}; it must be \"http\" or \"https\""
                )));
            }
        }
        if self.access_key.is_empty() != self.secret_key.is_empty() {
            return Err(Error::config(
                "store.access_key and store.secret_key must be given together (or both left out to use the default credential chain)",
            ));
        }
        if !self.session_token.is_empty() && self.access_key.is_empty() {
            return Err(Error::config(
                "store.session_token needs store.access_key and store.secret_key (the temporary credentials it belongs to)",
            ));
        }
        check_client_limits(
            self.connect_timeout_ms,
            self.request_timeout_ms,
            self.max_retries,
        )?;
        if self.load_part_bytes != 0 && self.load_part_bytes < MIN_LOAD_PART_BYTES {
            return Err(Error::config(format!(
                "store.load_part_bytes is {}; it must be 0 (one GET per object) or at least {MIN_LOAD_PART_BYTES}",
                self.load_part_bytes
            )));
        }
        if self.store_part_bytes != 0 && self.store_part_bytes < MIN_STORE_PART_BYTES {
            return Err(Error::config(format!(
                "store.store_part_bytes is {}; it must be 0 (one PUT per object) or at least {MIN_STORE_PART_BYTES} (S3's smallest part)",
                self.store_part_bytes
            )));
        }
        let endpoint = self.endpoint()?;
        if self.use_virtual_addressing {
            // With no endpoint_override the endpoint is AWS's, a DNS name.
            let host = endpoint.as_ref().map_or("", Endpoint::host);
            if host.starts_with('[') || host.parse::<std::net::IpAddr>().is_ok() {
                return Err(Error::config(format!(
                    "store.use_virtual_addressing needs a DNS name in endpoint_override (the bucket becomes part of the host name), not the IP address {host}; use path-style addressing (false)"
                )));
            }
        }
        if !self.ca_bundle.is_empty() && endpoint.as_ref().is_some_and(|e| !e.tls()) {
            log::warn!("store.ca_bundle is set but the endpoint is http: the CA bundle is unused");
        }
        Ok(())
    }
}

impl S3Config {
    /// The endpoint of `endpoint_override`, which may or may not carry a scheme (`scheme`
    /// decides then, https by default); `None` for AWS itself.
    pub(crate) fn endpoint(&self) -> Result<Option<Endpoint>> {
        if self.endpoint_override.is_empty() {
            return Ok(None);
        }
        parse_endpoint(
            &self.endpoint_override,
            self.scheme.as_deref().unwrap_or("https"),
        )
        .map(Some)
        .map_err(|why| {
            Error::config(format!(
                "store.endpoint_override {:?} is not a usable endpoint: {why}",
                self.endpoint_override
            ))
        })
    }
}

/// Azure Blob Storage settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AzureConfig {
    /// The storage account.
    #[schemars(example = &"devstoreaccount1")]
    pub account: String,
    /// The container.
    #[schemars(example = &"kv-cache")]
    pub container: String,
    /// The account's shared key (base64). Leave both this and `sas` out to use
    /// `object_store`'s credential chain (the `AZURE_*` environment variables, workload or
    /// managed identity).
    #[serde(default)]
    pub access_key: Secret,
    /// A shared access signature (the query string, with or without the leading `?`).
    #[serde(default)]
    pub sas: Secret,
    /// The account URL, e.g. `http://127.0.0.1:10000/devstoreaccount1` for Azurite; empty
    /// means `https://ACCOUNT.blob.core.windows.net`. Plain http is allowed when the URL
    /// says http.
    #[serde(default)]
    pub endpoint: String,
    /// PEM file of extra trusted CA certificates.
    #[serde(default)]
    pub ca_bundle: String,
    /// Milliseconds a connection may take to open.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Milliseconds one request may take, its body included.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Retries per request for 5xx, throttling, timeouts and connection resets.
    #[serde(default = "default_max_retries")]
    pub max_retries: usize,
}

/// Google Cloud Storage settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GcsConfig {
    /// The bucket.
    #[schemars(example = &"kv-cache")]
    pub bucket: String,
    /// Path of a service-account JSON key file. Empty: `object_store`'s chain (the
    /// `GOOGLE_*` environment variables, application default credentials, instance
    /// metadata).
    #[serde(default)]
    pub service_account: String,
    /// Base URL of the service, e.g. an emulator's `http://127.0.0.1:4443`; empty means
    /// the service-account file's `gcs_base_url`, else `https://storage.googleapis.com`.
    #[serde(default)]
    pub endpoint: String,
    /// PEM file of extra trusted CA certificates.
    #[serde(default)]
    pub ca_bundle: String,
    /// Milliseconds a connection may take to open.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Milliseconds one request may take, its body included.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Retries per request for 5xx, throttling, timeouts and connection resets.
    #[serde(default = "default_max_retries")]
    pub max_retries: usize,
}

impl AzureConfig {
    pub fn validate(&self) -> Result<()> {
        for (name, value) in [("account", &self.account), ("container", &self.container)] {
            if value.is_empty() {
                return Err(Error::config(format!("store.{name} is empty")));
            }
        }
        if !self.access_key.is_empty() && !self.sas.is_empty() {
            return Err(Error::config(
                "store.access_key and store.sas are both set; give one (or neither, to use the Azure credential chain)",
            ));
        }
        check_client_limits(
            self.connect_timeout_ms,
            self.request_timeout_ms,
            self.max_retries,
        )?;
        self.account_endpoint().map(drop)
    }

    /// The account URL requests go to: `endpoint`, or Azure's public one for the account.
    pub(crate) fn account_endpoint(&self) -> Result<Endpoint> {
        if self.endpoint.is_empty() {
            let url = format!("https://{}.blob.core.windows.net", self.account);
            return parse_endpoint(&url, "https").map_err(|why| {
                Error::config(format!(
                    "store.account {:?} makes the account URL {url:?}, not a usable endpoint: {why}",
                    self.account
                ))
            });
        }
        full_url("endpoint", &self.endpoint)
    }
}

impl GcsConfig {
    pub fn validate(&self) -> Result<()> {
        if self.bucket.is_empty() {
            return Err(Error::config("store.bucket is empty"));
        }
        check_client_limits(
            self.connect_timeout_ms,
            self.request_timeout_ms,
            self.max_retries,
        )?;
        if !self.endpoint.is_empty() {
            full_url("endpoint", &self.endpoint)?;
        }
        Ok(())
    }
}

fn check_client_limits(
    connect_timeout_ms: u64,
    request_timeout_ms: u64,
    max_retries: usize,
) -> Result<()> {
    for (name, value) in [
        ("connect_timeout_ms", connect_timeout_ms),
        ("request_timeout_ms", request_timeout_ms),
    ] {
        if value == 0 {
            return Err(Error::config(format!(
                "store.{name} is 0; it must be at least 1 (milliseconds)"
            )));
        }
    }
    if max_retries > 100 {
        return Err(Error::config(format!(
            "store.max_retries is {max_retries}; it must be 0..=100"
        )));
    }
    Ok(())
}

/// An endpoint setting that must be a full URL (`http[s]://host[:port][/path]`).
fn full_url(key: &str, url: &str) -> Result<Endpoint> {
    let parsed = if url.contains("://") {
        parse_endpoint(url, "https")
    } else {
        Err("it needs a scheme: http://host:port/... or https://...".to_string())
    };
    parsed.map_err(|why| {
        Error::config(format!(
            "store.{key} {url:?} is not a usable endpoint: {why}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    #[test]
    fn malformed_endpoints_are_config_errors_naming_the_key() {
        for bad in [
            "http://[::1",
            "http://127.0.0.1:99999",
            "ht!tp://x",
            "ftp://host",
            "host:port",
            "http://a b:9000",
            "http://:9000",
            "http://[nope]:9000",
            "http://[::1]x",
            "http://h:0",
            "http://u:p@h:9000",
            "http://h/a b",
            "http://h:+80",
        ] {
            let json =
                format!(r#"{{"store":{{"type":"s3","bucket":"b","endpoint_override":{bad:?}}}}}"#);
            let e = TierConfig::from_json(&json)
                .and_then(|c| c.validate())
                .unwrap_err();
            assert_eq!(e.status, Status::Config, "{bad}: {}", e.message);
            assert!(
                e.message.contains("endpoint_override"),
                "{bad}: {}",
                e.message
            );
        }
        for good in [
            "minio.internal:9000",
            "http://127.0.0.1:9000",
            "https://s3.example.com/",
            "http://[::1]:9000",
            "[::1]",
            "HTTPS://S3.example.com:443/base",
            "s3_gw.local",
        ] {
            let json =
                format!(r#"{{"store":{{"type":"s3","bucket":"b","endpoint_override":{good:?}}}}}"#);
            TierConfig::from_json(&json)
                .and_then(|c| c.validate())
                .unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn minimal_local_config_takes_defaults() {
        let c = TierConfig::from_json(r#"{"store":{"type":"local","path":"/tmp/x"}}"#).unwrap();
        assert_eq!(c.key_bytes, 36);
        assert_eq!(c.runtime_threads, 2);
        assert!(!c.enable_kv_events);
        assert!(matches!(c.store, StoreConfig::Local(_)));
    }

    #[test]
    fn unknown_key_is_named() {
        let e = TierConfig::from_json(r#"{"store":{"type":"memory"},"prefx":"a"}"#).unwrap_err();
        assert_eq!(e.status, Status::Config);
        assert!(e.message.contains("prefx"), "{}", e.message);
        let e = TierConfig::from_json(r#"{"store":{"type":"local","path":"/x","colour":1}}"#)
            .unwrap_err();
        assert!(e.message.contains("colour"), "{}", e.message);
    }

    #[test]
    fn malformed_json_and_bad_values() {
        assert_eq!(
            TierConfig::from_json("{").unwrap_err().status,
            Status::Config
        );
        assert_eq!(
            TierConfig::from_json("").unwrap_err().status,
            Status::Config
        );
        let e = TierConfig::from_json(r#"{"store":{"type":"ftp"}}"#).unwrap_err();
        assert!(e.message.contains("ftp"), "{}", e.message);
        let e =
            TierConfig::from_json(r#"{"store":{"type":"memory"},"locality":"local"}"#).unwrap_err();
        assert!(e.message.contains("local"), "{}", e.message);
        assert!(
            TierConfig::from_json(r#"{"store":{"type":"memory"},"locality":"REMOTE"}"#).is_ok()
        );
        let e = TierConfig::from_json(r#"{"store":{"type":"memory"},"runtime_threads":0}"#)
            .unwrap_err();
        assert!(e.message.contains("runtime_threads"));
        let e = TierConfig::from_json(r#"{"store":{"type":"memory"},"key_bytes":3}"#).unwrap_err();
        assert!(e.message.contains("key_bytes"));
        for nice in ["-1", "20"] {
            let json = format!(r#"{{"store":{{"type":"memory"}},"transfer_thread_nice":{nice}}}"#);
            let e = TierConfig::from_json(&json).unwrap_err();
            assert!(e.message.contains("transfer_thread_nice"), "{}", e.message);
        }
    }

    #[test]
    fn secrets_never_echoed() {
        let json = r#"{"store":{"type":"s3","bucket":"b","access_key":"AKIAEXAMPLE","secret_key":"hunter2-very-secret","bogus":1}}"#;
        let e = TierConfig::from_json(json).unwrap_err();
        assert!(!e.message.contains("hunter2"), "{}", e.message);
        assert!(!e.message.contains("AKIAEXAMPLE"), "{}", e.message);
        let json = r#"{"store":{"type":"s3","bucket":"b","access_key":"AKIAEXAMPLE","secret_key":12345678}}"#;
        let e = TierConfig::from_json(json).unwrap_err();
        assert!(!e.message.contains("12345678"), "{}", e.message);
        let ok = TierConfig::from_json(
            r#"{"store":{"type":"s3","bucket":"b","access_key":"AKIAEXAMPLE","secret_key":"hunter2-very-secret","session_token":"tok-secret"}}"#,
        )
        .unwrap();
        let debug = format!("{ok:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("tok-secret"),
            "{debug}"
        );
    }

    #[test]
    fn s3_words_and_validation() {
        let c = TierConfig::from_json(
            r#"{"store":{"type":"s3","bucket":"b","use_virtual_addressing":"true","req_checksum":"required","num_threads":"8"}}"#,
        )
        .unwrap();
        match c.store {
            StoreConfig::S3(s3) => {
                assert!(s3.use_virtual_addressing);
                assert_eq!(s3.req_checksum, Some(ChecksumPolicy::Required));
            }
            _ => panic!("expected s3"),
        }
        let e = TierConfig::from_json(r#"{"store":{"type":"s3","bucket":"b","scheme":"ftp"}}"#)
            .unwrap_err();
        assert!(e.message.contains("scheme"));
        let e = TierConfig::from_json(r#"{"store":{"type":"s3","bucket":""}}"#).unwrap_err();
        assert!(e.message.contains("bucket"));
        let e = TierConfig::from_json(r#"{"store":{"type":"s3","bucket":"b","access_key":"x"}}"#)
            .unwrap_err();
        assert!(e.message.contains("together"));
    }

    #[test]
    fn s3_defaults_and_vllm_store_config_keys() {
        // A vLLM obj-tier store_config pasted as is (all strings, NIXL's num_threads).
        let c = TierConfig::from_json(
            r#"{"store":{"type":"s3","bucket":"kv","endpoint_override":"minio.local:9000","scheme":"http",
                "access_key":"AKIDEXAMPLE","secret_key":"s3cret-value","session_token":"","region":"",
                "ca_bundle":"","use_virtual_addressing":"false","req_checksum":"required","resp_checksum":"supported",
                "num_threads":"4"}}"#,
        )
        .unwrap();
        let StoreConfig::S3(s3) = c.store else {
            panic!("expected s3")
        };
        assert_eq!(s3.scheme.as_deref(), Some("http"));
        assert!(!s3.use_virtual_addressing);
        assert_eq!(s3.resp_checksum, Some(ChecksumPolicy::Supported));
        // Defaults of kvtier's own keys.
        let c = TierConfig::from_json(r#"{"store":{"type":"s3","bucket":"kv"}}"#).unwrap();
        let StoreConfig::S3(s3) = c.store else {
            panic!("expected s3")
        };
        assert_eq!(
            (s3.connect_timeout_ms, s3.request_timeout_ms, s3.max_retries),
            (5_000, 30_000, 5)
        );
        assert!(!s3.payload_signing && s3.allow_http && !s3.use_virtual_addressing);
        assert_eq!(
            s3.scheme, None,
            "no scheme: https unless endpoint_override carries one"
        );
    }

    #[test]
    fn azure_and_gcs_configs() {
        let c = TierConfig::from_json(
            r#"{"store":{"type":"azure","account":"devstoreaccount1","container":"kv","access_key":"a2V5LXNlY3JldC12YWx1ZQ==","endpoint":"http://127.0.0.1:10000/devstoreaccount1","max_retries":1}}"#,
        )
        .unwrap();
        let StoreConfig::Azure(azure) = &c.store else {
            panic!("expected azure")
        };
        assert_eq!(
            (
                azure.container.as_str(),
                azure.max_retries,
                azure.connect_timeout_ms
            ),
            ("kv", 1, 5_000)
        );
        assert!(
            !format!("{c:?}").contains("a2V5LXNlY3JldC12YWx1ZQ=="),
            "the key in Debug"
        );
        let c = TierConfig::from_json(
            r#"{"store":{"type":"gcs","bucket":"kv","service_account":"/x/sa.json"}}"#,
        )
        .unwrap();
        let StoreConfig::Gcs(gcs) = &c.store else {
            panic!("expected gcs")
        };
        assert_eq!(
            (
                gcs.bucket.as_str(),
                gcs.endpoint.as_str(),
                gcs.request_timeout_ms
            ),
            ("kv", "", 30_000)
        );

        let bad =
            |store: &str| TierConfig::from_json(&format!(r#"{{"store":{store}}}"#)).unwrap_err();
        for (store, names) in [
            (
                r#"{"type":"azure","account":"a","container":"c","bucket":"b"}"#,
                "bucket",
            ),
            (
                r#"{"type":"azure","account":"a","container":""}"#,
                "store.container",
            ),
            (
                r#"{"type":"azure","account":"","container":"c"}"#,
                "store.account",
            ),
            (r#"{"type":"azure","container":"c"}"#, "account"),
            (
                r#"{"type":"azure","account":"a","container":"c","endpoint":"127.0.0.1:10000"}"#,
                "store.endpoint",
            ),
            (
                r#"{"type":"azure","account":"a","container":"c","max_retries":101}"#,
                "store.max_retries",
            ),
            (
                r#"{"type":"gcs","bucket":"b","container":"c"}"#,
                "container",
            ),
            (r#"{"type":"gcs","bucket":""}"#, "store.bucket"),
            (
                r#"{"type":"gcs","bucket":"b","endpoint":"ftp://h"}"#,
                "store.endpoint",
            ),
            (
                r#"{"type":"gcs","bucket":"b","request_timeout_ms":0}"#,
                "store.request_timeout_ms",
            ),
        ] {
            let e = bad(store);
            assert_eq!(e.status, Status::Config, "{store}: {}", e.message);
            assert!(e.message.contains(names), "{store}: {}", e.message);
        }
        let e = bad(
            r#"{"type":"azure","account":"a","container":"c","access_key":"key-secret-1","sas":"sig=sas-secret-2"}"#,
        );
        assert!(
            e.message.contains("store.access_key and store.sas"),
            "{}",
            e.message
        );
        assert!(
            !e.message.contains("key-secret-1") && !e.message.contains("sas-secret-2"),
            "{}",
            e.message
        );
        let e = bad(
            r#"{"type":"azure","account":"a","container":"c","sas":"sig=sas-secret-3","colour":1}"#,
        );
        assert!(
            e.message.contains("colour") && !e.message.contains("sas-secret-3"),
            "{}",
            e.message
        );
    }

    #[test]
    fn s3_value_checks() {
        let bad = |store: &str| {
            TierConfig::from_json(&format!(
                r#"{{"store":{{"type":"s3","bucket":"b",{store}}}}}"#
            ))
            .unwrap_err()
        };
        let e = bad(r#""request_timeout_ms":0"#);
        assert!(e.message.contains("request_timeout_ms"), "{}", e.message);
        let e = bad(r#""connect_timeout_ms":0"#);
        assert!(e.message.contains("connect_timeout_ms"), "{}", e.message);
        let e = bad(r#""max_retries":1000"#);
        assert!(e.message.contains("max_retries"), "{}", e.message);
        let e = bad(r#""session_token":"tok-secret-123""#);
        assert!(
            e.message.contains("session_token") && !e.message.contains("tok-secret-123"),
            "{}",
            e.message
        );
        let e = bad(r#""use_virtual_addressing":true,"endpoint_override":"127.0.0.1:9000""#);
        assert!(e.message.contains("DNS name"), "{}", e.message);
        let e = bad(r#""use_virtual_addressing":"yes","endpoint_override":"http://10.0.0.1""#);
        assert!(e.message.contains("DNS name"), "{}", e.message);
        assert!(TierConfig::from_json(
            r#"{"store":{"type":"s3","bucket":"b","use_virtual_addressing":true,"endpoint_override":"https://s3.example.com:9000"}}"#
        )
        .is_ok());
        let e = bad(r#""payload_signing":"maybe""#);
        assert!(e.message.contains("boolean"), "{}", e.message);
    }
}
