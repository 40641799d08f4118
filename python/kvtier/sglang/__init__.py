"""kvtier as SGLang's HiCache L3 storage backend.

Start SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierStorage", "interface_v1": 1,
        "store": {"type": "s3", "bucket": "kv", "endpoint_override": "http://127.0.0.1:9000"}}'

Everything in ``extra_config`` but SGLang's own keys is kvtier's tier configuration.
"""

from .backend import KvtierStorage, page_key
from .config import build_tier_config, namespace

__all__ = ["KvtierStorage", "build_tier_config", "namespace", "page_key"]
