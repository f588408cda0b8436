"""Start-up checks (``kvshare_vllm.startup``): the version the build recorded, a missing or
unsupported vLLM named with the supported version, the native modules checked against the
loaded library's C ABI, and a build without a C compiler that stops with what to install.

The failure paths run in subprocesses: a fake ``vllm`` distribution of another version first on
``sys.path`` (its metadata is what the plugin reads), ``sys.modules`` entries that hide vLLM or
a native module, a changed ``BUILT_ABI_VERSION``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import kvshare
import kvshare_vllm
from kvshare_vllm import compat, startup

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PKG))
SUPPORTED = compat.SUPPORTED_VLLM_VERSIONS[-1]


def _run(code: str, env_extra: dict | None = None, path_first: str | None = None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVSHARE_VLLM", "KVSHARE_VLLM_OPS", startup.ALLOW_UNSUPPORTED_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (path_first, PKG, os.path.join(REPO, "integration", "python"),
                    env.get("PYTHONPATH")) if p)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600, cwd=REPO)


@pytest.fixture(scope="module")
def vllm_0_99(tmp_path_factory):
    """A folder whose ``vllm-0.99.0.dist-info`` makes the metadata say vLLM 0.99.0."""
    d = tmp_path_factory.mktemp("fake-vllm-dist")
    info = d / "vllm-0.99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.99.0\n")
    return str(d)


def test_version_and_abi_come_from_the_build():
    sys.path.insert(0, os.path.join(REPO, "integration"))
    try:
        from cargo_version import cargo_version
    finally:
        sys.path.pop(0)
    assert kvshare_vllm.__version__ == cargo_version()
    assert kvshare_vllm.BUILT_ABI_VERSION == kvshare.ABI_VERSION
    assert kvshare_vllm.BUILT_ABI_VERSION == kvshare.lib.kvs_abi_version()


def test_supported_vllm_passes():
    assert startup.release(startup.require_vllm()) in compat.SUPPORTED_VLLM_VERSIONS
    startup.check_native()


def test_release_drops_the_local_label():
    assert startup.release("0.23.0+cpu") == "0.23.0"
    assert startup.release("0.23.0+empty") == "0.23.0"
    assert startup.release("0.23.1rc1") == "0.23.1rc1"


@pytest.mark.parametrize("code", [
    "import kvshare_vllm.manager",
    "import kvshare_vllm.hybrid",
    "from kvshare_vllm.plugin import register; register()",
])
def test_unsupported_vllm_is_named(vllm_0_99, code):
    res = _run(code, {"KVSHARE_VLLM": "1"}, path_first=vllm_0_99)
    assert res.returncode != 0, res.stdout
    assert "UnsupportedVllmError" in res.stderr, res.stderr[-3000:]
    assert f"supports vLLM {SUPPORTED}" in res.stderr and "has vLLM 0.99.0" in res.stderr, \
        res.stderr[-3000:]


def test_unsupported_vllm_with_the_plugin_off_is_quiet(vllm_0_99):
    """Installed but not enabled: vLLM's plugin loader calls register(), which does nothing."""
    res = _run("from kvshare_vllm.plugin import register; register(); print('ok')",
               path_first=vllm_0_99)
    assert res.returncode == 0 and res.stdout.splitlines()[-1] == "ok", res.stderr[-3000:]
    assert "0.99.0" not in res.stderr, res.stderr[-3000:]


def test_unsupported_vllm_allowed_is_a_warning(vllm_0_99):
    res = _run("import logging; logging.basicConfig(); import kvshare_vllm.manager; print('ok')",
               {startup.ALLOW_UNSUPPORTED_ENV: "1"}, path_first=vllm_0_99)
    assert res.returncode == 0 and res.stdout.splitlines()[-1] == "ok", res.stderr[-3000:]
    assert "has vLLM 0.99.0: going on because" in res.stderr, res.stderr[-3000:]


@pytest.mark.parametrize("code", [
    "import kvshare_vllm.manager",
    "from kvshare_vllm.plugin import register; register()",
])
def test_missing_vllm_is_named(code):
    res = _run("import sys; sys.modules['vllm'] = None\n" + code, {"KVSHARE_VLLM": "1"})
    assert res.returncode != 0
    assert "UnsupportedVllmError" in res.stderr and "ModuleNotFoundError" not in res.stderr, \
        res.stderr[-3000:]
    assert f"supports vLLM {SUPPORTED}" in res.stderr and "has no vLLM" in res.stderr


def test_a_native_module_of_another_abi_is_refused():
    res = _run("import kvshare_vllm; kvshare_vllm.BUILT_ABI_VERSION += 1\n"
               "from kvshare_vllm.plugin import register; register()", {"KVSHARE_VLLM": "1"})
    assert res.returncode != 0
    assert "NativeModuleError" in res.stderr, res.stderr[-3000:]
    want = (f"compiled against kvshare.h with C ABI {kvshare.ABI_VERSION + 1}, but "
            f"{kvshare.LIB_PATH} has C ABI {kvshare.ABI_VERSION}")
    assert want in res.stderr, res.stderr[-3000:]


def test_a_native_module_that_does_not_load_is_refused():
    res = _run("import sys; sys.modules['kvshare_vllm._fast'] = None\n"
               "import kvshare_vllm.hybrid", {"KVSHARE_VLLM": "1"})
    assert res.returncode != 0
    assert "NativeModuleError" in res.stderr and "_fast does not load" in res.stderr, \
        res.stderr[-3000:]


def test_build_without_a_c_compiler_stops_with_what_to_install(tmp_path):
    """No silent pure-Python install: the build (what pip runs) fails, naming the compiler and
    Python's headers. ``--force``: nothing compiled earlier is reused."""
    res = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--force", "--build-temp",
         str(tmp_path / "temp"), "--build-lib", str(tmp_path / "lib")],
        env=dict(os.environ, CC=str(tmp_path / "no-such-cc")), capture_output=True, text=True,
        timeout=600, cwd=PKG)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "kvshare-vllm needs its native module" in out, out[-3000:]
    assert re.search(r"install a C compiler and Python's headers", out), out[-3000:]
    assert not list(tmp_path.glob("lib/kvshare_vllm/*.so"))
