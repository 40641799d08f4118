//! vLLM's namespace string, computed as vLLM's object-store tier computes it.

use super::*;

/// Computes vLLM's namespace string
/// `<model_name with / replaced by _>_<first 12 hex of SHA-256 of the field set>_r<rank>`
/// from `fields_json`, the JSON object of hashed fields (model_name, tokens_per_hash,
/// blocks_per_file, tp_size, pp_size, pcp_size, dcp_size, dtype, kv_cache_groups,
/// inference_engine, and parallel_agnostic / replicated_layout where vLLM includes them),
/// so that objects are named as vLLM's tiers name them.
///
/// Writes the NUL-terminated string into `out_buf` (`capacity` bytes) and its length
/// without the NUL to `*out_len`. When `capacity` is too small, returns
/// KVT_STATUS_INVALID_ARGUMENT with `*out_len` set to the length needed. NULL
/// `fields_json` or `out_len`, or NULL `out_buf` with `capacity > 0`, is
/// KVT_STATUS_NULL_ARGUMENT. Needs no tier. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_vllm_namespace(
    fields_json: *const c_char,
    rank: u32,
    out_buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> Status {
    guard("kvt_vllm_namespace", || {
        if fields_json.is_null() || out_len.is_null() || (out_buf.is_null() && capacity > 0) {
            return Err(Error::new(
                Status::NullArgument,
                "fields_json, out_len or out_buf is NULL",
            ));
        }
        // SAFETY: non-NULL (checked above), a NUL-terminated string by the header's contract.
        let text = unsafe { CStr::from_ptr(fields_json) }
            .to_str()
            .map_err(|_| Error::invalid("fields_json is not UTF-8"))?;
        let fields: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid(format!("fields_json is not JSON: {e}")))?;
        let namespace = kvtier_core::namespace::vllm_namespace(&fields, rank)?;
        // SAFETY: the output arguments were checked non-NULL above and are sized by the
        // caller as the header states.
        unsafe { write_text(&namespace, out_buf, capacity, out_len) }
    })
}
