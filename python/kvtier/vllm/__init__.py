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

Without vLLM this package still imports, with stand-ins of vLLM 0.33's dataclasses and
enums (``LookupResult``, ``JobResult``, ``OffloadingEvent``, ``Medium``, ``Locality``,
``ReqContext``, ``RequestOffloadingContext``, ``TransferJob``) so that
:func:`build_tier_config` and the namespace helpers can be used anywhere.

The package's modules, by purpose: ``_shims`` (vLLM's types, or stand-ins, and the
interface check), ``config`` (``store_config`` -> tier configuration), ``namespace``
(vLLM's namespace from the offloading spec), ``metrics`` (kvtier's counters as vLLM
metrics) and ``adapter`` (:class:`KvtierTier`, vLLM's calls on one kvtier tier).
"""

from __future__ import annotations

from ._shims import (
    HAVE_VLLM,
    TESTED_VLLM_VERSIONS,
    JobResult,
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    ReqContext,
    RequestOffloadingContext,
    TransferJob,
    interface_mismatch,
    vllm_version,
)
from .adapter import KvtierTier, ObjectStoreTier
from .config import build_tier_config, parse_locality, tier_keys
from .metrics import CONFIG_INFO_KEYS, JOBS_IN_FLIGHT_METRIC, METRIC_LABELS, METRIC_PREFIX, stat_help
from .namespace import derive_namespace, namespace_fields


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


def __getattr__(name: str):
    # Read from the library on first use, so that importing never needs it.
    if name == "STAT_HELP":
        return stat_help()
    if name == "TIER_KEYS":
        return tier_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
