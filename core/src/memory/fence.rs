//! The tier's fence on writes into caller memory, which shutdown closes.
//!
//! A load writes the caller's blocks from two places: the polls of its job on the I/O
//! threads (bytes from the network, decryption) and the copies out of a file I/O thread's
//! own buffer (the local store reads into library memory, never straight into the block,
//! because a read can hang in the kernel for as long as its file system does). Both happen
//! inside the fence. Closing it waits for the writes in progress, each a bounded piece of
//! CPU work (a poll, a memcpy of at most one read buffer), and refuses every later one, so
//! once shutdown has closed it nothing of the tier writes caller memory again, whatever its
//! threads are still blocked in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// The state's top bit: closed. The rest counts the writers inside.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// See the module comment. One per tier.
#[derive(Debug, Default)]
pub(crate) struct CallerMemoryFence {
    state: AtomicUsize,
    /// Taken by the last writer leaving a closed fence before it wakes the closer, so the
    /// closer, which checks the count under it, never misses that wake-up.
    left: Mutex<()>,
    all_out: Condvar,
}

/// A writer inside the fence; leaving is dropping it.
pub(crate) struct Inside<'a>(&'a CallerMemoryFence);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl CallerMemoryFence {
    /// Enters the fence for one bounded write; `None` once it is closed (write nothing).
    pub(crate) fn enter(&self) -> Option<Inside<'_>> {
        let before = self.state.fetch_add(1, Ordering::SeqCst);
        if before & CLOSED != 0 {
            self.leave();
            return None;
        }
        Some(Inside(self))
    }

    fn leave(&self) {
        let before = self.state.fetch_sub(1, Ordering::SeqCst);
        if before == CLOSED | 1 {
            let _left = self.left.lock().unwrap_or_else(|p| p.into_inner());
            self.all_out.notify_all();
        }
    }

    /// Refuses every later write and waits for those inside to finish. Idempotent.
    ///
    /// The wait has no deadline of its own: what it waits for is CPU work on memory the
    /// library owns or the caller keeps resident (a poll, a memcpy), never a system call
    /// that waits on a device, and returning before it ends would let it write caller
    /// memory after shutdown returned. It is said in the log when it takes long.
    pub(crate) fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::SeqCst);
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        let mut waited = Duration::ZERO;
        const STEP: Duration = Duration::from_millis(100);
        while self.state.load(Ordering::SeqCst) & !CLOSED != 0 {
            left = self
                .all_out
                .wait_timeout(left, STEP)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            waited += STEP;
            if waited == Duration::from_secs(1) {
                log::warn!(
                    "shutdown: writes into caller memory still in progress after 1 s (a busy \
                     machine, or the caller's memory paging in); waiting for them"
                );
            }
        }
    }

    #[cfg(test)]
    fn is_closed(&self) -> bool {
        self.state.load(Ordering::SeqCst) & CLOSED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn close_waits_for_writers_inside_and_refuses_later_ones() {
        let fence = Arc::new(CallerMemoryFence::default());
        let inside = fence.enter().expect("open");
        let (closed_tx, closed_rx) = std::sync::mpsc::channel();
        let closer = {
            let fence = fence.clone();
            std::thread::spawn(move || {
                fence.close();
                closed_tx.send(()).unwrap();
            })
        };
        // The closer marks the fence closed first, then waits for the writer inside.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !fence.is_closed() {
            assert!(
                std::time::Instant::now() < deadline,
                "the fence never closed"
            );
            std::thread::yield_now();
        }
        assert!(
            fence.enter().is_none(),
            "no write starts once it is closing"
        );
        assert!(
            closed_rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "close returned while a writer was inside"
        );
        drop(inside);
        closed_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("close returns once the writer left");
        closer.join().unwrap();
        assert!(fence.enter().is_none());
        fence.close();
    }
}
