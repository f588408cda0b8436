"""Mamba / linear-attention hybrids through vLLM 0.23.0's Scheduler: vLLM's own
``HybridKVCacheCoordinator`` with its ``MambaManager`` groups against kvshare's manager, in
lockstep (``Pair.step``: same tokens scheduled, hits, per-group block counts and null-block
positions of every block table, blocks in use, preemptions, sampled tokens, every step).

The group layouts are vLLM's own (``harness.mamba_layer_specs`` per layer, grouped by vLLM's
``get_kv_cache_groups``): Qwen3-Next-like (3 gated-delta-net layers per full layer),
Nemotron-H-like (6 Mamba2 layers per attention layer), Jamba-like (1 attention layer in 8), each
under the ``mamba_cache_mode`` vLLM uses: "all" and "align" with prefix caching on (multi-turn
prompts resume from a cached state checkpoint), "none" with prefix caching off (one state
block per request, ``max_model_len`` tokens).

``test_mamba_workload_on_vllm`` runs each workload with vLLM's manager on both sides: it checks
that the workload does what the lockstep needs (checkpoint hits, released state blocks,
preemptions, the block-aligned prefill chunks of "align").

On vLLM 0.32 the cases in "none" run; "all" and "align" (0.32's sub-block hits, boundary-state
hand-offs and sparse checkpoints) are refused there, and vLLM's own manager takes the model
(``test_state_caching_modes_refused_on_newer_vllm``); "none" also with deferred block frees."""

from __future__ import annotations

import random
import zlib

import pytest

import harness as h
from test_scheduler_compare import Pair, conversations

# (model, mamba_cache_mode, Pair kwargs, workload kwargs)
CASES = {
    "qwen3-next-all": ("qwen3-next", "all", dict(num_blocks=2000),
                       dict(num_convs=6, turns=4, system=200, user_len=(5, 40), max_tokens=12)),
    "qwen3-next-align": ("qwen3-next", "align", dict(num_blocks=2000),
                         dict(num_convs=6, turns=4, system=200, user_len=(5, 40),
                              max_tokens=12)),
    "qwen3-next-none": ("qwen3-next", "none", dict(num_blocks=400, max_num_seqs=8),
                        dict(num_convs=6, turns=3, system=60, user_len=(5, 40), max_tokens=20)),
    "nemotron-h-all": ("nemotron-h", "all", dict(num_blocks=3000),
                       dict(num_convs=5, turns=3, system=150, user_len=(10, 60),
                            max_tokens=20)),
    "nemotron-h-align": ("nemotron-h", "align", dict(num_blocks=3000),
                         dict(num_convs=5, turns=3, system=150, user_len=(10, 60),
                              max_tokens=20)),
    "jamba-align": ("jamba", "align", dict(num_blocks=3000),
                    dict(num_convs=5, turns=3, system=90, user_len=(10, 60), max_tokens=20)),
    "jamba-none": ("jamba", "none", dict(num_blocks=400, max_num_seqs=8),
                   dict(num_convs=6, turns=3, system=60, user_len=(5, 40), max_tokens=20)),
    # Async scheduling (output placeholders: tokens scheduled before the last step's arrive).
    "qwen3-next-align-async": ("qwen3-next", "align", dict(num_blocks=2000,
                                                           async_scheduling=True),
                               dict(num_convs=4, turns=2, system=100, user_len=(5, 40),
                                    max_tokens=12)),
    "qwen3-next-all-async": ("qwen3-next", "all", dict(num_blocks=2000, async_scheduling=True),
                             dict(num_convs=4, turns=2, system=100, user_len=(5, 40),
                                  max_tokens=12)),
    # Chunked prefill (64-token budget): "align" cuts prefill chunks at block boundaries.
    "qwen3-next-align-chunked": ("qwen3-next", "align",
                                 dict(num_blocks=600, max_num_batched_tokens=64,
                                      max_num_seqs=4),
                                 dict(num_convs=5, turns=3, system=70, user_len=(20, 120),
                                      max_tokens=20)),
    "qwen3-next-all-chunked": ("qwen3-next", "all",
                               dict(num_blocks=600, max_num_batched_tokens=64, max_num_seqs=4),
                               dict(num_convs=5, turns=3, system=70, user_len=(20, 120),
                                    max_tokens=20)),
    # Memory pressure: preemptions, cached blocks evicted in vLLM's order.
    "qwen3-next-align-preempt": ("qwen3-next", "align", dict(num_blocks=120, max_num_seqs=8),
                                 dict(num_convs=8, turns=3, system=40, user_len=(5, 40),
                                      max_tokens=40)),
    "qwen3-next-all-preempt": ("qwen3-next", "all", dict(num_blocks=120, max_num_seqs=8),
                               dict(num_convs=8, turns=3, system=40, user_len=(5, 40),
                                    max_tokens=40)),
    "qwen3-next-none-preempt": ("qwen3-next", "none", dict(num_blocks=40, max_num_seqs=8),
                                dict(num_convs=8, turns=2, system=40, user_len=(5, 40),
                                     max_tokens=40)),
}


def run_case(model_dir, name: str, vllm_only: bool = False, pair_cls=Pair, abort_every=0,
             **extra) -> Pair:
    model, mode, pair_kw, work = CASES[name]
    pair_kw = dict(pair_kw)
    max_model_len = pair_kw.pop("max_model_len", 2048)
    pair = pair_cls(model_dir, vllm_only=vllm_only, mamba_cache_mode=mode,
                enable_prefix_caching=mode != "none", max_model_len=max_model_len,
                specs=h.mamba_layer_specs(model, mode, max_model_len=max_model_len),
                **pair_kw, **extra)
    work = dict(work)
    rng = random.Random(zlib.crc32(name.encode()))
    system = [rng.randrange(3, 30000) for _ in range(work.pop("system"))]
    conversations(pair, system=system, seed=rng.randrange(1 << 30), abort_every=abort_every,
                  **work)
    return pair


def _state_groups(s) -> list[int]:
    return [i for i, g in enumerate(s.kv_cache_config.kv_cache_groups)
            if type(g.kv_cache_spec).__name__ == "MambaSpec"]


def _runs_here(name: str) -> None:
    """Skips a case kvshare's manager refuses on the running vLLM (state caching on 0.32)."""
    if h.API != "0.23.0" and CASES[name][1] != "none":
        pytest.skip(f"mamba_cache_mode={CASES[name][1]!r} is refused on vLLM {h.API}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_mamba_workload_on_vllm(tiny_model_dir, name):
    """The workload on vLLM's manager (both sides): vLLM builds the expected groups, multi-turn
    prompts resume from cached state checkpoints (prefix caching on), the state groups hold
    null entries (released states / skipped positions), preemption where meant; deterministic."""
    _runs_here(name)
    model, mode = CASES[name][:2]
    pair = run_case(tiny_model_dir, name, vllm_only=True)
    assert type(pair.kvs.kv_cache_manager).__name__ == "KVCacheManager"
    groups = pair.ref.kv_cache_config.kv_cache_groups
    assert len(groups) == h.MAMBA_MODELS[model][3]
    assert len(_state_groups(pair.ref)) == len(groups) - 1
    if mode == "none":
        assert pair.hits[0] == 0
    else:
        assert pair.hits[0] > 0, "multi-turn prompts must resume from a checkpoint"
        assert pair.nulls > 0, "state groups hold the null block where no state is kept"
    if name.endswith("-preempt"):
        assert pair.preemptions > 0
    assert pair.hits[0] == pair.hits[1] and pair.peak_blocks[0] == pair.peak_blocks[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_mamba_lockstep(tiny_model_dir, name):
    """kvshare's manager against vLLM's on the same workload, every step (``Pair.step``)."""
    _runs_here(name)
    pair = run_case(tiny_model_dir, name)
    assert type(pair.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
    assert pair.hits[0] == pair.hits[1]
    assert pair.peak_blocks[0] == pair.peak_blocks[1]
    # Beside Mamba layers vLLM zeroes new attention blocks; Pair.step compared their ids.
    assert pair.zeroed > 0
    st = pair.kvs.kv_cache_manager.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0


@pytest.mark.skipif(h.API == "0.23.0", reason="vLLM 0.23.0 runs every mode")
@pytest.mark.parametrize("mode", ["all", "align"])
def test_state_caching_modes_refused_on_newer_vllm(tiny_model_dir, caplog, mode):
    """On vLLM 0.32 a state group that caches states is refused by name, and the scheduler
    keeps vLLM's own manager."""
    with caplog.at_level("WARNING"):
        s = h.make_scheduler(tiny_model_dir, kvshare=True, num_blocks=2000,
                             mamba_cache_mode=mode, enable_prefix_caching=True,
                             max_model_len=2048,
                             specs=h.mamba_layer_specs("qwen3-next", mode, max_model_len=2048))
    assert type(s.kv_cache_manager).__name__ == "KVCacheManager"
    assert f"mamba_cache_mode={mode!r} on vLLM 0.32" in caplog.text


@pytest.mark.skipif(h.API == "0.23.0", reason="vLLM 0.32's deferred block frees")
def test_deferred_frees_in_lockstep(tiny_model_dir):
    """Qwen3-Next-like under memory pressure ("none") on schedulers that defer block frees,
    an abort in flight every third step (``test_hybrid_compare.InFlightAborts``): both
    managers in lockstep every step, block ids included, and nothing held at the end.  With
    prefix caching off ("none") every freed block is uncached, so the free order is the same
    either way; this checks the popped requests' bookkeeping beside a state group."""
    from test_hybrid_compare import InFlightAborts

    pair = run_case(tiny_model_dir, "qwen3-next-none-preempt", pair_cls=InFlightAborts,
                    abort_every=3)
    assert pair.pops[0] == pair.pops[1] > 0 and pair.preemptions > 0
    st = pair.kvs.kv_cache_manager.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0

