"""Runs C and C++ test programs against each real S3 server of the tests.

    on_s3_servers.py -- PROGRAM [ARGS...] [-- PROGRAM [ARGS...]]...

Starts s3s-fs, moto_server and Ceph RGW (python/tests/s3_servers.py: free loopback ports,
one bucket each), then runs every program once per server with the server's kvtier store
section, as JSON, in KVT_HARNESS_STORE and KVT_EXAMPLE_STORE. Prints one line per
(server, program) and exits non-zero if any run failed. Run it with the test tools'
Python (tools/venv: boto3 creates the RGW bucket).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
import s3_servers  # noqa: E402


def programs(argv: list[str]) -> list[list[str]]:
    out: list[list[str]] = []
    for arg in argv:
        if arg == "--":
            out.append([])
        elif out:
            out[-1].append(arg)
        else:
            raise SystemExit(f"usage: {sys.argv[0]} -- PROGRAM [ARGS...] [-- PROGRAM ...]")
    out = [p for p in out if p]
    if not out:
        raise SystemExit(f"usage: {sys.argv[0]} -- PROGRAM [ARGS...] [-- PROGRAM ...]")
    return out


def store_section(server: dict) -> dict:
    """kvtier's store section for one of s3_servers' (vLLM-shaped) configurations."""
    section = {k: v for k, v in server.items() if k != "_id"}
    return {"type": "s3", **section}


def main() -> int:
    runs = programs(sys.argv[1:])
    failed = 0
    for server in s3_servers.start_all():
        store = json.dumps(store_section(server))
        env = dict(os.environ, KVT_HARNESS_STORE=store, KVT_EXAMPLE_STORE=store)
        for program in runs:
            result = subprocess.run(program, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            ok = result.returncode == 0
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} {server['_id']}: {' '.join(program)}", flush=True)
            if not ok:
                print(result.stdout, flush=True)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
