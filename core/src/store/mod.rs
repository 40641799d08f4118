//! Stores: where blocks live. Every backend is an `object_store::ObjectStore` client; a
//! [`Store`] adds what kvtier knows about it (how to describe it, its direct HTTP path,
//! where its checksums are recorded) and offers the block operations the engine uses:
//! write (`write.rs`), read into a block (`read.rs`), exists, and the start-up probe (here),
//! and whole-object operations (`objects.rs`).
//!
//! Data flows one way: the engine calls a `Store`; a `Store` never calls the engine.
//!
//! The Rust API of this module speaks `object_store`'s types on purpose: object names are
//! its [`Path`](object_store::path::Path), and [`Store::client`] is its client, for the
//! operations kvtier does not wrap (tests write objects out of band through it). So that a
//! Rust user never meets two versions of that crate, it is re-exported here as
//! [`kvtier::store::object_store`](object_store); a major version of `object_store` is a
//! major version of kvtier's Rust API. The C ABI and the Python package expose none of it.

mod answer;
mod azure;
mod budget;
mod classify;
mod credentials;
pub(crate) mod direct;
mod gcs;
mod http_options;
mod link;
mod local;
mod multipart;
mod objects;
mod probe;
mod read;
mod s3;
mod write;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, GetResultPayload, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload,
};

use crate::config::StoreConfig;
use crate::error::{Error, Result, Status};
use crate::integrity;
use crate::memory::{BlockMemory, BlockSlot, OwnedBuffer};

pub use ::object_store;
pub use classify::error_chain;
pub(crate) use classify::{answered, classify, op_error, Failed};
pub use credentials::CredentialSource;
pub(crate) use link::Lane;
pub use link::{Direction as LinkDirection, DirectionReport, LinkReport, Mode as LinkMode};
pub(crate) use local::ExistenceChecks;
pub use objects::{ObjectCheck, ObjectInfo};
pub use probe::ProbeOutcome;
pub(crate) use read::ReadBlock;
pub(crate) use write::WriteOutcome;
// The naming rules are the key layout's; the store and its users meet them here too.
pub use crate::key::{object_path, ObjectKind, PROBE_SEGMENT, TEMPORARY_START};

use crate::config::Endpoint;
use direct::{DirectError, DirectHttp};

/// An `object_store` client.
pub type DynStore = Arc<dyn ObjectStore>;

/// What kind of store a [`Store`] talks to, where that changes how blocks are handled.
enum Backend {
    /// A local directory, read and written by the store's own file code.
    Local { files: Arc<local::LocalFiles> },
    /// Process memory: the store keeps the PUT body itself, so it gets a copy, never a
    /// view of caller memory.
    Memory,
    /// An S3-compatible server.
    S3 {
        ca_bundle: String,
        credentials: CredentialSource,
        /// PUTs carry `x-amz-checksum-crc64nvme` (unless `req_checksum: "required"`).
        upload_checksum: bool,
        /// Objects of two parts or more of this size are stored as multipart uploads;
        /// 0: never; `None`: the link decides ([`link`]).
        store_part_bytes: Option<usize>,
    },
    /// Azure Blob Storage: metadata names are C# identifiers, so the checksum is recorded
    /// as `kvtier_crc32c`.
    Azure {
        ca_bundle: String,
        credentials: &'static str,
    },
    /// Google Cloud Storage.
    Gcs {
        ca_bundle: String,
        credentials: String,
        bucket_check: Arc<gcs::BucketCheck>,
    },
}

/// A store as a tier (or the command line) uses it.
pub struct Store {
    client: DynStore,
    backend: Backend,
    /// The zero-copy GET/HEAD path of plain-http S3 endpoints, if any.
    direct: Option<Arc<DirectHttp>>,
    describe: String,
    /// Where requests go: `None` for the local and memory stores, and for AWS itself (whose
    /// endpoint the client derives from the region).
    endpoint: Option<Endpoint>,
    /// How requests are repeated: for how long, and how many times at most.
    retry: budget::RetryPolicy,
    direct_requests: AtomicU64,
    direct_fallbacks: AtomicU64,
    /// PUTs the server refused because the body it received failed the request's checksum.
    damaged_uploads: AtomicU64,
    /// Requests the HTTP client repeated (none for the local and memory stores).
    retries: Option<Arc<http_options::RetryLedger>>,
    /// The store refused a whole batch delete (a server without DeleteObjects): later
    /// deletes of many objects go one at a time.
    batch_delete_refused: AtomicBool,
    /// The store refused a multipart upload as something it does not do: later large
    /// objects go up as one PUT each.
    multipart_refused: AtomicBool,
    /// The link as this client's transfers measure it: how they go (in parts or whole).
    link: link::Link,
}

/// Counters of the direct HTTP path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DirectCounts {
    pub(crate) requests: u64,
    pub(crate) fallbacks: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client by its Display: its Debug may show credentials (an Azure SAS token).
        f.debug_struct("Store")
            .field("describe", &self.describe)
            .field("client", &format_args!("{}", self.client))
            .finish()
    }
}

impl Store {
    /// Builds the store a configuration describes. Does no I/O except creating a local
    /// root and reading the AWS shared credentials/config files or a GCS service-account
    /// file. Must be called inside the tokio runtime that will run its requests (an HTTP
    /// client's connections belong to the runtime that opens them).
    pub fn open(config: &StoreConfig) -> Result<Store> {
        let none = budget::RetryPolicy::NONE;
        let (client, backend, direct, retry, retries, endpoint) = match config {
            StoreConfig::Local(local) => {
                let (client, files) = local::open(local)?;
                (client, Backend::Local { files }, None, none, None, None)
            }
            StoreConfig::Memory(_) => (
                Arc::new(InMemory::new()) as DynStore,
                Backend::Memory,
                None,
                none,
                None,
                None,
            ),
            StoreConfig::S3(config) => {
                let endpoint = config.endpoint()?;
                let built = s3::open(config, endpoint.as_ref())?;
                let backend = Backend::S3 {
                    ca_bundle: config.ca_bundle.clone(),
                    credentials: built.credentials,
                    upload_checksum: s3::sends_upload_checksum(config),
                    store_part_bytes: config
                        .store_part_bytes
                        .map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
                };
                let retries = Some(built.retries);
                (
                    built.client,
                    backend,
                    built.direct,
                    http_options::retry_policy(config.client_settings()),
                    retries,
                    endpoint,
                )
            }
            StoreConfig::Azure(config) => {
                let endpoint = config.account_endpoint()?;
                let backend = Backend::Azure {
                    ca_bundle: config.ca_bundle.clone(),
                    credentials: azure::credential_source(config),
                };
                let (client, retries) = azure::open(config, &endpoint)?;
                let retries = Some(retries);
                let retry = http_options::retry_policy(config.client_settings());
                (client, backend, None, retry, retries, Some(endpoint))
            }
            StoreConfig::Gcs(config) => {
                let endpoint = gcs::base_endpoint(config)?;
                let built = gcs::open(config, &endpoint)?;
                let backend = Backend::Gcs {
                    ca_bundle: config.ca_bundle.clone(),
                    credentials: gcs::credential_source(config),
                    bucket_check: built.bucket_check,
                };
                let retries = Some(built.retries);
                let retry = http_options::retry_policy(config.client_settings());
                (built.client, backend, None, retry, retries, Some(endpoint))
            }
        };
        Ok(Store {
            client,
            backend,
            direct,
            describe: describe(config, endpoint.as_ref()),
            endpoint,
            retry,
            direct_requests: AtomicU64::new(0),
            direct_fallbacks: AtomicU64::new(0),
            damaged_uploads: AtomicU64::new(0),
            retries,
            batch_delete_refused: AtomicBool::new(false),
            multipart_refused: AtomicBool::new(false),
            link: link::Link::default(),
        })
    }

    /// The `object_store` client, for operations kvtier does not wrap.
    pub fn client(&self) -> &DynStore {
        &self.client
    }

    /// The store in words, for messages: "s3 bucket \"kv\" at http://…".
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Whether requests to the store go over TLS: an https endpoint, or AWS itself.
    pub fn uses_tls(&self) -> bool {
        match (&self.backend, &self.endpoint) {
            (Backend::Local { .. } | Backend::Memory, _) => false,
            (_, Some(endpoint)) => endpoint.tls(),
            (_, None) => true,
        }
    }

    /// The link as this client's transfers measured it, and how it sends them (in parts or
    /// whole): see the `link` room.
    pub fn link(&self) -> LinkReport {
        self.link.report()
    }

    pub(crate) fn direct_counts(&self) -> DirectCounts {
        DirectCounts {
            requests: self.direct_requests.load(Ordering::Relaxed),
            fallbacks: self.direct_fallbacks.load(Ordering::Relaxed),
        }
    }

    /// PUTs the server refused as damaged in transit (each sent again within the retry
    /// budget).
    pub(crate) fn damaged_uploads(&self) -> u64 {
        self.damaged_uploads.load(Ordering::Relaxed)
    }

    /// Requests the store's HTTP client sent again after a 5xx or 429 answer or a
    /// transport error.
    pub(crate) fn retries(&self) -> u64 {
        self.retries.as_ref().map_or(0, |ledger| ledger.retries())
    }

    /// Existence checks of one lookup batch, made on the calling thread, for a store whose
    /// check is a system call of microseconds (the local store's `stat`); `None` for the
    /// others, which are asked with [`exists`](Self::exists).
    pub(crate) fn checks_in_place(&self) -> Option<ExistenceChecks<'_>> {
        match &self.backend {
            Backend::Local { files } => Some(files.existence_checks()),
            _ => None,
        }
    }

    /// The fence the store's own blocking threads enter to read or write caller memory
    /// (the local store's), which the tier closes at shutdown; `None` when the store has
    /// no such threads.
    pub(crate) fn caller_memory_fence(&self) -> Option<Arc<crate::memory::CallerMemoryFence>> {
        match &self.backend {
            Backend::Local { files } => Some(files.caller_memory_fence()),
            _ => None,
        }
    }

    /// Whether `path` exists. "Not found" is `false`; a 403 is `false` only when
    /// `missing_is_forbidden` (the principal lacks ListBucket, so S3 answers 403 for
    /// missing keys); anything else is an error. Plain-http S3 endpoints are asked on the
    /// direct path first; anything unexpected there is asked again through the client.
    pub async fn exists(&self, path: &Path, missing_is_forbidden: bool) -> Result<bool> {
        if let Backend::Local { files } = &self.backend {
            return files.exists(path.as_ref());
        }
        budget::within(
            self.retry.budget,
            self.exists_remotely(path, missing_is_forbidden),
        )
        .await
    }

    /// [`Store::exists`] answering a lookup: its repeats end within
    /// [`budget::LOOKUP_RETRY_BUDGET`] (the lookup answers MISS after that).
    pub(crate) async fn exists_for_lookup(
        &self,
        path: &Path,
        missing_is_forbidden: bool,
    ) -> Result<bool> {
        budget::within(
            budget::LOOKUP_RETRY_BUDGET,
            self.exists(path, missing_is_forbidden),
        )
        .await
    }

    async fn exists_remotely(&self, path: &Path, missing_is_forbidden: bool) -> Result<bool> {
        if let Some(direct) = &self.direct {
            self.direct_requests.fetch_add(1, Ordering::Relaxed);
            match direct.exists(path.as_ref(), missing_is_forbidden).await {
                Ok(found) => return Ok(found),
                Err(e) => {
                    self.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
                    log::debug!("existence check {path}: direct HEAD failed ({e:?}); repeating it through the store client");
                }
            }
        }
        match answered(self.client.head(path)).await {
            Ok(_) => Ok(true),
            Err(e) => match classify(&e) {
                Status::NotFound => Ok(false),
                Status::PermissionDenied if missing_is_forbidden => Ok(false),
                _ => Err(op_error("exists", path, &e)),
            },
        }
    }

    /// Looks up a key that never exists, and fails with advice a user can act on if the
    /// store is unreachable, refuses the credentials or lacks the bucket. See
    /// [`probe::probe`].
    pub async fn probe(&self, probe_name: &str) -> Result<ProbeOutcome> {
        if let Backend::Local { files } = &self.backend {
            local::check_writable(files.root())?;
        }
        budget::within(
            budget::START_UP_RETRY_BUDGET,
            probe::probe(self, probe_name),
        )
        .await
    }

    /// Whether the store refuses a second create of one object (conditional PUT), asked
    /// with an object named after `probe_name`.
    pub async fn honours_conditional_put(&self, probe_name: &str) -> bool {
        let check = probe::honours_conditional_put(self, probe_name);
        budget::within(budget::START_UP_RETRY_BUDGET, check).await
    }

    /// Whether the store refuses an upload whose body was damaged on the way, asked with
    /// an object named after `probe_name`: see [`UploadCheck`].
    pub async fn checks_uploads(&self, probe_name: &str) -> UploadCheck {
        match self.backend {
            Backend::Local { .. } | Backend::Memory => UploadCheck::NoNetwork,
            _ => {
                let check = probe::checks_uploads(self, probe_name);
                budget::within(budget::START_UP_RETRY_BUDGET, check).await
            }
        }
    }
}

/// Whether a store refuses an upload whose body was damaged between the tier and the
/// server (a flipped bit past TCP's checksum, a bad middlebox or NIC).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UploadCheck {
    /// The server verified the request's checksum (or signed payload hash) and refused the
    /// probe's damaged body: such an upload is sent again, never stored.
    Verified,
    /// The server stored the probe's damaged body: a block damaged in transit is stored,
    /// and found only by a later load's CRC32C check (which fails the key and reads MISS).
    NotVerified,
    /// The local directory and the in-memory store: no network between tier and store.
    NoNetwork,
    /// The server refuses PUTs that carry the checksum header (it does not know
    /// `x-amz-checksum-crc64nvme`): no block could be stored. The text is its answer.
    HeaderRefused(String),
}

/// The store in words: its kind, its bucket or container, and where it is. The one
/// definition of a store's printable location.
fn describe(config: &StoreConfig, endpoint: Option<&Endpoint>) -> String {
    let at = || endpoint.map_or_else(|| "AWS".to_string(), Endpoint::url);
    match config {
        StoreConfig::Local(l) => format!("local directory {}", l.path.display()),
        StoreConfig::Memory(_) => "in-memory store".to_string(),
        StoreConfig::S3(s3) => format!("s3 bucket {:?} at {}", s3.bucket, at()),
        StoreConfig::Azure(azure) => format!("azure container {:?} at {}", azure.container, at()),
        StoreConfig::Gcs(gcs) => format!("gcs bucket {:?} at {}", gcs.bucket, at()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tls_is_used_by_aws_https_and_https_urls() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = runtime.enter();
        let store = |json: serde_json::Value| {
            let config: crate::config::StoreConfig = serde_json::from_value(json).unwrap();
            super::Store::open(&config).unwrap()
        };
        let s3 = |extra: serde_json::Value| {
            let mut json = serde_json::json!({"type": "s3", "bucket": "b", "access_key": "k",
                "secret_key": "s", "region": "us-east-1", "allow_http": true});
            json.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            store(json)
        };
        use serde_json::json;
        let aws = s3(json!({}));
        assert!(aws.uses_tls());
        assert_eq!(aws.describe(), "s3 bucket \"b\" at AWS");
        assert!(s3(json!({"endpoint_override": "h:9000"})).uses_tls());
        let plain = s3(json!({"endpoint_override": "h:9000", "scheme": "http"}));
        assert!(!plain.uses_tls());
        assert_eq!(plain.describe(), "s3 bucket \"b\" at http://h:9000");
        assert!(!s3(json!({"endpoint_override": "http://h:9000", "scheme": "https"})).uses_tls());
        assert!(s3(json!({"endpoint_override": "HTTPS://h"})).uses_tls());
        let azurite = store(json!({"type": "azure", "account": "a", "container": "c",
            "access_key": "a2V5", "endpoint": "http://127.0.0.1:10000/a/"}));
        assert!(!azurite.uses_tls());
        assert_eq!(
            azurite.describe(),
            "azure container \"c\" at http://127.0.0.1:10000/a"
        );
        let azure =
            store(json!({"type": "azure", "account": "a", "container": "c", "access_key": "a2V5"}));
        assert!(azure.uses_tls());
        let gcs = store(json!({"type": "gcs", "bucket": "g", "endpoint": "http://127.0.0.1:4443"}));
        assert!(!gcs.uses_tls());
        assert_eq!(gcs.describe(), "gcs bucket \"g\" at http://127.0.0.1:4443");
        let local = store(json!({"type": "local", "path": std::env::temp_dir()}));
        assert!(!local.uses_tls());
    }
}
