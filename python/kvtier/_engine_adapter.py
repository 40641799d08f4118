"""What every engine adapter of kvtier needs, whatever the engine.

An engine adapter (vLLM's secondary tier in :mod:`kvtier.vllm`; an SGLang HiCache
backend) translates the engine's configuration into a tier configuration, reports
kvtier's counters as the engine's metrics, and maps the engine's transfer jobs onto
library jobs. The engine-specific parts stay in the adapter; these are the shared ones:

* configuration: splitting an engine's flat store dictionary into the tier's top-level
  keys and the store's keys, and leaving out values that mean "not set";
* metrics: the growth of kvtier's counters between two reports;
* jobs: one engine job becomes one library job per key length (a library job's keys
  have one length, an engine's may not), and their outcomes are gathered back into one
  finished job carrying the keys that succeeded.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any, Callable, Collection, Iterable, Mapping

from .errors import KvtierError, Status
from .tier import JobKind, JobOutcome, Tier

# ---------------------------------------------------------------------------------------
# Configuration.


def split_flat_config(flat: Mapping[str, Any], tier_keys: Collection[str]) -> tuple[dict, dict]:
    """``(tier, store)``: the entries of ``flat`` whose key is in ``tier_keys``, and the
    others. Engines take one flat dictionary where kvtier has the tier's keys at the top
    and the store's below ``store``."""
    tier: dict[str, Any] = {}
    store: dict[str, Any] = {}
    for key, value in flat.items():
        (tier if key in tier_keys else store)[key] = value
    return tier, store


def drop_unset(config: dict, keys: Iterable[str], unset: tuple = ("", None)) -> None:
    """Removes each of ``keys`` whose value is one of ``unset``: engines send empty strings
    or ``None`` for settings left at their default, where kvtier wants the key absent."""
    for key in keys:
        if key in config and config[key] in unset:
            del config[key]


# ---------------------------------------------------------------------------------------
# Metrics.


class CounterGrowth:
    """The growth of kvtier's counters between reports: engines' counters take
    increments, kvtier's counters are totals."""

    def __init__(self, names: Iterable[str]):
        self._reported = dict.fromkeys(names, 0)

    def since_last(self, totals: Mapping[str, int]) -> dict[str, int]:
        """Each counter's growth since the previous call (counters that did not grow are
        left out), remembering ``totals`` as reported."""
        grown = {}
        for name, before in self._reported.items():
            now = totals[name]
            if now != before:
                grown[name] = now - before
            self._reported[name] = now
        return grown


# ---------------------------------------------------------------------------------------
# Jobs.


@dataclasses.dataclass
class FinishedJob:
    """One engine job, finished: every library job it became has reported."""

    job_id: int
    kind: JobKind
    keys: tuple
    ok: bool
    #: Keys that succeeded (all of them when ``ok``).
    done: set
    #: Bytes moved by the keys that succeeded.
    nbytes: int
    #: The slowest library job's seconds from submission to completion.
    seconds: float

    def succeeded_keys(self) -> tuple:
        """The keys that succeeded, in job order."""
        return tuple(k for k in self.keys if k in self.done)


@dataclasses.dataclass
class _PendingJob:
    """One engine job in flight: its keys, and what its library jobs reported so far."""

    kind: JobKind
    keys: tuple
    parts: int  # library jobs still in flight
    ok: bool = True
    done: set = dataclasses.field(default_factory=set)
    nbytes: int = 0
    seconds: float = 0.0

    def add(self, *, ok: bool, done: Iterable, nbytes: int, seconds: float) -> None:
        self.parts -= 1
        self.ok = self.ok and ok
        self.done.update(done)
        self.nbytes += nbytes
        self.seconds = max(self.seconds, seconds)

    def finished(self, job_id: int) -> FinishedJob:
        return FinishedJob(job_id, self.kind, self.keys, self.ok, self.done, self.nbytes, self.seconds)


def _keys_done(outcome: JobOutcome, keys: list) -> list:
    if outcome.ok:
        return keys
    statuses = outcome.key_status if len(outcome.key_status) == len(keys) else ()
    return [k for k, st in zip(keys, statuses) if st == Status.OK]


class JobBook:
    """An engine's store and load jobs, each split into library jobs of one key length,
    and their results gathered back: one :class:`FinishedJob` per engine job, after all
    of its I/O is done.

    Submission never raises for a bad job: a job that cannot reach the library finishes
    at once, failed (its reason logged to ``logger``). Not thread-safe: engines call an
    adapter from one thread.
    """

    def __init__(self, logger: logging.Logger):
        self._logger = logger
        self._jobs: dict[int, _PendingJob] = {}
        self._parts: dict[int, tuple[int, list]] = {}  # library job id -> (engine job id, its keys)
        self._next_part_id = itertools.count(1)
        self._finished: list[FinishedJob] = []

    def submit(self, tier: Tier | None, kind: JobKind, job_id: int, keys: Iterable, slots: Iterable) -> None:
        """Moves ``keys[i]`` from or to slot ``slots[i]`` of the tier's registered memory."""
        job_id = int(job_id)
        keys = tuple(keys)
        if job_id in self._jobs:
            # Engines never reuse a pending id; a second result would confuse them.
            self._logger.error("job %d is already in flight; the duplicate submission is dropped", job_id)
            return
        if not keys:
            self._finished.append(FinishedJob(job_id, kind, keys, True, set(), 0, 0.0))
            return
        if tier is None:
            self._fail_at_submission(job_id, kind, keys, "the tier is shut down")
            return
        try:
            slots = [int(s) for s in slots]
            if len(slots) != len(keys):
                raise ValueError(f"{len(keys)} keys but {len(slots)} chunk ids")
        except Exception as exc:  # never reached the library: report the failure here
            self._fail_at_submission(job_id, kind, keys, str(exc))
            return
        by_length: dict[int, tuple[list, list]] = {}
        for key, slot in zip(keys, slots):
            part_slots, part_keys = by_length.setdefault(len(key), ([], []))
            part_slots.append(slot)
            part_keys.append(key)
        pending = self._jobs[job_id] = _PendingJob(kind, keys, parts=len(by_length))
        submit: Callable = tier.submit_store if kind is JobKind.STORE else tier.submit_load
        for part_slots, part_keys in by_length.values():
            part_id = next(self._next_part_id)
            self._parts[part_id] = (job_id, part_keys)
            try:
                submit(part_id, part_slots, part_keys)
            except KvtierError as exc:
                # Rejected by the library: its one failed result comes from the next poll.
                self._logger.warning("%s job %d rejected: %s", kind.name.lower(), job_id, exc)
            except Exception as exc:  # never reached the library: fail this part here
                del self._parts[part_id]
                self._logger.warning("%s job %d failed at submission: %s", kind.name.lower(), job_id, exc)
                pending.add(ok=False, done=(), nbytes=0, seconds=0.0)
        self._finish_if_done(job_id)

    def _fail_at_submission(self, job_id: int, kind: JobKind, keys: tuple, why: str) -> None:
        self._logger.warning("job %d failed at submission: %s", job_id, why)
        self._finished.append(FinishedJob(job_id, kind, keys, False, set(), 0, 0.0))

    def _finish_if_done(self, job_id: int) -> None:
        pending = self._jobs.get(job_id)
        if pending is not None and pending.parts == 0:
            del self._jobs[job_id]
            self._finished.append(pending.finished(job_id))

    def collect(self, tier: Tier | None) -> list[FinishedJob]:
        """Every job finished since the last call, each exactly once, in finishing order."""
        if tier is not None:
            for outcome in tier.poll():
                job_id, part_keys = self._parts.pop(outcome.job_id, (None, ()))
                pending = self._jobs.get(job_id) if job_id is not None else None
                if pending is None:
                    self._logger.error("kvtier reported job %d, which this tier did not submit", outcome.job_id)
                    continue
                if not outcome.ok:
                    self._logger.debug("%s job %d failed: %s", pending.kind.name.lower(), job_id, outcome.message)
                pending.add(
                    ok=outcome.ok, done=_keys_done(outcome, part_keys), nbytes=outcome.bytes, seconds=outcome.seconds
                )
                self._finish_if_done(job_id)
        finished, self._finished = self._finished, []
        return finished

    def has_pending(self) -> bool:
        """True while a submitted job has not been returned by :meth:`collect`."""
        return bool(self._jobs or self._finished)

    def clear(self) -> None:
        """Forgets every job (the tier is gone)."""
        self._jobs.clear()
        self._parts.clear()
        self._finished.clear()
