"""kvshare for vLLM / vLLM-Ascend: KV-cache bookkeeping in libkvshare, no change to vLLM.

``kvshare_vllm.plugin.register`` is the ``vllm.general_plugins`` entry point; enable it with
``KVSHARE_VLLM=1``.  ``kvshare_vllm.manager.KvshareKVCacheManager`` implements vLLM 0.23.0's
``KVCacheManager`` surface; ``kvshare_vllm.compat`` pins that surface and the supported vLLM
versions, ``kvshare_vllm.startup`` checks them and the native module at start-up.

``__version__`` (Cargo.toml's, as every kvshare version) and ``BUILT_ABI_VERSION`` (the C ABI of
the header the native module was compiled against) come from ``_build_info.py``, which the
build writes (``pip install``, or ``python setup.py build_ext --inplace`` in a checkout).
"""

import importlib.util
import logging

# A child of vLLM's "vllm" logger: vLLM configures only that logger (handler, level, format), in
# every process including the multiprocess engine core, so the plugin's lines show under vLLM's
# default logging and follow VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.kvshare_vllm")

try:
    from ._build_info import KVS_ABI_VERSION as BUILT_ABI_VERSION
    from ._build_info import __version__
except ImportError:
    raise ImportError("kvshare_vllm is not built: install it (pip install ./integration/python "
                      "./integration/vllm_ascend), or in a checkout run `python setup.py "
                      "build_ext --inplace` in integration/vllm_ascend") from None

if importlib.util.find_spec("vllm") is None:
    from .startup import UnsupportedVllmError, missing_vllm_message

    raise UnsupportedVllmError(missing_vllm_message())
