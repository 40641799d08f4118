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
import os
import select
import weakref
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping

from .errors import DuplicateJobError, ForkedError, KvtierError, Status
from .tier import KEY_GROUP_BYTES, JobKind, JobOutcome, LookupResult, Tier

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
        # The same counters in ``kvt_stats``'s order, for snapshots taken as raw bytes.
        self._order = tuple(self._reported)
        self._values: tuple[int, ...] | None = None

    def since_last_values(self, values: tuple[int, ...]) -> dict[str, int]:
        """:meth:`since_last` for the totals ``values``, in the order of the names given
        (``kvt_stats``'s): one comparison of tuples, and a pass only over what grew."""
        before = self._values
        if before is None:
            before = tuple(self._reported[name] for name in self._order)
        self._values = values
        if values == before:
            return {}
        return {name: now - was for name, now, was in zip(self._order, values, before) if now != was}

    def since_last(self, totals: Mapping[str, int]) -> dict[str, int]:
        """Each counter's growth since the previous call (counters that did not grow are
        left out), remembering ``totals`` as reported."""
        if self._values is not None:  # reported last through since_last_values
            self._reported.update(zip(self._order, self._values))
            self._values = None
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


_OK = Status.OK

# fork() children made so far in this process's line: a book made before the last one
# holds its parent's tier (counted rather than asking the kernel for the pid per poll).
_FORKS = 0


def _count_fork_in_child() -> None:
    global _FORKS
    _FORKS += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork_in_child)


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

    def __init__(self, logger: logging.Logger, on_failed_loads: Callable[[list], None] | None = None):
        self._logger = logger
        self._jobs: dict[int, _PendingJob] = {}
        self._parts: dict[int, tuple[int, list]] = {}  # library job id -> (engine job id, its keys)
        self._next_part_id = itertools.count(1)
        self._finished: list[FinishedJob] = []
        #: Told the keys of loads that failed, as the library marks them MISS (in the poll).
        self._on_failed_loads = on_failed_loads
        # The tier's event fd, polled without blocking: readable while results wait, so a
        # collect with jobs in flight and none finished makes no call into the library.
        self._ready: Any = None
        self._ready_tier: Any = None
        self._forks = _FORKS

    def _results_may_wait(self, tier: Tier) -> bool:
        if self._ready_tier is not tier:
            self._ready_tier, self._ready = tier, None
            try:
                fd = tier.event_fd()
                ready = select.poll()
                ready.register(fd, select.POLLIN)
                self._ready = ready
            except (KvtierError, AttributeError, OSError, ValueError):
                self._ready = None  # no fd: poll the library every time
        ready = self._ready
        # In a fork() child the fd is gone (the library closed it): the library answers.
        return ready is None or _FORKS != self._forks or bool(ready.poll(0))

    def submit(self, tier: Tier | None, kind: JobKind, job_id: int, keys: Iterable, slots: Iterable) -> None:
        """Moves ``keys[i]`` from or to slot ``slots[i]`` of the tier's registered memory."""
        job_id = int(job_id)
        keys = tuple(keys)
        if tier is not None and keys and job_id not in self._jobs and self._submit_whole(tier, kind, job_id, keys, slots):
            return
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

    def _submit_whole(self, tier: Tier, kind: JobKind, job_id: int, keys: tuple, slots: Any) -> bool:
        """The usual job, as one library job without a step per key: keys of one length
        (checked at C speed), slots an integer array (vLLM's chunk ids) or sequence handed
        to the binding as they are. False, having done nothing, for any other job (the
        general path then takes it and reports what is wrong with it)."""
        if len(set(map(len, keys))) != 1:
            return False
        try:
            if len(slots) != len(keys):
                return False
        except TypeError:
            return False
        part_id = next(self._next_part_id)
        self._parts[part_id] = (job_id, keys)
        self._jobs[job_id] = pending = _PendingJob(kind, keys, parts=1)
        try:
            refused = submit_library_job(tier, kind, part_id, keys, blocks=slots)
        except (TypeError, ValueError, OverflowError):  # never reached the library
            del self._parts[part_id], self._jobs[job_id]
            return False  # the general path converts what it can, and reports the rest
        except Exception as exc:  # never reached the library: fail it here
            del self._parts[part_id]
            self._logger.warning("%s job %d failed at submission: %s", kind.name.lower(), job_id, exc)
            pending.add(ok=False, done=(), nbytes=0, seconds=0.0)
            self._finish_if_done(job_id)
            return True
        if refused is not None:
            # Rejected by the library: its one failed result comes from the next poll.
            self._logger.warning("%s job %d rejected: %s", kind.name.lower(), job_id, refused)
        return True

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
        if tier is not None and self._parts and self._results_may_wait(tier):
            try:
                outcomes = tier.poll()
            except ForkedError:
                # A fork() child holds its parent's tier: no result of the parent's jobs
                # will ever come here, so every job this book still waits for fails now.
                self._fail_pending("the tier belongs to the parent process (fork)")
                outcomes = []
            parts, jobs = self._parts, self._jobs
            for outcome in outcomes:
                job_id, part_keys = parts.pop(outcome.job_id, (None, ()))
                pending = jobs.get(job_id) if job_id is not None else None
                if pending is None:
                    self._logger.error("kvtier reported job %d, which this tier did not submit", outcome.job_id)
                    continue
                if outcome.status == _OK:
                    pending.add(ok=True, done=part_keys, nbytes=outcome.bytes, seconds=outcome.seconds)
                else:
                    self._logger.debug("%s job %d failed: %s", pending.kind.name.lower(), job_id, outcome.message)
                    done = _keys_done(outcome, list(part_keys))
                    if (outcome.kind is JobKind.LOAD and self._on_failed_loads is not None
                            and len(outcome.key_status) == len(part_keys)):
                        # the keys the library itself marked MISS: those with a failed status
                        self._on_failed_loads(
                            [k for k, st in zip(part_keys, outcome.key_status) if st != Status.OK])
                    pending.add(ok=False, done=done, nbytes=outcome.bytes, seconds=outcome.seconds)
                self._finish_if_done(job_id)
        if not self._finished:
            return []
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


# ---------------------------------------------------------------------------------------
# Lookups answered on the engine's thread.

_LIVE_MIRRORS: "weakref.WeakSet[LookupMirror]" = weakref.WeakSet()


def _mirrors_after_fork_in_child() -> None:
    # A fork() child holds its parent's tier: every lookup goes to the library (FORKED).
    for mirror in list(_LIVE_MIRRORS):
        mirror._forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mirrors_after_fork_in_child)


class LookupMirror:
    """The tier's per-request lookups (``kvt_tier_lookup``), answered from a copy of the
    library's lookup state kept here, so that a lookup is a dictionary lookup rather than a
    call into the library; the library is told in batches (``kvt_tier_lookup_batch``).

    The library's rules are kept, call for call: a key's verdict is shared by the requests
    that asked for it and lives until the last of them finished; an unknown key answers
    RETRY and is checked after the step's end; a failed load's failed keys turn MISS. What
    the library knows and this copy knows are the same because every change of that state
    goes through here:

    * a request asking for a key (new to it) is queued, and the queue handed to the library
      in one call before anything that reads or changes its lookup state: the step's end,
      a request's end, a poll (where failed loads mark keys MISS), a refresh;
    * verdicts come back from those calls; a key whose check is in flight is asked again
      (one call for all of them) at its first lookup after the step's end, and whenever a
      caller comes back to a key it already asked since the last refresh (a caller looping
      without ending the step);
    * a request's end drops the keys nobody holds any more, as the library does;
    * a failed load's failed keys are MISS (``mark_miss``), told by :class:`JobBook`.

    The first key of each length goes to the library on its own (``kvt_tier_lookup``): a
    length the library refuses answers MISS at once, as before. Lookup failures answer MISS
    (logged), as a refused ``kvt_tier_lookup`` did. Not thread-safe: engines look up from
    one thread.
    """

    def __init__(self, tier: Tier, verdicts: Mapping[Any, Any], logger: logging.Logger):
        self._tier = tier
        self._logger = logger
        #: kvtier's verdict -> the engine's
        self._as_engine = dict(verdicts)
        self._hit, self._miss = self._as_engine[LookupResult.HIT], self._as_engine[LookupResult.MISS]
        self._retry = self._as_engine[LookupResult.RETRY]
        self._holders: dict[bytes, set] = {}  # key -> request ids holding it in the library
        self._verdicts: dict[bytes, Any] = {}  # key -> the engine's HIT or MISS (resolved)
        self._in_flight: dict[bytes, int] = {}  # unresolved key -> a request id holding it
        self._asked: set = set()  # unresolved keys asked since the last refresh
        self._refresh_due = False  # the step ended: the first unresolved key asked refreshes
        self._by_request: dict[int, list] = {}  # request id -> its keys
        self._unsent: list[tuple[int, bytes]] = []  # (request id, key) the library has not seen
        self._lengths: set[int] = set()  # key lengths the library took
        self._forked = False
        _LIVE_MIRRORS.add(self)

    # -- the engine's calls ----------------------------------------------------------

    def lookup(self, rid: int, key: bytes) -> Any:
        # The scheduler calls this once per key per step: the request's bookkeeping is
        # written out in both branches, a method call costing as much as the rest.
        holders = self._holders.get(key)
        if holders is None:
            if len(key) not in self._lengths or self._forked:
                return self._lookup_in_library(rid, key)
            self._holders[key] = {rid}
            keys = self._by_request.get(rid)
            if keys is None:
                self._by_request[rid] = [key]
            else:
                keys.append(key)
            self._unsent.append((rid, key))
            return self._retry
        if self._forked:
            return self._lookup_in_library(rid, key)
        if rid not in holders:
            holders.add(rid)
            keys = self._by_request.get(rid)
            if keys is None:
                self._by_request[rid] = [key]
            else:
                keys.append(key)
            self._unsent.append((rid, key))
        verdict = self._verdicts.get(key)
        if verdict is not None:
            return verdict
        if key in self._in_flight:
            if self._refresh_due or key in self._asked:
                self._sync(refresh=True)
                return self._verdicts.get(key, self._retry)
            self._asked.add(key)
        return self._retry

    def schedule_end(self) -> None:
        """Hands the step's new lookups to the library, then ends its step there."""
        if self._unsent:
            self._sync(refresh=False)
        self._tier.schedule_end()
        self._refresh_due = bool(self._in_flight)
        self._asked.clear()

    def request_finished(self, rid: int) -> None:
        if self._unsent:
            self._sync(refresh=False)
        keys = self._by_request.pop(rid, None)
        self._tier.request_finished(rid)
        if not keys:
            return
        holders_of, in_flight = self._holders, self._in_flight
        get_holders, drop_verdict, drop_in_flight = holders_of.get, self._verdicts.pop, in_flight.pop
        asked = self._asked
        for key in keys:
            holders = get_holders(key)
            if holders is None:
                continue
            holders.discard(rid)
            if holders:
                if in_flight.get(key) == rid:
                    in_flight[key] = next(iter(holders))
                continue
            # Nobody holds it: the library drops it (or drops a check in flight when its
            # answer comes); either way a new request's lookup starts from RETRY.
            del holders_of[key]
            drop_verdict(key, None)
            drop_in_flight(key, None)
            if asked:
                asked.discard(key)

    def before_poll(self) -> None:
        """Called before the tier's results are polled: the library marks failed loads'
        keys MISS there, for the requests holding them then."""
        if self._unsent:
            self._sync(refresh=False)

    def mark_miss(self, keys: Iterable[bytes]) -> None:
        """A load's failed keys, which the library made MISS for everyone holding them."""
        for key in keys:
            if key in self._verdicts:
                self._verdicts[key] = self._miss
            # A key still in flight stays so: the next refresh reads the library's verdict.

    def clear(self) -> None:
        self._holders.clear()
        self._verdicts.clear()
        self._in_flight.clear()
        self._asked.clear()
        self._by_request.clear()
        self._unsent.clear()
        _LIVE_MIRRORS.discard(self)

    # -- the library -----------------------------------------------------------------

    def _lookup_in_library(self, rid: int, key: bytes) -> Any:
        """One key asked of the library on its own (a new key length, or a fork child)."""
        if self._unsent:
            self._sync(refresh=False)
        try:
            verdict = self._tier.lookup(rid, key)
        except KvtierError as exc:
            self._logger.warning("kvtier lookup failed, answering MISS: %s", exc)
            return self._miss
        if self._forked:
            return self._as_engine[verdict]
        self._lengths.add(len(key))
        self._track(rid, key)
        return self._learn(rid, key, verdict)

    def _track(self, rid: int, key: bytes) -> None:
        holders = self._holders.setdefault(key, set())
        if rid not in holders:
            holders.add(rid)
            self._by_request.setdefault(rid, []).append(key)

    def _learn(self, rid: int, key: bytes, verdict: LookupResult) -> Any:
        if verdict is LookupResult.RETRY:
            self._in_flight.setdefault(key, rid)
            return self._retry
        answer = self._as_engine[verdict]
        self._verdicts[key] = answer
        self._in_flight.pop(key, None)
        return answer

    def _sync(self, refresh: bool) -> None:
        """One library call per key length: the lookups it has not seen yet and, with
        ``refresh``, every key whose verdict is not known here."""
        pairs, self._unsent = self._unsent, []
        if refresh:
            pairs.extend((rid, key) for key, rid in self._in_flight.items())
            self._refresh_due = False
            self._asked.clear()
        if not pairs:
            return
        rids, keys = zip(*pairs)
        if len(set(map(len, keys))) == 1:
            groups = [(rids, keys)]  # the usual step: one key length, grouped at C speed
        else:
            by_length: dict[int, tuple[list, list]] = {}
            for rid, key in pairs:
                group = by_length.get(len(key))
                if group is None:
                    group = by_length[len(key)] = ([], [])
                group[0].append(rid)
                group[1].append(key)
            groups = list(by_length.values())
        holders, verdicts_of, in_flight = self._holders, self._verdicts, self._in_flight
        as_engine, retry = self._as_engine, int(LookupResult.RETRY)
        # The verdicts' codes where the tier gives them (kvtier's verdicts are IntEnums:
        # the codes are equal to them and find the same engine verdicts).
        batch = getattr(self._tier, "_lookup_codes", None) or self._tier.lookup_batch
        for rids, keys in groups:
            try:
                verdicts = batch(rids, keys)
            except KvtierError as exc:
                self._logger.warning("kvtier lookup failed, answering MISS: %s", exc)
                for key in keys:
                    if key in self._holders:
                        self._verdicts[key] = self._miss
                        self._in_flight.pop(key, None)
                continue
            for rid, key, verdict in zip(rids, keys, verdicts):
                if key in holders:
                    # self._learn(rid, key, verdict), written out: once per key of the step
                    if verdict == retry:
                        if key not in in_flight:
                            in_flight[key] = rid
                    else:
                        answer = as_engine.get(verdict)
                        if answer is None:  # not a verdict: the enum raises as it did
                            answer = as_engine[LookupResult(verdict)]
                        verdicts_of[key] = answer
                        in_flight.pop(key, None)
