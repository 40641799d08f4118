//! The panic boundary, handle checks, fork detection and the thread-local last error.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use super::{kvt_tier, status_of, TIER_MAGIC};
use kvtier_core::panic_message;
use kvtier_core::{Error, Status};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Depth of kvt_ calls on this thread: a panic inside one is reported through
    /// kvt_last_error() only.
    static IN_CALL: Cell<u32> = const { Cell::new(0) };
    /// Where the last panic on this thread happened, for its message.
    static PANIC_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Text handed to C: a NUL inside (which C would read as the end) becomes a space.
pub(crate) fn c_text(text: String) -> CString {
    // A NUL inside a message would cut it short in C; it becomes a space.
    let bytes: Vec<u8> = text
        .into_bytes()
        .into_iter()
        .map(|b| if b == 0 { b' ' } else { b })
        .collect();
    CString::new(bytes).unwrap_or_default()
}

pub(crate) fn set_last_error(error: Option<Error>) {
    LAST_ERROR.with(|cell| {
        let mut text = cell.borrow_mut();
        match error {
            // Every successful call lands here: an empty text stays as it is (no allocation
            // and free per call on the host's hot path).
            None if text.as_bytes().is_empty() => {}
            None => *text = CString::default(),
            Some(e) => *text = c_text(e.to_string()),
        }
    });
}

/// The message of the last failed call on this thread, "" after a successful one.
///
/// Thread-local: never NULL, owned by the library, valid until the next kvt_ call on the
/// same thread. Never contains secrets.
#[no_mangle]
pub extern "C" fn kvt_last_error() -> *const c_char {
    // Outside the guard (a guard would overwrite the very text asked for), and it cannot
    // panic: a thread whose locals are gone gets the empty text.
    LAST_ERROR
        .try_with(|cell| cell.try_borrow().map(|text| text.as_ptr()).ok())
        .ok()
        .flatten()
        .unwrap_or(c"".as_ptr())
}

/// Installs, once per process, a panic hook that keeps the library's panics off the
/// host's stderr: a panic inside a kvt_ call or on one of the tier's own threads is
/// recorded (its text reaches the caller through kvt_last_error() or the job's result
/// message); any other panic goes to the hook that was installed before.
pub(crate) fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| std::panic::set_hook(silencing_hook(std::panic::take_hook())));
}

pub(crate) type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

/// The library's hook in front of `previous`.
pub(crate) fn silencing_hook(previous: PanicHook) -> PanicHook {
    Box::new(move |info| {
        // try_with: a hook must not panic, also on a thread whose locals are gone.
        let ours = IN_CALL.try_with(|c| c.get() > 0).unwrap_or(false)
            || kvtier_core::is_tier_thread(&std::thread::current());
        if ours {
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
            let _ = PANIC_AT.try_with(|p| *p.borrow_mut() = at);
        } else {
            previous(info);
        }
    })
}

fn panic_error(name: &str, panic: &Box<dyn std::any::Any + Send>) -> Error {
    let at = PANIC_AT
        .with(|p| p.borrow_mut().take())
        .map(|at| format!(" (at {at})"))
        .unwrap_or_default();
    Error::new(
        Status::Panic,
        format!("{name}: {}{at}", panic_message(&**panic)),
    )
}

/// Runs `body` as a kvt_ call: panics are caught (and not printed).
fn call<T>(body: impl FnOnce() -> T) -> std::thread::Result<T> {
    install_panic_hook();
    IN_CALL.with(|c| c.set(c.get() + 1));
    let outcome = catch_unwind(AssertUnwindSafe(body));
    IN_CALL.with(|c| c.set(c.get() - 1));
    outcome
}

/// Runs an export that returns a value rather than a status (static text): a panic
/// returns `fallback` (documented for that export) and records KVT_STATUS_PANIC's message as
/// the thread's last error.
pub(crate) fn guard_value<T>(name: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match call(body) {
        Ok(value) => value,
        Err(panic) => {
            set_last_error(Some(panic_error(name, &panic)));
            fallback
        }
    }
}

/// Runs an export body that needs no tier: a panic becomes KVT_STATUS_PANIC, an error is
/// recorded as the thread's last error.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> kvtier_core::Result<()>) -> Status {
    match call(body) {
        Ok(result) => status_of(result),
        Err(panic) => status_of(Err(panic_error(name, &panic))),
    }
}

/// What a call needs from its tier beyond a live handle in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Collecting what the tier already has (results, events, counters, its fd) and
    /// shutting it down: works after kvt_tier_shutdown and after a caught panic.
    Collect,
    /// Submitting: refused after shutdown or a caught panic by the submit path itself,
    /// which still queues the job's one result.
    Submit,
    /// New work of any other kind: refused after shutdown and after a caught panic.
    Work,
}

/// Runs an export body on a checked tier handle. A panic becomes KVT_STATUS_PANIC and
/// marks the tier failed, so that later calls refuse work instead of running on state
/// the panic may have left half-changed.
pub(crate) unsafe fn guard_tier(
    name: &str,
    tier: *mut kvt_tier,
    access: Access,
    body: impl FnOnce(&kvt_tier) -> kvtier_core::Result<()>,
) -> Status {
    // SAFETY: the caller's contract, passed through.
    match unsafe { guard_tier_or(name, tier, access, (), |handle| body(handle)) } {
        (_, None) => Status::Ok,
        (_, Some(status)) => status,
    }
}

/// Like [`guard_tier`] for functions that return a value: `fallback` on error or panic.
/// Returns the value and the failure's status, if any.
pub(crate) unsafe fn guard_tier_or<T>(
    name: &str,
    tier: *mut kvt_tier,
    access: Access,
    fallback: T,
    body: impl FnOnce(&kvt_tier) -> kvtier_core::Result<T>,
) -> (T, Option<Status>) {
    let checked: Cell<Option<&kvt_tier>> = Cell::new(None);
    let outcome = call(|| {
        // SAFETY: the caller's contract, passed through.
        let handle = unsafe { check_tier(tier, access)? };
        checked.set(Some(handle));
        body(handle)
    });
    match outcome {
        Ok(Ok(value)) => {
            set_last_error(None);
            (value, None)
        }
        Ok(Err(e)) => {
            let status = e.status;
            set_last_error(Some(e));
            (fallback, Some(status))
        }
        Err(panic) => {
            let mut e = panic_error(name, &panic);
            if let Some(handle) = checked.get() {
                handle.failed.store(true, Ordering::Release);
                e.message
                    .push_str("; the tier refuses further work: shut it down and free it");
            }
            set_last_error(Some(e));
            (fallback, Some(Status::Panic))
        }
    }
}

/// The id of this process, kept current across fork() by an atfork handler (a syscall
/// per call would cost more than most calls).
pub(crate) fn current_pid() -> u32 {
    static PID: AtomicU32 = AtomicU32::new(0);
    static HANDLER: Once = Once::new();
    extern "C" fn after_fork_in_child() {
        // getpid is async-signal-safe, as an atfork child handler must be.
        // SAFETY: a plain syscall.
        PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
    }
    HANDLER.call_once(|| {
        // SAFETY: a plain syscall.
        PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
        // SAFETY: registers a handler that stays mapped (the library is never unloaded).
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    PID.load(Ordering::Relaxed)
}

/// Turns a raw handle into a reference. NULL is reported. Anything else must be a live
/// handle from kvt_tier_new (the header's precondition): the tag is checked as a
/// best effort only (a debug build asserts on it), since a freed handle's memory may
/// already have been reused.
pub(crate) unsafe fn check_tier<'a>(
    tier: *mut kvt_tier,
    access: Access,
) -> kvtier_core::Result<&'a kvt_tier> {
    if tier.is_null() {
        return Err(Error::new(Status::NullArgument, "tier is NULL"));
    }
    // SAFETY: non-NULL, and a handle from kvt_tier_new by the caller's contract: readable.
    let magic = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*tier).magic)) };
    debug_assert_eq!(
        magic, TIER_MAGIC,
        "tier handle is not a live kvt_tier (freed, or not from kvt_tier_new)"
    );
    if magic != TIER_MAGIC {
        return Err(Error::state(
            "tier handle is not a live kvt_tier (freed, or not from kvt_tier_new)",
        ));
    }
    // SAFETY: as above; the tag says the handle was not freed through kvt_tier_free.
    let handle = unsafe { &*tier };
    if handle.pid != current_pid() {
        return Err(Error::new(
            Status::Forked,
            format!(
                "this tier was created by process {} and this is process {}: after fork() only kvt_tier_free may be called on it; create a new tier in this process",
                handle.pid,
                current_pid()
            ),
        ));
    }
    if access == Access::Work && handle.failed.load(Ordering::Acquire) {
        return Err(Error::new(
            Status::Panic,
            "an earlier call on this tier panicked; it refuses further work: shut it down and free it",
        ));
    }
    if access == Access::Work && handle.tier.is_shut_down() {
        return Err(Error::new(Status::ShutDown, "the tier has been shut down"));
    }
    Ok(handle)
}
