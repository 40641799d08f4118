//! Where the library's log records go: to a host's callback (`kvt_set_log_callback`), or
//! else to stderr, filtered by `RUST_LOG` (default `warn`). The `tracing` events of
//! `object_store` (its retry messages among them) arrive here as `log` records: tracing's
//! `log` feature forwards them when the host has installed no tracing subscriber.
//!
//! Installed by the C ABI on first use. A Rust program that installs its own logger
//! first keeps it: records then go there, and callbacks are not called.

use std::cell::Cell;

use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Condvar, Mutex, Once, OnceLock, RwLock};
use std::time::{Duration, Instant};

use log::Log;

/// Severity of a log record, and the most verbose severity a callback wants.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// No records (as `max_level`: the callback is never called).
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl LogLevel {
    fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Off => log::LevelFilter::Off,
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        }
    }

    fn of(level: log::Level) -> LogLevel {
        match level {
            log::Level::Error => LogLevel::Error,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Info => LogLevel::Info,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Trace => LogLevel::Trace,
        }
    }
}

/// A host's log function (NULL for none): `level`, the record's `target` (the Rust
/// module, e.g. `kvtier::engine` or `object_store::client::retry`) and `message`, both
/// NUL-terminated and valid for the call only.
pub type LogCallback = Option<
    unsafe extern "C" fn(
        userdata: *mut c_void,
        level: LogLevel,
        target: *const c_char,
        message: *const c_char,
    ),
>;

/// A log function that is set.
type LogFn = unsafe extern "C" fn(
    userdata: *mut c_void,
    level: LogLevel,
    target: *const c_char,
    message: *const c_char,
);

#[derive(Clone, Copy)]
struct Sink {
    callback: LogFn,
    /// The host's pointer, handed back untouched.
    userdata: usize,
    max_level: log::LevelFilter,
}

static SINK: RwLock<Option<Sink>> = RwLock::new(None);
static INSTALL: Once = Once::new();
/// The stderr logger, for records no callback takes.
static STDERR: OnceLock<env_logger::Logger> = OnceLock::new();

thread_local! {
    /// Set while this thread runs the host's callback: a record the callback causes goes
    /// to stderr rather than back into the callback.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Records from the library's I/O threads wait here for the log thread, at most this many:
/// a callback that falls further behind loses records (counted and said) rather than
/// holding up a transfer, or a tier's shutdown that the callback itself is running.
const QUEUED_RECORDS: usize = 4096;

/// A record formatted (and redacted) on the thread that made it.
struct Queued {
    level: log::Level,
    target: String,
    message: String,
}

/// The log thread of this process: the callback runs there for every record made on an
/// I/O thread or inside an I/O runtime, so a kvt_ call from the callback never runs on a
/// tier's own threads, where it could not block or stop that tier.
struct LogThread {
    /// The process that started it: a fork() child starts its own.
    pid: u32,
    queue: SyncSender<Queued>,
}

static LOG_THREAD: Mutex<Option<LogThread>> = Mutex::new(None);
/// Records queued for this process's log thread, and records it handed to the callback or
/// stderr, for `flush`.
static QUEUED: Mutex<(u64, u64)> = Mutex::new((0, 0));
static DELIVERED: Condvar = Condvar::new();
/// Records dropped because the queue was full, not yet reported.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// How long `kvt_set_log_callback` waits for the records queued before it to reach the
/// callback they were made for.
const FLUSH_BOUND: Duration = Duration::from_secs(5);

struct Router;

fn stderr() -> &'static env_logger::Logger {
    STDERR.get_or_init(stderr_logger)
}

fn stderr_logger() -> env_logger::Logger {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).build()
}

fn sink() -> Option<Sink> {
    *SINK.read().unwrap_or_else(|p| p.into_inner())
}

/// Whether this thread is one of the library's I/O threads or runs inside an I/O runtime
/// (a kvt_ call waiting on one): a callback run here could not block on or stop it.
fn on_library_runtime() -> bool {
    kvtier_core::is_tier_thread(&std::thread::current())
        || tokio::runtime::Handle::try_current().is_ok()
}

impl log::Log for Router {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        match sink() {
            Some(sink) => metadata.level() <= sink.max_level,
            None => stderr().enabled(metadata),
        }
    }

    fn log(&self, record: &log::Record<'_>) {
        if IN_CALLBACK.with(Cell::get) {
            stderr().log(record);
            return;
        }
        match sink() {
            None => stderr().log(record),
            Some(sink) if record.level() > sink.max_level => {}
            Some(_) => {
                let queued = Queued {
                    level: record.level(),
                    target: public_target(record.target()).into_owned(),
                    message: kvtier_core::redact::in_text(&record.args().to_string()),
                };
                if on_library_runtime() {
                    enqueue(queued);
                } else {
                    deliver(&queued);
                }
            }
        }
    }

    fn flush(&self) {
        stderr().flush();
    }
}

/// Hands `record` to the callback under the read lock, so that once kvt_set_log_callback
/// has replaced a callback, the old one is never called again; to stderr without one.
fn deliver(record: &Queued) {
    let sink = SINK.read().unwrap_or_else(|p| p.into_inner());
    let Some(sink) = *sink else {
        let metadata = log::Metadata::builder()
            .level(record.level)
            .target(&record.target)
            .build();
        if stderr().enabled(&metadata) {
            stderr().log(
                &log::Record::builder()
                    .metadata(metadata)
                    .args(format_args!("{}", record.message))
                    .build(),
            );
        }
        return;
    };
    if record.level > sink.max_level {
        return;
    }
    let message = CString::new(record.message.replace('\0', " ")).unwrap_or_default();
    let target = CString::new(record.target.replace('\0', " ")).unwrap_or_default();
    IN_CALLBACK.with(|f| f.set(true));
    // SAFETY: the host registered this function for exactly this call shape; both
    // strings are NUL-terminated and outlive the call.
    unsafe {
        (sink.callback)(
            sink.userdata as *mut c_void,
            LogLevel::of(record.level),
            target.as_ptr(),
            message.as_ptr(),
        )
    };
    IN_CALLBACK.with(|f| f.set(false));
}

/// Queues `record` for the log thread (started on first use, and again in a fork()
/// child); never blocks: a full queue drops the record, and the log thread says so.
fn enqueue(record: Queued) {
    let queue = {
        let mut thread = LOG_THREAD.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if thread.as_ref().is_none_or(|t| t.pid != pid) {
            *thread = start_log_thread(pid);
            // A fork() child's counts are its parent's, whose queued records it never sees.
            let mut counts = QUEUED.lock().unwrap_or_else(|p| p.into_inner());
            counts.1 = counts.0;
        }
        thread.as_ref().map(|t| t.queue.clone())
    };
    let Some(queue) = queue else {
        // No thread could be started: stderr, as without a callback.
        stderr().log(
            &log::Record::builder()
                .level(record.level)
                .target(&record.target)
                .args(format_args!("{}", record.message))
                .build(),
        );
        return;
    };
    let mut counts = QUEUED.lock().unwrap_or_else(|p| p.into_inner());
    match queue.try_send(record) {
        Ok(()) => counts.0 += 1,
        Err(_) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn start_log_thread(pid: u32) -> Option<LogThread> {
    let (queue, records) = sync_channel::<Queued>(QUEUED_RECORDS);
    let started = std::thread::Builder::new()
        // Not "kvtier-…", the names of the tiers' I/O threads, which blocking calls refuse.
        .name("kvtier.log".into())
        .spawn(move || {
            for record in records {
                deliver(&record);
                let dropped = DROPPED.swap(0, Ordering::Relaxed);
                if dropped > 0 {
                    deliver(&Queued {
                        level: log::Level::Warn,
                        target: "kvtier".into(),
                        message: format!(
                            "{dropped} log records were dropped: the log callback fell \
                             {QUEUED_RECORDS} records behind"
                        ),
                    });
                }
                let mut counts = QUEUED.lock().unwrap_or_else(|p| p.into_inner());
                counts.1 += 1;
                DELIVERED.notify_all();
            }
        });
    match started {
        Ok(_) => Some(LogThread { pid, queue }),
        Err(e) => {
            eprintln!("kvtier: cannot start the log thread ({e}); records go to stderr");
            None
        }
    }
}

/// Waits, at most [`FLUSH_BOUND`], until every record queued so far has been handed on.
fn flush() {
    let ours = LOG_THREAD
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|t| t.pid == std::process::id());
    if !ours {
        // No log thread in this process (none yet, or a fork() child's): nothing queued.
        return;
    }
    let deadline = Instant::now() + FLUSH_BOUND;
    let mut counts = QUEUED.lock().unwrap_or_else(|p| p.into_inner());
    let target = counts.0;
    while counts.1 < target {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        counts = DELIVERED
            .wait_timeout(counts, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// A record's target as the host sees it: the library's records come from the crate
/// `kvtier_core`, named `kvtier` here as the library is (`kvtier::engine`, not
/// `kvtier_core::engine`); a dependency's target is its own.
fn public_target(target: &str) -> std::borrow::Cow<'_, str> {
    match target.strip_prefix("kvtier_core") {
        Some(rest) if rest.is_empty() || rest.starts_with("::") => format!("kvtier{rest}").into(),
        _ => target.into(),
    }
}

/// Makes the library's records reach the router, once per process.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        let stderr_level = stderr().filter();
        if log::set_logger(&Router).is_ok() {
            log::set_max_level(stderr_level);
        }
    });
}

/// Routes records up to `max_level` to `callback` (or, with `None`, back to stderr).
/// When it returns, the records queued before it have reached the previous callback
/// (within [`FLUSH_BOUND`]), and that callback is not running and is never called again.
pub(crate) fn set_callback(callback: LogCallback, userdata: *mut c_void, max_level: LogLevel) {
    install();
    flush();
    let mut sink = SINK.write().unwrap_or_else(|p| p.into_inner());
    *sink = callback.map(|callback| Sink {
        callback,
        userdata: userdata as usize,
        max_level: max_level.filter(),
    });
    let stderr_level = stderr().filter();
    log::set_max_level(sink.map_or(stderr_level, |s| s.max_level));
}

#[cfg(test)]
mod tests {
    use super::public_target;

    #[test]
    fn the_library_s_records_are_named_kvtier() {
        assert_eq!(public_target("kvtier_core::engine"), "kvtier::engine");
        assert_eq!(public_target("kvtier_core"), "kvtier");
        assert_eq!(public_target("kvtier_corex::a"), "kvtier_corex::a");
        assert_eq!(
            public_target("object_store::client::retry"),
            "object_store::client::retry"
        );
    }
}
