//! The tier's counters. [`counters!`] below is the one list of them: it makes the
//! atomics the engine bumps, [`StatsSnapshot`] (which the compiler checks, field for
//! field, against the C ABI's `kvt_stats` in its conversion) and [`STATS_FIELDS`], the
//! names and help texts from which metrics are derived and against which the header's
//! `kvt_stats` comments and the Python binding are checked by tests.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter: its name (the field of `kvt_stats`) and what it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsField {
    pub name: &'static str,
    pub help: &'static str,
}

macro_rules! counters {
    ($($name:ident: $help:literal,)*) => {
        /// A snapshot of the tier's counters.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        // Not non_exhaustive: the C ABI's kvt_stats destructures it whole, so a counter added
        // here fails its build until the header has it too.
        pub struct StatsSnapshot {
            $(#[doc = $help] pub $name: u64,)*
        }

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

            /// A snapshot holding `values` in [`STATS_FIELDS`] order (0 for counters past
            /// the end of `values`).
            pub fn from_values(values: &[u64]) -> Self {
                let mut values = values.iter().copied();
                StatsSnapshot { $($name: values.next().unwrap_or_default(),)* }
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
    dedup_already_stored: "Store keys the store already held (a conditional PUT answered 412, or, for an object stored in parts, a HEAD found it); not a key whose 412 followed an attempt of this tier's that may have stored it and whose object is this store's (counted as stored).",
    direct_requests: "Stores, loads and existence checks sent on the direct HTTP path (`store.direct_http`).",
    direct_fallbacks: "Of those, the ones repeated through the general HTTP client after an unexpected answer or a transport error.",
    evicted_blocks: "Blocks this tier's eviction removed (the namespace's byte budget or maximum age), counting a block another tier or gc deleted first: S3 answers a delete of a missing object as done.",
    evicted_bytes: "Bytes of the blocks this tier's eviction removed.",
    retries: "Requests to the store sent again after a 5xx or 429 answer or a transport error (the storage client's retries and kvtier's own).",
    damaged_uploads: "Uploads the store refused because the body it received failed the request's checksum (damaged in transit); each is sent again within the store's retry budget (`retry_budget_ms`).",
    undecryptable_blocks: "Loads of encrypted objects that did not open with the tier's keyring (a key not in the ring, or a failed authentication tag: tampered with or copied under another name); counted apart from corrupt_blocks.",
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
        let expected: Vec<u64> = (0..STATS_FIELDS.len() as u64).map(|i| i + 100).collect();
        assert_eq!(values, expected);
    }
}
