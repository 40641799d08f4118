"""vLLM's obj-tier keywords -> kvtier's tier configuration.

vLLM configures its obj tier with one flat ``store_config`` (NIXL's ``ObjStoreConfig``
names) beside the tier's keywords (``prefix``, ``io_threads``, ``enable_kv_events``,
``locality``); kvtier has the tier's keys at the top of its configuration and the
store's below ``store``. This module lifts the tier's keys out of ``store_config``,
applies vLLM's defaults and "empty means unset" rules, and refuses NIXL settings kvtier
cannot honour.
"""

from __future__ import annotations

import enum
import functools
import logging
from typing import Any, Mapping

from .._engine_adapter import drop_unset, split_flat_config
from .._schema import config_schema
from ._shims import Locality

logger = logging.getLogger("kvtier.vllm")

#: Top-level keys the adapter sets itself from vLLM's keywords, never from ``store_config``.
_KEYWORD_KEYS = frozenset({"store", "prefix", "namespace", "enable_kv_events", "locality"})


@functools.cache
def tier_keys() -> frozenset:
    """Keys of ``store_config`` that configure the tier rather than the store: every
    top-level key the library publishes (``eviction.max_bytes`` gives ``eviction``), so a
    new library key needs no change here. Read from the library on first use, as
    ``TIER_KEYS`` is, so that importing the package never needs the library."""
    return frozenset(
        entry["key"].split(".", 1)[0] for entry in config_schema()["keys"] if entry["store"] is None
    ) - _KEYWORD_KEYS


@functools.cache
def _store_types() -> tuple:
    return tuple(config_schema()["store_types"])


def __getattr__(name: str):
    if name == "TIER_KEYS":
        return tier_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
#: vLLM sends these only when non-empty; empty means "use the default (credential chain...)".
_OMIT_WHEN_EMPTY = ("access_key", "secret_key", "session_token", "region", "ca_bundle")
#: Optional S3 settings (#56192) that vLLM sends only when set.
_OMIT_WHEN_NONE = ("use_virtual_addressing", "req_checksum", "resp_checksum", "scheme", "endpoint_override")
#: NIXL parameter names that vLLM's ``backend_params`` may not override (#56192).
_RESERVED_BACKEND_PARAMS = frozenset(
    {
        "bucket",
        "endpoint_override",
        "access_key",
        "secret_key",
        "session_token",
        "region",
        "scheme",
        "ca_bundle",
        "num_threads",
        "use_virtual_addressing",
        "req_checksum",
        "resp_checksum",
        "accelerated",
        "type",
    }
)
_TRUE_WORDS = {"1", "true", "yes", "y", "on", "enable"}


def parse_locality(locality: Any):
    """``None``, or vLLM's ``Locality`` for exactly ``"LOCAL"`` / ``"REMOTE"``; else ValueError."""
    if locality is None:
        return None
    if isinstance(locality, enum.Enum):
        locality = locality.value
    if not isinstance(locality, str):
        raise ValueError(f"locality must be 'LOCAL', 'REMOTE' or None, not {locality!r}")
    return Locality(locality)  # ValueError for anything but the exact enum values


def build_tier_config(
    store_config: Mapping[str, Any],
    *,
    prefix: str = "",
    namespace: str = "",
    io_threads: int | None = None,
    enable_kv_events: bool = False,
    locality: Any = None,
) -> dict:
    """kvtier's tier configuration for vLLM's obj-tier keywords.

    ``store_config`` takes vLLM's ``ObjStoreConfig`` names (bucket, endpoint_override,
    scheme, access_key, secret_key, session_token, region, ca_bundle,
    use_virtual_addressing, req_checksum, resp_checksum) and kvtier's extras: ``type``
    (``s3`` — the default when a bucket is given —, ``local`` with ``path``, or
    ``memory``), the tier keys in :data:`TIER_KEYS`, and the S3 client keys
    (connect_timeout_ms, request_timeout_ms, max_retries, payload_signing, allow_http).
    As in vLLM, ``scheme`` defaults to ``http`` when an ``endpoint_override`` is given
    and empty credentials/region/CA bundle are left out.
    """
    if not isinstance(store_config, Mapping):
        raise TypeError(f"store_config must be a dict, not {type(store_config).__name__}")
    tier, store = split_flat_config(store_config, tier_keys())

    accelerated = store.pop("accelerated", None)
    if accelerated is True or (isinstance(accelerated, str) and accelerated.lower() in _TRUE_WORDS):
        raise ValueError("store_config.accelerated: kvtier has no accelerated (RDMA) NIXL engines; remove it")
    backend_params = store.pop("backend_params", None)
    if backend_params:
        if not isinstance(backend_params, Mapping):
            raise ValueError("store_config.backend_params must be a dict")
        reserved = sorted(_RESERVED_BACKEND_PARAMS & backend_params.keys())
        if reserved:
            raise ValueError(f"store_config.backend_params may not set reserved keys {reserved}")
        logger.warning("store_config.backend_params %s are NIXL settings; kvtier ignores them", sorted(backend_params))

    store_type = store.pop("type", None) or None
    if store_type is None:
        if "bucket" not in store:
            raise ValueError(
                "store_config needs a 'bucket' (S3), or 'type': 'local' with a 'path', or 'type': 'memory'"
            )
        store_type = "s3"
    if store_type not in _store_types():
        raise ValueError(
            f"store_config.type {store_type!r}: kvtier stores are {', '.join(_store_types())} "
            "(NIXL accelerated engine types are not supported)"
        )
    if store_type == "s3":
        drop_unset(store, _OMIT_WHEN_EMPTY)
        drop_unset(store, _OMIT_WHEN_NONE, unset=(None,))
        if store.get("endpoint_override") and "scheme" not in store:
            store["scheme"] = "http"  # vLLM's default (NIXL's own would be https)

    config: dict[str, Any] = {"store": {"type": store_type, **store}, "prefix": prefix}
    if namespace:
        config["namespace"] = namespace
    # vLLM's keys are whatever the hash algorithm makes them (32-byte SHA-256 hashes by
    # default, 8 bytes for xxhash): accept any length unless the user pins one.
    config["key_bytes"] = 0
    if io_threads is not None:
        # NIXL's io_threads is the executor that caps concurrent requests. kvtier's
        # concurrency comes from max_inflight_transfers/_lookups; io_threads sizes the
        # async runtime driving them.
        config["runtime_threads"] = max(1, min(int(io_threads), 256))
    config.update(tier)
    config["enable_kv_events"] = bool(enable_kv_events)
    loc = parse_locality(locality)
    if loc is not None:
        config["locality"] = loc.name
    return config

