#!/usr/bin/env bash
# The Python package's tests, run in the test tools' venv (tools/venv, which holds the
# real vLLM 0.33.0): the binding, the namespace vectors, the vLLM tier's contract, kvtier
# inside vLLM's own tiering manager, vLLM's own tier tests adapted to kvtier, and
# interop with vLLM's obj tier. Store-parametrized tests run against the local store
# and against real s3s-fs and moto servers that the tests start.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x tools/venv/bin/python ]] || scripts/install-tools.sh
cargo build --release --lib
KVTIER_TEST_S3_SERVERS=1 PYTHONPATH=python exec tools/venv/bin/python -m pytest python/tests -q -p no:cacheprovider "$@"
