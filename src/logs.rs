//! Where the library's log records go: to a host's callback (`kvt_set_log_callback`), or
//! else to stderr, filtered by `RUST_LOG` (default `warn`). The `tracing` events of
//! `object_store` (its retry messages among them) arrive here as `log` records: tracing's
//! `log` feature forwards them when the host has installed no tracing subscriber.
//!
//! Installed by the C ABI on first use. A Rust program that installs its own logger
//! first keeps it: records then go there, and callbacks are not called.

use std::cell::Cell;
use std::ffi::{c_char, c_void, CString};
use std::sync::{Once, RwLock};

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

thread_local! {
    /// Set while this thread runs the host's callback: a record the callback causes goes
    /// to stderr rather than back into the callback.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

struct Router {
    stderr: env_logger::Logger,
}

impl Router {
    fn sink(&self) -> Option<Sink> {
        *SINK.read().unwrap_or_else(|p| p.into_inner())
    }
}

impl log::Log for Router {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        match self.sink() {
            Some(sink) => metadata.level() <= sink.max_level,
            None => self.stderr.enabled(metadata),
        }
    }

    fn log(&self, record: &log::Record<'_>) {
        if IN_CALLBACK.with(Cell::get) {
            self.stderr.log(record);
            return;
        }
        // The read lock is held through the call, so that once kvt_set_log_callback has
        // replaced a callback, the old one is never called again.
        let sink = SINK.read().unwrap_or_else(|p| p.into_inner());
        let Some(sink) = *sink else {
            self.stderr.log(record);
            return;
        };
        if record.level() > sink.max_level {
            return;
        }
        let text = kvtier_core::redact::in_text(&record.args().to_string());
        let message = CString::new(text.replace('\0', " ")).unwrap_or_default();
        let target =
            CString::new(public_target(record.target()).replace('\0', " ")).unwrap_or_default();
        IN_CALLBACK.with(|f| f.set(true));
        // SAFETY: the host registered this function for exactly this call shape; both
        // strings are NUL-terminated and outlive the call.
        unsafe {
            (sink.callback)(
                sink.userdata as *mut c_void,
                LogLevel::of(record.level()),
                target.as_ptr(),
                message.as_ptr(),
            )
        };
        IN_CALLBACK.with(|f| f.set(false));
    }

    fn flush(&self) {
        self.stderr.flush();
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
        let stderr =
            env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
                .build();
        let stderr_level = stderr.filter();
        if log::set_boxed_logger(Box::new(Router { stderr })).is_ok() {
            log::set_max_level(stderr_level);
        }
    });
}

/// Routes records up to `max_level` to `callback` (or, with `None`, back to stderr).
/// When it returns, the previous callback is not running and is never called again.
pub(crate) fn set_callback(callback: LogCallback, userdata: *mut c_void, max_level: LogLevel) {
    install();
    let mut sink = SINK.write().unwrap_or_else(|p| p.into_inner());
    *sink = callback.map(|callback| Sink {
        callback,
        userdata: userdata as usize,
        max_level: max_level.filter(),
    });
    let stderr_level =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
            .build()
            .filter();
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
