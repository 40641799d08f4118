//! The tier's I/O runtimes: one for transfers, optionally one (single-threaded) for the
//! lookup lane, so that existence checks never queue behind transfers.

use tokio::runtime::Runtime;

use crate::config::StoreConfig;
use crate::error::{Error, Result, Status};
use crate::store::Store;

/// An I/O runtime named `name` with `threads` workers and at most `blocking_threads`
/// threads for blocking file I/O (tokio's default would let that pool grow to 512 under
/// load), each at `nice` (0 = unchanged), and a store client built inside it (an HTTP
/// client's connections belong to the runtime that opens them).
pub(crate) fn runtime_with_store(
    config: &StoreConfig,
    threads: usize,
    blocking_threads: usize,
    name: &str,
    nice: i32,
) -> Result<(Runtime, Store)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .max_blocking_threads(blocking_threads)
        .thread_name(name)
        .on_thread_start(move || {
            if nice > 0 {
                // SAFETY: a plain syscall on the calling thread's own id.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice)
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
