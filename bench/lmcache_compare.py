#!/usr/bin/env python3
"""bench/lmcache_compare.py: kvtier's LMCache L2 adapter side by side with LMCache 0.5.6's own
``s3`` L2 adapter (awscrt), both driven through LMCache's own multiprocess-mode
``StorageManager``, built from the ``--l2-adapter`` JSON a user gives, on the same chunks and
the same S3 server in one run; LMCache's in-memory ``mock`` L2 adapter alongside as a ceiling.

    tools/venv/bin/python bench/lmcache_compare.py                  # defaults, ~7 min on 2 cores
    tools/venv/bin/python bench/lmcache_compare.py --chunks 4 --reps 1
    bench/run.py lmcache                                            # the published run

Chunks are LMCache's default chunk of 256 tokens of a Llama-3.1-8B-shaped layer stack: 32
layers x 8 KV heads x head dim 128, K and V, bf16 = 2 x 32 x 256 x 8 x 128 x 2 bytes = 32 MiB
a chunk (one L1 object of shape [2, 32, 256, 1024] bf16). --chunks of them per run.

Adapters (each run in a process of its own, so that the process's CPU time is that adapter's
and LMCache's alone):

  kvtier     ``{"type": "plugin", "module_path": "kvtier.lmcache", ...}``, kvtier's store
             ``s3`` on s3s-fs (path-style, bucket ``127``, prefix ``kvtier-bench``),
             configuration defaults (checksums on: a CRC32C of every chunk stored and checked
             on load).
  lmcache-s3 ``{"type": "s3"}``, LMCache's awscrt adapter, on the same s3s-fs process and
             bucket (virtual-hosted: s3s-fs started with ``--domain 1:PORT``, LMCache given
             ``"s3_endpoint": "127.1:PORT"``, which resolves to 127.0.0.1 without DNS and which
             s3s-fs reads as bucket ``127``), ``disable_tls``, ``s3_prefer_http2: false``,
             ``s3_num_io_threads`` --crt-threads (its default, 64, is far too many for 2 cores).
             awscrt comes from --awscrt-site (installed there with ``pip install --target``),
             not from the venv.
  lmcache-mock LMCache's ``mock`` adapter (an in-memory dict of tensor copies) with an
             unreachable bandwidth cap (1000 GB/s): what LMCache itself costs around an L2
             that costs nothing, a ceiling. Its objects live in its adapter, so its load and
             lookups run in the StorageManager that stored them, the chunks dropped from L1 first.

s3s-fs keeps its files on /dev/shm; its bucket is emptied between runs (untimed). One run:

  store    a StorageManager with its own L1: reserve_write the chunks, fill them (untimed),
           then ``finish_write`` (LMCache's store controller submits them to the L2 adapter)
           until LMCache's L2 listener has heard every chunk stored: chunks/s stored.
  lookup   --lookup-reps sets of --lookup-keys small objects (64 KiB each: an existence check
           does not depend on an object's size) stored by the same adapter, untimed; then, from
           a second, fresh StorageManager (a new adapter: no state from the store), the adapter
           LMCache built is asked ``submit_lookup_and_lock_task`` of each set once and polled
           until ``query_lookup_and_lock_result`` answers (every key must be found): "first",
           the median; then the first set again --lookup-reps times: "again", the median
           (LMCache's ``s3`` adapter remembers the sizes its HEADs found and answers a repeat
           without asking the store).
  load     in that fresh StorageManager, ``submit_prefetch_task`` of all the chunks to
           completion (``wait_prefetch_status``; LMCache's prefetch controller looks them up,
           locks and loads them from L2 into the fresh L1): chunks/s loaded. Every chunk
           must be an L2 hit, and every byte of every chunk is then compared with what was
           written (untimed); a difference marks the adapter WRONG DATA and its speed is not
           reported.

Both L1 arenas are written through once before use (untimed), so that first touches of fresh
memory are no adapter's cost. CPU: ``getrusage(RUSAGE_SELF)`` of the run's process (LMCache,
its controller threads and the adapter under test, nothing else) over each timed phase, per
GiB of chunks moved; the server's CPU (utime+stime of s3s-fs) likewise. Every adapter runs
--reps times, interleaved (the order rotated each repetition); the table shows medians.

Writes bench/results/lmcache.md (--output) with the targets: kvtier >= 1.5x LMCache's s3
adapter's throughput at <= 0.5x its client CPU per GiB, stores and loads.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid

import common
from common import ACCESS_KEY, REGION, SECRET_KEY, cpu_now, proc_cpu

ROOT = common.ROOT
ADAPTERS = ("kvtier", "lmcache-s3", "lmcache-mock")
BUCKET = "127"  # s3s-fs's bucket for virtual-hosted "127.1:PORT" (docs: /work reference, LMCache loopback)
KVTIER_PREFIX = "kvtier-bench"
MODEL = "bench/llama-3.1-8b"
LOOKUP_OBJECT_BYTES = 64 * 1024
LMCACHE_SITE = os.path.join(ROOT, "tools", "lmcache-site")
GIB = 1 << 30

log = common.logger("lmcache-bench")


# ---------------------------------------------------------------------------------------------
# One run: one adapter, in this process (--child)


def l2_adapter_json(adapter, args):
    if adapter == "kvtier":
        store = {"type": "s3", "bucket": BUCKET, "endpoint_override": f"127.0.0.1:{args.port}", "scheme": "http",
                 "access_key": ACCESS_KEY, "secret_key": SECRET_KEY, "region": REGION}
        extra = json.loads(args.kvtier_config)
        store.update(extra.pop("store", {}))  # --kvtier-config's "store" keys go into the store section
        params = {"store": store, "prefix": KVTIER_PREFIX, **extra}
        return {"type": "plugin", "module_path": "kvtier.lmcache", "class_name": "KvtierL2Adapter",
                "adapter_params": params}
    if adapter == "lmcache-s3":
        return {"type": "s3", "s3_endpoint": f"127.1:{args.port}", "s3_region": REGION, "disable_tls": True,
                "s3_prefer_http2": False, "s3_num_io_threads": args.crt_threads,
                "aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}
    return {"type": "mock", "max_size_gb": 64, "mock_bandwidth_gb": 1000}


def run_child(args):
    """Stores, looks up and loads --chunks chunks through one adapter; prints one JSON line."""
    if LMCACHE_SITE not in sys.path:
        sys.path.append(LMCACHE_SITE)
    if args.child == "lmcache-s3":
        sys.path.insert(0, args.awscrt_site)
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    common.use_package(args.library)
    import numpy as np
    import torch
    from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec
    from lmcache.v1.distributed.config import parse_args
    from lmcache.v1.distributed.internal_api import L2AdapterListener
    from lmcache.v1.distributed.storage_manager import StorageManager

    shape = torch.Size([2, args.layers, args.tokens, args.heads * args.head_dim])
    layout = MemoryLayoutDesc([shape], [torch.bfloat16])
    chunk_bytes = shape.numel() * 2
    small = MemoryLayoutDesc([torch.Size([LOOKUP_OBJECT_BYTES])], [torch.uint8])
    n, nl = args.chunks, args.lookup_keys
    l1_gb = (n * chunk_bytes + nl * args.lookup_reps * LOOKUP_OBJECT_BYTES) * 1.5 / GIB + 0.125
    adapter_json = json.dumps(l2_adapter_json(args.child, args))
    server_pid = args.server_pid
    tag = uuid.uuid4().hex  # fresh keys every run: no run finds another's objects

    class Stored(L2AdapterListener):
        def __init__(self):
            self.keys, self.cond = set(), threading.Condition()

        def on_l2_keys_stored(self, keys, sizes):
            with self.cond:
                self.keys.update(keys)
                self.cond.notify_all()

        def on_l2_keys_accessed(self, keys):
            pass

        def on_l2_keys_deleted(self, keys):
            pass

        def wait_for(self, keys, timeout):
            with self.cond:
                return self.cond.wait_for(lambda: set(keys) <= self.keys, timeout)

    def manager():
        config = parse_args(["--l1-size-gb", f"{l1_gb:.4f}", "--no-l1-use-lazy", "--eviction-policy", "LRU",
                             "--l2-adapter", adapter_json])
        for l1 in [config.l1_manager_config, *config.l1_manager_configs]:
            l1.memory_config.shm_name = f"lmcache_l1_pool_kvtier_bench_{uuid.uuid4().hex[:12]}"
        m = StorageManager(config)
        desc = m.l1_memory_desc
        ctypes.memset(desc.ptr, 0, desc.size)  # first touch of the whole arena, untimed
        stored = Stored()
        m.register_l2_listener(stored)
        ((_, adapter),) = m.l2_adapters()
        return m, stored, adapter

    def keys_of(prefix, count):
        return [ObjectKey(chunk_hash=bytes.fromhex(common.key_hex(hash((tag, prefix)) & 0xFFFFFFFF, i)),
                          model_name=MODEL, kv_rank=0, cache_salt="") for i in range(count)]

    keys = keys_of("chunk", n)
    lookup_keys = keys_of("lookup", nl * args.lookup_reps)
    words = chunk_bytes // 8
    seed = int(tag[:6], 16)
    expected = [torch.from_numpy(common.block_words(seed, i, words).view(np.int64)) for i in range(n)]

    out = {"adapter": args.child, "chunks": n, "chunk_bytes": chunk_bytes, "error": None}
    gib = n * chunk_bytes / GIB
    m1, stored1, m1_adapter = manager()
    m2 = None
    try:
        # store
        reserved = m1.reserve_write(keys, layout)
        if set(reserved) != set(keys):
            raise RuntimeError(f"L1 reserved {len(reserved)} of {n} chunks")
        for i, k in enumerate(keys):
            reserved[k].tensor.view(torch.int64).reshape(-1).copy_(expected[i])
        s0, c0, t0 = proc_cpu(server_pid), cpu_now(), time.perf_counter()
        m1.finish_write(keys)
        if not stored1.wait_for(keys, args.timeout):
            raise RuntimeError(f"L2 reported {len(stored1.keys & set(keys))} of {n} chunks stored "
                               f"within {args.timeout:.0f} s")
        t1, c1, s1 = time.perf_counter(), cpu_now(), proc_cpu(server_pid)
        out.update(store_s=t1 - t0, store_chunks_s=n / (t1 - t0), store_mib_s=gib * 1024 / (t1 - t0),
                   store_cpu_gib=(c1 - c0) / gib, store_server_cpu_gib=(s1 - s0) / gib if server_pid else None)
        # the lookup set (untimed)
        reserved = m1.reserve_write(lookup_keys, small)
        for k in lookup_keys:
            reserved[k].tensor.view(torch.uint8).fill_(7)
        m1.finish_write(lookup_keys)
        if not stored1.wait_for(lookup_keys, args.timeout):
            raise RuntimeError("the lookup set was not stored")
        if args.child == "lmcache-mock":
            # The mock's objects live in its adapter, which a second StorageManager would not
            # share: it loads into the same one, its chunks dropped from L1 first.
            m1.delete_l1_keys(keys + lookup_keys, force=True)
            m2, adapter2 = m1, m1_adapter
        else:
            m2 = None
    finally:
        if m2 is None:
            m1.close()

    if m2 is None:
        m2, _, adapter2 = manager()
    try:
        # lookup: the adapter LMCache built, called as LMCache's prefetch controller calls it;
        # first each set once (every key asked of the store), then set 0 again (what an
        # adapter remembers answers, if it remembers)
        def lookup(lkeys):
            t0 = time.perf_counter()
            task = adapter2.submit_lookup_and_lock_task(lkeys, {0: small})
            deadline = t0 + args.timeout
            while (found := adapter2.query_lookup_and_lock_result(task)) is None:
                if time.perf_counter() > deadline:
                    raise RuntimeError("a lookup never finished")
                time.sleep(0.0002)
            ms = (time.perf_counter() - t0) * 1000
            hits = [k for i, k in enumerate(lkeys) if found.test(i)]
            adapter2.submit_unlock(hits)
            if len(hits) != len(lkeys):
                raise RuntimeError(f"lookup found {len(hits)} of {len(lkeys)} keys")
            return ms

        first = [lookup(lookup_keys[r * nl:(r + 1) * nl]) for r in range(args.lookup_reps)]
        again = [lookup(lookup_keys[:nl]) for _ in range(args.lookup_reps)]
        out.update(lookup_ms=statistics.median(first), lookup_again_ms=statistics.median(again), lookup_keys=nl)
        # load: prefetch into the fresh L1
        spec = PrefetchTaskSpec(key_groups=[GroupedObjectKeys(keys, 0, layout)], fetching_policy="prefix")
        s0, c0, t0 = proc_cpu(server_pid), cpu_now(), time.perf_counter()
        handle = m2.submit_prefetch_task(spec)
        if not m2.wait_prefetch_status(handle, args.timeout):
            raise RuntimeError(f"the prefetch did not finish within {args.timeout:.0f} s")
        t1, c1, s1 = time.perf_counter(), cpu_now(), proc_cpu(server_pid)
        result = m2.query_prefetch_status(handle)
        if result is None or result.l2_hit_count != n:
            raise RuntimeError(f"prefetch: {None if result is None else result.l2_hit_count} of {n} chunks from L2")
        out.update(load_s=t1 - t0, load_chunks_s=n / (t1 - t0), load_mib_s=gib * 1024 / (t1 - t0),
                   load_cpu_gib=(c1 - c0) / gib, load_server_cpu_gib=(s1 - s0) / gib if server_pid else None)
        wrong = 0
        with m2.read_prefetched_results(keys) as objs:
            if objs is None:
                raise RuntimeError("a prefetched chunk is not in L1")
            for i, obj in enumerate(objs):
                wrong += not torch.equal(obj.tensor.view(torch.int64).reshape(-1), expected[i])
        m2.finish_read_prefetched(keys)
        out.update(wrong_chunks=wrong, verified_chunks=n - wrong)
        if hasattr(adapter2, "tier"):
            out["kvtier_stats"] = {k: v for k, v in adapter2.tier.stats().items()
                                   if k in ("retries", "keys_loaded", "bytes_loaded")}
    finally:
        m2.close()
    print(json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# The orchestrator: the server, the runs in processes of their own, the report


def start_s3sfs(args, workdir):
    s3 = common.servers()
    root = common.scratch_dir("kvbench-lmcache-s3sfs-")
    os.makedirs(os.path.join(root, BUCKET))
    fs = common.program("s3s-fs", args.s3s_fs)

    def argv(port):
        return s3.s3s_fs_argv(fs, port, root, ACCESS_KEY, SECRET_KEY) + ["--domain", f"1:{port}"]

    port, proc = s3.serve(argv, "s3sfs-lmcache", workdir, start_new_session=True)
    return port, proc, root


def stop(proc):
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def empty_bucket(root):
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    os.makedirs(os.path.join(root, BUCKET), exist_ok=True)


def one_run(adapter, args, port, server_pid):
    argv = [sys.executable, os.path.abspath(__file__), "--child", adapter, "--port", str(port),
            "--server-pid", str(server_pid), "--chunks", str(args.chunks), "--lookup-keys", str(args.lookup_keys),
            "--lookup-reps", str(args.lookup_reps), "--crt-threads", str(args.crt_threads),
            "--awscrt-site", args.awscrt_site, "--kvtier-config", args.kvtier_config, "--timeout", str(args.timeout),
            "--layers", str(args.layers), "--tokens", str(args.tokens), "--heads", str(args.heads),
            "--head-dim", str(args.head_dim)]
    if args.library:
        argv += ["--library", args.library]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout * 3 + 120, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"adapter": adapter, "error": "the run's process timed out"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-3:]
        return {"adapter": adapter, "error": f"exited {done.returncode}: {' / '.join(tail)[-400:]}"}
    return json.loads(lines[-1])


METRICS = ("store_chunks_s", "store_mib_s", "store_cpu_gib", "store_server_cpu_gib", "load_chunks_s", "load_mib_s",
           "load_cpu_gib", "load_server_cpu_gib", "lookup_ms", "lookup_again_ms")
NAMES = {"kvtier": "kvtier (plugin)", "lmcache-s3": "LMCache `s3` (awscrt)", "lmcache-mock": "LMCache `mock` (in memory)"}
STORES = {"kvtier": "s3s-fs", "lmcache-s3": "s3s-fs", "lmcache-mock": "memory (no server)"}


def aggregate(runs, adapters):
    rows = {}
    for a in adapters:
        rs = [r for r in runs if r["adapter"] == a]
        ok = [r for r in rs if not r.get("error")]
        row = {"adapter": a, "reps": len(rs), "ok": len(ok), "error": None,
               "wrong": sum(r.get("wrong_chunks", 0) for r in ok), "verified": sum(r.get("verified_chunks", 0) for r in ok)}
        if len(ok) < len(rs):
            row["error"] = f"failed in {len(rs) - len(ok)} of {len(rs)} runs: " + next(r["error"] for r in rs if r.get("error"))
        for m in METRICS:
            vals = [r[m] for r in ok if r.get(m) is not None]
            row[m] = statistics.median(vals) if vals else None
            if m.endswith("_chunks_s") and vals:
                row[m + "_range"] = (min(vals), max(vals))
        rows[a] = row
    return rows


def f(v, spec):
    return "–" if v is None else format(v, spec)


def report(rows, args, info):
    chunk_mib = info["chunk_bytes"] / (1 << 20)
    lines = [f"# kvtier's LMCache adapter against LMCache's own s3 adapter ({_dt.date.today().isoformat()})", "",
             f"Chunks of {args.tokens} tokens (LMCache's default chunk size) x {args.layers} layers x {args.heads} KV "
             f"heads x head dim {args.head_dim}, K and V, bf16 = {info['chunk_bytes']:,} bytes = {chunk_mib:g} MiB "
             f"a chunk (Llama-3.1-8B's shape); {args.chunks} chunks ({args.chunks * chunk_mib / 1024:g} GiB) stored "
             f"and loaded per run, through LMCache {info['lmcache']}'s own `StorageManager`; lookups of "
             f"{args.lookup_keys} keys. Each adapter in a process of its own, {args.reps} runs each, interleaved; "
             "medians (chunks/s also with min–max).", "",
             "| adapter | store | store chunks/s (MiB/s) [min–max] | load chunks/s (MiB/s) [min–max] | "
             "client CPU-s/GiB store / load | server CPU-s/GiB store / load | lookup of "
             f"{args.lookup_keys} keys, ms: first / again | verified |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for a, r in rows.items():
        head = f"| {NAMES[a]} | {STORES[a]} |"
        if r["ok"] == 0:
            lines.append(f"{head} FAILED | FAILED | – | – | – | {str(r['error']).replace('|', '/')} |")
            continue
        if r["wrong"]:
            lines.append(f"{head} – | – | – | – | – | WRONG DATA: {r['wrong']} chunks differ |")
            continue
        sr, lr = r["store_chunks_s_range"], r["load_chunks_s_range"]
        server = (f"{f(r['store_server_cpu_gib'], '.3f')} / {f(r['load_server_cpu_gib'], '.3f')}"
                  if STORES[a] != "memory (no server)" else "– (no server)")
        note = f"; {r['error']}" if r["error"] else ""
        lines.append(f"{head} {r['store_chunks_s']:.2f} ({r['store_mib_s']:.0f}) [{sr[0]:.2f}–{sr[1]:.2f}] | "
                     f"{r['load_chunks_s']:.2f} ({r['load_mib_s']:.0f}) [{lr[0]:.2f}–{lr[1]:.2f}] | "
                     f"{r['store_cpu_gib']:.3f} / {r['load_cpu_gib']:.3f} | {server} | {f(r['lookup_ms'], '.2f')} / {f(r['lookup_again_ms'], '.2f')} | "
                     f"{r['verified']} chunks, byte-exact{note} |")
    kv, lm = rows.get("kvtier"), rows.get("lmcache-s3")
    lines += ["", "Targets: kvtier >= 1.5x LMCache's `s3` adapter's throughput at <= 0.5x its client CPU per GiB "
              "(on the same s3s-fs).", "",
              "| phase | kvtier / LMCache s3 throughput | kvtier / LMCache s3 client CPU per GiB | met |",
              "|---|---:|---:|---|"]
    verdicts = []
    for phase in ("store", "load"):
        if not kv or not lm or not kv["ok"] or not lm["ok"] or kv["wrong"] or lm["wrong"]:
            lines.append(f"| {phase} | – | – | not measured |")
            verdicts.append(f"{phase}: not measured")
            continue
        tp = kv[f"{phase}_chunks_s"] / lm[f"{phase}_chunks_s"]
        cpu = kv[f"{phase}_cpu_gib"] / lm[f"{phase}_cpu_gib"]
        bad = [w for w, b in (("throughput", tp < 1.5), ("CPU", cpu > 0.5)) if b]
        lines.append(f"| {phase} | {tp:.2f}x | {cpu:.2f}x | {'yes' if not bad else 'NO (' + ', '.join(bad) + ')'} |")
        verdicts.append(f"{phase}: {'met' if not bad else 'missed (' + ', '.join(bad) + ')'}")
    measured = kv and lm and kv["ok"] and lm["ok"] and not kv["wrong"] and not lm["wrong"]
    if measured and all(r.get(f"{p}_server_cpu_gib") is not None for r in (kv, lm) for p in ("store", "load")):
        lines += ["", "Where the CPU goes (client + server CPU-s per GiB; client and server share the machine's "
                  "cores, so when both runs are CPU-bound their throughputs can differ by at most the inverse ratio "
                  "of these totals):", "",
                  "| phase | kvtier: client + server = total | LMCache s3: client + server = total | "
                  "server's share, kvtier / LMCache s3 | throughput ratio if CPU-bound |",
                  "|---|---:|---:|---:|---:|"]
        for phase in ("store", "load"):
            kc, ks = kv[f"{phase}_cpu_gib"], kv[f"{phase}_server_cpu_gib"]
            lc, ls = lm[f"{phase}_cpu_gib"], lm[f"{phase}_server_cpu_gib"]
            lines.append(f"| {phase} | {kc:.3f} + {ks:.3f} = {kc + ks:.3f} | {lc:.3f} + {ls:.3f} = {lc + ls:.3f} | "
                         f"{ks / (kc + ks):.0%} / {ls / (lc + ls):.0%} | {(lc + ls) / (kc + ks):.2f}x |")
    if kv and lm and kv.get("lookup_ms") and lm.get("lookup_ms"):
        lines += ["", f"Lookup of {args.lookup_keys} keys, first time: kvtier {kv['lookup_ms']:.2f} ms, LMCache s3 "
                  f"{lm['lookup_ms']:.2f} ms (kvtier's takes {kv['lookup_ms'] / lm['lookup_ms']:.2f}x LMCache's); "
                  f"asked again: kvtier {kv['lookup_again_ms']:.2f} ms, LMCache s3 {lm['lookup_again_ms']:.2f} ms."]
    lines += ["", "Targets: " + "; ".join(verdicts) + ".", "",
              "How: store = `finish_write` of the chunks (already in L1) until LMCache's L2 listener has heard "
              "every one stored; load = a second, fresh `StorageManager` (fresh L1, new adapter) running "
              "`submit_prefetch_task` of all the chunks to `wait_prefetch_status` (every one an L2 hit), then every "
              "byte compared (untimed); lookup = `submit_lookup_and_lock_task` to `query_lookup_and_lock_result` "
              f"(polled every 0.2 ms) on the fresh adapter, of {args.lookup_keys} objects of "
              f"{LOOKUP_OBJECT_BYTES // 1024} KiB stored by the same adapter (an existence check does not depend on "
              f"the object's size): *first*, the median over {args.lookup_reps} sets of keys each asked once "
              "(each key asked of the store: LMCache `s3` HEADs every key it has not seen); *again*, the median of "
              f"{args.lookup_reps} repeats of one set (LMCache `s3` then answers from the sizes it remembers, without "
              "asking the store; kvtier's adapter checks every batch with the store, `check_now`). Client CPU: `getrusage(RUSAGE_SELF)` of the run's "
              "process (LMCache, its controller threads and the one adapter), per GiB of chunks; server CPU: "
              "utime+stime of the s3s-fs process. L1 arenas written through once before use (untimed). "
              f"kvtier: configuration defaults{(' plus `' + args.kvtier_config + '`') if args.kvtier_config != '{}' else ''} "
              "(checksums on: a CRC32C of every chunk stored and checked on load; LMCache's adapters keep none); "
              f"LMCache `s3`: awscrt {info['awscrt']}, `s3_num_io_threads` {args.crt_threads}, `disable_tls`, "
              "`s3_prefer_http2` false, awscrt's own part size and multipart threshold (LMCache sets neither); both against one s3s-fs process on /dev/shm (bucket emptied between runs, "
              "untimed). LMCache `mock`: max_size_gb 64, mock_bandwidth_gb 1000 (no simulated delay at these "
              "sizes).",
              f"Machine: {os.cpu_count()} CPUs shared by client and server (and, during this run, by whatever else "
              f"ran), {platform.platform()}, Python {platform.python_version()}, torch {info['torch']}; load "
              f"average (1, 5, 15 min) at the start {info['load']}, at the end {info['load_end']}; the run took "
              f"{info['took']:.0f} s.",
              f"Command: `{' '.join([os.path.relpath(info['argv'][0], ROOT), *info['argv'][1:]])}`"]
    return "\n".join(lines) + "\n"


def versions(args):
    code = ("import sys, json; sys.path.append(%r); sys.path.insert(0, %r)\n"
            "import importlib.metadata as md, torch, awscrt\n"
            "print(json.dumps({'torch': torch.__version__, 'awscrt': md.version('awscrt'), "
            "'lmcache': md.version('lmcache')}))") % (LMCACHE_SITE, args.awscrt_site)
    try:
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(got.stdout.strip().splitlines()[-1])
    except Exception:  # noqa: BLE001 - versions are metadata, never a reason to fail
        return {"torch": "?", "awscrt": "?", "lmcache": "?"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapters", default=",".join(ADAPTERS), help="comma-separated subset of " + ", ".join(ADAPTERS))
    ap.add_argument("--chunks", type=int, default=32, help="chunks stored and loaded per run (32 MiB each by default)")
    ap.add_argument("--reps", type=int, default=5, help="runs of every adapter; the table shows medians")
    ap.add_argument("--lookup-keys", type=int, default=128)
    ap.add_argument("--lookup-reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256, help="tokens a chunk (LMCache's default chunk size)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--crt-threads", type=int, default=2, help="LMCache s3's s3_num_io_threads")
    ap.add_argument("--kvtier-config", default="{}", help="JSON merged into kvtier's adapter_params (its \"store\" into the store section)")
    ap.add_argument("--awscrt-site", default="/tmp/lmc-bench-awscrt",
                    help="a directory holding awscrt (pip install --target DIR awscrt)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a phase may take")
    ap.add_argument("--library", help="libkvtier.so (default: KVTIER_LIBRARY or target/release)")
    ap.add_argument("--s3s-fs", help="s3s-fs binary (default KVTIER_S3S_FS or tools/bin/s3s-fs)")
    ap.add_argument("--output", default=os.path.join(common.RESULTS, "lmcache.md"))
    # one run of one adapter, in a process of its own (the orchestrator starts these)
    ap.add_argument("--child", choices=ADAPTERS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(args)
        return
    adapters = [a for a in args.adapters.split(",") if a]
    bad = set(adapters) - set(ADAPTERS)
    if bad:
        ap.error(f"unknown adapter(s) {sorted(bad)}")
    if "lmcache-s3" in adapters and not os.path.isdir(os.path.join(args.awscrt_site, "awscrt")):
        sys.exit(f"awscrt is not in {args.awscrt_site}: `{sys.executable} -m pip install --target "
                 f"{args.awscrt_site} awscrt`, or give --awscrt-site")
    args.library = common.program("lib", args.library)
    info = {"load": common.loadavg(), "argv": sys.argv, **versions(args)}
    t_start = time.monotonic()
    workdir = common.scratch_dir("kvbench-lmcache-")
    port, server, root = start_s3sfs(args, workdir)
    log(f"s3s-fs on 127.0.0.1:{port} (pid {server.pid}, {root}); load average {info['load']}")
    runs = []
    try:
        for rep in range(args.reps):
            k = rep % len(adapters)
            for a in adapters[k:] + adapters[:k]:
                log(f"rep {rep + 1}/{args.reps}: {a}")
                r = one_run(a, args, port, server.pid if STORES[a] == "s3s-fs" else 0)
                runs.append(r)
                if r.get("error"):
                    log(f"  FAILED: {r['error']}")
                else:
                    info["chunk_bytes"] = r["chunk_bytes"]
                    log(f"  store {r['store_chunks_s']:.2f} chunks/s, {r['store_cpu_gib']:.3f} CPU-s/GiB; load "
                        f"{r['load_chunks_s']:.2f} chunks/s, {r['load_cpu_gib']:.3f} CPU-s/GiB; lookup "
                        f"{r['lookup_ms']:.2f} ms; wrong chunks {r['wrong_chunks']}")
                empty_bucket(root)
                if server.poll() is not None:
                    raise RuntimeError(f"s3s-fs exited {server.returncode}")
    finally:
        stop(server)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    info.setdefault("chunk_bytes", 2 * args.layers * args.tokens * args.heads * args.head_dim * 2)
    info["took"] = time.monotonic() - t_start
    info["load_end"] = common.loadavg()
    common.publish(report(aggregate(runs, adapters), args, info), args.output)


if __name__ == "__main__":
    main()
