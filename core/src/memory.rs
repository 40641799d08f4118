//! The caller's memory: the host pool (block `i` at `base + i * block_bytes`), the
//! regions registered beside it, the pieces one key's object is made of (one for a pool
//! block, one per range otherwise), and the leases that keep track of who still reads it.
//!
//! An object is the concatenation of its pieces: the same bytes stored from one piece or
//! from many are the same object. Every piece is checked against its pool or region when
//! the job is submitted; from then on a piece is an address and a length.

use std::sync::Arc;

use bytes::Bytes;
use object_store::PutPayload;
use rustc_hash::FxHashMap;
use tokio::sync::oneshot;

use crate::error::{Error, Result, Status};

mod fence;

pub(crate) use fence::CallerMemoryFence;

/// Most ranges one key's object may be made of.
pub const MAX_RANGES_PER_KEY: usize = 4096;
/// Most ranges one job may carry, over all its keys.
pub const MAX_RANGES_PER_JOB: usize = 1 << 22;

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
            return Err(Error::new(Status::NullArgument, "pool base is NULL"));
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

    /// The whole pool's memory.
    pub(crate) fn memory(&self) -> Piece {
        Piece {
            addr: self.base,
            len: self.num_blocks as usize * self.block_bytes,
        }
    }

    /// The memory of a block already checked with [`check_block`](Self::check_block).
    pub(crate) fn block(&self, block_id: u64) -> BlockMemory {
        BlockMemory::new(vec![Piece {
            addr: self.block_ptr(block_id) as usize,
            len: self.block_bytes,
        }])
    }
}

/// A part of a key's object in caller memory: a range of a region, or a pool block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemoryRange {
    /// The region, as [`Regions::add`] numbered it.
    pub region: u64,
    /// Where the range starts, from the region's base.
    pub offset: u64,
    /// Its length in bytes (at least 1).
    pub len: u64,
}

/// Caller memory registered besides the pool, by id. Ids are never reused, so a stale id
/// is an unknown region, never another one.
#[derive(Debug, Default)]
pub(crate) struct Regions {
    next_id: u64,
    /// The memory of each region.
    regions: FxHashMap<u64, Piece>,
}

impl Regions {
    /// Registers `len` bytes at `base`; returns the region's id (from 1).
    pub(crate) fn add(&mut self, base: *mut u8, len: usize) -> Result<u64> {
        if base.is_null() {
            return Err(Error::new(Status::NullArgument, "region base is NULL"));
        }
        if len == 0 {
            return Err(Error::invalid("a region needs at least one byte"));
        }
        if len > isize::MAX as usize || (base as usize).checked_add(len).is_none() {
            return Err(Error::invalid(format!(
                "a region of {len} bytes at {base:p} does not fit in the address space"
            )));
        }
        self.next_id += 1;
        let id = self.next_id;
        self.regions.insert(
            id,
            Piece {
                addr: base as usize,
                len,
            },
        );
        Ok(id)
    }

    /// Forgets a region; the caller checked that no job holds a range of it.
    pub(crate) fn remove(&mut self, id: u64) -> Result<()> {
        self.regions
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| unknown_region(id))
    }

    pub(crate) fn contains(&self, id: u64) -> bool {
        self.regions.contains_key(&id)
    }

    /// The regions other than `except` that share a byte with `memory`.
    pub(crate) fn overlapping(&self, memory: Piece, except: u64) -> Vec<u64> {
        self.regions
            .iter()
            .filter(|&(&id, region)| id != except && memory.overlaps(*region))
            .map(|(&id, _)| id)
            .collect()
    }

    /// The piece of memory `range` names, checked against its region.
    pub(crate) fn resolve(&self, range: &MemoryRange) -> Result<Piece> {
        let region = self
            .regions
            .get(&range.region)
            .ok_or_else(|| unknown_region(range.region))?;
        if range.len == 0 {
            return Err(Error::invalid(format!(
                "range at offset {} of region {} has length 0; every range holds at least one byte",
                range.offset, range.region
            )));
        }
        let end = range.offset as u128 + range.len as u128;
        if end > region.len as u128 {
            return Err(Error::invalid(format!(
                "range {}..{} is outside region {}, which has {} bytes",
                range.offset, end, range.region, region.len
            )));
        }
        Ok(Piece {
            addr: region.addr + range.offset as usize,
            len: range.len as usize,
        })
    }
}

fn unknown_region(id: u64) -> Error {
    Error::invalid(format!(
        "region {id} is not registered (never added, or removed)"
    ))
}

/// A contiguous piece of caller memory, checked against its pool or region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

impl Piece {
    pub(crate) fn end(&self) -> usize {
        self.addr + self.len
    }

    pub(crate) fn overlaps(&self, other: Piece) -> bool {
        self.addr < other.end() && other.addr < self.end()
    }
}

/// A buffer of the engine's own that a load reads into beside a block (an encrypted
/// object's header and tags). Every slot over it holds it: a blocking read that outlives
/// its load (a shutdown past its grace period, a panic in another key of the job) writes
/// into live memory, never into freed memory.
pub(crate) struct OwnedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain heap memory owned by this value; it is written only through
// the slot of the one load that made it, and read only after that load's reads returned.
unsafe impl Send for OwnedBuffer {}
unsafe impl Sync for OwnedBuffer {}

impl OwnedBuffer {
    pub(crate) fn new(len: usize) -> Arc<OwnedBuffer> {
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
        Arc::new(OwnedBuffer { ptr, len })
    }

    pub(crate) fn piece(&self) -> Piece {
        Piece {
            addr: self.ptr as usize,
            len: self.len,
        }
    }

    /// The buffer's bytes, once no slot holds it any more; `None` while one does.
    pub(crate) fn into_vec(buffer: Arc<OwnedBuffer>) -> Option<Vec<u8>> {
        let owned = Arc::into_inner(buffer)?;
        let owned = std::mem::ManuallyDrop::new(owned);
        // SAFETY: `ptr` and `len` came from `Box::into_raw` of a boxed slice in `new`; the
        // value is not dropped (ManuallyDrop), so the allocation changes owner only once.
        let boxed =
            unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(owned.ptr, owned.len)) };
        Some(boxed.into_vec())
    }

    /// The bytes.
    ///
    /// # Safety
    /// No read into the buffer may be in progress: the load that made it has awaited
    /// every read of its slot.
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes; no writer, per the contract.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for OwnedBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` came from `Box::into_raw` of a boxed slice in `new`, and
        // no slot holds the buffer any more (each holds an `Arc` of it).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// Where one key's object lives in caller memory: its pieces, in object order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockMemory {
    pieces: Vec<Piece>,
    len: usize,
}

impl BlockMemory {
    pub(crate) fn new(pieces: Vec<Piece>) -> Self {
        let len = pieces.iter().map(|p| p.len).sum();
        BlockMemory { pieces, len }
    }

    /// The object's length: the sum of its pieces.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn pieces(&self) -> &[Piece] {
        &self.pieces
    }
}

/// One key's memory, writable by the load that holds it: what a store reads an object
/// into, piece after piece.
pub(crate) struct BlockSlot {
    pieces: Vec<Piece>,
    /// Where each piece starts in the object.
    starts: Vec<usize>,
    len: usize,
    /// The engine's own buffers among the pieces, kept alive by the slot (and every slot
    /// made from it).
    keep_alive: Vec<Arc<OwnedBuffer>>,
    /// The tier's fence, which [`copy_in`](Self::copy_in) enters (none: tests of the stores).
    fence: Option<Arc<CallerMemoryFence>>,
}

// SAFETY: a slot is created only for memory that one load job holds alone (see
// `BlockSlot::new`); moving it to another thread moves that exclusive access with it.
unsafe impl Send for BlockSlot {}

impl BlockSlot {
    /// # Safety
    /// `memory` must have been checked against its pool or region at submit, and the
    /// caller must hold it alone for as long as the slot (or any slot made from it) is
    /// used: no other job reads or writes it, and the caller of the C API does not touch
    /// it until the job's result is polled.
    pub(crate) unsafe fn new(memory: &BlockMemory) -> Self {
        let mut starts = Vec::with_capacity(memory.pieces.len());
        let mut at = 0;
        for piece in &memory.pieces {
            starts.push(at);
            at += piece.len;
        }
        BlockSlot {
            pieces: memory.pieces.clone(),
            starts,
            len: memory.len,
            keep_alive: Vec::new(),
            fence: None,
        }
    }

    /// The slot, its copies from library buffers ([`copy_in`](Self::copy_in)) gated by
    /// the tier's `fence`.
    pub(crate) fn fenced(mut self, fence: Arc<CallerMemoryFence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// A slot over `memory`, some of whose pieces are the engine's own `buffers`, which
    /// the slot keeps alive.
    ///
    /// # Safety
    /// As [`BlockSlot::new`], for the pieces that are not `buffers`'.
    pub(crate) unsafe fn with_buffers(memory: &BlockMemory, buffers: &[Arc<OwnedBuffer>]) -> Self {
        // SAFETY: the caller's contract.
        let mut slot = unsafe { BlockSlot::new(memory) };
        slot.keep_alive = buffers.to_vec();
        slot
    }

    /// A slot over a buffer of the caller's (tests of the store paths).
    #[cfg(test)]
    pub(crate) fn of_buffer(buffer: &mut [u8]) -> Self {
        let memory = BlockMemory::new(vec![Piece {
            addr: buffer.as_mut_ptr() as usize,
            len: buffer.len(),
        }]);
        // SAFETY: the buffer is borrowed mutably by the caller for as long as it uses the slot.
        unsafe { BlockSlot::new(&memory) }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether every piece starts and ends on `align` bytes (for O_DIRECT).
    pub(crate) fn aligned(&self, align: usize) -> bool {
        self.pieces
            .iter()
            .all(|p| p.addr.is_multiple_of(align) && p.len.is_multiple_of(align))
    }

    /// The bytes of the object from `at` to the end of the piece that holds `at`, at most
    /// `max` of them; empty at or past the end of the object.
    pub(crate) fn rest_at(&mut self, at: usize, max: usize) -> &mut [u8] {
        if at >= self.len {
            return &mut [];
        }
        let i = self.starts.partition_point(|&s| s <= at) - 1;
        let piece = self.pieces[i];
        let skip = at - self.starts[i];
        let n = (piece.len - skip).min(max);
        // SAFETY: the slot's contract (`BlockSlot::new`) gives it exclusive access to every
        // piece; `skip + n <= piece.len`, and `&mut self` keeps this borrow unique.
        unsafe { std::slice::from_raw_parts_mut((piece.addr + skip) as *mut u8, n) }
    }

    /// The bytes of the object from `at` on, at most `max` of them, as one slice per piece
    /// they cross (for a vectored read); empty at or past the end of the object.
    pub(crate) fn slices_at(&mut self, at: usize, max: usize) -> Vec<std::io::IoSliceMut<'_>> {
        let mut out = Vec::new();
        if at >= self.len {
            return out;
        }
        let mut i = self.starts.partition_point(|&s| s <= at) - 1;
        let mut skip = at - self.starts[i];
        let mut left = max;
        while left > 0 && i < self.pieces.len() {
            let piece = self.pieces[i];
            let n = (piece.len - skip).min(left);
            // SAFETY: as in `rest_at`; the pieces of a slot never overlap (a load's pieces
            // are checked disjoint at submit), so the slices are disjoint, and `&mut self`
            // keeps them unique for their lifetime.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut((piece.addr + skip) as *mut u8, n) };
            out.push(std::io::IoSliceMut::new(bytes));
            left -= n;
            skip = 0;
            i += 1;
        }
        out
    }

    /// Copies `data` into the object at `at`, across pieces; `false` (and nothing
    /// written) if it would run past the end.
    pub(crate) fn write_at(&mut self, at: usize, data: &[u8]) -> bool {
        if at.checked_add(data.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        let mut done = 0;
        while done < data.len() {
            let rest = self.rest_at(at + done, data.len() - done);
            let n = rest.len();
            rest.copy_from_slice(&data[done..done + n]);
            done += n;
        }
        true
    }

    /// Copies `data`, read into a buffer of the library's, into the object at `at`, inside
    /// the tier's fence: `Err(FenceClosed)` (and nothing written) once shutdown closed it.
    /// For threads whose reads may outlive the job (a read held in the kernel): they read
    /// into their own memory and copy here, so a read abandoned at shutdown never lands in
    /// the caller's. Panics if `data` runs past the end of the object (a caller's bug).
    pub(crate) fn copy_in(
        &mut self,
        at: usize,
        data: &[u8],
    ) -> std::result::Result<(), FenceClosed> {
        let fence = self.fence.clone();
        let _inside = match &fence {
            Some(fence) => Some(fence.enter().ok_or(FenceClosed)?),
            None => None,
        };
        assert!(self.write_at(at, data), "a copy past the end of the object");
        Ok(())
    }

    /// The CRC32C of the whole object as the slot holds it now.
    pub(crate) fn checksum(&self) -> u32 {
        self.pieces.iter().fold(0, |crc, piece| {
            // SAFETY: as in `rest_at`; `&self` only reads.
            let bytes = unsafe { std::slice::from_raw_parts(piece.addr as *const u8, piece.len) };
            crate::integrity::checksum_append(crc, bytes)
        })
    }

    /// The slot cut into consecutive parts of `part_len` bytes (the last one shorter), each
    /// a slot of its own over disjoint bytes, for parts of one object read in parallel. The
    /// caller must not use `self` until every part is dropped.
    pub(crate) fn parts(&mut self, part_len: usize) -> Vec<BlockSlot> {
        let part_len = part_len.max(1);
        let mut parts = Vec::with_capacity(self.len.div_ceil(part_len));
        let mut at = 0;
        while at < self.len {
            let end = (at + part_len).min(self.len);
            let mut part = BlockSlot {
                pieces: Vec::new(),
                starts: Vec::new(),
                len: end - at,
                keep_alive: self.keep_alive.clone(),
                fence: self.fence.clone(),
            };
            let mut i = self.starts.partition_point(|&s| s <= at) - 1;
            let mut pos = at;
            while pos < end {
                let piece = self.pieces[i];
                let skip = pos - self.starts[i];
                let n = (piece.len - skip).min(end - pos);
                part.starts.push(pos - at);
                part.pieces.push(Piece {
                    addr: piece.addr + skip,
                    len: n,
                });
                pos += n;
                i += 1;
            }
            parts.push(part);
            at = end;
        }
        parts
    }

    /// The same memory for a blocking thread. The caller must not use `self` until that
    /// thread is done with the returned slot (it awaits the blocking task).
    pub(crate) fn reborrow(&mut self) -> BlockSlot {
        BlockSlot {
            pieces: self.pieces.clone(),
            starts: self.starts.clone(),
            len: self.len,
            keep_alive: self.keep_alive.clone(),
            fence: self.fence.clone(),
        }
    }
}

/// The tier shut down: the fence on caller memory is closed, and nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FenceClosed;

/// Counts the references to caller memory handed to the store for one job.
///
/// A PUT body is a `Bytes` that points straight into the host pool (no copy). HTTP
/// clients may hold such a body in a connection task after the request future has
/// returned, so a job is reported only after every body built from its blocks has
/// been dropped: [`MemoryLease::released`] resolves at that point.
pub(crate) struct MemoryLease {
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
        // SAFETY: `ptr..ptr+len` lies inside the registered pool (checked when the job was
        // submitted), which outlives every job, and the caller does not write it while the job runs.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl MemoryLease {
    pub(crate) fn new() -> Self {
        let (tx, rx) = oneshot::channel();
        MemoryLease {
            token: Some(Arc::new(LeaseToken { _on_drop: tx })),
            released: rx,
        }
    }

    /// A zero-copy view of a key's memory, one `Bytes` per piece, counted by this lease:
    /// the body of its upload, never gathered into one buffer.
    pub(crate) fn payload(&self, memory: &BlockMemory) -> PutPayload {
        let token = self.token.as_ref().expect("lease already waited on");
        memory
            .pieces
            .iter()
            .map(|piece| {
                Bytes::from_owner(BlockView {
                    ptr: piece.addr as *const u8,
                    len: piece.len,
                    _token: token.clone(),
                })
            })
            .collect()
    }

    /// Resolves once no view of this lease is alive any more.
    pub(crate) async fn released(mut self) {
        self.token = None;
        let _ = (&mut self.released).await;
    }
}

impl Default for MemoryLease {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts of a slot of several pieces cover its bytes in order, each once, and each part
    /// writes where the slot would.
    #[test]
    fn parts_cover_the_slot_in_order() {
        let mut a = vec![0u8; 10];
        let mut b = vec![0u8; 7];
        let mut c = vec![0u8; 13];
        let memory = BlockMemory::new(
            [&mut a, &mut b, &mut c]
                .into_iter()
                .map(|v| Piece {
                    addr: v.as_mut_ptr() as usize,
                    len: v.len(),
                })
                .collect(),
        );
        // SAFETY: the vectors outlive the slot and nothing else touches them.
        let mut slot = unsafe { BlockSlot::new(&memory) };
        let data: Vec<u8> = (1..=30).collect();
        for part_len in [1, 4, 7, 10, 11, 29, 30, 64] {
            let mut parts = slot.parts(part_len);
            assert_eq!(
                parts.len(),
                30usize.div_ceil(part_len),
                "part_len {part_len}"
            );
            let mut at = 0;
            for part in &mut parts {
                let len = part.len();
                assert!(len == part_len.min(30 - at), "part_len {part_len} at {at}");
                assert!(part.write_at(0, &data[at..at + len]));
                assert!(!part.write_at(1, &data[..len]), "a part ends where it ends");
                at += len;
            }
            assert_eq!(at, 30);
            drop(parts);
            assert_eq!(
                [&a[..], &b[..], &c[..]].concat(),
                data,
                "part_len {part_len}"
            );
            assert_eq!(slot.checksum(), crate::integrity::checksum(&data));
            a.fill(0);
            b.fill(0);
            c.fill(0);
        }
    }
}
