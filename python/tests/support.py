"""Keys, block contents and waits of the Python suites, for the tests to import (from
here rather than from conftest.py: vllm_upstream/ has a conftest.py of its own, and a
test module's ``from conftest import`` found whichever pytest had loaded last).
"""

from __future__ import annotations

import hashlib
import select
import time

import numpy as np


# -- keys and blocks --------------------------------------------------------------------


def make_key(i, group: int = 0, salt: str = "") -> bytes:
    """A vLLM OffloadKey: 32-byte SHA-256 block hash + 4-byte big-endian group index."""
    return hashlib.sha256(f"{salt}block-{i}".encode()).digest() + group.to_bytes(4, "big")


def pattern(i, row_bytes: int) -> np.ndarray:
    """Distinct, non-trivial content for block ``i``."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(repr(i).encode()).digest()[:8], "big"))
    return rng.integers(0, 256, row_bytes, dtype=np.uint8)


# -- lookups and results -----------------------------------------------------------------


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
