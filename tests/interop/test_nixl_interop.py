"""A bucket shared with vLLM's obj tier: NIXL's OBJ plugin and kvtier read each other's
blocks byte for byte.

NIXL writes and reads under the raw key strings vLLM's obj tier hands it
(``<prefix>//<namespace>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin``; the AWS SDK inside
NIXL collapses the doubled slash), kvtier under its own layout for the same prefix and
namespace; each side then loads what the other stored. kvtier is driven through its C
ABI (ctypes on ``libkvtier.so``), exactly as a C or Python host would.

Runs against s3s-fs (checks SigV4 signatures) and moto_server, both started here on free
loopback ports. Missing servers, NIXL or the library fail the test; nothing is skipped.

Run: ``scripts/install-tools.sh && cargo build --release &&
tools/venv/bin/python -m pytest tests/interop -q``
"""

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))
from s3_servers import owns_listener  # noqa: E402  (the project's test servers' helper)
BLOCK = 64 * 1024
PREFIX = "kv"
NAMESPACE = "meta-llama_Llama-3-8B_a1b2c3d4e5f6_r0"
ACCESS_KEY = "kvtier-interop-access"
SECRET_KEY = "kvtier-interop-secret-Pq31"

KVT_OK = 0
KVT_NOT_FOUND = 6
KVT_LENGTH_MISMATCH = 13
KVT_STORE = 0
KVT_LOAD = 1


# ---------------------------------------------------------------------------------------
# Servers


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port, method, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=b"" if method == "PUT" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def install_hint():
    return f"run {ROOT}/scripts/install-tools.sh (the interop test needs real servers and never skips)"


def s3s_fs_bin():
    path = Path(os.environ.get("KVTIER_S3S_FS", ROOT / "tools/bin/s3s-fs"))
    if not path.is_file():
        pytest.fail(f"s3s-fs not found at {path}; {install_hint()}")
    return str(path)


def moto_bin():
    if os.environ.get("KVTIER_MOTO_SERVER"):
        return os.environ["KVTIER_MOTO_SERVER"]
    venv = ROOT / "tools/venv/bin/moto_server"
    if venv.is_file():
        return str(venv)
    found = shutil.which("moto_server")
    if not found:
        pytest.fail(f"moto_server not found; {install_hint()}")
    return found


class Server:
    def __init__(self, kind):
        self.kind = kind
        self.dir = tempfile.TemporaryDirectory()
        self.log = open(Path(self.dir.name) / "server.log", "wb")
        self.access_key, self.secret_key = ACCESS_KEY, SECRET_KEY
        for _ in range(5):
            self.port = free_port()
            if kind == "s3s-fs":
                self.root = Path(self.dir.name) / "data"
                self.root.mkdir(exist_ok=True)
                cmd = [s3s_fs_bin(), "--host", "127.0.0.1", "--port", str(self.port),
                       "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, str(self.root)]
            else:
                cmd = [moto_bin(), "-H", "127.0.0.1", "-p", str(self.port)]
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
            if self._wait_ready():
                return
            self.proc.kill()
            self.proc.wait()
        pytest.fail(f"{kind} did not start; log:\n{self.log_tail()}")

    def _wait_ready(self):
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                http(self.port, "GET", "/")
            except OSError:
                time.sleep(0.05)
                continue
            # The answer may come from another process that took the port first.
            return owns_listener(self.proc.pid, self.port)
        return False

    def log_tail(self):
        self.log.flush()
        return (Path(self.dir.name) / "server.log").read_text(errors="replace")[-3000:]

    def new_bucket(self):
        name = f"interop-{uuid.uuid4().hex[:12]}"
        if self.kind == "s3s-fs":
            (self.root / name).mkdir()
        else:
            status, body = http(self.port, "PUT", f"/{name}")
            assert status == 200, body
        return name

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        self.dir.cleanup()


@pytest.fixture(scope="module", params=["s3s-fs", "moto"])
def server(request):
    srv = Server(request.param)
    yield srv
    srv.stop()


# ---------------------------------------------------------------------------------------
# kvtier through its C ABI


class KvtResult(ctypes.Structure):
    _fields_ = [
        ("job_id", ctypes.c_uint64),
        ("kind", ctypes.c_int),
        ("status", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("num_keys", ctypes.c_size_t),
        ("num_failed_keys", ctypes.c_size_t),
        ("key_status", ctypes.POINTER(ctypes.c_int)),
        ("message", ctypes.c_char_p),
    ]


def load_library():
    path = Path(os.environ.get("KVTIER_LIB", ROOT / "target/release/libkvtier.so"))
    if not path.is_file():
        pytest.fail(f"{path} not found: run `cargo build --release` first")
    lib = ctypes.CDLL(str(path))
    P = ctypes.c_void_p
    lib.kvt_tier_new.argtypes = [ctypes.c_char_p, ctypes.POINTER(P)]
    lib.kvt_tier_register_memory.argtypes = [P, P, ctypes.c_uint64, ctypes.c_size_t]
    for f in (lib.kvt_tier_submit_store, lib.kvt_tier_submit_load):
        f.argtypes = [P, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), P, ctypes.c_size_t, ctypes.c_size_t]
    lib.kvt_tier_poll.argtypes = [P, ctypes.POINTER(KvtResult), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    lib.kvt_tier_drain.argtypes = [P, ctypes.c_uint64]
    lib.kvt_tier_free.argtypes = [P]
    lib.kvt_tier_free.restype = None
    lib.kvt_last_error.restype = ctypes.c_char_p
    return lib


class Tier:
    def __init__(self, lib, config):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        status = lib.kvt_tier_new(json.dumps(config).encode(), ctypes.byref(self.handle))
        if status != KVT_OK:
            raise AssertionError(f"kvt_tier_new: status {status}: {lib.kvt_last_error().decode()}")

    def register(self, pool):
        status = self.lib.kvt_tier_register_memory(self.handle, pool.ctypes.data, pool.shape[0], pool.shape[1])
        assert status == KVT_OK, self.lib.kvt_last_error().decode()

    def run(self, kind, job_id, blocks, keys):
        """Submits one job, waits for it, and returns (status, key statuses, message)."""
        ids = (ctypes.c_uint64 * len(blocks))(*blocks)
        key_bytes = b"".join(keys)
        submit = self.lib.kvt_tier_submit_store if kind == KVT_STORE else self.lib.kvt_tier_submit_load
        status = submit(self.handle, job_id, ids, key_bytes, len(keys[0]), len(keys))
        assert status == KVT_OK, self.lib.kvt_last_error().decode()
        assert self.lib.kvt_tier_drain(self.handle, 120_000) == KVT_OK, "jobs did not finish"
        results = (KvtResult * 8)()
        count = ctypes.c_size_t()
        assert self.lib.kvt_tier_poll(self.handle, results, 8, ctypes.byref(count)) == KVT_OK
        assert count.value == 1, f"expected exactly one result, got {count.value}"
        r = results[0]
        assert r.job_id == job_id
        key_status = [r.key_status[i] for i in range(r.num_keys)]
        return r.status, key_status, (r.message or b"").decode()

    def close(self):
        self.lib.kvt_tier_free(self.handle)


def kvtier_config(srv, bucket):
    return {
        "store": {
            "type": "s3", "bucket": bucket, "endpoint_override": f"127.0.0.1:{srv.port}", "scheme": "http",
            "access_key": srv.access_key, "secret_key": srv.secret_key, "region": "us-east-1",
        },
        "prefix": PREFIX,
        "namespace": NAMESPACE,
    }


# ---------------------------------------------------------------------------------------
# vLLM's obj tier through NIXL


def vllm_raw_name(key):
    """The object name string vLLM's obj tier gives NIXL for a 36-byte key."""
    digest, group = key[:-4], int.from_bytes(key[-4:], "big")
    h = digest.hex()
    root_dir = PREFIX + "/"  # obj tier: root_dir = prefix + "/"; FileMapper adds another "/"
    return f"{root_dir}/{NAMESPACE}/{h[0:3]}/{h[3:5]}_g{group}/{h}.bin"


def effective_name(key):
    digest, group = key[:-4], int.from_bytes(key[-4:], "big")
    h = digest.hex()
    return f"{PREFIX}/{NAMESPACE}/{h[0:3]}/{h[3:5]}_g{group}/{h}.bin"


class Nixl:
    """One NIXL agent with an OBJ backend, used as vLLM's obj tier uses it."""

    def __init__(self, srv, bucket, pool):
        try:
            from nixl_cu12._api import nixl_agent, nixl_agent_config
        except ImportError as e:
            pytest.fail(f"NIXL is not installed ({e}); {install_hint()}")
        self.name = f"ObjAgent-{uuid.uuid4().hex[:8]}"
        self.agent = nixl_agent(self.name, nixl_agent_config(backends=[]))
        self.agent.create_backend("OBJ", {
            "bucket": bucket, "endpoint_override": f"127.0.0.1:{srv.port}", "scheme": "http",
            "access_key": srv.access_key, "secret_key": srv.secret_key, "region": "us-east-1", "num_threads": "4",
        })
        self.pool = pool
        self.agent.register_memory([(pool.ctypes.data, pool.nbytes, 0, "")], "DRAM")
        self.next_dev_id = 1

    def _transfer(self, op, rows, keys):
        ids = list(range(self.next_dev_id, self.next_dev_id + len(keys)))
        self.next_dev_id += len(keys)
        row_bytes = self.pool.shape[1]
        self.agent.register_memory([(0, row_bytes, i, vllm_raw_name(k)) for i, k in zip(ids, keys)], "OBJ")
        local = self.agent.get_xfer_descs([(self.pool[r].ctypes.data, row_bytes, 0) for r in rows], "DRAM")
        remote = self.agent.get_xfer_descs([(0, row_bytes, i) for i in ids], "OBJ")
        handle = self.agent.initialize_xfer(op, local, remote, self.name)
        state = self.agent.transfer(handle)
        deadline = time.time() + 120
        while state in ("PROC", "DONE") and time.time() < deadline:
            state = self.agent.check_xfer_state(handle)
            if state == "DONE":
                break
            time.sleep(0.005)
        self.agent.release_xfer_handle(handle)
        return state

    def write(self, rows, keys):
        return self._transfer("WRITE", rows, keys)

    def read(self, rows, keys):
        return self._transfer("READ", rows, keys)

    def exists(self, keys):
        found = self.agent.query_memory([(0, 0, 0, vllm_raw_name(k)) for k in keys], "OBJ", "OBJ")
        return [f is not None for f in found]


def random_keys(rng, n):
    return [rng.bytes(32) + int(g % 3).to_bytes(4, "big") for g in range(n)]


# ---------------------------------------------------------------------------------------


def test_nixl_writes_kvtier_loads(server):
    lib = load_library()
    rng = np.random.default_rng(1234)
    bucket = server.new_bucket()
    pool = rng.integers(0, 256, size=(24, BLOCK), dtype=np.uint8)
    keys = random_keys(rng, 8)
    nixl = Nixl(server, bucket, pool)
    assert nixl.write(list(range(8)), keys) == "DONE"

    tier = Tier(lib, kvtier_config(server, bucket))
    try:
        tier.register(pool)
        # Load into slots 23, 22, ... (a non-identity mapping), plus one key nobody wrote.
        absent = rng.bytes(32) + (0).to_bytes(4, "big")
        slots = [23 - i for i in range(8)] + [12]
        before = pool[12].copy()
        status, key_status, message = tier.run(KVT_LOAD, 1, slots, keys + [absent])
        assert key_status == [KVT_OK] * 8 + [KVT_NOT_FOUND], message
        assert status == KVT_NOT_FOUND
        for i in range(8):
            assert np.array_equal(pool[23 - i], pool[i]), f"key {i}: kvtier loaded different bytes than NIXL wrote"
        assert np.array_equal(pool[12], before), "the missing key's slot was written"
    finally:
        tier.close()


def test_kvtier_stores_nixl_reads(server):
    lib = load_library()
    rng = np.random.default_rng(99)
    bucket = server.new_bucket()
    pool = rng.integers(0, 256, size=(24, BLOCK), dtype=np.uint8)
    keys = random_keys(rng, 8)
    tier = Tier(lib, kvtier_config(server, bucket))
    try:
        tier.register(pool)
        status, key_status, message = tier.run(KVT_STORE, 1, list(range(8)), keys)
        assert status == KVT_OK and key_status == [KVT_OK] * 8, message
    finally:
        tier.close()

    nixl = Nixl(server, bucket, pool)
    other = random_keys(rng, 2)
    assert nixl.exists(keys + other) == [True] * 8 + [False] * 2, "NIXL's existence check disagrees"
    rows = [16 + i for i in range(8)]
    pool[16:24] = 0
    assert nixl.read(rows, keys) == "DONE"
    for i in range(8):
        assert np.array_equal(pool[16 + i], pool[i]), f"key {i}: NIXL read different bytes than kvtier stored"


def test_an_encrypted_bucket_and_nixls_plain_objects_do_not_mix(server, tmp_path):
    """With encryption on, kvtier refuses the plain objects NIXL (vLLM's obj tier) wrote,
    by their length, and never loads their bytes; and what NIXL reads of kvtier's encrypted
    objects is ciphertext, never the blocks: an encrypted bucket is not theirs to read."""
    import base64

    lib = load_library()
    rng = np.random.default_rng(2026)
    bucket = server.new_bucket()
    pool = rng.integers(0, 256, size=(24, BLOCK), dtype=np.uint8)
    plain_keys, sealed_keys = random_keys(rng, 4), random_keys(rng, 4)
    nixl = Nixl(server, bucket, pool)
    assert nixl.write(list(range(4)), plain_keys) == "DONE"

    ring = tmp_path / "keyring.json"
    ring.write_text(json.dumps({"write": "k", "keys": {"k": base64.b64encode(rng.bytes(32)).decode()}}))
    config = dict(kvtier_config(server, bucket), encryption={"keyring_file": str(ring)})
    tier = Tier(lib, config)
    try:
        tier.register(pool)
        status, key_status, message = tier.run(KVT_LOAD, 1, [8, 9, 10, 11], plain_keys)
        assert key_status == [KVT_LENGTH_MISMATCH] * 4, message
        assert "without encryption is refused" in message, message
        assert not any(np.array_equal(pool[8 + i], pool[i]) for i in range(4)), "a plain object's bytes were loaded"
        status, key_status, message = tier.run(KVT_STORE, 2, [4, 5, 6, 7], sealed_keys)
        assert key_status == [KVT_OK] * 4, message
    finally:
        tier.close()

    pool[16:20] = 0
    nixl.read([16, 17, 18, 19], sealed_keys)
    for i in range(4):
        assert not np.array_equal(pool[16 + i], pool[4 + i]), f"NIXL read key {i}'s block from an encrypted bucket"


def test_both_write_the_same_server_side_names(server):
    """A generic S3 client (here: the server's own listing) sees vLLM's effective key."""
    rng = np.random.default_rng(7)
    bucket = server.new_bucket()
    pool = rng.integers(0, 256, size=(4, BLOCK), dtype=np.uint8)
    keys = random_keys(rng, 2)
    nixl = Nixl(server, bucket, pool)
    assert nixl.write([0, 1], keys) == "DONE"
    if server.kind == "s3s-fs":
        stored = sorted(str(p.relative_to(server.root / bucket)) for p in (server.root / bucket).rglob("*.bin"))
    else:
        status, body = http(server.port, "GET", f"/{bucket}?list-type=2")
        assert status == 200, body
        stored = sorted(part.split("</Key>")[0] for part in body.split("<Key>")[1:])
    assert stored == sorted(effective_name(k) for k in keys), stored
