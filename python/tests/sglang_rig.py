"""SGLang 0.5.23's own pools and HiCache controller, on CPU, with kvtier as the dynamic
storage backend: what the SGLang tests drive. Nothing of SGLang is replaced; only the
device-to-host copies (which need a GPU) are left out, so pages are written into the
host pool directly, as a finished device-to-host copy would leave them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

# No model is ever downloaded (the model directory below holds only a configuration), and
# SGLang's page hashing JIT-builds its extension with the venv's ninja.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
from dataclasses import dataclass

import pytest
import torch

PAGE = 16  # tokens per page (the default; a pool's own page_size is what counts)
DSA_PAGE = 64  # DSA pools need 64-token pages
LAYERS = 3
HEADS = 4
HEAD_DIM = 64
# Short: the model is part of every object name (see conftest.S3S_FS_MAX_KEY_BYTES).
MODEL = "o/m"


# -- fixtures the SGLang suites share (imported into their modules) ----------------------


@pytest.fixture(autouse=True)
def root_logging_restored():
    """SGLang configures the root logger as a server would (its argument parsing sets the
    INFO level and a stderr handler); put it back, so that the tests run later see the
    logging configuration they started with (test_observability checks kvtier's default
    level)."""
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


_model_dir: str | None = None


def model_dir() -> str:
    """A model directory holding only the configuration of a tiny Llama (SGLang's server
    arguments read it; no weights are ever loaded)."""
    global _model_dir
    if _model_dir is None:
        import json
        import tempfile

        path = tempfile.mkdtemp(prefix="kvtier-sglang-model-")
        config = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HEADS * HEAD_DIM,
            "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": HEAD_DIM,
            "num_hidden_layers": LAYERS, "intermediate_size": 512, "vocab_size": 32000,
            "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
        }
        with open(f"{path}/config.json", "w") as f:
            json.dump(config, f)
        _model_dir = path
    return _model_dir


def server_args(layout: str, page: int = PAGE):
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    args = ServerArgs(
        model_path=model_dir(),
        skip_tokenizer_init=True,
        device="cpu",
        page_size=page,
        hicache_mem_layout=layout,
        hicache_io_backend="direct",
        hicache_write_policy="write_through",
        skip_server_warmup=True,
    )
    set_global_server_args_for_scheduler(args)
    return args


def parallel(tp_rank: int = 0, tp_size: int = 1):
    from sglang.srt.distributed.parallel_state import get_parallel

    get_parallel().override_permanently(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1)


@dataclass
class Pools:
    device: object
    host: object
    allocator: object
    mla: bool


def mha_pools(layout: str, size: int = 512, dtype=torch.bfloat16, heads: int = HEADS, page: int = PAGE) -> Pools:
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls

    dev = MHATokenToKVPool(
        size=size, page_size=page, dtype=dtype, head_num=heads, head_dim=HEAD_DIM,
        layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )
    info = dev.get_device_pool_infos()[0].buffer_info
    host = get_mha_host_pool_cls(info)(
        info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=dev.size, start_layer=dev.start_layer, end_layer=dev.end_layer,
        write_back_staging=dev.hicache_write_back_staging,
    )
    allocator = PagedTokenToKVPoolAllocator(dev.size, page, dtype, "cpu", dev, False)
    return Pools(dev, host, allocator, mla=False)


def mla_pools(layout: str, size: int = 512, dtype=torch.bfloat16, page: int = PAGE, dsa: bool = False) -> Pools:
    """SGLang's MLA KV pools; with ``dsa``, the device pool is a ``DSATokenToKVPool`` (the
    MLA pool of DeepSeek sparse attention, which also holds the indexer's keys: build its
    host pool with :func:`dsa_indexer_host_pool`; SGLang needs 64-token pages for it)."""
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    common = dict(size=size, page_size=page, dtype=dtype, kv_lora_rank=64, qk_rope_head_dim=16,
                  layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    if dsa:
        dev = DSATokenToKVPool(**common, index_head_dim=128, kv_cache_dim=80)
    else:
        dev = MLATokenToKVPool(**common)
    info = dev.get_device_pool_infos()[0].buffer_info
    host = MLATokenToKVPoolHost(
        info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=dev.size, start_layer=dev.start_layer, end_layer=dev.end_layer,
        target_layer_num=LAYERS,
    )
    allocator = PagedTokenToKVPoolAllocator(dev.size, page, dtype, "cpu", dev, False)
    return Pools(dev, host, allocator, mla=True)


def dsa_pools(layout: str, size: int = 512, page: int = DSA_PAGE) -> Pools:
    """The MLA KV pools of a DSA model (:func:`mla_pools` with ``dsa``)."""
    return mla_pools(layout, size=size, page=page, dsa=True)


def dsa_indexer_host_pool(anchor: Pools):
    """SGLang's DSA indexer host pool (``DSAIndexerPoolHost``) over the DSA device pool of
    ``anchor`` (:func:`mla_pools` with ``dsa``), on the anchor host pool's indices and
    layout, as SGLang's assembler declares it (``make_dsa_indexer_pool_decl``); unpinned."""
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl

    return DSAIndexerPoolHost(make_dsa_indexer_pool_decl(anchor.device), anchor.host, pin_memory=False, device="cpu")


def extra_config(store: dict, prefix: str, **more) -> dict:
    return {
        "backend_name": "kvtier",
        "module_path": "kvtier.sglang",
        "class_name": "KvtierStorage",
        "interface_v1": 1,
        "store": store,
        "prefix": prefix,
        **more,
    }


def controller(pools: Pools, extra: dict, layout: str, tp_rank: int = 0, tp_size: int = 1):
    """SGLang's HiCacheController with the dynamic backend from ``extra``."""
    from sglang.srt.managers.cache_controller import HiCacheController

    page = pools.host.page_size
    server_args(layout, page)
    parallel(tp_rank, tp_size)
    return HiCacheController(
        pools.allocator, pools.host, page, None, threading.Event(),
        write_policy="write_through", io_backend="direct", storage_backend="dynamic",
        prefetch_threshold=page, model_name=MODEL, storage_backend_extra_config=dict(extra),
    )


def fill_pages(host, indices: torch.Tensor, seed: int) -> None:
    """Random values in the KV host pool's pages at ``indices`` (token indices; the pool's
    own page size)."""
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, len(indices), host.page_size):
        page = host.get_data_page(int(indices[start]), flat=True)
        noise = torch.randint(-1000, 1000, page.shape, generator=gen, dtype=torch.int32).to(page.dtype) / 7
        host.set_from_flat_data_page(int(indices[start]), noise)


def page_bytes(host, indices: torch.Tensor) -> list[bytes]:
    """Each page's bytes at ``indices``, in flat-page order, for any host pool (KV or side
    pool; its own page size: a Mamba page is one slot)."""
    return [
        host.get_data_page(int(indices[s]), flat=True).contiguous().view(torch.uint8).numpy().tobytes()
        for s in range(0, len(indices), host.page_size)
    ]


def tokens(n_pages: int, salt: int = 0, page: int = PAGE) -> list[int]:
    return [(salt * 7919 + i) % 32000 for i in range(n_pages * page)]


def page_keys(toks: list[int], page: int = PAGE) -> list[str]:
    """SGLang's chained page keys of ``toks`` (pages of ``page`` tokens), as its controller
    computes them."""
    from sglang.srt.mem_cache.utils import get_hash_str

    keys, last = [], None
    for s in range(0, len(toks), page):
        last = get_hash_str(toks[s:s + page], last)
        keys.append(last)
    return keys


def backup_pages(ctrl, host_indices: torch.Tensor, toks: list[int], timeout: float = 60.0) -> tuple[list[str], int]:
    """``write_storage`` of the pages at ``host_indices`` and the wait for its ack; returns
    the page keys SGLang chained for them and how many pages SGLang counts as backed up
    (its batches stop at the first that fails)."""
    keys = page_keys(toks, ctrl.page_size)
    op_id = ctrl.write_storage(host_indices, toks, hash_value=keys)
    ack = ctrl.ack_backup_queue.get(timeout=timeout)
    assert ack.id == op_id, (ack.id, op_id)
    return keys, ack.completed_tokens // ctrl.page_size


def backup(ctrl, host_indices: torch.Tensor, toks: list[int], timeout: float = 60.0) -> list[str]:
    """:func:`backup_pages`, which must back every page up; returns the page keys."""
    keys, done = backup_pages(ctrl, host_indices, toks, timeout)
    assert done == len(keys), f"{done} of {len(keys)} pages backed up"
    return keys


def back_up_new_pages(ctrl, host, n_pages: int, seed: int) -> tuple[list[int], list[bytes], list[str]]:
    """``n_pages`` fresh pages of ``host`` filled from ``seed``, backed up by ``ctrl`` (every
    page) under tokens salted with ``seed``. Returns (tokens, each page's bytes, keys)."""
    indices = host.alloc(n_pages * host.page_size)
    fill_pages(host, indices, seed=seed)
    want = page_bytes(host, indices)
    toks = tokens(n_pages, salt=seed, page=host.page_size)
    return toks, want, backup(ctrl, indices, toks)


def prefetch_all(ctrl, host, rid, toks: list[int], want: list[bytes]) -> torch.Tensor:
    """:func:`prefetch`, which must hit and load exactly the pages of ``want``, byte-exact;
    returns their host indices."""
    hit, loaded, got = prefetch(ctrl, host, rid, toks)
    assert (hit, loaded) == (len(want), len(want))
    assert page_bytes(host, got) == want
    return got


def prefetch(ctrl, host, rid, toks: list[int], timeout: float = 60.0):
    """SGLang's prefetch of ``toks``: the storage hit query (``batch_exists``), host pages
    for the hits, the transfer (``batch_get_v1``). Returns (pages hit, pages loaded, host
    indices of the hit pages)."""
    op = ctrl.prefetch(rid, toks)
    hit = ctrl.prefetch_hit_queue.get(timeout=timeout)
    assert hit is op
    indices = host.alloc(op.storage_hit_count) if op.storage_hit_count else torch.tensor([], dtype=torch.int64)
    assert indices is not None, "host pool full"
    op.host_indices = indices
    ctrl.prefetch_buffer.put(op)
    loaded = 0
    while True:
        ack = ctrl.ack_prefetch_queue.get(timeout=timeout)
        assert ack.operation is op
        if ack.completed_tokens is not None:
            loaded = max(loaded, ack.completed_tokens)
        if ack.completed_req:
            break
    return op.storage_hit_count // ctrl.page_size, loaded // ctrl.page_size, indices


def hybrid_controller(layout: str, extra: dict, size: int = 512):
    """SGLang's production controller for plain MHA models, ``HybridCacheController`` over
    the host pool group ``build_kv_only_group`` makes, with the dynamic backend from
    ``extra``. Returns (controller, host pool). The group's host pool is built unpinned
    (pinning needs a CUDA driver), as SGLang's own CPU tests build it."""
    import functools

    import sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler as assembler
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    server_args(layout)
    parallel()
    pools = mha_pools(layout, size=size)
    original = assembler._mha_host_inputs

    def unpinned(*args, **kwargs):
        cls, inputs, more = original(*args, **kwargs)
        return functools.partial(cls, pin_memory=False), inputs, more

    assembler._mha_host_inputs = unpinned
    try:
        group = assembler.build_kv_only_group(
            page_size=PAGE, kv_pool=pools.device, full_layer_mapping={i: i for i in range(LAYERS)}, use_mla=False
        )
    finally:
        assembler._mha_host_inputs = original
    ctrl = HybridCacheController(
        pools.allocator, group, PAGE, None, threading.Event(),
        write_policy="write_through", io_backend="direct", storage_backend="dynamic",
        prefetch_threshold=PAGE, model_name=MODEL, storage_backend_extra_config=dict(extra),
    )
    return ctrl, group.anchor_entry.host_pool


# -- hybrid models: side pools ----------------------------------------------------------

MAMBA_LAYERS = 2


def mamba_host_pool(slots: int = 16, heads: int = 4):
    """SGLang's Mamba state host pool (``MambaPoolHost``, page_first: one page is one
    state slot holding every layer's temporal and conv state) over CPU state tensors
    shaped as a device ``MambaPool`` hands them over (layer, slot, ...); unpinned."""
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    info = MambaStateBufferInfo(
        temporal=torch.zeros(MAMBA_LAYERS, slots, heads, 16, dtype=torch.float32),
        conv=(torch.zeros(MAMBA_LAYERS, slots, 32, 3, dtype=torch.bfloat16),),
    )
    host = MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu", layout="page_first")
    return host, info


def swa_pools(layout: str, size: int = 256, mla: bool = False, page: int = PAGE) -> Pools:
    """A sliding-window KV pool: SGLang builds its host pool like the full KV pool's (MHA,
    or MLA beside an MLA KV pool), over the SWA layers' own device pool."""
    return (mla_pools if mla else mha_pools)(layout, size=size, page=page)


@dataclass
class Hybrid:
    """A hybrid model's host pool group under SGLang's ``HybridCacheController``."""

    ctrl: object
    kv: object  # the KV (anchor) host pool
    side: dict  # PoolName -> host pool

    @property
    def backend(self):
        return self.ctrl.storage_backend

    @property
    def page(self) -> int:
        """Tokens per KV page."""
        return self.ctrl.page_size


def hybrid_group_controller(layout: str, extra: dict, side, size: int = 512, anchor=mha_pools,
                            page: int = PAGE) -> Hybrid:
    """SGLang's ``HybridCacheController`` over a ``HostPoolGroup`` of a KV anchor (built by
    ``anchor(layout, size=, page=)``: :func:`mha_pools`, or :func:`mla_pools`) and the side
    pools ``side`` (PoolName -> (host pool, device pool), or a function of the anchor's
    :class:`Pools` returning that, for pools built on the anchor such as the DSA indexer),
    as SGLang's hybrid assemblers group them, with the dynamic backend from ``extra``: the
    controller registers every entry with the backend (``register_mem_host_pool_v2``)."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry

    server_args(layout, page)
    parallel()
    kv = anchor(layout, size=size, page=page)
    if callable(side):
        side = side(kv)
    entries = [PoolEntry(name=PoolName.KV, host_pool=kv.host, device_pool=kv.device,
                         layer_mapper=lambda i: i, is_primary_index_anchor=True)]
    for name, (host, device) in side.items():
        entries.append(PoolEntry(name=name, host_pool=host, device_pool=device, layer_mapper=lambda i: i))
    group = HostPoolGroup(entries)
    ctrl = HybridCacheController(
        kv.allocator, group, page, None, threading.Event(),
        write_policy="write_through", io_backend="direct", storage_backend="dynamic",
        prefetch_threshold=page, model_name=MODEL, storage_backend_extra_config=dict(extra),
    )
    return Hybrid(ctrl, kv.host, {name: host for name, (host, _) in side.items()})


def fill_side_pages(host, indices: torch.Tensor, seed: int) -> None:
    """Random bytes in the pages of side pool ``host`` at ``indices`` (the pool's own page
    size: a Mamba page is one slot)."""
    gen = torch.Generator().manual_seed(seed)
    step = host.page_size
    for start in range(0, len(indices), step):
        page = host.get_data_page(int(indices[start]), flat=True)
        noise = torch.randint(0, 256, (page.numel() * page.element_size(),), generator=gen, dtype=torch.int32)
        host.set_from_flat_data_page(int(indices[start]), noise.to(torch.uint8).view(page.dtype))


def hybrid_backup(h: Hybrid, kv_indices: torch.Tensor, toks: list[int], side: list, prefix_keys=None,
                  timeout: float = 60.0):
    """``write_storage`` of the KV pages at ``kv_indices`` (tokens ``toks``, after the pages
    of ``prefix_keys``) with the side-pool transfers ``side`` (``PoolTransfer`` as the radix
    cache builds them: keys and host indices, or ``indices_from_pool`` for a pool on the KV
    pages' indices, which SGLang resolves), and the wait for its ack. Returns (KV keys,
    pages SGLang counts as backed up, each side pool's leading run of stored pages)."""
    keys = page_keys(toks, h.page)[len(prefix_keys or ()):]
    op_id = h.ctrl.write_storage(kv_indices, toks[len(prefix_keys or ()) * h.page:], hash_value=keys,
                                 prefix_keys=prefix_keys, extra_pools=side)
    ack = h.ctrl.ack_backup_queue.get(timeout=timeout)
    assert ack.id == op_id, (ack.id, op_id)
    return keys, ack.completed_tokens // h.page, dict(ack.pool_storage_result.extra_pool_hit_pages)


@dataclass
class HybridHit:
    hit: int  # pages SGLang's hit query settled on (after its own reduction)
    restorable: list  # restorable_prefix_pages the backend reported
    loaded: int  # KV pages loaded
    pool_hits: dict  # pool name -> pages its batch_get_v2 loaded (leading run)
    kv_indices: torch.Tensor
    side_indices: dict  # PoolName -> host indices of the side pages read


def hybrid_prefetch(h: Hybrid, rid: str, toks: list[int], side: list, timeout: float = 60.0) -> HybridHit:
    """SGLang's hybrid prefetch of ``toks`` with side transfers ``side`` (placeholder keys:
    only their number counts, and no host indices): the hit query (``batch_exists_v2``),
    host pages for the hit in the KV pool and, as the radix cache stages them, for each
    side pool with indices of its own (``min(len(keys), hit pages)`` pages), the KV
    transfer (``batch_get_v1``, with ``batch_get_v2`` of the pools on the KV indices, e.g.
    the DSA indexer, batch by batch), then the other side transfers (``batch_get_v2``,
    keys re-aligned to the hit). A pool on the KV indices reads into the KV pages'
    indices (its ``side_indices``); its pages loaded count in ``loaded``, which SGLang
    clamps to the shorter of the two."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

    op = h.ctrl.prefetch(CacheRequestHandle(rid, 0), toks, extra_pools=side)
    got = h.ctrl.prefetch_hit_queue.get(timeout=timeout)
    assert got is op
    hit_pages = op.storage_hit_count // h.page
    kv_indices = h.kv.alloc(op.storage_hit_count) if hit_pages else torch.tensor([], dtype=torch.int64)
    assert kv_indices is not None, "host pool full"
    op.host_indices = kv_indices
    for t in side:
        if t.indices_from_pool is not None:
            continue
        host = h.side[t.name]
        n = min(len(t.keys or ()), hit_pages) * host.page_size
        if n:
            t.host_indices = host.alloc(n)
            assert t.host_indices is not None, f"{t.name} host pool full"
    h.ctrl.prefetch_buffer.put(op)
    loaded, pool_hits = 0, {}
    while True:
        ack = h.ctrl.ack_prefetch_queue.get(timeout=timeout)
        assert ack.operation is op
        if ack.completed_tokens is not None:
            loaded = max(loaded, ack.completed_tokens)
        if ack.pool_hits is not None:
            pool_hits = {k: v for k, v in ack.pool_hits.items() if v}
        if ack.completed_req:
            break
    restorable = list(op.pool_storage_result.restorable_prefix_pages or [])
    side_indices = {t.name: kv_indices if t.indices_from_pool is not None else t.host_indices for t in side}
    return HybridHit(hit_pages, restorable, loaded // h.page, pool_hits, kv_indices, side_indices)
