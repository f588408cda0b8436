"""kvshare's manager on hybrid models next to vllm-ascend 0.23.0's KV-cache patches, without an NPU.

vllm-ascend's platform plugin replaces vLLM's ``get_kv_cache_coordinator`` (its
``AscendHybridKVCacheCoordinator`` for every multi-group configuration) and patches
``KVCacheManager.allocate_slots`` / ``SingleTypeKVCacheManager.remove_skipped_blocks`` /
``Scheduler.__init__`` (async SWA lifetime: tokens still in flight keep their window; windowed
groups' admission cap sized for every in-flight batch).  kvshare's plugin replaces the
``KVCacheManager`` the scheduler builds, so none of those run when kvshare manages the cache:
its hybrid manager reads the same two knobs instead (``request.num_in_flight_tokens``, the cap
vllm-ascend writes on ``coordinator.single_type_managers``).  ``ascend_hybrid_cases.py`` runs,
in a subprocess, the lockstep with those real vllm-ascend files (from the pinned wheel of
``test_patch.py``) applied to vLLM's reference side."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from test_patch import wheel  # noqa: F401  (the pinned vllm-ascend 0.23.0 wheel fixture)

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("vllm_ascend/core/single_type_kv_cache_manager.py",
         "vllm_ascend/patch/platform/patch_async_swa_kv_lifetime.py",
         "vllm_ascend/patch/platform/patch_kv_cache_coordinator.py")


def test_hybrid_lockstep_under_vllm_ascend_patches(wheel, tmp_path):  # noqa: F811
    root = tmp_path / "src"
    with zipfile.ZipFile(wheel) as z:
        for f in FILES:
            z.extract(f, root)
    env = dict(os.environ, KVSHARE_ASCEND_SOURCES=str(root),
               PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         os.path.join(HERE, "ascend_hybrid_cases.py")],
        cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
