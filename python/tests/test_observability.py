"""What a tier reports to its host: Prometheus metrics and log records."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import kvtier
from kvtier import Status, Tier, _native

from support import make_key, wait_results

BLOCK = 64 * 1024




def samples(text: str) -> dict:
    """{(sample name, sorted labels): value} of an exposition text, parsed by prometheus_client."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_parse_and_match_the_counters(tmp_path):
    tier = Tier({"store": {"type": "local", "path": str(tmp_path / "store")}})
    pool = np.zeros((8, BLOCK), dtype=np.uint8)
    pool[:] = (np.arange(pool.size, dtype=np.uint64) % 251).astype(np.uint8).reshape(8, BLOCK)
    tier.register_memory(pool)
    keys = [make_key(i) for i in range(4)]
    tier.submit_store(1, [0, 1, 2, 3], keys)
    assert wait_results(tier, 1)[0].status is Status.OK
    tier.submit_load(2, [4, 5], [keys[0], make_key(99)])  # one key missing
    assert wait_results(tier, 1)[0].status is Status.NOT_FOUND

    metrics = samples(tier.metrics())
    stats = tier.stats()
    for name, value in stats.items():
        assert metrics[(f"kvtier_{name}_total", ())] == value, name
    assert stats["keys_stored"] == 4 and stats["keys_loaded"] == 1 and stats["keys_failed"] == 1
    assert metrics[("kvtier_failed_keys_total", (("status", "not_found"),))] == 1
    assert metrics[("kvtier_job_seconds_count", (("kind", "store"),))] == 1
    assert metrics[("kvtier_job_seconds_count", (("kind", "load"),))] == 1
    assert metrics[("kvtier_object_bytes_count", ())] == 5  # 4 stored + 1 loaded
    assert metrics[("kvtier_object_bytes_sum", ())] == 5 * BLOCK
    assert metrics[("kvtier_jobs_in_flight", ())] == 0
    tier.close()


def test_library_records_reach_the_kvtier_logger(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="kvtier"):
        _native.refresh_log_level()
        try:
            Tier({"store": {"type": "local", "path": str(tmp_path / "store")}}).close()
        finally:
            logging.getLogger("kvtier").setLevel(logging.NOTSET)
    ready = [r for r in caplog.records if r.name == "kvtier" and "tier ready" in r.getMessage()]
    assert ready, [r.getMessage() for r in caplog.records]
    assert ready[0].levelno == logging.INFO
    assert ready[0].target.startswith("kvtier")
    # Back at the default (WARNING): INFO records are not even formatted by the library.
    _native.refresh_log_level()
    caplog.clear()
    Tier({"store": {"type": "local", "path": str(tmp_path / "store2")}}).close()
    assert not [r for r in caplog.records if "tier ready" in r.getMessage()]
