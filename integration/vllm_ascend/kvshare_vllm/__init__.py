"""kvshare for vLLM / vLLM-Ascend: KV-cache bookkeeping in libkvshare, no change to vLLM.

``kvshare_vllm.plugin.register`` is the ``vllm.general_plugins`` entry point; enable it with
``KVSHARE_VLLM=1``.  ``kvshare_vllm.manager.KvshareKVCacheManager`` implements vLLM 0.23.0's
``KVCacheManager`` surface; ``kvshare_vllm.compat`` pins that surface.
"""

__version__ = "0.1.0"
