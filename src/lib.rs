//! kvtier: a secondary KV-cache tier on object storage.
//!
//! Rooms, with data flowing one way (caller → engine → store):
//! * [`Tier`] and the rest of `engine`: job table, transfers, dedup, lookups, events, stats;
//! * [`store`]: the store clients (local, memory, S3, Azure Blob, GCS) and the direct HTTP path;
//! * `integrity`: block checksums; `redact`: credentials kept out of messages; `signals`:
//!   SIGPIPE kept off the host; [`key`]: key layout and object names; [`config`];
//!   [`namespace`]: vLLM's namespace string; `memory`: the caller's memory (host pool,
//!   regions, the pieces of a key's object);
//! * `ffi`: the C ABI (`include/kvtier.h`), a thin layer over the same Rust API: its own
//!   value types (`ffi::abi`, converted from the engine's), the panic boundary, the log
//!   callback (`ffi::logs`).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
mod encryption;
mod engine;
pub mod error;
pub mod ffi;
mod integrity;
pub mod key;
mod memory;
pub mod namespace;
mod redact;
mod signals;
pub mod store;

pub use config::TierConfig;
pub use encryption::ObjectOpener;
pub use engine::{
    choose_evictions, EvictionCandidate, EvictionReason, EvictionReport, JobKind, JobResult,
    KeyBatch, KvEvent, LookupResult, StatsField, StatsSnapshot, Tier, EVENT_MEDIUM,
    MAX_KEYS_PER_JOB, STATS_FIELDS,
};
pub use error::{Error, Result, Status};
pub use integrity::{CRC_METADATA, CRC_METADATA_AZURE};
pub use memory::{HostPool, MemoryRange, MAX_RANGES_PER_JOB, MAX_RANGES_PER_KEY};

/// The library version, from Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
