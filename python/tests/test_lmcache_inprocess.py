"""kvtier as LMCache 0.5.6's remote storage in its in-process mode (``remote_storage_plugins``),
driven through LMCache's own ``LMCacheEngine``, built by its ``LMCacheEngineBuilder`` from a
configuration file as a user writes it and read by LMCache's own parser, on the local store,
s3s-fs and Ceph RGW (moto is left out to keep the suite short).

The one stand-in is the GPU connector: LMCache sees no GPU here, and its own
``MockGPUConnector`` copies nothing, so :class:`CpuKvConnector` copies between the engine's
memory objects and a CPU tensor standing for vLLM's KV cache; every byte that comes back is
compared with what went in.

LMCache comes from ``tools/lmcache-site`` (``scripts/install-tools.sh``, with the few
packages its in-process storage imports beside it), appended to the import path as in
``test_lmcache.py``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import pytest

import lmcache_site  # noqa: E402

lmcache_site.require()
import torch  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.exceptions import IrrecoverableException  # noqa: E402
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.connector import ConnectorContext  # noqa: E402

from fault_proxy import FaultProxy  # noqa: E402
from key_layout import object_name  # noqa: E402
from kvtier.lmcache import NAMESPACE, KvtierConnector, KvtierConnectorAdapter, engine_key  # noqa: E402
from kvtier.lmcache.config import key_of_engine_key  # noqa: E402
from test_lmcache import _flip_one_byte, _replace_object, store_of  # noqa: E402

MODEL = "test/model-1b"
CHUNK_TOKENS = 16
LAYERS, HEADS, HEAD_SIZE = 2, 4, 8
#: Tokens of one prompt in these tests: four chunks.
PROMPT_TOKENS = 4 * CHUNK_TOKENS
#: Bound of every wait on LMCache or the connector; each ends as soon as its condition holds.
WAIT_S = 60.0
#: Bound of an engine's destroy (LMCache's in-process shutdown can hang).
DESTROY_S = 60.0


@pytest.fixture
def lm_store(store, request):
    if "moto" in request.node.callspec.id:
        pytest.skip("LMCache suite: local store, s3s-fs and Ceph RGW (moto left out for time)")
    return store


class CpuKvConnector(GPUConnectorInterface):
    """LMCache's GPU connector on CPU: copies between memory objects (``[2, layers,
    tokens, hidden]``) and ``kvcaches``, a CPU tensor of that shape for the whole prompt."""

    def __init__(self, hidden: int):
        self.hidden = hidden

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, self.hidden])

    def from_gpu(self, memory_obj, start: int, end: int, **kwargs):
        memory_obj.tensor.copy_(kwargs["kvcaches"][:, :, start:end])

    def to_gpu(self, memory_obj, start: int, end: int, **kwargs):
        kwargs["kvcaches"][:, :, start:end].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs=None, starts=None, ends=None, **kwargs):
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, start, end, **kwargs)


def user_config_yaml(tier_config: dict) -> str:
    """LMCache's configuration file as a user writes it for kvtier (the tier's own
    configuration nested under one key; JSON is YAML)."""
    import json

    return (f"chunk_size: {CHUNK_TOKENS}\n"
            "local_cpu: true\n"
            "max_local_cpu_size: 0.01\n"
            "remote_storage_plugins: [\"kvtier\"]\n"
            "extra_config:\n"
            "  remote_storage_plugin.kvtier.module_path: kvtier.lmcache\n"
            "  remote_storage_plugin.kvtier.class_name: KvtierConnectorAdapter\n"
            f"  remote_storage_plugin.kvtier.config: {json.dumps(tier_config)}\n")


class Engine:
    """One LMCache engine (what ``LMCacheConnectorV1`` builds inside a vLLM worker) with
    kvtier as its remote storage, from a configuration file read by LMCache's parser."""

    def __init__(self, config_file: Path, model: str = MODEL, dtype=torch.float16):
        self.instance_id = f"kvtier-test-{uuid.uuid4().hex[:12]}"
        self.config = LMCacheEngineConfig.from_file(str(config_file))
        self.dtype = dtype
        self.metadata = LMCacheMetadata(model_name=model, world_size=1, local_world_size=1, worker_id=0,
                                        local_worker_id=0, kv_dtype=dtype,
                                        kv_shape=(LAYERS, 2, CHUNK_TOKENS, HEADS, HEAD_SIZE), chunk_size=CHUNK_TOKENS)
        self.engine = LMCacheEngineBuilder.get_or_create(self.instance_id, self.config, self.metadata,
                                                         CpuKvConnector(HEADS * HEAD_SIZE), lambda *a: None,
                                                         lambda *a: None)
        try:
            self.engine.post_init()
            self.backends = self.engine.storage_manager.storage_backends
        except BaseException:
            self.destroy()
            raise

    @property
    def connector(self) -> KvtierConnector:
        """The connector LMCache built (inside its instrumentation wrapper)."""
        remote = self.backends["RemoteBackend-kvtier"]
        assert remote.connection is not None, "LMCache has no connection to kvtier"
        return remote.connection._connector

    def kv(self, seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(2, LAYERS, PROMPT_TOKENS, HEADS * HEAD_SIZE, generator=generator).to(self.dtype)

    def keys(self, tokens: torch.Tensor) -> list:
        return [key for _, _, key in self.engine.token_database.process_tokens(tokens)]

    def store(self, tokens: torch.Tensor, kv: torch.Tensor) -> None:
        """Stores the prompt's KV and waits until kvtier stored every chunk of it."""
        before = self.connector.finished_keys()["stored"]
        self.engine.store(tokens, kvcaches=kv)
        chunks = len(tokens) // CHUNK_TOKENS
        assert self.connector.wait_finished(lambda c: c["stored"] + c["store_failed"] >= before + chunks, WAIT_S)
        assert self.connector.finished_keys()["store_failed"] == 0
        # The connector counts a job once its put has been answered on LMCache's loop; one
        # turn of the loop later LMCache has let go of the chunks (its put wrapper's
        # reference), so that they can be dropped from the local cache.
        self.call(asyncio.sleep(0))

    def retrieve(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask of the tokens retrieved, the KV written for them; zeros elsewhere)."""
        out = torch.zeros(2, LAYERS, len(tokens), HEADS * HEAD_SIZE, dtype=self.dtype)
        mask = self.engine.retrieve(tokens, kvcaches=out)
        return mask, out

    def drop_local_copies(self, tokens: torch.Tensor) -> None:
        self.engine.clear(locations=["LocalCPUBackend"])
        local = self.backends["LocalCPUBackend"]
        assert not any(local.contains(k) for k in self.keys(tokens)), "a chunk is still in the local cache"

    def call(self, coroutine):
        """Runs one of the connector's coroutines on LMCache's loop, bounded."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.connector.loop).result(WAIT_S)

    def destroy(self) -> None:
        """LMCache's destroy, bounded: it runs on a thread the test waits for."""
        done = threading.Event()

        def run():
            LMCacheEngineBuilder.destroy(self.instance_id)
            done.set()

        threading.Thread(target=run, name="lmcache-destroy", daemon=True).start()
        assert done.wait(DESTROY_S), f"LMCacheEngineBuilder.destroy did not return within {DESTROY_S} s"


@pytest.fixture
def engines(tmp_path):
    made = []

    def make(tier_config: dict | None = None, config_text: str | None = None, **kw) -> Engine:
        config_file = tmp_path / f"lmcache-{len(made)}.yaml"
        config_file.write_text(config_text if config_text is not None else user_config_yaml(tier_config))
        engine = Engine(config_file, **kw)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.destroy()


def tier_config(store) -> dict:
    return {"store": store_of(store), "prefix": store.prefix}


def prompt(tag: int) -> torch.Tensor:
    return torch.arange(PROMPT_TOKENS) + 1000 * tag


# -- the round trip ---------------------------------------------------------------------


def test_stored_kv_comes_back_byte_identical_from_kvtier(lm_store, engines):
    writer = engines(tier_config(lm_store))
    connector = writer.connector
    assert isinstance(connector, KvtierConnector)
    assert connector.zero_copy_arena, "LMCache's CPU memory is one arena: chunks move without a copy"
    tokens, kv = prompt(1), writer.kv(1)
    writer.store(tokens, kv)
    assert connector.finished_keys()["stored"] == 4

    # The local CPU copy gone, the chunks come from kvtier.
    writer.drop_local_copies(tokens)
    mask, out = writer.retrieve(tokens)
    assert bool(mask.all())
    assert torch.equal(out, kv)
    assert connector.finished_keys()["loaded"] == 4

    # A second engine (another vLLM instance) with an empty local cache reads them too.
    reader = engines(tier_config(lm_store))
    mask, out = reader.retrieve(tokens)
    assert bool(mask.all()) and torch.equal(out, kv)
    assert reader.connector.finished_keys()["loaded"] == 4


def test_exists_answers_as_the_store_does(lm_store, engines):
    engine = engines(tier_config(lm_store))
    tokens = prompt(2)
    engine.store(tokens, engine.kv(2))
    stored = engine.keys(tokens)
    absent = engine.keys(prompt(3))
    connector = engine.connector
    assert [connector.exists_sync(k) for k in stored + absent[:1]] == [True] * 4 + [False]
    assert engine.call(connector.exists(stored[0])) is True
    assert engine.call(connector.exists(absent[0])) is False
    assert connector.batched_contains([stored[0], stored[1], absent[0], stored[3]]) == 2
    assert engine.call(connector.batched_async_contains("lookup", stored)) == 4


# -- objects that are missing or corrupt --------------------------------------------------


def _delete_object(store, kv_key: bytes) -> None:
    name = object_name(store.prefix, NAMESPACE, kv_key)
    if store.kind == "local":
        (store.root / name).unlink()
        return
    import boto3
    from botocore.config import Config

    cfg = store.store_config
    client = boto3.client("s3", endpoint_url=f"http://{cfg['endpoint_override']}", aws_access_key_id=cfg["access_key"],
                          aws_secret_access_key=cfg["secret_key"], region_name=cfg.get("region", "us-east-1"),
                          config=Config(s3={"addressing_style": "path"}))
    client.delete_object(Bucket=cfg["bucket"], Key=name)


def test_missing_and_tampered_objects_miss_without_wrong_bytes(lm_store, engines):
    writer = engines(tier_config(lm_store))
    tokens, kv = prompt(4), writer.kv(4)
    writer.store(tokens, kv)
    keys = writer.keys(tokens)
    _replace_object(lm_store, key_of_engine_key(keys[1]), _flip_one_byte)
    _delete_object(lm_store, key_of_engine_key(keys[2]))

    reader = engines(tier_config(lm_store))
    connector = reader.connector
    # Each chunk alone: the good ones load byte-identical, the tampered and the missing miss.
    for i, key in enumerate(keys):
        obj = reader.call(connector.get(key))
        if i in (1, 2):
            assert obj is None, f"chunk {i} is damaged or gone, yet a get returned it"
            continue
        assert obj is not None, f"chunk {i} did not load"
        try:
            assert torch.equal(obj.tensor, kv[:, :, i * CHUNK_TOKENS:(i + 1) * CHUNK_TOKENS])
        finally:
            obj.ref_count_down()
    assert connector.finished_keys()["load_failed"] == 2

    # Through LMCache's retrieve: the prefix ends at the tampered chunk, and nothing is
    # written for the tokens it did not retrieve.
    mask, out = reader.retrieve(tokens)
    assert mask.tolist() == [True] * CHUNK_TOKENS + [False] * (PROMPT_TOKENS - CHUNK_TOKENS)
    assert torch.equal(out[:, :, :CHUNK_TOKENS], kv[:, :, :CHUNK_TOKENS])
    assert not out[:, :, CHUNK_TOKENS:].any()


def test_a_server_refusing_every_put_stores_nothing_and_says_so(lm_store, engines):
    if lm_store.kind != "s3":
        pytest.skip("a fault proxy sits in front of an S3 server")
    cfg = store_of(lm_store)
    proxy = FaultProxy(int(cfg["endpoint_override"].rsplit(":", 1)[1]))
    try:
        # One retry: a refusal may come as a reset, which is retried (see test_lmcache.py).
        cfg.update(endpoint_override=proxy.endpoint, max_retries=1)
        engine = engines({"store": cfg, "prefix": lm_store.prefix})
        proxy.refuse_puts = True  # after the tier's start-up probe, which writes
        tokens = prompt(6)
        engine.engine.store(tokens, kvcaches=engine.kv(6))
        connector = engine.connector
        assert connector.wait_finished(lambda c: c["stored"] + c["store_failed"] >= 4, WAIT_S)
        assert connector.finished_keys()["stored"] == 0 and proxy.refused >= 1
        assert not any(connector.exists_sync(k) for k in engine.keys(tokens))
    finally:
        proxy.close()
    reader = engines(tier_config(lm_store))
    mask, out = reader.retrieve(tokens)
    assert not mask.any() and not out.any()


# -- keys and configuration ---------------------------------------------------------------


def test_model_world_size_worker_dtype_and_tags_separate_objects():
    base = CacheEngineKey(MODEL, 1, 0, 12345, torch.float16)
    variants = [
        CacheEngineKey(MODEL + "x", 1, 0, 12345, torch.float16),
        CacheEngineKey(MODEL, 2, 0, 12345, torch.float16),
        CacheEngineKey(MODEL, 2, 1, 12345, torch.float16),
        CacheEngineKey(MODEL, 1, 0, 12345, torch.bfloat16),
        CacheEngineKey(MODEL, 1, 0, -12345, torch.float16),
        CacheEngineKey(MODEL, 1, 0, 12345, torch.float16, {"lmcache.tag.tenant": "a"}),
    ]
    kv_keys = [key_of_engine_key(k) for k in [base, *variants]]
    assert len(set(kv_keys)) == len(kv_keys)
    assert all(len(k) == 36 for k in kv_keys)
    assert key_of_engine_key(CacheEngineKey(MODEL, 1, 0, 12345, torch.float16)) == kv_keys[0]
    assert kv_keys[0] == engine_key(MODEL, 1, 0, 12345, "half")
    # The layerwise form carries its layer as the object group.
    layer = base.split_layers(3)[2]
    assert key_of_engine_key(layer)[32:] == (2).to_bytes(4, "big") and key_of_engine_key(layer) != kv_keys[0]


def test_another_model_or_dtype_finds_nothing(local_only, engines):
    writer = engines(tier_config(local_only))
    tokens = prompt(5)
    writer.store(tokens, writer.kv(5))
    for other in (engines(tier_config(local_only), model="other/model"),
                  engines(tier_config(local_only), dtype=torch.bfloat16)):
        mask, out = other.retrieve(tokens)
        assert not mask.any() and not out.any()
        assert not other.connector.exists_sync(other.keys(tokens)[0])


def test_the_tier_configuration_may_be_a_json_file(local_only, engines, tmp_path):
    """``remote_storage_plugin.kvtier.config`` as the path of a JSON file (credentials kept
    out of LMCache's configuration)."""
    import json

    path = tmp_path / "kvtier.json"
    path.write_text(json.dumps(tier_config(local_only)))
    text = user_config_yaml({}).replace("remote_storage_plugin.kvtier.config: {}",
                                        f"remote_storage_plugin.kvtier.config: {json.dumps(str(path))}")
    engine = engines(config_text=text)
    tokens = prompt(8)
    engine.store(tokens, engine.kv(8))
    assert all(engine.connector.exists_sync(k) for k in engine.keys(tokens))
    assert str(local_only.root) in engine.connector.tier.location


def test_a_bad_tier_configuration_builds_no_remote_backend_and_names_the_key(tmp_path, engines):
    engine = engines({"store": {"type": "local", "path": str(tmp_path / "s")}, "evictoin": {"max_bytes": 1}})
    assert "RemoteBackend-kvtier" not in engine.backends
    # What LMCache logged as its reason, asked of the adapter LMCache builds.
    remote_context = ConnectorContext("plugin://kvtier", None, None, engine.config, engine.metadata, "kvtier")
    with pytest.raises(IrrecoverableException) as caught:
        KvtierConnectorAdapter().create_connector(remote_context)
    assert "evictoin" in str(caught.value)
    assert KvtierConnectorAdapter().can_parse("plugin://kvtier") and KvtierConnectorAdapter().can_parse(
        "plugin://kvtier.primary")
    assert not KvtierConnectorAdapter().can_parse("plugin://kvtierx")


def test_the_documented_configuration_gives_a_working_remote_store(local_only, engines):
    """The YAML of docs/lmcache.md's in-process section, read by LMCache's own parser, gives
    an engine that stores and retrieves through kvtier. Only the tier's store and prefix
    (the document's are placeholders), the chunk size and the CPU cache size (256 tokens
    and 5 GB there) are the test's."""
    import re

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "lmcache.md").read_text()
    section = text[text.index("## In-process mode"):]
    documented = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    extra = documented["extra_config"]
    assert (documented["remote_storage_plugins"], extra["remote_storage_plugin.kvtier.module_path"],
            extra["remote_storage_plugin.kvtier.class_name"]) == (["kvtier"], "kvtier.lmcache",
                                                                   "KvtierConnectorAdapter")
    extra["remote_storage_plugin.kvtier.config"].update(tier_config(local_only))
    documented.update(chunk_size=CHUNK_TOKENS, max_local_cpu_size=0.01)
    writer = engines(config_text=yaml.safe_dump(documented))
    tokens, kv = prompt(7), writer.kv(7)
    writer.store(tokens, kv)
    reader = engines(config_text=yaml.safe_dump(documented))
    mask, out = reader.retrieve(tokens)
    assert bool(mask.all()) and torch.equal(out, kv)
    assert reader.connector.finished_keys()["loaded"] == 4
