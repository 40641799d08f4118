//! The tier's I/O runtimes: one for transfers, optionally one (single-threaded) for the
//! lookup lane, so that existence checks never queue behind transfers.

use tokio::runtime::Runtime;

use crate::config::StoreConfig;
use crate::error::{Error, Result, Status};
use crate::store::Store;

/// What every thread of a tier's runtimes is named with, by which the C boundary's panic
/// hook knows a panic on one of them as the library's.
const THREAD_PREFIX: &str = "kvtier-";

/// The tier's runtimes, by what they serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Stores, loads, eviction and (without a separate lane) lookups.
    Transfers,
    /// Existence checks, on their own thread and connections.
    Lookups,
}

impl Lane {
    fn thread_name(self) -> String {
        let lane = match self {
            Lane::Transfers => "io",
            Lane::Lookups => "lookup",
        };
        format!("{THREAD_PREFIX}{lane}")
    }
}

/// Whether `thread` is one of a tier's runtime threads.
pub fn is_tier_thread(thread: &std::thread::Thread) -> bool {
    thread.name().is_some_and(|n| n.starts_with(THREAD_PREFIX))
}

/// Runs `future` to completion on the caller's thread (a blocking call of the API), with
/// SIGPIPE kept off it: the host's thread may do socket writes meanwhile.
pub(crate) fn block_on_caller_thread<F: std::future::Future>(
    runtime: &Runtime,
    future: F,
) -> F::Output {
    crate::signals::without_sigpipe_on_caller_thread(|| runtime.block_on(future))
}

/// An I/O runtime for `lane` with `threads` workers and at most `blocking_threads`
/// threads for blocking file I/O (tokio's default would let that pool grow to 512 under
/// load), each at `nice` (0 = unchanged), and a store client built inside it (an HTTP
/// client's connections belong to the runtime that opens them).
pub(crate) fn runtime_with_store(
    config: &StoreConfig,
    threads: usize,
    blocking_threads: usize,
    lane: Lane,
    nice: i32,
) -> Result<(Runtime, Store)> {
    let name = lane.thread_name();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .max_blocking_threads(blocking_threads)
        .thread_name(name.clone())
        .on_thread_start(move || {
            crate::signals::block_sigpipe_on_library_thread();
            if nice > 0 {
                // SAFETY: plain syscalls on the calling thread's own id. gettid through
                // syscall(2): glibc's wrapper is 2.30's, above the wheels' 2.28 floor.
                unsafe {
                    let tid = libc::syscall(libc::SYS_gettid);
                    libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
                };
            }
        })
        .enable_all()
        .build()
        .map_err(|e| Error::new(Status::Io, format!("cannot start the {name} runtime: {e}")))?;
    let store = {
        let _guard = runtime.enter();
        Store::open(config)?
    };
    Ok((runtime, store))
}
