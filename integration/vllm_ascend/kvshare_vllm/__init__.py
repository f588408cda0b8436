"""kvshare for vLLM / vLLM-Ascend: KV-cache bookkeeping in libkvshare, no change to vLLM.

``kvshare_vllm.plugin.register`` is the ``vllm.general_plugins`` entry point; enable it with
``KVSHARE_VLLM=1``.  ``kvshare_vllm.manager.KvshareKVCacheManager`` implements vLLM 0.23.0's
``KVCacheManager`` surface; ``kvshare_vllm.compat`` pins that surface.
"""

import logging

__version__ = "0.1.0"

# A child of vLLM's "vllm" logger: vLLM configures only that logger (handler, level, format), in
# every process including the multiprocess engine core, so the plugin's lines show under vLLM's
# default logging and follow VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.kvshare_vllm")
