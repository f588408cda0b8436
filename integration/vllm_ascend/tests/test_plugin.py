"""The vllm.general_plugins entry point, installed as a real distribution."""

import os
import subprocess
import sys

import pytest


CHECK = r"""
import os, sys
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()  # re-entrant
import vllm.v1.core.sched.scheduler as m
print("SWAPPED" if hasattr(m, "_kvshare_original_KVCacheManager") else "ORIGINAL", m.KVCacheManager.__name__)
"""


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
    """Sliding window + full attention: kvshare's hybrid manager (KV events on too; on vLLM
    0.32 under sparse prefix-cache retention too, 0.32's default, but for segments longer than
    kvshare's limit; with EAGLE on vLLM 0.23); a Mamba group, EAGLE beside a chunked group (or
    beside a window on vLLM 0.32): the selector builds vLLM's own manager."""
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                                            KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                            SlidingWindowSpec)

    from kvshare_vllm import compat
    from kvshare_vllm.manager import KvshareKVCacheManager
    from kvshare_vllm.plugin import make_kv_cache_manager_factory

    sel = make_kv_cache_manager_factory(KVCacheManager)
    groups = [
        KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1,
                                                  dtype=torch.float32)),
        KVCacheGroupSpec(["b"], SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=1,
                                                  dtype=torch.float32, sliding_window=32))]
    cfg = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)
    m = sel(kv_cache_config=cfg, max_model_len=256, scheduler_block_size=16, hash_block_size=16)
    assert type(m) is KvshareKVCacheManager
    m = sel(kv_cache_config=cfg, max_model_len=256, scheduler_block_size=16, hash_block_size=16,
            enable_kv_cache_events=True)
    assert type(m) is KvshareKVCacheManager and m.enable_kv_cache_events
    if compat.manager_api() != "0.23.0":
        sparse = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups,
                               prefix_cache_retention_interval=0)
        m = sel(kv_cache_config=sparse, max_model_len=256, scheduler_block_size=16,
                hash_block_size=16)
        assert type(m) is KvshareKVCacheManager and m._sparse
        sparse.prefix_cache_retention_interval = 16 * 65535  # beyond kvshare's segments
        m = sel(kv_cache_config=sparse, max_model_len=256, scheduler_block_size=16,
                hash_block_size=16)
        assert type(m) is KVCacheManager
    old = compat.manager_api() == "0.23.0"
    m = sel(kv_cache_config=cfg, max_model_len=256, scheduler_block_size=16, hash_block_size=16,
            use_eagle=True)  # EAGLE beside a window
    assert type(m) is (KvshareKVCacheManager if old else KVCacheManager)
    if old:  # by position (0.32's scheduler passes keywords)
        m = sel(cfg, 256, 16, 16, 256, True, False, False, True)  # events on
        assert type(m) is KvshareKVCacheManager and m.enable_kv_cache_events
        m = sel(cfg, 256, 16, 16, 256, True, True)  # EAGLE beside a window
        assert type(m) is KvshareKVCacheManager and m.use_eagle
        assert [m.cache.group_info(g)["eagle"] for g in (0, 1)] == [True, True]
    chunked = KVCacheGroupSpec(["c"], ChunkedLocalAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32,
        attention_chunk_size=64))
    cfg_c = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[groups[0], chunked])
    m = sel(kv_cache_config=cfg_c, max_model_len=256, scheduler_block_size=16,
            hash_block_size=16, use_eagle=True)  # vLLM drops no block in a chunked group
    assert type(m) is KVCacheManager
    mamba = KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((1, 16),),
                                              dtypes=(torch.float32,)))
    cfg = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[groups[0], mamba])
    m = sel(kv_cache_config=cfg, max_model_len=256, scheduler_block_size=16, hash_block_size=16)
    assert type(m) is KVCacheManager


def test_dense_config_is_kvshares_unless_refused(tiny_model_dir):
    """One full-attention group: kvshare's manager, from keywords as both releases' schedulers
    pass them; on vLLM 0.32 a multi-module MTP prefill lookahead keeps vLLM's manager (its
    re-prefillable tokens stay out of the prefix cache there)."""
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from kvshare_vllm import compat
    from kvshare_vllm.manager import KvshareKVCacheManager
    from kvshare_vllm.plugin import make_kv_cache_manager_factory

    sel = make_kv_cache_manager_factory(KVCacheManager)
    group = KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=32, num_kv_heads=1,
                                                      head_size=1, dtype=torch.float32))
    cfg = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[group])
    base = dict(kv_cache_config=cfg, max_model_len=256, scheduler_block_size=32,
                hash_block_size=32, enable_caching=True, log_stats=True)
    if compat.manager_api() == "0.23.0":
        m = sel(max_num_batched_tokens=256, **base)
        assert type(m) is KvshareKVCacheManager
        return
    m = sel(max_in_flight_tokens=256, num_prefill_lookahead=1, watermark=0.25,
            enable_mamba_shared_prefix_checkpoint=False, **base)
    assert type(m) is KvshareKVCacheManager and m.watermark_blocks == 16
    assert m.mamba_shared_prefix_checkpoint is False
    assert not m.coordinator.enable_partial_hash_hits
    m = sel(max_in_flight_tokens=256, num_prefill_lookahead=3, **base)
    assert type(m) is KVCacheManager


class _NoModelExecutor:
    """Just enough of vLLM's Executor for the real ``EngineCore.__init__`` (no model, no
    workers): one full-attention layer and room for a fixed number of blocks."""

    BLOCKS = 64

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config

    def _spec(self):
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        return FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)

    def register_failure_callback(self, callback):
        pass

    def get_supported_kv_cache_layouts(self):  # vLLM 0.32: one worker, vLLM's CPU layout
        return [["LBHNC"]]

    def set_kv_cache_layout(self, layout_name):
        pass

    def compile_or_warm_up_model(self):
        pass

    def get_kv_cache_specs(self):
        return [{"layer": self._spec()}]

    def determine_available_memory(self):
        return [self._spec().page_size_bytes * self.BLOCKS]

    def initialize_from_config(self, kv_cache_configs):
        pass

    def collective_rpc(self, *args, **kwargs):
        return []

    def shutdown(self):
        pass

    max_concurrent_batches = 1


def _engine_core(tiny_model_dir, kvshare: bool, **kw):
    import harness as h
    from vllm.v1.engine.core import EngineCore

    from kvshare_vllm import plugin

    if kvshare:
        plugin.apply()
    try:
        return EngineCore(h.make_vllm_config(tiny_model_dir, max_model_len=512, **kw),
                          _NoModelExecutor,
                          log_stats=False)
    finally:
        if kvshare:
            plugin.remove()


def _engine_request(rid: str, prompt: list[int]):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    return EngineCoreRequest(request_id=rid, prompt_token_ids=prompt, mm_features=None,
                             sampling_params=SamplingParams(max_tokens=4), pooling_params=None,
                             arrival_time=0.0, lora_request=None, cache_salt=None,
                             data_parallel_rank=None)


@pytest.mark.parametrize("kvshare", [True, False])
def test_engine_core_drops_the_block_hasher_only_for_kvshare(tiny_model_dir, kvshare,
                                                              monkeypatch):
    """The real EngineCore.__init__ (model executor faked): with kvshare managing the cache,
    requests arrive without vLLM's block hashes; with vLLM's manager they keep them."""
    from kvshare_vllm.manager import KvshareKVCacheManager

    monkeypatch.delenv("KVSHARE_VLLM_BLOCK_HASHES", raising=False)
    core = _engine_core(tiny_model_dir, kvshare)
    try:
        assert isinstance(core.scheduler.kv_cache_manager, KvshareKVCacheManager) is kvshare
        assert core.request_block_hasher is not None  # built by __init__ either way
        from kvshare_vllm import plugin

        plugin.apply()  # the wrap is looked up per call: loading after __init__ is enough
        try:
            req, _ = core.preprocess_add_request(_engine_request("r", list(range(3, 40))))
        finally:
            plugin.remove()
        assert (core.request_block_hasher is None) is kvshare
        assert (req.block_hashes == []) is kvshare
        assert len(req.block_hashes) == (0 if kvshare else 2)
        core.add_request(req)
        out = core.scheduler.schedule()
        assert out.num_scheduled_tokens == {"r": 37}
    finally:
        core.shutdown()


def test_block_hasher_kept_on_request(tiny_model_dir, monkeypatch):
    from kvshare_vllm import plugin

    monkeypatch.setenv("KVSHARE_VLLM_BLOCK_HASHES", "1")
    core = _engine_core(tiny_model_dir, True)
    try:
        assert plugin.drop_block_hasher(core) is False
        assert core.request_block_hasher is not None
    finally:
        core.shutdown()


def test_block_hasher_kept_with_kv_events(tiny_model_dir, monkeypatch):
    """KV events publish vLLM's block hashes (kvshare_vllm.events): with events on, the real
    EngineCore keeps vLLM's request block hasher under kvshare's manager."""
    from kvshare_vllm import plugin
    from kvshare_vllm.manager import KvshareKVCacheManager

    monkeypatch.delenv("KVSHARE_VLLM_BLOCK_HASHES", raising=False)
    core = _engine_core(tiny_model_dir, True, kv_events=True)
    try:
        assert isinstance(core.scheduler.kv_cache_manager, KvshareKVCacheManager)
        assert plugin.drop_block_hasher(core) is False
        req, _ = core.preprocess_add_request(_engine_request("r", list(range(3, 40))))
        assert len(req.block_hashes) == 2
    finally:
        core.shutdown()
