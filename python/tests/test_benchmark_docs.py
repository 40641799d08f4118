"""The benchmark pages are generated, never typed: docs/benchmarks.md, bench/results/INDEX.md,
bench/README.md's table of comparisons and the benchmark tables in README.md are what bench/report.py writes from
bench/comparisons.py and the current result files under bench/results. This fails when one
is not (a result file or the list of comparisons changed without regenerating them, or a
page was edited by hand). It runs `python3 bench/report.py --check`: the standard library
only, no vLLM, no library build.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_pages_are_what_bench_report_writes():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        f"{done.stdout}{done.stderr}\n"
        "Regenerate the benchmark pages with `python3 bench/report.py` (from the checkout's root) and commit "
        "what it rewrites: docs/benchmarks.md, bench/results/INDEX.md, bench/README.md's table of comparisons "
        "and the benchmark tables README.md carries."
    )
