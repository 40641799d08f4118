#!/usr/bin/env bash
# A one-node Ceph cluster with the RADOS Gateway (S3) on loopback, for the S3 tests.
#
#   scripts/ceph-rgw.sh install          install radosgw, ceph-mon, ceph-osd (Debian/Ubuntu) if missing
#   scripts/ceph-rgw.sh run DIR PORT     set up a fresh cluster in DIR, serve S3 on 127.0.0.1:PORT,
#                                        stay in the foreground; the daemons die with this script
#   scripts/ceph-rgw.sh start [DIR]      the same, detached; prints the endpoint and keys
#   scripts/ceph-rgw.sh stop [DIR]       stops a cluster started with `start`
#
# The cluster: one monitor on 127.0.0.1 (msgr v1), one OSD on memstore (data in memory),
# `auth none`, pools of size 1, radosgw with the beast frontend, and two S3 users created
# with radosgw-admin (kvtier, and kvtier-nolist for bucket-policy tests). When it is ready,
# DIR/env holds RGW_ENDPOINT, RGW_ACCESS_KEY, RGW_SECRET_KEY, RGW_NOLIST_ACCESS_KEY and
# RGW_NOLIST_SECRET_KEY (shell syntax). Logs are in DIR/log.
#
# Traps this avoids: an OSD that sends the monitor commands at start (its crush location,
# its device class) sometimes exits on a fresh machine ("mon_cmd_maybe_osd_create fail:
# 'wrong fsid'", the command going out before the OSD has the monitor's map), so it is
# added to the crush map here and both of its own updates are off;
# a monitor refuses to start when the file system under its data has less than 5% of its
# size free ("mon data avail crit"), which on a large shared disk can be many free GiB,
# so that check is off (the cluster's data is in memory);
# memstore keeps data across an OSD restart only with `osd fast shutdown = false`; the
# default 32 PGs per pool would exceed the PG limit of a single OSD once radosgw has
# created its pools.
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

PIDS=()
check_children() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null || { echo "ceph-rgw: a daemon (pid $pid) exited during start-up" >&2; tail -n 30 "$DIR"/log/*.log "$DIR"/log/*.out >&2 2>/dev/null || true; exit 1; }
    done
}

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}

# Starts a daemon in the foreground as a child of this script; it is killed if this
# script dies (parent-death signal), so a killed test run leaves nothing behind.
daemon() {
    setpriv --pdeathsig KILL "$@" >>"$DIR/log/daemons.out" 2>&1 &
    PIDS+=($!)
}

ceph_() { timeout 30 ceph -c "$CONF" --connect-timeout 10 "$@"; }

osd_up() { ceph_ osd dump 2>/dev/null | grep -q '^osd.0 up'; }
rgw_up() { python3 - "$PORT" <<'EOF'
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=5).read()
EOF
}

run() {
    DIR=$(mkdir -p "$1" && cd "$1" && pwd)
    PORT=$2
    have_binaries || die "radosgw, ceph-mon or ceph-osd not installed: run $0 install (or scripts/install-tools.sh)"
    trap cleanup EXIT
    trap 'exit 143' TERM INT
    rm -rf "${DIR:?}"/{mon,osd,run,log,rgw,env,monmap,ceph.conf}
    mkdir -p "$DIR"/{mon,osd/ceph-0,run,log,rgw}
    local fsid mon_port osd_uuid
    fsid=$(cat /proc/sys/kernel/random/uuid)
    osd_uuid=$(cat /proc/sys/kernel/random/uuid)
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
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon data avail crit = 0
mon data avail warn = 0
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon osd full ratio = .99
mon osd nearfull ratio = .98
mon osd backfillfull ratio = .985
osd objectstore = memstore
memstore device bytes = 2147483648
osd crush update on start = false
osd class update on start = false
osd fast shutdown = false
osd max object name len = 460
osd max object namespace len = 64
osd op num threads per shard = 1
osd op num shards = 2

[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$PORT
rgw data = $DIR/rgw
rgw thread pool size = 64
rgw enable usage log = false
EOF
    : >"$DIR/keyring"
    monmaptool --create --clobber --fsid "$fsid" --addv a "[v1:127.0.0.1:$mon_port]" "$DIR/monmap" >/dev/null
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" >>"$DIR/log/setup.out" 2>&1 || die "ceph-mon --mkfs failed (see $DIR/log)"
    daemon ceph-mon -c "$CONF" -f -i a
    wait_for 60 "the monitor" ceph_ mon stat

    # The OSD: created, given its place in the crush map by us (its own update at start
    # is switched off), then started.
    # A monitor that answers `mon stat` may still refuse commands for a moment on a busy
    # machine ("EPERM: problem getting command descriptions"): each (idempotent) command
    # is repeated until it succeeds.
    wait_for 60 "osd create" ceph_ osd create "$osd_uuid" 0
    ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$DIR/log/setup.out" 2>&1 || die "ceph-osd --mkfs failed (see $DIR/log)"
    wait_for 60 "crush add-bucket" ceph_ osd crush add-bucket node1 host
    wait_for 60 "crush move" ceph_ osd crush move node1 root=default
    wait_for 60 "crush add" ceph_ osd crush add osd.0 1.0 host=node1
    daemon ceph-osd -c "$CONF" -f -i 0
    wait_for 60 "the OSD" osd_up

    daemon radosgw -c "$CONF" -f -n client.rgw.a
    wait_for 120 "radosgw on 127.0.0.1:$PORT" rgw_up
    radosgw-admin -c "$CONF" -n client.admin user create --uid=kvtier --display-name=kvtier \
        --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >>"$DIR/log/setup.out" 2>&1 \
        || die "radosgw-admin user create failed (see $DIR/log/setup.out)"
    radosgw-admin -c "$CONF" -n client.admin user create --uid=kvtier-nolist --display-name=kvtier-nolist \
        --access-key="$NOLIST_ACCESS_KEY" --secret-key="$NOLIST_SECRET_KEY" >>"$DIR/log/setup.out" 2>&1 \
        || die "radosgw-admin user create failed (see $DIR/log/setup.out)"
    cat >"$DIR/env.tmp" <<EOF
RGW_ENDPOINT=127.0.0.1:$PORT
RGW_ACCESS_KEY=$ACCESS_KEY
RGW_SECRET_KEY=$SECRET_KEY
RGW_NOLIST_ACCESS_KEY=$NOLIST_ACCESS_KEY
RGW_NOLIST_SECRET_KEY=$NOLIST_SECRET_KEY
EOF
    mv "$DIR/env.tmp" "$DIR/env"
    echo "ceph-rgw: ready on 127.0.0.1:$PORT (data in memory, logs in $DIR/log)" >&2
    # Serve until told to stop or until a daemon exits.
    wait -n "${PIDS[@]}" || true
    echo "ceph-rgw: a daemon exited; stopping the cluster" >&2
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
    run) [ $# -eq 3 ] || die "usage: $0 run DIR PORT"; run "$2" "$3" ;;
    start) start "${2:-}" ;;
    stop) stop "${2:-}" ;;
    *) die "usage: $0 install | run DIR PORT | start [DIR] | stop [DIR]" ;;
esac
