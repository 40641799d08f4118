"""vLLM namespaces: kvtier.vllm_namespace against an independent Python computation,
and the namespace the vLLM tier derives from an offloading spec (checklist 1-4)."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import numpy as np
import pytest

import kvtier
from kvtier import vllm as kv_vllm

from conftest import make_key


def expected_namespace(fields: dict, rank: int) -> str:
    """vLLM's FileMapper, re-derived: sorted compact JSON, SHA-256, first 12 hex."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]
    return f"{fields['model_name'].replace('/', '_')}_{digest}_r{rank}"


def base_fields(**overrides) -> dict:
    fields = {
        "model_name": "meta-llama/Llama-3.1-8B-Instruct",
        "tokens_per_hash": 16,
        "blocks_per_file": 1,
        "tp_size": 1,
        "pp_size": 1,
        "pcp_size": 1,
        "dcp_size": 1,
        "dtype": "torch.bfloat16",
        "kv_cache_groups": [
            {"tokens_per_block": 16, "layer_names": [f"model.layers.{i}.self_attn.attn" for i in range(4)]}
        ],
        "inference_engine": "vllm",
    }
    fields.update(overrides)
    return fields


VECTORS = [
    pytest.param(base_fields(), 0, id="agnostic-single-group"),
    pytest.param(base_fields(tp_size=4, parallel_agnostic=False), 3, id="tp4-not-agnostic-rank3"),
    pytest.param(base_fields(replicated_layout=True, model_name="deepseek-ai/DeepSeek-V3"), 0, id="replicated-mla"),
    pytest.param(base_fields(model_name="org/módèl-日本語", dtype="float16"), 0, id="non-ascii-model"),
    pytest.param(
        base_fields(
            kv_cache_groups=[
                {"tokens_per_block": 16, "layer_names": ["full.0", "full.1"]},
                {"tokens_per_block": 32, "layer_names": ["sliding.0", 'naïve"quote\\', "emoji-😀"]},
            ],
            parallel_agnostic=False,
            pp_size=2,
        ),
        1,
        id="two-groups-escapes",
    ),
    pytest.param(base_fields(canonical_format="canon-v1", storage_format="raw", blocks_per_file=4), 0, id="formats"),
    pytest.param(base_fields(model_name="/models/local/llama", kv_cache_groups=[]), 7, id="path-model-no-groups"),
]


@pytest.mark.parametrize("fields,rank", VECTORS)
def test_namespace_matches_independent_computation(fields, rank):
    assert kvtier.vllm_namespace(fields, rank) == expected_namespace(fields, rank)


def test_key_order_does_not_matter():
    fields = base_fields(parallel_agnostic=False)
    reordered = dict(reversed(list(fields.items())))
    assert kvtier.vllm_namespace(reordered, 0) == kvtier.vllm_namespace(fields, 0)


def test_presence_of_optional_fields_changes_the_digest():
    plain = kvtier.vllm_namespace(base_fields(), 0)
    assert kvtier.vllm_namespace(base_fields(parallel_agnostic=False), 0) != plain
    assert kvtier.vllm_namespace(base_fields(replicated_layout=True), 0) != plain


def test_long_namespace_and_bad_field_sets():
    long_name = "x" * 600 + "/y"
    fields = base_fields(model_name=long_name)
    assert kvtier.vllm_namespace(fields, 0) == expected_namespace(fields, 0)
    with pytest.raises(kvtier.InvalidArgumentError, match="model_name"):
        kvtier.vllm_namespace({"tp_size": 1}, 0)
    with pytest.raises(ValueError):
        kvtier.vllm_namespace(base_fields(), -1)


# -- the namespace the vLLM tier derives ------------------------------------------------


def fake_spec(
    model="Qwen/Qwen3-0.6B",
    tp=1,
    agnostic=True,
    replicated=False,
    rank=0,
    events=None,
    groups=(("model.layers.0.attn", "model.layers.1.attn"),),
):
    """The attributes of vLLM's OffloadingSpec that the obj tier's FileMapper reads."""
    config = SimpleNamespace(
        model=SimpleNamespace(name=model, dtype="torch.float16"),
        cache=SimpleNamespace(tokens_per_hash=16),
        parallel=SimpleNamespace(
            tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1, rank=rank, is_parallelism_agnostic=agnostic
        ),
        groups=[SimpleNamespace(tokens_per_block=16, layer_names=list(g)) for g in groups],
        canonical_layout=False,
        replicated_layout=replicated,
    )
    spec = SimpleNamespace(config=config, storage_format=None)
    if events is not None:
        spec.kv_events_config = SimpleNamespace(enable_kv_cache_events=events)
    return spec


def spec_fields(model, tp, agnostic, replicated):
    fields = {
        "model_name": model,
        "tokens_per_hash": 16,
        "blocks_per_file": 1,
        "tp_size": 1 if (agnostic or replicated) else tp,
        "pp_size": 1,
        "pcp_size": 1,
        "dcp_size": 1,
        "dtype": "torch.float16",
        "kv_cache_groups": [{"tokens_per_block": 16, "layer_names": ["model.layers.0.attn", "model.layers.1.attn"]}],
        "inference_engine": "vllm",
    }
    if not (agnostic or replicated):
        fields["parallel_agnostic"] = False
    if replicated:
        fields["replicated_layout"] = True
    return fields


@pytest.mark.skipif(kv_vllm.HAVE_VLLM, reason="with vLLM installed its own FileMapper reads the spec")
@pytest.mark.parametrize(
    "tp,agnostic,replicated,rank,expected_rank",
    [(1, True, False, 0, 0), (2, False, False, 1, 1), (4, False, True, 3, 0)],
)
def test_tier_derives_vllms_namespace_from_the_spec(tmp_path, tp, agnostic, replicated, rank, expected_rank):
    spec = fake_spec(tp=tp, agnostic=agnostic, replicated=replicated, rank=rank)
    expected = expected_namespace(spec_fields("Qwen/Qwen3-0.6B", tp, agnostic, replicated), expected_rank)
    pool = np.zeros((4, 128), np.uint8)
    tier = kv_vllm.KvtierTier(spec, pool, "kvtier", store_config={"type": "local", "path": str(tmp_path)}, prefix="kv")
    try:
        assert tier.namespace == expected
    finally:
        tier.shutdown()


def test_explicit_namespace_wins_and_underivable_spec_is_an_error(tmp_path):
    cfg = {"type": "local", "path": str(tmp_path)}
    pool = np.zeros((4, 128), np.uint8)
    tier = kv_vllm.KvtierTier(fake_spec(), pool, "kvtier", store_config=cfg, namespace="mine")
    assert tier.namespace == "mine"
    tier.shutdown()
    if not kv_vllm.HAVE_VLLM:
        with pytest.raises(ValueError, match="namespace"):
            kv_vllm.KvtierTier(SimpleNamespace(), pool, "kvtier", store_config=cfg)


@pytest.mark.skipif(kv_vllm.HAVE_VLLM, reason="uses the fallback field set")
def test_objects_get_vllms_effective_key(tmp_path):
    """Checklist 3-4: `<prefix>/<model>_<digest>_r<rank>/<h[0:3]>/<h[3:5]>_g<group>/<h>.bin`,
    single slashes, no leading slash; without a prefix the namespace comes first."""
    spec = fake_spec()
    namespace = expected_namespace(spec_fields("Qwen/Qwen3-0.6B", 1, True, False), 0)
    for prefix, root in (("team/kv", tmp_path / "a"), ("", tmp_path / "b")):
        pool = np.arange(4 * 128, dtype=np.uint32).astype(np.uint8).reshape(4, 128)
        tier = kv_vllm.KvtierTier(
            spec, pool, "kvtier", store_config={"type": "local", "path": str(root)}, prefix=prefix
        )
        key = make_key(42, group=3)
        job = SimpleNamespace(job_id=0, keys=[key], chunk_ids=np.array([2], np.int32))
        tier.submit_store(job)
        tier.drain_jobs()
        (result,) = tier.get_finished_jobs()
        assert result.success
        tier.shutdown()
        h = key[:-4].hex()
        relative = "/".join(p for p in (prefix, namespace, h[:3], f"{h[3:5]}_g3", f"{h}.bin") if p)
        obj = root / relative
        assert obj.is_file(), sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        assert obj.read_bytes() == pool[2].tobytes()
        assert not relative.startswith("/") and "//" not in relative
