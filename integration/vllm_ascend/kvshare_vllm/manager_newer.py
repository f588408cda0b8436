"""The calls only vLLM 0.32's scheduler makes on ``KvshareKVCacheManager`` (a mixin of it):
lookups cut to computed tokens, the cached-token estimate, KV zeroing after a failed load, the
block copies of sub-page hits, the offload hand-offs kvshare has none of, and the deferred
free (``pop_blocks_for_free``, then ``block_pool.free_blocks``).  The state they read
(``_reqs``, ``_pages``, ``_popped``, ...) is the manager's (``manager.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import kvshare
from kvshare import ffi, lib

from .base import _cdiv

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks


class NewerSurface:
    """vLLM 0.32's additions to the manager's surface; mixed into ``KvshareKVCacheManager``."""

    def get_block_ids_for_computed_tokens(self, request_id: str,
                                          num_computed_tokens: int) -> tuple[list[int], ...]:
        """The request's block ids covering its first ``num_computed_tokens`` tokens."""
        st = self._reqs.get(request_id)
        if st is None:
            return ([],)
        return (st.pages[:_cdiv(num_computed_tokens, self.block_size)],)

    def estimate_cached_tokens(self, request) -> int:
        """Tokens of the request's pages that are in the prefix cache (vLLM: the most tokens
        a block's hash covers, over the request's blocks): its leading full pages of known
        tokens, registered as they filled (a page whose registration waits in ``_dirty`` is
        counted: nothing can tell it apart).  0 with prefix caching off (no page
        registers)."""
        st = self._reqs.get(request.request_id)
        if st is None or not self.enable_caching:
            return 0
        known = st.n
        if self._dirty:
            d = self._dirty.get(request.request_id)
            if d is not None:
                known = max(known, d[2])
        return min(known // self.block_size, len(st.pages)) * self.block_size

    def truncate_computed_blocks(self, blocks: KVCacheBlocks,
                                 num_computed_tokens: int) -> KVCacheBlocks:
        """A lookup result cut to its first ``num_computed_tokens`` tokens (block-aligned);
        no reference changes (a hit holds none until ``allocate_slots``)."""
        bs = self.block_size
        if num_computed_tokens % bs:
            raise ValueError(f"kvshare_vllm: truncate_computed_blocks at {num_computed_tokens} "
                             f"tokens, not a multiple of the block size {bs}")
        group = blocks.blocks[0]
        n = num_computed_tokens // bs
        if n > len(group):
            raise ValueError(f"kvshare_vllm: truncate_computed_blocks to {n} blocks of a hit "
                             f"of {len(group)}")
        return self.create_kv_cache_blocks((list(group[:n]),))

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Hands the request's blocks from ``start_token`` (block-aligned) out again for KV
        zeroing (``take_new_block_ids``): blocks a failed asynchronous KV load left unwritten,
        in every group whose new blocks vLLM zeroes (null blocks of a window included, as
        vLLM's).  Only where the cache needs zeroing (``KVCacheConfig.needs_kv_cache_zeroing``).
        Shared by both managers (``_vllm_tables``: a request's block table per group)."""
        if not self._zero_new:
            return
        if start_token % self.block_size:
            raise ValueError(f"kvshare_vllm: record_blocks_for_zeroing at {start_token} "
                             f"tokens, not a multiple of the block size {self.block_size}")
        st = self._reqs.get(request_id)
        if st is not None:
            for g, t in enumerate(self._vllm_tables(st)):
                self._zero(g, t[start_token // self.block_size:])

    def take_kv_cache_block_copies(self) -> tuple[list, list]:
        """The block copies of this step's sub-page hits (``KVSHARE_VLLM_MATCH_UNIT``), which
        the worker runs before the step's forward pass, and the blocks retained for them:
        none, as kvshare holds each source until this hand-off and every later use of it
        (a new owner's KV writes, a later copy) comes in a later step, after these copies; a
        scheduler that defers block frees, whose loads may overlap a step in flight, gets no
        sub-page hits (``plugin.deferred_copies_reason``).
        vLLM copies whole blocks, in every layer; the slots past the hit's units are the
        request's to write before anything reads them.  On a model of several groups each
        copy lands in one group's page, whose slots no other group's layers read (the groups
        manager takes this method too)."""
        queue = self._copy_queue
        if queue is None:
            return [], []
        raw = queue.take()
        if not raw:
            return [], []
        from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

        copies = []
        for c in ffi.from_buffer("kvs_copy[]", raw):
            if c.kind != lib.KVS_COPY_KIND_DEVICE_TO_DEVICE:
                raise RuntimeError(f"kvshare_vllm: a copy of kind {c.kind} in group {c.group} "
                                   "has no vLLM block copy")
            copies.append(KVCacheBlockCopy(c.src_page, c.dst_page))
        return copies, []

    def take_boundary_state_offloads(self) -> dict:
        """Mamba "align" boundary states for a KV connector: none (no Mamba group)."""
        return {}

    def finalize_partial_tail_offloads(self, request) -> list:
        """A producer connector's partial Mamba tails at a request's end: none (no Mamba
        group)."""
        return []

    def pop_blocks_for_free(self, request) -> list:
        """Ends the request's bookkeeping and returns its blocks without releasing them (vLLM
        0.32's deferred free, while an in-flight step may still write them): its kvshare
        sequence stays open, holding its pages, until the scheduler returns exactly these
        blocks, last first (``reversed``: the order in which ``kvs_seq_free`` releases a
        sequence's pages), through ``block_pool.free_blocks`` (``ManagerBase._pop_for_free``,
        ``_free_popped``)."""
        return self._pop_for_free(request)

    @staticmethod
    def _popped_ids(st) -> list:
        return st.pages

    def _end_popped(self, st) -> None:
        """Frees a popped sequence (one group: ``kvs_seq_free``'s order is the pool's)."""
        self._avail = None
        rc = lib.kvs_seq_free(self._h, st.seq)
        if rc:
            kvshare.check(rc, "kvs_seq_free")
        if self.enable_kv_cache_events:
            self._drain_events(None, None)
