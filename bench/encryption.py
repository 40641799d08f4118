#!/usr/bin/env python3
"""bench/encryption.py: encryption at rest on against off, side by side.

    bench/encryption.py                 # 2 MiB blocks, 16 in flight, local + sink
    bench/encryption.py --reps 5 --blocks 512
    bench/run.py encryption             # the published run (bench/comparisons.py)

For each store (the local store on /dev/shm, so the device does not hide the client's
cost, and the in-memory S3 sink of bench/sink) runs `kvtier bench` (every byte of every
round trip verified) with and without an `encryption` keyring, interleaved `--reps`
times, and prints the medians with the cost of encryption: throughput against off
(target at least 0.85x) and CPU seconds per GiB added (target at most 0.35); writes
bench/results/encryption.md. The run and its options are bench/ranges.py's
(common.store_load_verify, one range per block).
"""

import base64
import json
import os
import statistics

import common

log = common.logger("encryption")


def main():
    args = common.run_arguments(__doc__, "encryption.md").parse_args()
    with common.bench_scratch(args, "encryption") as (stores, tmp):
        keyring = os.path.join(tmp, "keyring.json")
        with open(keyring, "w") as f:
            json.dump({"write": "bench", "keys": {"bench": base64.b64encode(os.urandom(32)).decode()}}, f)

        def run_one(store, variant):
            with common.fresh_store(store, tmp) as store_config:
                config = {"store": store_config, "dedup": "off"}
                if variant == "on":
                    config["encryption"] = {"keyring_file": keyring}
                return common.store_load_verify(config, args)

        rows = common.interleaved(args.reps, stores, ["off", "on"], run_one, log)

    lines = [f"# Encryption at rest on against off ({args.block_size} blocks, {args.concurrency} in flight, "
             f"{args.blocks} blocks x {args.rounds} rounds a run, median of {args.reps} runs)", "",
             "| store | phase | encryption | MiB/s | CPU s/GiB | MiB/s vs off | CPU s/GiB added | "
             "CPU target (<= +0.35) | throughput target (>= 0.85x) |",
             "|---|---|---|---:|---:|---:|---:|---|---|"]
    missed = {"CPU": [], "throughput": []}
    for store in stores:
        for phase in ("store", "load"):
            med = {v: (statistics.median(r["mib_s"] for r in rows[(store, phase, v)]),
                       statistics.median(r["cpu_s_per_gib"] for r in rows[(store, phase, v)])) for v in ("off", "on")}
            (off_mib, off_cpu), (on_mib, on_cpu) = med["off"], med["on"]
            cpu_ok, mib_ok = on_cpu - off_cpu <= 0.35, on_mib >= 0.85 * off_mib
            for target, ok in (("CPU", cpu_ok), ("throughput", mib_ok)):
                if not ok:
                    missed[target].append(f"{store} {phase}")
            lines.append(f"| {store} | {phase} | off | {off_mib:.0f} | {off_cpu:.3f} | | | | |")
            lines.append(f"| {store} | {phase} | on | {on_mib:.0f} | {on_cpu:.3f} | {on_mib / off_mib:.2f}x | "
                         f"{on_cpu - off_cpu:+.3f} | {'met' if cpu_ok else 'MISSED'} | {'met' if mib_ok else 'MISSED'} |")
    lines.append("")
    for target, where in missed.items():
        lines.append(f"{target} target: {'met everywhere' if not where else 'missed by ' + ', '.join(where)}.")
    lines += ["", f"Machine: {os.cpu_count()} CPUs, shared by `kvtier bench` and the sink: throughput here is "
              "bounded by CPU, so it falls as CPU per GiB rises. `kvtier bench` with checksums on, dedup off, "
              "every byte verified; AES-256-GCM in 64 KiB segments (aws-lc-rs)."]
    common.publish(lines, args.out)


if __name__ == "__main__":
    main()
