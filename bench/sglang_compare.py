#!/usr/bin/env python3
"""bench/sglang_compare.py: kvtier's SGLang HiCache backend side by side with SGLang 0.5.23's
own storage backends, in one run, through the same backend calls on the same pages. One
file because it is one comparison: its backends, their runs through SGLang's calls, its report.

    tools/venv/bin/python bench/sglang_compare.py                      # defaults, ~5-10 min on 2 cores
    tools/venv/bin/python bench/sglang_compare.py --pages 4 --batch 2 --passes 1 --layouts page_first
    bench/run.py sglang                                                # the published run

Backends (each run on a store of its own: a fresh directory, or the store's server with the
previous run's objects deleted):

  local    kvtier (``kvtier.sglang.KvtierStorage``, store ``{"type": "local"}``) against SGLang's
           ``HiCacheFile`` on a directory under --root (a disk, not tmpfs, by default).
           HiCacheFile has no zero-copy interface, so it is driven as SGLang's controller drives
           it: ``host.get_data_page(index, flat=True)`` for every page, then ``batch_set``; for
           loads ``host.get_dummy_flat_data_page()`` targets, ``batch_get``, then
           ``host.set_from_flat_data_page``. Those copies are timed: the controller does them.
  s3s-fs   kvtier (store ``{"type": "s3"}``) against SGLang's ``SeaweedFSStore`` (boto3,
           ``batch_set_v1``/``batch_get_v1``), both against s3s-fs (files on disk).
  sink     the same two against bench/sink, the in-memory S3 endpoint (a client's ceiling).

kvtier is driven through ``batch_set_v1(keys, host_indices)`` / ``batch_get_v1`` (ranges of
the registered host pool, no staging copy), and every backend's ``batch_exists``.

Pages are SGLang's MHA host-pool pages (default 64 tokens x 32 layers x 8 heads x 128 x bf16 =
8 MiB, K+V): layout ``page_first`` hands out 2 pieces per page, ``layer_first`` 64. The host
pool (``MHATokenToKVPoolHost``, built as SGLang builds it, unpinned on CPU) holds --pages pages
filled with random bytes; each backend:

  warm-up  one batch stored and loaded under keys of its own, untimed (connections, threads);
  write    --passes passes over the pool, --batch pages per call, fresh keys every pass;
  read     the same keys back into the same pages, batch by batch: before each call the batch's
           pages are zeroed and after it they are compared byte for byte with what was written
           (a copy of the pool taken before the writes). Any difference marks the backend
           WRONG DATA and its speed is not reported;
  exists   ``batch_exists`` of --exists-keys stored keys (all present), --exists-reps times.

The page cache: dirty pages are written back (sync) before each backend's write phase and
between its write and read phases (untimed), so no backend inherits another's writeback;
reads of the local store and s3s-fs then come from the page cache, alike for both backends.
After each run its files (or objects) are deleted, untimed.

Every backend runs --reps times, interleaved (the two backends of a store take turns going first);
the table shows each metric's median over the repetitions and the range of pages/s. Measured
per call and summed over the calls of a phase: wall clock (pages/s); CPU of this
process, every thread (``getrusage(RUSAGE_SELF)``), per GiB moved; the server's CPU (utime +
stime of /proc/<pid>/stat) per GiB when the server is a child process started here. The
machine's cores are shared by client and server.

Writes bench/results/sglang.md (--output) and prints the same table with the issue's targets:
on S3, kvtier >= 2x SeaweedFSStore's throughput at <= 0.5x its CPU per GiB; on a local disk,
kvtier >= HiCacheFile's throughput at <= its CPU per GiB (client CPU, this process).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import faulthandler
import gc
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid

import common
from common import ACCESS_KEY, BUCKET, SECRET_KEY, cpu_now, fs_type

ROOT = common.ROOT
MODEL = "bench-org/bench-model"
STORES = ("local", "s3s-fs", "sink")
LAYOUTS = ("page_first", "layer_first")
SGLANG_NAME = {"local": "HiCacheFile", "s3s-fs": "SeaweedFSStore", "sink": "SeaweedFSStore"}
SERVER_KIND = {"s3s-fs": "s3sfs", "sink": "sink"}  # common.Server's names

log = common.logger("sglang-bench")


# ---------------------------------------------------------------------------------------------
# Environment: kvtier's library and package, SGLang's offline setup, the servers' binaries


def find_sink(explicit, build):
    """The sink (--sink, KVTIER_BENCH_SINK or the bench target directory), built if missing."""
    if build and not os.path.isfile(common.program("sink", explicit, required=False)):
        log("building the sink")
        common.build("sink")
    return common.program("sink", explicit)


def setup_python(library):
    common.use_package(library)
    # No model is ever downloaded; SGLang JIT-builds extensions with the venv's ninja.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    # HiCacheFile would take its directory from here instead of extra_config.
    os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)


# ---------------------------------------------------------------------------------------------
# Servers (child processes on free ports: common.Server) and CPU counters


def start_server(kind, args, workdir):
    """The store's server (a sink or s3s-fs on a directory of its own under ``workdir``);
    ``http_endpoint`` is the URL SGLang's backends and boto3 take."""
    root = tempfile.mkdtemp(prefix="s3s-fs-", dir=workdir) if kind == "s3s-fs" else None
    server = common.Server(SERVER_KIND[kind], log_dir=workdir, root=root,
                           programs={"sink": args.sink, "s3s-fs": args.s3s_fs})
    server.http_endpoint = f"http://{server.endpoint}"
    return server


def touch_cost():
    """Microseconds to first-touch one 4 KiB page of fresh anonymous memory (median of 3 x 64
    MiB): what every freshly allocated byte (page cache, a server's buffers) costs here."""
    import mmap

    size, out = 64 << 20, []
    for _ in range(3):
        m = mmap.mmap(-1, size)
        t0 = time.perf_counter()
        for off in range(0, size, 4096):
            m[off] = 1
        out.append((time.perf_counter() - t0) / (size // 4096) * 1e6)
        m.close()
    return statistics.median(out)


# ---------------------------------------------------------------------------------------------
# SGLang's pools (as python/tests/sglang_rig.py builds them, at the benchmark's geometry)


class Pools:
    def __init__(self, layout, args):
        import torch
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls

        self.layout, self.page = layout, args.page_tokens
        # host_to_device_ratio 2.0: the host pool holds twice the device pool's tokens.
        dev_tokens = max(1, (args.pages + 1) // 2) * args.page_tokens
        self.dev = MHATokenToKVPool(
            size=dev_tokens, page_size=args.page_tokens, dtype=torch.bfloat16, head_num=args.heads,
            head_dim=args.head_dim, layer_num=args.layers, device="cpu", enable_memory_saver=False,
        )
        info = self.dev.get_device_pool_infos()[0].buffer_info
        self.host = get_mha_host_pool_cls(info)(
            info, 2.0, 0, args.page_tokens, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=self.dev.size, start_layer=self.dev.start_layer,
            end_layer=self.dev.end_layer, write_back_staging=self.dev.hicache_write_back_staging,
        )
        self.indices = self.host.alloc(args.pages * args.page_tokens)
        assert self.indices is not None, "host pool too small"
        self.page_bytes = 2 * args.layers * args.page_tokens * args.heads * args.head_dim * 2
        # Random bytes, never a NaN or Inf pattern (bit 14, the exponent's top bit, cleared),
        # then a copy of the whole pool: what every read is compared with.
        gen = torch.Generator().manual_seed(20240607)
        bits = self.host.kv_buffer.view(torch.int16)
        bits.random_(-32768, 32767, generator=gen)
        bits.bitwise_and_(-16385)
        self.expected = self.host.kv_buffer.clone()

    def batch_indices(self, b, n):
        return self.indices[b * n * self.page:(b + 1) * n * self.page]

    def page_starts(self, idx):
        return [int(idx[i]) for i in range(0, len(idx), self.page)]

    def _view(self, buf, index):
        if self.layout == "layer_first":
            return buf[:, :, index:index + self.page]
        return buf[:, index:index + self.page]

    def zero(self, idx):
        for s in self.page_starts(idx):
            self._view(self.host.kv_buffer, s).zero_()

    def mismatches(self, idx):
        import torch

        return sum(
            not torch.equal(self._view(self.host.kv_buffer, s).view(torch.int16),
                            self._view(self.expected, s).view(torch.int16))
            for s in self.page_starts(idx))

    def flat_pages_differ(self, idx):
        """Cross-check through SGLang's own flat page (what its file backend stores)."""
        import torch

        s = self.page_starts(idx)[0]
        got = self.host.get_data_page(s, flat=True).view(torch.int16)
        saved = self._view(self.expected, s).flatten().view(torch.int16)
        return not torch.equal(got, saved)

    def pieces_per_page(self):
        ptrs, _ = self.host.get_page_buffer_meta(self.batch_indices(0, 1))
        return len(ptrs)


def storage_config(layout, extra):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=layout != "layer_first",
        model_name=MODEL, extra_config=dict(extra),
    )


# ---------------------------------------------------------------------------------------------
# Backends and how each is driven


class Driven:
    """A backend with SGLang's way of calling it: ``v1`` (zero-copy host indices) or ``flat``
    (the controller's generic page copies, for backends without interface_v1)."""

    def __init__(self, name, backend, mode, pools):
        self.name, self.backend, self.mode, self.pools = name, backend, mode, pools

    def write(self, keys, idx):
        if self.mode == "v1":
            ok = self.backend.batch_set_v1(keys, idx)
            return sum(bool(x) for x in ok)
        host = self.pools.host
        data = [host.get_data_page(s, flat=True) for s in self.pools.page_starts(idx)]
        return len(keys) if self.backend.batch_set(keys, data) else 0

    def read(self, keys, idx):
        if self.mode == "v1":
            ok = self.backend.batch_get_v1(keys, idx)
            return sum(bool(x) for x in ok)
        host = self.pools.host
        targets = [host.get_dummy_flat_data_page() for _ in keys]
        pages = self.backend.batch_get(keys, targets)
        done = 0
        for s, page in zip(self.pools.page_starts(idx), pages):
            if page is None:
                break
            host.set_from_flat_data_page(s, page)
            done += 1
        return done

    def exists(self, keys):
        return self.backend.batch_exists(keys)

    def close(self):
        b = self.backend
        if hasattr(b, "close"):
            b.close()
        executor = getattr(b, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)


def make_backend(which, store, layout, pools, server, workdir, args, tag):
    """The backend on a store of its own (a fresh directory, or a server holding no other run's
    objects: names never repeat, since keys are fresh every run), so no prefix:
    s3s-fs keeps an object's metadata in a file named by the base64 of bucket and key, which
    must fit in 255 bytes; kvtier's names (sglang/<model>/<pool geometry>/<shard>/...) leave
    room for about 8 more characters, and its checksums travel as metadata."""
    if which == "kvtier":
        from kvtier.sglang import KvtierStorage

        if store == "local":
            kv_store = {"type": "local", "path": os.path.join(workdir, f"kvtier-{tag}")}
        else:
            kv_store = {"type": "s3", "bucket": BUCKET, "endpoint_override": server.http_endpoint,
                        "access_key": ACCESS_KEY, "secret_key": SECRET_KEY, "region": "us-east-1",
                        "allow_http": True}
        extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
                 "interface_v1": 1, "store": kv_store, **args.kvtier_extra}
        backend = KvtierStorage(storage_config(layout, extra))
        backend.register_mem_pool_host(pools.host)
        backend.on_host_pools_registered()
        return Driven("kvtier", backend, "v1", pools), kv_store.get("path")
    if store == "local":
        from sglang.srt.mem_cache.hicache_storage import HiCacheFile

        path = os.path.join(workdir, f"hicachefile-{tag}")
        backend = HiCacheFile(storage_config(layout, {"file_storage_path": path}))
        backend.register_mem_pool_host(pools.host)
        return Driven("HiCacheFile", backend, "flat", pools), path
    from sglang.srt.mem_cache.storage.seaweedfs.seaweedfs_store import SeaweedFSStore

    extra = {"endpoint": server.http_endpoint, "bucket": BUCKET, "region": "us-east-1",
             "access_key": ACCESS_KEY, "secret_key": SECRET_KEY, "max_workers": args.seaweed_workers}
    backend = SeaweedFSStore(storage_config(layout, extra))
    backend.register_mem_pool_host(pools.host)
    return Driven("SeaweedFSStore", backend, "v1", pools), None


def page_keys(tag, n, start=0):
    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(start, start + n)]


class Phase:
    def __init__(self):
        self.wall = self.cpu = self.server_cpu = 0.0
        self.pages = 0

    def call(self, fn, server):
        s0 = server.cpu() if server else 0.0
        c0, t0 = cpu_now(), time.perf_counter()
        done = fn()
        t1, c1 = time.perf_counter(), cpu_now()
        s1 = server.cpu() if server else 0.0
        self.wall += t1 - t0
        self.cpu += c1 - c0
        self.server_cpu += s1 - s0
        return done


class Servers:
    """One server per S3 store, started on first use and kept for every run (restarted if it
    died): a fresh process per run would pay for first-touching all its memory again (on
    this VM a first touch of a page costs tens of microseconds), which is noise, not the
    clients' cost. Each run deletes its objects after it, untimed."""

    def __init__(self, args, workdir):
        self.args, self.workdir, self.running = args, workdir, {}

    def get(self, store):
        server = self.running.get(store)
        if server is None or not server.alive():
            if server is not None:
                log(f"the {store} server had exited ({server.tail(200)!r}); starting another")
                server.stop()
            server = self.running[store] = start_server(store, self.args, self.workdir)
        return server

    def stop(self):
        for server in self.running.values():
            server.stop()


def delete_objects(server, names):
    """Deletes the run's objects (one DeleteObject each: the sink has no DeleteObjects)."""
    import boto3
    from botocore.config import Config
    from concurrent.futures import ThreadPoolExecutor

    client = boto3.client("s3", endpoint_url=server.http_endpoint, region_name="us-east-1",
                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                          config=Config(s3={"addressing_style": "path"}, max_pool_connections=8))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: client.delete_object(Bucket=BUCKET, Key=name), names))


def object_names(driven, keys):
    b = driven.backend
    if driven.name == "kvtier":
        # <namespace>/<hex[0:3]>/<hex[3:5]>_g0/<hex>.bin (no prefix)
        return [f"{b.namespace}/{k[:3]}/{k[3:5]}_g0/{k}.bin" for k in keys]
    return [b._object_key(k) for k in keys]


def run_backend(which, store, layout, pools, args, workdir, servers):
    """One backend on a store of its own (a fresh directory, or the store's server with the
    run's objects deleted after it): warm-up, write, read (verified), exists."""
    tag = f"{layout}-{store}-{which}-{uuid.uuid4().hex[:6]}"
    row = {"layout": layout, "store": store, "backend": which if which == "kvtier" else SGLANG_NAME[store],
           "pieces": pools.pieces_per_page(), "error": None}
    server = driven = path = None
    timer = None
    written = []
    try:
        if store != "local":
            server = servers.get(store)

        def deadline():
            log(f"{tag}: still running after {args.timeout:.0f} s; threads:")
            faulthandler.dump_traceback(all_threads=True)
            if server is not None:
                log(f"{tag}: stopping the {store} server so the blocked calls fail")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.proc.pid, signal.SIGKILL)

        timer = threading.Timer(args.timeout, deadline)
        timer.daemon = True
        timer.start()
        driven, path = make_backend(which, store, layout, pools, server, workdir, args, tag)
        row["mode"] = driven.mode
        # kvtier's counters from here on (its start-up probes, before, are not part of the runs).
        stats0 = driven.backend.tier.stats() if which == "kvtier" else None
        n, per_pass = args.batch, args.pages // args.batch

        # Warm-up: one batch under keys of its own, untimed.
        wkeys = page_keys(tag + "/warmup", n)
        written += wkeys
        widx = pools.batch_indices(0, n)
        if driven.write(wkeys, widx) != n or driven.read(wkeys, widx) != n:
            raise RuntimeError("warm-up batch failed")
        if pools.mismatches(widx):
            raise RuntimeError("warm-up batch read back wrong bytes")

        keys = [page_keys(f"{tag}/pass{p}", per_pass * n) for p in range(args.passes)]
        written += [k for ks in keys for k in ks]
        os.sync()
        write = Phase()
        for p in range(args.passes):
            for b in range(per_pass):
                k = keys[p][b * n:(b + 1) * n]
                done = write.call(lambda: driven.write(k, pools.batch_indices(b, n)), server)
                write.pages += n
                if done != n:
                    raise RuntimeError(f"write pass {p} batch {b}: {done}/{n} pages stored")
        os.sync()
        read = Phase()
        wrong = 0
        for p in range(args.passes):
            for b in range(per_pass):
                k, idx = keys[p][b * n:(b + 1) * n], pools.batch_indices(b, n)
                pools.zero(idx)
                done = read.call(lambda: driven.read(k, idx), server)
                read.pages += n
                if done != n:
                    raise RuntimeError(f"read pass {p} batch {b}: {done}/{n} pages loaded")
                wrong += pools.mismatches(idx)
        if not wrong and pools.flat_pages_differ(pools.batch_indices(0, n)):
            wrong += 1
        row["verified_pages"] = read.pages - wrong
        row["wrong_pages"] = wrong

        ekeys = [k for ks in keys for k in ks][:args.exists_keys]
        lat = []
        before = driven.backend.tier.stats()["existence_checks"] if which == "kvtier" else None
        for _ in range(args.exists_reps):
            t0 = time.perf_counter()
            hit = driven.exists(ekeys)
            lat.append(time.perf_counter() - t0)
            if hit != len(ekeys):
                raise RuntimeError(f"batch_exists answered {hit} of {len(ekeys)} present keys")
        if before is not None:
            asked = driven.backend.tier.stats()["existence_checks"] - before
            if asked != len(ekeys) * args.exists_reps:
                log(f"{tag}: batch_exists asked the store {asked} times for "
                    f"{len(ekeys) * args.exists_reps} keys")
        row["exists_keys"] = len(ekeys)
        row["exists_ms"] = statistics.median(lat) * 1e3

        gib = pools.page_bytes / (1 << 30)
        for name, ph in (("write", write), ("read", read)):
            row[f"{name}_pages_s"] = ph.pages / ph.wall
            row[f"{name}_mib_s"] = ph.pages * pools.page_bytes / (1 << 20) / ph.wall
            row[f"{name}_cpu_gib"] = ph.cpu / (ph.pages * gib)
            row[f"{name}_server_cpu_gib"] = ph.server_cpu / (ph.pages * gib) if server else None
        if which == "kvtier":
            stats = driven.backend.tier.stats()
            row["kvtier_stats"] = {k: stats[k] - stats0[k] for k in (
                "keys_stored", "keys_loaded", "keys_failed", "retries", "dedup_already_stored",
                "existence_checks", "direct_requests", "direct_fallbacks", "corrupt_blocks")}
        if server is not None and not server.alive():
            raise RuntimeError(f"the {store} server exited: {server.tail()}")
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        if server is not None and server.tail():
            row["error"] += f" (server log: {server.tail(200)!r})"
        log(f"{tag}: FAILED: {row['error']}")
        traceback.print_exc()
    finally:
        if timer is not None:
            timer.cancel()
        names = object_names(driven, written) if driven is not None and server is not None else []
        if driven is not None:
            with contextlib.suppress(Exception):
                driven.close()
        driven = None
        gc.collect()
        if names and server.alive():
            try:
                delete_objects(server, names)
            except Exception as exc:
                log(f"{tag}: deleting its objects failed: {exc}")
        os.sync()
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
    return row


# ---------------------------------------------------------------------------------------------
# The report


METRICS = ("write_pages_s", "write_mib_s", "write_cpu_gib", "write_server_cpu_gib",
           "read_pages_s", "read_mib_s", "read_cpu_gib", "read_server_cpu_gib", "exists_ms")


def aggregate(runs):
    """One row per (layout, store, backend): the median of every metric over the repetitions
    (pages/s also with its min and max); a failure or a wrong page in any repetition marks it."""
    groups = {}
    for r in runs:
        groups.setdefault((r["layout"], r["store"], r["backend"]), []).append(r)
    rows = []
    for (layout, store, backend), rs in groups.items():
        ok = [r for r in rs if not r["error"]]
        row = {"layout": layout, "store": store, "backend": backend, "pieces": rs[0]["pieces"],
               "page_mib": rs[0]["page_mib"], "reps": len(rs), "error": None,
               "wrong_pages": sum(r.get("wrong_pages", 0) for r in ok),
               "verified_pages": sum(r.get("verified_pages", 0) for r in ok)}
        failed = [r for r in rs if r["error"]]
        if failed:
            row["error"] = f"failed in {len(failed)} of {len(rs)} runs: {failed[0]['error']}"
        if ok:
            row["exists_keys"] = ok[0]["exists_keys"]
            for m in METRICS:
                vals = [r[m] for r in ok if r.get(m) is not None]
                row[m] = statistics.median(vals) if vals else None
                if m.endswith("_pages_s") and vals:
                    row[m + "_range"] = (min(vals), max(vals))
            stats = [r["kvtier_stats"] for r in ok if "kvtier_stats" in r]
            if stats:
                row["kvtier_stats"] = {k: sum(st[k] for st in stats) for k in stats[0]}
        rows.append(row)
    return rows


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows, args):
    lines = ["| layout | store | backend | pieces/page | write pages/s (MiB/s) [min-max pages/s] | "
             "read pages/s (MiB/s) [min-max] | "
             "client CPU s/GiB write / read | server CPU s/GiB write / read | "
             "batch_exists ms (keys) | verified |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        head = f"| {r['layout']} | {r['store']} | {r['backend']} | {r['pieces']} |"
        if r["error"]:
            lines.append(f"{head} FAILED | FAILED | - | - | - | {r['error'].replace('|', '/')} |")
            continue
        if r["wrong_pages"]:
            lines.append(f"{head} - | - | - | - | - | WRONG DATA: {r['wrong_pages']} pages differ |")
            continue
        server = (f"{fmt(r['write_server_cpu_gib'], '.3f')} / {fmt(r['read_server_cpu_gib'], '.3f')}"
                  if r["write_server_cpu_gib"] is not None else "- (no server)")
        spread = {p: "[{:.0f}-{:.0f}]".format(*r[f"{p}_pages_s_range"]) for p in ("write", "read")}
        lines.append(
            f"{head} {r['write_pages_s']:.1f} ({r['write_mib_s']:.0f}) {spread['write']} | {r['read_pages_s']:.1f} "
            f"({r['read_mib_s']:.0f}) {spread['read']} | {r['write_cpu_gib']:.3f} / {r['read_cpu_gib']:.3f} | "
            f"{server} | "
            f"{r['exists_ms']:.2f} ({r['exists_keys']}) | {r['verified_pages']} pages, byte-exact |")
    return lines


def targets(rows):
    """kvtier against SGLang's backend, per layout, store and direction."""
    lines = ["| layout | store | phase | kvtier / SGLang throughput | kvtier / SGLang client CPU per GiB | "
             "target | met |", "|---|---|---|---:|---:|---|---|"]
    missed, unmet = [], []
    by = {(r["layout"], r["store"], r["backend"] == "kvtier"): r for r in rows}
    for (layout, store, is_kv), kv in by.items():
        if not is_kv:
            continue
        other = by.get((layout, store, False))
        want_tp, want_cpu = (1.0, 1.0) if store == "local" else (2.0, 0.5)
        target = f">= {want_tp:g}x, <= {want_cpu:g}x"
        for phase in ("write", "read"):
            if other is None or kv["error"] or other["error"] or kv["wrong_pages"] or other["wrong_pages"]:
                lines.append(f"| {layout} | {store} | {phase} | - | - | {target} | not measured |")
                unmet.append(f"{layout}/{store}/{phase}")
                continue
            tp = kv[f"{phase}_pages_s"] / other[f"{phase}_pages_s"]
            cpu = kv[f"{phase}_cpu_gib"] / other[f"{phase}_cpu_gib"]
            ok_tp, ok_cpu = tp >= want_tp, cpu <= want_cpu
            met = "yes" if ok_tp and ok_cpu else "NO (" + ", ".join(
                w for w, bad in (("throughput", not ok_tp), ("CPU", not ok_cpu)) if bad) + ")"
            if met != "yes":
                missed.append(f"{layout}/{store}/{phase}")
            lines.append(f"| {layout} | {store} | {phase} | {tp:.2f}x | {cpu:.2f}x | {target} | {met} |")
    return lines, missed, unmet


def versions():
    out = {}
    for mod in ("torch", "sglang", "boto3", "botocore"):
        with contextlib.suppress(Exception):
            out[mod] = __import__(mod).__version__
    return ", ".join(f"{k} {v}" for k, v in out.items())


def report(rows, args, started, root_fs):
    gib_per_phase = args.passes * (args.pages // args.batch) * args.batch * rows[0]["page_mib"] / 1024 if rows else 0
    lines = [f"# kvtier against SGLang's HiCache storage backends ({_dt.date.today().isoformat()})", "",
             f"Pages of {args.page_tokens} tokens x {args.layers} layers x {args.heads} heads x {args.head_dim} "
             f"x bf16 = {rows[0]['page_mib']:g} MiB (K+V); host pool of {args.pages} pages, "
             f"{args.batch} pages per call, {args.passes} pass(es) = {gib_per_phase:g} GiB written and read "
             f"per backend and repetition (after one untimed warm-up batch); batch_exists median of "
             f"{args.exists_reps} calls. Medians of {args.reps} repetition(s), interleaved; every run on a fresh "
             "directory, or on the store's server (one process per store for the whole run) with the "
             "previous run's objects deleted.", "",
             *table(rows, args), ""]
    tlines, missed, unmet = targets(rows)
    lines += ["Targets from the issue: on S3, kvtier >= 2x SeaweedFSStore's throughput at <= 0.5x its CPU "
              "per GiB; on a local disk, kvtier >= HiCacheFile's throughput at <= its CPU per GiB "
              "(client CPU: this process, every thread).", "", *tlines, "",
              "Targets: " + ("all met." if not missed and not unmet else
                             "; ".join(p for p in (missed and "missed by " + ", ".join(missed),
                                                   unmet and "not measured: " + ", ".join(unmet)) if p) + "."),
              "",
              "How: kvtier through `batch_set_v1`/`batch_get_v1` (zero-copy ranges of the registered host "
              "pool), configuration defaults" + (f" plus `{json.dumps(args.kvtier_extra)}`" if args.kvtier_extra
                                                 else "") +
              " (checksums on: a CRC32C of every page stored and verified on load; SGLang's backends keep "
              "none); SeaweedFSStore through `batch_set_v1`/`batch_get_v1` (boto3, "
              f"max_workers {args.seaweed_workers}); HiCacheFile through `batch_set`/`batch_get` with the "
              "controller's flat-page copies (`get_data_page`, `get_dummy_flat_data_page`, "
              "`set_from_flat_data_page`) timed. Fresh keys every pass; every page read is compared byte for "
              "byte with what was written. Wall clock and CPU are summed over the calls; client CPU is "
              "`getrusage(RUSAGE_SELF)` of this process, server CPU utime+stime of the server process "
              "(both per GiB moved). Dirty pages written back before the write and the read phase (untimed); "
              "loads from the local store and s3s-fs are served from the page cache.",
              f"Machine: {os.cpu_count()} CPUs shared by client and server, {platform.platform()}, Python "
              f"{platform.python_version()}, {versions()}; local store and s3s-fs on {root_fs} under "
              f"{args.root}; load average (1, 5, 15 min) at the start {started['load']}, at the end "
              f"{started['load_end']}; the run took {started['took']:.0f} s. First touch of fresh anonymous memory: "
              f"{started['touch']:.1f} us per 4 KiB page at the start, {started['touch_end']:.1f} at the end "
              f"({started['touch'] * 262144 / 1e6:.2f} / {started['touch_end'] * 262144 / 1e6:.2f} CPU-s per GiB): "
              "every freshly allocated GiB (page cache of new files, a server's buffers) costs that much "
              "CPU on top.",
              f"Command: `{' '.join(started['argv'])}`"]
    counters = [f"- {r['layout']} / {r['store']} ({r['reps']} runs): {json.dumps(r['kvtier_stats'])}"
                for r in rows if r.get("kvtier_stats")]
    if counters:
        lines += ["", "kvtier's counters, summed over the runs, warm-up and exists included (retries: requests "
                  "repeated; dedup_already_stored: conditional PUTs that found the object; direct_*: loads and "
                  "HEADs on the direct HTTP path):",
                  "", *counters]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", default=",".join(STORES), help="comma-separated subset of " + ", ".join(STORES))
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated subset of " + ", ".join(LAYOUTS))
    ap.add_argument("--backends", default="kvtier,sglang", help="kvtier, sglang or both")
    ap.add_argument("--pages", type=int, default=64, help="pages in the host pool (8 MiB each by default)")
    ap.add_argument("--batch", type=int, default=16, help="pages per backend call (SGLang's STORAGE_BATCH_SIZE is 128)")
    ap.add_argument("--passes", type=int, default=2, help="write (and read) passes over the pool, fresh keys each")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every backend; the table shows medians")
    ap.add_argument("--exists-keys", type=int, default=128)
    ap.add_argument("--exists-reps", type=int, default=7)
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seaweed-workers", type=int, default=16, help="SeaweedFSStore's max_workers (its default 16)")
    ap.add_argument("--kvtier-config", default="{}",
                    help="JSON merged into kvtier's extra_config, e.g. '{\"checksums\": false}'")
    ap.add_argument("--root", default=os.path.join(ROOT, "target", "bench-sglang"),
                    help="directory for the local stores and s3s-fs (a disk by default, not tmpfs)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds one backend may take before its threads are dumped and its server stopped")
    ap.add_argument("--library", help="libkvtier.so (default: KVTIER_LIBRARY, target/release, CARGO_TARGET_DIR)")
    ap.add_argument("--sink", help="kvtier-bench-sink binary")
    ap.add_argument("--s3s-fs", help="s3s-fs binary (default KVTIER_S3S_FS or tools/bin/s3s-fs)")
    ap.add_argument("--no-build", action="store_true", help="do not build the sink when it is missing")
    ap.add_argument("--output", default=os.path.join(ROOT, "bench", "results", "sglang.md"))
    args = ap.parse_args()
    stores = [s for s in args.stores.split(",") if s]
    layouts = [s for s in args.layouts.split(",") if s]
    backends = [s for s in args.backends.split(",") if s]
    for got, allowed, what in ((stores, STORES, "store"), (layouts, LAYOUTS, "layout"),
                               (backends, ("kvtier", "sglang"), "backend")):
        bad = set(got) - set(allowed)
        if bad:
            ap.error(f"unknown {what}(s) {sorted(bad)}; choose from {', '.join(allowed)}")
    if args.pages % args.batch:
        ap.error("--pages must be a multiple of --batch")
    args.kvtier_extra = json.loads(args.kvtier_config)

    library = common.program("lib", args.library)
    if "sink" in stores:
        args.sink = find_sink(args.sink, not args.no_build)
    if "s3s-fs" in stores:
        args.s3s_fs = common.program("s3s-fs", args.s3s_fs)
    setup_python(library)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="[%(name)s] %(levelname)s %(message)s")
    started = {"load": " ".join(open("/proc/loadavg").read().split()[:3]), "argv": sys.argv,
               "touch": touch_cost()}
    t_start = time.monotonic()
    log(f"library {library}; load average {started['load']}")

    import torch

    os.makedirs(args.root, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="run-", dir=args.root)
    runs = []
    servers = Servers(args, workdir)
    try:
        # One pool per layout, built once and kept for every repetition.
        pools = {}
        for layout in layouts:
            log(f"building the {layout} pools ({args.pages} pages)")
            pools[layout] = Pools(layout, args)
        for r in range(args.reps):
            for li, layout in enumerate(layouts):
                for si, store in enumerate(stores):
                    # Which backend goes first alternates (by layout, store and repetition), so
                    # drift on the machine hits both alike.
                    order = backends if (li + si + r) % 2 == 0 else backends[::-1]
                    for which in order:
                        log(f"rep {r + 1}/{args.reps}: {layout} / {store} / "
                            f"{which if which == 'kvtier' else SGLANG_NAME[store]}")
                        row = run_backend(which, store, layout, pools[layout], args, workdir, servers)
                        row["page_mib"] = pools[layout].page_bytes / (1 << 20)
                        runs.append(row)
                        if not row["error"]:
                            log(f"  write {row['write_pages_s']:.1f} pages/s, {row['write_cpu_gib']:.3f} CPU-s/GiB; "
                                f"read {row['read_pages_s']:.1f} pages/s, {row['read_cpu_gib']:.3f} CPU-s/GiB; "
                                f"exists {row['exists_ms']:.2f} ms; wrong pages {row['wrong_pages']}"
                                + (f"; kvtier {row['kvtier_stats']}" if "kvtier_stats" in row else ""))
        del pools
        gc.collect()
    finally:
        servers.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    rows = aggregate(runs)
    started["took"] = time.monotonic() - t_start
    started["load_end"] = " ".join(open("/proc/loadavg").read().split()[:3])
    started["touch_end"] = touch_cost()
    if not rows:
        sys.exit("nothing ran")
    text = report(rows, args, started, fs_type(args.root))
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        f.write(text)
    log(f"wrote {args.output}")


if __name__ == "__main__":
    main()
