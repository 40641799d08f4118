"""Checks that LMCache, installed beside the test venv (tools/lmcache-site, on PYTHONPATH),
runs on the venv's torch on CPU: it imports, and its multiprocess-mode StorageManager
starts with an L2 adapter built from a JSON --l2-adapter, takes an object into its L1
arena and closes. Run by scripts/install-tools.sh after installing it; prints one line."""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")  # else a telemetry thread starts

started = time.monotonic()
import torch  # noqa: E402

import lmcache  # noqa: E402
from lmcache.lmcache_native import Bitmap  # noqa: E402  (what an L2 adapter answers with)
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey  # noqa: E402
from lmcache.v1.distributed.config import parse_args  # noqa: E402
from lmcache.v1.distributed.storage_manager import StorageManager  # noqa: E402
import lmcache.v1.cache_engine  # noqa: E402,F401  (the in-process engine: its storage's imports)

imported = time.monotonic()
mock_l2 = {"type": "mock", "max_size_gb": 0.01, "mock_bandwidth_gb": 10}
config = parse_args(["--l1-size-gb", "0.01", "--no-l1-use-lazy", "--eviction-policy", "LRU",
                     "--l2-adapter", json.dumps(mock_l2)])
manager = StorageManager(config)
try:
    key = ObjectKey(chunk_hash=bytes(32), model_name="check", kv_rank=0)
    reserved = manager.reserve_write([key], MemoryLayoutDesc([torch.Size([64])], [torch.uint8]))
    assert key in reserved, "LMCache's L1 refused one 64-byte object"
    manager.finish_write([key])
    desc = manager.l1_memory_desc
    assert desc.ptr and desc.size > 0, desc
    assert Bitmap(3).popcount() == 0
finally:
    manager.close()
print(f"check-lmcache: lmcache {lmcache.__version__ if hasattr(lmcache, '__version__') else '?'} on torch "
      f"{torch.__version__}, device cpu: import {imported - started:.1f} s, StorageManager ok")
