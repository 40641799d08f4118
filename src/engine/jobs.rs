//! Jobs: what a caller submits (kind, keys, blocks), the one result each job yields, the
//! table of jobs whose result has not been polled, and the ready fd that signals results.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

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
    pub(crate) jobs: HashMap<u64, Phase>,
    pub(crate) running: usize,
    /// Memory registered besides the pool. Under the table's lock, so that a region is
    /// never removed between a submit resolving a range of it and holding that range.
    pub(crate) regions: Regions,
    holds: Holds,
    /// What each accepted job holds, released when its result is polled.
    held_by: HashMap<u64, JobHold>,
    /// Jobs holding ranges of each region, by region id.
    region_jobs: HashMap<u64, usize>,
}

struct JobHold {
    kind: JobKind,
    /// The memory the job holds: (start address, job-local index).
    spans: Vec<(usize, u32)>,
    regions: Vec<u64>,
}

/// Caller memory held by jobs whose result has not been polled, as address ranges: any
/// number of store jobs may read the same bytes, a load needs its bytes alone.
#[derive(Default)]
struct Holds {
    /// Ranges of loads, which overlap no other held range: by start, (end, job).
    loads: BTreeMap<usize, (usize, u64)>,
    /// Ranges of stores, which may overlap each other: by (start, job, index), the end.
    stores: BTreeMap<(usize, u64, u32), usize>,
    /// The longest store range held since no store was held, which bounds how far before
    /// a range a store range overlapping it can start.
    longest_store: usize,
}

/// A job's memory that another job holds in a conflicting way.
pub(crate) struct Conflict {
    /// Which of the job's pieces, in submission order.
    pub(crate) piece: usize,
    /// The holding job and what it does.
    pub(crate) job_id: u64,
    pub(crate) kind: JobKind,
}

impl Conflict {
    /// The message of a refused job, naming the piece as the caller named it.
    pub(crate) fn error(&self, piece: &str) -> Error {
        let holder = match self.kind {
            JobKind::Load => "a load writing into it",
            JobKind::Store => "a store reading it",
        };
        Error::new(
            Status::BlockBusy,
            format!(
                "{piece} is held by job {} ({holder}) until that job's result is polled; memory may be read by several store jobs at once, but a load needs it alone",
                self.job_id
            ),
        )
    }
}

impl Holds {
    /// A load holding bytes that overlap `piece`.
    fn load_over(&self, piece: Piece) -> Option<(u64, JobKind)> {
        // Load ranges are disjoint: only the last one starting before the end can overlap.
        let (_, &(end, job)) = self.loads.range(..piece.end()).next_back()?;
        (end > piece.addr).then_some((job, JobKind::Load))
    }

    /// A store holding bytes that overlap `piece`.
    fn store_over(&self, piece: Piece) -> Option<(u64, JobKind)> {
        let from = piece.addr.saturating_sub(self.longest_store);
        self.stores
            .range((from, 0, 0)..(piece.end(), 0, 0))
            .find(|(_, &end)| end > piece.addr)
            .map(|(&(_, job, _), _)| (job, JobKind::Store))
    }
}

impl JobTable {
    /// Lets `job_id` hold `pieces` (every piece of every key, in submission order, from
    /// `regions`), unless a job whose result was not polled yet holds some of those bytes
    /// in a conflicting way (a load with anything else). The pieces of one load must not
    /// overlap each other: two keys cannot load into the same bytes.
    pub(crate) fn hold(
        &mut self,
        kind: JobKind,
        job_id: u64,
        pieces: &[Piece],
        regions: &[u64],
    ) -> std::result::Result<(), Conflict> {
        let conflict = |piece, (job_id, kind)| Conflict {
            piece,
            job_id,
            kind,
        };
        // A load naming the same bytes twice is the caller's error, whatever else holds
        // them: checked first.
        if kind == JobKind::Load {
            let mut order: Vec<usize> = (0..pieces.len()).collect();
            order.sort_unstable_by_key(|&i| pieces[i].addr);
            for pair in order.windows(2) {
                if pieces[pair[0]].end() > pieces[pair[1]].addr {
                    return Err(conflict(pair[0].max(pair[1]), (job_id, JobKind::Load)));
                }
            }
        }
        for (i, &piece) in pieces.iter().enumerate() {
            let found = match kind {
                JobKind::Store => self.holds.load_over(piece),
                JobKind::Load => self
                    .holds
                    .load_over(piece)
                    .or_else(|| self.holds.store_over(piece)),
            };
            if let Some(holder) = found {
                return Err(conflict(i, holder));
            }
        }
        let mut spans = Vec::with_capacity(pieces.len());
        for (i, piece) in pieces.iter().enumerate() {
            let index = i as u32;
            match kind {
                JobKind::Load => {
                    self.holds.loads.insert(piece.addr, (piece.end(), job_id));
                }
                JobKind::Store => {
                    self.holds
                        .stores
                        .insert((piece.addr, job_id, index), piece.end());
                    self.holds.longest_store = self.holds.longest_store.max(piece.len);
                }
            }
            spans.push((piece.addr, index));
        }
        let mut regions = regions.to_vec();
        regions.sort_unstable();
        regions.dedup();
        for region in &regions {
            *self.region_jobs.entry(*region).or_default() += 1;
        }
        self.held_by.insert(
            job_id,
            JobHold {
                kind,
                spans,
                regions,
            },
        );
        Ok(())
    }

    /// Releases the memory of a job whose result was handed out.
    pub(crate) fn release(&mut self, job_id: u64) {
        let Some(hold) = self.held_by.remove(&job_id) else {
            return;
        };
        for (addr, index) in hold.spans {
            match hold.kind {
                JobKind::Load => {
                    self.holds.loads.remove(&addr);
                }
                JobKind::Store => {
                    self.holds.stores.remove(&(addr, job_id, index));
                }
            }
        }
        if self.holds.stores.is_empty() {
            // The bound of the overlap search starts again from the next store.
            self.holds.longest_store = 0;
        }
        for region in hold.regions {
            if let std::collections::hash_map::Entry::Occupied(mut jobs) =
                self.region_jobs.entry(region)
            {
                *jobs.get_mut() -= 1;
                if *jobs.get() == 0 {
                    jobs.remove();
                }
            }
        }
    }

    /// Jobs whose result has not been polled that hold ranges of `region`.
    pub(crate) fn jobs_using(&self, region: u64) -> usize {
        self.region_jobs.get(&region).copied().unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(addr: usize, len: usize) -> Piece {
        Piece { addr, len }
    }

    #[test]
    fn loads_hold_bytes_alone_and_stores_share_them() {
        let mut table = JobTable::default();
        table
            .hold(JobKind::Store, 1, &[piece(1000, 100)], &[])
            .map_err(|_| ())
            .unwrap();
        table
            .hold(JobKind::Store, 2, &[piece(1050, 10), piece(1000, 100)], &[])
            .map_err(|_| ())
            .unwrap();
        // A load overlapping a store by one byte at either end is refused, naming the store.
        for p in [piece(1099, 5), piece(990, 11), piece(1010, 1)] {
            let c = table.hold(JobKind::Load, 3, &[p], &[]).err().unwrap();
            assert_eq!(c.kind, JobKind::Store);
            assert!(c.job_id == 1 || c.job_id == 2);
        }
        // Adjacent bytes are free.
        table
            .hold(JobKind::Load, 4, &[piece(1100, 50), piece(900, 100)], &[])
            .map_err(|_| ())
            .unwrap();
        let c = table
            .hold(JobKind::Store, 5, &[piece(10, 1), piece(1149, 1)], &[])
            .err()
            .unwrap();
        assert_eq!((c.piece, c.job_id, c.kind), (1, 4, JobKind::Load));
        let c = table
            .hold(JobKind::Load, 6, &[piece(950, 2)], &[])
            .err()
            .unwrap();
        assert_eq!((c.job_id, c.kind), (4, JobKind::Load));
        // Released, every byte is free again.
        for job in [1, 2, 4] {
            table.release(job);
        }
        table
            .hold(JobKind::Load, 7, &[piece(900, 300)], &[])
            .map_err(|_| ())
            .unwrap();
    }

    #[test]
    fn the_pieces_of_one_load_may_not_overlap() {
        let mut table = JobTable::default();
        let c = table
            .hold(
                JobKind::Load,
                1,
                &[piece(0, 4096), piece(32768, 64), piece(4000, 200)],
                &[],
            )
            .err()
            .unwrap();
        assert_eq!((c.piece, c.job_id), (2, 1));
        assert!(table
            .hold(JobKind::Load, 1, &[piece(0, 10), piece(10, 10)], &[])
            .is_ok());
    }

    #[test]
    fn regions_count_the_jobs_holding_them() {
        let mut table = JobTable::default();
        assert!(table
            .hold(JobKind::Store, 1, &[piece(0, 1), piece(5, 1)], &[7, 7])
            .is_ok());
        assert!(table
            .hold(JobKind::Store, 2, &[piece(0, 1)], &[7, 8])
            .is_ok());
        assert_eq!((table.jobs_using(7), table.jobs_using(8)), (2, 1));
        table.release(1);
        table.release(2);
        assert_eq!((table.jobs_using(7), table.jobs_using(8)), (0, 0));
    }
}
