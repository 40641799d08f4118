#!/usr/bin/env python3
"""HTTPS loads side by side, in one run: 2 MiB blocks loaded by `kvtier bench` from the bench
sink and from s3s-fs, three ways each:

  plain-direct   plain http, the direct path (store.direct_http on, the default)
  https-direct   https, the direct path over TLS
  https-general  https, direct_http off: object_store's general client

The sink and s3s-fs serve plain HTTP only: for https a TLS-terminating relay
(`cargo build --release --example tls-relay`, the relay of the TLS tests) sits in front of each,
with a certificate of a CA made here and passed as store.ca_bundle. Modes are interleaved and
their order rotated every repetition; the table shows medians of the load phase: MiB/s and the
client's CPU-s/GiB (user+sys of the kvtier process over the load phase). Client, relay and
server share the machine's cores.

  bench/https_loads.py [--reps 3] [--blocks 256] [--concurrency 16] [--block-size 2M] [--no-build]
"""

import argparse
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
KVTIER = os.path.join(ROOT, "target/release/kvtier")
RELAY = os.path.join(ROOT, "target/release/examples/tls-relay")
SINK = os.path.join(ROOT, "target/bench/release/kvtier-bench-sink")
S3S_FS = os.environ.get("KVTIER_S3S_FS", os.path.join(ROOT, "tools/bin/s3s-fs"))
MODES = ["plain-direct", "https-direct", "https-general"]
ACCESS, SECRET = "kvtier-bench", "kvtier-bench-secret-7Q"


def run(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=ROOT, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what):
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def certificates(d):
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=kvtier bench CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return [os.path.join(d, n) for n in ("ca.pem", "server.pem", "server.key")]


def start_relay(upstream, cert, key, procs):
    p = subprocess.Popen([RELAY, str(upstream), cert, key], stdout=subprocess.PIPE, text=True)
    procs.append(p)
    line = p.stdout.readline().strip()
    if not line.startswith("listening on "):
        sys.exit(f"tls-relay: {line!r}")
    return int(line.rsplit(":", 1)[1])


def bench(args, server, mode, ports, ca, bucket):
    https = mode != "plain-direct"
    store = {
        "type": "s3", "bucket": bucket, "region": "us-east-1",
        "endpoint_override": f"127.0.0.1:{ports[server][1 if https else 0]}",
        "scheme": "https" if https else "http",
        "access_key": ACCESS, "secret_key": SECRET,
        "direct_http": mode != "https-general",
    }
    if https:
        store["ca_bundle"] = ca
    config = {"store": store, "dedup": "off"}
    out = subprocess.run(
        [KVTIER, "bench", "--config", json.dumps(config), "--json", "--workload", "store,load",
         "--block-size", args.block_size, "--blocks", str(args.blocks),
         "--concurrency", str(args.concurrency)],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    load = next(p for p in report["phases"] if p["phase"] == "load")
    return {"mib_s": load["mib_s"], "cpu": load["cpu_s_per_gib"],
            "direct": report["direct_requests"], "fallbacks": report["direct_fallbacks"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--block-size", default="2M")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--no-build", action="store_true")
    args = ap.parse_args()
    if not args.no_build:
        run(["cargo", "build", "--release", "--bin", "kvtier", "--example", "tls-relay"])
        run(["cargo", "build", "--release", "--manifest-path", "bench/sink/Cargo.toml"],
            env={**os.environ, "CARGO_TARGET_DIR": os.path.join(ROOT, "target/bench")})
    if not os.path.isfile(S3S_FS):
        sys.exit(f"s3s-fs not found at {S3S_FS}: run scripts/install-tools.sh")
    tmp = tempfile.mkdtemp(prefix="kvtier-https-bench-")
    procs = []
    try:
        ca, cert, key = certificates(tmp)
        bucket = "kvbench"
        sink_port, fs_port = free_port(), free_port()
        sink = subprocess.Popen([SINK, "--port", str(sink_port), "--bucket", bucket],
                                stdout=subprocess.DEVNULL)
        procs.append(sink)
        root = os.path.join(tmp, "fs")
        os.makedirs(os.path.join(root, bucket))
        fs = subprocess.Popen([S3S_FS, "--host", "127.0.0.1", "--port", str(fs_port),
                               "--access-key", ACCESS, "--secret-key", SECRET, root],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(fs)
        wait_port(sink_port, sink, "sink")
        wait_port(fs_port, fs, "s3s-fs")
        ports = {
            "sink": (sink_port, start_relay(sink_port, cert, key, procs)),
            "s3s-fs": (fs_port, start_relay(fs_port, cert, key, procs)),
        }
        results = {}
        for rep in range(args.reps):
            for server in ports:
                chosen = [m for m in MODES if m in args.modes.split(",")]
                k = rep % len(chosen)
                for mode in chosen[k:] + chosen[:k]:
                    r = bench(args, server, mode, ports, ca, bucket)
                    print(f"rep {rep} {server:6} {mode:13} {r['mib_s']:8.0f} MiB/s "
                          f"{r['cpu']:6.3f} CPU-s/GiB direct={r['direct']} fallbacks={r['fallbacks']}",
                          file=sys.stderr)
                    results.setdefault((server, mode), []).append(r)
        print(f"\n{args.block_size} blocks, {args.blocks} per load, {args.concurrency} in flight, "
              f"medians of {args.reps}; {os.cpu_count()} cores shared by client, relay and server\n")
        print("| server | load path | MiB/s | client CPU-s/GiB | CPU vs plain direct | MiB/s vs https general |")
        print("|---|---|---:|---:|---:|---:|")
        for server in ports:
            ran = [m for m in MODES if (server, m) in results]
            med = {m: (statistics.median(r["mib_s"] for r in results[(server, m)]),
                       statistics.median(r["cpu"] for r in results[(server, m)])) for m in ran}
            ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"
            for m in ran:
                print(f"| {server} | {m} | {med[m][0]:.0f} | {med[m][1]:.3f} | "
                      f"{ratio(med[m][1], med.get('plain-direct', (0, 0))[1])} | "
                      f"{ratio(med[m][0], med.get('https-general', (0, 0))[0])} |")
            bad = [r for m in ran for r in results[(server, m)]
                   if r["fallbacks"] or (m == "https-general") != (r["direct"] == 0)]
            if bad:
                print(f"warning: {server}: unexpected direct-path counters: {bad}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
