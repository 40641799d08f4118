#!/usr/bin/env python3
"""bench/uring.py: io_uring against the local store's thread pool, in the published geometries.

    bench/uring.py                               # 2 MiB x 256, 256 KiB x 1024, 16 MiB x 32; 5 reps
    bench/uring.py --geometries 2M:256 --reps 3
    bench/run.py uring                           # the published run (bench/comparisons.py)

Runs the `uring-vs-threads` example (bench/uring_vs_threads.rs, `cargo build --release
--example uring-vs-threads`) once per geometry (block size and blocks) on a directory under
--dir (on a disk, not tmpfs: O_DIRECT is measured too) and writes what it prints, under a
line saying how, where and on what, to bench/results/uring.md (--out).
"""

import argparse
import datetime
import os
import platform
import subprocess

import common

log = common.logger("uring")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometries", default="2M:256,256K:1024,16M:32", help="BLOCK_SIZE:BLOCKS, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=os.path.join(common.target_dir(), "bench-uring"))
    ap.add_argument("--no-build", action="store_true", help="use the built example (or KVTIER_URING_VS_THREADS)")
    ap.add_argument("--out", default="uring.md")
    args = ap.parse_args()
    common.build("uring-vs-threads", skip=args.no_build)
    example = common.program("uring-vs-threads")
    os.makedirs(args.dir, exist_ok=True)
    parts = []
    for geometry in args.geometries.split(","):
        size, blocks = geometry.split(":")
        argv = [example, "--dir", args.dir, "--block-size", size, "--blocks", blocks, "--reps", str(args.reps)]
        log(" ".join(argv))
        parts.append(subprocess.run(argv, check=True, capture_output=True, text=True, cwd=common.ROOT).stdout.strip())
    head = [
        "# io_uring against the local store's thread pool",
        "",
        f"`bench/uring.py --geometries {args.geometries} --reps {args.reps}` (the `uring-vs-threads` example) on "
        f"{datetime.date.today().isoformat()}, kvtier @ {common.git_rev()}, kernel {platform.release()}, "
        f"{os.cpu_count()} cores, {common.fs_type(args.dir)} under {args.dir}; data moves only (files created or "
        "opened outside the clock), every loaded byte compared; CPU = process user+sys (io_uring's kernel workers "
        "included) per GiB.",
        "",
    ]
    common.publish(head + [p + "\n" for p in parts], args.out)


if __name__ == "__main__":
    main()
