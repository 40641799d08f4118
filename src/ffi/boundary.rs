//! The panic boundary, handle checks and the thread-local last error.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{kvt_tier, status_of, TIER_MAGIC};
use crate::error::{Error, Status};
use crate::tier::panic_message;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(error: Option<Error>) {
    let text = match error {
        None => CString::default(),
        Some(e) => CString::new(e.to_string().replace('\0', " ")).unwrap_or_default(),
    };
    LAST_ERROR.with(|cell| *cell.borrow_mut() = text);
}

/// The message of the last failed call on this thread, "" after a successful one.
///
/// Thread-local: never NULL, owned by the library, valid until the next kvt_ call on the
/// same thread. Never contains secrets.
#[no_mangle]
pub extern "C" fn kvt_last_error() -> *const c_char {
    LAST_ERROR.with(|cell| cell.borrow().as_ptr())
}

/// Runs an export body: a panic becomes KVT_STATUS_PANIC, an error is recorded as the
/// thread's last error.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> crate::Result<()>) -> Status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => status_of(result),
        Err(panic) => status_of(Err(Error::new(Status::Panic, format!("{name}: {}", panic_message(&panic))))),
    }
}

/// Like [`guard`] for functions that return a value; `fallback` on error or panic.
pub(crate) fn guard_or<T>(name: &str, fallback: T, body: impl FnOnce() -> crate::Result<T>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => {
            set_last_error(None);
            value
        }
        Ok(Err(e)) => {
            set_last_error(Some(e));
            fallback
        }
        Err(panic) => {
            set_last_error(Some(Error::new(Status::Panic, format!("{name}: {}", panic_message(&panic)))));
            fallback
        }
    }
}

/// Turns a raw handle into a reference, rejecting NULL and handles that are not live.
pub(crate) unsafe fn check_tier<'a>(tier: *mut kvt_tier) -> crate::Result<&'a kvt_tier> {
    if tier.is_null() {
        return Err(Error::new(Status::NullArgument, "tier is NULL"));
    }
    let handle = &*tier;
    if handle.magic != TIER_MAGIC {
        return Err(Error::state("tier handle is not a live kvt_tier (freed, or not from kvt_tier_new)"));
    }
    Ok(handle)
}
