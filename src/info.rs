//! What the library is, without a tier: its version, status names, the configuration
//! schema, the counters' names, and a configuration checked without opening a store.

use super::*;

static VERSION_CSTR: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("version string has a NUL"),
    };

/// The library version, e.g. "0.1.0". Static storage: never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn kvt_version() -> *const c_char {
    guard_value("kvt_version", c"".as_ptr(), || VERSION_CSTR.as_ptr())
}

/// A short, static English description of a status code ("unknown status" for values
/// outside the enum). Never NULL; never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn kvt_status_str(status: c_int) -> *const c_char {
    guard_value("kvt_status_str", c"unknown status".as_ptr(), || {
        let text: &'static CStr = match status_from_int(status) {
            Some(s) => s.as_cstr(),
            None => c"unknown status",
        };
        text.as_ptr()
    })
}

/// The tier configuration's schema: every key `kvt_tier_new` accepts, as a JSON document
/// `{"version": "...", "store_types": [...], "keys": [{"key": "store.request_timeout_ms",
/// "store": "s3", "type": "integer", "required": false, "default": 30000, "allowed": null,
/// "doc": "..."}, ...]}`. `key` is the full dotted path; a key inside `store` is listed once
/// per store type that has it (`store` names the type, null elsewhere); `type` is one of
/// string, integer, number, boolean, object, array, any; `allowed` lists an enumerated
/// key's values; `default` is null where there is none (or it is decided at start-up);
/// `example` is a valid value of a key without a default. `kvtier config schema` prints the
/// same document.
///
/// Static storage: never NULL, never free it, valid for the life of the process.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kvt_config_schema() -> *const c_char {
    static SCHEMA: OnceLock<CString> = OnceLock::new();
    static_text("kvt_config_schema", &SCHEMA, || {
        kvtier_core::config::schema_json().to_string()
    })
}

/// The counters of `kvt_stats`, in field order, as a JSON array
/// `[{"name": "keys_stored", "help": "Keys stored successfully."}, ...]`: the names and help
/// texts bindings and metric exporters use.
///
/// Static storage: never NULL, never free it, valid for the life of the process.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kvt_stats_fields() -> *const c_char {
    static FIELDS: OnceLock<CString> = OnceLock::new();
    static_text("kvt_stats_fields", &FIELDS, || {
        let fields: Vec<_> = kvtier_core::STATS_FIELDS
            .iter()
            .map(|f| serde_json::json!({"name": f.name, "help": f.help}))
            .collect();
        serde_json::Value::from(fields).to_string()
    })
}

/// Parses and checks a tier configuration exactly as `kvt_tier_new` does, without
/// opening its store or probing it: what a configuration file's author or a binding
/// calls to validate before starting a tier.
///
/// `config_json`: NUL-terminated UTF-8 JSON, borrowed for the call only; NULL is
/// KVT_STATUS_NULL_ARGUMENT. Returns KVT_STATUS_OK, or KVT_STATUS_CONFIG with a message
/// (`kvt_last_error`) naming the key's full path (`store.request_timeout_ms`) and what was
/// expected. Messages never contain secrets. Works after fork. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn kvt_config_check(config_json: *const c_char) -> Status {
    guard("kvt_config_check", || {
        // The keyring too, read as a tier's start reads it.
        // SAFETY: NULL or a NUL-terminated string, by the header's contract.
        kvtier_core::check_config(unsafe { config_text(config_json) }?).map(drop)
    })
}

/// The configuration text a caller passed (`kvt_tier_new`, `kvt_config_check`).
///
/// # Safety
/// `config_json` is NULL or a NUL-terminated string that outlives the returned borrow.
pub(crate) unsafe fn config_text<'a>(config_json: *const c_char) -> kvtier_core::Result<&'a str> {
    if config_json.is_null() {
        return Err(Error::new(Status::NullArgument, "config_json is NULL"));
    }
    // SAFETY: non-NULL, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(config_json) }
        .to_str()
        .map_err(|_| Error::config("config_json is not valid UTF-8"))
}

/// A string made once and kept for the life of the process, for exports that return
/// static text. Inside the panic guard: a panic while making it returns the empty text
/// (never NULL) with KVT_STATUS_PANIC's message in kvt_last_error, and the next call tries
/// again.
fn static_text(
    name: &str,
    cell: &'static OnceLock<CString>,
    make: impl FnOnce() -> String,
) -> *const c_char {
    // A NUL inside would be a library bug; the empty string still honours "never NULL".
    guard_value(name, c"".as_ptr(), || {
        cell.get_or_init(|| c_text(make())).as_ptr()
    })
}

pub(crate) fn status_from_int(value: c_int) -> Option<Status> {
    Status::from_code(value)
}
