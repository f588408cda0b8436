"""``KvshareKVCacheManager``: vLLM's ``KVCacheManager`` public surface backed by one kvshare cache.

Each request is one kvshare sequence (u64 id from a counter).  An admitted request takes
``kvs_seq_begin`` plus one ``kvs_seq_append_pages`` (lookahead slots and the page ids); a
running one takes one ``kvs_seq_append_pages`` only when it needs new slots (most decode steps
make no native call, see ``allocate_slots``); ``kvs_seq_free`` ends it.  Nothing is called per
block.  Semantics follow vLLM's built-in manager (docs/vllm.md, "How each method maps"):
block 0 is the null block, hits are computed blocks capped at ``num_tokens - 1``, full blocks
of known tokens are registered before anything could look them up, freed blocks are cached
last-block-first, allocation never evicts before free blocks run out.

This file owns the manager's state, ``_Req`` and vLLM's methods; 0.32's additions are in
``manager_newer.py``, the views (``coordinator``, ``block_pool``) in ``views.py``, the native
calls (``_match``, ``_open``, ``_cross``, ``_append``) ``_fast.Appender``'s.
"""

from __future__ import annotations

from typing import Any

import kvshare
from kvshare import ffi, lib

from .startup import require as _require_supported_vllm_and_native

_require_supported_vllm_and_native()  # before vLLM's imports: an unsupported vLLM is named

from .compat import manager_api, support

_API = manager_api()  # the vLLM release whose KVCacheManager signatures this module presents

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.request import RequestStatus

from . import _fast  # required: startup.require() has checked that it loads
from .base import (ManagerBase, _cdiv, _common_prefix, _extra_addr, _token_ids,
                   check_page_bytes, copies_need_connector, extra_keys_for, lookahead_reason,
                   match_unit_setting, page_geometry)
from .events import EventTranslator, cached_blocks_event
from .host_tier import HOST_PAGES, CopyQueue, HostTier
from .pool_tier import manager_pool
from .manager_newer import NewerSurface
from .views import _BlockPoolView, _CoordinatorView

_OK = 0
_NO_SPACE = kvshare.STATUS["KVS_STATUS_NO_SPACE"]
_STORED = ffi.typeof("enum kvs_event_kind").relements["KVS_EVENT_KIND_STORED"]
_REMOVED = ffi.typeof("enum kvs_event_kind").relements["KVS_EVENT_KIND_REMOVED"]
_CLEARED = ffi.typeof("enum kvs_event_kind").relements["KVS_EVENT_KIND_CLEARED"]
_DEVICE = ffi.typeof("enum kvs_tier").relements["KVS_TIER_DEVICE"]
_CACHED_STATE = ffi.typeof("enum kvs_page_state").relements["KVS_PAGE_STATE_CACHED"]
# Request states vLLM 0.32's admission watermark applies to (waiting, preempted).
_ADMITTED_FROM = frozenset((RequestStatus.WAITING, RequestStatus.PREEMPTED))


class _Req:
    """A request's kvshare sequence: id, block table (page ids), tokens appended so far (``n``)
    and ``quiet``: the largest token count the request can reach with no native call - its
    pages hold the slots and no page fills up with known tokens (which would register it).
    Tokens of a partly filled last page are handed to kvshare when the page fills (or when
    more pages are needed): until then nothing observable depends on them."""

    __slots__ = ("seq", "pages", "raw", "n", "extra", "quiet")

    def __init__(self, seq: int, extra):
        self.seq = seq
        self.pages: list[int] = []
        self.raw = b""  # the page ids as uint32 bytes (get_num_common_prefix_blocks)
        self.n = 0
        self.extra = extra
        self.quiet = -1

    def add_pages(self, new: list[int], raw: bytes) -> None:
        """Appends page ids, given both as ints and as their uint32 bytes."""
        self.pages.extend(new)
        self.raw += raw

    def settle(self, bs: int) -> None:
        """Recomputes ``quiet`` after ``n`` or ``pages`` changed."""
        fill = (self.n // bs + 1) * bs  # the token count that fills the current page
        self.quiet = min(len(self.pages) * bs, fill - 1)


def unsupported_reason(kv_cache_config, scheduler_block_size: int, hash_block_size: int,
                       dcp_world_size: int = 1, pcp_world_size: int = 1,
                       num_prefill_lookahead: int = 0) -> str | None:
    """Why kvshare cannot manage this configuration (None when it can).

    kvshare manages one group of full-attention layers (vLLM's UnitaryKVCacheCoordinator case):
    no sliding window, chunked-local, Mamba or cross-attention groups, no context parallelism,
    hash granularity equal to the block size, no multi-module MTP prefill lookahead (vLLM 0.32
    then keeps the last ``num_prefill_lookahead - 1`` computed tokens out of the prefix cache,
    as re-prefillable; kvshare registers every full page of computed tokens).
    """
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        return f"{len(groups)} KV-cache groups (kvshare manages exactly one)"
    spec = groups[0].kv_cache_spec
    if type(spec).__name__ not in ("FullAttentionSpec", "MLAAttentionSpec", "TQFullAttentionSpec") \
            or not isinstance(spec, FullAttentionSpec):
        return f"KV-cache spec {type(spec).__name__} (kvshare manages full attention only)"
    if getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None):
        return "sliding-window / chunked-local attention"
    if dcp_world_size != 1 or pcp_world_size != 1:
        return f"context parallelism (dcp={dcp_world_size}, pcp={pcp_world_size})"
    if hash_block_size != spec.block_size or scheduler_block_size != spec.block_size:
        return (f"block sizes differ (kv {spec.block_size}, scheduler {scheduler_block_size}, "
                f"hash {hash_block_size})")
    if not 1 <= spec.block_size <= kvshare.MAX_PAGE_SIZE:
        return f"block size {spec.block_size} outside kvshare's 1..{kvshare.MAX_PAGE_SIZE}"
    return lookahead_reason(num_prefill_lookahead)


class KvshareKVCacheManager(NewerSurface, ManagerBase):
    """Drop-in for ``vllm.v1.core.kv_cache_manager.KVCacheManager`` with the running vLLM's
    signatures (``compat.manager_api()``: 0.23.0 or 0.32.0)."""

    def _setup(self, kv_cache_config, max_model_len: int, scheduler_block_size: int,
               hash_block_size: int, enable_caching: bool, use_eagle: bool, log_stats: bool,
               enable_kv_cache_events: bool, dcp_world_size: int, pcp_world_size: int,
               metrics_collector, in_flight: dict, num_prefill_lookahead: int = 0,
               watermark: float = 0.0) -> None:
        """The constructor (``ManagerBase.__init__``, the running vLLM's signature);
        ``in_flight`` sizes windowed groups' admission caps in vLLM: none here."""
        why = unsupported_reason(kv_cache_config, scheduler_block_size, hash_block_size,
                                 dcp_world_size, pcp_world_size, num_prefill_lookahead)
        if why:
            raise ValueError(f"kvshare_vllm: unsupported configuration: {why}")
        group = kv_cache_config.kv_cache_groups[0]
        # vLLM 0.32 also drops the last hit block of a group the model marks as EAGLE's.
        use_eagle = use_eagle or bool(getattr(group, "is_eagle_group", False))
        self._init_base(kv_cache_config, max_model_len, enable_caching, use_eagle, log_stats,
                        enable_kv_cache_events, metrics_collector, watermark)
        spec = group.kv_cache_spec
        self.block_size = bs = spec.block_size
        self.num_kv_cache_groups = 1
        connector = HOST_PAGES.get()  # None without kvshare's KV connector (host_tier.py)
        num_host_pages = connector or 0
        self._unit = unit = match_unit_setting(bs)
        if unit and not support().block_copies and connector is None:
            raise copies_need_connector(unit, f"on vLLM {_API}")
        # The pool tier's key settings, when kvshare's connector has a pool (pool_tier.py).
        pool = manager_pool(unit, 1)
        cfg = kvshare.config_default(
            page_size=bs,
            num_device_pages=self.num_blocks,
            num_host_pages=num_host_pages,
            **page_geometry(group),
            enable_prefix_caching=enable_caching,
            reserve_null_page=True,
            defer_commit=False,
            skip_cached_writes=False,
            demote_to_host=num_host_pages > 0,
            enable_events=enable_kv_cache_events,
            # Sub-page hits: their partial copies reach the worker through kvshare's KV
            # connector (0.23) or vLLM's block copies (0.32, take_kv_cache_block_copies).
            match_unit=unit,
        )
        self.cache = kvshare.Cache(cfg, pool=pool["cache"] if pool else None)
        self._h = self.cache.handle
        check_page_bytes(self.cache, group)
        # Copies run by kvshare's KV connector (host_tier.py), or vLLM's block copies (0.32).
        self.host_tier = HostTier(self, num_host_pages) if connector is not None else None
        self._copy_queue = CopyQueue(self._h) if unit and connector is None else None
        self._found_out = ffi.new("size_t *")

        self.block_pool = _BlockPoolView(self, self.num_blocks)
        self._blocks = self.block_pool.blocks
        self.coordinator = _CoordinatorView(self, spec)
        self.empty_kv_cache_blocks = KVCacheBlocks((() ,))
        from vllm.v1.kv_cache_interface import (get_kv_cache_spec_kind,
                                                get_kv_cache_spec_sliding_window)
        self._translator = EventTranslator(
            bs, _STORED, _REMOVED, _CLEARED, _DEVICE,
            (get_kv_cache_spec_kind(spec).value, get_kv_cache_spec_sliding_window(spec)))

        # (request id, packed tokens, extra keys) of the last get_computed_blocks
        self._pending: tuple[str, bytes, Any] | None = None
        # Preallocated out-buffers: a block table can hold max_model_len tokens plus lookahead.
        self._max_pages = self.num_blocks
        # One size_t out-cell per meaning.
        self._available_out = ffi.new("size_t *")  # kvs_cache_available
        self._num_events_out = ffi.new("size_t *")  # kvs_cache_take_events
        self._info = ffi.new("kvs_seq_info *")
        self._ev_buf = ffi.new("kvs_event[]", 256)
        # The block-table prefix every request shares (packed page ids), None when it must be
        # recomputed; kept across steps (see get_num_common_prefix_blocks).
        self._common: bytes | None = None
        # The native hand-over and packing (_fast.c).
        self._pack = _fast.pack_i32
        appender = _fast.Appender(
            int(ffi.cast("uintptr_t", self._h)),
            int(ffi.cast("uintptr_t", ffi.addressof(lib, "kvs_seq_append_pages"))),
            bs, self._max_pages, self._blocks,
            int(ffi.cast("uintptr_t", ffi.addressof(lib, "kvs_seq_begin"))),
            int(ffi.cast("uintptr_t", ffi.addressof(lib, "kvs_prefix_match"))))
        self._append, self._cross, self._open, self._match = \
            appender.append, appender.cross, appender.begin, appender.match

    # ------------------------------------------------------------------ helpers
    def _capacity(self) -> int:
        """Free plus evictable device pages (vLLM's free blocks).  Kept between calls: a
        page-adding append takes exactly one page each from it (a fresh page comes off the
        free list or out of the cache); a sequence begin or free, an index clear change it by
        counts only kvshare knows, so they drop it (``None``) and the next read asks
        ``kvs_cache_available``."""
        a = self._avail
        if a is None:
            rc = lib.kvs_cache_available(self._h, _DEVICE, 0, self._available_out)
            if rc:
                kvshare.check(rc, "kvs_cache_available")
            a = self._avail = self._available_out[0]
        return a

    _extra_for = staticmethod(extra_keys_for)

    def _tokens(self, request, n: int):
        """The first ``n`` token ids packed (a view of what ``get_computed_blocks`` packed
        when it was this request's)."""
        pend = self._pending
        if pend is not None and pend[0] == request.request_id and len(pend[1]) >= 4 * n:
            return memoryview(pend[1])[:4 * n]
        return self._pack(_token_ids(request)[:n])

    def _drain_events(self, st: _Req | None, request) -> None:
        """Converts queued kvshare events into vLLM's (``events.EventTranslator``: vLLM's block
        hashes from ``request``, whose call stored them)."""
        raw = []
        while True:
            rc = lib.kvs_cache_take_events(self._h, self._ev_buf, 256, self._num_events_out)
            if rc:
                kvshare.check(rc, "kvs_cache_take_events")
            n = self._num_events_out[0]
            raw.extend((e.kind, e.tier, e.page) for e in self._ev_buf[0:n])
            if n < 256:
                break
        if raw:
            self._events.extend(self._translator.convert(
                raw, st.pages if st is not None else None, request))

    def _num_evictable(self, pages) -> int:
        """Hit pages with refcount 0 (cached): touching them takes evictable capacity.
        One ``kvs_page_get_info`` per page: used only when an admission gate is too close
        to call without it (the ABI has no evictable-hit count)."""
        info = ffi.new("kvs_page_info *")
        n = 0
        for p in pages:
            kvshare.check(lib.kvs_page_get_info(self._h, _DEVICE, 0, p, info), "kvs_page_get_info")
            n += info.state == _CACHED_STATE
        return n

    def _blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks) -> int:
        st = self._reqs.get(request_id)
        need = _cdiv(num_tokens, self.block_size)
        if st is not None:
            return max(need - len(st.pages), 0)
        group = new_computed_blocks[0] if new_computed_blocks else ()
        hits = [b.block_id for b in group]
        return max(need - len(hits), 0) + (self._num_evictable(hits) if hits else 0)

    def _gate(self, st: _Req | None, hits: list[int], need_slot: int, full_tokens: int | None,
              reserved: int, watermark: int = 0) -> bool:
        """vLLM's admission checks that kvshare's own NO_SPACE does not cover
        (``full_sequence_must_fit``, ``reserved_blocks``, lookahead of a new request, and
        vLLM 0.32's ``watermark`` blocks, kept free under both the step's and the full
        sequence's need)."""
        have = len(st.pages) if st is not None else len(hits)
        free = self._capacity() - watermark
        now = max(_cdiv(need_slot, self.block_size) - have, 0)
        full = max(_cdiv(full_tokens, self.block_size) - have, 0) if full_tokens is not None else 0
        if st is not None or not hits:
            return now <= free - reserved and full <= free
        h = len(hits)
        if now + h <= free - reserved and full + h <= free:
            return True
        if now > free - reserved or full > free:
            return False
        e = self._num_evictable(hits)
        return now + e <= free - reserved and full + e <= free

    # ------------------------------------------------------------------ public surface
    def _lookup(self, request) -> tuple[KVCacheBlocks, int]:
        """The hit blocks and hit tokens of ``request`` (whole pages, then with a match unit
        the whole units of a cached page the hit goes on into; at most ``num_tokens - 1``
        tokens; EAGLE drops the last page and any units), remembered for its
        ``allocate_slots``."""
        if self._dirty:
            self._flush()
        ids = _token_ids(request)
        st_extra = self._extra_for(request)
        if self.host_tier is not None:
            self.host_tier.promote(ids, st_extra)
        limit = max(len(ids) - 1, 0)
        rc, toks, hits = self._match(ids, _extra_addr(st_extra), limit)
        if rc:
            kvshare.check(rc, "kvs_prefix_match")
        if self.use_eagle and hits:
            hits.pop()  # EAGLE recomputes the last matched block for its hidden states
        self._pending = (request.request_id, toks, st_extra)
        hit = len(hits) * self.block_size
        if self._unit and not self.use_eagle and hit + self._unit <= limit:
            hit = self._unit_hit(toks, st_extra, limit, len(hits))
        if not hit:
            return self.empty_kv_cache_blocks, 0
        return KVCacheBlocks((hits,)), hit

    def _unit_hit(self, toks: bytes, extra, limit: int, pages: int) -> int:
        """The hit of ``pages`` whole pages plus the units ``kvs_seq_begin`` will copy from a
        cached page (``kvs_prefix_find``, which walks the same device pages)."""
        rc = lib.kvs_prefix_find(self._h, ffi.from_buffer("int32_t[]", toks), len(toks) // 4,
                                 extra.ptr if extra is not None else ffi.NULL, limit, ffi.NULL,
                                 0, 0, self._found_out)
        if rc:
            kvshare.check(rc, "kvs_prefix_find")
        found = self._found_out[0]
        assert found // self.block_size == pages, (pages, found)  # the same device walk
        return found

    if _API == "0.23.0":
        def get_computed_blocks(self, request) -> tuple[KVCacheBlocks, int]:
            """The request's hit (blocks, tokens); records the lookup in the prefix-cache
            stats."""
            if not self.prefix_cache_lookup_enabled(request):
                return self.empty_kv_cache_blocks, 0
            blocks, hit = self._lookup(request)
            self.record_prefix_cache_stats(request, hit)
            return blocks, hit

        def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
            return self._common_prefix_blocks(running_request_id)

        def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
            """Full attention skips nothing."""
    else:
        def get_computed_blocks(self, request) -> tuple[KVCacheBlocks, int, int]:
            """The request's hit (blocks, tokens, ``shared_prefix_boundary``: 0, the value of
            one group, which no other group lags).  The scheduler records the lookup at
            admission (``record_prefix_cache_stats``).  A request asking for
            ``kv_cache_report_mode == "full"`` with KV events on gets a ``BlockStored`` for the
            hit blocks, as vLLM's ``BlockPool.emit_cached_block_events`` publishes it."""
            if not self.prefix_cache_lookup_enabled(request):
                return self.empty_kv_cache_blocks, 0, 0
            blocks, hit = self._lookup(request)
            if hit and self.enable_kv_cache_events \
                    and getattr(request, "kv_cache_report_mode", "incremental") == "full":
                self._drain_events(None, None)  # what earlier calls queued comes first
                cached_blocks_event(self._events, request, hit // self.block_size,
                                    self.block_size, self._translator.meta)
            return blocks, hit, 0

        def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
            """vLLM 0.32 removed cascade attention: always 0, as its manager answers."""
            return [0]

        def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                                  num_prompt_tokens: int | None = None) -> None:
            """Full attention skips nothing."""

    def get_computed_blocks_for_connector(self, request):
        """vLLM 0.32's lookup for a scheduler with a KV connector: one group never diverges,
        so ``get_computed_blocks`` plus ``hit_diverged`` False."""
        return (*self.get_computed_blocks(request), False)

    def allocate_slots(
        self,
        request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """vLLM's ``allocate_slots`` (0.23's parameters; 0.32 adds ``has_scheduled_reqs``, which
        applies the watermark to a waiting or preempted request, and ``skip_zeroing_group_ids``:
        with group 0 in it, an asynchronous load's blocks are not handed out for KV zeroing,
        which would race the load)."""
        st = self._reqs.get(request.request_id)
        wm = self.watermark_blocks
        if wm and not (has_scheduled_reqs and request.status in _ADMITTED_FROM):
            wm = 0
        if st is not None and num_new_tokens and not (
                num_new_computed_tokens or num_external_computed_tokens or delay_cache_blocks
                or num_encoder_tokens):
            # A running request's step (decode, or the next chunk of a prefill).
            end = request.num_computed_tokens + num_new_tokens
            if not (num_lookahead_tokens or full_sequence_must_fit or reserved_blocks or wm):
                if end <= st.quiet:
                    # Most decode steps: the slots exist and no page fills up, so there is
                    # nothing to tell kvshare yet (the tokens go with a later call).
                    return self.empty_kv_cache_blocks
                if end <= len(st.pages) * self.block_size and self._defer \
                        and end <= self.max_model_len:
                    # The last page fills up in slots that exist.  Registering it can wait
                    # until something could look it up or free it (_flush), or until this
                    # request's next native call, which then carries the tokens.
                    self._dirty[request.request_id] = (st, request, min(end, request.num_tokens))
                    return self.empty_kv_cache_blocks
            if not (full_sequence_must_fit or reserved_blocks or wm):
                # A page crossing (the common case of a native call while running): written
                # out here rather than through _extend, it runs once per page per request.
                rc, blocks = self._crossing(st, request, _token_ids(request), end,
                                            num_lookahead_tokens)
                if rc:
                    if rc == _NO_SPACE:
                        return None
                    kvshare.check(rc, "kvs_seq_append_pages")
                return self._handed(st, request, blocks)
            return self._extend(request, st, end, num_lookahead_tokens, full_sequence_must_fit,
                                reserved_blocks, watermark=wm)
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and (
                _API == "0.23.0" or num_new_computed_tokens == 0):
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        if num_encoder_tokens:
            raise NotImplementedError(
                "kvshare_vllm: encoder (cross-attention) blocks are not supported")
        if st is not None:  # not from vLLM 0.23's scheduler; handled as its manager would
            main = min(request.num_computed_tokens + num_new_computed_tokens
                       + num_external_computed_tokens, self.max_model_len) + num_new_tokens
            return self._extend(request, st, main, num_lookahead_tokens, full_sequence_must_fit,
                                reserved_blocks, delay_cache_blocks, wm)
        return self._begin(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                           num_lookahead_tokens, full_sequence_must_fit, reserved_blocks,
                           num_external_computed_tokens, delay_cache_blocks, wm,
                           0 in skip_zeroing_group_ids)

    def _begin(self, request, num_new_tokens: int, num_new_computed_tokens: int,
               new_computed_blocks, num_lookahead_tokens: int, full_sequence_must_fit: bool,
               reserved_blocks: int, num_external: int = 0,
               delay: bool = False, watermark: int = 0,
               skip_zeroing: bool = False) -> KVCacheBlocks | None:
        """``allocate_slots`` of a request that has no sequence yet: ``kvs_seq_begin``.

        External tokens (a KV connector loads their KV into the pages allocated here) are
        tokens like the rest: with ``delay`` (an asynchronous load, ``delay_cache_blocks``)
        only the local hits are handed to kvshare and every other slot is lookahead, so no
        page of the transfer is registered (findable) before ``cache_blocks`` after the load
        lands; without it they are handed over and their full pages registered at once, as
        vLLM's manager caches them in this call."""
        rid = request.request_id
        bs = self.block_size
        local = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(local + num_external, self.max_model_len)
        main = total_computed + num_new_tokens
        need_slot = min(main + num_lookahead_tokens, self.max_model_len)
        # Tokens handed to kvshare (their full pages register): drafts/placeholders are not
        # tokens yet, and a delayed transfer's are not computed yet.
        known = min(local if delay else main, request.num_tokens)
        if self._dirty:
            self._flush()  # kvs_seq_begin matches: pages that filled must be findable
        group = new_computed_blocks.blocks[0] if new_computed_blocks is not None else ()
        nh = len(group)
        units = num_new_computed_tokens - nh * bs  # a sub-page hit's copied tokens
        if units and not (self._unit and 0 < units < bs and units % self._unit == 0):
            raise ValueError("num_new_computed_tokens does not match new_computed_blocks")
        lookahead = max(need_slot - known, 0)
        # kvs_seq_begin's own NO_SPACE is vLLM's check for `known` tokens; the gate adds what
        # it cannot see: lookahead slots, reserved blocks, the watermark, and a full sequence
        # longer than this chunk (otherwise implied).
        full_longer = full_sequence_must_fit and _cdiv(
            min(request.num_tokens, self.max_model_len), bs) > _cdiv(need_slot, bs)
        if (full_longer or reserved_blocks or lookahead or watermark) and not self._gate(
                None, [b.block_id for b in group], need_slot,
                min(request.num_tokens, self.max_model_len) if full_sequence_must_fit else None,
                reserved_blocks, watermark):
            return None
        toks = self._tokens(request, known)
        extra = self._pending[2] if self._pending is not None and \
            self._pending[0] == rid else self._extra_for(request)
        st = _Req(next(self._seq_ids), extra)
        self._avail = None
        try:
            begin_rc, append_rc, matched, new = self._open(st, toks, _extra_addr(extra),
                                                           num_new_computed_tokens, lookahead, nh)
        except BaseException:
            # Raised after kvs_seq_begin succeeded (only MemoryError-like failures can): the
            # sequence exists in kvshare but not here, so it is ended rather than leaked.
            if lib.kvs_seq_get_info(self._h, st.seq, self._info) == _OK:
                lib.kvs_seq_free(self._h, st.seq)
            raise
        if begin_rc == _NO_SPACE:
            return None
        if begin_rc:
            kvshare.check(begin_rc, "kvs_seq_begin")
        self._pending = None
        self._reqs[rid] = st
        if matched != num_new_computed_tokens:
            lib.kvs_seq_free(self._h, st.seq)
            del self._reqs[rid]
            raise RuntimeError(
                f"kvshare_vllm: request {rid}: {num_new_computed_tokens} tokens were found "
                f"cached by get_computed_blocks but only {matched} at allocation (pages "
                "evicted in between)")
        if append_rc:  # the gate checked room for the lookahead; anything else is a bug
            kvshare.check(append_rc, "kvs_seq_append_pages")
        if self._common is not None:  # a new table can only shorten the shared prefix
            self._common = self._common[:4 * _common_prefix(self._common, st.raw, 4)]
        if not num_external:
            return self._handed(st, request, new)
        self._mark_hashed((st.pages,), st.n // bs, request)
        # vLLM returns the blocks past the external tokens' (those are in get_blocks and,
        # for KV zeroing, in take_new_block_ids, like every block added here, unless the
        # asynchronous load writes them after this step: skip_zeroing, vLLM 0.32).
        skip = max(_cdiv(local + num_external, bs) - nh, 0)
        return self._handed(st, request, new, skip, skip if skip_zeroing else 0)

    def _extend(self, request, st: _Req, main: int, num_lookahead_tokens: int,
                full_sequence_must_fit: bool, reserved_blocks: int,
                delay: bool = False, watermark: int = 0) -> KVCacheBlocks | None:
        """``allocate_slots`` of a running request needing kvshare: ``main`` tokens computed
        after this step, plus lookahead slots; vLLM's admission checks kvshare's own NO_SPACE
        does not cover (``_gate``), then one ``kvs_seq_append_pages`` (``_cross``).
        ``delay``: slots only, no token handed (nothing registers)."""
        ids = _token_ids(request)
        if delay:
            ids = ids[:st.n]
        if full_sequence_must_fit or reserved_blocks or watermark:
            bs = self.block_size
            need_slot = min(main + num_lookahead_tokens, self.max_model_len)
            full = min(len(ids), self.max_model_len)
            if (reserved_blocks or watermark or _cdiv(full, bs) > _cdiv(need_slot, bs)) \
                    and not self._gate(st, [], need_slot,
                                       full if full_sequence_must_fit else None,
                                       reserved_blocks, watermark):
                return None
        rc, blocks = self._crossing(st, request, ids, main, num_lookahead_tokens, not delay)
        if rc:
            if rc == _NO_SPACE:
                return None
            kvshare.check(rc, "kvs_seq_append_pages")
        return self._handed(st, request, blocks)

    def _crossing(self, st: _Req, request, ids, main: int, lookahead: int,
                  carries: bool = True) -> tuple[int, list]:
        """``_cross`` of a running request (``ids[st.n:main]`` handed over, slots up to
        ``main`` plus ``lookahead``).  A page of it that filled with no native call and waits
        to register goes with the call (``carries``: the ids reach past it), so its entry in
        ``_dirty`` is dropped, unless kvshare refuses the call (nothing changed: it still
        waits, and registers at the request's next call or free, as vLLM cached it)."""
        rid = request.request_id
        waiting = self._dirty.pop(rid, None) if carries and self._dirty else None
        rc, blocks = self._cross(st, ids, main, lookahead, self.max_model_len)
        if rc and waiting is not None:
            self._dirty[rid] = waiting
        return rc, blocks

    def _handed(self, st: _Req, request, blocks: list, skip: int = 0,
                unzeroed: int = 0) -> KVCacheBlocks:
        """What ``allocate_slots`` returns: the blocks added from ``skip`` on (and events,
        zeroing ids of all of them but the first ``unzeroed``)."""
        if self.enable_kv_cache_events:
            self._drain_events(st, request)
        if not blocks:
            return self.empty_kv_cache_blocks
        if self._avail is not None:
            self._avail -= len(blocks)
        if self._zero_new:
            self._zero(0, [b.block_id for b in blocks[unzeroed:]])
        if skip:
            blocks = blocks[skip:]
            if not blocks:
                return self.empty_kv_cache_blocks
        return KVCacheBlocks((blocks,))

    def free(self, request) -> None:
        st = self._reqs.pop(request.request_id, None)
        self._common = None
        if self._pending is not None and self._pending[0] == request.request_id:
            self._pending = None
        if st is None:
            return
        self._settle_known(st, request)
        self._avail = None
        rc = lib.kvs_seq_free(self._h, st.seq)
        if rc:
            kvshare.check(rc, "kvs_seq_free")
        if self.enable_kv_cache_events:
            self._drain_events(None, None)

    def _common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Leading blocks of the request held by every request with blocks (vLLM's
        ``ref_cnt == len(req_to_blocks)``); a shared page sits at the same index in each."""
        st = self._reqs.get(running_request_id)
        if st is None:
            return [0]
        if len(self._reqs) == 1:
            return [len(st.pages)]
        # The common prefix of all tables is that of the lexicographically smallest and largest
        # (their uint32 bytes by memcmp), then a binary search on pages.  Kept between calls: a
        # new table can only shorten it, a free lengthen it (recomputed); a growing table's new
        # pages are its own, past the shared prefix (every request computes its last token).
        common = self._common
        if common is None:
            raws = [o.raw for o in self._reqs.values()]
            lo, hi = min(raws), max(raws)
            common = self._common = lo[:4 * _common_prefix(lo, hi, 4)]
        return [len(common) // 4]

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        st = self._reqs.get(request_id)
        if st is None or not st.pages:
            return self.empty_kv_cache_blocks
        blocks = self._blocks
        return KVCacheBlocks((list(map(blocks.__getitem__, st.pages)),))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        st = self._reqs.get(request_id)
        return (list(st.pages) if st is not None else [],)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        if self._dirty:
            self._settle_dirty(request.request_id)
        target = min(num_computed_tokens, request.num_tokens)
        if target <= st.n:
            return
        self._append_known(st, request, target)
        if self.enable_kv_cache_events:
            self._drain_events(st, request)

    @staticmethod
    def _vllm_tables(st: _Req) -> tuple[list[int]]:
        """A request's block tables as vLLM holds them: one group's."""
        return (st.pages,)

    def _append_known(self, st: _Req, request, target: int) -> None:
        """Appends the request's tokens ``st.n:target`` (no lookahead): full pages register."""
        rc, new = self._append(st, _token_ids(request), target, 0)
        if rc:
            kvshare.check(rc, "kvs_seq_append_pages")
        if new:
            if self._avail is not None:
                self._avail -= len(new)
            if self._zero_new:
                self._zero(0, new)

    # ------------------------------------------------------------------ extras
    def check(self) -> None:
        """kvshare's full invariant check (tests); registrations still waiting stay waiting.
        Also checks the kept free capacity (``_capacity``) against kvshare's count."""
        self.cache.check()
        kept, self._avail = self._avail, None
        if kept is not None and kept != self._capacity():
            raise AssertionError(f"kvshare_vllm: kept free capacity {kept} but kvshare counts "
                                 f"{self._avail}")

    def kvshare_stats(self) -> dict[str, int]:
        self._flush()
        return self.cache.stats()
