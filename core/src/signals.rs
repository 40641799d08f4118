//! SIGPIPE kept away from the host process.
//!
//! A write to a connection the server has reset raises SIGPIPE in the writing thread,
//! unless the write asks otherwise: the standard library's `send` passes MSG_NOSIGNAL, but
//! vectored writes (`writev`, which the HTTP client uses for a request's head and body)
//! cannot. Rust programs and CPython ignore SIGPIPE; a C or C++ host usually keeps the
//! default action, which ends the process: one server outage would kill the engine. So
//! every thread the library starts blocks SIGPIPE (a signal a thread raises on itself
//! stays pending there, unseen, and the write fails with EPIPE as a job's error), and
//! the few calls that do I/O on the caller's thread block it for their duration and
//! discard what they raised.

use std::mem::MaybeUninit;

fn sigpipe_set() -> libc::sigset_t {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given; sigaddset adds a valid signal.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGPIPE);
        set.assume_init()
    }
}

/// Blocks SIGPIPE on the calling thread for the rest of its life: for threads the library
/// starts and owns (runtime workers, blocking-pool threads, helper threads).
pub(crate) fn block_sigpipe_on_library_thread() {
    let set = sigpipe_set();
    // SAFETY: changes only the calling thread's signal mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Runs `f` on the caller's thread with SIGPIPE blocked, then discards a SIGPIPE that
/// became pending on this thread meanwhile (one pending before is left alone) and puts the
/// caller's signal mask back as it was, also when `f` panics.
pub(crate) fn without_sigpipe_on_caller_thread<T>(f: impl FnOnce() -> T) -> T {
    let _blocked = CallerSigpipeBlocked::new();
    f()
}

/// SIGPIPE blocked on the caller's thread while this lives ([`without_sigpipe_on_caller_thread`]).
struct CallerSigpipeBlocked {
    old_mask: libc::sigset_t,
    pending_before: bool,
}

impl CallerSigpipeBlocked {
    fn new() -> Self {
        let set = sigpipe_set();
        let mut old = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: changes only the calling thread's signal mask, keeping the old one.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, old.as_mut_ptr()) };
        CallerSigpipeBlocked {
            // SAFETY: pthread_sigmask filled `old`.
            old_mask: unsafe { old.assume_init() },
            pending_before: sigpipe_pending(),
        }
    }
}

impl Drop for CallerSigpipeBlocked {
    fn drop(&mut self) {
        if !self.pending_before && sigpipe_pending() {
            let set = sigpipe_set();
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: takes the pending SIGPIPE off this thread (it is blocked, so no
            // handler runs); a zero timeout never waits.
            unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) };
        }
        // SAFETY: restores the caller's own mask.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut()) };
    }
}

fn sigpipe_pending() -> bool {
    let mut pending = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigpending fills the set it is given; sigismember reads it.
    unsafe {
        libc::sigpending(pending.as_mut_ptr());
        libc::sigismember(pending.as_ptr(), libc::SIGPIPE) == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A write to a pipe whose reader is gone raises SIGPIPE like a reset connection does.
    fn write_to_broken_pipe() -> std::io::Error {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let fd = writer.as_raw_fd();
        // SAFETY: a one-byte write to a descriptor this function owns; plain write(2), not
        // send(2), so no MSG_NOSIGNAL.
        let n = unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) };
        assert_eq!(n, -1);
        std::io::Error::last_os_error()
    }

    fn sigpipe_blocked() -> bool {
        let mut mask = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: reads the calling thread's mask.
        unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), mask.as_mut_ptr());
            libc::sigismember(mask.as_ptr(), libc::SIGPIPE) == 1
        }
    }

    // The test harness ignores SIGPIPE process-wide (Rust's start-up does), so these check
    // the masks and the pending set, which decide whether a default-action host dies. (On
    // Linux a blocked signal is never discarded as ignored: it stays pending.)
    #[test]
    fn the_caller_gets_its_mask_back_and_no_sigpipe_left_pending() {
        std::thread::spawn(|| {
            assert!(!sigpipe_blocked());
            let err = without_sigpipe_on_caller_thread(|| {
                assert!(sigpipe_blocked());
                let err = write_to_broken_pipe();
                assert!(sigpipe_pending(), "the write raised SIGPIPE on this thread");
                err
            });
            assert_eq!(err.raw_os_error(), Some(libc::EPIPE));
            assert!(!sigpipe_pending(), "the raised SIGPIPE was discarded");
            assert!(!sigpipe_blocked(), "the caller's mask is back");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_panic_inside_still_gives_the_caller_its_mask_back() {
        std::thread::spawn(|| {
            let caught = std::panic::catch_unwind(|| {
                without_sigpipe_on_caller_thread(|| {
                    write_to_broken_pipe();
                    panic!("inside");
                })
            });
            assert!(caught.is_err());
            assert!(!sigpipe_pending(), "the raised SIGPIPE was discarded");
            assert!(!sigpipe_blocked(), "the caller's mask is back");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_library_thread_keeps_sigpipe_blocked() {
        std::thread::spawn(|| {
            block_sigpipe_on_library_thread();
            assert!(sigpipe_blocked());
            assert_eq!(write_to_broken_pipe().raw_os_error(), Some(libc::EPIPE));
        })
        .join()
        .unwrap();
    }
}
