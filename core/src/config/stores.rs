//! The stores' keys: the local directory, memory, S3 and S3-compatible servers, Azure
//! Blob and GCS, each parsed so that an error names the key's path, and the checks that
//! span keys (endpoints, timeouts, parts).

use super::*;

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

/// Declares a store's settings struct with the keys every HTTP store's client takes (S3,
/// Azure Blob, GCS): written once here, with their defaults and docs, rather than in each
/// struct. (A flattened struct would say it once too, but serde cannot flatten into a
/// struct that refuses unknown keys, and unknown keys must be errors that name the key.)
/// The published schema lists keys by name, so where they are declared does not show.
macro_rules! with_client_settings {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $($(#[$field_attr:meta])* pub $field:ident: $type:ty,)*
        }
    ) => {
        $(#[$attr])*
        pub struct $name {
            $($(#[$field_attr])* pub $field: $type,)*
            /// PEM file of extra trusted CA certificates.
            #[serde(default)]
            pub ca_bundle: String,
            /// Milliseconds a connection may take to open.
            #[serde(default = "default_connect_timeout_ms")]
            pub connect_timeout_ms: u64,
            /// Milliseconds one request may take, its body included.
            #[serde(default = "default_request_timeout_ms")]
            pub request_timeout_ms: u64,
            /// Milliseconds one operation (a block's load, store or existence check, a listing,
            /// a delete) may go on repeating its requests after 5xx answers, throttling,
            /// timeouts, refused connections and resets, counted from its first attempt: long
            /// enough to ride out a rolling restart of a gateway. Repeats back off
            /// exponentially with jitter, from 50 ms up to 1 s, so a server that comes back is
            /// found within a second. An attempt under way when the budget runs out (or begun
            /// after a backoff that straddled its end, so at most a second past it) finishes,
            /// within `request_timeout_ms`, and its failure is the operation's. 0: no repeats. Existence checks answering lookups, and the checks a tier makes of its
            /// store as it starts, repeat for at most 2000 ms of it.
            #[serde(default = "default_retry_budget_ms")]
            pub retry_budget_ms: u64,
            /// At most this many repeats of one request, within `retry_budget_ms`. Unset
            /// (the default): as many as the budget allows. 0: none.
            #[serde(default)]
            pub max_retries: Option<usize>,
        }

        impl $name {
            /// The client settings, as the store's HTTP client takes them.
            pub(crate) fn client_settings(&self) -> ClientSettings<'_> {
                ClientSettings {
                    ca_bundle: &self.ca_bundle,
                    connect_timeout_ms: self.connect_timeout_ms,
                    request_timeout_ms: self.request_timeout_ms,
                    retry_budget_ms: self.retry_budget_ms,
                    max_retries: self.max_retries,
                }
            }
        }
    };
}

/// The settings of an HTTP store's client, the same keys for S3, Azure Blob and GCS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientSettings<'a> {
    pub(crate) ca_bundle: &'a str,
    pub(crate) connect_timeout_ms: u64,
    pub(crate) request_timeout_ms: u64,
    pub(crate) retry_budget_ms: u64,
    pub(crate) max_retries: Option<usize>,
}

with_client_settings! {
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
    /// (one copy less per request, and less CPU). Unexpected answers are repeated
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
    /// block. Left out (the default), the tier decides from the link it measures: parts of
    /// any object of 512 KiB or more where one connection cannot fill the link (a remote
    /// store's per-connection cap or round trip), as many as `max_inflight_transfers` leaves
    /// to each transfer in flight, none where more connections carry no more (a nearby
    /// store, whose limit is the CPU); until it has measured, 8 MiB parts. A number fixes
    /// the size: parts are then used while a quarter of `max_inflight_transfers` or fewer
    /// are in flight. 0: one GET per object.
    #[serde(default)]
    #[schemars(example = 8_388_608_u64)]
    pub load_part_bytes: Option<u64>,
    /// A store of an object of at least twice this many bytes uploads it as a multipart
    /// upload of parts this size (the last one takes the remainder, so no part is small),
    /// all parts in flight at once on connections of their own, each sent straight from
    /// the block. With `dedup: "conditional"` such a store asks first whether the object is
    /// there (a multipart completion is not conditional: two tiers storing the same new
    /// block at once may both upload it). Left out (the default), the tier decides from the
    /// link it measures, as for loads: parts where one connection cannot fill the link and
    /// they save a tenth of the transfer's time (a multipart upload costs two requests
    /// more); an object under 10 MiB always goes as one PUT (S3's parts are 5 MiB at
    /// least, but the last); until it has measured, 16 MiB parts. A number fixes the size:
    /// parts are then used while a quarter of `max_inflight_transfers` or fewer are in
    /// flight. At least 5 MiB, S3's smallest part. 0: one PUT per object.
    #[serde(default)]
    #[schemars(example = 16_777_216_u64)]
    pub store_part_bytes: Option<u64>,
}
}

fn default_connect_timeout_ms() -> u64 {
    5_000
}

fn default_request_timeout_ms() -> u64 {
    30_000
}

/// Rolling restarts of MinIO, Ceph RGW or a load balancer take seconds per node.
fn default_retry_budget_ms() -> u64 {
    20_000
}

/// The longest `retry_budget_ms`: requests are repeated without renewing their signature,
/// which S3 accepts for 15 minutes, and temporary credentials may expire sooner.
pub(crate) const MAX_RETRY_BUDGET_MS: u64 = 300_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ChecksumPolicy {
    Required,
    Supported,
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

/// The store object (`type` and that type's keys), with errors naming `store.<key>`.
pub(super) fn parse_store(value: serde_json::Value) -> Result<StoreConfig> {
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

with_client_settings! {
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
}
}

with_client_settings! {
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
}
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
        self.client_settings().check()?;
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
        self.client_settings().check()?;
        if !self.endpoint.is_empty() {
            full_url("endpoint", &self.endpoint)?;
        }
        Ok(())
    }
}

impl ClientSettings<'_> {
    /// Timeouts of at least a millisecond, a retry budget of at most five minutes, at most
    /// 100 retries.
    fn check(&self) -> Result<()> {
        for (name, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("request_timeout_ms", self.request_timeout_ms),
        ] {
            if value == 0 {
                return Err(Error::config(format!(
                    "store.{name} is 0; it must be at least 1 (milliseconds)"
                )));
            }
        }
        if self.retry_budget_ms > MAX_RETRY_BUDGET_MS {
            return Err(Error::config(format!(
                "store.retry_budget_ms is {}; it must be 0..={MAX_RETRY_BUDGET_MS} (milliseconds)",
                self.retry_budget_ms
            )));
        }
        if let Some(count) = self.max_retries.filter(|&count| count > 100) {
            return Err(Error::config(format!(
                "store.max_retries is {count}; it must be 0..=100, or left out to let \
                 store.retry_budget_ms alone bound retries"
            )));
        }
        Ok(())
    }
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
        self.client_settings().check()?;
        if let Some(bytes @ 1..MIN_LOAD_PART_BYTES) = self.load_part_bytes {
            return Err(Error::config(format!(
                "store.load_part_bytes is {bytes}; it must be 0 (one GET per object) or at least {MIN_LOAD_PART_BYTES} (or left out: decided from the link)"
            )));
        }
        if let Some(bytes @ 1..MIN_STORE_PART_BYTES) = self.store_part_bytes {
            return Err(Error::config(format!(
                "store.store_part_bytes is {bytes}; it must be 0 (one PUT per object) or at least {MIN_STORE_PART_BYTES} (S3's smallest part; or left out: decided from the link)"
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
