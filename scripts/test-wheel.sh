#!/usr/bin/env bash
# Tests the Python wheel as a user gets it:
#
#   scripts/test-wheel.sh           build (or reuse) the wheel, install it, run the checks
#   scripts/test-wheel.sh --full    ... and all of python/tests against the installed wheel
#
# 1. scripts/build-wheel.sh builds the wheel once (reused while the library and the
#    package are unchanged); scripts/check-wheel.sh: its file name and auditwheel must
#    say manylinux_2_28, and its library must export exactly kvtier.h's functions;
# 2. a fresh venv (target/wheel-test.XXXXXX/venv, `python3 -m venv`) installs it with
#    `pip install --no-index` and no Rust toolchain on PATH (cargo and rustc absent,
#    CARGO pointing nowhere, an empty HOME): pip must accept the wheel's manylinux tag for
#    this interpreter, and install the library inside the package;
# 3. scripts/wheel-smoke.py, run by that venv's python in isolated mode from outside the
#    checkout: the bundled library is the one loaded; store, lookup, load round trip;
# 4. the binding's tests (python/tests: binding, lifetimes, header check, namespaces; with
#    --full every test, vLLM's included) with the test venv's python and pytest, importing
#    kvtier from the wheel's installed files instead of the source tree.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FULL=0
for arg in "$@"; do
    case $arg in
        --full) FULL=1 ;;
        -h | --help)
            sed -n '2,19p' "$0"
            exit 0
            ;;
        *)
            echo "test-wheel: unknown argument $arg" >&2
            exit 2
            ;;
    esac
done
say() { echo "test-wheel: $*"; }
fail() {
    echo "test-wheel: FAIL: $*"
    exit 1
}

mkdir -p "$ROOT/target"
WORK=$(mktemp -d "$ROOT/target/wheel-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
WHEEL=$("$ROOT/scripts/build-wheel.sh" --copy-to "$WORK/dist" | tail -n 1)
NAME=$(basename "$WHEEL")
say "wheel $NAME"
# The tag the release promises: glibc 2.28 (RHEL 8, Ubuntu 20.04), this machine's architecture.
TAG=manylinux_2_28_$(uname -m)
"$ROOT/scripts/check-wheel.sh" "$WHEEL" "$(uname -m)" || fail "the wheel's checks"

mkdir -p "$WORK/home" "$WORK/run"
python3 -m venv "$WORK/venv"
VENV_PY=$WORK/venv/bin/python
# A PATH with the venv and the system directories only, checked to hold no Rust toolchain.
CLEAN_PATH=$WORK/venv/bin:/usr/local/bin:/usr/bin:/bin
for tool in cargo rustc rustup; do
    if PATH=$CLEAN_PATH command -v "$tool" >/dev/null; then
        fail "$tool is on the clean PATH ($(PATH=$CLEAN_PATH command -v "$tool")); the test needs a PATH without Rust"
    fi
done
clean() { env -i HOME="$WORK/home" PATH="$CLEAN_PATH" CARGO=/nonexistent/cargo LANG=C.UTF-8 "$@"; }

clean "$VENV_PY" -m pip install --no-index --no-cache-dir --disable-pip-version-check "$WHEEL" >"$WORK/pip-install.log" 2>&1 ||
    fail "pip install: $(cat "$WORK/pip-install.log")"
cat "$WORK/pip-install.log"
grep -q "Successfully installed kvtier-" "$WORK/pip-install.log" || fail "pip did not install kvtier"
SITE=$(clean "$VENV_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
grep -qx "Tag: py3-none-$TAG" "$SITE"/kvtier-*.dist-info/WHEEL || fail "installed WHEEL metadata lacks Tag: py3-none-$TAG"
clean "$VENV_PY" -m pip show --files kvtier >"$WORK/pip-show.txt"
grep -qx '  kvtier/libkvtier.so' "$WORK/pip-show.txt" || fail "pip show lists no kvtier/libkvtier.so"
# pip's own list of the tags this interpreter accepts has the wheel's.
clean "$VENV_PY" -m pip debug --verbose >"$WORK/pip-debug.txt" 2>/dev/null || true
grep -qx "  py3-none-$TAG" "$WORK/pip-debug.txt" || fail "pip debug does not list py3-none-$TAG as supported"
say "pip installed $NAME (tag py3-none-$TAG) without cargo; library at $SITE/kvtier/libkvtier.so"

(cd "$WORK/run" && clean "$VENV_PY" -I "$ROOT/scripts/wheel-smoke.py") || fail "smoke test"

# The Python tests against the installed files: a --target install of the same wheel,
# imported by the test venv (pytest, numpy, vLLM) instead of python/.
[[ -x $ROOT/tools/venv/bin/python ]] || "$ROOT/scripts/install-tools.sh"
TPY=$ROOT/tools/venv/bin/python
"$TPY" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --target "$WORK/site" "$WHEEL"
env -u KVTIER_LIBRARY PYTHONPATH="$WORK/site" "$TPY" -c '
import sys, kvtier, pathlib
pkg = pathlib.Path(kvtier.__file__).resolve().parent
assert pkg == pathlib.Path(sys.argv[1]).resolve() / "kvtier", pkg
assert pathlib.Path(kvtier.library_path()).resolve() == pkg / "libkvtier.so", kvtier.library_path()
' "$WORK/site" || fail "the test venv does not import kvtier from the installed wheel"
if [[ $FULL == 1 ]]; then
    TESTS=("$ROOT/python/tests")
else
    TESTS=("$ROOT/python/tests/test_binding.py" "$ROOT/python/tests/test_tier_lifetime.py"
        "$ROOT/python/tests/test_header_bindings.py" "$ROOT/python/tests/test_namespace.py")
fi
say "python tests against the installed wheel: ${TESTS[*]#"$ROOT/"}"
(cd "$WORK/run" && env -u KVTIER_LIBRARY PYTHONPATH="$WORK/site" "$TPY" -m pytest -q -p no:cacheprovider \
    --rootdir "$ROOT/python" "${TESTS[@]}")
say "ok: $NAME"
