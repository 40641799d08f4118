"""One bucket, two tiers: vLLM 0.33's own obj tier and kvtier exchange KV blocks.

Two engines are built by vLLM's code (``TieringOffloadingSpec(...).get_manager()``, the
tiers constructed by vLLM's ``SecondaryTierFactory``) with the same model fields: one
whose ``secondary_tiers`` entry is vLLM's built-in ``{"type": "obj", ...}``
(``ObjectStoreSecondaryTierManager``, running over NIXL's OBJ plugin), the other with the
README's ``{"type": "KvtierTier", "module_path": "kvtier.vllm", ...}``, both on the same
bucket and prefix. What one engine stores (GPU -> CPU -> cascade to its tier), the other
engine -- whose CPU pool is empty -- finds (lookup RETRY... -> HIT_PENDING -> HIT, a
promotion from its own tier) and loads byte-exact. Both directions, chunks of 1 and 4
blocks, a non-ASCII model name (it is part of every object name). This is the proof of
bucket compatibility: the objects are written by one implementation and read by the
other, through a real S3 server.

Runs on the session's S3 servers (s3s-fs and moto with ``KVTIER_TEST_S3_SERVERS=1``, or
``KVTIER_TEST_S3_CONFIGS``); vLLM's obj tier has no local-directory store, so the local
parameter of the shared ``store`` fixture is skipped. Needs vLLM and ``nixl-cu12`` (the
test tools' venv, scripts/install-tools.sh).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time

import numpy as np
import pytest

pytest.importorskip("vllm", reason="needs vLLM (scripts/install-tools.sh installs it)")
if importlib.util.find_spec("nixl_cu12") is None:
    pytest.skip("needs nixl-cu12 (scripts/install-tools.sh installs it)", allow_module_level=True)

# vLLM imports NIXL under the name "nixl" (vllm/distributed/nixl_utils.py: "nixl._api" for
# nixl_agent/nixl_agent_config, "nixl._bindings" for nixlXferTelemetry). On PyPI the "nixl"
# meta package would pick the CUDA-13 build (nixl-cu13) to match vLLM's torch, but that
# build's OBJ plugin links libcuobjclient.so.1, which no package index ships; the test tools
# therefore install nixl-cu12 only, and it is made importable under the name vLLM uses. It
# is the real NIXL (agent, OBJ plugin and AWS SDK), only the module name differs. vLLM
# caps UCX's registration cache when it is the first to import NIXL; the same is done
# here since the aliasing imports it first.
os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")
import nixl_cu12  # noqa: E402
import nixl_cu12._api  # noqa: E402
import nixl_cu12._bindings  # noqa: E402

sys.modules.setdefault("nixl", nixl_cu12)
sys.modules.setdefault("nixl._api", nixl_cu12._api)
sys.modules.setdefault("nixl._bindings", nixl_cu12._bindings)

from vllm.v1.kv_offload.base import LookupResult, Medium, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.file_mapper import FileMapper  # noqa: E402

from key_layout import object_name  # noqa: E402
from kvtier import vllm as kv_vllm  # noqa: E402
from vllm_engine import BLOCK_BYTES, DEADLINE_S, Engine  # noqa: E402

MODEL = "org/modèle-ü"
CHUNKS = 5  # chunks each writer stores per test


@pytest.fixture(params=[1, 4], ids=["chunk1", "chunk4"])
def blocks_per_chunk(request) -> int:
    return request.param


@pytest.fixture
def s3_store(store):
    if store.kind != "s3":
        pytest.skip("vLLM's obj tier needs an S3 server (it has no local-directory store)")
    return store


def obj_entry(store) -> dict:
    """vLLM's own obj tier, as a vLLM user configures it."""
    return {
        "type": "obj",
        "store_config": dict(store.store_config),
        "prefix": store.prefix,
        "enable_kv_events": True,
    }


def kvtier_entry(store) -> dict:
    """The README's entry: the obj entry with ``type`` and ``module_path`` changed."""
    return dict(obj_entry(store), type="KvtierTier", module_path="kvtier.vllm")


@pytest.fixture
def engines(s3_store, blocks_per_chunk):
    """Builds engines by kind ("obj" or "kvtier") on one bucket and prefix; all are shut
    down at teardown."""
    made: list[Engine] = []

    def make(kind: str) -> Engine:
        entry = {"obj": obj_entry, "kvtier": kvtier_entry}[kind](s3_store)
        engine = Engine([entry], model=MODEL, blocks_per_chunk=blocks_per_chunk, events=True)
        made.append(engine)
        (tier,) = engine.tiers
        if kind == "obj":
            # vLLM's own tier over the real NIXL agent with its OBJ backend.
            assert type(tier).__name__ == "ObjectStoreSecondaryTierManager"
            assert type(tier).__module__ == "vllm.v1.kv_offload.tiering.obj.manager"
            assert type(tier._agent).__module__ == "nixl_cu12._api"
            assert "OBJ" in tier._agent.backends
        else:
            assert isinstance(tier, kv_vllm.KvtierTier)
        assert engine.pool.shape[1] == BLOCK_BYTES * blocks_per_chunk
        return engine

    yield make
    for engine in made:
        engine.shutdown()


def chunk_key(i: int, salt: str, group: int = 0) -> bytes:
    """A chunk's OffloadKey: a 32-byte SHA-256 block hash (vLLM's default) and a group."""
    return make_offload_key(hashlib.sha256(f"{salt}-{i}".encode()).digest(), group)


def exchange_keys(salt: str) -> list[bytes]:
    """CHUNKS keys; the last one in KV-cache group 1 (the ``_g<group>`` name segment)."""
    return [chunk_key(i, salt, group=int(i == CHUNKS - 1)) for i in range(CHUNKS)]


def kvtier_stats(engine: Engine) -> dict[str, int]:
    (tier,) = engine.tiers
    assert isinstance(tier, kv_vllm.KvtierTier)
    return tier.kvtier_stats()


def content(key: bytes, nbytes: int) -> np.ndarray:
    """Distinct bytes per key (and per chunk size)."""
    seed = int.from_bytes(hashlib.sha256(key + nbytes.to_bytes(4, "big")).digest()[:8], "big")
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def store_and_cascade(engine: Engine, keys: list[bytes], req_id: str) -> dict[bytes, np.ndarray]:
    """GPU -> CPU store of ``keys`` on ``engine``, then steps until the manager has no
    transfer left; asserts the engine's tier reported every key stored (BlockStored events
    with medium STORAGE, which both tiers emit only for successful store jobs)."""
    blocks = {k: content(k, engine.pool.shape[1]) for k in keys}
    stored = engine.store(req_id, blocks)
    assert stored == keys, "the writer's CPU pool did not take every chunk"
    engine.finish(req_id)
    engine.until(lambda: not engine.manager.has_pending_work(), "the cascade to the tier finished")
    engine.step()
    on_tier = {
        k
        for event in engine.events
        if event.medium == Medium.STORAGE and not event.removed
        for k in event.keys
    }
    assert on_tier >= set(keys), f"{len(set(keys) - on_tier)} chunk(s) not stored by the writer's tier"
    return blocks


def promote(engine: Engine, key: bytes, req_id: str) -> LookupResult:
    """Looks ``key`` up as the scheduler does (one lookup per step) until the answer is
    not RETRY; on HIT_PENDING (found in the tier, promotion queued) steps until the
    promotion resolved. Returns HIT (promoted into the CPU pool) or MISS."""
    verdict = engine.resolve(key, req_id)
    if verdict is LookupResult.HIT_PENDING:
        deadline = time.monotonic() + DEADLINE_S
        while verdict is LookupResult.HIT_PENDING:
            assert time.monotonic() < deadline, f"promotion of {key.hex()} never finished"
            engine.step()
            verdict = engine.lookup(key, req_id)
        assert verdict is LookupResult.HIT, f"promotion of {key.hex()} failed: {verdict}"
        return verdict
    assert verdict is LookupResult.MISS, (
        f"{key.hex()}: {verdict} before any promotion (the reader's CPU pool must start empty)"
    )
    return verdict


def exchange(engines, writer_kind: str, reader_kind: str, salt: str) -> None:
    writer = engines(writer_kind)
    reader = engines(reader_kind)
    keys = exchange_keys(salt)
    never_stored = chunk_key(CHUNKS, salt)
    blocks = store_and_cascade(writer, keys, "write")
    # The writer still holds them in its CPU pool, the reader only in the shared bucket.
    assert all(writer.lookup(k, "check") is LookupResult.HIT for k in keys)

    verdicts = {k: promote(reader, k, "read") for k in keys + [never_stored]}
    assert verdicts[never_stored] is LookupResult.MISS
    missing = [k.hex()[:16] for k in keys if verdicts[k] is not LookupResult.HIT]
    assert not missing, f"{reader_kind} did not find what {writer_kind} stored: {missing}"

    rows = reader.read(keys, "read")
    for key, row in zip(keys, rows):
        assert row.shape == blocks[key].shape
        assert np.array_equal(row, blocks[key]), f"chunk {key.hex()[:16]} differs after the exchange"
    reader.finish("read")
    assert not reader.manager.has_pending_work()
    # kvtier's own account of its side of the exchange.
    chunk_bytes = writer.pool.shape[1]
    if writer_kind == "kvtier":
        stats = kvtier_stats(writer)
        assert (stats["keys_stored"], stats["bytes_stored"]) == (CHUNKS, CHUNKS * chunk_bytes)
    else:
        stats = kvtier_stats(reader)
        assert (stats["keys_loaded"], stats["bytes_loaded"]) == (CHUNKS, CHUNKS * chunk_bytes)
        assert stats["corrupt_blocks"] == 0 and stats["keys_failed"] == 0


# -- the names -----------------------------------------------------------------------------


def test_both_tiers_map_keys_to_one_object_name(engines, s3_store, blocks_per_chunk):
    """The precondition of sharing: kvtier's namespace is the one vLLM's obj tier derives
    (with blocks_per_file = blocks_per_chunk) and the non-ASCII model name is in it."""
    obj = engines("obj")
    kvt = engines("kvtier")
    (obj_tier,) = obj.tiers
    (kv_tier,) = kvt.tiers
    mapper: FileMapper = obj_tier._file_mapper
    assert mapper.fields["blocks_per_file"] == blocks_per_chunk
    assert mapper.fields["model_name"] == MODEL
    for group in (0, 1):
        key = chunk_key(0, "names", group)
        obj_name = mapper.get_file_name(key)
        assert "//" in obj_name
        # vLLM's name has an empty segment (root_dir ends with "/" and base_path adds
        # one); the S3 client of NIXL's OBJ plugin drops it, kvtier never writes one.
        effective = "/".join(part for part in obj_name.split("/") if part)
        assert effective == object_name(s3_store.prefix, kv_tier.namespace, key)
    assert kv_tier.namespace.startswith("org_modèle-ü_")


# -- the exchange --------------------------------------------------------------------------


@pytest.fixture
def obj_tier_writes(request):
    """Skips Ceph RGW where vLLM's obj tier has to write: its PUTs fail there (NIXL reports
    NIXL_ERR_BACKEND), as RGW 16 rejects the AWS SDK's STREAMING-UNSIGNED-PAYLOAD-TRAILER
    uploads. kvtier's writes and the obj tier's reads work on RGW."""
    if "ceph-rgw" in request.node.callspec.id:
        pytest.skip("vLLM's obj tier (NIXL, AWS SDK trailer uploads) cannot write to Ceph RGW 16")


def test_kvtier_finds_and_loads_what_vllms_obj_tier_stored(engines, blocks_per_chunk, obj_tier_writes):
    exchange(engines, "obj", "kvtier", salt=f"obj-to-kvtier-{blocks_per_chunk}")


def test_vllms_obj_tier_finds_and_loads_what_kvtier_stored(engines, blocks_per_chunk):
    exchange(engines, "kvtier", "obj", salt=f"kvtier-to-obj-{blocks_per_chunk}")


def test_both_directions_on_one_bucket_at_once(engines, blocks_per_chunk, obj_tier_writes):
    """Each engine stores its own chunks, then each loads the other's: both engines live
    side by side on the same prefix, as two deployments sharing a bucket would."""
    obj = engines("obj")
    kvt = engines("kvtier")
    from_obj = exchange_keys(f"both-obj-{blocks_per_chunk}")
    from_kvt = exchange_keys(f"both-kvt-{blocks_per_chunk}")
    blocks = store_and_cascade(obj, from_obj, "w")
    blocks.update(store_and_cascade(kvt, from_kvt, "w"))
    for reader, keys in ((kvt, from_obj), (obj, from_kvt)):
        verdicts = [promote(reader, k, "r") for k in keys]
        assert all(v is LookupResult.HIT for v in verdicts), verdicts
        rows = reader.read(keys, "r")
        for key, row in zip(keys, rows):
            assert np.array_equal(row, blocks[key]), f"chunk {key.hex()[:16]} differs"
        reader.finish("r")
