# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Shared helpers (imported by conftest.py and the tests) for kvtier's adaptation of vLLM 0.33.0's tiering tests.

``make_offloading_config`` is copied from vLLM 0.33.0's
``tests/v1/kv_offload/conftest.py`` (the source release's tests are not installed with
vLLM). The rest is kvtier's: real stores in place of vLLM's NIXL mocks, and real faults
on them.

Stores (fixture ``kv_store``): every store-parametrized test runs against the local
directory store, s3s-fs and moto_server (both started once per session by
``python/tests/s3_servers.py``). The tiers reach the S3 servers through
:class:`FaultProxy`, a small HTTP relay that can answer chosen requests with an error or
hold them until released, so a failure or an in-flight transfer is a real one on the
wire; the tests read objects back directly from the server (SigV4-signed requests) to
check what kvtier stored.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import http.server
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any


_HERE = Path(__file__).resolve().parent
try:
    import kvtier  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # a checkout without PYTHONPATH=python
    sys.path.insert(0, str(_HERE.parents[1]))
    import kvtier  # noqa: F401

if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))  # python/tests: helpers shared with the other suites

import numpy as np  # noqa: E402
from key_layout import object_name  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

from kvtier.vllm import KvtierTier  # noqa: E402

#: Longest any test waits for kvtier (never reached when all is well).
DEADLINE_S = 60.0

#: The engine id of these tests' offloading configs. vLLM's primary tier maps the file
#: /dev/shm/vllm_offload_{engine_id}.mmap, so upstream's fixed "test-engine" made two test
#: runs on one machine share (and overwrite) one host pool: one id per process instead.
ENGINE_ID = f"test-engine-{os.getpid()}"


# ---------------------------------------------------------------------------------------
# From vLLM 0.33.0 tests/v1/kv_offload/conftest.py


def make_offloading_config(
    *,
    spec_name: str | None = "CPUOffloadingSpec",
    cpu_bytes_to_use: int | None = 65536,
    engine_id: str = ENGINE_ID,
    worker_kv_bytes_per_block: int = 8,
    groups: tuple[OffloadingGroupConfig, ...] | None = None,
    tokens_per_hash: int = 16,
    blocks_per_chunk: int = 1,
    max_model_len: int = 4096,
    rank: int = 0,
    world_size: int = 1,
    tp_size: int | None = None,
    pp_size: int = 1,
    pcp_size: int = 1,
    dcp_size: int = 1,
    data_parallel_index: int = 0,
    data_parallel_size: int = 1,
    data_parallel_rank_local: int | None = None,
    is_parallelism_agnostic: bool = False,
    replicated_layout: bool = False,
    extra_config: dict[str, Any] | None = None,
) -> OffloadingConfig:
    normalized_extra_config = dict(extra_config or {})
    if spec_name is not None:
        normalized_extra_config["spec_name"] = spec_name
    if cpu_bytes_to_use is not None:
        normalized_extra_config["cpu_bytes_to_use"] = cpu_bytes_to_use

    if groups is None:
        groups = (OffloadingGroupConfig(16, ("layer",), 0),)

    return OffloadingConfig(
        groups=groups,
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=False,
        extra_config=normalized_extra_config,
        engine_id=engine_id,
        model=OffloadingModelConfig(name="test-model", dtype="float16", max_model_len=max_model_len),
        cache=OffloadingCacheConfig(
            tokens_per_hash=tokens_per_hash,
            blocks_per_chunk=blocks_per_chunk,
        ),
        parallel=OffloadingParallelConfig(
            rank=rank,
            world_size=world_size,
            tp_size=world_size if tp_size is None else tp_size,
            pp_size=pp_size,
            pcp_size=pcp_size,
            dcp_size=dcp_size,
            data_parallel_index=data_parallel_index,
            data_parallel_size=data_parallel_size,
            data_parallel_rank_local=data_parallel_rank_local,
            is_parallelism_agnostic=is_parallelism_agnostic,
        ),
        replicated_layout=replicated_layout,
    )


# ---------------------------------------------------------------------------------------
# Short block hashes.
#
# vLLM's manager tests key chunks by make_offload_key(str(i).encode(), 0): 1-2 byte
# hashes. A kvtier library that still refuses hashes under 3 bytes fails those stores;
# the tests that use them are then expected to fail (strict xfail), so they start to
# count as soon as the library accepts every hash vLLM can produce.


def _library_refuses_short_hashes() -> bool:
    import kvtier as _kvtier

    pool = np.zeros((1, 64), dtype=np.uint8)
    with _kvtier.Tier({"store": {"type": "memory"}, "key_bytes": 0}) as tier:
        tier.register_memory(pool)
        try:
            tier.submit_store(1, [0], [b"1" + bytes(4)])
        except _kvtier.KvtierError:
            pass
        tier.drain(10_000)
        (outcome,) = tier.poll()
        return not outcome.ok


SHORT_HASHES_REFUSED = _library_refuses_short_hashes()
SHORT_HASH_REASON = "libkvtier refuses block hashes under 3 bytes (core/src/key.rs MIN_HASH_BYTES); vLLM uses 1-byte hashes"


# ---------------------------------------------------------------------------------------
# Waiting without sleeping.


def wait_until(condition, what: str, timeout: float = DEADLINE_S, tier: KvtierTier | None = None):
    """Polls ``condition`` until true; between checks waits on ``tier``'s event fd (when
    given) or yields briefly. Fails after ``timeout``."""
    import select

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out waiting for {what}"
        if tier is not None and tier.tier is not None:
            select.select([tier.tier.event_fd()], [], [], min(remaining, 0.01))
        else:
            time.sleep(0.002)  # a poll interval, not synchronisation: the condition decides


def _poll_interval(tier: KvtierTier | None) -> None:
    """One poll interval between two checks of a condition (lookup answers raise no fd)."""
    import select

    if tier is not None and tier.tier is not None:
        select.select([tier.tier.event_fd()], [], [], 0.002)
    else:
        time.sleep(0.002)


def wait_io(*tiers: KvtierTier) -> None:
    """Blocks until every job submitted to these tiers has finished its I/O (the results
    stay queued for get_finished_jobs)."""
    for tier in tiers:
        if tier.tier is not None:
            tier.tier.drain(int(DEADLINE_S * 1000))


def drain(tier: KvtierTier, expected: int | None = None) -> list:
    """get_finished_jobs() until the tier has no pending work (vLLM's ``drain`` helper
    polled a mock a fixed number of rounds; kvtier's jobs finish on their own time)."""
    results: list = []

    def done():
        results.extend(tier.get_finished_jobs())
        if expected is not None:
            return len(results) >= expected
        return not tier.has_pending_work()

    wait_until(done, "the tier's jobs to finish", tier=tier)
    return results


def lookup_and_wait(tier: KvtierTier, keys, ctx: ReqContext, timeout: float = DEADLINE_S) -> list:
    """A full async lookup cycle: lookups (RETRY), on_schedule_end, then lookups again
    each step until none answers RETRY."""
    deadline = time.monotonic() + timeout
    results = [tier.lookup(k, ctx) for k in keys]
    while LookupResult.RETRY in results:
        assert time.monotonic() < deadline, "lookups never resolved"
        tier.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
        _poll_interval(tier)
        results = [tier.lookup(k, ctx) for k in keys]
    return results


# ---------------------------------------------------------------------------------------
# S3 access for checks: SigV4-signed requests straight to the server.


class S3Client:
    def __init__(self, config: dict):
        self.host = config["endpoint_override"]
        self.bucket = config["bucket"]
        self.access_key = config["access_key"]
        self.secret_key = config["secret_key"]
        self.region = config.get("region") or "us-east-1"

    def _request(self, method: str, key: str = "", query: dict | None = None, body: bytes = b""):
        path = f"/{self.bucket}/{key}" if key else f"/{self.bucket}"
        canonical_uri = urllib.parse.quote(path, safe="/-_.~")
        query = query or {}
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(str(v), safe='-_.~')}"
            for k, v in sorted(query.items())
        )
        now = datetime.datetime.now(datetime.timezone.utc)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        date = now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(body).hexdigest()
        headers = {"host": self.host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
        signed = ";".join(sorted(headers))
        canonical_headers = "".join(f"{k}:{headers[k]}\n" for k in sorted(headers))
        canonical_request = "\n".join(
            [method, canonical_uri, canonical_query, canonical_headers, signed, payload_hash]
        )
        scope = f"{date}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()]
        )
        k = ("AWS4" + self.secret_key).encode()
        for part in (date, self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
        )
        headers["content-length"] = str(len(body))
        conn = http.client.HTTPConnection(self.host, timeout=30)
        try:
            conn.request(method, canonical_uri + (f"?{canonical_query}" if canonical_query else ""), body, headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def get(self, key: str) -> bytes | None:
        status, body = self._request("GET", key)
        if status == 404:
            return None
        assert status == 200, f"GET {key}: {status} {body[:200]!r}"
        return body

    def put(self, key: str, body: bytes) -> None:
        status, text = self._request("PUT", key, body=body)
        assert status == 200, f"PUT {key}: {status} {text[:200]!r}"

    def delete(self, key: str) -> None:
        status, text = self._request("DELETE", key)
        assert status in (200, 204), f"DELETE {key}: {status} {text[:200]!r}"

    def list(self, prefix: str) -> list[str]:
        names: list[str] = []
        token = None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            status, body = self._request("GET", query=query)
            assert status == 200, f"LIST {prefix}: {status} {body[:200]!r}"
            text = body.decode()
            names += re.findall(r"<Key>([^<]*)</Key>", text)
            m = re.search(r"<NextContinuationToken>([^<]*)</NextContinuationToken>", text)
            if not m:
                return names
            token = m.group(1)


# ---------------------------------------------------------------------------------------
# A fault-injecting HTTP relay in front of an S3 server.


class FaultProxy:
    """Relays HTTP requests to ``upstream`` (host:port). Rules match a method and a
    substring of the path: ``fail`` answers with an S3 error instead of relaying,
    ``hold`` keeps the request until its event is set (then relays it)."""

    _ERROR = (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
        b"<Message>fault injected by the kvtier test proxy</Message></Error>"
    )

    def __init__(self, upstream: str):
        self.upstream = upstream
        self._lock = threading.Lock()
        self._rules: list[tuple[str, str, str, Any]] = []
        self.hits: dict[tuple[str, str], int] = {}
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _relay(self):
                proxy._handle(self)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _relay

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def fail(self, method: str, path_part: str, status: int = 403) -> None:
        with self._lock:
            self._rules.append((method, path_part, "fail", status))

    def hold(self, method: str, path_part: str) -> threading.Event:
        release = threading.Event()
        with self._lock:
            self._rules.append((method, path_part, "hold", release))
        return release

    def held(self, method: str, path_part: str) -> int:
        with self._lock:
            return self.hits.get((method, path_part), 0)

    def clear(self) -> None:
        with self._lock:
            rules, self._rules = self._rules, []
            self.hits.clear()
        for _, _, action, arg in rules:
            if action == "hold":
                arg.set()

    def _rule_for(self, method: str, path: str):
        with self._lock:
            for m, part, action, arg in self._rules:
                if m == method and part in path:
                    self.hits[(m, part)] = self.hits.get((m, part), 0) + 1
                    return action, arg
        return None, None

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        body = b""
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(h.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(h.rfile.read(size))
                h.rfile.readline()
            body = b"".join(chunks)
        elif h.headers.get("Content-Length"):
            body = h.rfile.read(int(h.headers["Content-Length"]))
        action, arg = self._rule_for(h.command, urllib.parse.unquote(h.path))
        if action == "hold":
            arg.wait(DEADLINE_S)
        if action == "fail":
            h.send_response(arg)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(self._ERROR)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(self._ERROR)
            return
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("connection", "transfer-encoding",
                                                                            "content-length", "keep-alive")}
        if body or h.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(self.upstream, timeout=DEADLINE_S)
        try:
            conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = resp.read()
            h.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() in ("connection", "transfer-encoding", "keep-alive", "content-length", "date",
                                 "server"):
                    continue
                h.send_header(k, v)
            if h.command == "HEAD":
                h.send_header("Content-Length", resp.getheader("Content-Length", "0"))
            else:
                h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
        finally:
            conn.close()


# ---------------------------------------------------------------------------------------
# Stores.


class Store:
    """One test's view of a store: the tiers' ``store_config`` and a ``prefix`` of its
    own, and direct access to the objects for checks and faults."""

    def __init__(self, id: str, store_config: dict, prefix: str, root: Path | None = None,
                 s3: S3Client | None = None, proxy: FaultProxy | None = None):
        self.id = id
        self.store_config = store_config
        self.prefix = prefix
        self.root = root
        self.s3 = s3
        self.proxy = proxy

    @property
    def is_s3(self) -> bool:
        return self.s3 is not None

    def name(self, namespace: str, key: bytes) -> str:
        return object_name(self.prefix, namespace, key)

    def read(self, namespace: str, key: bytes) -> bytes | None:
        """The stored object of ``key``, or None."""
        name = self.name(namespace, key)
        if self.s3 is not None:
            return self.s3.get(name)
        path = self.root / name
        return path.read_bytes() if path.is_file() else None

    def write(self, namespace: str, key: bytes, data: bytes) -> None:
        """Writes an object directly (e.g. a truncated one)."""
        name = self.name(namespace, key)
        if self.s3 is not None:
            self.s3.put(name, data)
        else:
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def truncate(self, namespace: str, key: bytes) -> None:
        """Replaces a stored object by its first half (kvtier must fail the key)."""
        data = self.read(namespace, key)
        assert data is not None, "nothing stored to truncate"
        self.write(namespace, key, data[: len(data) // 2])

    def names(self) -> list[str]:
        """Every object under this test's prefix."""
        if self.s3 is not None:
            return self.s3.list(self.prefix + "/")
        base = self.root / self.prefix
        if not base.exists():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())

    def fail_store(self, namespace: str, key: bytes) -> None:
        """Makes every store of ``key`` fail: the server refuses its PUT (S3), or a file
        stands where the key's shard directory must be (local store; this fails every
        key of that shard: a local directory has no way to refuse one key alone, and a
        directory at the object's own path would read as "already stored" to kvtier's
        conditional PUT)."""
        name = self.name(namespace, key)
        if self.proxy is not None:
            self.proxy.fail("PUT", name)
        else:
            shard = (self.root / name).parent
            assert not shard.exists(), "the shard directory already exists"
            shard.parent.mkdir(parents=True, exist_ok=True)
            shard.write_bytes(b"not a directory")

    def fail_lookups(self) -> None:
        """Makes every existence check under this prefix fail with an error (not a
        404): S3 answers HEAD with 403; the local store's prefix becomes a file."""
        if self.proxy is not None:
            self.proxy.fail("HEAD", self.prefix)
        else:
            base = self.root / self.prefix
            moved = self.root / f"{self.prefix}.moved"
            if base.exists():
                base.rename(moved)
            base.write_bytes(b"not a directory")

    def fail_everything(self) -> None:
        """Every request under this prefix fails (S3: 403; local: prefix is a file)."""
        if self.proxy is not None:
            for method in ("PUT", "GET", "HEAD", "POST", "DELETE"):
                self.proxy.fail(method, self.prefix)
        else:
            self.fail_lookups()

    def hold_puts(self, namespace: str = "") -> threading.Event:
        """Holds every PUT under this prefix at the server until the event is set (S3
        only: a local write cannot be stalled)."""
        assert self.proxy is not None, "holding a transfer needs an S3 store"
        return self.proxy.hold("PUT", f"/{self.prefix}/")

    def heal(self) -> None:
        if self.proxy is not None:
            self.proxy.clear()


# ---------------------------------------------------------------------------------------
# Tiers and primary pools.


def fill_rows(view: memoryview, rows: Iterable[int], seed: int = 0) -> dict[int, bytes]:
    """Writes distinct random bytes into rows of a 2-D primary view; returns them."""
    arr = np.asarray(view).view(np.uint8).reshape(view.shape[0], -1)
    rng = np.random.default_rng(seed + 1000)
    out = {}
    for row in rows:
        arr[row] = rng.integers(0, 256, arr.shape[1], dtype=np.uint8)
        out[row] = arr[row].tobytes()
    return out


def row_bytes(view: memoryview, row: int) -> bytes:
    arr = np.asarray(view).view(np.uint8).reshape(view.shape[0], -1)
    return arr[row].tobytes()


def clear_rows(view: memoryview, rows: Iterable[int] | None = None) -> None:
    arr = np.asarray(view).view(np.uint8).reshape(view.shape[0], -1)
    if rows is None:
        arr[:] = 0
    else:
        for row in rows:
            arr[row] = 0


# ---------------------------------------------------------------------------------------
# vLLM's manager-test keys.

#: Set to 1 to run the short-hash tests with 4+ byte hashes (b"pad" + str(i)) instead of
#: vLLM's, on a library that still refuses short hashes: it checks everything else of
#: those tests. Unset, the tests use vLLM's keys exactly.
PAD_HASHES = os.environ.get("KVTIER_UPSTREAM_PAD_HASHES") == "1"


def to_keys(int_ids: Iterable[int]) -> list:
    """vLLM's ``to_keys``: make_offload_key(str(i).encode(), 0) — 1-2 byte hashes."""
    if PAD_HASHES:
        return [make_offload_key(b"pad" + str(i).encode(), 0) for i in int_ids]
    return [make_offload_key(str(i).encode(), 0) for i in int_ids]
