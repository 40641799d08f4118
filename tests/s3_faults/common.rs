//! What the fault tests share: the block size, how they pick requests to fault, and how
//! they check that no key succeeded with wrong bytes.

use kvtier_core::{JobKind, JobResult, Status, Tier};

use crate::support::proxy::{Fault, RequestInfo};
use crate::support::*;

pub const BLOCK: usize = 32 * 1024;

/// A deterministic "1 in n" choice by request number (a hash of it, so faults spread).
pub fn one_in(n: u64, salt: u64) -> impl Fn(&RequestInfo) -> bool {
    move |r: &RequestInfo| {
        r.seq > 0 && ((r.seq ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32).is_multiple_of(n)
    }
}

/// Checks every successful load key against the block it was stored from.
pub fn assert_loaded_bytes(pool: &Pool, r: &JobResult, slots: &[u64], sources: &[u64]) {
    assert_eq!(r.key_status.len(), slots.len(), "one status per key");
    for ((status, slot), source) in r.key_status.iter().zip(slots).zip(sources) {
        if status.is_ok() {
            assert!(
                pool.block(*slot) == pool.block(*source),
                "key of block {source} succeeded with wrong bytes in slot {slot}"
            );
        }
    }
}

/// Faults the first request of each block object with `method` gets; later ones pass.
pub fn first_of_each_object(method: &'static str, fault: Fault) -> impl Fn(&RequestInfo) -> Fault {
    let seen = std::sync::Mutex::new(std::collections::HashSet::new());
    move |r: &RequestInfo| {
        if r.method == method
            && r.path.contains(".bin")
            && seen.lock().unwrap().insert(r.path.clone())
        {
            fault
        } else {
            Fault::Pass
        }
    }
}

/// Stores `jobs` jobs of four keys (blocks `4j..4j + 4` of the pool as keys of the same
/// numbers), then loads each job's keys into the far end of the pool (block `i` into slot
/// `pool.blocks - 1 - i`): every job must succeed despite the faults, and every key load
/// its own bytes.
pub fn store_and_load_in_fours(tier: &Tier, pool: &Pool, jobs: u64) {
    let far_end = |ids: &[u64]| -> Vec<u64> { ids.iter().map(|i| pool.blocks - 1 - i).collect() };
    for job in 0..jobs {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        tier.submit(JobKind::Store, job, &ids, keys(&ids)).unwrap();
    }
    for (id, r) in wait_all(tier, jobs as usize) {
        assert_eq!(
            r.status,
            Status::Ok,
            "store job {id} failed despite retries: {}",
            r.message
        );
    }
    for job in 0..jobs {
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        tier.submit(JobKind::Load, 100 + job, &far_end(&ids), keys(&ids))
            .unwrap();
    }
    let loads = wait_all(tier, jobs as usize);
    for job in 0..jobs {
        let r = &loads[&(100 + job)];
        assert_eq!(
            r.status,
            Status::Ok,
            "load job {job} failed despite retries: {}",
            r.message
        );
        let ids: Vec<u64> = (job * 4..job * 4 + 4).collect();
        assert_loaded_bytes(pool, r, &far_end(&ids), &ids);
    }
}
