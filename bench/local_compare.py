#!/usr/bin/env python3
"""kvtier's local-directory store side by side with vLLM 0.33's own ``fs`` tier and a naive
Python loop, on the same disk, with the same keys and the same bytes. One file because it is
one comparison: its columns, their runs on one engine setup, and its report.

    tools/venv/bin/python bench/local_compare.py            # 256K,2M x 256 MiB x 5 reps, ~2-4 min on 2 cores
    tools/venv/bin/python bench/local_compare.py --sizes 256K,2M,16M --reps 3
    bench/run.py local                                      # the published run (bench/comparisons.py)

Columns (each stores N = mib/size chunks, looks up the N stored keys and N absent ones, loads
the N stored chunks back and compares every byte):

  fs-buf         vLLM's ``fs`` tier (``FileSystemTierManager``), built by vLLM's factory and
                 driven through vLLM's ``TieringOffloadingManager``, buffered. vLLM 0.33 has no
                 configuration key for this: the tier calls ``probe_o_direct(dir)`` once and
                 uses buffered I/O only where the probe fails. This column makes the probe
                 answer False (vLLM's own fallback path) and changes nothing else.
  fs-direct      the same tier as configured by default: O_DIRECT when the probe succeeds.
  kvtier-buf     kvtier's ``KvtierTier`` (``module_path`` ``kvtier.vllm``) on
                 ``{"type": "local", "path": ...}``, through the same manager and workload.
  kvtier-direct  the same with ``"o_direct": true``.
  naive          one Python thread: makedirs, write to a temporary name, rename; ``readinto``
                 a preallocated buffer; ``os.path.exists``.
  kvtier-cli     ``kvtier bench --block-size S --blocks N --json`` on a local store under the
                 same root (the CLI's own workload: one key per job, 16 jobs in flight).
  kvtier-buf-nocrc, kvtier-direct-nocrc
                 diagnostics: kvtier with ``"checksums": false`` (vLLM's fs tier keeps none).

Timing through vLLM's manager (this script plays the GPU worker and the scheduler):
  store   chunks are put into the CPU primary tier untimed (prepare_store + copy); timed is
          ``complete_store`` of every job (vLLM cascades each job to the secondary tier) until
          the tier's ``drain_jobs()`` returns.
  lookup  the primary tier is emptied (``reset_cache``), then scheduler passes: every unanswered
          key is looked up, the step ends (``on_schedule_end``), ``--step-ms`` of "model
          execution" pass. Lookup passes = passes until every key was answered (HIT_PENDING or
          HIT for stored keys, MISS for absent ones). Stored keys start promotions; those
          loads are verified but not timed.
  load    the primary tier is emptied again; new requests ask for the stored keys, which the
          tier answers from the verdicts it still holds (vLLM shares them between requests),
          so all promotions go out at one step: timed from that step until ``drain_jobs()``.
  exists  a 256-key batch (min(N,128) stored keys, the rest absent) asked of the tier directly
          (``lookup`` per key, ``on_schedule_end``, polled every 0.2 ms) until every key is
          answered; median over --exist-reps batches.
CPU = user+sys of this whole process (every thread, the libraries' included) over the timed
part, ``getrusage(RUSAGE_SELF)``, per GiB moved; the CLI reports its own process's the same
way. Per-thread-group CPU comes from /proc/self/task/*/schedstat.
Loads read what was just stored: hot in the page cache for every buffered column alike
(O_DIRECT bypasses it by design). After each column: ``sync``, its files dropped from the page
cache, kept on disk until the run ends (see ``retire_dir``).

Writes ``bench/results/<name>.md`` and ``.jsonl`` (default name ``local-latest``). A benchmark:
it prints numbers, nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import datetime as _dt
import hashlib
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import common
from common import cpu_now, fmt, fs_type, loadavg, median, parse_size, ratio, size_label

REPO = Path(common.ROOT)
DEFAULT_ROOT = REPO / "target" / "bench-local"
RESULTS = Path(common.RESULTS)
# The last two are diagnostics: kvtier with its CRC32C checksums off (vLLM's fs tier has none),
# to show what the checksums cost.
ALL_COLUMNS = ("fs-buf", "fs-direct", "kvtier-buf", "kvtier-direct", "naive", "kvtier-cli", "kvtier-buf-nocrc", "kvtier-direct-nocrc")
DEFAULT_COLUMNS = ALL_COLUMNS
EXIST_BATCH = 256
# `kvtier bench` waits on its ready fd (poll, 100 ms timeout) once more after the last result
# of a store or load phase, so each phase's time includes 100 ms of idling (seen with strace:
# the last poll returns 0 after 0.100 s; a 2-block phase takes 0.10 s). The "-adj" row
# subtracted it; CPU is unaffected. The CLI now stops waiting once a phase's last result is
# in, so there is no tail and no "-adj" row (set this back to 0.100 to measure an older CLI).
CLI_IDLE_TAIL_S = 0.0
DEADLINE_S = 120.0



# ---------------------------------------------------------------------------------------------
# Small helpers


def fresh_dir(root: Path, label: str) -> Path:
    path = root / f"{label}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


RETIRED: list[Path] = []


def retire_dir(path: Path, keep: bool) -> None:
    """Ends a column's use of its store directory without disturbing the next column: dirty
    pages are written back (sync) and every file's pages dropped from the page cache
    (POSIX_FADV_DONTNEED), so no column inherits another's dirty pages, writeback or cache.
    With ``keep`` the files stay until the end of the run: deleting thousands of inodes makes
    ext4 skip them as "recently deleted" when it allocates inodes for the next ~30 s
    (``find_inode_bit`` -> ``recently_deleted``, seen with perf), which taxed whichever
    column came next. Without ``keep`` (not enough free disk) they are deleted now."""
    os.sync()
    if not keep:
        shutil.rmtree(path, ignore_errors=True)
        return
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    RETIRED.append(path)


def remove_retired() -> None:
    while RETIRED:
        shutil.rmtree(RETIRED.pop(), ignore_errors=True)


# Page-cache residency of files (mincore over a PROT_READ mapping: nothing is faulted in), to
# show whether a store really bypassed the page cache.
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident_fraction(paths: list[str]) -> float | None:
    page = mmap.PAGESIZE
    total = resident = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                continue
            try:
                pages = (size + page - 1) // page
                vec = ctypes.create_string_buffer(pages)
                if _libc.mincore(addr, size, vec) == 0:
                    total += pages
                    resident += sum(b & 1 for b in vec.raw)
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / total if total else None


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every thread of this process: tid -> (name, seconds), from
    /proc/self/task/<tid>/schedstat (time on CPU, ns). Python threads are named by their
    ``threading`` names (Python 3.11 does not name OS threads), the others by their comm."""
    import threading

    py_names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            out[int(tid)] = (py_names.get(int(tid), name), ns / 1e9)
    return out


def thread_group(tid: int, name: str) -> str:
    if tid == os.getpid():
        return "main (scheduler)"
    if name.startswith("vllm_kv_py_fs"):
        return "vLLM fs I/O threads"
    if name.startswith("vllm_offloading_lookup") or name.startswith("vllm_offloadin"):
        return "vLLM lookup thread"
    if name.startswith("kvtier-lookup"):
        return "kvtier lookup lane"
    if name.startswith("kvtier"):
        return "kvtier I/O runtime"
    return "other threads"


def thread_cpu_delta(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per thread group between two thread_cpu() snapshots (threads that started
    in between count whole; threads that ended in between are missed)."""
    groups: dict[str, float] = {}
    for tid, (name, secs) in after.items():
        grown = secs - before.get(tid, (name, 0.0))[1]
        if grown > 0:
            key = thread_group(tid, before.get(tid, (name, 0.0))[0] if tid in before else name)
            groups[key] = round(groups.get(key, 0.0) + grown, 3)
    return groups


def all_files(root: Path, suffix: str = ".bin") -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out.extend(os.path.join(dirpath, f) for f in files if f.endswith(suffix))
    return out


# ---------------------------------------------------------------------------------------------
# vLLM's offloading side, built by vLLM's own code: python/tests/vllm_engine.py's Engine,
# at the benchmark's chunk size, stepping as a scheduler does


def Engine(tier_entry: dict, chunk_bytes: int, num_chunks: int):
    """vLLM's TieringOffloadingManager of one engine (CPU primary tier + the secondary tier of
    ``tier_entry``), built through ``TieringOffloadingSpec.get_manager()`` and vLLM's
    SecondaryTierFactory, one GPU block of ``chunk_bytes`` a chunk (vllm_engine.Engine, loaded
    once vLLM and the kvtier snapshot are set up)."""
    vllm_engine = common.test_support("vllm_engine")

    class BenchEngine(vllm_engine.Engine):
        def __init__(self) -> None:
            super().__init__([tier_entry], block_bytes=chunk_bytes, num_chunks=num_chunks, events=False,
                             model="org/bench-model", max_model_len=1 << 20,
                             engine_id=f"kvtier-bench-{uuid.uuid4().hex[:12]}")
            (self.tier,) = self.tiers

        def step(self) -> None:
            """The end of one scheduler step; events are dropped, not kept."""
            from vllm.v1.kv_offload.base import ScheduleEndContext

            self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
            for _ in self.manager.take_events():
                pass

        def finish(self, req_id: str) -> None:
            if req_id in self._known_requests:
                super().finish(req_id)

        def settle(self) -> None:
            """Steps, 1 ms apart, until the tier has no work in flight and the manager tracks
            no transfer."""
            deadline = time.monotonic() + DEADLINE_S
            while self.tier.has_pending_work() or self.manager._transfer_jobs:
                if time.monotonic() > deadline:
                    raise RuntimeError("the tier never settled")
                self.step()
                time.sleep(0.001)
            self.step()

    return BenchEngine()


def chunk_keys(tag: str, count: int) -> list[bytes]:
    """vLLM OffloadKeys: a SHA-256 block hash (vLLM's default hash) and group 0."""
    from vllm.v1.kv_offload.base import make_offload_key

    return [make_offload_key(hashlib.sha256(f"{tag}-{i}".encode()).digest(), 0) for i in range(count)]


def object_name(key: bytes) -> str:
    """vLLM's and kvtier's name of a key's block, below the namespace directory."""
    hexed = key[:-4].hex()
    group = int.from_bytes(key[-4:], "big")
    return f"{hexed[:3]}/{hexed[3:5]}_g{group}/{hexed}.bin"


def groups_of(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def scheduler_passes(engine, asked: list, step_s: float) -> dict:
    """Scheduler passes over ``asked`` ((key, req_id, present) triples) until every key has an
    answer that is not RETRY: each pass looks up every unanswered key through the manager,
    then ends the step (``on_schedule_end`` flushes lookups and promotions to the tier), then
    sleeps ``step_s`` (the model's execution). Afterwards waits for the tier to drain."""
    from vllm.v1.kv_offload.base import LookupResult

    contexts = {req: engine.ctx(req) for _, req, _ in asked}
    answers: dict[bytes, object] = {}
    pending = list(asked)
    out = {"passes": 0, "promo_t": None, "promo_c": None}
    t0 = time.perf_counter()
    deadline = time.monotonic() + DEADLINE_S
    while True:
        out["passes"] += 1
        still = []
        promoted = False
        for key, req, present in pending:
            verdict = engine.manager.lookup(key, contexts[req])
            if verdict is LookupResult.RETRY:
                still.append((key, req, present))
                continue
            answers[key] = verdict
            promoted = promoted or verdict is LookupResult.HIT_PENDING
        pending = still
        if not pending:
            out["answered_s"] = time.perf_counter() - t0
        ts, cs = time.perf_counter(), cpu_now()
        engine.step()  # flushes this pass's lookups and promotions to the tier
        if promoted and out["promo_t"] is None:
            out["promo_t"], out["promo_c"] = ts, cs
        if not pending:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} lookups never answered")
        time.sleep(step_s)
    engine.tier.drain_jobs()
    out["drained_t"], out["drained_c"] = time.perf_counter(), cpu_now()
    out["answers"] = answers
    return out


def verify_promoted(engine, load_groups: list, src, index: dict) -> int:
    """Steps until every promoted chunk is a primary HIT, then reads each back as the GPU
    worker would (prepare_load / complete_load) and compares every byte. Returns mismatches."""
    import numpy as np
    from vllm.v1.kv_offload.base import LookupResult

    contexts = {req: engine.ctx(req) for req, _ in load_groups}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        waiting = [k for req, group in load_groups for k in group if engine.manager.lookup(k, contexts[req]) is not LookupResult.HIT]
        if not waiting:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(waiting)} promotions never became HITs")
        engine.step()
        time.sleep(0.001)
    mismatched = 0
    for req, group in load_groups:
        spec = engine.manager.prepare_load(group, contexts[req])
        for key, slot in zip(group, spec.chunk_ids):
            if not np.array_equal(engine.pool[slot], src[index[key]]):
                mismatched += 1
        engine.manager.complete_load(group, contexts[req])
    return mismatched


def run_manager_column(column: str, args, point: dict, src, keys: list[bytes], absent: list[bytes], workdir: Path) -> dict:
    """One repetition of one vLLM-driven column: store, lookups + loads, existence batches."""
    import numpy as np
    from vllm.v1.kv_offload.base import LookupResult
    from vllm.v1.kv_offload.tiering.fs import manager as fs_manager

    size, count = point["size"], point["count"]
    if column.startswith("fs-"):
        entry = {"type": "fs", "root_dir": str(workdir)}
    else:
        store = {"type": "local", "path": str(workdir)}
        if column.startswith("kvtier-direct"):
            store["o_direct"] = True
        if column.endswith("-nocrc"):
            store["checksums"] = False  # a tier key: the adapter moves it out of the store section
        entry = {"type": "KvtierTier", "module_path": "kvtier.vllm", "store_config": store}

    original_probe = fs_manager.probe_o_direct
    if column == "fs-buf":
        fs_manager.probe_o_direct = lambda directory: False  # vLLM's fallback path: buffered I/O
    try:
        engine = Engine(entry, size, count + 2)
    finally:
        fs_manager.probe_o_direct = original_probe
    result: dict = {"ok": True, "errors": []}
    try:
        if column.startswith("fs-"):
            result["o_direct_in_use"] = bool(engine.tier._use_o_direct)
        tier = engine.tier
        index = {k: i for i, k in enumerate(keys)}
        kpj = args.keys_per_job

        # -- store: chunks into the primary tier (untimed), then complete_store -> cascades
        jobs = []
        for g, group in enumerate(groups_of(keys, kpj)):
            context = engine.ctx(f"store-{g}")
            out = engine.manager.prepare_store(group, context)
            if out is None or list(out.keys_to_store) != group:
                raise RuntimeError("the primary tier refused the store")
            for key, slot in zip(group, out.store_spec.chunk_ids):
                engine.pool[slot] = src[index[key]]
            jobs.append((group, context))
        th0 = thread_cpu()
        t0, c0 = time.perf_counter(), cpu_now()
        for group, context in jobs:
            engine.manager.complete_store(group, context, success=True)
        tier.drain_jobs()
        t1, c1 = time.perf_counter(), cpu_now()
        result["store_threads"] = thread_cpu_delta(th0, thread_cpu())
        result["store_s"], result["store_cpu_s"] = t1 - t0, c1 - c0
        engine.settle()
        for g in range(len(jobs)):
            engine.finish(f"store-{g}")
        engine.step()
        files = all_files(workdir)
        result["files_after_store"] = len(files)
        result["resident_after_store"] = resident_fraction(files[: args.residency_sample])

        # -- empty the primary tier (vLLM's reset_cache): later lookups go to the tier
        engine.manager.reset_cache()
        engine.manager.on_reset_flushed()
        engine.step()

        # -- lookups of every key (stored and absent), one request per job of keys: passes of
        #    the scheduler until each is answered. A present key starts its promotion
        #    (secondary -> primary) as vLLM does; those loads are verified but not timed here.
        asked = []  # (key, req_id, present)
        for g, group in enumerate(groups_of(keys, kpj)):
            asked += [(k, f"look-{g}", True) for k in group]
        for g, group in enumerate(groups_of(absent, kpj)):
            asked += [(k, f"absent-{g}", False) for k in group]
        look = scheduler_passes(engine, asked, args.step_ms / 1000.0)
        result["lookup_passes"] = look["passes"]
        result["lookup_all_s"] = look["answered_s"]
        result["lookup_keys"] = len(asked)
        wrong = [k for k, _, present in asked if present and look["answers"].get(k) is LookupResult.MISS]
        wrong += [k for k, _, present in asked if not present and look["answers"].get(k) is not LookupResult.MISS]
        if wrong:
            result["ok"] = False
            result["errors"].append(f"{len(wrong)} wrong lookup answers")
        mismatched = verify_promoted(engine, [(f"look-{g}", group) for g, group in enumerate(groups_of(keys, kpj))], src, index)

        # -- the timed load: the primary tier emptied again (reset_cache); new requests ask for
        #    the stored keys, which the tier answers from the verdicts it still holds for the
        #    lookup requests (vLLM shares them between requests), so every promotion is
        #    submitted at one step: timed from that step until drain_jobs() returns.
        engine.manager.reset_cache()
        engine.manager.on_reset_flushed()
        engine.step()
        load_asked = []
        for g, group in enumerate(groups_of(keys, kpj)):
            load_asked += [(k, f"load-{g}", True) for k in group]
        th0 = thread_cpu()
        load = scheduler_passes(engine, load_asked, args.step_ms / 1000.0)
        result["load_threads"] = thread_cpu_delta(th0, thread_cpu())  # includes the lookup pass
        result["load_passes"] = load["passes"]
        if load["promo_t"] is None:
            raise RuntimeError("no promotion started")
        result["load_s"], result["load_cpu_s"] = load["drained_t"] - load["promo_t"], load["drained_c"] - load["promo_c"]
        mismatched += verify_promoted(engine, [(f"load-{g}", group) for g, group in enumerate(groups_of(keys, kpj))], src, index)
        if mismatched:
            result["ok"] = False
            result["errors"].append(f"{mismatched} chunks loaded wrong bytes")
        result["verified_chunks"] = 2 * count - mismatched
        for _, req, _ in asked + load_asked:
            engine.finish(req)
        engine.settle()

        # -- 256-key existence batches asked of the tier (no promotion): latency per batch
        from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext

        present_part = keys[: min(count, EXIST_BATCH // 2)]
        latencies, batch_passes = [], []
        for r in range(args.exist_reps):
            extra = chunk_keys(f"{point['tag']}-{column}-exists-{r}", EXIST_BATCH - len(present_part))
            batch = present_part + extra
            context = ReqContext(req_id=f"exists-{r}")
            tier.on_new_request(context)
            end_ctx = ScheduleEndContext(new_req_ids=[], preempted_req_ids=())
            t0 = time.perf_counter()
            verdicts = {k: tier.lookup(k, context) for k in batch}
            tier.on_schedule_end(end_ctx)
            polls = 1
            deadline = time.monotonic() + DEADLINE_S
            while any(v is LookupResult.RETRY for v in verdicts.values()):
                if time.monotonic() > deadline:
                    raise RuntimeError("an existence batch never answered")
                time.sleep(0.0002)
                polls += 1
                for k, v in verdicts.items():
                    if v is LookupResult.RETRY:
                        verdicts[k] = tier.lookup(k, context)
                tier.on_schedule_end(end_ctx)
            latencies.append(time.perf_counter() - t0)
            batch_passes.append(polls)
            hits = sum(v is LookupResult.HIT for v in verdicts.values())
            if hits != len(present_part):
                result["ok"] = False
                result["errors"].append(f"existence batch: {hits} HITs, expected {len(present_part)}")
            tier.on_request_finished(context)
        result["exists_s"] = median(latencies)
        result["exists_present"] = len(present_part)
        result["exists_polls"] = median(batch_passes)
        if column.startswith("kvtier"):
            stats = tier.kvtier_stats()
            result["kvtier_stats"] = {k: stats[k] for k in ("keys_stored", "keys_loaded", "corrupt_blocks", "keys_failed")}
    finally:
        engine.shutdown()
    return result


# ---------------------------------------------------------------------------------------------
# The naive loop


def run_naive(args, point: dict, src, keys: list[bytes], absent: list[bytes], workdir: Path) -> dict:
    import numpy as np

    size, count = point["size"], point["count"]
    src_mv = memoryview(src.reshape(-1))
    dst = np.empty((count, size), dtype=np.uint8)
    dst.fill(0xA5)  # preallocated and pre-faulted (np.zeros would map lazily), untimed
    dst_mv = memoryview(dst.reshape(-1))
    root = str(workdir)
    result: dict = {"ok": True, "errors": []}

    t0, c0 = time.perf_counter(), cpu_now()
    for i, key in enumerate(keys):
        path = os.path.join(root, object_name(key))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb", buffering=0) as f:
            view = src_mv[i * size : (i + 1) * size]
            written = 0
            while written < size:
                written += f.write(view[written:])
        os.rename(tmp, path)
    t1, c1 = time.perf_counter(), cpu_now()
    result["store_s"], result["store_cpu_s"] = t1 - t0, c1 - c0
    files = all_files(workdir)
    result["files_after_store"] = len(files)
    result["resident_after_store"] = resident_fraction(files[: args.residency_sample])

    # lookups of every key: synchronous, one pass
    t0 = time.perf_counter()
    found = [os.path.exists(os.path.join(root, object_name(k))) for k in keys + absent]
    result["lookup_all_s"] = time.perf_counter() - t0
    result["lookup_passes"] = 1
    result["lookup_keys"] = len(found)
    if found != [True] * len(keys) + [False] * len(absent):
        result["ok"] = False
        result["errors"].append("wrong lookup answers")

    t0, c0 = time.perf_counter(), cpu_now()
    for i, key in enumerate(keys):
        with open(os.path.join(root, object_name(key)), "rb", buffering=0) as f:
            view = dst_mv[i * size : (i + 1) * size]
            got = 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
        if got != size:
            raise RuntimeError(f"short read: {got} of {size}")
    t1, c1 = time.perf_counter(), cpu_now()
    result["load_s"], result["load_cpu_s"] = t1 - t0, c1 - c0
    mismatched = count - int(sum(np.array_equal(dst[i], src[i]) for i in range(count)))
    if mismatched:
        result["ok"] = False
        result["errors"].append(f"{mismatched} chunks loaded wrong bytes")
    result["verified_chunks"] = count - mismatched

    present_part = keys[: min(count, EXIST_BATCH // 2)]
    latencies = []
    for r in range(args.exist_reps):
        batch = present_part + chunk_keys(f"{point['tag']}-naive-exists-{r}", EXIST_BATCH - len(present_part))
        t0 = time.perf_counter()
        answers = [os.path.exists(os.path.join(root, object_name(k))) for k in batch]
        latencies.append(time.perf_counter() - t0)
        if sum(answers) != len(present_part):
            result["ok"] = False
            result["errors"].append("existence batch: wrong answers")
    result["exists_s"] = median(latencies)
    result["exists_present"] = len(present_part)
    result["exists_polls"] = 1
    return result


# ---------------------------------------------------------------------------------------------
# The Rust CLI


def run_cli(args, point: dict, workdir: Path, cli: Path) -> dict:
    size, count = point["size"], point["count"]
    try:
        report = common.kvtier_bench({"store": {"type": "local", "path": str(workdir / "main")}},
                                     "--block-size", str(size), "--blocks", str(count), cli=str(cli), timeout=600)
    except RuntimeError as exc:
        return {"ok": False, "errors": [str(exc)[-300:]]}
    phases = common.phases(report)
    result: dict = {"ok": report.get("verified_blocks") == count and report.get("corrupt_blocks", 0) == 0, "errors": []}
    if not result["ok"]:
        result["errors"].append(f"verified {report.get('verified_blocks')} of {count} blocks")
    result["store_s"] = phases["store"]["seconds"]
    result["store_cpu_s"] = phases["store"]["cpu_seconds"]
    result["load_s"] = phases["load"]["seconds"]
    result["load_cpu_s"] = phases["load"]["cpu_seconds"]
    result["lookup_all_s"] = phases["exists"]["seconds"]
    result["lookup_keys"] = report.get("existence_checks")
    result["verified_chunks"] = report.get("verified_blocks")
    result["cli_report"] = report
    # A 256-key existence batch as the CLI asks it: 128 stored 4 KiB blocks + 128 absent keys.
    latencies = []
    for r in range(args.exist_reps):
        with contextlib.suppress(RuntimeError):
            ex = common.kvtier_bench({"store": {"type": "local", "path": str(workdir / f"exists-{r}")}},
                                     "--block-size", "4K", "--blocks", str(EXIST_BATCH // 2), "--workload", "store,exists",
                                     cli=str(cli), timeout=600)
            latencies.append(common.phases(ex)["exists"]["seconds"])
    result["exists_s"] = median(latencies)
    result["exists_present"] = EXIST_BATCH // 2
    return result


# ---------------------------------------------------------------------------------------------
# Report


def derived(r: dict, size: int, count: int) -> dict:
    gib = size * count / (1 << 30)
    mib = size * count / (1 << 20)
    out = dict(r)
    if r.get("store_s"):
        out["store_mib_s"] = mib / r["store_s"]
        out["store_cpu_s_per_gib"] = r["store_cpu_s"] / gib
    if r.get("load_s"):
        out["load_mib_s"] = mib / r["load_s"]
        out["load_cpu_s_per_gib"] = r["load_cpu_s"] / gib
    return out


def summarize(records: list[dict], column: str, size: int) -> dict | None:
    rows = [r for r in records if r.get("column") == column and r.get("size") == size]
    if not rows:
        return None

    def spread(name):
        vals = [r[name] for r in rows if r.get(name) is not None]
        return (median(vals), min(vals), max(vals)) if vals else (None, None, None)

    return {
        "n": len(rows),
        "ok": all(r.get("ok") for r in rows),
        "errors": sorted({e for r in rows for e in r.get("errors", [])}),
        "store_mib_s": spread("store_mib_s"),
        "load_mib_s": spread("load_mib_s"),
        "store_cpu": median([r.get("store_cpu_s_per_gib") for r in rows]),
        "load_cpu": median([r.get("load_cpu_s_per_gib") for r in rows]),
        "exists_ms": None if median([r.get("exists_s") for r in rows]) is None else 1000 * median([r.get("exists_s") for r in rows]),
        "exists_present": rows[0].get("exists_present"),
        "passes": median([r.get("lookup_passes") for r in rows]),
        "lookup_all_ms": None if median([r.get("lookup_all_s") for r in rows]) is None else 1000 * median([r.get("lookup_all_s") for r in rows]),
        "lookup_keys": rows[0].get("lookup_keys"),
        "resident": median([r.get("resident_after_store") for r in rows]),
        "o_direct_in_use": rows[0].get("o_direct_in_use"),
    }


COLUMN_TITLES = {
    "fs-buf": "vLLM fs, buffered",
    "fs-direct": "vLLM fs, default (O_DIRECT)",
    "kvtier-buf": "kvtier local (KvtierTier)",
    "kvtier-direct": "kvtier local, o_direct (KvtierTier)",
    "naive": "naive Python loop",
    "kvtier-cli": "kvtier bench CLI",
    "kvtier-cli-adj": "kvtier bench CLI − 100 ms idle tail",
    "kvtier-buf-nocrc": "kvtier local, checksums off",
    "kvtier-direct-nocrc": "kvtier local, o_direct, checksums off",
}


def table(records, sizes, columns) -> list[str]:
    lines = [
        "| size | column | store MiB/s (min–max) | load MiB/s (min–max) | store CPU-s/GiB | load CPU-s/GiB | 256-key exists ms | lookup passes | all-keys lookup ms | cached after store | verified |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size in sizes:
        for column in columns:
            s = summarize(records, column, size)
            if s is None:
                continue
            st, ld = s["store_mib_s"], s["load_mib_s"]
            exists = fmt(s["exists_ms"], "{:.2f}")
            if s["exists_present"] is not None and s["exists_present"] != EXIST_BATCH // 2:
                exists += f" ({s['exists_present']} present)"
            lookup = fmt(s["lookup_all_ms"], "{:.1f}")
            if s["lookup_keys"]:
                lookup += f" ({s['lookup_keys']} keys)"
            verified = "yes" if s["ok"] else "FAILED: " + "; ".join(s["errors"])
            lines.append(
                f"| {size_label(size)} | {COLUMN_TITLES[column]} | {fmt(st[0])} ({fmt(st[1])}–{fmt(st[2])}) | "
                f"{fmt(ld[0])} ({fmt(ld[1])}–{fmt(ld[2])}) | {fmt(s['store_cpu'], '{:.3f}')} | {fmt(s['load_cpu'], '{:.3f}')} | "
                f"{exists} | {fmt(s['passes'], '{:g}')} | {lookup} | {fmt(s['resident'], '{:.0%}')} | {verified} |"
            )
    return lines


def thread_table(records, sizes, columns, mib: int) -> list[str]:
    """Median CPU-s/GiB per thread group and phase, for the columns driven through vLLM."""
    lines = [
        "| size | column | phase | " + " | ".join(GROUPS) + " |",
        "|---|---|---|" + "---:|" * len(GROUPS),
    ]
    any_row = False
    for size in sizes:
        for column in columns:
            rows = [r for r in records if r.get("column") == column and r.get("size") == size and r.get("store_threads")]
            if not rows:
                continue
            gib = size * rows[0]["count"] / (1 << 30)
            for phase in ("store", "load"):
                cells = []
                for group in GROUPS:
                    vals = [r.get(f"{phase}_threads", {}).get(group, 0.0) / gib for r in rows]
                    cells.append(fmt(median(vals), "{:.3f}"))
                lines.append(f"| {size_label(size)} | {COLUMN_TITLES[column]} | {phase} | " + " | ".join(cells) + " |")
                any_row = True
    return lines if any_row else []


GROUPS = ("main (scheduler)", "vLLM fs I/O threads", "vLLM lookup thread", "kvtier I/O runtime", "kvtier lookup lane", "other threads")


def verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("**met**" if ok else "**missed**")


def targets(records, sizes) -> list[str]:
    lines = []
    for size in sizes:
        label = size_label(size)
        get = lambda c: summarize(records, c, size)  # noqa: E731
        cli, nv = get("kvtier-cli"), get("naive")
        # kvtier's column against vLLM fs's: throughput at least tp x, CPU per GiB at most cpu x.
        pairs = (("kvtier-buf", "fs-buf", "kvtier buffered vs vLLM fs buffered", 1.0, 0.8),
                 ("kvtier-direct", "fs-direct", "kvtier O_DIRECT vs vLLM fs default", 1.5, 1.0))
        for mine, theirs, what, tp, cpu in pairs:
            k, f = get(mine), get(theirs)
            if not (k and f):
                continue
            for op in ("store", "load"):
                t = ratio(k[f"{op}_mib_s"][0], f[f"{op}_mib_s"][0])
                c = ratio(k[f"{op}_cpu"], f[f"{op}_cpu"])
                ok = None if t is None or c is None else (t >= tp and c <= cpu)
                lines.append(
                    f"- {label}, {op}: {what} (throughput ≥{tp:g}×, CPU ≤{cpu:g}×): "
                    f"{fmt(t, '{:.2f}')}× throughput, {fmt(c, '{:.2f}')}× CPU/GiB — {verdict(ok)}"
                )
        adj = get("kvtier-cli-adj")
        if cli and nv:
            for op, tgt, cap in (("store", 2.0, 0.5), ("load", 1.5, 0.35)):
                t = ratio(cli[f"{op}_mib_s"][0], nv[f"{op}_mib_s"][0])
                c = cli[f"{op}_cpu"]
                ok = None if t is None or c is None else (t >= tgt and c <= cap)
                ta = ratio(adj[f"{op}_mib_s"][0], nv[f"{op}_mib_s"][0]) if adj else None
                oka = None if ta is None or c is None else (ta >= tgt and c <= cap)
                lines.append(
                    f"- {label}, {op}: kvtier bench vs naive loop (≥{tgt:g}× at ≤{cap:g} CPU-s/GiB): "
                    f"{fmt(t, '{:.2f}')}× throughput at {fmt(c, '{:.3f}')} CPU-s/GiB (naive: {fmt(nv[f'{op}_cpu'], '{:.3f}')}) — {verdict(ok)}"
                    + (f"; without the CLI's 100 ms idle tail: {fmt(ta, '{:.2f}')}× — {verdict(oka)}" if adj else "")
                )
    return lines


# ---------------------------------------------------------------------------------------------
# Main


def machine_facts(root: Path, lib: Path | None, cli: Path | None) -> dict:
    facts = {
        "cores": os.cpu_count(),
        "loadavg_start": loadavg(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "store_root": str(root),
        "store_root_fs": fs_type(root),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().split()
        facts["mem_gib"] = round(int(mem[1]) / (1 << 20), 1)
    with contextlib.suppress(Exception):
        import numpy
        import torch
        import vllm

        facts["vllm"] = vllm.__version__
        facts["torch"] = torch.__version__
        facts["numpy"] = numpy.__version__
    with contextlib.suppress(ImportError):
        import vllm.fs_io_C  # noqa: F401

        facts["vllm_fs_io_C"] = True
    facts.setdefault("vllm_fs_io_C", False)
    with contextlib.suppress(Exception):
        import kvtier

        facts["kvtier"] = kvtier.version()
    with contextlib.suppress(Exception):
        facts["git"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src", "core", "cli", "Cargo.toml", "build.rs"], capture_output=True, text=True).stdout.split("\n")
        facts["src_uncommitted"] = [line[3:] for line in dirty if line.strip()]
    with contextlib.suppress(OSError):
        built = Path(common.program("lib", required=False) if lib is None else lib).stat().st_mtime
        facts["libkvtier_built"] = _dt.datetime.fromtimestamp(built).strftime("%Y-%m-%d %H:%M:%S")
    for name, path in (("libkvtier", lib), ("kvtier_cli", cli)):
        if path is not None:
            facts[name] = {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}
    return facts


def snapshot_kvtier(root: Path) -> tuple[Path, Path, Path, str]:
    """Copies libkvtier.so, the kvtier CLI and the Python package to a private directory, so
    that a rebuild or an edit by someone else during the run cannot mix two versions in one
    table. The package is the checkout's (python/kvtier); if that copy cannot drive this
    library (say its binding already declares functions the build lacks), the package as of
    git HEAD is tried. Returns (library, CLI, directory to put on sys.path, which package)."""
    if not all(os.path.isfile(common.program(p, required=False)) for p in ("lib", "cli")):
        print("building libkvtier.so and the kvtier CLI (cargo build --release --lib --bin kvtier)...", flush=True)
        common.build("lib", "cli")
    lib, cli = Path(common.program("lib")), Path(common.program("cli"))
    snap = root / f"bin-{os.getpid()}"
    shutil.rmtree(snap, ignore_errors=True)
    snap.mkdir(parents=True)
    shutil.copy2(lib, snap / "libkvtier.so")
    shutil.copy2(cli, snap / "kvtier")
    probe = (
        "import kvtier, kvtier.vllm; kvtier.Tier({'store': {'type': 'memory'}, 'key_bytes': 0}).close(); "
        "print(kvtier.version())"
    )
    tried = []
    for label in ("working tree", "git HEAD"):
        pkg_root = snap / ("py-worktree" if label == "working tree" else "py-head")
        pkg_root.mkdir()
        if label == "working tree":
            shutil.copytree(REPO / "python" / "kvtier", pkg_root / "kvtier", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "python/kvtier"], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(pkg_root), "--strip-components=1"], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": str(pkg_root), "KVTIER_LIBRARY": str(snap / "libkvtier.so")}
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
        if out.returncode == 0:
            return snap / "libkvtier.so", snap / "kvtier", pkg_root, f"python/kvtier from the {label}"
        tried.append(f"{label}: {(out.stderr.strip().splitlines() or ['?'])[-1][:200]}")
    raise SystemExit("the kvtier Python package cannot drive target/release/libkvtier.so: " + " | ".join(tried))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256K,2M", help="chunk sizes (K/M suffixes), default 256K,2M")
    parser.add_argument("--mib", type=int, default=256, help="data per point and repetition, MiB (default 256)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions; the table shows medians (default 5)")
    parser.add_argument(
        "--columns",
        default=",".join(DEFAULT_COLUMNS),
        help=f"comma-separated, from {','.join(ALL_COLUMNS)} (default: all)",
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the unrecorded warm-up round")
    parser.add_argument("--keys-per-job", type=int, default=4, help="chunks per vLLM request/job (default 4)")
    parser.add_argument("--step-ms", type=float, default=2.0, help="modelled model-execution time between scheduler steps (default 2)")
    parser.add_argument("--exist-reps", type=int, default=5, help="256-key existence batches per repetition (median)")
    parser.add_argument("--residency-sample", type=int, default=64, help="files whose page-cache residency is sampled after the store")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="directory the stores live under (default target/bench-local)")
    parser.add_argument("--name", default="local-latest", help="write bench/results/NAME.md and .jsonl")
    args = parser.parse_args()

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    unknown = set(columns) - set(ALL_COLUMNS)
    if unknown:
        parser.error(f"unknown columns {sorted(unknown)}")
    started = time.time()
    args.root.mkdir(parents=True, exist_ok=True)

    lib, cli, pkg_root, pkg_label = snapshot_kvtier(args.root)
    os.environ["KVTIER_LIBRARY"] = str(lib)
    sys.path.insert(0, str(pkg_root))

    import logging

    logging.getLogger("vllm").setLevel(logging.ERROR)
    import numpy as np
    from vllm.v1.kv_offload.tiering.fs.io import probe_o_direct

    root = args.root
    notes = []
    if not probe_o_direct(str(root)):
        notes.append(f"{root} ({fs_type(root)}) refuses O_DIRECT")
        if root != DEFAULT_ROOT:
            notes.append(f"moved the stores to {DEFAULT_ROOT} (disk-backed)")
            root = DEFAULT_ROOT
            root.mkdir(parents=True, exist_ok=True)
            if not probe_o_direct(str(root)):
                notes.append(f"{root} ({fs_type(root)}) refuses O_DIRECT too: the O_DIRECT columns ran buffered")
    facts = machine_facts(root, lib, cli)
    facts["kvtier_python"] = pkg_label
    facts["o_direct_probe"] = probe_o_direct(str(root))

    # Keep every store directory until the end of the run (see retire_dir) when the disk has
    # room for all of them with a margin; otherwise delete each after its column.
    planned = len(sizes) * len(columns) * args.reps * (args.mib << 20) * 1.1 + (256 << 20)
    free = shutil.disk_usage(root).free
    keep_files = planned < 0.5 * free
    if not keep_files:
        notes.append(
            f"store dirs deleted after each column ({planned / 2**30:.1f} GiB planned, {free / 2**30:.1f} GiB free): "
            "ext4's recently-deleted inode skipping then taxes the next column"
        )

    header = [
        f"machine: {facts['cores']} cores, {facts.get('cpu', '?')}, {facts.get('mem_gib', '?')} GiB, kernel {facts['kernel']}",
        f"load average at start: {facts['loadavg_start']} (shared machine: read medians, expect noise)",
        f"store root: {root} (file system {facts['store_root_fs']}; O_DIRECT probe {'accepted' if facts['o_direct_probe'] else 'REFUSED'})",
        f"versions: vLLM {facts.get('vllm')} (fs_io_C extension {'present' if facts['vllm_fs_io_C'] else 'absent'}), "
        f"kvtier {facts.get('kvtier')} @ {facts.get('git')}"
        + (f" + {len(facts['src_uncommitted'])} uncommitted source files (listed in the .jsonl)" if facts.get("src_uncommitted") else "")
        + f", library built {facts.get('libkvtier_built', '?')}"
        + f" ({pkg_label}), torch {facts.get('torch')}, numpy {facts.get('numpy')}, python {facts['python']}",
        f"workload: {args.mib} MiB per point, chunk sizes {', '.join(size_label(s) for s in sizes)}, {args.reps} reps (columns rotated each rep), "
        f"{args.keys_per_job} chunks per vLLM job/request, scheduler step every {args.step_ms:g} ms, lookups: N stored + N absent keys",
        "page cache: loads read what was just stored, hot in the page cache for every buffered column alike "
        "(O_DIRECT stores/loads bypass it by design); after each column: sync, its files dropped from the page cache"
        + (", kept on disk until the end of the run (deleting inodes slows ext4's next inode allocations)" if keep_files else ", deleted"),
        "vLLM fs buffered = the fs tier with its O_DIRECT probe answering False (vLLM 0.33 has no config key for it)",
    ] + notes
    for line in header:
        print(line, flush=True)

    if not args.no_warmup:
        # One small unrecorded round of every in-process column: imports, first engine, first
        # tier, first library load and the first directories cost nothing in the table.
        size = sizes[0]
        count = max(4, min(32, (args.mib << 20) // size))
        src = np.frombuffer(np.random.default_rng(0).bytes(size * count), dtype=np.uint8).reshape(count, size)
        warm = argparse.Namespace(**{**vars(args), "exist_reps": 1})
        for column in columns:
            if column == "kvtier-cli":
                continue
            point = {"size": size, "count": count, "tag": f"warmup-{column}-{uuid.uuid4().hex[:6]}"}
            workdir = fresh_dir(root, f"warmup-{column}")
            try:
                keys, absent = chunk_keys(f"{point['tag']}-p", count), chunk_keys(f"{point['tag']}-a", count)
                if column == "naive":
                    run_naive(warm, point, src, keys, absent, workdir)
                else:
                    run_manager_column(column, warm, point, src, keys, absent, workdir)
            except Exception as exc:
                print(f"warm-up of {column} failed: {type(exc).__name__}: {exc}", flush=True)
            finally:
                retire_dir(workdir, keep_files)
        del src

    records: list[dict] = []
    jsonl = RESULTS / f"{args.name}.jsonl"
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(jsonl, "w") as out:
        out.write(json.dumps({"kind": "machine", **facts, "args": {k: str(v) for k, v in vars(args).items()}}) + "\n")
        for size in sizes:
            count = max(1, (args.mib << 20) // size)
            point = {"size": size, "count": count}
            src = np.frombuffer(np.random.default_rng(size).bytes(size * count), dtype=np.uint8).reshape(count, size)
            print(f"\n== {size_label(size)} x {count} chunks ({size * count >> 20} MiB) ==", flush=True)
            for rep in range(args.reps):
                order = columns[rep % len(columns) :] + columns[: rep % len(columns)]
                for column in order:
                    tag = f"{size}-{rep}-{column}-{uuid.uuid4().hex[:6]}"
                    point["tag"] = tag
                    keys = chunk_keys(f"{tag}-present", count)
                    absent = chunk_keys(f"{tag}-absent", count)
                    workdir = fresh_dir(root, column)
                    load_before = loadavg()
                    try:
                        if column == "naive":
                            r = run_naive(args, point, src, keys, absent, workdir)
                        elif column == "kvtier-cli":
                            r = run_cli(args, point, workdir, cli)
                        else:
                            r = run_manager_column(column, args, point, src, keys, absent, workdir)
                    except Exception as exc:  # a broken column is reported, the run goes on
                        r = {"ok": False, "errors": [f"{type(exc).__name__}: {exc}"]}
                    finally:
                        retire_dir(workdir, keep_files)
                    raw = r
                    r = derived(raw, size, count)
                    r.update(kind="run", column=column, size=size, count=count, rep=rep, loadavg=load_before)
                    records.append(r)
                    out.write(json.dumps(r, default=str) + "\n")
                    if column == "kvtier-cli" and raw.get("store_s") and CLI_IDLE_TAIL_S > 0:
                        adj = {k: v for k, v in raw.items() if k != "cli_report"}
                        adj["store_s"] = max(raw["store_s"] - CLI_IDLE_TAIL_S, 1e-6)
                        adj["load_s"] = max(raw["load_s"] - CLI_IDLE_TAIL_S, 1e-6)
                        adj = derived(adj, size, count)
                        adj.update(kind="derived", column="kvtier-cli-adj", size=size, count=count, rep=rep, loadavg=load_before)
                        records.append(adj)
                        out.write(json.dumps(adj, default=str) + "\n")
                    out.flush()
                    print(
                        f"  rep {rep} {column:14s} store {fmt(r.get('store_mib_s'))} MiB/s ({fmt(r.get('store_cpu_s_per_gib'), '{:.3f}')} CPU-s/GiB)"
                        f"  load {fmt(r.get('load_mib_s'))} MiB/s ({fmt(r.get('load_cpu_s_per_gib'), '{:.3f}')})"
                        f"  exists {fmt(None if r.get('exists_s') is None else r['exists_s'] * 1000, '{:.2f}')} ms"
                        f"  passes {r.get('lookup_passes', '–')}  {'ok' if r.get('ok') else 'FAILED ' + '; '.join(r.get('errors', []))}",
                        flush=True,
                    )
            del src
    facts["loadavg_end"] = loadavg()
    elapsed = time.time() - started
    remove_retired()
    shutil.rmtree(lib.parent, ignore_errors=True)

    shown = [c for c in columns]
    if "kvtier-cli" in shown and CLI_IDLE_TAIL_S > 0:
        shown.insert(shown.index("kvtier-cli") + 1, "kvtier-cli-adj")
    body = table(records, sizes, shown)
    threads = thread_table(records, sizes, [c for c in columns if c not in ("naive", "kvtier-cli")], args.mib)
    goals = targets(records, sizes)
    print()
    print(f"load average at end: {facts['loadavg_end']}; {elapsed / 60:.1f} min")
    print()
    print("\n".join(body))
    print()
    if threads:
        print("CPU-s/GiB by thread group:")
        print("\n".join(threads))
        print()
    print("Targets (ratios of medians):")
    print("\n".join(goals) if goals else "(needs the paired columns)")

    md = [
        "# kvtier local store vs vLLM's fs tier and a naive Python loop",
        "",
        f"Generated by `bench/local_compare.py` on {_dt.datetime.now():%Y-%m-%d %H:%M} in {elapsed / 60:.1f} min. "
        f"Medians of {args.reps} repetitions (columns rotated each repetition); every loaded byte verified.",
        "",
        *[f"- {line}" for line in header],
        f"- load average at end: {facts['loadavg_end']}",
        "",
        "Columns: **vLLM fs** = vLLM's `FileSystemTierManager` (16 read + 16 write threads, its C extension), "
        "**kvtier local** = `kvtier.vllm.KvtierTier` on `{\"type\":\"local\"}` (defaults: checksums on, "
        "`runtime_threads` 2, `file_io_threads` 16), both built by vLLM's `SecondaryTierFactory` and driven through "
        "`TieringOffloadingManager`; **naive** = one Python thread; **kvtier bench CLI** = `kvtier bench` (16 jobs "
        "in flight, 1 key per job, its 256-key existence batch from a separate 128 × 4 KiB run). CPU = whole process "
        "user+sys over the timed part / GiB moved. Load = from the step that submitted the first promotion until the "
        "tier drained. Lookup passes = scheduler passes until every key (N stored + N absent) was answered. 256-key "
        "exists = one batch asked of the tier, polled every 0.2 ms. Cached after store = fraction of a sample of the "
        "stored files' pages in the page cache right after the store (mincore): ~0% means the store really bypassed it."
        + (
            " **kvtier bench CLI − 100 ms idle tail**: the CLI's store/load loop polls its ready fd (100 ms timeout) once "
            "more after the last result, so each of its phases includes 100 ms of idling; this row subtracts it (CPU unchanged)."
            if CLI_IDLE_TAIL_S > 0
            else ""
        ),
        "",
        *body,
        "",
        "## Targets (ratios of medians; a benchmark, not a test)",
        "",
        *(goals or ["(needs the paired columns)"]),
        "",
        "## Where the CPU goes (CPU-s/GiB per thread group, medians; /proc/self/task/*/schedstat)",
        "",
        "The load phase includes its one scheduler pass of lookups (main thread).",
        "",
        *(threads or ["(no vLLM-driven columns)"]),
        "",
        f"Raw measurements: `bench/results/{args.name}.jsonl`.",
        "",
    ]
    (RESULTS / f"{args.name}.md").write_text("\n".join(md))
    with open(jsonl, "a") as out:
        out.write(json.dumps({"kind": "end", "loadavg_end": facts["loadavg_end"], "elapsed_s": elapsed}) + "\n")
    print(f"\nwrote {RESULTS / (args.name + '.md')} and {jsonl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
