#!/usr/bin/env python3
"""What a secondary tier costs vLLM's scheduler thread: kvtier's ``KvtierTier`` beside vLLM
0.33's own ``fs`` tier (and, with ``--tiers`` naming them, kvtier on s3s-fs beside vLLM's
``obj`` tier over NIXL on the same s3s-fs), each driven through vLLM's real
``TieringOffloadingManager`` (built by ``TieringOffloadingSpec.get_manager()`` and vLLM's
``SecondaryTierFactory``; python/tests/vllm_engine.py's Engine). One file because it is one
comparison: its workload, its measurement and its result file.

    tools/venv/bin/python bench/scheduler_cost.py                 # kvtier,fs; 3 mixes x 5 reps, ~2 min
    tools/venv/bin/python bench/scheduler_cost.py --tiers kvtier,fs,kvtier-s3,obj
    bench/run.py scheduler                                        # the published run: all four (bench/comparisons.py)

The workload is what one scheduler step asks of the manager. A mix is, per step:

  new_keys    a new request looks up this many keys the manager has not seen: ``in_primary``
              of them are in the CPU primary tier (the previous step's stores), ``in_tier``
              are in the secondary tier only (stored before the run), the rest are absent.
              Every request asks again, each step, the keys it has no final answer for yet
              (RETRY, or HIT_PENDING while a promotion runs), as vLLM's scheduler asks a
              waiting request; a request whose keys are all answered is finished.
  stores      ``store_jobs`` GPU->CPU stores of ``stores/store_jobs`` new keys each
              (``prepare_store`` + ``complete_store``): the manager cascades each to the
              secondary tier as one store job. The request that stored is finished two steps
              later.
  then        ``on_schedule_end`` (the manager collects finished jobs, submits the step's
              promotions as one load job per request, ends the tier's step),
              ``take_events`` (KV events on) and ``get_stats``.

Mixes: ``step`` (64 new keys: 16 in the primary, 16 in the tier, so one 16-block promotion
per step; 32 stores in one job), ``lookup-heavy`` (256 new keys, 16 in the tier, no stores),
``store-heavy`` (8 new keys, absent; 128 stores in 4 jobs). 64 KiB chunks (one block each).

Measured on the scheduler thread only, ``time.thread_time_ns()``:
  step CPU   around every manager call of a step (not the ``--gap-ms`` pause between steps,
             standing for the model's forward pass, in which the tier's own threads work);
             mean and p99 over the measured steps of a run, then the median over runs.
  per call   a separate, instrumented run of each tier: its methods wrapped, the wrapper's own
             cost (measured on an empty function) subtracted; median over calls of
             ``lookup`` (per key), ``submit_store`` (per job), ``submit_load``,
             ``get_finished_jobs`` with nothing finished and with some, ``take_events`` with
             none and with some, ``get_stats``.
  steps      from a key's first lookup to the tier's answer (the manager no longer says
             RETRY), and to HIT (the promotion done).
Runs alternate tiers (kvtier, fs, kvtier, fs...), each on a fresh engine. The ``obj`` tier is
vLLM's own NIXL tier: NIXL's OBJ plugin runs on the CPU (no GPU memory is registered, the CPU
tier's buffers are), so it is measured like the others on the same s3s-fs as ``kvtier-s3``. Writes
``bench/results/scheduler-cost.json``; `python3 bench/report.py` makes its tables. A benchmark:
it prints numbers, nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

RESULTS = os.path.join(common.ROOT, "bench", "results")
CHUNK_BYTES = 64 * 1024
NUM_CHUNKS = 2048
MODEL = "org/sched-model"

MIXES = {
    "step": dict(new_keys=64, in_primary=16, in_tier=16, stores=32, store_jobs=1),
    "lookup-heavy": dict(new_keys=256, in_primary=0, in_tier=16, stores=0, store_jobs=0),
    "store-heavy": dict(new_keys=8, in_primary=0, in_tier=0, stores=128, store_jobs=4),
}
TIERS = ("kvtier", "fs", "kvtier-s3", "obj")
#: The per-call timings, in report order: (name, what).
CALLS = (
    ("lookup", "lookup, per key"),
    ("submit_store", "submit_store, per job"),
    ("submit_load", "submit_load, per job"),
    ("collect_empty", "get_finished_jobs, nothing finished"),
    ("collect", "get_finished_jobs, some finished"),
    ("events_empty", "take_events, none"),
    ("events", "take_events, some"),
    ("get_stats", "get_stats"),
)

log = common.logger("scheduler")


def nixl_as_vllm_imports_it() -> bool:
    """vLLM imports NIXL as ``nixl``; the tools' venv has the real NIXL as ``nixl_cu12``
    (python/tests/test_vllm_obj_interop.py explains why). False without it."""
    try:
        import nixl_cu12
        import nixl_cu12._api
        import nixl_cu12._bindings
    except ImportError:
        return False
    sys.modules.setdefault("nixl", nixl_cu12)
    sys.modules.setdefault("nixl._api", nixl_cu12._api)
    sys.modules.setdefault("nixl._bindings", nixl_cu12._bindings)
    return True


def key_of(name: str) -> bytes:
    from vllm.v1.kv_offload.base import make_offload_key

    return make_offload_key(hashlib.sha256(name.encode()).digest(), 0)


class Rig:
    """Where each tier kind keeps its blocks (one place per kind for the whole run, so the
    keys stored before the runs serve every run), and the tier entry that builds it."""

    def __init__(self, tiers: list[str], workdir: str):
        self.workdir = workdir
        self.server = None
        if any(t in ("kvtier-s3", "obj") for t in tiers):
            self.server = common.Server("s3sfs", root=os.path.join(workdir, "s3sfs"))

    def entry(self, tier: str) -> dict:
        if tier == "kvtier":
            return {"type": "KvtierTier", "module_path": "kvtier.vllm", "enable_kv_events": True,
                    "store_config": {"type": "local", "path": os.path.join(self.workdir, "kvtier")}}
        if tier == "fs":
            return {"type": "fs", "root_dir": os.path.join(self.workdir, "fs"), "enable_kv_events": True}
        store = self.server.store()
        obj = {k: store[k] for k in ("bucket", "endpoint_override", "scheme", "access_key", "secret_key", "region")}
        if tier == "obj":
            return {"type": "obj", "store_config": obj, "prefix": "o", "enable_kv_events": True}
        return {"type": "KvtierTier", "module_path": "kvtier.vllm", "store_config": obj, "prefix": "k",
                "enable_kv_events": True}

    def files(self) -> set[str]:
        """Every file under the working directory (the stores' objects)."""
        return {os.path.join(d, f) for d, _, names in os.walk(self.workdir) for f in names}

    def trim(self, kept: set[str]) -> None:
        """Deletes the files a run stored (everything but ``kept``, the keys stored before the
        runs), untimed: a run of the store-heavy mix writes over a GiB, and the working
        directory is in memory."""
        for path in self.files() - kept:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def engine_for(rig: Rig, tier: str):
    vllm_engine = common.test_support("vllm_engine")
    return vllm_engine.Engine([rig.entry(tier)], block_bytes=CHUNK_BYTES, num_chunks=NUM_CHUNKS, events=True,
                              model=MODEL, max_model_len=1 << 20,
                              engine_id=f"sched-{uuid.uuid4().hex[:12]}")


def prepopulate(rig: Rig, tier: str, keys: list[bytes]) -> None:
    """Stores ``keys`` into the tier (through the manager), so that later engines find them."""
    engine = engine_for(rig, tier)
    try:
        rows = engine.pool
        for g in range(0, len(keys), 64):
            group = keys[g : g + 64]
            stored = engine.store(f"pre-{g}", {k: rows[0] for k in group})
            if stored != group:
                raise RuntimeError(f"{tier}: the primary tier took {len(stored)} of {len(group)} keys")
            engine.finish(f"pre-{g}")
            engine.settle()
        engine.settle()
    finally:
        engine.shutdown()


class CallTimer:
    """Wraps a tier's methods: each call's CPU time on the calling thread (thread_time_ns),
    less the wrapper's own cost."""

    def __init__(self, tier):
        self.samples: dict[str, list[float]] = {name: [] for name, _ in CALLS}
        self.overhead_ns = self._calibrate()
        self._wrap(tier)

    def _calibrate(self) -> float:
        """The median cost of the wrapper around a function that does nothing."""

        def nothing(*_a):
            return ()

        return self._wrapper_overhead(nothing)

    def _wrapper_overhead(self, fn) -> float:
        clock = time.thread_time_ns
        probe: list[float] = []

        def wrapped(*args):
            t0 = clock()
            out = fn(*args)
            probe.append(clock() - t0)
            return out

        for _ in range(20000):
            wrapped(1, 2)
        return statistics.median(probe)

    def _wrap(self, tier) -> None:
        clock = time.thread_time_ns
        samples, over = self.samples, self.overhead_ns

        def timed(name_full, name_empty, fn, materialise=False):
            full, empty = samples[name_full], samples[name_empty] if name_empty else None

            def wrapper(*args):
                t0 = clock()
                out = fn(*args)
                if materialise:
                    out = list(out)
                dt = clock() - t0 - over
                (empty if (empty is not None and not out) else full).append(dt)
                return out

            return wrapper

        tier.lookup = timed("lookup", None, tier.lookup)
        tier.submit_store = timed("submit_store", None, tier.submit_store)
        tier.submit_load = timed("submit_load", None, tier.submit_load)
        tier.get_finished_jobs = timed("collect", "collect_empty", tier.get_finished_jobs, True)
        tier.take_events = timed("events", "events_empty", tier.take_events, True)
        tier.get_stats = timed("get_stats", None, tier.get_stats)

    def summary(self) -> dict:
        return {name: {"calls": len(v), "median_us": round(statistics.median(v) / 1000, 3) if v else None,
                       "mean_us": round(statistics.fmean(v) / 1000, 3) if v else None}
                for name, v in self.samples.items()}


def run_one(rig: Rig, tier: str, mix: dict, present: list[bytes], args, instrument: bool = False) -> dict:
    """One run of ``mix`` on a fresh engine of ``tier``: per-step scheduler CPU, and with
    ``instrument`` the per-call timings."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

    HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
    engine = engine_for(rig, tier)
    manager = engine.manager
    (sec,) = engine.tiers
    timer = CallTimer(sec) if instrument else None
    salt = uuid.uuid4().hex[:8]
    steps = args.warmup + args.steps
    per_step_ns: list[int] = []
    answer_steps: list[int] = []  # first ask -> the tier answered (not RETRY)
    hit_steps: list[int] = []  # first ask of a key in the tier -> HIT (promotion done)
    active: list[list] = []  # [req_id, ctx, {key: first step}, {key: answered step}]
    writers: list[tuple[int, ReqContext]] = []
    last_stored: list[bytes] = []
    present_at = 0
    refused = 0
    clock = time.thread_time_ns
    per_job = mix["stores"] // mix["store_jobs"] if mix["store_jobs"] else 0
    try:
        for s in range(steps):
            # the step's keys, made before the clock starts
            fresh = [key_of(f"{salt}-a-{s}-{i}") for i in range(mix["new_keys"] - mix["in_primary"] - mix["in_tier"])]
            in_tier = present[present_at : present_at + mix["in_tier"]]
            present_at += mix["in_tier"]
            ask = last_stored[: mix["in_primary"]] + in_tier + fresh
            store_keys = [[key_of(f"{salt}-w-{s}-{j}-{i}") for i in range(per_job)] for j in range(mix["store_jobs"])]
            new_req = f"r{s}"
            in_tier_set = set(in_tier)
            t0 = clock()
            ctx = ReqContext(req_id=new_req)
            manager.on_new_request(ctx)
            active.append([new_req, ctx, dict.fromkeys(ask, s), {}, in_tier_set, set(last_stored[: mix["in_primary"]])])
            still = []
            for entry in active:
                req_id, rctx, waiting, answered, tier_keys, primary_keys = entry
                for key in list(waiting):
                    verdict = manager.lookup(key, rctx)
                    if verdict is RETRY:
                        continue
                    if key not in answered:
                        answered[key] = s
                    if verdict is HIT or verdict is MISS:
                        first = waiting.pop(key)
                        if s >= args.warmup and key not in primary_keys:
                            answer_steps.append(answered[key] - first)
                            if key in tier_keys:
                                hit_steps.append(s - first)
                if waiting:
                    still.append(entry)
                else:
                    manager.on_request_finished(rctx)
            active = still
            wctx = None
            if per_job:
                wctx = ReqContext(req_id=f"w{s}")
                manager.on_new_request(wctx)
                stored_now = []
                for keys in store_keys:
                    out = manager.prepare_store(keys, wctx)
                    if out is None:
                        refused += 1
                        continue
                    took = list(out.keys_to_store)
                    manager.complete_store(took, wctx, success=True)
                    stored_now += took
                last_stored = stored_now
            done = [w for w in writers if w[0] <= s - 2]
            for _, w in done:
                manager.on_request_finished(w)
            writers = [w for w in writers if w[0] > s - 2]
            if wctx is not None:
                writers.append((s, wctx))
            manager.on_schedule_end(ScheduleEndContext(new_req_ids=[new_req], preempted_req_ids=()))
            for _ in manager.take_events():
                pass
            manager.get_stats()
            t1 = clock()
            if s >= args.warmup:
                per_step_ns.append(t1 - t0)
            time.sleep(args.gap_ms / 1000)  # the model's forward pass: the tier's threads work
        if present_at > len(present):
            raise RuntimeError("not enough keys stored before the run")
    finally:
        engine.shutdown()
    ordered = sorted(per_step_ns)
    out = {
        "step_cpu_us_mean": statistics.fmean(per_step_ns) / 1000,
        "step_cpu_us_p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] / 1000,
        "steps_to_answer_mean": statistics.fmean(answer_steps) if answer_steps else None,
        "steps_to_answer_max": max(answer_steps) if answer_steps else None,
        "steps_to_hit_mean": statistics.fmean(hit_steps) if hit_steps else None,
        "refused_stores": refused,
    }
    if timer is not None:
        out["calls"] = timer.summary()
    return out


def median_of(runs: list[dict], field: str):
    values = [r[field] for r in runs if r.get(field) is not None]
    return round(statistics.median(values), 3) if values else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiers", default="kvtier,fs", help=f"comma-separated, of {','.join(TIERS)}")
    ap.add_argument("--mixes", default=",".join(MIXES), help=f"comma-separated, of {','.join(MIXES)}")
    ap.add_argument("--reps", type=int, default=5, help="runs of each tier and mix (interleaved)")
    ap.add_argument("--steps", type=int, default=150, help="measured steps of a run")
    ap.add_argument("--warmup", type=int, default=20, help="steps of a run before the measured ones")
    ap.add_argument("--gap-ms", type=float, default=4.0, help="pause between steps (the model's forward pass)")
    ap.add_argument("--name", default="scheduler-cost", help="result file bench/results/NAME.json")
    ap.add_argument("--label", default="", help="what this run measured (e.g. the code it ran), kept in the file")
    ap.add_argument("--no-calls", action="store_true", help="skip the instrumented per-call runs")
    args = ap.parse_args(argv)
    tiers = [t for t in args.tiers.split(",") if t]
    mixes = [m for m in args.mixes.split(",") if m]
    for t in tiers:
        if t not in TIERS:
            ap.error(f"unknown tier {t!r}")
    for m in mixes:
        if m not in MIXES:
            ap.error(f"unknown mix {m!r}")
    common.use_package()
    if "obj" in tiers and not nixl_as_vllm_imports_it():
        ap.error("the obj tier needs nixl-cu12 (scripts/install-tools.sh installs it)")
    import kvtier  # noqa: F401  (the checkout's package, the library it loads)

    workdir = tempfile.mkdtemp(prefix="kvtier-sched-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    rig = Rig(tiers, workdir)
    results = []
    try:
        need = max(MIXES[m]["in_tier"] for m in mixes) * (args.warmup + args.steps)
        present = [key_of(f"present-{i}") for i in range(need)]
        for t in tiers:
            log(f"{t}: storing {need} chunks before the runs")
            prepopulate(rig, t, present)
        kept = rig.files()
        for m in mixes:
            runs: dict[str, list[dict]] = {t: [] for t in tiers}
            for rep in range(args.reps):
                for t in (tiers if rep % 2 == 0 else tiers[::-1]):
                    r = run_one(rig, t, MIXES[m], present, args)
                    rig.trim(kept)
                    runs[t].append(r)
                    log(f"{m} {t} rep {rep}: {r['step_cpu_us_mean']:.0f} us/step (p99 {r['step_cpu_us_p99']:.0f}), "
                        f"answer in {r['steps_to_answer_mean']} steps")
            calls = {}
            if not args.no_calls:
                for t in tiers:
                    calls[t] = run_one(rig, t, MIXES[m], present, args, instrument=True)["calls"]
                    rig.trim(kept)
            for t in tiers:
                results.append({
                    "mix": m, "tier": t, "reps": len(runs[t]),
                    "step_cpu_us_mean": median_of(runs[t], "step_cpu_us_mean"),
                    "step_cpu_us_p99": median_of(runs[t], "step_cpu_us_p99"),
                    "steps_to_answer_mean": median_of(runs[t], "steps_to_answer_mean"),
                    "steps_to_answer_max": max((r["steps_to_answer_max"] or 0) for r in runs[t]),
                    "steps_to_hit_mean": median_of(runs[t], "steps_to_hit_mean"),
                    "refused_stores": sum(r["refused_stores"] for r in runs[t]),
                    "runs_step_cpu_us_mean": [round(r["step_cpu_us_mean"], 1) for r in runs[t]],
                    "calls": calls.get(t),
                })
    finally:
        rig.stop()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "name": args.name,
        "label": args.label,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git": common.git_rev(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "vllm": __import__("vllm").__version__,
        "settings": {"chunk_bytes": CHUNK_BYTES, "steps": args.steps, "warmup": args.warmup, "reps": args.reps,
                     "gap_ms": args.gap_ms, "mixes": {m: MIXES[m] for m in mixes}, "tiers": tiers},
        "results": results,
    }
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{args.name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    for r in results:
        log(f"{r['mix']:>13} {r['tier']:>9}: {r['step_cpu_us_mean']} us/step mean, p99 {r['step_cpu_us_p99']}; "
            f"lookup {((r['calls'] or {}).get('lookup') or {}).get('median_us')} us/key")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
