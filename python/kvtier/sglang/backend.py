"""kvtier as an SGLang HiCache storage backend (L3 below SGLang's host-memory cache).

SGLang loads it with ``--hicache-storage-backend dynamic`` and an ``extra_config`` naming
``module_path: kvtier.sglang`` and ``class_name: KvtierStorage``; the rest of the
``extra_config`` is kvtier's tier configuration (:mod:`kvtier.sglang.config`).

SGLang's controller threads call the backend synchronously: backup (``batch_set_v1``),
prefetch (``batch_exists``, then ``batch_get_v1``). Each call becomes one library job
over the host pool's own pages (the pieces ``get_page_buffer_meta`` names, as ranges of
one registered region: no staging copy) and waits for that job's result; several
threads may wait at once (:class:`_Results`). ``batch_exists`` is one blocking check of
all keys at once (``kvt_tier_check_now``).

One object per page, its bytes in the order of SGLang's flat data page
(``get_data_page``): K of every layer, then V of every layer (MHA), or the latent cache of
every layer (MLA). The zero-copy calls and the legacy ``batch_set``/``batch_get`` read and
write the same objects.

Hybrid models (Mamba state, sliding-window SWA, the DSA indexer, ...) add side pools
(``register_mem_host_pool_v2``), which SGLang moves with ``batch_set_v2`` /
``batch_get_v2`` and checks with ``batch_exists_v2``. Each side pool has a tier of its
own, on a namespace naming the pool's kind and geometry
(:func:`kvtier.sglang.config.side_pool_namespace`), with its host memory registered as
regions: its pages move zero-copy too, one object per page, the pieces
``get_page_buffer_meta`` names in their order.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import select
import threading
import time
from typing import Any, List, Optional

from .._engine_adapter import block_key, closed_on_failure, key_successes, submit_library_job
from .._schema import check_config
from ..errors import KvtierError
from ..tier import JobKind, JobOutcome, LookupResult, Tier
from . import config as _config

logger = logging.getLogger("kvtier.sglang")


def _pool_name(name: Any) -> str:
    """SGLang's pool name (a ``PoolName``, a str enum, or a plain string) as its value."""
    return str(getattr(name, "value", name))

try:  # The base class: SGLang's, when SGLang is installed (it always is when SGLang loads us).
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # pragma: no cover - exercised only without SGLang
    _Base = object

#: How long ``batch_exists`` waits for the store before treating the unanswered keys as
#: absent (SGLang then recomputes them).
EXISTS_TIMEOUT_S = 30.0
#: Threads of a backend that run its side pools' existence checks beside the calling
#: thread's (``batch_exists_v2``): one per side pool of the largest SGLang groups.
CHECK_THREADS = 6
#: How long a store or load waits for its job. Longer than any job the library lets run:
#: its own request timeouts and retries end every job first.
JOB_TIMEOUT_S = 600.0


def page_key(key: str) -> bytes:
    """kvtier's 36-byte key of an SGLang page key: the 32 bytes of its SHA-256 hex (or the
    SHA-256 of any other string) and group index 0."""
    try:
        raw = bytes.fromhex(key) if len(key) == 64 else None
    except ValueError:
        raw = None
    if raw is None:
        raw = hashlib.sha256(key.encode()).digest()
    return block_key(raw)


class _Results:
    """Hands each waiting thread its own job's result: whichever waiter finds the tier's
    event fd readable polls, and files every result it takes for its owner."""

    def __init__(self, tier: Tier):
        self._tier = tier
        self._fd = tier.event_fd()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._done: dict[int, JobOutcome] = {}
        self._polling = False

    def wait(self, job_id: int, timeout: float) -> JobOutcome | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                outcome = self._done.pop(job_id, None)
                if outcome is not None:
                    return outcome
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if self._polling:
                    self._cond.wait(left)
                    continue
                self._polling = True
                self._lock.release()
                try:
                    # Wakes on the tier's fd (readable while results wait); the bound only
                    # keeps a waiter from outliving its deadline.
                    select.select([self._fd], [], [], min(left, 1.0))
                    outcomes = self._tier.poll()
                finally:
                    self._lock.acquire()
                    self._polling = False
                for outcome in outcomes:
                    self._done[outcome.job_id] = outcome
                self._cond.notify_all()


def _buffers(host_pool: Any) -> list:
    """The host tensors a pool's pages live in: its ``kv_buffer`` when that is one
    tensor, else what SGLang registers for zero-copy I/O (``get_hybrid_pool_buffer``)."""
    buffer = getattr(host_pool, "kv_buffer", None)
    if hasattr(buffer, "data_ptr"):
        found = [buffer]
    elif hasattr(host_pool, "get_hybrid_pool_buffer"):
        found = list(host_pool.get_hybrid_pool_buffer() or [])
    else:
        found = list(buffer or [])
    return [b for b in found if b is not None and b.numel() > 0]


class _Pool:
    """One host pool and its tier: the pool's memory registered as regions, its pages
    named as ranges of them (``get_page_buffer_meta``), its jobs' results."""

    def __init__(self, name: str, host_pool: Any, namespace: str, extra_config: dict, *,
                 layer_first_mha: bool, writer: bool):
        import numpy as np

        buffers = _buffers(host_pool)
        if not buffers:
            raise ValueError(f"kvtier.sglang: the {name} pool ({type(host_pool).__name__}) has no host buffer")
        for b in buffers:
            if not b.is_contiguous() or b.device.type != "cpu":
                raise ValueError(
                    f"kvtier.sglang needs contiguous host buffers; the {name} pool ({type(host_pool).__name__}) "
                    f"has a {'non-contiguous' if b.device.type == 'cpu' else b.device.type} one"
                )
        self.name = name
        self.host_pool = host_pool
        self.namespace = namespace
        self.page_size = int(host_pool.page_size)
        self.layer_first_mha = layer_first_mha
        self.writer = writer
        self.job_ids = itertools.count(1)
        tier = Tier(_config.build_tier_config(extra_config, namespace))
        with closed_on_failure(tier):
            spans = []
            for b in buffers:
                nbytes = b.numel() * b.element_size()
                spans.append((b.data_ptr(), nbytes, tier.add_region(address=b.data_ptr(), nbytes=nbytes, owner=b)))
            spans.sort()
            self._bases = np.array([a for a, _, _ in spans], dtype=np.int64)
            self._ends = np.array([a + n for a, n, _ in spans], dtype=np.int64)
            self._regions = np.array([r for _, _, r in spans], dtype=np.uint64)
            self.results = _Results(tier)
            self.tier = tier
            self.piece_bytes()  # the pool names its pages' memory, inside those buffers

    def ranges(self, host_indices: Any, num_keys: int):
        """The (num_keys, R, 3) ranges of the pages at ``host_indices``, in object order."""
        import numpy as np

        ptrs, sizes = self.host_pool.get_page_buffer_meta(host_indices)
        if not ptrs or len(ptrs) % num_keys:
            raise ValueError(f"{len(ptrs)} buffer pieces for {num_keys} pages")
        per_page = len(ptrs) // num_keys
        ptrs = np.asarray(ptrs, dtype=np.int64)
        sizes = np.asarray(sizes, dtype=np.int64)
        which = np.searchsorted(self._bases, ptrs, side="right") - 1
        if (which < 0).any() or (ptrs + sizes > self._ends[np.maximum(which, 0)]).any():
            raise ValueError(f"a piece of a {self.name} page lies outside the pool's registered buffers")
        ranges = np.empty((num_keys, per_page, 3), dtype=np.uint64)
        ranges[:, :, 0] = self._regions[which].reshape(num_keys, per_page)
        ranges[:, :, 1] = (ptrs - self._bases[which]).reshape(num_keys, per_page)
        ranges[:, :, 2] = sizes.reshape(num_keys, per_page)
        if self.layer_first_mha:
            # SGLang hands out K_l0, V_l0, K_l1, ...; a flat page is K_l0, K_l1, ..., V_l0, ...
            ranges = np.concatenate([ranges[:, 0::2], ranges[:, 1::2]], axis=1)
        return ranges

    def piece_bytes(self) -> list[int]:
        """The bytes of each piece of one page, in object order (this also checks that the
        pool names its pages' memory and that it lies in the registered buffers)."""
        import torch

        first = torch.arange(self.page_size, dtype=torch.int64)
        return [int(n) for n in self.ranges(first, 1)[0, :, 2]]

    def close(self) -> None:
        self.tier.close()


def _page_piece_bytes(host_pool: Any, layer_first_mha: bool) -> list[int]:
    """The bytes of each piece of one page of ``host_pool`` in object order, as the pool
    itself names them (``get_page_buffer_meta``); its refusal propagates."""
    import torch

    _, sizes = host_pool.get_page_buffer_meta(torch.arange(int(host_pool.page_size), dtype=torch.int64))
    sizes = [int(n) for n in sizes]
    if not sizes:
        raise ValueError("it names no memory for a page")
    return sizes[0::2] + sizes[1::2] if layer_first_mha else sizes


class KvtierStorage(_Base):
    """An SGLang ``HiCacheStorage`` on a kvtier tier (S3-compatible stores, Azure Blob,
    GCS or a local directory). Built by SGLang's storage factory as
    ``KvtierStorage(storage_config, kwargs)``."""

    def __init__(self, storage_config: Any, kwargs: Optional[dict] = None, *, host_pool: Any = None):
        if storage_config is None:
            raise ValueError("kvtier.sglang needs SGLang's HiCacheStorageConfig")
        if getattr(storage_config, "should_split_heads", False):
            raise ValueError(
                "kvtier.sglang does not split heads across TP sizes (should_split_heads / tp_lcm_size): "
                "run every instance sharing a bucket with the same TP size"
            )
        self.storage_config = storage_config
        self.extra_config = dict(getattr(storage_config, "extra_config", None) or {})
        # Validated now, by the library's own rules, so that an unknown key, a missing store
        # or a bad value fails at construction, before SGLang starts its threads.
        check_config(_config.build_tier_config(self.extra_config, "sglang"))
        self.is_mla = bool(storage_config.is_mla_model)
        self.is_writer = bool(getattr(storage_config, "is_storage_writer", True))
        self.enable_metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self.tier: Tier | None = None
        self.mem_pool_host = None
        self.namespace = ""
        self._lock = threading.Lock()
        self._kv: _Pool | None = None
        self._results: _Results | None = None
        #: Side pools by SGLang's pool name (``mamba``, ``swa``, ``indexer``, ...).
        self._side: dict[str, _Pool] = {}
        self._checks = None  # ThreadPoolExecutor of the side pools' existence checks
        self._metrics_lock = threading.Lock()
        self._prefetch_pgs: list = []
        self._backup_pgs: list = []
        self._prefetch_bw: list = []
        self._backup_bw: list = []
        if host_pool is not None:
            self.register_mem_pool_host(host_pool)

    # -- setup -----------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang hands over its host KV pool: the tier opens on the pool's namespace and
        registers the pool's buffer as the one region pages are read from and written to."""
        if self.tier is not None:
            if mem_pool_host is self.mem_pool_host:
                return
            raise ValueError("kvtier.sglang serves one host pool per backend")
        geometry = _config.pool_geometry(mem_pool_host)
        buffer = getattr(mem_pool_host, "kv_buffer", None)
        if buffer is None or not hasattr(buffer, "is_contiguous") or not buffer.is_contiguous():
            raise ValueError(f"kvtier.sglang needs the contiguous kv_buffer of {type(mem_pool_host).__name__}")
        self.namespace = _config.namespace(self.storage_config, geometry)
        layer_first_mha = geometry["kind"] == "mha" and geometry["layout"] == "layer_first"
        pool = _Pool("kv", mem_pool_host, self.namespace, self.extra_config,
                     layer_first_mha=layer_first_mha, writer=self.is_writer)
        self._kv, self._results, self.tier = pool, pool.results, pool.tier
        self.mem_pool_host = mem_pool_host
        logger.info("kvtier.sglang: pages of %s go to %s", geometry, pool.tier.location)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang's hybrid controller registers every pool of its host pool group: the KV
        pool again (already served), then each side pool, which gets a tier of its own on
        a namespace naming the pool's kind and geometry, with the pool's host buffers as
        its regions. A pool whose pages SGLang cannot name as memory
        (``get_page_buffer_meta`` refuses, e.g. Mamba state with slot side states, or a
        DSA indexer in ``layer_first``) is refused with SGLang's reason."""
        name = _pool_name(host_pool_name)
        if name == "kv" or host_pool is self.mem_pool_host:
            if self.tier is None:
                self.register_mem_pool_host(host_pool)
            return
        known = self._side.get(name)
        if known is not None:
            if known.host_pool is host_pool:
                return
            raise ValueError(f"kvtier.sglang: a second host pool named {name}")
        if getattr(host_pool, "page_size", None) is None:
            raise ValueError(f"kvtier.sglang: the {name} pool ({type(host_pool).__name__}) has no page_size")
        # A KV-like side pool (SWA, a draft model's KV) in layer_first: SGLang hands out
        # K_l0, V_l0, K_l1, ...; the object is the flat page, K of every layer then V.
        layer_first_mha = (
            hasattr(host_pool, "head_num") and not _config._is_mla_pool(host_pool)
            and getattr(host_pool, "layout", None) == "layer_first"
        )
        try:
            pieces = _page_piece_bytes(host_pool, layer_first_mha)
        except Exception as exc:
            raise ValueError(
                f"kvtier.sglang cannot store the {name} pool ({type(host_pool).__name__}): "
                f"SGLang names no memory for its pages: {exc}"
            ) from exc
        per_rank = name in _config.PER_RANK_POOLS
        replicated = self.is_mla and not per_rank
        geometry = _config.side_pool_geometry(name, host_pool, pieces)
        namespace = _config.side_pool_namespace(self.storage_config, geometry, replicated)
        pool = _Pool(name, host_pool, namespace, self.extra_config,
                     layer_first_mha=layer_first_mha, writer=self.is_writer or per_rank)
        self._side[name] = pool
        logger.info("kvtier.sglang: pages of the %s pool (%s) go to %s/%s", name, geometry, pool.tier.location, namespace)

    def on_host_pools_registered(self) -> None:
        if self.tier is None:
            raise ValueError("kvtier.sglang: no host KV pool was registered")

    @property
    def side_pools(self) -> dict[str, str]:
        """Each registered side pool's namespace, by pool name."""
        return {name: pool.namespace for name, pool in self._side.items()}

    # -- the pages of a call -----------------------------------------------------------

    def _ranges(self, host_indices: Any, num_keys: int):
        """The (num_keys, R, 3) ranges of the KV pages at ``host_indices``, in object order."""
        return self._kv.ranges(host_indices, num_keys)

    def _submit(self, pool: _Pool, kind: JobKind, keys: List[str], ranges: Any) -> int | None:
        """Submits one job of ``pool``'s tier; returns its id, or None when no result
        will come (the keys failed)."""
        job = next(pool.job_ids)
        try:
            refused = submit_library_job(pool.tier, kind, job, [page_key(k) for k in keys], ranges=ranges)
        except Exception as exc:  # no result comes (see submit_library_job)
            logger.warning("kvtier.sglang: %s of %d %s pages failed: %s", kind.name.lower(), len(keys), pool.name, exc)
            return None
        if refused is not None:  # its one failed result still comes
            logger.warning("kvtier.sglang: %s of %d %s pages refused: %s", kind.name.lower(), len(keys), pool.name, refused)
        return job

    def _wait(self, pool: _Pool, kind: JobKind, job: int | None, num_keys: int) -> tuple[list[bool], JobOutcome | None]:
        if job is None:
            return [False] * num_keys, None
        outcome = pool.results.wait(job, JOB_TIMEOUT_S)
        if outcome is None:
            # The job still holds the pages: SGLang must not reuse them, but it will. This
            # is a bug of the library if it ever happens; say so loudly.
            logger.error("kvtier.sglang: %s job %d of the %s pool had no result after %.0f s",
                         kind.name.lower(), job, pool.name, JOB_TIMEOUT_S)
            return [False] * num_keys, None
        if not outcome.ok:
            logger.debug("kvtier.sglang: %s job %d of the %s pool: %s", kind.name.lower(), job, pool.name, outcome.message)
        return key_successes(outcome, num_keys), outcome

    def _run(self, kind: JobKind, keys: List[str], ranges: Any) -> list[bool]:
        pool = self._kv
        if self.tier is None or pool is None:
            return [False] * len(keys)
        started = time.perf_counter()
        done, outcome = self._wait(pool, kind, self._submit(pool, kind, keys, ranges), len(keys))
        pages = sum(done)
        if self.enable_metrics and pages and outcome is not None:
            seconds = max(time.perf_counter() - started, 1e-9)
            gib = outcome.bytes / (1 << 30)
            with self._metrics_lock:
                pgs, bw = (
                    (self._backup_pgs, self._backup_bw)
                    if kind is JobKind.STORE
                    else (self._prefetch_pgs, self._prefetch_bw)
                )
                pgs.append(pages)
                bw.append(gib / seconds)
        return done

    # -- zero-copy interface (interface_v1) --------------------------------------------

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        if keys and not self.is_writer:
            # MLA: every rank holds the same pages and only the writer rank stores them.
            return [True] * len(keys)
        return self._pages(JobKind.STORE, keys, host_indices)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        return self._pages(JobKind.LOAD, keys, host_indices)

    def _pages(self, kind: JobKind, keys: List[str], host_indices: Any) -> List[bool]:
        """One job moving the pages at ``host_indices`` under ``keys``, as their ranges."""
        if not keys:
            return []
        try:
            ranges = self._ranges(host_indices, len(keys))
        except Exception as exc:
            logger.warning("kvtier.sglang: %s of %d pages: %s", kind.name.lower(), len(keys), exc)
            return [False] * len(keys)
        return self._run(kind, keys, ranges)

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many of ``keys``, from the first, the store holds: all are checked at once
        (one round trip), then the leading run is counted."""
        tier = self.tier
        if tier is None or not keys:
            return 0
        try:
            verdicts = tier.check_now([page_key(k) for k in keys], EXISTS_TIMEOUT_S)
        except KvtierError as exc:
            logger.warning("kvtier.sglang: batch_exists: %s", exc)
            return 0
        for i, verdict in enumerate(verdicts):
            if verdict is not LookupResult.HIT:
                return i
        return len(verdicts)

    # -- hybrid models: side pools (v2 interface) -------------------------------------

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> dict:
        """Stores each transfer's pages (``keys``, ``host_indices`` into its pool) in its
        pool's namespace: one job per pool, all in flight at once. Returns each pool's
        per-page success."""
        return self._side_jobs(JobKind.STORE, transfers)

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> dict:
        """Loads each transfer's pages into its pool at ``host_indices``; per-page success
        by pool (SGLang counts each pool's leading run)."""
        return self._side_jobs(JobKind.LOAD, transfers)

    def _side_jobs(self, kind: JobKind, transfers: List[Any]) -> dict:
        results: dict = {}
        pending = []
        for t in transfers or []:
            keys = list(t.keys or [])
            name = _pool_name(t.name)
            pool = self._kv if name == "kv" else self._side.get(name)
            if not keys:
                results[t.name] = []
                continue
            if pool is None or pool.tier.closed:
                logger.warning("kvtier.sglang: %s of %d pages of the unregistered %s pool", kind.name.lower(), len(keys), name)
                results[t.name] = [False] * len(keys)
                continue
            if kind is JobKind.STORE and not pool.writer:
                # Replicated pages (MLA): only the writer rank stores them.
                results[t.name] = [True] * len(keys)
                continue
            indices = t.host_indices
            expected = len(keys) * pool.page_size
            if indices is None or len(indices) != expected:
                logger.warning("kvtier.sglang: %s of %d %s pages with %s host indices (%d expected)", kind.name.lower(),
                               len(keys), name, None if indices is None else len(indices), expected)
                results[t.name] = [False] * len(keys)
                continue
            try:
                ranges = pool.ranges(indices, len(keys))
            except Exception as exc:
                logger.warning("kvtier.sglang: %s of %d %s pages: %s", kind.name.lower(), len(keys), name, exc)
                results[t.name] = [False] * len(keys)
                continue
            pending.append((t.name, pool, len(keys), self._submit(pool, kind, keys, ranges)))
        for key, pool, n, job in pending:
            results[key] = self._wait(pool, kind, job, n)[0]
        return results

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[Any]] = None,
                        extra_info: Any = None) -> Any:
        """SGLang's hybrid hit query. The KV hit is the leading run of ``keys`` present;
        each transfer's pool then keeps the prefix lengths it can restore:
        ``all_pages``, those whose every page it holds; ``trailing_pages`` with N =
        ``len(transfer.keys)``, each length L whose pages [L-N, L) it holds (so valid
        lengths may skip). The usable lengths are those every pool keeps
        (``restorable_prefix_pages``, ascending), ``kv_hit_pages`` the longest of them, and
        ``extra_pool_hit_pages`` each pool's own longest (absent when 0), the KV pool's
        its leading run. A pool with another hit policy, or not registered, keeps no
        length (the request recomputes: never a wrong page)."""
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransferResult

        kv_pages = self.batch_exists(keys, extra_info)
        hit_count: dict = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        transfers = list(pool_transfers or []) if kv_pages else []
        # Every pool's check at once (one round trip after the KV pool's, not one each).
        presence = self._present_all([_pool_name(t.name) for t in transfers], keys[:kv_pages])
        for t in transfers:
            if not restorable:
                break
            name = _pool_name(t.name)
            present = presence[name]
            policy = _pool_name(t.hit_policy)
            if policy == PoolHitPolicy.ALL_PAGES.value:
                boundary = present.index(False) if False in present else kv_pages
                pool_restorable = set(range(1, boundary + 1))
            elif policy == PoolHitPolicy.TRAILING_PAGES.value:
                trailing = max(1, len(t.keys) if t.keys else 1)
                pool_restorable = {
                    length for length in range(1, kv_pages + 1)
                    if all(present[max(0, length - trailing):length])
                }
                boundary = max(pool_restorable, default=0)
            else:
                logger.warning("kvtier.sglang: hit policy %s of the %s pool is not served: no hit", policy, name)
                pool_restorable, boundary = set(), 0
            if boundary:
                hit_count[t.name] = boundary
            restorable = [length for length in restorable if length in pool_restorable]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit_count, restorable)

    def _present_all(self, names: List[str], keys: List[str]) -> dict[str, list[bool]]:
        """:meth:`_present` of each pool of ``names`` (each once), the pools' checks
        running concurrently: one on the calling thread, the others on the backend's
        check threads (each check blocks in the library, without the GIL)."""
        unique = list(dict.fromkeys(names))
        if len(unique) <= 1:
            return {name: self._present(name, keys) for name in unique}
        futures = {}
        for name in unique[1:]:
            try:
                futures[name] = self._check_pool().submit(self._present, name, keys)
            except RuntimeError:  # the backend is closing: its tiers answer absent anyway
                break
        found = {unique[0]: self._present(unique[0], keys)}
        for name in unique[1:]:
            future = futures.get(name)
            if future is None:
                found[name] = self._present(name, keys)
                continue
            try:
                # Each check ends within EXISTS_TIMEOUT_S; the margin covers a wait for a
                # thread when several of SGLang's threads ask at once.
                found[name] = future.result(timeout=2 * EXISTS_TIMEOUT_S)
            except Exception as exc:  # not answered in time: absent (SGLang recomputes)
                logger.warning("kvtier.sglang: batch_exists_v2 of the %s pool: %r", name, exc)
                found[name] = [False] * len(keys)
        return found

    def _check_pool(self):
        """The threads that run side pools' existence checks (made on first use)."""
        with self._lock:
            if self.tier is None:
                raise RuntimeError("the backend is closed")
            if self._checks is None:
                from concurrent.futures import ThreadPoolExecutor

                self._checks = ThreadPoolExecutor(max_workers=CHECK_THREADS, thread_name_prefix="kvtier-sglang-exists")
            return self._checks

    def _present(self, name: str, keys: List[str]) -> list[bool]:
        """Whether side pool ``name`` holds each of ``keys`` (one check of them all)."""
        pool = self._kv if name == "kv" else self._side.get(name)
        if pool is None or not keys or pool.tier.closed:
            return [False] * len(keys)
        try:
            verdicts = pool.tier.check_now([page_key(k) for k in keys], EXISTS_TIMEOUT_S)
        except KvtierError as exc:
            logger.warning("kvtier.sglang: batch_exists_v2 of the %s pool: %s", name, exc)
            return [False] * len(keys)
        return [v is LookupResult.HIT for v in verdicts]

    # -- legacy interface (flat page tensors) ------------------------------------------

    def _legacy(self, kind: JobKind, keys: List[str], tensors: list) -> list[bool]:
        """Moves whole flat pages held in tensors of their own (a region each for the call)."""
        tier = self.tier
        if tier is None:
            return [False] * len(keys)
        regions = []
        try:
            ranges = []
            for t in tensors:
                nbytes = t.numel() * t.element_size()
                region = tier.add_region(address=t.data_ptr(), nbytes=nbytes, owner=t)
                regions.append(region)
                ranges.append([(region, 0, nbytes)])
            return self._run(kind, keys, ranges)
        except (KvtierError, ValueError) as exc:
            logger.warning("kvtier.sglang: %s of %d flat pages: %s", kind.name.lower(), len(keys), exc)
            return [False] * len(keys)
        finally:
            for region in regions:
                try:
                    tier.remove_region(region)
                except KvtierError as exc:  # still held: the job had no result
                    logger.error("kvtier.sglang: region of a flat page stays registered: %s", exc)

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        if not keys:
            return True
        if not self.is_writer:
            return True
        if values is None or len(values) != len(keys):
            return False
        tensors = [v.contiguous() for v in values]
        return all(self._legacy(JobKind.STORE, keys, tensors))

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> list:
        if not keys:
            return []
        if target_locations is None or len(target_locations) != len(keys):
            return [None] * len(keys)
        targets = list(target_locations)
        if not all(t.is_contiguous() for t in targets):
            return [None] * len(keys)
        done = self._legacy(JobKind.LOAD, keys, targets)
        return [t if ok else None for t, ok in zip(targets, done)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        if target_location is None:
            target_location = self.mem_pool_host.get_dummy_flat_data_page()
        return self.batch_get([key], [target_location])[0]

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- housekeeping ------------------------------------------------------------------

    def clear(self) -> None:
        """Deletes every page of this backend's namespaces (model, layout and shard; the
        KV pool's and each side pool's), and nothing else in the bucket."""
        if self.tier is not None:
            report = self.tier.clear()
            logger.info("kvtier.sglang: cleared %d pages of %s", report["deleted"], self.namespace)
        for pool in self._side.values():
            if not pool.tier.closed:
                report = pool.tier.clear()
                logger.info("kvtier.sglang: cleared %d pages of %s", report["deleted"], pool.namespace)

    def get_stats(self):
        """SGLang's ``StorageMetrics`` since the last call, with kvtier's counters as
        ``kvtier`` (a dict of totals)."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:  # pragma: no cover
            return None
        metrics = StorageMetrics()
        with self._metrics_lock:
            metrics.prefetch_pgs.extend(self._prefetch_pgs)
            metrics.backup_pgs.extend(self._backup_pgs)
            metrics.prefetch_bandwidth.extend(self._prefetch_bw)
            metrics.backup_bandwidth.extend(self._backup_bw)
            for series in (self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw):
                series.clear()
        if self.tier is not None and not self.tier.closed:
            metrics.kvtier = self.tier.stats()
            metrics.kvtier_side_pools = {
                name: pool.tier.stats() for name, pool in self._side.items() if not pool.tier.closed
            }
        return metrics

    def take_events(self) -> list:
        """kvtier's BlockStored / BlockRemoved events since the last call (with
        ``enable_kv_events`` in ``extra_config``; SGLang itself has no consumer for them)."""
        return self.tier.take_events() if self.tier is not None else []

    def close(self) -> None:
        """Waits for the jobs in flight, then shuts the tier down. Idempotent."""
        with self._lock:
            checks, self._checks = self._checks, None
            tier, self.tier = self.tier, None
        if checks is not None:
            checks.shutdown(wait=True)
        side, self._side = list(self._side.values()), {}
        for pool in side:
            pool.close()
        if tier is not None:
            tier.close()

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass
