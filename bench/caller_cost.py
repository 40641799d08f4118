#!/usr/bin/env python3
"""bench/caller_cost.py: what the engine's thread pays per key to submit and poll, through the C caller.

    bench/caller_cost.py                   # 2 MiB blocks, 16 in flight, contiguous and 64 ranges
    bench/caller_cost.py --reps 7 --rounds 8
    bench/run.py caller                    # the published run (bench/comparisons.py)

Runs `kvtier bench` (one key per job, every byte of every round trip verified) on the
local store in /dev/shm, so that the device does not hide the caller's cost, with the
contiguous pool calls and with each block as 64 ranges in 64 regions (a layer-first
engine pool, the range calls), interleaved `--reps` times. Prints the medians of the
caller column: the CPU of the thread that submits and polls, per key moved, less the cost
of reading that thread's CPU clock (`kvtier bench` measures it at start; in some VMs the
clock is a system call of about 0.5 us). Targets: at most 2 us per key contiguous and
4 us at 64 ranges. Writes bench/results/caller-cost.md.
"""

import os
import statistics

import common

log = common.logger("caller")

LAYOUTS = {"contiguous": 1, "64 ranges": 64}
TARGET_US = {"contiguous": 2.0, "64 ranges": 4.0}


def main():
    ap = common.run_arguments(__doc__, "caller-cost.md")
    ap.set_defaults(stores="local", reps=5)
    args = ap.parse_args()
    with common.bench_scratch(args, "caller") as (stores, tmp):
        def run_one(store, layout):
            with common.fresh_store(store, tmp) as config:
                return common.store_load_verify({"store": config, "dedup": "off"}, args, LAYOUTS[layout])

        rows = common.interleaved(args.reps, stores, list(LAYOUTS), run_one, log)

    lines = [f"# The caller's thread per key ({args.block_size} blocks, one key per job, {args.concurrency} in "
             f"flight, {args.blocks} blocks x {args.rounds} rounds a run, median of {args.reps} runs)", "",
             "| store | layout | phase | caller µs/key (min–max) | target | met | MiB/s |",
             "|---|---|---|---:|---:|---|---:|"]
    missed = []
    for store in stores:
        for layout in LAYOUTS:
            for phase in ("store", "load"):
                got = rows[(store, phase, layout)]
                caller = [r["caller_us_per_key"] for r in got]
                us = statistics.median(caller)
                ok = us <= TARGET_US[layout]
                if not ok:
                    missed.append(f"{store} {layout} {phase} ({us:.2f} µs)")
                lines.append(f"| {store} | {layout} | {phase} | {us:.2f} ({min(caller):.2f}–{max(caller):.2f}) | "
                             f"≤ {TARGET_US[layout]:g} | {'yes' if ok else 'no'} | "
                             f"{statistics.median(r['mib_s'] for r in got):.0f} |")
    lines += ["", "Targets (at most 2 µs per key contiguous, 4 µs at 64 ranges): "
              + ("all met." if not missed else "missed by " + ", ".join(missed) + "."),
              f"Caller µs/key: CPU of the thread calling submit and poll (`kvtier bench`'s caller column), per key, "
              f"less the cost of reading that thread's CPU clock. Machine: {os.cpu_count()} CPUs, load average "
              f"{common.loadavg()} at the end; kvtier {common.git_rev()}; checksums on, dedup off, every byte verified."]
    common.publish(lines, args.out)


if __name__ == "__main__":
    main()
