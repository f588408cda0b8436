"""The vllm-ascend 0.23.0 patch applies cleanly to the released wheel's sources and the patched
files still compile; its calls into kvshare_vllm.ops match the hooks' signatures.

The wheel (``vllm-ascend==0.23.0``, cp311 manylinux x86_64, pinned by sha256) is downloaded once
with ``pip download --no-deps`` into ``<venv>/kvshare-cache/`` (``$KVSHARE_VLLM_ASCEND_WHEEL``
names an existing copy instead). Skipped only when PyPI cannot be reached. Nothing of
vllm-ascend is committed: only the diff under ``patches/``.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import inspect
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile

import pytest

from kvshare_vllm import ops

HERE = os.path.dirname(os.path.abspath(__file__))
PATCH = os.path.join(os.path.dirname(HERE), "patches", "vllm-ascend-0.23.0-kvshare-ops.patch")
VERSION = "0.23.0"
WHEEL = "vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl"
SHA256 = "4f0d25d3b6d8ae85753b53d4bd8d910418865baf413fa779b87012ad1a4a3f87"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/vllm-ascend/", timeout=20):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def wheel() -> str:
    env = os.environ.get("KVSHARE_VLLM_ASCEND_WHEEL")
    if env:
        assert os.path.isfile(env), f"KVSHARE_VLLM_ASCEND_WHEEL={env!r} is not a file"
        path = env
    else:
        cache = os.path.join(sys.prefix, "kvshare-cache", f"vllm-ascend-{VERSION}")
        path = os.path.join(cache, WHEEL)
        if not os.path.isfile(path):
            os.makedirs(cache, exist_ok=True)
            tmp = tempfile.mkdtemp(dir=cache)  # then an atomic rename: concurrent runs are safe
            # The platform is pinned so every host fetches the same file (only its .py matter).
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
                   f"vllm-ascend=={VERSION}", "-d", tmp]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                got = os.path.join(tmp, WHEEL)
                if r.returncode != 0 or not os.path.isfile(got):
                    if not _pypi_reachable():
                        pytest.skip("PyPI is unreachable: cannot download vllm-ascend==0.23.0")
                    pytest.fail(f"pip download failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
                os.replace(got, path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    digest = _sha256(path)
    assert digest == SHA256, f"{path}: sha256 {digest}, expected {SHA256} (vllm-ascend 0.23.0)"
    return path


def _patched_paths() -> list[str]:
    with open(PATCH, encoding="utf-8") as f:
        text = f.read()
    paths = re.findall(r"^\+\+\+ b/(\S+)", text, flags=re.M)
    assert paths, "no file in the patch"
    return paths


@pytest.fixture()
def sources(wheel, tmp_path) -> str:
    """The patched files (and only those) extracted from the wheel into a fresh directory."""
    root = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as z:
        for p in _patched_paths():
            z.extract(p, root)
    return str(root)


def test_patch_applies_cleanly_with_patch(sources):
    r = subprocess.run(["patch", "--dry-run", "--fuzz=0", "-p1", "-d", sources, "-i", PATCH],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not re.search(r"offset|fuzz|FAILED|reject", r.stdout + r.stderr, re.I), r.stdout


def test_patch_applies_cleanly_with_git_apply(sources):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = subprocess.run(["git", "apply", "--check", "-v", PATCH], cwd=sources,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _apply(sources: str) -> None:
    r = subprocess.run(["patch", "--fuzz=0", "-p1", "-d", sources, "-i", PATCH],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not glob.glob(os.path.join(sources, "**", "*.rej"), recursive=True)


def test_patched_files_compile(sources):
    _apply(sources)
    for p in _patched_paths():
        py_compile.compile(os.path.join(sources, p), doraise=True)
    # and the patch reverses cleanly (nothing else changed)
    r = subprocess.run(["patch", "-R", "--dry-run", "--fuzz=0", "-p1", "-d", sources, "-i", PATCH],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _kvshare_calls(tree: ast.AST):
    """(enclosing function, hook name, positional args, keywords) of every `_kvshare_ops.X(...)`."""
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "_kvshare_ops"):
                out.append((fn.name, node.func.attr, len(node.args),
                            [k.arg for k in node.keywords]))
    return out


def test_patched_calls_match_the_hooks(sources):
    _apply(sources)
    path = os.path.join(sources, "vllm_ascend", "attention", "attention_v1.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    calls = _kvshare_calls(tree)
    where = {(fn, hook) for fn, hook, _, _ in calls}
    assert where == {("forward_impl", "ascend_decode"), ("reshape_and_cache", "ascend_kv_write"),
                     ("do_kv_cache_update", "ascend_kv_write")}, calls
    for _, hook, nargs, kws in calls:
        assert hook in ops.__all__
        inspect.signature(getattr(ops, hook)).bind(*range(nargs), **{k: None for k in kws})
    # the hooks are imported only when KVSHARE_VLLM_OPS=1, by the name the calls use
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and n.module == "kvshare_vllm"]
    assert [(a.name, a.asname) for n in imports for a in n.names] == [("ops", "_kvshare_ops")]
    assert ops.ENV_ENABLE == "KVSHARE_VLLM_OPS"


def test_unpatched_wheel_still_has_the_native_calls_the_patch_guards(wheel):
    """The spots the patch hooks into are where vllm-ascend 0.23.0 launches its decode
    attention and KV write (so the patch routes the right calls)."""
    with zipfile.ZipFile(wheel) as z:
        src = z.read("vllm_ascend/attention/attention_v1.py").decode()
        dev = z.read("vllm_ascend/device/device_op.py").decode()
    assert "torch_npu._npu_paged_attention(" in src
    assert "DeviceOperator.reshape_and_cache(" in src
    assert "torch_npu._npu_reshape_and_cache(" in dev
    assert "return (2, num_blocks, block_size, num_kv_heads, head_size)" in src
