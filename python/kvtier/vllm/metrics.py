"""kvtier's counters as vLLM metrics.

vLLM's offloading connector collects metrics per tier: the tier class declares them
(``build_metric_definitions``, before any tier exists) and each tier reports increments
(``get_stats``). kvtier declares one counter per counter of ``kvt_stats`` plus a
jobs-in-flight gauge, all labelled with the tier's ``type``.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from .._schema import stats_fields
from ._shims import OFFLOAD_MODULE

def stat_help() -> dict[str, str]:
    """kvtier's counters as vLLM metrics: counter name -> help text, both as the library
    publishes them (``kvt_stats_fields``), so no tier is needed to declare the metrics.
    ``STAT_HELP`` is the same, read on first use: importing never needs the library."""
    return dict(stats_fields())


def __getattr__(name: str):
    if name == "STAT_HELP":
        return stat_help()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
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
        for name, help_text in stat_help().items()
    }
    metrics[JOBS_IN_FLIGHT_METRIC] = base.OffloadingGaugeMetadata(
        documentation=_JOBS_IN_FLIGHT_HELP, labelnames=METRIC_LABELS
    )
    return metrics


_stats_kit: Any = None  # (the stats class, how it says counter and gauge, its sections), once


def _kit() -> Any:
    """vLLM's stats class and its payload's section and type names, looked up once; None
    for the names when this vLLM does not publish them (the payload is then built through
    the class's methods)."""
    global _stats_kit
    if _stats_kit is None:
        module = _metrics_module()
        keys, types = getattr(module, "_StatsKey", None), getattr(module, "_MetricType", None)
        names = None
        try:
            names = (keys.TYPES, keys.DATA, keys.INFO, types.COUNTER, types.GAUGE)
            # The payload built here must be the one the methods build: checked once.
            probe = module.OffloadingConnectorStats()
            probe.increase_counter("c", 2, ("t",))
            probe.set_gauge("g", 3, ("t",))
            built = module.OffloadingConnectorStats(data={
                names[0]: {"c": names[3], "g": names[4]}, names[1]: {"c": {("t",): 2}, "g": {("t",): 3}}, names[2]: None,
            })
            if probe.data != built.data:
                names = None
        except Exception:
            names = None
        _stats_kit = (module.OffloadingConnectorStats, names)
    return _stats_kit


_metric_names: dict[str, str] = {}  # counter -> its vLLM metric name


def connector_stats(grown: Mapping[str, int], jobs_in_flight: int, tier_type: str) -> Any:
    """vLLM's ``OffloadingConnectorStats`` for one report: each counter's growth, the gauge."""
    stats_class, names = _stats_kit if _stats_kit is not None else _kit()
    labels = (tier_type,)
    if names is None:
        stats = stats_class()
        for name, increment in grown.items():
            stats.increase_counter(METRIC_PREFIX + name, increment, labels)
        stats.set_gauge(JOBS_IN_FLIGHT_METRIC, jobs_in_flight, labels)
        return stats
    # The payload increase_counter and set_gauge would build, built at once.
    types_key, data_key, info_key, counter, gauge = names
    types: dict[str, str] = {}
    values: dict[str, dict] = {}
    metric_names = _metric_names
    for name, increment in grown.items():
        metric = metric_names.get(name)
        if metric is None:
            metric = metric_names[name] = METRIC_PREFIX + name
        types[metric] = counter
        values[metric] = {labels: increment}
    types[JOBS_IN_FLIGHT_METRIC] = gauge
    values[JOBS_IN_FLIGHT_METRIC] = {labels: jobs_in_flight}
    return stats_class(data={types_key: types, data_key: values, info_key: None})
