#!/usr/bin/env bash
# Runs every test of the project: formatting and clippy (warnings are errors), the Rust unit and integration tests (engine, integrity,
# lookups, and the S3 suites against real s3s-fs and moto servers, with TLS, credentials and
# fault injection), the C/C++ harness (plain, ASan+UBSan, C++, valgrind), the dlopen test and
# the C examples, the Python contract tests, the manylinux_2_28 wheels (x86_64, and aarch64
# under qemu-user emulation), and the NIXL interop tests. Installs what it
# needs first (scripts/install-tools.sh, cached in tools/). Ends with "N passed, M failed"
# over suites.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# No test reads standard input, and a closed one (as CI starts the run) breaks imports that
# look at it: under pytest, IPython, which SGLang imports, fails its collection.
exec </dev/null
LOGS=$ROOT/target/test-logs
mkdir -p "$LOGS"

declare -a SUITES=() OUTCOMES=()
suite() {
    local name=$1
    shift
    local start=$SECONDS
    echo "=== $name: $*"
    if "$@" 2>&1 | tee "$LOGS/$name.log"; then
        OUTCOMES+=("PASS")
    else
        OUTCOMES+=("FAIL")
    fi
    SUITES+=("$name ($((SECONDS - start)) s)")
}

suite install-tools scripts/install-tools.sh
suite lint bash -c 'cargo fmt --all --check && cargo clippy --release --workspace --all-targets -- -D warnings'
suite rust cargo test --release --workspace --no-fail-fast
suite ffi bash ffi-tests/run.sh
suite install bash scripts/test-install.sh
suite python scripts/test-python.sh
suite wheel bash scripts/test-wheel.sh
suite aarch64 bash scripts/test-aarch64.sh
suite nixl-interop tools/venv/bin/python -m pytest tests/interop -q -p no:cacheprovider

# Why each failed suite failed, just above the summary: CI keeps only the end of the output.
# The lines that name a failure (pytest's FAILED/ERROR, cargo's failing tests and panics, the
# check runners' FAIL), else the end of the suite's log.
for i in "${!SUITES[@]}"; do
    [[ ${OUTCOMES[$i]} == FAIL ]] || continue
    log=$LOGS/${SUITES[$i]%% *}.log
    echo
    echo "=== ${SUITES[$i]%% *} failed ($log):"
    reasons=$(grep -E '^(FAILED|ERROR) |^test .* FAILED$|panicked at|^error(\[|:)|^  FAIL |^---- .* stdout ----$' "$log" | head -n 12)
    if [[ -n $reasons ]]; then echo "$reasons"; else tail -n 12 "$log"; fi
done

passed=0
failed=0
echo
echo "=== summary"
for i in "${!SUITES[@]}"; do
    printf '  %-4s %s\n' "${OUTCOMES[$i]}" "${SUITES[$i]}"
    if [[ ${OUTCOMES[$i]} == PASS ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
