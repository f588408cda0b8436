"""Start-up checks (``kvshare_vllm.startup``): the version the build recorded, a missing or
unsupported vLLM named with the supported versions, a part (kvshare's manager, its attention
backend) refused on a supported vLLM it does not run on, the native modules checked against the
loaded library's C ABI, and a build without a C compiler that stops with what to install.

The failure paths run in subprocesses: a fake ``vllm`` distribution of another version first on
``sys.path`` (its metadata is what the plugin reads), ``sys.modules`` entries that hide vLLM or
a native module, a changed ``BUILT_ABI_VERSION``."""

from __future__ import annotations

import dataclasses
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
SUPPORTED = "vLLM 0.23.0 or vLLM 0.32.0"
PARTS = {"manager": "KVSHARE_VLLM", "attention": "KVSHARE_VLLM_OPS"}


def _run(code: str, env_extra: dict | None = None, path_first: str | None = None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVSHARE_VLLM", "KVSHARE_VLLM_OPS", startup.ALLOW_UNSUPPORTED_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (path_first, PKG, os.path.join(REPO, "integration", "python"),
                    env.get("PYTHONPATH")) if p)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600, cwd=REPO)


def _fake_vllm_dist(tmp_path_factory, version: str) -> str:
    """A folder whose ``vllm-<version>.dist-info`` makes the metadata say vLLM ``version``."""
    d = tmp_path_factory.mktemp("fake-vllm-dist")
    info = d / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return str(d)


@pytest.fixture(scope="module")
def vllm_0_99(tmp_path_factory):
    return _fake_vllm_dist(tmp_path_factory, "0.99.0")


@pytest.fixture(scope="module")
def vllm_0_32(tmp_path_factory):
    return _fake_vllm_dist(tmp_path_factory, "0.32.0")


def test_supported_versions_are_the_two_releases():
    assert compat.SUPPORTED_VLLM_VERSIONS == ("0.23.0", "0.32.0")
    assert startup.supported() == SUPPORTED
    assert compat.MANAGER_VLLM_VERSIONS == ("0.23.0", "0.32.0")
    # kvshare's attention backend runs on both, on 0.32 in vLLM's fused CPU layout.
    assert compat.VLLM_SUPPORT["0.32.0"].attention
    assert compat.VLLM_SUPPORT["0.32.0"].attention_cache == "fused"
    assert compat.VLLM_SUPPORT["0.23.0"].attention_cache == "split"


@pytest.mark.parametrize("part", sorted(PARTS))
def test_each_part_starts_or_is_refused_on_the_installed_vllm(part):
    """The real vLLM of this venv: the plugin's start-up with one part enabled goes through
    where ``compat.VLLM_SUPPORT`` says the part runs, and stops naming the reason elsewhere."""
    runs = getattr(compat.VLLM_SUPPORT[startup.release(startup.vllm_version())], part)
    res = _run("from kvshare_vllm.plugin import register; register(); print('ok')",
               {PARTS[part]: "1"})
    if runs:
        assert res.returncode == 0 and res.stdout.splitlines()[-1] == "ok", res.stderr[-3000:]
    else:
        assert res.returncode != 0, res.stdout
        assert "UnsupportedVllmError" in res.stderr, res.stderr[-3000:]
        assert f"({PARTS[part]}=1) runs on vLLM 0.23.0, not on this Python's vLLM 0.32.0" \
            in res.stderr, res.stderr[-3000:]


@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_part_missing_on_a_release_is_refused_with_the_reason(monkeypatch, part):
    """A part that ``compat.VLLM_SUPPORT`` records as missing on the installed release stops
    the start-up, naming the releases it runs on, the reason and the way out."""
    why = "its interface moved"
    monkeypatch.setitem(compat.VLLM_SUPPORT, "0.32.0", dataclasses.replace(
        compat.VLLM_SUPPORT["0.32.0"], **{part + "_missing": why}))
    monkeypatch.setattr(startup, "require_vllm", lambda: "0.32.0")
    with pytest.raises(startup.UnsupportedVllmError) as err:
        startup.require_parts(manager=part == "manager", attention=part == "attention")
    assert str(err.value).startswith("kvshare's ")
    assert f"({PARTS[part]}=1) runs on vLLM 0.23.0, not on this Python's vLLM 0.32.0: " \
        f"{why}. Unset {PARTS[part]}, or install vLLM 0.23.0" in str(err.value)
    startup.require_parts(manager=part != "manager", attention=part != "attention")


SIGNATURES = ("import inspect\nfrom kvshare_vllm.manager import KvshareKVCacheManager as M\n"
              "print([tuple(inspect.signature(getattr(M, n)).parameters) for n in "
              "('__init__', 'remove_skipped_blocks')])")


@pytest.mark.parametrize("fake, allow, surface", [
    ("vllm_0_32", False, "0.32.0"),
    ("vllm_0_99", True, "0.32.0"),  # allowed: the newest surface not newer than it
])
def test_the_manager_presents_the_surface_of_the_release_it_finds(request, fake, allow,
                                                                 surface):
    """The manager's constructor and the methods whose parameters moved are those of the
    release the installed vLLM's metadata names (``compat.manager_api``)."""
    res = _run(SIGNATURES, {startup.ALLOW_UNSUPPORTED_ENV: "1"} if allow else None,
               path_first=request.getfixturevalue(fake))
    assert res.returncode == 0, res.stderr[-3000:]
    pinned = compat.PINNED[surface]
    assert res.stdout.splitlines()[-1] == repr([pinned["__init__"],
                                                pinned["remove_skipped_blocks"]])


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
    "import kvshare_vllm.manager",
    "from kvshare_vllm.plugin import register; register()",
])
def test_unsupported_vllm_is_named(vllm_0_99, code):
    res = _run(code, {"KVSHARE_VLLM": "1"}, path_first=vllm_0_99)
    assert res.returncode != 0, res.stdout
    assert "UnsupportedVllmError" in res.stderr, res.stderr[-3000:]
    assert f"supports {SUPPORTED}; this Python has vLLM 0.99.0" in res.stderr, \
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
    assert f"supports {SUPPORTED}" in res.stderr and "has no vLLM" in res.stderr


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
               "import kvshare_vllm.manager", {"KVSHARE_VLLM": "1"})
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
