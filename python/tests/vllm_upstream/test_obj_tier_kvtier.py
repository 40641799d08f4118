# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vLLM 0.33.0's obj-tier tests, adapted to kvtier's tier.

Adapted from vLLM 0.33.0 ``tests/v1/kv_offload/tiering/test_obj_tier.py`` (the mock-based
unit tests of ``ObjectStoreSecondaryTierManager``). Here the tier is
``kvtier.vllm.KvtierTier`` and there is no mock: every test runs against a real store
(the local directory store, s3s-fs and moto — fixture ``kv_store``), and the NIXL
mock's failure modes are real faults on that store:

================================  ===================================================
vLLM's mock                        kvtier's real fault
================================  ===================================================
check_xfer_state -> "ERR" (store)  the server refuses the object's PUT (S3, via the
                                   test proxy) / a directory stands where the object
                                   file goes (local)
check_xfer_state -> "ERR" (load)   the stored object is truncated
check_xfer_state -> "PROC"         the PUT is held at the server (S3 stores only: a
                                   local write cannot be stalled)
query_memory raises                existence checks fail with an error (HEAD 403 /
                                   the prefix is a file)
register_memory / make_prepped     kvtier refuses the submission: a chunk id outside
_xfer return None                  the registered pool / keys and chunk ids that do
                                   not pair up
================================  ===================================================

Every test that stores checks the object's bytes on the store (read back directly, not
through kvtier) and every test that loads checks the primary view's rows.

Left out (NIXL internals, nothing of them exists in kvtier):

* ``TestMockObjTierFailures::test_release_xfer_failure_retries_without_losing_result``
  — retrying NIXL's ``release_xfer_handle`` after it raised.
* ``TestMockObjTierFailures::test_post_transfer_cleanup_failure_does_not_lose_result``
  [release_dlist_handle, deregister_memory] — NIXL descriptor-list and memory
  deregistration failures after a transfer.

Adapted with a different mechanism (same contract):

* ``test_xfer_cleanup_retry_finalizes_parent_job_and_primary_pin`` — the NIXL
  release-retry step is gone; what remains is the contract it protects: while kvtier's
  transfer is in flight (a held PUT) the manager keeps the job and the primary pin,
  and both are released once kvtier reports it. S3 stores only.
* ``test_pending_transfer_not_returned_until_done``, ``test_drain_jobs_polls_until_
  transfers_complete`` and ``test_shutdown_clears_in_flight_transfers`` need a transfer
  that stays in flight: S3 stores only (a held PUT).
* ``TestObjStoreConfig`` checks kvtier's translation of the same ``store_config`` keys
  (``build_tier_config``) instead of NIXL's parameter dict, and round-trips a block
  with each configuration on the S3 servers.
"""

import threading
import uuid

import numpy as np
import pytest
import torch
from upstream_support import (
    ENGINE_ID,
    Store,
    clear_rows,
    drain,
    fill_rows,
    lookup_and_wait,
    row_bytes,
    wait_io,
    wait_until,
)
from types import SimpleNamespace
from unittest.mock import MagicMock

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingKVEventsConfig,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)

from kvtier.vllm import KvtierTier, build_tier_config

# ---------------------------------------------------------------------------
# Shared stubs (vLLM's, with the store in place of the NIXL agent)
# ---------------------------------------------------------------------------


def _make_offloading_config(
    enable_kv_cache_events: bool,
    *,
    tp_size: int = 1,
    rank: int = 0,
    world_size: int | None = None,
    replicated_layout: bool = False,
    is_parallelism_agnostic: bool = False,
    blocks_per_chunk: int = 1,
) -> OffloadingConfig:
    if world_size is None:
        world_size = tp_size
    return OffloadingConfig(
        groups=(),
        worker_kv_bytes_per_block=0,
        enable_kv_cache_events=enable_kv_cache_events,
        extra_config={},
        engine_id=ENGINE_ID,
        model=OffloadingModelConfig(name="test/model", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=rank,
            world_size=world_size,
            tp_size=tp_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=is_parallelism_agnostic,
        ),
        replicated_layout=replicated_layout,
    )


_OFFLOADING_SPEC = SimpleNamespace(
    config=_make_offloading_config(enable_kv_cache_events=False),
    blocks_per_chunk=1,
)

_BLOCK_ELEMENTS = 256
_DTYPE = torch.float32
_CTX = ReqContext(req_id="test-req")


def key(n: int) -> OffloadKey:
    return make_offload_key(n.to_bytes(8, "big"), 0)


def make_job(
    job_id: int,
    keys: list[OffloadKey],
    chunk_ids: list[int] | None = None,
) -> TransferJob:
    if chunk_ids is None:
        chunk_ids = list(range(len(keys)))
    return TransferJob(
        job_id=job_id,
        keys=keys,
        chunk_ids=np.array(chunk_ids, dtype=np.int32),
        is_promotion=False,
        req_context=_CTX,
    )


def _make_events_spec(enable_kv_cache_events: bool) -> SimpleNamespace:
    """Offloading spec stub with an explicit global KV events flag."""
    return SimpleNamespace(
        config=_make_offloading_config(enable_kv_cache_events),
        blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(
            enable_kv_cache_events=enable_kv_cache_events,
            self_describing_kv_events=False,
        ),
    )


def _make_tier(
    store: Store,
    created: list,
    num_blocks: int = 4,
    offloading_spec: SimpleNamespace = _OFFLOADING_SPEC,
    primary_kv_view: memoryview | None = None,
    store_config_extra: dict | None = None,
    **tier_kwargs,
) -> tuple[KvtierTier, memoryview]:
    """A kvtier tier on ``store`` over a float32 primary view (filled with random rows)."""
    if primary_kv_view is None:
        tensor = torch.zeros((num_blocks, _BLOCK_ELEMENTS), dtype=_DTYPE)
        primary_kv_view = memoryview(tensor.numpy())
        fill_rows(primary_kv_view, range(num_blocks), seed=len(created))
    tier = KvtierTier(
        offloading_spec=offloading_spec,
        primary_kv_view=primary_kv_view,
        tier_type="KvtierTier",
        store_config={**store.store_config, **(store_config_extra or {})},
        prefix=store.prefix,
        **tier_kwargs,
    )
    created.append(tier)
    return tier, primary_kv_view


def assert_stored(store: Store, tier: KvtierTier, view: memoryview, pairs) -> None:
    """Each (key, row): the object on the store holds exactly the row's bytes."""
    for k, row in pairs:
        assert store.read(tier.namespace, k) == row_bytes(view, row), f"object of row {row}"


def assert_absent(store: Store, tier: KvtierTier, *keys) -> None:
    for k in keys:
        assert store.read(tier.namespace, k) is None


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("locality", ["local", ""])
def test_invalid_locality_raises_at_construction(locality, kv_store, tiers):
    with pytest.raises(ValueError, match="Locality"):
        _make_tier(kv_store, tiers, locality=locality)
    assert kv_store.names() == []  # refused before anything reached the store


class TestMockObjTierBasic:
    @pytest.fixture(autouse=True)
    def _setup(self, kv_store, tiers):
        self.store = kv_store
        self.tiers = tiers
        self.tier, self.view = _make_tier(kv_store, tiers, num_blocks=4)

    def test_lookup_empty_tier(self):
        assert lookup_and_wait(self.tier, [key(1)], _CTX) == [LookupResult.MISS]
        stats = self.tier.kvtier_stats()
        assert stats["existence_checks"] >= 1 and stats["existence_check_errors"] == 0
        assert self.store.names() == []

    def test_store_and_lookup(self):
        self.tier.submit_store(make_job(1, [key(1)], [0]))
        results = drain(self.tier)
        assert len(results) == 1
        assert results[0].success
        assert lookup_and_wait(self.tier, [key(1)], _CTX) == [LookupResult.HIT]
        assert_stored(self.store, self.tier, self.view, [(key(1), 0)])

    def test_lookup_unrelated_key_returns_false(self):
        self.tier.submit_store(make_job(1, [key(1)], [0]))
        assert all(r.success for r in drain(self.tier))
        assert lookup_and_wait(self.tier, [key(999)], _CTX) == [LookupResult.MISS]
        assert_stored(self.store, self.tier, self.view, [(key(1), 0)])
        assert_absent(self.store, self.tier, key(999))

    def test_store_then_load_roundtrip(self):
        """Completed stores and loads report transfer timing (and kvtier's byte count)."""
        stored = {r: row_bytes(self.view, r) for r in (0, 1)}
        self.tier.submit_store(make_job(1, [key(1), key(2)], [0, 1]))
        (result,) = drain(self.tier)
        assert (result.job_id, result.success) == (1, True)
        assert result.transfer_time is not None and result.transfer_time > 0
        assert result.transfer_bytes == 2 * self.view.strides[0]
        assert_stored(self.store, self.tier, self.view, [(key(1), 0), (key(2), 1)])

        clear_rows(self.view, (0, 1))
        self.tier.submit_load(make_job(2, [key(1), key(2)], [0, 1]))
        (result,) = drain(self.tier)
        assert (result.job_id, result.success) == (2, True)
        assert result.transfer_time is not None and result.transfer_time > 0
        assert result.transfer_bytes == 2 * self.view.strides[0]
        assert not self.tier.has_pending_work()
        assert list(self.tier.get_finished_jobs()) == []
        assert {r: row_bytes(self.view, r) for r in (0, 1)} == stored

    def test_multiple_jobs_tracked_independently(self):
        self.tier.submit_store(make_job(1, [key(1)], [0]))
        self.tier.submit_store(make_job(2, [key(2)], [1]))
        results = drain(self.tier)
        assert len(results) == 2
        assert sorted(r.job_id for r in results) == [1, 2]
        assert all(r.success for r in results)
        assert_stored(self.store, self.tier, self.view, [(key(1), 0), (key(2), 1)])

    def test_failed_transfer_reported(self):
        self.store.fail_store(self.tier.namespace, key(1))
        self.tier.submit_store(make_job(1, [key(1)], [0]))
        results = drain(self.tier)
        assert len(results) == 1
        assert not results[0].success
        assert_absent(self.store, self.tier, key(1))
        assert self.tier.kvtier_stats()["keys_failed"] == 1

    def test_failed_load_marks_verdict_negative(self):
        """Regression for the failed-load livelock on the obj tier: a cached HIT must
        not survive a failed load of the same key. Here the load fails for real (the
        object was truncated on the store), and the SAME request then resolves to MISS
        although an object still exists under the key."""
        ctx = ReqContext(req_id="obj-livelock")
        self.tier.submit_store(make_job(1, [key(1)], [0]))
        assert all(r.success for r in drain(self.tier))
        assert_stored(self.store, self.tier, self.view, [(key(1), 0)])
        # Cache a positive verdict: the object is present, so lookup is a HIT.
        assert lookup_and_wait(self.tier, [key(1)], ctx=ctx) == [LookupResult.HIT]

        # The promotion the HIT triggered fails: the object is short now.
        self.store.truncate(self.tier.namespace, key(1))
        self.tier.submit_load(make_job(2, [key(1)], [1]))
        results = drain(self.tier)
        assert len(results) == 1 and not results[0].success
        assert results[0].successful_keys is None

        assert self.store.read(self.tier.namespace, key(1)) is not None
        assert lookup_and_wait(self.tier, [key(1)], ctx=ctx) == [LookupResult.MISS]

    def test_store_multiple_blocks_bytes_per_key(self):
        """(kvtier addition to the basic class: rows and objects pair up by index.)"""
        self.tier.submit_store(make_job(1, [key(7), key(8)], [3, 2]))
        assert all(r.success for r in drain(self.tier))
        assert_stored(self.store, self.tier, self.view, [(key(7), 3), (key(8), 2)])
        clear_rows(self.view)
        self.tier.submit_load(make_job(2, [key(8), key(7)], [0, 1]))
        assert all(r.success for r in drain(self.tier))
        assert self.store.read(self.tier.namespace, key(8)) == row_bytes(self.view, 0)
        assert self.store.read(self.tier.namespace, key(7)) == row_bytes(self.view, 1)


class TestObjTierInFlight:
    """The tests of TestMockObjTierBasic whose mock kept a transfer in PROC: here the
    PUT is held at the S3 server by the test proxy."""

    @pytest.fixture(autouse=True)
    def _setup(self, s3_store, tiers):
        self.store = s3_store
        self.tier, self.view = _make_tier(s3_store, tiers, num_blocks=4)

    def _hold_and_store(self, job_id: int, k: OffloadKey, row: int) -> threading.Event:
        release = self.store.hold_puts()
        self.tier.submit_store(make_job(job_id, [k], [row]))
        wait_until(lambda: self.store.proxy.held("PUT", f"/{self.store.prefix}/") >= 1,
                   "the PUT to reach the server")
        return release

    def test_pending_transfer_not_returned_until_done(self):
        release = self._hold_and_store(1, key(1), 0)
        assert list(self.tier.get_finished_jobs()) == []
        assert self.tier.has_pending_work()
        assert list(self.tier.get_finished_jobs()) == []
        release.set()
        results = drain(self.tier)
        assert len(results) == 1
        assert results[0].success
        assert_stored(self.store, self.tier, self.view, [(key(1), 0)])

    def test_drain_jobs_polls_until_transfers_complete(self, monkeypatch):
        """drain_jobs must wait until every in-flight transfer finishes: the PUT is
        still held when drain_jobs starts (it is released by the first wait)."""
        release = self._hold_and_store(1, key(1), 0)
        assert self.tier.has_pending_work()
        inner = self.tier.tier
        real_drain = inner.drain
        calls = []

        def drain_releasing(timeout_ms):
            calls.append(timeout_ms)
            release.set()  # the held PUT goes on only once drain_jobs is waiting
            return real_drain(timeout_ms)

        monkeypatch.setattr(inner, "drain", drain_releasing)
        self.tier.drain_jobs()

        assert calls
        assert inner.jobs_in_flight() == 0  # fully drained
        assert_stored(self.store, self.tier, self.view, [(key(1), 0)])
        # Result is buffered for the next get_finished_jobs() call.
        results = list(self.tier.get_finished_jobs())
        assert len(results) == 1
        assert results[0].success
        assert not self.tier.has_pending_work()


class TestMockObjTierMultiBlock:
    def test_store_multiple_blocks(self, kv_store, tiers):
        tier, view = _make_tier(kv_store, tiers, num_blocks=8)
        keys = [key(i) for i in range(8)]
        tier.submit_store(make_job(1, keys, list(range(8))))
        results = drain(tier)
        assert len(results) == 1
        assert results[0].success
        assert lookup_and_wait(tier, keys, _CTX) == [LookupResult.HIT] * 8
        assert_stored(kv_store, tier, view, [(k, i) for i, k in enumerate(keys)])

    def test_partial_block_lookup(self, kv_store, tiers):
        tier, view = _make_tier(kv_store, tiers, num_blocks=4)
        tier.submit_store(make_job(1, [key(0), key(1)], [0, 1]))
        assert all(r.success for r in drain(tier))
        assert lookup_and_wait(tier, [key(0), key(1), key(2)], _CTX) == [
            LookupResult.HIT,
            LookupResult.HIT,
            LookupResult.MISS,
        ]
        assert_stored(kv_store, tier, view, [(key(0), 0), (key(1), 1)])
        assert_absent(kv_store, tier, key(2))


class TestMockObjTierFailures:
    def test_lookup_exception_returns_false(self, kv_store, tiers):
        tier, view = _make_tier(kv_store, tiers, num_blocks=4)
        tier.submit_store(make_job(1, [key(1)], [0]))
        assert all(r.success for r in drain(tier))
        assert_stored(kv_store, tier, view, [(key(1), 0)])
        # The object is there; the store now fails every existence check.
        kv_store.fail_lookups()
        assert lookup_and_wait(tier, [key(1)], ReqContext(req_id="after-fault")) == [LookupResult.MISS]
        assert tier.kvtier_stats()["existence_check_errors"] >= 1

    def test_submit_store_register_memory_failure_reported_in_get_finished(self, kv_store, tiers):
        tier, _ = _make_tier(kv_store, tiers, num_blocks=4)
        tier.submit_store(make_job(1, [key(1)], [4]))  # chunk 4 is outside the pool
        results = list(tier.get_finished_jobs())
        assert len(results) == 1
        assert results[0].job_id == 1
        assert not results[0].success
        assert not tier.has_pending_work()
        assert kv_store.names() == []

    def test_submit_load_register_memory_failure_reported_in_get_finished(self, kv_store, tiers):
        tier, view = _make_tier(kv_store, tiers, num_blocks=4)
        tier.submit_store(make_job(1, [key(1)], [0]))
        assert all(r.success for r in drain(tier))
        assert_stored(kv_store, tier, view, [(key(1), 0)])
        tier.submit_load(make_job(2, [key(1)], [-1]))  # no such chunk
        results = list(tier.get_finished_jobs())
        assert len(results) == 1
        assert results[0].job_id == 2
        assert not results[0].success

    def test_submit_store_make_prepped_xfer_failure_reported_in_get_finished(self, kv_store, tiers):
        tier, _ = _make_tier(kv_store, tiers, num_blocks=4)
        tier.submit_store(make_job(3, [key(1), key(2)], [0]))  # keys and chunks do not pair up
        results = list(tier.get_finished_jobs())
        assert len(results) == 1
        assert results[0].job_id == 3
        assert not results[0].success
        assert kv_store.names() == []

    def test_failure_and_success_both_returned_by_get_finished(self, kv_store, tiers):
        # One job fails at submission, another succeeds in flight.
        tier, view = _make_tier(kv_store, tiers, num_blocks=4)
        tier.submit_store(make_job(1, [key(1)], [17]))  # fails immediately
        tier.submit_store(make_job(2, [key(2)], [1]))  # succeeds
        results = drain(tier)
        assert len(results) == 2
        by_id = {r.job_id: r for r in results}
        assert not by_id[1].success
        assert by_id[2].success
        assert_stored(kv_store, tier, view, [(key(2), 1)])
        assert_absent(kv_store, tier, key(1))

    def test_xfer_cleanup_retry_finalizes_parent_job_and_primary_pin(self, s3_store, tiers):
        """While kvtier's transfer is in flight (its PUT held at the server) the
        manager keeps the cascade job and the primary pin; once kvtier reports it,
        both are released and the object holds the primary chunk's bytes."""
        num_blocks = 4
        tensor = torch.zeros((num_blocks, _BLOCK_ELEMENTS), dtype=_DTYPE)
        primary_kv_view = memoryview(tensor.numpy())
        mmap_region = MagicMock()
        mmap_region.create_kv_memoryview.return_value = primary_kv_view
        primary_tier = CPUPrimaryTierOffloadingManager(num_chunks=num_blocks, mmap_region=mmap_region)
        obj_tier, _ = _make_tier(s3_store, tiers, num_blocks=num_blocks, primary_kv_view=primary_kv_view)
        manager = TieringOffloadingManager(primary_tier=primary_tier, secondary_tiers=[obj_tier])

        keys = [key(1)]
        primary_result = primary_tier.prepare_store(keys, _CTX)
        assert primary_result is not None
        (slot,) = primary_result.store_spec.chunk_ids
        fill_rows(primary_kv_view, [int(slot)], seed=42)
        primary_tier.complete_store(keys, _CTX, success=True)
        job = manager.create_store_job(keys, _CTX)
        release = s3_store.hold_puts()
        obj_tier.submit_store(job)
        wait_until(lambda: s3_store.proxy.held("PUT", f"/{s3_store.prefix}/") >= 1, "the PUT to reach the server")

        block = primary_tier._policy.get(keys[0])
        assert block is not None
        assert block.ref_cnt == 1
        assert len(manager._transfer_jobs) == 1
        schedule_context = ScheduleEndContext(new_req_ids=[], preempted_req_ids=())

        manager.on_schedule_end(schedule_context)

        assert len(manager._transfer_jobs) == 1
        assert block.ref_cnt == 1
        assert obj_tier.has_pending_work()
        assert manager.has_pending_work()

        release.set()
        wait_io(obj_tier)
        manager.on_schedule_end(schedule_context)

        assert manager._transfer_jobs == {}
        assert block.ref_cnt == 0
        assert not obj_tier.has_pending_work()
        assert not manager.has_pending_work()
        assert s3_store.read(obj_tier.namespace, keys[0]) == row_bytes(primary_kv_view, int(slot))


class TestMockObjTierShutdown:
    def test_shutdown_clears_in_flight_transfers(self, s3_store, tiers):
        tier, view = _make_tier(s3_store, tiers, num_blocks=4, store_config_extra={"shutdown_timeout_ms": 300})
        tier.submit_store(make_job(1, [key(0)], [0]))
        assert all(r.success for r in drain(tier))
        # Keep a transfer in flight by holding its PUT at the server.
        s3_store.hold_puts()
        tier.submit_store(make_job(2, [key(1)], [1]))
        wait_until(lambda: s3_store.proxy.held("PUT", f"/{s3_store.prefix}/") >= 1, "the PUT to reach the server")
        assert tier.has_pending_work()
        tier.shutdown()
        assert not tier.has_pending_work()
        assert tier.tier is None
        assert list(tier.get_finished_jobs()) == []
        # What finished before the shutdown is on the store.
        assert_stored(s3_store, tier, view, [(key(0), 0)])

    def test_shutdown_idempotent(self, kv_store, tiers):
        tier, view = _make_tier(kv_store, tiers, num_blocks=4)
        tier.submit_store(make_job(1, [key(1)], [2]))
        assert all(r.success for r in drain(tier))
        tier.shutdown()
        tier.shutdown()  # must not raise
        # A new tier on the same store loads what the first one stored.
        again, view2 = _make_tier(kv_store, tiers, num_blocks=4)
        clear_rows(view2)
        again.submit_load(make_job(2, [key(1)], [0]))
        assert all(r.success for r in drain(again))
        assert row_bytes(view2, 0) == row_bytes(view, 2)


class TestObjTierKVEvents:
    @pytest.fixture(autouse=True)
    def _setup(self, kv_store, tiers):
        self.store = kv_store
        self.tiers = tiers
        self.tier, self.view = _make_tier(
            kv_store,
            tiers,
            offloading_spec=_make_events_spec(enable_kv_cache_events=True),
            enable_kv_events=True,
            locality="REMOTE",
        )

    def test_successful_store_emits_stored_event(self):
        """A completed store transfer emits one stored event with the job's keys."""
        keys = [key(1), key(2)]
        self.tier.submit_store(make_job(1, keys, [0, 1]))
        assert all(r.success for r in drain(self.tier))

        events = list(self.tier.take_events())
        assert len(events) == 1
        assert events[0].keys == keys
        assert events[0].medium == Medium.STORAGE
        assert events[0].locality is Locality.REMOTE
        assert not events[0].removed
        # take_events drains the buffer.
        assert list(self.tier.take_events()) == []
        assert_stored(self.store, self.tier, self.view, [(key(1), 0), (key(2), 1)])

    @pytest.mark.parametrize(
        ("locality", "expected"),
        [(None, None), ("LOCAL", Locality.LOCAL)],
    )
    def test_store_event_uses_configured_locality(self, locality, expected):
        locality_config = {} if locality is None else {"locality": locality}
        tier, view = _make_tier(
            self.store,
            self.tiers,
            offloading_spec=_make_events_spec(enable_kv_cache_events=True),
            enable_kv_events=True,
            **locality_config,
        )
        try:
            tier.submit_store(make_job(1, [key(1)], [0]))
            assert all(r.success for r in drain(tier))

            events = list(tier.take_events())
            assert len(events) == 1
            assert events[0].locality is expected
            assert_stored(self.store, tier, view, [(key(1), 0)])
        finally:
            tier.shutdown()

    def test_load_job_emits_no_event(self):
        self.tier.submit_store(make_job(1, [key(1)], [0]))
        results = drain(self.tier)
        assert len(results) == 1
        assert results[0].success
        list(self.tier.take_events())

        stored = row_bytes(self.view, 0)
        clear_rows(self.view, [3])
        self.tier.submit_load(make_job(2, [key(1)], [3]))
        results = drain(self.tier)
        assert len(results) == 1
        assert results[0].success
        assert list(self.tier.take_events()) == []
        assert row_bytes(self.view, 3) == stored

    def test_failed_transfer_emits_no_event(self):
        self.store.fail_store(self.tier.namespace, key(1))
        self.tier.submit_store(make_job(1, [key(1)], [0]))
        results = drain(self.tier)
        assert not results[0].success
        assert list(self.tier.take_events()) == []
        assert not self.tier.has_pending_work()
        assert_absent(self.store, self.tier, key(1))

    def test_submission_failure_emits_no_event(self):
        self.tier.submit_store(make_job(1, [key(1)], [9]))  # chunk 9 is outside the pool
        results = list(self.tier.get_finished_jobs())
        assert not results[0].success
        assert list(self.tier.take_events()) == []
        assert not self.tier.has_pending_work()
        assert self.store.names() == []

    def test_events_disabled_by_default(self):
        tier, view = _make_tier(self.store, self.tiers)
        tier.submit_store(make_job(1, [key(1)], [0]))
        results = drain(tier)
        assert len(results) == 1
        assert results[0].success
        assert tier.events_enabled is False
        assert not tier.has_pending_work()
        assert list(tier.take_events()) == []
        assert_stored(self.store, tier, view, [(key(1), 0)])

    def test_events_require_global_kv_events_flag(self):
        """Tier-level opt-in alone is not enough; the global flag gates events."""
        tier, view = _make_tier(
            self.store,
            self.tiers,
            offloading_spec=_make_events_spec(enable_kv_cache_events=False),
            enable_kv_events=True,
        )
        tier.submit_store(make_job(1, [key(1)], [0]))
        results = drain(tier)
        assert len(results) == 1
        assert results[0].success
        assert tier.events_enabled is False
        assert not tier.has_pending_work()
        assert list(tier.take_events()) == []
        assert_stored(self.store, tier, view, [(key(1), 0)])


class TestObjTierKVEventsMixedResults:
    @pytest.fixture(autouse=True)
    def _setup(self, s3_store, tiers):
        self.store = s3_store
        self.tier, self.view = _make_tier(
            s3_store,
            tiers,
            offloading_spec=_make_events_spec(enable_kv_cache_events=True),
            enable_kv_events=True,
            locality="REMOTE",
        )

    def test_mixed_job_results_emit_event_only_for_successful_job(self):
        """With a failed and a successful store job resolving in the same poll,
        exactly one event is emitted and its keys belong to the successful job.
        S3 stores only: a local directory cannot refuse key(1) and take key(2),
        which share a shard directory."""
        self.store.fail_store(self.tier.namespace, key(1))
        self.tier.submit_store(make_job(1, [key(1)], [0]))  # the store refuses it
        self.tier.submit_store(make_job(2, [key(2)], [1]))  # succeeds
        wait_io(self.tier)  # both resolve before the one poll below
        results = list(self.tier.get_finished_jobs())
        by_id = {r.job_id: r for r in results}
        assert not by_id[1].success
        assert by_id[2].success

        events = list(self.tier.take_events())
        assert len(events) == 1
        assert events[0].keys == [key(2)]
        assert not self.tier.has_pending_work()
        assert_stored(self.store, self.tier, self.view, [(key(2), 1)])
        assert_absent(self.store, self.tier, key(1))


class TestObjStoreConfig:
    """vLLM checks ObjStoreConfig.to_nixl_params(); kvtier's translation of the same
    store_config keys is build_tier_config(), and each configuration must also work
    against a real server (one block stored, read back and loaded)."""

    def _roundtrip(self, store: Store, tiers, store_config: dict) -> None:
        tier = KvtierTier(
            offloading_spec=_OFFLOADING_SPEC,
            primary_kv_view=memoryview(torch.rand((2, _BLOCK_ELEMENTS), dtype=_DTYPE).numpy()),
            tier_type="KvtierTier",
            store_config=store_config,
            prefix=store.prefix,
        )
        tiers.append(tier)
        view = tier._primary_kv_view
        k = key(uuid.uuid4().int >> 64)
        tier.submit_store(make_job(1, [k], [0]))
        assert all(r.success for r in drain(tier))
        assert store.read(tier.namespace, k) == row_bytes(view, 0)
        tier.submit_load(make_job(2, [k], [1]))
        assert all(r.success for r in drain(tier))
        assert row_bytes(view, 1) == row_bytes(view, 0)

    def test_explicit_credentials_included(self, s3_store, tiers):
        cfg = build_tier_config({"bucket": "b", "endpoint_override": "ep", "access_key": "ak", "secret_key": "sk"})
        params = cfg["store"]
        assert params["access_key"] == "ak"
        assert params["secret_key"] == "sk"
        self._roundtrip(s3_store, tiers, dict(s3_store.store_config))

    def test_credentials_omitted_when_empty(self, s3_store, tiers, monkeypatch):
        cfg = build_tier_config(
            {"bucket": "b", "endpoint_override": "ep", "access_key": "", "secret_key": "", "session_token": "",
             "region": ""}
        )
        params = cfg["store"]
        assert "access_key" not in params
        assert "secret_key" not in params
        assert "session_token" not in params
        assert "region" not in params
        assert params["bucket"] == "b"
        assert params["endpoint_override"] == "ep"
        # Empty credentials mean "the default chain": here, the environment's.
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_store.store_config["access_key"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_store.store_config["secret_key"])
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        self._roundtrip(s3_store, tiers, dict(s3_store.store_config, access_key="", secret_key=""))

    def test_session_token_and_region_included(self, s3_store, tiers):
        cfg = build_tier_config(
            {"bucket": "b", "endpoint_override": "ep", "access_key": "ak", "secret_key": "sk",
             "session_token": "tok", "region": "us-east-1"}
        )
        params = cfg["store"]
        assert params["session_token"] == "tok"
        assert params["region"] == "us-east-1"
        self._roundtrip(s3_store, tiers, dict(s3_store.store_config, region="us-east-1"))

    def test_ca_bundle_included_when_set(self, s3_store, tiers):
        cfg = build_tier_config({"bucket": "b", "endpoint_override": "ep", "ca_bundle": "/path/to/ca.pem"})
        params = cfg["store"]
        assert params["ca_bundle"] == "/path/to/ca.pem"
        assert "access_key" not in params
        # An empty ca_bundle is "not set" and the tier works as before.
        self._roundtrip(s3_store, tiers, dict(s3_store.store_config, ca_bundle=""))


def test_obj_tier_replicated_layout_collapses_mapper_identity(kv_store, tiers):
    """TP=2 and TP=4 replicated configs share the namespace: what one stores, the
    other finds and loads."""
    tp2_spec = SimpleNamespace(
        config=_make_offloading_config(False, tp_size=2, world_size=2, rank=1, replicated_layout=True),
        blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(enable_kv_cache_events=False, self_describing_kv_events=False),
    )
    tp4_spec = SimpleNamespace(
        config=_make_offloading_config(False, tp_size=4, world_size=4, rank=3, replicated_layout=True),
        blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(enable_kv_cache_events=False, self_describing_kv_events=False),
    )
    tp2_tier, tp2_view = _make_tier(kv_store, tiers, offloading_spec=tp2_spec)
    tp4_tier, tp4_view = _make_tier(kv_store, tiers, offloading_spec=tp4_spec)
    assert tp2_tier.namespace == tp4_tier.namespace
    assert tp2_tier.namespace.endswith("_r0")

    tp2_tier.submit_store(make_job(1, [key(1)], [0]))
    assert all(r.success for r in drain(tp2_tier))
    assert lookup_and_wait(tp4_tier, [key(1)], _CTX) == [LookupResult.HIT]
    tp4_tier.submit_load(make_job(1, [key(1)], [3]))
    assert all(r.success for r in drain(tp4_tier))
    assert row_bytes(tp4_view, 3) == row_bytes(tp2_view, 0)


def test_obj_tier_namespace_includes_blocks_per_chunk(kv_store, tiers):
    """Chunks of different sizes have different layouts, so they must not share object
    keys: a chunk stored with 1 block per chunk is a MISS with 4."""
    made = []
    for blocks_per_chunk in (1, 4):
        spec = SimpleNamespace(
            config=_make_offloading_config(False, blocks_per_chunk=blocks_per_chunk),
            blocks_per_chunk=blocks_per_chunk,
        )
        made.append(_make_tier(kv_store, tiers, offloading_spec=spec))
    (tier1, view1), (tier4, _) = made
    assert tier1.namespace != tier4.namespace
    assert kv_store.name(tier1.namespace, key(1)) != kv_store.name(tier4.namespace, key(1))

    tier1.submit_store(make_job(1, [key(1)], [0]))
    assert all(r.success for r in drain(tier1))
    assert_stored(kv_store, tier1, view1, [(key(1), 0)])
    assert lookup_and_wait(tier4, [key(1)], _CTX) == [LookupResult.MISS]
    assert lookup_and_wait(tier1, [key(1)], ReqContext(req_id="other")) == [LookupResult.HIT]
