//! The tier's counters. [`counters!`] below is the one list of them: it makes the
//! atomics the engine bumps, the snapshot's constructor (which the compiler checks against
//! the C struct [`StatsSnapshot`], field for field) and [`STATS_FIELDS`], the names and
//! help texts from which metrics are derived and against which the header and the Python
//! binding are checked by tests.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter: its name (the field of `kvt_stats`) and what it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsField {
    pub name: &'static str,
    pub help: &'static str,
}

macro_rules! counters {
    ($($name:ident: $help:literal,)*) => {
        /// Counters since the tier was created.
        #[derive(Debug, Default)]
        pub(crate) struct Stats {
            $(pub(crate) $name: AtomicU64,)*
        }

        /// Every counter of [`StatsSnapshot`], in field order.
        pub const STATS_FIELDS: &[StatsField] = &[$(StatsField { name: stringify!($name), help: $help },)*];

        impl Stats {
            pub(crate) fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl StatsSnapshot {
            /// The values in [`STATS_FIELDS`] order.
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$name,)*]
            }
        }

        #[cfg(test)]
        impl Stats {
            /// The counters in [`STATS_FIELDS`] order.
            fn counters(&self) -> Vec<&AtomicU64> {
                vec![$(&self.$name,)*]
            }
        }
    };
}

counters! {
    keys_stored: "Keys stored successfully.",
    keys_loaded: "Keys loaded successfully.",
    bytes_stored: "Bytes of the keys stored successfully.",
    bytes_loaded: "Bytes of the keys loaded successfully.",
    keys_failed: "Keys of store or load jobs that failed.",
    existence_checks: "Existence checks (HEAD requests) sent to the store.",
    existence_check_errors: "Existence checks that failed (neither found nor absent).",
    corrupt_blocks: "Loads whose bytes did not match the recorded checksum.",
    dedup_known: "Store keys skipped without asking the store: the tier stored or found them within known_keys_ttl_ms.",
    dedup_joined: "Store keys that waited for a concurrent upload of the same key instead of uploading.",
    dedup_already_stored: "Store keys the store already held (conditional PUT answered 412).",
    direct_requests: "Loads and existence checks sent on the direct HTTP path (`store.direct_http`).",
    direct_fallbacks: "Of those, the ones repeated through the general HTTP client after an unexpected answer or a transport error.",
    evicted_blocks: "Blocks this tier's eviction removed (the namespace's byte budget or maximum age), counting a block another tier or gc deleted first: S3 answers a delete of a missing object as done.",
    evicted_bytes: "Bytes of the blocks this tier's eviction removed.",
    retries: "Requests to the store sent again after a 5xx or 429 answer or a transport error (the storage client's retries and kvtier's own).",
    damaged_uploads: "Uploads the store refused because the body it received failed the request's checksum (damaged in transit); each is sent again, up to max_retries times.",
}

/// A snapshot of the tier's counters. Counters are only ever appended, never renumbered.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
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
    /// Store keys the store already held (conditional PUT answered 412).
    pub dedup_already_stored: u64,
    /// Loads and existence checks sent on the direct HTTP path (`store.direct_http`).
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
    /// checksum (damaged in transit); each is sent again, up to max_retries times.
    pub damaged_uploads: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_the_field_list() {
        let stats = Stats::default();
        let counters = stats.counters();
        assert_eq!(counters.len(), STATS_FIELDS.len());
        for (i, (field, counter)) in STATS_FIELDS.iter().zip(counters).enumerate() {
            assert!(!field.help.is_empty(), "{} has no help", field.name);
            counter.store(i as u64 + 100, Ordering::Relaxed);
        }
        let values = stats.snapshot().values();
        assert_eq!(values.len(), STATS_FIELDS.len());
        assert_eq!(values.len() * 8, std::mem::size_of::<StatsSnapshot>());
        let expected: Vec<u64> = (0..STATS_FIELDS.len() as u64).map(|i| i + 100).collect();
        assert_eq!(values, expected);
    }
}
