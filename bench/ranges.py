#!/usr/bin/env python3
"""bench/ranges.py: blocks moved as N ranges against the contiguous pool, side by side.

    bench/ranges.py                 # 2 MiB blocks, 16 in flight, N = 1, 2, 64, 64a, local + sink
    bench/ranges.py --reps 5 --blocks 512
    bench/run.py ranges             # the published run (bench/comparisons.py)

For each store (the local store on /dev/shm, so the device does not hide the client's
cost, and the in-memory S3 sink of bench/sink; both empty at the start of every run, see
common.fresh_store) and each N, runs `kvtier bench` (every byte of every round trip
verified) with `--ranges-per-block N`: N = 1 is the contiguous pool calls, N > 1 a
layer-first layout (block b's piece j in region j) through the range calls. `64a` is the
same 64 ranges one after the other in one region (`--range-layout adjacent`): what the
ranges themselves cost, without the scattered memory. The runs are interleaved, `--reps` times, and the medians are printed with their
ratio to N = 1 and the targets (throughput at least 0.9x, CPU per GiB at most 1.1x; the
adjacent layout is shown, not judged); writes bench/results/ranges.md.
"""

import os
import statistics

import common

log = common.logger("ranges")


def variant(text):
    """A `--ranges` entry as (ranges per block, layout): "64" laid apart, "64a" adjacent."""
    return int(text.rstrip("a")), ("adjacent" if text.endswith("a") else "layer-first")


def main():
    ap = common.run_arguments(__doc__, "ranges.md")
    ap.add_argument("--ranges", default="1,2,64,64a", help="counts; a trailing 'a': the adjacent layout")
    args = ap.parse_args()
    counts = args.ranges.split(",")
    assert counts[0] == "1", "the first count is the contiguous baseline, 1"
    with common.bench_scratch(args, "ranges") as (stores, tmp):
        def run_one(store, text):
            n, layout = variant(text)
            with common.fresh_store(store, tmp) as config:
                return common.store_load_verify({"store": config, "dedup": "off"}, args, n, layout)

        rows = common.interleaved(args.reps, stores, counts, run_one, log)

    lines = [f"# Blocks as ranges against the contiguous pool ({args.block_size} blocks, {args.concurrency} in flight, "
             f"{args.blocks} blocks x {args.rounds} rounds a run, median of {args.reps} runs)", "",
             "| store | phase | ranges/block | MiB/s | CPU s/GiB | MiB/s vs 1 | CPU vs 1 | target met |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    failed = []
    for store in stores:
        for phase in ("store", "load"):
            base_rows = rows[(store, phase, "1")]
            base_mib = statistics.median(r["mib_s"] for r in base_rows)
            base_cpu = statistics.median(r["cpu_s_per_gib"] for r in base_rows)
            for n in counts:
                mib = statistics.median(r["mib_s"] for r in rows[(store, phase, n)])
                cpu = statistics.median(r["cpu_s_per_gib"] for r in rows[(store, phase, n)])
                count, layout = variant(n)
                judged = count > 1 and layout == "layer-first"
                ok = not judged or (mib >= 0.9 * base_mib and cpu <= 1.1 * base_cpu)
                if not ok:
                    failed.append(f"{store} {phase} N={n}")
                label = f"{count} adjacent" if layout == "adjacent" else n
                lines.append(f"| {store} | {phase} | {label} | {mib:.0f} | {cpu:.3f} | {mib / base_mib:.2f}x | "
                             f"{cpu / base_cpu:.2f}x | {('yes' if ok else 'NO') if judged else '-'} |")
    lines += ["", f"Targets (at least 0.9x the throughput, at most 1.1x the CPU per GiB): "
              f"{'all met' if not failed else 'missed by ' + ', '.join(failed)}.",
              f"Machine: {os.cpu_count()} CPUs; `kvtier bench` with checksums on, dedup off, every byte verified."]
    common.publish(lines, args.out)


if __name__ == "__main__":
    main()
