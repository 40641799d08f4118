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

import json
import os
import sys
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


#: The longest object name s3s-fs can keep metadata for: its metadata file is named
#: `.bucket-<base64 bucket>.object-<base64 key>.metadata.json`, at most 255 bytes.
S3S_FS_MAX_KEY_BYTES = (255 - len(".bucket-.object-.metadata.json") - 24) * 3 // 4


@pytest.fixture(params=[pytest.param(("local", None), id="local")] + _s3_params())
def store(request, tmp_path) -> Store:
    kind, cfg = request.param
    # Short: s3s-fs keeps an object's metadata in one file named by the base64 of the whole
    # key, so a key over about 150 bytes cannot keep its metadata there (ENAMETOOLONG, HTTP
    # 500 after the data is written). See S3S_FS_MAX_KEY_BYTES.
    prefix = f"k{uuid.uuid4().hex[:6]}"
    if kind == "local":
        root = tmp_path / "store"
        return Store("local", {"type": "local", "path": str(root)}, prefix, root=root)
    return Store("s3", cfg, prefix)


@pytest.fixture
def local_only(store):
    if store.kind != "local":
        pytest.skip("needs direct access to the objects (local store only)")
    return store


# -- tiers -------------------------------------------------------------------------------


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
