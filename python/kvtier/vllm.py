"""kvtier as a secondary tier of vLLM's tiered KV offloading.

Enable it in place of vLLM's built-in ``obj`` tier by changing two keys of the tier's
entry in ``secondary_tiers``::

    {"type": "KvtierTier", "module_path": "kvtier.vllm",
     "store_config": {"bucket": "kv", "endpoint_override": "minio:9000"}}

vLLM's factory (``SecondaryTierFactory``) imports ``module_path``, takes the class named
by ``type`` from it, and calls it with ``offloading_spec``, ``primary_kv_view``,
``tier_type``, ``backpressure_detector`` and every other key of the entry as a keyword
argument. The constructor takes the obj tier's keywords (``store_config``, ``prefix``,
``io_threads``, ``enable_kv_events``, ``locality``) plus ``namespace``; any other keyword
is a ``TypeError``, as in vLLM.

This is vLLM 0.33's tier interface (``vllm/v1/kv_offload/tiering/``), tested with the
versions in :data:`TESTED_VLLM_VERSIONS`. On a vLLM whose interface differs, constructing
the tier fails with a message saying so.

Behaviour, from the tiering manager's point of view, is the obj tier's (async lookups
that answer RETRY until the step after ``on_schedule_end``, verdicts shared between
requests, BlockStored events with medium STORAGE), minus its hazards: a rejected
submission never raises but yields one failed result; a failed load marks only its
failed keys MISS and reports the keys that did load in ``successful_keys``; a job is
reported only after all of its I/O is done; objects of the wrong length fail instead
of loading short; ``shutdown`` waits for I/O in progress so nothing touches the primary
pool afterwards; existence checks run on their own lane, never behind bulk transfers.
kvtier's counters appear in vLLM's metrics (``build_metric_definitions``/``get_stats``).

Without vLLM this module still imports, with stand-ins of vLLM 0.33's dataclasses and
enums (``LookupResult``, ``JobResult``, ``OffloadingEvent``, ``Medium``, ``Locality``,
``ReqContext``, ``RequestOffloadingContext``, ``TransferJob``) so that
:func:`build_tier_config` and the namespace helpers can be used anywhere.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.metadata
import inspect
import itertools
import logging
import time
from typing import Any, Iterable, Mapping

from .errors import ConfigError, KvtierError, Status, TimedOutError
from .tier import JobKind, Tier, vllm_namespace
from .tier import version as kvtier_version
from .tier import LookupResult as _KvtLookup

logger = logging.getLogger("kvtier.vllm")

# ---------------------------------------------------------------------------------------
# vLLM's types when vLLM is installed, stand-ins otherwise.

#: vLLM releases this adapter is tested with (their tier interface is the one implemented).
TESTED_VLLM_VERSIONS = ("0.33.0",)

_TIERING = "vllm.v1.kv_offload.tiering.base"
_OFFLOAD = "vllm.v1.kv_offload.base"


def _import_vllm() -> Any:
    try:
        return importlib.import_module(_TIERING)
    except ImportError:
        return None


_vllm_tiering = _import_vllm()
#: True when this module runs inside an installed vLLM (and subclasses its base class).
HAVE_VLLM = _vllm_tiering is not None


class _LookupResult(enum.Enum):
    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


class _Medium(enum.Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


class _Locality(enum.Enum):
    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


@dataclasses.dataclass
class _JobResult:
    job_id: int
    success: bool
    successful_keys: Any = None
    transfer_time: float | None = None
    transfer_bytes: int | None = None


@dataclasses.dataclass
class _OffloadingEvent:
    keys: list
    medium: Any
    removed: bool
    locality: Any = None


@dataclasses.dataclass
class _RequestOffloadingContext:
    policy: Any = None


@dataclasses.dataclass
class _ReqContext:
    req_id: str
    kv_transfer_params: dict | None = None


@dataclasses.dataclass
class _TransferJob:
    job_id: int
    keys: Any
    chunk_ids: Any
    is_promotion: bool = False
    req_context: Any = None


class _StandInBase:
    """vLLM 0.33's SecondaryTierManager defaults, for importing without vLLM."""

    def __init__(self, offloading_spec: Any, primary_kv_view: Any, tier_type: str, backpressure_detector: Any = None):
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        self.locality = None
        self._bp_detector = backpressure_detector

    @property
    def bp_detector(self) -> Any:
        return self._bp_detector


if HAVE_VLLM:
    _offload = importlib.import_module(_OFFLOAD)
    _Base = _vllm_tiering.SecondaryTierManager
    LookupResult = _offload.LookupResult
    Medium = _offload.Medium
    Locality = _offload.Locality
    OffloadingEvent = _offload.OffloadingEvent
    ReqContext = _offload.ReqContext
    RequestOffloadingContext = _offload.RequestOffloadingContext
    JobResult = _vllm_tiering.JobResult
    TransferJob = _vllm_tiering.TransferJob
else:
    _Base = _StandInBase
    LookupResult = _LookupResult
    Medium = _Medium
    Locality = _Locality
    OffloadingEvent = _OffloadingEvent
    ReqContext = _ReqContext
    RequestOffloadingContext = _RequestOffloadingContext
    JobResult = _JobResult
    TransferJob = _TransferJob

# kvtier's verdict -> vLLM's (by name), once rather than per lookup.
_VERDICTS = {verdict: LookupResult[verdict.name] for verdict in _KvtLookup}


def vllm_version() -> str | None:
    """The installed vLLM's version, or None without vLLM."""
    if not HAVE_VLLM:
        return None
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return getattr(importlib.import_module("vllm"), "__version__", "unknown")


def interface_mismatch() -> str | None:
    """What the installed vLLM's tier interface lacks of the one this adapter implements
    (vLLM 0.33's), or None when it matches or vLLM is not installed."""
    if not HAVE_VLLM:
        return None
    missing = []
    init = inspect.signature(_Base.__init__).parameters
    if "backpressure_detector" not in init:
        missing.append("SecondaryTierManager.__init__(backpressure_detector=...)")
    for cls, field_names in (
        (JobResult, ("job_id", "success", "successful_keys", "transfer_time", "transfer_bytes")),
        (TransferJob, ("job_id", "keys", "chunk_ids", "is_promotion", "req_context")),
    ):
        names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        missing += [f"{cls.__name__}.{n}" for n in field_names if n not in names]
    for name in ("MISS", "HIT", "RETRY"):
        if name not in LookupResult.__members__:
            missing.append(f"LookupResult.{name}")
    for name in ("has_pending_work", "touch", "build_metric_definitions", "get_stats", "config_info_keys", "config_info"):
        if not hasattr(_Base, name):
            missing.append(f"SecondaryTierManager.{name}")
    return ", ".join(missing) or None


_warned_untested = False


def _check_vllm() -> None:
    """Fails with a clear message on a vLLM whose tier interface this adapter does not know."""
    global _warned_untested
    problem = interface_mismatch()
    if problem is not None:
        raise RuntimeError(
            f"kvtier.vllm implements the secondary-tier interface of vLLM 0.33 (tested with "
            f"{', '.join(TESTED_VLLM_VERSIONS)}); the installed vLLM {vllm_version()} lacks {problem}. "
            "Use a tested vLLM version."
        )
    version = vllm_version()
    if HAVE_VLLM and version not in TESTED_VLLM_VERSIONS and not _warned_untested:
        _warned_untested = True
        logger.warning(
            "kvtier.vllm is tested with vLLM %s; vLLM %s has the same tier interface but is untested",
            ", ".join(TESTED_VLLM_VERSIONS),
            version,
        )


# ---------------------------------------------------------------------------------------
# Configuration: vLLM's obj-tier keywords -> kvtier's tier configuration.

#: Keys of ``store_config`` that configure the tier rather than the store.
TIER_KEYS = frozenset(
    {
        "max_inflight_transfers",
        "max_inflight_lookups",
        "runtime_threads",
        "shutdown_timeout_ms",
        "key_bytes",
        "checksums",
        "on_corrupt",
        "dedup",
        "known_keys_capacity",
        "known_keys_ttl_ms",
        "eviction",
        "file_io_threads",
    }
)
#: vLLM sends these only when non-empty; empty means "use the default (credential chain...)".
_OMIT_WHEN_EMPTY = ("access_key", "secret_key", "session_token", "region", "ca_bundle")
#: Optional S3 settings (#56192) that vLLM sends only when set.
_OMIT_WHEN_NONE = ("use_virtual_addressing", "req_checksum", "resp_checksum", "scheme", "endpoint_override")
#: NIXL parameter names that vLLM's ``backend_params`` may not override (#56192).
_RESERVED_BACKEND_PARAMS = frozenset(
    {
        "bucket",
        "endpoint_override",
        "access_key",
        "secret_key",
        "session_token",
        "region",
        "scheme",
        "ca_bundle",
        "num_threads",
        "use_virtual_addressing",
        "req_checksum",
        "resp_checksum",
        "accelerated",
        "type",
    }
)
_STORE_TYPES = ("s3", "local", "memory", "azure", "gcs")
_TRUE_WORDS = {"1", "true", "yes", "y", "on", "enable"}


def parse_locality(locality: Any):
    """``None``, or vLLM's ``Locality`` for exactly ``"LOCAL"`` / ``"REMOTE"``; else ValueError."""
    if locality is None:
        return None
    if isinstance(locality, enum.Enum):
        locality = locality.value
    if not isinstance(locality, str):
        raise ValueError(f"locality must be 'LOCAL', 'REMOTE' or None, not {locality!r}")
    return Locality(locality)  # ValueError for anything but the exact enum values


def build_tier_config(
    store_config: Mapping[str, Any],
    *,
    prefix: str = "",
    namespace: str = "",
    io_threads: int | None = None,
    enable_kv_events: bool = False,
    locality: Any = None,
) -> dict:
    """kvtier's tier configuration for vLLM's obj-tier keywords.

    ``store_config`` takes vLLM's ``ObjStoreConfig`` names (bucket, endpoint_override,
    scheme, access_key, secret_key, session_token, region, ca_bundle,
    use_virtual_addressing, req_checksum, resp_checksum) and kvtier's extras: ``type``
    (``s3`` — the default when a bucket is given —, ``local`` with ``path``, or
    ``memory``), the tier keys in :data:`TIER_KEYS`, and the S3 client keys
    (connect_timeout_ms, request_timeout_ms, max_retries, payload_signing, allow_http).
    As in vLLM, ``scheme`` defaults to ``http`` when an ``endpoint_override`` is given
    and empty credentials/region/CA bundle are left out.
    """
    if not isinstance(store_config, Mapping):
        raise TypeError(f"store_config must be a dict, not {type(store_config).__name__}")
    store = dict(store_config)
    tier: dict[str, Any] = {}
    for key in TIER_KEYS & store.keys():
        tier[key] = store.pop(key)

    accelerated = store.pop("accelerated", None)
    if accelerated is True or (isinstance(accelerated, str) and accelerated.lower() in _TRUE_WORDS):
        raise ValueError("store_config.accelerated: kvtier has no accelerated (RDMA) NIXL engines; remove it")
    backend_params = store.pop("backend_params", None)
    if backend_params:
        if not isinstance(backend_params, Mapping):
            raise ValueError("store_config.backend_params must be a dict")
        reserved = sorted(_RESERVED_BACKEND_PARAMS & backend_params.keys())
        if reserved:
            raise ValueError(f"store_config.backend_params may not set reserved keys {reserved}")
        logger.warning("store_config.backend_params %s are NIXL settings; kvtier ignores them", sorted(backend_params))

    store_type = store.pop("type", None) or None
    if store_type is None:
        if "bucket" not in store:
            raise ValueError(
                "store_config needs a 'bucket' (S3), or 'type': 'local' with a 'path', or 'type': 'memory'"
            )
        store_type = "s3"
    if store_type not in _STORE_TYPES:
        raise ValueError(
            f"store_config.type {store_type!r}: kvtier stores are {', '.join(_STORE_TYPES)} "
            "(NIXL accelerated engine types are not supported)"
        )
    if store_type == "s3":
        for key in _OMIT_WHEN_EMPTY:
            if store.get(key, "") in ("", None):
                store.pop(key, None)
        for key in _OMIT_WHEN_NONE:
            if store.get(key, 0) is None:
                store.pop(key)
        if store.get("endpoint_override") and "scheme" not in store:
            store["scheme"] = "http"  # vLLM's default (NIXL's own would be https)

    config: dict[str, Any] = {"store": {"type": store_type, **store}, "prefix": prefix}
    if namespace:
        config["namespace"] = namespace
    # vLLM's keys are whatever the hash algorithm makes them (32-byte SHA-256 hashes by
    # default, 8 bytes for xxhash): accept any length unless the user pins one.
    config["key_bytes"] = 0
    if io_threads is not None:
        # NIXL's io_threads is the executor that caps concurrent requests. kvtier's
        # concurrency comes from max_inflight_transfers/_lookups; io_threads sizes the
        # async runtime driving them.
        config["runtime_threads"] = max(1, min(int(io_threads), 256))
    config.update(tier)
    config["enable_kv_events"] = bool(enable_kv_events)
    loc = parse_locality(locality)
    if loc is not None:
        config["locality"] = loc.name
    return config


# ---------------------------------------------------------------------------------------
# vLLM's namespace, from the offloading spec.


def _blocks_per_chunk(spec: Any) -> int:
    """The chunk size in blocks, which vLLM's obj tier hashes as ``blocks_per_file``."""
    value = getattr(spec, "blocks_per_chunk", None)
    if value is None:
        value = getattr(getattr(getattr(spec, "config", None), "cache", None), "blocks_per_chunk", 1)
    return int(value)


def _vllm_file_mapper(spec: Any) -> Any:
    """vLLM's FileMapper for ``spec``, built exactly as vLLM 0.33's obj tier builds it."""
    mapper_cls = importlib.import_module("vllm.v1.kv_offload.file_mapper").FileMapper
    return mapper_cls.from_offloading_spec(
        "", spec, blocks_per_file=_blocks_per_chunk(spec), parallel_agnostic=True
    )


def namespace_fields(spec: Any) -> tuple[dict, int] | None:
    """vLLM's hashed field set and rank for the obj tier, or None when not derivable.

    With vLLM installed this is what vLLM's own FileMapper hashes (``blocks_per_file`` =
    the spec's ``blocks_per_chunk``, ``parallel_agnostic`` requested, as vLLM 0.33's obj
    tier does); without vLLM the field set is built from ``spec.config`` per vLLM's layout.
    """
    if spec is None:
        return None
    if HAVE_VLLM:
        mapper = _vllm_file_mapper(spec)
        return mapper.get_run_config(), int(mapper.rank)
    return _fields_from_config(spec)


def derive_namespace(spec: Any) -> str | None:
    """vLLM's namespace for the obj tier (``<model>_<digest>_r<rank>``), or None.

    With vLLM installed, the namespace is read off vLLM's own FileMapper and checked
    against kvtier's computation from the same field set (``kvt_vllm_namespace``).
    """
    if spec is None:
        return None
    if not HAVE_VLLM:
        derived = _fields_from_config(spec)
        return None if derived is None else vllm_namespace(*derived)
    mapper = _vllm_file_mapper(spec)
    namespace = vllm_namespace(mapper.get_run_config(), int(mapper.rank))
    theirs = f"{mapper.base_path.rstrip('/').rsplit('/', 1)[-1]}_r{mapper.rank}"
    if theirs != namespace:
        logger.warning("namespace %r differs from vLLM's %r; using vLLM's", namespace, theirs)
        namespace = theirs
    return namespace


def _fields_from_config(spec: Any) -> tuple[dict, int] | None:
    config = getattr(spec, "config", None)
    try:
        model, cache, parallel = config.model, config.cache, config.parallel
        if getattr(config, "canonical_layout", False):
            return None  # the canonical format id needs vLLM itself
        replicated = bool(getattr(config, "replicated_layout", False))
        agnostic = bool(getattr(parallel, "is_parallelism_agnostic", False)) or replicated
        sizes = {
            "tp_size": parallel.tp_size,
            "pp_size": parallel.pp_size,
            "pcp_size": parallel.pcp_size,
            "dcp_size": parallel.dcp_size,
        }
        if agnostic:
            sizes = dict.fromkeys(sizes, 1)
        fields = {
            "model_name": model.name,
            "tokens_per_hash": cache.tokens_per_hash,
            "blocks_per_file": _blocks_per_chunk(spec),
            **sizes,
            "dtype": str(model.dtype),
            "kv_cache_groups": [
                {"tokens_per_block": g.tokens_per_block, "layer_names": list(g.layer_names)} for g in config.groups
            ],
            "inference_engine": "vllm",
        }
        if not agnostic:
            fields["parallel_agnostic"] = False
        if replicated:
            fields["replicated_layout"] = True
        storage_format = getattr(spec, "storage_format", None)
        if storage_format is not None:
            fields["storage_format"] = storage_format
        return fields, 0 if agnostic else int(getattr(parallel, "rank", 0) or 0)
    except AttributeError:
        return None


def _events_enabled_globally(spec: Any) -> bool | None:
    """vLLM's global KV-event flag, or None when the spec does not say."""
    for owner in (spec, getattr(spec, "vllm_config", None)):
        events_config = getattr(owner, "kv_events_config", None)
        if events_config is not None and hasattr(events_config, "enable_kv_cache_events"):
            return bool(events_config.enable_kv_cache_events)
    return None


# ---------------------------------------------------------------------------------------
# The tier.

_DRAIN_WARN_AFTER_S = 5.0
_monotonic = time.monotonic  # patched by tests


#: kvtier's counters as vLLM metrics: counter name -> help text. Every name of
#: ``kvtier.Tier.stats()`` (the header's ``kvt_stats``) must be here; a test checks it.
STAT_HELP = {
    "keys_stored": "Keys kvtier stored to the object store.",
    "keys_loaded": "Keys kvtier loaded from the object store and verified.",
    "bytes_stored": "Bytes kvtier stored to the object store.",
    "bytes_loaded": "Bytes kvtier loaded from the object store and verified.",
    "keys_failed": "Keys of kvtier store or load jobs that failed.",
    "existence_checks": "Existence checks kvtier sent to the object store.",
    "existence_check_errors": "Existence checks that failed (answered MISS).",
    "corrupt_blocks": "Loaded blocks whose checksum did not match (failed, never returned).",
    "dedup_known": "Stores skipped without asking the object store: stored or found within known_keys_ttl_ms.",
    "dedup_joined": "Stores that joined an identical store already in flight.",
    "dedup_already_stored": "Stores the object store answered as already present.",
    "direct_requests": "Requests sent on kvtier's direct HTTP path.",
    "direct_fallbacks": "Direct-path requests repeated through the general HTTP client.",
    "evicted_blocks": "Blocks kvtier's eviction removed to keep its namespace within its budget or age (a block another tier deleted first counts too).",
    "evicted_bytes": "Bytes of the blocks kvtier deleted by eviction.",
    "retries": "Requests kvtier's storage client sent again after a 5xx or 429 answer or a transport error.",
    "damaged_uploads": "Uploads the object store refused as damaged in transit (each sent again).",
}
METRIC_PREFIX = "vllm:kv_offload_kvtier_"
JOBS_IN_FLIGHT_METRIC = METRIC_PREFIX + "jobs_in_flight"
#: The label every kvtier metric carries: the tier's ``type`` from its configuration.
METRIC_LABELS = ("tier",)
#: Labels kvtier adds to vLLM's ``vllm:kv_offload_config_info``.
CONFIG_INFO_KEYS = ("kvtier_version", "kvtier_store", "kvtier_location")


def _metrics_module() -> Any:
    return importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics")


@dataclasses.dataclass
class _PendingJob:
    """One of vLLM's jobs: its keys, and what its library jobs reported so far."""

    kind: JobKind
    keys: tuple
    parts: int  # library jobs still in flight
    ok: bool = True
    done: set = dataclasses.field(default_factory=set)  # keys that succeeded
    nbytes: int = 0
    seconds: float = 0.0

    def add(self, *, ok: bool, done: Iterable, nbytes: int, seconds: float) -> None:
        self.parts -= 1
        self.ok = self.ok and ok
        self.done.update(done)
        self.nbytes += nbytes
        self.seconds = max(self.seconds, seconds)

    def result(self, job_id: int) -> Any:
        successful = None
        if self.kind is JobKind.LOAD and not self.ok:
            # The keys that did load, in job order; None (all failed) when there are none.
            successful = tuple(k for k in self.keys if k in self.done) or None
        return JobResult(
            job_id=job_id,
            success=self.ok,
            successful_keys=successful,
            transfer_time=self.seconds,
            transfer_bytes=self.nbytes,
        )


class KvtierTier(_Base):
    """A vLLM secondary tier backed by kvtier (S3-compatible stores, or a local directory).

    Keywords (vLLM's obj tier, plus ``namespace``):

    * ``store_config`` (required): vLLM's ``ObjStoreConfig`` keys plus kvtier extras; see
      :func:`build_tier_config`.
    * ``prefix``: leading path of every object name (default ``""``).
    * ``io_threads``: sizes kvtier's I/O runtime (``runtime_threads``); concurrency is
      ``max_inflight_transfers`` / ``max_inflight_lookups`` in ``store_config``.
    * ``enable_kv_events``: emit one BlockStored event per successful store job
      (effective only with vLLM's global ``enable_kv_cache_events``).
    * ``locality``: ``"LOCAL"``, ``"REMOTE"`` or ``None``, carried on events.
    * ``namespace``: the namespace segment of object names. By default it is vLLM's
      (``<model>_<digest>_r<rank>``, computed from the offloading spec as vLLM's obj tier
      does), so a bucket is shared with vLLM's own obj tier.
    * ``backpressure_detector``: passed by vLLM's factory (from the entry's
      ``backpressure`` block); vLLM's tiering manager feeds it from this tier's results.
    """

    medium = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: Any,
        tier_type: str,
        store_config: Mapping[str, Any] | None = None,
        prefix: str = "",
        io_threads: int | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: Any = None,
        *,
        namespace: str | None = None,
    ) -> None:
        _check_vllm()
        if store_config is None:
            raise TypeError(f"{type(self).__name__}() missing required argument: 'store_config'")
        if primary_kv_view is None:
            raise TypeError(f"{type(self).__name__}() missing required argument: 'primary_kv_view'")
        view = memoryview(primary_kv_view)
        if view.ndim != 2:
            raise ValueError(f"primary_kv_view must be 2-D (num_slots, row_bytes), not {view.ndim}-D")
        super().__init__(offloading_spec, view, tier_type, backpressure_detector)
        self._tier: Tier | None = None
        self._closed = False
        # vLLM's jobs in flight, and the library jobs (one per key length) each consists of.
        self._jobs: dict[int, _PendingJob] = {}
        self._parts: dict[int, tuple[int, list]] = {}  # library job id -> (vLLM job id, its keys)
        self._next_part_id = itertools.count(1)
        self._early: list = []  # results of jobs that never reached the library
        self._req_ids: dict[Any, int] = {}
        self._next_req_id = itertools.count(1)
        self._reported_stats: dict[str, int] = dict.fromkeys(STAT_HELP, 0)

        if not isinstance(prefix, str):
            raise TypeError("prefix must be a string")
        if io_threads is not None and (isinstance(io_threads, bool) or int(io_threads) < 1):
            raise ValueError(f"io_threads must be a positive integer, not {io_threads!r}")
        self.locality = parse_locality(locality)

        events = bool(enable_kv_events)
        if events and _events_enabled_globally(offloading_spec) is False:
            logger.warning(
                "enable_kv_events is set on secondary tier '%s' but KV cache events are "
                "disabled globally; the tier will not emit events.",
                tier_type,
            )
            events = False
        self.events_enabled = events

        if namespace is None:
            namespace = derive_namespace(offloading_spec)
            if namespace is None:
                if offloading_spec is not None:
                    raise ValueError(
                        "cannot derive vLLM's namespace from this offloading spec; "
                        "set 'namespace' in the tier's configuration"
                    )
                namespace = ""
        if not isinstance(namespace, str):
            raise TypeError("namespace must be a string")
        self.namespace = namespace

        config = build_tier_config(
            store_config,
            prefix=prefix,
            namespace=namespace,
            io_threads=io_threads,
            enable_kv_events=events,
            locality=self.locality,
        )
        self._config_info = {
            "kvtier_version": kvtier_version(),
            "kvtier_store": config["store"]["type"],
            "kvtier_location": _location(config, prefix, namespace),
        }
        try:
            self._tier = Tier(config)
        except ConfigError:
            raise
        except KvtierError as exc:
            raise type(exc)(
                exc.status,
                f"kvtier tier could not start: {exc.message}. Check store_config "
                "(bucket, endpoint_override, scheme) and the credentials (access_key/secret_key, "
                "or the default credential chain)",
            ) from exc
        try:
            self._tier.register_memory(view)
        except BaseException:
            self._tier.close()
            self._tier = None
            raise
        self.row_bytes = self._tier.block_bytes
        self.num_slots = self._tier.num_blocks
        logger.info(
            "kvtier tier '%s': %s, %d slots of %d bytes",
            tier_type,
            self._config_info["kvtier_location"],
            self.num_slots,
            self.row_bytes,
        )

    # -- lookups ---------------------------------------------------------------------

    def _req_id(self, req_context: Any) -> int:
        key = getattr(req_context, "req_id", req_context)
        rid = self._req_ids.get(key)
        if rid is None:
            rid = self._req_ids[key] = next(self._next_req_id)
        return rid

    def lookup(self, key: bytes, req_context: Any):
        """HIT, MISS, or RETRY until the check sent at the next ``on_schedule_end`` answers."""
        if self._tier is None:
            return LookupResult.MISS
        try:
            verdict = self._tier.lookup(self._req_id(req_context), key)
        except KvtierError as exc:
            logger.warning("kvtier lookup failed, answering MISS: %s", exc)
            verdict = _KvtLookup.MISS
        return _VERDICTS[verdict]

    def on_new_request(self, req_context: Any):
        return RequestOffloadingContext()

    def on_schedule_end(self, context: Any = None) -> None:
        """Sends this step's new lookups as one deduplicated batch of existence checks."""
        if self._tier is not None:
            try:
                self._tier.schedule_end()
            except KvtierError as exc:
                logger.warning("kvtier schedule_end failed: %s", exc)

    def on_request_finished(self, req_context: Any) -> None:
        """Drops the verdicts only this request held."""
        rid = self._req_ids.pop(getattr(req_context, "req_id", req_context), None)
        if rid is not None and self._tier is not None:
            try:
                self._tier.request_finished(rid)
            except KvtierError as exc:
                logger.warning("kvtier request_finished failed: %s", exc)

    def touch(self, keys, req_context) -> None:
        """Accepted and ignored: eviction (the ``eviction`` config) deletes the oldest-stored
        blocks first; kvtier keeps no recency order that a touch could refresh."""
        return None

    # -- jobs ------------------------------------------------------------------------

    def submit_store(self, job_metadata: Any) -> None:
        """Stores the job's primary slots under its keys. Never raises for a bad job."""
        self._submit(job_metadata, JobKind.STORE)

    def submit_load(self, job_metadata: Any) -> None:
        """Loads the job's keys into its primary slots. Never raises for a bad job."""
        self._submit(job_metadata, JobKind.LOAD)

    def _submit(self, job: Any, kind: JobKind) -> None:
        job_id = int(job.job_id)
        keys = tuple(job.keys)
        if job_id in self._jobs:
            # The manager never reuses a pending id; a second result would crash it.
            logger.error("job %d is already in flight; the duplicate submission is dropped", job_id)
            return
        if not keys:
            self._early.append(JobResult(job_id=job_id, success=True, transfer_time=0.0, transfer_bytes=0))
            return
        if self._tier is None:
            self._fail_early(job_id, "the tier is shut down")
            return
        try:
            slots = [int(s) for s in job.chunk_ids]
            if len(slots) != len(keys):
                raise ValueError(f"{len(keys)} keys but {len(slots)} chunk ids")
        except Exception as exc:  # never reached the library: report the failure here
            self._fail_early(job_id, str(exc))
            return
        # A library job has keys of one length; vLLM's keys have the length of their hash,
        # which may differ within a job (vLLM's own tests mix 1- and 2-byte hashes). Each
        # length becomes one library job; vLLM sees one result when all of them finished.
        by_length: dict[int, tuple[list, list]] = {}
        for key, slot in zip(keys, slots):
            part_slots, part_keys = by_length.setdefault(len(key), ([], []))
            part_slots.append(slot)
            part_keys.append(key)
        pending = self._jobs[job_id] = _PendingJob(kind, keys, parts=len(by_length))
        submit = self._tier.submit_store if kind is JobKind.STORE else self._tier.submit_load
        for part_slots, part_keys in by_length.values():
            part_id = next(self._next_part_id)
            self._parts[part_id] = (job_id, part_keys)
            try:
                submit(part_id, part_slots, part_keys)
            except KvtierError as exc:
                # Rejected by the library: its one failed result comes from the next poll.
                logger.warning("%s job %d rejected: %s", kind.name.lower(), job_id, exc)
            except Exception as exc:  # never reached the library: fail this part here
                del self._parts[part_id]
                logger.warning("%s job %d failed at submission: %s", kind.name.lower(), job_id, exc)
                pending.add(ok=False, done=(), nbytes=0, seconds=0.0)
        self._finish_if_done(job_id)

    def _fail_early(self, job_id: int, why: str) -> None:
        logger.warning("job %d failed at submission: %s", job_id, why)
        self._early.append(JobResult(job_id=job_id, success=False, transfer_time=0.0, transfer_bytes=0))

    def _finish_if_done(self, job_id: int) -> None:
        pending = self._jobs.get(job_id)
        if pending is not None and pending.parts == 0:
            del self._jobs[job_id]
            self._early.append(pending.result(job_id))

    def get_finished_jobs(self) -> list:
        """Every job finished since the last call, each exactly once."""
        if self._tier is not None:
            for outcome in self._tier.poll():
                job_id, part_keys = self._parts.pop(outcome.job_id, (None, ()))
                pending = self._jobs.get(job_id) if job_id is not None else None
                if pending is None:
                    logger.error("kvtier reported job %d, which this tier did not submit", outcome.job_id)
                    continue
                if outcome.ok:
                    done = part_keys
                else:
                    logger.debug("%s job %d failed: %s", pending.kind.name.lower(), job_id, outcome.message)
                    statuses = outcome.key_status if len(outcome.key_status) == len(part_keys) else ()
                    done = [k for k, st in zip(part_keys, statuses) if st == Status.OK]
                pending.add(ok=outcome.ok, done=done, nbytes=outcome.bytes, seconds=outcome.seconds)
                self._finish_if_done(job_id)
        results, self._early = self._early, []
        return results

    def has_pending_work(self) -> bool:
        """True while a submitted job has not been returned by ``get_finished_jobs``."""
        return bool(self._jobs or self._early)

    def take_events(self) -> list:
        """KV events, oldest first (empty when disabled): BlockStored for successful store
        jobs, and BlockRemoved (``removed=True``) for keys kvtier deleted (eviction, or a
        corrupt object deleted under ``on_corrupt = fail_and_delete``)."""
        if self._tier is None or not self.events_enabled:
            return []
        return [
            OffloadingEvent(keys=list(e.keys), medium=Medium.STORAGE, removed=e.removed, locality=self.locality)
            for e in self._tier.take_events()
        ]

    def drain_jobs(self) -> None:
        """Blocks until no job is in flight; results wait for the next get_finished_jobs.

        Never cancels and never gives up; logs one warning after 5 s.
        """
        if self._tier is None:
            return
        start = _monotonic()
        warned = False
        while True:
            try:
                self._tier.drain(1000)
                return
            except TimedOutError:
                if not warned and _monotonic() - start >= _DRAIN_WARN_AFTER_S:
                    warned = True
                    logger.warning(
                        "kvtier drain_jobs: %d transfers still in flight after %.0f s; "
                        "a stuck transfer will block the engine",
                        self._tier.jobs_in_flight(),
                        _DRAIN_WARN_AFTER_S,
                    )
            except KvtierError as exc:  # shut down
                logger.warning("kvtier drain_jobs: %s", exc)
                return

    def shutdown(self) -> None:
        """Stops the tier; idempotent. When it returns, nothing touches the primary pool."""
        if self._closed:
            return
        self._closed = True
        tier, self._tier = self._tier, None
        self._jobs.clear()
        self._parts.clear()
        self._early.clear()
        self._req_ids.clear()
        if tier is not None:
            tier.close()  # cancels queued work, waits for I/O in progress, frees the handle
        self._primary_kv_view = None

    # -- metrics ---------------------------------------------------------------------

    @classmethod
    def build_metric_definitions(cls, extra_config: dict) -> dict:
        """kvtier's counters (:data:`STAT_HELP`) and its jobs-in-flight gauge, for vLLM's
        Prometheus exposition; every one is labelled with the tier's ``type``."""
        base = importlib.import_module(_OFFLOAD)
        metrics = {
            METRIC_PREFIX + name: base.OffloadingCounterMetadata(documentation=help_text, labelnames=METRIC_LABELS)
            for name, help_text in STAT_HELP.items()
        }
        metrics[JOBS_IN_FLIGHT_METRIC] = base.OffloadingGaugeMetadata(
            documentation="kvtier store and load jobs in flight.", labelnames=METRIC_LABELS
        )
        return metrics

    def get_stats(self) -> Any:
        """What kvtier's counters grew by since the last call, and the jobs in flight."""
        if self._tier is None:
            return None
        stats = _metrics_module().OffloadingConnectorStats()
        labels = (self.tier_type,)
        now = self._tier.stats()
        for name in STAT_HELP:
            grown = now[name] - self._reported_stats[name]
            if grown:
                stats.increase_counter(METRIC_PREFIX + name, grown, labels)
            self._reported_stats[name] = now[name]
        stats.set_gauge(JOBS_IN_FLIGHT_METRIC, self._tier.jobs_in_flight(), labels)
        return stats

    @classmethod
    def config_info_keys(cls, tier_config: dict) -> tuple:
        return CONFIG_INFO_KEYS

    def config_info(self) -> dict:
        """kvtier's version, the store type and where objects go (never a credential)."""
        return dict(self._config_info)

    # -- extras ----------------------------------------------------------------------

    @property
    def tier(self) -> Tier | None:
        """The underlying :class:`kvtier.Tier` (None after shutdown)."""
        return self._tier

    def kvtier_stats(self) -> dict:
        """kvtier's counters (existence checks, keys stored/loaded...); {} after shutdown."""
        return self._tier.stats() if self._tier is not None else {}

    def __repr__(self) -> str:
        state = "shut down" if self._closed else f"{getattr(self, 'num_slots', 0)} slots"
        return f"<{type(self).__name__} {self.tier_type!r} namespace={self.namespace!r} {state}>"


def _location(config: Mapping[str, Any], prefix: str, namespace: str) -> str:
    """Where a tier's objects go, for logs and vLLM's info metric; never a credential."""
    store = config["store"]
    objects = "/".join(p for p in (prefix.strip("/"), namespace) if p)
    if store["type"] == "s3":
        endpoint = store.get("endpoint_override") or "AWS"
        if "://" not in endpoint and store.get("endpoint_override"):
            endpoint = f"{store.get('scheme', 'https')}://{endpoint}"
        where = f"{endpoint}/{store['bucket']}"
    elif store["type"] == "local":
        where = f"file://{store.get('path', '')}"
    elif store["type"] == "azure":
        where = f"azure://{store.get('account', '')}/{store.get('container', '')}"
    elif store["type"] == "gcs":
        where = f"gs://{store.get('bucket', '')}"
    else:
        where = "memory:"
    return f"{where}/{objects}" if objects else where


#: The same class under a name that reads well in a vLLM configuration
#: (``"type": "ObjectStoreTier"``).
ObjectStoreTier = KvtierTier

__all__ = [
    "HAVE_VLLM",
    "JobResult",
    "KvtierTier",
    "Locality",
    "LookupResult",
    "Medium",
    "ObjectStoreTier",
    "OffloadingEvent",
    "ReqContext",
    "RequestOffloadingContext",
    "STAT_HELP",
    "TESTED_VLLM_VERSIONS",
    "TransferJob",
    "build_tier_config",
    "derive_namespace",
    "namespace_fields",
    "interface_mismatch",
    "parse_locality",
    "vllm_version",
]
