"""LMCache's ``adapter_params`` -> kvtier's tier configuration, and LMCache's object keys
-> kvtier's keys, for both of LMCache's modes. Imports nothing of LMCache.

Keys: an LMCache ``ObjectKey`` is (chunk hash, model name, kv rank, object group, cache
salt), and one batch may mix models, ranks and salts. A tier has one namespace, so what
separates objects goes into the key: its 32-byte hash is a BLAKE2b digest of the model,
the rank, the salt and the chunk hash (length-prefixed, so no two field tuples give one
input), and its 4-byte group is the object group. Two salts, models or ranks never share an
object; two LMCache servers with the same model and rank share every object. All of it in
one namespace, :data:`NAMESPACE`, under the configured ``prefix``: one eviction budget
and one ``kvtier du`` per prefix.

In-process mode keys a chunk by a ``CacheEngineKey`` (model, world size, worker id, chunk
hash, dtype, request tags; a layer for layerwise storage): the same derivation over those
fields (:func:`engine_key`), under its own BLAKE2b personalisation, so that no in-process
key can ever equal a multiprocess one.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from .._engine_adapter import block_key
from ..tier import DEFAULT_KEY_BYTES, KEY_GROUP_BYTES

#: The namespace of every object of the adapter (under the configured ``prefix``).
NAMESPACE = "lmcache"

#: Top-level keys the adapter sets itself.
DERIVED_KEYS = frozenset({"namespace", "key_bytes", "enable_kv_events"})

# Versioned, so that a change of the derivation can never read another one's objects;
# one personalisation per mode, so that the two modes' keys never meet.
_PERSON = b"kvtier-lmcache1"
_PERSON_INPROCESS = b"kvtier-lmc-ip1"


def _derived_key(person: bytes, fields: list[bytes], group: int) -> bytes:
    """kvtier's 36-byte key: BLAKE2b-256 of ``fields``, each length-prefixed (so no two
    field lists give one input), then ``group`` as the 4-byte big-endian group index."""
    if not 0 <= group < 1 << (8 * KEY_GROUP_BYTES):
        raise ValueError(f"object group {group} does not fit kvtier's {KEY_GROUP_BYTES}-byte group")
    digest = hashlib.blake2b(digest_size=32, person=person)
    for raw in fields:
        digest.update(len(raw).to_bytes(4, "big") + raw)
    return block_key(digest.digest(), group)


def _int_bytes(value: int) -> bytes:
    """A signed integer of any size, two's complement, big-endian (chunk hashes of
    LMCache's in-process mode are Python ints and may be negative)."""
    value = int(value)
    return value.to_bytes(max(8, (value.bit_length() + 8) // 8), "big", signed=True)


def object_key(chunk_hash: bytes, model_name: str, kv_rank: int, object_group_id: int = 0,
               cache_salt: str = "") -> bytes:
    """kvtier's 36-byte key of an LMCache object: BLAKE2b-256 of (model, kv rank, cache salt,
    chunk hash), then the object group as the 4-byte big-endian group index."""
    fields = [model_name.encode(), int(kv_rank).to_bytes(8, "big", signed=True), cache_salt.encode(),
              bytes(chunk_hash)]
    return _derived_key(_PERSON, fields, object_group_id)


def key_of(key: Any) -> bytes:
    """kvtier's key of an ``lmcache.v1.distributed.api.ObjectKey``."""
    return object_key(key.chunk_hash, key.model_name, key.kv_rank, key.object_group_id, key.cache_salt)


def engine_key(model_name: str, world_size: int, worker_id: int, chunk_hash: int, dtype: str,
               tags: tuple = (), layer: int | None = None) -> bytes:
    """kvtier's 36-byte key of an in-process ``CacheEngineKey``: BLAKE2b-256 of (model,
    world size, worker id, dtype, request tags, layer, chunk hash); its group is the layer
    (0 for whole chunks)."""
    tag_text = "\x00".join(f"{k}={v}" for k, v in (tags or ()))
    fields = [model_name.encode(), _int_bytes(world_size), _int_bytes(worker_id), dtype.encode(),
              tag_text.encode(), _int_bytes(-1 if layer is None else layer), _int_bytes(chunk_hash)]
    return _derived_key(_PERSON_INPROCESS, fields, 0 if layer is None else layer)


def key_of_engine_key(key: Any) -> bytes:
    """kvtier's key of an ``lmcache.utils.CacheEngineKey`` (or its layerwise form)."""
    return engine_key(key.model_name, key.world_size, key.worker_id, key.chunk_hash, key._dtype_str,
                      key.tags or (), getattr(key, "layer_id", None))


def build_tier_config(adapter_params: Mapping[str, Any] | None, kv_events: bool = True) -> dict:
    """kvtier's tier configuration from LMCache's ``adapter_params``: all of it is kvtier's
    (``store``, ``prefix``, ``eviction``, ``encryption``, checksums, concurrency...), which
    the library checks by its own rules, naming a bad key. Raises ``ValueError`` for a
    missing store or a key the adapter derives itself."""
    if adapter_params is None:
        adapter_params = {}
    if not isinstance(adapter_params, Mapping):
        raise ValueError(f"adapter_params must be a JSON object, not {type(adapter_params).__name__}")
    config = dict(adapter_params)
    derived = sorted(DERIVED_KEYS & config.keys())
    if derived:
        raise ValueError(
            f"adapter_params sets {derived}, which kvtier.lmcache derives itself (one namespace, "
            f"'{NAMESPACE}', with model, rank and salt in the key; use 'prefix' to separate deployments)"
        )
    if "store" not in config:
        raise ValueError(
            "adapter_params needs a kvtier 'store', e.g. {\"store\": {\"type\": \"s3\", \"bucket\": \"kv\", "
            "\"endpoint_override\": \"http://127.0.0.1:9000\"}} or "
            "{\"store\": {\"type\": \"local\", \"path\": \"/var/cache/kv\"}}"
        )
    config["namespace"] = NAMESPACE
    config["key_bytes"] = DEFAULT_KEY_BYTES
    # The MP adapter turns the tier's BlockRemoved events (its own eviction) into LMCache's
    # deleted-key notifications; the in-process connector has nobody to tell, and events
    # nobody takes would only pile up.
    config["enable_kv_events"] = kv_events
    return config
