"""A small model of vLLM's TieringOffloadingManager driving one secondary tier.

It calls the tier exactly the way the manager does (spec §3.10): one job-polling pass
per step (at the first lookup / store / schedule end of the step), HITs allocate a
primary slot at lookup time and queue a promotion under the request, promotions are
flushed at schedule end as one ``submit_load`` per request, every completed GPU->CPU
store cascades to the tier with a fresh job id, the tier is told once when a request
finishes, ``reset_cache`` drains and expects no job left, and it asserts what the
manager asserts: no unknown or duplicate job id, ``successful_keys`` a subset of the
job's keys.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtier.vllm import LookupResult, ReqContext, ScheduleEndContext


@dataclass
class Job:
    """The manager's TransferJob (newer vLLM); older ones call chunk_ids block_ids."""

    job_id: int
    keys: list
    chunk_ids: np.ndarray
    is_promotion: bool
    req_context: Any


class TieringSim:
    def __init__(self, tier, pool: np.ndarray):
        self.tier = tier
        self.pool = pool
        self.slot_of: dict[bytes, int] = {}  # keys complete in the primary tier
        self.writing: dict[bytes, int] = {}  # promotions in flight: key -> slot
        self.free = list(range(len(pool)))
        self.pins: Counter = Counter()
        self.jobs: dict[int, tuple] = {}  # job id -> (kind, keys, slots, req)
        self.next_job = itertools.count()  # manager-unique, increasing from 0
        self.promotions: dict[str, list] = defaultdict(list)
        self.polled = False
        self.step = 0
        self.loads_per_step: Counter = Counter()  # (step, req) -> submit_load calls
        self.results: list = []
        self.events: list = []
        self.failed_promotions: list = []

    # -- the manager's job-polling gate ----------------------------------------------

    def _poll(self) -> None:
        if self.polled:
            return
        self.polled = True
        for r in self.tier.get_finished_jobs():
            assert r.job_id in self.jobs, f"tier returned unknown or duplicate job id {r.job_id}"
            kind, keys, slots, req = self.jobs.pop(r.job_id)
            self.results.append((kind, keys, r))
            if kind == "load":
                if r.success:
                    ok = set(keys)
                else:
                    ok = set(r.successful_keys or ())
                    assert ok <= set(keys), "successful_keys must be a subset of the job's keys"
                    self.failed_promotions.append((req, [k for k in keys if k not in ok]))
                for key, slot in zip(keys, slots):
                    del self.writing[key]
                    if key in ok:
                        self.slot_of[key] = slot
                    else:
                        self.free.append(slot)
            else:  # cascade: unpin, success or not
                for slot in slots:
                    self.pins[slot] -= 1

    # -- scheduler-facing calls ------------------------------------------------------

    def lookup(self, key: bytes, req: str) -> str:
        self._poll()
        if key in self.slot_of:
            return "HIT"
        if key in self.writing:
            return "HIT_PENDING"
        verdict = self.tier.lookup(key, ReqContext(req_id=req))
        if verdict is LookupResult.HIT:
            if not self.free:
                return "MISS"  # primary full
            slot = self.free.pop(0)
            self.writing[key] = slot
            self.promotions[req].append((key, slot))
            return "HIT_PENDING"
        return verdict.name

    def store(self, req: str, blocks: dict) -> int:
        """GPU->CPU store of ``blocks`` (key -> bytes) completed: cascade to the tier."""
        self._poll()
        keys, slots = [], []
        for key, data in blocks.items():
            slot = self.free.pop(0)
            self.pool[slot] = data
            self.slot_of[key] = slot
            self.pins[slot] += 1
            keys.append(key)
            slots.append(slot)
        job_id = next(self.next_job)
        self.jobs[job_id] = ("store", keys, slots, req)
        self.tier.submit_store(Job(job_id, keys, np.array(slots, dtype=np.int32), False, ReqContext(req_id=req)))
        return job_id

    def schedule_end(self, new_req_ids=()) -> None:
        self._poll()
        for req, items in self.promotions.items():
            job_id = next(self.next_job)
            keys = [k for k, _ in items]
            slots = [s for _, s in items]
            self.jobs[job_id] = ("load", keys, slots, req)
            self.loads_per_step[(self.step, req)] += 1
            self.tier.submit_load(Job(job_id, keys, np.array(slots, dtype=np.int32), True, ReqContext(req_id=req)))
        self.promotions.clear()
        self.tier.on_schedule_end(ScheduleEndContext(list(new_req_ids), []))
        self.events.extend(self.tier.take_events())
        self.polled = False
        self.step += 1

    def finish(self, req: str) -> None:
        self.tier.on_request_finished(ReqContext(req_id=req))

    def evict(self, key: bytes) -> None:
        slot = self.slot_of.pop(key)
        assert self.pins[slot] == 0, "evicting a pinned slot"
        self.free.append(slot)

    def run_until_idle(self, timeout: float = 15.0) -> None:
        """Steps until every submitted job has been reported."""
        deadline = time.monotonic() + timeout
        while self.jobs:
            assert time.monotonic() < deadline, f"jobs {sorted(self.jobs)} never finished"
            self.schedule_end()
            time.sleep(0.002)

    def resolve(self, key: bytes, req: str, timeout: float = 15.0) -> str:
        """Looks ``key`` up once per step until the answer is not RETRY."""
        deadline = time.monotonic() + timeout
        while True:
            verdict = self.lookup(key, req)
            if verdict != "RETRY":
                return verdict
            assert time.monotonic() < deadline, "lookup never resolved"
            self.schedule_end()
            time.sleep(0.002)

    def reset_cache(self) -> None:
        self.tier.drain_jobs()
        self.polled = False
        self._poll()
        assert not self.jobs, f"jobs {sorted(self.jobs)} outstanding after drain_jobs"
        self.promotions.clear()
        self.slot_of.clear()
        self.writing.clear()
        self.pins.clear()
        self.free = list(range(len(self.pool)))

    def shutdown(self) -> None:
        self.tier.shutdown()
