"""Fixtures shared by the binding and the vLLM contract tests.

Stores: every store-parametrized test runs against the local-directory store, and also
against s3s-fs and moto_server started by the tests when ``KVTIER_TEST_S3_SERVERS=1``
(scripts/test-python.sh sets it), or against each S3 store listed in
``KVTIER_TEST_S3_CONFIGS``, a JSON list of vLLM
``store_config`` dicts (e.g. ``[{"bucket": "kv", "endpoint_override": "127.0.0.1:9000",
"access_key": "...", "secret_key": "...", "_id": "minio"}]``; ``_id`` names the
parameter). Each test gets its own object prefix, so tests never see each other's
objects.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

try:
    import kvtier  # installed, or on PYTHONPATH
except ImportError:  # running from a checkout without PYTHONPATH=python
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import kvtier

np = pytest.importorskip("numpy")

from key_layout import object_name  # noqa: E402


def pytest_report_header(config):
    try:
        lib = kvtier.library_path()
    except OSError as exc:
        lib = f"unavailable ({exc})"
    from kvtier import vllm as kv_vllm

    stores = ["local"] + [p.id for p in _s3_params()]
    return [
        f"kvtier package: {Path(kvtier.__file__).parent}",
        f"libkvtier: {lib}",
        f"vLLM types: {'vllm' if kv_vllm.HAVE_VLLM else 'stand-ins'}; stores: {', '.join(stores)}",
    ]


# -- stores ---------------------------------------------------------------------------


@dataclass
class Store:
    kind: str  # "local" or "s3"
    store_config: dict
    prefix: str
    root: Path | None = None  # local store directory
    extra: dict = field(default_factory=dict)

    def local_object(self, namespace: str, key: bytes) -> Path:
        """Path of a key's object in the local store (the effective object name)."""
        assert self.root is not None
        return self.root / object_name(self.prefix, namespace, key)


def _s3_params():
    if os.environ.get("KVTIER_TEST_S3_SERVERS") == "1":
        # The project's own servers (s3s-fs and moto), started for this session.
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import s3_servers

        configs = s3_servers.start_all()
    else:
        raw = os.environ.get("KVTIER_TEST_S3_CONFIGS")
        if not raw:
            return []
        configs = json.loads(raw)
    if not isinstance(configs, list):
        raise pytest.UsageError("KVTIER_TEST_S3_CONFIGS must be a JSON list of store_config objects")
    params = []
    for i, cfg in enumerate(configs):
        cfg = dict(cfg)
        name = cfg.pop("_id", None) or f"s3-{i}"
        params.append(pytest.param(("s3", cfg), id=name))
    return params


@pytest.fixture(params=[pytest.param(("local", None), id="local")] + _s3_params())
def store(request, tmp_path) -> Store:
    kind, cfg = request.param
    prefix = f"kvt-test-{uuid.uuid4().hex[:12]}"
    if kind == "local":
        root = tmp_path / "store"
        return Store("local", {"type": "local", "path": str(root)}, prefix, root=root)
    return Store("s3", cfg, prefix)


@pytest.fixture
def local_only(store):
    if store.kind != "local":
        pytest.skip("needs direct access to the objects (local store only)")
    return store


# -- keys and tiers ---------------------------------------------------------------------


def make_key(i, group: int = 0, salt: str = "") -> bytes:
    """A vLLM OffloadKey: 32-byte SHA-256 block hash + 4-byte big-endian group index."""
    return hashlib.sha256(f"{salt}block-{i}".encode()).digest() + group.to_bytes(4, "big")


def pattern(i, row_bytes: int) -> np.ndarray:
    """Distinct, non-trivial content for block ``i``."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(repr(i).encode()).digest()[:8], "big"))
    return rng.integers(0, 256, row_bytes, dtype=np.uint8)


@pytest.fixture
def make_tier(store):
    """Factory for KvtierTier instances over ``store``; all are shut down at teardown."""
    from kvtier.vllm import KvtierTier

    created = []

    def make(num_slots: int = 16, row_bytes: int = 512, pool=None, spec=None, **kwargs):
        if pool is None:
            pool = np.zeros((num_slots, row_bytes), dtype=np.uint8)
        kwargs.setdefault("prefix", store.prefix)
        kwargs.setdefault("store_config", dict(store.store_config))
        if spec is None:
            kwargs.setdefault("namespace", "ns")
        tier = KvtierTier(spec, pool, "kvtier", **kwargs)
        created.append(tier)
        return tier, pool

    yield make
    for tier in created:
        tier.shutdown()


def ctx(req_id: str):
    from kvtier.vllm import ReqContext

    return ReqContext(req_id=req_id)


#: Longest a lookup answer is waited for between two checks of it (answers raise no fd).
LOOKUP_POLL_S = 0.002


def wait_for_io(tier, timeout: float) -> None:
    """Blocks until the tier has job results to hand out (its event fd turns readable) or
    ``timeout`` passes, whichever comes first."""
    select.select([tier.tier.event_fd()], [], [], timeout)


def resolve(tier, key: bytes, req: str, timeout: float = 30.0):
    """Asks the way the manager does, one step at a time, until the answer is not RETRY."""
    from kvtier.vllm import LookupResult

    deadline = time.monotonic() + timeout
    while True:
        verdict = tier.lookup(key, ctx(req))
        if verdict is not LookupResult.RETRY:
            return verdict
        assert time.monotonic() < deadline, "lookup never resolved"
        tier.on_schedule_end(None)
        wait_for_io(tier, LOOKUP_POLL_S)


def wait_results(tier, n: int, timeout: float = 15.0) -> list:
    """Exactly ``n`` results of a ``kvtier.Tier``, sleeping on its event fd (readable while
    results wait) between polls; fails after ``timeout`` seconds."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        out += tier.poll()
        if len(out) < n:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(out)} of {n} results"
            select.select([tier.event_fd()], [], [], remaining)
    assert len(out) == n, out
    return out


def collect(tier, job_ids, timeout: float = 30.0) -> dict:
    """Waits for get_finished_jobs to hand back every id in ``job_ids``, each exactly once."""
    wanted = set(job_ids)
    got: dict = {}
    deadline = time.monotonic() + timeout
    while True:
        for result in tier.get_finished_jobs():
            assert result.job_id not in got, f"job {result.job_id} reported twice"
            assert result.job_id in wanted, f"unexpected job id {result.job_id}"
            got[result.job_id] = result
        if set(got) == wanted:
            return got
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"jobs {sorted(wanted - set(got))} never finished"
        wait_for_io(tier, remaining)
