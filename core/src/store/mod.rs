//! Stores: where blocks live. Every backend is an `object_store::ObjectStore` client; a
//! [`Store`] adds what kvtier knows about it (how to describe it, its direct HTTP path,
//! where its checksums are recorded) and offers the block operations the engine uses:
//! write, read into a block, exists, delete, and the start-up probe.
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
mod classify;
mod credentials;
pub(crate) mod direct;
mod gcs;
mod http_options;
mod local;
mod multipart;
mod probe;
mod s3;

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
pub(crate) use local::ExistenceChecks;
pub use probe::ProbeOutcome;
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
        /// 0: never.
        store_part_bytes: usize,
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
    /// Retries (after the first attempt) of one request.
    max_retries: usize,
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
}

/// What a block write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    Stored,
    /// A conditional create found the object in the store already.
    AlreadyStored,
}

/// The checksums of a body on its way up.
#[derive(Debug, Clone, Copy, Default)]
struct BodyChecksums {
    /// The CRC32C recorded with the object (when checksums are on).
    recorded: Option<u32>,
    /// Its CRC64NVME for `x-amz-checksum-crc64nvme`, when computed in the same pass.
    upload: Option<u64>,
}

/// What a block read found, beside the bytes now in the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadBlock {
    /// The checksum recorded with the object, if any.
    pub(crate) recorded: Option<u32>,
    /// The checksum of the bytes read, when asked for.
    pub(crate) computed: Option<u32>,
}

/// What [`Store::check_object`] read: an object's length and checksums, as a load sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectCheck {
    /// Bytes read.
    pub bytes: u64,
    /// The checksum recorded with the object (object metadata, or the local store's
    /// extended attribute), if any.
    pub recorded: Option<u32>,
    /// The checksum of the bytes read.
    pub computed: u32,
}

impl ObjectCheck {
    /// Whether the bytes read disagree with the recorded checksum.
    pub fn checksum_mismatch(&self) -> bool {
        self.recorded.is_some_and(|r| r != self.computed)
    }
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
        let (client, backend, direct, max_retries, retries, endpoint) = match config {
            StoreConfig::Local(local) => {
                let (client, files) = local::open(local)?;
                (client, Backend::Local { files }, None, 0, None, None)
            }
            StoreConfig::Memory(_) => (
                Arc::new(InMemory::new()) as DynStore,
                Backend::Memory,
                None,
                0,
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
                    store_part_bytes: usize::try_from(config.store_part_bytes)
                        .unwrap_or(usize::MAX),
                };
                let retries = Some(built.retries);
                (
                    built.client,
                    backend,
                    built.direct,
                    config.max_retries,
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
                let max_retries = config.max_retries;
                (client, backend, None, max_retries, retries, Some(endpoint))
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
                let max_retries = config.max_retries;
                (
                    built.client,
                    backend,
                    None,
                    max_retries,
                    retries,
                    Some(endpoint),
                )
            }
        };
        Ok(Store {
            client,
            backend,
            direct,
            describe: describe(config, endpoint.as_ref()),
            endpoint,
            max_retries,
            direct_requests: AtomicU64::new(0),
            direct_fallbacks: AtomicU64::new(0),
            damaged_uploads: AtomicU64::new(0),
            retries,
            batch_delete_refused: AtomicBool::new(false),
            multipart_refused: AtomicBool::new(false),
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

    pub(crate) fn direct_counts(&self) -> DirectCounts {
        DirectCounts {
            requests: self.direct_requests.load(Ordering::Relaxed),
            fallbacks: self.direct_fallbacks.load(Ordering::Relaxed),
        }
    }

    /// PUTs the server refused as damaged in transit (each sent again, up to
    /// `max_retries` times).
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

    /// Whether `path` exists. "Not found" is `false`; a 403 is `false` only when
    /// `missing_is_forbidden` (the principal lacks ListBucket, so S3 answers 403 for
    /// missing keys); anything else is an error. Plain-http S3 endpoints are asked on the
    /// direct path first; anything unexpected there is asked again through the client.
    pub async fn exists(&self, path: &Path, missing_is_forbidden: bool) -> Result<bool> {
        if let Backend::Local { files } = &self.backend {
            return files.exists(path.as_ref());
        }
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

    /// Writes one block. With `checksum`, its CRC32C is recorded beside the bytes and
    /// returned (the local store computes it piece by piece as it writes, on its file I/O
    /// thread; the others before the upload); `create` asks the store to refuse the write
    /// if the object exists (conditional PUT), which then answers [`Written::AlreadyStored`].
    /// `parts` lets a large object go up as a multipart upload (`store_part_bytes`).
    pub(crate) async fn write_block(
        &self,
        path: &Path,
        body: PutPayload,
        checksum: bool,
        create: bool,
        parts: bool,
    ) -> Result<(Written, Option<u32>)> {
        if let Backend::Local { files } = &self.backend {
            let (files, name) = (files.clone(), path.to_string());
            return tokio::task::spawn_blocking(move || {
                files.write(&name, &body, checksum, create)
            })
            .await
            .map_err(|e| Error::join(&format!("store {path}"), &e))?;
        }
        // The upload checksum a direct PUT sends is computed here with the block's own, in
        // the same pass over its bytes; the general client computes its own.
        let checksums = if checksum {
            let direct_put = self.puts_direct(body.content_length(), parts);
            let (crc, upload) = integrity::body_checksums(body.iter().map(|b| &b[..]), direct_put);
            BodyChecksums {
                recorded: Some(crc),
                upload,
            }
        } else {
            BodyChecksums::default()
        };
        self.put_object(path, body, checksums, create, parts)
            .await
            .map(|written| (written, checksums.recorded))
    }

    /// Whether PUTs carry `x-amz-checksum-crc64nvme` (an S3 store, unless
    /// `req_checksum: "required"`).
    pub(super) fn sends_upload_checksum(&self) -> bool {
        matches!(
            self.backend,
            Backend::S3 {
                upload_checksum: true,
                ..
            }
        )
    }

    /// Whether a body of `len` bytes goes first as one PUT on the direct path, with an
    /// upload checksum.
    fn puts_direct(&self, len: usize, parts: bool) -> bool {
        self.sends_upload_checksum()
            && self.direct.as_ref().is_some_and(|direct| direct.puts())
            && self.part_bytes(len, parts).is_none()
    }

    /// The bytes of each part when a body of `len` bytes is uploaded in parts (an S3 store,
    /// parts allowed for the transfer, two parts or more, and the store has not refused
    /// multipart uploads); `None` for one PUT.
    fn part_bytes(&self, len: usize, parts: bool) -> Option<usize> {
        match self.backend {
            Backend::S3 {
                store_part_bytes, ..
            } if parts
                && multipart::part_count(len, store_part_bytes) >= 2
                && !self.multipart_refused.load(Ordering::Relaxed) =>
            {
                Some(store_part_bytes)
            }
            _ => None,
        }
    }

    async fn put_object(
        &self,
        path: &Path,
        body: PutPayload,
        checksums: BodyChecksums,
        create: bool,
        parts: bool,
    ) -> Result<Written> {
        let attributes = match (checksums.recorded, &self.backend) {
            (None, _) => Default::default(),
            (Some(crc), Backend::Azure { .. }) => {
                integrity::checksum_attributes_named(crc, integrity::CRC_METADATA_AZURE)
            }
            (Some(crc), _) => integrity::checksum_attributes(crc),
        };
        let body = match self.backend {
            // The in-memory store keeps the body past the job: a copy, never a view of
            // caller memory.
            Backend::Memory => {
                let mut copy = Vec::with_capacity(body.content_length());
                body.iter().for_each(|piece| copy.extend_from_slice(piece));
                PutPayload::from(copy)
            }
            _ => body,
        };
        if let Some(part_len) = self.part_bytes(body.content_length(), parts) {
            let in_parts = self
                .put_in_parts(path, &body, &attributes, create, part_len)
                .await;
            if let Some(written) = in_parts {
                return written;
            }
        }
        let mode = if create {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        // Each attempt sets its own mode (a repeat of a damaged body overwrites).
        let options = PutOptions {
            attributes,
            ..Default::default()
        };
        // A body the server refused as damaged in transit, and a conditional PUT cut short by
        // a timeout or a reset, are repeated here: object_store repeats neither (a 400, and
        // a PUT it deems not idempotent); a repeat that finds the object is a 412. The first
        // attempt goes on the direct path where there is one.
        let mut first = true;
        let stored = classify::repeat_refused_uploads(
            &self.client,
            path,
            mode,
            self.max_retries,
            &self.damaged_uploads,
            |mode| {
                let options = PutOptions {
                    mode,
                    ..options.clone()
                };
                let direct_first = std::mem::take(&mut first);
                let body = &body;
                async move {
                    if direct_first {
                        if let Some(answered) =
                            self.put_direct(path, body, checksums, &options.mode).await
                        {
                            return answered;
                        }
                    }
                    answered(self.client.put_opts(path, body.clone(), options)).await
                }
            },
        )
        .await;
        match stored {
            Ok(_) => Ok(Written::Stored),
            Err(e) if create && classify::found_by_create(&e) => Ok(Written::AlreadyStored),
            Err(e) => Err(op_error("store", path, &e)),
        }
    }

    /// The first attempt of a single PUT, on the direct path of an S3 store that has one:
    /// the store's answer as the general client's would be read, or `None` (no direct path,
    /// or no answer, or one that `object_store` should retry itself) to send it through the
    /// client.
    async fn put_direct(
        &self,
        path: &Path,
        body: &PutPayload,
        checksums: BodyChecksums,
        mode: &PutMode,
    ) -> Option<std::result::Result<object_store::PutResult, Failed>> {
        let (
            Some(direct),
            Backend::S3 {
                upload_checksum, ..
            },
        ) = (&self.direct, &self.backend)
        else {
            return None;
        };
        if !direct.puts() {
            return None;
        }
        let create = matches!(mode, PutMode::Create);
        self.direct_requests.fetch_add(1, Ordering::Relaxed);
        let put = direct::PutRequest {
            body,
            recorded_crc: checksums.recorded,
            // Computed with the block's checksum where it was; else here.
            upload_checksum: upload_checksum.then(|| {
                checksums
                    .upload
                    .unwrap_or_else(|| integrity::upload_checksum(body.iter().map(|b| &b[..])))
            }),
            create,
        };
        let outcome = match direct.put_from(path.as_ref(), put).await {
            Ok(answer) => classify::direct_put_answer(path, answer, create),
            Err(e) => {
                log::debug!("store {path}: direct PUT failed ({e:?}); repeating it through the store client");
                None
            }
        };
        if outcome.is_none() {
            self.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// [`Store::put_object`] of a body of two parts or more: one multipart upload, its
    /// parts all in flight at once. `object_store` completes a multipart upload without a
    /// condition, so a `create` asks first whether the object is there (two tiers storing
    /// the same new block at the same moment may then both upload it: the same bytes,
    /// written twice). `None`: the store does not do multipart uploads (told once; the
    /// caller sends one PUT, as it will for every large object from now on).
    async fn put_in_parts(
        &self,
        path: &Path,
        body: &PutPayload,
        attributes: &object_store::Attributes,
        create: bool,
        part_len: usize,
    ) -> Option<Result<Written>> {
        if create {
            match self.exists(path, false).await {
                Ok(true) => return Some(Ok(Written::AlreadyStored)),
                Ok(false) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        let parts = multipart::split(body, part_len);
        let uploaded = classify::repeat_refused_uploads(
            &self.client,
            path,
            PutMode::Overwrite,
            self.max_retries,
            &self.damaged_uploads,
            |_| multipart::upload(&self.client, path, &parts, attributes),
        )
        .await;
        match uploaded {
            Ok(_) => Some(Ok(Written::Stored)),
            Err(e) if multipart::refused_as_unsupported(&e) => {
                if !self.multipart_refused.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "{}: the store does not take multipart uploads ({}); objects of two \
                         store.store_part_bytes or more go up as one PUT each (set it to 0 to \
                         say so)",
                        self.describe,
                        e.chain()
                    );
                }
                None
            }
            Err(e) => Some(Err(op_error("store", path, &e))),
        }
    }

    /// Reads the object at `path` into `slot`, which it must fill exactly. `checksum`
    /// computes the CRC32C of the bytes read; `allow_direct` lets a plain-http S3 endpoint
    /// answer on the direct path (falling back to the client on anything unexpected);
    /// `parts` lets the direct path read a large object as ranged parts (`load_part_bytes`).
    /// On error the slot may hold partial data.
    pub(crate) async fn read_block(
        &self,
        path: &Path,
        slot: &mut BlockSlot,
        checksum: bool,
        allow_direct: bool,
        parts: bool,
    ) -> Result<ReadBlock> {
        if let Backend::Local { files } = &self.backend {
            let (files, name, mut dest) = (files.clone(), path.to_string(), slot.reborrow());
            // The slot is used by the blocking task alone until it is awaited here.
            return tokio::task::spawn_blocking(move || files.read(&name, &mut dest, checksum))
                .await
                .map_err(|e| Error::join(&format!("load {path}"), &e))?;
        }
        if let (Some(direct), true) = (&self.direct, allow_direct) {
            self.direct_requests.fetch_add(1, Ordering::Relaxed);
            let block_bytes = slot.len();
            match direct.get_into(path.as_ref(), slot, checksum, parts).await {
                Ok((recorded, computed)) => {
                    return Ok(ReadBlock {
                        recorded,
                        computed: checksum.then_some(computed),
                    })
                }
                Err(DirectError::Final(status, detail)) => {
                    return Err(Error::new(status, format!("load {path}: {detail}")))
                }
                Err(DirectError::WrongLength(size)) => {
                    return Err(length_mismatch(path, size, block_bytes))
                }
                Err(DirectError::Fallback(why)) => {
                    self.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
                    log::debug!("load {path}: direct GET failed ({why}); repeating it through the store client");
                }
            }
        }
        self.read_block_through_client(path, slot, checksum).await
    }

    async fn read_block_through_client(
        &self,
        path: &Path,
        slot: &mut BlockSlot,
        checksum: bool,
    ) -> Result<ReadBlock> {
        let block_bytes = slot.len();
        // The whole object, without Range: servers that ignore Range answer 200 either way,
        // and the size in the answer's head settles the length before any byte is read.
        let got = answered(self.client.get_opts(path, GetOptions::default()))
            .await
            .map_err(|e| op_error("load", path, &e))?;
        if got.meta.size != block_bytes as u64 {
            return Err(length_mismatch(path, got.meta.size, block_bytes));
        }
        let read = read_body("load", path, got, Sink::Block(slot.reborrow()), checksum).await?;
        if read.bytes != block_bytes as u64 {
            return Err(length_mismatch(path, read.bytes, block_bytes));
        }
        Ok(ReadBlock {
            recorded: read.recorded,
            computed: checksum.then_some(read.computed),
        })
    }

    /// Writes `body` at `path` as a store job does (overwriting), its checksum recorded
    /// beside it where a load looks for it: for tools that check a store end to end.
    pub async fn put_block(&self, path: &Path, body: Bytes) -> Result<()> {
        self.write_block(path, PutPayload::from_bytes(body), true, false, true)
            .await
            .map(|_| ())
    }

    /// Reads the object at `path` whole through the store client, checksumming its bytes
    /// as they arrive, with the checksum recorded beside it, where a load finds it. A
    /// missing object fails with [`Status::NotFound`].
    pub async fn check_object(&self, path: &Path) -> Result<ObjectCheck> {
        let got = answered(self.client.get_opts(path, GetOptions::default()))
            .await
            .map_err(|e| op_error("verify", path, &e))?;
        let read = read_body("verify", path, got, Sink::Count, true).await?;
        Ok(ObjectCheck {
            bytes: read.bytes,
            recorded: read.recorded,
            computed: read.computed,
        })
    }

    /// Reads the object at `path` whole into memory, checksummed as
    /// [`check_object`](Self::check_object) does: its bytes and what the read found.
    pub async fn read_checked_object(&self, path: &Path) -> Result<(Vec<u8>, ObjectCheck)> {
        let got = answered(self.client.get_opts(path, GetOptions::default()))
            .await
            .map_err(|e| op_error("verify", path, &e))?;
        let len = usize::try_from(got.meta.size).map_err(|_| {
            Error::new(
                Status::Io,
                format!("verify {path}: too large to read whole"),
            )
        })?;
        // A buffer the slot keeps alive, as a load's own buffers are: a blocking read
        // outlives this future if it is dropped.
        let buffer = OwnedBuffer::new(len);
        let memory = BlockMemory::new(vec![buffer.piece()]);
        // SAFETY: the slot's only piece is `buffer`, which it keeps alive.
        let slot = unsafe { BlockSlot::with_buffers(&memory, std::slice::from_ref(&buffer)) };
        let read = read_body("verify", path, got, Sink::Block(slot), true).await?;
        if read.bytes != len as u64 {
            return Err(Error::new(
                Status::Io,
                format!("verify {path}: the object changed while it was read (listed {len} bytes, read {})", read.bytes),
            ));
        }
        let check = ObjectCheck {
            bytes: read.bytes,
            recorded: read.recorded,
            computed: read.computed,
        };
        let bytes =
            OwnedBuffer::into_vec(buffer).expect("the read is over: no slot holds the buffer");
        Ok((bytes, check))
    }

    /// Deletes the object at `path`.
    pub async fn delete(&self, path: &Path) -> Result<()> {
        if let Backend::Local { files } = &self.backend {
            return files.delete(path.as_ref());
        }
        answered(self.client.delete(path))
            .await
            .map_err(|e| op_error("delete", path, &e))
    }

    /// The objects whose names start with `prefix` (a `/`-separated path; "" for the whole
    /// store), in the store's order. An error's message is the store's answer alone: the
    /// caller says what was listed.
    pub fn list(&self, prefix: &str) -> BoxStream<'static, Result<ObjectInfo>> {
        use futures::StreamExt;
        let prefix = (!prefix.is_empty()).then(|| object_path(prefix));
        let listing = self.client.list(prefix.as_ref());
        futures::stream::unfold(listing, |mut listing| async move {
            // Each page is asked for while the stream is polled: observed there.
            let (item, answer) = answer::observed(listing.next()).await;
            let item = item?.map_err(|error| {
                let failed = Failed { error, answer };
                Error::new(classify(&failed), failed.chain())
            });
            let info = item.map(|meta| {
                let name = meta.location.to_string();
                ObjectInfo {
                    kind: ObjectKind::of(&name),
                    name,
                    bytes: meta.size,
                    modified: meta.last_modified.into(),
                }
            });
            Some((info, listing))
        })
        .boxed()
    }

    /// Deletes the objects named `names`, many per request where the store takes batches
    /// (S3's DeleteObjects, Azure's blob batch), and answers for each name, in their order,
    /// whether it is gone: deleted now, or not there ("not found" counts as gone). A store
    /// that refuses a whole batch (a server without DeleteObjects) is asked one object at a
    /// time, then and from then on.
    pub async fn delete_objects(&self, names: &[String]) -> Vec<(String, Result<()>)> {
        use futures::StreamExt;
        /// Objects per batch: S3's DeleteObjects takes up to 1000 keys.
        const BATCH: usize = 1000;
        /// Single deletes in flight at once where batches are refused.
        const SINGLE_DELETES_IN_FLIGHT: usize = 16;
        let gone = |name: &str, failed: Option<Failed>| -> Result<()> {
            match failed {
                None => Ok(()),
                Some(f) if matches!(f.error, object_store::Error::NotFound { .. }) => Ok(()),
                Some(f) => Err(op_error("delete", &object_path(name), &f)),
            }
        };
        let mut outcomes = Vec::with_capacity(names.len());
        for chunk in names.chunks(BATCH) {
            if !self.batch_delete_refused.load(Ordering::Relaxed) {
                let paths: Vec<_> = chunk.iter().map(|n| Ok(object_path(n))).collect();
                let (results, answer) = answer::observed(
                    self.client
                        .delete_stream(futures::stream::iter(paths).boxed())
                        .collect::<Vec<_>>(),
                )
                .await;
                let any_gone = results
                    .iter()
                    .any(|r| matches!(r, Ok(_) | Err(object_store::Error::NotFound { .. })));
                if results.len() == chunk.len() && (any_gone || results.iter().all(|r| r.is_ok())) {
                    // One result per object, in the order asked.
                    for (name, result) in chunk.iter().zip(results) {
                        let failed = result.err().map(Failed::unanswered);
                        outcomes.push((name.clone(), gone(name, failed)));
                    }
                    continue;
                }
                if !any_gone {
                    let why: Vec<String> = results
                        .into_iter()
                        .filter_map(|r| r.err())
                        .map(|error| {
                            Failed {
                                error,
                                answer: answer.clone(),
                            }
                            .chain()
                        })
                        .collect();
                    log::warn!(
                        "{}: a batch delete was refused ({}); deleting one object at a time",
                        self.describe,
                        why.join("; ")
                    );
                    self.batch_delete_refused.store(true, Ordering::Relaxed);
                }
                // Else some of the batch is gone, but which is not known for each name:
                // the batch is asked again one at a time (a name already gone is not found).
            }
            let singles: Vec<(String, Result<()>)> = futures::stream::iter(chunk)
                .map(|name| async move {
                    let outcome = answered(self.client.delete(&object_path(name))).await;
                    (name.clone(), gone(name, outcome.err()))
                })
                .buffered(SINGLE_DELETES_IN_FLIGHT)
                .collect()
                .await;
            outcomes.extend(singles);
        }
        outcomes
    }

    /// Reads the object at `path` whole, as it is stored (no checksum is looked for).
    pub async fn read_object(&self, path: &Path) -> Result<Bytes> {
        let got = answered(self.client.get(path))
            .await
            .map_err(|e| op_error("read", path, &e))?;
        answered(got.bytes())
            .await
            .map_err(|e| op_error("read", path, &e))
    }

    /// Writes `body` at `path` as it is (overwriting; no checksum is recorded).
    pub async fn write_object(&self, path: &Path, body: Bytes) -> Result<()> {
        answered(self.client.put(path, PutPayload::from_bytes(body)))
            .await
            .map(|_| ())
            .map_err(|e| op_error("write", path, &e))
    }

    /// Looks up a key that never exists, and fails with advice a user can act on if the
    /// store is unreachable, refuses the credentials or lacks the bucket. See
    /// [`probe::probe`].
    pub async fn probe(&self, probe_name: &str) -> Result<ProbeOutcome> {
        if let Backend::Local { files } = &self.backend {
            local::check_writable(files.root())?;
        }
        probe::probe(self, probe_name).await
    }

    /// Whether the store refuses a second create of one object (conditional PUT), asked
    /// with an object named after `probe_name`.
    pub async fn honours_conditional_put(&self, probe_name: &str) -> bool {
        probe::honours_conditional_put(self, probe_name).await
    }

    /// Whether the store refuses an upload whose body was damaged on the way, asked with
    /// an object named after `probe_name`: see [`UploadCheck`].
    pub async fn checks_uploads(&self, probe_name: &str) -> UploadCheck {
        match self.backend {
            Backend::Local { .. } | Backend::Memory => UploadCheck::NoNetwork,
            _ => probe::checks_uploads(self, probe_name).await,
        }
    }
}

/// One object of a [`Store::list`]ing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectInfo {
    /// The object's name (`/`-separated).
    pub name: String,
    pub bytes: u64,
    /// When it was last written.
    pub modified: SystemTime,
    /// What it is, by its name.
    pub kind: ObjectKind,
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

/// Where the bytes of an object's body go as they are read.
enum Sink {
    /// Into the block, which is never written past its end. (For a blocking thread: the
    /// caller awaits [`read_body`] before it uses the slot again.)
    Block(BlockSlot),
    /// Nowhere: the bytes are only counted and checksummed.
    Count,
}

/// What [`read_body`] read.
struct BodyRead {
    /// Bytes read (for a block: at most its length, or one piece past it when the body
    /// is longer).
    bytes: u64,
    /// The checksum recorded with the object, if any.
    recorded: Option<u32>,
    /// The CRC32C of the bytes read, if asked for (else 0).
    computed: u32,
}

/// Reads an object's body, a local file or an HTTP stream, into `sink`, with the CRC32C
/// of each piece computed while it is still in cache (when `checksum`). The one read
/// loop of loads through the store client and of `check_object`.
async fn read_body(
    what: &str,
    path: &Path,
    got: GetResult,
    sink: Sink,
    checksum: bool,
) -> Result<BodyRead> {
    /// Bytes read from a local file at a time when they go nowhere.
    const FILE_PIECE: usize = 1 << 20;
    match got.payload {
        GetResultPayload::File(file, _) => {
            let read = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let recorded = integrity::file_checksum(&file);
                let (mut sink, mut scratch) = match sink {
                    Sink::Block(slot) => (Some(slot), Vec::new()),
                    Sink::Count => (None, vec![0u8; FILE_PIECE]),
                };
                let (mut bytes, mut crc) = (0u64, 0u32);
                loop {
                    let buf = match &mut sink {
                        // A block is read up to its end: the caller settled the length.
                        Some(slot) => match slot.rest_at(bytes as usize, usize::MAX) {
                            [] => break,
                            rest => rest,
                        },
                        None => &mut scratch[..],
                    };
                    match file.read_at(buf, bytes) {
                        Ok(0) => break,
                        Ok(n) => {
                            if checksum {
                                crc = integrity::checksum_append(crc, &buf[..n]);
                            }
                            bytes += n as u64;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(BodyRead {
                    bytes,
                    recorded,
                    computed: crc,
                })
            })
            .await
            .map_err(|e| Error::join(&format!("{what} {path}"), &e))?;
            read.map_err(|e| Error::new(Status::Io, format!("{what} {path}: {e}")))
        }
        GetResultPayload::Stream(mut stream) => {
            use futures::StreamExt;
            let recorded = integrity::recorded_checksum(&got.attributes);
            let mut sink = sink;
            let (mut bytes, mut crc) = (0u64, 0u32);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| op_error(what, path, &Failed::unanswered(e)))?;
                if let Sink::Block(slot) = &mut sink {
                    if !slot.write_at(bytes as usize, &chunk) {
                        // Longer than the block: report how far the body went.
                        return Ok(BodyRead {
                            bytes: bytes + chunk.len() as u64,
                            recorded,
                            computed: crc,
                        });
                    }
                }
                if checksum {
                    crc = integrity::checksum_append(crc, &chunk);
                }
                bytes += chunk.len() as u64;
            }
            Ok(BodyRead {
                bytes,
                recorded,
                computed: crc,
            })
        }
    }
}

fn length_mismatch(path: &Path, got: u64, want: usize) -> Error {
    Error::new(
        Status::LengthMismatch,
        format!("load {path}: object holds {got} bytes but blocks are {want} bytes"),
    )
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
