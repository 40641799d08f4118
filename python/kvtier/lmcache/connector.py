"""kvtier as LMCache 0.5.6's remote storage in its in-process mode (``LMCacheConnectorV1``
inside vLLM, not MP), through ``remote_storage_plugins``.

LMCache's configuration (a YAML file, ``LMCACHE_CONFIG_FILE``)::

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5
    remote_storage_plugins: ["kvtier"]
    extra_config:
      remote_storage_plugin.kvtier.module_path: kvtier.lmcache
      remote_storage_plugin.kvtier.class_name: KvtierConnectorAdapter
      remote_storage_plugin.kvtier.config:
        store: {type: s3, bucket: kv-cache, endpoint_override: "http://minio.internal:9000"}
        prefix: lmcache-prod

``remote_storage_plugin.<name>.config`` is kvtier's tier configuration, as the MP adapter's
``adapter_params`` (:func:`~kvtier.lmcache.config.build_tier_config`), or the path of a JSON
file holding it. LMCache builds :class:`KvtierConnectorAdapter` with no arguments; it claims
``plugin://kvtier`` (and ``plugin://kvtier.<instance>``) and builds a
:class:`KvtierConnector`, LMCache's ``RemoteConnector``, whose coroutines run on LMCache's
event loop:

* ``put``/``get`` (and their batched forms) are library jobs over ranges of LMCache's local
  CPU memory: when its allocator is one arena (LMCache's ``MixedMemoryAllocator``, the
  default), that arena is registered once as a region and each chunk moves as a range of
  it, without a copy; a chunk outside it (another allocator, a compressing serde) gets a
  region of its own for the job's time, still without a copy.
* ``exists``, ``exists_sync`` and the batched contains are one existence check of all
  their keys (``check_now``), bounded in time; a key unanswered counts as absent.
* One poller thread sleeps on the tier's event fd and hands each finished job to the loop.

A ``put`` succeeds only when the library stored and checked the object; it raises
otherwise (LMCache counts a failed put). A ``get`` returns the chunk only when its object
arrived whole with a good checksum; a missing, short or corrupt object is ``None`` (a miss),
never other bytes. A chunk's memory is held until its job is over, even when LMCache stops
waiting for it (its ``blocking_timeout_secs``), so the library never writes into or reads
from memory LMCache has given to another chunk.

Objects hold the chunk's raw bytes (no LMCache metadata header), whole chunks only: a
partial chunk (``save_unfull_chunk``) is refused at ``put``. ``list()`` returns nothing:
objects are named by a digest of their key, which cannot be turned back into LMCache's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import select
import threading
from typing import Any, Mapping

from lmcache.v1.exceptions import IrrecoverableException
from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext, extract_plugin_type
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from .._engine_adapter import closed_on_failure, key_successes, submit_library_job
from .._schema import check_config
from ..errors import KvtierError
from ..tier import JobKind, LookupResult, Tier
from .config import build_tier_config, key_of_engine_key

logger = logging.getLogger("kvtier.lmcache")

#: The plugin type the adapter claims (``remote_storage_plugins: ["kvtier"]``).
PLUGIN_TYPE = "kvtier"
#: How long an existence check waits for the store before unanswered keys count as absent.
EXISTS_TIMEOUT_S = 10.0
#: How long ``close()`` waits for the jobs in flight before cancelling the rest.
CLOSE_DRAIN_S = 30.0
#: How long ``close()`` waits for the poller thread to end.
THREAD_JOIN_S = 10.0
#: What :meth:`KvtierConnector.finished_keys` counts.
COUNTS = ("stored", "store_failed", "loaded", "load_failed")


def tier_config_of(extra_config: Mapping[str, Any] | None, plugin_name: str) -> dict:
    """kvtier's tier configuration from LMCache's ``extra_config``: the value of
    ``remote_storage_plugin.<plugin_name>.config``, a mapping or the path of a JSON file."""
    key = f"remote_storage_plugin.{plugin_name}.config"
    value = (extra_config or {}).get(key)
    if value is None:
        raise ValueError(f"kvtier needs its tier configuration in extra_config[{key!r}] (a mapping with at least "
                         f"a 'store', or the path of a JSON file holding one)")
    if isinstance(value, str):
        try:
            with open(value, encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"extra_config[{key!r}]: cannot read {value!r} as a JSON tier configuration: {exc}") \
                from exc
    return build_tier_config(value, kv_events=False)


def _arena_of(local_cpu_backend: Any) -> tuple[int, int, Any] | None:
    """LMCache's local CPU memory as one arena ``(address, bytes, owner)``, when its
    allocator holds all of it in one CPU tensor (``MixedMemoryAllocator.buffer``); else
    None (every chunk then gets a region of its own)."""
    buffer = getattr(getattr(local_cpu_backend, "memory_allocator", None), "buffer", None)
    try:
        if buffer is None or buffer.device.type != "cpu" or not buffer.is_contiguous():
            return None
        nbytes = buffer.numel() * buffer.element_size()
        return (buffer.data_ptr(), nbytes, buffer) if buffer.data_ptr() and nbytes > 0 else None
    except AttributeError:  # not a tensor
        return None


class ChunkTransferError(RuntimeError):
    """A put that did not store every chunk, or a job the connector could not run."""


class _Job:
    """A library job in flight: what the coroutine awaits, and what it holds."""

    __slots__ = ("kind", "future", "objs", "regions")

    def __init__(self, kind: JobKind, future: asyncio.Future, objs: list, regions: list):
        self.kind, self.future, self.objs, self.regions = kind, future, objs, regions


class KvtierConnector(RemoteConnector):
    """LMCache's remote storage on a kvtier tier (S3-compatible stores, Azure Blob, GCS, a
    local directory); see the module's doc."""

    def __init__(self, context: ConnectorContext, tier_config: dict):
        super().__init__(context.config, context.metadata)
        check_config(tier_config)  # a bad key fails LMCache's start with its name
        self.loop = context.loop
        self.local_cpu_backend = context.local_cpu_backend
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)
        self._counts = dict.fromkeys(COUNTS, 0)
        self._closing = False
        self._job_ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self.tier = Tier(tier_config)
        with closed_on_failure(self.tier):
            arena = _arena_of(self.local_cpu_backend)
            self._arena = None
            if arena is not None:
                address, nbytes, owner = arena
                self._arena = (address, nbytes, self.tier.add_region(address=address, nbytes=nbytes, owner=owner))
            self._tier_fd = self.tier.event_fd()
            self._stop_r, self._stop_w = os.pipe()  # wakes the poller for close()
        self._poller = threading.Thread(target=self._poll_loop, name="kvtier-lmcache-connector", daemon=True)
        self._poller.start()
        logger.info("kvtier.lmcache: remote chunks go to %s (%s)", self.tier.location,
                    "zero-copy from LMCache's CPU arena" if self._arena else "a region per chunk")

    @property
    def zero_copy_arena(self) -> bool:
        """Whether LMCache's local CPU memory is registered as one region."""
        return self._arena is not None

    # -- stores and loads --------------------------------------------------------------

    async def put(self, key, memory_obj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys, memory_objs) -> None:
        keys, memory_objs = list(keys), list(memory_objs)
        for obj in memory_objs:
            if obj.get_size() != self.full_chunk_size_bytes:
                raise ValueError(f"kvtier stores whole chunks of {self.full_chunk_size_bytes} bytes, not "
                                 f"{obj.get_size()} (save_unfull_chunk)")
        done = await self._run(JobKind.STORE, keys, memory_objs)
        if not all(done):
            raise ChunkTransferError(f"kvtier stored {sum(done)} of {len(keys)} chunks")

    async def get(self, key):
        return (await self.batched_get([key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys) -> list:
        keys = list(keys)
        objs = []
        for _ in keys:
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            if obj is None:  # LMCache's memory is full: the rest are misses
                break
            objs.append(obj)
        try:
            done = await self._run(JobKind.LOAD, keys[: len(objs)], objs) if objs else []
        except BaseException:
            # Given up (LMCache's timeout) or failed: the job holds its own reference to
            # each chunk until it is over (_deliver); ours goes now.
            for obj in objs:
                obj.ref_count_down()
            raise
        out = []
        for obj, ok in zip(objs, done):
            if ok:
                out.append(obj)
            else:
                obj.ref_count_down()  # never hand out a buffer the load did not fill
                out.append(None)
        return out + [None] * (len(keys) - len(objs))

    async def batched_get_non_blocking(self, lookup_id: str, keys) -> list:
        """The leading chunks that loaded; the rest are released."""
        got = await self.batched_get(keys)
        leading = next((i for i, obj in enumerate(got) if obj is None), len(got))
        prefix = got[:leading]
        for obj in got[leading:]:
            if obj is not None:
                obj.ref_count_down()
        return prefix

    async def _run(self, kind: JobKind, keys: list, objs: list) -> list[bool]:
        """One library job moving ``objs[i]`` to or from ``keys[i]``; whether each key
        succeeded. Each object is held (ref count) until the job is over, whoever waits."""
        if not keys:
            return []
        kv_keys = [key_of_engine_key(k) for k in keys]
        ranges, regions = self._ranges(objs)
        job_id = next(self._job_ids)
        future = self.loop.create_future()
        for obj in objs:
            obj.ref_count_up()
        job = _Job(kind, future, objs, regions)
        with self._lock:
            closing = self._closing
            if not closing:
                self._jobs[job_id] = job  # filed first: the poller may take its result at once
        if closing:
            self._release(job)
            raise ChunkTransferError("the kvtier connector is closed")
        try:
            refused = submit_library_job(self.tier, kind, job_id, kv_keys, ranges=ranges)
        except Exception:  # no result will come
            with self._lock:
                self._jobs.pop(job_id, None)
            self._release(job)
            raise
        if refused is not None:  # its one failed result comes from the poller
            logger.warning("kvtier.lmcache: %s of %d chunks refused: %s", kind.name.lower(), len(keys), refused)
        return await future

    def _ranges(self, objs: list) -> tuple[list, list]:
        """Each object's one range: of the arena, or of a region of its own (returned, to
        be removed when the job is over)."""
        ranges, regions = [], []
        for obj in objs:
            address, nbytes = int(obj.data_ptr), int(obj.get_size())
            if self._arena is not None:
                base, size, region = self._arena
                offset = address - base
                if 0 <= offset and offset + nbytes <= size:
                    ranges.append([(region, offset, nbytes)])
                    continue
            region = self.tier.add_region(address=address, nbytes=nbytes, owner=obj)
            regions.append(region)
            ranges.append([(region, 0, nbytes)])
        return ranges, regions

    def _release(self, job: _Job) -> None:
        for region in job.regions if not self.tier.closed else ():
            try:
                self.tier.remove_region(region)
            except KvtierError as exc:
                logger.error("kvtier.lmcache: a chunk's region stays registered: %s", exc)
        for obj in job.objs:
            obj.ref_count_down()

    def _deliver(self, job: _Job, done: list[bool] | None, error: str = "") -> None:
        """On the loop: the job is over; its memory is released, its waiter, if still
        waiting, answered, and then it is counted (so that whoever waits for the count
        and then for the loop finds the waiter resumed)."""
        self._release(job)
        if not job.future.done():  # else LMCache stopped waiting (a timeout)
            if done is None:
                job.future.set_exception(ChunkTransferError(error or "the kvtier connector closed"))
            else:
                job.future.set_result(done)
        self._count(job.kind, done if done is not None else [False] * len(job.objs))

    def _hand_over(self, job: _Job, done: list[bool] | None, error: str = "") -> None:
        try:
            self.loop.call_soon_threadsafe(self._deliver, job, done, error)
        except RuntimeError:  # the loop is closed: nobody waits, memory is LMCache's to drop
            logger.debug("kvtier.lmcache: a job ended after LMCache's loop closed")
            self._count(job.kind, done if done is not None else [False] * len(job.objs))

    # -- existence ---------------------------------------------------------------------

    def _present(self, keys: list) -> list[bool]:
        if not keys:
            return []
        verdicts = self.tier.check_now([key_of_engine_key(k) for k in keys], EXISTS_TIMEOUT_S)
        return [v is LookupResult.HIT for v in verdicts]

    async def exists(self, key) -> bool:
        return (await self.loop.run_in_executor(None, self._present, [key]))[0]

    def exists_sync(self, key) -> bool:
        return self._present([key])[0]

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys) -> int:
        """How many leading keys the store holds."""
        present = self._present(list(keys))
        return present.index(False) if False in present else len(present)

    async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
        return await self.loop.run_in_executor(None, self.batched_contains, list(keys))

    def remove_sync(self, key) -> bool:
        return self.tier.delete([key_of_engine_key(key)])["deleted"] == 1

    async def list(self) -> list:
        return []  # objects are named by a digest of their key (see the module's doc)

    # -- the poller and close ----------------------------------------------------------

    def _poll_loop(self) -> None:
        while True:
            readable, _, _ = select.select([self._tier_fd, self._stop_r], [], [])
            self._dispatch()
            if self._stop_r in readable:
                return

    def _dispatch(self) -> None:
        try:
            outcomes = self.tier.poll()
        except KvtierError as exc:
            logger.error("kvtier.lmcache: polling the tier failed: %s", exc)
            return
        for outcome in outcomes:
            with self._lock:
                job = self._jobs.pop(outcome.job_id, None)
            if job is None:
                logger.error("kvtier.lmcache: kvtier reported job %d, which was not submitted", outcome.job_id)
                continue
            if not outcome.ok:
                logger.debug("kvtier.lmcache: job %d: %s", outcome.job_id, outcome.message)
            self._hand_over(job, key_successes(outcome, len(job.objs)))

    def _count(self, kind: JobKind, done: list[bool]) -> None:
        ok, failed = ("stored", "store_failed") if kind is JobKind.STORE else ("loaded", "load_failed")
        with self._finished:
            self._counts[ok] += sum(done)
            self._counts[failed] += len(done) - sum(done)
            self._finished.notify_all()

    def finished_keys(self) -> dict[str, int]:
        """Keys of finished jobs, by outcome (:data:`COUNTS`): for monitoring and tests."""
        with self._lock:
            return dict(self._counts)

    def wait_finished(self, predicate, timeout: float) -> bool:
        """Waits until ``predicate(finished_keys())`` holds, at most ``timeout`` seconds;
        returns whether it does."""
        with self._finished:
            return self._finished.wait_for(lambda: predicate(dict(self._counts)), timeout)

    async def close(self) -> None:
        await self.loop.run_in_executor(None, self.close_sync)

    def close_sync(self) -> None:
        """Refuses new jobs, waits up to :data:`CLOSE_DRAIN_S` for those in flight, then
        closes the tier; jobs still unfinished fail. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        try:
            self.tier.drain(int(CLOSE_DRAIN_S * 1000))
        except KvtierError as exc:
            logger.warning("kvtier.lmcache: closing with jobs still in flight: %s", exc)
        os.write(self._stop_w, b"x")
        self._poller.join(THREAD_JOIN_S)
        if self._poller.is_alive():
            logger.error("kvtier.lmcache: the poller did not end within %.0f s", THREAD_JOIN_S)
        self.tier.shutdown()
        self._dispatch()
        with self._lock:
            left = list(self._jobs.values())
            self._jobs.clear()
        for job in left:
            self._hand_over(job, None)
        self.tier.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def __repr__(self) -> str:
        return f"<KvtierConnector {self.tier.location if not self.tier.closed else 'closed'}>"


class KvtierConnectorAdapter(ConnectorAdapter):
    """What ``remote_storage_plugin.<name>.class_name`` names: built by LMCache with no
    arguments, it claims ``plugin://kvtier`` and ``plugin://kvtier.<instance>``."""

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://") and extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        plugin_name = context.plugin_name or PLUGIN_TYPE
        extra = context.config.extra_config if context.config is not None else None
        try:
            return KvtierConnector(context, tier_config_of(extra, plugin_name))
        except ValueError as exc:
            # Irrecoverable: LMCache then builds no remote backend (and logs why, naming
            # the key) instead of keeping one without a connection that retries for ever.
            raise IrrecoverableException(f"kvtier: {exc}") from exc
