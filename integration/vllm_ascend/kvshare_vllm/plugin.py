"""The ``vllm.general_plugins`` entry point: swaps kvshare in for vLLM's KVCacheManager.

vLLM runs general plugins in every process before the engine core builds its scheduler, so
rebinding the ``KVCacheManager`` name that ``vllm.v1.core.sched.scheduler`` imported is enough;
vLLM's source is not changed.  The swap is active when ``KVSHARE_VLLM`` is ``1`` (the default
once the package is installed is *off*: ``KVSHARE_VLLM=1`` turns it on; vLLM's own
``VLLM_PLUGINS`` list can also exclude the ``kvshare`` plugin).  ``register()`` is idempotent.

``KVSHARE_VLLM_OPS=1`` (independently of ``KVSHARE_VLLM``) also puts kvshare's attention inside
vLLM's CPU engine: :mod:`kvshare_vllm.cpu_attn` serves the platform's attention backend slot.

Every model kvshare takes runs in :class:`kvshare_vllm.manager.KvshareKVCacheManager`, one
class for one or many KV-cache groups (full attention / MLA, sliding window, chunked local
attention, Mamba / linear-attention state): a plain model is one full-attention group.
Configurations it does not manage (``unsupported_reason``: cross-attention, EAGLE beside
windowed or state groups, context parallelism, ...; a KV connector with Mamba /
linear-attention state groups) fall back to vLLM's own manager, with a log line.  So do KV
connectors whose scheduler side takes vLLM's ``BlockPool`` itself (``connector_reason``:
``SimpleCPUOffloadConnector`` in vLLM 0.23.0); every other connector runs with kvshare's
manager, which takes their external tokens, delayed caching (``allocate_slots``) and
``evict_blocks``.  On vLLM 0.32 the manager runs with kvshare's KV connector and vLLM's own,
follows 0.32's sparse prefix-cache retention of sliding-window groups and its deferred block
frees, and refuses Mamba / linear-attention state groups that cache states (modes all and
align: ``manager_newer.newer_groups_reason``).  The scheduler builds the manager with keywords
on both releases; ``_keywords`` reads positional arguments by the running vLLM's signature.

When kvshare manages the cache, vLLM's per-request block hasher (``Request.block_hashes``,
SHA-256 over every full block, recomputed as tokens arrive) has no reader left: kvshare
hashes tokens natively inside its own calls.  ``EngineCore.preprocess_add_request`` is
wrapped to drop the engine's ``request_block_hasher`` the first time a request arrives at an
engine whose scheduler holds a kvshare manager, no KV connector (connectors read
``block_hashes``) and KV events off (the events carry vLLM's block hashes: see
:mod:`kvshare_vllm.events`).  ``KVSHARE_VLLM_BLOCK_HASHES=1`` keeps the hasher.
"""

from __future__ import annotations

import os

from . import logger

ENV = "KVSHARE_VLLM"
OPS_ENV = "KVSHARE_VLLM_OPS"
KEEP_HASHES_ENV = "KVSHARE_VLLM_BLOCK_HASHES"
ENGINE_MODULE = "vllm.v1.engine.core"
# Modules that imported vLLM's KVCacheManager by name and build it (rebinding them is the swap).
TARGET_MODULES = ("vllm.v1.core.sched.scheduler",)
_ORIGINAL_ATTR = "_kvshare_original_KVCacheManager"


def enabled() -> bool:
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def connector_reason(connector) -> str | None:
    """Why kvshare's manager cannot serve this KV connector's scheduler side (None when it can,
    and for no connector).  A connector is served when it uses the manager's public surface
    only (``get_blocks`` / ``get_block_ids`` and the block objects' ``block_id``, ``is_null``,
    ``block_hash``, plus ``allocate_slots``' external tokens).  One that overrides
    ``KVConnectorBase_V1.bind_gpu_block_pool`` takes vLLM's ``BlockPool`` and drives its
    internals (free queue, cached-block map, ref counts), which kvshare's manager does not
    have; so does one overriding ``bind_kv_cache_manager`` (vLLM 0.32's HiSparse connector);
    a ``MultiConnector`` is judged by the connectors it holds."""
    if connector is None:
        return None
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    subs = getattr(connector, "_connectors", None)
    if type(connector).__name__ == "MultiConnector" and subs is not None:
        for sub in subs:
            why = connector_reason(sub)
            if why:
                return why
        return None
    from .connector import KvshareConnector

    if isinstance(connector, KvshareConnector):  # binds kvshare's own manager (connector.py)
        return None
    for hook, what in (("bind_gpu_block_pool", "BlockPool"),
                       ("bind_kv_cache_manager", "KVCacheManager")):  # the second: vLLM 0.31+
        bind = getattr(type(connector), hook, None)
        if bind is not None and bind is not getattr(KVConnectorBase_V1, hook, None):
            return (f"KV connector {type(connector).__name__} takes vLLM's {what} ({hook}) "
                    "and drives its internals")
    return None


def _connector_groups_reason(connector, kv_cache_config) -> str | None:
    """Why kvshare's manager cannot serve this KV connector on this model's groups (None when
    it can, and for no connector): a connector loads external tokens into attention pages, and
    the manager takes external tokens in attention groups only (kvshare's own connector
    is judged by ``unsupported_reason`` through its host tier)."""
    if connector is None:
        return None
    from .connector import KvshareConnector
    from .state_groups import is_state_spec

    if isinstance(connector, KvshareConnector):
        return None
    if any(is_state_spec(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups):
        return "a KV connector with Mamba / linear-attention state groups"
    return None


def deferred_copies_reason(sched, connector, block_size: int) -> str | None:
    """Why sub-page hits (``KVSHARE_VLLM_MATCH_UNIT``) cannot run on this scheduler: one that
    defers block frees (vLLM 0.32 with a consuming KV connector and several batches in
    flight) while vLLM's block copies carry the hits' partial copies (any connector but
    kvshare's, which runs them itself, in order).  vLLM then holds a copy's source block
    until the step in flight is done; kvshare hands a source back with the copy, so the next
    step could give it to a load that overwrites it first.  None otherwise."""
    from .base import MATCH_UNIT_ENV, match_unit_setting
    from .connector import KvshareConnector

    if not getattr(sched, "defer_block_free", False) or isinstance(connector, KvshareConnector):
        return None
    unit = match_unit_setting(block_size)
    if not unit:
        return None
    return (f"{MATCH_UNIT_ENV}={unit}: sub-page hits on a scheduler that defers block frees "
            f"(a consuming KV connector, {type(connector).__name__}, with several batches in "
            "flight): vLLM's block copies would read a source block the next step may hand "
            "out; configure KvshareConnector (it runs the copies) or unset it")


def _refuse_deferred_copies(sched, connector, block_size: int) -> None:
    """Raises ValueError with ``deferred_copies_reason`` where it has one (before kvshare's
    manager is built: the user asked for sub-page hits)."""
    why = deferred_copies_reason(sched, connector, block_size)
    if why:
        raise ValueError(f"kvshare_vllm: {why}")


def _building_scheduler():
    """The ``Scheduler`` whose ``__init__`` is constructing the manager (vLLM's
    ``Scheduler.__init__`` sets ``self.cache_config`` and builds ``self.connector`` before the
    ``KVCacheManager``, and passes the manager no config that names either); None when the
    caller of ``KVCacheManagerSelector.__new__`` is not a scheduler."""
    import sys

    frame = sys._getframe(2)  # the caller of KVCacheManagerSelector.__new__
    return frame.f_locals.get("self") if frame is not None else None


def _log_host_tier() -> None:
    from .host_tier import HOST_PAGES

    host = HOST_PAGES.get()  # kvshare's KV connector configured: the host tier is on
    if host:
        logger.info("kvshare_vllm: host tier of %d pages (kvshare's KV connector)", host)


def make_kv_cache_manager_factory(original):
    """A callable with KVCacheManager's constructor signature choosing kvshare or ``original``."""
    from .base import cache_dtype_reason
    from .manager import KvshareKVCacheManager, unsupported_reason

    class KVCacheManagerSelector:
        """Stands in for ``KVCacheManager`` in the scheduler module: builds kvshare's manager
        for supported configurations, vLLM's own otherwise."""

        kvshare_original = original

        def __new__(cls, kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                    *args, **kwargs):
            sched = _building_scheduler()
            connector = getattr(sched, "connector", None)
            # A cache format kvshare's manager cannot carry is refused, not left to vLLM's
            # manager: the user asked for kvshare.
            cache_dtype = getattr(getattr(sched, "cache_config", None), "cache_dtype", None)
            for group in kv_cache_config.kv_cache_groups:
                why_format = cache_dtype_reason(cache_dtype, group.kv_cache_spec)
                if why_format:
                    raise ValueError(f"kvshare_vllm: {why_format}; KVSHARE_VLLM=0 keeps "
                                     "vLLM's own manager")
            kw = _keywords(original, args, kwargs)
            why = connector_reason(connector) or unsupported_reason(
                kv_cache_config, scheduler_block_size, hash_block_size,
                kw.get("dcp_world_size", 1), kw.get("pcp_world_size", 1),
                kw.get("use_eagle", False), kw.get("enable_kv_cache_events", False),
                max_model_len=max_model_len,
                num_prefill_lookahead=kw.get("num_prefill_lookahead", 0)) \
                or _connector_groups_reason(connector, kv_cache_config)
            if why:
                logger.warning("kvshare_vllm: using vLLM's KVCacheManager: %s", why)
                return original(kv_cache_config, max_model_len, scheduler_block_size,
                                hash_block_size, *args, **kwargs)
            _refuse_deferred_copies(sched, connector, scheduler_block_size)
            n = len(kv_cache_config.kv_cache_groups)
            logger.info("kvshare_vllm: KV-cache bookkeeping runs in kvshare (%d KV-cache "
                        "group%s)", n, "" if n == 1 else "s")
            _log_host_tier()
            return KvshareKVCacheManager(kv_cache_config, max_model_len, scheduler_block_size,
                                         hash_block_size, *args, **kwargs)

    return KVCacheManagerSelector


def _keywords(original, args, kwargs) -> dict:
    """The constructor arguments after ``hash_block_size`` by name, whether the scheduler gave
    them by position or by keyword (``original``'s signature: the running vLLM's
    ``KVCacheManager``)."""
    if not args:
        return kwargs
    import inspect

    names = list(inspect.signature(original).parameters)[4:]  # after hash_block_size
    return {**dict(zip(names, args)), **kwargs}


def drop_block_hasher(engine_core) -> bool:
    """Removes ``engine_core.request_block_hasher`` when nothing reads the block hashes it
    computes: the scheduler's KV cache manager is kvshare's, KV events are off (they publish
    vLLM's block hashes) and there is no KV connector.
    Returns whether it did.  Requests built afterwards carry no ``block_hashes``."""
    from .manager import KvshareKVCacheManager

    if getattr(engine_core, "request_block_hasher", None) is None:
        return False
    if os.environ.get(KEEP_HASHES_ENV, "0").strip().lower() in ("1", "true", "yes", "on"):
        return False
    sched = getattr(engine_core, "scheduler", None)
    manager = getattr(sched, "kv_cache_manager", None)
    if not isinstance(manager, KvshareKVCacheManager) \
            or manager.enable_kv_cache_events:
        return False
    get_connector = getattr(sched, "get_kv_connector", None)
    if get_connector is None:
        return False
    conn = get_connector()
    if conn is not None and type(conn).__name__ != "KvshareConnector":  # ours reads no hashes
        return False
    engine_core.request_block_hasher = None
    logger.info("kvshare_vllm: vLLM's request block hasher is off (kvshare hashes natively)")
    return True


def _wrap_preprocess(original):
    def preprocess_add_request(self, request):
        if getattr(self, "request_block_hasher", None) is not None \
                and not getattr(self, "_kvshare_hasher_checked", False):
            self._kvshare_hasher_checked = True
            drop_block_hasher(self)
        return original(self, request)

    preprocess_add_request._kvshare_wrap = True
    preprocess_add_request.__wrapped__ = original
    preprocess_add_request.__doc__ = original.__doc__
    return preprocess_add_request


def _wrap_scheduler_init(original):
    """``Scheduler.__init__`` with the host pages of kvshare's KV connector (0 without it) in
    ``host_tier.HOST_PAGES``, where the manager reads them: the scheduler builds its connector
    and then its manager, and the manager's constructor has no view of the config."""
    from .connector import host_pages
    from .host_tier import HOST_PAGES
    from .pool_tier import POOL, pool_settings

    def __init__(self, vllm_config, *args, **kwargs):
        token = HOST_PAGES.set(host_pages(vllm_config))
        pool = POOL.set(pool_settings(vllm_config))
        try:
            original(self, vllm_config, *args, **kwargs)
        finally:
            POOL.reset(pool)
            HOST_PAGES.reset(token)

    __init__._kvshare_wrap = True
    __init__.__wrapped__ = original
    __init__.__doc__ = original.__doc__
    return __init__


def apply() -> None:
    """Rebinds ``KVCacheManager`` in the scheduler module(s) and wraps
    ``EngineCore.preprocess_add_request`` (idempotent).  The wrap is a method looked up per
    call, so it takes effect even when the plugins are loaded inside ``EngineCore.__init__``."""
    import importlib

    for name in TARGET_MODULES:
        mod = importlib.import_module(name)
        if hasattr(mod, _ORIGINAL_ATTR):
            continue
        original = mod.KVCacheManager
        setattr(mod, _ORIGINAL_ATTR, original)
        mod.KVCacheManager = make_kv_cache_manager_factory(original)
        sched = getattr(mod, "Scheduler", None)
        if sched is not None and not getattr(sched.__init__, "_kvshare_wrap", False):
            sched.__init__ = _wrap_scheduler_init(sched.__init__)
    core = importlib.import_module(ENGINE_MODULE).EngineCore
    if not getattr(core.preprocess_add_request, "_kvshare_wrap", False):
        core.preprocess_add_request = _wrap_preprocess(core.preprocess_add_request)


def remove() -> None:
    """Undoes :func:`apply` (tests)."""
    import importlib

    for name in TARGET_MODULES:
        mod = importlib.import_module(name)
        if hasattr(mod, _ORIGINAL_ATTR):
            mod.KVCacheManager = getattr(mod, _ORIGINAL_ATTR)
            delattr(mod, _ORIGINAL_ATTR)
        sched = getattr(mod, "Scheduler", None)
        if sched is not None and getattr(sched.__init__, "_kvshare_wrap", False):
            sched.__init__ = sched.__init__.__wrapped__
    core = importlib.import_module(ENGINE_MODULE).EngineCore
    if getattr(core.preprocess_add_request, "_kvshare_wrap", False):
        core.preprocess_add_request = core.preprocess_add_request.__wrapped__


def ops_enabled() -> bool:
    """``KVSHARE_VLLM_OPS=1``: kvshare's attention ops (on vLLM's CPU platform, the attention
    backend of :mod:`kvshare_vllm.cpu_attn`; on Ascend, the vllm-ascend patch's hooks)."""
    return os.environ.get(OPS_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def register_attention() -> bool:
    """On vLLM's CPU platform, serves its attention backend slot with kvshare's; returns whether
    it did (other platforms: the vllm-ascend patch calls :mod:`kvshare_vllm.ops` directly)."""
    from vllm.platforms import current_platform

    if current_platform.device_type != "cpu":
        return False
    from . import cpu_attn

    # The backend logs that it runs when a model's first layer is built (cpu_attn.ENGAGED):
    # vLLM 0.32 sets its logging up only after loading plugins, which loses a line from here.
    cpu_attn.register()
    return True


def register() -> None:
    """Entry point of ``vllm.general_plugins`` (runs in every vLLM process; re-entrant).
    Enabled, it first checks the vLLM version and the native module (:mod:`.startup`): an
    unsupported vLLM or a library of another C ABI stops the engine with what to install."""
    if ops_enabled() or enabled():
        from .startup import require

        require(manager=enabled(), attention=ops_enabled())
    if ops_enabled():
        register_attention()
    if enabled():
        apply()
