//! The submission pipeline: memory registered for jobs (the host pool, regions), and a
//! job from its submit call to its launch: admitted into the job table, its keys checked,
//! its memory held (blocks or ranges), its transfers started; a job refused on the way
//! still yields its one result.

use super::dispatch::QueuedJob;
use super::*;

impl Tier {
    /// Registers the caller's host pool. Allowed once per tier.
    ///
    /// # Safety
    /// `base .. base + num_blocks * block_bytes` must stay valid until [`shutdown`](Self::shutdown)
    /// returns, and the caller must not write a block while a store job reads it or touch
    /// a block while a load job writes it.
    pub unsafe fn register_memory(
        &self,
        base: *mut u8,
        num_blocks: u64,
        block_bytes: usize,
    ) -> Result<()> {
        if self.is_shut_down() {
            return Err(Error::new(
                Status::ShutDown,
                "register_memory after shutdown",
            ));
        }
        // SAFETY: this function's own contract, passed on.
        let pool = unsafe { HostPool::new(base, num_blocks, block_bytes)? };
        // Under the table's lock, as regions are added: a region and the pool are never
        // registered at once without one seeing the other.
        let mut table = self.shared.table();
        self.shared
            .pool
            .set(pool)
            .map_err(|_| Error::state("memory is already registered; a tier has one host pool"))?;
        table.pool_registered(pool.memory());
        Ok(())
    }

    pub fn pool(&self) -> Option<HostPool> {
        self.shared.pool.get().copied()
    }

    /// Submits a job moving `keys[i]` to or from block `block_ids[i]` of the pool.
    ///
    /// Never blocks. Unless it returns `DuplicateJob`, exactly one result for `job_id`
    /// will come out of [`poll`](Self::poll), also when this returns an error.
    pub fn submit(
        &self,
        kind: JobKind,
        job_id: u64,
        block_ids: &[u64],
        keys: KeyBatch,
    ) -> Result<()> {
        let submitted = self.admit(kind, job_id, &keys)?;
        let held = self
            .prepare(&keys)
            .and_then(|()| self.hold_blocks(kind, job_id, block_ids, &keys));
        self.launch_held(kind, job_id, keys, held, submitted)
    }

    /// Submits a job moving `keys[i]` to or from the memory
    /// `ranges[i * ranges_per_key .. (i + 1) * ranges_per_key]`, whose concatenation is the
    /// key's object: the same object a pool block of the same bytes gives.
    ///
    /// Same guarantees as [`submit`](Self::submit). A load may not overlap memory another
    /// job holds (or that another key of the same load names); stores may share it.
    pub fn submit_ranges(
        &self,
        kind: JobKind,
        job_id: u64,
        ranges: &[MemoryRange],
        ranges_per_key: usize,
        keys: KeyBatch,
    ) -> Result<()> {
        let submitted = self.admit(kind, job_id, &keys)?;
        let held = self
            .prepare(&keys)
            .and_then(|()| self.hold_ranges(kind, job_id, ranges, ranges_per_key, &keys));
        self.launch_held(kind, job_id, keys, held, submitted)
    }

    fn launch_held(
        &self,
        kind: JobKind,
        job_id: u64,
        keys: KeyBatch,
        held: Result<Vec<BlockMemory>>,
        submitted: Instant,
    ) -> Result<()> {
        match held {
            Ok(memory) => self.launch(kind, job_id, memory, keys, submitted),
            Err(e) => {
                self.fail_admitted(job_id, kind, keys, &e);
                Err(e)
            }
        }
    }

    /// Registers `len` bytes at `base` as a region that jobs name ranges of, and returns
    /// its id. Regions may be added at any time before shutdown, and may overlap each
    /// other and the pool (what jobs hold is checked by address).
    ///
    /// # Safety
    /// `base .. base + len` must stay valid until the region is removed with
    /// [`remove_region`](Self::remove_region) or the tier is shut down, and the caller must
    /// not write a range while a store job reads it or touch it while a load job writes it.
    pub unsafe fn add_region(&self, base: *mut u8, len: usize) -> Result<u64> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "add_region after shutdown"));
        }
        // The pool is read under the table's lock, under which it is registered.
        let mut table = self.shared.table();
        let pool = self.pool().map(|pool| pool.memory());
        table.add_region(base, len, pool)
    }

    /// Forgets a region, so that its memory may be freed. Refused (`BlockBusy`) while a job
    /// whose result has not been polled holds a range of it; an unknown id is `Invalid`.
    pub fn remove_region(&self, region: u64) -> Result<()> {
        let mut table = self.shared.table();
        if !table.regions.contains(region) {
            return table.remove_region(region);
        }
        let jobs = table.holds.jobs_using(region);
        if jobs > 0 {
            return Err(Error::new(
                Status::BlockBusy,
                format!(
                    "region {region} holds ranges of {jobs} jobs whose results have not been polled; poll them first"
                ),
            ));
        }
        table.remove_region(region)
    }

    /// Records a job that was rejected before its arguments could be read (NULL pointers
    /// at the C boundary), so that it still yields its one failed result.
    pub fn submit_rejected(
        &self,
        kind: JobKind,
        job_id: u64,
        num_keys: usize,
        error: Error,
    ) -> Error {
        let keys = KeyBatch::empty();
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

    /// Enters the job in the table; returns when it was submitted.
    fn admit(&self, kind: JobKind, job_id: u64, keys: &KeyBatch) -> Result<Instant> {
        let submitted = Instant::now();
        let mut table = self.shared.table();
        if table.jobs.contains_key(&job_id) {
            return Err(Error::new(
                Status::DuplicateJob,
                format!(
                    "job id {job_id} already has a result pending; poll it before reusing the id"
                ),
            ));
        }
        table.jobs.insert(
            job_id,
            Phase::Running {
                kind,
                keys: keys.clone(),
                submitted,
            },
        );
        table.running += 1;
        Ok(submitted)
    }

    fn fail_admitted(&self, job_id: u64, kind: JobKind, keys: KeyBatch, error: &Error) {
        self.shared.finish(failed_result(job_id, kind, keys, error));
    }

    /// Checks what every job is checked for, whatever memory it names: the tier is open,
    /// and the keys are as many as allowed, of the configured length, and well formed.
    fn prepare(&self, keys: &KeyBatch) -> Result<()> {
        if self.is_shut_down() {
            return Err(Error::new(Status::ShutDown, "submit after shutdown"));
        }
        if keys.is_empty() {
            return Err(Error::invalid("a job needs at least one key"));
        }
        if keys.len() > MAX_KEYS_PER_JOB {
            return Err(Error::invalid(format!(
                "a job has at most {MAX_KEYS_PER_JOB} keys; this one has {}",
                keys.len()
            )));
        }
        let expected = self.shared.config.key_bytes;
        if expected != 0 && keys.key_len() != expected {
            return Err(Error::invalid(format!(
                "keys are {} bytes but this tier is configured for key_bytes = {expected}",
                keys.key_len()
            )));
        }
        // Only validation here: the object names are built on the I/O side (`run_job`), so
        // the caller's thread pays neither the hex formatting nor the path allocations.
        for key in keys.iter() {
            split_key(key)?;
        }
        Ok(())
    }

    /// Checks `block_ids` against the pool and holds them for the job.
    fn hold_blocks(
        &self,
        kind: JobKind,
        job_id: u64,
        block_ids: &[u64],
        keys: &KeyBatch,
    ) -> Result<Vec<BlockMemory>> {
        let pool = self.shared.pool.get().ok_or_else(|| {
            Error::state("no memory registered: call register_memory before submitting jobs")
        })?;
        if keys.len() != block_ids.len() {
            return Err(Error::invalid(format!(
                "{} keys but {} block ids; a job moves one block per key",
                keys.len(),
                block_ids.len()
            )));
        }
        for &block in block_ids {
            pool.check_block(block)?;
        }
        let memory: Vec<BlockMemory> = block_ids.iter().map(|&b| pool.block(b)).collect();
        // A block is one piece: a job of one key holds its block's own slice.
        let gathered: Vec<Piece>;
        let pieces = match memory.as_slice() {
            [one] => one.pieces(),
            _ => {
                gathered = memory.iter().flat_map(|m| m.pieces()).copied().collect();
                &gathered
            }
        };
        self.shared
            .table()
            .holds
            .hold(kind, job_id, pieces, &[])
            .map_err(|c| {
                let block = block_ids[c.piece];
                if c.job_id == job_id {
                    Error::invalid(format!(
                        "block id {block} appears twice in one load job; two keys cannot load into one block"
                    ))
                } else {
                    c.error(&format!("block {block}"))
                }
            })?;
        Ok(memory)
    }

    /// Checks `ranges` against their regions and holds them for the job, under one lock,
    /// so that no region is removed in between.
    fn hold_ranges(
        &self,
        kind: JobKind,
        job_id: u64,
        ranges: &[MemoryRange],
        ranges_per_key: usize,
        keys: &KeyBatch,
    ) -> Result<Vec<BlockMemory>> {
        if ranges_per_key == 0 || ranges_per_key > MAX_RANGES_PER_KEY {
            return Err(Error::invalid(format!(
                "ranges_per_key is {ranges_per_key}; a key's object is 1 to {MAX_RANGES_PER_KEY} ranges"
            )));
        }
        if keys.len().checked_mul(ranges_per_key) != Some(ranges.len())
            || ranges.len() > MAX_RANGES_PER_JOB
        {
            return Err(Error::invalid(format!(
                "{} keys of {ranges_per_key} ranges need {} ranges, at most {MAX_RANGES_PER_JOB} a job; {} were given",
                keys.len(),
                keys.len() as u128 * ranges_per_key as u128,
                ranges.len()
            )));
        }
        let mut table = self.shared.table();
        let mut pieces = Vec::with_capacity(ranges.len());
        for (i, range) in ranges.iter().enumerate() {
            let piece = table.regions.resolve(range).map_err(|e| {
                Error::new(
                    e.status,
                    format!("range {i} (of key {}): {}", i / ranges_per_key, e.message),
                )
            })?;
            pieces.push(piece);
        }
        let memory: Vec<BlockMemory> = pieces
            .chunks_exact(ranges_per_key)
            .map(|p| BlockMemory::new(p.to_vec()))
            .collect();
        // Each piece lies inside a region of at most isize::MAX bytes, but a key's pieces
        // together may not fit.
        if let Some(k) = memory.iter().position(|m| m.len() > isize::MAX as usize) {
            return Err(Error::invalid(format!(
                "key {k}'s ranges add up to more than isize::MAX bytes"
            )));
        }
        let regions: Vec<u64> = ranges.iter().map(|r| r.region).collect();
        table
            .holds
            .hold(kind, job_id, &pieces, &regions)
            .map_err(|c| {
                let r = &ranges[c.piece];
                let what = format!(
                    "range {} (of key {}: region {}, bytes {}..{})",
                    c.piece,
                    c.piece / ranges_per_key,
                    r.region,
                    r.offset,
                    r.offset as u128 + r.len as u128
                );
                if c.job_id == job_id {
                    Error::invalid(format!(
                        "{what} overlaps another range of the same load job; two keys cannot load into the same bytes"
                    ))
                } else {
                    c.error(&what)
                }
            })?;
        Ok(memory)
    }

    fn launch(
        &self,
        kind: JobKind,
        job_id: u64,
        memory: Vec<BlockMemory>,
        keys: KeyBatch,
        submitted: Instant,
    ) -> Result<()> {
        let runtime = self.runtime.read().unwrap_or_else(|p| p.into_inner());
        if runtime.is_none() {
            let e = Error::new(Status::ShutDown, "submit after shutdown");
            self.fail_admitted(job_id, kind, keys, &e);
            return Err(e);
        }
        // The runtime lock is held while queueing: shutdown, which takes it first, sweeps
        // the job table only after this job is in the dispatcher's queue or refused.
        self.dispatch.queue(QueuedJob {
            kind,
            job_id,
            memory,
            keys,
            submitted,
        });
        Ok(())
    }
}
