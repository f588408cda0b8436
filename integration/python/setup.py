"""Builds the kvshare binding with its native library inside.

``pip install ./integration/python`` (or ``pip wheel``) from a checkout runs
``cargo build --release --lib`` on the repository this directory belongs to, and puts the
``libkvshare.so`` cargo reports and the generated ``include/kvshare.h`` next to the package, so
the installed binding needs no environment variable.  ``$KVSHARE_LIB`` names an already built
library instead (cargo is then not run).  The package version is ``Cargo.toml``'s.

The library is bundled as a plain data file loaded with cffi's ABI mode (``ffi.dlopen``), not
as a CPython extension, so the wheel is tagged ``py3-none-<platform>``: one wheel per platform,
any Python 3.
"""

import json
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 ships bdist_wheel; before that the `wheel` package does
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - depends on the build environment
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))
from cargo_version import MANIFEST, cargo_version  # noqa: E402  (integration/cargo_version.py)


def build_library() -> str:
    """Runs cargo and returns the path of the cdylib it reports."""
    cargo = os.environ.get("CARGO", "cargo")
    cmd = [cargo, "build", "--release", "--lib", "-p", "kvshare", "--manifest-path", MANIFEST,
           "--message-format=json-render-diagnostics"]
    try:
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    except FileNotFoundError:
        raise SystemExit("kvshare: building the binding needs cargo (the Rust toolchain, "
                         "https://rustup.rs), or KVSHARE_LIB naming a built libkvshare.so") from None
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"kvshare: `{' '.join(cmd)}` failed with status {e.returncode}") from None
    for line in out.splitlines():
        msg = json.loads(line) if line.startswith("{") else {}
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "kvshare":
            for path in msg["filenames"]:
                if os.path.basename(path) == "libkvshare.so":
                    return path
    raise SystemExit("kvshare: cargo built no libkvshare.so (Cargo.toml must keep crate-type "
                     "\"cdylib\")")


class BuildPyWithLibrary(build_py):
    """Copies the library and the header into the package of the build."""

    def run(self):
        super().run()
        lib = os.environ.get("KVSHARE_LIB") or build_library()
        header = os.path.join(REPO, "include", "kvshare.h")
        for src in (lib, header):
            if not os.path.isfile(src):
                raise SystemExit(f"kvshare: {src} not found")
        dest = os.path.join(self.build_lib, "kvshare")
        shutil.copyfile(lib, os.path.join(dest, "libkvshare.so"))
        shutil.copyfile(header, os.path.join(dest, "kvshare.h"))


cmdclass = {"build_py": BuildPyWithLibrary}


class NativeDistribution(Distribution):
    """Holds a native library: platform-specific, installed to platlib."""

    def has_ext_modules(self):
        return True


if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        """A platform wheel for any Python 3 (the library is not a CPython extension)."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel

setup(version=cargo_version(), cmdclass=cmdclass, distclass=NativeDistribution)
