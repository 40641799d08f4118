//! Who holds caller memory: the bytes of every job whose result has not been polled, so
//! that a load never writes bytes another job reads or writes. Any number of stores may
//! read the same bytes; a load needs its bytes alone.
//!
//! Held memory is checked by address. The pool, and regions that overlap the pool or
//! another region, share one set of held ranges; a region that no other registered memory
//! overlaps (the usual case: one allocation per layer or layer group) keeps a set of its
//! own, since only ranges of that region can touch its bytes. A key of 64 ranges in 64
//! such regions then costs 64 lookups in maps of the few jobs in flight over each region,
//! not in one map of every range in flight. A region that later gains an overlapping
//! neighbour (another region, or the pool) moves its ranges into the shared set.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::job::JobKind;
use crate::error::{Error, Status};
use crate::memory::Piece;

/// The region of a piece of the pool (region ids start at 1).
const POOL: u64 = 0;

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

/// What one accepted job holds, until its result is polled.
struct JobHold {
    kind: JobKind,
    /// Each piece: (start address, job-local index, region or [`POOL`]).
    spans: Vec<(usize, u32, u64)>,
    /// The distinct regions among them.
    regions: Vec<u64>,
}

/// One held range: `start .. end` of job `job`'s piece `index`.
#[derive(Clone, Copy)]
struct Held {
    start: usize,
    end: usize,
    job: u64,
    index: u32,
    kind: JobKind,
}

impl Held {
    fn overlaps(&self, piece: Piece) -> bool {
        self.start < piece.end() && piece.addr < self.end
    }
}

/// How many ranges a set keeps in a plain list before it sorts them by address: a scan of
/// a few cache lines costs less than the lookups, insertions and removals of ordered maps
/// (a set usually holds the ranges of the few jobs in flight over one region).
const FEW: usize = 32;

/// Ranges held by jobs: in a list while they are few, by address beyond.
#[derive(Default)]
struct HoldSet {
    /// Every held range, in no order, while there are at most [`FEW`] and `many` is `None`.
    few: Vec<Held>,
    /// How many of `few` are loads' ranges: with none, a store has nothing to check.
    few_loads: usize,
    /// Every held range once there were more than [`FEW`], until none is held again.
    many: Option<Box<ByAddress>>,
}

impl HoldSet {
    /// A job holding bytes of `piece` that a job of `kind` may not share: a load before a
    /// store, of the loads the last by start, of the stores the first by (start, job,
    /// index), as [`ByAddress`] finds them.
    fn conflict(&self, kind: JobKind, piece: Piece) -> Option<(u64, JobKind)> {
        if let Some(many) = &self.many {
            return many.conflict(kind, piece);
        }
        // Stores share bytes with stores: while only stores hold ranges here (a store
        // phase), a store's piece is granted without a scan.
        if kind == JobKind::Store && self.few_loads == 0 {
            return None;
        }
        let (mut load, mut store): (Option<&Held>, Option<&Held>) = (None, None);
        for held in &self.few {
            if !held.overlaps(piece) {
                continue;
            }
            match held.kind {
                JobKind::Load => {
                    if load.is_none_or(|l| held.start > l.start) {
                        load = Some(held);
                    }
                }
                JobKind::Store if kind == JobKind::Load => {
                    let first = |h: &Held| (h.start, h.job, h.index);
                    if store.is_none_or(|s| first(held) < first(s)) {
                        store = Some(held);
                    }
                }
                JobKind::Store => {}
            }
        }
        load.map(|l| (l.job, JobKind::Load))
            .or(store.map(|s| (s.job, JobKind::Store)))
    }

    fn insert(&mut self, kind: JobKind, job: u64, index: u32, piece: Piece) {
        let held = Held {
            start: piece.addr,
            end: piece.end(),
            job,
            index,
            kind,
        };
        if self.many.is_none() && self.few.len() < FEW {
            self.few_loads += usize::from(kind == JobKind::Load);
            self.few.push(held);
            return;
        }
        let many = self.many.get_or_insert_with(Box::default);
        for h in self.few.drain(..) {
            many.insert(h);
        }
        self.few_loads = 0;
        many.insert(held);
    }

    fn remove(&mut self, kind: JobKind, job: u64, index: u32, addr: usize) {
        if let Some(many) = &mut self.many {
            many.remove(kind, job, index, addr);
            if many.is_empty() {
                self.many = None;
            }
            return;
        }
        if let Some(at) = self
            .few
            .iter()
            .position(|h| h.job == job && h.index == index && h.start == addr)
        {
            let removed = self.few.swap_remove(at);
            self.few_loads -= usize::from(removed.kind == JobKind::Load);
        }
    }

    /// Takes in `other`'s ranges, none of which overlaps a load range of `self`'s.
    fn absorb(&mut self, mut other: HoldSet) {
        if let Some(many) = other.many.take() {
            other.few.extend(many.all());
        }
        for h in other.few {
            self.insert(
                h.kind,
                h.job,
                h.index,
                Piece {
                    addr: h.start,
                    len: h.end - h.start,
                },
            );
        }
    }
}

/// Held ranges by address, for sets of many.
#[derive(Default)]
struct ByAddress {
    /// Ranges of loads, which overlap no other held range: by start, (end, job, index).
    loads: BTreeMap<usize, (usize, u64, u32)>,
    /// Ranges of stores, which may overlap each other: by (start, job, index), the end.
    stores: BTreeMap<(usize, u64, u32), usize>,
    /// The longest store range held since no store was held, which bounds how far before
    /// a range a store range overlapping it can start.
    longest_store: usize,
}

impl ByAddress {
    fn is_empty(&self) -> bool {
        self.loads.is_empty() && self.stores.is_empty()
    }

    fn conflict(&self, kind: JobKind, piece: Piece) -> Option<(u64, JobKind)> {
        match kind {
            JobKind::Store => self.load_over(piece),
            JobKind::Load => self.load_over(piece).or_else(|| self.store_over(piece)),
        }
    }

    /// A load holding bytes that overlap `piece`.
    fn load_over(&self, piece: Piece) -> Option<(u64, JobKind)> {
        // Load ranges are disjoint: only the last one starting before the end can overlap.
        let (_, &(end, job, _)) = self.loads.range(..piece.end()).next_back()?;
        (end > piece.addr).then_some((job, JobKind::Load))
    }

    /// A store holding bytes that overlap `piece`.
    fn store_over(&self, piece: Piece) -> Option<(u64, JobKind)> {
        if self.stores.is_empty() {
            return None;
        }
        let from = piece.addr.saturating_sub(self.longest_store);
        self.stores
            .range((from, 0, 0)..(piece.end(), 0, 0))
            .find(|(_, &end)| end > piece.addr)
            .map(|(&(_, job, _), _)| (job, JobKind::Store))
    }

    fn insert(&mut self, h: Held) {
        match h.kind {
            JobKind::Load => {
                self.loads.insert(h.start, (h.end, h.job, h.index));
            }
            JobKind::Store => {
                self.stores.insert((h.start, h.job, h.index), h.end);
                self.longest_store = self.longest_store.max(h.end - h.start);
            }
        }
    }

    fn remove(&mut self, kind: JobKind, job_id: u64, index: u32, addr: usize) {
        match kind {
            JobKind::Load => {
                self.loads.remove(&addr);
            }
            JobKind::Store => {
                self.stores.remove(&(addr, job_id, index));
                if self.stores.is_empty() {
                    // The bound of the overlap search starts again from the next store.
                    self.longest_store = 0;
                }
            }
        }
    }

    fn all(&self) -> impl Iterator<Item = Held> + '_ {
        let loads = self.loads.iter().map(|(&start, &(end, job, index))| Held {
            start,
            end,
            job,
            index,
            kind: JobKind::Load,
        });
        let stores = self.stores.iter().map(|(&(start, job, index), &end)| Held {
            start,
            end,
            job,
            index,
            kind: JobKind::Store,
        });
        loads.chain(stores)
    }
}

struct RegionHolds {
    /// The region's own set while no other registered memory overlaps it; `None` once
    /// something does, its ranges then being in the shared set.
    own: Option<HoldSet>,
    /// Jobs whose result has not been polled that hold ranges of the region.
    jobs: usize,
}

/// The memory held by every job whose result has not been polled.
#[derive(Default)]
pub(crate) struct Holds {
    /// The pool's pieces, and those of regions that overlap other registered memory.
    shared: HoldSet,
    /// Every registered region, by id.
    regions: FxHashMap<u64, RegionHolds>,
    /// What each accepted job holds.
    jobs: FxHashMap<u64, JobHold>,
}

impl Holds {
    /// A region was registered; `alone` when no other registered memory overlaps it.
    pub(crate) fn region_added(&mut self, region: u64, alone: bool) {
        let own = alone.then(HoldSet::default);
        self.regions.insert(region, RegionHolds { own, jobs: 0 });
    }

    /// A region was removed (no job holds any of it).
    pub(crate) fn region_removed(&mut self, region: u64) {
        self.regions.remove(&region);
    }

    /// Memory registered later overlaps `region`: its ranges are checked against the
    /// shared set from now on.
    pub(crate) fn share(&mut self, region: u64) {
        if let Some(own) = self.regions.get_mut(&region).and_then(|r| r.own.take()) {
            self.shared.absorb(own);
        }
    }

    /// Jobs whose result has not been polled that hold ranges of `region`.
    pub(crate) fn jobs_using(&self, region: u64) -> usize {
        self.regions.get(&region).map_or(0, |r| r.jobs)
    }

    fn set_mut(&mut self, region: u64) -> &mut HoldSet {
        match self.regions.get_mut(&region) {
            Some(RegionHolds { own: Some(set), .. }) => set,
            _ => &mut self.shared,
        }
    }

    /// Takes a job's held pieces out of the sets they are in.
    fn remove_spans(&mut self, kind: JobKind, job_id: u64, spans: &[(usize, u32, u64)]) {
        for &(addr, index, region) in spans {
            self.set_mut(region).remove(kind, job_id, index, addr);
        }
    }

    /// Lets `job_id` hold `pieces` (every piece of every key, in submission order; of
    /// `regions[i]` each, or of the pool when `regions` is empty) until its result is
    /// polled, unless a job whose result was not polled yet holds some of those bytes in a
    /// conflicting way (a load with anything else). The pieces of one load must not
    /// overlap each other: two keys cannot load into the same bytes.
    pub(crate) fn hold(
        &mut self,
        kind: JobKind,
        job_id: u64,
        pieces: &[Piece],
        regions: &[u64],
    ) -> Result<(), Conflict> {
        debug_assert!(regions.is_empty() || regions.len() == pieces.len());
        let region_of = |i: usize| regions.get(i).copied().unwrap_or(POOL);
        let conflict = |piece, (job_id, kind)| Conflict {
            piece,
            job_id,
            kind,
        };
        // Each piece is checked and then held at once, so that a load's pieces are also
        // checked against each other: two of them overlapping meet in one set (the same
        // region's, or the shared one; regions alone share no byte).
        let mut spans = Vec::with_capacity(pieces.len());
        for (i, &piece) in pieces.iter().enumerate() {
            let (index, region) = (i as u32, region_of(i));
            let set = self.set_mut(region);
            if let Some(holder) = set.conflict(kind, piece) {
                self.remove_spans(kind, job_id, &spans);
                // A load naming the same bytes twice is the caller's error, whatever else
                // holds them: reported before another job's hold.
                let own = match holder {
                    (holder, _) if holder == job_id => Some(i),
                    _ if kind == JobKind::Load => self_overlap(pieces),
                    _ => None,
                };
                return Err(match own {
                    Some(piece) => conflict(piece, (job_id, JobKind::Load)),
                    None => conflict(i, holder),
                });
            }
            set.insert(kind, job_id, index, piece);
            spans.push((piece.addr, index, region));
        }
        let mut regions = regions.to_vec();
        regions.sort_unstable();
        regions.dedup();
        for region in &regions {
            if let Some(r) = self.regions.get_mut(region) {
                r.jobs += 1;
            }
        }
        let hold = JobHold {
            kind,
            spans,
            regions,
        };
        self.jobs.insert(job_id, hold);
        Ok(())
    }

    /// Releases the memory of a job whose result was handed out.
    pub(crate) fn release(&mut self, job_id: u64) {
        let Some(hold) = self.jobs.remove(&job_id) else {
            return;
        };
        self.remove_spans(hold.kind, job_id, &hold.spans);
        for region in hold.regions {
            if let Some(r) = self.regions.get_mut(&region) {
                r.jobs -= 1;
            }
        }
    }
}

/// The later (in submission order) of the first two pieces found to overlap, if any.
fn self_overlap(pieces: &[Piece]) -> Option<usize> {
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_unstable_by_key(|&i| pieces[i].addr);
    order
        .windows(2)
        .find(|pair| pieces[pair[0]].end() > pieces[pair[1]].addr)
        .map(|pair| pair[0].max(pair[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(addr: usize, len: usize) -> Piece {
        Piece { addr, len }
    }

    fn held(result: Result<(), Conflict>) {
        result.map_err(|c| c.job_id).expect("no conflict")
    }

    #[test]
    fn loads_hold_bytes_alone_and_stores_share_them() {
        let mut holds = Holds::default();
        held(holds.hold(JobKind::Store, 1, &[piece(1000, 100)], &[]));
        held(holds.hold(JobKind::Store, 2, &[piece(1050, 10), piece(1000, 100)], &[]));
        // A load overlapping a store by one byte at either end is refused, naming the store.
        for p in [piece(1099, 5), piece(990, 11), piece(1010, 1)] {
            let c = holds.hold(JobKind::Load, 3, &[p], &[]).err().unwrap();
            assert_eq!(c.kind, JobKind::Store);
            assert!(c.job_id == 1 || c.job_id == 2);
        }
        // Adjacent bytes are free.
        held(holds.hold(JobKind::Load, 4, &[piece(1100, 50), piece(900, 100)], &[]));
        let c = holds
            .hold(JobKind::Store, 5, &[piece(10, 1), piece(1149, 1)], &[])
            .err()
            .unwrap();
        assert_eq!((c.piece, c.job_id, c.kind), (1, 4, JobKind::Load));
        let c = holds
            .hold(JobKind::Load, 6, &[piece(950, 2)], &[])
            .err()
            .unwrap();
        assert_eq!((c.job_id, c.kind), (4, JobKind::Load));
        // Released, every byte is free again.
        holds.release(1);
        holds.release(2);
        holds.release(4);
        held(holds.hold(JobKind::Load, 7, &[piece(900, 300)], &[]));
    }

    #[test]
    fn the_pieces_of_one_load_may_not_overlap() {
        let mut holds = Holds::default();
        let c = holds
            .hold(
                JobKind::Load,
                1,
                &[piece(0, 4096), piece(32768, 64), piece(4000, 200)],
                &[],
            )
            .err()
            .unwrap();
        assert_eq!((c.piece, c.job_id), (2, 1));
        held(holds.hold(JobKind::Load, 1, &[piece(0, 10), piece(10, 10)], &[]));
    }

    /// Against a plain list of held ranges, through sets of few and of many ranges (and
    /// back): every hold is refused or granted as the list decides, naming the same holder.
    #[test]
    fn sets_of_few_and_of_many_ranges_decide_alike() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut holds = Holds::default();
        // (job, kind, pieces) held now.
        let mut model: Vec<(u64, JobKind, Vec<Piece>)> = Vec::new();
        for job in 1..4000u64 {
            // Grow to well past FEW ranges held, then shrink to none, twice.
            let target = if (job / 1000) % 2 == 0 { 3 * FEW } else { 0 };
            let held: usize = model.iter().map(|(_, _, p)| p.len()).sum();
            if held > target || (held == target && next(2) == 0) {
                if !model.is_empty() {
                    let (id, _, _) = model.swap_remove(next(model.len() as u64) as usize);
                    holds.release(id);
                }
                continue;
            }
            let kind = if next(3) == 0 {
                JobKind::Load
            } else {
                JobKind::Store
            };
            let pieces: Vec<Piece> = (0..1 + next(3))
                .map(|_| piece(next(4000) as usize, 1 + next(40) as usize))
                .collect();
            let expected = pieces.iter().enumerate().find_map(|(i, &p)| {
                let mut holders: Vec<(u64, JobKind, usize)> = model
                    .iter()
                    .flat_map(|(id, k, ps)| {
                        ps.iter().enumerate().map(move |(j, q)| (*id, *k, j, *q))
                    })
                    .filter(|&(_, k, _, q)| {
                        q.overlaps(p) && (k == JobKind::Load || kind == JobKind::Load)
                    })
                    .map(|(id, k, j, _)| (id, k, j))
                    .collect();
                // A load before a store; the load starting last; the store first by
                // (start, job, index).
                let first = |&(id, k, j): &(u64, JobKind, usize)| {
                    let q = model.iter().find(|m| m.0 == id).unwrap().2[j];
                    match k {
                        JobKind::Load => (0, usize::MAX - q.addr, 0, 0),
                        JobKind::Store => (1, q.addr, id, j),
                    }
                };
                holders.sort_by_key(first);
                holders.first().map(|&(id, k, _)| (i, id, k))
            });
            let self_overlap = kind == JobKind::Load
                && pieces
                    .iter()
                    .enumerate()
                    .any(|(i, p)| pieces[..i].iter().any(|q| q.overlaps(*p)));
            match holds.hold(kind, job, &pieces, &[]) {
                Ok(()) => {
                    assert!(expected.is_none() && !self_overlap, "job {job} held");
                    model.push((job, kind, pieces));
                }
                Err(c) if c.job_id == job => assert!(self_overlap),
                Err(c) if !self_overlap => {
                    assert_eq!(Some((c.piece, c.job_id, c.kind)), expected, "job {job}")
                }
                Err(_) => {}
            }
        }
    }

    #[test]
    fn regions_count_the_jobs_holding_them() {
        let mut holds = Holds::default();
        holds.region_added(7, true);
        holds.region_added(8, true);
        held(holds.hold(JobKind::Store, 1, &[piece(0, 1), piece(5, 1)], &[7, 7]));
        held(holds.hold(JobKind::Store, 2, &[piece(0, 1), piece(100, 1)], &[7, 8]));
        assert_eq!((holds.jobs_using(7), holds.jobs_using(8)), (2, 1));
        holds.release(1);
        holds.release(2);
        assert_eq!((holds.jobs_using(7), holds.jobs_using(8)), (0, 0));
    }

    #[test]
    fn a_region_overlapped_later_is_checked_against_the_shared_ranges() {
        // Region 1 overlaps nothing at first: its load is held in its own set.
        let mut holds = Holds::default();
        holds.region_added(1, true);
        held(holds.hold(JobKind::Load, 1, &[piece(4096, 64)], &[1]));
        // Region 2 is added over the same bytes: both now check against the shared set,
        // where the load already held through region 1 refuses another load through 2.
        holds.share(1);
        holds.region_added(2, false);
        let c = holds
            .hold(JobKind::Load, 2, &[piece(4100, 8)], &[2])
            .err()
            .unwrap();
        assert_eq!((c.job_id, c.kind), (1, JobKind::Load));
        // So does the pool's (the pool shares the set from the start).
        assert!(holds
            .hold(JobKind::Store, 3, &[piece(4000, 100)], &[])
            .is_err());
        // Released through the set it is in now, the bytes are free for either.
        holds.release(1);
        held(holds.hold(JobKind::Load, 4, &[piece(4100, 8)], &[2]));
        assert_eq!(holds.jobs_using(1), 0);
    }
}
