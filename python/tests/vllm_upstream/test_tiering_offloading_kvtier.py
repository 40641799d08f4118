# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vLLM 0.33.0's TieringOffloadingManager tests, adapted with kvtier as the secondary
tiers.

Adapted from vLLM 0.33.0 ``tests/v1/kv_offload/tiering/test_tiering_offloading.py``.
vLLM's tests drive its manager with ``ExampleSecondaryTierManager`` (an in-memory,
synchronous tier); here both secondary tiers are ``kvtier.vllm.KvtierTier`` on a real
store (local directory, s3s-fs, moto), and the manager is vLLM's own, with its CPU
primary tier over a primary view the test writes as the GPU worker would.

What changes because kvtier is a real, asynchronous tier:

* A chunk "already in a secondary tier" (``tier.chunks[c] = True`` in vLLM's tests) is
  an object written to the store beforehand; a failed promotion (vLLM patches
  ``get_finished_jobs`` or ``submit_load`` to return a failed ``JobResult``) is a real
  one: the object is truncated on the store, so kvtier fails the key.
* kvtier answers a new lookup RETRY until the step after ``on_schedule_end``, so where
  vLLM's tests expect HIT_PENDING or MISS at once, these step until the answer is not
  RETRY; kvtier's jobs finish on their own time, so the tests wait for the tiers' I/O
  (``drain`` of kvtier's handle; never a sleep) before the step that processes them.
* Metrics: kvtier's resolved lookups are asynchronous, so each of them also has an
  async-delay sample where vLLM's synchronous example tier has none.
* The request-level tier (``on_new_request`` returning REQUEST_LEVEL) is kvtier's
  tier with that one method patched, as vLLM patches the example tier.
* Every test checks the bytes: what a cascade stored is read back from the store and
  compared with what the test wrote into the primary view, and what a promotion loaded
  is read out of the primary view (prepare_load) and compared with the stored object.

Short hashes: vLLM keys these tests' chunks by ``make_offload_key(str(i).encode(), 0)``
(1-2 byte hashes), and so do these tests. A libkvtier from before short hashes were
accepted makes them strict expected failures (see conftest.py); there,
``KVTIER_UPSTREAM_PAD_HASHES=1`` runs them with 4+ byte hashes to check everything else.

Left out, "manager internals, no tier involved":

* ``test_every_lookup_result_has_a_declared_cascade_behavior`` — a table of the
  manager's dispositions per LookupResult.
* ``TestTieringOffloadingWithoutSecondaryTiers::test_works_without_secondary_tiers``
* ``test_parse_tier_filter_valid`` (6 cases), ``test_parse_tier_filter_invalid_returns_all``
  (3 cases), ``test_parse_tier_filter_skips_bad_entries`` — the scheduler's parser.
* ``test_tiering_manager_reports_the_primary_series_with_no_secondary_tier``
* ``test_tiering_manager_rejects_a_primary_tier_with_two_info_mappings``
"""

import time
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
import torch
from upstream_support import (
    DEADLINE_S,
    Store,
    lookup_and_wait,
    make_offloading_config,
    to_keys,
    wait_io,
)

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingKVEventsConfig,
    OffloadKey,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TierFilter,
    TierMatcher,
)
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy
from vllm.v1.kv_offload.tiering.base import TieringOffloadingMetrics, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvtier
from kvtier.vllm import CONFIG_INFO_KEYS, METRIC_PREFIX, KvtierTier

_CTX = ReqContext(req_id="test")
_ROW_BYTES = 64
_TIER_TYPE = "KvtierTier"


def _make_spec(events: bool = True) -> SimpleNamespace:
    """The offloading spec handed to the tiers (vLLM's tests pass a MagicMock; kvtier
    derives its namespace from a real config)."""
    return SimpleNamespace(
        config=make_offloading_config(spec_name=None, cpu_bytes_to_use=None),
        blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(enable_kv_cache_events=events, self_describing_kv_events=False),
    )


def _mock_mmap_region(num_chunks: int, row_bytes: int = _ROW_BYTES):
    """Create a mock SharedOffloadRegion for testing (vLLM's helper: the region's one
    method returns a real memoryview)."""
    mock = MagicMock()
    view = memoryview(torch.zeros((num_chunks, row_bytes), dtype=torch.int8).numpy())
    mock.create_kv_memoryview.return_value = view
    return mock


def count_hits(manager, keys: list[OffloadKey], ctx: ReqContext = _CTX) -> int | None:
    """Count consecutive lookup hits from the start of keys.

    Returns the count of leading HIT results, or None if any lookup
    returns HIT_PENDING or RETRY.
    """
    count = 0
    for key in keys:
        result = manager.lookup(key, ctx)
        if result in (LookupResult.HIT_PENDING, LookupResult.RETRY):
            return None
        if result is not LookupResult.HIT:
            break
        count += 1
    return count


def histogram_count_key(metric_name: str, labelvalues: tuple[str, ...]) -> str:
    return f"{metric_name}:{labelvalues}_count"


def has_histogram_count(reduced: dict[str, int | float], metric_name: str) -> bool:
    return any(key.startswith(f"{metric_name}:") and key.endswith("_count") for key in reduced)


def _step_ctx(new_req_ids=None) -> ScheduleEndContext:
    return ScheduleEndContext(new_req_ids=new_req_ids or [], preempted_req_ids=())


class _Harness:
    """vLLM's manager with a CPU primary tier and two kvtier secondary tiers, and the
    test's hands on the primary view (the GPU worker's side) and on the stores."""

    def _build(self, store: Store, tiers: list, num_chunks: int = 5, **tier_kwargs) -> None:
        self.store1 = store
        self.store2 = Store(store.id, store.store_config, store.prefix + "-t2", root=store.root, s3=store.s3,
                            proxy=store.proxy)
        mock_region = _mock_mmap_region(num_chunks)
        self.primary_tier = CPUPrimaryTierOffloadingManager(
            num_chunks=num_chunks, mmap_region=mock_region, enable_events=True
        )
        self.view = mock_region.create_kv_memoryview()
        self.pool = np.asarray(self.view).view(np.uint8)
        spec = _make_spec(events=True)
        self.secondary_tier1 = KvtierTier(
            offloading_spec=spec, primary_kv_view=self.view, tier_type=_TIER_TYPE,
            store_config=dict(self.store1.store_config), prefix=self.store1.prefix,
            enable_kv_events=True, locality="REMOTE", **tier_kwargs,
        )
        tiers.append(self.secondary_tier1)
        self.secondary_tier2 = KvtierTier(
            offloading_spec=spec, primary_kv_view=self.view, tier_type=_TIER_TYPE,
            store_config=dict(self.store2.store_config), prefix=self.store2.prefix,
            enable_kv_events=True, locality="LOCAL", **tier_kwargs,
        )
        tiers.append(self.secondary_tier2)
        self.manager = TieringOffloadingManager(
            primary_tier=self.primary_tier,
            secondary_tiers=[self.secondary_tier1, self.secondary_tier2],
        )
        self.written: dict[OffloadKey, bytes] = {}  # what the "GPU" wrote per key
        self.seeded: dict[OffloadKey, bytes] = {}  # objects put on the store directly
        self.events: list = []
        self._rng = np.random.default_rng(7)

    # -- the scheduler's and the worker's calls ---------------------------------------

    def _simulate_on_schedule_end(self, new_req_ids: list[str] | None = None):
        """Simulate end of scheduler step: lifecycle flush + drain events."""
        self.manager.on_schedule_end(_step_ctx(new_req_ids))
        self.events.extend(self.manager.take_events())

    def _start_request(self, req_context: ReqContext = _CTX):
        if req_context.req_id not in self.manager._req_state:
            self.manager.on_new_request(req_context)

    def _prepare_store(self, keys, ctx: ReqContext = _CTX):
        """prepare_store, then the GPU->CPU copy: fresh bytes into each slot given."""
        result = self.manager.prepare_store(keys, ctx)
        if result is not None:
            for key, slot in zip(result.keys_to_store, result.store_spec.chunk_ids):
                row = self._rng.integers(0, 256, _ROW_BYTES, dtype=np.uint8)
                self.pool[int(slot)] = row
                self.written[key] = row.tobytes()
        return result

    def _tiers(self):
        return (self.secondary_tier1, self.secondary_tier2)

    def _wait_io(self):
        wait_io(*self._tiers())

    def _settle(self):
        """Steps (after waiting for the tiers' I/O) until the manager has no work."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            self._wait_io()
            self._simulate_on_schedule_end()
            if not self.manager.has_pending_work():
                return
            assert time.monotonic() < deadline, "the manager never settled"

    def _resolve(self, lookups: list[tuple[OffloadKey, ReqContext]]) -> list[LookupResult]:
        """Looks each (key, ctx) up until none answers RETRY: after each step, waits
        until both kvtier tiers have answered every asked key, so that the manager
        sees all answers in one pass (kvtier's answers to one step's checks may
        arrive over several steps on a busy machine, which would otherwise split
        the promotions vLLM's tests expect in one job into several)."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            results = [self.manager.lookup(k, c) for k, c in lookups]
            if LookupResult.RETRY not in results:
                return results
            assert time.monotonic() < deadline, "lookups never resolved"
            self._simulate_on_schedule_end()
            asked = [(k, c) for (k, c), r in zip(lookups, results) if r is LookupResult.RETRY]
            for tier in self._tiers():
                while any(tier.lookup(k, c) is LookupResult.RETRY for k, c in asked):
                    assert time.monotonic() < deadline, "kvtier never answered"
                    tier.on_schedule_end(_step_ctx())
                    self._poll_interval()

    def _poll_interval(self):
        import select

        fds = [t.tier.event_fd() for t in self._tiers() if t.tier is not None]
        select.select(fds, [], [], 0.002)

    def _finish_promotions(self):
        """Steps until no promotion is pending or in flight."""
        deadline = time.monotonic() + DEADLINE_S
        while self.manager._pending_load_submissions or any(
            j.transfer_job.is_promotion for j in self.manager._jobs.values()
        ):
            assert time.monotonic() < deadline, "promotions never finished"
            self._simulate_on_schedule_end()
            self._wait_io()
        self._simulate_on_schedule_end()

    def _read_primary(self, keys, ctx: ReqContext = _CTX) -> list[bytes]:
        """CPU->GPU load of primary HITs: the bytes of each key's slot."""
        spec = self.manager.prepare_load(keys, ctx)
        rows = [self.pool[int(slot)].tobytes() for slot in spec.chunk_ids]
        self.manager.complete_load(keys, ctx)
        return rows

    # -- the stores ---------------------------------------------------------------------

    def _seed(self, keys, tier_idx: int = 1):
        """Puts chunks into a secondary tier's store directly (a previous cascade)."""
        tier, store = self._tier_store(tier_idx)
        for key in keys:
            data = self._rng.integers(0, 256, _ROW_BYTES, dtype=np.uint8).tobytes()
            store.write(tier.namespace, key, data)
            self.seeded[key] = data

    def _tier_store(self, tier_idx: int):
        return (self.secondary_tier1, self.store1) if tier_idx == 1 else (self.secondary_tier2, self.store2)

    def _assert_cascaded(self, keys, tier_idxs=(1, 2)):
        """The objects of ``keys`` hold exactly what the GPU wrote for them."""
        for i in tier_idxs:
            tier, store = self._tier_store(i)
            for key in keys:
                assert store.read(tier.namespace, key) == self.written[key], f"tier {i}: {key!r}"

    def _assert_not_stored(self, keys, tier_idxs=(1, 2)):
        for i in tier_idxs:
            tier, store = self._tier_store(i)
            for key in keys:
                assert store.read(tier.namespace, key) is None

    def _assert_promoted(self, keys, ctx: ReqContext = _CTX):
        """``keys`` are primary HITs whose bytes are the stored objects'."""
        assert [self.primary_tier.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * len(keys)
        assert self._read_primary(keys, ctx) == [self.seeded[k] for k in keys]

    def _stores_empty(self):
        assert self.store1.names() == []
        assert self.store2.names() == []


# ---------------------------------------------------------------------------------------
# Tier metrics through vLLM's spec and manager


def _spec_config(store: Store, entries: list[dict] | None = None, **kwargs):
    entries = entries if entries is not None else [
        {"type": _TIER_TYPE, "module_path": "kvtier.vllm", "store_config": dict(store.store_config),
         "prefix": store.prefix}
    ]
    return make_offloading_config(
        spec_name="TieringOffloadingSpec",
        cpu_bytes_to_use=4096 * 16,
        worker_kv_bytes_per_block=4096,
        extra_config={"secondary_tiers": entries},
        **kwargs,
    )


def _engine_roundtrip(manager, keys, stores_and_tiers) -> None:
    """Through a spec-built manager: the GPU writes ``keys`` to the primary tier, the
    cascade stores them (objects read back), the primary is reset, and the keys come
    back by promotion with the same bytes."""
    view = manager.primary_tier.get_kv_memoryview()
    pool = np.asarray(view).view(np.uint8)
    rng = np.random.default_rng(11)
    ctx = ReqContext(req_id="engine-store")
    manager.on_new_request(ctx)
    out = manager.prepare_store(keys, ctx)
    written = {}
    for key, slot in zip(out.keys_to_store, out.store_spec.chunk_ids):
        pool[int(slot)] = rng.integers(0, 256, pool.shape[1], dtype=np.uint8)
        written[key] = pool[int(slot)].tobytes()
    manager.complete_store(list(out.keys_to_store), ctx, success=True)
    manager.on_request_finished(ctx)
    deadline = time.monotonic() + DEADLINE_S
    while manager.has_pending_work():
        assert time.monotonic() < deadline
        wait_io(*manager.secondary_tiers)
        manager.on_schedule_end(_step_ctx())
    for store, tier in stores_and_tiers:
        for key in keys:
            assert store.read(tier.namespace, key) == written[key]
    manager.reset_cache()
    manager.on_reset_flushed()
    ctx = ReqContext(req_id="engine-load")
    manager.on_new_request(ctx)
    verdicts: dict = {}
    while len(verdicts) < len(keys):
        assert time.monotonic() < deadline, "promotions never finished"
        for key in keys:
            if key not in verdicts:
                v = manager.lookup(key, ctx)
                if v in (LookupResult.HIT, LookupResult.MISS):
                    verdicts[key] = v
        manager.on_schedule_end(_step_ctx())
        wait_io(*manager.secondary_tiers)
    assert list(verdicts.values()) == [LookupResult.HIT] * len(keys)
    spec = manager.prepare_load(keys, ctx)
    assert [pool[int(s)].tobytes() for s in spec.chunk_ids] == [written[k] for k in keys]
    manager.complete_load(keys, ctx)


@pytest.mark.short_hashes
def test_tiering_spec_collects_secondary_metric_definitions(kv_store):
    """The spec collects kvtier's metric definitions next to its own, and a manager
    built from that spec moves bytes through kvtier."""
    config = _spec_config(kv_store)
    metrics = TieringOffloadingSpec.build_metric_definitions(config.extra_config)

    metadata = metrics[METRIC_PREFIX + "bytes_stored"]
    assert isinstance(metadata, OffloadingCounterMetadata)
    assert metadata.documentation == dict(kvtier.stats_fields())["bytes_stored"]
    assert metadata.labelnames == ("tier",)
    assert isinstance(metrics[METRIC_PREFIX + "jobs_in_flight"], OffloadingGaugeMetadata)
    assert metrics[TieringOffloadingMetrics.CHUNK_QUERIES].labelnames == ("tier",)
    assert metrics[TieringOffloadingMetrics.LOOKUP_SYNC_DELAY].labelnames == ("tier",)
    assert metrics[TieringOffloadingMetrics.LOOKUP_ASYNC_DELAY].labelnames == ("tier",)
    assert metrics[TieringOffloadingMetrics.PROMOTION_JOB_FAILURES].labelnames == ("tier",)
    assert isinstance(
        metrics[TieringOffloadingMetrics.PROMOTION_ALLOCATION_FAILURES],
        OffloadingCounterMetadata,
    )
    for metric_name in (
        TieringOffloadingMetrics.PRIMARY_WRITE_USAGE_PERC,
        TieringOffloadingMetrics.PRIMARY_READ_USAGE_PERC,
        TieringOffloadingMetrics.ACTIVE_PROMOTION_JOBS,
        TieringOffloadingMetrics.ACTIVE_CASCADE_JOBS,
    ):
        assert isinstance(metrics[metric_name], OffloadingGaugeMetadata)
        assert metrics[metric_name].labelnames == ("tier",)

    spec = TieringOffloadingSpec(config)
    manager = spec.get_manager()
    try:
        (tier,) = manager.secondary_tiers
        _engine_roundtrip(manager, to_keys(range(3)), [(kv_store, tier)])
        # Every kvtier metric the tier reports is one the spec declared.
        stats = manager.get_stats()
        kvtier_names = {n for n in stats.data["data"] if n.startswith(METRIC_PREFIX)}
        assert kvtier_names and kvtier_names <= set(metrics)
    finally:
        manager.shutdown()


@pytest.mark.short_hashes
def test_tiering_manager_aggregates_secondary_stats(kv_store, tiers):
    h = _Harness()
    h._build(kv_store, tiers)
    chunks = to_keys(range(3))
    h._start_request()
    h._prepare_store(chunks, _CTX)
    h.manager.complete_store(chunks, _CTX, success=True)
    h._settle()
    h._assert_cascaded(chunks)

    stats = h.manager.get_stats()

    assert stats is not None
    data = stats.data["data"]
    assert data[METRIC_PREFIX + "keys_stored"][(_TIER_TYPE,)] == 6  # both tiers carry one label value
    assert data[METRIC_PREFIX + "bytes_stored"][(_TIER_TYPE,)] == 6 * _ROW_BYTES

    # The primary tier's cache-usage gauge is always reported, so get_stats()
    # never returns None, but the secondary tiers have nothing new to report
    # once their stats have been consumed.
    second_stats = h.manager.get_stats()
    assert second_stats is not None
    assert METRIC_PREFIX + "keys_stored" not in second_stats.data["data"]
    assert METRIC_PREFIX + "bytes_stored" not in second_stats.data["data"]


@pytest.mark.short_hashes
class TestExampleSecondaryTierManager:
    """vLLM's tests of its example tier's own methods, on kvtier's tier."""

    def _tier(self, kv_store, tiers):
        view = memoryview(torch.randint(-128, 127, (10, 16), dtype=torch.int8).numpy())
        tier = KvtierTier(
            offloading_spec=_make_spec(), primary_kv_view=view, tier_type="KvtierTier",
            store_config=dict(kv_store.store_config), prefix=kv_store.prefix,
        )
        tiers.append(tier)
        return tier, view

    def test_basic_store_and_lookup(self, kv_store, tiers):
        """Test basic store and lookup operations."""
        tier, view = self._tier(kv_store, tiers)

        # Initially empty
        chunks = to_keys(range(3))
        assert lookup_and_wait(tier, [chunks[0]], _CTX) == [LookupResult.MISS]

        # Store chunks (a real store job of rows 0 and 1)
        tier.submit_store(TransferJob(job_id=1, keys=chunks[:2], chunk_ids=np.array([0, 1], dtype=np.int32),
                                      is_promotion=False, req_context=_CTX))
        wait_io(tier)
        assert [r.success for r in tier.get_finished_jobs()] == [True]
        for i in (0, 1):
            assert kv_store.read(tier.namespace, chunks[i]) == np.asarray(view)[i].tobytes()

        # Lookup should find first two chunks, the third is not present. (A
        # verdict is shared by the requests that hold it, as in vLLM's obj tier:
        # the first request's MISS is dropped when it finishes.)
        tier.on_request_finished(_CTX)
        ctx = ReqContext(req_id="after-store")
        assert lookup_and_wait(tier, chunks, ctx) == [LookupResult.HIT, LookupResult.HIT, LookupResult.MISS]

    def test_config_info_keys_match_the_filled_values(self, kv_store, tiers):
        """A name the declaration misses becomes a dropped label at runtime."""
        tier, _ = self._tier(kv_store, tiers)
        info = tier.config_info()
        assert tuple(info) == KvtierTier.config_info_keys({})
        assert info["kvtier_store"] == ("s3" if kv_store.is_s3 else "local")
        assert kv_store.prefix in info["kvtier_location"]
        assert tier.namespace in info["kvtier_location"]
        secret = kv_store.store_config.get("secret_key")
        assert not secret or all(secret not in str(v) for v in info.values())
        # The location named is where the objects go.
        chunk = to_keys([5])[0]
        tier.submit_store(TransferJob(job_id=1, keys=[chunk], chunk_ids=np.array([2], dtype=np.int32),
                                      is_promotion=False, req_context=_CTX))
        wait_io(tier)
        assert [r.success for r in tier.get_finished_jobs()] == [True]
        (name,) = kv_store.names()
        objects = f"{kv_store.prefix}/{tier.namespace}"
        assert objects + "/" in info["kvtier_location"]
        assert name.startswith(objects + "/")
        assert kv_store.read(tier.namespace, chunk) == np.asarray(tier._primary_kv_view)[2].tobytes()


@pytest.mark.short_hashes
class TestTieringOffloadingManager(_Harness):
    """Tests for TieringOffloadingManager, with two kvtier secondary tiers."""

    @pytest.fixture
    def manager_setup(self, kv_store, tiers):
        self._build(kv_store, tiers)

    def test_failed_promotion_finalizes_primary_with_failure(self, manager_setup, monkeypatch):
        """A failed promotion still finalizes the primary slots with success=False;
        here kvtier fails it for real (both objects are short)."""
        keys = to_keys([1, 2])
        self._seed(keys)
        for key in keys:
            self.store1.truncate(self.secondary_tier1.namespace, key)
        self._start_request()
        completed = MagicMock(wraps=self.primary_tier.complete_write)
        monkeypatch.setattr(self.primary_tier, "complete_write", completed)

        assert self._resolve([(k, _CTX) for k in keys]) == [LookupResult.HIT_PENDING] * 2
        self._finish_promotions()

        completed.assert_called_once_with(keys, _CTX, False)
        assert [self.primary_tier.lookup(k, _CTX) for k in keys] == [LookupResult.MISS] * 2
        assert self.secondary_tier1.kvtier_stats()["keys_failed"] == 2

    def test_successful_promotion_finalizes_primary_with_success(self, manager_setup, monkeypatch):
        keys = to_keys([1])
        self._seed(keys)
        self._start_request()
        completed = MagicMock(wraps=self.primary_tier.complete_write)
        monkeypatch.setattr(self.primary_tier, "complete_write", completed)

        assert self._resolve([(keys[0], _CTX)]) == [LookupResult.HIT_PENDING]
        self._finish_promotions()

        completed.assert_called_once_with(keys, _CTX, True)
        self._assert_promoted(keys)

    def test_take_events_aggregates_tier_owned_events(self, manager_setup, monkeypatch):
        """One take_events() returns the primary tier's events, then tier 1's, then
        tier 2's — all real: a stored chunk in the primary tier and the two cascades."""
        chunks = to_keys([1])
        self._start_request()
        self._prepare_store(chunks)
        self.manager.complete_store(chunks, _CTX, success=True)
        self._wait_io()
        # Process the cascade completions without taking the events.
        self.manager.on_schedule_end(_step_ctx())
        self.manager.on_schedule_end(_step_ctx())
        assert not self.manager.has_pending_work()

        primary_take_events = MagicMock(wraps=self.primary_tier.take_events)
        tier1_take_events = MagicMock(wraps=self.secondary_tier1.take_events)
        tier2_take_events = MagicMock(wraps=self.secondary_tier2.take_events)
        monkeypatch.setattr(self.primary_tier, "take_events", primary_take_events)
        monkeypatch.setattr(self.secondary_tier1, "take_events", tier1_take_events)
        monkeypatch.setattr(self.secondary_tier2, "take_events", tier2_take_events)

        events = list(self.manager.take_events())
        assert [(e.keys, e.medium, e.locality, e.removed) for e in events] == [
            (chunks, Medium.CPU, None, False),
            (chunks, Medium.STORAGE, Locality.REMOTE, False),
            (chunks, Medium.STORAGE, Locality.LOCAL, False),
        ]
        primary_take_events.assert_called_once_with()
        tier1_take_events.assert_called_once_with()
        tier2_take_events.assert_called_once_with()
        self._assert_cascaded(chunks)

    def test_basic_store_to_primary(self, manager_setup):
        """Test basic store operation to primary tier."""
        chunks = to_keys(range(3))

        # Prepare store
        self._start_request()
        result = self._prepare_store(chunks, _CTX)
        assert result is not None
        assert len(result.keys_to_store) == 3

        # Complete store
        self.manager.complete_store(chunks, _CTX, success=True)

        # Chunks should be in primary tier
        assert count_hits(self.primary_tier, chunks) == 3
        assert self._read_primary(chunks) == [self.written[c] for c in chunks]
        self._settle()
        self._assert_cascaded(chunks)

    def test_cascade_to_all_secondary_tiers(self, manager_setup, monkeypatch):
        """Test that chunks are cascaded to ALL secondary tiers."""
        chunks = to_keys(range(3))

        tier1_submit_store = MagicMock(wraps=self.secondary_tier1.submit_store)
        tier2_submit_store = MagicMock(wraps=self.secondary_tier2.submit_store)
        monkeypatch.setattr(self.secondary_tier1, "submit_store", tier1_submit_store)
        monkeypatch.setattr(self.secondary_tier2, "submit_store", tier2_submit_store)

        # Store to primary
        self._start_request()
        result = self._prepare_store(chunks, _CTX)
        assert result is not None

        # Complete store (triggers cascade via submit_store on each tier)
        self.manager.complete_store(chunks, _CTX, success=True)

        # submit_store was called once per secondary tier
        tier1_submit_store.assert_called_once()
        tier2_submit_store.assert_called_once()

        # Chunks should be in both secondary tiers, with the bytes written
        self._settle()
        self._assert_cascaded(chunks)
        assert len(self.store1.names()) == 3
        assert len(self.store2.names()) == 3

        # Verify chunks are present
        ctx = ReqContext(req_id="verify")
        assert lookup_and_wait(self.secondary_tier1, chunks, ctx) == [LookupResult.HIT] * 3
        assert lookup_and_wait(self.secondary_tier2, chunks, ctx) == [LookupResult.HIT] * 3

    def test_ref_cnt_protection_during_cascade(self, manager_setup):
        """Test that ref_cnt protects chunks during cascade."""
        chunks = to_keys(range(3))

        # Store to primary
        self._start_request()
        result = self._prepare_store(chunks, _CTX)
        assert result is not None
        self.manager.complete_store(chunks, _CTX, success=True)

        # After complete_store, chunks should have ref_cnt 2 (one per secondary tier)
        for key in chunks:
            chunk = self.primary_tier._policy.get(key)
            assert chunk is not None
            assert chunk.ref_cnt == 2

        # End of step 1: prepare_store() above already polled this step, so
        # on_schedule_end() does NOT poll get_finished_jobs() again.
        self._wait_io()
        self._simulate_on_schedule_end()

        # ref_cnt still held: kvtier finished the cascades, but they have not
        # been polled yet because the per-step guard skipped the second call.
        for key in chunks:
            chunk = self.primary_tier._policy.get(key)
            assert chunk is not None
            assert chunk.ref_cnt == 2

        # Secondary tiers have completed jobs waiting to be drained
        for tier in self._tiers():
            assert tier.tier.jobs_in_flight() == 0
            assert tier.has_pending_work()
        self._assert_cascaded(chunks)

        # End of step 2: the flag was reset, so the completions are processed
        self._simulate_on_schedule_end()

        # After cascade completes, ref_cnt should be 0
        for key in chunks:
            chunk = self.primary_tier._policy.get(key)
            assert chunk is not None
            assert chunk.ref_cnt == 0

        # All completed jobs have been drained
        assert not self.secondary_tier1.has_pending_work()
        assert not self.secondary_tier2.has_pending_work()

    def test_lookup_from_primary(self, manager_setup):
        """Test lookup when chunks are in primary tier."""
        chunks = to_keys(range(3))

        # Store chunks
        self._start_request()
        self._prepare_store(chunks, _CTX)
        self.manager.complete_store(chunks, _CTX, success=True)

        # Lookup should find all chunks in primary (no tier is asked)
        checks = [t.kvtier_stats()["existence_checks"] for t in self._tiers()]
        assert count_hits(self.manager, chunks) == 3
        assert self._read_primary(chunks) == [self.written[c] for c in chunks]
        self._settle()
        assert [t.kvtier_stats()["existence_checks"] for t in self._tiers()] == checks
        self._assert_cascaded(chunks)

    @pytest.mark.parametrize(
        "source",
        [CacheHitSource.EXTERNAL_UNSPECIFIED, CacheHitSource.DISK, CacheHitSource.P2P],
    )
    def test_promotion_from_secondary(self, manager_setup, monkeypatch, source):
        """Test promotion of chunks from secondary to primary tier."""
        monkeypatch.setattr(KvtierTier, "cache_hit_source", source)
        chunks = to_keys(range(3))

        # Put chunks into tier 1's store (simulate previous cascade)
        self._seed(chunks)

        original_submit_load = self.secondary_tier1.submit_load

        def submit_load(job_metadata):
            assert job_metadata.job_id in self.manager._jobs
            original_submit_load(job_metadata)

        monkeypatch.setattr(self.secondary_tier1, "submit_load", submit_load)

        # Lookup each chunk to initiate promotion for all of them
        assert self._resolve([(c, _CTX) for c in chunks]) == [LookupResult.HIT_PENDING] * 3

        # End of step 1: flushes deferred submit_load() calls
        self._simulate_on_schedule_end()

        # End of step 2 (once kvtier loaded): processes the completed promotion job
        self._wait_io()
        self._simulate_on_schedule_end()

        stats = self.manager.get_stats()
        assert stats is not None
        reduced = stats.reduce()
        assert (
            reduced[
                histogram_count_key(
                    TieringOffloadingMetrics.PROMOTION_LATENCY,
                    ("1:KvtierTier", "success"),
                )
            ]
            == 1
        )

        # Now chunks should be in primary tier, with the stored bytes
        assert count_hits(self.primary_tier, chunks) == 3

        # Next lookup should succeed
        assert count_hits(self.manager, chunks) == 3
        self._assert_promoted(chunks)

        # The request that caused the promotion retains the secondary origin.
        assert all(self.manager.get_load_source(chunk, _CTX) == source for chunk in chunks)

        # A later request sees the chunks as ordinary host-memory primary hits.
        later_context = ReqContext(req_id="later")
        self.manager.on_new_request(later_context)
        assert all(self.manager.lookup(chunk, later_context) is LookupResult.HIT for chunk in chunks)
        assert all(self.manager.get_load_source(chunk, later_context) == "host" for chunk in chunks)

    @pytest.mark.parametrize(
        "source",
        [CacheHitSource.EXTERNAL_UNSPECIFIED, CacheHitSource.DISK, CacheHitSource.P2P],
    )
    @pytest.mark.parametrize(
        ("failed_indices", "expected_results"),
        [
            (
                (1,),
                [LookupResult.HIT, LookupResult.MISS, LookupResult.HIT],
            ),
            (
                (0, 1, 2),
                [LookupResult.MISS, LookupResult.MISS, LookupResult.MISS],
            ),
        ],
        ids=["partial", "legacy-full-failure"],
    )
    def test_failed_promotion_keeps_only_successful_chunks(
        self, manager_setup, monkeypatch, source, failed_indices, expected_results
    ):
        """kvtier loads what it can: a truncated object fails its key only
        (successful_keys names the others); when every key fails, successful_keys is
        None (vLLM's "legacy" full failure)."""
        monkeypatch.setattr(KvtierTier, "cache_hit_source", source)
        chunks = to_keys(range(3))
        self._seed(chunks)
        for i in failed_indices:
            self.store1.truncate(self.secondary_tier1.namespace, chunks[i])
        results = []
        real_get_finished = self.secondary_tier1.get_finished_jobs

        def get_finished_jobs():
            out = list(real_get_finished())
            results.extend(out)
            return out

        monkeypatch.setattr(self.secondary_tier1, "get_finished_jobs", get_finished_jobs)

        assert self._resolve([(c, _CTX) for c in chunks]) == [LookupResult.HIT_PENDING] * 3

        self._simulate_on_schedule_end()
        self._wait_io()
        self._simulate_on_schedule_end()

        (result,) = results
        assert not result.success
        ok = [c for i, c in enumerate(chunks) if i not in failed_indices]
        assert (set(result.successful_keys) if result.successful_keys is not None else None) == (set(ok) or None)
        assert [self.primary_tier.lookup(chunk, _CTX) for chunk in chunks] == expected_results
        assert set(self.manager._request_load_sources[_CTX.req_id]) == set(ok)
        if ok:
            self._assert_promoted(ok)

    def test_lookup_reports_sync_delay_for_resolved_lookups(self, manager_setup):
        """Resolved lookups report one sync delay sample per tier and chunk. kvtier
        answers RETRY first, so its resolved lookups also carry an async delay."""
        self._start_request()
        chunks = to_keys(range(2))

        # No tier has these chunks: they resolve as misses once kvtier answered.
        assert self._resolve([(c, _CTX) for c in chunks]) == [LookupResult.MISS] * 2

        stats = self.manager.get_stats()
        assert stats is not None
        reduced = stats.reduce()
        assert reduced[histogram_count_key(TieringOffloadingMetrics.LOOKUP_SYNC_DELAY, ("0:primary",))] == 2
        for label in ("1:KvtierTier", "2:KvtierTier"):
            assert reduced[histogram_count_key(TieringOffloadingMetrics.LOOKUP_SYNC_DELAY, (label,))] == 2
            assert reduced[histogram_count_key(TieringOffloadingMetrics.LOOKUP_ASYNC_DELAY, (label,))] == 2
        assert not has_histogram_count(
            {k: v for k, v in reduced.items() if "0:primary" in k}, TieringOffloadingMetrics.LOOKUP_ASYNC_DELAY
        )
        # Each tier asked its store about each chunk, and found nothing.
        for tier in self._tiers():
            assert tier.kvtier_stats()["existence_checks"] == 2
        self._stores_empty()

    def test_lookup_does_not_report_async_delay_for_promotion(self, manager_setup):
        """Promotion time is not included in lookup async delay."""
        self._start_request()
        chunk = to_keys(range(1))[0]
        self._seed([chunk])

        # The lookup finds the chunk in tier 1 (after kvtier's RETRY) and defers.
        assert self._resolve([(chunk, _CTX)]) == [LookupResult.HIT_PENDING]

        # Promotion is submitted; only the lookup's own resolution was observed.
        self._simulate_on_schedule_end(new_req_ids=[_CTX.req_id])
        stats = self.manager.get_stats()
        assert stats is not None
        reduced = stats.reduce()
        assert reduced[histogram_count_key(TieringOffloadingMetrics.LOOKUP_SYNC_DELAY, ("0:primary",))] == 1
        assert reduced[histogram_count_key(TieringOffloadingMetrics.LOOKUP_SYNC_DELAY, ("1:KvtierTier",))] == 1
        assert reduced[histogram_count_key(TieringOffloadingMetrics.LOOKUP_ASYNC_DELAY, ("1:KvtierTier",))] == 1

        # Promotion completes on a later scheduler step.
        self._wait_io()
        self._simulate_on_schedule_end()

        # Next lookup resolves via the now-promoted primary-tier chunk.
        assert self.manager.lookup(chunk, _CTX) is LookupResult.HIT
        self._assert_promoted([chunk])

        stats = self.manager.get_stats()
        if stats is not None:
            assert not has_histogram_count(stats.reduce(), TieringOffloadingMetrics.LOOKUP_ASYNC_DELAY)

    def test_lookup_reports_async_delay_when_deferred_lookup_resolves(self, manager_setup):
        """Async delay is observed when a RETRY lookup later resolves (kvtier's
        RETRY, then its HIT)."""
        ctx = ReqContext(req_id="req_lookup_finish")
        self._start_request(ctx)
        chunk = to_keys(range(1))[0]
        self._seed([chunk])

        # First lookup is deferred by the secondary tiers.
        assert self.manager.lookup(chunk, ctx) is LookupResult.RETRY

        stats = self.manager.get_stats()
        if stats is not None:
            assert not has_histogram_count(stats.reduce(), TieringOffloadingMetrics.LOOKUP_ASYNC_DELAY)

        self._simulate_on_schedule_end()
        assert self._resolve([(chunk, ctx)]) == [LookupResult.HIT_PENDING]

        stats = self.manager.get_stats()
        assert stats is not None
        reduced = stats.reduce()
        assert reduced[histogram_count_key(TieringOffloadingMetrics.LOOKUP_SYNC_DELAY, ("1:KvtierTier",))] == 1
        assert reduced[histogram_count_key(TieringOffloadingMetrics.LOOKUP_ASYNC_DELAY, ("1:KvtierTier",))] == 1
        self._finish_promotions()
        self._assert_promoted([chunk], ctx)

    def test_partial_lookup(self, manager_setup):
        """Test lookup with partial hits."""
        chunks = to_keys(range(5))

        # Store first 3 chunks to primary
        self._start_request()
        self._prepare_store(chunks[:3], _CTX)
        self.manager.complete_store(chunks[:3], _CTX, success=True)

        # Lookup all 5 chunks should return 3 (first 3 found; the 4th is a MISS
        # once the kvtier tiers answered)
        deadline = time.monotonic() + DEADLINE_S
        while (hits := count_hits(self.manager, chunks)) is None:
            assert time.monotonic() < deadline
            self._simulate_on_schedule_end()
            self._poll_interval()
        assert hits == 3
        self._settle()
        self._assert_cascaded(chunks[:3])
        self._assert_not_stored(chunks[3:])

    def test_eviction_in_primary_tier(self, manager_setup):
        """Test eviction in primary tier when capacity is exceeded."""
        # Primary tier has capacity of 5 chunks
        chunks = to_keys(range(5))
        self._start_request()
        result = self._prepare_store(chunks, _CTX)
        assert result is not None
        assert len(result.keys_to_store) == 5
        self.manager.complete_store(chunks, _CTX, success=True)

        # End of step: once kvtier finished the cascades, their ref_cnt is released
        self._wait_io()
        self._simulate_on_schedule_end()

        # Now try to store 2 more chunks (should trigger eviction)
        more_chunks = to_keys(range(5, 7))
        result = self._prepare_store(more_chunks, _CTX)

        # Should evict 2 chunks from primary tier
        assert result is not None
        assert len(result.evicted_keys) == 2
        assert len(result.keys_to_store) == 2
        # The evicted chunks live on in the secondary tiers.
        self._assert_cascaded(result.evicted_keys)

    def test_touch_propagates_to_all_tiers(self, manager_setup, monkeypatch):
        """Test that touch() propagates to all tiers."""
        chunks = to_keys(range(3))

        # Store chunks
        self._start_request()
        self._prepare_store(chunks, _CTX)
        self.manager.complete_store(chunks, _CTX, success=True)
        # for secondary tiers to drain jobs, so primary tier's chunks are evictable.
        self._settle()

        tier1_touch = MagicMock(wraps=self.secondary_tier1.touch)
        tier2_touch = MagicMock(wraps=self.secondary_tier2.touch)
        monkeypatch.setattr(self.secondary_tier1, "touch", tier1_touch)
        monkeypatch.setattr(self.secondary_tier2, "touch", tier2_touch)

        # Touch chunks
        self.manager.touch(chunks, _CTX)

        # Verify touch was called on the primary tier (head is most recent).
        policy = self.primary_tier._policy
        assert isinstance(policy, LRUCachePolicy)
        ranks = policy._ranks
        assert ranks[chunks[2]] < ranks[chunks[1]] < ranks[chunks[0]]

        # Verify touch was propagated to all secondary tiers
        tier1_touch.assert_called_once_with(chunks, _CTX)
        tier2_touch.assert_called_once_with(chunks, _CTX)
        self._assert_cascaded(chunks)

    def test_request_order_survives_late_cascade_completion(self, manager_setup):
        """Cascade completion must not replace request order with I/O order."""
        chunks = to_keys(range(5))
        self._start_request()
        output = self._prepare_store(chunks, _CTX)
        assert output is not None
        self.manager.complete_store(chunks, _CTX, success=True)

        # Finalize while both kvtier cascades still pin primary chunks.
        self.manager.on_request_finished(_CTX)
        self._settle()

        evict_ctx = ReqContext(req_id="evict")
        self._start_request(evict_ctx)
        output = self._prepare_store(to_keys([5]), evict_ctx)
        assert output is not None
        assert output.evicted_keys == [chunks[-1]]
        self._assert_cascaded(chunks)

    def test_late_old_store_submission_does_not_override_newer_request_order(self, manager_setup):
        """Cascade submission after finish is not a new primary access."""
        old_blocks = to_keys(range(2))
        old_ctx = ReqContext(req_id="old")
        self._start_request(old_ctx)
        assert self._prepare_store(old_blocks, old_ctx) is not None
        self.manager.on_request_finished(old_ctx)

        new_blocks = to_keys(range(2, 5))
        new_ctx = ReqContext(req_id="new")
        self._start_request(new_ctx)
        assert self._prepare_store(new_blocks, new_ctx) is not None
        self.manager.complete_store(new_blocks, new_ctx, success=True)
        self.manager.on_request_finished(new_ctx)

        # The old GPU->primary write lands after the newer request finished.
        # Its cascade pins must not turn it into the more recent request.
        self.manager.complete_store(old_blocks, old_ctx, success=True)
        self._settle()

        evict_ctx = ReqContext(req_id="evict")
        self._start_request(evict_ctx)
        output = self._prepare_store(to_keys([5]), evict_ctx)
        assert output is not None
        assert output.evicted_keys == [old_blocks[-1]]
        self._assert_cascaded(old_blocks + new_blocks)

    @pytest.mark.tier_sees_no_keys
    def test_failed_store_no_cascade(self, manager_setup, monkeypatch):
        """Test that failed GPU→primary store doesn't cascade."""
        chunks = to_keys(range(3))

        tier1_submit_store = MagicMock(wraps=self.secondary_tier1.submit_store)
        tier2_submit_store = MagicMock(wraps=self.secondary_tier2.submit_store)
        monkeypatch.setattr(self.secondary_tier1, "submit_store", tier1_submit_store)
        monkeypatch.setattr(self.secondary_tier2, "submit_store", tier2_submit_store)

        # Prepare store
        self._start_request()
        result = self._prepare_store(chunks, _CTX)
        assert result is not None

        # Complete store with failure — cascade must not happen
        self.manager.complete_store(chunks, _CTX, success=False)

        # submit_store was never called on either secondary tier
        tier1_submit_store.assert_not_called()
        tier2_submit_store.assert_not_called()
        self._settle()
        self._stores_empty()

    def test_held_promotions_keep_primary_hits(self, manager_setup):
        chunks = to_keys(range(2))
        self._start_request()
        self._prepare_store(chunks[:1], _CTX)
        self.manager.complete_store(chunks[:1], _CTX, success=True)
        self._seed(chunks[1:])

        self.manager._promotions_held = True

        assert self.manager.lookup(chunks[0], _CTX) is LookupResult.HIT
        assert self.manager.lookup(chunks[1], _CTX) is LookupResult.MISS
        assert self._read_primary(chunks[:1]) == [self.written[chunks[0]]]

        # Released, the held chunk comes back from kvtier.
        self.manager._promotions_held = False
        assert self._resolve([(chunks[1], _CTX)]) == [LookupResult.HIT_PENDING]
        self._finish_promotions()
        self._assert_promoted(chunks[1:])

    def test_reset_holds_promotions_until_flushed(self, manager_setup):
        chunk = to_keys(range(1))[0]
        self._start_request()
        self._seed([chunk])

        self.manager.reset_cache()
        assert self.manager.lookup(chunk, _CTX) is LookupResult.MISS

        self.manager.on_reset_flushed()
        assert self.manager.lookup(chunk, _CTX) is not LookupResult.MISS
        assert self._resolve([(chunk, _CTX)]) == [LookupResult.HIT_PENDING]
        self._finish_promotions()
        self._assert_promoted([chunk])

    def test_lookup_batches_submit_load_per_request(self, manager_setup, monkeypatch):
        """lookup() defers submit_load until on_schedule_end(), one per request.

        Chunks from different requests each get their own submit_load call, each
        carrying the correct req_context.
        """
        chunks = to_keys(range(4))
        self._seed(chunks)

        tier1_submit_load = MagicMock(wraps=self.secondary_tier1.submit_load)
        monkeypatch.setattr(self.secondary_tier1, "submit_load", tier1_submit_load)

        ctx_a = ReqContext(req_id="req_a")
        ctx_b = ReqContext(req_id="req_b")

        # All lookups end in HIT_PENDING: a secondary hit triggers promotion
        assert self._resolve(
            [(chunks[0], ctx_a), (chunks[1], ctx_a), (chunks[2], ctx_b), (chunks[3], ctx_b)]
        ) == [LookupResult.HIT_PENDING] * 4

        # submit_load must not fire during lookup - only at end of step
        tier1_submit_load.assert_not_called()

        # simulate end of step
        self._simulate_on_schedule_end()

        assert tier1_submit_load.call_count == 2
        calls = tier1_submit_load.call_args_list
        jm_a = calls[0].args[0]
        jm_b = calls[1].args[0]
        assert set(jm_a.keys) == {chunks[0], chunks[1]}
        assert jm_a.req_context is ctx_a
        assert set(jm_b.keys) == {chunks[2], chunks[3]}
        assert jm_b.req_context is ctx_b

        self._finish_promotions()
        self._assert_promoted(chunks[:2], ctx_a)
        self._assert_promoted(chunks[2:], ctx_b)

    def test_lookup_shared_chunk_no_duplicate_promotion(self, manager_setup, monkeypatch):
        """A chunk looked up by two requests in the same step is promoted once."""
        shared_chunk = to_keys([0])[0]
        self._seed([shared_chunk])

        tier1_submit_load = MagicMock(wraps=self.secondary_tier1.submit_load)
        monkeypatch.setattr(self.secondary_tier1, "submit_load", tier1_submit_load)

        ctx_a = ReqContext(req_id="req_a")
        ctx_b = ReqContext(req_id="req_b")

        # Both lookups find the shared_chunk (the first initiates the promotion,
        # the second sees the in-flight primary slot): HIT_PENDING.
        result_a, result_b = self._resolve([(shared_chunk, ctx_a), (shared_chunk, ctx_b)])
        assert result_a is LookupResult.HIT_PENDING
        assert result_b is LookupResult.HIT_PENDING

        self._simulate_on_schedule_end()

        # Only one submit_load call despite two lookups
        tier1_submit_load.assert_called_once()
        job_metadata = tier1_submit_load.call_args.args[0]
        assert list(job_metadata.keys) == [shared_chunk]
        assert job_metadata.req_context is ctx_a
        self._finish_promotions()
        self._assert_promoted([shared_chunk], ctx_a)
        self._assert_promoted([shared_chunk], ctx_b)

    def test_complete_store_forwards_req_context_to_submit_store(self, manager_setup, monkeypatch):
        """complete_store cascades to secondary tiers with the correct req_context."""
        chunks = to_keys(range(2))

        tier1_submit_store = MagicMock(wraps=self.secondary_tier1.submit_store)
        monkeypatch.setattr(self.secondary_tier1, "submit_store", tier1_submit_store)

        ctx = ReqContext(req_id="req_ctx", kv_transfer_params={"key": "value"})

        self._start_request(ctx)
        self._prepare_store(chunks, ctx)
        self.manager.complete_store(chunks, ctx, success=True)

        assert tier1_submit_store.call_count == 1
        job_metadata = tier1_submit_store.call_args.args[0]
        assert job_metadata.req_context is ctx
        self._settle()
        self._assert_cascaded(chunks)

    def test_on_request_finished_delays_only_secondary_until_store_submitted(self, manager_setup, monkeypatch):
        """Primary order commits immediately; secondary cleanup waits."""
        chunks = to_keys(range(2))
        ctx = ReqContext(req_id="req_delayed_secondary")
        calls: list[tuple[str, str]] = []

        monkeypatch.setattr(
            self.primary_tier,
            "on_request_finished",
            MagicMock(side_effect=lambda req_context: calls.append(("primary_finish", req_context.req_id))),
        )

        original_submit_store1 = self.secondary_tier1.submit_store
        original_submit_store2 = self.secondary_tier2.submit_store
        original_finish1 = self.secondary_tier1.on_request_finished
        original_finish2 = self.secondary_tier2.on_request_finished

        def submit_store1(job_metadata):
            calls.append(("submit_store_1", job_metadata.req_context.req_id))
            return original_submit_store1(job_metadata)

        def submit_store2(job_metadata):
            calls.append(("submit_store_2", job_metadata.req_context.req_id))
            return original_submit_store2(job_metadata)

        def finish1(req_context):
            calls.append(("secondary_finish_1", req_context.req_id))
            return original_finish1(req_context)

        def finish2(req_context):
            calls.append(("secondary_finish_2", req_context.req_id))
            return original_finish2(req_context)

        tier1_on_request_finished = MagicMock(side_effect=finish1)
        tier2_on_request_finished = MagicMock(side_effect=finish2)
        monkeypatch.setattr(self.secondary_tier1, "submit_store", MagicMock(side_effect=submit_store1))
        monkeypatch.setattr(self.secondary_tier2, "submit_store", MagicMock(side_effect=submit_store2))
        monkeypatch.setattr(self.secondary_tier1, "on_request_finished", tier1_on_request_finished)
        monkeypatch.setattr(self.secondary_tier2, "on_request_finished", tier2_on_request_finished)

        self._start_request(ctx)
        self._prepare_store(chunks, ctx)
        self.manager.on_request_finished(ctx)

        assert calls == [("primary_finish", ctx.req_id)]
        tier1_on_request_finished.assert_not_called()
        tier2_on_request_finished.assert_not_called()

        self.manager.complete_store(chunks, ctx, success=True)

        assert calls == [
            ("primary_finish", ctx.req_id),
            ("submit_store_1", ctx.req_id),
            ("submit_store_2", ctx.req_id),
            ("secondary_finish_1", ctx.req_id),
            ("secondary_finish_2", ctx.req_id),
        ]
        # kvtier's stores, submitted before the request's end, complete after it.
        self._settle()
        self._assert_cascaded(chunks)

    @pytest.mark.tier_sees_no_keys
    def test_failed_store_finalizes_finished_request(self, manager_setup, monkeypatch):
        """Failed primary stores still unblock secondary finalization."""
        chunks = to_keys(range(2))
        ctx = ReqContext(req_id="req_failed_store_finalize")

        tier1_submit_store = MagicMock(wraps=self.secondary_tier1.submit_store)
        tier2_submit_store = MagicMock(wraps=self.secondary_tier2.submit_store)
        tier1_on_request_finished = MagicMock(wraps=self.secondary_tier1.on_request_finished)
        tier2_on_request_finished = MagicMock(wraps=self.secondary_tier2.on_request_finished)
        monkeypatch.setattr(self.secondary_tier1, "submit_store", tier1_submit_store)
        monkeypatch.setattr(self.secondary_tier2, "submit_store", tier2_submit_store)
        monkeypatch.setattr(self.secondary_tier1, "on_request_finished", tier1_on_request_finished)
        monkeypatch.setattr(self.secondary_tier2, "on_request_finished", tier2_on_request_finished)

        self._start_request(ctx)
        self._prepare_store(chunks, ctx)
        self.manager.on_request_finished(ctx)

        tier1_on_request_finished.assert_not_called()
        tier2_on_request_finished.assert_not_called()

        self.manager.complete_store(chunks, ctx, success=False)

        tier1_submit_store.assert_not_called()
        tier2_submit_store.assert_not_called()
        tier1_on_request_finished.assert_called_once_with(ctx)
        tier2_on_request_finished.assert_called_once_with(ctx)
        assert ctx.req_id not in self.manager._req_state
        self._settle()
        self._stores_empty()

    def test_zero_store_request_finalizes_immediately(self, manager_setup, monkeypatch):
        """Requests with no pending stores finalize secondary tiers immediately."""
        ctx = ReqContext(req_id="req_zero_store_finalize")
        chunk = to_keys([3])[0]
        self._seed([chunk])

        tier1_on_request_finished = MagicMock(wraps=self.secondary_tier1.on_request_finished)
        tier2_on_request_finished = MagicMock(wraps=self.secondary_tier2.on_request_finished)
        monkeypatch.setattr(self.secondary_tier1, "on_request_finished", tier1_on_request_finished)
        monkeypatch.setattr(self.secondary_tier2, "on_request_finished", tier2_on_request_finished)

        self._start_request(ctx)
        # The request looked a chunk up (kvtier holds a verdict for it) and loads it.
        assert self._resolve([(chunk, ctx)]) == [LookupResult.HIT_PENDING]
        self._finish_promotions()
        self._assert_promoted([chunk], ctx)
        self.manager.on_request_finished(ctx)

        tier1_on_request_finished.assert_called_once_with(ctx)
        tier2_on_request_finished.assert_called_once_with(ctx)
        assert ctx.req_id not in self.manager._req_state

    @pytest.mark.tier_sees_no_keys
    def test_reset_cache_finalizes_delayed_secondary_request(self, manager_setup, monkeypatch):
        """reset_cache abandons pending primary stores and finalizes secondaries."""
        chunks = to_keys(range(2))
        ctx = ReqContext(req_id="req_reset_finalize_secondary")

        tier1_on_request_finished = MagicMock(wraps=self.secondary_tier1.on_request_finished)
        tier2_on_request_finished = MagicMock(wraps=self.secondary_tier2.on_request_finished)
        monkeypatch.setattr(self.secondary_tier1, "on_request_finished", tier1_on_request_finished)
        monkeypatch.setattr(self.secondary_tier2, "on_request_finished", tier2_on_request_finished)

        self._start_request(ctx)
        self._prepare_store(chunks, ctx)
        self.manager.on_request_finished(ctx)

        tier1_on_request_finished.assert_not_called()
        tier2_on_request_finished.assert_not_called()

        self.manager.reset_cache()

        tier1_on_request_finished.assert_called_once_with(ctx)
        tier2_on_request_finished.assert_called_once_with(ctx)
        assert self.manager._req_state == {}
        self._stores_empty()

    def test_reset_cache_clears_pending_primary_stores_for_active_request(self, manager_setup, monkeypatch):
        """reset_cache drops active pending stores so resumed requests finalize."""
        initial_chunks = to_keys(range(2))
        resumed_chunks = to_keys(range(2, 4))
        ctx = ReqContext(req_id="req_reset_resume")

        tier1_on_request_finished = MagicMock(wraps=self.secondary_tier1.on_request_finished)
        tier2_on_request_finished = MagicMock(wraps=self.secondary_tier2.on_request_finished)
        monkeypatch.setattr(self.secondary_tier1, "on_request_finished", tier1_on_request_finished)
        monkeypatch.setattr(self.secondary_tier2, "on_request_finished", tier2_on_request_finished)

        self._start_request(ctx)
        self._prepare_store(initial_chunks, ctx)
        assert self.manager._req_state[ctx.req_id].pending_primary_stores == 1

        self.manager.reset_cache()

        assert ctx.req_id in self.manager._req_state
        assert self.manager._req_state[ctx.req_id].pending_primary_stores == 0
        tier1_on_request_finished.assert_not_called()
        tier2_on_request_finished.assert_not_called()

        self._prepare_store(resumed_chunks, ctx)
        self.manager.complete_store(resumed_chunks, ctx, success=True)
        self.manager.on_request_finished(ctx)

        tier1_on_request_finished.assert_called_once_with(ctx)
        tier2_on_request_finished.assert_called_once_with(ctx)
        assert ctx.req_id not in self.manager._req_state
        self._settle()
        self._assert_cascaded(resumed_chunks)
        self._assert_not_stored(initial_chunks)

    def test_on_new_request_lifecycle(self, manager_setup, monkeypatch):
        """Policy defaults to CHUNK_LEVEL (kvtier's), escalates when a tier requests
        it, and is cleaned up on on_request_finished."""
        ctx = ReqContext(req_id="req_policy_lifecycle")
        result = self.manager.on_new_request(ctx)
        assert result.policy == OffloadPolicy.CHUNK_LEVEL
        assert self.manager._req_state[ctx.req_id].request_level_tiers is None
        self.manager.on_request_finished(ctx)
        assert ctx.req_id not in self.manager._req_state

        # Escalate: tier1 requests REQUEST_LEVEL
        monkeypatch.setattr(
            self.secondary_tier1,
            "on_new_request",
            lambda req_context: RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL),
        )

        ctx = ReqContext(req_id="req_policy_lifecycle_2")
        result = self.manager.on_new_request(ctx)
        assert result.policy == OffloadPolicy.REQUEST_LEVEL
        assert self.manager._req_state[ctx.req_id].request_level_tiers == {0}

        # The request-level request's chunks still reach both kvtier tiers.
        chunks = to_keys(range(2))
        self._prepare_store(chunks, ctx)
        self.manager.complete_store(chunks, ctx, success=True)

        # Cleanup
        self.manager.on_request_finished(ctx)
        assert ctx.req_id not in self.manager._req_state
        self._settle()
        self._assert_cascaded(chunks)

    @pytest.mark.parametrize("new_ids", [(), (3, 4)], ids=["fully_warm", "mixed"])
    def test_prepare_store_cascades_existing_chunks_to_request_level_tiers(self, manager_setup, monkeypatch,
                                                                          new_ids):
        """prepare_store cascades hit chunks to request-level tiers only."""
        # Store some chunks to primary first
        existing_chunks = to_keys(range(3))
        self._start_request()
        result = self._prepare_store(existing_chunks, _CTX)
        assert result is not None
        self.manager.complete_store(existing_chunks, _CTX, success=True)
        # Drain cascade completions
        self._settle()
        self._assert_cascaded(existing_chunks)
        stored_before = self.secondary_tier1.kvtier_stats()

        # Make tier1 request-level, tier2 stays chunk-level
        monkeypatch.setattr(
            self.secondary_tier1,
            "on_new_request",
            lambda req_context: RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL),
        )

        ctx = ReqContext(req_id="req_cascade")
        self.manager.on_new_request(ctx)

        # Spy on submit_store
        tier1_submit_store = MagicMock(wraps=self.secondary_tier1.submit_store)
        tier2_submit_store = MagicMock(wraps=self.secondary_tier2.submit_store)
        monkeypatch.setattr(self.secondary_tier1, "submit_store", tier1_submit_store)
        monkeypatch.setattr(self.secondary_tier2, "submit_store", tier2_submit_store)

        # Call prepare_store with existing + new chunks
        new_chunks = to_keys(new_ids)
        all_chunks = existing_chunks + new_chunks
        result = self._prepare_store(all_chunks, ctx)
        assert result is not None
        assert set(result.keys_to_store) == set(new_chunks)

        # Only tier1 (request-level) should get existing chunks cascaded now.
        tier1_submit_store.assert_called_once()
        job_metadata = tier1_submit_store.call_args.args[0]
        assert set(job_metadata.keys) == set(existing_chunks)

        # tier2 (chunk-level) does not get existing chunks here.
        tier2_submit_store.assert_not_called()

        # kvtier completes the request-level cascade (the objects are there already:
        # every key is accounted as stored, none failed), then the new chunks.
        if new_chunks:
            self.manager.complete_store(new_chunks, ctx, success=True)
        self._settle()
        after = self.secondary_tier1.kvtier_stats()
        assert after["keys_failed"] == stored_before["keys_failed"] == 0
        self._assert_cascaded(all_chunks)

    def _make_request_level_request(self, monkeypatch: pytest.MonkeyPatch, req_id: str) -> ReqContext:
        """Start a request for which tier1 asks for request-level offloading,
        with tier1's submit_store wrapped so the cascade can be observed."""
        monkeypatch.setattr(
            self.secondary_tier1,
            "on_new_request",
            lambda req_context: RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL),
        )
        ctx = ReqContext(req_id=req_id)
        self.manager.on_new_request(ctx)
        monkeypatch.setattr(
            self.secondary_tier1,
            "submit_store",
            MagicMock(wraps=self.secondary_tier1.submit_store),
        )
        return ctx

    def _cascaded_keys_for(self, req_id: str) -> list[set[OffloadKey]]:
        """Key sets tier1 was asked to store on behalf of `req_id`."""
        submit_store = self.secondary_tier1.submit_store
        assert isinstance(submit_store, MagicMock)
        return [
            set(call.args[0].keys) for call in submit_store.call_args_list if call.args[0].req_context.req_id == req_id
        ]

    def test_cascade_rejects_retry_from_primary(self, manager_setup, monkeypatch):
        """RETRY would be parked with no guarantee of ever draining, so the
        cascade refuses it. No real primary tier returns it, so this is the one
        disposition that has to be forced."""
        keys = to_keys(range(3))
        self._start_request()
        assert self._prepare_store(keys, _CTX) is not None
        self.manager.complete_store(keys, _CTX, success=True)
        self._settle()
        self._assert_cascaded(keys)

        ctx = self._make_request_level_request(monkeypatch, "req_cascade")
        monkeypatch.setattr(
            self.manager.primary_tier,
            "lookup",
            lambda key, req_context: LookupResult.RETRY,
        )

        with pytest.raises(AssertionError):
            self.manager._cascade_existing_chunks_to_request_level_tiers(keys, ctx, {0})
        assert not self._cascaded_keys_for(ctx.req_id)

    def _start_in_flight_primary_write(self, keys: list[OffloadKey]) -> ReqContext:
        """Leave a GPU->primary write for `keys` open, so they look present to
        prepare_store but are not yet readable."""
        writer_ctx = ReqContext(req_id="req_writer")
        self._start_request(writer_ctx)
        assert self._prepare_store(keys, writer_ctx) is not None
        return writer_ctx

    def test_cascade_defers_keys_whose_primary_write_is_in_flight(self, manager_setup, monkeypatch):
        """A key another request is still writing must reach the peer once the
        write lands, not be dropped."""
        keys = to_keys(range(3))
        writer_ctx = self._start_in_flight_primary_write(keys)

        ctx = self._make_request_level_request(monkeypatch, "req_cascade")
        result = self.manager.prepare_store(keys, ctx)
        assert result is not None
        assert not result.keys_to_store
        assert not self._cascaded_keys_for(ctx.req_id)

        self.manager.complete_store(keys, writer_ctx, success=True)
        self._simulate_on_schedule_end()

        assert self._cascaded_keys_for(ctx.req_id) == [set(keys)]
        self._settle()
        self._assert_cascaded(keys)

    def test_deferred_cascade_holds_request_from_finalization(self, manager_setup, monkeypatch):
        """A request that finishes with keys still deferred must stay alive, or
        its tiers are torn down before the peer is ever served."""
        keys = to_keys(range(3))
        writer_ctx = self._start_in_flight_primary_write(keys)

        ctx = self._make_request_level_request(monkeypatch, "req_cascade")
        result = self.manager.prepare_store(keys, ctx)
        assert result is not None
        assert not result.keys_to_store
        self.manager.on_request_finished(ctx)

        assert ctx.req_id in self.manager._req_state
        assert self.manager.has_pending_work()

        self.manager.complete_store(keys, writer_ctx, success=True)
        self._simulate_on_schedule_end()

        assert self._cascaded_keys_for(ctx.req_id) == [set(keys)]
        assert ctx.req_id not in self.manager._req_state
        self._settle()
        self._assert_cascaded(keys)

    @pytest.mark.tier_sees_no_keys
    def test_cascade_drops_deferred_keys_whose_primary_write_failed(self, manager_setup, monkeypatch):
        """A failed write frees the chunk, so the deferred key resolves to MISS
        and the request finalizes instead of parking forever."""
        keys = to_keys(range(3))
        writer_ctx = self._start_in_flight_primary_write(keys)

        ctx = self._make_request_level_request(monkeypatch, "req_cascade")
        result = self.manager.prepare_store(keys, ctx)
        assert result is not None
        assert not result.keys_to_store
        self.manager.on_request_finished(ctx)

        self.manager.complete_store(keys, writer_ctx, success=False)
        self._simulate_on_schedule_end()

        assert not self._cascaded_keys_for(ctx.req_id)
        assert ctx.req_id not in self.manager._req_state
        assert not self.manager.has_pending_work()
        self._stores_empty()

    def test_reset_cache_clears_orchestrator_state(self, manager_setup, monkeypatch):
        """reset_cache wipes every kind of orchestrator state and resets
        primary tier; pending submissions are dropped without being sent
        to the secondary tier. Active request state is retained."""
        # Pending promotion submission (deferred — no on_schedule_end after
        # the lookup that staged it). kvtier answers the lookup over a few steps
        # first, so this is staged before the cascade below.
        promo_chunk = to_keys([99])[0]
        self._seed([promo_chunk])
        assert self._resolve([(promo_chunk, ReqContext(req_id="pending"))]) == [LookupResult.HIT_PENDING]
        assert self.manager._pending_load_submissions

        # Cascade — populates primary chunks and leaves kvtier's cascade jobs
        # in _jobs; reset_cache's drain picks them up.
        chunks = to_keys(range(3))
        self._start_request()
        self._prepare_store(chunks, _CTX)
        self.manager.complete_store(chunks, _CTX, success=True)
        assert self.manager._jobs

        # Request-level tier registration.
        monkeypatch.setattr(
            self.secondary_tier1,
            "on_new_request",
            lambda req_context: RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL),
        )
        rl_ctx = ReqContext(req_id="rl")
        self.manager.on_new_request(rl_ctx)
        assert self.manager._req_state[rl_ctx.req_id].request_level_tiers == {0}

        # Mark this step as already polled (reset_cache must clear it).
        self.manager._processed_jobs_this_step = True

        # Spy: pending submission must NOT reach the tier.
        tier1_submit_load = MagicMock(wraps=self.secondary_tier1.submit_load)
        monkeypatch.setattr(self.secondary_tier1, "submit_load", tier1_submit_load)

        self.manager.reset_cache()

        # Orchestrator state cleared.
        assert self.manager._jobs == {}
        assert self.manager._pending_load_submissions == {}
        assert self.manager._request_load_sources == {}
        assert set(self.manager._req_state) == {_CTX.req_id, rl_ctx.req_id}
        assert self.manager._processed_jobs_this_step is False

        # Primary tier reset to a fresh state.
        assert self.primary_tier._num_allocated_chunks == 0
        assert self.primary_tier._free_list == []
        for chunk in chunks:
            assert self.primary_tier.lookup(chunk, _CTX) is LookupResult.MISS

        # Pending submission was dropped, not submitted.
        tier1_submit_load.assert_not_called()
        # The drained cascades are on the stores.
        self._assert_cascaded(chunks)
        assert not any(t.has_pending_work() for t in self._tiers())

    def test_reset_cache_drains_all_tiers(self, manager_setup, monkeypatch):
        """reset_cache must drain each secondary tier before resetting the primary
        tier so no tier I/O is touching primary memory: when it returns, kvtier's
        cascades have finished and their objects are on the stores."""
        tier1_drain_jobs = MagicMock(wraps=self.secondary_tier1.drain_jobs)
        tier2_drain_jobs = MagicMock(wraps=self.secondary_tier2.drain_jobs)
        monkeypatch.setattr(self.secondary_tier1, "drain_jobs", tier1_drain_jobs)
        monkeypatch.setattr(self.secondary_tier2, "drain_jobs", tier2_drain_jobs)

        # Drive a cascade so a job lands in _jobs.
        chunks = to_keys(range(3))
        self._start_request()
        self._prepare_store(chunks, _CTX)
        self.manager.complete_store(chunks, _CTX, success=True)
        assert self.manager._jobs

        self.manager.reset_cache()

        tier1_drain_jobs.assert_called_once()
        tier2_drain_jobs.assert_called_once()
        assert self.manager._jobs == {}
        for tier in self._tiers():
            assert tier.tier.jobs_in_flight() == 0
            assert not tier.has_pending_work()
        self._assert_cascaded(chunks)

    @pytest.mark.parametrize(
        "load_tier_filter",
        [
            TierFilter(matchers=(TierMatcher(medium=Medium.CPU),)),
            TierFilter(matchers=()),
        ],
        ids=["non_matching_medium", "empty_no_load"],
    )
    def test_tier_filter_skips_filtered_secondary(self, manager_setup, monkeypatch, load_tier_filter):
        """Filter excluding secondary medium returns MISS from secondaries
        even when they hold the chunk; primary is unaffected. (kvtier's medium is
        STORAGE, so the non-matching filter asks for CPU.)"""
        chunks = to_keys(range(2))
        # Put one chunk in primary, one only in secondary
        self._start_request()
        self._prepare_store(chunks[:1], _CTX)
        self.manager.complete_store(chunks[:1], _CTX, success=True)
        self._seed(chunks[1:])

        tier1_lookup = MagicMock(wraps=self.secondary_tier1.lookup)
        monkeypatch.setattr(self.secondary_tier1, "lookup", tier1_lookup)

        ctx = ReqContext(req_id="r1", load_tier_filter=load_tier_filter)
        assert self.manager.lookup(chunks[0], ctx) is LookupResult.HIT
        assert self.manager.lookup(chunks[1], ctx) is LookupResult.MISS
        tier1_lookup.assert_not_called()
        assert self._read_primary(chunks[:1], ctx) == [self.written[chunks[0]]]
        # Unfiltered, the same chunk is found in tier 1.
        assert self._resolve([(chunks[1], ReqContext(req_id="r1-all"))]) == [LookupResult.HIT_PENDING]

    @pytest.mark.parametrize(
        "load_tier_filter",
        [
            TierFilter.ALL,
            TierFilter(matchers=(TierMatcher(medium=Medium.STORAGE),)),
            TierFilter(matchers=(TierMatcher(),)),
        ],
        ids=["all", "explicit_storage", "unconstrained_matcher"],
    )
    def test_tier_filter_allows_matching_secondary(self, manager_setup, monkeypatch, load_tier_filter):
        """Filter that matches the secondary's medium allows lookup."""
        chunks = to_keys(range(1))
        self._seed(chunks)

        tier1_lookup = MagicMock(wraps=self.secondary_tier1.lookup)
        monkeypatch.setattr(self.secondary_tier1, "lookup", tier1_lookup)

        ctx = ReqContext(req_id="r2", load_tier_filter=load_tier_filter)
        assert self._resolve([(chunks[0], ctx)]) == [LookupResult.HIT_PENDING]
        tier1_lookup.assert_called()
        self._finish_promotions()
        self._assert_promoted(chunks, ctx)


# ---------------------------------------------------------------------------------------
# Config info: the manager's series, the spec's declarations


@pytest.mark.short_hashes
def test_tiering_manager_reports_one_config_info_series_for_each_tier(kv_store, tiers):
    """The info metric holds one series for each tier, and the tier label tells the
    series apart; each kvtier tier fills its own names, naming where its objects go."""
    h = _Harness()
    h._build(kv_store, tiers)

    infos = h.manager.config_info()
    assert infos == [
        {"tier": "0:primary"},
        {"tier": "1:KvtierTier", **h.secondary_tier1.config_info()},
        {"tier": "2:KvtierTier", **h.secondary_tier2.config_info()},
    ]
    assert infos[1]["kvtier_location"] != infos[2]["kvtier_location"]
    assert h.store1.prefix in infos[1]["kvtier_location"]
    assert h.store2.prefix in infos[2]["kvtier_location"]
    # Each series names where that tier's objects actually go.
    chunks = to_keys(range(2))
    h._start_request()
    h._prepare_store(chunks)
    h.manager.complete_store(chunks, _CTX, success=True)
    h._settle()
    h._assert_cascaded(chunks)


@pytest.mark.short_hashes
def test_tiering_manager_keeps_the_tier_label_out_of_the_tier_mapping(kv_store, tiers):
    """The manager adds the tier label to a copy: kvtier's own mapping does not gain
    a foreign key that outlives the call."""
    h = _Harness()
    h._build(kv_store, tiers)
    before = h.secondary_tier1.config_info()

    h.manager.config_info()

    assert h.secondary_tier1.config_info() == before
    assert "tier" not in h.secondary_tier1._config_info
    chunks = to_keys([1])
    h._start_request()
    h._prepare_store(chunks)
    h.manager.complete_store(chunks, _CTX, success=True)
    h._settle()
    h._assert_cascaded(chunks)


@pytest.mark.short_hashes
def test_tiering_spec_declares_the_config_info_keys_the_manager_fills(kv_store):
    """The spec declares the info label names (API-server process), the manager
    fills the values (engine process); both from the same secondary_tiers, here
    two kvtier entries built by vLLM's spec and factory."""
    entries = [
        {"type": _TIER_TYPE, "module_path": "kvtier.vllm", "store_config": dict(kv_store.store_config),
         "prefix": f"{kv_store.prefix}-{i}"}
        for i in (1, 2)
    ]
    config = _spec_config(kv_store, entries, blocks_per_chunk=1, max_model_len=1024)
    spec = TieringOffloadingSpec(config)
    manager = spec.get_manager()
    try:
        keys = TieringOffloadingSpec.config_info_keys(config.extra_config)

        assert keys == (
            "cpu_num_chunks",
            "cpu_blocks_per_chunk",
            "cpu_kv_cache_size_bytes",
            "cpu_kv_cache_size_tokens",
            "tier",
            *CONFIG_INFO_KEYS,
        )
        filled: set[str] = set()
        for info in manager.config_info():
            assert set(info) <= set(keys)
            filled |= set(info)
        assert filled == set(keys)
        stores = [
            (Store(kv_store.id, kv_store.store_config, e["prefix"], root=kv_store.root, s3=kv_store.s3), tier)
            for e, tier in zip(entries, manager.secondary_tiers)
        ]
        _engine_roundtrip(manager, to_keys(range(2)), stores)
    finally:
        manager.shutdown()


@pytest.mark.short_hashes
def test_tiering_spec_passes_each_tier_its_own_config(kv_store, monkeypatch):
    """A tier reads its own parameters out of its own config dict, not out of the
    instance-wide kv_connector_extra_config: the declaration sees each entry, and
    each kvtier tier built from it stores under its own prefix."""
    seen: list[dict] = []
    original = KvtierTier.config_info_keys.__func__

    def recording(cls, extra_config):
        seen.append(extra_config)
        return original(cls, extra_config)

    monkeypatch.setattr(KvtierTier, "config_info_keys", classmethod(recording))
    entries = [
        {"type": _TIER_TYPE, "module_path": "kvtier.vllm", "store_config": dict(kv_store.store_config),
         "prefix": f"{kv_store.prefix}-{i}"}
        for i in (1, 2)
    ]
    config = _spec_config(kv_store, entries)
    TieringOffloadingSpec.config_info_keys(config.extra_config)

    assert seen == entries

    manager = TieringOffloadingSpec(config).get_manager()
    try:
        stores = [
            (Store(kv_store.id, kv_store.store_config, e["prefix"], root=kv_store.root, s3=kv_store.s3), tier)
            for e, tier in zip(entries, manager.secondary_tiers)
        ]
        _engine_roundtrip(manager, to_keys(range(2)), stores)
        assert kv_store.names() == []  # nothing under the instance-wide prefix
    finally:
        manager.shutdown()


def test_tiering_spec_rejects_a_tier_that_declares_the_reserved_tier_label():
    """The manager writes the tier label over a tier's value, so a tier (here a
    kvtier subclass) that declares the name must fail at start-up instead."""

    class _ReservedLabelTier(KvtierTier):
        @classmethod
        def config_info_keys(cls, extra_config):
            return ("tier",)

    tier_configs = [{"type": "KvtierTier", "module_path": "kvtier.vllm"}]
    with (
        patch.object(SecondaryTierFactory, "get_tier_class", return_value=_ReservedLabelTier),
        pytest.raises(AssertionError, match="reserved label 'tier'"),
    ):
        TieringOffloadingSpec.config_info_keys({"secondary_tiers": tier_configs})
