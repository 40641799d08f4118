//! kvtier: a secondary KV-cache tier on object storage.
//!
//! The engine (config, store, key layout, pool, jobs) is plain Rust; `ffi` is the C ABI.

pub mod config;
pub mod error;
pub mod ffi;
pub mod key;
pub mod lookup;
pub mod namespace;
pub mod pool;
pub mod direct_http;
pub mod store;
pub mod tier;

pub use config::TierConfig;
pub use error::{Error, Result, Status};
pub use lookup::LookupResult;
pub use tier::{JobKind, JobResult, KeyBatch, StatsSnapshot, StoredEvent, Tier};

/// The library version, from Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
