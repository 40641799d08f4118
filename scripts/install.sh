#!/usr/bin/env bash
# Installs libkvtier for C and C++ hosts into a prefix.
#
#   scripts/install.sh --prefix /usr/local [--libdir lib] [--arch x86_64|aarch64] [--no-build]
#
# Builds the release library (`cargo build --release --lib`; --no-build takes the one in
# target/release as it is) and installs it. With --arch, the library is the one the wheels
# carry instead (scripts/build-library.sh: linked against glibc 2.28, cross-compiled for
# aarch64 on an x86_64 machine; --no-build takes target/ARCH-unknown-linux-gnu/release),
# so an aarch64 tree can be made here and copied to the machine that runs it. Installs:
#
#   PREFIX/lib/libkvtier.so.X.Y.Z            the library (SONAME libkvtier.so.X)
#   PREFIX/lib/libkvtier.so.X -> libkvtier.so.X.Y.Z
#   PREFIX/lib/libkvtier.so   -> libkvtier.so.X              (for -lkvtier)
#   PREFIX/include/kvtier/kvtier.h, kvtier.hpp
#   PREFIX/lib/pkgconfig/kvtier.pc           Cflags: -I${includedir}/kvtier, Libs: -lkvtier
#   PREFIX/lib/cmake/kvtier/kvtierConfig.cmake, kvtierConfigVersion.cmake
#                                            find_package(kvtier) -> target kvtier::kvtier
#
# so that `#include "kvtier.h"` works with `pkg-config --cflags --libs kvtier` and with
# `target_link_libraries(app PRIVATE kvtier::kvtier)`. DESTDIR is honoured as usual
# (files go under $DESTDIR$PREFIX; their contents name $PREFIX). The CMake package is
# relocatable; kvtier.pc names the prefix. Run ldconfig afterwards for a system prefix.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=
LIBDIR=lib
BUILD=1
ARCH=
while [[ $# -gt 0 ]]; do
    case $1 in
        --arch)
            ARCH=$2
            shift 2
            ;;
        --arch=*)
            ARCH=${1#--arch=}
            shift
            ;;
        --prefix)
            PREFIX=$2
            shift 2
            ;;
        --prefix=*)
            PREFIX=${1#--prefix=}
            shift
            ;;
        --libdir)
            LIBDIR=$2
            shift 2
            ;;
        --libdir=*)
            LIBDIR=${1#--libdir=}
            shift
            ;;
        --no-build)
            BUILD=0
            shift
            ;;
        -h | --help)
            sed -n '2,23p' "$0"
            exit 0
            ;;
        *)
            echo "install: unknown argument $1 (see --help)" >&2
            exit 2
            ;;
    esac
done
die() {
    echo "install: $*" >&2
    exit 1
}
[[ -n $PREFIX ]] || die "--prefix DIR is required"
[[ $PREFIX == /* ]] || PREFIX=$(mkdir -p "$PREFIX" && cd "$PREFIX" && pwd)
PREFIX=${PREFIX%/}
[[ $LIBDIR != /* && $LIBDIR != *..* && -n $LIBDIR ]] || die "--libdir must be a relative path inside the prefix"
LIBDIR=${LIBDIR%/}

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
if [[ -z $ARCH ]]; then
    LIB=$TARGET/release/libkvtier.so
    if [[ $BUILD == 1 ]]; then
        (cd "$ROOT" && cargo build --release --lib -q)
    fi
else
    [[ $ARCH == x86_64 || $ARCH == aarch64 ]] || die "--arch must be x86_64 or aarch64, not $ARCH"
    LIB=$TARGET/$ARCH-unknown-linux-gnu/release/libkvtier.so
    if [[ $BUILD == 1 ]]; then
        LIB=$("$ROOT/scripts/build-library.sh" "$ARCH" | tail -n 1)
    fi
fi
[[ -f $LIB ]] || die "$LIB is missing (build it, or drop --no-build)"

VERSION=$(awk -F'"' '/^\[/ { pkg = ($0 == "[workspace.package]") } pkg && /^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")
[[ $VERSION =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] || die "cannot read the version from Cargo.toml (got '$VERSION')"
MAJOR=${BASH_REMATCH[1]}
grep -q "^#define KVTIER_VERSION \"$VERSION\"$" "$ROOT/include/kvtier.h" || die "include/kvtier.h is not version $VERSION"
SONAME=$(readelf -d "$LIB" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
[[ $SONAME == "libkvtier.so.$MAJOR" ]] || die "$LIB has SONAME '$SONAME', expected libkvtier.so.$MAJOR"

DEST=${DESTDIR:-}$PREFIX
REAL=libkvtier.so.$VERSION
install -d "$DEST/$LIBDIR/pkgconfig" "$DEST/$LIBDIR/cmake/kvtier" "$DEST/include/kvtier"
# Copy, then rename: a process running the old library keeps its mapping intact.
install -m 0755 "$LIB" "$DEST/$LIBDIR/.$REAL.tmp"
mv -f "$DEST/$LIBDIR/.$REAL.tmp" "$DEST/$LIBDIR/$REAL"
ln -sfn "$REAL" "$DEST/$LIBDIR/$SONAME"
ln -sfn "$SONAME" "$DEST/$LIBDIR/libkvtier.so"
install -m 0644 "$ROOT/include/kvtier.h" "$ROOT/include/kvtier.hpp" "$DEST/include/kvtier/"

# lib/cmake/kvtier -> the prefix: one ".." per component of LIBDIR, plus cmake/kvtier.
UP=../..
IFS=/ read -r -a parts <<<"$LIBDIR"
for part in "${parts[@]}"; do [[ -z $part || $part == . ]] || UP=$UP/..; done
subst() {
    sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@LIBDIR@|$LIBDIR|g" -e "s|@VERSION@|$VERSION|g" \
        -e "s|@VERSION_MAJOR@|$MAJOR|g" -e "s|@CMAKE_DIR_TO_PREFIX@|$UP|g" "$1" >"$2.tmp"
    chmod 0644 "$2.tmp"
    mv -f "$2.tmp" "$2"
}
subst "$ROOT/packaging/kvtier.pc.in" "$DEST/$LIBDIR/pkgconfig/kvtier.pc"
subst "$ROOT/packaging/kvtierConfig.cmake.in" "$DEST/$LIBDIR/cmake/kvtier/kvtierConfig.cmake"
subst "$ROOT/packaging/kvtierConfigVersion.cmake.in" "$DEST/$LIBDIR/cmake/kvtier/kvtierConfigVersion.cmake"

echo "install: kvtier $VERSION into ${DESTDIR:+$DESTDIR}$PREFIX:"
(cd "$DEST" && find "$LIBDIR/$REAL" "$LIBDIR/$SONAME" "$LIBDIR/libkvtier.so" include/kvtier "$LIBDIR/pkgconfig/kvtier.pc" \
    "$LIBDIR/cmake/kvtier" \( -type f -o -type l \) -printf '  %p%l\n' | sed 's/\(libkvtier\.so[.0-9]*\)\(libkvtier\)/\1 -> \2/')
