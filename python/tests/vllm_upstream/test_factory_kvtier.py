# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vLLM 0.33.0's SecondaryTierFactory tests, adapted to kvtier's tier.

Adapted from vLLM 0.33.0 ``tests/v1/kv_offload/tiering/test_factory.py``. vLLM's
factory finds and constructs ``kvtier.vllm.KvtierTier`` (by ``module_path``, or
registered under a short name), on a real store, with a real offloading spec and a real
primary view instead of MagicMocks; every tier the factory builds stores a block (read
back from the store) and loads it into another row of the primary view.

Changes from vLLM's tests:

* ``test_pre_registered_tiers_can_be_imported`` / ``test_example_tier_registered``
  iterate over vLLM's own registry (which includes the NIXL-backed ``obj`` and the
  optional ``kvcr`` tiers); here they check kvtier's class the same way: it imports,
  is a ``SecondaryTierManager``, and is attributed as a ``DISK`` hit source.
* The example tier accepts any keyword (``custom_param``); kvtier's tier refuses an
  unknown keyword with a ``TypeError``, as vLLM's obj tier does, so the adapted tests
  pass kvtier's keywords and check that refusal.

Nothing of the file is left out.
"""

import numpy as np
import pytest
import torch
from types import SimpleNamespace
from upstream_support import ENGINE_ID, Store, drain, lookup_and_wait, row_bytes

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvtier
from kvtier.vllm import KvtierTier, ObjectStoreTier

# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def restore_registry():
    """Save and restore SecondaryTierFactory._registry between tests."""
    original = dict(SecondaryTierFactory._registry)
    yield
    SecondaryTierFactory._registry = original


_OFFLOADING_SPEC = SimpleNamespace(
    config=OffloadingConfig(
        groups=(),
        worker_kv_bytes_per_block=0,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id=ENGINE_ID,
        model=OffloadingModelConfig(name="test/model", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
        replicated_layout=False,
    ),
    blocks_per_chunk=1,
)
_CTX = ReqContext(req_id="factory")


def _make_args():
    """A real primary view (random rows) and offloading spec for create_secondary_tier."""
    primary_kv_view = memoryview(torch.rand((4, 256), dtype=torch.float32).numpy())
    return primary_kv_view, _OFFLOADING_SPEC


def _kvtier_entry(store, **extra) -> dict:
    """kvtier's keywords of a secondary_tiers entry, for ``store``."""
    return {"store_config": dict(store.store_config), "prefix": store.prefix, **extra}


def _job(job_id, keys, chunk_ids, is_promotion=False):
    return TransferJob(job_id=job_id, keys=keys, chunk_ids=np.array(chunk_ids, dtype=np.int32),
                       is_promotion=is_promotion, req_context=_CTX)


def _assert_roundtrip(tier, store, n: int = 1):
    """The tier stores row 0 under a fresh key (the object holds the row's bytes),
    finds it, and loads it into row 3."""
    created = _assert_roundtrip.counter = getattr(_assert_roundtrip, "counter", 0) + 1
    k = make_offload_key(f"factory-{created}-{n}".encode(), 0)
    view = tier._primary_kv_view
    tier.submit_store(_job(1, [k], [0]))
    assert all(r.success for r in drain(tier))
    assert store.read(tier.namespace, k) == row_bytes(view, 0)
    assert lookup_and_wait(tier, [k], ReqContext(req_id=f"rt-{created}")) == [LookupResult.HIT]
    tier.submit_load(_job(2, [k], [3], is_promotion=True))
    assert all(r.success for r in drain(tier))
    assert row_bytes(view, 3) == row_bytes(view, 0)
    return k


# ---------------------------------------------------------------------------
# Pre-registration integrity (CI sentinel)
# ---------------------------------------------------------------------------


def test_pre_registered_tiers_can_be_imported(local_store, tiers):
    """CI sentinel: kvtier's tier class imports through the factory and yields a
    SecondaryTierManager attributed by its medium (STORAGE -> DISK)."""
    cls = SecondaryTierFactory.get_tier_class({"type": "KvtierTier", "module_path": "kvtier.vllm"})
    assert issubclass(cls, SecondaryTierManager)
    assert cls.cache_hit_source == CacheHitSource.DISK
    primary_kv_view, offloading_spec = _make_args()
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "KvtierTier", "module_path": "kvtier.vllm", **_kvtier_entry(local_store)},
        primary_kv_view, offloading_spec,
    )
    tiers.append(tier)
    _assert_roundtrip(tier, local_store)


def test_example_tier_registered(local_store, tiers):
    """kvtier's class is found by module_path, under either of its names, without
    entering the registry."""
    cls = SecondaryTierFactory.get_tier_class({"type": "KvtierTier", "module_path": "kvtier.vllm"})
    assert cls is KvtierTier
    assert SecondaryTierFactory.get_tier_class({"type": "ObjectStoreTier", "module_path": "kvtier.vllm"}) is cls
    assert cls is ObjectStoreTier
    assert "KvtierTier" not in SecondaryTierFactory._registry
    primary_kv_view, offloading_spec = _make_args()
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "ObjectStoreTier", "module_path": "kvtier.vllm", **_kvtier_entry(local_store)},
        primary_kv_view, offloading_spec,
    )
    tiers.append(tier)
    assert tier.tier_type == "ObjectStoreTier"
    _assert_roundtrip(tier, local_store)


# ---------------------------------------------------------------------------
# Normal path — create_secondary_tier
# ---------------------------------------------------------------------------


def test_create_tier_from_registry(local_store, tiers):
    """A registered tier_type creates a kvtier instance with that tier_type."""
    SecondaryTierFactory.register_tier("kvtier", "kvtier.vllm", "KvtierTier")
    primary_kv_view, offloading_spec = _make_args()
    tier_config = {"type": "kvtier", **_kvtier_entry(local_store)}

    tier = SecondaryTierFactory.create_secondary_tier(tier_config, primary_kv_view, offloading_spec)
    tiers.append(tier)

    assert isinstance(tier, SecondaryTierManager)
    assert isinstance(tier, KvtierTier)
    assert tier.tier_type == "kvtier"
    _assert_roundtrip(tier, local_store)


def test_create_multiple_tiers(local_store, tiers):
    """Multiple tier configs create independent kvtier tiers with correct tier_types:
    each stores under its own prefix and does not see the other's blocks."""
    primary_kv_view, offloading_spec = _make_args()
    configs = [
        {"type": "KvtierTier", "module_path": "kvtier.vllm", "store_config": dict(local_store.store_config),
         "prefix": f"{local_store.prefix}-{i}"}
        for i in (1, 2)
    ]

    made = [
        SecondaryTierFactory.create_secondary_tier(cfg.copy(), primary_kv_view, offloading_spec)
        for cfg in configs
    ]
    tiers.extend(made)

    assert len(made) == 2
    assert all(tier.tier_type == "KvtierTier" for tier in made)
    assert all(isinstance(tier, KvtierTier) for tier in made)
    keys = []
    for i, (tier, cfg) in enumerate(zip(made, configs)):
        own = Store(local_store.id, local_store.store_config, cfg["prefix"], root=local_store.root)
        keys.append(_assert_roundtrip(tier, own, n=i))
    assert local_store.names() == []  # nothing outside the two prefixes
    assert lookup_and_wait(made[0], [keys[1]], ReqContext(req_id="cross-0")) == [LookupResult.MISS]
    assert lookup_and_wait(made[1], [keys[0]], ReqContext(req_id="cross-1")) == [LookupResult.MISS]


@pytest.mark.parametrize("tier_type", ["custom_tier", "cpu", "nvme"])
def test_register_new_tier_type(tier_type, local_store, tiers):
    """kvtier's class registered under a new tier type is created by it (this is how
    external projects add custom secondary tiers)."""
    SecondaryTierFactory.register_tier(tier_type, "kvtier.vllm", "KvtierTier")

    primary_kv_view, offloading_spec = _make_args()
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": tier_type, **_kvtier_entry(local_store)},
        primary_kv_view,
        offloading_spec,
    )
    tiers.append(tier)

    assert tier.tier_type == tier_type
    assert isinstance(tier, KvtierTier)
    # Attribution follows the tier's medium, never its registration name.
    assert tier.cache_hit_source is CacheHitSource.DISK
    _assert_roundtrip(tier, local_store)

    # Unlike the example tier, kvtier refuses keywords it does not know.
    with pytest.raises(TypeError, match="custom_param"):
        SecondaryTierFactory.create_secondary_tier(
            {"type": tier_type, "custom_param": 99, **_kvtier_entry(local_store)},
            primary_kv_view,
            offloading_spec,
        )


# ---------------------------------------------------------------------------
# Error paths
# ---------------------------------------------------------------------------


def test_missing_tier_type_raises(local_store):
    """tier_config without 'type' → ValueError; nothing reaches the store."""
    primary_kv_view, offloading_spec = _make_args()
    tier_config = {"module_path": "kvtier.vllm", **_kvtier_entry(local_store)}

    with pytest.raises(ValueError, match="must include 'type'"):
        SecondaryTierFactory.create_secondary_tier(tier_config, primary_kv_view, offloading_spec)
    assert local_store.names() == []


def test_unknown_tier_type_raises(local_store):
    """kvtier's class name without module_path → ValueError."""
    primary_kv_view, offloading_spec = _make_args()
    tier_config = {"type": "KvtierTier", **_kvtier_entry(local_store)}

    with pytest.raises(
        ValueError,
        match=r"Unknown secondary tier type.*also set 'module_path'",
    ):
        SecondaryTierFactory.create_secondary_tier(tier_config, primary_kv_view, offloading_spec)
    assert local_store.names() == []


def test_duplicate_registration_raises():
    """register_tier with an existing type → ValueError (also for kvtier's class)."""
    SecondaryTierFactory.register_tier("kvtier", "kvtier.vllm", "KvtierTier")
    with pytest.raises(ValueError, match="is already registered"):
        SecondaryTierFactory.register_tier("kvtier", "kvtier.vllm", "KvtierTier")
    with pytest.raises(ValueError, match="is already registered"):
        SecondaryTierFactory.register_tier("obj", "kvtier.vllm", "KvtierTier")
    assert SecondaryTierFactory.get_tier_class({"type": "kvtier"}) is KvtierTier


# ---------------------------------------------------------------------------
# Out-of-tree dynamic loading via module_path
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backpressure", [False, True], ids=["plain", "backpressure"])
def test_create_tier_from_module_path(kv_store, tiers, backpressure):
    """Full end-to-end: create_secondary_tier with module_path and the README's
    entry (store_config, prefix, enable_kv_events, locality; once with a
    backpressure block)."""
    assert "KvtierTier" not in SecondaryTierFactory._registry

    primary_kv_view, offloading_spec = _make_args()
    tier_config = {
        "type": "KvtierTier",
        "module_path": "kvtier.vllm",
        **_kvtier_entry(kv_store),
        "enable_kv_events": True,
        "locality": "REMOTE",
    }
    if backpressure:
        tier_config["backpressure"] = {"backpressure_cls": "EMABackpressureDetector"}

    tier = SecondaryTierFactory.create_secondary_tier(tier_config, primary_kv_view, offloading_spec)
    tiers.append(tier)

    assert isinstance(tier, KvtierTier)
    assert tier.tier_type == "KvtierTier"
    assert (tier.bp_detector is not None) == backpressure
    assert tier.locality is not None and tier.locality.name == "REMOTE"
    _assert_roundtrip(tier, kv_store)


def test_module_path_invalid_module_raises(local_store):
    """Non-existent module_path → ModuleNotFoundError."""
    primary_kv_view, offloading_spec = _make_args()
    tier_config = {
        "type": "KvtierTier",
        "module_path": "kvtier.vllm_missing",
        **_kvtier_entry(local_store),
    }

    with pytest.raises(ModuleNotFoundError):
        SecondaryTierFactory.create_secondary_tier(tier_config, primary_kv_view, offloading_spec)
    assert local_store.names() == []


def test_module_path_not_subclass_raises():
    """module_path resolving to a non-SecondaryTierManager (kvtier's plain binding
    class) → AssertionError."""
    assert isinstance(kvtier.Tier, type)
    tier_config = {
        "type": "Tier",
        "module_path": "kvtier",
    }

    with pytest.raises(AssertionError):
        SecondaryTierFactory.get_tier_class(tier_config)
