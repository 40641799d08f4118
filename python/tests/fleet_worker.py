"""One process of the fleet soak (fleet.py, driven by test_fleet_soak.py and bench/fleet_soak.py).

    python fleet_worker.py engine  SPEC_JSON   an engine: vLLM 0.33's TieringOffloadingManager
                                               (built by vLLM's factory) with kvtier as its
                                               secondary tier
    python fleet_worker.py evictor SPEC_JSON   a kvtier tier with `eviction` that loads and
                                               checks blocks while its eviction task runs
    python fleet_worker.py verify  SPEC_JSON   a fresh tier that loads the keys of the spec
                                               and checks every byte

Every block's content is a function of its key (``content``; ffi-tests/fleet_worker.c
computes the same keys and bytes), so every process checks every block it loads, whoever
stored it.

Protocol: the worker writes one JSON document per line on stdout, each prefixed ``FLEET ``
(vLLM logs there too): ``ready`` when it serves, ``progress`` now and then (cumulative
figures, so a killed worker's work is still counted), ``wrong`` at once for a block loaded
with wrong bytes, and ``final`` with its figures before it exits. It reads commands on
stdin, one a line: ``final`` (engines: stop the run; look every key this engine stored up
in a new request, store the ones that MISS and report them; then exit), ``stop`` (the
evictor: report and exit). End of stdin (the test died) makes it exit at once.
"""

from __future__ import annotations

import json
import os
import random
import select
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import kvtier  # installed, or on PYTHONPATH
except ImportError:  # a checkout without PYTHONPATH=python
    sys.path.insert(0, str(HERE.parent))
    import kvtier
from kvtier.errors import Status  # noqa: E402

BLOCK_BYTES = 4096
KEY_BYTES = 36
MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
#: The longest any single wait may take before the worker reports itself stuck.
DEADLINE_S = 60.0
PROGRESS_EVERY_S = 0.5
#: Pause between two rounds (an engine's time between requests; leaves the cores to the others).
ROUND_PAUSE_S = 0.005
#: Statuses a key may end with while stores and deletes race: OK, or NotFound (a load of a
#: block deleted under it). Anything else is recorded with its time for the test to judge.
EXPECTED = (Status.OK, Status.NOT_FOUND)


# -- keys and content, the same in ffi-tests/fleet_worker.c ---------------------------------


def mix(z: int) -> int:
    """splitmix64's finaliser (bench/driver_kvtier.c's mix)."""
    z = (z + GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def key_of(index: int, key_seed: int) -> bytes:
    """Key ``index``: four little-endian words mix((seed << 32) ^ (4 i + k)), then group 0
    (a vLLM OffloadKey: a 32-byte block hash and a 4-byte big-endian group index)."""
    words = [mix(((key_seed << 32) ^ (4 * index + k)) & MASK) for k in range(4)]
    return b"".join(w.to_bytes(8, "little") for w in words) + b"\0\0\0\0"


def _seed_of(key: bytes) -> int:
    """FNV-1a 64 of the key's bytes."""
    h = 0xCBF29CE484222325
    for b in key:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


_U = np.uint64
_CONTENT: dict[bytes, np.ndarray] = {}


def content(key: bytes) -> np.ndarray:
    """The block of ``key``: little-endian words mix(fnv1a64(key) + j), j = 0..511."""
    block = _CONTENT.get(key)
    if block is None:
        z = np.arange(BLOCK_BYTES // 8, dtype=_U) + _U(_seed_of(key)) + _U(GOLDEN)
        z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
        z = z ^ (z >> _U(31))
        block = _CONTENT[key] = z.astype("<u8").view(np.uint8)
        block.flags.writeable = False
    return block


# -- output and commands ---------------------------------------------------------------------

_out_lock = threading.Lock()


def emit(event: str, **fields) -> None:
    line = "FLEET " + json.dumps({"event": event, "pid": os.getpid(), **fields}, sort_keys=True)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Commands:
    """Lines from stdin, read by a thread; end of stdin exits the process."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            with self._cond:
                self._lines.append(line.strip())
                self._cond.notify_all()
        os._exit(3)  # the test is gone: leave no process behind

    def has(self, word: str) -> bool:
        with self._cond:
            return word in self._lines

    def wait(self, word: str) -> None:
        """Blocks until ``word`` arrives (or stdin ends, which exits)."""
        with self._cond:
            self._cond.wait_for(lambda: word in self._lines)


class Figures:
    """What one worker saw: every job's one result, every key's status, every load checked."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rounds = 0
        self.loads = 0  # blocks loaded (status OK) and checked
        self.wrong = 0  # of those, blocks with any wrong byte
        self.hits = 0
        self.misses = 0
        self.stores = 0  # keys stored (status OK)
        self.statuses: Counter = Counter()  # per key, by status name (both kinds)
        self.job_statuses: Counter = Counter()
        self.unexpected: list[dict] = []  # keys ending in neither OK nor NotFound
        self.jobs_submitted = 0
        self.duplicate_results = 0
        self.unknown_results = 0
        self.stored: set[int] = set()  # key indices this process stored at least once
        self._last_progress = 0.0

    def key_status(self, status, kind: str, t0: float, t1: float, message: str) -> None:
        name = status.name if isinstance(status, Status) else str(status)
        self.statuses[name] += 1
        if status not in EXPECTED and len(self.unexpected) < 200:
            if len(message) > 600:  # the head names the key, the tail the cause
                message = message[:200] + " ... " + message[-400:]
            self.unexpected.append({"status": name, "kind": kind, "t0": t0, "t1": t1, "message": message})

    def progress(self, force: bool = False, **extra) -> None:
        now = time.monotonic()
        if force or now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            emit("progress", name=self.name, rounds=self.rounds, loads=self.loads, wrong=self.wrong,
                 stores=self.stores, hits=self.hits, misses=self.misses, **extra)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "rounds": self.rounds,
            "loads": self.loads,
            "wrong": self.wrong,
            "hits": self.hits,
            "misses": self.misses,
            "stores": self.stores,
            "statuses": dict(self.statuses),
            "job_statuses": dict(self.job_statuses),
            "unexpected": self.unexpected,
            "jobs_submitted": self.jobs_submitted,
            "duplicate_results": self.duplicate_results,
            "unknown_results": self.unknown_results,
        }


class LibraryJobs:
    """Watches the kvtier.Tier under a worker: every library job's one result, every key's
    status, and the bytes of every key loaded OK, checked in the slot at the moment the
    result is polled (before anything else reads it)."""

    def __init__(self, tier: "kvtier.Tier", pool: np.ndarray, figures: Figures, index_of: dict) -> None:
        self.tier = tier
        self.pool = pool
        self.fig = figures
        self.index_of = index_of
        self.pending: dict[int, tuple] = {}  # job id -> (kind, slots, keys, t0)
        self.seen: set[int] = set()
        self.wrong_keys: list[int] = []
        self._submit_store, self._submit_load, self._poll = tier.submit_store, tier.submit_load, tier.poll
        tier.submit_store = lambda job_id, slots, keys: self._submit("store", job_id, slots, keys)
        tier.submit_load = lambda job_id, slots, keys: self._submit("load", job_id, slots, keys)
        tier.poll = self.poll

    def _submit(self, kind, job_id, slots, keys):
        slots = [int(s) for s in slots]
        keys = [bytes(k) for k in keys]
        self.pending[int(job_id)] = (kind, slots, keys, time.time())
        self.fig.jobs_submitted += 1
        (self._submit_store if kind == "store" else self._submit_load)(job_id, slots, keys)

    def poll(self):
        outcomes = self._poll()
        now = time.time()
        for o in outcomes:
            job = self.pending.pop(o.job_id, None)
            if job is None:
                if o.job_id in self.seen:
                    self.fig.duplicate_results += 1
                else:
                    self.fig.unknown_results += 1
                continue
            self.seen.add(o.job_id)
            kind, slots, keys, t0 = job
            self.fig.job_statuses[getattr(o.status, "name", str(o.status))] += 1
            statuses = o.key_status if len(o.key_status) == len(keys) else (o.status,) * len(keys)
            for slot, key, status in zip(slots, keys, statuses):
                self.fig.key_status(status, kind, t0, now, o.message)
                if status != Status.OK:
                    continue
                index = self.index_of.get(key)
                if kind == "store":
                    self.fig.stores += 1
                    if index is not None:
                        self.fig.stored.add(index)
                else:
                    self.fig.loads += 1
                    if not np.array_equal(self.pool[slot], content(key)):
                        self.fig.wrong += 1
                        self.wrong_keys.append(index)
                        emit("wrong", name=self.fig.name, key=index, where="library load")
        return outcomes

    def missing(self) -> int:
        return len(self.pending)


def worker_start(spec: dict):
    """What every worker starts with: its name, figures, command reader, the fleet's keys
    and each key's index."""
    keys = [key_of(i, spec["key_seed"]) for i in range(spec["keys"])]
    return spec["name"], Figures(spec["name"]), Commands(), keys, {k: i for i, k in enumerate(keys)}


# -- the engine: vLLM's manager over kvtier --------------------------------------------------


def run_engine(spec: dict) -> None:
    from vllm.v1.kv_offload.base import LookupResult, make_offload_key

    from vllm_engine import Engine

    name, fig, commands, keys, index_of = worker_start(spec)
    if spec.get("standby"):
        # A replacement engine: vLLM is imported (the slow part of a start); the engine
        # and its tier are built only once told to start.
        emit("standby", name=name)
        commands.wait("go")
    assert make_offload_key(keys[0][:32], 0) == keys[0], "key layout differs from vLLM's OffloadKey"
    entry = {
        "type": "KvtierTier",
        "module_path": "kvtier.vllm",
        "store_config": spec["store_config"],
        "prefix": spec["prefix"],
        "enable_kv_events": True,
        "locality": "REMOTE",
    }
    engine = Engine([entry], model=spec["model"], num_chunks=spec.get("num_chunks", 32),
                    engine_id=spec["engine_id"])
    (tier,) = engine.tiers
    lib = LibraryJobs(tier.tier, engine.pool, fig, index_of)

    # vLLM's jobs: each exactly one result, through the manager's own calls to the tier.
    vllm_jobs: dict[int, str] = {}
    vllm_seen: set[int] = set()
    vllm_counts = Counter()
    submit_store, submit_load, finished = tier.submit_store, tier.submit_load, tier.get_finished_jobs

    def track(kind, inner):
        def submit(job):
            vllm_jobs[int(job.job_id)] = kind
            vllm_counts["submitted"] += 1
            inner(job)
        return submit

    def get_finished_jobs():
        results = finished()
        for r in results:
            if r.job_id in vllm_jobs:
                del vllm_jobs[r.job_id]
                vllm_seen.add(r.job_id)
                vllm_counts["succeeded" if r.success else "failed"] += 1
            elif r.job_id in vllm_seen:
                vllm_counts["duplicate"] += 1
            else:
                vllm_counts["unknown"] += 1
        return results

    tier.submit_store, tier.submit_load = track("store", submit_store), track("load", submit_load)
    tier.get_finished_jobs = get_finished_jobs
    emit("ready", name=name, namespace=tier.namespace)

    rng = random.Random(spec["rng_seed"])
    batch = spec["batch"]

    def one_request(indices: list[int], req: str) -> tuple[list[int], list[int]]:
        """Looks the keys up as the scheduler does (RETRY until known; HITs promoted into
        the primary tier), checks the bytes of the HITs as the GPU would read them, and
        stores the MISSes (the manager cascades them to kvtier)."""
        wanted = [keys[i] for i in indices]
        verdicts = engine.promote(wanted, req)
        hits = [i for i in indices if verdicts[keys[i]] is LookupResult.HIT]
        misses = [i for i in indices if verdicts[keys[i]] is LookupResult.MISS]
        fig.hits += len(hits)
        fig.misses += len(misses)
        if hits:
            for i, row in zip(hits, engine.read([keys[i] for i in hits], req)):
                if not np.array_equal(row, content(keys[i])):
                    fig.wrong += 1
                    emit("wrong", name=name, key=i, where="primary tier after promotion")
        if misses:
            engine.store(req, {keys[i]: content(keys[i]) for i in misses})
        engine.finish(req)
        engine.settle()
        engine.evict_all()  # the next lookups go to kvtier again
        return hits, misses

    while not commands.has("final"):
        one_request(rng.sample(range(len(keys)), batch), f"{name}-r{fig.rounds}")
        fig.rounds += 1
        fig.progress()
        select.select([], [], [], ROUND_PAUSE_S)
    fig.progress(force=True)

    # The final check: gc and eviction have stopped. Every key this engine stored is looked
    # up in a new request; those that MISS (deleted since) are stored again, and a fresh
    # tier must then load every one of them.
    mine = sorted(fig.stored)
    stored_after_miss: list[int] = []
    final_hits: list[int] = []
    stores_before = fig.stores
    failed_before = sum(n for s, n in fig.statuses.items() if s != "OK")
    for j in range(0, len(mine), batch):
        hits, misses = one_request(mine[j : j + batch], f"{name}-final-{j}")
        final_hits += hits
        stored_after_miss += misses
    failed_in_final = sum(n for s, n in fig.statuses.items() if s != "OK") - failed_before
    stats = tier.kvtier_stats()
    result = fig.as_dict()
    result.update(
        role="engine",
        namespace=tier.namespace,
        final_keys=len(mine),
        final_hits=final_hits,
        stored_after_miss=stored_after_miss,
        final_stores=fig.stores - stores_before,
        final_failed_keys=failed_in_final,
        library_jobs_without_result=lib.missing(),
        vllm_jobs=dict(vllm_counts),
        vllm_jobs_without_result=len(vllm_jobs),
        kvtier_stats=stats,
    )
    engine.shutdown()
    emit("final", **result)
    os._exit(0)  # everything is shut down and reported; skip vLLM's slow interpreter exit


# -- the evictor: a tier with `eviction` beside the engines ----------------------------------


def resolve_all(tier: "kvtier.Tier", req: int, keys: list[bytes]) -> dict[bytes, "kvtier.LookupResult"]:
    """Lookups until every key is HIT or MISS, one schedule_end per step."""
    verdicts: dict[bytes, kvtier.LookupResult] = {}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        for k in keys:
            if k not in verdicts:
                v = tier.lookup(req, k)
                if v is not kvtier.LookupResult.RETRY:
                    verdicts[k] = v
        if len(verdicts) == len(keys):
            return verdicts
        if time.monotonic() > deadline:
            raise RuntimeError(f"lookups never resolved ({len(keys) - len(verdicts)} left)")
        tier.schedule_end()
        select.select([], [], [], 0.002)  # one scheduler step


def wait_jobs(tier: "kvtier.Tier", lib: LibraryJobs) -> None:
    deadline = time.monotonic() + DEADLINE_S
    fd = tier.event_fd()
    while True:
        lib.tier.poll()
        if not lib.pending:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"jobs {sorted(lib.pending)} never finished")
        select.select([fd], [], [], min(remaining, 0.5))


def tier_config(spec: dict, **extra) -> dict:
    """The spec's tier configuration (built by the test with kvtier.vllm.build_tier_config,
    as vLLM's engines build theirs: importing kvtier.vllm here would import vLLM)."""
    config = dict(spec["tier_config"], enable_kv_events=True)
    config.update(extra)
    return config


def run_evictor(spec: dict) -> None:
    name, fig, commands, keys, index_of = worker_start(spec)
    batch = spec["batch"]
    tier = kvtier.Tier(tier_config(spec, eviction=spec["eviction"]))
    pool = np.zeros((batch, BLOCK_BYTES), dtype=np.uint8)
    tier.register_memory(pool)
    lib = LibraryJobs(tier, pool, fig, index_of)
    removed = 0
    emit("ready", name=name)
    rng = random.Random(spec["rng_seed"])
    job = 0
    while not commands.has("stop"):
        indices = rng.sample(range(len(keys)), batch)
        req = fig.rounds + 1
        verdicts = resolve_all(tier, req, [keys[i] for i in indices])
        hits = [i for i in indices if verdicts[keys[i]] is kvtier.LookupResult.HIT]
        fig.hits += len(hits)
        fig.misses += len(indices) - len(hits)
        if hits:
            pool[: len(hits)] = 0
            job += 1
            tier.submit_load(job, list(range(len(hits))), [keys[i] for i in hits])
            wait_jobs(tier, lib)
        tier.request_finished(req)
        removed += sum(len(e.keys) for e in tier.take_events() if e.removed)
        fig.rounds += 1
        fig.progress(evicted=tier.stats()["evicted_blocks"])
        select.select([], [], [], ROUND_PAUSE_S)
    stats = tier.stats()
    removed += sum(len(e.keys) for e in tier.take_events() if e.removed)
    tier.close()  # stops the eviction task
    result = fig.as_dict()
    result.update(role="evictor", evicted_blocks=stats["evicted_blocks"], removed_events=removed,
                  library_jobs_without_result=lib.missing(), kvtier_stats=stats)
    emit("final", **result)


# -- the fresh tier that checks the end state ------------------------------------------------


def run_verify(spec: dict) -> None:
    keys = [key_of(i, spec["key_seed"]) for i in range(spec["keys"])]
    index_of = {k: i for i, k in enumerate(keys)}
    wanted = sorted(set(spec["check"]))
    fig = Figures("verify")
    tier = kvtier.Tier(tier_config(spec))
    batch = 64
    pool = np.zeros((batch, BLOCK_BYTES), dtype=np.uint8)
    tier.register_memory(pool)
    lib = LibraryJobs(tier, pool, fig, index_of)
    found, missing = [], []
    for j in range(0, len(wanted), batch):
        part = wanted[j : j + batch]
        pool[:] = 0
        tier.submit_load(j + 1, list(range(len(part))), [keys[i] for i in part])
        wait_jobs(tier, lib)
        for slot, i in enumerate(part):  # a key that failed left its slot zero
            (found if np.array_equal(pool[slot], content(keys[i])) else missing).append(i)
    tier.close()
    result = fig.as_dict()
    result.update(role="verify", checked=len(wanted), found=len(found), missing=missing,
                  library_jobs_without_result=lib.missing())
    emit("final", **result)


def main() -> None:
    role, spec = sys.argv[1], json.loads(sys.argv[2])
    {"engine": run_engine, "evictor": run_evictor, "verify": run_verify}[role](spec)


if __name__ == "__main__":
    main()
