"""bench/comparisons.py: every comparison of bench/, in one place.

Read by bench/run.py (which driver a name starts, with which options), and by
bench/report.py, which writes from it bench/README.md's table of comparisons,
bench/results/INDEX.md (the current result file of each) and docs/benchmarks.md (one section
per heading, with the tables of the current result files). Only the standard library.

A comparison:
  name       what `bench/run.py NAME` takes
  question   what it answers (bench/README.md's table)
  heading    its section of docs/benchmarks.md (stable: the project's README links to them);
             comparisons sharing a heading share the section, in this order
  title      its subsection there, when it shares one
  measures   what it measures, in words (no measured number is ever typed here or in the
             docs: they come from the result files)
  driver     the program, relative to the checkout, and the interpreter it needs:
             "python3" (any), "tools/venv" (the test tools' venv: vLLM, SGLang, pytest)
  preset     the options that reproduce the published run (options given to run.py come
             after them, so they win)
  minutes    how long the published run takes on a 2-core machine, after the builds
  results    the current result files under bench/results, the report first
  render     how bench/report.py shows the report: "compare" (bench/compare's report:
             client pivot tables, targets, existence; ``sections`` picks some, ``headline``
             the block size and concurrency shown first), "markdown" (the file as it is),
             "soak" (its summary, without the samples), "scheduler" (bench/scheduler_cost.py's
             JSON as tables: CPU per step, per call, the targets)
  chart      a chart under bench/results shown below the tables
  readme     tables of the report (indexes, from 0) that the project's README.md carries,
             between the marker lines `<!-- bench NAME: begin ... -->` and `<!-- bench NAME: end -->`
  note       what the command needs besides the preset

To publish a new run: run it (it rewrites its current files), run `python3 bench/report.py`,
commit both. To keep a superseded run, `git mv` it to bench/results/archive/ and say why in
ARCHIVED.
"""

COMPARISONS = [
    {
        "name": "side-by-side",
        "question": "How do kvtier, NIXL OBJ, awscrt and boto3 compare on the same S3 server, "
                    "same keys and same bytes?",
        "heading": "Side by side",
        "measures": "The same workload (same keys, same bytes, every loaded byte verified) through kvtier's C "
                    "ABI, NIXL OBJ (the engine under vLLM's obj tier), awscrt's S3Client and boto3, against an "
                    "in-memory S3 sink (a client's ceiling), s3s-fs and moto on loopback: throughput, client "
                    "and server CPU per GiB, latency, existence batches, and the issue's targets checked one "
                    "by one. Clients and servers share the machine's cores.",
        "driver": ["bench/compare"],
        "interpreter": "python3",
        "preset": ["--name", "full"],
        "minutes": "25-40",
        "results": ["full.md", "full.jsonl", "full.png"],
        "render": "compare",
        "headline": {"block": "2 MiB", "c": "16"},
        "chart": "full.png",
    },
    {
        "name": "rcvlowat",
        "question": "What does waking a load once 256 KiB are buffered (SO_RCVLOWAT) save?",
        "heading": "Side by side",
        "title": "SO_RCVLOWAT on and off",
        "measures": "kvtier's loads on the direct path with SO_RCVLOWAT (kvtier) and a build without it "
                    "(kvtier-base, through `--kvtier-lib base=DIR`), beside NIXL OBJ, in one run.",
        "driver": ["bench/compare"],
        "interpreter": "python3",
        "preset": ["--servers", "sink,s3sfs", "--sizes", "2M", "--concurrency", "16,64", "--clients", "kvtier,nixl",
                   "--reps", "3", "--name", "lowat"],
        "note": "Add `--kvtier-lib base=DIR`, DIR holding a libkvtier.so.0 built without SO_RCVLOWAT.",
        "minutes": "3",
        "results": ["lowat.md", "lowat.jsonl", "lowat.png"],
        "render": "compare",
        "sections": ["pivot"],
    },
    {
        "name": "soak",
        "question": "Does kvtier's resident memory stay flat over a long run?",
        "heading": "Soak",
        "measures": "`kvtier bench` against s3s-fs round after round, every loaded byte verified, the "
                    "process's resident memory sampled all along.",
        "driver": ["bench/compare"],
        "interpreter": "python3",
        "preset": ["--soak", "600"],
        "minutes": "11",
        "results": ["soak.md"],
        "render": "soak",
    },
    {
        "name": "ranges",
        "question": "What do blocks moved as many ranges (a layer-first pool) cost against contiguous blocks?",
        "heading": "Ranges",
        "measures": "`kvtier bench --ranges-per-block N`: every block moved as N ranges in N regions (a "
                    "layer-first pool) through the range calls, against the contiguous pool calls (N = 1), and "
                    "the same ranges laid side by side in one region (adjacent: what the ranges cost without "
                    "the scattered memory), on the local store in memory and the in-memory S3 sink, each run "
                    "on an empty store, interleaved, every byte verified.",
        "driver": ["bench/ranges.py"],
        "interpreter": "python3",
        "preset": ["--reps", "7"],
        "minutes": "4",
        "results": ["ranges.md"],
        "render": "markdown",
    },
    {
        "name": "encryption",
        "question": "What does encryption at rest cost in throughput and CPU?",
        "heading": "Encryption at rest",
        "measures": "`kvtier bench` with and without an `encryption` keyring (AES-256-GCM), on the local store "
                    "in memory and the in-memory S3 sink, interleaved, every byte verified.",
        "driver": ["bench/encryption.py"],
        "interpreter": "python3",
        "preset": ["--reps", "5"],
        "minutes": "2",
        "results": ["encryption.md"],
        "render": "markdown",
    },
    {
        "name": "at-latency",
        "question": "How do existence batches and large stores and loads behave at a remote store's round "
                    "trip?",
        "heading": "At a remote store's latency",
        "title": "kvtier alone",
        "measures": "kvtier through the shaper (bench/shaper.rs: a round trip on every exchange, one more on a "
                    "new connection, each connection's bandwidth capped) in front of s3s-fs: `check_now` "
                    "batches on new and on pooled connections with two `max_inflight_lookups`, and large "
                    "stores and loads with and without parts, every byte compared.",
        "driver": ["bench/at_latency.py"],
        "interpreter": "python3",
        "preset": ["--reps", "10", "--connection-mbps", "25"],
        "minutes": "5",
        "results": ["latency.md"],
        "render": "markdown",
    },
    {
        "name": "latency-matrix",
        "question": "How do kvtier, NIXL OBJ and awscrt compare at a remote store's round trip?",
        "heading": "At a remote store's latency",
        "title": "Side by side with the peers",
        "measures": "`bench/compare --latency RTT --connection-mbps MBPS` at round trips of 0, 20, 40 and 50 ms "
                    "and connections capped at 25 and 100 MB/s: s3s-fs behind the shaper, 2 and 32 MiB objects, "
                    "16 jobs in flight, stores, loads and an existence batch, every byte verified; awscrt with "
                    "its default parts, kvtier with its defaults; the targets checked cell by cell.",
        "driver": ["bench/latency_matrix.py"],
        "interpreter": "python3",
        "preset": [],
        "minutes": "40",
        "results": ["latency-matrix.md", "latency-matrix.png"]
                   + [f"latency-matrix-{mbps}mbps-{rtt}.{ext}" for mbps in (25, 100) for rtt in (0, 20, 40, 50)
                      for ext in ("md", "jsonl", "png")],
        "render": "markdown",
        "chart": "latency-matrix.png",
    },
    {
        "name": "link-40ms-25mbps",
        "question": "Where the link caps each connection, do parts chosen from the link close the gap to awscrt?",
        "heading": "At a remote store's latency",
        "title": "A capped link: 40 ms, 25 MB/s a connection",
        "measures": "`bench/compare --latency 40 --connection-mbps 25`: 2 MiB objects, 16 jobs in flight, kvtier "
                    "with its defaults (parts decided from what its own requests measure) beside NIXL OBJ and "
                    "awscrt, every byte verified; the cell of the latency matrix where kvtier trailed most.",
        "driver": ["bench/compare"],
        "interpreter": "python3",
        "preset": ["--latency", "40", "--connection-mbps", "25", "--sizes", "2M", "--concurrency", "16",
                   "--servers", "s3sfs", "--clients", "kvtier,nixl,awscrt", "--reps", "2",
                   "--name", "link-40ms-25mbps"],
        "minutes": "4",
        "results": ["link-40ms-25mbps.md", "link-40ms-25mbps.jsonl", "link-40ms-25mbps.png"],
        "render": "compare",
        "sections": ["pivot"],
    },
    {
        "name": "loopback-16m",
        "question": "Do blocks up to 16 MiB still go as one request on loopback, as fast as before parts?",
        "heading": "At a remote store's latency",
        "title": "Loopback, 16 MiB blocks",
        "measures": "The loopback comparison's 16 MiB rows again, kvtier against awscrt on the sink and "
                    "s3s-fs: large blocks stay one PUT by default.",
        "driver": ["bench/compare"],
        "interpreter": "python3",
        "preset": ["--sizes", "16M", "--concurrency", "4,16", "--servers", "sink,s3sfs", "--clients",
                   "kvtier,awscrt", "--reps", "2", "--name", "loopback-16m"],
        "minutes": "2",
        "results": ["loopback-16m.md", "loopback-16m.jsonl", "loopback-16m.png"],
        "render": "compare",
        "sections": ["pivot"],
    },
    {
        "name": "loopback-link",
        "question": "On loopback, with parts decided from the link, is kvtier as fast as with the fixed parts before?",
        "heading": "At a remote store's latency",
        "title": "Loopback, parts from the link against the fixed rule",
        "measures": "kvtier with its defaults beside the library built before parts followed the link (the fixed "
                    "rule: loads over 8 MiB in 8 MiB ranges, stores of 32 MiB and up in 16 MiB parts) and awscrt, on the "
                    "sink and s3s-fs without the shaper, 2 and 16 MiB blocks, 4 and 16 in flight, interleaved in "
                    "one run, every byte verified.",
        "driver": ["bench/compare"],
        "interpreter": "python3",
        "preset": ["--servers", "sink,s3sfs", "--sizes", "2M,16M", "--concurrency", "4,16", "--clients",
                   "kvtier,awscrt", "--reps", "3", "--name", "loopback-link"],
        "note": "Add `--kvtier-lib fixed-parts=DIR`, DIR holding a libkvtier.so.0 built at f4c04a3 (`git worktree "
                "add --detach DIR-src f4c04a3`, `cargo build --release --lib` there).",
        "minutes": "12",
        "results": ["loopback-link.md", "loopback-link.jsonl", "loopback-link.png"],
        "render": "compare",
        "sections": ["pivot"],
    },
    {
        "name": "sglang",
        "question": "How does kvtier's SGLang backend compare with SGLang's own storage backends?",
        "heading": "SGLang backends",
        "measures": "kvtier's SGLang HiCache backend, SGLang's `HiCacheFile` (local directory) and its "
                    "`SeaweedFSStore` (boto3; on s3s-fs and the in-memory sink), through the same backend calls "
                    "on the same pages of SGLang's own host pool, in both layouts, every page read back "
                    "compared byte for byte.",
        "driver": ["bench/sglang_compare.py"],
        "interpreter": "tools/venv",
        "preset": [],
        "minutes": "5-10",
        "results": ["sglang.md"],
        "render": "markdown",
    },
    {
        "name": "lmcache",
        "question": "How does kvtier's LMCache adapter compare with LMCache's own s3 adapter?",
        "heading": "LMCache L2 adapters",
        "measures": "kvtier's LMCache L2 adapter and LMCache 0.5.6's own `s3` L2 adapter (awscrt) on the same "
                    "s3s-fs process, through LMCache's own `StorageManager` built from the `--l2-adapter` JSON, "
                    "the same Llama-3.1-8B-shaped 256-token chunks, each adapter in a process of its own "
                    "(interleaved runs, medians), beside LMCache's in-memory `mock` adapter as a ceiling: chunks "
                    "stored and loaded (prefetch into a fresh L1) per second, client CPU per GiB, lookup latency, "
                    "every loaded byte compared.",
        "driver": ["bench/lmcache_compare.py"],
        "interpreter": "tools/venv",
        "preset": [],
        "note": "LMCache's `s3` adapter needs awscrt, which tools/venv lacks: `tools/venv/bin/python -m pip install "
                "--target /tmp/lmc-bench-awscrt awscrt` (or `--awscrt-site DIR`).",
        "minutes": "7",
        "results": ["lmcache.md"],
        "render": "markdown",
        "readme": [1, 2],
    },
    {
        "name": "local",
        "question": "How does the local store compare with vLLM's own fs tier?",
        "heading": "Local store against vLLM's fs tier",
        "measures": "The same chunks stored, looked up and loaded through vLLM's `TieringOffloadingManager` "
                    "with kvtier's tier and with vLLM's `fs` tier, buffered and O_DIRECT, beside a naive Python "
                    "loop and `kvtier bench`, every loaded byte verified, with the CPU of each thread group.",
        "driver": ["bench/local_compare.py"],
        "interpreter": "tools/venv",
        "preset": [],
        "minutes": "2-4",
        "results": ["local-latest.md", "local-latest.jsonl"],
        "render": "markdown",
    },
    {
        "name": "scheduler",
        "question": "What does the tier cost vLLM's scheduler thread per step, beside vLLM's own fs tier and its "
                    "obj tier over NIXL?",
        "heading": "Scheduler-thread cost in vLLM",
        "measures": "kvtier's `KvtierTier` on a local directory beside vLLM 0.33's own `fs` tier, and on s3s-fs "
                    "beside vLLM's `obj` tier (NIXL's OBJ plugin, on the CPU) on the same s3s-fs, each driven through "
                    "vLLM's real `TieringOffloadingManager` (built by vLLM's factory) with the same scheduler steps: "
                    "new keys looked up and asked again until answered, stores cascaded to the tier, promotions, then "
                    "the step's end, `take_events` and `get_stats`, 64 KiB chunks. Measured is the scheduler "
                    "thread's CPU (`time.thread_time_ns`) around the manager's calls, per step and, in instrumented "
                    "runs, per tier call, and the steps until a lookup is answered.",
        "driver": ["bench/scheduler_cost.py"],
        "interpreter": "tools/venv",
        "preset": ["--tiers", "kvtier,fs,kvtier-s3,obj"],
        "minutes": "8",
        "note": "The kvtier-s3 and obj tiers need s3s-fs and nixl-cu12 (scripts/install-tools.sh installs both).",
        "results": ["scheduler-cost.json"],
        "render": "scheduler",
    },
    {
        "name": "caller",
        "question": "What does the engine's thread pay per key to submit jobs and poll their results?",
        "heading": "Scheduler-thread cost in vLLM",
        "title": "The C caller's thread",
        "measures": "`kvtier bench` on the local store in /dev/shm, one key per job, 2 MiB blocks, 16 in flight, with "
                    "the contiguous pool calls and with each block as 64 ranges in 64 regions, interleaved: the CPU "
                    "of the thread calling submit and poll per key (less its clock reads), every byte verified.",
        "driver": ["bench/caller_cost.py"],
        "interpreter": "python3",
        "preset": [],
        "minutes": "3",
        "note": "Where the 64-range rows miss, the cost is the bookkeeping of held memory: each range is checked "
                "against the ranges that jobs not yet polled hold in its region, recorded there, and released at "
                "poll. A build that skipped it (an experiment only: without it a load could write bytes another "
                "job reads) cost about half as much per key in the same interleaved runs.",
        "results": ["caller-cost.md"],
        "render": "markdown",
    },
    {
        "name": "https",
        "question": "What do HTTPS loads cost on the direct path against the general client and plain http?",
        "heading": "HTTPS loads",
        "measures": "`kvtier bench`'s load phase from the in-memory sink and s3s-fs three ways: plain http on "
                    "the direct path, https on the direct path, and https through the general client "
                    "(`direct_http` off); the project's TLS relay (rustls) terminates TLS in front of each "
                    "server. Client, relay and server share the machine's cores.",
        "driver": ["bench/https_loads.py"],
        "interpreter": "python3",
        "preset": ["--reps", "2"],
        "minutes": "3",
        "results": ["https_loads.md"],
        "render": "markdown",
    },
    {
        "name": "rgw",
        "question": "How do the clients compare on Ceph RGW?",
        "heading": "Ceph RGW",
        "measures": "bench/compare's quick run against a one-node Ceph RGW (memstore OSD, "
                    "scripts/ceph-rgw.sh) as the server.",
        "driver": ["bench/compare"],
        "interpreter": "python3",
        "preset": ["--quick", "--servers", "rgw", "--reps", "2", "--name", "rgw-quick"],
        "minutes": "3-5",
        "results": ["rgw-quick.md", "rgw-quick.jsonl", "rgw-quick.png"],
        "render": "compare",
        "sections": ["pivot", "targets", "existence"],
    },
    {
        "name": "uring",
        "question": "Would io_uring beat the local store's thread pool?",
        "heading": "io_uring against the thread pool",
        "measures": "The local store's data path (a block per thread, positional reads and writes in pieces, "
                    "a pool of threads) against io_uring from one thread with as many pieces in flight, "
                    "buffered and O_DIRECT, data moves only, every byte compared; and a lookup batch as "
                    "`fstatat` one by one against `IORING_OP_STATX` together.",
        "driver": ["bench/uring.py"],
        "interpreter": "python3",
        "preset": [],
        "minutes": "3",
        "results": ["uring.md"],
        "render": "markdown",
    },
    {
        "name": "fleet-soak",
        "question": "Do engines, gc and eviction on one namespace keep every byte right for a long run?",
        "heading": None,
        "measures": "The fleet of python/tests/test_fleet_soak.py run longer on each store: two vLLM engines, a "
                    "C engine, an evicting tier and `kvtier gc` on one namespace, one engine killed, the server "
                    "taken down once; prints a summary line per store and fails on any problem.",
        "driver": ["bench/fleet_soak.py"],
        "interpreter": "tools/venv",
        "preset": [],
        "minutes": "8",
        "results": [],
        "render": None,
    },
]

# Result files moved to bench/results/archive/ (superseded runs), and why.
ARCHIVED = {
    "scheduler-cost-before.json": "bench/scheduler_cost.py on the vLLM adapter before its scheduler-thread work "
                                  "(a library call per lookup, per poll, per event take): the baseline of "
                                  "scheduler-cost.json",
    "latest.md": "bench/compare's default output name; this run is full.md's (the same run, kept as full.*)",
    "latest.jsonl": "the raw measurements of latest.md, the same as full.jsonl",
    "latest.png": "the chart of latest.md, the same as full.png",
    "latency20.md": "a first `bench/compare --latency 20` (the sink, one repetition), before parts followed the "
                    "transfer lane; the published runs at a round trip are latency-matrix-*",
    "latency20.jsonl": "the raw measurements of latency20.md",
    "latency20.png": "the chart of latency20.md",
    "latency20-s3sfs.md": "the same first run on s3s-fs; superseded by latency-matrix-20.md",
    "latency20-s3sfs.jsonl": "the raw measurements of latency20-s3sfs.md",
    "latency20-s3sfs.png": "the chart of latency20-s3sfs.md",
}
# The latency matrix before parts and connections followed the link (100 MB/s links only).
ARCHIVED.update({
    f"latency-matrix-{rtt}.{ext}": (f"the latency matrix's {rtt} ms run at 100 MB/s a connection, before kvtier "
                                    "decided parts from the link" if ext == "md" else
                                    f"the {'raw measurements' if ext == 'jsonl' else 'chart'} of "
                                    f"latency-matrix-{rtt}.md")
    for rtt in (0, 5, 20, 50) for ext in ("md", "jsonl", "png")})
ARCHIVED["latency-matrix-before-link.md"] = ("the latency matrix's summary before kvtier decided parts from the "
                                             "link (100 MB/s a connection, round trips 0, 5, 20, 50 ms)")

# Drivers `bench/run.py` also starts by their own name, with no preset (their own defaults).
DRIVERS = {
    "compare": (["bench/compare"], "python3"),
    "ranges.py": (["bench/ranges.py"], "python3"),
    "encryption.py": (["bench/encryption.py"], "python3"),
    "at_latency.py": (["bench/at_latency.py"], "python3"),
    "latency_matrix.py": (["bench/latency_matrix.py"], "python3"),
    "local_compare.py": (["bench/local_compare.py"], "tools/venv"),
    "sglang_compare.py": (["bench/sglang_compare.py"], "tools/venv"),
    "lmcache_compare.py": (["bench/lmcache_compare.py"], "tools/venv"),
    "scheduler_cost.py": (["bench/scheduler_cost.py"], "tools/venv"),
    "caller_cost.py": (["bench/caller_cost.py"], "python3"),
    "https_loads.py": (["bench/https_loads.py"], "python3"),
    "uring.py": (["bench/uring.py"], "python3"),
    "fleet_soak.py": (["bench/fleet_soak.py"], "tools/venv"),
}


def by_name(name):
    """The comparison called ``name``, or None."""
    return next((c for c in COMPARISONS if c["name"] == name), None)
