#!/usr/bin/env python3
"""bench/at_latency.py: existence batches and large loads at a remote store's latency.

    python3 bench/at_latency.py         # 0, 5, 20, 50 ms (any python3: it needs only python/kvtier)
    python3 bench/at_latency.py --rtt 20 --reps 50
    bench/run.py at-latency             # the published run

s3s-fs (tools/bin, from scripts/install-tools.sh) behind the project's shaping proxy (the
`shaper` example, bench/shaper.rs): every exchange waits a round trip, a new connection's
first request one more. Half of 256 keys are stored; for each round trip, a fresh tier
through the shaper asks `check_now` for all 256 (every verdict checked), once on new
connections (cold) and `--reps` times more (warm: its pooled connections), with the
configured `max_inflight_lookups` (256, the default) and with 64 (the old default) side by
side. Prints batch times in milliseconds and in round trips, the most connections open
at once, and the shaper's own CPU.

Stores and loads: 8 objects of 32 MiB, 4 jobs in flight, through the same link capped at
`--connection-mbps` (100 MB/s) a connection, with parts (`store_part_bytes`, 16 MiB by
default, and 8 MiB: multipart uploads; `load_part_bytes`, 8 MiB by default: ranged GETs)
and with one request per object (0) side by side: MiB/s, the connections opened, and the client's CPU
per GiB. Every byte is compared: loaded ones with what was stored, stored ones by reading
them back straight from the server. Writes bench/results/latency.md.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import common

common.use_package()
import kvtier  # noqa: E402

NAMESPACE = "bench_lookups_r0"
BATCH = 256
BLOCK = 4096

log = common.logger("at-latency")


def store_config(endpoint, **extra):
    return {"store": common.s3_store(endpoint), "prefix": "kv", "namespace": NAMESPACE, **extra}


def key(i):
    return i.to_bytes(8, "big") * 4 + (0).to_bytes(4, "little")


def store_half(endpoint):
    stored = list(range(0, BATCH, 2))
    with kvtier.Tier(store_config(endpoint)) as tier:
        pool = bytearray(os.urandom(len(stored) * BLOCK))
        tier.register_memory(pool, BLOCK)
        for job, first in enumerate(range(0, len(stored), 16)):
            ids = stored[first:first + 16]
            tier.submit_store(job, list(range(first, first + len(ids))), [key(i) for i in ids])
        done = []
        deadline = time.monotonic() + 60
        while len(done) < (len(stored) + 15) // 16:
            done += tier.poll()
            assert time.monotonic() < deadline, "stores did not finish"
            time.sleep(0.01)
        assert all(o.ok for o in done), [o for o in done if not o.ok]


def run(server, rtt_ms, inflight, reps):
    shaper, shaped = common.start_shaper(server.port, rtt_ms)
    keys = [key(i) for i in range(BATCH)]
    want = [kvtier.LookupResult.HIT if i % 2 == 0 else kvtier.LookupResult.MISS for i in range(BATCH)]
    times = []
    try:
        with kvtier.Tier(store_config(shaped, max_inflight_lookups=inflight)) as tier:
            before = common.shaper_stats(shaper)
            for _ in range(reps + 1):
                t0 = time.perf_counter()
                got = tier.check_now(keys, timeout=60)
                times.append(time.perf_counter() - t0)
                assert got == want, "a verdict differs from the store"
            after = common.shaper_stats(shaper)
    finally:
        common.stop_shaper(shaper)
    cold, warm = times[0] * 1e3, sorted(t * 1e3 for t in times[1:])
    p = lambda q: warm[min(len(warm) - 1, int(q * len(warm)))]  # noqa: E731
    in_rtt = (lambda ms: f"{ms / rtt_ms:.1f}") if rtt_ms else (lambda ms: "-")
    return {"rtt_ms": rtt_ms, "inflight": inflight, "cold_ms": cold, "cold_rtt": in_rtt(cold),
            "p50_ms": statistics.median(warm), "p50_rtt": in_rtt(statistics.median(warm)), "p99_ms": p(0.99),
            "most_open": after["most_open"], "accepted": after["accepted"] - before["accepted"],
            "shaper_cpu_s": after["cpu_s"] - before["cpu_s"]}


LARGE = 32 << 20
LARGE_COUNT = 8


def wait_outcomes(tier, n, deadline_s=300):
    done, deadline = [], time.monotonic() + deadline_s
    while len(done) < n:
        done += tier.poll()
        assert time.monotonic() < deadline, "jobs did not finish"
        time.sleep(0.002)
    return done


def store_large(endpoint):
    data = bytearray(os.urandom(LARGE * LARGE_COUNT))
    with kvtier.Tier(store_config(endpoint)) as tier:
        tier.register_memory(data, LARGE)
        for i in range(LARGE_COUNT):
            tier.submit_store(i, [i], [key(1000 + i)])
        assert all(o.ok for o in wait_outcomes(tier, LARGE_COUNT))
    return data


def parts_label(op, part_bytes):
    if part_bytes is None:
        return "8 MiB (default)" if op == "load" else "16 MiB (default)"
    if part_bytes == 0:
        return f"off (one {'GET' if op == 'load' else 'PUT'})"
    return f"{part_bytes >> 20} MiB"


def run_large(server, stored, rtt_ms, mbps, part_bytes, op, key_base, in_flight=4):
    """LARGE_COUNT stores or loads (`op`) of 32 MiB through the shaper, `in_flight` at once,
    with parts of the default size (`part_bytes` None) or one request per object (0). Stores
    go to fresh keys from `key_base` and are read back straight from the server afterwards."""
    shaper, shaped = common.start_shaper(server.port, rtt_ms, mbps)
    config = store_config(shaped)
    if part_bytes is not None:
        config["store"][f"{op}_part_bytes"] = part_bytes
    base = 1000 if op == "load" else key_base
    try:
        with kvtier.Tier(config) as tier:
            memory = bytearray(LARGE * LARGE_COUNT) if op == "load" else stored
            tier.register_memory(memory, LARGE)
            submit = tier.submit_load if op == "load" else tier.submit_store
            before, t0, c0 = common.shaper_stats(shaper), time.perf_counter(), common.cpu_now()
            submitted = finished = 0
            while finished < LARGE_COUNT:
                while submitted < LARGE_COUNT and submitted - finished < in_flight:
                    submit(submitted, [submitted], [key(base + submitted)])
                    submitted += 1
                outcomes = wait_outcomes(tier, 1)
                assert all(o.ok for o in outcomes), outcomes
                finished += len(outcomes)
            took, cpu = time.perf_counter() - t0, common.cpu_now() - c0
            after = common.shaper_stats(shaper)
    finally:
        common.stop_shaper(shaper)
    if op == "store":
        with kvtier.Tier(store_config(server.endpoint)) as tier:
            memory = bytearray(LARGE * LARGE_COUNT)
            tier.register_memory(memory, LARGE)
            for i in range(LARGE_COUNT):
                tier.submit_load(i, [i], [key(base + i)])
            assert all(o.ok for o in wait_outcomes(tier, LARGE_COUNT))
    assert memory == stored, f"a byte read back after the {op}s differs from the block"
    gib = LARGE * LARGE_COUNT / (1 << 30)
    return {"op": op, "rtt_ms": rtt_ms,
            "parts": parts_label(op, part_bytes),
            "mib_s": LARGE * LARGE_COUNT / (1 << 20) / took, "per_op_s": took * in_flight / LARGE_COUNT,
            "connections": after["accepted"] - before["accepted"], "cpu_s_per_gib": cpu / gib}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt", type=int, nargs="*", default=[0, 5, 20, 50], help="round trips, ms")
    ap.add_argument("--reps", type=int, default=20, help="warm batches per setting")
    ap.add_argument("--connection-mbps", type=float, default=100, help="per-connection cap for the loads, MB/s")
    ap.add_argument("--out", default=os.path.join(common.RESULTS, "latency.md"))
    ap.add_argument("--no-build", action="store_true", help="use the built library and shaper (or KVTIER_LIBRARY, "
                    "KVTIER_SHAPER) without running cargo")
    args = ap.parse_args()
    common.build("lib", "shaper", skip=args.no_build)
    with tempfile.TemporaryDirectory() as data:
        server = common.Server("s3sfs", log_dir=data, root=os.path.join(data, "s3s-fs"))
        try:
            store_half(server.endpoint)
            rows = []
            for rtt in args.rtt:
                for inflight in (256, 64):
                    row = run(server, rtt, inflight, args.reps)
                    log(json.dumps(row))
                    rows.append(row)
            stored = store_large(server.endpoint)
            large = []
            for op in ("store", "load"):
                for rtt in args.rtt:
                    for part_bytes in ((None, 8 << 20, 0) if op == "store" else (None, 0)):
                        row = run_large(server, stored, rtt, args.connection_mbps, part_bytes, op,
                                        key_base=2000 + 100 * len(large))
                        log(json.dumps(row))
                        large.append(row)
        finally:
            server.stop()
    head = ("| round trip | max_inflight_lookups | cold batch ms (round trips) | warm p50 ms (round trips) | "
            "warm p99 ms | connections open at most | shaper CPU s |\n|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['rtt_ms']} ms | {r['inflight']}{' (default)' if r['inflight'] == 256 else ''} | "
        f"{r['cold_ms']:.0f} ({r['cold_rtt']}) | {r['p50_ms']:.1f} ({r['p50_rtt']}) | {r['p99_ms']:.1f} | "
        f"{r['most_open']} | {r['shaper_cpu_s']:.2f} |\n" for r in rows)
    text = (f"256-key `check_now` batches (half present) against s3s-fs behind bench/shaper.rs; "
            f"{args.reps} warm batches per row.\n\n" + head + body)
    text += (f"\n{LARGE_COUNT} stores and loads of 32 MiB, 4 in flight, {args.connection_mbps:g} MB/s a connection:\n\n"
             "| op | round trip | parts | MiB/s | seconds per job | connections opened | client CPU s/GiB |\n"
             "|---|---|---|---|---|---|---|\n")
    text += "".join(f"| {r['op']} | {r['rtt_ms']} ms | {r['parts']} | {r['mib_s']:.0f} | {r['per_op_s']:.2f} | "
                    f"{r['connections']} | {r['cpu_s_per_gib']:.2f} |\n" for r in large)
    common.publish(text, args.out)


if __name__ == "__main__":
    main()
