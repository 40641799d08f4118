//! Jobs: what a caller submits (kind, keys, blocks), the one result each job yields, the
//! table of jobs whose result has not been polled, and the ready fd that signals results.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use rustc_hash::FxHashMap;

use super::holds::Holds;
use crate::error::{Error, Result, Status};
use crate::memory::{Piece, Regions};

/// Most keys one job may carry.
pub const MAX_KEYS_PER_JOB: usize = 1 << 20;

/// Direction of a job.
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
        if key_len == 0 || !bytes.len().is_multiple_of(key_len) {
            return Err(Error::invalid(format!(
                "{} key bytes do not divide into keys of {key_len} bytes",
                bytes.len()
            )));
        }
        Ok(KeyBatch {
            bytes: bytes.into(),
            key_len,
        })
    }

    pub fn from_keys<K: AsRef<[u8]>>(keys: &[K]) -> Result<Self> {
        let key_len = keys.first().map(|k| k.as_ref().len()).unwrap_or(1);
        let mut bytes = Vec::with_capacity(key_len * keys.len());
        for k in keys {
            if k.as_ref().len() != key_len {
                return Err(Error::invalid(
                    "all keys of a job must have the same length",
                ));
            }
            bytes.extend_from_slice(k.as_ref());
        }
        Self::new(&bytes, key_len)
    }

    /// A batch of no keys (a job rejected before its keys could be read).
    pub(crate) fn empty() -> Self {
        KeyBatch {
            bytes: Arc::from(&[][..]),
            key_len: 1,
        }
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
#[non_exhaustive]
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
        self.keys
            .iter()
            .zip(&self.key_status)
            .filter(|(_, s)| s.is_ok())
            .map(|(k, _)| k)
    }
}

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

/// Readable exactly while results wait to be polled. Both sides change it under the job
/// table lock: `finish` raises it when the queue turns non-empty, `poll` clears it when it
/// empties the queue, so the caller pays at most one syscall per poll.
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
