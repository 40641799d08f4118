#!/usr/bin/env bash
# Every S3 test: real s3s-fs and moto_server (plain and TLS) on loopback, the credential
# chain, fault injection through the project's proxy, and NIXL interop. Installs the
# tools first (cached). Fails, never skips, when something is missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
start=$(date +%s)

scripts/install-tools.sh
cargo build --release
# The store's own unit tests (endpoint rules, credential chain, INI parsing, redaction).
cargo test --release --lib -- store:: config::
cargo test --release --test s3 --test s3_credentials --test s3_faults
tools/venv/bin/python -m pytest tests/interop -q -p no:cacheprovider

echo "S3 tests: all passed in $(( $(date +%s) - start )) s"
