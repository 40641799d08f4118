#!/usr/bin/env bash
# Checks a built wheel against what the release promises:
#
#   scripts/check-wheel.sh WHEEL x86_64|aarch64
#
# - its name is kvtier-<version>-py3-none-manylinux_2_28_ARCH.whl;
# - `auditwheel show` finds it consistent with manylinux_2_28_ARCH (every glibc and libgcc
#   symbol version it needs is 2.28's or older; it links only system libraries);
# - the library inside passes scripts/check-library.sh for ARCH (architecture, SONAME,
#   nodelete, exactly kvtier.h's functions exported, every import versioned).
# Uses the tools of tools/packaging-venv (scripts/build-library.sh makes it). Prints one
# summary line; exits non-zero with the reason on the first failed check.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEEL=${1:?usage: check-wheel.sh WHEEL x86_64|aarch64}
ARCH=${2:?usage: check-wheel.sh WHEEL x86_64|aarch64}
TAG=manylinux_2_28_$ARCH
NAME=$(basename "$WHEEL")
VENV=$ROOT/tools/packaging-venv
fail() {
    echo "check-wheel: $NAME: $*" >&2
    exit 1
}
[[ -f $WHEEL ]] || fail "no such file"
[[ $NAME =~ ^kvtier-[0-9.]+-py3-none-${TAG}(\.manylinux[a-z0-9_]+)*\.whl$ ]] || fail "not a py3-none-$TAG wheel"
show=$(PATH=$VENV/bin:$PATH "$VENV/bin/python" -m auditwheel show "$WHEEL" 2>&1) || fail "auditwheel show failed: $show"
[[ $(tr '\n' ' ' <<<"$show") == *"consistent with the following platform tag: \"$TAG\""* ]] ||
    fail "auditwheel does not find it consistent with $TAG: $show"
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
"$VENV/bin/python" -m zipfile -e "$WHEEL" "$unpacked"
library=$("$ROOT/scripts/check-library.sh" "$unpacked/kvtier/libkvtier.so" "$ARCH") || fail "its library failed the check above"
echo "check-wheel: $NAME: consistent with $TAG; ${library#check-library: }"
