"""C programs of ffi-tests/ built for the Python tests: against include/kvtier.h and the
very library the kvtier package loads (so a test drives one build of it from both sides)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import kvtier

ROOT = Path(__file__).resolve().parents[2]


def build(source: Path, work: Path) -> str:
    """Compiles ``source`` strictly (C11, warnings as errors) into ``work``; returns the
    executable's path. Skips the test when there is no C compiler."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("needs a C compiler")
    work.mkdir(parents=True, exist_ok=True)
    lib = Path(kvtier.library_path()).resolve()
    soname = work / "libkvtier.so.0"  # the name the program is linked against
    if soname.is_symlink() or soname.exists():
        soname.unlink()
    soname.symlink_to(lib)
    exe = work / source.stem
    include = ROOT / "include"
    compiled = subprocess.run(
        [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{include}", str(source),
         str(soname), f"-Wl,-rpath,{work}", "-o", str(exe)],
        capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    return str(exe)
