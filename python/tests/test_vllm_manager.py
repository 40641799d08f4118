"""kvtier inside vLLM 0.33's own tiering manager.

Every engine here is built by vLLM's code from a ``secondary_tiers`` entry shaped like the
README's: vLLM's ``SecondaryTierFactory`` imports ``kvtier.vllm`` by ``module_path`` and
constructs the tier, ``TieringOffloadingSpec.get_manager()`` wires it under the CPU
primary tier, and the tests drive the ``TieringOffloadingManager`` through its public
methods, playing the GPU worker on the primary tier's memory. Nothing of vLLM is stubbed.

Each test runs on the local-directory store and on the S3 servers of the session
(s3s-fs and moto when ``KVTIER_TEST_S3_SERVERS=1``), with chunks of 1 and 4 blocks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import select
import signal
import uuid

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="needs vLLM (scripts/install-tools.sh installs it)")

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import OffloadingEventsTracker  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    Locality,
    LookupResult,
    Medium,
    OffloadingKVEventsConfig,
    make_offload_key,
)
from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash  # noqa: E402
from vllm.v1.kv_offload.file_mapper import FileMapper  # noqa: E402
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

import kvtier  # noqa: E402
from kvtier import vllm as kv_vllm  # noqa: E402
from kvtier._native import STATS_FIELDS  # noqa: E402
from vllm_engine import BLOCK_BYTES, Engine, content, kvtier_tier  # noqa: E402
from vllm_engine import kvtier_entry as tier_entry  # noqa: E402

MODEL = "org/modèle-ü"


@pytest.fixture(params=[1, 4], ids=["chunk1", "chunk4"])
def blocks_per_chunk(request) -> int:
    return request.param


@pytest.fixture
def engines(store, blocks_per_chunk):
    """Factory of engines over ``store``; every one is shut down at teardown."""
    made: list[Engine] = []

    def make(**overrides) -> Engine:
        entry = tier_entry(store, **overrides.pop("entry", {}))
        engine = Engine([entry], model=MODEL, blocks_per_chunk=blocks_per_chunk, **overrides)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown()


def chunk_key(i, salt: str) -> bytes:
    """A chunk's OffloadKey: a SHA-256 block hash (vLLM's default) and group 0."""
    return make_offload_key(hashlib.sha256(f"{salt}-{i}".encode()).digest(), 0)


def blocks_for(engine: Engine, keys) -> dict[bytes, np.ndarray]:
    return {k: content(k, engine.pool.shape[1]) for k in keys}


# -- construction by vLLM's factory --------------------------------------------------------


def test_vllms_factory_builds_the_readme_entry(engines, blocks_per_chunk):
    engine = engines()
    tier = kvtier_tier(engine)
    assert tier.tier_type == "KvtierTier"
    assert tier.locality is Locality.REMOTE and tier.events_enabled
    assert tier.medium is Medium.STORAGE
    assert tier.bp_detector is None
    assert (tier.num_slots, tier.row_bytes) == engine.pool.shape
    assert tier.row_bytes == BLOCK_BYTES * blocks_per_chunk
    # The namespace is the one vLLM's own obj tier uses for this spec.
    mapper = FileMapper.from_offloading_spec(
        "", engine.spec, blocks_per_file=blocks_per_chunk, parallel_agnostic=True
    )
    assert tier.namespace == f"{mapper.base_path.rsplit('/', 1)[-1]}_r{mapper.rank}"
    assert tier.namespace.startswith("org_modèle-ü_")


def test_chunk_sizes_get_different_namespaces(store):
    names = []
    for bpc in (1, 4):
        engine = Engine([tier_entry(store)], model=MODEL, blocks_per_chunk=bpc)
        try:
            names.append(kvtier_tier(engine).namespace)
        finally:
            engine.shutdown()
    assert names[0] != names[1]


def test_a_backpressure_block_reaches_the_tier(engines):
    engine = engines(entry={"backpressure": {"backpressure_cls": "EMABackpressureDetector"}})
    tier = kvtier_tier(engine)
    assert isinstance(tier.bp_detector, BackpressureDetector)
    keys = [chunk_key(i, "bp") for i in range(3)]
    engine.store("r", blocks_for(engine, keys))
    engine.settle()
    # The manager fed the detector from kvtier's results (transfer_bytes, no failure).
    assert tier.bp_detector.stats


# -- the whole life of a block through the manager ---------------------------------------------


def test_cascade_then_a_second_engine_promotes_byte_exact(engines):
    writer = engines()
    keys = [chunk_key(i, "life") for i in range(6)]
    blocks = blocks_for(writer, keys)
    writer.store("r1", dict(list(blocks.items())[:3]))
    writer.store("r1", dict(list(blocks.items())[3:]))
    tier = kvtier_tier(writer)
    assert tier.has_pending_work()  # submitted, not yet reported to the manager
    writer.settle()
    assert not tier.has_pending_work()
    assert tier.kvtier_stats()["keys_stored"] == 6

    # Events: the manager hands kvtier's BlockStored events to vLLM's tracker.
    stored = [e for e in writer.events if e.medium is Medium.STORAGE]
    assert sorted(list(e.keys) for e in stored) == sorted([keys[:3], keys[3:]])
    assert all(e.locality is Locality.REMOTE and not e.removed for e in stored)
    tracker = OffloadingEventsTracker(OffloadingKVEventsConfig(True, False))
    kv_events = list(tracker.take_events(stored))
    assert len(kv_events) == 6
    expected = {maybe_convert_block_hash(BlockHash(k[:-4])) for k in keys}
    assert {e.block_hashes[0] for e in kv_events} == expected
    assert {(e.medium, e.locality) for e in kv_events} == {("STORAGE", "REMOTE")}
    writer.finish("r1")

    reader = engines()
    assert [reader.lookup(k, "r2") for k in keys] == [LookupResult.RETRY] * 6
    verdicts = reader.promote(keys, "r2")
    assert set(verdicts.values()) == {LookupResult.HIT}
    for key, row in zip(keys, reader.read(keys, "r2")):
        assert np.array_equal(row, blocks[key])
    assert kvtier_tier(reader).kvtier_stats()["keys_loaded"] == 6


def test_evicted_chunks_reach_vllm_as_block_removed_events(store, engines, blocks_per_chunk):
    """A tier with a byte budget deletes its oldest chunks; vLLM's manager and events
    tracker receive one BlockRemoved per deleted chunk, and the chunks then MISS."""
    chunk_bytes = BLOCK_BYTES * blocks_per_chunk
    budget = 3 * chunk_bytes
    eviction = {"max_bytes": budget, "interval_ms": 3_600_000}
    writer = engines(entry={"store_config": {**store.store_config, "eviction": eviction}})
    keys = [chunk_key(i, "evict") for i in range(6)]
    for key in keys:  # one at a time: each chunk's object is older than the next one's
        writer.store("w", blocks_for(writer, [key]))
        writer.settle()
    tier = kvtier_tier(writer)
    report = tier._tier.evict_now()
    assert report["deleted"] == 3 and report["bytes"] - report["deleted_bytes"] <= budget
    writer.step()
    removed = [e for e in writer.events if e.medium is Medium.STORAGE and e.removed]
    # Oldest first by the store's modification times (ties, within a clock tick or a
    # second on S3, are broken by name): which three is the store's call.
    gone = [k for e in removed for k in e.keys]
    assert len(gone) == len(set(gone)) == 3 and set(gone) <= set(keys)
    kv_events = list(OffloadingEventsTracker(OffloadingKVEventsConfig(True, False)).take_events(removed))
    assert {type(e).__name__ for e in kv_events} == {"BlockRemoved"}
    expected = {maybe_convert_block_hash(BlockHash(k[:-4])) for k in gone}
    assert {h for e in kv_events for h in e.block_hashes} == expected
    assert tier.kvtier_stats()["evicted_blocks"] == 3
    reader = engines()
    verdicts = reader.promote(keys, "r")
    assert {k: verdicts[k] for k in keys} == {k: LookupResult.MISS if k in gone else LookupResult.HIT for k in keys}


def test_keys_of_short_hashes_as_vllms_own_tests_make_them(engines):
    """make_offload_key takes a hash of any length; vLLM's tier tests use 1-2 byte ones."""
    writer = engines()
    keys = [make_offload_key(str(i).encode(), 0) for i in range(12)]
    blocks = blocks_for(writer, keys)
    writer.store("w", blocks)
    writer.settle()
    assert kvtier_tier(writer).kvtier_stats()["keys_stored"] == 12
    reader = engines()
    assert set(reader.promote(keys, "r").values()) == {LookupResult.HIT}
    for key, row in zip(keys, reader.read(keys, "r")):
        assert np.array_equal(row, blocks[key])


def test_absent_chunks_retry_then_miss(engines):
    engine = engines()
    absent = [chunk_key(i, "absent") for i in range(3)]
    assert [engine.lookup(k, "r") for k in absent] == [LookupResult.RETRY] * 3
    assert [engine.resolve(k, "r") for k in absent] == [LookupResult.MISS] * 3
    assert kvtier_tier(engine).kvtier_stats()["keys_loaded"] == 0


def test_a_truncated_object_fails_only_its_chunk(engines, store):
    writer = engines()
    keys = [chunk_key(i, "partial") for i in range(3)]
    blocks = blocks_for(writer, keys)
    writer.store("w", {keys[0]: blocks[keys[0]], keys[2]: blocks[keys[2]]})
    writer.settle()
    # The middle chunk's object is half as long as a chunk (another writer's block size).
    namespace = kvtier_tier(writer).namespace
    row = writer.pool.shape[1]
    short = kvtier.Tier(kv_vllm.build_tier_config(store.store_config, prefix=store.prefix, namespace=namespace))
    try:
        half = np.zeros((1, row // 2), dtype=np.uint8)
        short.register_memory(half)
        short.submit_store(1, [0], [keys[1]])
        short.drain(30_000)
        (outcome,) = short.poll()
        assert outcome.ok
    finally:
        short.close()

    reader = engines()
    verdicts = reader.promote(keys, "r")
    assert verdicts == {keys[0]: LookupResult.HIT, keys[1]: LookupResult.MISS, keys[2]: LookupResult.HIT}
    rows = reader.read([keys[0], keys[2]], "r")
    assert np.array_equal(rows[0], blocks[keys[0]]) and np.array_equal(rows[1], blocks[keys[2]])
    # The failed chunk stays a MISS for this request: no promotion loop.
    assert reader.lookup(keys[1], "r") is LookupResult.MISS


def test_an_encrypted_tier_round_trips_and_others_miss(engines, store, tmp_path):
    """The ``encryption`` block in vLLM's ``store_config``: chunks sealed by one engine are
    promoted byte-exact by another with the keyring; an engine without encryption, and one
    whose keyring lacks the key, get MISS (never the bytes), and the latter counts them."""
    import base64
    import json
    import os

    def ring(path, key_id):
        path.write_text(json.dumps({"write": key_id, "keys": {key_id: base64.b64encode(os.urandom(32)).decode()}}))
        return {"keyring_file": str(path)}

    sealed = ring(tmp_path / "ring.json", "v1")
    stranger = ring(tmp_path / "other.json", "v1")

    def encrypted(encryption):
        return engines(entry={"store_config": dict(store.store_config, encryption=encryption)})

    writer = encrypted(sealed)
    keys = [chunk_key(i, "sealed") for i in range(3)]
    blocks = blocks_for(writer, keys)
    writer.store("w", blocks)
    writer.settle()
    assert kvtier_tier(writer).kvtier_stats()["keys_stored"] == 3

    reader = encrypted(sealed)
    assert set(reader.promote(keys, "r").values()) == {LookupResult.HIT}
    for key, row in zip(keys, reader.read(keys, "r")):
        assert np.array_equal(row, blocks[key])

    plain = engines()
    assert set(plain.promote(keys, "p").values()) == {LookupResult.MISS}
    wrong_key = encrypted(stranger)
    assert set(wrong_key.promote(keys, "s").values()) == {LookupResult.MISS}
    assert kvtier_tier(wrong_key).kvtier_stats()["undecryptable_blocks"] == 3


def test_reset_cache_drains_the_tier_and_loses_nothing(engines):
    writer = engines()
    keys = [chunk_key(i, "reset") for i in range(24)]
    blocks = blocks_for(writer, keys)
    for i in range(0, 24, 4):
        writer.store("w", {k: blocks[k] for k in keys[i : i + 4]})
    tier = kvtier_tier(writer)
    writer.evict_all()  # reset_cache with the cascades in flight: drain_jobs, then reset
    assert tier.tier.jobs_in_flight() == 0
    writer.finish("w")
    writer.settle()
    assert tier.kvtier_stats()["keys_stored"] == 24

    verdicts = writer.promote(keys, "again")  # the primary tier is empty now
    assert set(verdicts.values()) == {LookupResult.HIT}
    for key, row in zip(keys, writer.read(keys, "again")):
        assert np.array_equal(row, blocks[key])


def test_shutdown_stops_the_tier_and_is_idempotent(engines):
    engine = engines()
    keys = [chunk_key(i, "shutdown") for i in range(4)]
    engine.store("r", blocks_for(engine, keys))
    tier = kvtier_tier(engine)
    engine.shutdown()
    assert tier.tier is None and not tier.has_pending_work()
    engine.shutdown()
    tier.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_fork_child_gets_every_job_back_failed(engines):
    """In a fork() child the parent's tier answers FORKED and yields no result: the
    adapter must finish the child's jobs itself (failed), and the ones the parent had in
    flight, or vLLM's manager waits for them forever."""
    engine = engines()
    tier = kvtier_tier(engine)
    engine.store("parent", blocks_for(engine, [chunk_key(i, "fork-parent") for i in range(4)]))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        try:
            results = []
            collect = tier.get_finished_jobs
            tier.get_finished_jobs = lambda: _tap(collect, results)  # what vLLM's manager collects
            engine.store("child", blocks_for(engine, [chunk_key(i, "fork-child") for i in range(4)]))
            engine.step()
            engine.until(lambda: not tier.has_pending_work(), "every job of the child finished")
            failed = [r for r in results if not r.success]
            message = "ok" if failed and len(failed) == len(results) else f"results {results}"
        except BaseException as exc:  # noqa: BLE001
            message = __import__('traceback').format_exc()
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 120)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        message = os.read(read_end, 65536).decode() if ready else "the child hung"
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert message == "ok"
    engine.settle()  # the parent's own tier is untouched by the child
    assert tier.kvtier_stats()["keys_stored"] == 4


def _tap(collect, results: list) -> list:
    finished = collect()
    results.extend(finished)
    return finished


# -- metrics and config info --------------------------------------------------------------------


def test_kvtier_metrics_are_declared_and_reported_through_the_manager(engines, blocks_per_chunk):
    engine = engines()
    definitions = TieringOffloadingSpec.build_metric_definitions(engine.config.extra_config)
    assert set(kv_vllm.STAT_HELP) == set(STATS_FIELDS)  # every counter of kvt_stats
    for name in STATS_FIELDS:
        assert f"vllm:kv_offload_kvtier_{name}" in definitions
    assert kv_vllm.JOBS_IN_FLIGHT_METRIC in definitions

    keys = [chunk_key(i, "metrics") for i in range(5)]
    engine.store("r", blocks_for(engine, keys))
    engine.settle()
    label = ("KvtierTier",)
    data = engine.manager.get_stats().data["data"]
    assert data["vllm:kv_offload_kvtier_keys_stored"][label] == 5
    assert data["vllm:kv_offload_kvtier_bytes_stored"][label] == 5 * BLOCK_BYTES * blocks_per_chunk
    assert data[kv_vllm.JOBS_IN_FLIGHT_METRIC][label] == 0
    # Counters report growth: nothing new, nothing reported.
    again = engine.manager.get_stats().data["data"]
    assert "vllm:kv_offload_kvtier_keys_stored" not in again
    engine.resolve(chunk_key(99, "metrics"), "r")
    grown = engine.manager.get_stats().data["data"]
    assert grown["vllm:kv_offload_kvtier_existence_checks"][label] == 1


def test_config_info_names_the_store_without_secrets(engines, store):
    engine = engines()
    keys = TieringOffloadingSpec.config_info_keys(engine.config.extra_config)
    assert set(kv_vllm.CONFIG_INFO_KEYS) <= set(keys)
    infos = engine.manager.config_info()
    (ours,) = [i for i in infos if "kvtier_store" in i]
    assert ours["kvtier_version"] == kvtier.version()
    assert ours["kvtier_store"] == ("local" if store.kind == "local" else "s3")
    assert store.prefix in ours["kvtier_location"]
    secret = store.store_config.get("secret_key")
    assert not secret or secret not in repr(infos)


# -- versions -----------------------------------------------------------------------------------


def test_an_unknown_tier_interface_fails_at_construction_with_a_clear_message(store, monkeypatch):
    @dataclasses.dataclass
    class OlderJobResult:  # an interface without transfer_bytes
        job_id: int
        success: bool

    monkeypatch.setattr(kv_vllm._shims, "JobResult", OlderJobResult)  # what the interface check reads
    with pytest.raises(RuntimeError, match=r"vLLM 0\.33.*JobResult\.transfer_bytes"):
        Engine([tier_entry(store)], model=MODEL, engine_id=f"old-{uuid.uuid4().hex[:8]}")


def test_the_installed_vllm_is_a_tested_version():
    assert kv_vllm.vllm_version() in kv_vllm.TESTED_VLLM_VERSIONS
    assert kv_vllm.interface_mismatch() is None
