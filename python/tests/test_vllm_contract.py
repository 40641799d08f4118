"""The vLLM tier's contract, driven the way vLLM's tiering manager drives a secondary tier.

Numbers in test names refer to the conformance checklist (§9) of the obj-tier spec.
Every test that takes ``store`` runs on each configured store (local directory, plus
the S3 servers of KVTIER_TEST_S3_CONFIGS).
"""

from __future__ import annotations

import logging
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

import kvtier
from kvtier import vllm as kv_vllm
from kvtier.vllm import KvtierTier, LookupResult, Medium

from conftest import S3S_FS_MAX_KEY_BYTES
from key_layout import object_name
from support import LOOKUP_POLL_S, collect, ctx, make_key, pattern, resolve, wait_for_io

ROW = 512


def job(job_id, keys, slots, promotion=False, req="r"):
    return kv_vllm.TransferJob(
        job_id=job_id,
        keys=list(keys),
        chunk_ids=np.array(slots, dtype=np.int32),
        is_promotion=promotion,
        req_context=ctx(req),
    )


def store_blocks(tier, pool, first_job, items):
    """Stores ``items`` (key -> slot) with one job; waits for its result."""
    keys = list(items)
    for key, slot in items.items():
        pool[slot] = pattern(key, pool.shape[1])
    tier.submit_store(job(first_job, keys, [items[k] for k in keys]))
    return collect(tier, [first_job])[first_job]


def foreign_writer(store, make_tier, namespace="ns", row_bytes=ROW * 2):
    """Another tier on the same objects but with a different block size (a foreign
    deployment sharing the namespace): its objects have the wrong length for ours."""
    tier, pool = make_tier(num_slots=4, row_bytes=row_bytes, namespace=namespace)
    return tier, pool


# -- lookups (10-16) ----------------------------------------------------------------------


def test_10_first_lookup_retries_then_resolves_after_schedule_end(store, make_tier):
    tier, pool = make_tier()
    stored = make_key(1)
    assert store_blocks(tier, pool, 0, {stored: 0}).success
    absent = make_key(2)
    assert tier.lookup(stored, ctx("a")) is LookupResult.RETRY
    assert tier.lookup(absent, ctx("a")) is LookupResult.RETRY
    # Nothing is checked before the step ends: lookups never do I/O.
    assert tier.lookup(stored, ctx("a")) is LookupResult.RETRY
    assert tier.kvtier_stats()["existence_checks"] == 0
    tier.on_schedule_end(None)
    assert resolve(tier, stored, "a") is LookupResult.HIT
    assert resolve(tier, absent, "a") is LookupResult.MISS
    # One check per key, sent by the step's end: the three lookups before it sent none.
    assert tier.kvtier_stats()["existence_checks"] == 2


def test_11_repeated_lookups_issue_no_new_existence_checks(store, make_tier):
    tier, pool = make_tier()
    keys = [make_key(i) for i in range(4)]
    assert store_blocks(tier, pool, 0, {keys[0]: 0, keys[1]: 1}).success
    verdicts = [resolve(tier, k, "a") for k in keys]
    assert verdicts == [LookupResult.HIT, LookupResult.HIT, LookupResult.MISS, LookupResult.MISS]
    checks = tier.kvtier_stats()["existence_checks"]
    assert checks == 4
    for _ in range(20):  # many later steps: cached HIT and cached MISS alike
        for k in keys:
            tier.lookup(k, ctx("a"))
        tier.on_schedule_end(None)
    # A fresh key's check goes through the same lane after any check those steps sent.
    assert resolve(tier, make_key(99), "a") is LookupResult.MISS
    assert tier.kvtier_stats()["existence_checks"] == checks + 1


def test_12_two_requests_share_one_check_and_the_verdict_outlives_one_of_them(store, make_tier):
    tier, pool = make_tier()
    key = make_key(7)
    assert store_blocks(tier, pool, 0, {key: 3}).success
    assert tier.lookup(key, ctx("a")) is LookupResult.RETRY
    assert tier.lookup(key, ctx("b")) is LookupResult.RETRY
    tier.on_schedule_end(None)
    assert resolve(tier, key, "a") is LookupResult.HIT
    assert tier.lookup(key, ctx("b")) is LookupResult.HIT
    assert tier.kvtier_stats()["existence_checks"] == 1
    tier.on_request_finished(ctx("a"))
    assert tier.lookup(key, ctx("b")) is LookupResult.HIT  # b still holds the verdict
    tier.on_schedule_end(None)
    assert tier.kvtier_stats()["existence_checks"] == 1
    tier.on_request_finished(ctx("b"))
    # Nobody holds it any more: a new request checks again.
    assert tier.lookup(key, ctx("c")) is LookupResult.RETRY
    tier.on_schedule_end(None)
    assert resolve(tier, key, "c") is LookupResult.HIT
    assert tier.kvtier_stats()["existence_checks"] == 2


def test_12_negative_verdicts_are_sticky_while_held(store, make_tier):
    tier, pool = make_tier()
    key = make_key(8)
    assert resolve(tier, key, "a") is LookupResult.MISS
    assert store_blocks(tier, pool, 0, {key: 0}).success  # stored meanwhile
    assert resolve(tier, key, "b") is LookupResult.MISS  # shares a's cached verdict
    tier.on_request_finished(ctx("a"))
    tier.on_request_finished(ctx("b"))
    assert resolve(tier, key, "c") is LookupResult.HIT  # re-checked


def test_13_finish_while_in_flight_then_a_new_request_rechecks(store, make_tier):
    # One I/O thread and one check at a time: a later check runs only after an earlier one
    # answered, so a later answer proves the earlier one arrived.
    store_config = dict(store.store_config, max_inflight_lookups=1)
    tier, pool = make_tier(io_threads=1, store_config=store_config)
    key = make_key(9)
    assert store_blocks(tier, pool, 0, {key: 0}).success
    assert tier.lookup(key, ctx("a")) is LookupResult.RETRY
    tier.on_schedule_end(None)  # check in flight
    tier.on_request_finished(ctx("a"))  # finished before the answer was seen
    deadline = time.monotonic() + 30
    while tier.kvtier_stats()["existence_checks"] < 1:  # the orphaned check has started
        assert time.monotonic() < deadline, "the existence check never ran"
        wait_for_io(tier, LOOKUP_POLL_S)
    # c's check waits for the orphaned one's answer: once c resolves, that answer is in.
    assert resolve(tier, make_key(10), "c") is LookupResult.MISS
    assert tier.lookup(key, ctx("b")) is LookupResult.RETRY  # state was dropped with a
    tier.on_schedule_end(None)
    assert resolve(tier, key, "b") is LookupResult.HIT
    assert tier.kvtier_stats()["existence_checks"] == 3


def test_14_failed_existence_check_makes_the_requests_keys_miss(local_only, make_tier):
    store = local_only
    tier, pool = make_tier()
    good = make_key(10)
    assert store_blocks(tier, pool, 0, {good: 0}).success
    # A key whose shard directory is a plain file: its check fails (neither found nor absent).
    broken = next(make_key(i) for i in range(11, 10_000) if make_key(i).hex()[:3] != good.hex()[:3])
    shard = store.local_object("ns", broken).parent.parent
    shard.parent.mkdir(parents=True, exist_ok=True)
    shard.write_bytes(b"not a directory")
    tier.lookup(good, ctx("a"))
    tier.lookup(broken, ctx("a"))
    tier.on_schedule_end(None)
    assert resolve(tier, good, "a") is LookupResult.MISS  # the whole request's batch
    assert resolve(tier, broken, "a") is LookupResult.MISS
    assert tier.kvtier_stats()["existence_check_errors"] >= 1
    # Another request, in another step, still sees the good key.
    tier.on_request_finished(ctx("a"))
    assert resolve(tier, good, "b") is LookupResult.HIT


def test_15_failed_load_marks_only_its_failed_keys_miss(store, make_tier):
    tier, pool = make_tier(num_slots=16)
    foreign, fpool = foreign_writer(store, make_tier)
    good = [make_key(20), make_key(21)]
    bad = make_key(22)
    assert store_blocks(tier, pool, 0, {good[0]: 0, good[1]: 1}).success
    assert store_blocks(foreign, fpool, 0, {bad: 0}).success  # wrong size for our pool
    other = make_key(23)
    assert store_blocks(tier, pool, 1, {other: 2}).success
    for k in good + [bad, other]:
        assert resolve(tier, k, "a") is LookupResult.HIT
    assert resolve(tier, bad, "b") is LookupResult.HIT
    checks = tier.kvtier_stats()["existence_checks"]

    keys = [good[0], bad, good[1]]
    tier.submit_load(job(2, keys, [10, 11, 12], promotion=True, req="a"))
    tier.submit_load(job(3, [other], [13], promotion=True, req="a"))
    results = collect(tier, [2, 3])
    failed, fine = results[2], results[3]
    assert not failed.success
    assert tuple(failed.successful_keys) == (good[0], good[1])
    assert failed.transfer_bytes == 2 * ROW
    assert np.array_equal(pool[10], pattern(good[0], ROW)) and np.array_equal(pool[12], pattern(good[1], ROW))
    assert fine.success and fine.successful_keys is None
    # Only the failed key turns MISS, for every request holding it, without a re-check.
    assert tier.lookup(bad, ctx("a")) is LookupResult.MISS
    assert tier.lookup(bad, ctx("b")) is LookupResult.MISS
    for k in good + [other]:
        assert tier.lookup(k, ctx("a")) is LookupResult.HIT
    assert tier.kvtier_stats()["existence_checks"] == checks
    # Once its holders finish, a later request checks again.
    tier.on_request_finished(ctx("a"))
    tier.on_request_finished(ctx("b"))
    assert resolve(tier, bad, "c") is LookupResult.HIT
    assert tier.kvtier_stats()["existence_checks"] == checks + 1


def test_16_one_batch_per_step_for_all_of_a_requests_keys(store, make_tier):
    tier, pool = make_tier()
    keys = [make_key(100 + i) for i in range(12)]
    assert store_blocks(tier, pool, 0, {k: i for i, k in enumerate(keys[:6])}).success
    for k in keys:
        assert tier.lookup(k, ctx("a")) is LookupResult.RETRY
    for k in keys[:3]:
        assert tier.lookup(k, ctx("b")) is LookupResult.RETRY  # same keys, other request
    tier.on_schedule_end(None)
    deadline = time.monotonic() + 15
    while any(tier.lookup(k, ctx("a")) is LookupResult.RETRY for k in keys):
        assert time.monotonic() < deadline
        wait_for_io(tier, LOOKUP_POLL_S)  # no further on_schedule_end: the one batch answers everything
    assert [tier.lookup(k, ctx("a")) for k in keys] == [LookupResult.HIT] * 6 + [LookupResult.MISS] * 6
    assert tier.kvtier_stats()["existence_checks"] == 12  # deduplicated across requests


# -- transfers and results (17-25) ---------------------------------------------------------


def test_17_roundtrip_into_other_slots_and_objects_are_exactly_one_row(store, make_tier):
    tier, pool = make_tier(num_slots=16)
    keys = [make_key(200 + i, group=i % 3) for i in range(6)]
    src = [5, 0, 9, 2, 7, 3]
    assert store_blocks(tier, pool, 0, dict(zip(keys, src))).success
    dst = [15, 11, 4, 13, 1, 8]  # non-identity slot mapping
    tier.submit_load(job(1, keys, dst, promotion=True))
    (r,) = collect(tier, [1]).values()
    assert r.success and r.successful_keys is None
    for k, s in zip(keys, dst):
        assert np.array_equal(pool[s], pattern(k, ROW))
    if store.kind == "local":
        for k in keys:
            obj = store.local_object("ns", k)
            assert obj.stat().st_size == ROW
            assert obj.read_bytes() == pattern(k, ROW).tobytes()


def test_18_every_job_id_comes_back_exactly_once_and_submission_failures_never_raise(store, make_tier):
    tier, pool = make_tier(num_slots=8)
    k = [make_key(300 + i) for i in range(4)]
    pool[0] = pattern(k[0], ROW)
    submissions = [
        ("store", job(0, [k[0]], [0])),  # fine
        ("store", job(1, [k[1]], [99])),  # slot out of range
        ("store", job(2, [k[2]], [-1])),  # negative slot
        ("load", job(3, [k[0], k[1]], [4, 4])),  # one slot twice in a load
        ("store", job(4, [b"\0\0\0\0"], [1])),  # malformed key: a group index and no hash
        ("load", job(5, [k[3]], [6])),  # object absent
        ("store", job(6, [], [])),  # empty job: completes at once
    ]
    for kind, j in submissions:
        (tier.submit_store if kind == "store" else tier.submit_load)(j)  # never raises
    results = collect(tier, range(7))
    assert {i: r.success for i, r in results.items()} == {
        0: True,
        1: False,
        2: False,
        3: False,
        4: False,
        5: False,
        6: True,
    }
    # A later job's result comes after any second result of the earlier ones would have.
    assert store_blocks(tier, pool, 7, {make_key(777): 7}).success  # collect() fails on a repeat
    assert tier.get_finished_jobs() == []
    # Ids are free again once reported.
    tier.submit_store(job(1, [k[1]], [1]))
    assert collect(tier, [1])[1].success


def test_18_submission_failures_appear_at_the_next_poll(store, make_tier):
    tier, _ = make_tier(num_slots=4)
    tier.submit_store(job(0, [make_key(1)], [42]))
    (r,) = tier.get_finished_jobs()
    assert (r.job_id, r.success) == (0, False)


def test_19_a_job_is_reported_only_when_complete(store, make_tier):
    tier, pool = make_tier(num_slots=64, row_bytes=64 * 1024)
    keys = [make_key(400 + i) for i in range(32)]
    for i, key in enumerate(keys):
        pool[i] = pattern(key, pool.shape[1])
    tier.submit_store(job(0, keys, range(32)))
    assert collect(tier, [0])[0].success
    tier.submit_load(job(1, keys, range(32, 64), promotion=True))
    r = None
    deadline = time.monotonic() + 15
    while r is None:  # PROC ... then DONE; when reported, every byte is in place
        assert time.monotonic() < deadline
        got = tier.get_finished_jobs()
        if got:
            (r,) = got
    assert r.success
    for i, key in enumerate(keys):
        assert np.array_equal(pool[32 + i], pattern(key, pool.shape[1]))


def test_20_jobs_complete_independently_with_mixed_outcomes(store, make_tier):
    tier, pool = make_tier(num_slots=16)
    keys = [make_key(500 + i) for i in range(4)]
    assert store_blocks(tier, pool, 0, {keys[0]: 0, keys[1]: 1}).success
    tier.submit_load(job(1, [keys[0]], [8], promotion=True))
    tier.submit_load(job(2, [keys[2]], [9], promotion=True))  # absent
    tier.submit_store(job(3, [keys[3]], [3]))
    tier.submit_store(job(4, [keys[3]], [77]))  # bad slot
    tier.drain_jobs()
    results = {r.job_id: r for r in tier.get_finished_jobs()}  # all in one poll
    assert {i: r.success for i, r in results.items()} == {1: True, 2: False, 3: True, 4: False}
    assert results[2].successful_keys is None  # nothing loaded: all share success=False


def test_21_transfer_bytes_and_time(store, make_tier):
    tier, pool = make_tier(num_slots=8)
    keys = [make_key(600 + i) for i in range(5)]
    r = store_blocks(tier, pool, 0, {k: i for i, k in enumerate(keys)})
    assert r.success and r.transfer_bytes == 5 * ROW and r.transfer_time >= 0
    tier.submit_load(job(1, keys[:3], [5, 6, 7], promotion=True))
    r = collect(tier, [1])[1]
    assert r.success and r.transfer_bytes == 3 * ROW and r.transfer_time >= 0


def test_22_drain_jobs_returns_when_nothing_is_in_flight(store, make_tier):
    tier, pool = make_tier(num_slots=64, row_bytes=32 * 1024)
    for j in range(16):
        keys = [make_key(700 + 4 * j + i) for i in range(4)]
        tier.submit_store(job(j, keys, range(4 * j, 4 * j + 4)))
    tier.drain_jobs()
    assert tier.tier.jobs_in_flight() == 0
    results = tier.get_finished_jobs()  # all queued for the next call
    assert sorted(r.job_id for r in results) == list(range(16)) and all(r.success for r in results)


def test_22_drain_jobs_warns_after_five_seconds_and_never_gives_up(monkeypatch, caplog):
    class SlowTier:
        def __init__(self):
            self.calls = 0

        def drain(self, timeout_ms):
            self.calls += 1
            if self.calls < 8:
                raise kvtier.TimedOutError(kvtier.Status.TIMEOUT, "still busy")

        def jobs_in_flight(self):
            return 3

    clock = iter(float(t) for t in range(0, 100, 2))
    monkeypatch.setattr(kv_vllm.adapter, "_monotonic", lambda: next(clock))
    tier = KvtierTier.__new__(KvtierTier)
    tier._tier = SlowTier()
    with caplog.at_level(logging.WARNING, logger="kvtier.vllm"):
        tier.drain_jobs()
    assert tier._tier.calls == 8
    warnings = [r for r in caplog.records if "stuck transfer" in r.getMessage()]
    assert len(warnings) == 1


def test_23_a_partly_failed_load_is_reported_after_all_of_its_objects(store, make_tier):
    tier, pool = make_tier(num_slots=40, row_bytes=64 * 1024)
    keys = [make_key(800 + i) for i in range(16)]
    for i, key in enumerate(keys):
        pool[i] = pattern(key, pool.shape[1])
    tier.submit_store(job(0, keys, range(16)))
    assert collect(tier, [0])[0].success
    missing = make_key(899)
    load_keys = [missing] + keys  # the failure comes first, 16 good loads follow
    tier.submit_load(job(1, load_keys, range(20, 37), promotion=True))
    r = collect(tier, [1])[1]
    assert not r.success and tuple(r.successful_keys) == tuple(keys)
    snapshot = pool[21:37].copy()
    for i, key in enumerate(keys):
        assert np.array_equal(snapshot[i], pattern(key, pool.shape[1]))
    # Another job runs through the same I/O runtime after the report; then compare again.
    assert store_blocks(tier, pool, 2, {make_key(898): 1}).success
    assert np.array_equal(pool[21:37], snapshot)  # nothing writes after the report


def test_24_an_object_of_the_wrong_length_fails_its_key(store, make_tier):
    tier, pool = make_tier(num_slots=8)
    for row_bytes in (ROW * 2, ROW // 2):
        foreign, fpool = foreign_writer(store, make_tier, row_bytes=row_bytes)
        key = make_key(f"len-{row_bytes}")
        assert store_blocks(foreign, fpool, 0, {key: 1}).success
        pool[5] = 0xAB
        tier.submit_load(job(1, [key], [5], promotion=True))
        r = collect(tier, [1])[1]
        assert not r.success and r.successful_keys is None and r.transfer_bytes == 0


def test_25_shutdown_is_idempotent_and_the_tier_stays_harmless(store, make_tier):
    tier, pool = make_tier(num_slots=32, row_bytes=64 * 1024)
    keys = [make_key(900 + i) for i in range(32)]
    tier.submit_store(job(0, keys, range(32)))
    tier.shutdown()  # waits for transfers in progress; nothing touches the pool afterwards
    assert tier.tier is None
    tier.shutdown()
    pool[:] = 1  # free for reuse
    tier.submit_store(job(1, keys[:1], [0]))  # never raises
    tier.submit_load(job(2, keys[:1], [1]))
    assert sorted((r.job_id, r.success) for r in tier.get_finished_jobs()) == [(1, False), (2, False)]
    assert tier.lookup(keys[0], ctx("a")) is LookupResult.MISS
    tier.on_schedule_end(None)
    tier.on_request_finished(ctx("a"))
    tier.drain_jobs()
    assert tier.take_events() == []


# -- events (26-27) --------------------------------------------------------------------------


@pytest.mark.parametrize("locality", [None, "LOCAL", "REMOTE"])
def test_26_one_event_per_successful_store_job(store, make_tier, locality):
    tier, pool = make_tier(enable_kv_events=True, locality=locality)
    a = [make_key(1000 + i) for i in range(3)]
    b = [make_key(1010 + i) for i in range(2)]
    assert store_blocks(tier, pool, 0, {a[2]: 0, a[0]: 1, a[1]: 2}).success
    assert store_blocks(tier, pool, 1, {b[0]: 3, b[1]: 4}).success
    events = tier.take_events()
    assert [list(e.keys) for e in events] == [[a[2], a[0], a[1]], b]  # job order, keys in order
    for e in events:
        assert e.medium is Medium.STORAGE and e.removed is False
        expected = None if locality is None else kv_vllm.Locality(locality)
        assert getattr(e, "locality", None) == expected
    assert tier.take_events() == []  # drained


def test_27_no_events_for_loads_failures_or_submission_failures(store, make_tier):
    tier, pool = make_tier(enable_kv_events=True)
    key = make_key(1100)
    assert store_blocks(tier, pool, 0, {key: 0}).success
    assert len(tier.take_events()) == 1
    tier.submit_load(job(1, [key], [5], promotion=True))  # successful load
    tier.submit_load(job(2, [make_key(1101)], [6], promotion=True))  # failed load
    tier.submit_store(job(3, [make_key(1102)], [99]))  # submission failure
    tier.submit_store(job(4, [b"bad"], [1]))  # malformed key
    collect(tier, [1, 2, 3, 4])
    assert tier.take_events() == []


def test_27_events_are_off_by_default_and_need_the_global_flag(store, make_tier, caplog):
    tier, pool = make_tier()
    assert store_blocks(tier, pool, 0, {make_key(1200): 0}).success
    assert tier.take_events() == []
    spec = SimpleNamespace(kv_events_config=SimpleNamespace(enable_kv_cache_events=False))
    with caplog.at_level(logging.WARNING, logger="kvtier.vllm"):
        quiet, qpool = make_tier(spec=spec, namespace="ns", enable_kv_events=True)
    assert any("disabled globally" in r.getMessage() for r in caplog.records)
    assert store_blocks(quiet, qpool, 0, {make_key(1201): 0}).success
    assert quiet.take_events() == []
    spec.kv_events_config.enable_kv_cache_events = True
    loud, lpool = make_tier(spec=spec, namespace="ns", enable_kv_events=True)
    assert store_blocks(loud, lpool, 0, {make_key(1202): 0}).success
    assert len(loud.take_events()) == 1


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["local", "", "Local", "REMOTE ", 1, True])
def test_bad_locality_is_a_value_error(tmp_path, bad):
    with pytest.raises(ValueError):
        KvtierTier(None, np.zeros((2, 64), np.uint8), "kvtier", store_config={"type": "memory"}, locality=bad)


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="colour"):
        KvtierTier(None, np.zeros((2, 64), np.uint8), "kvtier", store_config={"type": "memory"}, colour="red")
    with pytest.raises(TypeError, match="store_config"):
        KvtierTier(None, np.zeros((2, 64), np.uint8), "kvtier")


def test_vllms_factory_call_shape_is_accepted():
    """SecondaryTierFactory: tier_cls(offloading_spec=..., primary_kv_view=..., tier_type=..., **config)."""
    entry = {"type": "ObjectStoreTier", "module_path": "kvtier.vllm", "store_config": {"type": "memory"}, "prefix": "p"}
    config = dict(entry)
    module = __import__(config.pop("module_path"), fromlist=["x"])
    cls = getattr(module, config.pop("type"))
    assert cls is KvtierTier
    view = memoryview(bytearray(8 * 256)).cast("B", (8, 256))
    tier = cls(
        offloading_spec=None,
        primary_kv_view=view,
        tier_type="ObjectStoreTier",
        backpressure_detector=None,
        namespace="ns",
        **config,
    )
    try:
        assert (tier.num_slots, tier.row_bytes, tier.tier_type) == (8, 256, "ObjectStoreTier")
        assert isinstance(tier.on_new_request(ctx("a")), kv_vllm.RequestOffloadingContext)
    finally:
        tier.shutdown()


def test_unknown_store_config_key_and_bad_types_fail_construction():
    pool = np.zeros((2, 64), np.uint8)
    with pytest.raises(kvtier.ConfigError, match="colour"):
        KvtierTier(None, pool, "kvtier", store_config={"type": "memory", "colour": 1}, namespace="n")
    with pytest.raises(ValueError, match="bucket"):
        KvtierTier(None, pool, "kvtier", store_config={}, namespace="n")
    with pytest.raises(ValueError, match="dell"):
        KvtierTier(None, pool, "kvtier", store_config={"bucket": "b", "type": "dell"}, namespace="n")
    with pytest.raises(ValueError, match="2-D"):
        KvtierTier(None, bytearray(128), "kvtier", store_config={"type": "memory"}, namespace="n")


def test_store_config_translation():
    cfg = kv_vllm.build_tier_config(
        {
            "bucket": "kv",
            "endpoint_override": "127.0.0.1:9000",
            "access_key": "",
            "secret_key": "",
            "session_token": "",
            "region": "",
            "ca_bundle": "",
            "req_checksum": None,
            "max_inflight_transfers": 8,
            "dedup": "off",
            "request_timeout_ms": 1000,
        },
        prefix="p",
        namespace="ns",
        io_threads=4,
        enable_kv_events=True,
        locality="REMOTE",
    )
    assert cfg["store"] == {
        "type": "s3",
        "bucket": "kv",
        "endpoint_override": "127.0.0.1:9000",
        "scheme": "http",  # vLLM's default
        "request_timeout_ms": 1000,
    }
    assert cfg["max_inflight_transfers"] == 8 and cfg["dedup"] == "off"  # lifted to the tier
    assert cfg["runtime_threads"] == 4 and cfg["key_bytes"] == 0
    assert (cfg["prefix"], cfg["namespace"], cfg["locality"], cfg["enable_kv_events"]) == ("p", "ns", "REMOTE", True)
    explicit = kv_vllm.build_tier_config(
        {"bucket": "kv", "endpoint_override": "h", "scheme": "https", "access_key": "a", "secret_key": "s"}
    )
    assert explicit["store"]["scheme"] == "https" and explicit["store"]["access_key"] == "a"
    aws = kv_vllm.build_tier_config({"bucket": "kv"})
    assert "scheme" not in aws["store"]  # no endpoint: AWS over https
    with pytest.raises(ValueError, match="reserved"):
        kv_vllm.build_tier_config({"bucket": "kv", "backend_params": {"bucket": "x"}})
    with pytest.raises(ValueError, match="accelerated"):
        kv_vllm.build_tier_config({"bucket": "kv", "accelerated": "true"})


def test_keys_of_other_hash_lengths_are_accepted(store, make_tier, request):
    """vLLM's key is hash + 4 bytes, the hash of any length: xxhash makes 8 bytes, sha256
    32, and vLLM's own tests use 1-byte hashes. On s3s-fs a key whose object name is too
    long for s3s-fs to keep its metadata is left out (the server answers 500 after writing
    the data, and kvtier rightly reports the store failed)."""
    tier, pool = make_tier()
    on_s3s_fs = request.node.callspec.id == "s3s-fs"
    for slot, hash_bytes in enumerate((1, 2, 3, 8, 64)):
        key = os.urandom(hash_bytes) + (1).to_bytes(4, "big")
        if on_s3s_fs and len(object_name(store.prefix, "ns", key)) > S3S_FS_MAX_KEY_BYTES:
            assert hash_bytes == 64, hash_bytes
            continue
        assert store_blocks(tier, pool, slot, {key: slot}).success, hash_bytes
        assert resolve(tier, key, "a") is LookupResult.HIT, hash_bytes


def test_construction_failure_releases_everything(tmp_path, monkeypatch):
    """A tier whose pool is refused is closed before the constructor raises: neither its
    handle nor its I/O runtime outlives the failed construction."""
    opened = []

    class RecordedTier(kvtier.Tier):
        def __init__(self, config):
            super().__init__(config)
            opened.append(self)

    monkeypatch.setattr(kv_vllm.adapter, "Tier", RecordedTier)
    pool = np.zeros((4, 64), np.uint8)[:, :32]  # not contiguous: registration refused
    with pytest.raises(ValueError, match="C-contiguous"):
        KvtierTier(None, pool, "kvtier", store_config={"type": "local", "path": str(tmp_path)}, namespace="n")
    assert len(opened) == 1
    assert opened[0].closed


def test_unreachable_store_fails_construction_with_an_actionable_message(tmp_path):
    pool = np.zeros((4, 64), np.uint8)
    cfg = {
        "bucket": "kv",
        "endpoint_override": "127.0.0.1:1",
        "access_key": "AKIDEXAMPLE",
        "secret_key": "s3cr3t-value",
        "connect_timeout_ms": 300,
        "max_retries": 0,
    }
    with pytest.raises(kvtier.KvtierError) as info:
        KvtierTier(None, pool, "kvtier", store_config=cfg, namespace="n")
    assert isinstance(info.value, RuntimeError)  # as vLLM's obj tier raises
    assert "endpoint_override" in str(info.value)
    assert "s3cr3t" not in str(info.value) and "AKIDEXAMPLE" not in str(info.value)


def test_a_job_mixing_hash_lengths_has_one_result_with_its_loaded_keys(store, make_tier):
    """vLLM's keys have the length of their hash, and one job may mix lengths."""
    tier, pool = make_tier(num_slots=8)
    group = (0).to_bytes(4, "big")
    keys = [b"\x01" + group, make_key(1), b"\x02\x03" + group]
    r = store_blocks(tier, pool, 0, {k: i for i, k in enumerate(keys)})
    assert r.success and r.transfer_bytes == 3 * ROW
    missing = b"\x04\x05" + group
    load_keys = [keys[0], missing, keys[1], keys[2]]
    tier.submit_load(job(1, load_keys, [4, 5, 6, 7], promotion=True))
    (result,) = collect(tier, [1]).values()
    assert not result.success
    assert tuple(result.successful_keys) == (keys[0], keys[1], keys[2])  # in job order
    assert result.transfer_bytes == 3 * ROW
    for slot, key in zip([4, 6, 7], keys):
        assert np.array_equal(pool[slot], pattern(key, ROW))
    assert tier.get_finished_jobs() == [] and not tier.has_pending_work()
