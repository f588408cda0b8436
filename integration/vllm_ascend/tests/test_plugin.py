"""The vllm.general_plugins entry point, installed as a real distribution."""

import os
import subprocess
import sys

import pytest

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINDING = os.path.join(os.path.dirname(PKG), "python")

CHECK = r"""
import os, sys
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()  # re-entrant
import vllm.v1.core.sched.scheduler as m
print("SWAPPED" if hasattr(m, "_kvshare_original_KVCacheManager") else "ORIGINAL", m.KVCacheManager.__name__)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    for pkg in (BINDING, PKG):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-index", "--target", str(target), pkg],
                       check=True)
    return str(target)


def _run(site, env_extra):
    env = dict(os.environ, PYTHONPATH=site, **env_extra)
    env.pop("KVSHARE_VLLM", None)
    env.update(env_extra)
    res = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-1]


def test_entry_point_swaps_when_enabled(installed):
    assert _run(installed, {"KVSHARE_VLLM": "1"}) == "SWAPPED KVCacheManagerSelector"


def test_entry_point_off_by_default(installed):
    assert _run(installed, {}) == "ORIGINAL KVCacheManager"


def test_vllm_plugins_filter_excludes_it(installed):
    assert _run(installed, {"KVSHARE_VLLM": "1", "VLLM_PLUGINS": "someone_else"}) == \
        "ORIGINAL KVCacheManager"


def test_unsupported_config_falls_back(tiny_model_dir):
    """Two KV-cache groups: the selector builds vLLM's own manager."""
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            SlidingWindowSpec)

    from kvshare_vllm.plugin import make_kv_cache_manager_factory

    sel = make_kv_cache_manager_factory(KVCacheManager)
    cfg = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1,
                                                  dtype=torch.float32)),
        KVCacheGroupSpec(["b"], SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=1,
                                                  dtype=torch.float32, sliding_window=32))])
    m = sel(kv_cache_config=cfg, max_model_len=256, scheduler_block_size=16, hash_block_size=16)
    assert type(m) is KVCacheManager
