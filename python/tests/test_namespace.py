"""vLLM namespaces: kvtier.vllm_namespace against an independent Python computation,
and the namespace the vLLM tier derives from an offloading spec (checklist 1-4).

Where vLLM is installed (every suite), kvtier.vllm reads the namespace off vLLM's own
FileMapper; without vLLM it rebuilds vLLM's field set from the spec. That fallback is
tested in a fresh interpreter in which vLLM cannot be imported (:func:`without_vllm`),
against the vectors of ``tests/vectors/namespace.json``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import kvtier
from kvtier import vllm as kv_vllm

from key_layout import object_name
from support import make_key

HERE = Path(__file__).resolve().parent
#: The namespace vectors the Rust tests check too.
NAMESPACE_VECTORS = HERE.parents[1] / "tests" / "vectors" / "namespace.json"


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
    groups=((16, ("model.layers.0.attn", "model.layers.1.attn")),),
    dtype="torch.float16",
    tokens_per_hash=16,
    blocks_per_chunk=1,
):
    """The attributes of vLLM's OffloadingSpec that the obj tier's FileMapper reads;
    ``groups`` are (tokens_per_block, layer names) of each KV-cache group."""
    config = SimpleNamespace(
        model=SimpleNamespace(name=model, dtype=dtype),
        cache=SimpleNamespace(tokens_per_hash=tokens_per_hash, blocks_per_chunk=blocks_per_chunk),
        parallel=SimpleNamespace(
            tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1, rank=rank, is_parallelism_agnostic=agnostic
        ),
        groups=[SimpleNamespace(tokens_per_block=size, layer_names=list(names)) for size, names in groups],
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


def without_vllm(function: str, *args):
    """``function(*args)``, a function of this module, run in a fresh interpreter in which
    every ``import vllm...`` fails (``sys.modules["vllm"] = None``), so that kvtier.vllm
    takes its fallbacks; returns what it returned (through JSON). Fails when the call
    raised, or when kvtier.vllm still found vLLM there."""
    code = "\n".join(
        [
            "import json, sys",
            "sys.modules['vllm'] = None  # `import vllm` and `import vllm.<anything>` raise ImportError",
            "sys.path[:0] = json.loads(sys.argv[1])",
            "import test_namespace",
            "from kvtier import vllm as kv_vllm",
            f"result = test_namespace.{function}(*json.loads(sys.argv[2]))",
            "print(json.dumps({'have_vllm': kv_vllm.HAVE_VLLM, 'result': result}))",
        ]
    )
    # The same kvtier as this process's (a checkout, or the installed wheel), and this directory.
    path = [str(Path(kvtier.__file__).resolve().parents[1]), str(HERE)]
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(path), json.dumps(args)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{function} failed without vLLM:\n{proc.stderr[-4000:]}"
    answer = json.loads(proc.stdout.splitlines()[-1])
    assert answer["have_vllm"] is False, "vLLM was importable in the interpreter meant to be without it"
    return answer["result"]


# Run by without_vllm, in the interpreter without vLLM.


def _derived(spec_args: list) -> list:
    """``(namespace, fields, rank)`` that kvtier.vllm derives from each fake spec."""
    out = []
    for args in spec_args:
        spec = fake_spec(**args)
        fields, rank = kv_vllm.namespace_fields(spec)
        out.append((kv_vllm.derive_namespace(spec), fields, rank))
    return out


def _tier_namespace(root: str, spec_args: dict) -> str:
    pool = np.zeros((4, 128), np.uint8)
    tier = kv_vllm.KvtierTier(
        fake_spec(**spec_args), pool, "kvtier", store_config={"type": "local", "path": root}, prefix="kv"
    )
    try:
        return tier.namespace
    finally:
        tier.shutdown()


def _underivable_spec_error(root: str) -> str | None:
    """The ValueError's message for a spec without vLLM's fields and no namespace, or None."""
    pool = np.zeros((4, 128), np.uint8)
    try:
        tier = kv_vllm.KvtierTier(SimpleNamespace(), pool, "kvtier", store_config={"type": "local", "path": root})
    except ValueError as exc:
        return str(exc)
    tier.shutdown()
    return None


def effective_key_pool() -> np.ndarray:
    return np.arange(4 * 128, dtype=np.uint32).astype(np.uint8).reshape(4, 128)


def _store_from_slot_2(root: str, prefix: str, key_hex: str) -> dict:
    """Stores slot 2 of :func:`effective_key_pool` under the key, from a tier on the
    default spec without a namespace: its result and the namespace it derived."""
    tier = kv_vllm.KvtierTier(
        fake_spec(), effective_key_pool(), "kvtier", store_config={"type": "local", "path": root}, prefix=prefix
    )
    try:
        job = SimpleNamespace(job_id=0, keys=[bytes.fromhex(key_hex)], chunk_ids=np.array([2], np.int32))
        tier.submit_store(job)
        tier.drain_jobs()
        (result,) = tier.get_finished_jobs()
        return {"success": result.success, "namespace": tier.namespace}
    finally:
        tier.shutdown()


# The tests.


def vector_spec(fields: dict, rank: int) -> dict | None:
    """:func:`fake_spec`'s arguments for a spec whose vLLM field set and rank are
    ``fields`` and ``rank``, or None where they are not a field set vLLM builds (a vector
    with a field of its own, such as a ``note``). An agnostic or replicated spec gets a
    TP size and rank that the derivation must drop."""
    own = {"parallel_agnostic", "replicated_layout"}
    if set(fields) - own != {
        "model_name", "tokens_per_hash", "blocks_per_file", "tp_size", "pp_size", "pcp_size", "dcp_size",
        "dtype", "kv_cache_groups", "inference_engine",
    }:
        return None
    if (fields["pp_size"], fields["pcp_size"], fields["dcp_size"]) != (1, 1, 1):
        return None
    replicated = fields.get("replicated_layout", False)
    agnostic = "parallel_agnostic" not in fields
    args = {
        "model": fields["model_name"],
        "dtype": fields["dtype"],
        "tokens_per_hash": fields["tokens_per_hash"],
        "blocks_per_chunk": fields["blocks_per_file"],
        "groups": [(g["tokens_per_block"], g["layer_names"]) for g in fields["kv_cache_groups"]],
        "replicated": replicated,
        "agnostic": agnostic and not replicated,
    }
    if agnostic:
        args.update(tp=4, rank=3)
    else:
        args.update(tp=fields["tp_size"], rank=rank)
    return args


def test_without_vllm_the_fallback_derives_the_vector_namespaces():
    vectors = json.loads(NAMESPACE_VECTORS.read_text())["vectors"]
    usable = [(vector_spec(v["fields"], v["rank"]), v) for v in vectors]
    usable = [(args, v) for args, v in usable if args is not None]
    # Agnostic and not: a change of the vector file must not leave this test without cases.
    assert {"parallel_agnostic" in v["fields"] for _, v in usable} == {True, False}, [v["namespace"] for v in vectors]
    derived = without_vllm("_derived", [args for args, _ in usable])
    assert len(derived) == len(usable)
    for (_, vector), (namespace, fields, rank) in zip(usable, derived):
        assert (fields, rank) == (vector["fields"], vector["rank"])
        assert namespace == vector["namespace"]


@pytest.mark.parametrize(
    "tp,agnostic,replicated,rank,expected_rank",
    [(1, True, False, 0, 0), (2, False, False, 1, 1), (4, False, True, 3, 0)],
)
def test_without_vllm_the_tier_derives_vllms_namespace_from_the_spec(
    tmp_path, tp, agnostic, replicated, rank, expected_rank
):
    expected = expected_namespace(spec_fields("Qwen/Qwen3-0.6B", tp, agnostic, replicated), expected_rank)
    spec = {"tp": tp, "agnostic": agnostic, "replicated": replicated, "rank": rank}
    assert without_vllm("_tier_namespace", str(tmp_path), spec) == expected


def test_explicit_namespace_wins_and_underivable_spec_is_an_error(tmp_path):
    cfg = {"type": "local", "path": str(tmp_path)}
    pool = np.zeros((4, 128), np.uint8)
    tier = kv_vllm.KvtierTier(fake_spec(), pool, "kvtier", store_config=cfg, namespace="mine")
    assert tier.namespace == "mine"
    tier.shutdown()
    message = without_vllm("_underivable_spec_error", str(tmp_path))
    assert message is not None and "namespace" in message


def test_without_vllm_objects_get_vllms_effective_key(tmp_path):
    """Checklist 3-4: `<prefix>/<model>_<digest>_r<rank>/<h[0:3]>/<h[3:5]>_g<group>/<h>.bin`,
    single slashes, no leading slash; without a prefix the namespace comes first."""
    namespace = expected_namespace(spec_fields("Qwen/Qwen3-0.6B", 1, True, False), 0)
    key = make_key(42, group=3)
    for prefix, root in (("team/kv", tmp_path / "a"), ("", tmp_path / "b")):
        stored = without_vllm("_store_from_slot_2", str(root), prefix, key.hex())
        assert stored == {"success": True, "namespace": namespace}
        relative = object_name(prefix, namespace, key)
        obj = root / relative
        assert obj.is_file(), sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        assert obj.read_bytes() == effective_key_pool()[2].tobytes()
        assert not relative.startswith("/") and "//" not in relative
