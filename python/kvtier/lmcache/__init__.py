"""kvtier as LMCache's remote store, in both of LMCache 0.5.6's modes.

Multiprocess (MP) mode: the L2 adapter, loaded from LMCache's ``--l2-adapter`` JSON::

    {"type": "plugin", "module_path": "kvtier.lmcache", "class_name": "KvtierL2Adapter",
     "adapter_params": {"store": {"type": "s3", "bucket": "kv", "endpoint_override": "..."},
                        "prefix": "lmcache-prod"}}

In-process mode (``LMCacheConnectorV1`` inside vLLM): the remote storage plugin, named in
LMCache's configuration (``remote_storage_plugins: ["kvtier"]``, ``extra_config``
``remote_storage_plugin.kvtier.module_path: kvtier.lmcache``, ``.class_name:
KvtierConnectorAdapter``, ``.config``: the tier's configuration); see
:mod:`kvtier.lmcache.connector`.

``adapter_params`` and ``.config`` are kvtier's tier configuration
(:mod:`kvtier.lmcache.config`). Importing this package imports LMCache's MP-mode code (the
adapter subclasses its ``L2AdapterInterface``); the in-process connector, whose LMCache
code needs more of LMCache's dependencies, is imported on first use. The configuration
helpers in :mod:`kvtier.lmcache.config` import nothing of LMCache.
"""

from .adapter import KvtierL2Adapter
from .config import NAMESPACE, build_tier_config, engine_key, object_key

__all__ = ["KvtierConnector", "KvtierConnectorAdapter", "KvtierL2Adapter", "NAMESPACE", "build_tier_config",
           "engine_key", "object_key"]

_IN_PROCESS = frozenset({"KvtierConnector", "KvtierConnectorAdapter"})


def __getattr__(name: str):
    # LMCache finds the class by getattr on this module, which lands here on first use.
    if name in _IN_PROCESS:
        from . import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
