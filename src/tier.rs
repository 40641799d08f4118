//! The tier engine: job table, I/O runtime and completion queue.
//!
//! Submission runs on the caller's thread and only validates and spawns; the I/O runs on
//! the tier's own tokio runtime; completions come back through a crossbeam channel, with
//! an eventfd that is readable while results wait.

use std::collections::{HashMap, HashSet};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use futures::FutureExt;
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, GetOptions, GetResultPayload, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload,
};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

use crate::direct_http::{DirectError, DirectHttp};
use crate::config::{DedupMode, Locality, OnCorrupt, StoreConfig, TierConfig};
use crate::lookup::{Answer, LookupResult, LookupTable, ProbeGroup};
use crate::error::{Error, Result, Status};
use crate::key::{split_key, KeyLayout};
use crate::pool::{HostPool, MemoryLease};
use crate::store::{self, DynStore, ProbeOutcome};

/// Most keys one job may carry.
pub const MAX_KEYS_PER_JOB: usize = 1 << 20;

/// Direction of a job.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// Host pool to store.
    Store = 0,
    /// Store to host pool.
    Load = 1,
}

/// The keys of one job, stored back to back (every key has the same length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyBatch {
    bytes: Arc<[u8]>,
    key_len: usize,
}

impl KeyBatch {
    /// `bytes` holds `bytes.len() / key_len` keys of `key_len` bytes each.
    pub fn new(bytes: &[u8], key_len: usize) -> Result<Self> {
        if key_len == 0 || bytes.len() % key_len != 0 {
            return Err(Error::invalid(format!(
                "{} key bytes do not divide into keys of {key_len} bytes",
                bytes.len()
            )));
        }
        Ok(KeyBatch { bytes: bytes.into(), key_len })
    }

    pub fn from_keys<K: AsRef<[u8]>>(keys: &[K]) -> Result<Self> {
        let key_len = keys.first().map(|k| k.as_ref().len()).unwrap_or(1);
        let mut bytes = Vec::with_capacity(key_len * keys.len());
        for k in keys {
            if k.as_ref().len() != key_len {
                return Err(Error::invalid("all keys of a job must have the same length"));
            }
            bytes.extend_from_slice(k.as_ref());
        }
        Self::new(&bytes, key_len)
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / self.key_len
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn key_len(&self) -> usize {
        self.key_len
    }

    pub fn get(&self, i: usize) -> &[u8] {
        &self.bytes[i * self.key_len..(i + 1) * self.key_len]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes.chunks_exact(self.key_len)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The one result of a submitted job.
#[derive(Debug, Clone)]
pub struct JobResult {
    pub job_id: u64,
    pub kind: JobKind,
    /// `Ok` only if every key succeeded; otherwise the first failing key's status.
    pub status: Status,
    /// Bytes moved by the keys that succeeded.
    pub bytes: u64,
    /// Seconds from submission to completion.
    pub seconds: f64,
    /// Outcome of each key, in submission order.
    pub key_status: Vec<Status>,
    /// The job's keys, in submission order.
    pub keys: KeyBatch,
    /// Why the job failed; empty on success.
    pub message: String,
}

impl JobResult {
    pub fn succeeded(&self) -> bool {
        self.status.is_ok()
    }

    /// Keys whose own outcome is `Ok`.
    pub fn successful_keys(&self) -> impl Iterator<Item = &[u8]> {
        self.keys.iter().zip(&self.key_status).filter(|(_, s)| s.is_ok()).map(|(k, _)| k)
    }
}

enum Phase {
    Running { kind: JobKind, keys: KeyBatch, submitted: Instant },
    Finished,
}

#[derive(Default)]
struct JobTable {
    /// Every job id submitted and not yet handed out by `poll`.
    jobs: HashMap<u64, Phase>,
    running: usize,
    /// Blocks held by jobs whose result has not been polled: any number of store jobs
    /// (readers), or one load job (the writer).
    holds: HashMap<u64, BlockHold>,
    /// The blocks each accepted job holds, released when its result is polled.
    held_by: HashMap<u64, (JobKind, Vec<u64>)>,
}

#[derive(Debug, Clone, Copy)]
struct BlockHold {
    kind: JobKind,
    /// One of the holding jobs, for messages.
    job_id: u64,
    jobs: usize,
}

impl JobTable {
    /// Lets `job_id` hold `blocks`, unless a job whose result was not polled yet holds one
    /// of them in a conflicting way (a load with anything else).
    fn hold(&mut self, kind: JobKind, job_id: u64, blocks: &[u64]) -> Result<()> {
        let mut distinct = blocks.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        for block in &distinct {
            if let Some(hold) = self.holds.get(block) {
                if hold.kind == JobKind::Load || kind == JobKind::Load {
                    let holder = match hold.kind {
                        JobKind::Load => "a load writing into it",
                        JobKind::Store => "a store reading it",
                    };
                    return Err(Error::new(
                        Status::BlockBusy,
                        format!(
                            "block {block} is held by job {} ({holder}) until that job's result is polled; a block may be read by several store jobs at once, but a load needs it alone",
                            hold.job_id
                        ),
                    ));
                }
            }
        }
        for &block in &distinct {
            self.holds.entry(block).and_modify(|h| h.jobs += 1).or_insert(BlockHold { kind, job_id, jobs: 1 });
        }
        self.held_by.insert(job_id, (kind, distinct));
        Ok(())
    }

    /// Releases the blocks of a job whose result was handed out.
    fn release(&mut self, job_id: u64) {
        let Some((_, blocks)) = self.held_by.remove(&job_id) else { return };
        for block in blocks {
            if let std::collections::hash_map::Entry::Occupied(mut hold) = self.holds.entry(block) {
                hold.get_mut().jobs -= 1;
                if hold.get().jobs == 0 {
                    hold.remove();
                }
            }
        }
    }
}

/// Readable exactly while results wait to be polled. Both sides change it under the job
/// table lock: `finish` raises it when the queue turns non-empty, `poll` clears it when it
/// empties the queue, so the caller pays at most one syscall per poll.
struct ReadyFd(RawFd);

impl ReadyFd {
    fn new() -> Result<Self> {
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::new(
                Status::Io,
                format!("eventfd: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(ReadyFd(fd))
    }
    fn raise(&self) {
        let one: u64 = 1;
        unsafe { libc::write(self.0, &one as *const u64 as *const libc::c_void, 8) };
    }
    fn clear(&self) {
        let mut value: u64 = 0;
        unsafe { libc::read(self.0, &mut value as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl Drop for ReadyFd {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

pub(crate) struct Shared {
    pub(crate) store: DynStore,
    pub(crate) layout: KeyLayout,
    pub(crate) config: TierConfig,
    pub(crate) probe: ProbeOutcome,
    /// The store keeps the PUT body itself (in-memory): it must get a copy, never a view
    /// of caller memory.
    store_keeps_payload: bool,
    pool: OnceLock<HostPool>,
    transfer_permits: Semaphore,
    pub(crate) lookup_permits: Semaphore,
    table: Mutex<JobTable>,
    table_changed: Condvar,
    results_tx: Sender<JobResult>,
    ready: ReadyFd,
    closing: AtomicBool,
    answers_tx: Sender<Vec<Answer>>,
    pub(crate) stats: Stats,
    /// Dedup mode in force (the configured one, or what the start-up probe allows).
    dedup: DedupMode,
    /// Keys known to be in the store: not uploaded again.
    known: Mutex<HashSet<Vec<u8>>>,
    /// Keys whose objects two reads found corrupt: MISS for every lookup, and the next
    /// store overwrites the object (no skip, no conditional PUT).
    corrupt: Mutex<HashSet<Vec<u8>>>,
    /// Checksums of the blocks this tier uploaded, for objects that come back without
    /// their recorded checksum (rewritten by another client).
    uploaded_crc: Mutex<HashMap<Vec<u8>, u32>>,
    /// Uploads in flight, with the stores of the same key waiting for them.
    uploads: Mutex<HashMap<Vec<u8>, Vec<tokio::sync::oneshot::Sender<Result<()>>>>>,
    /// Root of the local store: its checksums live in extended attributes.
    local_root: Option<std::path::PathBuf>,
    /// The direct HTTP path of the transfer lane (plain-http S3 endpoints), if any.
    direct: Option<Arc<DirectHttp>>,
    /// The store client of the lookup lane (the transfer store unless separated), and
    /// its own direct path: connections belong to the runtime that opened them.
    lookup_store: DynStore,
    lookup_direct: Option<Arc<DirectHttp>>,
}

/// Counters since the tier was created.
#[derive(Debug, Default)]
pub struct Stats {
    pub keys_stored: AtomicU64,
    pub keys_loaded: AtomicU64,
    pub bytes_stored: AtomicU64,
    pub bytes_loaded: AtomicU64,
    pub keys_failed: AtomicU64,
    pub existence_checks: AtomicU64,
    pub existence_check_errors: AtomicU64,
    pub corrupt_blocks: AtomicU64,
    pub dedup_known: AtomicU64,
    pub dedup_joined: AtomicU64,
    pub dedup_already_stored: AtomicU64,
    pub direct_requests: AtomicU64,
    pub direct_fallbacks: AtomicU64,
}

/// A snapshot of the tier's counters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Keys stored successfully.
    pub keys_stored: u64,
    /// Keys loaded successfully.
    pub keys_loaded: u64,
    pub bytes_stored: u64,
    pub bytes_loaded: u64,
    /// Keys of store or load jobs that failed.
    pub keys_failed: u64,
    /// Existence checks (HEAD requests) sent to the store.
    pub existence_checks: u64,
    /// Existence checks that failed (neither found nor absent).
    pub existence_check_errors: u64,
    /// Loads whose bytes did not match the recorded checksum.
    pub corrupt_blocks: u64,
    /// Store keys skipped because the tier knew the store holds them.
    pub dedup_known: u64,
    /// Store keys that waited for a concurrent upload of the same key instead of uploading.
    pub dedup_joined: u64,
    /// Store keys the store already held (conditional PUT answered 412).
    pub dedup_already_stored: u64,
    /// Loads and existence checks sent on the direct HTTP path (`store.direct_http`).
    pub direct_requests: u64,
    /// Of those, the ones repeated through the general HTTP client after an unexpected
    /// answer or a transport error.
    pub direct_fallbacks: u64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            keys_stored: get(&self.keys_stored),
            keys_loaded: get(&self.keys_loaded),
            bytes_stored: get(&self.bytes_stored),
            bytes_loaded: get(&self.bytes_loaded),
            keys_failed: get(&self.keys_failed),
            existence_checks: get(&self.existence_checks),
            existence_check_errors: get(&self.existence_check_errors),
            corrupt_blocks: get(&self.corrupt_blocks),
            dedup_known: get(&self.dedup_known),
            dedup_joined: get(&self.dedup_joined),
            dedup_already_stored: get(&self.dedup_already_stored),
            direct_requests: get(&self.direct_requests),
            direct_fallbacks: get(&self.direct_fallbacks),
        }
    }
}

/// A BlockStored event: one per successful store job, keys in job order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub job_id: u64,
    pub keys: KeyBatch,
    pub locality: Option<Locality>,
}

/// Medium of every event this tier emits (vLLM's `Medium.STORAGE`).
pub const EVENT_MEDIUM: &str = "STORAGE";

struct Lookups {
    table: LookupTable,
    answers_rx: Receiver<Vec<Answer>>,
}

impl Lookups {
    fn apply_answers(&mut self) {
        while let Ok(batch) = self.answers_rx.try_recv() {
            self.table.apply(batch);
        }
    }
}

impl Shared {
    async fn transfer_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.transfer_permits
            .acquire()
            .await
            .map_err(|_| Error::new(Status::Cancelled, "the tier shut down before the transfer started"))
    }

    fn known(&self) -> MutexGuard<'_, HashSet<Vec<u8>>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn remember(&self, key: &[u8]) {
        if self.dedup == DedupMode::Off {
            return;
        }
        let mut known = self.known();
        if known.len() >= self.config.known_keys_capacity {
            known.clear();
        }
        known.insert(key.to_vec());
    }

    fn forget(&self, key: &[u8]) {
        self.known().remove(key);
    }

    fn corrupt(&self) -> MutexGuard<'_, HashSet<Vec<u8>>> {
        self.corrupt.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark_corrupt(&self, key: &[u8]) {
        self.forget(key);
        let mut corrupt = self.corrupt();
        if corrupt.len() >= self.config.known_keys_capacity {
            corrupt.clear();
        }
        corrupt.insert(key.to_vec());
    }

    pub(crate) fn is_corrupt(&self, key: &[u8]) -> bool {
        self.corrupt().contains(key)
    }

    fn uploaded_crc(&self) -> MutexGuard<'_, HashMap<Vec<u8>, u32>> {
        self.uploaded_crc.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember_upload(&self, key: &[u8], crc: u32) {
        let mut crcs = self.uploaded_crc();
        if crcs.len() >= self.config.known_keys_capacity {
            crcs.clear();
        }
        crcs.insert(key.to_vec(), crc);
    }

    /// Stores one block unless the store is known to hold it or an upload of the same key
    /// is already running, in which case the outcome of that upload is shared.
    async fn store_deduplicated(&self, key: &[u8], name: &Path, view: bytes::Bytes) -> Result<()> {
        let repair = self.is_corrupt(key);
        if self.dedup == DedupMode::Off {
            let _permit = self.transfer_permit().await?;
            return self.store_block(key, name, view, repair).await;
        }
        if !repair && self.known().contains(key) {
            self.stats.dedup_known.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let waiter = {
            let mut uploads = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
            match uploads.get_mut(key) {
                Some(waiters) => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    waiters.push(tx);
                    Some(rx)
                }
                None => {
                    uploads.insert(key.to_vec(), Vec::new());
                    None
                }
            }
        };
        if let Some(rx) = waiter {
            self.stats.dedup_joined.fetch_add(1, Ordering::Relaxed);
            return rx.await.unwrap_or_else(|_| Err(Error::new(Status::Cancelled, "the shared upload was abandoned")));
        }
        let outcome = match self.transfer_permit().await {
            Ok(_permit) => self.store_block(key, name, view, repair).await,
            Err(e) => Err(e),
        };
        if outcome.is_ok() {
            self.remember(key);
        }
        let waiters = self.uploads.lock().unwrap_or_else(|p| p.into_inner()).remove(key).unwrap_or_default();
        for waiter in waiters {
            let _ = waiter.send(outcome.clone());
        }
        outcome
    }

    /// Uploads one block; `repair` overwrites whatever the store holds under the name
    /// (an object found corrupt), also in `conditional` mode.
    async fn store_block(&self, key: &[u8], name: &Path, view: bytes::Bytes, repair: bool) -> Result<()> {
        let crc = self.config.checksums.then(|| crc32c::crc32c(&view));
        let mut attributes = Attributes::new();
        if let (Some(crc), None) = (crc, &self.local_root) {
            attributes.insert(Attribute::Metadata(CRC_METADATA.into()), format!("{crc:08x}").into());
        }
        // The in-memory store keeps the body itself: it gets a copy, never caller memory.
        let body = if self.store_keeps_payload { bytes::Bytes::copy_from_slice(&view) } else { view };
        let mode = if self.dedup == DedupMode::Conditional && !repair { PutMode::Create } else { PutMode::Overwrite };
        let options = PutOptions { mode, attributes, ..Default::default() };
        // A conditional PUT cut short by a timeout or a reset is repeated here: object_store
        // repeats only PUTs it deems idempotent, and a repeat that finds the object is a 412.
        let retries = store::max_retries(&self.config.store);
        match store::put_with_retries(&self.store, name, PutPayload::from_bytes(body), options, retries).await {
            Ok(_) => {
                if repair {
                    self.corrupt().remove(key);
                }
                if let Some(crc) = crc {
                    if let Some(root) = &self.local_root {
                        set_local_checksum(&root.join(name.as_ref()), crc);
                    }
                    self.remember_upload(key, crc);
                }
                Ok(())
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                self.stats.dedup_already_stored.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(op_error("store", name, &e)),
        }
    }

    fn table(&self) -> MutexGuard<'_, JobTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes a job's one result. A second finish for the same id is dropped.
    fn finish(&self, result: JobResult) {
        let mut table = self.table();
        match table.jobs.get_mut(&result.job_id) {
            Some(phase @ Phase::Running { .. }) => {
                *phase = Phase::Finished;
                table.running -= 1;
            }
            _ => {
                log::error!("job {} finished twice; second result dropped", result.job_id);
                return;
            }
        }
        if self.results_tx.is_empty() {
            self.ready.raise();
        }
        let _ = self.results_tx.send(result);
        drop(table);
        self.table_changed.notify_all();
    }
}

/// A secondary KV-cache tier.
///
/// All methods take `&self`; the tier is `Send + Sync`. `poll` must not run concurrently
/// with itself if the caller relies on result order.
pub struct Tier {
    shared: Arc<Shared>,
    runtime: RwLock<Option<Runtime>>,
    /// The lookup lane's own runtime (one thread) and HTTP client, so that existence
    /// checks neither queue behind transfer tasks nor wait for a pooled connection.
    lookup_runtime: RwLock<Option<Runtime>>,
    results_rx: Receiver<JobResult>,
    lookups: Mutex<Lookups>,
    events: Mutex<Vec<StoredEvent>>,
}

impl Tier {
    /// Parses `json`, builds the store and probes it.
    pub fn from_json(json: &str) -> Result<Tier> {
        Tier::new(TierConfig::from_json(json)?)
    }

    pub fn new(config: TierConfig) -> Result<Tier> {
        config.validate()?;
        let layout = KeyLayout::new(&config.prefix, &config.namespace)?;
        let (runtime, store) = runtime_with_store(&config.store, config.runtime_threads, "kvtier-io", config.transfer_thread_nice)?;
        let describe = describe_store(&config);
        if let StoreConfig::Local(local) = &config.store {
            check_local_writable(&local.path)?;
        }
        let probe_name = layout.probe_name();
        let probe = runtime.block_on(store::probe(&store, &probe_name, &describe))?;
        let dedup = runtime.block_on(choose_dedup(&store, &layout, config.dedup, &describe))?;
        let direct = store::direct_http_for(&store);
        let (lookup_runtime, lookup_store) = if config.separate_lookup_lane && matches!(config.store, StoreConfig::S3(_)) {
            let (lane, lane_store) = runtime_with_store(&config.store, 1, "kvtier-lookup", 0)?;
            (Some(lane), lane_store)
        } else {
            (None, store.clone())
        };
        let lookup_direct = store::direct_http_for(&lookup_store);
        let (results_tx, results_rx) = crossbeam_channel::unbounded();
        let (answers_tx, answers_rx) = crossbeam_channel::unbounded();
        let local_root = match &config.store {
            StoreConfig::Local(local) => Some(local.path.clone()),
            _ => None,
        };
        let shared = Arc::new(Shared {
            store,
            layout,
            transfer_permits: Semaphore::new(config.max_inflight_transfers),
            lookup_permits: Semaphore::new(config.max_inflight_lookups),
            store_keeps_payload: matches!(config.store, crate::config::StoreConfig::Memory(_)),
            config,
            probe,
            pool: OnceLock::new(),
            table: Mutex::new(JobTable::default()),
            table_changed: Condvar::new(),
            results_tx,
            ready: ReadyFd::new()?,
            closing: AtomicBool::new(false),
            answers_tx,
            stats: Stats::default(),
            dedup,
            known: Mutex::new(HashSet::new()),
            corrupt: Mutex::new(HashSet::new()),
            uploaded_crc: Mutex::new(HashMap::new()),
            uploads: Mutex::new(HashMap::new()),
            local_root,
            direct,
            lookup_store,
            lookup_direct,
        });
        log::info!("kvtier tier ready on {describe}");
        Ok(Tier {
            shared,
            runtime: RwLock::new(Some(runtime)),
            lookup_runtime: RwLock::new(lookup_runtime),
            results_rx,
            lookups: Mutex::new(Lookups { table: LookupTable::default(), answers_rx }),
            events: Mutex::new(Vec::new()),
        })
    }

    pub fn config(&self) -> &TierConfig {
        &self.shared.config
    }

    pub fn layout(&self) -> &KeyLayout {
        &self.shared.layout
    }

    pub fn store(&self) -> &DynStore {
        &self.shared.store
    }

    /// Whether start-up found that missing keys answer 403 (no ListBucket permission).
    pub fn missing_keys_are_forbidden(&self) -> bool {
        self.shared.probe == ProbeOutcome::ReadyWithoutList
    }

    pub fn is_shut_down(&self) -> bool {
        self.shared.closing.load(Ordering::Acquire)
    }

    /// Registers the caller's host pool. Allowed once per tier.
    ///
    /// # Safety
    /// `base .. base + num_blocks * block_bytes` must stay valid until [`shutdown`](Self::shutdown)
    /// returns, and the caller must not write a block while a store job reads it or touch
    /// a block while a load job writes it.
    pub unsafe fn register_memory(&self, base: *mut u8, num_blocks: u64, block_bytes: usize) -> Result<()> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "register_memory after shutdown"));
        }
        let pool = HostPool::new(base, num_blocks, block_bytes)?;
        self.shared
            .pool
            .set(pool)
            .map_err(|_| Error::state("memory is already registered; a tier has one host pool"))
    }

    pub fn pool(&self) -> Option<HostPool> {
        self.shared.pool.get().copied()
    }

    /// Submits a job moving `keys[i]` to or from block `block_ids[i]`.
    ///
    /// Never blocks. Unless it returns `DuplicateJob`, exactly one result for `job_id`
    /// will come out of [`poll`](Self::poll), also when this returns an error.
    pub fn submit(&self, kind: JobKind, job_id: u64, block_ids: &[u64], keys: KeyBatch) -> Result<()> {
        self.admit(kind, job_id, &keys)?;
        match self.prepare(kind, block_ids, &keys).and_then(|()| self.shared.table().hold(kind, job_id, block_ids)) {
            Ok(()) => self.launch(kind, job_id, block_ids.to_vec(), keys),
            Err(e) => {
                self.fail_admitted(job_id, kind, keys, &e);
                Err(e)
            }
        }
    }

    /// Records a job that was rejected before its arguments could be read (NULL pointers
    /// at the C boundary), so that it still yields its one failed result.
    pub fn submit_rejected(&self, kind: JobKind, job_id: u64, num_keys: usize, error: Error) -> Error {
        let keys = KeyBatch { bytes: Arc::from(&[][..]), key_len: 1 };
        if let Err(dup) = self.admit(kind, job_id, &keys) {
            return dup;
        }
        let mut result = failed_result(job_id, kind, keys, &error);
        // Per-key outcomes only for a plausible job size: the count came from the caller
        // unchecked and must not decide an allocation.
        if num_keys <= MAX_KEYS_PER_JOB {
            result.key_status = vec![error.status; num_keys];
        }
        self.shared.finish(result);
        error
    }

    fn admit(&self, kind: JobKind, job_id: u64, keys: &KeyBatch) -> Result<()> {
        let mut table = self.shared.table();
        if table.jobs.contains_key(&job_id) {
            return Err(Error::new(
                Status::DuplicateJob,
                format!("job id {job_id} already has a result pending; poll it before reusing the id"),
            ));
        }
        table.jobs.insert(job_id, Phase::Running { kind, keys: keys.clone(), submitted: Instant::now() });
        table.running += 1;
        Ok(())
    }

    fn fail_admitted(&self, job_id: u64, kind: JobKind, keys: KeyBatch, error: &Error) {
        self.shared.finish(failed_result(job_id, kind, keys, error));
    }

    fn prepare(&self, kind: JobKind, block_ids: &[u64], keys: &KeyBatch) -> Result<()> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "submit after shutdown"));
        }
        let pool = self
            .shared
            .pool
            .get()
            .ok_or_else(|| Error::state("no memory registered: call register_memory before submitting jobs"))?;
        if keys.is_empty() {
            return Err(Error::invalid("a job needs at least one key"));
        }
        if keys.len() > MAX_KEYS_PER_JOB {
            return Err(Error::invalid(format!(
                "a job has at most {MAX_KEYS_PER_JOB} keys; this one has {}",
                keys.len()
            )));
        }
        if keys.len() != block_ids.len() {
            return Err(Error::invalid(format!(
                "{} keys but {} block ids; a job moves one block per key",
                keys.len(),
                block_ids.len()
            )));
        }
        let expected = self.shared.config.key_bytes;
        if expected != 0 && keys.key_len() != expected {
            return Err(Error::invalid(format!(
                "keys are {} bytes but this tier is configured for key_bytes = {expected}",
                keys.key_len()
            )));
        }
        for &block in block_ids {
            pool.check_block(block)?;
        }
        if kind == JobKind::Load {
            let mut seen = std::collections::HashSet::with_capacity(block_ids.len());
            for &block in block_ids {
                if !seen.insert(block) {
                    return Err(Error::invalid(format!(
                        "block id {block} appears twice in one load job; two keys cannot load into one block"
                    )));
                }
            }
        }
        // Only validation here: the object names are built on the I/O side (`run_job`), so
        // the caller's thread pays neither the hex formatting nor the path allocations.
        for key in keys.iter() {
            split_key(key)?;
        }
        Ok(())
    }

    fn launch(&self, kind: JobKind, job_id: u64, block_ids: Vec<u64>, keys: KeyBatch) -> Result<()> {
        let runtime = self.runtime.read().unwrap_or_else(|p| p.into_inner());
        let Some(runtime) = runtime.as_ref() else {
            let e = Error::new(Status::ShutDown, "submit after shutdown");
            self.fail_admitted(job_id, kind, keys, &e);
            return Err(e);
        };
        let shared = self.shared.clone();
        let submitted = Instant::now();
        runtime.spawn(async move {
            let job = run_job(shared.clone(), kind, job_id, block_ids, keys.clone(), submitted);
            let result = match std::panic::AssertUnwindSafe(job).catch_unwind().await {
                Ok(result) => result,
                Err(panic) => {
                    let e = Error::new(Status::Panic, format!("job {job_id} panicked: {}", panic_message(&panic)));
                    failed_result(job_id, kind, keys, &e)
                }
            };
            shared.finish(result);
        });
        Ok(())
    }

    /// Takes up to `max` finished jobs. Each job is returned exactly once.
    pub fn poll(&self, max: usize) -> Vec<JobResult> {
        let mut out = Vec::new();
        // Under the table lock, `finish` is either wholly done or not begun.
        let mut table = self.shared.table();
        while out.len() < max {
            match self.results_rx.try_recv() {
                Ok(result) => {
                    table.jobs.remove(&result.job_id);
                    table.release(result.job_id);
                    out.push(result);
                }
                Err(_) => break,
            }
        }
        if !out.is_empty() && self.results_rx.is_empty() {
            self.shared.ready.clear();
        }
        drop(table);
        self.after_poll(&out);
        out
    }

    /// Applies finished jobs to lookups and events, in vLLM's order: failed load keys
    /// become MISS for the requests holding them; successful stores yield one event.
    fn after_poll(&self, results: &[JobResult]) {
        let failed_loads = results.iter().any(|r| r.kind == JobKind::Load && !r.succeeded());
        if failed_loads {
            let mut lookups = self.lookups();
            for r in results.iter().filter(|r| r.kind == JobKind::Load) {
                let failed = r.keys.iter().zip(&r.key_status).filter(|(_, s)| !s.is_ok()).map(|(k, _)| k);
                lookups.table.mark_miss(failed);
            }
        }
        if self.shared.config.enable_kv_events {
            let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
            for r in results.iter().filter(|r| r.kind == JobKind::Store && r.succeeded()) {
                events.push(StoredEvent { job_id: r.job_id, keys: r.keys.clone(), locality: self.shared.config.locality });
            }
        }
    }

    fn lookups(&self) -> MutexGuard<'_, Lookups> {
        self.lookups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Does the tier hold `key`? Never blocks and never does I/O: an unknown key answers
    /// `Retry` and is checked after the next [`schedule_end`](Self::schedule_end).
    pub fn lookup(&self, request: u64, key: &[u8]) -> Result<LookupResult> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "lookup after shutdown"));
        }
        self.check_key(key)?;
        let mut lookups = self.lookups();
        lookups.apply_answers();
        Ok(lookups.table.lookup(request, key))
    }

    /// Sends the lookups asked since the last call as one batch to the lookup lane.
    pub fn schedule_end(&self) -> Result<()> {
        let groups = {
            let mut lookups = self.lookups();
            lookups.apply_answers();
            lookups.table.flush()
        };
        if groups.is_empty() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let task = async move {
            let answers = check_groups(&shared, groups).await;
            let _ = shared.answers_tx.send(answers);
        };
        let lane = self.lookup_runtime.read().unwrap_or_else(|p| p.into_inner());
        let spawned = match lane.as_ref() {
            Some(rt) => Some(drop(rt.spawn(task))),
            None => self.with_runtime(|rt| drop(rt.spawn(task))),
        };
        spawned.ok_or_else(|| Error::new(Status::ShutDown, "schedule_end after shutdown"))
    }

    /// The request will not look anything up again; verdicts only it held are dropped.
    pub fn request_finished(&self, request: u64) {
        let mut lookups = self.lookups();
        lookups.apply_answers();
        lookups.table.request_finished(request);
    }

    /// Keys with lookup state (for tests).
    pub fn tracked_lookup_keys(&self) -> usize {
        self.lookups().table.tracked_keys()
    }

    /// Takes up to `max` of the BlockStored events recorded so far, oldest first.
    pub fn take_events(&self, max: usize) -> Vec<StoredEvent> {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let n = max.min(events.len());
        events.drain(..n).collect()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        let expected = self.shared.config.key_bytes;
        if expected != 0 && key.len() != expected {
            return Err(Error::invalid(format!(
                "key is {} bytes but this tier is configured for key_bytes = {expected}",
                key.len()
            )));
        }
        split_key(key).map(|_| ())
    }

    /// A file descriptor that is readable while results wait. Owned by the tier.
    pub fn ready_fd(&self) -> RawFd {
        self.shared.ready.0
    }

    /// Jobs submitted and not yet finished.
    pub fn jobs_in_flight(&self) -> usize {
        self.shared.table().running
    }

    /// Waits until no job is in flight. Results stay queued for `poll`.
    pub fn drain(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut table = self.shared.table();
        while table.running > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    Status::Timeout,
                    format!("{} jobs still in flight after {} ms", table.running, timeout.as_millis()),
                ));
            }
            table = self
                .shared
                .table_changed
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// Stops the tier: refuses new work, cancels work that has not started (reported as
    /// `Cancelled`), waits for operations in progress, and stops the runtime. Afterwards
    /// no thread of the tier touches the host pool; results stay available to `poll`.
    /// Idempotent.
    pub fn shutdown(&self) {
        let runtime = self.runtime.write().unwrap_or_else(|p| p.into_inner()).take();
        let Some(runtime) = runtime else { return };
        let lookup_runtime = self.lookup_runtime.write().unwrap_or_else(|p| p.into_inner()).take();
        self.shared.closing.store(true, Ordering::Release);
        self.shared.transfer_permits.close();
        self.shared.lookup_permits.close();
        let grace = Duration::from_millis(self.shared.config.shutdown_timeout_ms);
        if let Err(e) = self.drain(grace) {
            log::warn!("shutdown: {}; abandoning them", e.message);
        }
        // Dropping the runtime waits for blocking file I/O and drops every task, so no
        // code of the tier runs after this line.
        drop(runtime);
        drop(lookup_runtime);
        let abandoned: Vec<(u64, JobKind, KeyBatch, Instant)> = self
            .shared
            .table()
            .jobs
            .iter()
            .filter_map(|(&id, phase)| match phase {
                Phase::Running { kind, keys, submitted } => Some((id, *kind, keys.clone(), *submitted)),
                Phase::Finished => None,
            })
            .collect();
        for (id, kind, keys, submitted) in abandoned {
            let e = Error::new(Status::Cancelled, "the tier shut down before the job finished");
            let mut result = failed_result(id, kind, keys, &e);
            result.seconds = submitted.elapsed().as_secs_f64();
            self.shared.finish(result);
        }
    }

    pub(crate) fn with_runtime<R>(&self, f: impl FnOnce(&Runtime) -> R) -> Option<R> {
        let runtime = self.runtime.read().unwrap_or_else(|p| p.into_inner());
        runtime.as_ref().map(f)
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A local store must take new files: found at start, not by the first store job.
fn check_local_writable(root: &std::path::Path) -> Result<()> {
    use std::io::Write;
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    // A name no object can have (object names never start with a dot).
    let probe = root.join(format!(".kvtier-write-probe-{}-{nonce}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut file| file.write_all(b"kvtier"));
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| {
        let denied = matches!(e.kind(), std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem);
        let status = if denied { Status::PermissionDenied } else { Status::Config };
        Error::new(status, format!("local store directory {} is not writable: {e}", root.display()))
    })
}

fn describe_store(config: &TierConfig) -> String {
    match &config.store {
        crate::config::StoreConfig::Local(l) => format!("local directory {}", l.path.display()),
        crate::config::StoreConfig::Memory(_) => "in-memory store".to_string(),
        crate::config::StoreConfig::S3(s3) => format!(
            "s3 bucket {:?} at {}",
            s3.bucket,
            store::endpoint_url(&s3.endpoint_override, s3.scheme.as_deref())
                .unwrap_or_else(|| "AWS".to_string())
        ),
    }
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

fn failed_result(job_id: u64, kind: JobKind, keys: KeyBatch, error: &Error) -> JobResult {
    JobResult {
        job_id,
        kind,
        status: error.status,
        bytes: 0,
        seconds: 0.0,
        key_status: vec![error.status; keys.len()],
        keys,
        message: error.message.clone(),
    }
}

async fn run_job(
    shared: Arc<Shared>,
    kind: JobKind,
    job_id: u64,
    block_ids: Vec<u64>,
    keys: KeyBatch,
    submitted: Instant,
) -> JobResult {
    // Keys were validated at submit; names are built from validated segments, so
    // `Path::parse` takes them without re-encoding.
    let names: Vec<Path> = keys
        .iter()
        .map(|key| {
            let name = shared.layout.object_name(key).expect("keys are validated at submit");
            store::object_path(&name)
        })
        .collect();
    let pool = *shared.pool.get().expect("submit checks registration");
    let lease = MemoryLease::new();
    let outcomes: Vec<std::result::Result<(), Error>> = {
        let lease = &lease;
        let shared = &shared;
        futures::future::join_all(block_ids.iter().zip(&names).zip(keys.iter()).map(|((&block, name), key)| async move {
            match kind {
                JobKind::Store => shared.store_deduplicated(key, name, lease.view(&pool, block)).await,
                JobKind::Load => {
                    let _permit = shared.transfer_permit().await?;
                    let loaded = load_block(shared, key, name, &pool, block).await;
                    if let Err(e) = &loaded {
                        if matches!(e.status, Status::NotFound | Status::Corrupt | Status::LengthMismatch) {
                            shared.forget(key);
                        }
                    }
                    loaded
                }
            }
        }))
        .await
    };
    // Every operation has returned; wait until no HTTP body still points into the pool.
    lease.released().await;

    let key_status: Vec<Status> = outcomes.iter().map(|o| o.as_ref().err().map_or(Status::Ok, |e| e.status)).collect();
    let ok_keys = key_status.iter().filter(|s| s.is_ok()).count();
    let stats = &shared.stats;
    let (keys_counter, bytes_counter) = match kind {
        JobKind::Store => (&stats.keys_stored, &stats.bytes_stored),
        JobKind::Load => (&stats.keys_loaded, &stats.bytes_loaded),
    };
    keys_counter.fetch_add(ok_keys as u64, Ordering::Relaxed);
    bytes_counter.fetch_add((ok_keys * pool.block_bytes()) as u64, Ordering::Relaxed);
    stats.keys_failed.fetch_add((keys.len() - ok_keys) as u64, Ordering::Relaxed);
    let first_error = outcomes.iter().find_map(|o| o.as_ref().err());
    let message = match first_error {
        Some(e) => {
            let failed = keys.len() - ok_keys;
            format!("{failed} of {} keys failed; first: {}", keys.len(), e.message)
        }
        None => String::new(),
    };
    JobResult {
        job_id,
        kind,
        status: first_error.map_or(Status::Ok, |e| e.status),
        bytes: (ok_keys * pool.block_bytes()) as u64,
        seconds: submitted.elapsed().as_secs_f64(),
        key_status,
        keys,
        message,
    }
}

/// An I/O runtime and a store client built inside it (an HTTP client's connections
/// belong to the runtime that opens them).
fn runtime_with_store(config: &StoreConfig, threads: usize, name: &str, nice: i32) -> Result<(Runtime, DynStore)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .on_thread_start(move || {
            if nice > 0 {
                // SAFETY: a plain syscall on the calling thread's own id.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
            }
        })
        .enable_all()
        .build()
        .map_err(|e| Error::new(Status::Io, format!("cannot start the {name} runtime: {e}")))?;
    let store = {
        let _guard = runtime.enter();
        store::build_store(config)?
    };
    Ok((runtime, store))
}

fn op_error(op: &str, name: &Path, e: &object_store::Error) -> Error {
    if let object_store::Error::JoinError { source } = e {
        // The store's blocking task was abandoned at shutdown: the job is cancelled.
        return Error::join(&format!("{op} {name}"), source);
    }
    // classify maps a 416 / InvalidRange answer to LengthMismatch itself.
    Error::new(store::classify(e), format!("{op} {name}: {}", store::error_chain(e)))
}

/// Loads one block. A checksum mismatch is read again through the general client before
/// anything is concluded: corruption in transit (a bad link, middlebox or NIC) reads clean
/// the second time, and the load succeeds with the verified bytes. A second mismatch fails
/// the key: it turns MISS for every later lookup of this tier and its next store overwrites
/// the object. `fail_and_delete` deletes the object only when both reads returned the same
/// bytes (corrupt in the store); two different wrong reads are corruption in transit.
async fn load_block(shared: &Shared, key: &[u8], name: &Path, pool: &HostPool, block: u64) -> Result<()> {
    let first = match load_block_once(shared, key, name, pool, block).await {
        Err(e) if e.status == Status::Corrupt => e,
        other => return other,
    };
    log::warn!("{}; reading it again to tell corruption in the store from corruption in transit", first.message);
    // The bytes of each read are in the block when it reports a mismatch.
    // SAFETY: the block was bounds-checked at submit; the job owns it until reported.
    let read_crc = || crc32c::crc32c(unsafe { std::slice::from_raw_parts(pool.block_ptr(block), pool.block_bytes()) });
    let first_crc = read_crc();
    match load_block_object_store(shared, key, name, pool, block).await {
        Ok(()) => {
            log::warn!("block {name} read clean the second time: the first read was corrupted in transit");
            Ok(())
        }
        Err(second) if second.status == Status::Corrupt => {
            shared.stats.corrupt_blocks.fetch_add(1, Ordering::Relaxed);
            shared.mark_corrupt(key);
            // The same wrong bytes twice: the object itself is corrupt. Two different wrong
            // reads are corruption in transit (or an object being rewritten): never deleted.
            let same_bytes = read_crc() == first_crc;
            log::warn!(
                "block {name}: two reads failed its checksum{}",
                if same_bytes { ", with the same bytes: corrupt in the store" } else { ", with different bytes" }
            );
            if shared.config.on_corrupt == OnCorrupt::FailAndDelete && same_bytes {
                if let Err(e) = shared.store.delete(name).await {
                    log::warn!("could not delete corrupt block {name}: {e}");
                }
            }
            Err(second)
        }
        Err(second) => Err(Error::new(
            first.status,
            format!("{}; reading it again failed too: {}", first.message, second.message),
        )),
    }
}

async fn load_block_once(shared: &Shared, key: &[u8], name: &Path, pool: &HostPool, block: u64) -> Result<()> {
    if let Some(direct) = &shared.direct {
        let block_bytes = pool.block_bytes();
        // SAFETY: the block was bounds-checked at submit, and this load job holds it alone
        // until its result is polled (JobTable::hold): no other job reads or writes it.
        let dest = unsafe { std::slice::from_raw_parts_mut(pool.block_ptr(block), block_bytes) };
        let verify = shared.config.checksums;
        shared.stats.direct_requests.fetch_add(1, Ordering::Relaxed);
        match direct.get_into(name.as_ref(), dest, verify).await {
            Ok((recorded, loaded)) => {
                // The object's own record first; else what this tier uploaded under the key.
                let expected = if verify { recorded.or_else(|| shared.uploaded_crc().get(key).copied()) } else { None };
                return verify_loaded(shared, name, expected, loaded).await;
            }
            Err(DirectError::Final(status, detail)) => return Err(Error::new(status, format!("load {name}: {detail}"))),
            Err(DirectError::WrongLength(size)) => return Err(length_mismatch(name, size, block_bytes)),
            Err(DirectError::Fallback(why)) => {
                shared.stats.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
                log::debug!("load {name}: direct GET failed ({why}); repeating it through the store client");
            }
        }
    }
    load_block_object_store(shared, key, name, pool, block).await
}

/// A checksum mismatch of one read: what it means is decided by [`load_block`].
async fn verify_loaded(_shared: &Shared, name: &Path, expected: Option<u32>, loaded: u32) -> Result<()> {
    match expected {
        Some(want) if want != loaded => {
            Err(Error::new(
                Status::Corrupt,
                format!("load {name}: checksum {loaded:08x} does not match the recorded {want:08x}"),
            ))
        }
        _ => Ok(()),
    }
}

async fn load_block_object_store(shared: &Shared, key: &[u8], name: &Path, pool: &HostPool, block: u64) -> Result<()> {
    let block_bytes = pool.block_bytes();
    // The whole object, without Range: servers that ignore Range answer 200 either way,
    // and the size in the answer's head settles the length before any byte is read.
    let got = shared.store.get_opts(name, GetOptions::default()).await.map_err(|e| op_error("load", name, &e))?;
    if got.meta.size != block_bytes as u64 {
        return Err(length_mismatch(name, got.meta.size, block_bytes));
    }
    let dest = pool.block_ptr(block) as usize;
    let verify = shared.config.checksums;
    // The object's own record first; else what this tier uploaded under the key.
    let uploaded = if verify { shared.uploaded_crc().get(key).copied() } else { None };
    let expected_crc = if verify { recorded_checksum(&got.attributes).or(uploaded) } else { None };
    let (loaded, expected_crc) = match got.payload {
        GetResultPayload::File(file, _) => {
            let read = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let recorded = if verify { local_checksum(&file).or(uploaded) } else { None };
                // SAFETY: bounds-checked at submit; this load job holds the block alone until
                // its result is polled (JobTable::hold).
                let slot = unsafe { std::slice::from_raw_parts_mut(dest as *mut u8, block_bytes) };
                file.read_exact_at(slot, 0)?;
                Ok::<_, std::io::Error>(recorded.map(|want| (want, crc32c::crc32c(slot))))
            })
            .await
            .map_err(|e| Error::join(&format!("load {name}"), &e))?;
            let checked = read.map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Error::new(Status::LengthMismatch, format!("load {name}: object shorter than {block_bytes} bytes"))
                } else {
                    Error::new(Status::Io, format!("load {name}: {e}"))
                }
            })?;
            match checked {
                Some((want, got)) => (got, Some(want)),
                None => (0, None),
            }
        }
        GetResultPayload::Stream(mut stream) => {
            use futures::StreamExt;
            let mut filled = 0usize;
            let mut crc = 0u32;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| op_error("load", name, &e))?;
                if filled + chunk.len() > block_bytes {
                    return Err(length_mismatch(name, (filled + chunk.len()) as u64, block_bytes));
                }
                // SAFETY: bounds checked just above against the block, which this job owns.
                unsafe {
                    std::ptr::copy_nonoverlapping(chunk.as_ptr(), (dest as *mut u8).add(filled), chunk.len());
                }
                if expected_crc.is_some() {
                    // The chunk is still in cache: checksum it now rather than in a second pass.
                    crc = crc32c::crc32c_append(crc, &chunk);
                }
                filled += chunk.len();
            }
            if filled != block_bytes {
                return Err(length_mismatch(name, filled as u64, block_bytes));
            }
            (crc, expected_crc)
        }
    };
    verify_loaded(shared, name, expected_crc, loaded).await
}

/// Object metadata key of the CRC32C (8 lowercase hex digits) of a block's bytes.
pub const CRC_METADATA: &str = "kvtier-crc32c";
/// The same as an S3 response header.
pub(crate) const CRC_HEADER: &str = "x-amz-meta-kvtier-crc32c";

/// A recorded checksum: 8 hex digits.
pub(crate) fn parse_crc(text: &str) -> Option<u32> {
    u32::from_str_radix(text.trim(), 16).ok()
}
/// Extended attribute holding the same on the local store.
const CRC_XATTR: &std::ffi::CStr = c"user.kvtier.crc32c";

fn recorded_checksum(attributes: &Attributes) -> Option<u32> {
    parse_crc(attributes.get(&Attribute::Metadata(CRC_METADATA.into()))?.as_ref())
}

fn set_local_checksum(path: &std::path::Path, crc: u32) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cpath) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return };
    let value = format!("{crc:08x}");
    let rc = unsafe {
        libc::setxattr(cpath.as_ptr(), CRC_XATTR.as_ptr(), value.as_ptr() as *const libc::c_void, value.len(), 0)
    };
    if rc != 0 {
        static WARNED: std::sync::Once = std::sync::Once::new();
        let err = std::io::Error::last_os_error();
        WARNED.call_once(|| log::warn!("cannot record checksums as extended attributes ({err}); local blocks load with the length check only"));
    }
}

fn local_checksum(file: &std::fs::File) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 16];
    let n = unsafe {
        libc::fgetxattr(file.as_raw_fd(), CRC_XATTR.as_ptr(), buf.as_mut_ptr() as *mut libc::c_void, buf.len())
    };
    if n <= 0 {
        return None;
    }
    std::str::from_utf8(&buf[..n as usize]).ok().and_then(parse_crc)
}

/// Decides the dedup mode: conditional PUT only where the store refuses a second create.
async fn choose_dedup(store: &DynStore, layout: &KeyLayout, configured: Option<DedupMode>, describe: &str) -> Result<DedupMode> {
    if matches!(configured, Some(DedupMode::Off | DedupMode::SkipKnown)) {
        return Ok(configured.unwrap_or(DedupMode::SkipKnown));
    }
    // One fixed name per prefix, beside the probe key (never below it: on file-backed
    // stores a child would turn the probe key into a directory), so that a start whose
    // delete is refused leaves at most this one object behind, whoever started before.
    let path = store::object_path(&format!("{}-conditional-put", layout.probe_name()));
    let create = || PutOptions { mode: PutMode::Create, ..Default::default() };
    let put = || store.put_opts(&path, PutPayload::from_static(b"kvtier"), create());
    let already = |r: &object_store::Result<_>| matches!(r, Err(object_store::Error::AlreadyExists { .. }));
    // A refused create proves the condition is honoured (the object is a leftover, or
    // another tier's probe in progress). A store that ignores it answers OK twice; as
    // another starting tier may delete the object between the two creates, that is asked
    // up to three times before it counts.
    let mut honoured = false;
    for _ in 0..3 {
        let first = put().await;
        honoured = already(&first) || (first.is_ok() && already(&put().await));
        if honoured || first.is_err() {
            break;
        }
    }
    if let Err(e) = store.delete(&path).await {
        if !matches!(e, object_store::Error::NotFound { .. }) {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                log::warn!(
                    "{describe}: cannot delete the start-up probe object {path} ({}); it stays (one object per prefix)",
                    store::error_chain(&e)
                )
            });
        }
    }
    match (honoured, configured) {
        (true, _) => Ok(DedupMode::Conditional),
        (false, Some(DedupMode::Conditional)) => Err(Error::config(format!(
            "dedup is \"conditional\" but {describe} does not honour conditional PUT (If-None-Match: *); use \"skip_known\""
        ))),
        (false, _) => {
            log::info!("{describe} does not honour conditional PUT; dedup falls back to skip_known");
            Ok(DedupMode::SkipKnown)
        }
    }
}

fn length_mismatch(name: &Path, got: u64, want: usize) -> Error {
    Error::new(
        Status::LengthMismatch,
        format!("load {name}: object holds {got} bytes but blocks are {want} bytes"),
    )
}

/// Checks every group's keys concurrently on the lookup lane. A group (one request's keys
/// of one step) whose check fails anywhere answers MISS for all its keys.
async fn check_groups(shared: &Arc<Shared>, groups: Vec<ProbeGroup>) -> Vec<Answer> {
    let missing_is_forbidden = shared.probe == ProbeOutcome::ReadyWithoutList;
    let per_group = futures::future::join_all(groups.into_iter().map(|group| async move {
        let checks = futures::future::join_all(group.probes.iter().map(|probe| async move {
            if shared.is_corrupt(&probe.key) {
                return Ok(false); // the object is corrupt until this tier stores the key again
            }
            let _permit = shared.lookup_permits.acquire().await.map_err(|_| ())?;
            shared.stats.existence_checks.fetch_add(1, Ordering::Relaxed);
            // One name for the direct HEAD, its fallback and every other request.
            let name = store::object_path(&shared.layout.object_name(&probe.key).map_err(|_| ())?);
            if let Some(direct) = &shared.lookup_direct {
                shared.stats.direct_requests.fetch_add(1, Ordering::Relaxed);
                match direct.exists(name.as_ref(), missing_is_forbidden).await {
                    Ok(found) => return Ok(found),
                    Err(e) => {
                        shared.stats.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
                        log::debug!("existence check {name}: direct HEAD failed ({e:?}); repeating it through the store client");
                    }
                }
            }
            store::exists(&shared.lookup_store, &name, missing_is_forbidden).await.map_err(|e| {
                shared.stats.existence_check_errors.fetch_add(1, Ordering::Relaxed);
                log::warn!("existence check failed: {}", e.message);
            })
        }))
        .await;
        let group_failed = checks.iter().any(|c| c.is_err());
        for (probe, found) in group.probes.iter().zip(&checks) {
            if found == &Ok(true) {
                shared.remember(&probe.key);
            }
        }
        group
            .probes
            .into_iter()
            .zip(checks)
            .map(|(probe, found)| Answer {
                key: probe.key,
                generation: probe.generation,
                found: !group_failed && found.unwrap_or(false),
            })
            .collect::<Vec<_>>()
    }))
    .await;
    per_group.into_iter().flatten().collect()
}
