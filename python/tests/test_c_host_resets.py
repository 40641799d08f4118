"""A C host keeps SIGPIPE's default action; connections reset under its jobs must not end it.

A write to a connection its peer has reset raises SIGPIPE in the writing thread unless the
write asks otherwise, and the HTTP client's vectored writes cannot ask. CPython and Rust
programs ignore SIGPIPE, so neither the Python suites nor the Rust ones would notice; most
C and C++ serving stacks do not. ffi-tests/reset_host.c stores and loads blocks through the
project's fault proxy (python/tests/fault_proxy.py), which resets a connection every
``CUT_EVERY`` bytes of traffic, in front of each real S3 server: the host must exit
normally, with one result per job, requests sent again (retried, or repeated through the
general client after the direct path's attempt) or jobs failed (so the resets did meet
them), and every load reported OK byte-exact.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import c_programs
from fault_proxy import FaultProxy

HOST = c_programs.ROOT / "ffi-tests" / "reset_host.c"
#: Bodies of several writes each, cut part-way: what raised SIGPIPE in every run before the
#: library kept it off (2 and 1 MiB blocks did too, in every one of 8 runs).
BLOCK_BYTES = 4 << 20
ROUNDS = 3
#: Most requests meet a reset at least once; the library sends them again.
CUT_EVERY = 6_000_000
DEADLINE_S = 600


def test_a_c_host_lives_through_connections_reset(store, tmp_path: Path):
    if store.kind != "s3":
        pytest.skip("resets connections to an S3 server")
    exe = c_programs.build(HOST, tmp_path / "c")
    proxy = FaultProxy(int(store.store_config["endpoint_override"].rsplit(":", 1)[1]))
    try:
        config = {"store": dict(store.store_config, type="s3", endpoint_override=proxy.endpoint),
                  "prefix": store.prefix}
        proxy.cut_every = CUT_EVERY
        run = subprocess.run([exe, json.dumps(config), str(BLOCK_BYTES), str(ROUNDS)],
                             capture_output=True, text=True, timeout=DEADLINE_S)
        cuts = proxy.cuts
    finally:
        proxy.close()
    assert run.returncode >= 0, (
        f"the host died of signal {-run.returncode} after {cuts} resets; stderr: {run.stderr[-2000:]}")
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESET_HOST ")]
    assert len(lines) == 1, f"exit {run.returncode}; stdout: {run.stdout!r}; stderr: {run.stderr[-2000:]}"
    counts = json.loads(lines[0].split(" ", 1)[1])
    assert run.returncode == 0, f"{counts}; stderr: {run.stderr[-2000:]}"
    assert counts["one_result_each"] and counts["wrong"] == 0, counts
    assert cuts > 0, counts
    met = counts["retries"] + counts["direct_fallbacks"] + counts["store_failed"] + counts["load_failed"]
    assert met > 0, f"no request met one of {cuts} resets: {counts}"
    assert counts["loaded"] > 0, f"no load got through between {cuts} resets: {counts}"
