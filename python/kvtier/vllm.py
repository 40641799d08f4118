"""kvtier as a secondary tier of vLLM's tiered KV offloading.

Enable it in place of vLLM's built-in ``obj`` tier by changing two keys of the tier's
entry in ``secondary_tiers``::

    {"type": "KvtierTier", "module_path": "kvtier.vllm",
     "store_config": {"bucket": "kv", "endpoint_override": "minio:9000"}}

vLLM's factory imports ``module_path`` and takes the class named by ``type`` from it
(``getattr(module, type)``), then calls it with ``offloading_spec`` (``vllm_config`` in
older versions), ``primary_kv_view``, ``tier_type`` and every other key of the entry as a
keyword argument. The constructor takes the obj tier's keywords (``store_config``,
``prefix``, ``io_threads``, ``enable_kv_events``, ``locality``) plus ``namespace``;
any other keyword is a ``TypeError``, as in vLLM.

Behaviour, from the tiering manager's point of view, is the obj tier's (async lookups
that answer RETRY until the step after ``on_schedule_end``, verdicts shared between
requests, BlockStored events with medium STORAGE), minus its hazards: a rejected
submission never raises but yields one failed result; a failed load marks only its
failed keys MISS and reports the keys that did load in ``successful_keys``; a job is
reported only after all of its I/O is done; objects of the wrong length fail instead
of loading short; ``shutdown`` waits for I/O in progress so nothing touches the primary
pool afterwards; existence checks run on their own lane, never behind bulk transfers.

vLLM is optional: without it this module uses small stand-ins with the same field names
for vLLM's dataclasses and enums (``LookupResult``, ``JobResult``, ``OffloadingEvent``,
``Medium``, ``Locality``, ``RequestOffloadingContext``, ``TransferJob``), so it imports
and can be tested anywhere.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import itertools
import logging
import time
from typing import Any, Iterable, Mapping

from .errors import ConfigError, DuplicateJobError, KvtierError, Status, TimedOutError
from .tier import JobKind, Tier, vllm_namespace
from .tier import LookupResult as _KvtLookup

logger = logging.getLogger("kvtier.vllm")

# ---------------------------------------------------------------------------------------
# vLLM's types when vLLM is installed, stand-ins otherwise.


def _vllm_attr(name: str, *modules: str) -> Any:
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        except Exception:  # a broken vLLM install must not break this module
            logger.debug("importing %s from %s failed", name, module, exc_info=True)
    return None


_TIERING = "vllm.v1.kv_offload.tiering.base"
_OFFLOAD = "vllm.v1.kv_offload.base"

_VllmBase = _vllm_attr("SecondaryTierManager", _TIERING)
#: True when this module runs inside an installed vLLM (and subclasses its base class).
HAVE_VLLM = _VllmBase is not None


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
    transfer_size: int | None = None
    transfer_time: float | None = None


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


class _ScheduleEndContext:
    def __init__(self, new_req_ids=(), preempted_req_ids=()):
        self.new_req_ids = new_req_ids
        self.preempted_req_ids = preempted_req_ids


def _pick(name: str, fallback: Any, *modules: str) -> Any:
    found = _vllm_attr(name, *modules) if HAVE_VLLM else None
    return found if found is not None else fallback


_VllmLookupResult = _vllm_attr("LookupResult", _TIERING, _OFFLOAD) if HAVE_VLLM else None
#: vLLM before LookupResult answered lookups with True / False / None.
_LEGACY_LOOKUP = HAVE_VLLM and _VllmLookupResult is None

LookupResult = _VllmLookupResult or _LookupResult
Medium = _pick("Medium", _Medium, _OFFLOAD)
Locality = _pick("Locality", _Locality, _OFFLOAD)
JobResult = _pick("JobResult", _JobResult, _TIERING)
OffloadingEvent = _pick("OffloadingEvent", _OffloadingEvent, _OFFLOAD)
RequestOffloadingContext = _pick("RequestOffloadingContext", _RequestOffloadingContext, _TIERING, _OFFLOAD)
ReqContext = _pick("ReqContext", _ReqContext, _OFFLOAD)
TransferJob = _pick("TransferJob", _pick("JobMetadata", _TransferJob, _TIERING), _TIERING)
ScheduleEndContext = _pick("ScheduleEndContext", _ScheduleEndContext, _TIERING, _OFFLOAD)


def _factory(cls: Any):
    """A constructor taking keyword arguments and dropping those ``cls`` lacks.

    vLLM's dataclasses gained fields over time (JobResult.successful_keys,
    transfer_size; OffloadingEvent.locality); each version gets what it has.
    """
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        return lambda **kw: cls(**{k: v for k, v in kw.items() if k in names})
    return lambda **kw: cls(**kw)


_make_result = _factory(JobResult)
_make_event = _factory(OffloadingEvent)


class _StandInBase:
    """vLLM's SecondaryTierManager defaults, for use without vLLM."""

    def __init__(self, offloading_spec: Any, primary_kv_view: Any, tier_type: str) -> None:
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type

    def has_pending_work(self) -> bool:
        return False

    def take_events(self) -> Iterable:
        return ()

    def touch(self, keys, req_context) -> None:
        return None

    def serve_external_requests(self, parent) -> None:
        return None

    def on_schedule_end(self, context=None) -> None:
        return None

    def on_request_finished(self, req_context) -> None:
        return None

    def shutdown(self) -> None:
        return None

    @classmethod
    def build_metric_definitions(cls, extra_config: dict) -> dict:
        return {}

    def get_stats(self):
        return None


_Base = _VllmBase if HAVE_VLLM else _StandInBase

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
_STORE_TYPES = ("s3", "local", "memory")
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


def namespace_fields(spec: Any) -> tuple[dict, int] | None:
    """vLLM's hashed field set and rank for the obj tier, or None when not derivable.

    Uses vLLM's own FileMapper when it has ``from_offloading_spec`` (so the field set is
    exactly what the installed vLLM hashes, with ``blocks_per_file=1`` and
    ``parallel_agnostic`` requested, as the obj tier does); otherwise builds the field
    set from ``spec.config`` per vLLM's layout.
    """
    if spec is None:
        return None
    mapper_cls = _vllm_attr("FileMapper", "vllm.v1.kv_offload.file_mapper") if HAVE_VLLM else None
    if mapper_cls is not None and hasattr(mapper_cls, "from_offloading_spec"):
        try:
            mapper = mapper_cls.from_offloading_spec("", spec, parallel_agnostic=True)
            fields = mapper.get_run_config() if hasattr(mapper, "get_run_config") else dict(mapper.fields)
            return fields, int(getattr(mapper, "rank", 0))
        except Exception:
            logger.debug("vLLM's FileMapper could not map this spec", exc_info=True)
    return _fields_from_config(spec)


def derive_namespace(spec: Any) -> str | None:
    """vLLM's namespace for the obj tier (``<model>_<digest>_r<rank>``), or None."""
    derived = namespace_fields(spec)
    if derived is None:
        return None
    fields, rank = derived
    namespace = vllm_namespace(fields, rank)
    # Cross-check against the base path vLLM's own mapper computed, when there is one.
    mapper_cls = _vllm_attr("FileMapper", "vllm.v1.kv_offload.file_mapper") if HAVE_VLLM else None
    if mapper_cls is not None and hasattr(mapper_cls, "from_offloading_spec"):
        try:
            mapper = mapper_cls.from_offloading_spec("", spec, parallel_agnostic=True)
            theirs = f"{mapper.base_path.rstrip('/').rsplit('/', 1)[-1]}_r{mapper.rank}"
        except Exception:
            theirs = None
        if theirs and theirs != namespace:
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
            "blocks_per_file": 1,
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
      (``<model>_<digest>_r<rank>``, computed from the offloading spec as the obj tier
      does), so a bucket is shared with vLLM's own obj tier.
    """

    def __init__(
        self,
        offloading_spec: Any = None,
        primary_kv_view: Any = None,
        tier_type: str | None = None,
        store_config: Mapping[str, Any] | None = None,
        prefix: str = "",
        io_threads: int | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
        *,
        namespace: str | None = None,
        vllm_config: Any = None,
    ) -> None:
        spec = offloading_spec if offloading_spec is not None else vllm_config
        tier_type = tier_type or type(self).__name__
        try:
            super().__init__(spec, primary_kv_view, tier_type)
        except TypeError:  # a vLLM base with another signature
            self._offloading_spec, self._primary_kv_view, self.tier_type = spec, primary_kv_view, tier_type
        self._tier: Tier | None = None
        self._closed = False
        self._jobs: dict[int, tuple[JobKind, tuple]] = {}
        self._early: list = []  # results of jobs that never reached the library
        self._req_ids: dict[Any, int] = {}
        self._next_req_id = itertools.count(1)

        if store_config is None:
            raise TypeError(f"{type(self).__name__}() missing required argument: 'store_config'")
        if primary_kv_view is None:
            raise TypeError(f"{type(self).__name__}() missing required argument: 'primary_kv_view'")
        if not isinstance(prefix, str):
            raise TypeError("prefix must be a string")
        if io_threads is not None and (isinstance(io_threads, bool) or int(io_threads) < 1):
            raise ValueError(f"io_threads must be a positive integer, not {io_threads!r}")
        self.locality = parse_locality(locality)

        events = bool(enable_kv_events)
        if events and _events_enabled_globally(spec) is False:
            logger.warning(
                "enable_kv_events is set on secondary tier '%s' but KV cache events are "
                "disabled globally; the tier will not emit events.",
                tier_type,
            )
            events = False
        self.events_enabled = events

        if namespace is None:
            namespace = derive_namespace(spec)
            if namespace is None:
                if spec is not None:
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
            view = memoryview(primary_kv_view)
            if view.ndim != 2:
                raise ValueError(f"primary_kv_view must be 2-D (num_slots, row_bytes), not {view.ndim}-D")
            self._tier.register_memory(view)
        except BaseException:
            self._tier.close()
            self._tier = None
            raise
        self.row_bytes = self._tier.block_bytes
        self.num_slots = self._tier.num_blocks
        logger.info(
            "kvtier tier '%s': %s store, namespace %r, %d slots of %d bytes",
            tier_type,
            config["store"]["type"],
            "/".join(p for p in (prefix.strip("/"), namespace) if p),
            self.num_slots,
            self.row_bytes,
        )

    medium = Medium.STORAGE

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
            return self._answer(_KvtLookup.MISS)
        try:
            verdict = self._tier.lookup(self._req_id(req_context), key)
        except KvtierError as exc:
            logger.warning("kvtier lookup failed, answering MISS: %s", exc)
            verdict = _KvtLookup.MISS
        return self._answer(verdict)

    @staticmethod
    def _answer(verdict: _KvtLookup):
        if _LEGACY_LOOKUP:
            return {_KvtLookup.HIT: True, _KvtLookup.MISS: False}.get(verdict)
        return LookupResult[verdict.name]

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
        return None

    # -- jobs ------------------------------------------------------------------------

    def submit_store(self, job: Any) -> None:
        """Stores the job's primary slots under its keys. Never raises for a bad job."""
        self._submit(job, JobKind.STORE)

    def submit_load(self, job: Any) -> None:
        """Loads the job's keys into its primary slots. Never raises for a bad job."""
        self._submit(job, JobKind.LOAD)

    def _submit(self, job: Any, kind: JobKind) -> None:
        job_id = int(job.job_id)
        keys = tuple(job.keys)
        if job_id in self._jobs:
            # The manager never reuses a pending id; a second result would crash it.
            logger.error("job %d is already in flight; the duplicate submission is dropped", job_id)
            return
        if not keys:
            self._early.append(_make_result(job_id=job_id, success=True, transfer_size=0, transfer_time=0.0))
            return
        if self._tier is None:
            self._fail_early(job_id, "the tier is shut down")
            return
        try:
            submit = self._tier.submit_store if kind is JobKind.STORE else self._tier.submit_load
            slots = _job_slots(job)
            self._jobs[job_id] = (kind, keys)
            submit(job_id, slots, keys)
        except DuplicateJobError as exc:
            self._jobs.pop(job_id, None)
            logger.error("job %d: %s", job_id, exc)
        except KvtierError as exc:
            # Rejected by the library: its one failed result comes from the next poll.
            logger.warning("%s job %d rejected: %s", kind.name.lower(), job_id, exc)
        except Exception as exc:  # never reached the library: report the failure here
            self._jobs.pop(job_id, None)
            self._fail_early(job_id, str(exc))

    def _fail_early(self, job_id: int, why: str) -> None:
        logger.warning("job %d failed at submission: %s", job_id, why)
        self._early.append(_make_result(job_id=job_id, success=False, transfer_size=0, transfer_time=0.0))

    def get_finished_jobs(self) -> list:
        """Every job finished since the last call, each exactly once."""
        results, self._early = self._early, []
        if self._tier is None:
            return results
        for outcome in self._tier.poll():
            info = self._jobs.pop(outcome.job_id, None)
            if info is None:
                logger.error("kvtier reported job %d, which this tier did not submit", outcome.job_id)
                continue
            kind, keys = info
            successful = None
            if kind is JobKind.LOAD and not outcome.ok and len(outcome.key_status) == len(keys):
                loaded = tuple(k for k, s in zip(keys, outcome.key_status) if s == Status.OK)
                successful = loaded or None
            if not outcome.ok:
                logger.debug("%s job %d failed: %s", kind.name.lower(), outcome.job_id, outcome.message)
            results.append(
                _make_result(
                    job_id=outcome.job_id,
                    success=outcome.ok,
                    successful_keys=successful,
                    transfer_size=outcome.bytes,
                    transfer_time=outcome.seconds,
                )
            )
        return results

    get_finished = get_finished_jobs  # the name in early tiering versions

    def has_pending_work(self) -> bool:
        return False

    def take_events(self) -> list:
        """BlockStored events of successful store jobs, oldest first (empty when disabled)."""
        if self._tier is None or not self.events_enabled:
            return []
        return [
            _make_event(keys=list(e.keys), medium=Medium.STORAGE, removed=False, locality=self.locality)
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
        self._early.clear()
        self._req_ids.clear()
        if tier is not None:
            tier.close()  # cancels queued work, waits for I/O in progress, frees the handle
        self._primary_kv_view = None

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


def _job_slots(job: Any):
    for name in ("chunk_ids", "block_ids", "primary_slots"):
        slots = getattr(job, name, None)
        if slots is not None:
            return slots
    raise TypeError("the job has no chunk_ids/block_ids")


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
    "ScheduleEndContext",
    "TransferJob",
    "build_tier_config",
    "derive_namespace",
    "namespace_fields",
    "parse_locality",
]
