"""The thin binding (kvtier.Tier): errors, lifetimes, host pools, jobs, lookups, events."""

from __future__ import annotations

import gc
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import kvtier
from kvtier import JobKind, LookupResult, Status, Tier

from support import make_key, wait_results

PYTHON_DIR = Path(kvtier.__file__).resolve().parent.parent


def local(tmp_path, **extra):
    return {"store": {"type": "local", "path": str(tmp_path / "store")}, **extra}




def test_version_and_status_strings():
    assert kvtier.version() == "0.1.0"
    assert Path(kvtier.library_path()).is_file()
    assert kvtier.status_str(Status.OK) == "ok"
    assert kvtier.status_str(Status.DUPLICATE_JOB) == "duplicate job id"
    assert kvtier.status_str(12345) == "unknown status"


def test_config_errors_carry_status_and_message():
    with pytest.raises(kvtier.ConfigError) as info:
        Tier({"store": {"type": "memory"}, "prefx": "a"})
    err = info.value
    assert err.status is Status.CONFIG
    assert "prefx" in err.message and "prefx" in str(err)
    # Configuration and argument errors are ValueErrors too; every error is a KvtierError.
    assert isinstance(err, ValueError) and isinstance(err, kvtier.KvtierError)
    with pytest.raises(kvtier.ConfigError, match="local"):
        Tier({"store": {"type": "memory"}, "locality": "local"})
    with pytest.raises(kvtier.ConfigError):
        Tier("{not json")


def test_secrets_never_appear_in_errors():
    cfg = {
        "store": {"type": "s3", "bucket": "b", "access_key": "AKIAEXAMPLE", "secret_key": "hunter2-secret", "oops": 1}
    }
    with pytest.raises(kvtier.ConfigError) as info:
        Tier(cfg)
    assert "hunter2" not in str(info.value) and "AKIAEXAMPLE" not in str(info.value)


def test_context_manager_closes_and_close_is_idempotent(tmp_path):
    with Tier(local(tmp_path)) as tier:
        assert not tier.closed
        tier.register_memory(np.zeros((4, 64), np.uint8))
    assert tier.closed
    tier.close()
    tier.shutdown()  # no-op once closed
    with pytest.raises(kvtier.ShutDownError):
        tier.poll()
    with pytest.raises(kvtier.ShutDownError):
        tier.submit_store(1, [0], [make_key(1)])
    assert "closed" in repr(tier)


def roundtrip(tier: Tier, pool_view: np.ndarray, n: int = 3):
    """Stores blocks 0..n-1, loads them back into the last n blocks (reversed)."""
    rows, row_bytes = pool_view.shape
    for i in range(n):
        pool_view[i] = np.frombuffer(os.urandom(row_bytes), np.uint8)
    original = pool_view[:n].copy()
    keys = [make_key(i, salt=str(id(tier))) for i in range(n)]
    tier.submit_store(1, list(range(n)), keys)
    (stored,) = wait_results(tier, 1)
    assert stored.ok and stored.kind is JobKind.STORE and stored.bytes == n * row_bytes
    targets = list(range(rows - 1, rows - 1 - n, -1))
    tier.submit_load(2, np.array(targets, dtype=np.int64), keys)
    (loaded,) = wait_results(tier, 1)
    assert loaded.ok and loaded.kind is JobKind.LOAD, loaded
    for i, t in enumerate(targets):
        assert np.array_equal(pool_view[t], original[i])


def test_numpy_pool(tmp_path):
    with Tier(local(tmp_path)) as tier:
        pool = np.zeros((8, 256), dtype=np.uint8)
        tier.register_memory(pool)
        assert (tier.num_blocks, tier.block_bytes) == (8, 256)
        roundtrip(tier, pool)


def test_bytearray_and_memoryview_pools(tmp_path):
    with Tier(local(tmp_path, prefix="ba")) as tier:
        buf = bytearray(8 * 128)
        tier.register_memory(buf, block_bytes=128)
        roundtrip(tier, np.frombuffer(buf, np.uint8).reshape(8, 128))
    with Tier(local(tmp_path, prefix="mv")) as tier:
        backing = bytearray(6 * 64)
        view = memoryview(backing).cast("B", (6, 64))  # 2-D: block size from the view
        tier.register_memory(view)
        assert (tier.num_blocks, tier.block_bytes) == (6, 64)
        roundtrip(tier, np.frombuffer(backing, np.uint8).reshape(6, 64), n=2)


def test_pool_is_kept_alive_and_pinned(tmp_path):
    with Tier(local(tmp_path)) as tier:
        buf = bytearray(4 * 64)
        tier.register_memory(buf, block_bytes=64)
        with pytest.raises(BufferError):
            buf.extend(b"x")  # the registration holds a buffer export: no realloc under the tier
        del buf
        gc.collect()
        tier.submit_store(7, [1], [make_key(1)])
        (r,) = wait_results(tier, 1)
        assert r.ok


def test_bad_pools_are_refused(tmp_path):
    with Tier(local(tmp_path)) as tier:
        with pytest.raises(ValueError, match="writable"):
            tier.register_memory(bytes(256), block_bytes=64)
        with pytest.raises(ValueError, match="block_bytes"):
            tier.register_memory(bytearray(256))
        with pytest.raises(ValueError, match="whole number"):
            tier.register_memory(bytearray(250), block_bytes=64)
        with pytest.raises(ValueError, match="contiguous"):
            tier.register_memory(np.zeros((8, 64), np.uint8)[:, :32])
        tier.register_memory(np.zeros((4, 64), np.uint8))
        with pytest.raises(kvtier.StateError) as info:
            tier.register_memory(np.zeros((4, 64), np.uint8))
        assert info.value.status is Status.STATE and "registered" in info.value.message


def test_rejected_submission_raises_and_still_yields_one_result(tmp_path):
    with Tier(local(tmp_path)) as tier:
        tier.register_memory(np.zeros((4, 64), np.uint8))
        with pytest.raises(kvtier.InvalidArgumentError) as info:
            tier.submit_store(10, [0, 99], [make_key(1), make_key(2)])
        assert "99" in info.value.message
        with pytest.raises(kvtier.InvalidArgumentError):
            tier.submit_load(11, [], [])  # an empty job is refused, and reported
        (a, b) = sorted(wait_results(tier, 2), key=lambda r: r.job_id)
        assert (a.job_id, a.ok, a.status) == (10, False, Status.INVALID_ARGUMENT)
        assert "99" in a.message
        assert (b.job_id, b.kind, b.ok) == (11, JobKind.LOAD, False)
        assert tier.poll() == []


def test_duplicate_job_id_is_refused_without_a_second_result(tmp_path):
    with Tier(local(tmp_path)) as tier:
        tier.register_memory(np.zeros((4, 64), np.uint8))
        tier.submit_store(5, [0], [make_key(1)])
        with pytest.raises(kvtier.DuplicateJobError):
            tier.submit_store(5, [1], [make_key(2)])
        tier.drain(10_000)
        results = tier.poll()
        assert [r.job_id for r in results] == [5] and results[0].ok
        tier.submit_store(5, [1], [make_key(2)])  # the id is free again once polled
        assert [r.job_id for r in wait_results(tier, 1)] == [5]


def test_errors_before_the_c_call_produce_no_result(tmp_path):
    with Tier(local(tmp_path)) as tier:
        tier.register_memory(np.zeros((4, 64), np.uint8))
        with pytest.raises(ValueError, match="same length"):
            tier.submit_store(1, [0, 1], [make_key(1), b"short-key"])
        with pytest.raises(ValueError, match="block ids"):
            tier.submit_store(2, [0], [make_key(1), make_key(2)])
        with pytest.raises(TypeError):
            tier.submit_store(3, [0.5], [make_key(1)])
        with pytest.raises(TypeError):
            tier.submit_store(4, [0], make_key(1))  # one key, not a list of keys
        tier.drain(1000)
        assert tier.poll() == []


def test_keys_and_block_ids_in_any_accepted_form_make_the_same_job(tmp_path):
    """A list of bytes keys with a numpy array of slots (the usual call, taken at C speed)
    and the general forms (bytearrays, a generator, Python ints) store the same blocks;
    results and events carry the enums (STORE, whose code is 0, included)."""
    with Tier(local(tmp_path, enable_kv_events=True)) as tier:
        pool = np.arange(6 * 64, dtype=np.uint64).astype(np.uint8).reshape(6, 64)
        tier.register_memory(pool)
        keys = [make_key(i) for i in range(3)]
        tier.submit_store(1, np.array([[0], [1], [2]], np.int32), keys)
        tier.submit_store(2, [3, 4, 5], (bytearray(make_key(i, salt="b")) for i in range(3)))
        results = sorted(wait_results(tier, 2), key=lambda r: r.job_id)
        assert [(r.job_id, r.kind, r.status, r.key_status, r.message) for r in results] == [
            (1, JobKind.STORE, Status.OK, (Status.OK,) * 3, ""), (2, JobKind.STORE, Status.OK, (Status.OK,) * 3, "")]
        assert results[0].kind is JobKind.STORE and results[0].status is Status.OK
        events = sorted(tier.take_events(), key=lambda e: e.job_id)
        assert [e.keys for e in events] == [tuple(keys), tuple(make_key(i, salt="b") for i in range(3))]
        assert all(e.locality is kvtier.Locality.UNSET and e.medium == "STORAGE" and not e.removed for e in events)
        tier.submit_load(3, np.array([5, 4, 3], np.int64), [make_key(i) for i in range(3)])
        (loaded,) = wait_results(tier, 1)
        assert loaded.ok and loaded.kind is JobKind.LOAD and loaded.bytes == 3 * 64
        assert (pool[[5, 4, 3]] == pool[[0, 1, 2]]).all()
        with pytest.raises(TypeError):
            tier.submit_store(4, np.array([0.0, 1.0]), keys[:2])
        with pytest.raises(ValueError, match="same length"):
            tier.submit_store(5, np.array([0, 1]), [keys[0], keys[1][:-1]])
        with pytest.raises(ValueError, match="block ids"):
            tier.submit_store(6, np.array([0, 1]), keys)
        # request ids: ints at C speed, numpy integers converted one by one, as before
        assert tier.lookup_batch(np.array([7, 7], np.int64), keys[:2]) == tier.lookup_batch([7, 7], keys[:2])
        tier.drain(1000)
        assert tier.poll() == []


def test_per_key_outcomes_are_copied_out(tmp_path):
    with Tier(local(tmp_path)) as tier:
        tier.register_memory(np.zeros((4, 64), np.uint8))
        tier.submit_store(1, [0], [make_key(1)])
        wait_results(tier, 1)
        tier.submit_load(2, [1, 2], [make_key(1), make_key(2)])  # key 2 was never stored
        (r,) = wait_results(tier, 1)
        assert not r.ok and r.num_failed_keys == 1
        assert r.key_status == (Status.OK, Status.NOT_FOUND)
        assert r.succeeded_indices() == [0]
        assert r.bytes == 64
        tier.poll()  # the C arrays of the previous poll are released here
        assert r.key_status == (Status.OK, Status.NOT_FOUND) and r.message


def test_event_fd_is_readable_while_results_wait(tmp_path):
    with Tier(local(tmp_path)) as tier:
        tier.register_memory(np.zeros((4, 64), np.uint8))
        fd = tier.event_fd()
        assert select.select([fd], [], [], 0)[0] == []
        tier.submit_store(1, [0], [make_key(1)])
        assert select.select([fd], [], [], 10)[0] == [fd]
        assert len(tier.poll()) == 1
        assert select.select([fd], [], [], 0)[0] == []


def test_jobs_in_flight_and_drain(tmp_path):
    with Tier(local(tmp_path)) as tier:
        tier.register_memory(np.zeros((16, 4096), np.uint8))
        for j in range(8):
            tier.submit_store(j, [j * 2, j * 2 + 1], [make_key(2 * j), make_key(2 * j + 1)])
        tier.drain(30_000)
        assert tier.jobs_in_flight() == 0
        assert sorted(r.job_id for r in tier.poll()) == list(range(8))


def test_lookups_events_and_stats(tmp_path):
    with Tier(local(tmp_path, enable_kv_events=True, locality="REMOTE")) as tier:
        tier.register_memory(np.zeros((4, 64), np.uint8))
        keys = [make_key(1), make_key(2)]
        tier.submit_store(1, [0, 1], keys)
        wait_results(tier, 1)
        (event,) = tier.take_events()
        assert event.keys == tuple(keys) and event.medium == "STORAGE"
        assert event.locality is kvtier.Locality.REMOTE and event.job_id == 1
        assert tier.take_events() == []
        assert tier.lookup(1, keys[0]) is LookupResult.RETRY
        assert tier.lookup(1, make_key(3)) is LookupResult.RETRY
        tier.schedule_end()
        deadline = time.monotonic() + 10
        while tier.lookup(1, keys[0]) is LookupResult.RETRY:  # answers raise no fd: poll
            assert time.monotonic() < deadline
            select.select([], [], [], 0.002)
        assert tier.lookup(1, keys[0]) is LookupResult.HIT
        assert tier.lookup(1, make_key(3)) is LookupResult.MISS
        stats = tier.stats()
        assert stats["existence_checks"] == 2 and stats["keys_stored"] == 2 and stats["bytes_stored"] == 128
        tier.request_finished(1)
        with pytest.raises(kvtier.InvalidArgumentError):
            tier.lookup(1, b"tiny")


def test_lookup_batch_answers_as_lookups_one_by_one(tmp_path):
    """``Tier.lookup_batch`` (kvt_tier_lookup_batch): the verdicts and the sharing of
    ``lookup`` asked key after key, in one call; ``events_pending`` and ``stats_raw``."""
    with Tier(local(tmp_path, enable_kv_events=True)) as tier:
        tier.register_memory(np.zeros((4, 64), np.uint8))
        stored, absent = make_key(1), make_key(2)
        assert tier.lookup_batch([], []) == []
        tier.submit_store(1, [0], [stored])
        wait_results(tier, 1)
        assert tier.events_pending() and len(tier.take_events()) == 1 and not tier.events_pending()
        before = tier.stats_raw()
        assert kvtier.tier.stats_dict(before) == tier.stats()
        assert tier.lookup_batch([1, 1, 2], [stored, absent, stored]) == [LookupResult.RETRY] * 3
        assert tier.stats()["existence_checks"] == 0  # nothing is checked before the step ends
        tier.schedule_end()
        deadline = time.monotonic() + 10
        while LookupResult.RETRY in tier.lookup_batch([1, 1], [stored, absent]):  # answers raise no fd: poll
            assert time.monotonic() < deadline
            select.select([], [], [], 0.002)
        assert tier.lookup_batch([2, 1], [stored, absent]) == [LookupResult.HIT, LookupResult.MISS]
        assert tier.lookup(2, absent) is LookupResult.MISS  # 2 joined the shared verdict
        assert tier.stats()["existence_checks"] == 2 and tier.stats_raw() != before
        tier.request_finished(1)
        assert tier.lookup_batch([2], [stored]) == [LookupResult.HIT]  # 2 still holds it
        with pytest.raises(kvtier.InvalidArgumentError):
            tier.lookup_batch([1], [b"tiny"])
        with pytest.raises(ValueError):
            tier.lookup_batch([1], [stored, absent])


def test_delete_removes_named_blocks_with_removed_events(store):
    """``Tier.delete`` (kvt_tier_delete) on every store: the named blocks go (an absent one
    counts as gone), each a BlockRemoved event; their loads fail alone, the others load."""
    store_config = dict(store.store_config) if store.kind == "local" else {"type": "s3", **store.store_config}
    config = {"store": store_config, "prefix": store.prefix, "namespace": "ns", "enable_kv_events": True}
    with Tier(config) as tier:
        pool = np.arange(4 * 64, dtype=np.uint32).astype(np.uint8).reshape(4, 64)
        tier.register_memory(pool)
        keys = [make_key(i, salt="delete") for i in range(3)]
        tier.submit_store(1, [0, 1, 2], keys)
        assert wait_results(tier, 1)[0].ok
        tier.take_events()
        absent = make_key(9, salt="delete")
        report = tier.delete([keys[0], keys[2], absent])
        assert (report["objects"], report["deleted"]) == (3, 3), report
        removed = {k for e in tier.take_events() if e.removed for k in e.keys}
        assert removed == {keys[0], keys[2], absent}
        pool[3] = 0
        tier.submit_load(2, [3], [keys[1]])
        assert wait_results(tier, 1)[0].ok and np.array_equal(pool[3], pool[1])
        tier.submit_load(3, [3], [keys[0]])
        (gone,) = wait_results(tier, 1)
        assert not gone.ok and gone.key_status == (Status.NOT_FOUND,)
        assert tier.delete([]) == {"objects": 0, "bytes": 0, "deleted": 0, "deleted_bytes": 0}
        with pytest.raises(kvtier.InvalidArgumentError):
            tier.delete([b"tiny"])


def test_shutdown_then_submit_yields_failed_result(tmp_path):
    with Tier(local(tmp_path)) as tier:
        tier.register_memory(np.zeros((4, 64), np.uint8))
        tier.shutdown()
        tier.shutdown()
        with pytest.raises(kvtier.ShutDownError):
            tier.submit_store(1, [0], [make_key(1)])
        (r,) = tier.poll()
        assert r.job_id == 1 and r.status is Status.SHUT_DOWN


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR), **env}
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=60)


def test_kvtier_library_overrides_the_bundled_library(tmp_path):
    real = kvtier.library_path()
    ok = _run("import kvtier; print(kvtier.library_path())", KVTIER_LIBRARY=real)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == real
    missing = tmp_path / "nowhere" / "libkvtier.so"
    bad = _run("import kvtier; kvtier.version()", KVTIER_LIBRARY=str(missing))
    assert bad.returncode != 0
    assert str(missing) in bad.stderr and "KVTIER_LIBRARY" in bad.stderr
    # Importing never needs the library; only using it does.
    assert _run("import kvtier, kvtier.vllm", KVTIER_LIBRARY=str(missing)).returncode == 0


def test_stats_fields_match_the_header():
    """The binding's kvt_stats layout is the header's, field for field."""
    import pathlib
    import re

    from kvtier import _native

    header = pathlib.Path(__file__).resolve().parents[2] / "include" / "kvtier.h"
    body = re.search(r"typedef struct kvt_stats \{(.*?)\} kvt_stats;", header.read_text(), re.S).group(1)
    fields = tuple(re.findall(r"uint64_t (\w+);", body))
    assert fields == _native.STATS_FIELDS
