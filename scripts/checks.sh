# Sourced by the test scripts that run a list of checks (test-install.sh, test-aarch64.sh):
#
#   CHECK_LOGS=DIR; source scripts/checks.sh
#   check NAME CMD...     runs CMD; its whole output goes to DIR/NAME.log; prints one line,
#                         PASS with the output's last line, or FAIL with its last 40 lines
#   checks_summary        prints "N passed, M failed" and returns non-zero on any failure
PASSED=0
FAILED=0

check() {
    local name=$1 log=$CHECK_LOGS/$1.log start=$SECONDS
    shift
    mkdir -p "$CHECK_LOGS"
    if "$@" >"$log" 2>&1; then
        PASSED=$((PASSED + 1))
        echo "  PASS $name ($((SECONDS - start)) s): $(tail -n 1 "$log")"
    else
        FAILED=$((FAILED + 1))
        echo "  FAIL $name ($((SECONDS - start)) s); last lines of its output:"
        tail -n 40 "$log" | sed 's/^/    | /'
    fi
}

checks_summary() {
    echo "$PASSED passed, $FAILED failed"
    [[ $FAILED == 0 ]]
}
