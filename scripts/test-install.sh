#!/usr/bin/env bash
# Tests the C/C++ install (scripts/install.sh) as a host project would use it:
#
# 1. installs into a fresh temporary prefix and checks the layout: the versioned library
#    with its SONAME symlinks, the headers, kvtier.pc and the CMake package;
# 2. builds examples-c/ (offload.c, lookups_events.c) and the kvtier.hpp test
#    (ffi-tests/dlopen_test.cpp, linked mode) from copies outside the checkout, once with
#    `pkg-config --cflags --libs kvtier` and once with CMake's find_package(kvtier)
#    (packaging/consumer), checks that each binary resolves libkvtier.so.0 in the prefix,
#    and runs them; the kvtier.hpp test also runs in dlopen mode on the installed SONAME;
# 3. find_package refuses an incompatible version; the CMake package still works after
#    the prefix is moved; a DESTDIR install stages files without changing what they name.
#
# Last line: "N passed, M failed" over the checks; non-zero exit status on any failure.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$ROOT/target"
WORK=$(mktemp -d "$ROOT/target/test-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export TMPDIR=$WORK/tmp # the examples' temporary stores
mkdir -p "$TMPDIR"
PREFIX=$WORK/prefix
CHECK_LOGS=$WORK/logs
# shellcheck source=scripts/checks.sh
source "$ROOT/scripts/checks.sh"

need() { command -v "$1" >/dev/null || {
    echo "test-install: $1 is not installed (scripts/install-tools.sh installs it)"
    echo "0 passed, 1 failed"
    exit 1
}; }
need pkg-config
need cmake
need readelf

echo "=== install into $PREFIX"
if ! "$ROOT/scripts/install.sh" --prefix "$PREFIX"; then
    echo "0 passed, 1 failed"
    exit 1
fi
VERSION=$(awk -F'"' '/^\[/ { pkg = ($0 == "[workspace.package]") } pkg && /^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")
IFS=. read -r MAJOR MINOR _ <<<"$VERSION"

layout() {
    local lib=$PREFIX/lib
    [[ -f $lib/libkvtier.so.$VERSION && ! -L $lib/libkvtier.so.$VERSION ]] || { echo "no regular file libkvtier.so.$VERSION"; return 1; }
    [[ $(readlink "$lib/libkvtier.so.$MAJOR") == "libkvtier.so.$VERSION" ]] || { echo "libkvtier.so.$MAJOR is not a link to libkvtier.so.$VERSION"; return 1; }
    [[ $(readlink "$lib/libkvtier.so") == "libkvtier.so.$MAJOR" ]] || { echo "libkvtier.so is not a link to libkvtier.so.$MAJOR"; return 1; }
    # (grep reads captured output: `cmd | grep -q` under pipefail fails when cmd gets SIGPIPE)
    grep -q "SONAME.*\[libkvtier\.so\.$MAJOR\]" <<<"$(readelf -d "$lib/libkvtier.so.$VERSION")" || { echo "SONAME is not libkvtier.so.$MAJOR"; return 1; }
    grep -q ' kvt_tier_new$' <<<"$(nm -D --defined-only "$lib/libkvtier.so.$VERSION")" || { echo "kvt_tier_new is not exported"; return 1; }
    cmp "$PREFIX/include/kvtier/kvtier.h" "$ROOT/include/kvtier.h" || return 1
    cmp "$PREFIX/include/kvtier/kvtier.hpp" "$ROOT/include/kvtier.hpp" || return 1
    [[ -f $lib/pkgconfig/kvtier.pc && -f $lib/cmake/kvtier/kvtierConfig.cmake && -f $lib/cmake/kvtier/kvtierConfigVersion.cmake ]] || return 1
    if grep -rn '@[A-Z_]*@' "$lib/pkgconfig" "$lib/cmake"; then echo "unsubstituted template variables"; return 1; fi
    echo "layout ok: libkvtier.so -> libkvtier.so.$MAJOR -> libkvtier.so.$VERSION, include/kvtier/, pkgconfig, cmake"
}
check layout layout

export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
pc_metadata() {
    pkg-config --validate kvtier || return 1
    [[ $(pkg-config --modversion kvtier) == "$VERSION" ]] || { echo "modversion $(pkg-config --modversion kvtier)"; return 1; }
    local cflags libs
    cflags=$(pkg-config --cflags kvtier) && libs=$(pkg-config --libs kvtier) || return 1
    [[ ${cflags% } == "-I$PREFIX/include/kvtier" ]] || { echo "cflags: $cflags"; return 1; }
    [[ ${libs% } == "-L$PREFIX/lib -lkvtier" ]] || { echo "libs: $libs"; return 1; }
    pkg-config --atleast-version="$MAJOR.0" kvtier && ! pkg-config --atleast-version=$((MAJOR + 1)).0 kvtier || return 1
    echo "pkg-config: kvtier $VERSION, $(pkg-config --cflags --libs kvtier)"
}
check pkg-config-metadata pc_metadata

# Sources copied out of the checkout, so only the installed headers can be found.
SRC=$WORK/src
mkdir -p "$SRC"
cp "$ROOT/examples-c/offload.c" "$ROOT/examples-c/lookups_events.c" "$ROOT/ffi-tests/dlopen_test.cpp" "$SRC/"

uses_prefix() { # the binary's libkvtier.so.0 resolves into the prefix
    local deps
    deps=$(ldd "$1") || return 1
    grep -q "libkvtier.so.$MAJOR => $PREFIX/lib/libkvtier.so.$MAJOR " <<<"$deps" || {
        echo "$1 does not load libkvtier.so.$MAJOR from $PREFIX/lib:"
        echo "$deps"
        return 1
    }
}

echo "=== build with pkg-config"
PC=$WORK/pc
mkdir -p "$PC"
pc_build() {
    local cflags libs libdir
    cflags=$(pkg-config --cflags kvtier) && libs=$(pkg-config --libs kvtier) && libdir=$(pkg-config --variable=libdir kvtier) || return 1
    # shellcheck disable=SC2086 # pkg-config output is a list of words
    gcc -std=c11 -Wall -Wextra -Werror -pedantic $cflags "$SRC/offload.c" -o "$PC/offload" $libs -Wl,-rpath,"$libdir" &&
        gcc -std=c11 -Wall -Wextra -Werror -pedantic $cflags "$SRC/lookups_events.c" -o "$PC/lookups_events" $libs -Wl,-rpath,"$libdir" &&
        g++ -std=c++17 -Wall -Wextra -Werror -pedantic -DKVTIER_HPP_TEST_LINKED $cflags "$SRC/dlopen_test.cpp" \
            -o "$PC/hpp_linked_test" $libs -Wl,-rpath,"$libdir" &&
        g++ -std=c++17 -Wall -Wextra -Werror -pedantic $cflags "$SRC/dlopen_test.cpp" -o "$PC/dlopen_test" -ldl &&
        uses_prefix "$PC/offload" && uses_prefix "$PC/lookups_events" && uses_prefix "$PC/hpp_linked_test" &&
        echo "built offload, lookups_events, hpp_linked_test, dlopen_test"
}
check pkg-config-build pc_build
if [[ -x $PC/offload ]]; then
    check pkg-config-run-offload "$PC/offload"
    check pkg-config-run-lookups-events "$PC/lookups_events"
    check pkg-config-run-hpp-linked "$PC/hpp_linked_test"
    check pkg-config-run-hpp-dlopen "$PC/dlopen_test" "$PREFIX/lib/libkvtier.so.$MAJOR"
fi

echo "=== build with CMake find_package(kvtier)"
CM=$WORK/cmake
cmake_build() { # cmake_build BUILD_DIR PREFIX_PATH [extra cmake args]
    local dir=$1 prefix_path=$2
    shift 2
    cmake -S "$ROOT/packaging/consumer" -B "$dir" -DCMAKE_PREFIX_PATH="$prefix_path" -DCMAKE_BUILD_TYPE=Release \
        -DKVTIER_EXAMPLES="$SRC" -DKVTIER_HPP_TEST="$SRC/dlopen_test.cpp" -DKVTIER_REQUIRED_VERSION="$MAJOR.$MINOR" "$@" &&
        cmake --build "$dir" -j 2
}
cm_build() {
    cmake_build "$CM" "$PREFIX" || return 1
    grep -q "kvtier $VERSION from $PREFIX/lib/cmake/kvtier" "$CM/CMakeFiles/CMakeOutput.log" 2>/dev/null ||
        grep -q "kvtier_DIR:PATH=$PREFIX/lib/cmake/kvtier" "$CM/CMakeCache.txt" || return 1
    uses_prefix "$CM/offload" && uses_prefix "$CM/lookups_events" && uses_prefix "$CM/hpp_linked_test" &&
        echo "built offload, lookups_events, hpp_linked_test with kvtier::kvtier"
}
check cmake-build cm_build
if [[ -x $CM/offload ]]; then
    check cmake-run-offload "$CM/offload"
    check cmake-run-lookups-events "$CM/lookups_events"
    check cmake-run-hpp-linked "$CM/hpp_linked_test"
fi

wrong_version() { # find_package(kvtier <next major>) must fail, and so must a newer minor
    local v
    for v in "$((MAJOR + 1)).0" "$MAJOR.$((MINOR + 1))"; do
        if cmake -S "$ROOT/packaging/consumer" -B "$WORK/cmake-wrong" -DCMAKE_PREFIX_PATH="$PREFIX" \
            -DKVTIER_EXAMPLES="$SRC" -DKVTIER_REQUIRED_VERSION="$v"; then
            echo "find_package(kvtier $v) accepted kvtier $VERSION"
            return 1
        fi
        rm -rf "$WORK/cmake-wrong"
    done
    echo "find_package refuses versions $((MAJOR + 1)).0 and $MAJOR.$((MINOR + 1))"
}
check cmake-version-check wrong_version

relocated() { # the CMake package names no absolute path: move the prefix and build again
    cp -a "$PREFIX" "$WORK/moved" &&
        cmake_build "$WORK/cmake-moved" "$WORK/moved" &&
        grep -q "libkvtier.so.$MAJOR => $WORK/moved/lib/" <<<"$(ldd "$WORK/cmake-moved/offload")" &&
        "$WORK/cmake-moved/offload" >/dev/null && echo "moved prefix: built and ran offload"
}
check cmake-relocated relocated

destdir() {
    DESTDIR=$WORK/stage "$ROOT/scripts/install.sh" --prefix /opt/kvtier --no-build &&
        [[ -f $WORK/stage/opt/kvtier/lib/libkvtier.so.$VERSION && -f $WORK/stage/opt/kvtier/include/kvtier/kvtier.h ]] &&
        grep -qx 'prefix=/opt/kvtier' "$WORK/stage/opt/kvtier/lib/pkgconfig/kvtier.pc" &&
        echo "DESTDIR install staged under $WORK/stage, kvtier.pc names /opt/kvtier"
}
check destdir destdir

checks_summary
