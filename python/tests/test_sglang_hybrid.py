"""kvtier as SGLang 0.5.23's HiCache storage backend for hybrid models: SGLang's real host
pool groups on CPU (a KV anchor with a Mamba state pool, or with a sliding-window SWA
pool), driven by SGLang's production ``HybridCacheController``: backups carry side-pool
transfers (``batch_set_v2``), prefetches ask SGLang's hybrid hit query
(``batch_exists_v2``) and read the side pages after the KV pages (``batch_get_v2``), on
the local store and the S3 servers of the session. Only the device-to-host copies,
which need a GPU, are left out.
"""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller")

import sglang_rig as rig  # noqa: E402
from sglang_rig import kv_store, root_logging_restored  # noqa: E402,F401 (fixtures)
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer  # noqa: E402

TRAILING = PoolHitPolicy.TRAILING_PAGES


@pytest.fixture
def hybrids():
    """Builds hybrid controllers; closes their backends at teardown."""
    made = []

    def make(layout, extra, side, **kw):
        h = rig.hybrid_group_controller(layout, extra, side, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.backend.close()


def mamba(**kw):
    return {PoolName.MAMBA: rig.mamba_host_pool(**kw)}


def swa(layout, mla=False):
    pools = rig.swa_pools(layout, mla=mla)
    return {PoolName.SWA: (pools.host, pools.device)}


def indexer(kv):
    """The DSA indexer host pool on the DSA anchor ``kv`` (its device pool holds both)."""
    return {PoolName.INDEXER: (rig.dsa_indexer_host_pool(kv), kv.device)}


def dsa(hybrids, extra, layout="page_first"):
    """A DSA model's group: an MLA KV anchor on a DSA device pool and the indexer pool on
    its indices, with 64-token pages."""
    return hybrids(layout, extra, indexer, anchor=rig.dsa_pools, page=rig.DSA_PAGE)


def on_kv(keys=None):
    """The indexer's transfer as SGLang's radix cache builds it: on the KV pages' indices
    (SGLang fills in their host indices and keys), ``all_pages``; a prefetch's has no keys."""
    return [PoolTransfer(name=PoolName.INDEXER, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES,
                         indices_from_pool=PoolName.KV)]


def filled(host, n_pages, seed):
    """``n_pages`` fresh pages of ``host`` (its own page size) filled from ``seed``; their
    indices and bytes."""
    indices = host.alloc(n_pages * host.page_size)
    assert indices is not None
    if hasattr(host, "head_num") or hasattr(host, "kv_lora_rank"):  # a KV pool: values of its dtype
        rig.fill_pages(host, indices, seed)
    else:
        rig.fill_side_pages(host, indices, seed)
    return indices, rig.page_bytes(host, indices)


def backup_with_side(h, toks, kv_idx, name, side_idx, side_keys, prefix_keys=None):
    """One ``write_storage`` of KV pages with one side transfer, as SGLang's radix cache
    issues it (trailing pages); every page must be stored."""
    transfer = PoolTransfer(name=name, host_indices=side_idx, keys=side_keys, hit_policy=TRAILING)
    keys, done, side = rig.hybrid_backup(h, kv_idx, toks, [transfer], prefix_keys=prefix_keys)
    assert done == len(keys)
    assert side[name] == len(side_keys)


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
    assert rig.page_bytes(b.side[PoolName.MAMBA], got.side_indices[PoolName.MAMBA]) == m_want


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
    assert rig.page_bytes(b.side[PoolName.MAMBA], got.side_indices[PoolName.MAMBA]) == m6_want

    deleted = a.backend._side["mamba"].tier.delete([page_key(keys[5])])
    assert deleted["deleted"] == 1, deleted
    got = rig.hybrid_prefetch(b, "r2", toks, placeholder(PoolName.MAMBA, 1))
    assert (got.hit, got.restorable, got.loaded) == (3, [3], 3)
    assert got.pool_hits == {"mamba": 1}
    assert rig.page_bytes(b.kv, got.kv_indices) == kv_want[:3]
    assert rig.page_bytes(b.side[PoolName.MAMBA], got.side_indices[PoolName.MAMBA]) == m3_want


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


def draft(layout):
    """An MTP draft model's KV pool, which SGLang keeps on the KV pages' indices."""
    pools = rig.mha_pools(layout)
    return {PoolName.DRAFT: (pools.host, pools.device)}


def test_the_hit_query_over_three_side_pools_keeps_each_pools_verdict(kv_store, hybrids):
    """A Mamba + SWA model with an MTP draft pool (KV, then three side pools, whose checks
    run at once): each pool's own restorable lengths and longest hit come back under its
    own name, and the usable lengths are those all of them keep. Two backups of pages 1-3
    and 4-6 save the Mamba state at 3 and 6, the SWA windows over 2-3 and 5-6 and every
    draft page; without SWA page 6 and draft page 5, Mamba keeps 3 and 6, SWA 3, the draft
    1-4: length 3 is the hit."""
    from kvtier.sglang import page_key

    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    layout = "page_first"
    a = hybrids(layout, extra, {**mamba(), **swa(layout), **draft(layout)})
    toks = rig.tokens(6, salt=50)
    keys = rig.page_keys(toks)
    kv_idx, _ = filled(a.kv, 6, seed=50)
    for part, prefix_keys in ((slice(0, 3), None), (slice(3, 6), keys[:3])):
        m_idx, _ = filled(a.side[PoolName.MAMBA], 1, seed=51 + part.start)
        s_idx, _ = filled(a.side[PoolName.SWA], 2, seed=52 + part.start)
        side = [PoolTransfer(name=PoolName.MAMBA, host_indices=m_idx, keys=keys[part][-1:], hit_policy=TRAILING),
                PoolTransfer(name=PoolName.SWA, host_indices=s_idx, keys=keys[part][-2:], hit_policy=TRAILING),
                PoolTransfer(name=PoolName.DRAFT, keys=keys[part], hit_policy=PoolHitPolicy.ALL_PAGES,
                             indices_from_pool=PoolName.KV)]
        rig.fill_side_pages(a.side[PoolName.DRAFT], kv_idx[part.start * rig.PAGE:part.stop * rig.PAGE], seed=53)
        _, done, stored = rig.hybrid_backup(a, kv_idx[part.start * rig.PAGE:part.stop * rig.PAGE],
                                            toks[: part.stop * rig.PAGE], side, prefix_keys=prefix_keys)
        assert (done, stored) == (3, {PoolName.MAMBA: 1, PoolName.SWA: 2, PoolName.DRAFT: 3})
    draft_want = rig.page_bytes(a.side[PoolName.DRAFT], kv_idx)
    query = placeholder(PoolName.MAMBA, 1) + placeholder(PoolName.SWA, 2) + [
        PoolTransfer(name=PoolName.DRAFT, hit_policy=PoolHitPolicy.ALL_PAGES, indices_from_pool=PoolName.KV)]
    result = a.backend.batch_exists_v2(keys, query)
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (6, [3, 6])
    assert result.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.MAMBA: 6, PoolName.SWA: 6, PoolName.DRAFT: 6}

    assert a.backend._side["swa"].tier.delete([page_key(keys[5])])["deleted"] == 1
    assert a.backend._side["draft"].tier.delete([page_key(keys[4])])["deleted"] == 1
    result = a.backend.batch_exists_v2(keys, query)
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (3, [3])
    assert result.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.MAMBA: 6, PoolName.SWA: 3, PoolName.DRAFT: 4}
    # In another order, and with an SWA window of 3 pages, which no length has: no hit;
    # the pools after the one that left no length are not reported.
    query = [PoolTransfer(name=PoolName.DRAFT, hit_policy=PoolHitPolicy.ALL_PAGES, indices_from_pool=PoolName.KV)
             ] + placeholder(PoolName.SWA, 3) + placeholder(PoolName.MAMBA, 1)
    result = a.backend.batch_exists_v2(keys, query)
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (0, [])
    assert result.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.DRAFT: 4}
    # And SGLang's own hit query through the controller settles on length 3.
    b = hybrids(layout, extra, {**mamba(), **swa(layout), **draft(layout)})
    got = rig.hybrid_prefetch(b, "r", toks, placeholder(PoolName.MAMBA, 1) + placeholder(PoolName.SWA, 2) + [
        PoolTransfer(name=PoolName.DRAFT, hit_policy=PoolHitPolicy.ALL_PAGES, indices_from_pool=PoolName.KV)])
    assert (got.hit, got.restorable, got.loaded) == (3, [3], 3)
    assert got.pool_hits == {"mamba": 1, "swa": 2}
    assert rig.page_bytes(b.side[PoolName.DRAFT], got.side_indices[PoolName.DRAFT]) == draft_want[:3]


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


def test_the_dsa_indexer_pool_registers_in_page_first_and_is_refused_in_layer_first(local_only, hybrids):
    """The DSA indexer builds on CPU; SGLang's controller registers it. In ``page_first`` it
    gets its own namespace; in ``layer_first`` SGLang names no memory for its pages, and the
    backend refuses it at registration with SGLang's reason (the controller fails to start)."""
    extra = rig.extra_config(local_only.store_config, local_only.prefix)
    h = dsa(hybrids, extra)
    indexer_ns = h.backend.side_pools["indexer"]
    assert indexer_ns.startswith("sglang/o-m/indexer-page_first-p64-") and indexer_ns.endswith("/tp1")
    with pytest.raises(ValueError, match="indexer.*Unsupported layout"):
        dsa(hybrids, extra, layout="layer_first")


def test_the_dsa_indexer_backs_up_and_prefetches_with_the_kv_pages(kv_store, hybrids):
    """DSA (64-token pages): the indexer pool shares the KV pages' indices. SGLang backs its
    pages up under the KV pages' keys (``batch_set_v2``) and reads them beside each KV batch
    (``batch_get_v2``); a second instance with fresh pools gets both byte-exact. With the
    indexer page of page 3 deleted from the store (every KV page still there), ``all_pages``
    leaves lengths 1 and 2: the prefetch stops after page 2, both pools byte-exact."""
    from kvtier.sglang import page_key

    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = dsa(hybrids, extra)
    page = a.page
    assert page == 64
    toks = rig.tokens(5, salt=40, page=page)
    keys = rig.page_keys(toks, page)
    kv_idx, kv_want = filled(a.kv, 5, seed=40)
    rig.fill_side_pages(a.side[PoolName.INDEXER], kv_idx, seed=41)
    ix_want = rig.page_bytes(a.side[PoolName.INDEXER], kv_idx)
    stored_keys, done, side = rig.hybrid_backup(a, kv_idx, toks, on_kv(keys))
    assert (stored_keys, done, side) == (keys, 5, {PoolName.INDEXER: 5})

    b = dsa(hybrids, extra)  # fresh pools, its own tiers
    got = rig.hybrid_prefetch(b, "r1", toks, on_kv())
    assert (got.hit, got.restorable, got.loaded) == (5, [1, 2, 3, 4, 5], 5)
    assert rig.page_bytes(b.kv, got.kv_indices) == kv_want
    assert rig.page_bytes(b.side[PoolName.INDEXER], got.side_indices[PoolName.INDEXER]) == ix_want
    b.kv.free(got.kv_indices)

    assert a.backend._side["indexer"].tier.delete([page_key(keys[2])])["deleted"] == 1
    assert b.backend.batch_exists(keys) == 5
    c = dsa(hybrids, extra)
    got = rig.hybrid_prefetch(c, "r2", toks, on_kv())
    assert (got.hit, got.restorable, got.loaded) == (2, [1, 2], 2)
    assert rig.page_bytes(c.kv, got.kv_indices) == kv_want[:2]
    assert rig.page_bytes(c.side[PoolName.INDEXER], got.side_indices[PoolName.INDEXER]) == ix_want[:2]


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_swa_beside_an_mla_kv_pool_backs_up_and_prefetches(kv_store, hybrids, layout):
    """An MLA KV pool with a sliding-window pool, which SGLang builds as a second MLA host
    pool: both replicated across TP ranks (``tp1``); a window over pages 3-4 of 4 makes
    length 4 usable and loads byte-exact, with the KV pages, in a second instance."""
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = hybrids(layout, extra, swa(layout, mla=True), anchor=rig.mla_pools)
    assert a.backend.namespace.startswith(f"sglang/o-m/mla-{layout}-") and a.backend.namespace.endswith("/tp1")
    assert a.backend.side_pools["swa"].startswith(f"sglang/o-m/swa-{layout}-p16-")
    assert a.backend.side_pools["swa"].endswith("/tp1")
    toks = rig.tokens(4, salt=42)
    keys = rig.page_keys(toks)
    kv_idx, kv_want = filled(a.kv, 4, seed=42)
    s_idx, s_want = filled(a.side[PoolName.SWA], 2, seed=43)
    backup_with_side(a, toks, kv_idx, PoolName.SWA, s_idx, keys[2:4])

    b = hybrids(layout, extra, swa(layout, mla=True), anchor=rig.mla_pools)
    got = rig.hybrid_prefetch(b, "r", toks, placeholder(PoolName.SWA, 2))
    assert (got.hit, got.restorable, got.loaded) == (4, [4], 4)
    assert got.pool_hits == {"swa": 2}
    assert rig.page_bytes(b.kv, got.kv_indices) == kv_want
    assert rig.page_bytes(b.side[PoolName.SWA], got.side_indices[PoolName.SWA]) == s_want


def test_connections_cut_under_a_mamba_hybrid_never_yield_wrong_pages(kv_store, hybrids):
    """As test_sglang.py's fault-proxy test (on the S3 servers only: it cuts connections to
    one), for a model with Mamba state and a sliding window beside its KV pool: the fault
    proxy resets a connection every 200 KiB of traffic while SGLang's hybrid controller
    backs up 8 sequences (3 KV pages, the Mamba state at the last, the SWA window of the
    last two) and prefetches them. No prefetch, during the faults or after, lands a wrong
    byte in any pool; once the faults stop, every page each pool reported stored loads
    byte-exact, and a sequence every pool stored whole prefetches whole."""
    from fault_proxy import FaultProxy

    store, prefix = kv_store
    if store.get("type") != "s3":
        pytest.skip("cuts the connections to an S3 server")
    proxy = FaultProxy(int(store["endpoint_override"].rsplit(":", 1)[1]))
    layout = "page_first"
    sides = lambda: {**mamba(), **swa(layout)}  # noqa: E731
    wanted = lambda: placeholder(PoolName.MAMBA, 1) + placeholder(PoolName.SWA, 2)  # noqa: E731
    try:
        through = rig.extra_config(dict(store, endpoint_override=proxy.endpoint), prefix)
        a = hybrids(layout, through, sides(), size=1024)
        proxy.cut_every = 200 * 1024
        sequences = []
        for seq in range(8):
            toks = rig.tokens(3, salt=100 + seq)
            keys = rig.page_keys(toks)
            kv_idx, kv_want = filled(a.kv, 3, seed=100 + seq)
            m_idx, m_want = filled(a.side[PoolName.MAMBA], 1, seed=200 + seq)
            s_idx, s_want = filled(a.side[PoolName.SWA], 2, seed=300 + seq)
            side = [PoolTransfer(name=PoolName.MAMBA, host_indices=m_idx, keys=keys[2:], hit_policy=TRAILING),
                    PoolTransfer(name=PoolName.SWA, host_indices=s_idx, keys=keys[1:], hit_policy=TRAILING)]
            _, done, stored = rig.hybrid_backup(a, kv_idx, toks, side)
            # Each pool's pages, their bytes, and how many of them (from the first) it stored.
            pools = {PoolName.KV: (keys, kv_want, done),
                     PoolName.MAMBA: (keys[2:], m_want, stored.get(PoolName.MAMBA, 0)),
                     PoolName.SWA: (keys[1:], s_want, stored.get(PoolName.SWA, 0))}
            sequences.append((toks, pools))
        b = hybrids(layout, through, sides(), size=1024)
        for i, (toks, pools) in enumerate(sequences):
            got = rig.hybrid_prefetch(b, f"during-{i}", toks, wanted())
            assert_loaded_exact(b, got, pools)
        cuts = proxy.cuts
        proxy.cut_every = 0
        assert cuts > 0, f"no connection was cut in {proxy.connections}"

        c = hybrids(layout, rig.extra_config(store, prefix), sides(), size=1024)
        for i, (toks, pools) in enumerate(sequences):
            for name, (keys, want, n) in pools.items():
                assert loads_exact(c, name, keys[:n]) == want[:n], f"sequence {i}: {name}"
            got = rig.hybrid_prefetch(c, f"after-{i}", toks, wanted())
            assert_loaded_exact(c, got, pools)
            if all(n == len(keys) for keys, _, n in pools.values()):
                assert (got.hit, got.loaded, got.pool_hits) == (3, 3, {"mamba": 1, "swa": 2}), f"sequence {i}"
    finally:
        proxy.close()


def assert_loaded_exact(h, got, pools):
    """What a hybrid prefetch loaded is byte-exact in every pool: the KV pages loaded and,
    where the side pools were read (the whole hit loaded, which can only be all 3 pages
    here: the Mamba state is saved at page 3 alone), their pages."""
    kv_keys, kv_want, _ = pools[PoolName.KV]
    assert got.loaded <= got.hit
    assert rig.page_bytes(h.kv, got.kv_indices)[: got.loaded] == kv_want[: got.loaded]
    for name, n in got.pool_hits.items():
        assert got.hit == 3
        _, want, _ = pools[PoolName(name)]
        assert rig.page_bytes(h.side[PoolName(name)], got.side_indices[PoolName(name)])[:n] == want[:n]
    h.kv.free(got.kv_indices)
    for name, indices in got.side_indices.items():
        if indices is not None:
            h.side[name].free(indices)


def loads_exact(h, name, keys):
    """The pages of pool ``name`` stored under ``keys``, loaded by the backend
    (``batch_get_v2``) into fresh pages of the pool: their bytes; asserts every load
    succeeded."""
    if not keys:
        return []
    host = h.kv if name == PoolName.KV else h.side[name]
    indices = host.alloc(len(keys) * host.page_size)
    assert indices is not None
    try:
        done = h.backend.batch_get_v2([PoolTransfer(name=name, keys=list(keys), host_indices=indices)])
        assert done[name] == [True] * len(keys), (name, done)
        return rig.page_bytes(host, indices)
    finally:
        host.free(indices)
