"""vLLM's namespace for the obj tier, from the offloading spec.

kvtier names objects ``<prefix>/<namespace>/...`` where vLLM's obj tier does, so that
both share a bucket: the namespace is vLLM's ``<model>_<digest>_r<rank>``. With vLLM
installed it is read off vLLM's own FileMapper (and checked against kvtier's computation
of the same field set); without vLLM the field set is rebuilt from ``spec.config`` after
vLLM 0.33's layout.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ..tier import vllm_namespace
from ._shims import HAVE_VLLM

logger = logging.getLogger("kvtier.vllm")

def _blocks_per_chunk(spec: Any) -> int:
    """The chunk size in blocks, which vLLM's obj tier hashes as ``blocks_per_file``."""
    value = getattr(spec, "blocks_per_chunk", None)
    if value is None:
        value = getattr(getattr(getattr(spec, "config", None), "cache", None), "blocks_per_chunk", 1)
    return int(value)


def _vllm_file_mapper(spec: Any) -> Any:
    """vLLM's FileMapper for ``spec``, built exactly as vLLM 0.33's obj tier builds it."""
    mapper_cls = importlib.import_module("vllm.v1.kv_offload.file_mapper").FileMapper
    return mapper_cls.from_offloading_spec(
        "", spec, blocks_per_file=_blocks_per_chunk(spec), parallel_agnostic=True
    )


def namespace_fields(spec: Any) -> tuple[dict, int] | None:
    """vLLM's hashed field set and rank for the obj tier, or None when not derivable.

    With vLLM installed this is what vLLM's own FileMapper hashes (``blocks_per_file`` =
    the spec's ``blocks_per_chunk``, ``parallel_agnostic`` requested, as vLLM 0.33's obj
    tier does); without vLLM the field set is built from ``spec.config`` per vLLM's layout.
    """
    if spec is None:
        return None
    if HAVE_VLLM:
        mapper = _vllm_file_mapper(spec)
        return mapper.get_run_config(), int(mapper.rank)
    return _fields_from_config(spec)


def derive_namespace(spec: Any) -> str | None:
    """vLLM's namespace for the obj tier (``<model>_<digest>_r<rank>``), or None.

    With vLLM installed, the namespace is read off vLLM's own FileMapper and checked
    against kvtier's computation from the same field set (``kvt_vllm_namespace``).
    """
    if spec is None:
        return None
    if not HAVE_VLLM:
        derived = _fields_from_config(spec)
        return None if derived is None else vllm_namespace(*derived)
    mapper = _vllm_file_mapper(spec)
    namespace = vllm_namespace(mapper.get_run_config(), int(mapper.rank))
    theirs = f"{mapper.base_path.rstrip('/').rsplit('/', 1)[-1]}_r{mapper.rank}"
    if theirs != namespace:
        logger.warning("namespace %r differs from vLLM's %r; using vLLM's", namespace, theirs)
        namespace = theirs
    return namespace


def _fields_from_config(spec: Any) -> tuple[dict, int] | None:
    config = getattr(spec, "config", None)
    try:
        model, cache, parallel = config.model, config.cache, config.parallel
        if getattr(config, "canonical_layout", False):
            return None  # the canonical format id needs vLLM itself
        replicated = bool(getattr(config, "replicated_layout", False))
        agnostic = bool(getattr(parallel, "is_parallelism_agnostic", False)) or replicated
        sizes = {
            "tp_size": parallel.tp_size,
            "pp_size": parallel.pp_size,
            "pcp_size": parallel.pcp_size,
            "dcp_size": parallel.dcp_size,
        }
        if agnostic:
            sizes = dict.fromkeys(sizes, 1)
        fields = {
            "model_name": model.name,
            "tokens_per_hash": cache.tokens_per_hash,
            "blocks_per_file": _blocks_per_chunk(spec),
            **sizes,
            "dtype": str(model.dtype),
            "kv_cache_groups": [
                {"tokens_per_block": g.tokens_per_block, "layer_names": list(g.layer_names)} for g in config.groups
            ],
            "inference_engine": "vllm",
        }
        if not agnostic:
            fields["parallel_agnostic"] = False
        if replicated:
            fields["replicated_layout"] = True
        storage_format = getattr(spec, "storage_format", None)
        if storage_format is not None:
            fields["storage_format"] = storage_format
        return fields, 0 if agnostic else int(getattr(parallel, "rank", 0) or 0)
    except AttributeError:
        return None


