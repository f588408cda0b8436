"""``KvshareKVCacheManager``: vLLM's ``KVCacheManager`` surface backed by one ``kvshare.Cache``
with the model's KV-cache groups (kept in vLLM's block pool order, ``vllm_free_order``), for
every model kvshare takes: a plain model is one full-attention group; hybrid models add
sliding-window, chunked-local and Mamba / linear-attention state groups.

It plays vLLM 0.23.0's ``KVCacheCoordinator`` (unitary or hybrid): one page pool shared
by every group (vLLM unifies page bytes, so kvshare puts all groups in one pool), one block
table per group and request, the null block (page 0) at positions a window released or a hit
skipped, hits found by kvshare's fixed point across groups (``kvs_prefix_find``), positions
released out of the window by ``remove_skipped_blocks`` (``kvs_seq_release_skipped``,
registered pages still matchable).  Nothing is called per block: an admitted request takes one
``kvs_seq_begin``, a running one a native call only when it needs slots or a page fills (most
decode steps make none, see ``allocate_slots``), through ``_fast.Groups``.

vLLM's admission arithmetic (``get_num_blocks_to_allocate``: the per-request cap of windowed
groups under ``full_sequence_must_fit``, skipped positions, evictable hit blocks) runs here on a
mirror of the block tables (``group_tables``); every page operation runs in kvshare.  Mamba /
linear-attention state groups run on kvshare's STATE groups (``state_groups``).  What is not
handled is refused by :func:`unsupported_reason` (the plugin then keeps vLLM's manager): state
groups with KV events or speculative blocks, cross attention, EAGLE beside chunked-local or
state groups (on vLLM 0.32 beside any windowed group), per-group block sizes.  EAGLE / MTP
groups are kvshare's (``KVS_GROUP_EAGLE``): its lookup drops their last hit block as vLLM's
coordinator does.  KV events are vLLM's (``events.GroupEventTranslator``).  KV
connectors' calls are served: external tokens and delayed caching (``_begin_external``),
``evict_blocks`` and the block hashes connectors read (``base``).  vLLM 0.32's additions are in
``manager_newer.py``, the views (``coordinator``, ``block_pool``) in ``views.py``.
"""

from __future__ import annotations

from array import array

import kvshare
from kvshare import ffi, lib

from .startup import require as _require_supported_vllm_and_native

_require_supported_vllm_and_native()  # before vLLM's imports: an unsupported vLLM is named

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.request import RequestStatus

from . import _fast  # required: startup.require() has checked that it loads
from .compat import manager_api, support
from .base import (MATCH_UNIT_ENV, ManagerBase, _cdiv, _extra_addr, _token_ids,
                   check_page_bytes, copies_need_connector, extra_keys_for, match_unit_setting,
                   page_geometry)
from .events import cached_blocks_event
from .group_tables import GroupTables, _HReq
from .host_tier import HOST_PAGES, CopyQueue, HostTier
from .pool_tier import manager_pool
from .manager_newer import NewerSurface, newer_groups_reason, window_retention
from .state_groups import (is_state_spec, state_group_kind, state_unsupported_reason,
                           vllm_table)
from .views import _BlockPoolView, _CoordinatorView

# kvshare_vllm._fast.Groups' group kinds
_FAST_KINDS = {"full": 0, "sliding_window": 1, "chunked_local": 2}
_API = manager_api()  # the vLLM release whose KVCacheManager signatures this module presents
_NO_SPACE = kvshare.STATUS["KVS_STATUS_NO_SPACE"]
_STORED = ffi.typeof("enum kvs_event_kind").relements["KVS_EVENT_KIND_STORED"]
_REMOVED = ffi.typeof("enum kvs_event_kind").relements["KVS_EVENT_KIND_REMOVED"]
_CLEARED = ffi.typeof("enum kvs_event_kind").relements["KVS_EVENT_KIND_CLEARED"]
_DEVICE = ffi.typeof("enum kvs_tier").relements["KVS_TIER_DEVICE"]
# Request states vLLM 0.32's admission watermark applies to (waiting, preempted).
_ADMITTED_FROM = frozenset((RequestStatus.WAITING, RequestStatus.PREEMPTED))


def _group_kind(spec) -> tuple[str, int] | None:
    """kvshare's (kind, window) for a vLLM spec; None when kvshare has no such kind."""
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                                            SlidingWindowSpec)

    name = type(spec).__name__
    if is_state_spec(spec):
        return state_group_kind(spec)
    if name in ("SlidingWindowSpec", "SlidingWindowMLASpec") \
            and isinstance(spec, SlidingWindowSpec):
        return "sliding_window", spec.sliding_window
    if name == "ChunkedLocalAttentionSpec" and isinstance(spec, ChunkedLocalAttentionSpec):
        return "chunked_local", spec.attention_chunk_size
    if name in ("FullAttentionSpec", "MLAAttentionSpec", "TQFullAttentionSpec") \
            and isinstance(spec, FullAttentionSpec) \
            and not getattr(spec, "sliding_window", None) \
            and not getattr(spec, "attention_chunk_size", None):
        return "full", 0
    return None


def eagle_groups(groups, use_eagle: bool) -> list[bool]:
    """Per group, whether vLLM's coordinator drops its last hit block: the groups the model
    marks (``is_eagle_group``), or every group under ``use_eagle`` when none is marked
    (``eagle_group_ids``), spread to every group of an equal spec (``SpecGroup.use_eagle``)."""
    marked = [bool(getattr(g, "is_eagle_group", False)) for g in groups]
    if use_eagle and not any(marked):
        marked = [True] * len(groups)
    return [any(m and g.kv_cache_spec == h.kv_cache_spec for m, h in zip(marked, groups))
            for g in groups]


def _eagle_reason(groups, eagle: list[bool]) -> str | None:
    """Why kvshare cannot drop the EAGLE block as vLLM does for these groups (None: it can)."""
    kinds = [_group_kind(g.kv_cache_spec) for g in groups]
    bad = {k for (k, _), e in zip(kinds, eagle) if e and k not in ("full", "sliding_window")}
    if bad:
        return (f"EAGLE / MTP speculative decoding with {', '.join(sorted(bad))} groups (vLLM "
                "drops no block there)")
    if _API != "0.23.0" and any(eagle) and any(k != "full" for k, _ in kinds):
        return ("EAGLE / MTP speculative decoding beside windowed or state groups on vLLM "
                f"{_API} (its coordinator looks a block past the lookup limit)")
    # kvshare looks groups of one kind and window up together and drops in all of them when one
    # is EAGLE's.  For full attention that is vLLM's hit whenever the groups cache the same
    # blocks (a draft model's group marked beside the target's); windows must agree.
    for k in set(kinds):
        if k[0] != "full" and len({e for kk, e in zip(kinds, eagle) if kk == k}) > 1:
            return (f"EAGLE / MTP on part of the sliding-window groups of window {k[1]} (vLLM "
                    "drops per spec, kvshare per kind and window)")
    return None


def unsupported_reason(kv_cache_config, scheduler_block_size: int, hash_block_size: int,
                       dcp_world_size: int = 1, pcp_world_size: int = 1,
                       use_eagle: bool = False, enable_kv_cache_events: bool = False,
                       max_model_len: int | None = None,
                       num_prefill_lookahead: int = 0) -> str | None:
    """Why kvshare's manager cannot manage this configuration (None when it can); on vLLM 0.32
    also ``newer_groups_reason``."""
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        return "no KV-cache groups (attention-free model)"
    if _API != "0.23.0":
        why = newer_groups_reason(kv_cache_config, num_prefill_lookahead)
        if why:
            return why
    for i, g in enumerate(groups):
        if _group_kind(g.kv_cache_spec) is None:
            return (f"KV-cache group {i}: {type(g.kv_cache_spec).__name__} (kvshare's groups "
                    "manage full attention / MLA, sliding window, chunked local attention and "
                    "Mamba / linear-attention state)")
    why, state_bs = state_unsupported_reason(groups, scheduler_block_size, hash_block_size,
                                             max_model_len, lib)
    if why:
        return why
    if state_bs is not None and enable_kv_cache_events:
        return "KV events with Mamba / linear-attention state groups"
    if state_bs is not None and HOST_PAGES.get():
        return ("kvshare's host tier (KvshareConnector) with Mamba / linear-attention state "
                "groups (the connector copies attention KV pages only)")
    sizes = {g.kv_cache_spec.block_size for g in groups}
    if state_bs is None and len(sizes) != 1:
        return f"block sizes differ between groups ({sorted(sizes)})"
    bs = sizes.pop() if state_bs is None else state_bs
    if state_bs is None and (hash_block_size != bs or scheduler_block_size != bs):
        return (f"block sizes differ (kv {bs}, scheduler {scheduler_block_size}, "
                f"hash {hash_block_size})")
    if len({g.kv_cache_spec.page_size_bytes for g in groups}) != 1:
        return "page bytes differ between groups (vLLM unifies them; one pool here)"
    why = _eagle_reason(groups, eagle_groups(groups, use_eagle))
    if why:
        return why
    if dcp_world_size != 1 or pcp_world_size != 1:
        return f"context parallelism (dcp={dcp_world_size}, pcp={pcp_world_size})"
    if not 1 <= bs <= kvshare.MAX_PAGE_SIZE:
        return f"block size {bs} outside kvshare's 1..{kvshare.MAX_PAGE_SIZE}"
    if len(groups) > getattr(kvshare, "MAX_GROUPS", 32):
        return f"{len(groups)} KV-cache groups (kvshare manages at most 32)"
    return None


class KvshareKVCacheManager(NewerSurface, GroupTables, ManagerBase):
    """Drop-in for ``vllm.v1.core.kv_cache_manager.KVCacheManager`` on one or many KV-cache
    groups, with the running vLLM's signatures (``compat.manager_api()``: 0.23.0 or 0.32.0)."""

    def _setup(self, kv_cache_config, max_model_len: int, scheduler_block_size: int,
               hash_block_size: int, enable_caching: bool, use_eagle: bool, log_stats: bool,
               enable_kv_cache_events: bool, dcp_world_size: int, pcp_world_size: int,
               metrics_collector, in_flight: dict, num_prefill_lookahead: int = 0,
               watermark: float = 0.0) -> None:
        """The constructor (``ManagerBase.__init__``, the running vLLM's signature);
        ``in_flight``: the tokens windowed groups' caps are sized by, under the running vLLM's
        parameter name."""
        why = unsupported_reason(kv_cache_config, scheduler_block_size, hash_block_size,
                                        dcp_world_size, pcp_world_size, use_eagle,
                                        enable_kv_cache_events, max_model_len,
                                        num_prefill_lookahead)
        if why:
            raise ValueError(f"kvshare_vllm: unsupported configuration: {why}")
        # The groups whose last hit block vLLM drops (EAGLE / MTP); kvshare's lookup drops it.
        eagle = eagle_groups(kv_cache_config.kv_cache_groups, use_eagle)
        use_eagle = any(eagle)
        self._init_base(kv_cache_config, max_model_len, enable_caching, use_eagle, log_stats,
                        enable_kv_cache_events, metrics_collector, watermark)
        self.specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        self.num_kv_cache_groups = ng = len(self.specs)
        # The page size: the attention groups' block size (a "none" state group's block is
        # max_model_len tokens: one page here, see state_groups).
        self.block_size = bs = next(s.block_size for s in self.specs if not is_state_spec(s))
        kinds = [_group_kind(s) for s in self.specs]
        self._groups = [(k, w, s.page_size_bytes, e)
                        for (k, w), s, e in zip(kinds, self.specs, eagle)]
        # Tokens a group skips once c tokens are computed (vLLM's get_num_skipped_tokens).
        self._windows = [(k, s.mamba_cache_mode if k == "state" else w)
                         for (k, w), s in zip(kinds, self.specs)]
        # vLLM's per-request admission cap of windowed groups (full_sequence_must_fit).
        ((name, tokens),) = in_flight.items()
        cap_args = {name: tokens if tokens is not None else max_model_len,
                    "max_model_len": max_model_len}
        self._caps = [None if k in ("full", "state") else
                      s.max_admission_blocks_per_request(**cap_args)
                      for (k, _), s in zip(kinds, self.specs)]
        self._full = [k == "full" for k, _ in kinds]
        self._first_full = self._full.index(True) if any(self._full) else None
        # State groups in "none": one page per request, handed to vLLM as a one-block table.
        self._single = frozenset(g for g, w in enumerate(self._windows) if w == ("state", "none"))
        self._has_state = any(k == "state" for k, _ in kinds)
        # State groups in "align": at most the running state page and the previous step's.
        self._align = frozenset(g for g, w in enumerate(self._windows) if w == ("state", "align"))
        self._windowed = [g for g, (k, _) in enumerate(kinds)
                          if k != "full" and g not in self._single]
        # Full attention in every group: no window, no state (the plain model's case).
        self._all_full = all(self._full)
        # vLLM 0.32's retention of sliding-window pages; sparse: sequences get boundaries.
        self._retention = window_retention(kv_cache_config, bs) if _API != "0.23.0" \
            else kvshare.MACROS["KVS_WINDOW_RETENTION_DENSE"]
        self._sparse = bool(self._retention) and enable_caching
        self._sliding = frozenset(g for g, (k, _) in enumerate(kinds) if k == "sliding_window")
        # The host tier, when kvshare's KV connector executes its copies (host_tier.py).
        connector = HOST_PAGES.get()  # None without kvshare's KV connector
        self._unit = self._unit_setting(bs, connector is not None)
        self.num_host_pages = connector or 0
        # The pool tier's key settings, when kvshare's connector has a pool (pool_tier.py).
        self._pool = manager_pool(self._unit, ng)
        self.cache = self._new_cache(kv_cache_config.kv_cache_groups)
        self._h = self.cache.handle
        self.host_tier = HostTier(self, self.num_host_pages) if connector is not None else None
        # vLLM's block copies of sub-page hits (0.32), without kvshare's connector.
        self._copy_queue = CopyQueue(self._h) if self._unit and connector is None \
            else None
        if enable_kv_cache_events:
            from vllm.v1.kv_cache_interface import (get_kv_cache_spec_kind,
                                                    get_kv_cache_spec_sliding_window)

            from .events import GroupEventTranslator
            self._translator = GroupEventTranslator(
                bs, _STORED, _REMOVED, _CLEARED, _DEVICE,
                [(get_kv_cache_spec_kind(s).value, get_kv_cache_spec_sliding_window(s))
                 for s in self.specs])
        self._stats_out = ffi.new("kvs_group_stats *")

        self.block_pool = _BlockPoolView(self, self.num_blocks)
        self._blocks = self.block_pool.blocks
        self.coordinator = _CoordinatorView(self, self.specs)
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in range(ng)))
        # page -> tables holding it (live sequences); shared with the compiled calls
        self._refs = array("I", bytes(4 * self.num_blocks))
        self._fast = self._new_fast()
        self._pending: tuple[str, object] | None = None  # (request id, extra keys) of a match
        if _API != "0.23.0":
            self._newer_setup()
        # Per full group, the page ids every live table begins with (None: recompute).
        self._common: dict[int, list[int]] | None = None

    def _new_cache(self, groups):
        """The cache of these groups.  One full-attention group's page holds every layer's K
        and V (``page_geometry``), so a pool's store keys, which name the page bytes, are those
        of the model's KV, whichever engine stored a page."""
        geometry = {}
        specs = self._groups
        if len(specs) == 1 and self._full[0]:
            geometry = page_geometry(groups[0])
            specs = [(specs[0][0], specs[0][1], 0, specs[0][3])]  # 0: the geometry's bytes
        cache = kvshare.Cache(
            page_size=self.block_size, num_device_pages=self.num_blocks, groups=specs,
            enable_prefix_caching=self.enable_caching, enable_events=self.enable_kv_cache_events,
            reserve_null_page=True, vllm_free_order=True,
            # vLLM 0.32's block pool reuses every freed uncached block first, 0.23's only a
            # window's
            vllm_uncached_first=_API != "0.23.0", defer_commit=False,
            skip_cached_writes=False, num_host_pages=self.num_host_pages,
            demote_to_host=self.num_host_pages > 0, match_unit=self._unit,
            window_retention=self._retention,
            pool=self._pool["cache"] if self._pool else None, **geometry)
        if geometry:
            check_page_bytes(cache, groups[0])
        return cache

    def _unit_setting(self, bs: int, connector: bool) -> int:
        """``KVSHARE_VLLM_MATCH_UNIT`` for these groups: sub-page hits on attention groups,
        their partial copies run by kvshare's KV connector on vLLM 0.23 (which also runs the
        groups' host tier), by vLLM's block copies on 0.32 (whole blocks, every layer: a copy
        lands in one group's page, which no other group's layers read); refused with a state
        group (a state page is whole or nothing)."""
        unit = match_unit_setting(bs)
        if unit and self._has_state:
            raise ValueError(f"kvshare_vllm: {MATCH_UNIT_ENV}={unit}: sub-page hits with "
                             "Mamba / linear-attention state groups (a state page is a "
                             "checkpoint, whole or nothing; unset it)")
        if unit and self.use_eagle:
            raise ValueError(f"kvshare_vllm: {MATCH_UNIT_ENV}={unit}: sub-page hits with EAGLE "
                             "/ MTP (a hit ends a block early for the draft model to recompute, "
                             "and a sub-page hit would reuse part of that block; unset it)")
        if unit and not connector and not support().block_copies:
            raise copies_need_connector(unit, f"on vLLM {_API}")
        return unit

    _pack = staticmethod(_fast.pack_i32)
    _extra_for = staticmethod(extra_keys_for)

    def _new_fast(self):
        """The native calls over this cache (``_fast.Groups``), or None with a state group
        (kinds ``_fast.Groups`` does not handle: their calls go through the binding)."""
        if any(k not in _FAST_KINDS for k, _ in self._windows):
            return None
        fns = tuple(int(ffi.cast("uintptr_t", ffi.addressof(lib, f"kvs_{name}")))
                    for name in ("seq_append", "seq_get_info", "seq_pages",
                                 "seq_release_skipped", "seq_free", "seq_begin_computed",
                                 "prefix_find"))
        return _fast.Groups(
            int(ffi.cast("uintptr_t", self.cache.handle)), fns, self.block_size, self.num_blocks,
            tuple((_FAST_KINDS[k], w) for k, w in self._windows), self._refs, self._blocks)

    # ------------------------------------------------------------------ helpers
    def _drain_events(self, st: _HReq | None, request, first: int = 0, end: int = 0) -> None:
        """vLLM's events for what the last native call queued (``request``'s call caching its
        blocks ``first..end-1``; tables already re-read)."""
        if self.enable_kv_cache_events:
            raw = self.cache.take_events()
            if raw or end > first:
                self._events.extend(self._translator.convert(
                    raw, st.tables if st is not None else None, request, first, end))

    # ------------------------------------------------------------------ public surface
    def _lookup(self, request):
        """The request's hit: (blocks, tokens, token ids, extra keys); kept for its
        ``allocate_slots`` (``_pending``)."""
        if self._dirty:
            self._flush()  # pages that filled with no native call must be findable
        ids = _token_ids(request)
        extra = extra_keys_for(request)
        if self.host_tier is not None:  # the request's host-tier prefix back on the device
            self.host_tier.promote(ids, extra)
        fast = self._fast
        if fast is not None:
            rc, hit, rows = fast.match(ids, _extra_addr(extra), max(len(ids) - 1, 0))
            if rc:
                kvshare.check(rc, "kvs_prefix_find")
        else:
            hit, rows = self.cache.prefix_find(ids, max(len(ids) - 1, 0), extra)
            blocks = self._blocks
            rows = [[blocks[p] for p in row] for row in rows] if hit else rows
        self._pending = (request.request_id, extra)
        if not hit:
            return self.empty_kv_cache_blocks, 0, ids, extra
        return KVCacheBlocks(tuple(rows)), hit, ids, extra

    if _API == "0.23.0":
        def get_computed_blocks(self, request) -> tuple[KVCacheBlocks, int]:
            """The request's hit (blocks, tokens); records the lookup in the prefix-cache
            stats."""
            if not self.prefix_cache_lookup_enabled(request):
                return self.empty_kv_cache_blocks, 0
            blocks, hit, _, _ = self._lookup(request)
            self.record_prefix_cache_stats(request, hit)
            return blocks, hit

        def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
            self._remove_skipped(request_id, total_computed_tokens)
    else:
        def get_computed_blocks(self, request) -> tuple[KVCacheBlocks, int, int]:
            """The request's hit (blocks, tokens, ``shared_prefix_boundary``).  The scheduler
            records the lookup at admission (``record_prefix_cache_stats``).  A request asking
            for ``kv_cache_report_mode == "full"`` with KV events on gets a ``BlockStored`` per
            group for the hit blocks, as vLLM's coordinator publishes them."""
            if not self.prefix_cache_lookup_enabled(request):
                return self.empty_kv_cache_blocks, 0, 0
            blocks, hit, ids, extra = self._lookup(request)
            if hit and self.enable_kv_cache_events \
                    and getattr(request, "kv_cache_report_mode", "incremental") == "full":
                self._drain_events(None, None)  # what earlier calls queued comes first
                for g, row in enumerate(blocks.blocks):
                    if row:
                        cached_blocks_event(self._events, request, len(row), self.block_size,
                                            self._translator.metas[g], g)
            return blocks, hit, self._shared_prefix_boundary(request, ids, extra, hit)

        def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
            """vLLM 0.32 removed cascade attention: always 0s, as its manager answers."""
            return [0] * self.num_kv_cache_groups

        def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                                  num_prompt_tokens: int | None = None) -> None:
            """Positions out of every window become null (``num_prompt_tokens`` concerns
            R-SWA groups: none here)."""
            self._remove_skipped(request_id, processed_computed_tokens)

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False, num_encoder_tokens: int = 0,
                       full_sequence_must_fit: bool = False,
                       reserved_blocks: int = 0, has_scheduled_reqs: bool = True,
                       skip_zeroing_group_ids: tuple[int, ...] = ()) -> KVCacheBlocks | None:
        """vLLM's ``allocate_slots`` (0.23's parameters; 0.32 adds ``has_scheduled_reqs``,
        which applies the watermark to a waiting or preempted request, and
        ``skip_zeroing_group_ids``: blocks of no group here are zeroed on 0.32)."""
        st = self._reqs.get(request.request_id)
        if st is not None and num_new_tokens and self._fast is not None and not (
                num_new_computed_tokens or num_lookahead_tokens or full_sequence_must_fit
                or reserved_blocks or num_external_computed_tokens or delay_cache_blocks
                or num_encoder_tokens):
            # Most decode steps: the slots exist, no page fills and no window drops a page
            # the request holds, so there is nothing to tell kvshare (the tokens go with a
            # later call, as below).
            q = st.quiet
            if q < 0:
                q = st.quiet = self._quiet(st)
            end = request.num_computed_tokens + num_new_tokens
            if end <= q:
                return self.empty_kv_cache_blocks
            if end <= st.room and self._defer and end <= self.max_model_len:
                # A page fills in slots that exist and no window drops a page now or at the
                # next call (``_quiet``).  Registering it waits until something could look it
                # up, count or free it (_flush), or until this request's next native call,
                # which then carries the tokens.
                self._dirty[request.request_id] = (st, request, min(end, request.num_tokens))
                return self.empty_kv_cache_blocks
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and (
                _API == "0.23.0" or num_new_computed_tokens == 0):
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        wm = self.watermark_blocks
        if wm and not (has_scheduled_reqs and request.status in _ADMITTED_FROM):
            wm = 0
        if num_encoder_tokens:
            raise NotImplementedError(
                "kvshare_vllm: encoder (cross-attention) blocks are not supported")
        hits = new_computed_blocks.blocks if new_computed_blocks is not None else None
        local = request.num_computed_tokens + num_new_computed_tokens
        # Tokens a KV connector loads come after the local hit; windows count them computed.
        external = num_external_computed_tokens
        total = min(local + external, self.max_model_len)
        if st is None and self._dirty:
            self._flush()  # the begin matches: pages that filled must be findable
        if st is None and self._all_full and not (external or delay_cache_blocks
                                                  or reserved_blocks or wm):
            # Full attention only: kvs_seq_begin's own NO_SPACE is vLLM's room check (fresh
            # pages for every slot against free pages less the evictable hits it holds), so
            # only a full sequence longer than this chunk needs vLLM's arithmetic first.
            bs = self.block_size
            need_slot = min(total + num_new_tokens + num_lookahead_tokens, self.max_model_len)
            full = min(request.num_tokens, self.max_model_len)
            if full_sequence_must_fit and _cdiv(full, bs) > _cdiv(need_slot, bs) and \
                    self._blocks_to_allocate(None, full, hits, total, True) > self._capacity():
                return None
            return self._begin(request, _token_ids(request),
                               min(total + num_new_tokens, request.num_tokens), need_slot,
                               num_new_computed_tokens)
        seen = {} if st is None else None  # evictable hit counts, shared by the two checks
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._blocks_to_allocate(st, full, hits, total, True, seen) + wm \
                    > self._capacity():
                return None
        main = total + num_new_tokens
        need_slot = min(main + num_lookahead_tokens, self.max_model_len)
        fast = self._fast
        # Tokens of a page that filled with no native call: this call carries them.
        waiting = self._dirty.pop(request.request_id, None) \
            if self._dirty and st is not None else None
        if st is not None and fast is not None and not reserved_blocks \
                and not delay_cache_blocks and not wm:
            # A running request's step, one compiled call: the release, vLLM's room check and
            # the append below (full_sequence_must_fit was checked above).
            inflight = max(0, getattr(request, "num_in_flight_tokens", 0))
            events = self.enable_kv_cache_events
            cached = st.n // self.block_size if events else 0
            avail = self._avail
            st.quiet = -1
            known = min(main, request.num_tokens)
            if waiting is not None:  # the window drops none of its pages here (_quiet)
                known = max(known, waiting[2])
            room, rc, appended, added, self._avail = fast.running(
                st, _token_ids(request), max(0, total - inflight), need_slot, known,
                avail if avail is not None else self._capacity())
            if not room:
                if waiting is not None:  # nothing changed: the page still waits
                    self._dirty[request.request_id] = waiting
                return None
            if rc:
                kvshare.check(rc, "kvs_seq_append")
            if appended and events:
                self._drain_events(st, request, cached,
                                   st.n // self.block_size if self.enable_caching else cached)
            return self.empty_kv_cache_blocks if added is None else self._handed_blocks(added)
        if waiting is not None:  # registered before the release, as vLLM cached it
            self._append_known(*waiting)
        if st is not None:
            # vLLM's remove_skipped_blocks, done even when the allocation below fails.  Under
            # vllm-ascend (its async-SWA patch gives requests ``num_in_flight_tokens``), tokens
            # of steps still in flight keep their window, as its patched manager does.
            inflight = max(0, getattr(request, "num_in_flight_tokens", 0))
            self._release(st, max(0, total - inflight))
        need = self._blocks_to_allocate(st, need_slot, hits, local + external, False, seen)
        if (need or reserved_blocks or wm) and need + wm > self._capacity() - reserved_blocks:
            return None
        # vLLM caches min(total + new, num_tokens) tokens: drafts are not tokens yet; with a
        # delayed (asynchronous) load it caches none here (cache_blocks after the load).
        known = min(main, request.num_tokens)
        ids = _token_ids(request)
        if st is None:
            if external or delay_cache_blocks:
                return self._begin_external(request, ids, local, local + external,
                                            known, need_slot, delay_cache_blocks,
                                            skip_zeroing_group_ids)
            return self._begin(request, ids, known, need_slot, num_new_computed_tokens)
        if delay_cache_blocks:
            known = st.n
        bs = self.block_size
        grows = _cdiv(need_slot, bs) > len(st.tables[0])
        if grows or known // bs > st.n // bs:
            # New pages, or a page filled with known tokens (vLLM caches it now).  Tokens of a
            # partly filled page wait for such a call: nothing can look them up before.
            toks = ids[st.n:known] if known > st.n else []
            cached = st.n // bs
            st.n += len(toks)
            self.cache.seq_append(st.seq, toks, max(need_slot - st.n, 0))
            out = self._handed(self._refresh(st)) if grows else self.empty_kv_cache_blocks
            # vLLM caches with prefix caching on only
            self._drain_events(st, request, cached, st.n // bs if self.enable_caching else cached)
            return out
        return self.empty_kv_cache_blocks

    def _new_seq(self, request) -> _HReq:
        """The state of a request beginning its sequence, with the extra keys its
        ``get_computed_blocks`` computed (or computed now)."""
        pend = self._pending
        extra = pend[1] if pend is not None and pend[0] == request.request_id \
            else extra_keys_for(request)
        self._pending = None
        return _HReq(next(self._seq_ids), extra, self.num_kv_cache_groups)

    def _check_matched(self, request, expected: int, matched: int) -> None:
        """The hit at allocation is the one ``get_computed_blocks`` reported, or the request
        is freed and the call fails."""
        if matched != expected:
            self.free(request)
            raise RuntimeError(
                f"kvshare_vllm: request {request.request_id}: {expected} tokens were found "
                f"cached by get_computed_blocks but {matched} at allocation")

    def _begin(self, request, ids, known: int, need_slot: int, num_hit: int) -> KVCacheBlocks:
        """``allocate_slots`` of a request without a sequence: ``kvs_seq_begin`` (the
        hit again, skipped positions null, fresh pages up to ``need_slot``, full pages of the
        known tokens registered)."""
        rid = request.request_id
        st = self._new_seq(request)
        extra = st.extra
        fast = self._fast
        nh = num_hit // self.block_size
        rows = None
        if fast is not None:
            rc, matched, rows, self._avail = fast.begin(st, ids, known, _extra_addr(extra),
                                                        num_hit, max(need_slot - known, 0), nh,
                                                        0, self._avail)
            if rc == _NO_SPACE and (self._unit or self._all_full):
                # Full attention only: the begin's room check is vLLM's (allocate_slots).  A
                # sub-page hit's source page, cached, is held too: no room.
                return None
            if rc:
                kvshare.check(rc, "kvs_seq_begin")
            info = {"matched_tokens": matched}
            self._reqs[rid] = st
            if self._sparse:
                self._retain(st, request)
        else:
            try:
                info = self.cache.seq_begin(st.seq, ids[:known], max_match_tokens=num_hit,
                                            lookahead_slots=max(need_slot - known, 0),
                                            extra=extra)
            except kvshare.NoSpaceError:
                if not self._has_state:
                    raise
                # A hit ending at a state checkpoint registered in this step (its state is
                # written by this step's forward): vLLM's MambaManager refuses it too.
                return None
            self._reqs[rid] = st
            if self._sparse:
                self._retain(st, request)
            st.n = known
            self._refresh(st)
        self._drain_events(st, request, nh, known // self.block_size if self.enable_caching else nh)
        self._common_with(st)
        self._check_matched(request, num_hit, info["matched_tokens"])
        if rows is not None:
            return self._handed_blocks(rows)
        return self._handed([vllm_table(t) if g in self._single else t[nh:]
                             for g, t in enumerate(st.tables)])

    def _begin_external(self, request, ids, local: int, computed: int, known: int,
                        need_slot: int, delay: bool,
                        unzeroed: tuple[int, ...] = ()) -> KVCacheBlocks | None:
        """``allocate_slots`` of a request without a sequence whose tokens ``local..computed``
        a KV connector loads, or whose caching waits for a load (``delay``): vLLM's
        ``allocate_new_computed_blocks`` (hit, nulls where a window no longer reads at
        ``computed``, fresh blocks for the external tokens) and ``allocate_new_blocks`` in
        every group.  kvshare begins the sequence with the local hit, slots up to
        ``need_slot`` and the computed count (``kvs_seq_begin_computed``: positions a window
        drops at ``computed`` take the null page, none is taken, so admission counts vLLM's
        pages; no page of the transfer is registered: nothing finds it before its KV is
        written), then without ``delay`` hands over the ``known`` tokens, whose full pages
        register as vLLM caches them in this call.  Returns the blocks past the external
        tokens', as vLLM does.  The blocks added go out for KV zeroing, but for the groups in
        ``unzeroed`` only those past the external tokens' (the load writes those after this
        step)."""
        fast = self._fast
        if fast is None:
            raise NotImplementedError(
                "kvshare_vllm: KV connectors' external tokens with Mamba / linear-attention "
                "state groups")
        rid, bs = request.request_id, self.block_size
        st = self._new_seq(request)
        extra = st.extra
        rc, matched, _, self._avail = fast.begin(st, ids, local, _extra_addr(extra), local,
                                                 max(need_slot - local, 0), 0, computed,
                                                 self._avail)
        if rc == _NO_SPACE:
            return None
        if rc:
            kvshare.check(rc, "kvs_seq_begin")
        self._reqs[rid] = st
        if self._sparse:
            self._retain(st, request)
        self._common_with(st)
        self._check_matched(request, local, matched)
        if not delay and known > st.n:
            st.quiet = -1
            rc, _, self._avail = fast.append(st, ids, known, 0, self._avail)
            if rc:
                kvshare.check(rc, "kvs_seq_append")
        nh = local // bs
        self._drain_events(st, request, nh, st.n // bs if self.enable_caching else nh)
        self._mark_hashed(st.tables, st.n // bs, request)
        skip = _cdiv(computed, bs)
        if self._zero_new:  # every block added (a window's nulls are none), as vLLM
            for g, t in enumerate(st.tables):
                self._zero(g, t[skip:] if g in unzeroed else [p for p in t[nh:] if p])
        out = [t[skip:] for t in st.tables]
        if not any(out):
            return self.empty_kv_cache_blocks
        blocks = self._blocks
        return KVCacheBlocks(tuple([blocks[p] for p in t] for t in out))

    def free(self, request) -> None:
        rid = request.request_id
        if self._pending is not None and self._pending[0] == rid:
            self._pending = None
        st = self._reqs.pop(rid, None)
        if st is None:
            return
        self._common = None  # the shared prefix may lengthen
        self._settle_known(st, request)
        self._release_seq(st)

    def _release_seq(self, st: _HReq, deferred: bool = False) -> None:
        """Frees the request's sequence: its pages released, full pages still cached; with
        ``deferred`` as vLLM 0.32's block pool takes a popped request's blocks back (one list,
        the last group first: ``kvs_seq_free_deferred``)."""
        if self._fast is not None and not deferred:
            rc, self._avail = self._fast.free(st, self._avail)
            if rc:
                kvshare.check(rc, "kvs_seq_free")
            return
        if deferred:
            self.cache.seq_free_deferred(st.seq)
        else:
            self.cache.seq_free(st.seq)
        refs = self._refs
        for t in st.tables:
            for p in t:
                if p:
                    self._ref(refs, p, -1)

    def _remove_skipped(self, request_id: str, total_computed_tokens: int) -> None:
        st = self._reqs.get(request_id)
        if st is None:
            return
        if self._fast is not None:
            st.quiet = -1
            _, self._avail = self._fast.release(st, total_computed_tokens, self._avail)
        else:
            self._release(st, total_computed_tokens)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        if self._dirty:
            self._settle_dirty(request.request_id)
        target = min(num_computed_tokens, request.num_tokens)
        bs = self.block_size
        if target // bs > st.n // bs and self._fast is not None:
            self._append_known(st, request, target)
        elif target // bs > st.n // bs:  # a page fills (partial pages wait, see allocate_slots)
            self.cache.seq_append(st.seq, _token_ids(request)[st.n:target], 0)
            cached, st.n = st.n // bs, target
            if _cdiv(target, bs) > len(st.tables[0]):
                self._refresh(st)
            self._drain_events(st, request, cached, target // bs)

    def _append_known(self, st: _HReq, request, target: int) -> None:
        """The request's tokens up to ``target`` to kvshare (``_fast.append``), full pages
        registered, and vLLM's events for them."""
        cached = st.n // self.block_size
        st.quiet = -1
        rc, _, self._avail = self._fast.append(st, _token_ids(request), target, 0, self._avail)
        if rc:
            kvshare.check(rc, "kvs_seq_append")
        self._drain_events(st, request, cached, target // self.block_size)

    def new_step_starts(self) -> None:
        """vLLM's ``MambaManager.new_step_starts`` (clears ``cached_blocks_this_step``):
        ``Cache.new_step`` (``kvs_cache_new_step``); nothing to do without state groups."""
        if self._has_state:
            self.cache.new_step()

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        st = self._reqs.get(request_id)
        if st is None:
            return self.empty_kv_cache_blocks
        get = self._blocks.__getitem__
        return KVCacheBlocks(tuple(list(map(get, t)) for t in self._vllm_tables(st)))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        st = self._reqs.get(request_id)
        if st is None:
            return tuple([] for _ in range(self.num_kv_cache_groups))
        return tuple(list(t) for t in self._vllm_tables(st))

    def kvshare_stats(self) -> dict[str, int]:
        if self._dirty:
            self._flush()
        st = self.cache.stats()
        return {**st, "device_pages_in_use": self.cache.group_stats(0)["pool_pages_in_use"],
                **{f"group{g}_{k}": v for g in range(self.num_kv_cache_groups)
                   for k, v in self.cache.group_stats(g).items()}}
