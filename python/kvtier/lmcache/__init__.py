"""kvtier as LMCache's L2 store in multiprocess (MP) mode.

LMCache 0.5.6 loads it from its ``--l2-adapter`` JSON::

    {"type": "plugin", "module_path": "kvtier.lmcache", "class_name": "KvtierL2Adapter",
     "adapter_params": {"store": {"type": "s3", "bucket": "kv", "endpoint_override": "..."},
                        "prefix": "lmcache-prod"}}

``adapter_params`` is kvtier's tier configuration (:mod:`kvtier.lmcache.config`). Importing
this package imports LMCache (the adapter subclasses its ``L2AdapterInterface``); the
configuration helpers in :mod:`kvtier.lmcache.config` do not.
"""

from .adapter import KvtierL2Adapter
from .config import NAMESPACE, build_tier_config, object_key

__all__ = ["KvtierL2Adapter", "NAMESPACE", "build_tier_config", "object_key"]
