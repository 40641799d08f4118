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
    model = segment(getattr(storage_config, "model_name", None) or "model")
    g = geometry
    if g["kind"] == "mha":
        shape = f"h{g['heads']}x{g['head_dim']}"
    else:
        shape = f"r{g['kv_lora_rank']}x{g['rope_dim']}"
    pool = segment(f"{g['kind']}-{g['layout']}-{g['dtype']}-p{g['page_size']}-l{g['layers']}-{shape}")
    tp_rank, tp_size = storage_config.tp_rank, storage_config.tp_size
    shard = [f"tp{tp_size}" if g["kind"] == "mla" else f"tp{tp_rank}of{tp_size}"]
    if storage_config.pp_size > 1:
        shard.append(f"pp{storage_config.pp_rank}of{storage_config.pp_size}")
    if getattr(storage_config, "attn_cp_size", 1) > 1:
        shard.append(f"cp{storage_config.attn_cp_rank}of{storage_config.attn_cp_size}")
    if getattr(storage_config, "dcp_size", 1) > 1:
        shard.append(f"dcp{storage_config.dcp_rank}of{storage_config.dcp_size}")
    return "/".join(["sglang", model, pool, "_".join(shard)])


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
