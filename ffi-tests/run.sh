#!/usr/bin/env bash
# ffi-tests/run.sh: build libkvtier and run every C/C++ test of its C ABI.
#
#   ffi-tests/run.sh             build, then run all sub-runs
#   ffi-tests/run.sh --strict    also fail on the known library bugs listed below
#   ffi-tests/run.sh --no-valgrind
#
# Sub-runs: the C harness plainly, under ASan+UBSan, built as C++, under valgrind; the
# kvtier.hpp test through dlopen and linked; the C examples; the range round trips of the
# harness and the layer-first example on s3s-fs, moto and Ceph RGW. Everything is built into
# target/ffi-tests/ (override with KVT_FFI_BUILD_DIR); each sub-run's full output is in
# target/ffi-tests/logs/. The last line is "N passed, M failed" over the sub-runs; the
# exit status is non-zero when anything failed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${KVT_FFI_BUILD_DIR:-$ROOT/target/ffi-tests}
LOGS=$BUILD/logs
LIB=$ROOT/target/release/libkvtier.so

STRICT=0
VALGRIND=1
for arg in "$@"; do
    case $arg in
        --strict) STRICT=1 ;;
        --no-valgrind) VALGRIND=0 ;;
        -h | --help)
            sed -n '2,12p' "$0"
            exit 0
            ;;
        *)
            echo "unknown argument: $arg" >&2
            exit 2
            ;;
    esac
done

# Harness cases that fail because of known libkvtier bugs (reported to the library's
# owner; see the XFAIL lines in the output). They still run: a listed case that fails
# is reported as XFAIL, one that passes is reported as XPASS and fails the run, so the
# entry must be removed here once the bug is fixed. --strict tolerates nothing.
KNOWN_BUGS=
if [[ $STRICT == 1 ]]; then
    KNOWN_BUGS=
fi
export KVT_HARNESS_XFAIL=$KNOWN_BUGS

CFLAGS_COMMON=(-Wall -Wextra -Werror -pedantic -O1 -g -I"$ROOT/include")
LINK=(-L"$BUILD" -lkvtier -pthread -Wl,-rpath,'$ORIGIN')
SAN=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)

declare -a NAMES=() RESULTS=() TIMES=()
PASSED=0
FAILED=0
T_START=$SECONDS

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# step NAME CMD...: a build step; any failure stops the script.
step() {
    local name=$1 t0 log=$LOGS/build-$1.log
    shift
    t0=$(now)
    echo "==> build $name: $*"
    if ! "$@" >"$log" 2>&1; then
        cat "$log"
        echo "build step '$name' failed (log: $log)"
        echo "0 passed, 1 failed"
        exit 1
    fi
    echo "    ok ($(elapsed "$t0") s)"
    NAMES+=("build $name")
    RESULTS+=(built)
    TIMES+=("$(elapsed "$t0")")
}

# run NAME CMD...: a test sub-run; its output goes to logs/NAME.log; a failure is counted.
run() {
    local name=$1 t0 rc=0 log=$LOGS/$1.log
    shift
    t0=$(now)
    echo "==> run $name: $*"
    "$@" >"$log" 2>&1 || rc=$?
    local took
    took=$(elapsed "$t0")
    grep -E '^\[ (XFAIL|XPASS) ' "$log" | sed 's/^/    /' || true
    if [[ $rc == 0 ]]; then
        PASSED=$((PASSED + 1))
        RESULTS+=(PASS)
        echo "    PASS in $took s: $(tail -n 1 "$log")"
    else
        FAILED=$((FAILED + 1))
        RESULTS+=("FAIL (exit $rc)")
        echo "    FAIL (exit $rc) in $took s; last 60 lines of $log:"
        tail -n 60 "$log" | sed 's/^/    | /'
    fi
    NAMES+=("run $name")
    TIMES+=("$took")
}

mkdir -p "$BUILD" "$LOGS"
# Fresh sandbox for the tests' temporary stores, removed at exit.
TEST_TMP=$(mktemp -d "$BUILD/tmp.XXXXXX")
trap 'rm -rf "$TEST_TMP"' EXIT
export TMPDIR=$TEST_TMP

# ---- build ----------------------------------------------------------------------------
step libkvtier bash -c "cd '$ROOT' && cargo build --release --lib -q"
# Link against the SONAME (libkvtier.so.0) from the build dir; $ORIGIN rpath finds it.
ln -sf "$LIB" "$BUILD/libkvtier.so.0"
ln -sf libkvtier.so.0 "$BUILD/libkvtier.so"

# The harness is every .c file of ffi-tests/harness/ (main.c holds its case table).
HARNESS=("$ROOT"/ffi-tests/harness/*.c)
step harness-c gcc -std=c11 "${CFLAGS_COMMON[@]}" "${HARNESS[@]}" -o "$BUILD/harness" "${LINK[@]}" -lm
step harness-c-asan gcc -std=c11 "${CFLAGS_COMMON[@]}" "${SAN[@]}" "${HARNESS[@]}" \
    -o "$BUILD/harness-asan" "${LINK[@]}" -lm
step harness-cxx g++ -x c++ -std=c++17 "${CFLAGS_COMMON[@]}" "${HARNESS[@]}" \
    -o "$BUILD/harness-cxx" "${LINK[@]}"
# Not linked with libkvtier: everything comes from dlopen.
step dlopen-test g++ -std=c++17 "${CFLAGS_COMMON[@]}" "$ROOT/ffi-tests/dlopen_test.cpp" \
    -o "$BUILD/dlopen_test" -ldl
step hpp-linked-test g++ -std=c++17 "${CFLAGS_COMMON[@]}" -DKVTIER_HPP_TEST_LINKED \
    "$ROOT/ffi-tests/dlopen_test.cpp" -o "$BUILD/hpp_linked_test" "${LINK[@]}"
step example gcc -std=c11 "${CFLAGS_COMMON[@]}" "$ROOT/examples-c/offload.c" -o "$BUILD/offload" "${LINK[@]}"
step example-lookups gcc -std=c11 "${CFLAGS_COMMON[@]}" "$ROOT/examples-c/lookups_events.c" \
    -o "$BUILD/lookups_events" "${LINK[@]}"
step example-layer-first g++ -std=c++17 "${CFLAGS_COMMON[@]}" "$ROOT/examples-c/layer_first.cpp" \
    -o "$BUILD/layer_first" "${LINK[@]}"

if readelf -d "$BUILD/dlopen_test" | grep -q 'libkvtier'; then
    echo "dlopen_test must not link libkvtier:"
    readelf -d "$BUILD/dlopen_test" | grep NEEDED
    echo "0 passed, 1 failed"
    exit 1
fi

# ---- runs -----------------------------------------------------------------------------
# ABI identity (scripts/check-library.sh): the SONAME carries the major version, dlclose()
# cannot unmap the library, and the dynamic symbol table exports exactly the functions
# kvtier.h declares (build.rs keeps the C API of object_store's crc-fast dependency local).
check_exports() {
    "$ROOT/scripts/check-library.sh" "$LIB"
}
run abi-identity check_exports

run harness-c "$BUILD/harness"

# The Rust library is not instrumented; ASan still checks the harness's own accesses,
# UBSan its arithmetic, and LeakSanitizer every allocation made through malloc (the
# library's included) that is unreachable at exit. No suppressions are needed: the
# library frees its runtime threads, thread-locals and results by kvt_tier_free.
run harness-asan env \
    ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_string_checks=1:detect_stack_use_after_return=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$BUILD/harness-asan"

run harness-cxx "$BUILD/harness-cxx"

if [[ $VALGRIND == 1 ]]; then
    if command -v valgrind >/dev/null; then
        # Full size (1000 jobs) fits easily; KVT_HARNESS_SMALL=1 in the environment shrinks it.
        run harness-valgrind env KVT_HARNESS_TIMEOUT_SCALE=4 \
            valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
            --track-origins=no "$BUILD/harness"
    else
        echo "==> valgrind not installed"
        run harness-valgrind false
    fi
fi

run dlopen-test "$BUILD/dlopen_test" "$LIB"
run hpp-linked-test "$BUILD/hpp_linked_test"
run example "$BUILD/offload"
run example-lookups "$BUILD/lookups_events"
run example-layer-first "$BUILD/layer_first"
# Pages of 2 and of 2 x 32 ranges from C (the harness) and C++ (the layer-first example)
# on the real S3 servers of the tests: s3s-fs, moto and Ceph RGW.
VPY=$ROOT/tools/venv/bin/python
[[ -x $VPY ]] || "$ROOT/scripts/install-tools.sh"
run ranges-on-s3-servers "$VPY" "$ROOT/ffi-tests/on_s3_servers.py" \
    -- "$BUILD/harness" ranges_on_store -- "$BUILD/layer_first"

# ---- summary --------------------------------------------------------------------------
echo
echo "Stage times:"
for i in "${!NAMES[@]}"; do
    printf '  %-26s %-14s %6s s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}"
done
echo "  total $((SECONDS - T_START)) s"
if [[ -n $KNOWN_BUGS ]]; then
    echo "Known library bugs tolerated as XFAIL (run with --strict to fail on them): $KNOWN_BUGS"
fi
echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
