"""Loading ``libkvtier`` and declaring its C ABI for ctypes.

Everything here mirrors ``include/kvtier.h`` one to one: the structs, the enums (as
plain ints) and the prototypes. ``python/tests/test_header_bindings.py`` checks that in
full against the header (every prototype, struct layout, enum and constant). The library
is found, in order:

1. ``KVTIER_LIBRARY`` (an explicit path; nothing else is tried when it is set);
2. the copy bundled in this package by its wheel or ``pip install`` (``kvtier/libkvtier.so``);
3. the Cargo build of the source tree this package sits in
   (``<repo>/target/release/libkvtier.so``, or under ``CARGO_TARGET_DIR``), so that
   ``PYTHONPATH=python`` works in a checkout without installing.

The library is loaded on first use, not at import, so ``import kvtier`` never fails
for want of it.
"""

from __future__ import annotations

import atexit
import ctypes
import enum
import logging
import os
import sys
import threading
from pathlib import Path

#: Major and minor version of the C ABI this binding was written against.
ABI_VERSION = (0, 1)

if sys.platform == "darwin":
    LIBRARY_FILE = "libkvtier.dylib"
elif sys.platform == "win32":
    LIBRARY_FILE = "kvtier.dll"
else:
    LIBRARY_FILE = "libkvtier.so"

# ---------------------------------------------------------------------------------------
# Structs (field order and types exactly as in kvtier.h; C enums are int-sized).

c_status = ctypes.c_int


class KvtResult(ctypes.Structure):
    _fields_ = [
        ("job_id", ctypes.c_uint64),
        ("kind", ctypes.c_int),
        ("status", c_status),
        ("bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("num_keys", ctypes.c_size_t),
        ("num_failed_keys", ctypes.c_size_t),
        ("key_status", ctypes.POINTER(c_status)),
        ("message", ctypes.c_char_p),
    ]


class KvtEvent(ctypes.Structure):
    _fields_ = [
        ("job_id", ctypes.c_uint64),
        ("keys", ctypes.POINTER(ctypes.c_uint8)),
        ("key_len", ctypes.c_size_t),
        ("num_keys", ctypes.c_size_t),
        ("medium", ctypes.c_char_p),
        ("locality", ctypes.c_int),
    ]


class KvtKvEvent(ctypes.Structure):
    _fields_ = [("event", KvtEvent), ("removed", ctypes.c_bool)]


class KvtEvictionReport(ctypes.Structure):
    _fields_ = [
        ("objects", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("deleted", ctypes.c_uint64),
        ("deleted_bytes", ctypes.c_uint64),
    ]


#: Counters of ``kvt_stats``, in header order.
STATS_FIELDS = (
    "keys_stored",
    "keys_loaded",
    "bytes_stored",
    "bytes_loaded",
    "keys_failed",
    "existence_checks",
    "existence_check_errors",
    "corrupt_blocks",
    "dedup_known",
    "dedup_joined",
    "dedup_already_stored",
    "direct_requests",
    "direct_fallbacks",
    "evicted_blocks",
    "evicted_bytes",
    "retries",
    "damaged_uploads",
    "undecryptable_blocks",
)


class KvtStats(ctypes.Structure):
    # kvt_tier_stats writes at most the size it is given: counters a newer library
    # appends are simply not copied.
    _fields_ = [(name, ctypes.c_uint64) for name in STATS_FIELDS]


class KvtRange(ctypes.Structure):
    """``kvt_range``: ``len`` bytes at ``offset`` in region ``region``."""

    _fields_ = [("region", ctypes.c_uint64), ("offset", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class LogLevel(enum.IntEnum):
    """``kvt_log_level``: a record's severity, or the most verbose one wanted."""

    OFF = 0
    ERROR = 1
    WARN = 2
    INFO = 3
    DEBUG = 4
    TRACE = 5


#: ``kvt_log_callback``: (userdata, level, target, message).
LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)

#: The header's function-pointer types.
CALLBACKS = {"kvt_log_callback": LOG_CALLBACK}

tier_p = ctypes.c_void_p  # opaque `kvt_tier *`

_PROTOTYPES = {
    "kvt_version": (ctypes.c_char_p, []),
    "kvt_status_str": (ctypes.c_char_p, [ctypes.c_int]),
    "kvt_config_schema": (ctypes.c_char_p, []),
    "kvt_stats_fields": (ctypes.c_char_p, []),
    "kvt_config_check": (c_status, [ctypes.c_char_p]),
    "kvt_last_error": (ctypes.c_char_p, []),
    "kvt_tier_new": (c_status, [ctypes.c_char_p, ctypes.POINTER(tier_p)]),
    "kvt_tier_register_memory": (c_status, [tier_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]),
    "kvt_tier_submit_store": (
        c_status,
        [tier_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t],
    ),
    "kvt_tier_submit_load": (
        c_status,
        [tier_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t],
    ),
    "kvt_tier_add_region": (c_status, [tier_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]),
    "kvt_tier_remove_region": (c_status, [tier_p, ctypes.c_uint64]),
    "kvt_tier_submit_store_ranges": (
        c_status,
        [tier_p, ctypes.c_uint64, ctypes.POINTER(KvtRange), ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t],
    ),
    "kvt_tier_submit_load_ranges": (
        c_status,
        [tier_p, ctypes.c_uint64, ctypes.POINTER(KvtRange), ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t],
    ),
    "kvt_tier_poll": (c_status, [tier_p, ctypes.POINTER(KvtResult), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "kvt_tier_event_fd": (ctypes.c_int, [tier_p]),
    "kvt_tier_jobs_in_flight": (ctypes.c_size_t, [tier_p]),
    "kvt_tier_location": (ctypes.c_char_p, [tier_p]),
    "kvt_tier_drain": (c_status, [tier_p, ctypes.c_uint64]),
    "kvt_tier_shutdown": (c_status, [tier_p]),
    "kvt_tier_free": (None, [tier_p]),
    "kvt_tier_lookup": (
        c_status,
        [tier_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)],
    ),
    "kvt_tier_lookup_batch": (
        c_status,
        [tier_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
         ctypes.POINTER(ctypes.c_int)],
    ),
    "kvt_tier_schedule_end": (c_status, [tier_p]),
    "kvt_tier_request_finished": (c_status, [tier_p, ctypes.c_uint64]),
    "kvt_tier_check_now": (
        c_status,
        [tier_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)],
    ),
    "kvt_tier_take_events": (
        c_status,
        [tier_p, ctypes.POINTER(KvtEvent), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "kvt_tier_stats": (c_status, [tier_p, ctypes.POINTER(KvtStats), ctypes.c_size_t]),
    "kvt_vllm_namespace": (
        c_status,
        [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "kvt_tier_take_kv_events": (
        c_status,
        [tier_p, ctypes.POINTER(KvtKvEvent), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "kvt_tier_evict_now": (c_status, [tier_p, ctypes.POINTER(KvtEvictionReport)]),
    "kvt_tier_clear": (c_status, [tier_p, ctypes.POINTER(KvtEvictionReport)]),
    "kvt_tier_delete": (
        c_status,
        [tier_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(KvtEvictionReport)],
    ),
    "kvt_tier_pin": (
        c_status,
        [tier_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint8)],
    ),
    "kvt_tier_unpin": (c_status, [tier_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]),
    "kvt_tier_metrics": (c_status, [tier_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "kvt_set_log_callback": (c_status, [LOG_CALLBACK, ctypes.c_void_p, ctypes.c_int]),
}

# ---------------------------------------------------------------------------------------
# Log records of the library, routed to the ``kvtier`` logger.

#: The Python logger that receives the library's records (its own and its storage
#: client's, retry messages among them); targets become child loggers' ``target`` extra.
logger = logging.getLogger("kvtier")

_PY_LEVELS = {
    LogLevel.ERROR: logging.ERROR,
    LogLevel.WARN: logging.WARNING,
    LogLevel.INFO: logging.INFO,
    LogLevel.DEBUG: logging.DEBUG,
    LogLevel.TRACE: 5,
}


def _forward_record(_userdata, level, target, message) -> None:
    try:
        py_level = _PY_LEVELS.get(LogLevel(level), logging.INFO)
        logger.log(py_level, "%s", message.decode("utf-8", "replace"), extra={"target": target.decode("utf-8", "replace")})
    except Exception:  # never let an exception cross back into the library's thread
        pass


# Kept for the life of the process: the library may call it from any of its threads.
_LOG_FORWARDER = LOG_CALLBACK(_forward_record)


def _wanted_level() -> LogLevel:
    effective = logger.getEffectiveLevel()
    if effective <= 5:
        return LogLevel.TRACE
    if effective <= logging.DEBUG:
        return LogLevel.DEBUG
    if effective <= logging.INFO:
        return LogLevel.INFO
    if effective <= logging.WARNING:
        return LogLevel.WARN
    return LogLevel.ERROR


def refresh_log_level() -> None:
    """Reads the ``kvtier`` logger's effective level again and tells the library, which
    then formats only the records that logger would keep. Called when the library is
    loaded; call it again after changing the logging configuration."""
    lib = load()
    lib.kvt_set_log_callback(_LOG_FORWARDER, None, int(_wanted_level()))


def _stop_logging() -> None:
    # At interpreter exit, before Python tears down: the library's threads must not call
    # into a finalising interpreter.
    if _lib is not None:
        _lib.kvt_set_log_callback(LOG_CALLBACK(), None, 0)

# ---------------------------------------------------------------------------------------
# Finding and loading the library.

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: str | None = None


def candidate_paths() -> list[Path]:
    """Where the library is looked for, in order (see the module docstring)."""
    explicit = os.environ.get("KVTIER_LIBRARY")
    if explicit:
        return [Path(explicit)]
    here = Path(__file__).resolve().parent
    paths = [here / LIBRARY_FILE]
    target_dir = os.environ.get("CARGO_TARGET_DIR")
    if target_dir:
        paths.append(Path(target_dir) / "release" / LIBRARY_FILE)
    repo = here.parent.parent  # python/kvtier -> python -> repository root
    paths.append(repo / "target" / "release" / LIBRARY_FILE)
    return paths


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def load() -> ctypes.CDLL:
    """The loaded library (loaded and checked on the first call)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidate_paths():
            if not path.is_file():
                tried.append(f"{path} (not found)")
                continue
            try:
                lib = ctypes.CDLL(str(path))
                _declare(lib)
            except (OSError, AttributeError) as exc:
                tried.append(f"{path} ({exc})")
                if os.environ.get("KVTIER_LIBRARY"):
                    break
                continue
            version = lib.kvt_version().decode()
            major, minor = (int(part) for part in version.split(".")[:2])
            if (major, minor) != ABI_VERSION:
                raise OSError(
                    f"{path} is libkvtier {version}, but this kvtier package needs "
                    f"{ABI_VERSION[0]}.{ABI_VERSION[1]}.x; reinstall the package or point "
                    "KVTIER_LIBRARY at a matching build"
                )
            _lib, _lib_path = lib, str(path)
            lib.kvt_set_log_callback(_LOG_FORWARDER, None, int(_wanted_level()))
            atexit.register(_stop_logging)
            return lib
        hint = (
            "KVTIER_LIBRARY is set but unusable"
            if os.environ.get("KVTIER_LIBRARY")
            else "install the kvtier wheel (it bundles the library; `scripts/build-wheel.sh` "
            "builds it) or `pip install ./python` from a checkout, build the library with "
            "`cargo build --release --lib`, or set KVTIER_LIBRARY"
        )
        raise OSError(f"cannot load {LIBRARY_FILE}: tried " + "; ".join(tried) + f". {hint}")


def library_path() -> str:
    """Path of the library in use (loading it if needed)."""
    load()
    assert _lib_path is not None
    return _lib_path
