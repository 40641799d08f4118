#!/usr/bin/env bash
# Every S3 test: real s3s-fs, moto_server (plain and TLS) and Ceph RGW on loopback, the
# credential chain, fault injection through the project's proxy, integrity, and NIXL
# interop. Installs the tools first (cached). Fails, never skips, when something is missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
start=$(date +%s)

scripts/install-tools.sh
cargo build --release
# The store's own unit tests (endpoint rules, credential chain, INI parsing, redaction).
cargo test --release -p kvtier-core --lib -- store:: config::
cargo test --release -p kvtier --test s3 --test s3_credentials --test s3_faults --test s3_integrity
tools/venv/bin/python -m pytest tests/interop -q -p no:cacheprovider

echo "S3 tests: all passed in $(( $(date +%s) - start )) s"
