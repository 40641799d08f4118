#!/usr/bin/env bash
# Tests kvtier for aarch64 on this x86_64 machine, under user-mode emulation: qemu-aarch64
# with Debian's own arm64 C library, libstdc++ and CPython 3.11 (tools/aarch64-root, from
# scripts/install-tools.sh).
#
# 1. wheel: scripts/build-wheel.sh --arch aarch64 gives kvtier-…-py3-none-manylinux_2_28_aarch64,
#    which auditwheel finds consistent with that tag; its library is an aarch64 ELF that
#    exports exactly kvtier.h's functions (scripts/check-library.sh);
# 2. unit-tests: the library's unit tests built for aarch64 (cargo zigbuild) and run under
#    emulation; among them, crc-fast's PMULL CRC32C path checked against the bit-by-bit
#    definition over every length and alignment up to 600 bytes and large buffers;
# 3. prefix: scripts/install.sh --arch aarch64 into a fresh prefix; the C examples, the
#    C++ layer-first example and the C harness built against it with Debian's aarch64 cross
#    compilers and `pkg-config --cflags --libs kvtier`, each binary an aarch64 ELF;
# 4. examples and harness: run under emulation (the harness's many-jobs case shrunk to
#    100 jobs, its deadlines x10 for the emulator's speed; every other case as on x86_64
#    but fork, which the emulator cannot run reliably: see below);
# 5. s3-servers: the harness's range round trips and the layer-first example against real
#    s3s-fs, moto and Ceph RGW (ffi-tests/on_s3_servers.py), run under emulation;
# 6. python: Debian's aarch64 CPython makes a venv, installs the wheel with its own pip
#    (which must accept the manylinux_2_28_aarch64 tag, offline), and runs
#    scripts/wheel-smoke.py (the bundled library loaded; store, lookup, load byte-exact).
#
# Last line: "N passed, M failed" over the checks; non-zero exit status on any failure.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AROOT=$ROOT/tools/aarch64-root
if [[ ! -x $AROOT/usr/bin/python3.11 ]] || ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    "$ROOT/scripts/install-tools.sh" || exit 1
fi
mkdir -p "$ROOT/target"
WORK=$(mktemp -d "$ROOT/target/test-aarch64.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export TMPDIR=$WORK/tmp # the examples' and the harness's temporary stores
# Each check's whole output, kept after the run.
LOGS=$ROOT/target/test-logs/aarch64
rm -rf "$LOGS"
mkdir -p "$TMPDIR" "$LOGS"
# qemu-aarch64 -L: the loader and every absolute path the program opens are looked up in
# the arm64 root first (/lib/ld-linux-aarch64.so.1, /usr/lib/aarch64-linux-gnu, …).
EMULATE=(qemu-aarch64 -L "$AROOT")
CHECK_LOGS=$LOGS
# shellcheck source=scripts/checks.sh
source "$ROOT/scripts/checks.sh"

# 1. The wheel. ---------------------------------------------------------------------------
WHEEL=
wheel() {
    WHEEL=$("$ROOT/scripts/build-wheel.sh" --arch aarch64 --copy-to "$WORK/dist" | tail -n 1) || return 1
    "$ROOT/scripts/check-wheel.sh" "$WHEEL" aarch64
}
check wheel wheel

# 2. The unit tests, under emulation. ----------------------------------------------------
unit_tests() {
    # The same glibc floor and zig link as the library itself (scripts/build-library.sh
    # made the tools); cargo runs each test binary through the emulator.
    PATH=$ROOT/tools/packaging-venv/bin:$PATH \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $AROOT" \
        cargo-zigbuild test --release --lib --target aarch64-unknown-linux-gnu.2.28 -- --nocapture 2>&1 |
        tee "$LOGS/unit-tests-full.log" | grep -E "^(test |checksum path|test result)" || true
    grep -q "^checksum path: aarch64-neon-pmull" "$LOGS/unit-tests-full.log" || {
        echo "the CRC32C test did not run on crc-fast's PMULL path"
        return 1
    }
    # One result line per crate's library (kvtier-core's and the C ABI's): none may fail.
    ! grep -q "^test result: FAILED" "$LOGS/unit-tests-full.log" &&
        grep -qE "^test result: ok\. [1-9][0-9]* passed; 0 failed" "$LOGS/unit-tests-full.log"
}
check unit-tests unit_tests

# 3. An aarch64 prefix, and the C programs built against it. -----------------------------
PREFIX=$WORK/prefix
BIN=$WORK/bin
CFLAGS_COMMON=(-Wall -Wextra -Werror -pedantic -O1 -g)
prefix() {
    "$ROOT/scripts/install.sh" --prefix "$PREFIX" --arch aarch64 --no-build || return 1
    "$ROOT/scripts/check-library.sh" "$PREFIX/lib/libkvtier.so.0" aarch64 || return 1
    local kvtier
    # pkg-config as an aarch64 build would use it: the installed kvtier.pc, nothing of the host's.
    kvtier=$(PKG_CONFIG_LIBDIR=$PREFIX/lib/pkgconfig pkg-config --cflags --libs kvtier) || return 1
    mkdir -p "$BIN"
    local link=(-pthread -Wl,-rpath,"$PREFIX/lib")
    aarch64-linux-gnu-gcc -std=c11 "${CFLAGS_COMMON[@]}" "$ROOT/examples-c/offload.c" -o "$BIN/offload" $kvtier "${link[@]}" &&
        aarch64-linux-gnu-gcc -std=c11 "${CFLAGS_COMMON[@]}" "$ROOT/examples-c/lookups_events.c" -o "$BIN/lookups_events" $kvtier "${link[@]}" &&
        aarch64-linux-gnu-g++ -std=c++17 "${CFLAGS_COMMON[@]}" "$ROOT/examples-c/layer_first.cpp" -o "$BIN/layer_first" $kvtier "${link[@]}" &&
        aarch64-linux-gnu-gcc -std=c11 "${CFLAGS_COMMON[@]}" "$ROOT"/ffi-tests/harness/*.c -o "$BIN/harness" $kvtier "${link[@]}" || return 1
    local program
    for program in offload lookups_events layer_first harness; do
        [[ $(readelf -h "$BIN/$program") =~ Machine:\ *AArch64 ]] || {
            echo "$program is not an aarch64 program"
            return 1
        }
    done
    echo "offload, lookups_events, layer_first and harness built for aarch64 against $PREFIX ($kvtier)"
}
check prefix prefix

# 4. The examples and the harness, under emulation. --------------------------------------
# The library each program loads must be the prefix's aarch64 one.
loads_the_prefix() {
    local loaded
    loaded=$("${EMULATE[@]}" -E LD_TRACE_LOADED_OBJECTS=1 "$BIN/offload") || return 1
    grep -q "libkvtier.so.0 => $PREFIX/lib/libkvtier.so.0 " <<<"$loaded" || {
        echo "$loaded"
        return 1
    }
    echo "offload loads $PREFIX/lib/libkvtier.so.0"
}
check loads-the-prefix loads_the_prefix
check example-offload "${EMULATE[@]}" "$BIN/offload"
check example-lookups "${EMULATE[@]}" "$BIN/lookups_events"
check example-layer-first "${EMULATE[@]}" "$BIN/layer_first"
# Every case but fork: a child forked by this multithreaded program hangs, now and then,
# when it starts threads of its own under the emulator: its one guest thread waits on a
# futex in qemu-aarch64's own data (qemu's lock, not the program's; Debian 12's qemu 7.2
# aborts there instead). The fork case runs natively in ffi-tests/run.sh, plainly, as C++
# and under valgrind.
check harness env KVT_HARNESS_SMALL=1 KVT_HARNESS_TIMEOUT_SCALE=10 KVT_HARNESS_SKIP=fork "${EMULATE[@]}" "$BIN/harness"

# 5. Real S3 servers, from the emulated library. -----------------------------------------
check s3-servers "$ROOT/tools/venv/bin/python" "$ROOT/ffi-tests/on_s3_servers.py" \
    -- env KVT_HARNESS_TIMEOUT_SCALE=10 "${EMULATE[@]}" "$BIN/harness" ranges_on_store \
    -- "${EMULATE[@]}" "$BIN/layer_first"

# 6. Python on aarch64. ------------------------------------------------------------------
python_smoke() {
    [[ -n $WHEEL ]] || {
        echo "no wheel (see the wheel check)"
        return 1
    }
    local venv=$WORK/venv-aarch64
    # Debian's pip (architecture-free, in the root's dist-packages) through the venv's
    # system site packages; the wheel goes into the venv itself.
    "${EMULATE[@]}" "$AROOT/usr/bin/python3.11" -m venv --without-pip --system-site-packages "$venv" || return 1
    "${EMULATE[@]}" "$venv/bin/python" -c 'import platform, sys; assert platform.machine() == "aarch64", platform.machine(); print(sys.version)' || return 1
    # Offline, and with no pip configuration of this machine's.
    local pip_env=(-E PIP_NO_INDEX=1 -E PIP_DISABLE_PIP_VERSION_CHECK=1 -E PIP_CONFIG_FILE=/dev/null)
    "${EMULATE[@]}" "${pip_env[@]}" "$venv/bin/python" -m pip install --no-cache-dir "$WHEEL" || return 1
    "${EMULATE[@]}" "${pip_env[@]}" "$venv/bin/python" -m pip show --files kvtier >"$WORK/pip-show.txt" || return 1
    grep -qx '  kvtier/libkvtier.so' "$WORK/pip-show.txt" || {
        echo "pip show lists no kvtier/libkvtier.so:"
        cat "$WORK/pip-show.txt"
        return 1
    }
    mkdir -p "$WORK/run"
    (cd "$WORK/run" && "${EMULATE[@]}" "$venv/bin/python" -I "$ROOT/scripts/wheel-smoke.py")
}
check python python_smoke

checks_summary
