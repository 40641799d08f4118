"""kvtier as SGLang 0.5.23's HiCache storage backend for hybrid models: SGLang's real host
pool groups on CPU (a KV anchor with a Mamba state pool, or with a sliding-window SWA
pool), driven by SGLang's production ``HybridCacheController``: backups carry side-pool
transfers (``batch_set_v2``), prefetches ask SGLang's hybrid hit query
(``batch_exists_v2``) and read the side pages after the KV pages (``batch_get_v2``), on
the local store and the S3 servers of the session. Only the device-to-host copies,
which need a GPU, are left out.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller")

import sglang_rig as rig  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer  # noqa: E402

TRAILING = PoolHitPolicy.TRAILING_PAGES


@pytest.fixture(autouse=True)
def root_logging_restored():
    """SGLang configures the root logger as a server would; put it back afterwards."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.fixture
def kv_store(store):
    """The session store as kvtier's ``store`` section (the S3 configs are vLLM-shaped)."""
    from kvtier.vllm.config import build_tier_config

    return build_tier_config(store.store_config, prefix=store.prefix)["store"], store.prefix


@pytest.fixture
def hybrids():
    """Builds hybrid controllers; closes their backends at teardown."""
    made = []

    def make(layout, extra, side):
        h = rig.hybrid_group_controller(layout, extra, side)
        made.append(h)
        return h

    yield make
    for h in made:
        h.backend.close()


def mamba(**kw):
    return {PoolName.MAMBA: rig.mamba_host_pool(**kw)}


def swa(layout):
    pools = rig.swa_pools(layout)
    return {PoolName.SWA: (pools.host, pools.device)}


def filled(host, n_pages, seed):
    """``n_pages`` fresh pages of ``host`` (its own page size) filled from ``seed``; their
    indices and bytes."""
    indices = host.alloc(n_pages * host.page_size)
    assert indices is not None
    if host.page_size == rig.PAGE and hasattr(host, "head_num"):
        rig.fill_pages(host, indices, seed)
        return indices, rig.page_bytes(host, indices)
    rig.fill_side_pages(host, indices, seed)
    return indices, rig.side_page_bytes(host, indices)


def backup_with_side(h, toks, kv_idx, name, side_idx, side_keys, prefix_keys=None):
    """One ``write_storage`` of KV pages with one side transfer, as SGLang's radix cache
    issues it (trailing pages); every page must be stored."""
    keys = rig.page_keys(toks)
    if prefix_keys is not None:
        keys = keys[len(prefix_keys):]
    transfer = PoolTransfer(name=name, host_indices=side_idx, keys=side_keys, hit_policy=TRAILING)
    op_id = h.ctrl.write_storage(kv_idx, toks[len(prefix_keys or []) * rig.PAGE:], hash_value=keys,
                                 prefix_keys=prefix_keys, extra_pools=[transfer])
    ack = h.ctrl.ack_backup_queue.get(timeout=60)
    assert ack.id == op_id
    assert ack.completed_tokens // rig.PAGE == len(keys)
    assert ack.pool_storage_result.extra_pool_hit_pages[name] == len(side_keys)


def placeholder(name, n):
    """A prefetch's side transfer: only the number of its keys counts."""
    return [PoolTransfer(name=name, keys=[""] * n, hit_policy=TRAILING)]


def test_the_kv_namespace_is_unchanged_and_each_side_pool_has_its_own(kv_store, hybrids):
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    h = hybrids("page_first", extra, {**mamba(), **swa("page_first")})
    b = h.backend
    assert b.namespace == "sglang/o-m/mha-page_first-bfloat16-p16-l3-h4x64/tp0of1"
    sides = b.side_pools
    assert sorted(sides) == ["mamba", "swa"]
    # Kind, layout, tokens and bytes per page, and a digest of the whole geometry.
    temporal = rig.MAMBA_LAYERS * 4 * 16 * 4
    conv = rig.MAMBA_LAYERS * 32 * 3 * 2
    assert sides["mamba"].startswith(f"sglang/o-m/mamba-page_first-p1-b{temporal + conv}-")
    swa_page = 2 * rig.LAYERS * rig.PAGE * rig.HEADS * rig.HEAD_DIM * 2
    assert sides["swa"].startswith(f"sglang/o-m/swa-page_first-p16-b{swa_page}-")
    assert all(ns.endswith("/tp0of1") for ns in sides.values())
    # Another geometry of the same kind is another namespace.
    other = hybrids("page_first", extra, mamba(heads=2))
    assert other.backend.side_pools["mamba"] != sides["mamba"]
    assert other.backend.namespace == b.namespace


def test_mamba_state_backs_up_and_prefetches_into_a_second_instance(kv_store, hybrids):
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = hybrids("page_first", extra, mamba())
    toks = rig.tokens(4, salt=21)
    keys = rig.page_keys(toks)
    kv_idx, kv_want = filled(a.kv, 4, seed=21)
    m_idx, m_want = filled(a.side[PoolName.MAMBA], 1, seed=22)
    backup_with_side(a, toks, kv_idx, PoolName.MAMBA, m_idx, keys[-1:])

    b = hybrids("page_first", extra, mamba())  # fresh pools, its own tiers
    got = rig.hybrid_prefetch(b, "r", toks, placeholder(PoolName.MAMBA, 1))
    assert (got.hit, got.restorable, got.loaded) == (4, [4], 4)
    assert got.pool_hits == {"mamba": 1}
    assert rig.page_bytes(b.kv, got.kv_indices) == kv_want
    assert rig.side_page_bytes(b.side[PoolName.MAMBA], got.side_indices[PoolName.MAMBA]) == m_want


def test_a_missing_mamba_state_at_the_tail_falls_back_to_the_last_stored_state(kv_store, hybrids):
    """Trailing pages, N = 1: a prefix length is usable only where a state was saved.
    With states at pages 3 and 6, both lengths are; with the state at 6 deleted from the
    store, the prefetch stops at 3 and reads the state saved there."""
    from kvtier.sglang import page_key

    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = hybrids("page_first", extra, mamba())
    host_m = a.side[PoolName.MAMBA]
    toks = rig.tokens(6, salt=23)
    keys = rig.page_keys(toks)
    kv_idx, kv_want = filled(a.kv, 6, seed=23)
    m3, m3_want = filled(host_m, 1, seed=24)
    m6, m6_want = filled(host_m, 1, seed=25)
    backup_with_side(a, toks[: 3 * rig.PAGE], kv_idx[: 3 * rig.PAGE], PoolName.MAMBA, m3, keys[2:3])
    backup_with_side(a, toks, kv_idx[3 * rig.PAGE:], PoolName.MAMBA, m6, keys[5:6], prefix_keys=keys[:3])

    b = hybrids("page_first", extra, mamba())
    got = rig.hybrid_prefetch(b, "r1", toks, placeholder(PoolName.MAMBA, 1))
    assert (got.hit, got.restorable, got.loaded) == (6, [3, 6], 6)
    assert rig.side_page_bytes(b.side[PoolName.MAMBA], got.side_indices[PoolName.MAMBA]) == m6_want

    deleted = a.backend._side["mamba"].tier.delete([page_key(keys[5])])
    assert deleted["deleted"] == 1, deleted
    got = rig.hybrid_prefetch(b, "r2", toks, placeholder(PoolName.MAMBA, 1))
    assert (got.hit, got.restorable, got.loaded) == (3, [3], 3)
    assert got.pool_hits == {"mamba": 1}
    assert rig.page_bytes(b.kv, got.kv_indices) == kv_want[:3]
    assert rig.side_page_bytes(b.side[PoolName.MAMBA], got.side_indices[PoolName.MAMBA]) == m3_want


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_the_swa_window_backs_up_prefetches_and_shortens_when_its_tail_is_missing(kv_store, hybrids, layout):
    """Trailing pages, N = 2: windows saved over pages 2-3 and 4-5 make lengths 4, 5 and
    6 usable (never 1-3); without page 5's SWA object, 4 and 5 remain, and the prefetch
    of length 5 reads the window of pages 3-4, byte-exact."""
    from kvtier.sglang import page_key

    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = hybrids(layout, extra, swa(layout))
    host_s = a.side[PoolName.SWA]
    toks = rig.tokens(6, salt=26)
    keys = rig.page_keys(toks)
    kv_idx, kv_want = filled(a.kv, 6, seed=26)
    s_idx, s_want = filled(host_s, 4, seed=27)  # the SWA pages of KV pages 2, 3, 4, 5
    backup_with_side(a, toks[: 4 * rig.PAGE], kv_idx[: 4 * rig.PAGE], PoolName.SWA, s_idx[: 2 * rig.PAGE], keys[2:4])
    backup_with_side(a, toks, kv_idx[4 * rig.PAGE:], PoolName.SWA, s_idx[2 * rig.PAGE:], keys[4:6],
                     prefix_keys=keys[:4])

    b = hybrids(layout, extra, swa(layout))
    got = rig.hybrid_prefetch(b, "r1", toks, placeholder(PoolName.SWA, 2))
    assert (got.hit, got.restorable, got.loaded) == (6, [4, 5, 6], 6)
    assert got.pool_hits == {"swa": 2}
    assert rig.page_bytes(b.kv, got.kv_indices) == kv_want
    assert rig.page_bytes(b.side[PoolName.SWA], got.side_indices[PoolName.SWA]) == s_want[2:]

    assert a.backend._side["swa"].tier.delete([page_key(keys[5])])["deleted"] == 1
    got = rig.hybrid_prefetch(b, "r2", toks, placeholder(PoolName.SWA, 2))
    assert (got.hit, got.restorable, got.loaded) == (5, [4, 5], 5)
    assert got.pool_hits == {"swa": 2}
    assert rig.page_bytes(b.kv, got.kv_indices) == kv_want[:5]
    # SGLang re-aligned the window to the hit's last two pages, 3 and 4, and trimmed it.
    assert rig.page_bytes(b.side[PoolName.SWA], got.side_indices[PoolName.SWA][: 2 * rig.PAGE]) == s_want[1:3]


def test_all_pages_policy_needs_every_page_up_to_the_hit(kv_store, hybrids):
    """``all_pages`` (the DSA indexer's policy) on SGLang's hit query: the pool must hold
    every page before the KV hit; its first missing page caps the prefix."""
    from kvtier.sglang import page_key

    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = hybrids("page_first", extra, swa("page_first"))
    toks = rig.tokens(4, salt=28)
    keys = rig.page_keys(toks)
    kv_idx, _ = filled(a.kv, 4, seed=28)
    s_idx, _ = filled(a.side[PoolName.SWA], 4, seed=29)
    backup_with_side(a, toks, kv_idx, PoolName.SWA, s_idx, keys)
    every = [PoolTransfer(name=PoolName.SWA, keys=[""] * 4, hit_policy=PoolHitPolicy.ALL_PAGES)]
    result = a.backend.batch_exists_v2(keys, every)
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (4, [1, 2, 3, 4])
    a.backend._side["swa"].tier.delete([page_key(keys[2])])
    result = a.backend.batch_exists_v2(keys, every)
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (2, [1, 2])
    assert result.extra_pool_hit_pages == {PoolName.KV: 4, PoolName.SWA: 2}
    # The same pool under trailing pages (N = 1) only misses length 3.
    result = a.backend.batch_exists_v2(keys, placeholder(PoolName.SWA, 1))
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (4, [1, 2, 4])


def test_a_side_pool_never_reads_another_pools_or_geometrys_bytes(kv_store, hybrids):
    """The same page keys stored in the Mamba pool are absent to an SWA pool, to a Mamba
    pool of another geometry and to the KV pool of a model that stored only side pages."""
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = hybrids("page_first", extra, mamba())
    toks = rig.tokens(2, salt=30)
    keys = rig.page_keys(toks)
    kv_idx, _ = filled(a.kv, 2, seed=30)
    m_idx, _ = filled(a.side[PoolName.MAMBA], 1, seed=31)
    backup_with_side(a, toks, kv_idx, PoolName.MAMBA, m_idx, keys[-1:])
    same = hybrids("page_first", extra, mamba())
    assert same.backend.batch_exists_v2(keys, placeholder(PoolName.MAMBA, 1)).kv_hit_pages == 2
    other_geometry = hybrids("page_first", extra, mamba(heads=2))
    assert other_geometry.backend.batch_exists_v2(keys, placeholder(PoolName.MAMBA, 1)).kv_hit_pages == 0
    other_kind = hybrids("page_first", extra, swa("page_first"))
    assert other_kind.backend.batch_exists_v2(keys, placeholder(PoolName.SWA, 1)).kv_hit_pages == 0
    # And a prefetch through the controller of the other geometry loads nothing.
    got = rig.hybrid_prefetch(other_geometry, "r", toks, placeholder(PoolName.MAMBA, 1))
    assert (got.hit, got.loaded) == (0, 0)


def test_clear_deletes_the_side_pools_pages_too(kv_store, hybrids):
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = hybrids("page_first", extra, mamba())
    toks = rig.tokens(2, salt=32)
    keys = rig.page_keys(toks)
    kv_idx, _ = filled(a.kv, 2, seed=32)
    m_idx, _ = filled(a.side[PoolName.MAMBA], 1, seed=33)
    backup_with_side(a, toks, kv_idx, PoolName.MAMBA, m_idx, keys[-1:])
    assert a.backend.batch_exists_v2(keys, placeholder(PoolName.MAMBA, 1)).kv_hit_pages == 2
    a.backend.clear()
    assert a.backend.batch_exists(keys) == 0
    assert a.backend._present("mamba", keys) == [False, False]


def dsa_group(layout, extra):
    """SGLang's DSA pools on CPU (DSA needs 64-token pages): an MLA KV anchor host pool and
    the indexer host pool on its indices, in a group under ``HybridCacheController``."""
    import threading

    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    page = 64
    rig.server_args(layout)
    rig.parallel()
    dev = DSATokenToKVPool(size=512, page_size=page, kv_lora_rank=64, dtype=torch.bfloat16, qk_rope_head_dim=16,
                           layer_num=rig.LAYERS, device="cpu", index_head_dim=128, enable_memory_saver=False,
                           kv_cache_dim=80)
    info = dev.get_device_pool_infos()[0].buffer_info
    anchor = MLATokenToKVPoolHost(info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
                                  device_capacity_tokens=dev.size, start_layer=dev.start_layer,
                                  end_layer=dev.end_layer, target_layer_num=rig.LAYERS)
    indexer = DSAIndexerPoolHost(make_dsa_indexer_pool_decl(dev), anchor, pin_memory=False, device="cpu")
    group = HostPoolGroup([
        PoolEntry(name=PoolName.KV, host_pool=anchor, device_pool=dev, layer_mapper=lambda i: i,
                  is_primary_index_anchor=True),
        PoolEntry(name=PoolName.INDEXER, host_pool=indexer, device_pool=dev, layer_mapper=lambda i: i),
    ])
    allocator = PagedTokenToKVPoolAllocator(dev.size, page, torch.bfloat16, "cpu", dev, False)
    return lambda: HybridCacheController(
        allocator, group, page, None, threading.Event(), write_policy="write_through", io_backend="direct",
        storage_backend="dynamic", prefetch_threshold=page, model_name=rig.MODEL,
        storage_backend_extra_config=dict(extra),
    )


def test_the_dsa_indexer_pool_registers_in_page_first_and_is_refused_in_layer_first(local_only):
    """The DSA indexer builds on CPU; SGLang's controller registers it. In ``page_first`` it
    gets its own namespace; in ``layer_first`` SGLang names no memory for its pages, and the
    backend refuses it at registration with SGLang's reason (the controller fails to start)."""
    extra = rig.extra_config(local_only.store_config, local_only.prefix)
    ctrl = dsa_group("page_first", extra)()
    try:
        indexer = ctrl.storage_backend.side_pools["indexer"]
        assert indexer.startswith("sglang/o-m/indexer-page_first-p64-") and indexer.endswith("/tp1")
    finally:
        ctrl.storage_backend.close()
    with pytest.raises(ValueError, match="indexer.*Unsupported layout"):
        dsa_group("layer_first", extra)()
