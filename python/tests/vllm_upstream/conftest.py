# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fixtures and hooks for kvtier's adaptation of vLLM 0.33.0's tiering tests (adapted
from vLLM 0.33.0's tests/v1/kv_offload/conftest.py; the helpers are in
upstream_support.py)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

try:
    import vllm.v1.kv_offload.tiering.base  # noqa: F401
except ImportError:
    HAVE_VLLM = False
else:
    HAVE_VLLM = True


def pytest_configure(config):
    config.addinivalue_line("markers", "short_hashes: uses vLLM's 1-2 byte block hashes")
    config.addinivalue_line(
        "markers", "tier_sees_no_keys: checks that no key reaches the tiers (runs whatever the key length)"
    )


if not HAVE_VLLM:
    # Without vLLM (e.g. `python -m pytest python/tests` outside the test tools' venv)
    # these tests are not collected; the rest of python/tests still runs.
    collect_ignore_glob = ["test_*.py"]

    def pytest_report_header(config):
        return ["vllm_upstream: vLLM is not importable; vLLM's adapted tier tests are not collected"]

else:
    from upstream_support import (  # noqa: E402
        PAD_HASHES,
        SHORT_HASH_REASON,
        SHORT_HASHES_REFUSED,
        FaultProxy,
        S3Client,
        Store,
    )

    def pytest_collection_modifyitems(config, items):
        for item in items:
            if (
                item.get_closest_marker("short_hashes")
                and not item.get_closest_marker("tier_sees_no_keys")
                and SHORT_HASHES_REFUSED
                and not PAD_HASHES
            ):
                item.add_marker(pytest.mark.xfail(reason=SHORT_HASH_REASON, strict=True))

    def pytest_report_header(config):
        state = "accepted" if not SHORT_HASHES_REFUSED else "refused (short-hash tests xfail)"
        if PAD_HASHES:
            state += "; KVTIER_UPSTREAM_PAD_HASHES=1: tests use padded hashes"
        return [f"kvtier short block hashes: {state}"]


_STORE_IDS = ["local", "s3s-fs", "moto"]


@pytest.fixture(scope="session")
def s3_backends():
    """s3s-fs and moto, started once, each behind its own fault proxy."""
    sys.path.insert(0, str(_HERE.parent))
    import s3_servers

    backends = {}
    for cfg in s3_servers.start_all():
        cfg = dict(cfg)
        name = cfg.pop("_id")
        backends[name] = (cfg, FaultProxy(cfg["endpoint_override"]))
    return backends


def _make_store(store_id: str, request, tmp_path) -> Store:
    prefix = f"vllm-upstream-{uuid.uuid4().hex[:12]}"
    if store_id == "local":
        root = tmp_path / "store"
        root.mkdir()
        return Store("local", {"type": "local", "path": str(root)}, prefix, root=root)
    cfg, proxy = request.getfixturevalue("s3_backends")[store_id]
    request.addfinalizer(proxy.clear)
    tier_cfg = dict(cfg, endpoint_override=proxy.address)
    return Store(store_id, tier_cfg, prefix, s3=S3Client(cfg), proxy=proxy)


@pytest.fixture(params=_STORE_IDS)
def kv_store(request, tmp_path) -> Store:
    """The local store, s3s-fs and moto, each with a prefix of the test's own."""
    return _make_store(request.param, request, tmp_path)


@pytest.fixture(params=["s3s-fs", "moto"])
def s3_store(request, tmp_path) -> Store:
    """s3s-fs and moto only: for faults a local directory cannot produce (a held PUT)."""
    return _make_store(request.param, request, tmp_path)


@pytest.fixture
def local_store(request, tmp_path) -> Store:
    return _make_store("local", request, tmp_path)


@pytest.fixture
def tiers():
    """Shuts down every tier a test registers here."""
    created: list = []
    yield created
    for tier in created:
        tier.shutdown()
