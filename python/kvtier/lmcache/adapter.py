"""kvtier as an LMCache 0.5.6 multiprocess-mode L2 adapter (``"type": "plugin"``).

LMCache builds it as ``KvtierL2Adapter(adapter_params, l1_memory_desc=...)`` and calls it
from two controller threads (store and prefetch). Every call returns at once:

* stores and loads are library jobs over ranges of LMCache's L1 arena, registered once as
  one region (no staging copy);
* lookups (existence checks of the whole batch at once, ``check_now``) and deletes
  (``kvt_tier_delete``) run in order on one worker thread, so that the caller never waits;
* one poller thread sleeps on the tier's event fd, takes every finished job, files its
  result under its task and signals that kind's event fd (three distinct ``eventfd``\\ s, as
  LMCache requires); it also turns the tier's BlockRemoved events (its own eviction) into
  LMCache's deleted-key notifications, as it does for LMCache's own ``delete()``.

Every task yields exactly one result: a job the library refused still yields its failed
result, and a task that never reached the library (a key it cannot name, an object outside
the arena, the adapter closing) fails at once. A store task succeeds only when every key
was stored and checked by the library; a load sets the bit of each key whose bytes arrived
whole and verified. Nothing is reported stored or loaded that was not.

"Locked" (``submit_lookup_and_lock_task``): a key reported present is pinned in the tier
(pinned before the store is asked) until ``submit_unlock``, so this tier's own ``eviction``
keeps its object. The bucket is shared: ``kvtier gc``, another server or LMCache's
``delete()`` may still delete it before the load. Such a load fails that key alone
(NotFound); it never returns another object's bytes.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import queue
import select
import threading
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface

from .._engine_adapter import closed_on_failure, key_successes, submit_library_job
from .._schema import check_config
from ..errors import KvtierError
from ..tier import JobKind, JobOutcome, LookupResult, Tier
from .config import build_tier_config, key_of

logger = logging.getLogger("kvtier.lmcache")

#: How long a lookup batch waits for the store before its unanswered keys count as absent.
LOOKUP_TIMEOUT_S = 30.0
#: How long ``close()`` waits for the jobs in flight before cancelling the rest.
CLOSE_DRAIN_S = 30.0
#: Longest the poller sleeps between checks for BlockRemoved events and for close().
POLLER_WAKE_S = 1.0
#: How long ``close()`` waits for each helper thread to end.
THREAD_JOIN_S = 10.0


class _EventFd:
    """A non-blocking eventfd LMCache polls and drains (``os.eventfd_read``)."""

    def __init__(self):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # A signal racing close() must not write to whatever file reuses the number.
        self._lock = threading.Lock()

    def signal(self) -> None:
        with self._lock:
            if self.fd >= 0:
                os.eventfd_write(self.fd, 1)

    def close(self) -> None:
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class _Task:
    """A store or load task in flight: its LMCache keys, their kvtier keys and sizes."""

    __slots__ = ("kind", "keys", "kv_keys", "sizes")

    def __init__(self, kind: JobKind, keys: list, kv_keys: list, sizes: list):
        self.kind, self.keys, self.kv_keys, self.sizes = kind, keys, kv_keys, sizes


class KvtierL2Adapter(L2AdapterInterface):
    """LMCache's L2 on a kvtier tier (S3-compatible stores, Azure Blob, GCS, a local
    directory). ``adapter_params`` is the tier's configuration; see the module's doc."""

    def __init__(self, adapter_params: dict | None = None, l1_memory_desc: Any = None):
        # max_capacity_bytes 0: LMCache's global L2 eviction stays off (this server knows
        # only what it stored, not the shared bucket); the tier's `eviction` bounds the
        # store. LMCache's per-salt eviction may still call delete().
        super().__init__(max_capacity_bytes=0)
        config = build_tier_config(adapter_params)
        # The library's own check, before anything starts: a bad key fails with its name.
        check_config(config)
        if l1_memory_desc is None or not l1_memory_desc.ptr or l1_memory_desc.size <= 0:
            raise ValueError(f"kvtier.lmcache needs LMCache's L1 arena (l1_memory_desc), got {l1_memory_desc!r}")
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)
        self._counts: collections.Counter = collections.Counter()  # finished tasks by outcome
        self._closing = False
        self._task_ids = itertools.count(1)
        self._tasks: dict[int, _Task] = {}
        self._store_results: dict[int, L2StoreResult] = {}
        self._lookup_results: dict[int, Bitmap] = {}
        self._load_results: dict[int, Bitmap] = {}
        self._locks: dict[Any, int] = {}  # ObjectKey -> lookups holding it (see the module doc)
        # kvtier key -> (ObjectKey, bytes) of what this adapter stored (or was asked to
        # delete): the tier's BlockRemoved events name kvtier keys, LMCache's notifications
        # ObjectKeys. An entry lives until its BlockRemoved event: about 200 bytes for each
        # key this server stored and the tier did not delete.
        self._known: dict[bytes, tuple[Any, int]] = {}
        self._store_fd, self._lookup_fd, self._load_fd = _EventFd(), _EventFd(), _EventFd()
        self._stop_fd = _EventFd()
        self._wake_fd = _EventFd()  # events are waiting (a delete just finished)
        self.tier = Tier(config)
        with closed_on_failure(self.tier):
            self._arena = (l1_memory_desc.ptr, l1_memory_desc.size)
            self._region = self.tier.add_region(address=l1_memory_desc.ptr, nbytes=l1_memory_desc.size,
                                                owner=l1_memory_desc)
            self._tier_fd = self.tier.event_fd()
        self._lookups: queue.Queue = queue.Queue()
        self._poller = threading.Thread(target=self._poll_loop, name="kvtier-lmcache-poller", daemon=True)
        self._lookup_worker = threading.Thread(target=self._lookup_loop, name="kvtier-lmcache-lookups",
                                               daemon=True)
        self._poller.start()
        self._lookup_worker.start()
        logger.info("kvtier.lmcache: L2 objects go to %s", self.tier.location)

    # -- event fds ---------------------------------------------------------------------

    def get_store_event_fd(self) -> int:
        return self._store_fd.fd

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_fd.fd

    def get_load_event_fd(self) -> int:
        return self._load_fd.fd

    # -- stores and loads --------------------------------------------------------------

    def submit_store_task(self, keys: list, objects: list) -> int:
        return self._submit(JobKind.STORE, keys, objects)

    def pop_completed_store_tasks(self) -> dict:
        with self._lock:
            done, self._store_results = self._store_results, {}
        return done

    def submit_load_task(self, keys: list, objects: list) -> int:
        return self._submit(JobKind.LOAD, keys, objects)

    def query_load_result(self, task_id: int) -> Bitmap | None:
        with self._lock:
            return self._load_results.pop(task_id, None)

    def _submit(self, kind: JobKind, keys: list, objects: list) -> int:
        task_id = next(self._task_ids)
        keys = list(keys)
        try:
            if len(objects) != len(keys):
                raise ValueError(f"{len(keys)} keys but {len(objects)} objects")
            kv_keys = [key_of(k) for k in keys]
            ranges, sizes = self._ranges(objects)
        except Exception as exc:  # never reaches the library: the task fails here
            logger.warning("kvtier.lmcache: %s task of %d keys failed: %s", kind.name.lower(), len(keys), exc)
            self._finish(task_id, _Task(kind, keys, [], []), None)
            return task_id
        task = _Task(kind, keys, kv_keys, sizes)
        if not keys:
            self._finish(task_id, task, None, empty=True)
            return task_id
        with self._lock:
            closing = self._closing
            if not closing:
                # Filed before the job exists: the poller may take its result at once.
                self._tasks[task_id] = task
        if closing:
            self._finish(task_id, task, None)
            return task_id
        try:
            refused = submit_library_job(self.tier, kind, task_id, kv_keys, ranges=ranges)
        except Exception as exc:  # no result will come (see submit_library_job)
            logger.warning("kvtier.lmcache: %s task %d failed at submission: %s", kind.name.lower(), task_id, exc)
            with self._lock:
                task = self._tasks.pop(task_id, None)
            if task is not None:
                self._finish(task_id, task, None)
            return task_id
        if refused is not None:  # its one failed result comes from the poller
            logger.warning("kvtier.lmcache: %s task %d refused: %s", kind.name.lower(), task_id, refused)
        return task_id

    def _ranges(self, objects: list) -> tuple[list, list]:
        """Each object's one range of the L1 region, and its size; raises for an object
        outside the arena."""
        base, size = self._arena
        ranges, sizes = [], []
        for obj in objects:
            offset, nbytes = int(obj.data_ptr) - base, int(obj.get_size())
            if nbytes <= 0 or offset < 0 or offset + nbytes > size:
                raise ValueError(f"an object of {nbytes} bytes at {int(obj.data_ptr):#x} lies outside the L1 arena")
            ranges.append([(self._region, offset, nbytes)])
            sizes.append(nbytes)
        return ranges, sizes

    def _finish(self, task_id: int, task: _Task, outcome: JobOutcome | None, empty: bool = False) -> None:
        """Files the one result of ``task`` (failed whole when ``outcome`` is None and the
        task is not ``empty``) and signals its event fd."""
        if outcome is not None:
            done = key_successes(outcome, len(task.keys))
        else:
            done = [empty] * len(task.keys)
        if task.kind is JobKind.STORE:
            ok = empty or (outcome is not None and outcome.ok and all(done))
            stored = [(k, kv, n) for k, kv, n, d in zip(task.keys, task.kv_keys, task.sizes, done) if d]
            fresh = self._remember(stored)
            if fresh:
                self._notify_keys_stored([k for k, _, _ in fresh], [n for _, _, n in fresh])
            nbytes = outcome.bytes if outcome is not None else 0
            with self._lock:
                self._store_results[task_id] = L2StoreResult(ok, nbytes)
                self._counted("stores_ok" if ok else "stores_failed")
            self._signal(self._store_fd)
        else:
            bitmap = Bitmap(len(task.keys))
            for i, d in enumerate(done):
                if d:
                    bitmap.set(i)
            loaded = [k for k, d in zip(task.keys, done) if d]
            if loaded:
                self._notify_keys_accessed(loaded)
            with self._lock:
                self._load_results[task_id] = bitmap
                self._counted("loads")
            self._signal(self._load_fd)

    def _counted(self, outcome: str) -> None:
        """Counts a finished task (under the lock) and wakes :meth:`wait_finished`."""
        self._counts[outcome] += 1
        self._finished.notify_all()

    def finished_tasks(self) -> dict[str, int]:
        """Tasks that have their result, by outcome: ``stores_ok``, ``stores_failed``,
        ``loads``, ``lookups``."""
        with self._lock:
            return {name: self._counts[name] for name in ("stores_ok", "stores_failed", "loads", "lookups")}

    def wait_finished(self, predicate, timeout: float) -> bool:
        """Waits until ``predicate(finished_tasks())`` holds, at most ``timeout`` seconds;
        returns whether it does (for monitoring and tests: LMCache itself waits on the
        event fds)."""
        names = ("stores_ok", "stores_failed", "loads", "lookups")
        with self._finished:
            return self._finished.wait_for(lambda: predicate({n: self._counts[n] for n in names}), timeout)

    def _signal(self, efd: _EventFd) -> None:
        try:
            efd.signal()
        except OSError:  # closed by close(): nobody waits any more
            pass

    def _remember(self, entries: list) -> list:
        """Records stored keys; returns those not already recorded (a key stored again
        is counted once in LMCache's byte accounting)."""
        fresh = []
        with self._lock:
            for key, kv_key, nbytes in entries:
                known = self._known.get(kv_key)
                if known is None or known[1] == 0:  # 0: named by a delete, never counted
                    self._known[kv_key] = (key, nbytes)
                    fresh.append((key, kv_key, nbytes))
        return fresh

    # -- lookups -----------------------------------------------------------------------

    def submit_lookup_and_lock_task(self, keys: list, group_layout_descs: dict) -> int:
        task_id = next(self._task_ids)
        with self._lock:
            closing = self._closing
        if closing:
            self._finish_lookup(task_id, list(keys), [])
        else:
            self._lookups.put((task_id, list(keys)))
        return task_id

    def query_lookup_and_lock_result(self, task_id: int) -> Bitmap | None:
        with self._lock:
            return self._lookup_results.pop(task_id, None)

    def submit_unlock(self, keys: list) -> None:
        unpinned = []
        with self._lock:
            for key in keys:
                held = self._locks.get(key, 0)
                if held == 0:
                    continue  # never locked here: no pin to take
                unpinned.append(key)
                if held == 1:
                    self._locks.pop(key)
                else:
                    self._locks[key] = held - 1
        if unpinned:
            try:
                self.tier.unpin([key_of(k) for k in unpinned])
            except (KvtierError, ValueError) as exc:  # closed: the pins went with the tier
                logger.debug("kvtier.lmcache: unlock of %d keys: %s", len(unpinned), exc)

    def _lookup_loop(self) -> None:
        while True:
            item = self._lookups.get()
            if item is None:
                return
            task_id, keys = item
            if task_id == "delete":
                self._delete_now(keys)
                continue
            found: list[bool] = []
            pinned: list[bytes] = []
            try:
                kv_keys = [key_of(k) for k in keys]
                # Pinned before the store is asked: a key found present whose pin holds
                # stays through this tier's eviction until LMCache unlocks it.
                held = self.tier.pin(kv_keys)
                pinned = kv_keys
                verdicts = self.tier.check_now(kv_keys, LOOKUP_TIMEOUT_S) if keys else []
                found = [v is LookupResult.HIT and h for v, h in zip(verdicts, held)]
            except (KvtierError, ValueError) as exc:
                logger.warning("kvtier.lmcache: lookup task %d of %d keys failed: %s", task_id, len(keys), exc)
                found = []
            missed = [k for i, k in enumerate(pinned) if not (i < len(found) and found[i])]
            if missed:
                try:
                    self.tier.unpin(missed)
                except KvtierError as exc:  # closed meanwhile: the pins went with the tier
                    logger.debug("kvtier.lmcache: unpin of %d keys: %s", len(missed), exc)
            self._finish_lookup(task_id, keys, found)

    def _finish_lookup(self, task_id: int, keys: list, found: list) -> None:
        bitmap = Bitmap(len(keys))
        with self._lock:
            for i, hit in enumerate(found):
                if hit:
                    bitmap.set(i)
                    self._locks[keys[i]] = self._locks.get(keys[i], 0) + 1
            self._lookup_results[task_id] = bitmap
            self._counted("lookups")
        self._signal(self._lookup_fd)

    # -- eviction ----------------------------------------------------------------------

    def delete(self, keys: list) -> None:
        """LMCache's L2 eviction deletes ``keys``: queued for the worker thread (the call
        returns at once), which deletes their objects (``kvt_tier_delete``); the tier's
        BlockRemoved events for them then become LMCache's deleted-key notifications. The
        objects are gone for every server sharing them."""
        keys = list(keys)
        if not keys:
            return
        with self._lock:
            if self._closing:
                logger.warning("kvtier.lmcache: delete of %d keys after close is dropped", len(keys))
                return
        self._lookups.put(("delete", keys))

    def _delete_now(self, keys: list) -> None:
        try:
            kv_keys = [key_of(k) for k in keys]
        except ValueError as exc:
            logger.warning("kvtier.lmcache: delete of %d keys: %s", len(keys), exc)
            return
        with self._lock:
            for key, kv_key in zip(keys, kv_keys):
                # Objects this adapter did not store (found through a lookup) are named in
                # LMCache's notification too; their bytes were never counted here.
                self._known.setdefault(kv_key, (key, 0))
        try:
            report = self.tier.delete(kv_keys)
        except KvtierError as exc:
            logger.warning("kvtier.lmcache: delete of %d keys failed: %s", len(keys), exc)
            return
        if report["deleted"] != len(keys):
            logger.warning("kvtier.lmcache: %d of %d keys could not be deleted", len(keys) - report["deleted"],
                           len(keys))
        self._signal_poller()

    def _signal_poller(self) -> None:
        """Wakes the poller to take the tier's events now rather than at its next bound."""
        self._wake_fd.signal()

    def _removed(self, kv_keys: list) -> None:
        """The tier deleted ``kv_keys`` (its own eviction): LMCache's notifications for those
        this adapter knows."""
        keys, sizes = [], []
        with self._lock:
            for kv_key in kv_keys:
                entry = self._known.pop(kv_key, None)
                if entry is not None:
                    keys.append(entry[0])
                    sizes.append(entry[1])
        if keys:
            self._notify_keys_deleted(keys, sizes)

    # -- the poller --------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while True:
            # Woken by the tier's results or by close(); the bound only paces the checks
            # for BlockRemoved events, which raise no fd.
            readable, _, _ = select.select([self._tier_fd, self._stop_fd.fd, self._wake_fd.fd], [], [],
                                           POLLER_WAKE_S)
            if self._wake_fd.fd in readable:
                try:
                    os.eventfd_read(self._wake_fd.fd)
                except BlockingIOError:
                    pass
            self._dispatch()
            if self._stop_fd.fd in readable:
                return

    def _dispatch(self) -> None:
        """Files every finished job's result and handles the tier's KV events."""
        try:
            outcomes = self.tier.poll()
            events = self.tier.take_events()
        except KvtierError as exc:
            logger.error("kvtier.lmcache: polling the tier failed: %s", exc)
            return
        for outcome in outcomes:
            with self._lock:
                task = self._tasks.pop(outcome.job_id, None)
            if task is None:
                logger.error("kvtier.lmcache: kvtier reported job %d, which this adapter did not submit",
                             outcome.job_id)
                continue
            if not outcome.ok:
                logger.debug("kvtier.lmcache: %s task %d: %s", task.kind.name.lower(), outcome.job_id,
                             outcome.message)
            self._finish(outcome.job_id, task, outcome)
        removed = [key for event in events if event.removed for key in event.keys]
        if removed:
            self._removed(removed)

    # -- status and close --------------------------------------------------------------

    def report_status(self) -> dict:
        with self._lock:
            status = {
                "is_healthy": not self._closing,
                "type": "KvtierL2Adapter",
                "location": self.tier.location if not self._closing else "",
                "tasks_in_flight": len(self._tasks),
                "locked_keys": len(self._locks),
                "known_keys": len(self._known),
            }
        if not self._closing:
            status["kvtier"] = self.tier.stats()
        return status

    def close(self) -> None:
        """Refuses new tasks, waits up to :data:`CLOSE_DRAIN_S` for the jobs in flight and
        files their results, then closes the tier (cancelling what is left: those tasks
        fail), the threads and the event fds. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        try:
            self.tier.drain(int(CLOSE_DRAIN_S * 1000))
        except KvtierError as exc:
            logger.warning("kvtier.lmcache: closing with jobs still in flight: %s", exc)
        self._lookups.put(None)
        self._lookup_worker.join(THREAD_JOIN_S)
        self._stop_fd.signal()
        self._poller.join(THREAD_JOIN_S)
        if self._poller.is_alive() or self._lookup_worker.is_alive():
            logger.error("kvtier.lmcache: a helper thread did not end within %.0f s", THREAD_JOIN_S)
        self.tier.shutdown()  # cancels what has not started; results of the rest stay
        self._dispatch()
        self.tier.close()
        with self._lock:
            left = list(self._tasks.items())
            self._tasks.clear()
        for task_id, task in left:  # no result will come any more: each fails once
            self._finish(task_id, task, None)
        for efd in (self._store_fd, self._lookup_fd, self._load_fd, self._stop_fd, self._wake_fd):
            efd.close()
