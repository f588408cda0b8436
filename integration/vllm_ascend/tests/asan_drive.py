"""Runs the adapter's native module (``kvshare_vllm/_fast*.c``) under AddressSanitizer +
UndefinedBehaviorSanitizer: built with ``-fsanitize=address,undefined`` and
driven by a script of ``tests/fast_asan/`` in a process of its own (the sanitizer runtime
preloaded; no torch, no vLLM), for ``test_fast.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

import kvshare
import pytest

# Each native module's C sources, as setup.py's NATIVE lists them.
SOURCES = {"_fast": ("_fast.c", "_fast_groups.c")}


def build_and_drive(tmp_path, module: str, driver: str) -> None:
    """Builds the sources of ``kvshare_vllm.<module>`` into ``tmp_path`` and runs
    ``tests/fast_asan/<driver>`` on it; the driver must exit 0 and print ``ok`` last.  Skips the
    test without a C compiler or libasan."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    asan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    if not os.path.isabs(asan) or not os.path.exists(asan):
        pytest.skip("libasan not installed")
    here = os.path.dirname(os.path.abspath(__file__))
    srcs = [os.path.join(here, "..", "kvshare_vllm", src) for src in SOURCES[module]]
    so = str(tmp_path / f"{module}.so")
    header = kvshare.HEADER_PATH  # $KVSHARE_HEADER first, as the binding looks it up
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-g", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
                    "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers",
                    "-I", os.path.dirname(header), "-I", sysconfig.get_paths()["include"],
                    *srcs, "-o", so], check=True)
    # PYTHONMALLOC=malloc: every Python allocation (list item arrays too) goes through the
    # sanitizer's malloc, so reads past a list's items are caught, not hidden in an arena.
    env = dict(os.environ, LD_PRELOAD=asan, ASAN_OPTIONS="detect_leaks=0", PYTHONMALLOC="malloc",
               PYTHONPATH=os.pathsep.join(sys.path), KVSHARE_LIB=kvshare.LIB_PATH,
               KVSHARE_HEADER=header)
    r = subprocess.run([sys.executable, os.path.join(here, "fast_asan", driver), so],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
