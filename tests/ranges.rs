//! Blocks as lists of ranges over several regions: pages of 2 ranges (K and V apart) and
//! of 2 x 32 ranges (a layer-first pool, one allocation per layer and per K or V) round
//! trip byte-exact on the local store and on real S3 servers (s3s-fs, moto, Ceph RGW),
//! and an object stored from ranges is the object a pool block of the same bytes gives.
//! Then the guarantees of the boundary, per range: every range checked against its region
//! before any I/O, a load holding its bytes alone, one result per job, regions removable
//! only when no job holds them.

#[macro_use]
mod support;

use kvtier_core::{JobKind, MemoryRange, Status, Tier};
use serde_json::json;
use support::*;

/// Bytes of one layer's K (or V) for one page.
const PIECE: usize = 8 * 1024;
const PAGES: usize = 6;

/// An engine's layer-first KV pool: for each layer, one allocation of K and one of V,
/// page `p` at `p * PIECE` in each. Registered with a tier, its memory is never freed
/// (as the support pool's): a failing test may leave jobs writing into it.
struct LayerPool {
    layers: Vec<(Vec<u8>, Vec<u8>)>,
    regions: Vec<(u64, u64)>,
}

impl Drop for LayerPool {
    fn drop(&mut self) {
        if !self.regions.is_empty() {
            std::mem::forget(std::mem::take(&mut self.layers));
        }
    }
}

impl LayerPool {
    fn new(layers: usize, seed: Option<u64>) -> Self {
        let layers = (0..layers)
            .map(|l| {
                let make = |which: u64| match seed {
                    Some(seed) => random_bytes(PAGES * PIECE, seed * 1000 + l as u64 * 2 + which),
                    None => vec![0u8; PAGES * PIECE],
                };
                (make(0), make(1))
            })
            .collect();
        LayerPool {
            layers,
            regions: Vec::new(),
        }
    }

    fn register(&mut self, tier: &Tier) {
        for (k, v) in &mut self.layers {
            // SAFETY: the allocations live until the tier is done (see Drop).
            let ids = unsafe {
                (
                    tier.add_region(k.as_mut_ptr(), k.len()).unwrap(),
                    tier.add_region(v.as_mut_ptr(), v.len()).unwrap(),
                )
            };
            self.regions.push(ids);
        }
    }

    /// The ranges of `page`: layer 0's K and V, layer 1's K and V, ...
    fn ranges(&self, page: usize) -> Vec<MemoryRange> {
        let offset = (page * PIECE) as u64;
        self.regions
            .iter()
            .flat_map(|&(k, v)| {
                [k, v].map(|region| MemoryRange {
                    region,
                    offset,
                    len: PIECE as u64,
                })
            })
            .collect()
    }

    fn job_ranges(&self, pages: &[usize]) -> Vec<MemoryRange> {
        pages.iter().flat_map(|&p| self.ranges(p)).collect()
    }

    /// The page's object: its ranges' bytes, concatenated.
    fn page(&self, page: usize) -> Vec<u8> {
        let at = page * PIECE..(page + 1) * PIECE;
        self.layers
            .iter()
            .flat_map(|(k, v)| [&k[at.clone()], &v[at.clone()]].concat())
            .collect()
    }

    fn ranges_per_page(&self) -> usize {
        self.layers.len() * 2
    }
}

fn start(store: &serde_json::Value) -> Tier {
    Tier::from_json(&tier_json(store.clone(), json!({"checksums": true})))
        .unwrap_or_else(|e| panic!("tier start failed: {e}"))
}

fn run_ranges(
    tier: &Tier,
    kind: JobKind,
    id: u64,
    ranges: &[MemoryRange],
    per_key: usize,
    ids: &[u64],
) -> kvtier_core::JobResult {
    let _ = tier.submit_ranges(kind, id, ranges, per_key, keys(ids));
    wait_all(tier, 1).remove(&id).unwrap()
}

/// Stores every page of a fresh pool of `layers` layers from one tier and loads them into
/// a zeroed pool of a second tier, byte-exact.
fn round_trip(store: &serde_json::Value, layers: usize) {
    let writer = start(store);
    let mut pool = LayerPool::new(layers, Some(layers as u64));
    pool.register(&writer);
    let pages: Vec<usize> = (0..PAGES).collect();
    let ids: Vec<u64> = (0..PAGES as u64).map(|p| 100 * layers as u64 + p).collect();
    let per_key = pool.ranges_per_page();
    let stored = run_ranges(
        &writer,
        JobKind::Store,
        1,
        &pool.job_ranges(&pages),
        per_key,
        &ids,
    );
    assert!(stored.succeeded(), "{}", stored.message);
    assert_eq!(stored.bytes as usize, PAGES * per_key * PIECE);

    let reader = start(store);
    let mut into = LayerPool::new(layers, None);
    into.register(&reader);
    // Loaded in an order other than stored: page p's key goes to page PAGES-1-p.
    let reversed: Vec<usize> = pages.iter().rev().copied().collect();
    let loaded = run_ranges(
        &reader,
        JobKind::Load,
        2,
        &into.job_ranges(&reversed),
        per_key,
        &ids,
    );
    assert!(loaded.succeeded(), "{}", loaded.message);
    for p in pages {
        assert!(
            into.page(PAGES - 1 - p) == pool.page(p),
            "page {p} differs after the round trip"
        );
    }
    assert_eq!(reader.stats().corrupt_blocks, 0);
}

fn two_ranges_round_trip(store: &serde_json::Value) {
    round_trip(store, 1);
}

fn layer_first_sixty_four_ranges_round_trip(store: &serde_json::Value) {
    round_trip(store, 32);
}

/// An object stored from ranges is the object a pool block of the same bytes gives:
/// loadable into a pool block, and the reverse; same name, same bytes, same checksum.
fn contiguous_and_ranges_make_one_object(store: &serde_json::Value) {
    let tier = start(store);
    let mut pages = LayerPool::new(2, Some(7));
    pages.register(&tier);
    let page_bytes = 4 * PIECE;
    let mut pool = Pool::new(4, page_bytes);
    pool.block_mut(0).copy_from_slice(&pages.page(1));
    pool.register(&tier);
    let per_key = pages.ranges_per_page();

    // Key 1 from ranges, key 2 from the pool block holding the same bytes.
    let from_ranges = run_ranges(&tier, JobKind::Store, 1, &pages.ranges(1), per_key, &[1]);
    assert!(from_ranges.succeeded(), "{}", from_ranges.message);
    let _ = tier.submit(JobKind::Store, 2, &[0], keys(&[2]));
    assert!(wait_all(&tier, 1)[&2].succeeded());
    let name = |i| tier.layout().object_name(&key(i)).unwrap();
    assert_eq!(oob_get(store, &name(1)), Some(pages.page(1)));
    assert_eq!(oob_get(store, &name(1)), oob_get(store, &name(2)));

    // Each loads the other way, its checksum verified against the recorded one.
    let _ = tier.submit(JobKind::Load, 3, &[1], keys(&[1]));
    assert!(wait_all(&tier, 1)[&3].succeeded());
    assert!(pool.block(1) == pages.page(1).as_slice());
    let loaded = run_ranges(&tier, JobKind::Load, 4, &pages.ranges(4), per_key, &[2]);
    assert!(loaded.succeeded(), "{}", loaded.message);
    assert_eq!(pages.page(4), pages.page(1));

    // A page whose ranges add up to another length fails alone, as a wrong-size block.
    let short: Vec<MemoryRange> = pages.ranges(5)[..per_key - 1].to_vec();
    let wrong = run_ranges(&tier, JobKind::Load, 5, &short, per_key - 1, &[1]);
    assert_eq!(wrong.status, Status::LengthMismatch, "{}", wrong.message);
}

/// The S3 cases: each on a new bucket of the server.
fn on_bucket(srv: &Server, case: fn(&serde_json::Value)) {
    case(&srv.store_json(&srv.new_bucket()));
}

fn s3_two_ranges_round_trip(srv: &Server) {
    on_bucket(srv, two_ranges_round_trip);
}

fn s3_layer_first_sixty_four_ranges_round_trip(srv: &Server) {
    on_bucket(srv, layer_first_sixty_four_ranges_round_trip);
}

fn s3_contiguous_and_ranges_make_one_object(srv: &Server) {
    on_bucket(srv, contiguous_and_ranges_make_one_object);
}

on_both_servers!(
    s3_two_ranges_round_trip,
    s3_layer_first_sixty_four_ranges_round_trip,
    s3_contiguous_and_ranges_make_one_object,
);

fn local_store() -> (tempfile::TempDir, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let store = json!({"type": "local", "path": dir.path()});
    (dir, store)
}

mod local {
    use super::*;

    #[test]
    fn two_ranges_round_trip() {
        let (_dir, store) = local_store();
        super::two_ranges_round_trip(&store);
    }

    #[test]
    fn layer_first_sixty_four_ranges_round_trip() {
        let (_dir, store) = local_store();
        super::layer_first_sixty_four_ranges_round_trip(&store);
    }

    #[test]
    fn contiguous_and_ranges_make_one_object() {
        let (_dir, store) = local_store();
        super::contiguous_and_ranges_make_one_object(&store);
    }

    #[test]
    fn o_direct_loads_and_stores_aligned_ranges() {
        let (_dir, store) = local_store();
        round_trip(&with(store, "o_direct", json!(true)), 4);
    }
}

// -- the guarantees, per range ------------------------------------------------------

fn memory_tier() -> Tier {
    Tier::from_json(&tier_json(json!({"type": "memory"}), json!({}))).unwrap()
}

fn range(region: u64, offset: u64, len: u64) -> MemoryRange {
    MemoryRange {
        region,
        offset,
        len,
    }
}

/// A job's result, which must be its one result, and the status its submit returned.
fn refused(
    tier: &Tier,
    kind: JobKind,
    id: u64,
    ranges: &[MemoryRange],
    per_key: usize,
    n: u64,
) -> (Status, String) {
    let ids: Vec<u64> = (0..n).collect();
    let submitted = tier
        .submit_ranges(kind, id, ranges, per_key, keys(&ids))
        .err()
        .unwrap_or_else(|| panic!("job {id} was accepted"));
    let result = wait_all(tier, 1).remove(&id).unwrap();
    assert_eq!(result.status, submitted.status);
    assert_eq!(result.key_status, vec![submitted.status; n as usize]);
    (submitted.status, submitted.message)
}

#[test]
fn every_range_is_checked_against_its_region_before_any_io() {
    let tier = memory_tier();
    let mut memory = vec![0u8; 4096];
    // SAFETY: the buffer outlives the tier's jobs (they are polled before it is dropped).
    let region = unsafe { tier.add_region(memory.as_mut_ptr(), memory.len()) }.unwrap();
    for kind in [JobKind::Store, JobKind::Load] {
        let cases: Vec<(Vec<MemoryRange>, usize, u64, &str)> = vec![
            (vec![range(region + 7, 0, 16)], 1, 1, "not registered"),
            (vec![range(region, 0, 0)], 1, 1, "length 0"),
            (vec![range(region, 4000, 97)], 1, 1, "outside region"),
            (vec![range(region, u64::MAX, 2)], 1, 1, "outside region"),
            (vec![range(region, 0, u64::MAX)], 1, 1, "outside region"),
            (vec![range(region, 0, 16)], 0, 1, "ranges_per_key is 0"),
            (
                vec![range(region, 0, 16)],
                5000,
                1,
                "ranges_per_key is 5000",
            ),
            (vec![range(region, 0, 16)], 1, 2, "need 2 ranges"),
            (
                vec![range(region, 0, 16), range(region, 0, 0)],
                2,
                1,
                "length 0",
            ),
        ];
        for (i, (ranges, per_key, n, says)) in cases.into_iter().enumerate() {
            let (status, message) = refused(&tier, kind, 10 + i as u64, &ranges, per_key, n);
            assert_eq!(status, Status::InvalidArgument, "{message}");
            assert!(message.contains(says), "case {i}: {message}");
        }
    }
    // Nothing was written into the region.
    assert!(memory.iter().all(|&b| b == 0));
    drop(tier);
}

#[test]
fn a_load_holds_its_bytes_alone_and_stores_share_them() {
    let tier = memory_tier();
    let mut memory = random_bytes(64 * 1024, 5);
    // SAFETY: as above.
    let region = unsafe { tier.add_region(memory.as_mut_ptr(), memory.len()) }.unwrap();
    // A second region over the second half of the same memory: holds are by address.
    let alias = unsafe { tier.add_region(memory.as_mut_ptr().add(32 * 1024), 32 * 1024) }.unwrap();

    // Two stores may read the same bytes at once.
    tier.submit_ranges(
        JobKind::Store,
        1,
        &[range(region, 0, 40 * 1024)],
        1,
        keys(&[1]),
    )
    .unwrap();
    tier.submit_ranges(
        JobKind::Store,
        2,
        &[range(region, 1024, 1024)],
        1,
        keys(&[2]),
    )
    .unwrap();
    // A load of bytes a store holds, through either region, is busy.
    let busy = tier
        .submit_ranges(JobKind::Load, 3, &[range(alias, 0, 16)], 1, keys(&[1]))
        .unwrap_err();
    assert_eq!(busy.status, Status::BlockBusy, "{}", busy.message);
    assert!(busy.message.contains("job 1"), "{}", busy.message);
    let results = wait_all(&tier, 3);
    assert!(results[&1].succeeded() && results[&2].succeeded());
    assert_eq!(results[&3].status, Status::BlockBusy);

    // Once polled, the bytes are free: a load takes them, and then a store of the same
    // bytes is busy until the load's result is polled.
    tier.submit_ranges(
        JobKind::Load,
        4,
        &[range(alias, 0, 8 * 1024)],
        1,
        keys(&[1]),
    )
    .unwrap();
    let store_busy = tier
        .submit_ranges(
            JobKind::Store,
            5,
            &[range(region, 32 * 1024 + 100, 8)],
            1,
            keys(&[5]),
        )
        .unwrap_err();
    assert_eq!(store_busy.status, Status::BlockBusy);
    let results = wait_all(&tier, 2);
    // Key 1's object is 40 KiB: an 8 KiB range is a length mismatch, failing alone.
    assert_eq!(results[&4].status, Status::LengthMismatch);
    assert_eq!(results[&5].status, Status::BlockBusy);
    assert!(
        memory[32 * 1024..40 * 1024] == random_bytes(64 * 1024, 5)[32 * 1024..40 * 1024],
        "a failed load wrote its range"
    );

    // The ranges of one load may not overlap each other.
    let (status, message) = refused(
        &tier,
        JobKind::Load,
        6,
        &[
            range(region, 0, 4096),
            range(alias, 0, 64),
            range(region, 4000, 200),
        ],
        1,
        3,
    );
    assert_eq!(status, Status::InvalidArgument, "{message}");
    let (status, _) = refused(
        &tier,
        JobKind::Load,
        7,
        &[range(region, 0, 4096), range(region, 4095, 2)],
        2,
        1,
    );
    assert_eq!(status, Status::InvalidArgument);
    drop(tier);
}

#[test]
fn memory_registered_later_over_held_bytes_sees_them_held() {
    // A region that overlaps nothing keeps its holds apart; memory registered over it
    // later (another region, or the pool) must still see what its jobs hold.
    let tier = memory_tier();
    let mut memory = random_bytes(4 * 8192, 11);
    let base = memory.as_mut_ptr();
    let at = |offset: usize| base.wrapping_add(offset);
    // SAFETY: the buffer outlives the tier's jobs (they are polled before it is dropped).
    let (first, last) = unsafe {
        (
            tier.add_region(at(0), 2 * 8192).unwrap(),
            tier.add_region(at(3 * 8192), 8192).unwrap(),
        )
    };
    tier.submit_ranges(JobKind::Load, 1, &[range(first, 0, 8192)], 1, keys(&[1]))
        .unwrap();
    tier.submit_ranges(JobKind::Store, 2, &[range(last, 0, 8192)], 1, keys(&[2]))
        .unwrap();
    // A region over bytes 4096..12288 meets the load through the first region.
    // SAFETY: as above.
    let over = unsafe { tier.add_region(at(4096), 8192) }.unwrap();
    for (id, kind) in [(3, JobKind::Load), (4, JobKind::Store)] {
        let busy = tier
            .submit_ranges(kind, id, &[range(over, 4000, 8)], 1, keys(&[id]))
            .unwrap_err();
        assert_eq!(busy.status, Status::BlockBusy, "{}", busy.message);
        assert!(busy.message.contains("job 1"), "{}", busy.message);
    }
    // Bytes the load does not hold are free through it (block 1's first bytes).
    tier.submit_ranges(JobKind::Store, 5, &[range(over, 4096, 8)], 1, keys(&[5]))
        .unwrap();
    // The pool, registered over all of it, meets the load (block 0) and the store through
    // the last region (block 3), which overlapped nothing until now.
    // SAFETY: as above.
    unsafe { tier.register_memory(at(0), 4, 8192) }.unwrap();
    for (id, block, holder) in [(6, 0, "job 1"), (7, 3, "job 2")] {
        let busy = tier
            .submit(JobKind::Load, id, &[block], keys(&[id]))
            .unwrap_err();
        assert_eq!(busy.status, Status::BlockBusy, "{}", busy.message);
        assert!(busy.message.contains(holder), "{}", busy.message);
    }
    let results = wait_all(&tier, 7);
    assert_eq!(results[&1].status, Status::NotFound);
    assert!(results[&2].succeeded() && results[&5].succeeded());
    // Polled, every byte is free again through any of them: block 3, stored through the
    // last region, loads into the bytes the first load held.
    tier.submit_ranges(JobKind::Load, 8, &[range(first, 0, 8192)], 1, keys(&[2]))
        .unwrap();
    tier.submit(JobKind::Load, 9, &[2], keys(&[2])).unwrap();
    let results = wait_all(&tier, 2);
    assert!(results[&8].succeeded() && results[&9].succeeded());
    assert!(
        memory[..8192] == memory[3 * 8192..] && memory[2 * 8192..3 * 8192] == memory[3 * 8192..]
    );
    drop(tier);
}

#[test]
fn a_region_is_removed_only_when_no_job_holds_it() {
    let tier = memory_tier();
    let mut memory = random_bytes(8192, 9);
    // SAFETY: as above.
    let region = unsafe { tier.add_region(memory.as_mut_ptr(), memory.len()) }.unwrap();
    let other = unsafe { tier.add_region(memory.as_mut_ptr(), 16) }.unwrap();
    assert_ne!(region, other);
    assert!(region > 0 && other > 0);
    tier.submit_ranges(JobKind::Store, 1, &[range(region, 0, 8192)], 1, keys(&[1]))
        .unwrap();
    tier.drain(std::time::Duration::from_secs(60)).unwrap();
    // Finished but not polled: the job still holds the region.
    let busy = tier.remove_region(region).unwrap_err();
    assert_eq!(busy.status, Status::BlockBusy, "{}", busy.message);
    tier.remove_region(other).unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    tier.remove_region(region).unwrap();
    // Removed ids are unknown from then on, and never reused.
    assert_eq!(
        tier.remove_region(region).unwrap_err().status,
        Status::InvalidArgument
    );
    let (status, message) = refused(&tier, JobKind::Load, 2, &[range(region, 0, 8192)], 1, 1);
    assert_eq!(status, Status::InvalidArgument);
    assert!(message.contains("not registered"), "{message}");
    let again = unsafe { tier.add_region(memory.as_mut_ptr(), memory.len()) }.unwrap();
    assert!(again > other);
    // After shutdown: no new region, no job; removing still works.
    tier.shutdown();
    let late = unsafe { tier.add_region(memory.as_mut_ptr(), 8) }.unwrap_err();
    assert_eq!(late.status, Status::ShutDown);
    let (status, _) = refused(&tier, JobKind::Store, 3, &[range(again, 0, 8)], 1, 1);
    assert_eq!(status, Status::ShutDown);
    tier.remove_region(again).unwrap();
    drop(tier);
}

#[test]
fn regions_are_checked_when_added() {
    let tier = memory_tier();
    let mut memory = vec![0u8; 16];
    // SAFETY: the calls only check their arguments.
    unsafe {
        assert_eq!(
            tier.add_region(std::ptr::null_mut(), 16)
                .unwrap_err()
                .status,
            Status::NullArgument
        );
        assert_eq!(
            tier.add_region(memory.as_mut_ptr(), 0).unwrap_err().status,
            Status::InvalidArgument
        );
        assert_eq!(
            tier.add_region(memory.as_mut_ptr(), usize::MAX)
                .unwrap_err()
                .status,
            Status::InvalidArgument
        );
    }
}
