"""pytest plugin for running vLLM's own scheduler tests (from vLLM's sdist) on a CPU host,
with or without kvshare.

- Forces vLLM's CPU platform (vLLM 0.23.0's CUDA wheel cannot infer a device without a GPU).
- With KVSHARE_VLLM=1, applies the kvshare_vllm swap exactly as the vllm.general_plugins entry
  point does, before any test module builds a Scheduler.
"""

import os


def pytest_configure(config):
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    if os.environ.get("KVSHARE_VLLM", "0") == "1":
        from kvshare_vllm import plugin

        plugin.register()
        import vllm.v1.core.sched.scheduler as m

        assert hasattr(m, "_kvshare_original_KVCacheManager")
