"""Hybrid models (several KV-cache groups) through the installed vLLM's Scheduler (0.23.0 or
0.32.0): vLLM's own ``HybridKVCacheCoordinator`` against kvshare's manager, in lockstep
(``Pair.step``: same tokens scheduled, hits, per-group block counts, null-block positions of
every block table, blocks in use, preemptions, sampled tokens, on 0.32 the lookups'
shared-prefix boundaries, every step).  The harness's ``KVCacheConfig`` keeps vLLM 0.32's
sliding-window pages densely (``prefix_cache_retention_interval`` None) unless a test asks for
sparse retention (``test_sparse_retention_in_lockstep``); 0.32's Mamba state groups are refused
(``test_unmanaged_configurations_fall_back``).

The group layouts are vLLM's own (``harness.layer_specs`` per layer, grouped by vLLM's
``get_kv_cache_groups``): gpt-oss (sliding window 128 / full alternating), Gemma 3 (5 windows of
1024 per full layer), Llama 4 (chunked local 8192, 3 per full layer), MLA (one group), plus the
same layouts with short windows / chunks so short prompts release pages often.

``test_workload_on_vllm`` runs each workload with vLLM's manager on both sides: it checks that
the workload does what the lockstep needs (hits, released positions, preemptions)."""

from __future__ import annotations

import random
import zlib

import pytest

import harness as h
from vllm.v1.request import RequestStatus
from test_scheduler_compare import Pair, _lockstep_events, conversations

# (model, window/chunk override, Pair kwargs, workload kwargs)
CASES = {
    "gpt-oss": ("gpt-oss", None, dict(num_blocks=2000),
                dict(num_convs=6, turns=4, system=200, user_len=(5, 40), max_tokens=12)),
    "gpt-oss-w32": ("gpt-oss", 32, dict(num_blocks=2000),
                    dict(num_convs=6, turns=4, system=60, user_len=(5, 40), max_tokens=20)),
    "gemma3": ("gemma3", None, dict(num_blocks=3000),
               dict(num_convs=4, turns=3, system=1100, user_len=(50, 200), max_tokens=12)),
    "gemma3-w64": ("gemma3", 64, dict(num_blocks=2000),
                   dict(num_convs=5, turns=4, system=90, user_len=(10, 60), max_tokens=20)),
    "llama4": ("llama4", None, dict(num_blocks=3000, max_model_len=16384),
               dict(num_convs=2, turns=2, system=8250, user_len=(20, 60), max_tokens=8)),
    "llama4-c64": ("llama4", 64, dict(num_blocks=2000),
                   dict(num_convs=5, turns=4, system=90, user_len=(10, 60), max_tokens=20)),
    "mla": ("mla", None, dict(num_blocks=2000),
            dict(num_convs=6, turns=4, system=100, user_len=(5, 40), max_tokens=12)),
    "mistral-w32": ("mistral", 32, dict(num_blocks=2000),
                    dict(num_convs=6, turns=4, system=60, user_len=(5, 40), max_tokens=20)),
    "gpt-oss-w32-async": ("gpt-oss", 32, dict(num_blocks=2000, async_scheduling=True),
                          dict(num_convs=6, turns=3, system=60, user_len=(5, 40),
                               max_tokens=20)),
    # Chunked prefill (64-token budget): windows slide inside a prompt's prefill.
    "gpt-oss-w32-chunked": ("gpt-oss", 32, dict(num_blocks=400, max_num_batched_tokens=64,
                                                 max_num_seqs=4),
                            dict(num_convs=5, turns=3, system=70, user_len=(20, 120),
                                 max_tokens=20)),
    # Memory pressure: preemptions, and cached pages evicted in vLLM's order.
    "gpt-oss-w32-preempt": ("gpt-oss", 32, dict(num_blocks=60, max_num_seqs=8),
                            dict(num_convs=8, turns=3, system=40, user_len=(5, 40),
                                 max_tokens=40)),
    "llama4-c64-preempt": ("llama4", 64, dict(num_blocks=90, max_num_seqs=8),
                           dict(num_convs=8, turns=3, system=40, user_len=(5, 40),
                                max_tokens=40)),
    # Prefix caching off (vLLM's KVCacheCoordinatorNoPrefixCache): preemption, nothing cached.
    "gpt-oss-w32-nocache-preempt": ("gpt-oss", 32, dict(num_blocks=60, max_num_seqs=8,
                                                         enable_prefix_caching=False),
                                    dict(num_convs=8, turns=2, system=40, user_len=(5, 40),
                                         max_tokens=40)),
    "gemma3-w64-preempt": ("gemma3", 64, dict(num_blocks=150, max_num_seqs=8),
                           dict(num_convs=8, turns=3, system=40, user_len=(5, 40),
                                max_tokens=40)),
}
WINDOWED = {"gpt-oss", "gemma3", "llama4", "mistral"}


def run_case(model_dir, name: str, vllm_only: bool = False, events: list | None = None,
             on_pair=None, **extra) -> Pair:
    """Runs case ``name``; with ``events`` (a list), KV events are on and every step compares
    both managers' streams (``_lockstep_events``), whose common stream lands in ``events``;
    ``on_pair(pair)`` runs before the workload."""
    model, size, pair_kw, work = CASES[name]
    pair = Pair(model_dir, vllm_only=vllm_only, specs=h.layer_specs(model, size=size),
                kv_events=events is not None, **pair_kw, **extra)
    if on_pair is not None:
        on_pair(pair)
    if events is not None:
        seen = _lockstep_events(pair)
        events.append(seen[1])
    work = dict(work)
    rng = random.Random(zlib.crc32(name.encode()))
    system = [rng.randrange(3, 30000) for _ in range(work.pop("system"))]
    conversations(pair, system=system, seed=rng.randrange(1 << 30), **work)
    return pair


@pytest.mark.parametrize("name", sorted(CASES))
def test_workload_on_vllm(tiny_model_dir, name):
    """The workload on vLLM's manager (both sides): it hits, releases out-of-window positions
    (null entries in block tables) on windowed models, preempts where meant to; deterministic."""
    pair = run_case(tiny_model_dir, name, vllm_only=True)
    assert type(pair.kvs.kv_cache_manager).__name__ == "KVCacheManager"
    groups = pair.ref.kv_cache_config.kv_cache_groups
    model = CASES[name][0]
    assert len(groups) == (h.MODELS[model][2] or 1)
    if pair_kw_caching(name):
        assert pair.hits[0] > 0
    if model in WINDOWED:
        assert pair.nulls > 0, "the workload must release positions out of the window"
    if name.endswith("-preempt"):
        assert pair.preemptions > 0
    assert pair.hits[0] == pair.hits[1] and pair.peak_blocks[0] == pair.peak_blocks[1]


def pair_kw_caching(name: str) -> bool:
    return CASES[name][2].get("enable_prefix_caching", True)


class DecodeCalls:
    """Counts the manager's decode steps (``allocate_slots`` of a running request with one
    new token and nothing else), the native calls they make (``_fast.Groups.running``) and
    those calls that changed nothing (room found, no token handed over, every table as it
    was): a step the manager could have answered in Python; and ``fills``: calls that only
    handed tokens over (registering a page that filled: no table changed)."""

    def __init__(self):
        self.decodes = self.calls = self.idle = self.fills = 0

    def attach(self, pair) -> None:
        mgr, counts = pair.kvs.kv_cache_manager, self
        fast, allocate = mgr._fast, mgr.allocate_slots
        decoding = [False]

        class Counted:
            def __getattr__(self, name):
                return getattr(fast, name)

            def running(self, st, *args):
                before = (st.n, [list(t) for t in st.tables])
                out = fast.running(st, *args)
                if decoding[0]:
                    counts.calls += 1
                    counts.idle += out[0] and not out[1] and before == (st.n, st.tables)
                    counts.fills += out[0] and not out[1] and before[0] != st.n \
                        and before[1] == st.tables
                return out

        def allocate_slots(request, num_new_tokens, *args, **kw):
            decoding[0] = request.request_id in mgr._reqs and num_new_tokens == 1 \
                and not args and not any(kw.values())
            counts.decodes += decoding[0]
            try:
                return allocate(request, num_new_tokens, *args, **kw)
            finally:
                decoding[0] = False

        mgr._fast, mgr.allocate_slots = Counted(), allocate_slots


@pytest.mark.parametrize("name", sorted(CASES))
def test_lockstep(tiny_model_dir, name):
    """kvshare's manager against vLLM's on the same workload, every step (``Pair.step``; its
    ``check()`` compares the mirrored tables and refcounts with kvshare's), on the native calls
    (``_fast.Groups``).  A decode step that changes nothing in kvshare (slots there, no page
    filled, no page out of a window) makes no native call, and every other one makes one."""
    calls = DecodeCalls()
    pair = run_case(tiny_model_dir, name, on_pair=calls.attach)
    assert type(pair.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    assert calls.idle == 0, f"{calls.idle} decode steps called kvshare for nothing"
    assert 0 < calls.calls < calls.decodes / 4, (calls.calls, calls.decodes)
    assert pair.hits[0] == pair.hits[1]
    assert pair.peak_blocks[0] == pair.peak_blocks[1]
    st = pair.kvs.kv_cache_manager.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0
    # Every page vLLM cached is in kvshare's index (a page whose registration waited included:
    # a window may drop it right after it fills, vLLM cached it first).
    assert st["index_pages"] == _vllm_cached(pair)
    if not h.CASCADE and name.endswith("-preempt") and pair_kw_caching(name):
        # vLLM 0.32: under pressure a window's pages go before the full group's, so hits lag
        # behind the full group's and lookups report where it ended (compared every step).
        assert pair.junctions > 0


@pytest.mark.parametrize("model", [None, "mla"])
@pytest.mark.parametrize("pressure", [False, True])
def test_one_full_group_in_lockstep(tiny_model_dir, model, pressure):
    """The manager on a model of one full-attention group (plain or MLA): in lockstep with
    vLLM's ``KVCacheManager`` every step, under cache pressure too (pages kept in vLLM's free
    order, so evictions and hits stay vLLM's), its decode steps that need no page answered
    without a native call: a page that fills registers with the next page's call (or before
    anything could look it up, count or free it)."""
    specs = h.layer_specs(model) if model else None
    pair_kw = dict(num_blocks=60, max_num_seqs=8) if pressure else dict(num_blocks=2000)
    pair = Pair(tiny_model_dir, specs=specs, **pair_kw)
    mgr = pair.kvs.kv_cache_manager
    assert type(mgr).__name__ == "KvshareKVCacheManager" and not mgr._windowed
    calls = DecodeCalls()
    calls.attach(pair)
    rng = random.Random(zlib.crc32(f"{model}-{pressure}".encode()))
    system = [rng.randrange(3, 30000) for _ in range(40 if pressure else 100)]
    conversations(pair, num_convs=8 if pressure else 6, turns=3, system=system,
                  seed=rng.randrange(1 << 30), max_tokens=40 if pressure else 12)
    assert pair.hits[0] == pair.hits[1] > 0
    assert pair.peak_blocks[0] == pair.peak_blocks[1]
    assert (pair.preemptions > 0) == pressure
    assert calls.idle == calls.fills == 0 and 0 < calls.calls < calls.decodes / 8, \
        (calls.idle, calls.fills, calls.calls, calls.decodes)
    st = mgr.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0


ZEROING_CASES = ["gpt-oss-w32", "gpt-oss-w32-async", "gpt-oss-w32-chunked", "gemma3-w64-preempt",
                 "llama4-c64", "mla"]


@pytest.mark.parametrize("name", ZEROING_CASES)
def test_kv_zeroing_in_lockstep(tiny_model_dir, name):
    """A cache that needs KV zeroing (vLLM: Mamba layers or mixed precision; forced here): every
    step the scheduler hands out the same block ids for zeroing in the same order (vLLM 0.23:
    new blocks of full-attention and MLA groups; 0.32: of every attention group), beside the
    lockstep's own checks."""
    pair = run_case(tiny_model_dir, name, zeroing=True)
    assert pair.kvs.kv_cache_manager.kv_cache_config.needs_kv_cache_zeroing
    assert pair.zeroed > 0
    assert pair.hits[0] == pair.hits[1] > 0


@pytest.mark.skipif(h.API != "0.23.0", reason="TQFullAttentionSpec is vLLM 0.23's (0.32 "
                    "describes quantized KV with kv_quant_mode)")
def test_turboquant_full_attention_in_lockstep(tiny_model_dir):
    """gpt-oss's layout with TurboQuant full-attention layers (``TQFullAttentionSpec``, a
    full-attention spec with its own page size) beside sliding window 32, under KV zeroing:
    the manager takes them as full attention, in lockstep with vLLM (zeroed blocks
    included: vLLM 0.23 zeroes a TQ group's new blocks as a full group's)."""
    from vllm.v1.kv_cache_interface import TQFullAttentionSpec

    specs = {name: TQFullAttentionSpec(block_size=s.block_size, num_kv_heads=s.num_kv_heads,
                                       head_size=s.head_size, dtype=s.dtype)
             if type(s).__name__ == "FullAttentionSpec" else s
             for name, s in h.layer_specs("gpt-oss", size=32).items()}
    pair = Pair(tiny_model_dir, specs=specs, num_blocks=2000, zeroing=True)
    mgr = pair.kvs.kv_cache_manager
    assert type(mgr).__name__ == "KvshareKVCacheManager"
    assert [type(g.kv_cache_spec).__name__ for g in mgr.kv_cache_config.kv_cache_groups] == \
        ["SlidingWindowSpec", "TQFullAttentionSpec"]
    rng = random.Random(7)
    system = [rng.randrange(3, 30000) for _ in range(60)]
    conversations(pair, num_convs=5, turns=3, system=system, seed=rng.randrange(1 << 30),
                  max_tokens=20)
    assert pair.hits[0] == pair.hits[1] > 0 and pair.nulls > 0 and pair.zeroed > 0


@pytest.mark.parametrize("name", ["gpt-oss-w32-preempt", "llama4-c64"])
def test_prefix_cache_reset_in_lockstep(tiny_model_dir, name):
    """``reset_prefix_cache`` between two workloads (under KV zeroing, so that every step
    compares the block ids handed out): kvshare forgets every cached page and keeps vLLM's
    free order, so the second workload takes the same blocks as vLLM's and hits only what it
    computed itself."""
    pair = run_case(tiny_model_dir, name, zeroing=True)
    mgr = pair.kvs.kv_cache_manager
    cache = mgr.cache
    hits = list(pair.hits)
    assert pair.ref.reset_prefix_cache() and pair.kvs.reset_prefix_cache()
    assert mgr.kvshare_stats()["index_pages"] == 0 and mgr.cache is cache
    rng = random.Random(11)
    system = [rng.randrange(3, 30000) for _ in range(60)]
    conversations(pair, num_convs=5, turns=2, system=system, seed=rng.randrange(1 << 30),
                  max_tokens=20)
    assert pair.hits[0] == pair.hits[1] > hits[0] and pair.zeroed > 0
    assert mgr.kvshare_stats()["index_pages"] == _vllm_cached(pair)


def _eagle_in_lockstep(pair, key: str, pressure: bool) -> None:
    """Conversations with EAGLE (two draft tokens) on ``pair``, in lockstep every step: the
    groups kvshare drops in are those vLLM's coordinator drops in."""
    mgr = pair.kvs.kv_cache_manager
    assert type(mgr).__name__ == "KvshareKVCacheManager"
    assert mgr.use_eagle and pair.kvs.num_lookahead_tokens == 2
    vllm = pair.ref.kv_cache_manager.coordinator.single_type_managers
    assert [mgr.cache.group_info(g)["eagle"] for g in range(len(vllm))] == \
        [m.use_eagle for m in vllm]
    rng = random.Random(zlib.crc32(f"eagle-{key}-{pressure}".encode()))
    system = [rng.randrange(3, 30000) for _ in range(40 if pressure else 100)]
    conversations(pair, num_convs=8 if pressure else 6, turns=3, system=system,
                  seed=rng.randrange(1 << 30), max_tokens=40 if pressure else 12)
    assert pair.hits[0] == pair.hits[1] > 0
    assert (pair.preemptions > 0) == pressure


@pytest.mark.parametrize("model", [None, "mla"])
@pytest.mark.parametrize("pressure", [False, True])
def test_eagle_on_full_attention_in_lockstep(tiny_model_dir, model, pressure):
    """EAGLE speculative decoding (two draft tokens: lookahead slots, and vLLM drops a hit's
    last block, whose hidden states the drafter needs) on a model of one full-attention group,
    plain or MLA, in lockstep with vLLM's manager every step, under cache pressure too."""
    specs = h.layer_specs(model) if model else None
    pair = Pair(tiny_model_dir, specs=specs, num_blocks=60 if pressure else 200, eagle=2,
                max_num_seqs=8)
    _eagle_in_lockstep(pair, str(model), pressure)


@pytest.mark.skipif(h.API != "0.23.0", reason="vLLM 0.32's EAGLE beside windows stays vLLM's")
@pytest.mark.parametrize("model,size,marked", [("gpt-oss", 32, None), ("gemma3", 64, None),
                                               ("gpt-oss", 32, "full"), ("gemma3", 64, "window")])
@pytest.mark.parametrize("pressure", [False, True])
def test_eagle_beside_windows_in_lockstep(tiny_model_dir, model, size, marked, pressure):
    """EAGLE beside sliding-window groups: vLLM's coordinator drops the last hit block of every
    EAGLE group, a window looking for a tail one block longer, each once per candidate length
    of its fixed point; kvshare's lookup does the same.  Every group EAGLE's (``use_eagle``),
    or only the groups of one kind (``is_eagle_group``), on gpt-oss- and Gemma-3-like layouts
    with short windows, under cache pressure too."""
    blocks = (150 if model == "gemma3" else 60) if pressure else 2000
    pair = Pair(tiny_model_dir, specs=h.layer_specs(model, size=size), num_blocks=blocks,
                eagle=2, eagle_groups=marked, max_num_seqs=8)
    groups = pair.kvs.kv_cache_manager.kv_cache_config.kv_cache_groups
    assert [g.is_eagle_group for g in groups] == (
        [False] * len(groups) if marked is None else
        [(type(g.kv_cache_spec).__name__ == "SlidingWindowSpec") == (marked == "window")
         for g in groups])
    _eagle_in_lockstep(pair, f"{model}-{marked}", pressure)


EVENT_CASES = ["gpt-oss", "gpt-oss-w32", "gpt-oss-w32-chunked", "gpt-oss-w32-preempt", "gemma3",
               "gemma3-w64", "gemma3-w64-preempt"]


@pytest.mark.parametrize("name", EVENT_CASES)
def test_kv_events_match_vllm(tiny_model_dir, name):
    """With KV events on, kvshare's manager publishes vLLM's hybrid stream field by
    field every step: one ``BlockStored`` per group and caching call (group index, spec kind
    and window, vLLM's block hashes of the group's registered blocks, parent, token ids, extra
    keys), ``BlockRemoved`` in the group the page was stored for, and the clear of a reset."""
    events: list = []
    pair = run_case(tiny_model_dir, name, events=events)
    assert type(pair.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    assert pair.ref.reset_prefix_cache() and pair.kvs.reset_prefix_cache()
    pair.step()  # drains (and compares) the reset's events
    stream = events[0]
    assert stream[-1][0] == "AllBlocksCleared"
    stored = [dict(e[1:]) for e in stream if e[0] == "BlockStored"]
    ngroups = len(pair.ref.kv_cache_config.kv_cache_groups)
    assert {ev["group_idx"] for ev in stored} == set(range(ngroups))
    assert {ev["kv_cache_spec_kind"] for ev in stored} >= {"full_attention", "sliding_window"}
    assert any(ev["kv_cache_spec_sliding_window"] for ev in stored)
    assert any(ev["parent_block_hash"] is not None for ev in stored)
    if name.endswith("-preempt"):
        removed = [dict(e[1:]) for e in stream if e[0] == "BlockRemoved"]
        assert removed and {ev["group_idx"] for ev in removed} == set(range(ngroups))


SPARSE_CASES = ["gpt-oss", "gpt-oss-w32", "gemma3-w64", "mistral-w32", "gpt-oss-w32-async",
                "gpt-oss-w32-chunked", "gpt-oss-w32-preempt", "gemma3-w64-preempt"]


def _vllm_cached(pair) -> int:
    """Blocks in vLLM's prefix cache (distinct hashes per group) on the reference side."""
    return len(pair.ref.kv_cache_manager.block_pool.cached_block_hash_to_block._cache)


@pytest.mark.skipif(h.API == "0.23.0", reason="vLLM 0.32's sparse prefix-cache retention")
@pytest.mark.parametrize("interval", [0, 256])
@pytest.mark.parametrize("name", SPARSE_CASES)
def test_sparse_retention_in_lockstep(tiny_model_dir, name, interval):
    """vLLM 0.32's sparse retention of sliding-window pages (``prefix_cache_retention_interval``
    0, its default: only the tails before each prompt's last token and before a lookup's
    shared-prefix junction; 256: also a tail per 256-token segment) in kvshare's core, in
    lockstep: same hits, tables, free order under pressure and preemption, every step; the
    index holds as many pages as vLLM's, fewer than with dense retention."""
    pair = run_case(tiny_model_dir, name, retention_interval=interval)
    mgr = pair.kvs.kv_cache_manager
    assert type(mgr).__name__ == "KvshareKVCacheManager" and mgr._sparse
    assert pair.hits[0] == pair.hits[1] and pair.hits[0] > 0
    assert pair.peak_blocks[0] == pair.peak_blocks[1]
    kvs = mgr.kvshare_stats()["index_pages"]
    assert kvs == _vllm_cached(pair)
    if name.endswith("-preempt"):
        assert pair.preemptions > 0
    else:
        dense = _vllm_cached(run_case(tiny_model_dir, name, vllm_only=True))
        assert kvs < dense, (kvs, dense)


@pytest.mark.skipif(h.API == "0.23.0", reason="vLLM 0.32's sparse prefix-cache retention")
@pytest.mark.parametrize("name", ["gpt-oss-w32", "gemma3-w64-preempt"])
def test_sparse_retention_events_match_vllm(tiny_model_dir, name):
    """KV events under sparse retention: each caching call's ``BlockStored`` names the hashes
    of the pages registered and the tokens of the whole range, as vLLM's block pool does."""
    events: list = []
    pair = run_case(tiny_model_dir, name, events=events, retention_interval=0)
    assert pair.kvs.kv_cache_manager._sparse
    stored = [dict(e[1:]) for e in events[0] if e[0] == "BlockStored"]
    bs = pair.block_size
    assert any(len(ev["block_hashes"]) < len(ev["token_ids"]) // bs for ev in stored)


def test_unmanaged_configurations_fall_back(tiny_model_dir):
    """What kvshare's groups do not cover stays with vLLM's manager (the plugin logs why):
    Mamba / linear-attention state groups with speculative blocks or KV events,
    EAGLE beside chunked groups (beside windows on vLLM 0.32), differing block sizes.  KV
    events with several groups run in kvshare (``test_kv_events_match_vllm``)."""
    import torch
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                                            KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                            SlidingWindowSpec)

    from kvshare_vllm.manager import unsupported_reason

    s = h.make_scheduler(tiny_model_dir, kvshare=True, kv_events=True,
                         specs=h.layer_specs("gpt-oss", size=32))
    assert type(s.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    assert s.kv_cache_manager.enable_kv_cache_events
    s = h.make_scheduler(tiny_model_dir, kvshare=True, specs=h.layer_specs("gpt-oss", size=32))
    assert type(s.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    # Mamba state groups run in kvshare in "align" / "all" / "none" (test_mamba_compare.py);
    # speculative state blocks and KV events with state groups stay with vLLM.
    mamba = MambaSpec(block_size=16, shapes=((16, 16),), dtypes=(torch.float32,),
                      mamba_cache_mode="align")
    cfg = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["a"], full),
                                         KVCacheGroupSpec(["m"], mamba)])
    if h.API == "0.23.0":
        assert unsupported_reason(cfg, 16, 16) is None
        cfg.kv_cache_groups[1] = KVCacheGroupSpec(["m"], MambaSpec(
            block_size=16, shapes=((16, 16),), dtypes=(torch.float32,),
            mamba_cache_mode="all"))
        assert unsupported_reason(cfg, 16, 16) is None
        assert "KV events" in unsupported_reason(cfg, 16, 16,
                                                        enable_kv_cache_events=True)
        cfg.kv_cache_groups[1] = KVCacheGroupSpec(["m"], MambaSpec(
            block_size=16, shapes=((16, 16),), dtypes=(torch.float32,),
            mamba_cache_mode="all", num_speculative_blocks=1))
        assert "speculative" in unsupported_reason(cfg, 16, 16)
    else:  # vLLM 0.32: state groups, and sparse retention of sliding-window groups
        assert "mamba_cache_mode='align'" in unsupported_reason(cfg, 16, 16)
        cfg.kv_cache_groups[1] = KVCacheGroupSpec(["m"], MambaSpec(
            block_size=256, shapes=((16, 16),), dtypes=(torch.float32,),
            mamba_cache_mode="none"))
        assert unsupported_reason(cfg, 256, 256, max_model_len=256) is None
        window = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8,
                                   dtype=torch.float32, sliding_window=32)
        sw = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["a"], full),
                                            KVCacheGroupSpec(["w"], window)])
        assert unsupported_reason(sw, 16, 16) is None
        for interval in (0, 64):
            sw.prefix_cache_retention_interval = interval
            assert unsupported_reason(sw, 16, 16) is None
        for interval in (40, 16 * 65535):  # not whole blocks; beyond the core's segments
            sw.prefix_cache_retention_interval = interval
            assert "retention_interval" in unsupported_reason(sw, 16, 16)
        sw.prefix_cache_retention_interval = None
        sw.kv_cache_groups[1] = KVCacheGroupSpec(["w"], SlidingWindowSpec(
            block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32,
            sliding_window=32, extra_retained_tokens=2))
        assert "MTP" in unsupported_reason(sw, 16, 16)
    cfg.kv_cache_groups.pop()
    assert unsupported_reason(cfg, 16, 16) is None
    assert unsupported_reason(cfg, 16, 16, enable_kv_cache_events=True) is None
    assert unsupported_reason(cfg, 16, 16, use_eagle=True) is None  # full attention
    win = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["a"], full), KVCacheGroupSpec(["w"], SlidingWindowSpec(
            block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32, sliding_window=32))])
    if h.API == "0.23.0":  # EAGLE beside a window: test_eagle_beside_windows_in_lockstep
        assert unsupported_reason(win, 16, 16, use_eagle=True) is None
    else:  # 0.32's coordinator looks a block past the lookup limit
        assert "EAGLE" in unsupported_reason(win, 16, 16, use_eagle=True)
    # vLLM drops no block in a chunked group; nor can kvshare drop in part of one window's
    # groups when vLLM's specs split them.
    chunked = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["a"], full), KVCacheGroupSpec(["c"], ChunkedLocalAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32,
            attention_chunk_size=64))])
    assert "chunked_local" in unsupported_reason(chunked, 16, 16, use_eagle=True)
    if h.API == "0.23.0":
        split = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["a"], full), win.kv_cache_groups[1],
            KVCacheGroupSpec(["d"], SlidingWindowSpec(
                block_size=16, num_kv_heads=2, head_size=4, dtype=torch.float32,
                sliding_window=32), is_eagle_group=True)])
        assert "part of the sliding-window groups" in unsupported_reason(split, 16, 16)
    assert "block sizes" in unsupported_reason(cfg, 32, 16)
    if h.API != "0.23.0":
        assert "MTP" in unsupported_reason(cfg, 16, 16, num_prefill_lookahead=2)


@pytest.mark.parametrize("seed", range(16))
def test_random_small_pools_in_lockstep(tiny_model_dir, seed):
    """Random small workloads on every layout (gpt-oss, Gemma 3, Llama 4, Mistral with short
    windows or chunks): 16 to 24 blocks, 2 to 4 running requests, a shared system prompt or
    none, chunked prefill on some, arrivals between steps and the odd abort.  Preemption,
    eviction and re-admission come often; kvshare's groups keep vLLM's free order, so the two
    managers stay in lockstep every step (``Pair.step``), however the schedule goes (a
    workload whose requests cannot all fit runs 300 steps, still compared)."""
    rng = random.Random(seed)
    model, size = [("gpt-oss", 32), ("gemma3", 64), ("llama4", 64), ("mistral", 32)][seed % 4]
    kw = dict(num_blocks=rng.randint(16, 24), max_num_seqs=rng.randint(2, 4),
              specs=h.layer_specs(model, size=size))
    if rng.random() < 0.4:
        kw["max_num_batched_tokens"] = rng.choice([16, 32, 48])
    pair = Pair(tiny_model_dir, **kw)
    assert type(pair.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    system = [rng.randrange(3, 30000) for _ in range(rng.randint(0, 40))]
    for i in range(rng.randint(2, 4)):
        own = [rng.randrange(3, 30000) for _ in range(rng.randint(3, 30))]
        pair.add(f"r{i}", (system if rng.random() < 0.7 else []) + own,
                 max_tokens=rng.randint(5, 40))
        for _ in range(rng.randint(0, 6)):
            pair.step()
            live = [r for r, q in pair.reqs_ref.items() if not q.is_finished()]
            if live and rng.random() < 0.03:
                pair.abort(rng.choice(live))
    for _ in range(300):
        if not pair.ref.has_unfinished_requests():
            break
        pair.step()
    assert pair.steps > 0


def test_pressure_with_duplicate_blocks_in_lockstep(tiny_model_dir):
    """Heavier pressure (48 blocks, 256-token chunks, six conversations computing the same
    system prompt at once): vLLM registers a block whose content is already cached a second
    time and keeps both copies (the copy is cached: freed to the LRU tail; evicting one copy
    leaves the other matchable). kvshare's groups keep duplicates the same way, so the two
    managers stay in lockstep every step (before the core kept duplicates, kvshare hit 16
    tokens fewer at step 158 here). Then the same workload on each manager alone: same tokens
    and statuses, and kvshare ends with nothing held."""
    from test_scheduler_compare import Single

    def workload(d):
        rng = random.Random(0)
        system = [rng.randrange(3, 30000) for _ in range(192)]
        conversations(d, num_convs=6, turns=2, system=system, seed=0, max_tokens=64,
                      user_len=(20, 30))

    kw = dict(specs=h.layer_specs("gpt-oss", size=64), num_blocks=48,
              max_num_batched_tokens=256, max_model_len=400)
    pair = Pair(tiny_model_dir, **kw)
    assert type(pair.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    workload(pair)
    assert pair.preemptions > 0
    ref, kvs = Single(tiny_model_dir, False, **kw), Single(tiny_model_dir, True, **kw)
    workload(ref)
    workload(kvs)
    for rid, r in ref.reqs.items():
        assert list(r.all_token_ids) == list(kvs.reqs[rid].all_token_ids), rid
        assert r.status == kvs.reqs[rid].status, rid
    st = kvs.s.kv_cache_manager.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0


@pytest.mark.skipif(h.API == "0.23.0", reason="vLLM 0.32's manager surface")
def test_newer_calls_match_vllm(tiny_model_dir):
    """vLLM 0.32's calls on a hybrid model (gpt-oss layout, window 32), both managers driven
    directly: the block ids covering computed tokens in every group, the cached-token estimate,
    a lookup cut short (``truncate_computed_blocks``) and the deferred free: the popped
    request's blocks held (usage, hits on them, a refused prefix-cache reset) until they come
    back through the block pool, last first."""
    seen = []
    for kvshare in (False, True):
        m = h.make_scheduler(tiny_model_dir, kvshare=kvshare, num_blocks=40,
                             specs=h.layer_specs("gpt-oss", size=32)).kv_cache_manager

        def admit(rid, prompt):
            return h.admit(m, rid, prompt, kvshare)

        def ids(blocks):
            return [[b.block_id for b in g] for g in blocks]

        prompt = list(range(100, 180))  # 5 pages per group
        a, _ = admit("a", prompt)
        log = [m.get_block_ids_for_computed_tokens("a", 40), m.estimate_cached_tokens(a)]
        x = h.make_request("x", prompt + [7], hash_blocks=not kvshare)
        blocks, hit = h.lookup(m, x)
        log += [hit, ids(blocks.blocks), ids(m.truncate_computed_blocks(blocks, 32).blocks)]
        popped = m.pop_blocks_for_free(a)
        log += [[b.block_id for b in popped], m.get_block_ids("a"), round(m.usage, 6),
                m.reset_prefix_cache()]  # refused: the popped blocks are still held
        b, hit = admit("b", prompt)
        log += [hit, round(m.usage, 6), m.reset_prefix_cache()]
        log.append(h.return_popped(m, popped, kvshare))
        m.free(b)
        log += [round(m.usage, 6), m.reset_prefix_cache()]
        if kvshare:
            m.check()
        seen.append(log)
    assert seen[0] == seen[1]
    assert seen[1][1] == 80 and seen[1][2] == 80 and len(seen[1][5]) == 10 and not seen[1][8]


@pytest.mark.skipif(h.API == "0.23.0", reason="vLLM 0.32's admission watermark")
def test_watermark_in_lockstep(tiny_model_dir):
    """vLLM 0.32's admission watermark (a tenth of the blocks kept free when a waiting or
    preempted request is admitted while others run) on a hybrid model under pressure: in
    lockstep with 0.32's manager every step, and the watermark changes the schedule."""
    plain = run_case(tiny_model_dir, "gpt-oss-w32-preempt")
    held = run_case(tiny_model_dir, "gpt-oss-w32-preempt", watermark=0.1)
    assert type(held.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    assert held.kvs.kv_cache_manager.watermark_blocks == 6
    assert (held.steps, held.preemptions) != (plain.steps, plain.preemptions)


class InFlightAborts(Pair):
    """A Pair on schedulers that defer block frees (vLLM 0.32 with a consuming KV connector and
    several batches in flight), whose aborts land while a step is in flight (between
    ``schedule`` and ``update_from_output``, as an asynchronous engine's do): an aborted
    request's blocks go back to the block pool (``pop_blocks_for_free``, then
    ``free_blocks``) once that step is processed.  Every step also compares every running
    request's block ids, group by group: they depend on the order freed blocks were queued."""

    def __init__(self, *args, overlap=False, **kw):
        super().__init__(*args, async_scheduling=overlap, **kw)
        self.overlap = overlap  # two batches in flight: popped blocks held across a schedule
        self.queued: list[str] = []
        self.pops = [0, 0]  # pop_blocks_for_free calls: vLLM's side, kvshare's
        for i, s in enumerate((self.ref, self.kvs)):
            s.defer_block_free = True
            m = s.kv_cache_manager
            m.pop_blocks_for_free = self._counted(m.pop_blocks_for_free, i)

    def _counted(self, pop, i):
        def counted(request):
            self.pops[i] += 1
            return pop(request)
        return counted

    def abort(self, rid):
        self.queued.append(rid)

    held_over = False  # kvshare's manager held popped blocks when a step was scheduled

    def in_flight(self, s):
        s.finish_requests(self.queued, RequestStatus.FINISHED_ABORTED)
        if s is self.kvs:
            self.queued = []

    def step(self):
        self.held_over |= bool(self.kvs.kv_cache_manager._popped)
        out = super().step()
        for r in self.ref.running:
            ids = [m.get_block_ids(r.request_id) for m in
                   (self.ref.kv_cache_manager, self.kvs.kv_cache_manager)]
            assert [list(g) for g in ids[0]] == [list(g) for g in ids[1]], \
                f"step {self.steps}: {r.request_id}'s block ids"
        return out

    def run_until_idle(self, limit=10_000):
        super().run_until_idle(limit)
        if self.overlap:  # the last batch in flight comes back
            self.step()


@pytest.mark.skipif(h.API == "0.23.0", reason="vLLM 0.32's deferred block frees")
@pytest.mark.parametrize("name,overlap", [("gpt-oss-w32-preempt", False),
                                          ("gpt-oss-w32-preempt", True),
                                          ("llama4-c64-preempt", False),
                                          ("gemma3-w64-preempt", True)])
def test_deferred_frees_in_lockstep(tiny_model_dir, name, overlap):
    """vLLM 0.32's deferred block frees on hybrid models under memory pressure, with an abort
    in flight every third step: both managers stay in lockstep every step, block ids
    included, which holds only if kvshare queues a popped request's freed pages as vLLM's
    block pool does (every group's blocks in one list, the last group's tail first, cached
    ones to the back, the others to the front, in one go).  With ``overlap`` two batches are
    in flight (an ``AsyncScheduler``, each step's output fed back after the next schedule):
    popped blocks stay held while the next step is scheduled (its hits, its room)."""
    model, size, pair_kw, work = CASES[name]
    pair = InFlightAborts(tiny_model_dir, specs=h.layer_specs(model, size=size), **pair_kw,
                          overlap=overlap)
    assert type(pair.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    rng = random.Random(zlib.crc32(name.encode()))
    work = dict(work)
    system = [rng.randrange(3, 30000) for _ in range(work.pop("system"))]
    conversations(pair, system=system, seed=rng.randrange(1 << 30), abort_every=3, **work)
    assert pair.pops[0] == pair.pops[1] > 0 and pair.preemptions > 0
    assert pair.held_over == overlap
    m = pair.kvs.kv_cache_manager
    st = m.kvshare_stats()
    assert not m._popped and st["num_seqs"] == 0 and st["device_pages_in_use"] == 0

