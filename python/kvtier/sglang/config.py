"""SGLang's ``extra_config`` and storage config -> kvtier's tier configuration.

SGLang hands a dynamic backend one dictionary, ``--hicache-storage-backend-extra-config``,
which also carries its factory's keys (``backend_name``, ``module_path``, ``class_name``)
and ``interface_v1``. Everything else in it is kvtier's tier configuration (``store``,
``prefix``, ``eviction``, checksums, ...), validated by the library, so an unknown key
fails at construction with the key's name.

The namespace is not configurable: it is derived from what makes a stored page
meaningful to a pool (model, memory layout, dtype, page size, heads, layers, and the
TP/PP/CP shard a rank holds), so that pools that cannot share bytes never do and pools
that can always do.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

from .._engine_adapter import split_flat_config
from ..tier import DEFAULT_KEY_BYTES

#: Keys of ``extra_config`` that belong to SGLang (its factory and controller), not kvtier.
SGLANG_KEYS = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        # Popped by SGLang's controller before the backend is built; listed so that a
        # backend built by hand from the same dictionary accepts them too.
        "prefetch_threshold",
        "prefetch_timeout_base",
        "prefetch_timeout_per_ki_token",
        "hicache_storage_pass_prefix_keys",
        "tp_lcm_size",
    }
)

#: Top-level keys the backend sets itself.
_DERIVED_KEYS = frozenset({"namespace", "key_bytes"})

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def segment(text: Any) -> str:
    """``text`` as one object-name segment: characters other than letters, digits, ``.``,
    ``_`` and ``-`` become ``-`` (a model path's ``/`` too, as SGLang's file backend does)."""
    out = _UNSAFE.sub("-", str(text)).strip("-.")
    return out or "none"


def pool_geometry(host_pool: Any) -> dict[str, Any]:
    """What a page's bytes depend on in ``host_pool`` (an SGLang host KV pool)."""
    dtype = getattr(host_pool, "dtype", None)
    geometry = {
        "kind": "mla" if _is_mla_pool(host_pool) else "mha",
        "layout": getattr(host_pool, "layout", None),
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
        "page_size": getattr(host_pool, "page_size", None),
        "layers": getattr(host_pool, "layer_num", None),
    }
    if geometry["kind"] == "mha":
        geometry["heads"] = getattr(host_pool, "head_num", None)
        geometry["head_dim"] = getattr(host_pool, "head_dim", None)
    else:
        geometry["kv_lora_rank"] = getattr(host_pool, "kv_lora_rank", None)
        geometry["rope_dim"] = getattr(host_pool, "qk_rope_head_dim", None)
    missing = sorted(k for k, v in geometry.items() if v is None)
    if missing:
        raise ValueError(
            f"kvtier.sglang cannot name the pages of {type(host_pool).__name__}: it has no {', '.join(missing)}"
        )
    return geometry


def _is_mla_pool(host_pool: Any) -> bool:
    return "MLA" in type(host_pool).__name__ or hasattr(host_pool, "kv_lora_rank")


def namespace(storage_config: Any, geometry: Mapping[str, Any]) -> str:
    """The namespace of this rank's pages:
    ``sglang/<model>/<kind>-<layout>-<dtype>-p<page>-l<layers>-h<heads>x<dim>/<shard>``.

    The shard is ``tp<rank>of<size>`` for MHA (each rank holds its own heads) and
    ``tp<size>`` for MLA (every rank holds the same latent cache; one writes), then
    ``pp<rank>of<size>`` and ``cp<rank>of<size>`` when those are used.
    """
    g = geometry
    if g["kind"] == "mha":
        shape = f"h{g['heads']}x{g['head_dim']}"
    else:
        shape = f"r{g['kv_lora_rank']}x{g['rope_dim']}"
    pool = segment(f"{g['kind']}-{g['layout']}-{g['dtype']}-p{g['page_size']}-l{g['layers']}-{shape}")
    return "/".join(["sglang", _model(storage_config), pool, shard(storage_config, replicated=g["kind"] == "mla")])


def _model(storage_config: Any) -> str:
    return segment(getattr(storage_config, "model_name", None) or "model")


def shard(storage_config: Any, replicated: bool) -> str:
    """The rank's shard segment: ``tp<size>`` for a pool every TP rank holds alike (MLA),
    else ``tp<rank>of<size>``; then ``pp``, ``cp`` and ``dcp`` when used."""
    tp_rank, tp_size = storage_config.tp_rank, storage_config.tp_size
    parts = [f"tp{tp_size}" if replicated else f"tp{tp_rank}of{tp_size}"]
    if storage_config.pp_size > 1:
        parts.append(f"pp{storage_config.pp_rank}of{storage_config.pp_size}")
    if getattr(storage_config, "attn_cp_size", 1) > 1:
        parts.append(f"cp{storage_config.attn_cp_rank}of{storage_config.attn_cp_size}")
    if getattr(storage_config, "dcp_size", 1) > 1:
        parts.append(f"dcp{storage_config.dcp_rank}of{storage_config.dcp_size}")
    return "_".join(parts)


#: Attributes of SGLang's host pools that shape a page's bytes, where a pool has them:
#: KV-like pools (MHA, MLA), Mamba state, the DSA indexer. A side pool's geometry is
#: every one of these it has, with its layout, page size and the byte size of each piece
#: of a page.
_SHAPE_ATTRS = (
    "layer_num", "head_num", "head_dim", "kv_lora_rank", "qk_rope_head_dim", "kv_cache_dim",
    "num_mamba_layers", "temporal_state_shape", "conv_state_shapes", "temporal_dtype", "conv_dtype",
    "indexer_page_stride_size", "indexer_dtype", "dtype",
)

#: Side pools whose pages every TP rank holds for itself, even when the KV pool is
#: replicated (MLA): SGLang backs their pages up on every rank.
PER_RANK_POOLS = frozenset({"mamba"})


def side_pool_geometry(name: str, host_pool: Any, piece_bytes: list[int]) -> dict[str, Any]:
    """What the bytes of a page of side pool ``name`` depend on: its kind (the pool's
    name), layout, tokens per page, the bytes of each piece of a page (in object order)
    and every shape attribute :data:`_SHAPE_ATTRS` the pool has."""
    geometry: dict[str, Any] = {
        "kind": name,
        "layout": getattr(host_pool, "layout", None),
        "page_size": getattr(host_pool, "page_size", None),
        "pieces": [int(n) for n in piece_bytes],
    }
    for attr in _SHAPE_ATTRS:
        value = getattr(host_pool, attr, None)
        if value is not None:
            geometry[attr] = _plain(value)
    return geometry


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data: dtypes and shapes as strings and lists."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Size":
        return [_plain(v) for v in value]
    return str(value).replace("torch.", "")


def side_pool_namespace(storage_config: Any, geometry: Mapping[str, Any], replicated: bool) -> str:
    """The namespace of a side pool's pages (Mamba state, SWA window, DSA indexer, ...):
    ``sglang/<model>/<kind>-<layout>-p<tokens per page>-b<bytes per page>-<digest>/<shard>``,
    where the digest is the first 8 hex digits of the SHA-256 of the whole geometry
    (:func:`side_pool_geometry`). A pool of another kind or geometry never shares a
    namespace, and so never reads another's bytes; the KV pool's namespace
    (:func:`namespace`) has no such segment."""
    g = geometry
    digest = hashlib.sha256(json.dumps(dict(g), sort_keys=True).encode()).hexdigest()[:8]
    pool = segment(f"{g['kind']}-{g['layout']}-p{g['page_size']}-b{sum(g['pieces'])}-{digest}")
    return "/".join(["sglang", _model(storage_config), pool, shard(storage_config, replicated)])


def build_tier_config(extra_config: Mapping[str, Any] | None, ns: str) -> dict:
    """kvtier's tier configuration from SGLang's ``extra_config`` (its own keys removed)
    under namespace ``ns``. Raises ``ValueError`` for a missing store or a key the backend
    derives itself; the library refuses anything else it does not know."""
    _, config = split_flat_config(extra_config or {}, SGLANG_KEYS)
    derived = sorted(_DERIVED_KEYS & config.keys())
    if derived:
        raise ValueError(
            f"extra_config sets {derived}, which kvtier.sglang derives itself (the namespace comes from "
            "the model, layout and TP/PP/CP shard; use 'prefix' to separate deployments)"
        )
    if "store" not in config:
        raise ValueError(
            "extra_config needs a kvtier 'store', e.g. {\"store\": {\"type\": \"s3\", \"bucket\": \"kv\", "
            "\"endpoint_override\": \"http://127.0.0.1:9000\"}} or {\"store\": {\"type\": \"local\", \"path\": \"/var/cache/kv\"}}"
        )
    config["namespace"] = ns
    # SGLang's page keys are SHA-256 hex strings: 32 bytes and kvtier's 4-byte group index
    # (backend.page_key).
    config["key_bytes"] = DEFAULT_KEY_BYTES
    return config
