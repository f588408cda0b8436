"""Builds the kvshare binding with its native library inside.

``pip install ./integration/python`` (or ``pip wheel``, ``python -m build``) from a checkout runs
``cargo build --release --lib`` on the repository this directory belongs to, and puts the
``libkvshare.so`` cargo reports (debug info stripped) and the generated ``include/kvshare.h``
next to the package, so the installed binding needs no environment variable.  ``$KVSHARE_LIB``
names an already built library instead (cargo is then not run).  The package version is
``Cargo.toml``'s (``integration/cargo_version.py``).

The source distribution is self-contained: it carries the Rust workspace's library crates under
``rust/`` (a workspace of just those, with ``Cargo.lock``) and the header, so a wheel builds from
it wherever cargo is installed (``python -m build`` makes the sdist, then the wheel from it).

The library is bundled as a plain data file loaded with cffi's ABI mode (``ffi.dlopen``), not
as a CPython extension, so the wheel is tagged ``py3-none-<platform>``: one wheel per platform,
any Python 3.  Such a wheel is for the machine that built it; ``scripts/build-wheels`` makes the
``manylinux`` wheels a package index accepts.
"""

import json
import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

try:  # setuptools >= 70.1 ships bdist_wheel; before that the `wheel` package does
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - depends on the build environment
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
# In a checkout the helper is integration/cargo_version.py; an sdist carries a copy at its root.
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from cargo_version import (MANIFEST as CHECKOUT_MANIFEST, REPO as CHECKOUT,  # noqa: E402
                           fresh_build, package_version, project_urls)

SDIST_RUST = os.path.join(HERE, "rust")  # the Rust sources, inside an unpacked sdist
if os.path.isfile(os.path.join(HERE, "PKG-INFO")):
    ROOT = SDIST_RUST
elif os.path.isfile(CHECKOUT_MANIFEST):
    ROOT = CHECKOUT
else:
    ROOT = None
MANIFEST = os.path.join(ROOT, "Cargo.toml") if ROOT else None
VERSION = package_version(HERE, MANIFEST)

# What the sdist takes from the checkout (under rust/): the crates that make libkvshare, the
# header, the lock file. Their tests, the tools and the fuzzer stay out.
RUST_CRATES = ("crates/kvshare-core", "crates/kvshare-attention", "crates/libkvshare")
RUST_FILES = ("Cargo.lock", "include/kvshare.h")


def build_library() -> str:
    """Runs cargo and returns the path of the cdylib it reports."""
    if MANIFEST is None:
        raise SystemExit("kvshare: no Cargo.toml to build libkvshare.so from; build from the "
                         "repository checkout or the sdist, or set KVSHARE_LIB")
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


def strip_debug_info(path: str) -> None:
    """Removes the debug sections from the bundled copy (the release profile keeps line tables
    for profiling: about 17 MB of the library's 19). Symbols stay, for profilers."""
    strip = os.environ.get("STRIP", "strip")
    try:
        subprocess.run([strip, "--strip-debug", path], check=True)
    except FileNotFoundError:
        raise SystemExit(f"kvshare: `{strip}` not found: it comes with binutils, as the linker "
                         "cargo uses does (or set STRIP)") from None
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"kvshare: `{strip} --strip-debug {path}` failed with status "
                         f"{e.returncode}") from None


class BuildPyWithLibrary(build_py):
    """Copies the library and the header into the package of the build."""

    def run(self):
        super().run()
        lib = os.environ.get("KVSHARE_LIB") or build_library()
        header = os.path.join(ROOT or "", "include", "kvshare.h")
        for src in (lib, header):
            if not os.path.isfile(src):
                raise SystemExit(f"kvshare: {src} not found")
        dest = os.path.join(self.build_lib, "kvshare")
        shutil.copyfile(lib, os.path.join(dest, "libkvshare.so"))
        strip_debug_info(os.path.join(dest, "libkvshare.so"))
        shutil.copyfile(header, os.path.join(dest, "kvshare.h"))


def workspace_of_library_crates(manifest_text: str) -> str:
    """The checkout's Cargo.toml with only the library crates as members (the sdist's)."""
    members = "".join(f'  "{c}",\n' for c in RUST_CRATES)
    text, n = re.subn(r"(?ms)^members = \[.*?^\]\n", f"members = [\n{members}]\n", manifest_text)
    text, m = re.subn(r"(?m)^default-members = .*\n", "", text)
    text = re.sub(r"(?m)^exclude = .*\n", "", text)
    # Workspace dependencies on crates the sdist does not carry (the tools).
    text = re.sub(r'(?m)^[\w-]+ = \{ path = "tools/.*\n', "", text)
    if n != 1 or m != 1:
        raise SystemExit("kvshare: Cargo.toml's [workspace] members / default-members changed "
                         "shape; update workspace_of_library_crates in integration/python/setup.py")
    return text


class SdistWithRustSources(sdist):
    """Adds the Rust workspace's library crates, the header and the version helper."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        if ROOT != CHECKOUT:
            raise SystemExit("kvshare: make the sdist from the repository checkout")
        shutil.copyfile(os.path.join(os.path.dirname(HERE), "cargo_version.py"),
                        os.path.join(base_dir, "cargo_version.py"))
        rust = os.path.join(base_dir, "rust")
        for crate in RUST_CRATES:
            src = os.path.join(CHECKOUT, crate)
            for name in os.listdir(src):
                if name in ("Cargo.toml", "build.rs", "cbindgen.toml") or name == "src":
                    copy = shutil.copytree if name == "src" else shutil.copyfile
                    os.makedirs(os.path.join(rust, crate), exist_ok=True)
                    copy(os.path.join(src, name), os.path.join(rust, crate, name))
        for f in RUST_FILES:
            os.makedirs(os.path.dirname(os.path.join(rust, f)), exist_ok=True)
            shutil.copyfile(os.path.join(CHECKOUT, f), os.path.join(rust, f))
        with open(CHECKOUT_MANIFEST, encoding="utf-8") as f:
            text = workspace_of_library_crates(f.read())
        with open(os.path.join(rust, "Cargo.toml"), "w", encoding="utf-8") as f:
            f.write(text)


cmdclass = {"build": fresh_build(), "build_py": BuildPyWithLibrary, "sdist": SdistWithRustSources}


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


setup(version=VERSION, cmdclass=cmdclass, distclass=NativeDistribution,
      project_urls=project_urls(MANIFEST))
