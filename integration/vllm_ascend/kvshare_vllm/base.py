"""``ManagerBase``: the part of ``manager.KvshareKVCacheManager`` that follows vLLM's
``KVCacheManager`` surface whatever the groups: the running vLLM's constructor (``__init__``,
one per release, which hands the arguments to the subclass's ``_setup``), prefix-cache stats,
the usage fraction, new-block ids for KV zeroing, ``KVCacheBlocks`` construction, reset and
event hand-out; and two translations: a request's kvshare extra keys (``extra_keys_for``) and
a KV-cache spec's page element (``_kv_dtype``).

A subclass provides ``empty_kv_cache_blocks``, ``_capacity()`` (vLLM's free blocks),
``_drain_events(st, request)`` (vLLM's events for what kvshare queued; called with
``(None, None)`` when no request's call is pending), ``_vllm_tables(st)`` (a request's block
table per group),
``_append_known(st, request, target)`` (hands kvshare the request's tokens up to ``target``, no
slots: full pages register), and the block objects in ``_blocks``.  The base lets the
registration of a page that fills in a step needing no other native call wait (``_dirty``,
``_flush``), settles a request's tokens before its pages go back (``_settle_known``; ``_unit``:
the match unit) and serves a KV connector's calls: ``evict_blocks`` and the block hashes
connectors read after an allocation with external tokens (``_mark_hashed``).
"""

from __future__ import annotations

import hashlib
import itertools

import kvshare
from kvshare import lib

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.metrics.stats import PrefixCacheStats

from . import logger
from .compat import manager_api

_API = manager_api()  # the vLLM release whose KVCacheManager signatures the managers present


# block_hash of a registered page whose request carries no vLLM block hash (see _mark_hashed)
_HASHED = b"kvshare:registered"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def zeroed_groups(kv_cache_config) -> tuple[bool, ...]:
    """Per KV-cache group, whether vLLM hands its new blocks out for KV zeroing
    (``take_new_block_ids``): only where the cache needs zeroing (0.23: Mamba layers; 0.32 also
    mixed precision).  vLLM 0.23 zeroes full-attention and MLA blocks only (exact spec types);
    0.32 every attention group's but a circular buffer's."""
    from vllm.v1 import kv_cache_interface as kci

    groups = kv_cache_config.kv_cache_groups
    if not getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        return tuple(False for _ in groups)
    if _API == "0.23.0":
        return tuple(type(g.kv_cache_spec).__name__ in
                     ("FullAttentionSpec", "TQFullAttentionSpec", "MLAAttentionSpec")
                     for g in groups)
    ring = getattr(kci, "CircularBufferSpec", ())
    return tuple(isinstance(g.kv_cache_spec, kci.AttentionSpec)
                 and not isinstance(g.kv_cache_spec, ring) for g in groups)


def _common_prefix(a, b, width: int = 1) -> int:
    """Leading entries two sequences share, an entry being ``width`` items (4: the uint32 page
    ids of a packed block table; 1: a list of page ids): slice comparisons, binary search."""
    n = min(len(a), len(b)) // width
    if a[:width * n] == b[:width * n]:
        return n
    lo, hi = 0, n  # they agree on lo entries, not on hi
    while hi - lo > 1:
        m = (lo + hi) // 2
        if a[:width * m] == b[:width * m]:
            lo = m
        else:
            hi = m
    return lo


def _token_ids(request) -> list[int]:
    """The request's token ids as a plain list (vLLM's own list behind the read-only
    ``all_token_ids`` view; a copy when a Request type has no such list)."""
    toks = getattr(request, "_all_token_ids", None)
    return toks if type(toks) is list else list(request.all_token_ids)


def _extra_addr(extra) -> int:
    """A ``kvshare.ExtraKeys``' ``kvs_extra_keys *`` as an int (0 for None), the form the
    native module's calls take."""
    from kvshare import ffi

    return int(ffi.cast("uintptr_t", extra.ptr)) if extra is not None else 0


MATCH_UNIT_ENV = "KVSHARE_VLLM_MATCH_UNIT"


def copies_need_connector(unit: int, where: str) -> ValueError:
    """The refusal of sub-page hits whose partial copies have no channel to the worker
    (``where``: a release without vLLM's block copies, or a model of several groups)."""
    return ValueError(f"kvshare_vllm: {MATCH_UNIT_ENV}={unit}: {where} the partial copies of "
                      "sub-page hits run in the worker through kvshare's KV connector; "
                      "configure KvshareConnector (kv_transfer_config, docs/vllm.md) or unset it")


def match_unit_setting(block_size: int) -> int:
    """``KVSHARE_VLLM_MATCH_UNIT``: the granularity of prefix hits in tokens, a divisor of the
    block size below it (e.g. 16 with 128-token blocks); 0 (unset, or the block size itself)
    keeps whole-block hits.  A hit then also takes the whole units of a cached block it goes
    on into, copied into the request's first new block before the step's forward pass.
    Raises ValueError naming the variable for any other value."""
    import os

    raw = os.environ.get(MATCH_UNIT_ENV, "").strip()
    if not raw:
        return 0
    try:
        unit = int(raw)
    except ValueError:
        unit = -1
    if unit < 0 or (unit and block_size % unit):
        raise ValueError(f"kvshare_vllm: {MATCH_UNIT_ENV}={raw!r} must be 0 or a divisor of the "
                         f"block size {block_size} (tokens)")
    return 0 if unit == block_size else unit


class ManagerBase:
    """The manager's half that follows vLLM's surface; see the module doc for what a
    subclass provides."""

    if _API == "0.23.0":
        def __init__(self, kv_cache_config, max_model_len: int, scheduler_block_size: int,
                     hash_block_size: int, max_num_batched_tokens: int | None = None,
                     enable_caching: bool = True, use_eagle: bool = False,
                     log_stats: bool = False, enable_kv_cache_events: bool = False,
                     dcp_world_size: int = 1, pcp_world_size: int = 1,
                     metrics_collector=None) -> None:
            """vLLM 0.23.0's ``KVCacheManager`` constructor; the subclass's ``_setup``
            builds."""
            self._setup(kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                        enable_caching, use_eagle, log_stats, enable_kv_cache_events,
                        dcp_world_size, pcp_world_size, metrics_collector,
                        {"max_num_batched_tokens": max_num_batched_tokens})
    else:
        def __init__(self, kv_cache_config, max_model_len: int, scheduler_block_size: int,
                     hash_block_size: int, max_in_flight_tokens: int | None = None,
                     enable_caching: bool = True, use_eagle: bool = False,
                     num_prefill_lookahead: int = 0, log_stats: bool = False,
                     enable_kv_cache_events: bool = False, dcp_world_size: int = 1,
                     pcp_world_size: int = 1, metrics_collector=None, watermark: float = 0.0,
                     enable_mamba_shared_prefix_checkpoint: bool = False) -> None:
            """vLLM 0.32.0's ``KVCacheManager`` constructor; the subclass's ``_setup`` builds.
            ``enable_mamba_shared_prefix_checkpoint`` concerns Mamba groups, which neither
            manager takes on 0.32 (the attribute the scheduler reads is False, as vLLM's
            manager sets it without them)."""
            if watermark < 0.0:
                raise ValueError(f"kvshare_vllm: watermark {watermark} must be non-negative")
            self._setup(kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                        enable_caching, use_eagle, log_stats, enable_kv_cache_events,
                        dcp_world_size, pcp_world_size, metrics_collector,
                        {"max_in_flight_tokens": max_in_flight_tokens}, num_prefill_lookahead,
                        watermark)

    def _init_base(self, kv_cache_config, max_model_len: int, enable_caching: bool,
                   use_eagle: bool, log_stats: bool, enable_kv_cache_events: bool,
                   metrics_collector, watermark: float = 0.0) -> None:
        """The state the manager keeps, set before anything else of theirs."""
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector  # sampled block-lifetime metrics: not fed
        self.enable_kv_cache_events = enable_kv_cache_events
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.num_blocks = kv_cache_config.num_blocks
        self._usable = self.num_blocks - 1  # the null block is never usable
        self._reqs: dict = {}  # request id -> the subclass's per-request state
        self._seq_ids = itertools.count(1)  # kvshare sequence ids
        # KV zeroing (take_new_block_ids): which groups' new blocks vLLM zeroes, and the ids
        # not yet taken, per group (vLLM hands them out group after group).
        self._zeroed = zeroed_groups(kv_cache_config)
        self._zero_new = any(self._zeroed)
        self._new_block_ids: list[list[int]] = [[] for _ in self._zeroed]
        self._events: list = []  # vLLM's KV events not yet taken
        self._avail: int | None = None  # the kept free count (the subclass's _capacity)
        # Blocks kept free when admitting a waiting / preempted request while others are
        # scheduled (vLLM 0.32's admission watermark; 0 on 0.23).
        self.watermark_blocks = int(watermark * self.num_blocks)
        # vLLM 0.32 attributes the scheduler reads: no Mamba group, no group retaining a
        # longer hit than the computed tokens.
        self.mamba_shared_prefix_checkpoint = False
        self.retained_hit_group_ids = ()
        # Sequences taken with pop_blocks_for_free, holding their pages until
        # block_pool.free_blocks returns them (vLLM 0.32's deferred frees), oldest first.
        self._popped: list = []
        # Requests whose last page filled up in a step that needed no native call: request id
        # -> (state, request, known tokens), registered by _flush / _settle_dirty.  Off with
        # KV events, which must come out in vLLM's order.
        self._dirty: dict = {}
        self._defer = not enable_kv_cache_events

    @property
    def usage(self) -> float:
        return 1.0 - self._capacity() / self._usable if self._usable else 0

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request) -> bool:
        """Whether ``request`` may take prefix-cache hits (caching on, and the request does not
        skip reading the cache: prompt logprobs, all-token pooling)."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request, num_hits: int) -> None:
        """Records a request's lookup (not for a request that skipped it): vLLM 0.32's
        scheduler calls it at admission; on 0.23 ``get_computed_blocks`` does."""
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                       preempted=request.num_preemptions > 0)

    def _pop_for_free(self, request) -> list:
        """vLLM 0.32's ``pop_blocks_for_free``: ends the request's
        bookkeeping and returns its blocks in vLLM's order (``_popped_ids``) without releasing
        them; its sequence is held on ``_popped`` until ``_free_popped``.  A page that filled
        without a native call is registered first, as ``free`` would (``_settle_known``).  A
        request with no blocks ends at once: vLLM never hands an empty list back."""
        rid = request.request_id
        if self._pending is not None and self._pending[0] == rid:
            self._pending = None
        st = self._reqs.pop(rid, None)
        self._common = None
        if st is None:
            return []
        self._settle_known(st, request)
        ids = self._popped_ids(st)
        if not ids:
            self._end_popped(st)
            return []
        self._popped.append(st)
        blocks = self._blocks
        return [blocks[p] for p in ids]

    def _free_popped(self, blocks) -> None:
        """``block_pool.free_blocks`` of a popped request's blocks, given last block first as
        the scheduler returns them: the popped sequence whose blocks they are ends
        (``_end_popped``).  Raises ValueError, changing nothing, for blocks no popped request
        holds in that order."""
        ids = [b.block_id for b in blocks]
        if not ids:
            return
        ids.reverse()
        for i, st in enumerate(self._popped):
            if ids == self._popped_ids(st):
                del self._popped[i]
                self._end_popped(st)
                return
        raise ValueError(f"kvshare_vllm: free_blocks({ids}) names no request's blocks "
                         "taken with pop_blocks_for_free")

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: refused (False, a warning) while a request holds
        blocks; otherwise every cached page is forgotten (``kvs_prefix_clear``, an
        ``AllBlocksCleared`` event) and stays where it was in the free order, as vLLM's
        block pool keeps its free queue."""
        if self._reqs or self._popped:  # popped: held until block_pool.free_blocks
            held = [*self._reqs.values(), *self._popped]
            logger.warning("Failed to reset prefix cache because some blocks (%d) are not "
                           "freed yet", sum(len(t) for st in held for t in self._vllm_tables(st)))
            return False
        self._flush()
        self._drain_events(None, None)
        self._avail = None
        kvshare.check(lib.kvs_prefix_clear(self._h), "kvs_prefix_clear")
        self._drain_events(None, None)
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def take_events(self) -> list:
        if not self.enable_kv_cache_events:
            return []
        self._drain_events(None, None)
        ev, self._events = self._events, []
        return ev

    def create_kv_cache_blocks(self, blocks) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def take_new_block_ids(self) -> list[int]:
        lists = self._new_block_ids
        if not any(lists):
            return []
        self._new_block_ids = [[] for _ in lists]
        return [b for ids in lists for b in ids]

    def _zero(self, g: int, ids) -> None:
        """Hands blocks ``ids`` added to group ``g`` out for KV zeroing, where vLLM zeroes that
        group's new blocks."""
        if self._zeroed[g]:
            self._new_block_ids[g].extend(ids)

    def new_step_starts(self) -> None:
        """Nothing per step: registration is immediate (no deferred commit)."""

    def evict_blocks(self, block_ids) -> None:
        """Drops the cached entries of blocks a failed KV load left wrong (vLLM's
        ``kv_load_failure_policy`` recompute), as vLLM's ``BlockPool.evict_blocks`` drops
        theirs: ``kvs_prefix_unregister`` on their pages (vLLM's block ids are the page ids of
        the cache's one device pool, whichever group holds them: every group's pages have the
        same bytes, see ``unsupported_reason``; the null block is skipped)."""
        from kvshare import ffi, lib

        ids = sorted({int(b) for b in block_ids if b})
        if not ids:
            return
        if self._dirty:
            self._flush()  # pages that filled with no native call register first
        pages = ffi.new("uint32_t[]", ids)
        kvshare.check(lib.kvs_prefix_unregister(self._h, 0, pages, len(ids), ffi.NULL),
                      "kvs_prefix_unregister")
        self._avail = None
        if self.enable_kv_cache_events:
            self._drain_events(None, None)

    def _flush(self) -> None:
        """Hands kvshare the tokens of pages that filled up in steps that made no native call
        (``allocate_slots``), registering those pages, in the order the steps filled them.
        Runs before anything could look them up (a prefix match, a sequence begin), free them,
        count them or clear the index, so hits, evictions, events and block counts are what
        registering at the fill gives, as vLLM's manager caches them."""
        dirty, self._dirty = self._dirty, {}
        for st, request, target in dirty.values():
            if target > st.n:
                self._append_known(st, request, target)

    def _settle_dirty(self, request_id: str) -> None:
        """``_flush`` of one request (before its pages go back or are counted)."""
        d = self._dirty.pop(request_id, None)
        if d is not None and d[2] > d[0].n:
            self._append_known(*d)

    def _settle_known(self, st, request) -> None:
        """Before a request's pages go back (``free``, ``pop_blocks_for_free``): a page that
        filled with no native call is registered, as vLLM caches it at free; with a match
        unit, the computed tokens of the last, partly filled page are handed over too, so their
        whole units stay matchable (a conversation's next turn)."""
        if self._dirty:
            self._settle_dirty(request.request_id)
        if self._unit and self.enable_caching:
            target = min(request.num_computed_tokens, request.num_tokens)
            if target > st.n:
                self._append_known(st, request, target)

    def _mark_hashed(self, tables, registered: int, request) -> None:
        """Sets ``block_hash`` on the request's block objects as vLLM's blocks have it right
        after an allocation with external tokens: in every group's table (``tables``, page ids,
        0 at the null page, which is left alone) the pages kvshare registered (positions below
        ``registered``: local hits, and without a delayed load every full page of the handed
        tokens) carry the request's vLLM block hash for that group (a placeholder when the
        engine computes none), the others ``None``.  KV connectors read exactly this, on
        ``get_blocks`` of this request in ``update_state_after_alloc`` (the offloading
        connector's first unhashed block, ``get_unhashed_block_ids`` of NIXL / Mooncake /
        HF3FS); nothing else reads it, so it is maintained only here (the block objects are
        shared handles: a page's flag is only meaningful in this request's table now)."""
        blocks = self._blocks
        n = registered if self.enable_caching else 0
        hashes = getattr(request, "block_hashes", None) or ()
        for g, table in enumerate(tables):
            for i, p in enumerate(table):
                if not p:
                    continue
                b = blocks[p]
                if i < n:
                    b._block_hash = make_block_hash_with_group_id(hashes[i], g) \
                        if i < len(hashes) else _HASHED
                else:
                    b._block_hash = None


def lookahead_reason(num_prefill_lookahead: int) -> str | None:
    """Why neither manager takes vLLM 0.32's multi-module MTP prefill lookahead (None without
    one): vLLM keeps the last ``num_prefill_lookahead - 1`` computed tokens out of the prefix
    cache, as re-prefillable; kvshare registers every full page of computed tokens."""
    if num_prefill_lookahead > 1:
        return (f"multi-module MTP prefill lookahead of {num_prefill_lookahead} tokens (their "
                "re-prefillable KV is kept out of the prefix cache)")
    return None


def extra_keys_for(request):
    """kvshare extra keys: LoRA id, cache salt, multimodal items (None when none)."""
    lora = request.lora_request.lora_int_id if request.lora_request else 0
    salt = request.cache_salt.encode() if getattr(request, "cache_salt", None) else None
    if getattr(request, "prompt_embeds", None) is not None:
        # Prompt embeddings are not token ids: isolate the request (never shares).
        salt = (salt or b"") + b"\0prompt-embeds\0" + request.request_id.encode()
    items = []
    for f in getattr(request, "mm_features", None) or ():
        d = hashlib.blake2b(str(f.identifier).encode(), digest_size=16).digest()
        pos = f.mm_position
        items.append((int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little"),
                      pos.offset, pos.length))
    if not lora and not salt and not items:
        return None
    return kvshare.ExtraKeys(lora, salt, items)


# vLLM's KV-cache element type -> kvshare's page element (the page bytes follow from it). vLLM
# stores fp8 caches (kv_cache_dtype fp8, fp8_e4m3, fp8_e5m2) as uint8, which does not say which
# fp8; both are one byte, all the manager's page accounting needs.
_KV_DTYPES = {
    "torch.float32": "KVS_DTYPE_F32",
    "torch.float16": "KVS_DTYPE_F16",
    "torch.bfloat16": "KVS_DTYPE_BF16",
    "torch.float8_e4m3fn": "KVS_DTYPE_FP8_E4M3",
    "torch.float8_e5m2": "KVS_DTYPE_FP8_E5M2",
    "torch.uint8": "KVS_DTYPE_FP8_E4M3",
}


def _kv_dtype(spec) -> str:
    """The ``kvs_dtype`` name of a vLLM KV-cache spec's element type (f16 when the spec has none
    kvshare stores)."""
    return _KV_DTYPES.get(str(getattr(spec, "dtype", "")), "KVS_DTYPE_F16")


def page_geometry(group) -> dict:
    """``kvs_config`` fields giving one KV-cache group's page kvshare's geometry: its layers,
    KV heads, head size and element type, so the page's bytes are vLLM's for that group over
    all of its layers (the pool tier's store keys name them)."""
    from kvshare import ffi

    spec = group.kv_cache_spec
    return {"num_layers": max(1, len(group.layer_names)),
            "num_kv_heads": max(1, getattr(spec, "num_kv_heads", 1)),
            "head_dim": max(1, getattr(spec, "head_size", 1)),
            "dtype": ffi.typeof("enum kvs_dtype").relements[_kv_dtype(spec)]}


def check_page_bytes(cache, group) -> None:
    """Raises ValueError unless kvshare's page of a full-attention group built with
    ``page_geometry`` holds vLLM's bytes (K and V of every layer, no scales or padding inside
    the page); other specs are not judged."""
    spec = group.kv_cache_spec
    if type(spec).__name__ != "FullAttentionSpec":
        return
    want = spec.page_size_bytes * max(1, len(group.layer_names))
    got = cache.group_info(0)["page_bytes"]
    if got != want:
        raise ValueError(f"kvshare_vllm: vLLM's KV pages hold {want} bytes over "
                         f"{len(group.layer_names)} layers, kvshare's would hold {got} "
                         f"(element type {spec.dtype})")


# vLLM's ``kv_cache_dtype`` values whose caches kvshare's manager sizes and serves: the model's
# own type, a 16-bit float, and the fp8 caches with per-tensor scales that vLLM's CPU backend
# stores (uint8, one byte an element). vLLM 0.32's other formats (int8 / fp8 / int4 per token
# and head with their scales inside the page, nvfp4, turboquant, ultraquant, the MLA ones) lay
# out pages kvshare's geometry does not give.
CARRIED_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


def cache_dtype_reason(cache_dtype: str | None, spec) -> str | None:
    """Why kvshare's manager cannot carry vLLM's ``kv_cache_dtype`` ``cache_dtype`` (None when
    the caller does not know it) for a KV-cache group whose layers are ``spec``; None when it
    can.  Without the name, vLLM 0.32's ``spec.kv_quant_mode`` and the spec's element type
    tell; specs with no KV heads (Mamba state) are not judged here."""
    carried = ", ".join(CARRIED_CACHE_DTYPES)
    if cache_dtype is not None and cache_dtype not in CARRIED_CACHE_DTYPES:
        return f"kv_cache_dtype {cache_dtype!r} (kvshare's manager carries {carried})"
    if not hasattr(spec, "num_kv_heads"):
        return None
    mode = getattr(spec, "kv_quant_mode", None)  # vLLM 0.32's KVQuantMode
    if mode is not None and mode.name not in ("NONE", "FP8_PER_TENSOR"):
        return (f"a KV cache quantized as {mode.name} (kv_cache_dtype {mode.name.lower()!r}; "
                f"kvshare's manager carries {carried})")
    if str(getattr(spec, "dtype", "")) not in _KV_DTYPES:
        return f"KV-cache element type {spec.dtype} (kvshare's manager carries {carried})"
    return None
