//! The job table: jobs whose result has not been polled, the memory they hold, and the
//! ready fd that signals results. What a job is (kind, keys, result) is `job`'s.

use std::os::fd::RawFd;
use std::time::Instant;

use rustc_hash::FxHashMap;

use super::holds::Holds;
use super::job::{JobKind, JobResult, KeyBatch};
use crate::error::{Error, Result, Status};
use crate::memory::{Piece, Regions};

pub(crate) enum Phase {
    Running {
        kind: JobKind,
        keys: KeyBatch,
        submitted: Instant,
    },
    Finished,
}

#[derive(Default)]
pub(crate) struct JobTable {
    /// Every job id submitted and not yet handed out by `poll`.
    pub(crate) jobs: FxHashMap<u64, Phase>,
    pub(crate) running: usize,
    /// Callers waiting in `drain` for `running` to reach 0 (woken by finishing jobs).
    pub(crate) draining: usize,
    /// Memory registered besides the pool. Under the table's lock, so that a region is
    /// never removed between a submit resolving a range of it and holding that range.
    pub(crate) regions: Regions,
    /// The caller memory held by jobs whose result has not been polled.
    pub(crate) holds: Holds,
}

impl JobTable {
    /// Registers `len` bytes at `base` as a region (see [`Regions::add`]); `pool` is the
    /// registered pool's memory, if any, which the region may overlap.
    pub(crate) fn add_region(
        &mut self,
        base: *mut u8,
        len: usize,
        pool: Option<Piece>,
    ) -> Result<u64> {
        let id = self.regions.add(base, len)?;
        let region = Piece {
            addr: base as usize,
            len,
        };
        let neighbours = self.regions.overlapping(region, id);
        let over_pool = pool.is_some_and(|pool| pool.overlaps(region));
        for neighbour in &neighbours {
            self.holds.share(*neighbour);
        }
        self.holds
            .region_added(id, neighbours.is_empty() && !over_pool);
        Ok(id)
    }

    /// Forgets a region that no job holds.
    pub(crate) fn remove_region(&mut self, id: u64) -> Result<()> {
        self.regions.remove(id)?;
        self.holds.region_removed(id);
        Ok(())
    }

    /// The pool was registered: regions over its memory are checked against it from now on.
    pub(crate) fn pool_registered(&mut self, pool: Piece) {
        for region in self.regions.overlapping(pool, 0) {
            self.holds.share(region);
        }
    }
}

/// Readable exactly while results wait to be polled: `finish` raises it when the queue
/// turns non-empty, `poll` clears it when it empties the queue, both through
/// `TierState::sync_ready`, so the caller pays at most one syscall per poll.
pub(crate) struct ReadyFd(RawFd);

impl ReadyFd {
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: a plain syscall with constant flags.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::new(
                Status::Io,
                format!("eventfd: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(ReadyFd(fd))
    }
    pub(crate) fn raise(&self) {
        let one: u64 = 1;
        // SAFETY: the eventfd this value owns, and an 8-byte buffer as eventfd requires.
        unsafe { libc::write(self.0, &one as *const u64 as *const libc::c_void, 8) };
    }
    pub(crate) fn clear(&self) {
        let mut value: u64 = 0;
        // SAFETY: the eventfd this value owns, and an 8-byte buffer as eventfd requires.
        unsafe { libc::read(self.0, &mut value as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl ReadyFd {
    pub(crate) fn fd(&self) -> RawFd {
        self.0
    }
}

impl Drop for ReadyFd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is owned by this value and closed once, here.
        unsafe { libc::close(self.0) };
    }
}

pub(crate) fn failed_result(
    job_id: u64,
    kind: JobKind,
    keys: KeyBatch,
    error: &Error,
) -> JobResult {
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
