"""The version is Cargo.toml's (``integration/cargo_version.py``).

Builds ``kvshare_vllm._fast`` (the adapter's page hand-over, compiled) when a C compiler is at
hand; without it the package still installs and ``manager.py`` runs the same step in Python.
The extension includes the generated ``kvshare.h`` (``$KVSHARE_HEADER``, the installed
``kvshare`` package's copy, or the repository's ``include/``) and links against nothing: it calls
``kvs_seq_append_pages`` through the address the cffi binding resolved."""

import importlib.util
import os
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))
from cargo_version import cargo_version  # noqa: E402  (integration/cargo_version.py)


def header_dir() -> str:
    env = os.environ.get("KVSHARE_HEADER")
    if env:
        return os.path.dirname(os.path.abspath(env))
    spec = importlib.util.find_spec("kvshare")
    if spec is not None and spec.origin:
        pkg = os.path.dirname(spec.origin)
        if os.path.isfile(os.path.join(pkg, "kvshare.h")):
            return pkg
    return os.path.join(REPO, "include")


# Optional for users; scripts/test-python sets KVSHARE_VLLM_REQUIRE_FAST so a failed build fails.
HEADER_DIR = header_dir()
setup(version=cargo_version(),
      ext_modules=[Extension("kvshare_vllm._fast", ["kvshare_vllm/_fast.c"],
                             include_dirs=[HEADER_DIR], extra_compile_args=["-O2"],
                             depends=[os.path.join(HEADER_DIR, "kvshare.h")],
                             optional=not os.environ.get("KVSHARE_VLLM_REQUIRE_FAST"))])
