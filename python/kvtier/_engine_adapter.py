"""What every engine adapter of kvtier needs, whatever the engine.

An engine adapter (vLLM's secondary tier in :mod:`kvtier.vllm`; an SGLang HiCache
backend) translates the engine's configuration into a tier configuration, reports
kvtier's counters as the engine's metrics, and maps the engine's transfer jobs onto
library jobs. The engine-specific parts stay in the adapter; these are the shared ones:

* configuration: splitting an engine's flat dictionary by key set (the tier's top-level
  keys and the store's; the engine's own keys and kvtier's), and leaving out values that
  mean "not set";
* keys: an engine's block hash and KV-cache group as kvtier's key;
* the tier: closed again when setting it up for the engine (its memory, its regions)
  fails;
* metrics: the growth of kvtier's counters between two reports;
* jobs: submitting one library job (the call for its kind, and what a refusal means: its
  one failed result still comes, except in a fork() child and for a duplicate id, where
  none does), which keys of a finished library job succeeded, and,
  for engines whose jobs are asynchronous, one engine job as one library job per key
  length (a library job's keys have one length, an engine's may not), their outcomes
  gathered back into one finished job carrying the keys that succeeded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from typing import Any, Collection, Iterable, Iterator, Mapping

from .errors import DuplicateJobError, ForkedError, KvtierError, Status
from .tier import KEY_GROUP_BYTES, JobKind, JobOutcome, Tier

# ---------------------------------------------------------------------------------------
# Configuration.


def split_flat_config(flat: Mapping[str, Any], keys: Collection[str]) -> tuple[dict, dict]:
    """``(in_keys, others)``: the entries of ``flat`` whose key is in ``keys``, and the
    others, each in ``flat``'s order. Engines take one flat dictionary where kvtier has
    the tier's keys at the top and the store's below ``store`` (vLLM's ``store_config``),
    or where the engine's own keys sit beside kvtier's (SGLang's ``extra_config``)."""
    in_keys: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, value in flat.items():
        (in_keys if key in keys else others)[key] = value
    return in_keys, others


def drop_unset(config: dict, keys: Iterable[str], unset: tuple = ("", None)) -> None:
    """Removes each of ``keys`` whose value is one of ``unset``: engines send empty strings
    or ``None`` for settings left at their default, where kvtier wants the key absent."""
    for key in keys:
        if key in config and config[key] in unset:
            del config[key]


# ---------------------------------------------------------------------------------------
# Keys and the tier.


def block_key(block_hash: bytes, group: int = 0) -> bytes:
    """kvtier's key of a block: its hash, then its KV-cache group index in
    :data:`~kvtier.KEY_GROUP_BYTES` big-endian bytes (vLLM's OffloadKey layout)."""
    return bytes(block_hash) + group.to_bytes(KEY_GROUP_BYTES, "big")


@contextlib.contextmanager
def closed_on_failure(tier: Tier) -> Iterator[Tier]:
    """Closes ``tier`` (and re-raises) when the block fails: a tier whose setup for the
    engine (registering its memory, its regions) did not finish must not outlive it."""
    try:
        yield tier
    except BaseException:
        tier.close()
        raise


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


def submit_library_job(
    tier: Tier, kind: JobKind, job_id: int, keys: Any, *, blocks: Any = None, ranges: Any = None
) -> KvtierError | None:
    """Submits one library job of ``kind``: ``keys[i]`` from or to block ``blocks[i]`` of
    the tier's pool, or, with ``ranges``, from or to the ranges ``ranges[i]`` (one of the
    two is given).

    Returns None when the library took the job, or its refusal: a :class:`KvtierError`
    whose job still yields its one failed result from :meth:`Tier.poll`. Any exception
    means no result comes and the caller fails the job itself; it propagates: a
    ``TypeError`` or ``ValueError`` for arguments the binding rejects (the job never
    reached the library), and the two refusals the C ABI answers with no result:
    :class:`ForkedError` (a fork() child using its parent's tier) and
    :class:`DuplicateJobError` (the id already has a result pending: that result is the
    earlier job's)."""
    try:
        if ranges is None:
            submit = tier.submit_store if kind is JobKind.STORE else tier.submit_load
            submit(job_id, blocks, keys)
        else:
            submit = tier.submit_store_ranges if kind is JobKind.STORE else tier.submit_load_ranges
            submit(job_id, keys, ranges)
    except (ForkedError, DuplicateJobError):
        raise
    except KvtierError as exc:
        return exc
    return None


def key_successes(outcome: JobOutcome, num_keys: int) -> list[bool]:
    """Whether each of a finished library job's ``num_keys`` keys succeeded, in job order:
    every key of a job that succeeded; else those whose own status is OK (none when the
    result carries no per-key statuses, as a job rejected at submission may)."""
    if outcome.ok:
        return [True] * num_keys
    if len(outcome.key_status) != num_keys:
        return [False] * num_keys
    return [status == Status.OK for status in outcome.key_status]


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
    return [k for k, ok in zip(keys, key_successes(outcome, len(keys))) if ok]


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
        for part_slots, part_keys in by_length.values():
            part_id = next(self._next_part_id)
            self._parts[part_id] = (job_id, part_keys)
            try:
                refused = submit_library_job(tier, kind, part_id, part_keys, blocks=part_slots)
            except Exception as exc:  # never reached the library: fail this part here
                del self._parts[part_id]
                self._logger.warning("%s job %d failed at submission: %s", kind.name.lower(), job_id, exc)
                pending.add(ok=False, done=(), nbytes=0, seconds=0.0)
                continue
            if refused is not None:
                # Rejected by the library: its one failed result comes from the next poll.
                self._logger.warning("%s job %d rejected: %s", kind.name.lower(), job_id, refused)
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
            try:
                outcomes = tier.poll()
            except ForkedError:
                # A fork() child holds its parent's tier: no result of the parent's jobs
                # will ever come here, so every job this book still waits for fails now.
                self._fail_pending("the tier belongs to the parent process (fork)")
                outcomes = []
            for outcome in outcomes:
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

    def _fail_pending(self, why: str) -> None:
        if self._jobs:
            self._logger.warning("%d jobs failed: %s", len(self._jobs), why)
        for job_id, pending in list(self._jobs.items()):
            pending.ok = False
            pending.parts = 0
            self._finish_if_done(job_id)
        self._parts.clear()

    def has_pending(self) -> bool:
        """True while a submitted job has not been returned by :meth:`collect`."""
        return bool(self._jobs or self._finished)

    def clear(self) -> None:
        """Forgets every job (the tier is gone)."""
        self._jobs.clear()
        self._parts.clear()
        self._finished.clear()
