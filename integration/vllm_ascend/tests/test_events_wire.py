"""KV events on the wire, on whichever supported vLLM this venv holds: the events kvshare's
translators build (``kvshare_vllm.events``) equal, field by field and byte by byte after vLLM's
publisher encoding, the events vLLM's own ``BlockPool`` queues for the same requests and the
same cache operations, and decode with vLLM's own decoder.

vLLM 0.23 encodes each event as a msgpack array, 0.24 and later as a map tagged with the event
type, and 0.32 publishes block-hash extra keys untagged (``to_event_extra_keys``) and a
``session_id``; the test asserts the running version's shape, so it reads the same on both
venvs.  The reference is vLLM's ``BlockPool`` (what vLLM's manager drains in ``take_events``),
annotated with the group's spec kind as the manager annotates it; the scheduler-level stream
comparison against vLLM's whole manager is ``test_scheduler_compare.py``'s
``test_kv_events_match_vllm``."""

from __future__ import annotations

import msgspec
import pytest
import torch

import vllm
from vllm.distributed.kv_events import KVEventBatch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (FullAttentionSpec, get_kv_cache_spec_kind,
                                        get_kv_cache_spec_sliding_window)
from vllm.v1.request import Request

from kvshare_vllm.events import GroupEventTranslator

BS = 16
STORED, REMOVED, CLEARED, DEVICE = 1, 2, 3, 0
# The event encoding of each supported release (msgspec: array_like or tagged map).
ENCODED_AS = {"0.23.0": list, "0.32.0": dict}
RELEASE = vllm.__version__.split("+", 1)[0]


def _request(rid: str, n_tokens: int, hash_algo: str, **kw) -> Request:
    hash_fn = get_hash_fn_by_name(hash_algo)
    init_none_hash(hash_fn)
    if "session_id" in kw and "session_id" not in Request.__init__.__code__.co_varnames:
        del kw["session_id"]  # vLLM 0.23 requests carry no session id
    sp = SamplingParams(ignore_eos=True, max_tokens=4)
    sp.update_from_generation_config({}, 2)
    return Request(request_id=rid, prompt_token_ids=[(7 * i + len(rid)) % 30000 + 3
                                                     for i in range(n_tokens)],
                   sampling_params=sp, pooling_params=None, mm_features=None,
                   block_hasher=get_request_block_hasher(BS, hash_fn), **kw)


def _meta():
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16)
    return get_kv_cache_spec_kind(spec).value, get_kv_cache_spec_sliding_window(spec)


def _annotated(events, metas):
    """vLLM's ``KVCacheManager.take_events``: stores get their group's spec kind."""
    for ev in events:
        if hasattr(ev, "kv_cache_spec_kind") and ev.group_idx is not None:
            ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window = metas[ev.group_idx]
    return events


def _encoded(events) -> bytes:
    # vLLM's ZmqEventPublisher: msgspec.msgpack.Encoder() over a KVEventBatch.
    return msgspec.msgpack.Encoder().encode(
        KVEventBatch(ts=1.5, events=events, data_parallel_rank=None))


def _assert_same_stream(ours, theirs):
    assert ours == theirs, f"kvshare {ours}\nvLLM    {theirs}"
    assert _encoded(ours) == _encoded(theirs)
    decoded = msgspec.msgpack.Decoder(KVEventBatch).decode(_encoded(ours))
    assert decoded.events == theirs
    raw = msgspec.msgpack.decode(_encoded(ours))
    assert all(isinstance(e, ENCODED_AS[RELEASE]) for e in raw[1]), raw


def _ev(kind: int, tier: int, page: int, group: int = 0) -> dict:
    """One kvshare event as ``kvshare.Cache.take_events()`` gives it."""
    return {"kind": kind, "tier": tier, "group": group, "page": page}


@pytest.mark.parametrize("hash_algo", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
def test_single_group_stream_equals_vllm_block_pool(hash_algo):
    """Stores in two calls (the second with a parent), a salted LoRA request with a session,
    evictions one page at a time, and a prefix-cache reset."""
    meta = _meta()
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=BS,
                     enable_kv_cache_events=True)
    tr = GroupEventTranslator(BS, STORED, REMOVED, CLEARED, DEVICE, [meta])
    reqs = [_request("plain", 3 * BS + 5, hash_algo),
            _request("tenant", 4 * BS, hash_algo, cache_salt="tenant-a", session_id="s-1",
                     lora_request=LoRARequest("adapter", 7, "/nonexistent"))]
    ours, theirs, tables = [], [], []
    for req in reqs:
        blocks = pool.get_new_blocks(req.num_tokens // BS + 1)
        pages = [b.block_id for b in blocks]
        tables.append(blocks)
        full = req.num_tokens // BS
        for first, end in ((0, 2), (2, full)):
            pool.cache_full_blocks(req, blocks, first, end, BS, 0)
            ours += tr.convert([_ev(STORED, DEVICE, p) for p in pages[first:end]], [pages], req,
                               first, end)
            # Another tier's event is not the device's: vLLM publishes none for it.
            assert tr.convert([_ev(STORED, DEVICE + 1, pages[0])], [pages], req, 0, 0) == []
    theirs += _annotated(pool.take_events(), [meta])
    _assert_same_stream(ours, theirs)

    for blocks in tables:
        pool.free_blocks(reversed(blocks))
    evicted = [tables[1][2].block_id, tables[0][0].block_id]
    ours, theirs = [], []
    for page in evicted:
        pool.evict_blocks({page})
        ours += tr.convert([_ev(REMOVED, DEVICE, page)], None, None, 0, 0)
    assert pool.reset_prefix_cache()
    ours += tr.convert([_ev(CLEARED, DEVICE + 1, 0), _ev(CLEARED, DEVICE, 0)], None, None, 0, 0)
    theirs += _annotated(pool.take_events(), [meta])
    assert len(theirs) == len(evicted) + 1
    _assert_same_stream(ours, theirs)


def test_group_stream_equals_vllm_block_pool():
    """Two KV-cache groups over one pool: per group one ``BlockStored`` with its group index,
    then a removal named in the group it was stored for, then a reset's ``AllBlocksCleared``
    (the device tier's clear only)."""
    metas = [_meta(), _meta()]
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=BS,
                     enable_kv_cache_events=True)
    tr = GroupEventTranslator(BS, STORED, REMOVED, CLEARED, DEVICE, metas)
    req = _request("tenant", 3 * BS, "sha256", cache_salt="tenant-b", session_id="s-2",
                   lora_request=LoRARequest("adapter", 3, "/nonexistent"))
    tables = [pool.get_new_blocks(3), pool.get_new_blocks(3)]
    pages = [[b.block_id for b in t] for t in tables]
    for g, blocks in enumerate(tables):
        pool.cache_full_blocks(req, blocks, 0, 3, BS, g)
    raw = [_ev(STORED, DEVICE, p, g) for g in (0, 1) for p in pages[g]]
    ours = tr.convert(raw, pages, req, 0, 3)
    pool.free_blocks(reversed(tables[1]))
    pool.evict_blocks({pages[1][2]})
    ours += tr.convert([_ev(REMOVED, DEVICE, pages[1][2], 1)], pages, req, 0, 0)
    pool.free_blocks(reversed(tables[0]))
    assert pool.reset_prefix_cache()
    ours += tr.convert([_ev(CLEARED, tier, 0) for tier in (DEVICE, DEVICE + 1)], None, None,
                       0, 0)
    theirs = _annotated(pool.take_events(), metas)
    assert type(theirs[-1]).__name__ == "AllBlocksCleared"
    _assert_same_stream(ours, theirs)
