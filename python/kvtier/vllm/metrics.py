"""kvtier's counters as vLLM metrics.

vLLM's offloading connector collects metrics per tier: the tier class declares them
(``build_metric_definitions``, before any tier exists) and each tier reports increments
(``get_stats``). kvtier declares one counter per counter of ``kvt_stats`` plus a
jobs-in-flight gauge, all labelled with the tier's ``type``.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from ._shims import OFFLOAD_MODULE

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
_JOBS_IN_FLIGHT_HELP = "kvtier store and load jobs in flight."


def _metrics_module() -> Any:
    return importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics")


def metric_definitions() -> dict:
    """vLLM's metadata of every kvtier metric, by metric name."""
    base = importlib.import_module(OFFLOAD_MODULE)
    metrics = {
        METRIC_PREFIX + name: base.OffloadingCounterMetadata(documentation=help_text, labelnames=METRIC_LABELS)
        for name, help_text in STAT_HELP.items()
    }
    metrics[JOBS_IN_FLIGHT_METRIC] = base.OffloadingGaugeMetadata(
        documentation=_JOBS_IN_FLIGHT_HELP, labelnames=METRIC_LABELS
    )
    return metrics


def connector_stats(grown: Mapping[str, int], jobs_in_flight: int, tier_type: str) -> Any:
    """vLLM's ``OffloadingConnectorStats`` for one report: each counter's growth, the gauge."""
    stats = _metrics_module().OffloadingConnectorStats()
    labels = (tier_type,)
    for name, increment in grown.items():
        stats.increase_counter(METRIC_PREFIX + name, increment, labels)
    stats.set_gauge(JOBS_IN_FLIGHT_METRIC, jobs_in_flight, labels)
    return stats
