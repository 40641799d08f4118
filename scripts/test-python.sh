#!/usr/bin/env bash
# The Python package's tests, run in the test tools' venv (tools/venv, which holds the
# real vLLM 0.33.0): the binding, the namespace vectors, the vLLM tier's contract, kvtier
# inside vLLM's own tiering manager, vLLM's own tier tests adapted to kvtier, and
# interop with vLLM's obj tier, kvtier inside SGLang's HiCache controllers and inside
# LMCache's StorageManager (LMCache from tools/lmcache-site, which test_lmcache.py appends
# to its import path itself). Store-parametrized tests run against the local store
# and against real s3s-fs, moto and Ceph RGW servers that the tests start.
#
#   scripts/test-python.sh [pytest args]            against the installed wheel (default)
#   scripts/test-python.sh --source [pytest args]   against python/ and target/release
#
# By default the tests import kvtier as users get it: scripts/build-wheel.sh builds the
# manylinux wheel (reused while nothing changed), pip installs it into a fresh directory
# (--target), and that directory, not python/, is on PYTHONPATH; a check before the tests
# fails the run if kvtier or its library would come from anywhere else.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# No test reads standard input, and a closed one (as CI starts the run) breaks imports that
# look at it: under pytest, IPython, which SGLang imports, fails its collection.
exec </dev/null
[[ -x tools/venv/bin/python && -d tools/lmcache-site/lmcache ]] || scripts/install-tools.sh
export KVTIER_TEST_LMCACHE_SITE=$ROOT/tools/lmcache-site
TPY=$ROOT/tools/venv/bin/python
export KVTIER_TEST_S3_SERVERS=1
if [[ ${1:-} == --source ]]; then
    shift
    cargo build --release --lib
    PYTHONPATH=python exec "$TPY" -m pytest python/tests -q -p no:cacheprovider "$@"
fi

mkdir -p target
WORK=$(mktemp -d "$ROOT/target/python-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
WHEEL=$(scripts/build-wheel.sh --copy-to "$WORK/dist" | tail -n 1)
"$TPY" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --target "$WORK/site" "$WHEEL"
mkdir -p "$WORK/run"
cd "$WORK/run"
env -u KVTIER_LIBRARY PYTHONPATH="$WORK/site" "$TPY" -c '
import sys, kvtier, pathlib
pkg = pathlib.Path(kvtier.__file__).resolve().parent
assert pkg == pathlib.Path(sys.argv[1]).resolve() / "kvtier", pkg
assert pathlib.Path(kvtier.library_path()).resolve() == pkg / "libkvtier.so", kvtier.library_path()
print(f"test-python: kvtier from {pkg.parent.name} ({sys.argv[2]})")
' "$WORK/site" "$(basename "$WHEEL")"
env -u KVTIER_LIBRARY PYTHONPATH="$WORK/site" "$TPY" -m pytest -q -rfE -p no:cacheprovider \
    --rootdir "$ROOT/python" "$ROOT/python/tests" "$@"
