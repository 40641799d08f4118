"""The low-level binding: one :class:`Tier` per ``kvt_tier`` handle.

This mirrors the C ABI (``include/kvtier.h``) closely. Failed calls raise
:class:`~kvtier.errors.KvtierError` subclasses carrying the status and the
``kvt_last_error()`` message. Everything the C side owns (per-key statuses, messages,
event keys) is copied into Python objects before the call returns, so results stay
valid after the next :meth:`Tier.poll` or :meth:`Tier.take_events`.

Job submission keeps the C contract: with an open tier and a job id that has no result
pending, every ``submit_*`` call yields exactly one result from :meth:`Tier.poll`, also
when the call raises :class:`KvtierError` (except :class:`DuplicateJobError`). Errors
raised *before* the C call (keys of different lengths, block ids that are not
integers, a closed tier) are ``TypeError``/``ValueError``/``ShutDownError`` and produce
no result.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import json
import operator
import os
import threading
import warnings
import weakref
from typing import Any, Mapping, Sequence

from . import _native
from .errors import KvtierError, ShutDownError, Status, as_status, error_for

#: Bytes of the group index at the end of every key (``KVT_KEY_GROUP_BYTES``).
KEY_GROUP_BYTES = 4
#: Key length of vLLM's default (SHA-256) block hash plus the group index.
DEFAULT_KEY_BYTES = 36
#: Most keys one job may carry (``MAX_KEYS_PER_JOB``).
MAX_KEYS_PER_JOB = 1 << 20

_U64_MAX = (1 << 64) - 1
_BATCH = 64  # results / events fetched per C call


class JobKind(enum.IntEnum):
    """``kvt_job_kind``."""

    STORE = 0
    LOAD = 1


class LookupResult(enum.IntEnum):
    """``kvt_lookup_result``."""

    MISS = 0
    HIT = 1
    RETRY = 2


class Locality(enum.IntEnum):
    """``kvt_locality``, carried on events."""

    UNSET = 0
    LOCAL = 1
    REMOTE = 2


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """One finished job (a copy of ``kvt_result``)."""

    job_id: int
    kind: JobKind
    #: OK only if every key succeeded; else the first failing key's status or the
    #: reason the job was rejected at submission.
    status: Status | int
    #: Bytes moved by the keys that succeeded.
    bytes: int
    #: Seconds from submission to completion.
    seconds: float
    #: Outcome of each key in submission order; may be empty for a rejected job.
    key_status: tuple
    num_failed_keys: int
    #: Why the job failed ("" on success).
    message: str

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    def succeeded_indices(self) -> list[int]:
        """Indices of the keys that succeeded (none for a job rejected at submission)."""
        return [i for i, s in enumerate(self.key_status) if s == Status.OK]


@dataclasses.dataclass(frozen=True)
class Event:
    """A BlockStored event: the keys of one successful store job, in job order."""

    job_id: int
    keys: tuple
    medium: str
    locality: Locality


def _lib() -> ctypes.CDLL:
    return _native.load()


def _check(status: int) -> None:
    if status != Status.OK:
        raw = _lib().kvt_last_error()
        raise error_for(status, raw.decode("utf-8", "replace") if raw else "")


def version() -> str:
    """Version of the loaded library, e.g. ``"0.1.0"``."""
    return _lib().kvt_version().decode()


def status_str(status: int) -> str:
    """Short description of a status code."""
    return _lib().kvt_status_str(int(status)).decode()


def library_path() -> str:
    """Path of the loaded ``libkvtier``."""
    return _native.library_path()


def vllm_namespace(fields: Mapping[str, Any], rank: int = 0) -> str:
    """vLLM's namespace ``<model with / as _>_<12 hex of SHA-256>_r<rank>``.

    ``fields`` is vLLM's hashed field set (model_name, tokens_per_hash, blocks_per_file,
    tp_size, pp_size, pcp_size, dcp_size, dtype, kv_cache_groups, inference_engine, and
    ``parallel_agnostic: False`` / ``replicated_layout: True`` where vLLM includes them).
    """
    text = json.dumps(fields, allow_nan=False).encode()
    rank = operator.index(rank)
    if not 0 <= rank < 1 << 32:
        raise ValueError(f"rank {rank} is out of range")
    lib = _lib()
    capacity = 256
    for _ in range(2):
        buf = ctypes.create_string_buffer(capacity)
        needed = ctypes.c_size_t()
        status = lib.kvt_vllm_namespace(text, rank, buf, capacity, ctypes.byref(needed))
        if status == Status.OK:
            return buf.value.decode()
        if status == Status.INVALID_ARGUMENT and needed.value + 1 > capacity:
            capacity = needed.value + 1
            continue
        _check(status)
    raise AssertionError("unreachable")  # pragma: no cover


def _key_buffer(keys: Sequence) -> tuple[bytes, int, int]:
    """Keys concatenated into one buffer: (bytes, key_len, num_keys)."""
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise TypeError("keys must be a sequence of byte strings, not one byte string")
    keys = [k if isinstance(k, bytes) else bytes(k) for k in keys]
    if not keys:
        # The C side reports the empty job (as its one failed result); key_len only has
        # to be non-zero for the message to name the real problem.
        return b"", DEFAULT_KEY_BYTES, 0
    key_len = len(keys[0])
    if any(len(k) != key_len for k in keys):
        raise ValueError("all keys of one job must have the same length")
    return b"".join(keys), key_len, len(keys)


def _block_id_array(block_ids: Any, expected: int):
    """A C array of uint64 block ids (negative ids wrap, so the library rejects them)."""
    try:
        import numpy as np  # optional
    except ImportError:  # pragma: no cover - numpy is optional
        np = None
    if np is not None and isinstance(block_ids, np.ndarray):
        if block_ids.dtype.kind not in "iu":
            raise TypeError(f"block ids must be integers, not {block_ids.dtype}")
        arr = np.ascontiguousarray(block_ids.reshape(-1)).astype(np.uint64)
        if arr.size != expected:
            return _mismatch(arr.tolist(), expected)
        return arr, arr.ctypes.data
    ids = [operator.index(b) for b in block_ids]
    if len(ids) != expected:
        return _mismatch(ids, expected)
    arr = (ctypes.c_uint64 * max(len(ids), 1))(*ids)
    return arr, ctypes.addressof(arr)


def _mismatch(ids, expected):
    raise ValueError(f"{len(ids)} block ids for {expected} keys; a job moves one block per key")


_live_tiers: "weakref.WeakSet[Tier]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A tier belongs to the process that created it: in a child the C calls on it fail
    # at once with FORKED and close() only retires the handle. The binding's own locks
    # may have been held by parent threads at fork time: fresh ones, so that those calls
    # raise instead of hanging.
    for tier in list(_live_tiers):
        tier._lock = threading.RLock()
        tier._poll_lock = threading.Lock()
        tier._events_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Tier:
    """A kvtier tier (``kvt_tier``).

    ``config`` is the tier's JSON configuration, as a ``dict`` or a JSON string, e.g.
    ``{"store": {"type": "local", "path": "/var/cache/kv"}}``. Creating the tier builds
    the store and probes it (blocking). Close it with :meth:`close` or a ``with``
    block; ``close`` shuts the tier down and frees the handle, and is idempotent.

    A tier may be used from several threads, except that :meth:`shutdown` and
    :meth:`close` must not run concurrently with other calls (as in C); :meth:`poll` and
    :meth:`take_events` serialize themselves. A tier belongs to the process that created
    it: in a ``fork()`` child its methods raise (status FORKED) and :meth:`close` only
    retires the handle; create a new tier there.
    """

    def __init__(self, config: Mapping[str, Any] | str):
        text = config if isinstance(config, str) else json.dumps(config)
        lib = _lib()
        handle = ctypes.c_void_p()
        _check(lib.kvt_tier_new(text.encode(), ctypes.byref(handle)))
        self._ptr: int | None = handle.value
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()
        self._events_lock = threading.Lock()
        self._pool: tuple | None = None  # references that keep the host pool alive
        self.num_blocks = 0
        self.block_bytes = 0
        _live_tiers.add(self)

    # -- lifetime --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _handle(self) -> int:
        ptr = self._ptr
        if ptr is None:
            raise ShutDownError(Status.SHUT_DOWN, "the tier is closed")
        return ptr

    def shutdown(self) -> None:
        """Refuse new work, cancel what has not started, wait for what has; idempotent.

        Results stay available to :meth:`poll`. Blocks.
        """
        with self._lock:
            if self._ptr is not None:
                _check(_lib().kvt_tier_shutdown(self._ptr))

    def close(self) -> None:
        """Shut down and free the handle (``kvt_tier_free``); idempotent. Blocks."""
        with self._lock:
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                _lib().kvt_tier_free(ptr)
            # The library touches the pool no more once kvt_tier_free has returned.
            self._pool = None

    def __enter__(self) -> "Tier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_ptr", None) is not None:
            warnings.warn("kvtier.Tier was not closed; closing it now", ResourceWarning, stacklevel=2)
            try:
                self.close()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.num_blocks} blocks of {self.block_bytes} bytes"
        return f"<kvtier.Tier {state}>"

    # -- memory ----------------------------------------------------------------------

    def register_memory(self, buffer: Any, block_bytes: int | None = None) -> None:
        """Registers the host pool: block ``i`` is bytes ``[i*block_bytes, (i+1)*block_bytes)``.

        ``buffer`` is any writable C-contiguous buffer: a 2-D numpy ``uint8`` array or
        memoryview of shape ``(num_blocks, block_bytes)`` (``block_bytes`` is then taken
        from it), or a bytearray / 1-D memoryview / mmap together with ``block_bytes``.
        The tier keeps a reference to the buffer, so it stays alive (and a bytearray
        cannot be resized) until :meth:`close`. Allowed once per tier.
        """
        ptr = self._handle()
        view = memoryview(buffer)
        if view.readonly:
            raise ValueError("the host pool must be writable")
        if not view.c_contiguous:
            raise ValueError("the host pool must be C-contiguous")
        nbytes = view.nbytes
        if block_bytes is None:
            if view.ndim != 2:
                raise ValueError("pass block_bytes, or a 2-D pool of shape (num_blocks, block_bytes)")
            num_blocks, block_bytes = view.shape[0], view.strides[0]
        else:
            block_bytes = operator.index(block_bytes)
            if view.ndim == 2 and view.strides[0] != block_bytes:
                raise ValueError(f"block_bytes {block_bytes} differs from the pool's row size {view.strides[0]}")
            if block_bytes <= 0 or nbytes % block_bytes:
                raise ValueError(f"the pool's {nbytes} bytes are not a whole number of {block_bytes}-byte blocks")
            num_blocks = nbytes // block_bytes
        flat = view if (view.ndim == 1 and view.format in ("B", "b", "c")) else view.cast("B")
        # from_buffer holds a buffer export: the memory cannot be freed or resized while
        # the tier keeps `holder`.
        holder = (ctypes.c_ubyte * nbytes).from_buffer(flat)
        with self._lock:
            _check(_lib().kvt_tier_register_memory(ptr, ctypes.addressof(holder), num_blocks, block_bytes))
            self._pool = (buffer, view, flat, holder)
            self.num_blocks, self.block_bytes = num_blocks, block_bytes

    # -- jobs ------------------------------------------------------------------------

    def _submit(self, fn, job_id: int, block_ids: Any, keys: Sequence) -> None:
        job_id = operator.index(job_id)
        if not 0 <= job_id <= _U64_MAX:
            raise ValueError(f"job id {job_id} is out of range")
        buf, key_len, num_keys = _key_buffer(keys)
        ids, address = _block_id_array(block_ids, num_keys)
        _check(fn(self._handle(), job_id, address, buf, key_len, num_keys))
        del ids  # kept alive through the call

    def submit_store(self, job_id: int, block_ids: Any, keys: Sequence) -> None:
        """Stores block ``block_ids[i]`` under ``keys[i]``. Never blocks.

        The blocks must not change until the job's result has come out of :meth:`poll`.
        Raises on a rejected job, which still yields its one failed result at the next
        poll (except :class:`DuplicateJobError`).
        """
        self._submit(_lib().kvt_tier_submit_store, job_id, block_ids, keys)

    def submit_load(self, job_id: int, block_ids: Any, keys: Sequence) -> None:
        """Loads ``keys[i]`` into block ``block_ids[i]``. Never blocks.

        Same contract as :meth:`submit_store`; the blocks must not be touched until the
        result has been polled. A missing or wrong-sized object fails only its key.
        """
        self._submit(_lib().kvt_tier_submit_load, job_id, block_ids, keys)

    def poll(self) -> list[JobOutcome]:
        """Takes every finished job. Never blocks; each job is returned exactly once."""
        lib = _lib()
        out: list[JobOutcome] = []
        with self._poll_lock:
            ptr = self._handle()
            results = (_native.KvtResult * _BATCH)()
            count = ctypes.c_size_t()
            while True:
                _check(lib.kvt_tier_poll(ptr, results, _BATCH, ctypes.byref(count)))
                for r in results[: count.value]:
                    n = r.num_keys
                    statuses = tuple(as_status(s) for s in r.key_status[:n]) if n and r.key_status else ()
                    out.append(
                        JobOutcome(
                            job_id=r.job_id,
                            kind=JobKind(r.kind),
                            status=as_status(r.status),
                            bytes=r.bytes,
                            seconds=r.seconds,
                            key_status=statuses,
                            num_failed_keys=r.num_failed_keys,
                            message=r.message.decode("utf-8", "replace") if r.message else "",
                        )
                    )
                if count.value < _BATCH:
                    return out

    def event_fd(self) -> int:
        """A file descriptor readable while results wait (owned by the tier: don't close it)."""
        fd = _lib().kvt_tier_event_fd(self._handle())
        if fd < 0:
            raise ShutDownError(Status.SHUT_DOWN, "the tier has no event fd")
        return fd

    def jobs_in_flight(self) -> int:
        """Jobs submitted and not yet finished."""
        return _lib().kvt_tier_jobs_in_flight(self._handle())

    def drain(self, timeout_ms: int) -> None:
        """Blocks until no job is in flight; :class:`TimedOutError` after ``timeout_ms``.

        Results stay queued for :meth:`poll`; nothing is cancelled. Releases the GIL.
        """
        _check(_lib().kvt_tier_drain(self._handle(), max(0, int(timeout_ms))))

    # -- lookups ---------------------------------------------------------------------

    def lookup(self, req_id: int, key: bytes) -> LookupResult:
        """HIT, MISS, or RETRY (not known yet: ask again after :meth:`schedule_end`)."""
        req_id = operator.index(req_id)
        if not 0 <= req_id <= _U64_MAX:
            raise ValueError(f"request id {req_id} is out of range")
        key = key if isinstance(key, bytes) else bytes(key)
        out = ctypes.c_int()
        _check(_lib().kvt_tier_lookup(self._handle(), req_id, key, len(key), ctypes.byref(out)))
        return LookupResult(out.value)

    def schedule_end(self) -> None:
        """Sends the lookups asked since the last call as one deduplicated batch."""
        _check(_lib().kvt_tier_schedule_end(self._handle()))

    def request_finished(self, req_id: int) -> None:
        """The request will look nothing up again; verdicts only it held are dropped."""
        _check(_lib().kvt_tier_request_finished(self._handle(), operator.index(req_id)))

    # -- events and stats ------------------------------------------------------------

    def take_events(self) -> list[Event]:
        """Takes every BlockStored event recorded so far, oldest first."""
        lib = _lib()
        out: list[Event] = []
        with self._events_lock:
            ptr = self._handle()
            events = (_native.KvtEvent * _BATCH)()
            count = ctypes.c_size_t()
            while True:
                _check(lib.kvt_tier_take_events(ptr, events, _BATCH, ctypes.byref(count)))
                for e in events[: count.value]:
                    raw = ctypes.string_at(e.keys, e.key_len * e.num_keys) if e.num_keys else b""
                    keys = tuple(raw[i * e.key_len : (i + 1) * e.key_len] for i in range(e.num_keys))
                    out.append(
                        Event(
                            job_id=e.job_id,
                            keys=keys,
                            medium=e.medium.decode() if e.medium else "",
                            locality=Locality(e.locality),
                        )
                    )
                if count.value < _BATCH:
                    return out

    def stats(self) -> dict[str, int]:
        """The tier's counters (keys/bytes stored and loaded, failures, existence checks)."""
        out = _native.KvtStats()
        _check(_lib().kvt_tier_stats(self._handle(), ctypes.byref(out), ctypes.sizeof(out)))
        return {name: getattr(out, name) for name in _native.STATS_FIELDS}


__all__ = [
    "DEFAULT_KEY_BYTES",
    "Event",
    "JobKind",
    "JobOutcome",
    "KEY_GROUP_BYTES",
    "KvtierError",
    "Locality",
    "LookupResult",
    "MAX_KEYS_PER_JOB",
    "Tier",
    "library_path",
    "status_str",
    "version",
    "vllm_namespace",
]
