//! Results of a tier's jobs and lookups, waited for: every job answers exactly once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvtier_core::{JobKind, JobResult, LookupResult, Tier};

use super::data::keys;

/// Waits for every job in flight and returns exactly `expected` results by job id,
/// failing on a duplicate or a missing result.
pub fn wait_all(tier: &Tier, expected: usize) -> HashMap<u64, JobResult> {
    tier.drain(Duration::from_secs(180))
        .expect("jobs did not finish within 180 s");
    let mut seen = HashMap::new();
    for r in tier.poll(usize::MAX) {
        let id = r.job_id;
        assert!(seen.insert(id, r).is_none(), "job {id} reported twice");
    }
    assert_eq!(
        seen.len(),
        expected,
        "expected {expected} results, got {}",
        seen.len()
    );
    seen
}

/// Calls lookup until it stops answering Retry, ending a step between calls.
pub fn resolve_lookup(tier: &Tier, request: u64, k: &[u8]) -> LookupResult {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = tier.lookup(request, k).unwrap();
        if v != LookupResult::Retry {
            return v;
        }
        assert!(Instant::now() < deadline, "lookup never resolved");
        tier.schedule_end().unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Submits one job (`blocks` of the registered memory as the keys numbered `ids`, see
/// [`keys`]) and returns its result, the only one in flight.
pub fn run_job(tier: &Tier, kind: JobKind, job: u64, blocks: &[u64], ids: &[u64]) -> JobResult {
    tier.submit(kind, job, blocks, keys(ids)).unwrap();
    wait_all(tier, 1).remove(&job).unwrap()
}
