"""kvtier as SGLang 0.5.23's HiCache storage backend, driven through SGLang's own code:
its storage factory loads ``kvtier.sglang.KvtierStorage`` from ``extra_config``, its real
host pools (every MHA layout, and MLA) hold the pages, and its ``HiCacheController``
backs pages up (``batch_set_v1``) and prefetches them (``batch_exists``, then
``batch_get_v1``), on the local store and the S3 servers of the session. Only the
device-to-host copies, which need a GPU, are left out.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.managers.cache_controller")

import sglang_rig as rig  # noqa: E402
from sglang_rig import kv_store, root_logging_restored  # noqa: E402,F401 (fixtures)

MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]


@pytest.fixture
def controllers():
    made = []

    def make(pools, extra, layout, **kw):
        ctrl = rig.controller(pools, extra, layout, **kw)
        made.append(ctrl)
        return ctrl

    yield make
    for ctrl in made:
        ctrl.storage_backend.close()


def backend_for(pools, extra, tp_rank=0, tp_size=1, mla=False):
    """A backend built by SGLang's own factory, for one rank, with the pool registered."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    cfg = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=True, is_page_first_layout=True,
        model_name=rig.MODEL, extra_config=dict(extra),
    )
    backend = StorageBackendFactory.create_backend("dynamic", cfg, pools.host)
    backend.register_mem_pool_host(pools.host)
    backend.on_host_pools_registered()
    return backend


@pytest.mark.parametrize("layout", MHA_LAYOUTS)
def test_backup_then_prefetch_on_a_second_instance(kv_store, controllers, layout):
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = rig.mha_pools(layout)
    ctrl_a = controllers(a, extra, layout)
    assert type(ctrl_a.storage_backend).__name__ == "KvtierStorage"
    toks, want, _ = rig.back_up_new_pages(ctrl_a, a.host, 5, seed=1)

    b = rig.mha_pools(layout)  # another instance: its own pools, its own tier
    ctrl_b = controllers(b, extra, layout)
    rig.prefetch_all(ctrl_b, b.host, "r1", toks, want)
    # A prompt that continues differently hits only the shared pages.
    other = toks[: 2 * rig.PAGE] + rig.tokens(3, salt=99)
    rig.prefetch_all(ctrl_b, b.host, "r2", other, want[:2])
    stats = ctrl_b.storage_backend.get_stats()
    assert stats.kvtier["keys_loaded"] == 7


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_the_hybrid_controller_backs_up_and_prefetches(kv_store, layout):
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    ctrl_a, host_a = rig.hybrid_controller(layout, extra)
    ctrl_b, host_b = rig.hybrid_controller(layout, extra)
    try:
        assert type(ctrl_a.storage_backend).__name__ == "KvtierStorage"
        toks, want, _ = rig.back_up_new_pages(ctrl_a, host_a, 4, seed=11)
        rig.prefetch_all(ctrl_b, host_b, CacheRequestHandle("r1", 0), toks, want)
    finally:
        ctrl_a.storage_backend.close()
        ctrl_b.storage_backend.close()


def test_a_missing_page_in_the_middle_stops_the_run_there(kv_store, controllers):
    store, prefix = kv_store
    layout = "page_first"
    extra = rig.extra_config(store, prefix)
    a = rig.mha_pools(layout)
    ctrl_a = controllers(a, extra, layout)
    idx = a.host.alloc(4 * rig.PAGE)
    rig.fill_pages(a.host, idx, seed=2)
    want = rig.page_bytes(a.host, idx)
    toks = rig.tokens(4, salt=2)
    keys = rig.page_keys(toks)
    # Pages 0, 1 and 3 are stored; page 2 is not.
    backend = ctrl_a.storage_backend
    assert backend.batch_set_v1(keys[:2], idx[: 2 * rig.PAGE]) == [True, True]
    assert backend.batch_set_v1(keys[3:], idx[3 * rig.PAGE:]) == [True]
    assert backend.batch_exists(keys) == 2
    assert backend.batch_exists(keys[3:]) == 1

    b = rig.mha_pools(layout)
    ctrl_b = controllers(b, extra, layout)
    rig.prefetch_all(ctrl_b, b.host, "r", toks, want[:2])


def test_a_truncated_page_fails_its_load_alone(local_only, controllers):
    store = local_only
    layout = "layer_first"
    extra = rig.extra_config(store.store_config, store.prefix)
    a = rig.mha_pools(layout)
    ctrl_a = controllers(a, extra, layout)
    toks, want, keys = rig.back_up_new_pages(ctrl_a, a.host, 3, seed=3)
    from kvtier.sglang import page_key

    path = store.local_object(ctrl_a.storage_backend.namespace, page_key(keys[1]))
    assert path.is_file()
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)

    b = rig.mha_pools(layout)
    ctrl_b = controllers(b, extra, layout)
    hit, loaded, got = rig.prefetch(ctrl_b, b.host, "r", toks)
    assert hit == 3  # it exists; its bytes are wrong
    assert loaded == 1
    assert rig.page_bytes(b.host, got)[:1] == want[:1]


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_legacy_calls_and_zero_copy_calls_share_objects(kv_store, controllers, layout):
    store, prefix = kv_store
    legacy = rig.extra_config(store, prefix, interface_v1=0)
    zero_copy = rig.extra_config(store, prefix)
    a = rig.mha_pools(layout)
    ctrl_a = controllers(a, legacy, layout)
    assert ctrl_a.page_set_func == ctrl_a._generic_page_set
    toks, want, _ = rig.back_up_new_pages(ctrl_a, a.host, 3, seed=4)

    b = rig.mha_pools(layout)
    ctrl_b = controllers(b, zero_copy, layout)
    rig.prefetch_all(ctrl_b, b.host, "r", toks, want)
    # And back: what the zero-copy path stored, the legacy path reads.
    toks2, want2, _ = rig.back_up_new_pages(ctrl_b, b.host, 2, seed=5)
    c = rig.mha_pools(layout)
    ctrl_c = controllers(c, legacy, layout)
    rig.prefetch_all(ctrl_c, c.host, "r", toks2, want2)


def test_pools_that_cannot_share_bytes_never_do(kv_store):
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    a = rig.mha_pools("page_first")
    toks = rig.tokens(2, salt=6)
    keys = rig.page_keys(toks)
    writer = backend_for(a, extra)
    try:
        idx = a.host.alloc(2 * rig.PAGE)
        rig.fill_pages(a.host, idx, seed=6)
        assert writer.batch_set_v1(keys, idx) == [True, True]
        same = backend_for(rig.mha_pools("page_first"), extra)
        others = [
            backend_for(rig.mha_pools("page_head"), extra),  # another layout
            backend_for(rig.mha_pools("page_first", dtype=torch.float16), extra),  # dtype
            backend_for(rig.mha_pools("page_first", heads=2), extra),  # head count
            backend_for(rig.mha_pools("page_first"), extra, tp_rank=1, tp_size=2),  # TP shard
        ]
        try:
            assert same.batch_exists(keys) == 2
            assert [o.batch_exists(keys) for o in others] == [0, 0, 0, 0]
            assert len({o.namespace for o in others} | {same.namespace}) == 5
        finally:
            for o in [same, *others]:
                o.close()
    finally:
        writer.close()


def test_mla_one_rank_writes_and_every_rank_reads(kv_store):
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    toks = rig.tokens(3, salt=7)
    keys = rig.page_keys(toks)
    r0, r1 = rig.mla_pools("page_first"), rig.mla_pools("page_first")
    rank0 = backend_for(r0, extra, tp_rank=0, tp_size=2, mla=True)
    rank1 = backend_for(r1, extra, tp_rank=1, tp_size=2, mla=True)
    try:
        assert rank0.namespace == rank1.namespace
        idx1 = r1.host.alloc(3 * rig.PAGE)
        rig.fill_pages(r1.host, idx1, seed=70)
        assert rank1.batch_set_v1(keys, idx1) == [True] * 3  # not the writer: stores nothing
        assert rank1.batch_exists(keys) == 0
        idx0 = r0.host.alloc(3 * rig.PAGE)
        rig.fill_pages(r0.host, idx0, seed=7)
        want = rig.page_bytes(r0.host, idx0)
        assert rank0.batch_set_v1(keys, idx0) == [True] * 3
        assert rank1.batch_exists(keys) == 3
        into = r1.host.alloc(3 * rig.PAGE)
        assert rank1.batch_get_v1(keys, into) == [True] * 3
        assert rig.page_bytes(r1.host, into) == want
    finally:
        rank0.close()
        rank1.close()


def test_mla_through_the_controller(kv_store, controllers):
    store, prefix = kv_store
    layout = "page_first"
    extra = rig.extra_config(store, prefix)
    a = rig.mla_pools(layout)
    ctrl_a = controllers(a, extra, layout)
    toks, want, _ = rig.back_up_new_pages(ctrl_a, a.host, 3, seed=8)
    b = rig.mla_pools(layout)
    ctrl_b = controllers(b, extra, layout)
    rig.prefetch_all(ctrl_b, b.host, "r", toks, want)


def test_clear_deletes_this_namespace_only(kv_store):
    store, prefix = kv_store
    extra = rig.extra_config(store, prefix)
    toks = rig.tokens(2, salt=9)
    keys = rig.page_keys(toks)
    first, second = rig.mha_pools("page_first"), rig.mha_pools("layer_first")
    mine, theirs = backend_for(first, extra), backend_for(second, extra)
    try:
        for backend, pools in ((mine, first), (theirs, second)):
            idx = pools.host.alloc(2 * rig.PAGE)
            rig.fill_pages(pools.host, idx, seed=9)
            assert backend.batch_set_v1(keys, idx) == [True, True]
        mine.clear()
        assert mine.batch_exists(keys) == 0
        assert theirs.batch_exists(keys) == 2
    finally:
        mine.close()
        theirs.close()


def test_eviction_and_block_events_as_configured(kv_store):
    """``eviction`` and ``enable_kv_events`` in ``extra_config`` work as in any tier: with a
    budget of two pages, a round deletes two of four, those MISS afterwards and are the
    BlockRemoved events, and every stored page was a BlockStored event."""
    from kvtier.sglang import page_key

    store, prefix = kv_store
    page_bytes = 2 * rig.LAYERS * rig.PAGE * rig.HEADS * rig.HEAD_DIM * 2  # K and V, bf16
    extra = rig.extra_config(
        store, prefix, enable_kv_events=True, eviction={"max_bytes": 2 * page_bytes, "interval_ms": 3_600_000}
    )
    pools = rig.mha_pools("page_first")
    backend = backend_for(pools, extra)
    try:
        keys = rig.page_keys(rig.tokens(4, salt=13))
        idx = pools.host.alloc(4 * rig.PAGE)
        rig.fill_pages(pools.host, idx, seed=13)
        assert backend.batch_set_v1(keys, idx) == [True] * 4
        report = backend.tier.evict_now()
        assert (report["objects"], report["bytes"], report["deleted"]) == (4, 4 * page_bytes, 2), report
        present = [k for k in keys if backend.exists(k)]
        gone = [k for k in keys if k not in present]
        assert len(present) == 2
        events = backend.take_events()
        assert [k for e in events if not e.removed for k in e.keys] == [page_key(k) for k in keys]
        assert sorted(k for e in events if e.removed for k in e.keys) == sorted(page_key(k) for k in gone)
    finally:
        backend.close()


def test_sglangs_failure_injector_never_yields_wrong_pages(kv_store, controllers, monkeypatch):
    store, prefix = kv_store
    layout = "page_first"
    extra = rig.extra_config(store, prefix)
    a = rig.mha_pools(layout)
    ctrl_a = controllers(a, extra, layout)
    toks, want, _ = rig.back_up_new_pages(ctrl_a, a.host, 6, seed=10)
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.4")
    b = rig.mha_pools(layout)
    ctrl_b = controllers(b, extra, layout)
    assert type(ctrl_b.storage_backend).__name__ == "HiCacheStorageFailureInjector"
    outcomes = set()
    for i in range(12):
        hit, loaded, got = rig.prefetch(ctrl_b, b.host, f"r{i}", toks)
        assert loaded <= hit <= 6
        assert rig.page_bytes(b.host, got)[:loaded] == want[:loaded]
        outcomes.add(loaded == 6)
        b.host.free(got)
    # Some prefetches failed and some did not (a 0.4 failure rate per call, 24 calls).
    assert outcomes == {True, False}


def test_connections_cut_under_sglang_never_yield_wrong_pages(kv_store, controllers):
    """The project's fault proxy resets a connection to the S3 server every 200 KiB of
    traffic (about one request in ten) while SGLang's controller backs pages up and
    prefetches them: every page SGLang counts as backed up
    loads byte-exact once the faults stop, and no prefetch, during the faults or after,
    ever lands a wrong byte."""
    from fault_proxy import FaultProxy

    store, prefix = kv_store
    if store.get("type") != "s3":
        pytest.skip("cuts the connections to an S3 server")
    proxy = FaultProxy(int(store["endpoint_override"].rsplit(":", 1)[1]))
    try:
        layout = "page_first"
        through = rig.extra_config(dict(store, endpoint_override=proxy.endpoint), prefix)
        a = rig.mha_pools(layout, size=1024)
        ctrl_a = controllers(a, through, layout)
        proxy.cut_every = 200 * 1024
        sequences = []
        for seq in range(8):
            idx = a.host.alloc(3 * rig.PAGE)
            rig.fill_pages(a.host, idx, seed=100 + seq)
            toks = rig.tokens(3, salt=100 + seq)
            _, done = rig.backup_pages(ctrl_a, idx, toks)
            sequences.append((toks, rig.page_bytes(a.host, idx), done))
        b = rig.mha_pools(layout, size=1024)
        ctrl_b = controllers(b, through, layout)
        for i, (toks, want, _) in enumerate(sequences):
            hit, loaded, got = rig.prefetch(ctrl_b, b.host, f"during-{i}", toks)
            assert loaded <= hit
            assert rig.page_bytes(b.host, got)[:loaded] == want[:loaded]
            b.host.free(got)
        cuts = proxy.cuts
        proxy.cut_every = 0
        assert cuts > 0, f"no connection was cut in {proxy.connections}"
        c = rig.mha_pools(layout, size=1024)
        ctrl_c = controllers(c, rig.extra_config(store, prefix), layout)
        for i, (toks, want, done) in enumerate(sequences):
            hit, loaded, got = rig.prefetch(ctrl_c, c.host, f"after-{i}", toks)
            assert loaded >= done, f"sequence {i}: {done} pages backed up, {loaded} load"
            assert rig.page_bytes(c.host, got)[:loaded] == want[:loaded]
            c.host.free(got)
    finally:
        proxy.close()


def readme_launch_argv() -> list[str]:
    """The SGLang command line of the README's "Use with SGLang" section, as argv."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("## Use with SGLang"):]
    section = section[: section.index("\n## ", 1)]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "sglang.launch_server"], argv[:3]
    return argv[3:]


def test_the_readmes_sglang_flags_give_a_working_l3(kv_store):
    """What a user who follows the README gets: its exact flags, parsed by SGLang's own
    argument parser and its controller's extra-config parser, load kvtier's backend, which
    backs pages up and prefetches them into a second instance. Only the store (the README's
    is a placeholder) and the model (a local config, no weights) are the session's."""
    import json

    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.server_args import prepare_server_args

    store, prefix = kv_store
    argv = readme_launch_argv()
    argv[argv.index("--model-path") + 1] = rig.model_dir()
    args = prepare_server_args(argv + ["--device", "cpu", "--page-size", str(rig.PAGE), "--skip-tokenizer-init"])
    assert args.enable_hierarchical_cache and args.hicache_storage_backend == "dynamic"
    documented = json.loads(args.hicache_storage_backend_extra_config)
    assert documented["module_path"] == "kvtier.sglang" and documented["class_name"] == "KvtierStorage"
    documented.update(store=store, prefix=prefix)
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(json.dumps(documented))
    layout = "page_first"
    ctrl_a, host_a = rig.hybrid_controller(layout, extra)
    ctrl_b, host_b = rig.hybrid_controller(layout, extra)
    try:
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        assert ctrl_a.page_set_func == ctrl_a._page_set_zero_copy  # interface_v1 took effect
        toks, want, _ = rig.back_up_new_pages(ctrl_a, host_a, 3, seed=12)
        rig.prefetch_all(ctrl_b, host_b, CacheRequestHandle("r", 0), toks, want)
    finally:
        ctrl_a.storage_backend.close()
        ctrl_b.storage_backend.close()


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"store": {"type": "local", "path": "/tmp/x"}, "no_such_key": 1}, "no_such_key"),
        ({"prefix": "p"}, "store"),
        ({"store": {"type": "local", "path": "/tmp/x"}, "namespace": "mine"}, "namespace"),
        ({"store": {"type": "nosuch"}}, "nosuch"),
    ],
)
def test_bad_configs_fail_at_construction(bad, words):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    from kvtier.sglang import KvtierStorage

    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=rig.MODEL,
        extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage", **bad},
    )
    with pytest.raises(Exception) as info:
        KvtierStorage(cfg, {})
    assert words in str(info.value)
