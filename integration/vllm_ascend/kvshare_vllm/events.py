"""KV events as vLLM's own manager publishes them: kvshare's queued index events (its xxh3
chain digests, one per page) turned into ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared`` carrying vLLM's block hashes, so a router that recomputes vLLM's hashes
from tokens (llm-d's indexer, Dynamo's KV router, Mooncake's conductor) cannot tell the two
managers' streams apart.

The hashes are vLLM's: ``Request.block_hashes``, computed by the engine's own request block
hasher (``get_request_block_hasher`` with the configured ``prefix_caching_hash_algo``, the
parent chain from ``NONE_HASH``, LoRA / cache-salt / multimodal / prompt-embedding extra keys).
The plugin keeps that hasher when KV events are on (``plugin.drop_block_hasher``), so the cost
of hashing is paid only then; this module reads the hashes, never recomputes them.  The extra
keys a ``BlockStored`` carries come from vLLM's ``generate_block_hash_extra_keys``, published
as the running vLLM publishes them (0.32 tags the keys it hashes and publishes them untagged,
through its ``to_event_extra_keys``), with the request's ``session_id`` where the running vLLM's
``BlockStored`` has one.  The events are the running vLLM's own classes, so they encode in its
wire format: msgpack arrays on 0.23, maps tagged with the event type on 0.32.

Shape follows ``vllm.v1.core.block_pool.BlockPool`` (0.23.0): one ``BlockStored`` per caching
call, for the run of blocks it registered (parent: the hash of the block before the run, None
for a run starting at block 0); one ``BlockRemoved`` per evicted block; removals a call makes
(allocating pages evicts) come before what it stores.  Removals name the vLLM hash the page was
stored under (kept per page until it leaves the index).
"""

from __future__ import annotations

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

# vLLM's own conversion: bytes, or the low 64 bits as an int with
# VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
try:
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as external_hash
except ImportError:  # pragma: no cover - older/newer vLLM
    def external_hash(h: bytes):
        return h

try:  # vLLM 0.32: hashed extra keys are tagged, events publish them untagged
    from vllm.v1.core.kv_cache_utils import to_event_extra_keys
except ImportError:  # vLLM 0.23: events publish the keys as hashed
    def to_event_extra_keys(extra_keys):
        return extra_keys if extra_keys else None

# vLLM 0.32's BlockStored names the request's session (None when it has none).
_HAS_SESSION = "session_id" in BlockStored.__struct_fields__

MEDIUM = "GPU"  # vLLM's MEDIUM_GPU: the accelerator's KV tensors (NPU HBM on Ascend)


def _index(pages: list[int] | None, page: int) -> int:
    """Where ``page`` sits in a block table (searched from the end: stored pages are the
    newly filled ones)."""
    for i in range(len(pages) - 1 if pages else -1, -1, -1):
        if pages[i] == page:
            return i
    raise RuntimeError(f"kvshare_vllm: page {page} stored outside the calling request")


def stored_event(out: list, request, first: int, end: int, run: list[int], bs: int,
                 group: int, meta: tuple) -> list:
    """vLLM's ``BlockPool.cache_full_blocks`` event for blocks ``first..end-1`` of ``request``
    in KV-cache group ``group``, of which the blocks ``run`` (sorted) were registered (vLLM
    skips null blocks: their hashes and extra keys are left out, their tokens are not).
    Appends the ``BlockStored`` to ``out``; returns the external hashes of ``run``."""
    hashes = request.block_hashes
    if len(hashes) < end:
        raise RuntimeError(
            f"kvshare_vllm: request {request.request_id} has {len(hashes)} vLLM block "
            f"hashes, events need {end} (KV events need vLLM's request block hasher)")
    new = [external_hash(hashes[i]) for i in run]
    extra, mm = [], 0
    for i in run:
        keys, mm = generate_block_hash_extra_keys(request, i * bs, (i + 1) * bs, mm)
        extra.append(keys)
    lora = request.lora_request
    session = {"session_id": request.session_id} if _HAS_SESSION else {}
    ev = BlockStored(
        block_hashes=new,
        parent_block_hash=external_hash(hashes[first - 1]) if first else None,
        token_ids=request.all_token_ids[first * bs:end * bs],
        block_size=bs,
        lora_id=lora.adapter_id if lora else None,
        medium=MEDIUM,
        lora_name=lora.name if lora else None,
        extra_keys=to_event_extra_keys(extra),
        group_idx=group,
        **session,
    )
    ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window = meta
    out.append(ev)
    return new


def cached_blocks_event(out: list, request, num_blocks: int, bs: int, meta: tuple,
                        group: int = 0) -> None:
    """vLLM 0.32's ``BlockPool.emit_cached_block_events``: one ``BlockStored`` for the first
    ``num_blocks`` blocks of ``request`` in KV-cache group ``group``, a prefix hit it reuses
    (published when the request asks for ``kv_cache_report_mode == "full"``; the index does
    not change; a window's null positions are named too, as vLLM names them).  Appends it to
    ``out``."""
    stored_event(out, request, 0, num_blocks, list(range(num_blocks)), bs, group, meta)


class GroupEventTranslator:
    """Turns one drain of kvshare events (``kvshare.Cache.take_events()`` dicts) into vLLM's
    events, for one KV-cache group or several, as vLLM's ``KVCacheCoordinator`` publishes:
    only the device tier's (``device``: kvshare's device ``kvs_tier``; vLLM publishes nothing
    for another tier); per caching call, the removals
    of its allocations (each in the group its page was stored for), then one ``BlockStored``
    per group, in group order, for the call's block range (also when the group registered
    none of it: null positions).  ``metas[g]`` is group g's (kind, sliding window)."""

    def __init__(self, block_size: int, stored: int, removed: int, cleared: int, device: int,
                 metas) -> None:
        self.block_size = block_size
        self._kinds = (stored, removed, cleared)
        self._device = device
        self.metas = list(metas)
        self._page_hash: dict[int, tuple] = {}  # page id -> (external hash, group)

    def convert(self, raw, tables, request, first: int, end: int) -> list[KVCacheEvent]:
        """vLLM's events for ``raw`` (one native call's events, in order).  ``tables`` are the
        request's block tables per group after the call, ``first..end-1`` the blocks the call
        caches (vLLM's ``num_cached_blocks`` .. ``num_full_blocks``; empty when it caches
        none).  Raises RuntimeError on a stored page outside that range or never stored
        before its removal."""
        stored, removed, cleared = self._kinds
        out: list[KVCacheEvent] = []
        runs: list[list[int]] = [[] for _ in self.metas]
        for e in raw:
            if e["tier"] != self._device:
                continue
            kind, g, page = e["kind"], e["group"], e["page"]
            if kind == cleared:  # the index cleared (reset_prefix_cache)
                self._page_hash.clear()
                out.append(AllBlocksCleared())
            elif kind == removed:
                h = self._page_hash.pop(page, None)
                if h is None or h[1] != g:
                    raise RuntimeError(f"kvshare_vllm: page {page} of group {g} removed but "
                                       "never stored there")
                out.append(BlockRemoved(block_hashes=[h[0]], medium=MEDIUM, group_idx=g))
            elif kind == stored:
                i = _index(tables[g] if tables else None, page)
                if not first <= i < end:
                    raise RuntimeError(f"kvshare_vllm: block {i} of group {g} stored outside "
                                       f"the call's blocks {first}..{end - 1}")
                runs[g].append(i)
        if end > first:
            for g, run in enumerate(runs):
                run.sort()
                new = stored_event(out, request, first, end, run, self.block_size, g,
                                   self.metas[g])
                for i, h in zip(run, new):
                    self._page_hash[tables[g][i]] = (h, g)
        return out
