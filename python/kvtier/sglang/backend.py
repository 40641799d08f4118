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

try:  # The base class: SGLang's, when SGLang is installed (it always is when SGLang loads us).
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # pragma: no cover - exercised only without SGLang
    _Base = object

#: How long ``batch_exists`` waits for the store before treating the unanswered keys as
#: absent (SGLang then recomputes them).
EXISTS_TIMEOUT_S = 30.0
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
        self._job_ids = itertools.count(1)
        self._results: _Results | None = None
        self._region = None
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
        if buffer is None or not buffer.is_contiguous():
            raise ValueError(f"kvtier.sglang needs the contiguous kv_buffer of {type(mem_pool_host).__name__}")
        self.namespace = _config.namespace(self.storage_config, geometry)
        tier = Tier(_config.build_tier_config(self.extra_config, self.namespace))
        with closed_on_failure(tier):
            self._region = tier.add_region(
                address=buffer.data_ptr(), nbytes=buffer.numel() * buffer.element_size(), owner=buffer
            )
            self._base = buffer.data_ptr()
            self._results = _Results(tier)
        self.tier = tier
        self.mem_pool_host = mem_pool_host
        self._layer_first_mha = geometry["kind"] == "mha" and geometry["layout"] == "layer_first"
        logger.info("kvtier.sglang: pages of %s go to %s", geometry, tier.location)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        # The hybrid controller registers its KV pool again under its name; side pools
        # (Mamba, SWA, ...) need batch_*_v2, which this backend does not serve.
        if str(host_pool_name) in ("kv", "PoolName.KV") or host_pool is self.mem_pool_host:
            if self.tier is None:
                self.register_mem_pool_host(host_pool)
            return
        raise ValueError(f"kvtier.sglang stores the KV pool only, not {host_pool_name}")

    def on_host_pools_registered(self) -> None:
        if self.tier is None:
            raise ValueError("kvtier.sglang: no host KV pool was registered")

    # -- the pages of a call -----------------------------------------------------------

    def _ranges(self, host_indices: Any, num_keys: int):
        """The (num_keys, R, 3) ranges of the pages at ``host_indices``, in object order."""
        import numpy as np

        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if not ptrs or len(ptrs) % num_keys:
            raise ValueError(f"{len(ptrs)} buffer pieces for {num_keys} pages")
        per_page = len(ptrs) // num_keys
        ranges = np.empty((num_keys, per_page, 3), dtype=np.uint64)
        offsets = np.asarray(ptrs, dtype=np.int64) - self._base
        ranges[:, :, 0] = self._region
        ranges[:, :, 1] = offsets.reshape(num_keys, per_page)
        ranges[:, :, 2] = np.asarray(sizes, dtype=np.uint64).reshape(num_keys, per_page)
        if self._layer_first_mha:
            # SGLang hands out K_l0, V_l0, K_l1, ...; a flat page is K_l0, K_l1, ..., V_l0, ...
            ranges = np.concatenate([ranges[:, 0::2], ranges[:, 1::2]], axis=1)
        return ranges

    def _run(self, kind: JobKind, keys: List[str], ranges: Any) -> list[bool]:
        tier, results = self.tier, self._results
        if tier is None or results is None:
            return [False] * len(keys)
        job = next(self._job_ids)
        started = time.perf_counter()
        try:
            refused = submit_library_job(tier, kind, job, [page_key(k) for k in keys], ranges=ranges)
        except Exception as exc:  # no result comes (see submit_library_job)
            logger.warning("kvtier.sglang: %s of %d pages failed: %s", kind.name.lower(), len(keys), exc)
            return [False] * len(keys)
        if refused is not None:  # its one failed result still comes
            logger.warning("kvtier.sglang: %s of %d pages refused: %s", kind.name.lower(), len(keys), refused)
        outcome = results.wait(job, JOB_TIMEOUT_S)
        if outcome is None:
            # The job still holds the pages: SGLang must not reuse them, but it will. This
            # is a bug of the library if it ever happens; say so loudly.
            logger.error("kvtier.sglang: %s job %d had no result after %.0f s", kind.name.lower(), job, JOB_TIMEOUT_S)
            return [False] * len(keys)
        if not outcome.ok:
            logger.debug("kvtier.sglang: %s job %d: %s", kind.name.lower(), job, outcome.message)
        done = key_successes(outcome, len(keys))
        pages = sum(done)
        if self.enable_metrics and pages:
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
        """Deletes every page of this backend's namespace (model, layout and shard), and
        nothing else in the bucket."""
        if self.tier is not None:
            report = self.tier.clear()
            logger.info("kvtier.sglang: cleared %d pages of %s", report["deleted"], self.namespace)

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
        return metrics

    def take_events(self) -> list:
        """kvtier's BlockStored / BlockRemoved events since the last call (with
        ``enable_kv_events`` in ``extra_config``; SGLang itself has no consumer for them)."""
        return self.tier.take_events() if self.tier is not None else []

    def close(self) -> None:
        """Waits for the jobs in flight, then shuts the tier down. Idempotent."""
        tier, self.tier = self.tier, None
        if tier is not None:
            tier.close()

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass
