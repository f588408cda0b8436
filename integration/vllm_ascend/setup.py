"""Builds the vLLM plugin ``kvshare-vllm``. The version is Cargo.toml's
(``integration/cargo_version.py``); the plugin requires the binding of the same C ABI
(``kvshare~=<version>``: before 1.0 the minor version is the ABI version).

Builds ``kvshare_vllm._fast`` (the adapter's page hand-over, compiled, for one or many KV-cache
groups). It is required: without a C compiler or
Python's headers the build stops and says what to install, instead of installing a plugin that
runs the same steps in Python, slower. The extension includes the generated ``kvshare.h``
(``$KVSHARE_HEADER``, the installed ``kvshare`` package's copy, the repository's ``include/``,
or the copy an sdist carries) and links against nothing: it calls ``kvs_seq_append_pages``
through the address the cffi binding resolved. The build records the header's
``KVS_ABI_VERSION`` and the package version in ``kvshare_vllm/_build_info.py``; at start-up the
plugin compares that ABI version with the loaded library's ``kvs_abi_version()``
(``kvshare_vllm/startup.py``). The wheel holds the compiled modules, not their C sources.
"""

import importlib.util
import os
import re
import shutil
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
# In a checkout the helper is integration/cargo_version.py; an sdist carries a copy at its root.
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from cargo_version import (MANIFEST, REPO, fresh_build, package_version,  # noqa: E402
                           project_urls, release_series)

VERSION = package_version(HERE, MANIFEST)
# The native module and its C sources: _fast.c (the module) and _fast_groups.c (Groups: the
# manager's calls, manager.py).
NATIVE = {"_fast": ("_fast.c", "_fast_groups.c")}
NEEDS = ("kvshare-vllm needs its native module (kvshare_vllm._fast): "
         "install a C compiler and Python's headers (Debian / Ubuntu: apt-get install gcc "
         "python3-dev; RHEL / openEuler: dnf install gcc python3-devel) and run pip again")


def header_dir() -> str:
    env = os.environ.get("KVSHARE_HEADER")
    if env:
        return os.path.dirname(os.path.abspath(env))
    spec = importlib.util.find_spec("kvshare")
    if spec is not None and spec.origin:
        pkg = os.path.dirname(spec.origin)
        if os.path.isfile(os.path.join(pkg, "kvshare.h")):
            return pkg
    for d in (os.path.join(REPO, "include"), os.path.join(HERE, "include")):  # checkout, sdist
        if os.path.isfile(os.path.join(d, "kvshare.h")):
            return d
    raise SystemExit("kvshare-vllm: kvshare.h not found: set KVSHARE_HEADER, install the "
                     "kvshare binding first, or build from the repository checkout")


def abi_version(header: str) -> int:
    with open(header, encoding="utf-8") as f:
        found = re.search(r"^#define KVS_ABI_VERSION (\d+)$", f.read(), re.M)
    if not found:
        raise SystemExit(f"kvshare-vllm: {header} defines no KVS_ABI_VERSION")
    return int(found.group(1))


class BuildNative(build_ext):
    """Compiles the native module (failing with what to install when it cannot) and writes
    ``kvshare_vllm/_build_info.py`` beside them."""

    def run(self):
        python_h = os.path.join(sysconfig.get_paths()["include"], "Python.h")
        if not os.path.isfile(python_h):
            raise SystemExit(f"{NEEDS}. ({python_h} is missing.)")
        try:
            super().run()
        except SystemExit:
            raise
        except Exception as e:  # CompileError, LinkError, a missing compiler (platform errors)
            raise SystemExit(f"{NEEDS}. (The build failed: {e}.)") from None
        with open(self._info_path(), "w", encoding="utf-8") as f:
            f.write("# Written by setup.py when it compiled the native module (not in the "
                    "repository).\n"
                    f"__version__ = {VERSION!r}\n"
                    "#: KVS_ABI_VERSION of the kvshare.h the native module was compiled "
                    "against.\n"
                    f"KVS_ABI_VERSION = {abi_version(os.path.join(HEADER_DIR, 'kvshare.h'))}\n")

    def _info_path(self) -> str:
        base = HERE if self.inplace else self.build_lib
        return os.path.join(base, "kvshare_vllm", "_build_info.py")

    def get_outputs(self):
        return super().get_outputs() + [self._info_path()]


class SdistWithHeader(sdist):
    """Adds the version helper and the header the native module compiles against."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        shutil.copyfile(os.path.join(os.path.dirname(HERE), "cargo_version.py"),
                        os.path.join(base_dir, "cargo_version.py"))
        os.makedirs(os.path.join(base_dir, "include"), exist_ok=True)
        shutil.copyfile(os.path.join(HEADER_DIR, "kvshare.h"),
                        os.path.join(base_dir, "include", "kvshare.h"))


HEADER_DIR = header_dir()
setup(version=VERSION,
      install_requires=[f"kvshare{release_series(VERSION)}"],
      project_urls=project_urls(MANIFEST),
      cmdclass={"build": fresh_build(), "build_ext": BuildNative, "sdist": SdistWithHeader},
      ext_modules=[Extension(f"kvshare_vllm.{name}", [f"kvshare_vllm/{src}" for src in sources],
                             include_dirs=[HEADER_DIR], extra_compile_args=["-O2"],
                             depends=[os.path.join(HEADER_DIR, "kvshare.h"),
                                      "kvshare_vllm/_fast_common.h"])
                   for name, sources in NATIVE.items()])
