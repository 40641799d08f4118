"""bench/common.py: what the benchmark drivers share, in one place.

Every driver under bench/ imports this module (and no other driver); nothing here runs a
benchmark. It imports only the standard library, so any interpreter can load it (the test
tools' venv, the bench venv, a bare python3).

- Paths and names: ``ROOT``, ``RESULTS``, the bench servers' bucket and credentials.
- The built programs (``program``) and their builds (``build``): libkvtier.so, the kvtier
  command line, the in-memory S3 sink, the ``shaper`` and ``tls-relay`` examples, s3s-fs.
  Each can be pointed at a prebuilt file with an environment variable (``PROGRAMS`` lists
  them), and is then never built.
- Servers on loopback: ``Server`` (the sink, s3s-fs, moto_server, Ceph RGW) and the shaper
  (``start_shaper``). Starting a server on a free port and waiting until it serves is
  python/tests/s3_servers.py's (the tests', ffi-tests' and interop tests' one copy), loaded
  here by its path (``test_support``): the benchmarks use the tests' support modules, never
  their test modules.
- Keys and data: the key and block-content rule every client of bench/compare shares
  (``mix``, ``key_hex``, ``object_name``, ``block_words``), the same as driver_kvtier.c.
- Runs and results: ``kvtier_bench`` (one `kvtier bench --json` run), ``fresh_store``,
  ``interleaved``, ``publish`` (write bench/results/NAME), and the numbers' formatting
  (``median``, ``fmt``, ``ratio``, ``parse_size``, ``size_label``) and CPU counters.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "results")
TESTS = os.path.join(ROOT, "python", "tests")
# KVTIER_BENCH_VENV: a bench venv elsewhere (where tools/ is shared and read-only).
BENCH_VENV = os.environ.get("KVTIER_BENCH_VENV") or os.path.join(ROOT, "tools", "bench-venv")
TOOLS_VENV = os.path.join(ROOT, "tools", "venv")
MIB = 1 << 20

# The bench's own servers: one bucket, these credentials (the sink takes any).
ACCESS_KEY, SECRET_KEY, REGION, BUCKET = "kvtier", "kvtier-secret", "us-east-1", "kvbench"


def logger(tag: str):
    """A function printing ``[HH:MM:SS tag] message`` on stderr."""

    def log(msg) -> None:
        print(f"[{time.strftime('%H:%M:%S')} {tag}] {msg}", file=sys.stderr, flush=True)

    return log


# ------------------------------------------------------------------------------------------
# The tests' support modules


def test_support(*names: str):
    """Loads python/tests/NAME.py for each name, in order, by its path, and returns the last
    module. Only support modules (s3_servers, c_programs, vllm_engine, fleet), never a
    test_*.py; a module is registered under its own name, so one loaded earlier satisfies a
    later one's ``import`` (fleet imports c_programs) and a module looking another up by name
    (fleet's outage finds s3_servers) finds it. python/tests is not put on sys.path."""
    module = None
    for name in names:
        if name.startswith("test_"):
            raise ValueError(f"{name}: the benchmarks use the tests' support modules, not their tests")
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, os.path.join(TESTS, f"{name}.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
    return module


def servers():
    """python/tests/s3_servers.py: free ports, starting a server until it serves, s3s-fs's,
    moto's and Ceph RGW's command lines."""
    return test_support("s3_servers")


def use_package(library: str | None = None) -> None:
    """Makes ``import kvtier`` find python/kvtier of this checkout, and the package load
    ``library``, else KVTIER_LIBRARY if set, else target/release/libkvtier.so (the package
    loads it at its first call, so it may be built after this)."""
    if library:
        os.environ["KVTIER_LIBRARY"] = library
    os.environ.setdefault("KVTIER_LIBRARY", PROGRAMS["lib"][1]())
    path = os.path.join(ROOT, "python")
    if path not in sys.path:
        sys.path.insert(0, path)


# ------------------------------------------------------------------------------------------
# Built programs


def target_dir() -> str:
    return os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")


def bench_target_dir() -> str:
    """The sink's own cargo target directory (it is a crate of its own, bench/sink)."""
    return os.path.join(target_dir(), "bench")


# name -> (environment variable that points at a prebuilt file, default path, how to get it)
PROGRAMS = {
    "lib": ("KVTIER_LIBRARY", lambda: os.path.join(target_dir(), "release", "libkvtier.so"),
            "cargo build --release --lib"),
    "cli": ("KVTIER_CLI", lambda: os.path.join(target_dir(), "release", "kvtier"),
            "cargo build --release --bin kvtier"),
    "sink": ("KVTIER_BENCH_SINK", lambda: os.path.join(bench_target_dir(), "release", "kvtier-bench-sink"),
             "CARGO_TARGET_DIR=target/bench cargo build --release --manifest-path bench/sink/Cargo.toml"),
    "shaper": ("KVTIER_SHAPER", lambda: os.path.join(target_dir(), "release", "examples", "shaper"),
               "cargo build --release --example shaper"),
    "tls-relay": ("KVTIER_TLS_RELAY", lambda: os.path.join(target_dir(), "release", "examples", "tls-relay"),
                  "cargo build --release --example tls-relay"),
    "uring-vs-threads": ("KVTIER_URING_VS_THREADS",
                         lambda: os.path.join(target_dir(), "release", "examples", "uring-vs-threads"),
                         "cargo build --release --example uring-vs-threads"),
    "s3s-fs": ("KVTIER_S3S_FS", lambda: os.path.join(ROOT, "tools", "bin", "s3s-fs"), "scripts/install-tools.sh"),
}


def program(name: str, explicit: str | None = None, required: bool = True) -> str:
    """The path of a built program: ``explicit``, else its environment variable, else where
    the build puts it. Exits with the way to get it when there is no such file (unless not
    ``required``: then the path it would have)."""
    variable, default, how = PROGRAMS[name]
    path = explicit or os.environ.get(variable) or default()
    if required and not os.path.isfile(path):
        sys.exit(f"{name} not found at {path}: {how}, or point {variable} at one")
    return os.path.abspath(path)


def build(*names: str, skip: bool = False) -> None:
    """Builds the named programs of PROGRAMS with cargo (quietly), but those an environment
    variable points at (prebuilt) and all of them with ``skip`` (a driver's --no-build)."""
    wanted = [n for n in names if not skip and not os.environ.get(PROGRAMS[n][0])]
    args = []
    for n in wanted:
        if n == "lib":
            args.append("--lib")
        elif n == "cli":
            args += ["--bin", "kvtier"]
        elif n in ("shaper", "tls-relay", "uring-vs-threads"):
            args += ["--example", n]
    if args:
        subprocess.run(["cargo", "build", "--release", "-q", *args], cwd=ROOT, check=True)
    if "sink" in wanted:
        manifest = os.path.join(BENCH, "sink", "Cargo.toml")
        subprocess.run(["cargo", "build", "--release", "-q", "--manifest-path", manifest],
                       cwd=ROOT, env=dict(os.environ, CARGO_TARGET_DIR=bench_target_dir()), check=True)
    if "s3s-fs" in wanted and not os.path.isfile(program("s3s-fs", required=False)):
        subprocess.run(["cargo", "install", "s3s-fs@0.14.1", "--features", "binary", "--locked", "--root",
                        os.path.join(ROOT, "tools")], cwd=ROOT, check=True)


# ------------------------------------------------------------------------------------------
# Servers


def free_port() -> int:
    return servers().free_port()


def scratch_dir(prefix: str) -> str:
    """A new directory on /dev/shm (memory: the device does not hide a client's cost), or in
    the temporary directory where there is none."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def proc_cpu(pid: int) -> float:
    """CPU seconds (user+sys, all threads) process ``pid`` has used so far; 0 if unknown."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class Server:
    """One S3 server of the bench on a free loopback port, serving ``BUCKET`` with the bench's
    credentials: ``sink`` (bench/sink, in memory), ``s3sfs`` (s3s-fs on a directory of its
    own, ``root`` or a new one on /dev/shm), ``moto`` (moto_server) or ``rgw`` (a Ceph cluster
    of three memstore OSDs, reached through its first gateway, scripts/ceph-rgw.sh). Each runs in a session of its own; ``stop`` ends it
    and removes the directory it was given or made. The bucket is created where the server
    does not make it from its directory (moto, RGW)."""

    def __init__(self, kind: str, log_dir: str | None = None, root: str | None = None, programs: dict | None = None):
        s3 = servers()
        self.kind, self.root = kind, None
        given = dict(programs or {})
        if kind == "rgw":
            rgw = s3.start_rgw(ACCESS_KEY, SECRET_KEY, start_new_session=True)
            self.proc, self.root, self.endpoint = rgw["process"], str(rgw["directory"]), rgw["endpoint"]
            self.port = int(self.endpoint.rsplit(":", 1)[1])
            self.log_path = os.path.join(self.root, "supervisor.out")
            self._create_bucket()
            return
        if kind == "sink":
            sink = program("sink", given.get("sink"))

            def argv(port):
                return [sink, "--host", "127.0.0.1", "--port", str(port), "--bucket", BUCKET,
                        "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]
        elif kind == "s3sfs":
            fs = program("s3s-fs", given.get("s3s-fs"))
            self.root = root or scratch_dir("kvbench-s3sfs-")
            os.makedirs(os.path.join(self.root, BUCKET), exist_ok=True)

            def argv(port):
                return s3.s3s_fs_argv(fs, port, self.root, ACCESS_KEY, SECRET_KEY)
        elif kind == "moto":
            moto = s3.find_program("moto_server", os.path.join(BENCH_VENV, "bin", "moto_server"),
                                   os.path.join(TOOLS_VENV, "bin", "moto_server"))

            def argv(port):
                return s3.moto_argv(moto, port)
        else:
            raise ValueError(kind)
        self.port, self.proc = s3.serve(argv, kind, log_dir, start_new_session=True)
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log_path = os.path.join(log_dir or tempfile.gettempdir(), f"kvtier-{kind}-{self.port}.log")
        if kind == "moto":
            self._create_bucket()

    def _create_bucket(self) -> None:
        import boto3  # the bench venv's and the test tools' venv have it
        from botocore.config import Config

        boto3.client("s3", endpoint_url=f"http://{self.endpoint}", aws_access_key_id=ACCESS_KEY,
                     aws_secret_access_key=SECRET_KEY, region_name=REGION,
                     config=Config(s3={"addressing_style": "path"})).create_bucket(Bucket=BUCKET)

    def store(self, endpoint: str | None = None, **extra) -> dict:
        """kvtier's store section for this server (or for ``endpoint`` in front of it)."""
        return s3_store(endpoint or self.endpoint, **extra)

    def cpu(self) -> float:
        """The server process's CPU seconds so far (user+sys, every thread)."""
        return proc_cpu(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 400) -> str:
        """The end of the server's log."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)


def s3_store(endpoint: str, **extra) -> dict:
    """kvtier's store section for a bench server at ``endpoint`` (host:port, plain http)."""
    return {"type": "s3", "bucket": BUCKET, "endpoint_override": endpoint, "scheme": "http",
            "access_key": ACCESS_KEY, "secret_key": SECRET_KEY, "region": REGION, **extra}


def start_shaper(upstream_port: int, rtt_ms: float, mbps: float | None = None) -> tuple[subprocess.Popen, str]:
    """The `shaper` example (bench/shaper.rs) in front of ``upstream_port``: a round trip of
    ``rtt_ms`` on every exchange (one more on a new connection), each connection capped at
    ``mbps`` MB/s. Returns the process and the endpoint clients should use; close its stdin
    to stop it, ``shaper_stats`` for its counts."""
    argv = [program("shaper"), "--upstream", str(upstream_port), "--round-trip-ms", str(rtt_ms)]
    if mbps:
        argv += ["--connection-mbps", str(mbps)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"the shaper did not start: {line!r}")
    return proc, line.split()[-1]


def shaper_stats(shaper: subprocess.Popen) -> dict:
    """The shaper's counts so far: cpu_s (its own CPU), accepted, most_open, ..."""
    shaper.stdin.write("\n")
    shaper.stdin.flush()
    return json.loads(shaper.stdout.readline())


def stop_shaper(shaper: subprocess.Popen) -> None:
    shaper.stdin.close()
    shaper.wait()


@contextlib.contextmanager
def fresh_store(store: str, directory: str, programs: dict | None = None):
    """The configuration of an empty store for one run: a directory under ``directory``,
    removed afterwards (``local``), or a sink of its own, stopped afterwards (``sink``). Every
    run starts alike: a sink keeps what it is sent, and one grown by earlier runs slowed
    stores by up to 3x."""
    if store == "local":
        path = tempfile.mkdtemp(prefix="store-", dir=directory)
        try:
            yield {"type": "local", "path": path}
        finally:
            shutil.rmtree(path, ignore_errors=True)
        return
    sink = Server("sink", log_dir=directory, programs=programs)
    try:
        yield sink.store()
    finally:
        sink.stop()


# ------------------------------------------------------------------------------------------
# Keys and data: the rule every client of bench/compare shares (bench/driver_kvtier.c's too).
#
#   key i  = 4 little-endian words mix((key_seed << 32) ^ (4i + k)) + group 0
#   name   = <prefix>/<hex[0:3]>/<hex[3:5]>_g0/<hex>.bin     (kvtier's / vLLM's layout)
#   word j of block i = mix((data_seed << 56) | (i << 28) | j)

MASK64 = (1 << 64) - 1


def mix(z):
    """splitmix64's finaliser, on a Python int or elementwise on a numpy uint64 array (whose
    arithmetic wraps by itself)."""
    wrap = (lambda v: v & MASK64) if isinstance(z, int) else (lambda v: v)
    z = wrap(z + 0x9E3779B97F4A7C15)
    z = wrap((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9)
    z = wrap((z ^ (z >> 27)) * 0x94D049BB133111EB)
    return z ^ (z >> 31)


def key_hex(key_seed: int, index: int) -> str:
    words = (mix(((key_seed << 32) ^ (4 * index + k)) & MASK64) for k in range(4))
    return b"".join(w.to_bytes(8, "little") for w in words).hex()


def object_name(prefix: str, key_seed: int, index: int) -> str:
    h = key_hex(key_seed, index)
    name = f"{h[0:3]}/{h[3:5]}_g0/{h}.bin"
    prefix = "/".join(s for s in prefix.split("/") if s)
    return f"{prefix}/{name}" if prefix else name


def block_words(data_seed: int, block: int, nwords: int):
    """The words of one block, as a numpy uint64 array (numpy imported here: clients.py)."""
    import numpy as np

    base = ((data_seed << 56) | (block << 28)) & MASK64
    return mix(np.uint64(base) | np.arange(nwords, dtype=np.uint64))


# ------------------------------------------------------------------------------------------
# Runs and results


def kvtier_bench(config: dict, *args: str, cli: str | None = None, timeout: float | None = None) -> dict:
    """One `kvtier bench --json` run against ``config``; its report. Raises RuntimeError with
    the command's error when it fails."""
    cmd = [cli or program("cli"), "bench", "--json", "--config", json.dumps(config), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"kvtier bench {' '.join(args)} exited {out.returncode}: {out.stderr.strip()[-600:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def phases(report: dict) -> dict:
    """A `kvtier bench` report's phases by name (store, load, exists, verify)."""
    return {p["phase"]: p for p in report["phases"]}


@contextlib.contextmanager
def bench_scratch(args, name: str):
    """For the drivers of ``run_arguments``: builds `kvtier` (and the sink when ``--stores``
    names it); yields the stores and a scratch directory, removed afterwards."""
    stores = args.stores.split(",")
    build("cli", *(["sink"] if "sink" in stores else []), skip=args.no_build)
    tmp = scratch_dir(f"kvbench-{name}-")
    try:
        yield stores, tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_arguments(description: str, out: str):
    """The options of the drivers that time `kvtier bench` runs of store, load and verify
    (ranges.py, encryption.py; ``out``: their result file): an argparse parser to add their
    own to."""
    import argparse

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=out, help="the result file: a name under bench/results, or a path")
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--block-size", default="2M")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4,
                    help="rounds per run over the same keys (rewritten: dedup is off), so that each phase "
                         "lasts long enough to measure (a round of 256 blocks is 0.1-0.4 s)")
    ap.add_argument("--stores", default="local,sink")
    ap.add_argument("--no-build", action="store_true",
                    help="use the built kvtier and sink (or KVTIER_CLI, KVTIER_BENCH_SINK) without running cargo")
    return ap


def store_load_verify(config: dict, args, ranges: int = 1, layout: str = "layer-first") -> dict:
    """One `kvtier bench` run of store, load and verify with ``run_arguments``' options, each
    block as ``ranges`` ranges (1: the contiguous pool calls); its phases. Every block of
    every round must verify."""
    report = kvtier_bench(
        config, "--blocks", str(args.blocks), "--block-size", args.block_size, "--concurrency", str(args.concurrency),
        "--workload", "store,load,verify", "--ranges-per-block", str(ranges), "--range-layout", layout,
        "--repeat", str(args.rounds), "--key-sets", "1")
    if report["verified_blocks"] != args.blocks * args.rounds:
        raise RuntimeError(f"verified {report['verified_blocks']} of {args.blocks * args.rounds} blocks: {report}")
    return phases(report)


def interleaved(reps: int, stores: list, variants: list, run_one, log=None) -> dict:
    """Runs ``run_one(store, variant)`` (a `kvtier bench` run's phases) for every store and
    variant, ``reps`` times, the variants' order rotated each repetition so that drift on the
    machine hits each alike; returns {(store, phase, variant): [phase reports]} for the store
    and load phases."""
    rows: dict = {}
    for rep in range(reps):
        k = rep % len(variants)
        for store in stores:
            for variant in variants[k:] + variants[:k]:
                if log:
                    log(f"rep {rep + 1}/{reps}: {store}, {variant}")
                got = run_one(store, variant)
                for phase in ("store", "load"):
                    rows.setdefault((store, phase, variant), []).append(got[phase])
    return rows


def publish(lines, name: str) -> str:
    """Prints a result (a list of lines or a text) and writes it to bench/results/NAME, or to
    NAME itself when it is a path; returns the path."""
    text = lines if isinstance(lines, str) else "\n".join(lines) + "\n"
    print(text)
    path = name if os.sep in name else os.path.join(RESULTS, name)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def git_rev() -> str:
    """The checkout's commit (short), with "+uncommitted changes" when its sources differ."""
    def git(*args):
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "?"
    return rev + (" (+uncommitted changes)" if git("status", "--porcelain", "--", "src", "core", "cli", "Cargo.toml") else "")


def cpu_now() -> float:
    """This process's CPU seconds so far (user+sys, every thread)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def fs_type(path) -> str:
    try:
        return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def median(values):
    """The median of the values that are numbers; None when there are none."""
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def median_of(rows, field: str):
    return median(r.get(field) for r in rows)


def ratio(a, b):
    return None if a is None or not b else a / b


def fmt(value, spec=0, none="–") -> str:
    """``value`` with ``spec`` digits and thousands separators, or through a format spec
    ("{:.3f}" or ".3f"); ``none`` for None."""
    if value is None:
        return none
    if isinstance(spec, int):
        return f"{value:,.{spec}f}"
    return spec.format(value) if "{" in spec else format(value, spec)


def parse_size(text: str) -> int:
    """"256K", "2M", "2MiB", "1G", "4096" -> bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def size_label(nbytes: int) -> str:
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult} {unit}"
    return f"{nbytes} B"
