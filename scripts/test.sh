#!/usr/bin/env bash
# Runs every test of the project: the Rust unit and integration tests, the C/C++ harness
# (plain, ASan+UBSan, C++, valgrind), the dlopen test and the C example, and the Python
# contract tests. Installs what it needs first. Ends with "N passed, M failed" over suites.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
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

if [[ -x scripts/install-tools.sh ]]; then
    suite install-tools scripts/install-tools.sh
fi
suite rust cargo test --release --no-fail-fast
suite ffi bash ffi-tests/run.sh
if [[ -d python/tests ]]; then
    suite python scripts/test-python.sh
fi

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
