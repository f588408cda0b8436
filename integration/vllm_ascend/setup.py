"""The version is Cargo.toml's (``integration/cargo_version.py``).

Builds ``kvshare_vllm._fast`` and ``kvshare_vllm._fast_groups`` (the adapter's page hand-over,
compiled, for one group and for KV-cache groups) when a C compiler is at hand; without it the
package still installs and ``manager.py`` / ``hybrid.py`` run the same steps in Python.
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
      ext_modules=[Extension(f"kvshare_vllm.{name}", [f"kvshare_vllm/{name}.c"],
                             include_dirs=[HEADER_DIR], extra_compile_args=["-O2"],
                             depends=[os.path.join(HEADER_DIR, "kvshare.h"),
                                      "kvshare_vllm/_fast_common.h"],
                             optional=not os.environ.get("KVSHARE_VLLM_REQUIRE_FAST"))
                   # _fast: one full-attention group (manager.py); _fast_groups: KV-cache
                   # groups (hybrid.py)
                   for name in ("_fast", "_fast_groups")])
