"""vLLM 0.32 for kvshare's manager: which configurations of KV-cache groups it takes there
(``newer_groups_reason``), and the calls only 0.32's scheduler makes (``NewerSurface``, a
mixin of ``manager.KvshareKVCacheManager``): the lookup's
shared-prefix boundary, lookups cut to computed tokens, the cached-token estimate, the
deferred free (``pop_blocks_for_free``, then ``block_pool.free_blocks``) and the hand-offs of
features it refuses.  The state they read (``_reqs``, ``_refs``, ``cache``, ...) is the
manager's."""

from __future__ import annotations

import kvshare
from kvshare import ffi, lib

from . import _fast
from .base import _cdiv, lookahead_reason
from .state_groups import is_state_spec


def newer_groups_reason(kv_cache_config, num_prefill_lookahead: int = 0) -> str | None:
    """Why kvshare's manager cannot keep lockstep with vLLM 0.32's coordinator on this
    configuration (None when it can).  Sparse retention of sliding-window pages
    (``prefix_cache_retention_interval``) runs in the core (``window_retention``); an
    interval ``window_retention`` cannot carry is refused.  Mamba / linear-attention state
    groups run in ``mamba_cache_mode`` "none"; the modes that cache states ("align" sub-block
    hits, boundary-state hand-offs, sparse checkpoints), bounded prefix replay, extra retained
    window tokens (multi-module MTP), group roles (HiSparse) and multi-module MTP prefill
    lookahead are refused."""
    groups = kv_cache_config.kv_cache_groups
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        if is_state_spec(spec) and spec.mamba_cache_mode != "none":
            return (f"KV-cache group {i}: Mamba / linear-attention state with "
                    f"mamba_cache_mode={spec.mamba_cache_mode!r} on vLLM 0.32 (its 'align' "
                    "sub-block hits, boundary-state hand-offs and sparse checkpoints are not "
                    "implemented; vLLM 0.23.0 has them; 'none' runs)")
        role = getattr(g, "role", None)
        if role is not None and getattr(role, "value", role) != "default":
            return f"KV-cache group {i} with role {getattr(role, 'value', role)!r}"
        if not getattr(spec, "prefix_cacheable", True):
            return f"KV-cache group {i}: {type(spec).__name__} is not prefix-cacheable"
        if getattr(spec, "prefix_replay_tokens", 0):
            return (f"KV-cache group {i}: bounded prefix replay of {spec.prefix_replay_tokens} "
                    "tokens")
        if getattr(spec, "extra_retained_tokens", 0):
            return (f"KV-cache group {i}: {spec.extra_retained_tokens} extra retained window "
                    "tokens (multi-module MTP)")
    bs = groups[0].kv_cache_spec.block_size
    if window_retention(kv_cache_config, bs) is None:
        return (f"prefix_cache_retention_interval="
                f"{kv_cache_config.prefix_cache_retention_interval}: kvshare's window "
                f"retention takes a multiple of the block size {bs} up to "
                f"{kvshare.MACROS['KVS_MAX_SEGMENT_PAGES']} blocks")
    return lookahead_reason(num_prefill_lookahead)


def window_retention(kv_cache_config, block_size: int) -> int | None:
    """``kvs_config.window_retention`` for vLLM 0.32's ``prefix_cache_retention_interval``
    (which only sliding-window groups act on here): None dense, 0 the tails before each
    request's retention boundaries only, a positive interval also a tail per segment of that
    many tokens (in pages); None for an interval it cannot carry (not whole blocks, or more
    than ``KVS_MAX_SEGMENT_PAGES`` blocks)."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if interval is None or not any(isinstance(g.kv_cache_spec, SlidingWindowSpec)
                                   for g in kv_cache_config.kv_cache_groups):
        return kvshare.MACROS["KVS_WINDOW_RETENTION_DENSE"]
    if interval == 0:
        return kvshare.MACROS["KVS_WINDOW_RETENTION_BOUNDARIES"]
    if interval % block_size or interval // block_size > kvshare.MACROS["KVS_MAX_SEGMENT_PAGES"]:
        return None
    return interval // block_size


class NewerSurface:
    """vLLM 0.32's additions to the manager's surface."""

    def _newer_setup(self) -> None:
        """What the shared-prefix boundary's lookup reuses at every admission: the C function,
        the token buffer type and the out-buffers (cffi resolves a function and parses a type at
        their first use, which costs milliseconds: paid here, at start); likewise the page-info
        struct of ``estimate_cached_tokens`` and the call and buffer of ``_retain``."""
        self._full_match = (lib.kvs_prefix_match, ffi.typeof("int32_t[]"),
                            ffi.new("uint32_t[]", self.num_blocks), ffi.new("size_t *"),
                            ffi.new("size_t *"))
        self._page_info = (lib.kvs_page_get_info, ffi.new("kvs_page_info *"))  # estimates
        self._retention_call = (lib.kvs_seq_set_retention, ffi.new("size_t[]", 2))  # _retain

    def _retain(self, st, request) -> None:
        """vLLM 0.32's reachable boundaries of a request beginning its sequence, under sparse
        window retention: the prompt's last token (a resend of the prompt is capped there)
        and the lookup's shared-prefix junction when it found one."""
        fn, buf = self._retention_call
        buf[0] = request.num_prompt_tokens - 1
        buf[1] = junction = request.shared_prefix_boundary
        rc = fn(self.cache.handle, st.seq, buf, 2 if junction else 1)
        if rc:
            kvshare.check(rc, "kvs_seq_set_retention")

    def _shared_prefix_boundary(self, request, ids, extra, hit: int) -> int:
        """vLLM 0.32's ``shared_prefix_boundary`` of a lookup that found ``hit`` tokens: where
        the longest single-group hit ends when a lagging group shortened the reconciled hit
        (0 otherwise).  The coordinator looks up a full-attention group first, so that
        longest hit is the first full group's alone; one group (vLLM's unitary coordinator)
        never lags."""
        full = self._first_full
        if full is None or self.num_kv_cache_groups == 1:
            return 0
        limit = max(len(ids) - 1, 0)
        if hit + self.block_size > limit:
            return 0  # the full group cannot reach a whole page further
        match, i32, pages, npages, longest = self._full_match
        rc = match(self.cache.handle, full, ffi.from_buffer(i32, _fast.pack_i32(ids)), len(ids),
                   extra.ptr if extra is not None else ffi.NULL, limit, False, pages,
                   self.num_blocks, npages, longest)
        if rc:
            kvshare.check(rc, "kvs_prefix_match")
        return longest[0] if longest[0] > hit else 0

    def get_block_ids_for_computed_tokens(self, request_id: str,
                                          num_computed_tokens: int) -> tuple[list[int], ...]:
        """Each group's block ids covering the first ``num_computed_tokens`` tokens."""
        st = self._reqs.get(request_id)
        if st is None:
            return tuple([] for _ in range(self.num_kv_cache_groups))
        n = _cdiv(num_computed_tokens, self.block_size)
        return tuple(list(t[:n]) for t in self._vllm_tables(st))

    def estimate_cached_tokens(self, request) -> int:
        """Tokens of the request's blocks found in the prefix cache (vLLM: per group the most
        tokens a held block's hash covers, the least over the groups): per group, the end of
        its last held page among the full pages of known tokens (registered when it filled;
        under sparse window retention, the last registered one).  0 with prefix caching
        off."""
        st = self._reqs.get(request.request_id)
        if st is None or not self.enable_caching:
            return 0
        known = st.n
        if self._dirty:
            d = self._dirty.get(request.request_id)
            if d is not None:
                if self._sparse:  # the core says which window pages register
                    self._settle_dirty(request.request_id)
                else:  # a page whose registration waits is counted: it registers unchanged
                    known = max(known, d[2])
        k = known // self.block_size
        out = None
        (get_info, info), h = self._page_info, self.cache.handle
        for g, t in enumerate(st.tables):
            i = min(k, len(t))
            # Under sparse retention a window group registers only some of its full pages.
            sparse = self._sparse and g in self._sliding
            while i and (not t[i - 1] or sparse and (
                    get_info(h, 0, g, t[i - 1], info) or not info.registered)):
                i -= 1
            out = i if out is None else min(out, i)
        return (out or 0) * self.block_size

    def truncate_computed_blocks(self, blocks, num_computed_tokens: int):
        """A lookup result cut to its first ``num_computed_tokens`` tokens (block-aligned) in
        every group; no reference changes (a hit holds none until ``allocate_slots``)."""
        bs = self.block_size
        if num_computed_tokens % bs:
            raise ValueError(f"kvshare_vllm: truncate_computed_blocks at {num_computed_tokens} "
                             f"tokens, not a multiple of the block size {bs}")
        n = num_computed_tokens // bs
        if any(n > len(g) for g in blocks.blocks):
            raise ValueError(f"kvshare_vllm: truncate_computed_blocks to {n} blocks of a hit "
                             f"of {[len(g) for g in blocks.blocks]}")
        return self.create_kv_cache_blocks(tuple(list(g[:n]) for g in blocks.blocks))

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Hands the request's blocks from ``start_token`` (block-aligned) out again for KV
        zeroing (``take_new_block_ids``): blocks a failed asynchronous KV load left unwritten,
        in every group whose new blocks vLLM zeroes (null blocks of a window included, as
        vLLM's).  Only where the cache needs zeroing (``KVCacheConfig.needs_kv_cache_zeroing``).
        (``_vllm_tables``: a request's block table per group)."""
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
        copy lands in one group's page, whose slots no other group's layers read."""
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
        """Mamba "align" boundary states: none (state groups run in mode "none" only here)."""
        return {}

    def finalize_partial_tail_offloads(self, request) -> list:
        """Partial Mamba tails at a request's end: none (state groups: mode "none" only)."""
        return []

    def get_computed_blocks_for_connector(self, request):
        """The lookup for a scheduler with a KV connector: without a Mamba group vLLM answers
        with ``get_computed_blocks`` and ``hit_diverged`` False."""
        return (*self.get_computed_blocks(request), False)

    def pop_blocks_for_free(self, request) -> list:
        """Ends the request's bookkeeping and returns its blocks, every group's table in group
        order (null blocks included, as vLLM's), without releasing them: its kvshare sequence
        keeps its pages until the scheduler returns exactly these blocks through
        ``block_pool.free_blocks`` (``ManagerBase._pop_for_free``, ``_free_popped``), after a
        step in flight may have written them.  vLLM's scheduler does this only with a
        consuming KV connector and several batches in flight."""
        return self._pop_for_free(request)

    def _popped_ids(self, st) -> list:
        return [p for t in self._vllm_tables(st) for p in t]

    def _end_popped(self, st) -> None:
        """Frees a popped sequence as vLLM's pool takes its list back: one list, the last
        group's tail first, each page placed as the pool places it."""
        self._release_seq(st, deferred=True)
