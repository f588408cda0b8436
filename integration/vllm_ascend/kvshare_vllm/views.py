"""The parts of vLLM's ``KVCacheManager`` surface that the scheduler and connectors read
through attributes (``coordinator``, ``coordinator.single_type_managers``, ``block_pool``):
thin views that forward to ``KvshareKVCacheManager``, which holds all the state."""

from __future__ import annotations

from typing import Any, Protocol

from vllm.distributed.kv_events import KVCacheEvent
from vllm.v1.core.kv_cache_utils import KVCacheBlock


class _Manager(Protocol):
    """What the views read of the manager (``KvshareKVCacheManager`` provides it)."""

    block_pool: Any
    block_size: int
    enable_caching: bool
    enable_kv_cache_events: bool
    use_eagle: bool
    usage: float

    def take_new_block_ids(self) -> list[int]: ...
    _caps: list
    _reqs: dict

    def _blocks_to_allocate(self, st: Any, num_tokens: int, hits: Any, total_computed: int,
                            apply_cap: bool) -> int: ...
    def get_blocks(self, request_id: str) -> Any: ...
    def _capacity(self) -> int: ...
    def take_events(self) -> list[KVCacheEvent]: ...
    def _reset_index(self) -> bool: ...
    def evict_blocks(self, block_ids: Any) -> None: ...
    def _free_popped(self, blocks: Any) -> None: ...


class _SingleTypeView:
    """What the scheduler and connectors read of a single-type manager."""

    def __init__(self, mgr: _Manager, spec):
        self._mgr = mgr
        self.kv_cache_spec = spec
        self.block_size = spec.block_size
        self.kv_cache_group_id = 0

    def take_new_block_ids(self) -> list[int]:
        return self._mgr.take_new_block_ids()


class _CoordinatorView:
    """``KVCacheManager.coordinator`` surface the scheduler uses (``single_type_managers``, one
    view per group, ``get_num_blocks_to_allocate``: vLLM's arithmetic, ``_blocks_to_allocate``,
    ``block_pool``)."""

    def __init__(self, mgr: _Manager, specs):
        self._mgr = mgr
        views = []
        for i, spec in enumerate(specs):
            v = _SingleTypeView(mgr, spec)
            v.kv_cache_group_id = i
            # vLLM's per-request admission cap of a windowed group (None: uncapped).  Read at
            # every admission: vllm-ascend's Scheduler.__init__ patch (async SWA lifetime)
            # rewrites it on the coordinator's managers, and kvshare follows.
            v._max_admission_blocks_per_request = mgr._caps[i]
            views.append(v)
        self.single_type_managers = tuple(views)
        self.num_single_type_manager = len(views)
        self.block_pool = mgr.block_pool
        self.enable_caching = mgr.enable_caching
        self.use_eagle = mgr.use_eagle
        # vLLM 0.32: sub-block (partial hash) hits exist only for Mamba "align" groups.
        self.enable_partial_hash_hits = False

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks,
                                   num_encoder_tokens: int = 0, total_computed_tokens: int = 0,
                                   num_tokens_main_model: int | None = None,
                                   apply_admission_cap: bool = False,
                                   num_local_computed_tokens: int = 0,
                                   prefill_end: int = 0) -> int:
        """vLLM's count (0.23's parameters; 0.32 adds ``num_local_computed_tokens``, read for
        sub-block hits, and ``prefill_end``, read by sparse Mamba checkpoints: neither exists
        here)."""
        return self._mgr._blocks_to_allocate(self._mgr._reqs.get(request_id), num_tokens,
                                             new_computed_blocks, total_computed_tokens,
                                             apply_admission_cap)

    def get_blocks(self, request_id: str):
        return self._mgr.get_blocks(request_id).blocks

    def new_step_starts(self) -> None:
        pass


class _BlockPoolView:
    """``KVCacheManager.block_pool`` surface: the null block, per-id block objects, free counts.

    The blocks are plain ``KVCacheBlock`` records (id and ``is_null``) used as handles in
    ``KVCacheBlocks``; refcounts, hashes and the free list live in kvshare, not in them.
    """

    def __init__(self, mgr: _Manager, num_blocks: int):
        self._mgr = mgr
        self.num_gpu_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.enable_caching = mgr.enable_caching
        self.enable_kv_cache_events = mgr.enable_kv_cache_events
        self.hash_block_size = mgr.block_size

    def get_num_free_blocks(self) -> int:
        return self._mgr._capacity()

    def get_usage(self) -> float:
        return self._mgr.usage

    def take_events(self) -> list[KVCacheEvent]:
        return self._mgr.take_events()

    def reset_prefix_cache(self) -> bool:
        return self._mgr._reset_index()

    def evict_blocks(self, block_ids) -> None:
        self._mgr.evict_blocks(block_ids)

    def free_blocks(self, ordered_blocks) -> None:
        """vLLM 0.32's scheduler returns a deferred-freed request's blocks here (those
        ``pop_blocks_for_free`` handed out, reversed)."""
        self._mgr._free_popped(ordered_blocks)
