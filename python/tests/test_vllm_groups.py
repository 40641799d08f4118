"""Hybrid models in vLLM 0.33's own tiering manager: several KV-cache groups.

A hybrid model's KV cache is several groups: full-attention layers, sliding-window layers
(Gemma 3, gpt-oss), and layers of another block size. vLLM 0.33 describes each group in
``OffloadingConfig.groups`` (``OffloadingGroupConfig``: its block size in tokens, its
layers, its group index and ``sliding_window_size_in_chunks``), and its offload keys carry
the group index after the block hash (``make_offload_key``). The sliding window decides
which chunks vLLM's scheduler stores and asks for; every chunk that reaches the tier is a
key of its own.

Here an engine of four groups (full attention; sliding window of two chunks; full
attention of 32-token blocks; Mamba state, a window of one chunk) is built by vLLM's code, with kvtier as its secondary tier
from the README's ``secondary_tiers`` entry, and the test drives vLLM's
``TieringOffloadingManager`` as the scheduler and worker would. The same block hash in
every group has bytes of its own in each; they must never be confused. On the local
store and the S3 servers of the session.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip("vllm", reason="needs vLLM (scripts/install-tools.sh installs it)")

from vllm.v1.kv_offload.base import LookupResult, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.config import OffloadingGroupConfig  # noqa: E402
from vllm.v1.kv_offload.file_mapper import FileMapper  # noqa: E402

import kvtier  # noqa: E402
from kvtier import vllm as kv_vllm  # noqa: E402
from vllm_engine import Engine, content, kvtier_entry, kvtier_tier  # noqa: E402

MODEL = "org/hybrid"

#: Full attention, a sliding window of two chunks (Gemma 3, gpt-oss), a group of 32-token
#: blocks (vLLM's hybrid allocator gives groups their own block size), and a Mamba group,
#: whose state vLLM 0.33 offloads as a window of one chunk (Jamba, Nemotron-H).
GROUPS = (
    OffloadingGroupConfig(16, ("model.layers.0.self_attn.attn",), 0),
    OffloadingGroupConfig(16, ("model.layers.1.self_attn.attn",), 1, sliding_window_size_in_chunks=2),
    OffloadingGroupConfig(32, ("model.layers.2.self_attn.attn",), 2),
    OffloadingGroupConfig(32, ("model.layers.3.mixer",), 3, sliding_window_size_in_chunks=1),
)


@pytest.fixture
def engines(store):
    made: list[Engine] = []

    def make(groups=GROUPS) -> Engine:
        engine = Engine([kvtier_entry(store)], model=MODEL, groups=groups)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown()


def block_hash(i: int, salt: str) -> bytes:
    return hashlib.sha256(f"{salt}-{i}".encode()).digest()


def keys_of(hashes, groups=GROUPS) -> list[bytes]:
    """Every group's key of every hash: the same block hash in each group."""
    return [make_offload_key(h, g.group_id) for h in hashes for g in groups]


def test_the_namespace_is_vllms_obj_tier_namespace_for_every_group(engines):
    engine = engines()
    mapper = FileMapper.from_offloading_spec("", engine.spec, blocks_per_file=1, parallel_agnostic=True)
    # vLLM hashes every group's block size and layers into the namespace.
    assert [g["tokens_per_block"] for g in mapper.get_run_config()["kv_cache_groups"]] == [16, 16, 32, 32]
    assert kvtier_tier(engine).namespace == f"{mapper.base_path.rsplit('/', 1)[-1]}_r{mapper.rank}"
    # A model of one group is another namespace: its objects are never this one's.
    single = engines(groups=GROUPS[:1])
    assert kvtier_tier(single).namespace != kvtier_tier(engine).namespace


def test_every_group_round_trips_its_own_bytes_through_a_second_engine(engines, store):
    writer = engines()
    hashes = [block_hash(i, "groups") for i in range(4)]
    keys = keys_of(hashes)
    blocks = {k: content(k, writer.pool.shape[1]) for k in keys}
    # Same hash, other group: other bytes (else confusing groups could pass unseen).
    assert not np.array_equal(blocks[keys[0]], blocks[keys[1]])
    writer.store("w", blocks)
    writer.settle()
    assert kvtier_tier(writer).kvtier_stats()["keys_stored"] == len(keys)

    if store.kind == "local":
        # Named exactly as vLLM's obj tier names the key: <hhh>/<hh>_g<group>/<hash>.bin.
        mapper = FileMapper.from_offloading_spec("", writer.spec, blocks_per_file=1, parallel_agnostic=True)
        for key in keys:
            name = mapper.get_file_name(key).lstrip("/")
            assert (store.root / store.prefix / name).is_file(), name

    reader = engines()
    verdicts = reader.promote(keys, "r")
    assert set(verdicts.values()) == {LookupResult.HIT}
    for key, row in zip(keys, reader.read(keys, "r")):
        assert np.array_equal(row, blocks[key]), f"group {int.from_bytes(key[-4:], 'big')} of {key[:4].hex()}"
    assert kvtier_tier(reader).kvtier_stats()["keys_loaded"] == len(keys)


def test_a_missing_sliding_window_chunk_misses_alone(engines, store):
    """The sliding-window group's object of one hash is gone (evicted, deleted by another
    engine): that key MISSes, and the same hash's other groups still HIT with their bytes."""
    writer = engines()
    hashes = [block_hash(i, "window") for i in range(3)]
    keys = keys_of(hashes)
    blocks = {k: content(k, writer.pool.shape[1]) for k in keys}
    writer.store("w", blocks)
    writer.settle()

    gone = make_offload_key(hashes[1], 1)
    other = kvtier.Tier(
        kv_vllm.build_tier_config(store.store_config, prefix=store.prefix, namespace=kvtier_tier(writer).namespace)
    )
    try:
        assert other.delete([gone])["deleted"] == 1
    finally:
        other.close()

    reader = engines()
    verdicts = reader.promote(keys, "r")
    assert verdicts == {k: LookupResult.MISS if k == gone else LookupResult.HIT for k in keys}
    kept = [k for k in keys if k != gone]
    for key, row in zip(kept, reader.read(kept, "r")):
        assert np.array_equal(row, blocks[key])


def test_window_groups_hit_for_their_window_alone(engines):
    """vLLM's scheduler stores a windowed group's chunks of its window only (the last two
    of the sliding-window group, the last one of the Mamba group), and every chunk of the
    full groups; the manager is handed those keys here as the scheduler hands them. Each
    key answers for itself: a window's chunks HIT with their bytes, the windowed groups'
    chunks before their windows MISS, though their hashes HIT in the full groups."""
    writer = engines()
    hashes = [block_hash(i, "partial") for i in range(5)]
    stored, outside = [], []
    for group in GROUPS:
        window = group.sliding_window_size_in_chunks or len(hashes)
        stored += [make_offload_key(h, group.group_id) for h in hashes[-window:]]
        outside += [make_offload_key(h, group.group_id) for h in hashes[:-window]]
    assert len(outside) == 3 + 4
    blocks = {k: content(k, writer.pool.shape[1]) for k in stored}
    writer.store("w", blocks)
    writer.settle()

    reader = engines()
    verdicts = reader.promote(stored + outside, "r")
    assert verdicts == {**dict.fromkeys(stored, LookupResult.HIT), **dict.fromkeys(outside, LookupResult.MISS)}
    for key, row in zip(stored, reader.read(stored, "r")):
        assert np.array_equal(row, blocks[key])
