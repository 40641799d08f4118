"""The low-level binding: one :class:`Tier` per ``kvt_tier`` handle.

One file because it is one idea, the C ABI's tier as a Python object: each method is a
C function's argument checks and conversions, sharing the handle's lifetime guard.

This mirrors the C ABI (``include/kvtier.h``) closely. Failed calls raise
:class:`~kvtier.errors.KvtierError` subclasses carrying the status and the
``kvt_last_error()`` message. Everything the C side owns (per-key statuses, messages,
event keys) is copied into Python objects before the call returns, so results stay
valid after the next :meth:`Tier.poll` or :meth:`Tier.take_events`.

Job submission keeps the C contract: with an open tier and a job id that has no result
pending, every ``submit_*`` call yields exactly one result from :meth:`Tier.poll`, also
when the call raises :class:`KvtierError` (except :class:`DuplicateJobError`, and
:class:`ForkedError` in a fork() child using its parent's tier). Errors
raised *before* the C call (keys of different lengths, block ids that are not
integers, a closed tier) are ``TypeError``/``ValueError``/``ShutDownError`` and produce
no result.
"""

from __future__ import annotations

import array
import ctypes
import dataclasses
import enum
import json
import operator
import os
import struct
import threading
import warnings
import weakref
from typing import Any, Mapping, Sequence

from . import _native
from .errors import STATUS_BY_CODE, KvtierError, ShutDownError, Status, error_for

#: Bytes of the group index at the end of every key (``KVT_KEY_GROUP_BYTES``).
KEY_GROUP_BYTES = 4
#: Key length of vLLM's default (SHA-256) block hash plus the group index.
DEFAULT_KEY_BYTES = 36
#: Most keys one job may carry (``MAX_KEYS_PER_JOB``).
MAX_KEYS_PER_JOB = 1 << 20
#: Most ranges one key's object may be made of (``KVT_MAX_RANGES_PER_KEY``).
MAX_RANGES_PER_KEY = 4096
#: Most ranges one job may carry (``KVT_MAX_RANGES_PER_JOB``).
MAX_RANGES_PER_JOB = 1 << 22

_U64_MAX = (1 << 64) - 1
_U64_ARRAY = array.array
if _U64_ARRAY("Q").itemsize != 8:  # pragma: no cover - every platform the library builds on
    raise ImportError("kvtier: array('Q') is not 64-bit here")
_RANGE_P = ctypes.POINTER(_native.KvtRange)
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


# Lookup verdicts by code, a table rather than the enum constructor (a per-key call).
_LOOKUP_RESULTS = {int(r): r for r in LookupResult}


def _lookup_results(codes) -> list:
    """The verdicts of ``codes`` (ints), in order: one table lookup each, at C speed."""
    try:
        return list(map(_LOOKUP_RESULTS.__getitem__, codes))
    except KeyError:  # a code this binding does not know: the enum says what it is
        return [LookupResult(v) for v in codes]


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
    """A KV event: BlockStored (the keys of one successful store job, in job order) or,
    with ``removed``, BlockRemoved (keys the tier deleted: eviction, or a corrupt object
    deleted under ``on_corrupt = fail_and_delete``; ``job_id`` is 0)."""

    job_id: int
    keys: tuple
    medium: str
    locality: Locality
    removed: bool = False


def _lib() -> ctypes.CDLL:
    return _native.load()


_new_object = object.__new__
_set_attribute = object.__setattr__


def _outcome(job_id, kind, status, nbytes, seconds, key_status, num_failed_keys, message) -> JobOutcome:
    """A :class:`JobOutcome` built without the frozen dataclass's per-field
    ``object.__setattr__`` (one per finished job, on the engine's thread)."""
    outcome = _new_object(JobOutcome)
    _set_attribute(outcome, "__dict__", {
        "job_id": job_id, "kind": kind, "status": status, "bytes": nbytes, "seconds": seconds,
        "key_status": key_status, "num_failed_keys": num_failed_keys, "message": message,
    })
    return outcome


_JOB_KINDS = {int(k): k for k in JobKind}
_LOCALITIES = {int(k): k for k in Locality}
_OK = Status.OK
_STORE = int(JobKind.STORE)


def _checked_reader(ctype, fmt: str, sample: dict, expected: tuple) -> struct.Struct:
    """A ``struct.Struct`` reading one ``ctype`` (its fields in one C call rather than a
    ctypes attribute read each), checked against ctypes' own layout: ``sample`` written
    through ctypes must read back as ``expected``."""
    reader = struct.Struct(fmt)
    probe = ctype(**sample)
    if reader.size > ctypes.sizeof(ctype) or reader.unpack_from(probe) != expected:  # pragma: no cover
        raise ImportError(f"kvtier: the layout of {ctype.__name__} differs from {fmt!r} on this platform")
    return reader


#: ``kvt_result``: job_id, kind, status, bytes, seconds, num_keys, num_failed_keys,
#: key_status (address), message (address).
_RESULT = _checked_reader(
    _native.KvtResult, "@QiiQdNNPP",
    dict(job_id=1, kind=2, status=3, bytes=4, seconds=5.5, num_keys=6, num_failed_keys=7,
         key_status=ctypes.cast(8, ctypes.POINTER(ctypes.c_int)), message=ctypes.cast(9, ctypes.c_char_p)),
    (1, 2, 3, 4, 5.5, 6, 7, 8, 9),
)
_RESULT_STRIDE = ctypes.sizeof(_native.KvtResult)
#: ``kvt_kv_event``: job_id, keys (address), key_len, num_keys, medium (address), locality,
#: removed (after the padding that ends ``kvt_event``).
_KV_EVENT = _checked_reader(
    _native.KvtKvEvent,
    f"@QPNNPi{_native.KvtKvEvent.removed.offset - _native.KvtEvent.locality.offset - 4}x?",
    dict(event=_native.KvtEvent(job_id=1, keys=ctypes.cast(2, ctypes.POINTER(ctypes.c_uint8)), key_len=3,
                                num_keys=4, medium=ctypes.cast(5, ctypes.c_char_p), locality=6), removed=True),
    (1, 2, 3, 4, 5, 6, True),
)
_KV_EVENT_STRIDE = ctypes.sizeof(_native.KvtKvEvent)
#: ``kvt_event.medium`` is a static string: decoded once per address.
_MEDIA: dict[int, str] = {0: ""}
_string_at = ctypes.string_at


def _config_text(config: Mapping[str, Any] | str) -> str:
    """A tier configuration as the library takes it: JSON text, or a mapping dumped to it."""
    return config if isinstance(config, str) else json.dumps(config)


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
    if type(keys) is not list and type(keys) is not tuple:
        keys = list(keys)
    if keys and len(set(map(type, keys))) == 1 and type(keys[0]) is bytes:
        # The usual call: every key a bytes object. Checked and joined without a Python
        # step per key.
        lengths = set(map(len, keys))
        if len(lengths) != 1:
            raise ValueError("all keys of one job must have the same length")
        return b"".join(keys), len(keys[0]), len(keys)
    keys = [k if isinstance(k, bytes) else bytes(k) for k in keys]
    if not keys:
        # The C side reports the empty job (as its one failed result); key_len only has
        # to be non-zero for the message to name the real problem.
        return b"", DEFAULT_KEY_BYTES, 0
    key_len = len(keys[0])
    if any(len(k) != key_len for k in keys):
        raise ValueError("all keys of one job must have the same length")
    return b"".join(keys), key_len, len(keys)


_np: Any = None  # numpy once looked up (False: not installed)


def _numpy() -> Any:
    """numpy, or None: the binding takes numpy arrays where it is installed, and needs it
    nowhere. Imported on first use, then remembered."""
    global _np
    np = _np
    if np is None:
        try:
            import numpy as np  # optional
        except ImportError:  # pragma: no cover - numpy is optional
            np = False
        _np = np
    return np or None


def _job_id(job_id: int) -> int:
    """``job_id`` as a C ``uint64_t``; ``ValueError`` when it does not fit."""
    job_id = operator.index(job_id)
    if not 0 <= job_id <= _U64_MAX:
        raise ValueError(f"job id {job_id} is out of range")
    return job_id


def _writable_view(buffer: Any, what: str) -> memoryview:
    """A view of ``buffer``, memory the library may write: ``ValueError`` (naming it as
    ``what``) when it is read-only or not C-contiguous."""
    view = memoryview(buffer)
    if view.readonly:
        raise ValueError(f"{what} must be writable")
    if not view.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    return view


def _flat_bytes(view: memoryview) -> memoryview:
    """``view`` as one dimension of bytes (itself when it is one already)."""
    return view if (view.ndim == 1 and view.format in ("B", "b", "c")) else view.cast("B")


def _pin(flat: memoryview) -> Any:
    """A ctypes array over ``flat``: its buffer export keeps the memory from being freed
    or resized while it is held."""
    return (ctypes.c_ubyte * flat.nbytes).from_buffer(flat)


def _block_id_array(block_ids: Any, expected: int):
    """A C array of uint64 block ids (negative ids wrap, so the library rejects them)."""
    np = _np if _np is not None else _numpy()
    if np and isinstance(block_ids, np.ndarray):
        if block_ids.dtype.kind not in "iu":
            raise TypeError(f"block ids must be integers, not {block_ids.dtype}")
        if block_ids.size != expected:
            return _mismatch(range(block_ids.size), expected)
        # uint64 values in C order, as bytes (ctypes passes bytes as a pointer to them).
        ids = block_ids.astype(np.uint64).tobytes() if expected else b"\0" * 8
        return ids, ids
    ids = [operator.index(b) for b in block_ids]
    if len(ids) != expected:
        return _mismatch(ids, expected)
    arr = (ctypes.c_uint64 * max(len(ids), 1))(*ids)
    return arr, ctypes.addressof(arr)


def _mismatch(ids, expected):
    raise ValueError(f"{len(ids)} block ids for {expected} keys; a job moves one block per key")


class _Handle:
    """The ``kvt_tier *`` of one tier, the calls using it, and what must outlive it.

    Every C call on the handle runs inside ``with handle as ptr:`` (a shared use, many at
    once, as the C ABI allows); :meth:`exclusive` waits until no call uses the handle and
    keeps new ones waiting, for ``kvt_tier_shutdown`` and ``kvt_tier_free``, which must not
    run concurrently with any other call. So a call racing :meth:`Tier.close` either runs
    before the handle is freed or raises :class:`ShutDownError`; it never passes a freed
    pointer. The host pool's references live here, not on the tier, so that they outlive
    ``kvt_tier_free`` also when the tier is finalized by the garbage collector.
    """

    __slots__ = ("ptr", "pool", "regions", "_lock", "_cond", "_users", "_exclusive", "__weakref__")

    def __init__(self, ptr: int):
        self.ptr: int | None = ptr
        self.pool: tuple | None = None  # references that keep the host pool alive
        #: Region id -> (base address, length, references that keep its memory alive).
        self.regions: dict[int, tuple[int, int, Any]] = {}
        self._after_fork()
        _live_handles.add(self)

    def _after_fork(self) -> None:
        # Also run in a fork() child, where the threads that held the lock or used the
        # handle do not exist.
        # Every call enters and leaves under the lock itself (a C-level context manager);
        # the condition, on the same lock, is only waited on while `exclusive` runs. That
        # keeps a call's guard to two lock operations (a lookup is called per key).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._users = 0
        self._exclusive = False

    def ensure_open(self) -> None:
        if self.ptr is None:
            raise ShutDownError(Status.SHUT_DOWN, "the tier is closed")

    def __enter__(self) -> int:
        with self._lock:
            while self._exclusive:
                self._cond.wait()
            ptr = self.ptr
            if ptr is None:
                raise ShutDownError(Status.SHUT_DOWN, "the tier is closed")
            self._users += 1
            return ptr

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._exclusive:
                self._cond.notify_all()

    def exclusive(self, action) -> Any:
        """Runs ``action(ptr)`` (``ptr`` may be None) with no other call using the handle."""
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True
            while self._users:
                self._cond.wait()
        try:
            return action(self.ptr)
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    def free(self) -> None:
        """``kvt_tier_free`` once; drops the pool's references after it returned."""

        def _free(ptr):
            if ptr is not None:
                self.ptr = None
                _lib().kvt_tier_free(ptr)
            # The library touches the pool and the regions no more once kvt_tier_free has
            # returned.
            self.pool = None
            self.regions = {}

        self.exclusive(_free)


_live_handles: "weakref.WeakSet[_Handle]" = weakref.WeakSet()


def _handles_after_fork_in_child() -> None:
    for handle in list(_live_handles):
        handle._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_handles_after_fork_in_child)


def _finalize_unclosed(handle: _Handle) -> None:
    # weakref.finalize of a tier dropped without close() (garbage collection or exit).
    if handle.ptr is not None:
        warnings.warn("kvtier.Tier was not closed; closing it now", ResourceWarning, stacklevel=2)
        handle.free()


_live_tiers: "weakref.WeakSet[Tier]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A tier belongs to the process that created it: in a child the C calls on it fail
    # at once with FORKED and close() only retires the handle. The binding's own locks
    # may have been held by parent threads at fork time: fresh ones, so that those calls
    # raise instead of hanging.
    for tier in list(_live_tiers):
        tier._poll_lock = threading.Lock()
        tier._poll_results = (_native.KvtResult * _BATCH)()
        tier._events_lock = threading.Lock()
        tier._events_buffer = (_native.KvtKvEvent * _BATCH)()
        _output_counts(tier)


def _output_counts(tier: "Tier") -> None:
    # The counts poll and take_events are told (each used under its lock), and the
    # references passed for them, made once.
    tier._poll_count = ctypes.c_size_t()
    tier._poll_count_ref = ctypes.byref(tier._poll_count)
    tier._events_count = ctypes.c_size_t()
    tier._events_count_ref = ctypes.byref(tier._events_count)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Tier:
    """A kvtier tier (``kvt_tier``).

    ``config`` is the tier's JSON configuration, as a ``dict`` or a JSON string, e.g.
    ``{"store": {"type": "local", "path": "/var/cache/kv"}}``. Creating the tier builds
    the store and probes it (blocking). Close it with :meth:`close` or a ``with``
    block; ``close`` shuts the tier down and frees the handle, and is idempotent.

    A tier may be used from several threads: :meth:`shutdown` and :meth:`close` wait
    for the calls in progress on other threads (the C ABI forbids running them
    concurrently with other calls), and :meth:`poll` and :meth:`take_events` serialize
    themselves. A tier dropped without :meth:`close` is closed when it is collected or
    at exit, with a ``ResourceWarning``. A tier belongs to the process that created
    it: in a ``fork()`` child its methods raise (status FORKED) and :meth:`close` only
    retires the handle; create a new tier there.
    """

    def __init__(self, config: Mapping[str, Any] | str):
        lib = _lib()
        handle = ctypes.c_void_p()
        text = _config_text(config)
        _check(lib.kvt_tier_new(text.encode(), ctypes.byref(handle)))
        self._lib = lib  # its functions are looked up once, then found in its __dict__
        self._h = _Handle(handle.value)
        # Frees the handle of a tier dropped without close(), when it is collected or at
        # exit; close() detaches it.
        self._finalizer = weakref.finalize(self, _finalize_unclosed, self._h)
        self._poll_lock = threading.Lock()
        # Reused by every poll (under _poll_lock): its results are copied out before the
        # next call.
        self._poll_results = (_native.KvtResult * _BATCH)()
        self._events_lock = threading.Lock()
        self._events_buffer = (_native.KvtKvEvent * _BATCH)()
        _output_counts(self)
        # Whether take_events may find something: set by what makes events (a successful
        # store or a failed load polled, a delete, an eviction round), cleared when taken;
        # a tier with background eviction may have events at any time.
        self._events_hint = True
        try:
            self._evicts = bool((json.loads(text) if isinstance(config, str) else config).get("eviction"))
        except (ValueError, AttributeError):  # pragma: no cover - the library took it
            self._evicts = True
        self.num_blocks = 0
        self.block_bytes = 0
        _live_tiers.add(self)

    # -- lifetime --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._h.ptr is None

    def shutdown(self) -> None:
        """Refuse new work, cancel what has not started, wait for what has; idempotent.

        Results stay available to :meth:`poll`. Waits for calls in progress on other
        threads first, then for the I/O in progress up to the configuration's
        ``shutdown_timeout_ms``; what is still running then is abandoned (its jobs are
        reported cancelled), so this returns within that plus about a second even while a
        read hangs in the kernel. The pool is no longer touched once it returns.
        """
        status = self._h.exclusive(lambda ptr: Status.OK if ptr is None else _lib().kvt_tier_shutdown(ptr))
        _check(status)

    def close(self) -> None:
        """Shut down (as :meth:`shutdown`) and free the handle (``kvt_tier_free``);
        idempotent. Blocks.

        Waits for calls in progress on other threads; calls made afterwards raise
        :class:`ShutDownError`.
        """
        self._finalizer.detach()
        self._h.free()

    def __enter__(self) -> "Tier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
        self._h.ensure_open()
        view = _writable_view(buffer, "the host pool")
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
        flat = _flat_bytes(view)
        holder = _pin(flat)  # kept by the tier
        with self._h as ptr:
            _check(_lib().kvt_tier_register_memory(ptr, ctypes.addressof(holder), num_blocks, block_bytes))
            self._h.pool = (buffer, view, flat, holder)
            self.num_blocks, self.block_bytes = num_blocks, block_bytes

    def add_region(self, buffer: Any = None, *, address: int | None = None, nbytes: int | None = None,
                   owner: Any = None) -> int:
        """Registers memory that range jobs name parts of, and returns its region id.

        Either ``buffer``, any writable C-contiguous buffer (a numpy array, bytearray,
        memoryview, mmap...), which the tier keeps a reference to (so it stays alive and
        cannot be resized); or ``address`` and ``nbytes``, memory an engine hands out by
        pointer (a torch tensor's ``data_ptr()``, what SGLang's ``get_page_buffer_meta``
        points into), with ``owner`` the object that keeps it alive (the tensor): the tier
        holds ``owner`` until the region is removed or the tier closed. A tier may have
        any number of regions, added at any time before shutdown.
        """
        self._h.ensure_open()
        if buffer is not None:
            if address is not None or nbytes is not None:
                raise TypeError("pass a buffer, or address and nbytes, not both")
            view = _writable_view(buffer, "a region")
            flat = _flat_bytes(view)
            if flat.nbytes == 0:
                raise ValueError("a region needs at least one byte")
            holder = _pin(flat)
            address, nbytes, refs = ctypes.addressof(holder), flat.nbytes, (buffer, view, flat, holder)
        else:
            if address is None or nbytes is None:
                raise TypeError("pass a buffer, or address and nbytes")
            address, nbytes, refs = operator.index(address), operator.index(nbytes), owner
        region = ctypes.c_uint64()
        with self._h as ptr:
            _check(_lib().kvt_tier_add_region(ptr, address, nbytes, ctypes.byref(region)))
            self._h.regions[region.value] = (address, nbytes, refs)
        return region.value

    def remove_region(self, region: int) -> None:
        """Forgets a region; its memory may be freed afterwards. Raises
        :class:`BlockBusyError` while a job whose result has not been polled holds a range
        of it (the region stays registered)."""
        with self._h as ptr:
            _check(_lib().kvt_tier_remove_region(ptr, operator.index(region)))
            self._h.regions.pop(region, None)

    # -- jobs ------------------------------------------------------------------------

    def submit_store(self, job_id: int, block_ids: Any, keys: Sequence) -> None:
        """Stores block ``block_ids[i]`` under ``keys[i]``. Never blocks.

        The blocks must not change until the job's result has come out of :meth:`poll`.
        Raises on a rejected job, which still yields its one failed result at the next
        poll (except :class:`DuplicateJobError` and :class:`ForkedError`).
        """
        self._submit(self._lib.kvt_tier_submit_store, job_id, block_ids, keys)

    def submit_load(self, job_id: int, block_ids: Any, keys: Sequence) -> None:
        """Loads ``keys[i]`` into block ``block_ids[i]``. Never blocks.

        Same contract as :meth:`submit_store`; the blocks must not be touched until the
        result has been polled. A missing or wrong-sized object fails only its key.
        """
        self._submit(self._lib.kvt_tier_submit_load, job_id, block_ids, keys)

    def _submit(self, submit_c, job_id: int, block_ids: Any, keys: Sequence) -> None:
        if type(job_id) is not int or not 0 <= job_id <= _U64_MAX:
            job_id = _job_id(job_id)
        buf, key_len, num_keys = _key_buffer(keys)
        ids, address = _block_id_array(block_ids, num_keys)
        with self._h as ptr:
            status = submit_c(ptr, job_id, address, buf, key_len, num_keys)
        del ids  # kept alive through the call
        if status:
            _check(status)

    def _ranges_array(self, ranges: Any, num_keys: int):
        """(owner, address, ranges_per_key) of a C array of ``kvt_range``: ``ranges`` is a
        numpy array of shape ``(num_keys, R, 3)`` (region, offset, len; any integer type),
        or ``num_keys`` sequences of ``R`` (region, offset, len) triples."""
        np = _numpy()
        if np is not None and isinstance(ranges, np.ndarray):
            if ranges.dtype.kind not in "iu" or ranges.ndim != 3 or ranges.shape[2] != 3:
                raise ValueError(f"ranges must be integers of shape (num_keys, R, 3), not {ranges.dtype} {ranges.shape}")
            if ranges.shape[0] != num_keys:
                raise ValueError(f"ranges for {ranges.shape[0]} keys, but {num_keys} keys")
            arr = np.ascontiguousarray(ranges, dtype=np.uint64)
            return arr, arr.ctypes.data, ranges.shape[1]
        per_key = [list(r) for r in ranges]
        if len(per_key) != num_keys:
            raise ValueError(f"ranges for {len(per_key)} keys, but {num_keys} keys")
        count = len(per_key[0]) if per_key else 0
        if any(len(r) != count for r in per_key):
            raise ValueError("every key of one job has the same number of ranges")
        flat = [tuple(map(operator.index, r)) for key_ranges in per_key for r in key_ranges]
        arr = (_native.KvtRange * max(len(flat), 1))(*flat)
        return arr, ctypes.addressof(arr), count

    def ranges_of(self, ptrs: Sequence[int], sizes: Sequence[int], ranges_per_key: int):
        """The ``(num_keys, ranges_per_key, 3)`` ranges of pieces given by address, as an
        engine hands them out (SGLang's ``get_page_buffer_meta``: flat lists of pointers
        and sizes, key after key), each found in the region that holds it. Raises
        ``ValueError`` for a piece no registered region holds whole."""
        import bisect

        if len(ptrs) != len(sizes):
            raise ValueError(f"{len(ptrs)} pointers but {len(sizes)} sizes")
        if ranges_per_key <= 0 or len(ptrs) % ranges_per_key:
            raise ValueError(f"{len(ptrs)} pieces do not divide into keys of {ranges_per_key} ranges")
        regions = sorted((base, length, rid) for rid, (base, length, _) in self._h.regions.items())
        bases = [r[0] for r in regions]
        out = []
        for ptr, size in zip(ptrs, sizes):
            ptr, size = operator.index(ptr), operator.index(size)
            i = bisect.bisect_right(bases, ptr) - 1
            # Regions may overlap: the one starting last at or before the piece, or an
            # earlier one, holds it whole.
            while i >= 0 and not (regions[i][0] <= ptr and ptr + size <= regions[i][0] + regions[i][1]):
                i -= 1
            if i < 0:
                raise ValueError(f"no registered region holds the {size} bytes at {ptr:#x}")
            base, _, rid = regions[i]
            out.append((rid, ptr - base, size))
        return [out[k : k + ranges_per_key] for k in range(0, len(out), ranges_per_key)]

    def _submit_ranges(self, fn, job_id: int, keys: Sequence, ranges: Any) -> None:
        job_id = _job_id(job_id)
        buf, key_len, num_keys = _key_buffer(keys)
        arr, address, per_key = self._ranges_array(ranges, num_keys)
        with self._h as ptr:
            status = fn(ptr, job_id, ctypes.cast(address, _RANGE_P), per_key, buf, key_len, num_keys)
        del arr  # kept alive through the call
        _check(status)

    def submit_store_ranges(self, job_id: int, keys: Sequence, ranges: Any) -> None:
        """Stores under ``keys[i]`` the object made of ``ranges[i]``, a list of (region,
        offset, len), concatenated: the object a pool block of the same bytes gives. The
        ranges are sent as they are (no gathering copy) and must not change until the
        job's result has come out of :meth:`poll`. Raises on a rejected job, which still
        yields its one failed result (except :class:`DuplicateJobError`)."""
        self._submit_ranges(_lib().kvt_tier_submit_store_ranges, job_id, keys, ranges)

    def submit_load_ranges(self, job_id: int, keys: Sequence, ranges: Any) -> None:
        """Loads ``keys[i]`` into ``ranges[i]``, one range after the other, straight from
        the store. The ranges must not be touched until the result has been polled; a load
        needs its bytes alone (another job's are :class:`BlockBusyError`)."""
        self._submit_ranges(_lib().kvt_tier_submit_load_ranges, job_id, keys, ranges)

    def poll(self) -> list[JobOutcome]:
        """Takes every finished job. Never blocks; each job is returned exactly once."""
        out: list[JobOutcome] = []
        append = out.append
        statuses_of = STATUS_BY_CODE.get  # as_status, without a call per key
        kinds = _JOB_KINDS
        unpack, stride = _RESULT.unpack_from, _RESULT_STRIDE
        with self._poll_lock, self._h as ptr:
            results, count, count_ref = self._poll_results, self._poll_count, self._poll_count_ref
            poll_c = self._lib.kvt_tier_poll
            while True:
                status = poll_c(ptr, results, _BATCH, count_ref)
                if status:
                    _check(status)
                n = count.value
                for offset in range(0, n * stride, stride):
                    job_id, kind, status, nbytes, seconds, num_keys, failed, key_status, message = unpack(
                        results, offset)
                    if not num_keys or not key_status:
                        statuses = ()
                    elif not failed:
                        statuses = (_OK,) * num_keys
                    else:
                        codes = (ctypes.c_int * num_keys).from_address(key_status)
                        statuses = tuple([statuses_of(c, c) for c in codes])
                    if (kind == _STORE) == (status == 0):
                        self._events_hint = True  # a successful store's event, or a corrupt block's
                    append(_outcome(
                        job_id, kinds[kind] if kind in kinds else JobKind(kind), statuses_of(status, status),
                        nbytes, seconds, statuses, failed,
                        # "" on success (the header's contract): read only for a failure
                        _string_at(message).decode("utf-8", "replace") if status and message else "",
                    ))
                if n < _BATCH:
                    return out

    def event_fd(self) -> int:
        """A file descriptor readable while results wait (owned by the tier: don't close it)."""
        with self._h as ptr:
            fd = _lib().kvt_tier_event_fd(ptr)
        if fd < 0:
            raise ShutDownError(Status.SHUT_DOWN, "the tier has no event fd")
        return fd

    @property
    def location(self) -> str:
        """Where the tier's objects go, in the library's words (never a credential)."""
        with self._h as ptr:
            raw = _lib().kvt_tier_location(ptr)
        return raw.decode("utf-8", "replace") if raw else ""

    def jobs_in_flight(self) -> int:
        """Jobs submitted and not yet finished."""
        with self._h as ptr:
            return self._lib.kvt_tier_jobs_in_flight(ptr)

    def drain(self, timeout_ms: int) -> None:
        """Blocks until no job is in flight; :class:`TimedOutError` after ``timeout_ms``.

        Results stay queued for :meth:`poll`; nothing is cancelled. Releases the GIL.
        """
        timeout_ms = max(0, int(timeout_ms))
        with self._h as ptr:
            status = _lib().kvt_tier_drain(ptr, timeout_ms)
        _check(status)

    # -- lookups ---------------------------------------------------------------------

    def lookup(self, req_id: int, key: bytes) -> LookupResult:
        """HIT, MISS, or RETRY (not known yet: ask again after :meth:`schedule_end`)."""
        req_id = operator.index(req_id)
        if not 0 <= req_id <= _U64_MAX:
            raise ValueError(f"request id {req_id} is out of range")
        key = key if isinstance(key, bytes) else bytes(key)
        out = ctypes.c_int()
        with self._h as ptr:
            status = _lib().kvt_tier_lookup(ptr, req_id, key, len(key), ctypes.byref(out))
        if status:
            _check(status)
        try:
            return _LOOKUP_RESULTS[out.value]
        except KeyError:
            return LookupResult(out.value)

    def lookup_batch(self, req_ids: Sequence[int], keys: Sequence) -> list[LookupResult]:
        """Many :meth:`lookup` calls in one: ``keys[i]`` for request ``req_ids[i]``, one
        verdict each, in order, as asking them one after the other would answer. The keys
        have one length. For engines that gather a step's lookups."""
        return _lookup_results(self._lookup_codes(req_ids, keys))

    def _lookup_codes(self, req_ids: Sequence[int], keys: Sequence) -> Any:
        """:meth:`lookup_batch`'s verdicts as their codes (``kvt_lookup_result`` ints, a
        sequence), for callers that map them on themselves."""
        buf, key_len, num_keys = _key_buffer(keys)
        if not num_keys:
            return ()
        if len(req_ids) != num_keys:
            raise ValueError(f"{len(req_ids)} request ids for {num_keys} keys")
        array_type = ctypes.c_uint64 * num_keys
        try:
            # ints as one C array at C speed; anything else (negative ids, which wrap,
            # objects with __index__) converted one by one as before
            ids = array_type.from_buffer_copy(_U64_ARRAY("Q", req_ids))
        except (TypeError, OverflowError, ValueError):
            ids = array_type(*map(operator.index, req_ids))
        out = (ctypes.c_int * num_keys)()
        with self._h as ptr:
            status = self._lib.kvt_tier_lookup_batch(ptr, ids, buf, key_len, num_keys, out)
        if status:
            _check(status)
        return out

    def schedule_end(self) -> None:
        """Sends the lookups asked since the last call as one deduplicated batch."""
        with self._h as ptr:
            status = self._lib.kvt_tier_schedule_end(ptr)
        if status:
            _check(status)

    def request_finished(self, req_id: int) -> None:
        """The request will look nothing up again; verdicts only it held are dropped."""
        if type(req_id) is not int:
            req_id = operator.index(req_id)
        with self._h as ptr:
            status = self._lib.kvt_tier_request_finished(ptr, req_id)
        if status:
            _check(status)

    def check_now(self, keys: Sequence, timeout: float = 10.0) -> list[LookupResult]:
        """Checks ``keys`` in the store now, all at once, and blocks (without the GIL)
        until every check has answered or ``timeout`` seconds have passed: one verdict per
        key, HIT or MISS as the store answered, RETRY where a check failed or was late.
        For engines whose existence call is synchronous (SGLang's ``batch_exists``)."""
        buf, key_len, num_keys = _key_buffer(keys)
        if not num_keys:
            return []
        out = (ctypes.c_int * num_keys)()
        timeout_ms = max(0, int(timeout * 1000))
        with self._h as ptr:
            status = _lib().kvt_tier_check_now(ptr, buf, key_len, num_keys, timeout_ms, out)
        _check(status)
        return _lookup_results(out)

    # -- events and stats ------------------------------------------------------------

    def take_events(self) -> list[Event]:
        """Takes every BlockStored and BlockRemoved event recorded so far, oldest first."""
        out: list[Event] = []
        append = out.append
        unpack, stride = _KV_EVENT.unpack_from, _KV_EVENT_STRIDE
        new, set_attribute, media, localities = _new_object, _set_attribute, _MEDIA, _LOCALITIES
        with self._events_lock, self._h as ptr:
            self._events_hint = False  # before taking: what comes meanwhile sets it again
            events, count, count_ref = self._events_buffer, self._events_count, self._events_count_ref
            take = self._lib.kvt_tier_take_kv_events
            while True:
                status = take(ptr, events, _BATCH, count_ref)
                if status:
                    _check(status)
                n = count.value
                for offset in range(0, n * stride, stride):
                    job_id, keys_at, key_len, num_keys, medium, locality, removed = unpack(events, offset)
                    if not num_keys:
                        keys = ()
                    elif key_len:
                        # One copy of the event's keys, then one slice per key, at C speed.
                        end = key_len * num_keys
                        raw = _string_at(keys_at, end)
                        keys = tuple(map(raw.__getitem__, map(slice, range(0, end, key_len), range(key_len, end + 1, key_len))))
                    else:
                        keys = (b"",) * num_keys
                    name = media.get(medium)
                    if name is None:  # a static string: decoded once
                        name = media[medium] = _string_at(medium).decode()
                    event = new(Event)
                    set_attribute(event, "__dict__", {
                        "job_id": job_id,
                        "keys": keys,
                        "medium": name,
                        "locality": localities[locality] if locality in localities else Locality(locality),
                        "removed": removed,
                    })
                    append(event)
                if n < _BATCH:
                    return out

    def events_pending(self) -> bool:
        """False when :meth:`take_events` would certainly find nothing: no store succeeded
        and no load failed in the results polled since it last ran, no block was deleted
        through this tier, and the tier evicts nothing in the background. True otherwise
        (events may wait). Costs no call into the library."""
        return self._events_hint or self._evicts

    def evict_now(self) -> dict[str, int]:
        """Runs one eviction round now (the tier's ``eviction`` configuration; the
        background task runs them every ``interval_ms``) and returns what it did:
        ``objects``/``bytes`` before the round, ``deleted``/``deleted_bytes``."""
        return self._eviction_report(_lib().kvt_tier_evict_now)

    def clear(self) -> dict[str, int]:
        """Deletes every block under the tier's prefix and namespace, at any depth (objects
        there with a block's name; nothing else), whether or not eviction is configured, and
        returns what it did (as :meth:`evict_now`). Blocks other tiers stored into the same
        namespace go too, and so do those of the namespaces below it: with an empty
        namespace every namespace under the prefix, with both empty every block of the
        bucket. Each deleted block of the tier's own namespace is a BlockRemoved event."""
        return self._eviction_report(_lib().kvt_tier_clear)

    def delete(self, keys: Sequence) -> dict[str, int]:
        """Deletes the blocks of ``keys`` now and waits (``kvt_tier_delete``): each block
        gone afterwards, deleted or absent already, is a BlockRemoved event and is forgotten.
        Returns ``objects`` (blocks asked) and ``deleted`` (blocks gone); the byte counts
        are 0. Releases the GIL while it waits."""
        buf, key_len, num_keys = _key_buffer(keys)
        report = _native.KvtEvictionReport()
        self._events_hint = True
        with self._h as ptr:
            _check(_lib().kvt_tier_delete(ptr, buf, key_len, num_keys, ctypes.byref(report)))
        return {name: getattr(report, name) for name, _ in report._fields_}

    def pin(self, keys: Sequence) -> list[bool]:
        """Pins the blocks of ``keys`` (``kvt_tier_pin``): this tier's own eviction keeps
        them until :meth:`unpin`, though they count towards its byte budget. Pins count (a
        key pinned twice needs two unpins). Returns for each key whether the pin holds it:
        False for a block this tier's eviction was deleting at that moment (pinned all the
        same). Pin, then ask the store (:meth:`check_now`): a key found present and held
        stays. A pin holds against this tier alone: other tiers, ``kvtier gc``,
        :meth:`clear` and :meth:`delete` do not honour it."""
        buf, key_len, num_keys = _key_buffer(keys)
        if not num_keys:
            return []
        held = (ctypes.c_uint8 * num_keys)()
        with self._h as ptr:
            _check(_lib().kvt_tier_pin(ptr, buf, key_len, num_keys, held))
        return [bool(h) for h in held]

    def unpin(self, keys: Sequence) -> None:
        """Takes one pin from each of ``keys`` (``kvt_tier_unpin``); keys not pinned are
        left alone."""
        buf, key_len, num_keys = _key_buffer(keys)
        if not num_keys:
            return
        with self._h as ptr:
            _check(_lib().kvt_tier_unpin(ptr, buf, key_len, num_keys))

    def _eviction_report(self, fn) -> dict[str, int]:
        """Runs ``fn`` (``kvt_tier_evict_now`` or ``kvt_tier_clear``) and returns its
        ``kvt_eviction_report`` as a dict."""
        report = _native.KvtEvictionReport()
        self._events_hint = True
        with self._h as ptr:
            _check(fn(ptr, ctypes.byref(report)))
        return {name: getattr(report, name) for name, _ in report._fields_}

    def metrics(self) -> str:
        """The tier's metrics in the Prometheus text exposition format: the counters of
        :meth:`stats` as ``kvtier_<name>_total``, failed keys by status, jobs in flight,
        and histograms of job latency, existence-check latency and object sizes."""
        size = ctypes.c_size_t(0)
        capacity = 16384
        while True:
            buf = ctypes.create_string_buffer(capacity)
            with self._h as ptr:
                status = _lib().kvt_tier_metrics(ptr, buf, capacity, ctypes.byref(size))
            if status == 0:
                return buf.value.decode()
            if size.value + 1 <= capacity:
                _check(status)
            capacity = size.value + 4096  # the text may grow between two calls

    def stats(self) -> dict[str, int]:
        """The tier's counters (keys/bytes stored and loaded, failures, existence checks)."""
        return stats_dict(self.stats_raw())

    def stats_raw(self) -> bytes:
        """The tier's counters as ``kvt_stats``'s bytes: cheap to compare with an earlier
        snapshot; :func:`stats_dict` makes them the dict of :meth:`stats`."""
        out = _native.KvtStats()
        with self._h as ptr:
            status = self._lib.kvt_tier_stats(ptr, out, _STATS_SIZE)
        if status:
            _check(status)
        return bytes(out)


_STATS_SIZE = ctypes.sizeof(_native.KvtStats)


#: Every counter of ``kvt_stats`` is a uint64, in ``STATS_FIELDS`` order.
_STATS_VALUES = struct.Struct(f"={len(_native.STATS_FIELDS)}Q").unpack


def stats_values(raw: bytes) -> tuple[int, ...]:
    """The counters of a :meth:`Tier.stats_raw` snapshot, in ``STATS_FIELDS`` order (one
    unpack, not an attribute read per counter)."""
    return _STATS_VALUES(raw)


def stats_dict(raw: bytes) -> dict[str, int]:
    """The counters of a :meth:`Tier.stats_raw` snapshot, by name."""
    return dict(zip(_native.STATS_FIELDS, _STATS_VALUES(raw)))


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
    "MAX_RANGES_PER_JOB",
    "MAX_RANGES_PER_KEY",
    "Tier",
    "library_path",
    "status_str",
    "version",
    "vllm_namespace",
]
