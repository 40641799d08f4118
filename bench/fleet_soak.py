#!/usr/bin/env python3
"""The fleet soak of python/tests/test_fleet_soak.py (its fleet: python/tests/fleet.py), run
longer: several engines on one namespace (two vLLM 0.33 TieringOffloadingManagers with
kvtier as their secondary tier, one C engine on the C ABI), a tier with eviction, `kvtier gc
--max-bytes` in a loop, one engine SIGKILLed and restarted, the S3 server down once; then
the final check (every block stored after a MISS loadable by a fresh tier). Prints the
test's summary line per store and exits 1 if any check failed.

    tools/venv/bin/python bench/fleet_soak.py                      # 120 s on each store
    tools/venv/bin/python bench/fleet_soak.py --seconds 600 --stores s3s-fs
    bench/run.py fleet-soak --seconds 600 --stores s3s-fs

Stores: local (a temporary directory), and s3s-fs and ceph-rgw started as the tests start
them (python/tests/s3_servers.py: moto and a Ceph cluster of three OSDs and two gateways start too). Needs what the
test needs: tools/venv (scripts/install-tools.sh), target/release/libkvtier.so (or
KVTIER_LIBRARY) and target/release/kvtier (cargo build --release), gcc. The fleet and the
servers are the tests' support modules (fleet.py, s3_servers.py, c_programs.py), loaded by
bench/common.py's ``test_support``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from pathlib import Path

import common

common.use_package()
fleet = common.test_support("c_programs", "s3_servers", "fleet")


def stores(names: list[str], tmp: Path) -> list[tuple[str, str, dict]]:
    out = []
    if "local" in names:
        out.append(("local", "local", {"type": "local", "path": str(tmp / "store")}))
    wanted = [n for n in names if n != "local"]
    if wanted:
        for cfg in common.servers().start_all():
            cfg = dict(cfg)
            name = cfg.pop("_id")
            if name in wanted:
                out.append((name, "s3", cfg))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0, help="how long the fleet runs on each store")
    ap.add_argument("--stores", default="local,s3s-fs,ceph-rgw", help="comma-separated: local, s3s-fs, ceph-rgw")
    ap.add_argument("--json", type=Path, help="also write every store's figures to this file")
    args = ap.parse_args()
    failed = False
    figures = {}
    with tempfile.TemporaryDirectory(prefix="kvtier-fleet-soak-") as tmp:
        tmp = Path(tmp)
        for name, kind, config in stores(args.stores.split(","), tmp):
            work = tmp / name
            work.mkdir()
            result = fleet.run_fleet(kind, config, f"fleet-soak-{uuid.uuid4().hex[:8]}", work, run_s=args.seconds)
            s = fleet.check(result)
            print(fleet.summary_line(name, result, s), flush=True)
            print(f"fleet soak [{name}] timeline (s): " + "; ".join(result["timeline"]), flush=True)
            for p in s["problems"]:
                print(f"fleet soak [{name}] PROBLEM: {p}", flush=True)
            failed |= bool(s["problems"])
            figures[name] = {k: v for k, v in s.items() if k != "excused_details"}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
