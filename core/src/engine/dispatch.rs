//! From a submit call to a running job: the caller's thread queues the job and wakes the
//! dispatcher only when it waits; the dispatcher, a task on the I/O runtime, spawns the
//! jobs' tasks. The caller's thread thus pays neither a task's allocation nor its entry
//! in the runtime's task list, and one wake-up serves every job queued meanwhile.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use futures::FutureExt;
use tokio::runtime::Runtime;
use tokio::sync::Notify;

use super::jobs::failed_result;
use super::transfer;
use super::{JobKind, KeyBatch, TierState};
use crate::error::{panic_message, Error, Status};
use crate::memory::{BlockMemory, CallerMemoryFence};

/// A job admitted, checked and holding its memory, waiting for its task. It is in the job
/// table as running from its submit on: should the runtime stop before the dispatcher
/// spawns it, shutdown reports it as cancelled, like a task dropped unpolled.
pub(crate) struct QueuedJob {
    pub(crate) kind: JobKind,
    pub(crate) job_id: u64,
    pub(crate) memory: Vec<BlockMemory>,
    pub(crate) keys: KeyBatch,
    pub(crate) submitted: Instant,
}

/// The caller's end of the dispatcher.
pub(crate) struct Dispatch {
    queue: Sender<QueuedJob>,
    /// Holds one permit while the dispatcher runs, so that a job queued while it is busy
    /// costs the caller a compare-and-swap, not a wake-up.
    wake: Arc<Notify>,
}

impl Dispatch {
    /// Starts the dispatcher on `runtime`; it ends with the runtime.
    pub(crate) fn start(runtime: &Runtime, shared: Arc<TierState>) -> Self {
        let (queue, queued) = crossbeam_channel::unbounded();
        let wake = Arc::new(Notify::new());
        drop(runtime.spawn(dispatch(queued, wake.clone(), shared)));
        Dispatch { queue, wake }
    }

    /// Hands `job` to the dispatcher. Call it while the runtime is known to run (under
    /// the tier's runtime lock): a job queued after the runtime stopped would wait for
    /// shutdown's sweep of the job table, which has already passed.
    pub(crate) fn queue(&self, job: QueuedJob) {
        // The receiver lives in the dispatcher's task, which lives as long as the runtime.
        let _ = self.queue.send(job);
        self.wake.notify_one();
    }
}

/// Spawns each queued job's task, then waits for the next wake-up. A wake-up that comes
/// while it spawns leaves a permit behind, so no job is left waiting.
async fn dispatch(queued: Receiver<QueuedJob>, wake: Arc<Notify>, shared: Arc<TierState>) {
    loop {
        while let Ok(job) = queued.try_recv() {
            let fence = shared.caller_memory.clone();
            drop(tokio::spawn(Fenced {
                fence,
                job: run(shared.clone(), job),
            }));
        }
        wake.notified().await;
    }
}

/// Runs a job and publishes its one result, a panic included.
async fn run(shared: Arc<TierState>, job: QueuedJob) {
    let QueuedJob {
        kind,
        job_id,
        memory,
        keys,
        submitted,
    } = job;
    let transfer = transfer::run_job(
        shared.clone(),
        kind,
        job_id,
        memory,
        keys.clone(),
        submitted,
    );
    let result = match std::panic::AssertUnwindSafe(transfer).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let e = Error::new(
                Status::Panic,
                format!("job {job_id} panicked: {}", panic_message(&*panic)),
            );
            failed_result(job_id, kind, keys, &e)
        }
    };
    shared.finish(result);
}

/// A job's future, polled only inside the fence on caller memory (a load writes the block
/// in its polls): ready, unpolled, once shutdown closed the fence, and shutdown reports
/// the job.
struct Fenced<F> {
    fence: Arc<CallerMemoryFence>,
    job: F,
}

impl<F: std::future::Future<Output = ()>> std::future::Future for Fenced<F> {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        // SAFETY: `job` is pinned with `self` (structural pinning): it is never moved out
        // of `self`, `Fenced` has no Drop of its own and is not Unpin unless `F` is.
        let this = unsafe { self.get_unchecked_mut() };
        match this.fence.enter() {
            // SAFETY: as above; `this.job` stays where it is.
            Some(_inside) => unsafe { std::pin::Pin::new_unchecked(&mut this.job) }.poll(cx),
            None => std::task::Poll::Ready(()),
        }
    }
}
