#!/usr/bin/env bash
# A small Ceph cluster with two RADOS Gateways (S3) on loopback, for the S3 tests.
#
#   scripts/ceph-rgw.sh install                 install radosgw, ceph-mon, ceph-osd (Debian/Ubuntu) if missing
#   scripts/ceph-rgw.sh run DIR PORT [PORT2]    set up a fresh cluster in DIR, serve S3 on 127.0.0.1:PORT
#                                               (gateway rgw.1) and PORT2 (rgw.2; a free port if not given),
#                                               stay in the foreground; the daemons die with this script
#   scripts/ceph-rgw.sh start [DIR]             the same, detached; prints the endpoints and keys
#   scripts/ceph-rgw.sh stop [DIR]              stops a cluster started with `start`
#   scripts/ceph-rgw.sh stop-daemon DIR NAME    stops one daemon of a running cluster (NAME: osd.0, osd.1,
#                                               osd.2, rgw.1, rgw.2); returns once it is gone (an OSD:
#                                               and marked down by the monitor)
#   scripts/ceph-rgw.sh start-daemon DIR NAME   starts it again; returns once a gateway answers on its
#                                               port, or an OSD is up and every placement group is
#                                               active+clean again
#   scripts/ceph-rgw.sh wait-clean DIR [SECONDS]  waits (60 s by default) until every placement group
#                                               is active+clean
#
# The cluster: one monitor on 127.0.0.1 (msgr v1, no manager: nothing here needs one), three
# OSDs on memstore (data in memory), `auth none`, and two radosgw gateways (beast frontend)
# of the same zone, so the same buckets and users, on two ports. Every pool, radosgw's own
# included (the defaults are set before radosgw creates them), is replicated 3 times across
# the three OSDs (crush places replicas on distinct OSDs of the one host, `osd crush
# chooseleaf type = 0`) with min_size 2: with one OSD down each placement group still has 2
# copies, enough to stay writable, and a write acknowledged then is still on two OSDs (size 2
# with min_size 1 would also stay writable, on one copy only). Two S3 users are created with
# radosgw-admin (kvtier, and kvtier-nolist for bucket-policy tests). When it is ready, DIR/env
# holds RGW_ENDPOINT (gateway rgw.1), RGW_ENDPOINT_2 (gateway rgw.2), RGW_ACCESS_KEY,
# RGW_SECRET_KEY, RGW_NOLIST_ACCESS_KEY and RGW_NOLIST_SECRET_KEY (shell syntax). Logs are
# in DIR/log.
#
# Supervision: every daemon is a child of the script that runs the cluster (`run`), started
# with a parent-death signal, so the whole cluster dies with that script and nothing leaks.
# A daemon that exits is logged and the cluster runs on without it (only the monitor's exit
# ends the cluster: nothing works without it). stop-daemon and start-daemon do not touch the
# daemons themselves: they send the running script a request through the FIFO DIR/control and
# wait (bounded) for its answer in DIR/answers, so a daemon started again is again the
# script's child. An OSD is stopped with SIGTERM: it asks the monitor to mark it down at once
# (no heartbeat grace), and, with `osd fast shutdown = false`, memstore writes its data into
# DIR/osd at shutdown and reads it back at start, so a restarted OSD rejoins with its data
# and recovers only what was written while it was down.
#
# Traps this avoids: an OSD that sends the monitor commands at start (its crush location,
# its device class) sometimes exits on a fresh machine ("mon_cmd_maybe_osd_create fail:
# 'wrong fsid'", the command going out before the OSD has the monitor's map), so the OSDs are
# added to the crush map here and both of their own updates are off;
# a monitor refuses to start when the file system under its data has less than 5% of its
# size free ("mon data avail crit"), which on a large shared disk can be many free GiB,
# so that check is off (the cluster's data is in memory);
# memstore keeps data across an OSD restart only with `osd fast shutdown = false`;
# two gateways starting at once on a fresh cluster both create the zone's pools, so the
# second starts once the first answers;
# without a manager, `ceph pg stat` knows nothing, and an OSD's admin socket calls an
# undersized PG Active/Clean: each placement group's state is asked of the PG itself.
set -euo pipefail

# The S3 user's keys (the tests pass their own), and a second user, kvtier-nolist, that
# owns nothing: a bucket policy can grant it object access without s3:ListBucket.
ACCESS_KEY="${RGW_ACCESS_KEY:-kvtier-rgw-access}"
SECRET_KEY="${RGW_SECRET_KEY:-kvtier-rgw-secret-Vb71qZ}"
NOLIST_ACCESS_KEY="${RGW_NOLIST_ACCESS_KEY:-kvtier-rgw-nolist}"
NOLIST_SECRET_KEY="${RGW_NOLIST_SECRET_KEY:-kvtier-rgw-nolist-secret-8sQw}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "ceph-rgw: $*" >&2; exit 1; }

have_binaries() {
    command -v radosgw >/dev/null && command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null \
        && command -v radosgw-admin >/dev/null && command -v monmaptool >/dev/null && command -v ceph >/dev/null
}

install() {
    if have_binaries; then
        return 0
    fi
    command -v apt-get >/dev/null || die "radosgw, ceph-mon and ceph-osd are missing and there is no apt-get to install them"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "ceph-rgw: installing radosgw ceph-mon ceph-osd with apt-get" >&2
    # An index that does not know the packages yet is refreshed once.
    if ! apt-cache show radosgw >/dev/null 2>&1; then
        $sudo apt-get update -q
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends radosgw ceph-mon ceph-osd \
        || die "apt-get install radosgw ceph-mon ceph-osd failed"
    have_binaries || die "radosgw, ceph-mon, ceph-osd, radosgw-admin, monmaptool or ceph still missing after install"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until "$@" succeeds, up to $1 seconds (the first argument), or dies naming $2.
wait_for() {
    local seconds=$1 what=$2 deadline
    shift 2
    deadline=$(( $(date +%s) + seconds ))
    until "$@" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "ceph-rgw: $what not ready within ${seconds}s; last log lines:" >&2
            tail -n 30 "$DIR"/log/*.log "$DIR"/log/*.out >&2 2>/dev/null || true
            return 1
        fi
        check_children
        sleep 0.2
    done
}

OSDS=(0 1 2)
GATEWAYS=(1 2)
declare -A PID=()

# The command line of daemon NAME (mon.a, osd.N, rgw.N), in the foreground.
daemon_argv() {
    case "$1" in
        mon.a) echo ceph-mon -c "$CONF" -f -i a ;;
        osd.[0-9]) echo ceph-osd -c "$CONF" -f -i "${1#osd.}" ;;
        rgw.[0-9]) echo radosgw -c "$CONF" -f -n "client.$1" ;;
        *) return 1 ;;
    esac
}

# Starts daemon NAME in the foreground as a child of this script; it is killed if this
# script dies (parent-death signal), so a killed test run leaves nothing behind.
launch() {
    local name=$1 argv
    argv=$(daemon_argv "$name") || die "no daemon $name"
    # shellcheck disable=SC2086 # the paths in $CONF's directory hold no spaces (checked in run)
    setpriv --pdeathsig KILL $argv >>"$DIR/log/daemons.out" 2>&1 &
    PID[$name]=$!
}

# During start-up every daemon must live.
check_children() {
    local name
    for name in "${!PID[@]}"; do
        kill -0 "${PID[$name]}" 2>/dev/null || { echo "ceph-rgw: $name (pid ${PID[$name]}) exited during start-up" >&2; tail -n 30 "$DIR"/log/*.log "$DIR"/log/*.out >&2 2>/dev/null || true; exit 1; }
    done
}

cleanup() {
    local name
    # The cluster's data is thrown away with it: no daemon needs a clean shutdown.
    for name in "${!PID[@]}"; do
        kill -KILL "${PID[$name]}" 2>/dev/null || true
    done
    for name in "${!PID[@]}"; do
        wait "${PID[$name]}" 2>/dev/null || true
    done
}

ceph_() { timeout 30 ceph -c "$CONF" --connect-timeout 10 "$@"; }

# Whether the monitor's map shows osd.$1 as $2 (up or down).
osd_is() { ceph_ osd dump 2>/dev/null | grep -q "^osd\.$1 $2 "; }
all_osds_up() { [ "$(ceph_ osd dump 2>/dev/null | grep -c '^osd\.[0-9]* up ')" -eq "${#OSDS[@]}" ]; }
port_answers() { python3 - "$1" <<'EOF'
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=5).read()
EOF
}

# Whether every placement group of every pool is active+clean. Without a manager the
# monitor knows no PG states, and an OSD's own view of its PGs (its admin socket's
# dump_pgstate_history) says Active/Clean for an undersized PG too; so each PG is asked
# itself (`pg query`, answered by its primary OSD), in one process through the rados module
# of the Python the ceph command runs on.
pgs_clean() {
    local python
    python=$(sed -n '1s/^#! *//p' "$(command -v ceph)")
    timeout 60 ${python:-python3} - "$CONF" <<'EOF'
import json, sys
import rados

with rados.Rados(conffile=sys.argv[1]) as cluster:
    ret, out, err = cluster.mon_command(json.dumps({"prefix": "osd dump", "format": "json"}), b"", timeout=10)
    if ret != 0:
        sys.exit(f"osd dump: {err}")
    pools = json.loads(out)["pools"]
    for pg in (f"{pool['pool']}.{i:x}" for pool in pools for i in range(pool["pg_num"])):
        ret, out, err = cluster.pg_command(pg, json.dumps({"prefix": "query", "pgid": pg, "format": "json"}), b"",
                                           timeout=10)
        state = json.loads(out)["state"] if ret == 0 else f"unknown ({err})"
        if state != "active+clean":
            sys.exit(f"pg {pg} is {state}")
EOF
}

# The port of gateway rgw.$1, from DIR/env.
gateway_port() {
    local var=RGW_ENDPOINT
    [ "$1" = 1 ] || var=RGW_ENDPOINT_$1
    sed -n "s/^$var=127\.0\.0\.1://p" "$DIR/env"
}

# Creates osd.$1: in the monitor's map, its memstore, its place in the crush map.
setup_osd() {
    local osd=$1 uuid
    uuid=$(cat /proc/sys/kernel/random/uuid)
    mkdir -p "$DIR/osd/ceph-$osd"
    wait_for 60 "osd create $osd" ceph_ osd create "$uuid" "$osd"
    ceph-osd -c "$CONF" -i "$osd" --mkfs --osd-uuid "$uuid" >>"$DIR/log/setup-osd.$osd.out" 2>&1 || return 1
    wait_for 60 "crush add osd.$osd" ceph_ osd crush add "osd.$osd" 1.0 host=node1 root=default
}

run() {
    DIR=$(mkdir -p "$1" && cd "$1" && pwd)
    PORT=$2
    PORT2=${3:-$(free_port)}
    case "$DIR" in *[[:space:]]*) die "the cluster's directory must not contain spaces: $DIR" ;; esac
    have_binaries || die "radosgw, ceph-mon or ceph-osd not installed: run $0 install (or scripts/install-tools.sh)"
    trap cleanup EXIT
    trap 'exit 143' TERM INT
    rm -rf "${DIR:?}"/{mon,osd,run,log,rgw,env,monmap,ceph.conf,control,answers}
    mkdir -p "$DIR"/{mon,run,log,rgw,answers}
    echo $$ >"$DIR/supervisor.pid"
    mkfifo "$DIR/control"
    local fsid mon_port osd gw
    fsid=$(cat /proc/sys/kernel/random/uuid)
    mon_port=$(free_port)
    CONF="$DIR/ceph.conf"
    cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon initial members = a
mon host = v1:127.0.0.1:$mon_port
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
run dir = $DIR/run
admin socket = $DIR/run/\$name.asok
pid file = $DIR/run/\$name.pid
log file = $DIR/log/\$name.log
log to stderr = false
err to stderr = false
mon data = $DIR/mon/\$cluster-\$id
osd data = $DIR/osd/\$cluster-\$id
keyring = $DIR/keyring
osd pool default size = 3
osd pool default min size = 2
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon osd down out interval = 0
mon data avail crit = 0
mon data avail warn = 0
mon allow pool delete = true
paxos propose interval = 0.1
mon max pg per osd = 1000
mon osd full ratio = .99
mon osd nearfull ratio = .98
mon osd backfillfull ratio = .985
osd objectstore = memstore
memstore device bytes = 2147483648
osd crush update on start = false
osd class update on start = false
osd fast shutdown = false
osd recovery sleep = 0
osd max object name len = 460
osd max object namespace len = 64
osd op num threads per shard = 1
osd op num shards = 2

[client.rgw.1]
rgw frontends = beast endpoint=127.0.0.1:$PORT
rgw data = $DIR/rgw/1
rgw thread pool size = 64
rgw enable usage log = false

[client.rgw.2]
rgw frontends = beast endpoint=127.0.0.1:$PORT2
rgw data = $DIR/rgw/2
rgw thread pool size = 64
rgw enable usage log = false
EOF
    : >"$DIR/keyring"
    monmaptool --create --clobber --fsid "$fsid" --addv a "[v1:127.0.0.1:$mon_port]" "$DIR/monmap" >/dev/null
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" >>"$DIR/log/setup.out" 2>&1 || die "ceph-mon --mkfs failed (see $DIR/log)"
    launch mon.a
    wait_for 60 "the monitor" ceph_ mon stat

    # The OSDs: created, given their place in the crush map by us (their own update at
    # start is switched off; `crush add` with a location creates the host), then started.
    # A monitor that answers `mon stat` may still refuse commands for a moment on a busy
    # machine ("EPERM: problem getting command descriptions"): each (idempotent) command is
    # repeated until it succeeds. The three OSDs are set up side by side.
    local setup=()
    for osd in "${OSDS[@]}"; do
        setup_osd "$osd" &
        setup+=($!)
    done
    for osd in "${!setup[@]}"; do
        wait "${setup[$osd]}" || die "setting up osd.$osd failed (see $DIR/log)"
    done
    for osd in "${OSDS[@]}"; do
        launch "osd.$osd"
    done
    wait_for 60 "the OSDs" all_osds_up

    # The first gateway creates the zone's pools; the second starts once it answers.
    launch rgw.1
    wait_for 120 "radosgw rgw.1 on 127.0.0.1:$PORT" port_answers "$PORT"
    launch rgw.2
    radosgw-admin -c "$CONF" -n client.admin user create --uid=kvtier --display-name=kvtier \
        --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >>"$DIR/log/setup.out" 2>&1 \
        || die "radosgw-admin user create failed (see $DIR/log/setup.out)"
    radosgw-admin -c "$CONF" -n client.admin user create --uid=kvtier-nolist --display-name=kvtier-nolist \
        --access-key="$NOLIST_ACCESS_KEY" --secret-key="$NOLIST_SECRET_KEY" >>"$DIR/log/setup.out" 2>&1 \
        || die "radosgw-admin user create failed (see $DIR/log/setup.out)"
    wait_for 120 "radosgw rgw.2 on 127.0.0.1:$PORT2" port_answers "$PORT2"
    cat >"$DIR/env.tmp" <<EOF
RGW_ENDPOINT=127.0.0.1:$PORT
RGW_ENDPOINT_2=127.0.0.1:$PORT2
RGW_ACCESS_KEY=$ACCESS_KEY
RGW_SECRET_KEY=$SECRET_KEY
RGW_NOLIST_ACCESS_KEY=$NOLIST_ACCESS_KEY
RGW_NOLIST_SECRET_KEY=$NOLIST_SECRET_KEY
EOF
    mv "$DIR/env.tmp" "$DIR/env"
    echo "ceph-rgw: ready on 127.0.0.1:$PORT and 127.0.0.1:$PORT2 (data in memory, logs in $DIR/log)" >&2
    supervise
}

# Serves until told to stop: answers stop/start requests, and logs daemons that exit.
supervise() {
    local verb name id
    exec 3<>"$DIR/control"  # read-write: opening never blocks, and writers never see EOF
    while true; do
        if read -r -t 0.5 -u 3 verb name id; then
            handle "$verb" "$name"  # in this shell (not a subshell): a started daemon is its child
            printf '%s\n' "$ANSWER" >"$DIR/answers/$id.tmp"
            mv "$DIR/answers/$id.tmp" "$DIR/answers/$id"
        fi
        for name in "${!PID[@]}"; do
            kill -0 "${PID[$name]}" 2>/dev/null && continue
            if [ "$name" = mon.a ]; then
                echo "ceph-rgw: the monitor exited; stopping the cluster" >&2
                exit 1
            fi
            echo "ceph-rgw: $name (pid ${PID[$name]}) exited; the cluster runs on without it" >&2
            unset "PID[$name]"
        done
    done
}

# The daemons stop-daemon and start-daemon take.
stoppable() { [[ " ${OSDS[*]/#/osd.} ${GATEWAYS[*]/#/rgw.} " == *" $1 "* ]]; }

# One request: stop or start daemon NAME; sets ANSWER to "ok" or what went wrong.
handle() {
    local verb=$1 name=$2 pid
    ANSWER=ok
    if ! stoppable "$name"; then
        ANSWER="no daemon $name to $verb (osd.0-$(( ${#OSDS[@]} - 1 )) or rgw.1-${#GATEWAYS[@]})"
        return 0
    fi
    pid=${PID[$name]:-}
    case "$verb" in
        stop)
            if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
                ANSWER="$name is not running"
                return 0
            fi
            # SIGTERM: an OSD asks to be marked down and writes memstore's data out first.
            kill -TERM "$pid"
            local deadline=$(( $(date +%s) + 60 ))
            while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
                sleep 0.1
            done
            unset "PID[$name]"
            if kill -0 "$pid" 2>/dev/null; then
                kill -KILL "$pid"
                ANSWER="$name did not exit within 60 s of SIGTERM and was killed"
                return 0
            fi
            echo "ceph-rgw: $name stopped" >&2 ;;
        start)
            if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
                ANSWER="$name is already running"
                return 0
            fi
            launch "$name"
            echo "ceph-rgw: $name started (pid ${PID[$name]})" >&2 ;;
        *) ANSWER="unknown request $verb" ;;
    esac
}

# Sends the running cluster in $DIR the request "$1 $2" and waits (bounded) for its answer.
request() {
    local verb=$1 name=$2 id answer deadline pid
    [ -p "$DIR/control" ] && [ -f "$DIR/supervisor.pid" ] || die "no cluster in $DIR"
    pid=$(cat "$DIR/supervisor.pid")
    kill -0 "$pid" 2>/dev/null || die "the cluster in $DIR is not running (supervisor pid $pid)"
    id="$$-$RANDOM$RANDOM"
    timeout 10 bash -c 'printf "%s\n" "$1" >"$2"' _ "$verb $name $id" "$DIR/control" \
        || die "could not send '$verb $name' to the cluster in $DIR"
    deadline=$(( $(date +%s) + 90 ))
    until [ -f "$DIR/answers/$id" ]; do
        kill -0 "$pid" 2>/dev/null || die "the cluster in $DIR stopped before answering '$verb $name'"
        [ "$(date +%s)" -lt "$deadline" ] || die "no answer to '$verb $name' within 90 s"
        sleep 0.1
    done
    answer=$(cat "$DIR/answers/$id")
    rm -f "$DIR/answers/$id"
    [ "$answer" = ok ] || die "$verb $name: $answer"
}

client_dir() {
    DIR=$(cd "$1" 2>/dev/null && pwd) || die "no cluster directory $1"
    CONF="$DIR/ceph.conf"
    [ -f "$CONF" ] || die "no cluster in $DIR"
}

stop_daemon() {
    client_dir "$1"
    local name=$2
    request stop "$name"
    case "$name" in
        osd.*) wait_for 60 "$name marked down" osd_is "${name#osd.}" down ;;
    esac
    echo "ceph-rgw: $name stopped" >&2
}

start_daemon() {
    client_dir "$1"
    local name=$2 port
    request start "$name"
    case "$name" in
        osd.*)
            wait_for 60 "$name up" osd_is "${name#osd.}" up
            wait_for 120 "every placement group active+clean after $name's start" pgs_clean ;;
        rgw.*)
            port=$(gateway_port "${name#rgw.}")
            wait_for 60 "radosgw $name on 127.0.0.1:$port" port_answers "$port" ;;
    esac
    echo "ceph-rgw: $name started" >&2
}

wait_clean() {
    client_dir "$1"
    wait_for "${2:-60}" "every placement group active+clean" pgs_clean
}

start() {
    local dir=${1:-$REPO/target/ceph-rgw} port
    mkdir -p "$dir"
    if [ -f "$dir/supervisor.pid" ] && kill -0 "$(cat "$dir/supervisor.pid")" 2>/dev/null; then
        die "a cluster is already running in $dir (stop it first: $0 stop $dir)"
    fi
    port=${KVTIER_RGW_PORT:-$(free_port)}
    rm -f "$dir/env"
    setsid "$0" run "$dir" "$port" >"$dir/supervisor.out" 2>&1 </dev/null &
    echo $! >"$dir/supervisor.pid"
    local deadline=$(( $(date +%s) + 240 ))
    until [ -f "$dir/env" ]; do
        kill -0 "$(cat "$dir/supervisor.pid")" 2>/dev/null || { cat "$dir/supervisor.out" >&2; die "start-up failed"; }
        [ "$(date +%s)" -lt "$deadline" ] || { cat "$dir/supervisor.out" >&2; stop "$dir"; die "not ready within 240 s"; }
        sleep 0.5
    done
    cat "$dir/env"
}

stop() {
    local dir=${1:-$REPO/target/ceph-rgw} pid
    [ -f "$dir/supervisor.pid" ] || { echo "ceph-rgw: nothing started in $dir" >&2; return 0; }
    pid=$(cat "$dir/supervisor.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$dir/supervisor.pid" "$dir/env"
}

case "${1:-}" in
    install) install ;;
    run) [ $# -eq 3 ] || [ $# -eq 4 ] || die "usage: $0 run DIR PORT [PORT2]"; run "$2" "$3" "${4:-}" ;;
    start) start "${2:-}" ;;
    stop) stop "${2:-}" ;;
    stop-daemon) [ $# -eq 3 ] || die "usage: $0 stop-daemon DIR NAME"; stop_daemon "$2" "$3" ;;
    start-daemon) [ $# -eq 3 ] || die "usage: $0 start-daemon DIR NAME"; start_daemon "$2" "$3" ;;
    wait-clean) [ $# -ge 2 ] || die "usage: $0 wait-clean DIR [SECONDS]"; wait_clean "$2" "${3:-}" ;;
    *) die "usage: $0 install | run DIR PORT [PORT2] | start [DIR] | stop [DIR] | stop-daemon DIR NAME | start-daemon DIR NAME | wait-clean DIR [SECONDS]" ;;
esac
