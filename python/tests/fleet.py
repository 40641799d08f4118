"""A fleet on one namespace: engines, gc and eviction at once, each in its own process.

On one store (the test: the local store, s3s-fs and Ceph RGW, the ``store`` fixture's
parameters; moto is left to the other suites), for tens of seconds or longer:

* engines A and B are vLLM 0.33's real ``TieringOffloadingManager`` (built by vLLM's own
  ``TieringOffloadingSpec``, kvtier imported by vLLM's factory through ``module_path``
  ``kvtier.vllm``; python/tests/vllm_engine.py), C is a C program on the C ABI
  (ffi-tests/fleet_worker.c, compiled here against include/kvtier.h and the library the
  package loads). Each, in rounds, looks a random batch of one shared key space up, checks
  the bytes of every block it loads and stores the blocks that MISS;
* a fourth process, the evictor, is a tier with ``eviction`` (a byte budget, a short
  interval) that also loads and checks blocks;
* ``kvtier gc --max-bytes`` (the command line, each run its own process) runs again and
  again, with a smaller budget than the evictor's;
* the S3 server goes down once and comes back: s3s-fs is killed and started again on the
  same port and data directory. On Ceph (the cluster of scripts/ceph-rgw.sh: three memstore
  OSDs, pools of size 3 and min_size 2, two radosgw gateways of one zone) the processes
  spread over both gateways (GATEWAY_OF: A and gc through the first; B, B2, C and the
  evictor through the second), and the failures are real daemons': the second gateway's
  radosgw is stopped (the process exits; its port refuses) and started again after
  OUTAGE_S, and once everyone worked again, one OSD (STOPPED_OSD) is stopped, the fleet
  works on (OSD_DOWN_S at least) and must store blocks while it is down (the pools stay
  writable), and it is started again, the run going on once every placement group is
  active+clean. Any other server is reached through a TCP relay of this file that is
  stopped (connections reset, the port refusing) and started again on the same port;
* engine B is SIGKILLed mid-run and started again: B2, a new process with a new engine
  and tier on the same namespace. (B2's process is started beside A and B and imports vLLM
  there, the slow part of a start; it builds its engine and tier only after B's death.)

A block's bytes are a function of its key (fleet_worker.content), so every process checks
every block it loads, whoever stored it. Then gc and eviction stop, one last gc deletes
most of the namespace, and each engine looks every key it stored up in a new request and
stores the ones that MISS; a fresh tier in a new process must load every one of them
byte-exact: a block stored after a MISS stays loadable until it is deleted again. On Ceph
that fresh tier reads each block through the other gateway from the one its engine stored
it through.

The schedule, from the moment the whole fleet is up (RUN_S long at least): after a third of
it the server outage (on Ceph the gateway's), then on Ceph the OSD's, each followed by
rounds of every worker and a successful gc run; after two thirds B's SIGKILL and B2's start;
after the whole of it, the end: gc and eviction stop, the last gc, the final lookups and
stores, the fresh tier.

Checked (``check``): no block loaded with a wrong byte, by any process (checked in the
slot when the library hands out the result, and again where vLLM's manager reads it);
every job exactly one result (library jobs, and vLLM's jobs through the manager's own calls); every key's
status OK or NotFound. Decision on the outages: the library repeats a request that meets a
refused or reset connection for its retry budget (``store.retry_budget_ms``, 20 s by
default), so no outage shorter than the budget may fail a key, and OUTAGES_EXCUSED is
False: failures inside faults are counted per fault (a gateway's outage reaches only the
processes behind that gateway; a job is inside a fault when its submission-to-result
interval overlaps the fault's span, widened by OUTAGE_GRACE_S) and printed, and every one
is a problem; an OSD down is no outage, the pools staying writable, so nothing is excused
for it however long it lasts. (OUTAGES_EXCUSED = True would excuse CONNECT, IO or TIMEOUT
keys and failed gc runs inside a fault, as a library without the budget needed.) Outside
the faults, on the local store, and in the final check, nothing may fail.

Each worker reports its figures as JSON; ``check`` turns them into the soak's verdict and
``summary_line`` into one line per store. The fleet runs RUN_S seconds once up: the test
(test_fleet_soak.py, ``KVTIER_FLEET_SOAK_S`` overrides) and bench/fleet_soak.py, which runs
the same fleet longer, both drive it through ``run_fleet``. A support module of the tests,
not a test: it needs vLLM (fleet_worker.py's engines) and, for s3s-fs's restart and Ceph's
daemons, the ``s3_servers`` module that started the server.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import c_programs
import kvtier
from kvtier.errors import Status
from kvtier.vllm import build_tier_config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "fleet_worker.py"
C_WORKER = ROOT / "ffi-tests" / "fleet_worker.c"

BLOCK_BYTES = 4096  # vllm_engine.BLOCK_BYTES, one block per chunk
KEYS = 160  # the fleet's key space
BATCH = 8  # keys per request
GC_BUDGET_BLOCKS = 64  # kvtier gc --max-bytes, in blocks
EVICTION = {"max_bytes": 80 * BLOCK_BYTES, "interval_ms": 300}
FINAL_GC_BUDGET_BLOCKS = 32  # the last gc before the final check
GC_PAUSE_S = 0.25  # between two gc runs
OUTAGE_S = 0.5  # how long a server stays down (a fault's length, not a synchronisation)
OUTAGE_GRACE_S = 1.0
#: Whether a key of a job in flight during an outage may end CONNECT, IO or TIMEOUT (and a gc
#: run overlapping it fail). No: requests are retried for a time budget
#: (``store.retry_budget_ms``, 20 s by default), so an outage shorter than the budget must
#: fail nothing. True is for a library whose retries give up sooner (a check that excuses
#: them); KVTIER_FLEET_STRICT_OUTAGES=1 makes the check strict whatever this says.
OUTAGES_EXCUSED = False
#: In a strict check, only an outage longer than this (the default retry budget) may fail a key.
RETRY_BUDGET_S = 20.0
#: On Ceph: which gateway each process reaches (A and gc through the first, B, B2, C and the
#: evictor through the second), the gateway stopped and started again, and the OSD stopped
#: and brought back.
GATEWAY_OF = {"A": 1, "gc": 1, "B": 2, "B2": 2, "C": 2, "evictor": 2}
STOPPED_GATEWAY = 2
STOPPED_OSD = "osd.2"
#: How long the fleet works on at least while the OSD is down (a fault's length, not a
#: synchronisation: the rounds and stores that must happen meanwhile are polled for).
OSD_DOWN_S = 3.0
MODEL = "org/fleet-model"
#: Deadlines: a vLLM engine's start (importing vLLM takes 10-20 s on a busy 2-core
#: machine), any other condition. Never reached when all is well.
START_S = 240.0
DEADLINE_S = 90.0
ROUNDS_BETWEEN_FAULTS = 3
#: How long the fleet runs (from the moment all of it is up to the final check): the outage
#: comes after a third of it, B's SIGKILL after two thirds. KVTIER_FLEET_SOAK_S overrides.
RUN_S = 15.0
#: Statuses a job overlapping the outage may end with.
OUTAGE_STATUSES = {"CONNECT", "IO", "TIMEOUT"}


# -- processes -------------------------------------------------------------------------------


class WorkerDied(AssertionError):
    pass


class Worker:
    """A child process speaking fleet_worker's protocol: FLEET lines out, commands in."""

    def __init__(self, name: str, argv: list[str], env: dict, log_dir: Path) -> None:
        self.name = name
        self.stderr_path = log_dir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=env, text=True, bufsize=1)
        self.events: list[dict] = []
        self.other: collections.deque = collections.deque(maxlen=40)
        self.eof = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, name=f"fleet-{name}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("FLEET "):
                try:
                    event = json.loads(line[6:])
                except ValueError:
                    event = {"event": "garbled", "line": line}
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
            else:
                self.other.append(line.rstrip())
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    # -- what it said ----------------------------------------------------------------

    def of(self, kind: str) -> list[dict]:
        with self._cond:
            return [e for e in self.events if e.get("event") == kind]

    def last(self, kind: str) -> dict | None:
        found = self.of(kind)
        return found[-1] if found else None

    def rounds(self) -> int:
        p = self.last("progress")
        return p["rounds"] if p else 0

    def figure(self, name: str) -> int:
        """A cumulative figure: from the final report, else the last progress line."""
        report = self.last("final") or self.last("progress") or {}
        return report.get(name, 0)

    def diagnostics(self) -> str:
        self._stderr.flush()
        try:
            err = self.stderr_path.read_text(errors="replace")[-3000:]
        except OSError:
            err = ""
        errors = self.of("error")
        return (f"worker {self.name} (pid {self.proc.pid}, exit {self.proc.poll()}):\n"
                f"errors: {errors}\nstdout tail:\n" + "\n".join(self.other) + f"\nstderr tail:\n{err}")

    # -- waiting -----------------------------------------------------------------------

    def wait_event(self, kind: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [e for e in self.events if e.get("event") == kind]
                if found:
                    return found[-1]
                if self.eof:
                    raise WorkerDied(f"{self.name} exited before '{kind}'\n{self.diagnostics()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{self.name}: no '{kind}' within {timeout:.0f} s\n{self.diagnostics()}")
                self._cond.wait(remaining)

    def check_alive(self) -> None:
        if self.eof or self.proc.poll() is not None:
            raise WorkerDied(f"{self.name} died\n{self.diagnostics()}")

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def wait_exit(self, timeout: float = DEADLINE_S) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {timeout:.0f} s\n{self.diagnostics()}") from None
        self._thread.join(timeout)
        return rc

    def kill(self) -> None:
        """SIGKILL, as an engine dies: nothing of it runs on."""
        if self.proc.poll() is None:
            self.proc.send_signal(9)
        self.proc.wait()
        self._thread.join(DEADLINE_S)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self._stderr):
            try:
                f.close()
            except OSError:
                pass


def until(condition, what: str, workers, timeout: float = DEADLINE_S) -> None:
    """Polls ``condition()`` until it holds; fails at the deadline or when a worker dies."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        for w in workers:
            w.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what} (within {timeout:.0f} s)\n" +
                                 "\n".join(f"{w.name}: {w.rounds()} rounds" for w in workers))
        pause.wait(0.05)


class GcLoop:
    """``kvtier gc --max-bytes`` again and again, each run its own process, until stopped."""

    def __init__(self, cli: str, config: dict, max_bytes: int) -> None:
        self.argv = [cli, "gc", "--config", json.dumps(config), "--max-bytes", str(max_bytes), "--json"]
        self.runs: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-gc", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.runs.append(run_gc(self.argv))
            self._stop.wait(GC_PAUSE_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S)
        assert not self._thread.is_alive(), "the gc loop did not stop"

    def ok_runs_after(self, t: float) -> int:
        return sum(1 for r in self.runs if r["rc"] == 0 and r["t0"] >= t)

    def deleted(self) -> int:
        return sum(r.get("deleted", 0) for r in self.runs)


def run_gc(argv: list[str]) -> dict:
    t0 = time.time()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = -1, exc.stdout or "", f"timed out: {exc}"
    run = {"rc": rc, "t0": t0, "t1": time.time(), "stderr": (err or "")[-500:]}
    try:
        report = json.loads(out)
        run["deleted"] = report["deleted_objects"]
        run["remaining_bytes"] = report["remaining_bytes"]
        run["failed"] = report.get("failed", [])
    except (ValueError, KeyError, TypeError):
        run["stdout"] = (out or "")[-500:]
    return run


# -- the S3 server's outage ------------------------------------------------------------------


class Relay:
    """A TCP relay on a fixed loopback port: ``stop`` resets every connection and closes the
    port, ``start`` opens it again (for servers this test cannot restart, such as RGW)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind(("127.0.0.1", self.port))
                break
            except OSError:
                listener.close()
                if time.monotonic() > deadline:
                    raise
                threading.Event().wait(0.05)
        listener.listen(128)
        listener.settimeout(0.1)
        self._listener = listener
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, args=(listener, self._stopped), daemon=True).start()

    def _accept(self, listener: socket.socket, stopped: threading.Event) -> None:
        while not stopped.is_set():
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                if stopped.is_set():
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                gone = src not in self._conns
            if gone:
                return
            for s in (src, dst):
                self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._conns.discard(s)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def stop(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            self._drop(s)


def outages_excused() -> bool:
    """Whether failures inside an outage shorter than RETRY_BUDGET_S are excused (see
    OUTAGES_EXCUSED)."""
    return OUTAGES_EXCUSED and os.environ.get("KVTIER_FLEET_STRICT_OUTAGES") != "1"


class Window:
    """One fault's time span (wall-clock seconds, ``down`` to ``up``), the processes it can
    fail (``affects``: names as in GATEWAY_OF; None: all of them), and whether the service was
    gone meanwhile (``outage``: a server or gateway down; not an OSD down, the pools staying
    writable, so no retry budget has anything to bridge however long it lasts)."""

    def __init__(self, what: str, down: float, up: float, affects: frozenset | None = None,
                 outage: bool = True) -> None:
        self.what, self.down, self.up, self.affects, self.outage = what, down, up, affects, outage

    def length(self) -> float:
        return self.up - self.down

    def covers(self, worker: str, t0: float, t1: float) -> bool:
        """Whether a job of ``worker`` from ``t0`` to ``t1`` overlapped this fault (widened
        by OUTAGE_GRACE_S) and could meet it."""
        if self.affects is not None and worker not in self.affects:
            return False
        return t0 <= self.up + OUTAGE_GRACE_S and t1 >= self.down - OUTAGE_GRACE_S

    def excusable(self) -> bool:
        return outages_excused() or (self.outage and self.length() > RETRY_BUDGET_S)

    def __repr__(self) -> str:
        return f"{self.what} ({self.length():.1f} s)"


class Faults:
    """The store's faults: on s3s-fs the server is killed and started again on its port and
    data; on Ceph (a cluster of s3_servers.start_rgw) the processes spread over its two
    gateways (GATEWAY_OF), one gateway's radosgw is stopped and started again
    (``gateway_outage``) and one OSD is stopped and brought back (``osd_down``, ``osd_up``);
    any other S3 server is reached through a Relay that is stopped and started again. Each
    fault's span goes into ``windows``. ``store_config(name)`` is what process ``name`` must
    use, ``other_store_config(name)`` the one through the other gateway (the same on a store
    with one endpoint)."""

    def __init__(self, kind: str, store_config: dict) -> None:
        self.kind = "none"
        self.windows: list[Window] = []
        self._configs = {1: dict(store_config), 2: dict(store_config)}
        self._relay: Relay | None = None
        self._restart = False
        self.cluster: dict | None = None
        if kind == "local":
            return
        servers = sys.modules.get("s3_servers")
        if servers is not None and servers.restartable(store_config):
            self._restart = True
            self.kind = "s3s-fs restarted"
            return
        if servers is not None and servers.rgw_cluster(store_config) is not None:
            self.cluster = servers.rgw_cluster(store_config)
            self._configs[2]["endpoint_override"] = self.cluster["endpoint_2"]
            self.kind = f"Ceph: radosgw rgw.{STOPPED_GATEWAY} stopped and started, {STOPPED_OSD} stopped and started"
            return
        endpoint = store_config.get("endpoint_override") or ""
        scheme, _, hostport = endpoint.rpartition("://")
        scheme = scheme or store_config.get("scheme") or "http"
        host, _, port = hostport.rpartition(":")
        if scheme != "http" or not port.isdigit():
            self.kind = "none (the relay takes plain http endpoints with a port only)"
            return
        self._relay = Relay(host or "127.0.0.1", int(port))
        self._relay.start()
        for config in self._configs.values():
            config["endpoint_override"] = f"127.0.0.1:{self._relay.port}"
        self.kind = "relay stopped and restarted"

    def store_config(self, name: str) -> dict:
        return dict(self._configs[GATEWAY_OF[name] if self.cluster else 1])

    def other_store_config(self, name: str) -> dict:
        return dict(self._configs[3 - GATEWAY_OF[name]] if self.cluster else self._configs[1])

    def gateway_outage(self) -> None:
        """The server goes down and comes back: s3s-fs or the relay for OUTAGE_S, or on Ceph
        one gateway, stopped (its radosgw process exits) and started again after OUTAGE_S
        (start-daemon returns once it answers)."""
        down = time.time()
        if self.cluster is not None:
            servers = sys.modules["s3_servers"]
            name = f"rgw.{STOPPED_GATEWAY}"
            servers.rgw_daemon(self.cluster, "stop", name)
            threading.Event().wait(OUTAGE_S)  # the outage's length: the fault itself
            servers.rgw_daemon(self.cluster, "start", name)
            affects = frozenset(n for n, g in GATEWAY_OF.items() if g == STOPPED_GATEWAY)
            self.windows.append(Window(f"gateway {name} down", down, time.time(), affects))
        elif self._relay is not None:
            self._relay.stop()
            threading.Event().wait(OUTAGE_S)  # the outage's length: the fault itself
            self._relay.start()
            self.windows.append(Window("relay down", down, time.time()))
        elif self._restart:
            sys.modules["s3_servers"].restart(self._configs[1], OUTAGE_S, DEADLINE_S)
            self.windows.append(Window("s3s-fs down", down, time.time()))

    def osd_down(self) -> None:
        """Ceph: stops STOPPED_OSD (returns once the monitor marked it down)."""
        self._osd_down_at = time.time()
        sys.modules["s3_servers"].rgw_daemon(self.cluster, "stop", STOPPED_OSD)

    def osd_up(self) -> None:
        """Ceph: starts STOPPED_OSD again (returns once every placement group is active+clean)."""
        sys.modules["s3_servers"].rgw_daemon(self.cluster, "start", STOPPED_OSD)
        self.windows.append(Window(f"{STOPPED_OSD} down", self._osd_down_at, time.time(), outage=False))

    def close(self) -> None:
        if self._relay is not None:
            self._relay.stop()

    def window_of(self, worker: str, t0: float, t1: float) -> Window | None:
        """The fault a job of ``worker`` from ``t0`` to ``t1`` overlapped, if any."""
        for w in self.windows:
            if w.covers(worker, t0, t1):
                return w
        return None


# -- building blocks -------------------------------------------------------------------------


def kvtier_cli() -> str:
    """target/release/kvtier (built with cargo when missing)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    cli = target / "release" / "kvtier"
    if not cli.exists():
        cargo = shutil.which("cargo")
        if cargo is None or not (ROOT / "Cargo.toml").exists():
            pytest.skip("needs the kvtier command line (cargo build --release --bin kvtier)")
        subprocess.run([cargo, "build", "--release", "--bin", "kvtier"], cwd=ROOT, check=True)
    return str(cli)


def worker_env() -> dict:
    env = dict(os.environ)
    package_root = str(Path(kvtier.__file__).resolve().parent.parent)  # the kvtier this test imports
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # 2 cores for the whole fleet
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


def status_name(code) -> str:
    try:
        return Status(int(code)).name
    except ValueError:
        return str(code)


def statuses_of(report: dict) -> collections.Counter:
    """Per-key statuses by name (the C worker reports codes)."""
    if "status_codes" in report:
        return collections.Counter({status_name(c): n for c, n in report["status_codes"].items()})
    return collections.Counter(report.get("statuses", {}))


# -- the fleet -------------------------------------------------------------------------------


def run_fleet(kind: str, store_config: dict, prefix: str, work: Path, run_s: float = RUN_S) -> dict:
    """Runs the fleet on one store and returns every worker's report (nothing asserted
    beyond the workers' own liveness; see ``check``)."""
    cli = kvtier_cli()
    c_exe = c_programs.build(C_WORKER, work / "c")
    env = worker_env()
    py = sys.executable
    key_seed = random.randrange(1, 1 << 32)
    faults = Faults(kind, store_config)
    base = {"prefix": prefix, "key_seed": key_seed, "keys": KEYS, "batch": BATCH}
    run_id = uuid.uuid4().hex[:8]
    workers: list[Worker] = []
    shm: list[Path] = []

    def engine(name: str, standby: bool = False) -> Worker:
        engine_id = f"fleet-{run_id}-{name}"
        shm.append(Path(f"/dev/shm/vllm_offload_{engine_id}.mmap"))  # left behind by a SIGKILL
        spec = dict(base, name=name, store_config=faults.store_config(name), model=MODEL, engine_id=engine_id,
                    rng_seed=random.randrange(1 << 30), standby=standby)
        w = Worker(name, [py, str(WORKER), "engine", json.dumps(spec)], env, work)
        workers.append(w)
        return w

    gc = None
    t_start = time.monotonic()
    timeline: list[str] = []

    def mark(what: str) -> None:
        timeline.append(f"{time.monotonic() - t_start:.1f} {what}")

    try:
        # B2, B's replacement, imports vLLM (the slow part of a start) beside A and B; it
        # builds its engine and tier only after B has been killed.
        a, b, b2 = engine("A"), engine("B"), engine("B2", standby=True)
        namespace = a.wait_event("ready", START_S)["namespace"]
        assert b.wait_event("ready", START_S)["namespace"] == namespace, "the engines' namespaces differ"
        mark("A, B ready")

        def tier_config(store: dict) -> dict:
            return build_tier_config(store, prefix=prefix, namespace=namespace)

        c = Worker("C", [c_exe, "C", json.dumps(tier_config(faults.store_config("C"))), str(key_seed), str(KEYS),
                         str(BATCH), str(random.randrange(1 << 30))], env, work)
        evictor = Worker("evictor", [py, str(WORKER), "evictor",
                                     json.dumps(dict(base, name="evictor",
                                                     tier_config=tier_config(faults.store_config("evictor")),
                                                     eviction=EVICTION, rng_seed=random.randrange(1 << 30)))],
                         env, work)
        workers += [c, evictor]
        c.wait_event("ready", DEADLINE_S)
        evictor.wait_event("ready", DEADLINE_S)
        gc_config = tier_config(faults.store_config("gc"))
        gc = GcLoop(cli, gc_config, GC_BUDGET_BLOCKS * BLOCK_BYTES)
        gc.start()
        started = time.monotonic()
        mark("C, evictor ready; gc started")

        def progressed(ws, marks, n=ROUNDS_BETWEEN_FAULTS):
            return lambda: all(w.rounds() >= marks.get(w.name, 0) + n for w in ws)

        def after(fraction):
            return lambda: time.monotonic() - started >= fraction * run_s

        # 1. The server (on Ceph: one gateway) goes down and comes back while everyone works.
        running = [a, b, c, evictor]
        until(lambda: progressed(running, {})() and after(1 / 3)(), "every worker ran some rounds", running,
              timeout=run_s + DEADLINE_S)
        faults.gateway_outage()
        mark(f"server back: {faults.windows[-1] if faults.windows else 'no outage'}")
        marks = {w.name: w.rounds() for w in running}
        up = faults.windows[-1].up if faults.windows else 0.0
        until(lambda: progressed(running, marks)() and gc.ok_runs_after(up) >= 1,
              "every worker and gc worked after the outage", running)

        # 1b. On Ceph, one OSD goes down: the pools (size 3, min_size 2) stay writable, so the
        # fleet works on and stores blocks; then it comes back and recovers (active+clean).
        if faults.cluster is not None:
            faults.osd_down()
            osd_down_at = time.monotonic()
            mark(f"{STOPPED_OSD} down")
            marks = {w.name: w.rounds() for w in running}
            stores_before = sum(w.figure("stores") for w in running)
            until(lambda: progressed(running, marks)() and sum(w.figure("stores") for w in running) > stores_before
                  and time.monotonic() - osd_down_at >= OSD_DOWN_S,
                  f"every worker worked and blocks were stored while {STOPPED_OSD} was down", running)
            osd_stores = sum(w.figure("stores") for w in running) - stores_before
            mark(f"{STOPPED_OSD} starting")
            faults.osd_up()
            mark(f"{STOPPED_OSD} back, active+clean ({osd_stores} blocks stored while it was down)")
            marks = {w.name: w.rounds() for w in running}
            up = faults.windows[-1].up
            until(lambda: progressed(running, marks)() and gc.ok_runs_after(up) >= 1,
                  f"every worker and gc worked after {STOPPED_OSD} came back", running)

        # 2. Engine B is SIGKILLed mid-run and started again.
        b2.wait_event("standby", START_S)
        until(after(2 / 3), "two thirds of the run", running, timeout=run_s + DEADLINE_S)
        b.kill()
        mark("B killed")
        b_killed_at = b.rounds()
        running = [a, c, evictor]
        marks = {w.name: w.rounds() for w in running}
        b2.send("go")
        b2.wait_event("ready", DEADLINE_S)
        mark("B2 ready")
        running = [a, b2, c, evictor]
        until(lambda: progressed(running, marks)()
              and gc.deleted() > 0
              and evictor.figure("evicted") > 0
              and after(1)(),
              "the fleet worked on after the restart (and gc and eviction deleted blocks)", running,
              timeout=run_s + DEADLINE_S)
        ran_s = time.monotonic() - started
        mark("run over")

        # 3. gc and eviction stop; one last gc deletes most of the namespace.
        gc.stop()
        mark("gc stopped")
        evictor.send("stop")
        evictor_report = evictor.wait_event("final", DEADLINE_S)
        evictor.wait_exit()
        mark("evictor stopped")
        final_gc = run_gc([cli, "gc", "--config", json.dumps(gc_config),
                           "--max-bytes", str(FINAL_GC_BUDGET_BLOCKS * BLOCK_BYTES), "--json"])
        assert final_gc["rc"] == 0, final_gc
        mark(f"last gc deleted {final_gc.get('deleted')}")

        # 4. Each engine looks up every key it stored, and stores the MISSes again.
        engines = [a, b2, c]
        for w in engines:
            w.send("final")
        reports = {w.name: w.wait_event("final", DEADLINE_S) for w in engines}
        mark("final reports")
        for w in engines:
            assert w.wait_exit() == 0, w.diagnostics()
        mark("final stores done")

        # 5. A fresh tier, in a new process, loads every one of them, each through the other
        # gateway from the one its engine stored it through (on a store with one endpoint:
        # through that one).
        through: dict[str, set] = {}
        for name, r in reports.items():
            other = json.dumps(faults.other_store_config(name), sort_keys=True)
            through.setdefault(other, set()).update(r["stored_after_miss"] + r["final_hits"])
        verifies = []
        for n, (store, keys) in enumerate(sorted(through.items())):
            verifier = Worker(f"verify{n + 1}", [py, str(WORKER), "verify",
                                                 json.dumps(dict(base, tier_config=tier_config(json.loads(store)),
                                                                 check=sorted(keys)))], env, work)
            workers.append(verifier)
            verifies.append(verifier.wait_event("final", DEADLINE_S))
            assert verifier.wait_exit() == 0, verifier.diagnostics()
        verify = merge_verifies(verifies)
        mark(f"fresh tier checked ({len(verifies)} through {'the other gateway' if faults.cluster else 'the store'})")
    finally:
        if gc is not None:
            gc.stop()
        for w in workers:
            w.close()
        faults.close()
        for path in shm:
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    killed = {"name": "B", "rounds": b_killed_at, "loads": b.figure("loads"), "wrong": b.figure("wrong"),
              "wrong_events": b.of("wrong")}
    return {
        "kind": kind,
        "outage": faults.kind,
        "outage_windows": [(w.what, w.down, w.up) for w in faults.windows],
        "run_s": ran_s,
        "timeline": timeline,
        "namespace": namespace,
        "engines": reports,
        "killed": killed,
        "evictor": evictor_report,
        "gc_runs": gc.runs,
        "final_gc": final_gc,
        "verify": verify,
        "wrong_events": [e for w in workers for e in w.of("wrong")],
        "_faults": faults,
    }


def merge_verifies(reports: list[dict]) -> dict:
    """The fresh tiers' reports as one: figures summed, missing keys joined."""
    merged = dict(reports[0])
    for r in reports[1:]:
        for field in ("loads", "wrong", "checked", "found", "jobs_submitted", "duplicate_results", "unknown_results",
                      "library_jobs_without_result"):
            merged[field] = merged.get(field, 0) + r.get(field, 0)
        merged["missing"] = merged["missing"] + r["missing"]
        merged["statuses"] = dict(collections.Counter(merged["statuses"]) + collections.Counter(r["statuses"]))
        merged["unexpected"] = merged.get("unexpected", []) + r.get("unexpected", [])
    return merged


def check(result: dict) -> dict:
    """The soak's assertions; returns the figures of the summary line."""
    faults: Faults = result["_faults"]
    reports = dict(result["engines"], evictor=result["evictor"])
    problems: list[str] = []

    # No wrong byte, ever, by any process (the killed one included).
    if result["wrong_events"]:
        problems.append(f"blocks loaded with wrong bytes: {result['wrong_events']}")
    for name, r in reports.items():
        if r["wrong"]:
            problems.append(f"{name}: {r['wrong']} blocks with wrong bytes")

    # Every job exactly one result.
    for name, r in dict(reports, verify=result["verify"]).items():
        for field in ("duplicate_results", "unknown_results", "library_jobs_without_result"):
            if r.get(field):
                problems.append(f"{name}: {field} = {r[field]}")
        vj = r.get("vllm_jobs")
        if vj is not None:
            if vj.get("duplicate") or vj.get("unknown") or r["vllm_jobs_without_result"]:
                problems.append(f"{name}: vLLM jobs {vj}, {r['vllm_jobs_without_result']} without a result")
            if vj.get("submitted", 0) != vj.get("succeeded", 0) + vj.get("failed", 0):
                problems.append(f"{name}: vLLM jobs {vj}")

    # Statuses: OK or NotFound; CONNECT/IO/TIMEOUT only for jobs in flight during a fault that
    # could reach them, and then only when outages are excused (outages_excused) or the fault
    # outlasted the retry budget.
    statuses: collections.Counter = collections.Counter()
    excused: list[dict] = []
    in_outages: collections.Counter = collections.Counter()  # failed keys (and gc runs) per fault
    for name, r in reports.items():
        statuses += statuses_of(r)
        for u in r["unexpected"]:
            st = status_name(u["status"]) if isinstance(u["status"], int) else u["status"]
            window = faults.window_of(name, u["t0"], u["t1"]) if st in OUTAGE_STATUSES else None
            if window is not None:
                in_outages[window.what] += 1
            if window is not None and window.excusable():
                excused.append(dict(u, worker=name, status=st, window=window.what))
            elif window is not None:
                problems.append(f"{name}: a {u['kind']} key ended {st} in the {window!r}, which a retry budget "
                                f"of {RETRY_BUDGET_S:.0f} s must bridge (strict): {u}")
            else:
                problems.append(f"{name}: a {u['kind']} key ended {st} outside every outage "
                                f"{faults.windows}: {u}")
    for bad in set(statuses) - {"OK", "NOT_FOUND"} - OUTAGE_STATUSES:
        problems.append(f"status {bad} seen {statuses[bad]} times")

    # gc: every run succeeded, but those overlapping a fault that could reach them.
    gc_failed = [g for g in result["gc_runs"] if g["rc"] != 0]
    for g in gc_failed:
        window = faults.window_of("gc", g["t0"], g["t1"])
        if window is not None:
            in_outages[f"gc runs in the {window.what}"] += 1
        if window is not None and window.excusable():
            excused.append({"worker": "gc", "status": f"exit {g['rc']}", "t0": g["t0"], "t1": g["t1"],
                            "message": g["stderr"], "window": window.what})
        elif window is not None:
            problems.append(f"kvtier gc failed in the {window!r} (strict): {g}")
        else:
            problems.append(f"kvtier gc failed outside every outage {faults.windows}: {g}")
    gc_deleted = sum(g.get("deleted", 0) for g in result["gc_runs"])

    # The final check: no failure; every block stored after a MISS found by a fresh tier.
    stored_after_miss = sorted({k for r in result["engines"].values() for k in r["stored_after_miss"]})
    verify = result["verify"]
    missing = set(verify["missing"])
    for name, r in result["engines"].items():
        if r["final_failed_keys"]:
            problems.append(f"{name}: {r['final_failed_keys']} keys failed in the final check")
        lost = sorted(set(r["stored_after_miss"]) & missing)
        if lost:
            problems.append(f"{name} stored {len(lost)} blocks after a MISS that a fresh tier cannot load: {lost}")
    if missing:
        problems.append(f"the fresh tier could not load {sorted(missing)}")
    if verify["wrong"] or verify["statuses"].get("OK", 0) != verify["checked"]:
        problems.append(f"the fresh tier's loads: {verify['statuses']}, {verify['wrong']} wrong")
    if not stored_after_miss:
        problems.append("no engine stored a block after a MISS in the final check (the last gc deleted nothing?)")
    if result["evictor"]["evicted_blocks"] <= 0 or gc_deleted <= 0:
        problems.append(f"eviction deleted {result['evictor']['evicted_blocks']}, gc {gc_deleted} blocks")

    loads = sum(r["loads"] for r in reports.values()) + result["killed"]["loads"] + verify["loads"]
    summary = {
        "jobs": sum(r.get("jobs_submitted", 0) for r in reports.values()),
        "keys": sum(statuses.values()),
        "in_outages": dict(in_outages),
        "strict": not outages_excused(),
        "loads": loads,
        "wrong": sum(r["wrong"] for r in reports.values()) + result["killed"]["wrong"] + verify["wrong"],
        "stored_after_miss": len(stored_after_miss),
        "found_after": len(set(stored_after_miss) - missing),
        "statuses": dict(statuses),
        "excused": sum(1 for e in excused if e["worker"] != "gc"),
        "excused_details": excused,
        "gc_runs": len(result["gc_runs"]),
        "gc_failed": len(gc_failed),
        "gc_deleted": gc_deleted + result["final_gc"].get("deleted", 0),
        "evicted": result["evictor"]["evicted_blocks"],
        "run_s": result["run_s"],
        "problems": problems,
    }
    return summary


def summary_line(name: str, result: dict, s: dict) -> str:
    per = ", ".join(f"{n} {r['loads']}" for n, r in result["engines"].items())
    k = result["killed"]
    return (f"fleet soak [{name}]: {s['run_s']:.0f} s; loads {s['loads']} ({per}, B killed after {k['rounds']} "
            f"rounds {k['loads']}, evictor {result['evictor']['loads']}, fresh tier {result['verify']['loads']}); "
            f"wrong bytes {s['wrong']}; stored after MISS found afterwards {s['found_after']}/"
            f"{s['stored_after_miss']}; jobs {s['jobs']}, keys {s['keys']}, key statuses {s['statuses']}; "
            f"failures inside outages {s['in_outages'] or 0} ({s['excused']} keys excused, "
            f"{'strict' if s['strict'] else 'outages excused'}); "
            f"gc {s['gc_runs']} runs ({s['gc_failed']} failed), {s['gc_deleted']} deleted; "
            f"evicted {s['evicted']}; faults: {result['outage']}")
