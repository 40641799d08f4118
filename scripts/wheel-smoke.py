"""Smoke test of an installed kvtier wheel (run by scripts/test-wheel.sh in a fresh venv).

Checks that ``kvtier`` comes from the venv's site-packages, that it loads the library the
wheel bundles (not a build of the source tree), and that a store, a lookup and a load
round-trip byte for byte on a local-directory store. Standard library only.
"""

import hashlib
import os
import select
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import kvtier

site = Path(sysconfig.get_paths()["purelib"]).resolve()
package = Path(kvtier.__file__).resolve().parent
library = Path(kvtier.library_path()).resolve()
assert "KVTIER_LIBRARY" not in os.environ, "the bundled library must be the one found"
assert package.parent == site, f"kvtier imported from {package}, not from {site}"
assert library == package / "libkvtier.so", f"loaded {library}, not the bundled library"
assert kvtier.version() == kvtier.__version__, (kvtier.version(), kvtier.__version__)

BLOCKS, BLOCK_BYTES, N = 8, 4096, 4
keys = [hashlib.sha256(b"wheel-%d" % i).digest() + (0).to_bytes(4, "big") for i in range(N)]


def wait(tier, job_id):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for result in tier.poll():
            assert result.job_id == job_id, result
            return result
        select.select([tier.event_fd()], [], [], max(0.0, deadline - time.monotonic()))
    raise AssertionError(f"job {job_id}: no result in 30 s")


with tempfile.TemporaryDirectory() as store:
    pool = bytearray(BLOCKS * BLOCK_BYTES)
    for i in range(N):
        pool[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] = hashlib.sha256(keys[i]).digest() * (BLOCK_BYTES // 32)
    with kvtier.Tier({"store": {"type": "local", "path": store}}) as tier:
        tier.register_memory(pool, block_bytes=BLOCK_BYTES)
        tier.submit_store(1, list(range(N)), keys)
        stored = wait(tier, 1)
        assert stored.ok and stored.bytes == N * BLOCK_BYTES, stored
        tier.lookup(7, keys[0])
        tier.schedule_end()
        deadline = time.monotonic() + 30
        while tier.lookup(7, keys[0]) == kvtier.LookupResult.RETRY:
            assert time.monotonic() < deadline, "lookup still RETRY after 30 s"
            select.select([], [], [], 0.01)  # lookups have no fd: ask again next "step"
        assert tier.lookup(7, keys[0]) == kvtier.LookupResult.HIT
        tier.submit_load(2, list(range(N, 2 * N)), keys)
        loaded = wait(tier, 2)
        assert loaded.ok and loaded.bytes == N * BLOCK_BYTES, loaded
        assert pool[N * BLOCK_BYTES :] == pool[: N * BLOCK_BYTES], "loaded bytes differ from the stored ones"
        stats = tier.stats()
        assert stats["keys_stored"] == N and stats["keys_loaded"] == N, stats
    assert tier.closed

print(f"wheel smoke test passed: kvtier {kvtier.version()} from {package}, library {library.name}", file=sys.stdout)
