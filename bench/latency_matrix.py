#!/usr/bin/env python3
"""bench/latency_matrix.py: kvtier, NIXL OBJ and awscrt at a remote store's latency, side by side.

    python3 bench/latency_matrix.py                     # round trips 0, 5, 20, 50 ms (~15 min)
    python3 bench/latency_matrix.py --rtt 20 50 --reps 3
    python3 bench/latency_matrix.py --report-only       # rewrite the report from the last runs
    bench/run.py latency-matrix                         # the published run (bench/comparisons.py)

Runs `bench/compare --latency RTT` once per round trip (s3s-fs behind bench/shaper.rs, each
connection capped at --connection-mbps, 100 MB/s by default; 2 MiB and 32 MiB objects,
stores and loads, --concurrency jobs in flight; a 256-key existence batch; every byte
verified), each in the project's bench venv with its own tools, awscrt with 8 MiB parts as
its users get it, kvtier with its defaults. Then writes one table over all round trips
(MiB/s, client CPU per GiB, p50/p99 job latency, connections opened) and a chart:
bench/results/latency-matrix.md and bench/results/latency-matrix.png. The raw runs stay in
bench/results/latency-matrix-RTT.{md,jsonl}.
"""

import argparse
import json
import os
import subprocess
import sys

import common

RESULTS = common.RESULTS
CLIENTS = ["kvtier", "nixl", "awscrt"]
LABELS = {"kvtier": "kvtier", "nixl": "NIXL OBJ", "awscrt": "awscrt"}
MIB = common.MIB


def run_name(rtt):
    return f"latency-matrix-{rtt}"


def load(rtts):
    """{(rtt, client, op, block_bytes): [rows]}, and whether every row verified."""
    cells, all_verified = {}, True
    for rtt in rtts:
        path = os.path.join(RESULTS, run_name(rtt) + ".jsonl")
        for line in open(path):
            r = json.loads(line)
            if r.get("client") not in CLIENTS or r.get("op") not in ("store", "load", "exists"):
                continue
            all_verified &= bool(r.get("verified"))
            cells.setdefault((rtt, r["client"], r["op"], r.get("block_bytes", 0)), []).append(r)
    return cells, all_verified


def fmt(v, digits=0):
    return common.fmt(v, digits, "-")


median = common.median_of
ratio = common.ratio


def report(args):
    cells, all_verified = load(args.rtt)
    sizes = sorted({k[3] for k in cells if k[2] != "exists"})
    lines = [
        "# kvtier, NIXL OBJ and awscrt at a remote store's latency",
        "",
        f"`bench/latency_matrix.py --rtt {' '.join(map(str, args.rtt))} --reps {args.reps} "
        f"--concurrency {args.concurrency} --connection-mbps {args.connection_mbps:g}`: s3s-fs 0.14.1 behind "
        f"`bench/shaper.rs` (the round trip on every exchange, one more on a new connection; "
        f"{args.connection_mbps:g} MB/s a connection each way), {args.concurrency} jobs in flight, one object per job, "
        f"medians of {args.reps} interleaved repetitions; awscrt with 8 MiB parts (its default), kvtier with its "
        f"defaults. Every byte verified: {'yes' if all_verified else '**NO: some rows FAILED, see the raw runs**'}. "
        "Client and server share the machine's cores. Raw runs: `bench/results/latency-matrix-RTT.md`.",
        "",
        "| round trip | object | op | kvtier MiB/s | NIXL MiB/s | awscrt MiB/s | kvtier ÷ awscrt | "
        "CPU-s/GiB kvtier / NIXL / awscrt | kvtier CPU ÷ awscrt's | p50 / p99 ms kvtier | p50 / p99 ms awscrt | "
        "connections kvtier / NIXL / awscrt |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---|---|---|",
    ]
    for size in sizes:
        for op in ("store", "load"):
            for rtt in args.rtt:
                got = {c: cells.get((rtt, c, op, size), []) for c in CLIENTS}
                mib = {c: median(got[c], "mib_s") for c in CLIENTS}
                cpu = {c: median(got[c], "cpu_s_per_gib") for c in CLIENTS}
                conns = {c: median(got[c], "connections") for c in CLIENTS}
                lat = {c: (median(got[c], "lat_p50_ms"), median(got[c], "lat_p99_ms")) for c in CLIENTS}
                lines.append(
                    f"| {rtt} ms | {size // MIB} MiB | {op} | {fmt(mib['kvtier'])} | {fmt(mib['nixl'])} | "
                    f"{fmt(mib['awscrt'])} | {fmt(ratio(mib['kvtier'], mib['awscrt']), 2)} | "
                    f"{' / '.join(fmt(cpu[c], 2) for c in CLIENTS)} | {fmt(ratio(cpu['kvtier'], cpu['awscrt']), 2)} | "
                    f"{fmt(lat['kvtier'][0])} / {fmt(lat['kvtier'][1])} | {fmt(lat['awscrt'][0])} / "
                    f"{fmt(lat['awscrt'][1])} | {' / '.join(fmt(conns[c]) for c in CLIENTS)} |")
    lines += [
        "",
        "256-key existence batch (half present), 256 checks in flight for every client, p50 / p99 ms over the "
        "batches (in round trips at p50):",
        "",
        "| round trip | kvtier | NIXL OBJ | awscrt |",
        "|---|---|---|---|",
    ]
    for rtt in args.rtt:
        row = []
        for c in CLIENTS:
            got = cells.get((rtt, c, "exists", 0), [])
            p50, p99 = median(got, "lat_p50_ms"), median(got, "lat_p99_ms")
            trips = f" ({p50 / rtt:.1f})" if rtt and p50 is not None else ""
            row.append(f"{fmt(p50, 1)} / {fmt(p99, 1)}{trips}")
        lines.append(f"| {rtt} ms | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(RESULTS, "latency-matrix.md"), "w") as f:
        f.write(text)
    print(text)
    chart(cells, sizes, args.rtt)


def chart(cells, sizes, rtts):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(sizes), 2, figsize=(11, 4 * len(sizes)), squeeze=False)
    for row, size in enumerate(sizes):
        for col, op in enumerate(("store", "load")):
            ax = axes[row][col]
            for c in CLIENTS:
                ys = [median(cells.get((rtt, c, op, size), []), "mib_s") for rtt in rtts]
                ax.plot(rtts, [y if y is not None else float("nan") for y in ys], marker="o", label=LABELS[c])
            ax.set_title(f"{size // MIB} MiB objects, {op}")
            ax.set_xlabel("round trip, ms")
            ax.set_ylabel("MiB/s")
            ax.set_xticks(rtts)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle("s3s-fs behind a shaped link: throughput by round trip")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "latency-matrix.png"), dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt", type=int, nargs="+", default=[0, 5, 20, 50], help="round trips, ms")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--connection-mbps", type=float, default=100)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if not args.report_only:
        for rtt in args.rtt:
            subprocess.run([sys.executable, os.path.join(common.BENCH, "compare"), "--latency", str(rtt),
                            "--connection-mbps", str(args.connection_mbps), "--sizes", "2M,32M",
                            "--concurrency", str(args.concurrency), "--servers", "s3sfs",
                            "--clients", ",".join(CLIENTS), "--reps", str(args.reps), "--name", run_name(rtt)],
                           check=True)
    # The chart needs matplotlib, which the bench venv has (bench/compare made it).
    venv = common.BENCH_VENV
    venv_python = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) != os.path.realpath(venv) and os.path.exists(venv_python):
        rerun = [a for a in sys.argv[1:] if a != "--report-only"] + ["--report-only"]
        os.execv(venv_python, [venv_python, os.path.abspath(__file__)] + rerun)
    report(args)


if __name__ == "__main__":
    main()
