#!/usr/bin/env bash
# Runs the Python tests from a checkout, without installing the package: builds the
# library if needed, installs the test tools if missing, then runs pytest with
# PYTHONPATH=python. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --lib
python3 -c "import numpy, pytest" 2>/dev/null || python3 -m pip install -q numpy pytest
PYTHONPATH=python exec python3 -m pytest python/tests -q "$@"
