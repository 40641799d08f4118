"""kvtier as LMCache 0.5.6's L2 store, driven through LMCache's own multiprocess-mode
``StorageManager``, which builds the adapter from the ``--l2-adapter`` JSON exactly as a
user configures it (``"type": "plugin"``, ``module_path`` ``kvtier.lmcache``), on the local
store, s3s-fs and Ceph RGW (moto is left out to keep the suite short).

LMCache comes from ``tools/lmcache-site`` (``scripts/install-tools.sh``), appended to the
import path here so that the venv's own torch stays the one imported; the module is
skipped only when LMCache is not installed.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

import lmcache_site  # noqa: E402

lmcache_site.require()
import torch  # noqa: E402
from lmcache.v1.distributed.api import (  # noqa: E402
    GroupedObjectKeys,
    MemoryLayoutDesc,
    ObjectKey,
    PrefetchTaskSpec,
)
from lmcache.v1.distributed.config import parse_args  # noqa: E402
from lmcache.v1.distributed.internal_api import L2AdapterListener  # noqa: E402
from lmcache.v1.distributed.storage_manager import StorageManager  # noqa: E402

import kvtier  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402
from key_layout import object_name  # noqa: E402
from kvtier.lmcache import NAMESPACE, KvtierL2Adapter, build_tier_config, object_key  # noqa: E402
from support import pattern  # noqa: E402

#: Bytes of one LMCache object (a chunk's KV) in these tests: a whole number of L1 pages.
OBJECT_BYTES = 16 * 1024
LAYOUT = MemoryLayoutDesc([torch.Size([OBJECT_BYTES])], [torch.uint8])
MODEL = "test/model-1b"
#: Bound of every wait on LMCache or the adapter; each ends as soon as its condition holds.
WAIT_S = 60.0


@pytest.fixture
def lm_store(store, request):
    if "moto" in request.node.callspec.id:
        pytest.skip("LMCache suite: local store, s3s-fs and Ceph RGW (moto left out for time)")
    return store


def adapter_json(params: dict) -> str:
    """The ``--l2-adapter`` value a user gives LMCache for kvtier."""
    return json.dumps({"type": "plugin", "module_path": "kvtier.lmcache", "class_name": "KvtierL2Adapter",
                       "adapter_params": params})


def store_of(store) -> dict:
    """kvtier's ``store`` of the fixture's store (its S3 entries are vLLM-style, typeless)."""
    return dict(store.store_config) if store.kind == "local" else {"type": "s3", **store.store_config}


def params_for(store, **extra) -> dict:
    return {"store": store_of(store), "prefix": store.prefix, **extra}


class StoredKeys(L2AdapterListener):
    """LMCache's L2 listener: the keys its adapters reported stored, and deleted."""

    def __init__(self):
        self.keys: set = set()
        self.deleted: set = set()
        self._cond = threading.Condition()

    def on_l2_keys_stored(self, keys, sizes):
        with self._cond:
            self.keys.update(keys)
            self._cond.notify_all()

    def on_l2_keys_accessed(self, keys):
        pass

    def on_l2_keys_deleted(self, keys):
        with self._cond:
            self.deleted.update(keys)
            self._cond.notify_all()

    def wait_for(self, keys, timeout: float = WAIT_S) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: set(keys) <= self.keys, timeout)

    def wait_deleted(self, count: int, timeout: float = WAIT_S) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.deleted) >= count, timeout)


class Server:
    """One LMCache storage manager (an LMCache server's storage) with kvtier as its L2,
    from LMCache's own argument parser (``argv``: its storage flags, as a server gets them)."""

    def __init__(self, params: dict | None = None, l1_gb: float = 0.03125, argv: list | None = None):
        if argv is None:
            argv = ["--l1-size-gb", str(l1_gb), "--eviction-policy", "LRU", "--l2-adapter", adapter_json(params)]
        config = parse_args(argv + ["--no-l1-use-lazy"])
        # LMCache names its L1 shared memory after the process (one server per process):
        # two servers in this one need names of their own, or closing one unlinks the other's.
        shm_name = f"lmcache_l1_pool_kvtier_test_{uuid.uuid4().hex[:12]}"
        for l1 in [config.l1_manager_config, *config.l1_manager_configs]:
            l1.memory_config.shm_name = shm_name
        self.manager = StorageManager(config)
        try:
            self.stored = StoredKeys()
            self.manager.register_l2_listener(self.stored)
            ((_, adapter),) = self.manager.l2_adapters()
            assert isinstance(adapter, KvtierL2Adapter)
        except BaseException:
            self.manager.close()
            raise
        self.adapter: KvtierL2Adapter = adapter

    def write(self, contents: dict) -> None:
        """Writes each key's bytes into L1 (LMCache then pushes them to L2)."""
        keys = list(contents)
        reserved = self.manager.reserve_write(keys, LAYOUT)
        assert set(reserved) == set(keys), "L1 refused some objects"
        for key, obj in reserved.items():
            obj.tensor.view(torch.uint8).reshape(-1).copy_(torch.from_numpy(contents[key]))
        self.manager.finish_write(keys)

    def push(self, contents: dict) -> None:
        """Writes, waits until the L2 holds every key, then drops them from L1."""
        self.write(contents)
        assert self.stored.wait_for(contents), f"L2 stored {len(self.stored.keys)} of {len(contents)} keys"
        self.manager.delete_l1_keys(list(contents), force=True)

    def prefetch(self, keys: list, policy: str = "prefix"):
        spec = PrefetchTaskSpec(key_groups=[GroupedObjectKeys(keys, 0, LAYOUT)], fetching_policy=policy)
        handle = self.manager.submit_prefetch_task(spec)
        assert self.manager.wait_prefetch_status(handle, WAIT_S), "prefetch never finished"
        result = self.manager.query_prefetch_status(handle)
        assert result is not None
        return result

    def read(self, keys: list) -> list[bytes]:
        with self.manager.read_prefetched_results(keys) as objs:
            assert objs is not None, "a prefetched object is not in L1"
            out = [obj.tensor.view(torch.uint8).reshape(-1).numpy().tobytes() for obj in objs]
        self.manager.finish_read_prefetched(keys)
        return out

    def close(self) -> None:
        self.manager.close()


@pytest.fixture
def servers():
    made = []

    def make(params=None, **kw) -> Server:
        server = Server(params, **kw)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def chunk_keys(n: int, tag: str, model: str = MODEL, rank: int = 0, salt: str = "") -> list:
    return [ObjectKey(chunk_hash=np.frombuffer(pattern(f"{tag}-{i}", 32), np.uint8).tobytes(), model_name=model,
                      kv_rank=rank, cache_salt=salt) for i in range(n)]


def contents_of(keys: list) -> dict:
    return {k: pattern((k.chunk_hash, k.cache_salt, k.model_name, k.kv_rank), OBJECT_BYTES) for k in keys}


# -- the round trip --------------------------------------------------------------------


def test_stored_chunks_come_back_from_l2_byte_identical_and_a_second_server_reads_them(lm_store, servers):
    params = params_for(lm_store)
    first = servers(params)
    adapter = first.adapter
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
    assert len(fds) == 3, "LMCache needs three distinct event fds"
    keys = chunk_keys(4, "round-trip")
    contents = contents_of(keys)
    first.push(contents)
    assert adapter.finished_tasks()["stores_failed"] == 0

    result = first.prefetch(keys)
    assert (result.l1_hit_count, result.l2_hit_count) == (0, 4)
    assert first.read(keys) == [contents[k].tobytes() for k in keys]

    # A second server with a fresh L1 and the same configuration finds and reads them.
    second = servers(params)
    result = second.prefetch(keys)
    assert result.l2_hit_count == 4
    assert second.read(keys) == [contents[k].tobytes() for k in keys]
    assert second.adapter.tier.stats()["keys_loaded"] == 4


def test_model_rank_and_salt_separate_objects(lm_store, servers):
    params = params_for(lm_store)
    writer = servers(params)
    salted = chunk_keys(2, "tenant", salt="alice")
    writer.push(contents_of(salted))

    reader = servers(params)
    # The same chunks under another salt, model or rank are other objects: not found.
    for other in (chunk_keys(2, "tenant", salt="bob"), chunk_keys(2, "tenant"),
                  chunk_keys(2, "tenant", model="other/model", salt="alice"),
                  chunk_keys(2, "tenant", rank=1, salt="alice")):
        assert reader.prefetch(other).l2_hit_count == 0
    assert reader.prefetch(salted).l2_hit_count == 2
    assert reader.read(salted) == [contents_of(salted)[k].tobytes() for k in salted]
    # The key derivation itself: every field separates, the group is the key's last 4 bytes.
    base = object_key(b"h" * 32, MODEL, 0, 0, "")
    assert len(base) == kvtier.DEFAULT_KEY_BYTES
    assert len({base, object_key(b"h" * 32, MODEL, 0, 0, "s"), object_key(b"h" * 32, MODEL + "x", 0, 0, ""),
                object_key(b"h" * 32, MODEL, 1, 0, ""), object_key(b"g" * 32, MODEL, 0, 0, "")}) == 5
    assert object_key(b"h" * 32, MODEL, 0, 7, "")[:32] == base[:32]
    assert object_key(b"h" * 32, MODEL, 0, 7, "")[32:] == (7).to_bytes(4, "big")


def test_many_keys_in_flight(lm_store, servers):
    params = params_for(lm_store)
    writer = servers(params)
    batches = [chunk_keys(16, f"many-{b}") for b in range(4)]
    contents = {}
    for batch in batches:  # four writes back to back: their stores overlap
        batch_contents = contents_of(batch)
        contents.update(batch_contents)
        writer.write(batch_contents)
    assert writer.stored.wait_for(contents)
    assert writer.adapter.finished_tasks()["stores_failed"] == 0

    reader = servers(params)
    keys = [k for batch in batches for k in batch]
    assert reader.prefetch(keys).l2_hit_count == len(keys)
    assert reader.read(keys) == [contents[k].tobytes() for k in keys]


# -- objects that are missing, short or corrupt ------------------------------------------


def _replace_object(store, kv_key: bytes, damage) -> None:
    """Replaces a stored object's bytes by ``damage(bytes)`` at rest, keeping its metadata
    (kvtier's checksum among it): a local file rewritten in place, or an S3 object put
    again with the original user metadata."""
    name = object_name(store.prefix, NAMESPACE, kv_key)
    if store.kind == "local":
        path = store.root / name
        raw = path.read_bytes()
        with open(path, "r+b") as f:  # in place: the file keeps its checksum attribute
            f.truncate(0)
            f.write(damage(raw))
        return
    import boto3
    from botocore.config import Config

    cfg = store.store_config
    client = boto3.client("s3", endpoint_url=f"http://{cfg['endpoint_override']}", aws_access_key_id=cfg["access_key"],
                          aws_secret_access_key=cfg["secret_key"], region_name=cfg.get("region", "us-east-1"),
                          config=Config(s3={"addressing_style": "path"}))
    got = client.get_object(Bucket=cfg["bucket"], Key=name)
    client.put_object(Bucket=cfg["bucket"], Key=name, Body=damage(got["Body"].read()), Metadata=got["Metadata"])


def _flip_one_byte(raw: bytes) -> bytes:
    return raw[:100] + bytes([raw[100] ^ 0xFF]) + raw[101:]


def _load_into_l1(server: Server, keys: list) -> tuple[object, list]:
    """Lookup-and-lock then load of ``keys`` through the adapter LMCache built, into L1
    objects LMCache reserved: (lookup bitmap, [(loaded?, bytes)])."""
    adapter = server.adapter
    lookup = adapter.submit_lookup_and_lock_task(keys, {0: LAYOUT})
    assert adapter.wait_finished(lambda c: c["lookups"] >= 1, WAIT_S)
    found = adapter.query_lookup_and_lock_result(lookup)
    reserved = server.manager.reserve_write(keys, LAYOUT)
    objs = [reserved[k] for k in keys]
    for obj in objs:
        obj.tensor.view(torch.uint8).fill_(0xAB)  # what a failed key's buffer must keep or lose, never gain
    loads_before = adapter.finished_tasks()["loads"]
    task = adapter.submit_load_task(keys, objs)
    assert adapter.wait_finished(lambda c: c["loads"] > loads_before, WAIT_S)
    loaded = adapter.query_load_result(task)
    assert adapter.query_load_result(task) is None, "a load result is handed out once"
    adapter.submit_unlock([k for i, k in enumerate(keys) if found.test(i)])
    out = [(loaded.test(i), obj.tensor.view(torch.uint8).reshape(-1).numpy().tobytes()) for i, obj in enumerate(objs)]
    server.manager.delete_l1_keys(keys, force=True)
    return found, out


def test_missing_truncated_and_tampered_objects_fail_those_keys_alone(lm_store, servers):
    params = params_for(lm_store)
    writer = servers(params)
    keys = chunk_keys(5, "damaged")
    contents = contents_of(keys)
    stored = {k: contents[k] for k in keys if k is not keys[3]}  # keys[3] is never stored
    writer.push(stored)
    _replace_object(lm_store, object_key(**_fields(keys[1])), lambda raw: raw[: len(raw) // 2])
    _replace_object(lm_store, object_key(**_fields(keys[2])), _flip_one_byte)

    reader = servers(params)
    found, loaded = _load_into_l1(reader, keys)
    assert [found.test(i) for i in range(5)] == [True, True, True, False, True]
    assert [ok for ok, _ in loaded] == [True, False, False, False, True]
    assert loaded[0][1] == contents[keys[0]].tobytes() and loaded[4][1] == contents[keys[4]].tobytes()
    for i in (1, 2, 3):  # never the damaged object's bytes, nor another key's
        assert loaded[i][1] not in (contents[keys[i]].tobytes(), contents[keys[0]].tobytes())
    # Through LMCache's prefetch: the prefix ends at the first key that does not load.
    assert reader.prefetch(keys).l2_hit_count == 1


def _fields(key: ObjectKey) -> dict:
    return {"chunk_hash": key.chunk_hash, "model_name": key.model_name, "kv_rank": key.kv_rank,
            "object_group_id": key.object_group_id, "cache_salt": key.cache_salt}


def test_a_locked_key_stays_through_the_tiers_own_eviction_until_unlocked(lm_store, servers):
    """A key LMCache looked up and locked is pinned in the tier: eviction over the budget
    deletes the unlocked objects (the locked ones still count), and the locked ones load
    byte-identical; once unlocked, they are evicted like any other."""
    budget = {"max_bytes": OBJECT_BYTES, "interval_ms": 3_600_000}  # rounds run on request
    server = servers(params_for(lm_store, eviction=budget))
    adapter = server.adapter
    keys = chunk_keys(3, "pinned")
    contents = contents_of(keys)
    for key in keys:
        server.push({key: contents[key]})
    locked = keys[:2]
    lookup = adapter.submit_lookup_and_lock_task(locked, {0: LAYOUT})
    assert adapter.wait_finished(lambda c: c["lookups"] >= 1, WAIT_S)
    found = adapter.query_lookup_and_lock_result(lookup)
    assert [found.test(0), found.test(1)] == [True, True]

    report = adapter.tier.evict_now()
    assert (report["objects"], report["deleted"]) == (3, 1), report
    present = lambda: [v.name for v in adapter.tier.check_now([object_key(**_fields(k)) for k in keys], WAIT_S)]  # noqa: E731
    assert present() == ["HIT", "HIT", "MISS"]
    reserved = server.manager.reserve_write(locked, LAYOUT)
    task = adapter.submit_load_task(locked, [reserved[k] for k in locked])
    assert adapter.wait_finished(lambda c: c["loads"] >= 1, WAIT_S)
    loaded = adapter.query_load_result(task)
    assert [loaded.test(0), loaded.test(1)] == [True, True]
    for key in locked:
        assert reserved[key].tensor.view(torch.uint8).reshape(-1).numpy().tobytes() == contents[key].tobytes()
    server.manager.delete_l1_keys(locked, force=True)

    # Unlocked, they are evicted like any other: the older one goes (which one is older is
    # the store's call: modification times may tie within a second).
    adapter.submit_unlock(locked)
    report = adapter.tier.evict_now()
    assert report["deleted"] == 1, report
    assert sorted(present()) == ["HIT", "MISS", "MISS"] and present()[2] == "MISS"


def test_a_locked_key_deleted_since_fails_its_load_alone(local_only, servers):
    """A lock holds against this tier's own eviction alone: an object deleted afterwards by
    anyone else (kvtier gc, another server's eviction) fails its key, never with another
    object's bytes."""
    writer = servers(params_for(local_only))
    keys = chunk_keys(2, "locked")
    contents = contents_of(keys)
    writer.push(contents)
    reader = servers(params_for(local_only))
    adapter = reader.adapter
    lookup = adapter.submit_lookup_and_lock_task(keys, {0: LAYOUT})
    assert adapter.wait_finished(lambda c: c["lookups"] >= 1, WAIT_S)
    found = adapter.query_lookup_and_lock_result(lookup)
    assert [found.test(0), found.test(1)] == [True, True]
    (local_only.root / object_name(local_only.prefix, NAMESPACE, object_key(**_fields(keys[0])))).unlink()
    reserved = reader.manager.reserve_write(keys, LAYOUT)
    task = adapter.submit_load_task(keys, [reserved[k] for k in keys])
    assert adapter.wait_finished(lambda c: c["loads"] >= 1, WAIT_S)
    loaded = adapter.query_load_result(task)
    assert [loaded.test(0), loaded.test(1)] == [False, True]
    assert reserved[keys[1]].tensor.view(torch.uint8).reshape(-1).numpy().tobytes() == contents[keys[1]].tobytes()
    adapter.submit_unlock(keys)
    reader.manager.delete_l1_keys(keys, force=True)


def test_the_tiers_own_eviction_reaches_lmcache_as_deleted_keys(local_only, servers):
    """kvtier's eviction (a byte budget for the namespace) deletes the oldest objects; each
    becomes LMCache's deleted-key notification, and its chunk is a miss afterwards."""
    budget = {"max_bytes": 2 * OBJECT_BYTES, "interval_ms": 100}
    server = servers(params_for(local_only, eviction=budget))
    keys = chunk_keys(4, "evicted")
    contents = contents_of(keys)
    for key in keys:  # one at a time: their objects' ages order the eviction
        server.push({key: contents[key]})
    assert server.stored.wait_deleted(2), f"{len(server.stored.deleted)} keys reported deleted"
    assert server.stored.deleted <= set(keys) and len(server.stored.deleted) == 2
    usage = server.adapter.get_usage()
    assert usage.total_bytes_used == 2 * OBJECT_BYTES
    kept = [k for k in keys if k not in server.stored.deleted]
    assert server.prefetch(kept).l2_hit_count == 2
    for key in server.stored.deleted:
        assert server.prefetch([key]).l2_hit_count == 0


def test_lmcaches_delete_removes_the_objects_for_every_server(lm_store, servers):
    """LMCache's L2 eviction calls delete(): the objects go from the store (for every server
    sharing them), each reported to LMCache as deleted, including one the deleting server
    only found (stored by another); the rest stay."""
    params = params_for(lm_store)
    writer = servers(params)
    keys = chunk_keys(3, "deleted")
    contents = contents_of(keys)
    writer.push(contents)
    reader = servers(params)
    assert reader.prefetch(keys).l2_hit_count == 3
    reader.manager.delete_l1_keys(keys, force=True)
    writer.adapter.delete(keys[:2])
    assert writer.stored.wait_deleted(2)
    assert writer.stored.deleted == set(keys[:2])
    assert writer.adapter.get_usage().total_bytes_used == OBJECT_BYTES
    assert reader.prefetch(keys[:1]).l2_hit_count == 0
    assert reader.prefetch(keys[1:2]).l2_hit_count == 0
    reader.adapter.delete(keys[2:])  # found by the reader, stored by the writer
    assert reader.stored.wait_deleted(1)
    assert writer.prefetch(keys[2:]).l2_hit_count == 0


# -- a server that refuses writes ---------------------------------------------------------


def test_a_server_refusing_every_put_gives_failed_store_tasks(lm_store, servers):
    if lm_store.kind != "s3":
        pytest.skip("a fault proxy sits in front of an S3 server")
    cfg = store_of(lm_store)
    upstream = int(cfg["endpoint_override"].rsplit(":", 1)[1])
    proxy = FaultProxy(upstream)
    try:
        # One retry: the proxy's refusal may come as a reset (it closes while the body is
        # still on its way), which is retried; the test need not wait out the default five.
        cfg.update(endpoint_override=proxy.endpoint, max_retries=1)
        server = servers({"store": cfg, "prefix": lm_store.prefix})
        proxy.refuse_puts = True  # after the tier's start-up probe, which writes
        keys = chunk_keys(3, "refused")
        server.write(contents_of(keys))
        assert server.adapter.wait_finished(lambda c: c["stores_ok"] + c["stores_failed"] >= 1, WAIT_S)
        counts = server.adapter.finished_tasks()
        assert counts["stores_ok"] == 0 and counts["stores_failed"] >= 1, counts
        assert proxy.refused >= 1
        assert not server.stored.keys, "LMCache was told refused objects were stored"
        assert server.adapter.tier.stats()["keys_stored"] == 0
        # Reads still work: the keys are absent, and a lookup says so.
        server.manager.delete_l1_keys(keys, force=True)
        assert server.prefetch(keys).l2_hit_count == 0
    finally:
        proxy.close()


# -- configuration and lifetime -----------------------------------------------------------


def test_bad_adapter_params_fail_at_start_naming_the_key(tmp_path):
    store = {"type": "local", "path": str(tmp_path)}
    cases = [
        ({"store": store, "evictoin": {"max_bytes": 1}}, "evictoin"),
        ({"store": store, "eviction": {"max_bytes": "lots"}}, "max_bytes"),
        ({"store": store, "namespace": "mine"}, "namespace"),
        ({"prefix": "p"}, "store"),
    ]
    for params, named in cases:
        with pytest.raises((kvtier.KvtierError, ValueError)) as caught:
            Server(params)
        assert named in str(caught.value), (params, caught.value)
    assert build_tier_config({"store": store})["namespace"] == NAMESPACE


def test_close_gives_every_task_one_result(local_only, servers):
    server = servers(params_for(local_only))
    adapter = server.adapter
    keys = chunk_keys(8, "closing")
    server.push(contents_of(keys))
    reserved = server.manager.reserve_write(keys, LAYOUT)
    loads = [adapter.submit_load_task([k], [reserved[k]]) for k in keys]
    lookups = [adapter.submit_lookup_and_lock_task(keys, {0: LAYOUT}) for _ in range(3)]
    adapter.close()
    adapter.close()  # idempotent
    load_results = [adapter.query_load_result(t) for t in loads]
    lookup_results = [adapter.query_lookup_and_lock_result(t) for t in lookups]
    assert all(r is not None for r in load_results + lookup_results)
    assert all(adapter.query_load_result(t) is None for t in loads), "a second result"
    # After close, a task fails at once instead of never finishing.
    late = adapter.submit_load_task(keys[:1], [reserved[keys[0]]])
    assert adapter.query_load_result(late).popcount() == 0
    server.manager.delete_l1_keys(keys, force=True)


@pytest.mark.parametrize("doc, section", [("README.md", "## Use with LMCache"),
                                          ("docs/lmcache.md", "## Configuration")])
def test_the_documented_command_line_gives_a_working_l2(local_only, servers, doc, section):
    """The documented flags, parsed by LMCache's own parser, load kvtier's adapter, which
    stores and serves chunks. Only the store and prefix (the docs' are placeholders), the
    L1 size (16 GB there) and the server's own flags (host, port) are the test's."""
    argv = lmcache_site.documented_server_argv(doc, section)
    for flag in ("--host", "--port"):  # the server's, not the storage manager's
        if flag in argv:
            del argv[argv.index(flag): argv.index(flag) + 2]
    argv[argv.index("--l1-size-gb") + 1] = "0.03125"
    documented = json.loads(argv[argv.index("--l2-adapter") + 1])
    assert (documented["type"], documented["module_path"], documented["class_name"]) == (
        "plugin", "kvtier.lmcache", "KvtierL2Adapter")
    documented["adapter_params"].update(store=store_of(local_only), prefix=local_only.prefix)
    argv[argv.index("--l2-adapter") + 1] = json.dumps(documented)
    writer = servers(argv=argv)
    keys = chunk_keys(2, f"documented-{doc}")
    contents = contents_of(keys)
    writer.push(contents)
    reader = servers(argv=argv)
    assert reader.prefetch(keys).l2_hit_count == 2
    assert reader.read(keys) == [contents[k].tobytes() for k in keys]
