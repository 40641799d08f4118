"""Build hook: compile libkvtier with Cargo and bundle it in the package.

`pip install ./python` runs `cargo build --release --lib` in the repository root (the
parent of this directory), copies the library into the built `kvtier` package, and tags
the wheel as platform-specific (py3-none-<platform>: the library is plain C ABI, loaded
with ctypes, so one wheel serves every CPython 3 on the platform).

The wheel for distribution comes from `scripts/build-wheel.sh`: it builds with
KVTIER_PREBUILT_LIBRARY set to a library linked against glibc 2.28 (x86_64 or aarch64),
then `auditwheel repair` checks the library's glibc symbol versions and retags the wheel
manylinux_2_28_<arch>. The wheel's platform is the architecture of the library it
carries (read from its ELF header), so a cross-built library gets a wheel of its own
architecture.

Environment:
  KVTIER_PREBUILT_LIBRARY  bundle this already-built library instead of running cargo
  KVTIER_SOURCE_DIR        the repository root, when this directory is not inside it
  CARGO                    the cargo executable (default: `cargo` on PATH)
  CARGO_TARGET_DIR         honoured, as by cargo itself
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.dist import Distribution

try:  # setuptools >= 70.1 ships bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # pragma: no cover - older setuptools
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

HERE = Path(__file__).resolve().parent
if sys.platform == "darwin":
    LIBRARY = "libkvtier.dylib"
else:
    LIBRARY = "libkvtier.so"


def _repo_root() -> Path:
    root = Path(os.environ.get("KVTIER_SOURCE_DIR") or HERE.parent)
    if not (root / "Cargo.toml").is_file():
        raise SystemExit(
            f"kvtier: no Cargo.toml in {root}; build from a checkout (`pip install ./python` in the "
            "repository root), or set KVTIER_SOURCE_DIR or KVTIER_PREBUILT_LIBRARY"
        )
    return root


def _build_library() -> Path:
    prebuilt = os.environ.get("KVTIER_PREBUILT_LIBRARY")
    if prebuilt:
        path = Path(prebuilt)
        if not path.is_file():
            raise SystemExit(f"kvtier: KVTIER_PREBUILT_LIBRARY={prebuilt} does not exist")
        return path
    root = _repo_root()
    cargo = os.environ.get("CARGO") or shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(cargo).exists() and not shutil.which(cargo):
        raise SystemExit("kvtier: cargo not found; install Rust (https://rustup.rs) or set KVTIER_PREBUILT_LIBRARY")
    command = [cargo, "build", "--release", "--lib"]
    print("kvtier: running " + " ".join(command) + f" in {root}", flush=True)
    subprocess.run(command, cwd=root, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or root / "target")
    if not target.is_absolute():
        target = root / target
    path = target / "release" / LIBRARY
    if not path.is_file():
        raise SystemExit(f"kvtier: cargo finished but {path} is missing")
    return path


class build_py(_build_py):
    """Builds the Python package and bundles the freshly built library in it."""

    def run(self):
        super().run()
        if self.editable_mode:
            return  # an editable install loads the library from target/ (see kvtier/_native.py)
        library = _build_library()
        dest = Path(self.build_lib) / "kvtier" / LIBRARY
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, dest)
        os.chmod(dest, 0o755)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs.append(str(Path(self.build_lib) / "kvtier" / LIBRARY))
        return outputs


class BinaryDistribution(Distribution):
    """The package carries a native library: never a pure-Python wheel."""

    def has_ext_modules(self):
        return True


class bdist_wheel(_bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        prebuilt = os.environ.get("KVTIER_PREBUILT_LIBRARY")
        if prebuilt and platform.startswith("linux_"):
            platform = "linux_" + _elf_architecture(Path(prebuilt))
        return "py3", "none", platform


# ELF e_machine values of the architectures a wheel is built for.
_ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}


def _elf_architecture(library: Path) -> str:
    """The wheel platform's architecture for an ELF shared library (little-endian, 64-bit)."""
    with open(library, "rb") as file:
        header = file.read(20)
    if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise SystemExit(f"kvtier: {library} is not a 64-bit little-endian ELF library")
    machine = int.from_bytes(header[18:20], "little")
    if machine not in _ELF_MACHINES:
        raise SystemExit(f"kvtier: {library} is for ELF machine {machine:#x}, not x86_64 or aarch64")
    return _ELF_MACHINES[machine]


setup(distclass=BinaryDistribution, cmdclass={"build_py": build_py, "bdist_wheel": bdist_wheel})
