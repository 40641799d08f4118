"""LMCache 0.5.6 for the LMCache suites: installed beside the test venv, on its torch
(scripts/install-tools.sh puts it into tools/lmcache-site; ``KVTIER_TEST_LMCACHE_SITE``
names another directory). ``require()`` puts it on the path, or skips the calling module;
``documented_server_argv`` reads the MP server's command line out of a document."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

SITE = Path(os.environ.get("KVTIER_TEST_LMCACHE_SITE", Path(__file__).resolve().parents[2] / "tools" / "lmcache-site"))


def require() -> None:
    """Makes LMCache importable, or skips the module that calls it (at its import)."""
    if SITE.is_dir() and str(SITE) not in sys.path:
        sys.path.append(str(SITE))
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")  # else LMCache starts a telemetry thread
    pytest.importorskip(
        "lmcache.v1.distributed.storage_manager",
        reason="LMCache is not installed (scripts/install-tools.sh puts lmcache 0.5.6 into tools/lmcache-site)",
    )


def documented_server_argv(doc: str = "README.md", section: str = "## Use with LMCache") -> list[str]:
    """The LMCache MP server command line of a document's section (its ``sh`` code block), as
    argv after ``python -m lmcache.v1.multiprocess.server``."""
    text = (Path(__file__).resolve().parents[2] / doc).read_text()
    part = text[text.index(section):]
    part = part[: part.index("\n## ", 1)]
    block = re.search(r"```sh\n(.*?)```", part, re.S).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "lmcache.v1.multiprocess.server"], argv[:3]
    return argv[3:]
