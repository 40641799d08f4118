"""LMCache's ``adapter_params`` -> kvtier's tier configuration, and LMCache's object keys
-> kvtier's keys. Imports nothing of LMCache.

Keys: an LMCache ``ObjectKey`` is (chunk hash, model name, kv rank, object group, cache
salt), and one batch may mix models, ranks and salts. A tier has one namespace, so what
separates objects goes into the key: its 32-byte hash is a BLAKE2b digest of the model,
the rank, the salt and the chunk hash (length-prefixed, so no two field tuples give one
input), and its 4-byte group is the object group. Two salts, models or ranks never share an
object; two LMCache servers with the same model and rank share every object. All of it in
one namespace, :data:`NAMESPACE`, under the configured ``prefix``: one eviction budget
and one ``kvtier du`` per prefix.
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

# Versioned, so that a change of the derivation can never read another one's objects.
_PERSON = b"kvtier-lmcache1"


def _field(raw: bytes) -> bytes:
    return len(raw).to_bytes(4, "big") + raw


def object_key(chunk_hash: bytes, model_name: str, kv_rank: int, object_group_id: int = 0,
               cache_salt: str = "") -> bytes:
    """kvtier's 36-byte key of an LMCache object: BLAKE2b-256 of (model, kv rank, cache salt,
    chunk hash), then the object group as the 4-byte big-endian group index."""
    if not 0 <= object_group_id < 1 << (8 * KEY_GROUP_BYTES):
        raise ValueError(f"object_group_id {object_group_id} does not fit kvtier's {KEY_GROUP_BYTES}-byte group")
    digest = hashlib.blake2b(digest_size=32, person=_PERSON)
    digest.update(_field(model_name.encode()))
    digest.update(_field(int(kv_rank).to_bytes(8, "big", signed=True)))
    digest.update(_field(cache_salt.encode()))
    digest.update(_field(bytes(chunk_hash)))
    return block_key(digest.digest(), object_group_id)


def key_of(key: Any) -> bytes:
    """kvtier's key of an ``lmcache.v1.distributed.api.ObjectKey``."""
    return object_key(key.chunk_hash, key.model_name, key.kv_rank, key.object_group_id, key.cache_salt)


def build_tier_config(adapter_params: Mapping[str, Any] | None) -> dict:
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
    # The adapter turns the tier's BlockRemoved events (its own eviction) into LMCache's
    # deleted-key notifications.
    config["enable_kv_events"] = True
    return config
