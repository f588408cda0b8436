"""The ``vllm.general_plugins`` entry point: swaps kvshare in for vLLM's KVCacheManager.

vLLM runs general plugins in every process before the engine core builds its scheduler, so
rebinding the ``KVCacheManager`` name that ``vllm.v1.core.sched.scheduler`` imported is enough;
vLLM's source is not changed.  The swap is active when ``KVSHARE_VLLM`` is ``1`` (the default
once the package is installed is *off*: ``KVSHARE_VLLM=1`` turns it on; vLLM's own
``VLLM_PLUGINS`` list can also exclude the ``kvshare`` plugin).  ``register()`` is idempotent.

Configurations kvshare does not manage (several KV-cache groups, sliding window, Mamba,
cross-attention, context parallelism) fall back to vLLM's own manager, with a log line.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("kvshare_vllm")

ENV = "KVSHARE_VLLM"
# Modules that imported vLLM's KVCacheManager by name and build it (rebinding them is the swap).
TARGET_MODULES = ("vllm.v1.core.sched.scheduler",)
_ORIGINAL_ATTR = "_kvshare_original_KVCacheManager"


def enabled() -> bool:
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def make_kv_cache_manager_factory(original):
    """A callable with KVCacheManager's constructor signature choosing kvshare or ``original``."""
    from .manager import KvshareKVCacheManager, unsupported_reason

    class KVCacheManagerSelector:
        """Stands in for ``KVCacheManager`` in the scheduler module: builds kvshare's manager
        for supported configurations, vLLM's own otherwise."""

        kvshare_original = original

        def __new__(cls, kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                    *args, **kwargs):
            why = unsupported_reason(kv_cache_config, scheduler_block_size, hash_block_size,
                                     kwargs.get("dcp_world_size", 1),
                                     kwargs.get("pcp_world_size", 1))
            if why:
                logger.warning("kvshare_vllm: using vLLM's KVCacheManager: %s", why)
                return original(kv_cache_config, max_model_len, scheduler_block_size,
                                hash_block_size, *args, **kwargs)
            logger.info("kvshare_vllm: KV-cache bookkeeping runs in kvshare")
            return KvshareKVCacheManager(kv_cache_config, max_model_len, scheduler_block_size,
                                         hash_block_size, *args, **kwargs)

    return KVCacheManagerSelector


def apply() -> None:
    """Rebinds ``KVCacheManager`` in the scheduler module(s) (idempotent)."""
    import importlib

    for name in TARGET_MODULES:
        mod = importlib.import_module(name)
        if hasattr(mod, _ORIGINAL_ATTR):
            continue
        original = mod.KVCacheManager
        setattr(mod, _ORIGINAL_ATTR, original)
        mod.KVCacheManager = make_kv_cache_manager_factory(original)


def remove() -> None:
    """Undoes :func:`apply` (tests)."""
    import importlib

    for name in TARGET_MODULES:
        mod = importlib.import_module(name)
        if hasattr(mod, _ORIGINAL_ATTR):
            mod.KVCacheManager = getattr(mod, _ORIGINAL_ATTR)
            delattr(mod, _ORIGINAL_ATTR)


def register() -> None:
    """Entry point of ``vllm.general_plugins`` (runs in every vLLM process; re-entrant)."""
    if not enabled():
        return
    apply()
