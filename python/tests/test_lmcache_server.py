"""kvtier as the L2 of a running LMCache 0.5.6 MP server, with an engine's client connected.

The server is a process started from the command line of docs/lmcache.md ("Configuration"),
read out of the document: only the store and prefix (the document's are placeholders), the
port, the L1 size (16 GB there) and ``--disable-metrics`` (see the document) are the test's.
The client is LMCache's own: the scheduler and worker adapters that vLLM's
``LMCacheMPConnector`` builds (``lmcache.integration.vllm.vllm_multi_process_adapter``), over
CPU paged KV caches in vLLM's layout. On CPU the worker moves KV through the server either
by LMCache-driven transfer (the KV caches moved into POSIX shared memory that the server
maps; the server's default, so the documented command line serves it as it is) or by
engine-driven transfer (the worker gathers chunks and sends them pickled; the server needs
``--supported-transfer-mode auto``, which the document says).

Run on the local store and s3s-fs (moto and Ceph RGW are left out to keep the suite short:
test_lmcache.py runs the adapter on Ceph RGW);
LMCache comes from ``tools/lmcache-site`` (see lmcache_site), or the module is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lmcache_site  # noqa: E402

lmcache_site.require()
import torch  # noqa: E402
import zmq  # noqa: E402
from lmcache.integration.vllm.vllm_multi_process_adapter import (  # noqa: E402
    LMCacheMPSchedulerAdapter,
    LMCacheMPWorkerAdapter,
    LoadStoreOp,
    ParallelStrategy,
)
from lmcache.v1.distributed.api import ipc_key_to_object_keys  # noqa: E402
from lmcache.v1.multiprocess.token_hasher import TokenHasher  # noqa: E402

import kvtier  # noqa: E402
from key_layout import object_name  # noqa: E402
from kvtier.lmcache import NAMESPACE, object_key  # noqa: E402
from s3_servers import free_port, owns_listener  # noqa: E402

MODEL = "test/model-mp"
#: LMCache's default chunk (256 tokens, the documented command sets none) of 16-token blocks.
CHUNK_TOKENS, BLOCK_TOKENS = 256, 16
BLOCKS_PER_CHUNK = CHUNK_TOKENS // BLOCK_TOKENS
CHUNKS = 4
LAYERS, HEADS, HEAD_SIZE = 2, 2, 64
#: Paged KV blocks: block 0 is LMCache's null block; chunks are stored from the first
#: region and retrieved into the second.
STORE_BLOCKS = list(range(1, 1 + CHUNKS * BLOCKS_PER_CHUNK))
LOAD_BLOCKS = list(range(STORE_BLOCKS[-1] + 1, STORE_BLOCKS[-1] + 1 + CHUNKS * BLOCKS_PER_CHUNK))
NUM_BLOCKS = LOAD_BLOCKS[-1] + 1
#: Bound of every wait on a server, the client or the store; each ends as soon as its
#: condition holds.
WAIT_S = 60.0
#: How often a bounded wait looks again at what it waits for (the condition decides).
POLL_S = 0.02


@pytest.fixture
def lm_store(store, request):
    if any(name in request.node.callspec.id for name in ("moto", "ceph")):
        pytest.skip("LMCache server suite: local store and s3s-fs (moto and Ceph RGW left out for time)")
    return store


def until(condition, what: str, timeout: float = WAIT_S, on_fail=lambda: ""):
    """Polls ``condition`` until it returns a value other than None/False; fails naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s{on_fail()}")
        time.sleep(POLL_S)


# -- the server ------------------------------------------------------------------------


def documented_argv(store, port: int, *extra: str) -> list[str]:
    """docs/lmcache.md's server command line, with the test's store, prefix, port and L1 size."""
    argv = lmcache_site.documented_server_argv("docs/lmcache.md", "## Configuration")
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--l1-size-gb") + 1] = "0.0625"
    adapter = json.loads(argv[argv.index("--l2-adapter") + 1])
    assert (adapter["type"], adapter["module_path"], adapter["class_name"]) == (
        "plugin", "kvtier.lmcache", "KvtierL2Adapter")
    store_cfg = dict(store.store_config) if store.kind == "local" else {"type": "s3", **store.store_config}
    adapter["adapter_params"].update(store=store_cfg, prefix=store.prefix)
    argv[argv.index("--l2-adapter") + 1] = json.dumps(adapter)
    return [sys.executable, "-m", "lmcache.v1.multiprocess.server", *argv, "--disable-metrics", *extra]


class MPServer:
    """One LMCache MP server process on a free loopback port; its output in ``log``."""

    def __init__(self, store, log_dir: Path, name: str, *extra: str):
        # The child imports this kvtier package and LMCache the way this process does
        # (LMCache's directory last, after the venv's own packages).
        path = [str(Path(kvtier.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", ""),
                str(lmcache_site.SITE)]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), LMCACHE_TRACK_USAGE="false")
        self.store, self.extra = store, extra
        self.log = log_dir / f"lmcache-server-{name}.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> "MPServer":
        self.port = free_port()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(documented_argv(self.store, self.port, *self.extra), env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT)
        return self

    def tail(self) -> str:
        return "\n--- server log (tail) ---\n" + self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> None:
        """Until the server process holds its listening socket (bounded); fails with its log
        if it exits first."""
        def ready():
            if self.proc.poll() is not None:
                pytest.fail(f"LMCache server exited ({self.proc.returncode}) before serving{self.tail()}")
            return owns_listener(self.proc.pid, self.port)

        until(ready, f"LMCache server listening on port {self.port}", on_fail=self.tail)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def terminate(self) -> None:
        """Asks the server to stop: its SIGTERM handler closes it, kvtier's adapter included."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def stop(self) -> None:
        """Stops the server (bounded: killed if it has not stopped after 30 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def start_servers(tmp_path):
    """Starts LMCache servers (all at once, then waits for each); stopped at teardown."""
    made = []

    def start(store, count: int, *extra: str) -> list[MPServer]:
        servers = [MPServer(store, tmp_path, f"{len(made) + i}", *extra) for i in range(count)]
        made.extend(servers)
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        return servers

    yield start
    for server in made:
        server.terminate()
    for server in made:
        server.stop()


# -- the engine side ---------------------------------------------------------------------


class Engine:
    """LMCache's vLLM-side MP client of one server: the scheduler adapter (lookups, cache
    reset) and the worker adapter (store and retrieve) vLLM's LMCacheMPConnector builds,
    with one worker's CPU paged KV caches (vLLM's layout: per layer
    ``[2, blocks, block tokens, heads, head size]``)."""

    def __init__(self, server: MPServer, mode: str):
        self.server = server
        self.context = zmq.Context()
        strategy = ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1, pp_size=1,
                                    n_servers=1)
        extra = {"lmcache.mp.mq_timeout": WAIT_S, "lmcache.mp.mp_transfer_mode": mode}
        self.scheduler = self.worker = None
        try:
            self.scheduler = LMCacheMPSchedulerAdapter([server.url], self.context, MODEL, BLOCK_TOKENS, strategy,
                                                       extra_config=extra)
            self.worker = LMCacheMPWorkerAdapter(server.url, self.context, MODEL, BLOCK_TOKENS, strategy,
                                                 extra_config=extra)
            assert self.worker.lmcache_tokens_per_chunk == CHUNK_TOKENS
            self.kv = {f"model.layers.{i}.self_attn": torch.zeros(2, NUM_BLOCKS, BLOCK_TOKENS, HEADS, HEAD_SIZE,
                                                                  dtype=torch.bfloat16) for i in range(LAYERS)}
            self.worker.register_kv_caches(self.kv, layout_hints={"kv_layout": "NHD"})
        except BaseException:
            self.close()
            raise
        self._finished_stores: set = set()
        self._finished_retrieves: set = set()

    def fill(self, blocks: list, seed: int) -> None:
        """Distinct random bytes into ``blocks`` of every layer."""
        gen = torch.Generator().manual_seed(seed)
        for t in self.kv.values():
            raw = t.view(torch.uint8)
            raw[:, blocks] = torch.randint(0, 256, raw[:, blocks].shape, dtype=torch.uint8, generator=gen)

    def kv_zero(self, blocks: list) -> None:
        for t in self.kv.values():
            t[:, blocks] = 0

    def blocks_bytes(self, blocks: list) -> list[bytes]:
        return [t.view(torch.uint8)[:, blocks].contiguous().numpy().tobytes() for t in self.kv.values()]

    def chunk_bytes(self, blocks: list, chunk: int) -> bytes:
        """LMCache's object of chunk ``chunk`` of ``blocks``: ``[K|V, layer, token, heads*size]``."""
        mine = blocks[chunk * BLOCKS_PER_CHUNK:(chunk + 1) * BLOCKS_PER_CHUNK]
        planes = [t[:, mine].reshape(2, CHUNK_TOKENS, HEADS * HEAD_SIZE) for t in self.kv.values()]
        return torch.stack(planes, dim=1).contiguous().view(torch.uint8).numpy().tobytes()

    def _on_fail(self) -> str:
        return self.server.tail()

    def _drain(self, engine_finished: set = frozenset()) -> None:
        stores, retrieves = self.worker.get_finished(set(engine_finished))
        self._finished_stores |= stores or set()
        self._finished_retrieves |= retrieves or set()

    def store(self, request_id: str, tokens: list, blocks: list) -> None:
        op = LoadStoreOp(token_ids=tokens, block_ids=[blocks], start=0, end=len(tokens))
        self.worker.batched_submit_store_requests([request_id], [op], self.worker.create_recorded_event())

        def done():
            self._drain({request_id})
            return request_id in self._finished_stores

        until(done, f"store {request_id} finished", on_fail=self._on_fail)
        assert request_id not in (self.worker.get_failed_store_requests() or set()), f"store {request_id} failed"

    def lookup(self, request_id: str, tokens: list) -> int:
        """Tokens of ``tokens`` the server has (a prefix of whole chunks), once its prefetch
        from L2 into L1 is over."""
        self.scheduler.maybe_submit_lookup_request(request_id, tokens)
        return until(lambda: self.scheduler.check_lookup_result(request_id), f"lookup {request_id}",
                     on_fail=self._on_fail)

    def retrieve(self, request_id: str, tokens: list, blocks: list, end: int) -> None:
        op = LoadStoreOp(token_ids=tokens, block_ids=[blocks], start=0, end=end)
        self.worker.batched_submit_retrieve_requests([request_id], [op], self.worker.create_recorded_event())

        def done():
            self._drain()
            return request_id in self._finished_retrieves

        until(done, f"retrieve {request_id} finished", on_fail=self._on_fail)
        assert not self.worker.get_block_ids_with_load_errors(), f"retrieve {request_id} failed blocks"
        self.scheduler.cleanup_lookup_result(request_id)

    def object_keys(self, tokens: list, request_id: str) -> list:
        """LMCache's ObjectKeys of ``tokens``' chunks, as the server derives them (its token
        hasher, blake3 by default, and its IPC key to object key mapping)."""
        hashes = TokenHasher(CHUNK_TOKENS, "blake3").compute_chunk_hashes(tokens)
        ipc_key = self.worker._create_key(tokens, 0, len(tokens), request_id=request_id)
        return ipc_key_to_object_keys(ipc_key, hashes, [0])[0]

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        if self.scheduler is not None:
            self.scheduler.shutdown()
        self.context.destroy(linger=0)


@pytest.fixture
def engines():
    made = []

    def make(server: MPServer, mode: str) -> Engine:
        engine = Engine(server, mode)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


# -- kvtier's store -----------------------------------------------------------------------


def _s3_client(cfg: dict):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=f"http://{cfg['endpoint_override']}", aws_access_key_id=cfg["access_key"],
                        aws_secret_access_key=cfg["secret_key"], region_name=cfg.get("region", "us-east-1"),
                        config=Config(s3={"addressing_style": "path"}))


def read_object(store, name: str) -> bytes | None:
    """An object's bytes as kvtier stored them, straight from the store; None when absent."""
    if store.kind == "local":
        path = store.root / name
        return path.read_bytes() if path.is_file() else None
    client = _s3_client(store.store_config)
    try:
        return client.get_object(Bucket=store.store_config["bucket"], Key=name)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def delete_object(store, name: str) -> None:
    if store.kind == "local":
        (store.root / name).unlink()
    else:
        _s3_client(store.store_config).delete_object(Bucket=store.store_config["bucket"], Key=name)


# -- the round trip ----------------------------------------------------------------------

TOKENS = list(range(10_000, 10_000 + CHUNKS * CHUNK_TOKENS))


def store_and_find_objects(engine: Engine, store) -> tuple[list, list]:
    """Stores the prompt's KV through the engine's server, then waits until kvtier holds
    each chunk's object under the prefix (the server's L1 pushes chunks to its L2 on its
    own) and checks that each holds its chunk's bytes. Returns (the KV sent, object names)."""
    engine.fill(STORE_BLOCKS, seed=43)
    sent = engine.blocks_bytes(STORE_BLOCKS)
    engine.store("store-1", TOKENS, STORE_BLOCKS)
    keys = engine.object_keys(TOKENS, "store-1")
    names = [object_name(store.prefix, NAMESPACE,
                         object_key(k.chunk_hash, k.model_name, k.kv_rank, k.object_group_id, k.cache_salt))
             for k in keys]
    assert len(set(names)) == CHUNKS

    def all_stored():
        got = [read_object(store, n) for n in names]
        return got if all(b is not None for b in got) else None

    stored = until(all_stored, "kvtier holds every chunk's object", on_fail=engine.server.tail)
    assert stored == [engine.chunk_bytes(STORE_BLOCKS, c) for c in range(CHUNKS)]
    return sent, names


def read_back(engine: Engine, request_id: str) -> list[bytes]:
    """The whole prompt looked up (every chunk found) and retrieved into other blocks."""
    engine.kv_zero(LOAD_BLOCKS)
    assert engine.lookup(request_id, TOKENS) == len(TOKENS), "the server did not find every chunk"
    engine.retrieve(request_id, TOKENS, LOAD_BLOCKS, len(TOKENS))
    return engine.blocks_bytes(LOAD_BLOCKS)


def test_an_engine_stores_through_the_documented_server_and_reads_back_from_kvtier(lm_store, start_servers,
                                                                                    engines):
    first, second = start_servers(lm_store, 2)
    writer = engines(first, "lmcache_driven")
    sent, names = store_and_find_objects(writer, lm_store)

    # L1 cleared through LMCache's cache reset (vLLM's reset_prefix_cache): the chunks
    # come back, into other blocks, byte-identical. (A chunk whose push to kvtier is still
    # ending stays in L1 through a reset; the second server below has nothing in L1.)
    assert writer.scheduler.reset_cache()
    assert read_back(writer, "read-1") == sent

    # A second server, fresh L1, same prefix: its engine finds and reads them.
    reader = engines(second, "lmcache_driven")
    assert read_back(reader, "read-2") == sent

    # What the servers found was kvtier's: with the objects deleted and L1 cleared, a
    # lookup finds nothing.
    for name in names:
        delete_object(lm_store, name)
    assert reader.scheduler.reset_cache()
    assert reader.lookup("read-3", TOKENS) == 0


def test_engine_driven_transfer_round_trips_through_kvtier(local_only, start_servers, engines):
    """The worker's other CPU path (chunks gathered and sent pickled; vLLM's default on CPU),
    which the server serves with ``--supported-transfer-mode auto``."""
    (server,) = start_servers(local_only, 1, "--supported-transfer-mode", "auto")
    engine = engines(server, "engine_driven")
    sent, _ = store_and_find_objects(engine, local_only)
    assert engine.scheduler.reset_cache()
    assert read_back(engine, "read-1") == sent
