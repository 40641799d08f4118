#!/usr/bin/env bash
# The Python package's tests (binding, namespace vectors, vLLM tier contract).
exec "$(dirname "$0")/../python/run-tests.sh" "$@"
