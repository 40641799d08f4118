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
  bench/run.py https                 # the published run (bench/comparisons.py)

Writes bench/results/https_loads.md (--out).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import common

MODES = ["plain-direct", "https-direct", "https-general"]
SERVERS = {"sink": "sink", "s3s-fs": "s3sfs"}  # as this table names them -> common.Server's kinds
log = common.logger("https")


def times(a, b):
    return common.fmt(common.ratio(a, b), "{:.2f}x", "-")


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
    p = subprocess.Popen([common.program("tls-relay"), str(upstream), cert, key], stdout=subprocess.PIPE, text=True)
    procs.append(p)
    line = p.stdout.readline().strip()
    if not line.startswith("listening on "):
        sys.exit(f"tls-relay: {line!r}")
    return int(line.rsplit(":", 1)[1])


def bench(args, server, mode, ports, ca):
    https = mode != "plain-direct"
    store = common.s3_store(ports[server][1 if https else 0], direct_http=mode != "https-general")
    if https:
        store.update(scheme="https", ca_bundle=ca)
    report = common.kvtier_bench({"store": store, "dedup": "off"}, "--workload", "store,load",
                                 "--block-size", args.block_size, "--blocks", str(args.blocks),
                                 "--concurrency", str(args.concurrency))
    load = common.phases(report)["load"]
    return {"mib_s": load["mib_s"], "cpu": load["cpu_s_per_gib"],
            "direct": report["direct_requests"], "fallbacks": report["direct_fallbacks"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--block-size", default="2M")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--no-build", action="store_true", help="use the built kvtier, tls-relay and sink (or KVTIER_CLI, "
                    "KVTIER_TLS_RELAY, KVTIER_BENCH_SINK) without running cargo")
    ap.add_argument("--out", default="https_loads.md", help="the table's file (a name under bench/results, or a path)")
    args = ap.parse_args()
    common.build("cli", "tls-relay", "sink", skip=args.no_build)
    common.program("s3s-fs")  # exits naming scripts/install-tools.sh when it is missing
    tmp = tempfile.mkdtemp(prefix="kvtier-https-bench-")
    procs, servers = [], []
    try:
        ca, cert, key = certificates(tmp)
        ports = {}
        for name, kind in SERVERS.items():
            server = common.Server(kind, log_dir=tmp, root=os.path.join(tmp, "fs") if kind == "s3sfs" else None)
            servers.append(server)
            ports[name] = (server.endpoint, f"127.0.0.1:{start_relay(server.port, cert, key, procs)}")
        results = {}
        chosen = [m for m in MODES if m in args.modes.split(",")]
        for rep in range(args.reps):
            for server in ports:
                k = rep % len(chosen)
                for mode in chosen[k:] + chosen[:k]:
                    r = bench(args, server, mode, ports, ca)
                    log(f"rep {rep} {server:6} {mode:13} {r['mib_s']:8.0f} MiB/s "
                        f"{r['cpu']:6.3f} CPU-s/GiB direct={r['direct']} fallbacks={r['fallbacks']}")
                    results.setdefault((server, mode), []).append(r)
        lines = ["", f"{args.block_size} blocks, {args.blocks} per load, {args.concurrency} in flight, "
                 f"medians of {args.reps}; {os.cpu_count()} cores shared by client, relay and server", "",
                 "| server | load path | MiB/s | client CPU-s/GiB | CPU vs plain direct | MiB/s vs https general |",
                 "|---|---|---:|---:|---:|---:|"]
        for server in ports:
            ran = [m for m in MODES if (server, m) in results]
            med = {m: (statistics.median(r["mib_s"] for r in results[(server, m)]),
                       statistics.median(r["cpu"] for r in results[(server, m)])) for m in ran}
            plain, general = med.get("plain-direct", (0, 0)), med.get("https-general", (0, 0))
            for m in ran:
                lines.append(f"| {server} | {m} | {med[m][0]:.0f} | {med[m][1]:.3f} | {times(med[m][1], plain[1])} | "
                             f"{times(med[m][0], general[0])} |")
            bad = [r for m in ran for r in results[(server, m)]
                   if r["fallbacks"] or (m == "https-general") != (r["direct"] == 0)]
            if bad:
                lines.append(f"warning: {server}: unexpected direct-path counters: {bad}")
        common.publish(lines, args.out)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        for server in servers:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
