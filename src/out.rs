//! Out-parameters and statuses: text into caller buffers, counts reset on failure, and a
//! result turned into its status.

use super::*;

/// Writes `text` and a NUL into `out_buf` and its length (without the NUL) to
/// `*out_len`; when it does not fit, only `*out_len` is written, and the error says how
/// many bytes are needed.
///
/// # Safety
/// `out_len` is non-NULL and writable; `out_buf` holds `capacity` writable bytes (and is
/// non-NULL when `capacity > 0`).
pub(crate) unsafe fn write_text(
    text: &str,
    out_buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> kvtier_core::Result<()> {
    // SAFETY: the function's contract.
    unsafe { *out_len = text.len() };
    if text.len() + 1 > capacity {
        return Err(Error::invalid(format!(
            "out_buf holds {capacity} bytes; {} needed",
            text.len() + 1
        )));
    }
    // SAFETY: `out_buf` holds `capacity` writable bytes and the text plus its NUL fits
    // (checked just above); it is non-NULL as capacity > 0.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), out_buf as *mut u8, text.len());
        *out_buf.add(text.len()) = 0;
    }
    Ok(())
}

/// `*out_count` reads 0 on every error of a function that fills a caller array.
pub(crate) unsafe fn reset_count(out_count: *mut usize) {
    if !out_count.is_null() {
        // SAFETY: non-NULL, and writable by the caller's contract.
        unsafe { *out_count = 0 };
    }
}

/// Checks the output arguments of a function that fills a caller array.
pub(crate) fn check_outputs<T>(
    out: *mut T,
    capacity: usize,
    out_count: *mut usize,
) -> kvtier_core::Result<()> {
    if out_count.is_null() {
        return Err(Error::new(Status::NullArgument, "out_count is NULL"));
    }
    if out.is_null() && capacity > 0 {
        return Err(Error::new(
            Status::NullArgument,
            "the output array is NULL with capacity > 0",
        ));
    }
    Ok(())
}

pub(crate) fn status_of(result: kvtier_core::Result<()>) -> Status {
    match result {
        Ok(()) => {
            set_last_error(None);
            Status::Ok
        }
        Err(e) => {
            let status = e.status;
            set_last_error(Some(e));
            status
        }
    }
}

/// The `num_keys` keys of `key_len` bytes each, back to back at `keys` (`what` names the
/// call in errors): NULL with `num_keys > 0`, a `key_len` outside the library's bounds or
/// more than KVT_MAX_KEYS_PER_JOB keys is an error; no keys is an empty list.
///
/// # Safety
/// `keys` is NULL or points to `key_len * num_keys` readable bytes that outlive the list.
pub(crate) unsafe fn key_array<'a>(
    keys: *const u8,
    key_len: usize,
    num_keys: usize,
    what: &str,
) -> Result<Vec<&'a [u8]>, Error> {
    if num_keys == 0 {
        return Ok(Vec::new());
    }
    if keys.is_null() {
        return Err(Error::new(
            Status::NullArgument,
            format!("keys is NULL with num_keys = {num_keys}"),
        ));
    }
    kvtier_core::key::check_key_len(key_len)?;
    if num_keys > kvtier_core::MAX_KEYS_PER_JOB {
        return Err(Error::invalid(format!(
            "num_keys is {num_keys}; {what} has at most {} keys",
            kvtier_core::MAX_KEYS_PER_JOB
        )));
    }
    // SAFETY: non-NULL (checked above) and `key_len * num_keys` readable bytes by the
    // caller's contract; both are bounded (checked above), so the product fits.
    let bytes = unsafe { std::slice::from_raw_parts(keys, key_len * num_keys) };
    Ok(bytes.chunks_exact(key_len).collect())
}
