//! The C ABI's value types: the enums and structs the header declares beside the status
//! enum. The engine has its own Rust types for the same things; these are converted from
//! them at the boundary, so that an engine change is never an ABI change by accident.
//! Every conversion names every field or variant, so the compiler refuses an engine type
//! that gained one the ABI lacks.
//!
//! (`Status` is the exception: the one status enum is both the Rust error kind and the C
//! status code, and lives in `error.rs`; a copy here would be a second list of the same
//! codes.)

use kvtier_core as engine;
use kvtier_core::MemoryRange;

/// Moves every field of an engine struct into the ABI struct of the same field names,
/// stating the names once; the destructuring makes the compiler check that no field of
/// either side is left out.
macro_rules! same_fields {
    ($value:expr, $from:path => $to:ident { $($field:ident),* $(,)? }) => {{
        let $from { $($field),* } = $value;
        $to { $($field),* }
    }};
}

/// A part of a key's object in caller memory: `len` bytes at `offset` in region `region`
/// (an id from `kvt_tier_add_region`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvt_range {
    pub region: u64,
    pub offset: u64,
    pub len: u64,
}

impl From<kvt_range> for kvtier_core::MemoryRange {
    fn from(range: kvt_range) -> Self {
        same_fields!(range, kvt_range => MemoryRange { region, offset, len })
    }
}

/// Direction of a job.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum kvt_job_kind {
    /// Host pool to store.
    Store = 0,
    /// Store to host pool.
    Load = 1,
}

impl From<engine::JobKind> for kvt_job_kind {
    fn from(kind: engine::JobKind) -> Self {
        match kind {
            engine::JobKind::Store => kvt_job_kind::Store,
            engine::JobKind::Load => kvt_job_kind::Load,
        }
    }
}

/// Answer to a lookup.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum kvt_lookup_result {
    /// The tier does not hold the key.
    Miss = 0,
    /// The tier holds the key.
    Hit = 1,
    /// Not known yet: ask again in a later step.
    Retry = 2,
}

impl From<engine::LookupResult> for kvt_lookup_result {
    fn from(result: engine::LookupResult) -> Self {
        match result {
            engine::LookupResult::Miss => kvt_lookup_result::Miss,
            engine::LookupResult::Hit => kvt_lookup_result::Hit,
            engine::LookupResult::Retry => kvt_lookup_result::Retry,
        }
    }
}

/// What one eviction round found and did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvt_eviction_report {
    /// Blocks of the namespace and their bytes before the round.
    pub objects: u64,
    pub bytes: u64,
    /// Blocks deleted and their bytes.
    pub deleted: u64,
    pub deleted_bytes: u64,
}

impl From<engine::EvictionReport> for kvt_eviction_report {
    fn from(report: engine::EvictionReport) -> Self {
        same_fields!(report, engine::EvictionReport => kvt_eviction_report {
            objects,
            bytes,
            deleted,
            deleted_bytes,
        })
    }
}

/// A snapshot of the tier's counters. Counters are only ever appended, never renumbered.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvt_stats {
    /// Keys stored successfully.
    pub keys_stored: u64,
    /// Keys loaded successfully.
    pub keys_loaded: u64,
    /// Bytes of the keys stored successfully.
    pub bytes_stored: u64,
    /// Bytes of the keys loaded successfully.
    pub bytes_loaded: u64,
    /// Keys of store or load jobs that failed.
    pub keys_failed: u64,
    /// Existence checks (HEAD requests) sent to the store.
    pub existence_checks: u64,
    /// Existence checks that failed (neither found nor absent).
    pub existence_check_errors: u64,
    /// Loads whose bytes did not match the recorded checksum.
    pub corrupt_blocks: u64,
    /// Store keys skipped without asking the store: the tier stored or found them within
    /// known_keys_ttl_ms.
    pub dedup_known: u64,
    /// Store keys that waited for a concurrent upload of the same key instead of uploading.
    pub dedup_joined: u64,
    /// Store keys the store already held (a conditional PUT answered 412, or, for an object
    /// stored in parts, a HEAD found it); not a key whose 412 followed an attempt of this
    /// tier's that may have stored it and whose object is this store's (counted as stored).
    pub dedup_already_stored: u64,
    /// Stores, loads and existence checks sent on the direct HTTP path (`store.direct_http`).
    pub direct_requests: u64,
    /// Of those, the ones repeated through the general HTTP client after an unexpected
    /// answer or a transport error.
    pub direct_fallbacks: u64,
    /// Blocks this tier's eviction removed (the namespace's byte budget or maximum age),
    /// counting a block another tier or gc deleted first: S3 answers a delete of a missing
    /// object as done.
    pub evicted_blocks: u64,
    /// Bytes of the blocks this tier's eviction removed.
    pub evicted_bytes: u64,
    /// Requests to the store sent again after a 5xx or 429 answer or a transport error
    /// (the storage client's retries and kvtier's own).
    pub retries: u64,
    /// Uploads the store refused because the body it received failed the request's
    /// checksum (damaged in transit); each is sent again within the store's retry budget
    /// (`retry_budget_ms`).
    pub damaged_uploads: u64,
    /// Loads of encrypted objects that did not open with the tier's keyring (a key not in
    /// the ring, or a failed authentication tag: tampered with or copied under another
    /// name); counted apart from corrupt_blocks.
    pub undecryptable_blocks: u64,
}

impl From<engine::StatsSnapshot> for kvt_stats {
    fn from(stats: engine::StatsSnapshot) -> Self {
        same_fields!(stats, engine::StatsSnapshot => kvt_stats {
            keys_stored,
            keys_loaded,
            bytes_stored,
            bytes_loaded,
            keys_failed,
            existence_checks,
            existence_check_errors,
            corrupt_blocks,
            dedup_known,
            dedup_joined,
            dedup_already_stored,
            direct_requests,
            direct_fallbacks,
            evicted_blocks,
            evicted_bytes,
            retries,
            damaged_uploads,
            undecryptable_blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stats_struct_follows_the_counter_list() {
        // Field order is the ABI: each counter lands at its index in STATS_FIELDS.
        assert_eq!(
            std::mem::size_of::<kvt_stats>(),
            engine::STATS_FIELDS.len() * 8
        );
        let n = engine::STATS_FIELDS.len() as u64;
        let snapshot = engine::StatsSnapshot::from_values(&(100..100 + n).collect::<Vec<_>>());
        let c = kvt_stats::from(snapshot);
        // SAFETY: kvt_stats is repr(C), all u64, size checked above.
        let words: &[u64] =
            unsafe { std::slice::from_raw_parts(&c as *const kvt_stats as *const u64, n as usize) };
        assert_eq!(words, (100..100 + n).collect::<Vec<_>>().as_slice());
    }
}
