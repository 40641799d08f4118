//! A tier's end: bounded by its grace period, whatever the store or a keyring command is
//! blocked in, and leaving the caller's memory alone once it returns.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::jobs::{failed_result, Phase};
use super::{JobKind, KeyBatch, Tier};
use crate::error::{Error, Status};

/// How long shutdown waits, after the grace period, for the tier's threads to stop: the I/O
/// threads drop their tasks within microseconds; a thread blocked in the kernel or in a
/// keyring command is not waited for past this.
pub(crate) const RUNTIME_STOP: Duration = Duration::from_secs(1);

impl Tier {
    /// Stops the tier: refuses new work, cancels work that has not started (reported as
    /// `Cancelled`), waits up to `shutdown_timeout_ms` for operations in progress, then
    /// abandons them (reported as `Cancelled`). Returns within the grace period plus
    /// [`RUNTIME_STOP`] (and the few microseconds a write into caller memory in progress
    /// takes to finish), whatever the store or a keyring command is blocked in. Afterwards
    /// no thread of the tier writes the host pool: the fence on caller memory is closed
    /// before the threads are let go, and a thread still held in the kernel (a local read
    /// of a hung file system) reads into a buffer of its own and is left to end when the
    /// kernel lets it. Results stay available to `poll`. Idempotent.
    pub fn shutdown(&self) {
        let runtime = self
            .runtime
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(runtime) = runtime else { return };
        let lookup_runtime = self
            .lookup_runtime
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.shared.closing.store(true, Ordering::Release);
        self.shared.transfer_permits.close();
        self.shared.lookup_permits.close();
        let grace = Duration::from_millis(self.shared.config.shutdown_timeout_ms);
        if let Err(e) = self.drain(grace) {
            log::warn!("shutdown: {}; abandoning them", e.message);
        }
        // No write into caller memory starts after this, and those in progress (a poll of a
        // job, a copy out of a file I/O thread's buffer) have ended.
        self.shared.caller_memory.close();
        if let Some(encryption) = &self.shared.encryption {
            encryption.stop_refreshing();
        }
        // Tasks are dropped; threads still blocked after RUNTIME_STOP (a read the kernel
        // holds, a keyring command that hangs) are left behind, never waited for.
        runtime.shutdown_timeout(RUNTIME_STOP);
        if let Some(lane) = lookup_runtime {
            lane.shutdown_timeout(RUNTIME_STOP);
        }
        let abandoned: Vec<(u64, JobKind, KeyBatch, Instant)> = self
            .shared
            .table()
            .jobs
            .iter()
            .filter_map(|(&id, phase)| match phase {
                Phase::Running {
                    kind,
                    keys,
                    submitted,
                } => Some((id, *kind, keys.clone(), *submitted)),
                Phase::Finished => None,
            })
            .collect();
        for (id, kind, keys, submitted) in abandoned {
            let e = Error::new(
                Status::Cancelled,
                "the tier shut down before the job finished",
            );
            let mut result = failed_result(id, kind, keys, &e);
            result.seconds = submitted.elapsed().as_secs_f64();
            self.shared.finish(result);
        }
    }
}
