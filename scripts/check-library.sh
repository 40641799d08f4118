#!/usr/bin/env bash
# Checks the identity of a built libkvtier.so, whichever machine it was built for:
#
#   scripts/check-library.sh LIB [x86_64|aarch64]     (default: this machine's architecture)
#
# - it is an ELF shared library for that architecture;
# - its SONAME is libkvtier.so.<major> (the major version of Cargo.toml) and it is linked
#   -z nodelete (dlclose() cannot unmap a library whose threads may still run);
# - every symbol it imports is versioned (an unversioned strong import is a function the
#   glibc it was linked against lacks, and would fail the load);
# - its dynamic symbol table exports exactly the functions include/kvtier.h declares: every
#   one of them, and nothing else (no symbol of a dependency, such as crc-fast's C API).
# readelf reads any architecture's ELF files, so the aarch64 library is checked here too.
# Prints one summary line; exits non-zero with the reason on the first failed check.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIB=${1:?usage: check-library.sh LIB [x86_64|aarch64]}
ARCH=${2:-$(uname -m)}
fail() {
    echo "check-library: $LIB: $*" >&2
    exit 1
}
[[ -f $LIB ]] || fail "no such file"
case $ARCH in
    x86_64) MACHINE="Advanced Micro Devices X86-64" ;;
    aarch64) MACHINE="AArch64" ;;
    *) fail "unknown architecture $ARCH" ;;
esac
header=$(readelf -h "$LIB") || fail "not an ELF file"
grep -q "Type: *DYN" <<<"$header" || fail "not a shared library"
grep -q "Machine: *$MACHINE\$" <<<"$header" || fail "not built for $ARCH: $(grep Machine <<<"$header")"

MAJOR=$(sed -n 's/^version = "\([0-9]*\)\..*/\1/p' "$ROOT/Cargo.toml" | head -n1)
dynamic=$(readelf -d "$LIB")
grep -q "(SONAME) *Library soname: \[libkvtier\.so\.$MAJOR\]" <<<"$dynamic" || fail "SONAME is not libkvtier.so.$MAJOR"
grep -q "NODELETE" <<<"$dynamic" || fail "not linked -z nodelete"

# Every symbol it needs from another library is versioned (GLIBC_2.x, GCC_x): an
# unversioned strong one names a function the glibc it was linked against does not have
# (a wrapper newer than the floor), and would stop the library loading (ld.so: "undefined
# symbol"). Weak ones are looked up at run time and may be absent.
unversioned=$(readelf --dyn-syms -W "$LIB" | awk 'NR > 3 && $7 == "UND" && $5 == "GLOBAL" && $8 != "" && $8 !~ /@/ { print $8 }')
[[ -z $unversioned ]] || fail "needs unversioned symbols no glibc version provides: $(echo $unversioned)"

# Defined symbols of the dynamic table (Ndx is a section number, not UND or ABS), by name.
exported=$(readelf --dyn-syms -W "$LIB" | awk 'NR > 3 && $7 != "UND" && $7 != "ABS" && $8 != "" { sub(/@.*/, "", $8); print $8 }' | LC_ALL=C sort -u)
declared=$(grep -oE '\bkvt_[a-z0-9_]+\(' "$ROOT/include/kvtier.h" | tr -d '(' | LC_ALL=C sort -u)
unexpected=$(LC_ALL=C comm -23 <(echo "$exported") <(echo "$declared"))
missing=$(LC_ALL=C comm -13 <(echo "$exported") <(echo "$declared"))
[[ -z $unexpected ]] || fail "exports symbols kvtier.h does not declare: $(echo $unexpected)"
[[ -z $missing ]] || fail "does not export functions kvtier.h declares: $(echo $missing)"
echo "check-library: $ARCH ELF, SONAME libkvtier.so.$MAJOR, NODELETE, every import versioned, exports the $(wc -l <<<"$exported") kvt_ functions of kvtier.h and nothing else"
