"""One engine's offloading side, built by vLLM's own code, for tests that drive a tier
through vLLM's real tiering manager.

``Engine`` builds vLLM's ``OffloadingConfig`` (as ``vllm serve`` does from a
``--kv-transfer-config``), ``TieringOffloadingSpec`` and, through ``get_manager()``, the
``TieringOffloadingManager`` with its CPU primary tier and the secondary tiers of the
``secondary_tiers`` entries, created by vLLM's ``SecondaryTierFactory``. The test plays
the GPU worker: it writes a block's bytes into the primary tier's memoryview at the slot
``prepare_store`` gave, and reads promoted bytes from the slot ``prepare_load`` gives.

Needs vLLM (the test tools' venv, scripts/install-tools.sh).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any, Iterable

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

#: Bytes of one GPU block on the (single) worker; a chunk is blocks_per_chunk of them.
BLOCK_BYTES = 4096
#: How long a test waits for the tier before it fails (never reached when all is well).
DEADLINE_S = 30.0


def offloading_config(
    secondary_tiers: list[dict],
    *,
    model: str = "org/test-model",
    blocks_per_chunk: int = 1,
    num_chunks: int = 64,
    events: bool = True,
    engine_id: str | None = None,
    extra: dict | None = None,
    block_bytes: int = BLOCK_BYTES,
    max_model_len: int = 4096,
    groups: tuple[OffloadingGroupConfig, ...] | None = None,
) -> OffloadingConfig:
    """vLLM's OffloadingConfig for one single-GPU engine with a TieringOffloadingSpec (also
    bench/local_compare.py's engines, with blocks of the benchmark's chunk size). ``groups``:
    the model's KV-cache groups (default one full-attention group of 16-token blocks)."""
    chunk_bytes = block_bytes * blocks_per_chunk
    extra_config = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": chunk_bytes * num_chunks,
        "secondary_tiers": secondary_tiers,
        **(extra or {}),
    }
    return OffloadingConfig(
        groups=groups or (OffloadingGroupConfig(16, ("model.layers.0.attn",), 0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=events,
        extra_config=extra_config,
        engine_id=engine_id or f"kvtier-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype="bfloat16", max_model_len=max_model_len),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
        replicated_layout=False,
    )


def kvtier_entry(store, **overrides) -> dict:
    """The README's ``secondary_tiers`` entry for kvtier, on a test's ``store`` (conftest's
    ``Store``); ``overrides`` replace or add keys."""
    return {
        "type": "KvtierTier",
        "module_path": "kvtier.vllm",
        "store_config": dict(store.store_config),
        "prefix": store.prefix,
        "enable_kv_events": True,
        "locality": "REMOTE",
        **overrides,
    }


def content(key: bytes, nbytes: int) -> np.ndarray:
    """A key's own ``nbytes`` bytes: the same for the same key, in every engine."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
    return rng.integers(0, 256, nbytes, dtype=np.uint8)


def kvtier_tier(engine: "Engine") -> Any:
    """The engine's one secondary tier, which must be kvtier's."""
    from kvtier.vllm import KvtierTier

    (tier,) = engine.tiers
    assert isinstance(tier, KvtierTier)
    return tier


class Engine:
    """vLLM's offloading manager of one engine, and the test's hands on its CPU pool."""

    def __init__(self, secondary_tiers: list[dict], **config: Any) -> None:
        self.config = offloading_config(secondary_tiers, **config)
        self.spec = TieringOffloadingSpec(self.config)
        self.manager = self.spec.get_manager()
        self.view = self.manager.primary_tier.get_kv_memoryview()
        # (num_chunks, chunk_bytes) bytes over the same memory as the view
        self.pool = np.asarray(self.view).view(np.uint8)
        self.tiers = list(self.manager.secondary_tiers)
        self.events: list = []
        self._known_requests: set[str] = set()
        self._closed = False

    # -- the scheduler's calls -------------------------------------------------------

    def ctx(self, req_id: str) -> ReqContext:
        context = ReqContext(req_id=req_id)
        if req_id not in self._known_requests:
            self._known_requests.add(req_id)
            self.manager.on_new_request(context)
        return context

    def step(self) -> None:
        """The end of one scheduler step: flushes promotions and lookups, polls the tiers."""
        self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
        self.events.extend(self.manager.take_events())

    def store(self, req_id: str, blocks: dict[bytes, np.ndarray]) -> list[bytes]:
        """GPU -> CPU store of ``blocks`` (key -> bytes); the manager cascades them to the
        secondary tiers. Returns the keys the primary tier accepted."""
        context = self.ctx(req_id)
        keys = list(blocks)
        out = self.manager.prepare_store(keys, context)
        assert out is not None, "the primary tier refused the store"
        stored = list(out.keys_to_store)
        for key, slot in zip(stored, out.store_spec.chunk_ids):
            self.pool[slot] = blocks[key]
        self.manager.complete_store(stored, context, success=True)
        return stored

    def finish(self, req_id: str) -> None:
        self.manager.on_request_finished(self.ctx(req_id))
        self._known_requests.discard(req_id)

    def lookup(self, key: bytes, req_id: str) -> LookupResult:
        return self.manager.lookup(key, self.ctx(req_id))

    def resolve(self, key: bytes, req_id: str) -> LookupResult:
        """Asks as the scheduler does, once per step, until the answer is not RETRY."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            verdict = self.lookup(key, req_id)
            if verdict is not LookupResult.RETRY:
                return verdict
            assert time.monotonic() < deadline, f"lookup of {key.hex()} never resolved"
            self.step()

    def until(self, condition, what: str) -> None:
        """Steps until ``condition()`` holds."""
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert time.monotonic() < deadline, f"never: {what}"
            self.step()

    def settle(self) -> None:
        """Steps until no tier has work in flight and the manager tracks no transfer."""
        self.until(
            lambda: not any(t.has_pending_work() for t in self.tiers) and not self.manager._transfer_jobs,
            "the tiers settled",
        )
        self.step()

    def promote(self, keys: Iterable[bytes], req_id: str) -> dict[bytes, LookupResult]:
        """Looks ``keys`` up until each is HIT or MISS, stepping while promotions run."""
        keys = list(keys)
        verdicts: dict[bytes, LookupResult] = {}
        deadline = time.monotonic() + DEADLINE_S
        while len(verdicts) < len(keys):
            for key in keys:
                if key not in verdicts:
                    verdict = self.lookup(key, req_id)
                    if verdict in (LookupResult.HIT, LookupResult.MISS):
                        verdicts[key] = verdict
            assert time.monotonic() < deadline, "promotions never finished"
            self.step()
        return verdicts

    def read(self, keys: list[bytes], req_id: str) -> list[np.ndarray]:
        """CPU -> GPU load of ``keys`` (all must be primary HITs): a copy of each block."""
        context = self.ctx(req_id)
        spec = self.manager.prepare_load(keys, context)
        rows = [self.pool[slot].copy() for slot in spec.chunk_ids]
        self.manager.complete_load(keys, context)
        return rows

    def evict_all(self) -> None:
        """Empties the primary tier (vLLM's reset_cache): later lookups go to the tiers."""
        self.manager.reset_cache()
        self.manager.on_reset_flushed()
        self.step()

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.manager.shutdown()
