"""Blocks as lists of ranges from Python: a layer-first KV pool (one allocation per layer
and per K or V, as C++ stacks and SGLang's ``layer_first`` host pools keep them) stores
and loads pages of 2 and of 2 x 32 ranges byte-exact, from numpy buffers and from raw
pointers and sizes as an engine hands them out, on the local store and the S3 servers of
the session; the same bytes stored from a pool block are the same object.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import kvtier
from support import make_key, wait_results

PIECE = 4096
PAGES = 6




def config(store) -> dict:
    """The tier configuration of the session's store: its ``store_config`` is vLLM-shaped
    (an S3 bucket without a type, scheme defaulting as vLLM's), so the drop-in's own
    translation makes it a tier configuration (any key length)."""
    from kvtier.vllm.config import build_tier_config

    return build_tier_config(store.store_config, prefix=store.prefix)


class LayerFirstPool:
    """``layers`` allocations of K and of V, page ``p`` at ``p * PIECE`` in each."""

    def __init__(self, layers: int, seed: int | None):
        rng = np.random.default_rng(seed)
        make = (lambda: rng.integers(0, 256, PAGES * PIECE, dtype=np.uint8)) if seed is not None else (
            lambda: np.zeros(PAGES * PIECE, dtype=np.uint8)
        )
        self.k = [make() for _ in range(layers)]
        self.v = [make() for _ in range(layers)]

    def page(self, p: int) -> bytes:
        at = slice(p * PIECE, (p + 1) * PIECE)
        return b"".join(bytes(k[at]) + bytes(v[at]) for k, v in zip(self.k, self.v))

    def pointers(self, pages):
        """Flat pointers and sizes, page after page, as ``get_page_buffer_meta`` gives them."""
        ptrs, sizes = [], []
        for p in pages:
            for k, v in zip(self.k, self.v):
                ptrs += [k.ctypes.data + p * PIECE, v.ctypes.data + p * PIECE]
                sizes += [PIECE, PIECE]
        return ptrs, sizes

    def register(self, tier: kvtier.Tier, by_pointer: bool) -> list[int]:
        buffers = [b for pair in zip(self.k, self.v) for b in pair]
        if by_pointer:
            return [tier.add_region(address=b.ctypes.data, nbytes=b.nbytes, owner=b) for b in buffers]
        return [tier.add_region(b) for b in buffers]


@pytest.mark.parametrize("layers", [1, 32], ids=["2-ranges", "64-ranges"])
@pytest.mark.parametrize("by_pointer", [False, True], ids=["buffers", "pointers"])
def test_pages_of_ranges_round_trip_byte_exact(store, layers, by_pointer):
    keys = [make_key(i, salt=f"ranges-{layers}") for i in range(PAGES)]
    pool = LayerFirstPool(layers, seed=layers)
    with kvtier.Tier(config(store)) as writer:
        pool.register(writer, by_pointer)
        ranges = writer.ranges_of(*pool.pointers(range(PAGES)), ranges_per_key=2 * layers)
        writer.submit_store_ranges(1, keys, ranges)
        (stored,) = wait_results(writer, 1, timeout=30.0)
        assert stored.ok, stored.message
        assert stored.bytes == PAGES * 2 * layers * PIECE
    into = LayerFirstPool(layers, seed=None)
    with kvtier.Tier(config(store)) as reader:
        into.register(reader, by_pointer)
        # Page p's key loads into page PAGES-1-p, as a numpy array of ranges.
        ranges = np.array(reader.ranges_of(*into.pointers(reversed(range(PAGES))), ranges_per_key=2 * layers))
        reader.submit_load_ranges(2, keys, ranges)
        (loaded,) = wait_results(reader, 1, timeout=30.0)
        assert loaded.ok, loaded.message
    for p in range(PAGES):
        assert into.page(PAGES - 1 - p) == pool.page(p), f"page {p}"


def test_a_page_from_ranges_is_the_object_of_a_pool_block(store):
    pages = LayerFirstPool(2, seed=3)
    page_bytes = 4 * PIECE
    pool = np.zeros((2, page_bytes), dtype=np.uint8)
    pool[0] = np.frombuffer(pages.page(1), dtype=np.uint8)
    key_from_ranges, key_from_block = make_key(1, salt="one"), make_key(2, salt="one")
    with kvtier.Tier(config(store)) as tier:
        tier.register_memory(pool)
        pages.register(tier, by_pointer=False)
        tier.submit_store_ranges(1, [key_from_ranges], tier.ranges_of(*pages.pointers([1]), ranges_per_key=4))
        tier.submit_store(2, [0], [key_from_block])
        assert all(r.ok for r in wait_results(tier, 2, timeout=30.0))
        # Each loads the other way, its checksum verified.
        tier.submit_load(3, [1], [key_from_ranges])
        tier.submit_load_ranges(4, [key_from_block], tier.ranges_of(*pages.pointers([4]), ranges_per_key=4))
        results = {r.job_id: r for r in wait_results(tier, 2, timeout=30.0)}
        assert results[3].ok and results[4].ok, results
        assert bytes(pool[1]) == pages.page(1) == pages.page(4)
        assert tier.stats()["corrupt_blocks"] == 0
    if store.kind == "local":
        a = store.local_object("", key_from_ranges).read_bytes()
        assert a == store.local_object("", key_from_block).read_bytes() == pages.page(1)


def test_a_region_is_kept_alive_until_removed_and_refused_while_held(tmp_path):
    with kvtier.Tier({"store": {"type": "local", "path": str(tmp_path / "s")}}) as tier:
        buffer = np.arange(8192, dtype=np.uint8)
        alive = weakref.ref(buffer)
        region = tier.add_region(address=buffer.ctypes.data, nbytes=buffer.nbytes, owner=buffer)
        del buffer
        gc.collect()
        assert alive() is not None  # the tier holds the owner
        key = make_key(0, salt="alive")
        tier.submit_store_ranges(1, [key], [[(region, 0, 8192)]])
        tier.drain(30_000)
        with pytest.raises(kvtier.BlockBusyError):
            tier.remove_region(region)  # its job's result is not polled yet
        (result,) = wait_results(tier, 1, timeout=30.0)
        assert result.ok
        tier.remove_region(region)
        gc.collect()
        assert alive() is None
        with pytest.raises(kvtier.InvalidArgumentError):
            tier.remove_region(region)


def test_bad_ranges_are_refused_with_one_result(tmp_path):
    with kvtier.Tier({"store": {"type": "local", "path": str(tmp_path / "s")}}) as tier:
        region = tier.add_region(bytearray(4096))
        key = make_key(0, salt="bad")
        for job, ranges in enumerate(
            [[[(region + 5, 0, 16)]], [[(region, 0, 0)]], [[(region, 4000, 100)]], [[(region, 2**64 - 1, 2)]]],
            start=1,
        ):
            with pytest.raises(kvtier.InvalidArgumentError):
                tier.submit_load_ranges(job, [key], ranges)
            (result,) = wait_results(tier, 1, timeout=30.0)
            assert result.job_id == job and result.status == kvtier.Status.INVALID_ARGUMENT
        with pytest.raises(ValueError):
            tier.ranges_of([12345], [16], ranges_per_key=1)  # in no region
        with pytest.raises(ValueError):
            tier.add_region(bytes(16))  # read-only
