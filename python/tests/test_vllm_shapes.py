"""kvtier.vllm inside a vLLM: a minimal stand-in ``vllm`` package with the shapes of
vLLM's tiering interfaces (abstract SecondaryTierManager, LookupResult enum, JobResult
and OffloadingEvent dataclasses of an older version lacking some fields, FileMapper,
and the factory's out-of-tree class lookup), run in a subprocess so that this test
process keeps the real import state."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import kvtier

FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/kv_offload/__init__.py": "",
    "vllm/v1/kv_offload/base.py": """
        import enum
        from dataclasses import dataclass

        class Medium(enum.Enum):
            CPU = "CPU"
            STORAGE = "STORAGE"

        class Locality(enum.Enum):
            LOCAL = "LOCAL"
            REMOTE = "REMOTE"

        class LookupResult(enum.Enum):
            MISS = enum.auto()
            HIT = enum.auto()
            HIT_PENDING = enum.auto()
            RETRY = enum.auto()

        @dataclass
        class ReqContext:
            req_id: str
            kv_transfer_params: dict | None = None

        @dataclass
        class RequestOffloadingContext:
            policy: str = "chunk_level"

        @dataclass
        class OffloadingEvent:          # an older shape: no locality field
            keys: list
            medium: Medium
            removed: bool
    """,
    "vllm/v1/kv_offload/tiering/__init__.py": "",
    "vllm/v1/kv_offload/tiering/base.py": """
        from abc import ABC, abstractmethod
        from dataclasses import dataclass
        from vllm.v1.kv_offload.base import LookupResult, RequestOffloadingContext

        @dataclass
        class JobResult:                # an older shape: no successful_keys / transfer_size
            job_id: int
            success: bool
            transfer_time: float | None = None

        class SecondaryTierManager(ABC):
            def __init__(self, offloading_spec, primary_kv_view, tier_type):
                self._offloading_spec = offloading_spec
                self._primary_kv_view = primary_kv_view
                self.tier_type = tier_type

            @abstractmethod
            def lookup(self, key, req_context): ...
            @abstractmethod
            def submit_store(self, job): ...
            @abstractmethod
            def submit_load(self, job): ...
            @abstractmethod
            def get_finished_jobs(self): ...
            @abstractmethod
            def on_new_request(self, req_context): ...
            @abstractmethod
            def drain_jobs(self): ...

            def take_events(self):
                return ()

            def shutdown(self):
                return None

            @classmethod
            def build_metric_definitions(cls, extra_config):
                return {}
    """,
    "vllm/v1/kv_offload/file_mapper.py": """
        import hashlib, json

        class FileMapper:
            def __init__(self, root_dir, fields, rank):
                self.fields = fields
                self.rank = rank
                canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
                digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
                self.base_path = f"{root_dir}/{fields['model_name'].replace('/', '_')}_{digest}"

            @classmethod
            def from_offloading_spec(cls, root_dir, spec, blocks_per_file=1, parallel_agnostic=False):
                c = spec.config
                fields = {"model_name": c.model.name, "tokens_per_hash": 16, "blocks_per_file": blocks_per_file,
                          "tp_size": 1, "pp_size": 1, "pcp_size": 1, "dcp_size": 1, "dtype": c.model.dtype,
                          "kv_cache_groups": [], "inference_engine": "vllm"}
                return cls(root_dir, fields, 0)

            def get_run_config(self):
                return dict(self.fields)
    """,
}

SCRIPT = r"""
import importlib, json, time
from types import SimpleNamespace
import numpy as np
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, JobResult
from vllm.v1.kv_offload.base import LookupResult, OffloadingEvent, Medium, ReqContext
import kvtier.vllm as kv

assert kv.HAVE_VLLM
assert issubclass(kv.KvtierTier, SecondaryTierManager)
assert kv.LookupResult is LookupResult and kv.JobResult is JobResult

# The factory's out-of-tree path: getattr(import_module(module_path), type).
entry = {"type": "KvtierTier", "module_path": "kvtier.vllm",
         "store_config": {"type": "local", "path": STORE}, "enable_kv_events": True, "locality": "LOCAL"}
config = dict(entry)
cls = getattr(importlib.import_module(config.pop("module_path")), config.pop("type"))
assert issubclass(cls, SecondaryTierManager)
spec = SimpleNamespace(config=SimpleNamespace(model=SimpleNamespace(name="org/m", dtype="fp16")),
                       kv_events_config=SimpleNamespace(enable_kv_cache_events=True))
pool = np.zeros((8, 256), np.uint8)
tier = cls(offloading_spec=spec, primary_kv_view=memoryview(pool), tier_type="KvtierTier", **config)

fields = {"model_name": "org/m", "tokens_per_hash": 16, "blocks_per_file": 1, "tp_size": 1, "pp_size": 1,
          "pcp_size": 1, "dcp_size": 1, "dtype": "fp16", "kv_cache_groups": [], "inference_engine": "vllm"}
assert tier.namespace == kvtier.vllm_namespace(fields, 0), tier.namespace

key = bytes(range(32)) + b"\0\0\0\1"
pool[1] = 7
tier.submit_store(SimpleNamespace(job_id=0, keys=[key], block_ids=np.array([1])))
tier.drain_jobs()
(r,) = tier.get_finished_jobs()
assert isinstance(r, JobResult) and r.success and r.transfer_time >= 0
(e,) = tier.take_events()
assert isinstance(e, OffloadingEvent) and e.keys == [key] and e.medium is Medium.STORAGE
ctx = ReqContext(req_id="a")
assert tier.lookup(key, ctx) is LookupResult.RETRY
tier.on_schedule_end(None)
deadline = time.monotonic() + 10
while tier.lookup(key, ctx) is LookupResult.RETRY:
    assert time.monotonic() < deadline
    time.sleep(0.002)
assert tier.lookup(key, ctx) is LookupResult.HIT
tier.submit_load(SimpleNamespace(job_id=1, keys=[key, b"\1" * 36], block_ids=np.array([5, 6])))
tier.drain_jobs()
(r,) = tier.get_finished_jobs()
assert not r.success and not hasattr(r, "successful_keys")  # this vLLM has no such field
assert tier.lookup(b"\1" * 36, ctx) is LookupResult.RETRY
tier.on_request_finished(ctx)
tier.shutdown()
print("ok")
"""


def test_inside_a_vllm_with_older_dataclasses(tmp_path):
    root = tmp_path / "fake-vllm"
    for rel, text in FAKE_VLLM.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    package_dir = Path(kvtier.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(package_dir)])}
    script = "import kvtier\nSTORE = %r\n" % str(tmp_path / "store") + SCRIPT
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok")
