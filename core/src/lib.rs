//! kvtier-core: the tier itself, a secondary KV-cache tier on object storage. The C ABI
//! (the `kvtier` crate, `libkvtier.so`) and the command line (`kvtier-cli`) sit above it
//! and use only its public API; nothing here knows either.
//!
//! Rooms, with data flowing one way (caller → engine → store), each layer using only the
//! layers below it (`tests/layering.rs` fails on an import that runs up or in a circle):
//! * [`Tier`] and the rest of `engine`: job table, transfers, dedup, lookups, events, stats;
//! * [`store`]: the store clients (local, memory, S3, Azure Blob, GCS) and the direct HTTP path;
//! * `integrity`: block checksums; `redact`: credentials kept out of messages; `signals`:
//!   SIGPIPE kept off the host; [`key`]: key layout and object names; [`config`];
//!   [`namespace`]: vLLM's namespace string; `memory`: the caller's memory (host pool,
//!   regions, the pieces of a key's object);
#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
mod encryption;
mod engine;
pub mod error;
mod integrity;
pub mod key;
mod memory;
pub mod namespace;
pub mod redact;
mod signals;
pub mod store;

pub use config::TierConfig;
pub use encryption::{
    check_config, encrypted_block_len, encrypted_object_len, is_encrypted_object, ObjectOpener,
};
pub use engine::is_tier_thread;
pub use engine::{
    choose_evictions, EvictionCandidate, EvictionReason, EvictionReport, JobKind, JobResult,
    KeyBatch, KvEvent, LookupResult, StatsField, StatsSnapshot, Tier, EVENT_MEDIUM,
    MAX_KEYS_PER_JOB, STATS_FIELDS,
};
pub use error::{panic_message, Error, Result, Status};
pub use integrity::{CRC_METADATA, CRC_METADATA_AZURE};
pub use memory::{HostPool, MemoryRange, MAX_RANGES_PER_JOB, MAX_RANGES_PER_KEY};

/// The library version, from Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
