#!/usr/bin/env python3
"""bench/ranges.py: blocks moved as N ranges against the contiguous pool, side by side.

    bench/ranges.py                 # 2 MiB blocks, 16 in flight, N = 1, 2, 64, 64a, local + sink
    bench/ranges.py --reps 5 --blocks 512

For each store (the local store on /dev/shm, so the device does not hide the client's
cost, and the in-memory S3 sink of bench/sink; both empty at the start of every run, see
`fresh_store`) and each N, runs `kvtier bench` (every
byte of every round trip verified) with `--ranges-per-block N`: N = 1 is the contiguous
pool calls, N > 1 a layer-first layout (block b's piece j in region j) through the range
calls. `64a` is the same 64 ranges one after the other in one region
(`--range-layout adjacent`): what the ranges themselves cost, without the scattered
memory. The runs are interleaved, `--reps` times, and the medians are printed with their
ratio to N = 1 and the targets (throughput at least 0.9x, CPU per GiB at most 1.1x; the
adjacent layout is shown, not judged); writes bench/results/ranges.md.
"""

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SINK_TARGET = os.path.join(ROOT, "target", "bench")
ACCESS_KEY, SECRET_KEY, BUCKET = "kvtier", "kvtier-secret", "kvbench"


def log(msg):
    print(f"[ranges] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build():
    subprocess.run(["cargo", "build", "--release", "--bin", "kvtier", "-q"], cwd=ROOT, check=True)
    env = dict(os.environ, CARGO_TARGET_DIR=SINK_TARGET)
    subprocess.run(["cargo", "build", "--release", "-q", "--manifest-path", "bench/sink/Cargo.toml"],
                   cwd=ROOT, env=env, check=True)


def start_sink():
    port = free_port()
    proc = subprocess.Popen(
        [os.path.join(SINK_TARGET, "release", "kvtier-bench-sink"), "--host", "127.0.0.1", "--port", str(port),
         "--bucket", BUCKET, "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the sink did not start")
            time.sleep(0.05)


@contextlib.contextmanager
def fresh_store(store, directory):
    """The configuration of an empty store for one run: a directory under `directory`,
    removed afterwards (local), or a sink of its own, stopped afterwards. Every run starts
    alike: a sink keeps what it is sent, and one grown by earlier runs slowed stores by up
    to 3x."""
    if store == "local":
        path = tempfile.mkdtemp(prefix="store-", dir=directory)
        try:
            yield {"type": "local", "path": path}
        finally:
            shutil.rmtree(path, ignore_errors=True)
        return
    sink, port = start_sink()
    try:
        yield {"type": "s3", "bucket": BUCKET, "endpoint_override": f"127.0.0.1:{port}", "scheme": "http",
               "access_key": ACCESS_KEY, "secret_key": SECRET_KEY, "region": "us-east-1"}
    finally:
        os.killpg(sink.pid, 15)
        sink.wait()


def variant(text):
    """A `--ranges` entry as (ranges per block, layout): "64" laid apart, "64a" adjacent."""
    return int(text.rstrip("a")), ("adjacent" if text.endswith("a") else "layer-first")


def run(config, n, args, layout="layer-first"):
    cmd = [os.path.join(ROOT, "target", "release", "kvtier"), "bench", "--json", "--config", json.dumps(config),
           "--blocks", str(args.blocks), "--block-size", args.block_size, "--concurrency", str(args.concurrency),
           "--workload", "store,load,verify", "--ranges-per-block", str(n), "--range-layout", layout,
           "--repeat", str(args.rounds), "--key-sets", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kvtier bench N={n} failed: {out.stderr.strip()}")
    report = json.loads(out.stdout)
    assert report["verified_blocks"] == args.blocks * args.rounds, report
    return {p["phase"]: p for p in report["phases"]}


def interleaved(args, stores, variants, run_one):
    """Runs `run_one(store, variant)` (a `run`'s phases) for every store and variant,
    `args.reps` times, the variants' order rotated each repetition so that drift on the
    machine hits each alike; returns {(store, phase, variant): [phase reports]} for the
    store and load phases."""
    rows = {}
    for rep in range(args.reps):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for store in stores:
            for variant in order:
                log(f"rep {rep + 1}/{args.reps}: {store}, {variant}")
                phases = run_one(store, variant)
                for phase in ("store", "load"):
                    rows.setdefault((store, phase, variant), []).append(phases[phase])
    return rows


def publish(lines, name):
    """Prints a result table and writes it to bench/results/NAME."""
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", name), "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranges", default="1,2,64,64a", help="counts; a trailing 'a': the adjacent layout")
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--block-size", default="2M")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4,
                    help="rounds per run over the same keys (rewritten: dedup is off), so that each phase "
                         "lasts long enough to measure (a round of 256 blocks is 0.1-0.4 s)")
    ap.add_argument("--stores", default="local,sink")
    args = ap.parse_args()
    counts = args.ranges.split(",")
    assert counts[0] == "1", "the first count is the contiguous baseline, 1"
    build()
    stores = args.stores.split(",")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    tmp = tempfile.mkdtemp(prefix="kvbench-ranges-", dir=base)

    def run_one(store, text):
        n, layout = variant(text)
        with fresh_store(store, tmp) as config:
            return run({"store": config, "dedup": "off"}, n, args, layout)

    try:
        rows = interleaved(args, stores, counts, run_one)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

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
    publish(lines, "ranges.md")


if __name__ == "__main__":
    main()
