"""Real S3 servers for the contract tests: s3s-fs, moto_server and Ceph RGW on free
loopback ports.

``start_all()`` starts them (s3s-fs from the project's ``tools/bin``, installed by
``scripts/install-tools.sh``; moto_server from the PATH or ``tools/venv``; a Ceph cluster
of three memstore OSDs and two radosgw gateways from ``scripts/ceph-rgw.sh run``), creates
one bucket on each, and returns vLLM ``store_config`` dicts for them (Ceph's through its
first gateway; ``rgw_cluster`` finds the cluster behind it, with its second gateway, and
``rgw_daemon`` stops and starts one of its gateways or OSDs). The servers are killed when
the Python process exits (the Ceph daemons die with their supervising script).

The building blocks are the project's one way to run a loopback server, shared with the
other suites and the benchmarks (ffi-tests/on_s3_servers.py and tests/interop import this
file from this directory, bench/common.py loads it by its path): ``free_port``, ``serve`` (start a program on a
free port and wait until it answers there and holds the listening socket), ``find_program``,
``s3s_fs_argv``, ``moto_argv``, ``start_rgw`` and ``rgw_daemon``. It imports nothing outside the standard
library at import time, and nothing of the tests.
"""

from __future__ import annotations

import atexit
import http.client
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "kvtier-contract"
ACCESS_KEY = "kvtier-contract-access"
SECRET_KEY = "kvtier-contract-secret-7Hq2"

_children: list[subprocess.Popen] = []
_rgw_clusters: list[dict] = []


def free_port() -> int:
    """A TCP port free on loopback now (another process may take it before it is used:
    ``serve`` checks who listens)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port: int, method: str, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request(method, path)
        return conn.getresponse().status
    finally:
        conn.close()


def owns_listener(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on loopback port `port`, from
    /proc: a port found free and then handed to a server may have been taken by another
    process in between, whose answers would then pass for the server's."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
                return True
    return False


def _serving(child: subprocess.Popen, port: int, deadline: float) -> bool:
    """Waits until ``child`` answers HTTP on ``port`` and is the process listening there
    (see :func:`owns_listener`); False once it exited, another process answered, or
    ``deadline`` (a ``time.monotonic()``) passed."""
    while time.monotonic() < deadline and child.poll() is None:
        try:
            _request(port, "GET", "/")
        except OSError:
            time.sleep(0.02)  # a poll interval: the server's answer decides
            continue
        return owns_listener(child.pid, port)
    return False


def serve(argv_for_port, name: str, log_dir: str | os.PathLike | None = None,
          **popen) -> tuple[int, subprocess.Popen]:
    """Starts ``argv_for_port(port)`` on a free loopback port and returns (port, process) once
    it answers HTTP there and holds the listening socket (a port found free may be taken by
    another process in between: then a new port, up to five times). Its output goes to
    ``name-PORT.log`` in ``log_dir`` (the temporary directory by default); ``popen`` goes to
    ``subprocess.Popen`` (e.g. ``start_new_session``, ``env``). The process is killed when
    this Python process exits, if it still runs."""
    last = ""
    for _ in range(5):
        port = free_port()
        log = open(Path(log_dir or tempfile.gettempdir()) / f"kvtier-{name}-{port}.log", "wb")
        child = subprocess.Popen(argv_for_port(port), stdout=log, stderr=subprocess.STDOUT, **popen)
        if _serving(child, port, time.monotonic() + 30):
            _children.append(child)
            return port, child
        # Not answering, or another process answered on the port: a new port.
        child.kill()
        child.wait()
        last = f"{name} did not answer on port {port} (log {log.name})"
    raise RuntimeError(last)


def s3s_fs_argv(program: str, port: int, root: str | os.PathLike, access_key: str, secret_key: str) -> list[str]:
    """s3s-fs serving the directory ``root`` (a bucket is a directory in it) on ``port``."""
    return [program, "--host", "127.0.0.1", "--port", str(port), "--access-key", access_key,
            "--secret-key", secret_key, str(root)]


def moto_argv(program: str, port: int) -> list[str]:
    return [program, "-H", "127.0.0.1", "-p", str(port)]


def find_program(binary: str, *candidates: str | os.PathLike) -> str:
    """The first of ``candidates`` that is an executable file, else ``binary`` on the PATH."""
    for c in map(Path, candidates):
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which(binary)
    if not found:
        raise RuntimeError(f"{binary} not found: run scripts/install-tools.sh")
    return found


def _server_on(port: int, program: str) -> subprocess.Popen | None:
    for child in _children:
        args = [str(a) for a in child.args]
        if Path(args[0]).name == program and str(port) in args and child.poll() is None:
            return child
    return None


def restartable(store_config: dict) -> bool:
    """Whether ``restart`` can take the server of ``store_config`` down and bring it back
    with its data: s3s-fs (its objects are files). moto and Ceph RGW keep theirs in memory."""
    endpoint = store_config.get("endpoint_override", "")
    port = endpoint.rsplit(":", 1)[1] if ":" in endpoint else ""
    return port.isdigit() and _server_on(int(port), "s3s-fs") is not None


def restart(store_config: dict, down_s: float, deadline_s: float = 90.0) -> None:
    """Kills the session's s3s-fs serving ``store_config``, and after ``down_s`` starts the
    same program on the same port and data directory, returning once it answers."""
    port = int(store_config["endpoint_override"].rsplit(":", 1)[1])
    old = _server_on(port, "s3s-fs")
    assert old is not None, f"no s3s-fs of this session on port {port}"
    old.kill()
    old.wait()
    time.sleep(down_s)  # the outage's length: the fault itself, not a synchronisation
    log = open(Path(tempfile.gettempdir()) / f"kvtier-s3s-fs-{port}-restarted.log", "ab")
    deadline = time.monotonic() + deadline_s
    while True:
        child = subprocess.Popen(old.args, stdout=log, stderr=subprocess.STDOUT)
        if _serving(child, port, deadline):
            break
        # It exited (the port not free again yet, say), or the deadline passed.
        child.kill()
        child.wait()
        assert time.monotonic() < deadline, f"s3s-fs did not come back on port {port} (log {log.name})"
    _children[_children.index(old)] = child  # killed with the session's servers


@atexit.register
def _stop_all() -> None:
    for child in _children:
        child.kill()
        child.wait()


def start_rgw(access_key: str | None = None, secret_key: str | None = None, ready_s: float = 240.0,
              **popen) -> dict:
    """A Ceph cluster of three memstore OSDs and two radosgw gateways (``scripts/ceph-rgw.sh
    run``); returns the first gateway's ``endpoint``, the second's ``endpoint_2``, the S3
    user's ``access_key`` and ``secret_key`` (the given ones, else the script's), the
    supervising ``process`` (the daemons die with it) and the cluster's ``directory``.
    ``popen`` goes to ``subprocess.Popen``.

    A cluster that fails to come up within ``ready_s`` (a busy machine can make its start-up
    miss a deadline; a fresh cluster now and then loses an OSD at start) is stopped and
    started afresh, up to three times."""
    errors = []
    for _ in range(3):
        try:
            cluster = _start_rgw_once(access_key, secret_key, ready_s, popen)
            _rgw_clusters.append(cluster)
            return cluster
        except RuntimeError as exc:
            errors.append(str(exc))
    raise RuntimeError("Ceph RGW did not start in three attempts; the last:\n" + errors[-1])


def _start_rgw_once(access_key: str | None, secret_key: str | None, ready_s: float, popen: dict) -> dict:
    script = ROOT / "scripts" / "ceph-rgw.sh"
    cluster = Path(tempfile.mkdtemp(prefix="kvtier-ceph-rgw-"))
    atexit.register(shutil.rmtree, cluster, True)
    port = free_port()
    log = open(cluster / "supervisor.out", "wb")
    popen = dict(popen)
    env = dict(popen.pop("env", None) or os.environ)
    if access_key:
        env.update(RGW_ACCESS_KEY=access_key, RGW_SECRET_KEY=secret_key or "")
    child = subprocess.Popen(["bash", str(script), "run", str(cluster), str(port)], stdout=log,
                             stderr=subprocess.STDOUT, env=env, **popen)
    env_file = cluster / "env"
    deadline = time.monotonic() + ready_s
    while not env_file.exists():  # written once the cluster serves S3 and has its users
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()  # its daemons die with it
            child.wait()
            log.flush()
            text = (cluster / "supervisor.out").read_text(errors="replace")
            reasons = [line for line in text.splitlines() if line.startswith("ceph-rgw:")]
            raise RuntimeError("\n".join(reasons) + "\n" + text[-2000:])
        time.sleep(0.2)
    _children.append(child)
    values = dict(line.split("=", 1) for line in env_file.read_text().split() if "=" in line)
    return {"endpoint": values["RGW_ENDPOINT"], "endpoint_2": values["RGW_ENDPOINT_2"],
            "access_key": values["RGW_ACCESS_KEY"], "secret_key": values["RGW_SECRET_KEY"], "process": child,
            "directory": cluster}


def rgw_cluster(store_config: dict) -> dict | None:
    """The running Ceph cluster of this process whose first gateway ``store_config`` reaches
    (see ``start_rgw``), else None."""
    endpoint = store_config.get("endpoint_override", "")
    for cluster in _rgw_clusters:
        if cluster["endpoint"] == endpoint and cluster["process"].poll() is None:
            return cluster
    return None


def rgw_daemon(cluster: dict, verb: str, name: str, deadline_s: float = 300.0) -> None:
    """Stops (``verb`` "stop") or starts ("start") one daemon of ``cluster``: ``osd.0``-``osd.2``,
    ``rgw.1`` or ``rgw.2`` (``scripts/ceph-rgw.sh stop-daemon``/``start-daemon``). Returns once
    a stopped gateway is gone or a stopped OSD is marked down, a started gateway answers, or a
    started OSD is up with every placement group active+clean; raises otherwise. The script
    bounds each of its waits; ``deadline_s`` bounds the whole."""
    script = ROOT / "scripts" / "ceph-rgw.sh"
    try:
        p = subprocess.run(["bash", str(script), f"{verb}-daemon", str(cluster["directory"]), name],
                           capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"ceph-rgw.sh {verb}-daemon {name}: no end within {deadline_s:.0f} s") from exc
    if p.returncode != 0:
        supervisor = (Path(cluster["directory"]) / "supervisor.out").read_text(errors="replace")[-2000:]
        raise AssertionError(f"ceph-rgw.sh {verb}-daemon {name} failed ({p.returncode}):\n{p.stderr[-3000:]}\n"
                             f"supervisor:\n{supervisor}")


def _create_bucket_signed(endpoint: str, access_key: str, secret_key: str) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=f"http://{endpoint}", aws_access_key_id=access_key,
                          aws_secret_access_key=secret_key, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
    client.create_bucket(Bucket=BUCKET)


_started: list[dict] | None = None


def start_all() -> list[dict]:
    """The servers of this process, started on the first call (later calls share them)."""
    global _started
    if _started is None:
        _started = _start_all()
    return [dict(c) for c in _started]


def _start_all() -> list[dict]:
    s3s_fs = find_program("s3s-fs", ROOT / "tools" / "bin" / "s3s-fs")
    moto = find_program("moto_server", ROOT / "tools" / "venv" / "bin" / "moto_server")
    root = Path(tempfile.mkdtemp(prefix="kvtier-s3s-fs-"))
    atexit.register(shutil.rmtree, root, True)
    (root / BUCKET).mkdir()
    s3s_port, _ = serve(lambda p: s3s_fs_argv(s3s_fs, p, root, ACCESS_KEY, SECRET_KEY), "s3s-fs")
    moto_port, _ = serve(lambda p: moto_argv(moto, p), "moto")
    status = _request(moto_port, "PUT", f"/{BUCKET}")
    if status != 200:
        raise RuntimeError(f"moto: creating bucket {BUCKET} answered {status}")
    common = {"bucket": BUCKET, "scheme": "http", "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
              "region": "us-east-1"}
    rgw = start_rgw()
    _create_bucket_signed(rgw["endpoint"], rgw["access_key"], rgw["secret_key"])
    return [
        dict(common, endpoint_override=f"127.0.0.1:{s3s_port}", _id="s3s-fs"),
        dict(common, endpoint_override=f"127.0.0.1:{moto_port}", _id="moto"),
        dict(common, endpoint_override=rgw["endpoint"], access_key=rgw["access_key"],
             secret_key=rgw["secret_key"], _id="ceph-rgw"),
    ]
