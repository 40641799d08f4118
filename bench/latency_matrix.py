#!/usr/bin/env python3
"""bench/latency_matrix.py: kvtier, NIXL OBJ and awscrt at a remote store's latency, side by side.

    python3 bench/latency_matrix.py                     # 0/20/40/50 ms x 25/100 MB/s (~40 min)
    python3 bench/latency_matrix.py --rtt 20 50 --connection-mbps 25 --reps 3
    python3 bench/latency_matrix.py --report-only       # rewrite the report from the last runs
    bench/run.py latency-matrix                         # the published run (bench/comparisons.py)

Runs `bench/compare --latency RTT --connection-mbps MBPS` once per round trip and link (s3s-fs
behind bench/shaper.rs, each connection capped at MBPS each way; 2 MiB and 32 MiB objects,
stores and loads, --concurrency jobs in flight; a 256-key existence batch; every byte
verified), each in the project's bench venv with its own tools, awscrt with 8 MiB parts as
its users get it, kvtier with its defaults. Then writes one table over all round trips
(MiB/s, client CPU per GiB, p50/p99 job latency, connections opened), the issue's targets
checked cell by cell (kvtier >= 1.2x awscrt's throughput at <= 0.5x its CPU), and a chart:
bench/results/latency-matrix.md and bench/results/latency-matrix.png. The raw runs stay in
bench/results/latency-matrix-MBPSmbps-RTT.{md,jsonl}.
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


# The published matrix: round trips (ms) and per-connection caps (MB/s each way).
RTTS = (0, 20, 40, 50)
LINKS = (25, 100)
# The targets for every cell: throughput against awscrt's, and CPU against awscrt's.
TARGET_SPEEDUP = 1.2
TARGET_CPU = 0.5


def run_name(mbps, rtt):
    return f"latency-matrix-{mbps:g}mbps-{rtt}"


def result_files():
    """Every file the published matrix writes (bench/comparisons.py lists them)."""
    return ["latency-matrix.md", "latency-matrix.png"] + [
        f"{run_name(mbps, rtt)}.{ext}" for mbps in LINKS for rtt in RTTS for ext in ("md", "jsonl", "png")]


def load(links, rtts):
    """{(mbps, rtt, client, op, block_bytes): [rows]}, and whether every row verified."""
    cells, all_verified = {}, True
    for mbps in links:
        for rtt in rtts:
            path = os.path.join(RESULTS, run_name(mbps, rtt) + ".jsonl")
            for line in open(path):
                r = json.loads(line)
                if r.get("client") not in CLIENTS or r.get("op") not in ("store", "load", "exists"):
                    continue
                all_verified &= bool(r.get("verified"))
                key = (mbps, rtt, r["client"], r["op"], r.get("block_bytes", 0))
                cells.setdefault(key, []).append(r)
    return cells, all_verified


def fmt(v, digits=0):
    return common.fmt(v, digits, "-")


median = common.median_of
ratio = common.ratio


def report(args):
    cells, all_verified = load(args.connection_mbps, args.rtt)
    sizes = sorted({k[4] for k in cells if k[3] != "exists"})
    links = " and ".join(f"{m:g}" for m in args.connection_mbps)
    lines = [
        "# kvtier, NIXL OBJ and awscrt at a remote store's latency",
        "",
        f"`bench/latency_matrix.py --rtt {' '.join(map(str, args.rtt))} --connection-mbps "
        f"{' '.join(f'{m:g}' for m in args.connection_mbps)} --reps {args.reps} --concurrency {args.concurrency}`: "
        f"s3s-fs 0.14.1 behind `bench/shaper.rs` (the round trip on every exchange, one more on a new connection; "
        f"each connection capped at {links} MB/s each way), {args.concurrency} jobs in flight, one object per job, "
        f"medians of {args.reps} interleaved repetitions; awscrt with 8 MiB parts (its default), kvtier with its "
        f"defaults (parts and connections decided from the link). Every byte verified: "
        f"{'yes' if all_verified else '**NO: some rows FAILED, see the raw runs**'}. "
        "Client, shaper and server share the machine's cores. Raw runs: `bench/results/latency-matrix-MBPSmbps-RTT.md`.",
        "",
        "The column *one request each* is what the link allows "
        f"{args.concurrency} jobs in flight moving each object as one request on a connection of its own "
        "(each connection's rate, plus a round trip per object): the ceiling of every client that does not "
        "split objects, and of any store of an object S3 cannot split (under 10 MiB: its parts are at least "
        "5 MiB). *server cores* is the CPU s3s-fs used over the transfer's time, on the same 2 cores as the "
        "client and the shaper.",
        "",
        "| link | round trip | object | op | one request each, MiB/s | kvtier MiB/s | NIXL MiB/s | awscrt MiB/s | "
        "kvtier ÷ awscrt | CPU-s/GiB kvtier / NIXL / awscrt | kvtier CPU ÷ awscrt's | server cores kvtier / awscrt | "
        "p50 / p99 ms kvtier | p50 / p99 ms awscrt | connections kvtier / NIXL / awscrt |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---|---|---|",
    ]
    met, total, misses = 0, 0, []
    for mbps in args.connection_mbps:
        for size in sizes:
            for op in ("store", "load"):
                for rtt in args.rtt:
                    got = {c: cells.get((mbps, rtt, c, op, size), []) for c in CLIENTS}
                    mib = {c: median(got[c], "mib_s") for c in CLIENTS}
                    cpu = {c: median(got[c], "cpu_s_per_gib") for c in CLIENTS}
                    conns = {c: median(got[c], "connections") for c in CLIENTS}
                    lat = {c: (median(got[c], "lat_p50_ms"), median(got[c], "lat_p99_ms")) for c in CLIENTS}
                    server_cores = {c: median([{"cores": r["server_cpu_s"] / r["wall_s"]} for r in got[c]
                                               if r.get("wall_s")], "cores") for c in CLIENTS}
                    one_each = args.concurrency * size / (size / (mbps * 1e6) + rtt / 1000) / MIB
                    speedup, cpu_ratio = ratio(mib["kvtier"], mib["awscrt"]), ratio(cpu["kvtier"], cpu["awscrt"])
                    if speedup is not None and cpu_ratio is not None:
                        total += 1
                        if speedup >= TARGET_SPEEDUP and cpu_ratio <= TARGET_CPU:
                            met += 1
                        else:
                            misses.append(f"{mbps:g} MB/s, {rtt} ms, {size // MIB} MiB {op}: "
                                          f"{speedup:.2f}× at {cpu_ratio:.2f}× CPU")
                    lines.append(
                        f"| {mbps:g} MB/s | {rtt} ms | {size // MIB} MiB | {op} | {fmt(one_each)} | "
                        f"{fmt(mib['kvtier'])} | {fmt(mib['nixl'])} | {fmt(mib['awscrt'])} | {fmt(speedup, 2)} | "
                        f"{' / '.join(fmt(cpu[c], 2) for c in CLIENTS)} | {fmt(cpu_ratio, 2)} | "
                        f"{fmt(server_cores['kvtier'], 2)} / {fmt(server_cores['awscrt'], 2)} | "
                        f"{fmt(lat['kvtier'][0])} / {fmt(lat['kvtier'][1])} | {fmt(lat['awscrt'][0])} / "
                        f"{fmt(lat['awscrt'][1])} | {' / '.join(fmt(conns[c]) for c in CLIENTS)} |")
    lines += [
        "",
        f"Target, every cell: kvtier ≥ {TARGET_SPEEDUP}× awscrt's throughput at ≤ {TARGET_CPU}× its CPU per GiB. "
        f"Met in {met} of {total} cells."
        + (" Missed: " + "; ".join(misses) + "." if misses else ""),
        "",
        "256-key existence batch (half present), 256 checks in flight for every client, p50 / p99 ms over the "
        "batches (in round trips at p50):",
        "",
        "| link | round trip | kvtier | NIXL OBJ | awscrt |",
        "|---|---|---|---|---|",
    ]
    for mbps in args.connection_mbps:
        for rtt in args.rtt:
            row = []
            for c in CLIENTS:
                got = cells.get((mbps, rtt, c, "exists", 0), [])
                p50, p99 = median(got, "lat_p50_ms"), median(got, "lat_p99_ms")
                trips = f" ({p50 / rtt:.1f})" if rtt and p50 is not None else ""
                row.append(f"{fmt(p50, 1)} / {fmt(p99, 1)}{trips}")
            lines.append(f"| {mbps:g} MB/s | {rtt} ms | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(RESULTS, "latency-matrix.md"), "w") as f:
        f.write(text)
    print(text)
    chart(cells, sizes, args.connection_mbps, args.rtt)


def chart(cells, sizes, links, rtts):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(mbps, size) for mbps in links for size in sizes]
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 3.6 * len(rows)), squeeze=False)
    for row, (mbps, size) in enumerate(rows):
        for col, op in enumerate(("store", "load")):
            ax = axes[row][col]
            for c in CLIENTS:
                ys = [median(cells.get((mbps, rtt, c, op, size), []), "mib_s") for rtt in rtts]
                ax.plot(rtts, [y if y is not None else float("nan") for y in ys], marker="o", label=LABELS[c])
            ax.set_title(f"{mbps:g} MB/s a connection, {size // MIB} MiB objects, {op}")
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
    ap.add_argument("--rtt", type=int, nargs="+", default=list(RTTS), help="round trips, ms")
    ap.add_argument("--connection-mbps", type=float, nargs="+", default=list(LINKS),
                    help="per-connection caps, MB/s each way")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if not args.report_only:
        for mbps in args.connection_mbps:
            for rtt in args.rtt:
                subprocess.run([sys.executable, os.path.join(common.BENCH, "compare"), "--latency", str(rtt),
                                "--connection-mbps", f"{mbps:g}", "--sizes", "2M,32M",
                                "--concurrency", str(args.concurrency), "--servers", "s3sfs",
                                "--clients", ",".join(CLIENTS), "--reps", str(args.reps),
                                "--name", run_name(mbps, rtt)],
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
