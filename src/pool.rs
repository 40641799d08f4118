//! The caller's host pool and the leases that keep track of who still reads it.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

/// The registered host pool: block `i` lives at `base + i * block_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct HostPool {
    base: usize,
    num_blocks: u64,
    block_bytes: usize,
}

impl HostPool {
    /// # Safety
    /// `base` must point to `num_blocks * block_bytes` bytes that stay valid, and that
    /// nothing else writes while a job using them is in flight, until the tier is shut down.
    pub unsafe fn new(base: *mut u8, num_blocks: u64, block_bytes: usize) -> Result<Self> {
        if base.is_null() {
            return Err(Error::new(crate::Status::NullArgument, "pool base is NULL"));
        }
        if num_blocks == 0 || block_bytes == 0 {
            return Err(Error::invalid(format!(
                "pool of {num_blocks} blocks of {block_bytes} bytes is empty"
            )));
        }
        let total = (num_blocks as u128) * (block_bytes as u128);
        if total > isize::MAX as u128 || (base as u128) + total > usize::MAX as u128 {
            return Err(Error::invalid(format!(
                "pool of {num_blocks} blocks of {block_bytes} bytes does not fit in the address space"
            )));
        }
        Ok(HostPool {
            base: base as usize,
            num_blocks,
            block_bytes,
        })
    }

    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    pub fn check_block(&self, block_id: u64) -> Result<()> {
        if block_id >= self.num_blocks {
            return Err(Error::invalid(format!(
                "block id {block_id} is out of range: the registered pool has {} blocks",
                self.num_blocks
            )));
        }
        Ok(())
    }

    /// Start address of a block already checked with [`check_block`](Self::check_block).
    pub fn block_ptr(&self, block_id: u64) -> *mut u8 {
        debug_assert!(block_id < self.num_blocks);
        (self.base + block_id as usize * self.block_bytes) as *mut u8
    }
}

/// One block of the host pool, writable by the load that holds it: what a store reads
/// an object into.
pub(crate) struct BlockSlot {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a slot is created only for a block that one load job holds alone (see
// `BlockSlot::new`); moving it to another thread moves that exclusive access with it.
unsafe impl Send for BlockSlot {}

impl BlockSlot {
    /// # Safety
    /// `block_id` must be in the pool (checked at submit), and the caller must hold the
    /// block alone for as long as the slot (or any slot made from it) is used: no other job
    /// reads or writes it, and the caller of the C API does not touch it until the job's
    /// result is polled.
    pub(crate) unsafe fn new(pool: &HostPool, block_id: u64) -> Self {
        BlockSlot {
            ptr: pool.block_ptr(block_id),
            len: pool.block_bytes(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the slot's contract (`BlockSlot::new`) gives it exclusive access to
        // `len` valid bytes at `ptr`; `&mut self` keeps this borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`; `&self` only reads.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The same block for a blocking thread. The caller must not use `self` until that
    /// thread is done with the returned slot (it awaits the blocking task).
    pub(crate) fn reborrow(&mut self) -> BlockSlot {
        BlockSlot {
            ptr: self.ptr,
            len: self.len,
        }
    }
}

/// Counts the references to caller memory handed to the store for one job.
///
/// A PUT body is a `Bytes` that points straight into the host pool (no copy). HTTP
/// clients may hold such a body in a connection task after the request future has
/// returned, so a job is reported only after every body built from its blocks has
/// been dropped: [`MemoryLease::released`] resolves at that point.
pub struct MemoryLease {
    token: Option<Arc<LeaseToken>>,
    released: oneshot::Receiver<()>,
}

struct LeaseToken {
    _on_drop: oneshot::Sender<()>,
}

struct BlockView {
    ptr: *const u8,
    len: usize,
    _token: Arc<LeaseToken>,
}

// The view only reads caller memory the caller promised not to change while the job runs.
unsafe impl Send for BlockView {}
unsafe impl Sync for BlockView {}

impl AsRef<[u8]> for BlockView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies inside the registered pool (checked when the view was
        // made), which outlives every job, and the caller does not write it while the job runs.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl MemoryLease {
    pub fn new() -> Self {
        let (tx, rx) = oneshot::channel();
        MemoryLease {
            token: Some(Arc::new(LeaseToken { _on_drop: tx })),
            released: rx,
        }
    }

    /// A zero-copy view of a block, counted by this lease.
    pub fn view(&self, pool: &HostPool, block_id: u64) -> Bytes {
        let token = self
            .token
            .as_ref()
            .expect("lease already waited on")
            .clone();
        Bytes::from_owner(BlockView {
            ptr: pool.block_ptr(block_id),
            len: pool.block_bytes(),
            _token: token,
        })
    }

    /// Resolves once no view of this lease is alive any more.
    pub async fn released(mut self) {
        self.token = None;
        let _ = (&mut self.released).await;
    }
}

impl Default for MemoryLease {
    fn default() -> Self {
        Self::new()
    }
}
