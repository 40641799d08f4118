#!/usr/bin/env bash
# The Python package's tests (binding, namespace vectors, vLLM tier contract), with the
# contract tests run against the local store and against real s3s-fs and moto servers.
cd "$(dirname "$0")/.."
KVTIER_TEST_S3_SERVERS=1 exec python/run-tests.sh "$@"
