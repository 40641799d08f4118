//! The tier engine: job table, I/O runtime and completion queue.
//!
//! Submission runs on the caller's thread and only validates and queues; a dispatcher task
//! spawns the jobs, and the I/O runs on the tier's own tokio runtime; completions come
//! back through a crossbeam channel, with an eventfd that is readable while results wait.
//!
//! Rooms: `jobs` (what is submitted and what comes back), `holds` (the caller memory that
//! jobs not yet polled hold), `dispatch` (from a submit to the job's task), `transfer`
//! (moving blocks), `dedup` (what the tier remembers about keys), `lookup` (non-blocking
//! existence lookups), `events`, `stats`, `runtime`.

mod dedup;
mod dispatch;
mod events;
mod eviction;
mod holds;
mod job;
mod jobs;
mod lookup;
mod metrics;
mod pins;
mod runtime;
mod shutdown;
mod stats;
mod submit;
mod transfer;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

use crate::config::{StoreConfig, TierConfig};
use crate::encryption::Encryption;
use crate::error::{Error, Result, Status};
use crate::key::{split_key, KeyLayout};
use crate::memory::{
    BlockMemory, CallerMemoryFence, HostPool, MemoryRange, Piece, MAX_RANGES_PER_JOB,
    MAX_RANGES_PER_KEY,
};
use crate::store::{Lane, ProbeOutcome, Store, UploadCheck};
use dedup::Dedup;
use jobs::{failed_result, JobTable, Phase, ReadyFd};
use lookup::{Existence, LookupTable};

pub use events::{KvEvent, EVENT_MEDIUM};
pub use eviction::{choose_evictions, EvictionCandidate, EvictionReason, EvictionReport};
pub use job::{JobKind, JobResult, KeyBatch, MAX_KEYS_PER_JOB};
pub use lookup::LookupResult;
pub use runtime::is_tier_thread;
pub use stats::{StatsField, StatsSnapshot, STATS_FIELDS};

/// What the caller's side and the I/O side of a tier share.
pub(crate) struct TierState {
    /// The store of the transfer lane.
    store: Arc<Store>,
    /// The store client of the lookup lane (its own when the lane is separate:
    /// connections belong to the runtime that opened them).
    lookup_store: Arc<Store>,
    layout: KeyLayout,
    config: TierConfig,
    probe: ProbeOutcome,
    /// Whether the store refuses an upload damaged in transit (probed at start).
    upload_check: UploadCheck,
    pool: OnceLock<HostPool>,
    transfer_permits: Semaphore,
    lookup_permits: Semaphore,
    table: Mutex<JobTable>,
    table_changed: Condvar,
    results_tx: Sender<JobResult>,
    ready: ReadyFd,
    /// Whether `ready` is raised; its lock orders the raises and clears (see
    /// [`TierState::sync_ready`]).
    ready_raised: Mutex<bool>,
    closing: AtomicBool,
    answers_tx: Sender<Vec<Existence>>,
    stats: stats::Stats,
    metrics: metrics::Metrics,
    dedup: Dedup,
    events: events::EventQueue,
    /// Encryption at rest, when configured.
    encryption: Option<Arc<Encryption>>,
    /// Every write into caller memory happens inside it; shutdown closes it once the grace
    /// period is over (see [`Tier::shutdown`]).
    caller_memory: Arc<CallerMemoryFence>,
    /// Keys this tier's eviction keeps ([`Tier::pin_keys`]).
    pins: pins::Pins,
}

struct Lookups {
    table: LookupTable,
    answers_rx: Receiver<Vec<Existence>>,
}

impl Lookups {
    fn apply_answers(&mut self) {
        while let Ok(batch) = self.answers_rx.try_recv() {
            self.table.apply(batch);
        }
    }
}

impl TierState {
    async fn transfer_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.transfer_permits.acquire().await.map_err(|_| {
            Error::new(
                Status::Cancelled,
                "the tier shut down before the transfer started",
            )
        })
    }

    /// The transfer lane as a transfer starting now (its permit held) finds it: how many
    /// transfers are in flight, of `max_inflight_transfers`. The store decides from it and
    /// from the link how the transfer goes (in parts on connections of their own, or as one
    /// request): parts fill a link the caller's jobs leave idle, within the lane's bound.
    fn transfer_lane(&self) -> Lane {
        let most = self.config.max_inflight_transfers;
        Lane {
            in_flight: most.saturating_sub(self.transfer_permits.available_permits()),
            most,
        }
    }

    fn table(&self) -> MutexGuard<'_, JobTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes a job's one result. A second finish for the same id is dropped.
    fn finish(&self, result: JobResult) {
        self.metrics
            .job_finished(result.kind, result.seconds, &result.key_status);
        let mut table = self.table();
        match table.jobs.get_mut(&result.job_id) {
            Some(phase @ Phase::Running { .. }) => {
                *phase = Phase::Finished;
                table.running -= 1;
            }
            _ => {
                log::error!(
                    "job {} finished twice; second result dropped",
                    result.job_id
                );
                return;
            }
        }
        let _ = self.results_tx.send(result);
        let drained = table.draining > 0;
        drop(table);
        // Outside the table's lock: the wake-up of a caller waiting on the fd is not paid
        // while the caller's next submit or poll waits for the lock.
        self.sync_ready();
        if drained {
            self.table_changed.notify_all();
        }
    }

    /// Makes the ready fd readable exactly when results wait: whoever changed the queue
    /// (a finish adding to it, a poll taking from it) calls this afterwards, so the last
    /// call sees the queue as it stays, and its lock keeps a raise and a clear from
    /// crossing. The caller pays at most one syscall per poll that empties the queue.
    fn sync_ready(&self) {
        let mut raised = self.ready_raised.lock().unwrap_or_else(|p| p.into_inner());
        let waiting = !self.results_tx.is_empty();
        if waiting != *raised {
            if waiting {
                self.ready.raise();
            } else {
                self.ready.clear();
            }
            *raised = waiting;
        }
    }
}

/// A secondary KV-cache tier.
///
/// All methods take `&self`; the tier is `Send + Sync`. `poll` must not run concurrently
/// with itself if the caller relies on result order.
pub struct Tier {
    shared: Arc<TierState>,
    runtime: RwLock<Option<Runtime>>,
    /// Where submits hand jobs to the I/O runtime.
    dispatch: dispatch::Dispatch,
    /// The lookup lane's own runtime (one thread) and HTTP client, so that existence
    /// checks neither queue behind transfer tasks nor wait for a pooled connection.
    lookup_runtime: RwLock<Option<Runtime>>,
    results_rx: Receiver<JobResult>,
    lookups: Mutex<Lookups>,
}

impl Tier {
    /// Parses `json`, builds the store and probes it.
    pub fn from_json(json: &str) -> Result<Tier> {
        Tier::new(TierConfig::from_json(json)?)
    }

    pub fn new(config: TierConfig) -> Result<Tier> {
        config.validate()?;
        let layout = KeyLayout::new(&config.prefix, &config.namespace)?;
        // The keyring before the store: a tier that cannot encrypt does not start.
        let encryption = config
            .encryption
            .as_ref()
            .map(Encryption::open)
            .transpose()?
            .map(Arc::new);
        let (runtime, store) = runtime::runtime_with_store(
            &config.store,
            config.runtime_threads,
            config.file_io_threads,
            runtime::Lane::Transfers,
            config.transfer_thread_nice,
        )?;
        let probe_name = layout.probe_name();
        let (probe, dedup_mode, upload_check) = runtime::block_on_caller_thread(&runtime, async {
            let probe = store.probe(&probe_name).await?;
            let dedup_mode = dedup::choose_mode(&store, &probe_name, config.dedup).await?;
            Ok::<_, Error>((probe, dedup_mode, store.checks_uploads(&probe_name).await))
        })?;
        if let UploadCheck::HeaderRefused(answer) = &upload_check {
            return Err(Error::config(format!(
                "{} refuses a PUT that carries the checksum header x-amz-checksum-crc64nvme ({answer}): \
                 if it does not support S3's additional checksums, set store.req_checksum to \"required\"",
                store.describe()
            )));
        }
        let store = Arc::new(store);
        let (lookup_runtime, lookup_store) = if config.separate_lookup_lane
            && !matches!(config.store, StoreConfig::Local(_) | StoreConfig::Memory(_))
        {
            let (lane, lane_store) =
                runtime::runtime_with_store(&config.store, 1, 1, runtime::Lane::Lookups, 0)?;
            (Some(lane), Arc::new(lane_store))
        } else {
            (None, store.clone())
        };
        let (results_tx, results_rx) = crossbeam_channel::unbounded();
        let (answers_tx, answers_rx) = crossbeam_channel::unbounded();
        log::info!("kvtier tier ready on {}", store.describe());
        // The local store's threads copy between blocks and their buffers inside it.
        let caller_memory = store.caller_memory_fence().unwrap_or_default();
        let shared = Arc::new(TierState {
            store,
            lookup_store,
            layout,
            transfer_permits: Semaphore::new(config.max_inflight_transfers),
            lookup_permits: Semaphore::new(config.max_inflight_lookups),
            dedup: Dedup::new(
                dedup_mode,
                config.known_keys_capacity,
                std::time::Duration::from_millis(config.known_keys_ttl_ms),
            ),
            config,
            probe,
            upload_check,
            pool: OnceLock::new(),
            table: Mutex::new(JobTable::default()),
            table_changed: Condvar::new(),
            results_tx,
            ready: ReadyFd::new()?,
            ready_raised: Mutex::new(false),
            closing: AtomicBool::new(false),
            answers_tx,
            stats: stats::Stats::default(),
            metrics: metrics::Metrics::default(),
            events: events::EventQueue::default(),
            encryption,
            caller_memory,
            pins: pins::Pins::default(),
        });
        if let Some(encryption) = &shared.encryption {
            if let Some(interval) = encryption.refresh_interval() {
                drop(runtime.spawn(refresh_keyring(encryption.clone(), interval)));
            }
        }
        if let Some(eviction) = shared.config.eviction.clone() {
            // On the lookup lane when there is one: listing never competes with transfers.
            let task = eviction::run(shared.clone(), eviction);
            match &lookup_runtime {
                Some(lane) => drop(lane.spawn(task)),
                None => drop(runtime.spawn(task)),
            }
        }
        let dispatch = dispatch::Dispatch::start(&runtime, shared.clone());
        Ok(Tier {
            shared,
            runtime: RwLock::new(Some(runtime)),
            dispatch,
            lookup_runtime: RwLock::new(lookup_runtime),
            results_rx,
            lookups: Mutex::new(Lookups {
                table: LookupTable::default(),
                answers_rx,
            }),
        })
    }

    pub fn config(&self) -> &TierConfig {
        &self.shared.config
    }

    pub fn layout(&self) -> &KeyLayout {
        &self.shared.layout
    }

    /// The store the tier writes to and reads from.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Whether the store refuses an upload whose body was damaged in transit, as the
    /// start-up probe found.
    pub fn upload_check(&self) -> UploadCheck {
        self.shared.upload_check.clone()
    }

    /// The dedup mode in force: the configured one, or `SkipKnown` where the start-up
    /// probe found that the store does not honour conditional PUT.
    pub fn dedup_mode(&self) -> crate::config::DedupMode {
        self.shared.dedup.mode
    }

    /// Whether start-up found that missing keys answer 403 (no ListBucket permission).
    pub fn missing_keys_are_forbidden(&self) -> bool {
        self.shared.probe == ProbeOutcome::ReadyWithoutList
    }

    pub fn is_shut_down(&self) -> bool {
        self.shared.closing.load(Ordering::Acquire)
    }

    /// Takes up to `max` finished jobs. Each job is returned exactly once.
    pub fn poll(&self, max: usize) -> Vec<JobResult> {
        // Sized for what waits now: no regrowth while results are moved out.
        let mut out = Vec::with_capacity(self.results_rx.len().min(max));
        // Under the table lock, `finish` is either wholly done or not begun.
        let mut table = self.shared.table();
        while out.len() < max {
            match self.results_rx.try_recv() {
                Ok(result) => {
                    table.jobs.remove(&result.job_id);
                    table.holds.release(result.job_id);
                    out.push(result);
                }
                Err(_) => break,
            }
        }
        drop(table);
        if !out.is_empty() {
            self.shared.sync_ready();
        }
        self.after_poll(&out);
        out
    }

    /// Applies finished jobs to lookups and events, in vLLM's order: failed load keys
    /// become MISS for the requests holding them; successful stores yield one event.
    fn after_poll(&self, results: &[JobResult]) {
        let failed_loads = results
            .iter()
            .any(|r| r.kind == JobKind::Load && !r.succeeded());
        if failed_loads {
            let mut lookups = self.lookups();
            for r in results.iter().filter(|r| r.kind == JobKind::Load) {
                let failed = r
                    .keys
                    .iter()
                    .zip(&r.key_status)
                    .filter(|(_, s)| !s.is_ok())
                    .map(|(k, _)| k);
                lookups.table.mark_miss(failed);
            }
        }
        if self.shared.config.enable_kv_events {
            for r in results
                .iter()
                .filter(|r| r.kind == JobKind::Store && r.succeeded())
            {
                let locality = self.shared.config.locality;
                self.shared.events.push(KvEvent {
                    job_id: r.job_id,
                    keys: r.keys.clone(),
                    locality,
                    removed: false,
                });
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

    /// Many lookups at once, as [`lookup`](Self::lookup) one after the other would answer
    /// them: `keys[i]` for `requests[i]`, one verdict each, in order. The keys have one
    /// length, checked once; the lookup state's lock is taken once.
    pub fn lookup_batch(&self, requests: &[u64], keys: &[&[u8]]) -> Result<Vec<LookupResult>> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "lookup after shutdown"));
        }
        if requests.len() != keys.len() {
            return Err(Error::invalid(format!(
                "{} request ids for {} keys",
                requests.len(),
                keys.len()
            )));
        }
        if let Some(first) = keys.first() {
            self.check_key(first)?;
            if keys.iter().any(|k| k.len() != first.len()) {
                return Err(Error::invalid(
                    "the keys of one lookup batch have one length",
                ));
            }
        }
        let mut lookups = self.lookups();
        lookups.apply_answers();
        Ok(requests
            .iter()
            .zip(keys)
            .map(|(&request, key)| lookups.table.lookup(request, key))
            .collect())
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
        if self.on_lookup_lane(|lane| lookup::start_checks(&self.shared, groups, lane)) {
            Ok(())
        } else {
            Err(Error::new(Status::ShutDown, "schedule_end after shutdown"))
        }
    }

    /// Runs `start` with the lookup lane's runtime (the transfer runtime when the lane
    /// has none of its own); false, without running it, after shutdown. `start` runs while
    /// the runtime's lock is held, so shutdown cannot drop the runtime in between.
    fn on_lookup_lane(&self, start: impl FnOnce(&tokio::runtime::Handle)) -> bool {
        let lane = self
            .lookup_runtime
            .read()
            .unwrap_or_else(|p| p.into_inner());
        match lane.as_ref() {
            Some(rt) => {
                start(rt.handle());
                true
            }
            None => self.with_runtime(|rt| start(rt.handle())).is_some(),
        }
    }

    /// Checks `keys` in the store now, all at once on the lookup lane, and blocks until
    /// every check has answered or `timeout` has passed: one verdict per key, in order,
    /// `Hit` or `Miss` as the store answered, `Retry` where the check failed or had not
    /// answered in time. For engines whose existence call is synchronous (SGLang's
    /// `batch_exists`); it shares nothing with the per-request lookups. Must not be
    /// called from the tier's own threads.
    pub fn check_now<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        timeout: Duration,
    ) -> Result<Vec<LookupResult>> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "check_now after shutdown"));
        }
        if is_tier_thread(&std::thread::current()) {
            return Err(Error::invalid(
                "check_now blocks, so it must not be called from one of the tier's threads",
            ));
        }
        if keys.len() > MAX_KEYS_PER_JOB {
            return Err(Error::invalid(format!(
                "a check has at most {MAX_KEYS_PER_JOB} keys; this one has {}",
                keys.len()
            )));
        }
        let mut shared_keys = Vec::with_capacity(keys.len());
        for key in keys {
            self.check_key(key.as_ref())?;
            shared_keys.push(lookup::SharedKey::from(key.as_ref()));
        }
        if shared_keys.is_empty() {
            return Ok(Vec::new());
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let learned = self.shared.clone();
        let done = move |keys: Vec<lookup::SharedKey>, verdicts: Vec<lookup::Verdict>| {
            lookup::learn(&learned, keys.iter().map(|k| &**k).zip(verdicts.iter()));
            // The caller may have stopped waiting (timed out): then nobody receives.
            let _ = tx.try_send(verdicts);
        };
        let checked = shared_keys.clone();
        let started = self.on_lookup_lane(|lane| {
            lookup::spawn_checks(&self.shared, shared_keys, lane, move |v| done(checked, v))
        });
        if !started {
            return Err(Error::new(Status::ShutDown, "check_now after shutdown"));
        }
        let to_result = |v: &lookup::Verdict| match v {
            Ok(true) => LookupResult::Hit,
            Ok(false) => LookupResult::Miss,
            Err(()) => LookupResult::Retry,
        };
        match rx.recv_timeout(timeout) {
            Ok(verdicts) => Ok(verdicts.iter().map(to_result).collect()),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                Ok(vec![LookupResult::Retry; keys.len()])
            }
            // The runtime was dropped with the checks (a shutdown on another thread).
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(Error::new(
                Status::ShutDown,
                "the tier shut down during the check",
            )),
        }
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

    /// Takes up to `max` of the BlockStored and BlockRemoved events recorded so far,
    /// oldest first.
    pub fn take_events(&self, max: usize) -> Vec<KvEvent> {
        self.shared.events.take(max, false)
    }

    /// Takes up to `max` BlockStored events, oldest first; BlockRemoved events on the way
    /// are dropped (the interface of hosts that know only stored blocks).
    pub fn take_stored_events(&self, max: usize) -> Vec<KvEvent> {
        self.shared.events.take(max, true)
    }

    /// The tier's metrics in the Prometheus text exposition format (version 0.0.4): the
    /// counters of [`stats`](Self::stats) as `kvtier_<name>_total`, failed keys by status,
    /// jobs in flight, and histograms of job latency, existence-check latency and object
    /// sizes.
    pub fn metrics(&self) -> String {
        let gauges = metrics::Gauges {
            jobs_in_flight: self.jobs_in_flight(),
            lookups_tracked: self.tracked_lookup_keys(),
        };
        self.shared.metrics.render(&self.stats(), &gauges)
    }

    pub fn stats(&self) -> StatsSnapshot {
        let mut snapshot = self.shared.stats.snapshot();
        // The direct path's and the HTTP client's counters live with the stores that count
        // them.
        let mut stores = vec![&self.shared.store];
        if !Arc::ptr_eq(&self.shared.store, &self.shared.lookup_store) {
            stores.push(&self.shared.lookup_store);
        }
        for store in stores {
            let direct = store.direct_counts();
            snapshot.direct_requests += direct.requests;
            snapshot.direct_fallbacks += direct.fallbacks;
            snapshot.retries += store.retries();
            snapshot.damaged_uploads += store.damaged_uploads();
        }
        snapshot
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
        self.shared.ready.fd()
    }

    /// Where the tier's objects are, for logs and metrics labels: the store in words
    /// ([`Store::describe`](crate::store::Store::describe)) and the prefix/namespace its
    /// objects live under. Never holds a credential.
    pub fn location(&self) -> String {
        let store = self.shared.store.describe();
        match self.shared.layout.base() {
            "" => store.to_string(),
            base => format!("{store}, objects under {base}/"),
        }
    }

    /// Jobs submitted and not yet finished.
    pub fn jobs_in_flight(&self) -> usize {
        self.shared.table().running
    }

    /// Waits until no job is in flight. Results stay queued for `poll`.
    pub fn drain(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut table = self.shared.table();
        // Finishing jobs wake this wait only while it is counted.
        table.draining += 1;
        let drained = loop {
            if table.running == 0 {
                break Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(Error::new(
                    Status::Timeout,
                    format!(
                        "{} jobs still in flight after {} ms",
                        table.running,
                        timeout.as_millis()
                    ),
                ));
            }
            table = self
                .shared
                .table_changed
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        table.draining -= 1;
        drained
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

/// Reads the keyring again every `interval` (a file read or a command: on a blocking
/// thread), for as long as the tier's runtime runs.
async fn refresh_keyring(encryption: Arc<Encryption>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let encryption = encryption.clone();
        let _ = tokio::task::spawn_blocking(move || encryption.refresh()).await;
    }
}
