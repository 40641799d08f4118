#!/usr/bin/env python3
"""bench/clients.py: one benchmark point through a Python-reachable S3 client.

    python3 bench/clients.py --client nixl|awscrt|boto3 --ops store,load --endpoint 127.0.0.1:PORT \
        --block-size 2097152 --blocks 128 --concurrency 16
    python3 bench/clients.py --client nixl --ops exists --blocks 256 --repeat 10 ...

Prints one JSON line per op with the same fields as bench/driver_kvtier.c, so bench/compare
can put every client in one table. Keys, object names and block bytes are computed exactly
as the C driver computes them (splitmix64's finaliser, see driver_kvtier.c), so every client
moves the same bytes under the same names (the rule is bench/common.py's):

    key i  = 4 little-endian words mix((key_seed << 32) ^ (4i + k)) + group 0
    name   = <prefix>/<hex[0:3]>/<hex[3:5]>_g0/<hex>.bin     (kvtier's / vLLM's layout)
    word j of block i = mix((data_seed << 56) | (i << 28) | j)

Workload shape (same as the C driver): one block per request, `--concurrency` requests in
flight, a new one started as soon as one finishes. Loads use `Range: bytes=0-(n-1)` (as
vLLM's obj tier does) into a pre-faulted pool, and every byte is compared afterwards.
CPU = getrusage(RUSAGE_SELF) user+sys over the timed part only (data generation and
verification are outside it).

Clients:
  nixl    NIXL OBJ (nixl_cu12 wheel), driven as vLLM's obj tier drives it: one DRAM
          registration of the pool and a prepared local descriptor list, then per job:
          register an OBJ descriptor (devId, object name), prepare the remote list,
          make_prepped_xfer, transfer, poll check_xfer_state, release. NIXL has no
          completion fd, so in-flight jobs are polled every --poll-interval-ms (default
          1 ms, a fraction of a vLLM scheduler step). num_threads = concurrency.
          exists: one query_memory call with all keys per batch.
  awscrt  aws-crt-python S3Client (tls off, port via the Host header), part size and
          multipart threshold above the block size so a block is one request. PUT body
          read with readinto() straight from the pool; GET body chunks copied into the
          pool at their offsets from on_body. exists: HEAD requests, all in flight.
  boto3   one boto3 client (max_pool_connections = concurrency) shared by a
          ThreadPoolExecutor of `concurrency` threads; put_object(Body=bytes of the
          block), get_object(Range=...)['Body'].read() copied into the pool;
          exists: head_object on the pool.
"""

import argparse
import io
import json
import os
import resource
import sys
import threading
import time

import numpy as np

from common import block_words, object_name, proc_cpu


def rusage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def percentiles(values):
    if not values:
        return {"lat_p50_ms": 0, "lat_p90_ms": 0, "lat_p99_ms": 0, "lat_max_ms": 0}
    a = np.array(values) * 1e3
    return {
        "lat_p50_ms": float(np.percentile(a, 50)),
        "lat_p90_ms": float(np.percentile(a, 90)),
        "lat_p99_ms": float(np.percentile(a, 99)),
        "lat_max_ms": float(a.max()),
    }


class Pool:
    """A pre-faulted pool of `blocks` blocks."""

    def __init__(self, blocks, block_bytes):
        self.blocks = blocks
        self.block_bytes = block_bytes
        self.buf = np.empty(blocks * block_bytes, dtype=np.uint8)
        self.buf.fill(0xA5)
        self.addr = self.buf.ctypes.data
        self.mv = memoryview(self.buf)

    def fill(self, data_seed):
        nw = self.block_bytes // 8
        words = self.buf.view("<u8")
        for b in range(self.blocks):
            words[b * nw:(b + 1) * nw] = block_words(data_seed, b, nw)

    def clear(self):
        self.buf.fill(0xA5)

    def bad_blocks(self, data_seed):
        nw = self.block_bytes // 8
        words = self.buf.view("<u8")
        return sum(
            0 if np.array_equal(words[b * nw:(b + 1) * nw], block_words(data_seed, b, nw)) else 1
            for b in range(self.blocks)
        )

    def block(self, b):
        return self.mv[b * self.block_bytes:(b + 1) * self.block_bytes]


# ---------------------------------------------------------------------------------------
# Clients. Each has setup(), start(op, block, name, done_cb) for store/load, and
# exists_batch(names) -> list[bool].


class NixlClient:
    AGENT = "ObjAgent"

    def __init__(self, a, pool):
        from nixl_cu12._api import nixl_agent, nixl_agent_config

        self.a, self.pool = a, pool
        cfg = nixl_agent_config(enable_prog_thread=True, backends=[])
        self.agent = nixl_agent(self.AGENT, cfg)
        params = {
            "bucket": a.bucket,
            "endpoint_override": a.endpoint,
            "scheme": "http",
            "access_key": a.access_key,
            "secret_key": a.secret_key,
            "region": a.region,
            "num_threads": str(a.concurrency),
        }
        self.agent.create_backend("OBJ", params)
        self.next_dev = 1
        if pool is not None:
            bb = pool.block_bytes
            self.dram = self.agent.register_memory([(pool.addr, pool.blocks * bb, 0, "")], "DRAM")
            self.local = self.agent.prep_xfer_dlist(
                "NIXL_INIT_AGENT", [(pool.addr + i * bb, bb, 0) for i in range(pool.blocks)], "DRAM"
            )

    def run(self, op, names, on_done):
        """Keeps `concurrency` transfers in flight; calls on_done(i, ok) per block."""
        a, bb = self.a, self.pool.block_bytes
        ag = self.agent
        inflight = {}
        nxt, done = 0, 0
        n = len(names)
        sleep = a.poll_interval_ms / 1000.0
        opname = "WRITE" if op == "store" else "READ"
        while done < n:
            while len(inflight) < a.concurrency and nxt < n:
                dev = self.next_dev
                self.next_dev += 1
                files = ag.register_memory([(0, bb, dev, names[nxt])], "OBJ")
                remote = ag.prep_xfer_dlist(self.AGENT, [(0, bb, dev)], "OBJ")
                h = ag.make_prepped_xfer(opname, self.local, [nxt], remote, [0])
                st = ag.transfer(h)
                inflight[nxt] = (h, remote, files, time.monotonic())
                if st == "ERR":
                    pass  # reported by check_xfer_state below
                nxt += 1
            finished = []
            for i, (h, remote, files, t0) in inflight.items():
                st = ag.check_xfer_state(h)
                if st != "PROC":
                    finished.append((i, st == "DONE"))
            for i, ok in finished:
                h, remote, files, t0 = inflight.pop(i)
                h.release()
                remote.release()
                ag.deregister_memory(files)
                on_done(i, ok, time.monotonic() - t0)
                done += 1
            if not finished:
                time.sleep(sleep)

    def exists_batch(self, names):
        res = self.agent.query_memory([(0, 1, 0, nm) for nm in names], "OBJ", "OBJ")
        return [r is not None for r in res]


class AwscrtClient:
    def __init__(self, a, pool):
        from awscrt.auth import AwsCredentialsProvider
        from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
        from awscrt.s3 import S3Client, S3RequestTlsMode

        self.a, self.pool = a, pool
        elg = EventLoopGroup()
        bootstrap = ClientBootstrap(elg, DefaultHostResolver(elg))
        # One request per block unless a part size is given (then objects above it are
        # split into parts, as awscrt's users get it).
        part = a.crt_part_bytes or max(8 << 20, (pool.block_bytes if pool else 0) + 1)
        self.client = S3Client(
            bootstrap=bootstrap,
            region=a.region,
            tls_mode=S3RequestTlsMode.DISABLED,
            credential_provider=AwsCredentialsProvider.new_static(a.access_key, a.secret_key),
            part_size=part,
            multipart_upload_threshold=part,
            throughput_target_gbps=a.crt_target_gbps,
        )
        self.host = a.endpoint

    def _request(self, method, name, headers=(), body=None):
        from awscrt.http import HttpHeaders, HttpRequest

        h = HttpHeaders([("Host", self.host)] + list(headers))
        return HttpRequest(method, f"/{self.a.bucket}/{name}", h, body)

    def run(self, op, names, on_done):
        from awscrt.s3 import S3RequestType

        a, pool, bb = self.a, self.pool, self.pool.block_bytes
        n = len(names)
        cv = threading.Condition()
        state = {"next": 0, "inflight": 0, "done": 0}
        keep = {}

        def launch(i):
            t0 = time.monotonic()
            status = {}

            def on_headers(status_code, headers, **kw):
                status["code"] = status_code

            def on_done_cb(error=None, status_code=None, **kw):
                ok = error is None and (status_code or status.get("code", 0)) in (200, 206)
                with cv:
                    keep.pop(i, None)
                    state["inflight"] -= 1
                    state["done"] += 1
                    on_done(i, ok, time.monotonic() - t0)
                    cv.notify()

            if op == "store":
                body = _Reader(pool.block(i))
                req = self._request("PUT", names[i], [("Content-Length", str(bb))], body)
                fut = self.client.make_request(
                    type=S3RequestType.PUT_OBJECT, request=req, on_headers=on_headers, on_done=on_done_cb
                )
            else:
                dest = pool.block(i)

                def on_body(chunk, offset, **kw):
                    dest[offset:offset + len(chunk)] = chunk

                req = self._request("GET", names[i], [("Range", f"bytes=0-{bb - 1}")])
                fut = self.client.make_request(
                    type=S3RequestType.GET_OBJECT,
                    request=req,
                    on_headers=on_headers,
                    on_body=on_body,
                    on_done=on_done_cb,
                )
            keep[i] = fut

        with cv:
            while state["done"] < n:
                while state["inflight"] < a.concurrency and state["next"] < n:
                    i = state["next"]
                    state["next"] += 1
                    state["inflight"] += 1
                    launch(i)
                cv.wait(timeout=1.0)

    def exists_batch(self, names):
        from awscrt.s3 import S3RequestType

        results = [None] * len(names)
        cv = threading.Condition()
        left = [len(names)]
        keep = []
        for i, nm in enumerate(names):
            code = {}

            def on_headers(status_code, headers, code=code, **kw):
                code["c"] = status_code

            def on_done_cb(error=None, status_code=None, i=i, code=code, **kw):
                sc = status_code or code.get("c", 0)
                with cv:
                    results[i] = sc == 200
                    left[0] -= 1
                    cv.notify()

            req = self._request("HEAD", nm)
            keep.append(
                self.client.make_request(
                    type=S3RequestType.DEFAULT,
                    operation_name="HeadObject",
                    request=req,
                    on_headers=on_headers,
                    on_done=on_done_cb,
                )
            )
        with cv:
            while left[0]:
                cv.wait(timeout=1.0)
        return results


class _Reader(io.RawIOBase):
    """A read-only stream over a memoryview: readinto copies straight from the pool."""

    def __init__(self, mv):
        self.mv, self.pos = mv, 0

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), len(self.mv) - self.pos)
        b[:n] = self.mv[self.pos:self.pos + n]
        self.pos += n
        return n

    def seekable(self):
        return True

    def seek(self, off, whence=0):
        self.pos = off if whence == 0 else (self.pos + off if whence == 1 else len(self.mv) + off)
        return self.pos

    def tell(self):
        return self.pos


class Boto3Client:
    def __init__(self, a, pool):
        import boto3
        from botocore.config import Config

        self.a, self.pool = a, pool
        self.s3 = boto3.client(
            "s3",
            endpoint_url=f"http://{a.endpoint}",
            aws_access_key_id=a.access_key,
            aws_secret_access_key=a.secret_key,
            region_name=a.region,
            config=Config(
                max_pool_connections=max(a.concurrency, 10),
                s3={"addressing_style": "path"},
                retries={"max_attempts": 3},
            ),
        )
        from concurrent.futures import ThreadPoolExecutor

        self.ex = ThreadPoolExecutor(max_workers=a.concurrency)

    def run(self, op, names, on_done):
        from concurrent.futures import FIRST_COMPLETED, wait

        a, pool, bb = self.a, self.pool, self.pool.block_bytes

        def one(i):
            t0 = time.monotonic()
            try:
                if op == "store":
                    self.s3.put_object(Bucket=a.bucket, Key=names[i], Body=pool.block(i).tobytes())
                else:
                    r = self.s3.get_object(Bucket=a.bucket, Key=names[i], Range=f"bytes=0-{bb - 1}")
                    data = r["Body"].read()
                    if len(data) != bb:
                        return i, False, time.monotonic() - t0
                    pool.block(i)[:] = data
                return i, True, time.monotonic() - t0
            except Exception as e:  # noqa: BLE001 - a failed request fails the point
                print(f"boto3 {op} {names[i]}: {e}", file=sys.stderr)
                return i, False, time.monotonic() - t0

        pending = set()
        nxt = 0
        n = len(names)
        while nxt < n or pending:
            while len(pending) < a.concurrency and nxt < n:
                pending.add(self.ex.submit(one, nxt))
                nxt += 1
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                on_done(*f.result())

    def exists_batch(self, names):
        import botocore

        def head(nm):
            try:
                self.s3.head_object(Bucket=self.a.bucket, Key=nm)
                return True
            except botocore.exceptions.ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise

        return list(self.ex.map(head, names))


CLIENTS = {"nixl": NixlClient, "awscrt": AwscrtClient, "boto3": Boto3Client}


def transfer_point(a, client, pool, op, names):
    lat = [0.0] * len(names)
    errors = [0]

    def on_done(i, ok, seconds):
        lat[i] = seconds
        if not ok:
            errors[0] += 1

    if op == "load":
        pool.clear()
    srv0 = proc_cpu(a.server_pid)
    u0, s0 = rusage()
    t0 = time.monotonic()
    client.run(op, names, on_done)
    wall = time.monotonic() - t0
    u1, s1 = rusage()
    srv = proc_cpu(a.server_pid) - srv0
    bad = pool.bad_blocks(a.data_seed) if op == "load" else 0
    nbytes = len(names) * pool.block_bytes
    gib = nbytes / 2**30
    cpu = (u1 - u0) + (s1 - s0)
    out = {
        "op": op,
        "bytes": nbytes,
        "wall_s": wall,
        "mib_s": nbytes / 2**20 / wall,
        "ops_s": len(names) / wall,
        **percentiles(lat),
        "cpu_s": cpu,
        "user_s": u1 - u0,
        "sys_s": s1 - s0,
        "cpu_s_per_gib": cpu / gib,
        "server_cpu_s": srv,
        "server_cpu_s_per_gib": srv / gib,
        "errors": errors[0],
        "bad_blocks": bad,
        "verified": errors[0] == 0 and bad == 0,
    }
    return out


def exists_point(a, client):
    half = a.blocks // 2
    names = [object_name(a.prefix, a.key_seed, i) for i in range(half)]
    names += [object_name(a.prefix, a.key_seed, (1 << 31) | i) for i in range(half, a.blocks)]
    lat, ok = [], True
    u0, s0 = rusage()
    t0 = time.monotonic()
    err = ""
    for rep in range(a.repeat):
        b0 = time.monotonic()
        found = client.exists_batch(names)
        lat.append(time.monotonic() - b0)
        want = [True] * half + [False] * (a.blocks - half)
        if found != want:
            ok = False
            err = f"batch {rep}: {sum(found)} hits, expected {half}"
    wall = time.monotonic() - t0
    u1, s1 = rusage()
    return {
        "op": "exists",
        "bytes": 0,
        "wall_s": wall,
        "mib_s": 0.0,
        "ops_s": a.repeat * a.blocks / wall,
        **percentiles(lat),
        "cpu_s": (u1 - u0) + (s1 - s0),
        "user_s": u1 - u0,
        "sys_s": s1 - s0,
        "cpu_s_per_gib": 0.0,
        "errors": 0 if ok else 1,
        "bad_blocks": 0,
        "verified": ok,
        "error": err,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client", required=True, choices=sorted(CLIENTS))
    p.add_argument("--ops", default="store,load", help="comma list of store, load, exists")
    p.add_argument("--endpoint", required=True, help="HOST:PORT")
    p.add_argument("--bucket", default="bench")
    p.add_argument("--prefix", default="kvbench")
    p.add_argument("--block-size", type=int, default=2 << 20)
    p.add_argument("--blocks", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--repeat", type=int, default=10, help="exists batches")
    p.add_argument("--key-seed", type=int, default=1)
    p.add_argument("--data-seed", type=int, default=1)
    p.add_argument("--access-key", default="kvtier")
    p.add_argument("--secret-key", default="kvtier-secret")
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--poll-interval-ms", type=float, default=1.0, help="NIXL completion polling period")
    p.add_argument("--crt-target-gbps", type=float, default=10.0, help="awscrt throughput target")
    p.add_argument("--crt-part-bytes", type=int, default=0,
                   help="awscrt part size (0: above the block size, one request per block)")
    p.add_argument("--label", default="")
    p.add_argument("--server-pid", type=int, default=0, help="report this process's CPU (from /proc) too")
    a = p.parse_args()
    ops = [o for o in a.ops.split(",") if o]
    if a.block_size % 8:
        p.error("--block-size must be a multiple of 8")

    transfers = [o for o in ops if o in ("store", "load")]
    pool = Pool(a.blocks, a.block_size) if transfers else None
    if pool is not None and "store" in transfers:
        pool.fill(a.data_seed)
    names = [object_name(a.prefix, a.key_seed, i) for i in range(a.blocks)]
    t0 = time.monotonic()
    client = CLIENTS[a.client](a, pool)
    setup = time.monotonic() - t0
    common = {
        "client": a.client,
        "label": a.label,
        "block_bytes": a.block_size,
        "blocks": a.blocks,
        "concurrency": a.concurrency,
        "setup_s": setup,
        "pool_mib": (a.blocks * a.block_size / 2**20) if pool is not None else 0,
    }
    rc = 0
    for op in ops:
        if op in ("store", "load"):
            out = transfer_point(a, client, pool, op, names)
        elif op == "exists":
            out = exists_point(a, client)
        else:
            p.error(f"unknown op {op}")
        out.update(common)
        out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out.setdefault("error", "" if out["verified"] else f"{out['errors']} failed requests, {out['bad_blocks']} bad blocks")
        print(json.dumps(out), flush=True)
        if not out["verified"]:
            rc = 1
    sys.stdout.flush()
    # NIXL and the CRT run native threads; skip interpreter teardown.
    os._exit(rc)


if __name__ == "__main__":
    main()
