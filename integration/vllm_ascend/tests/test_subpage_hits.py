"""Sub-page prefix hits (``KVSHARE_VLLM_MATCH_UNIT``) in vLLM's real Scheduler, on the copy
channel of the running release: on vLLM 0.23 kvshare's KV connector ships the partial copies in
its metadata (the worker runs them in ``start_load_kv``); on vLLM 0.32 they are vLLM's own block
copies (``SchedulerOutput.kv_cache_block_copies``), which its model runner executes before the
forward pass (whole blocks, in every layer: on a model of several groups each copy lands in one
group's page).

Model-based: ``harness.ShadowWorker`` keeps each page's KV as a label (the tokens it holds),
runs each step's copies, checks every scheduled request's computed tokens against its block
table and writes the new ones.  The workload ends hits inside blocks: prompts share prefixes of
any length, and conversations come back with their history (prompt + output) plus a new message,
under a small device cache.  A copy not executed, shipped late or pointing at the wrong page
breaks a check.  The configurations kvshare cannot serve are refused by name.
"""

from __future__ import annotations

import random

import pytest

from harness import API, ShadowWorker, connector_copies, make_request, make_scheduler, \
    shadow_run, shared_prefix_requests
from kvshare import lib

BS = 16
UNIT = 4
ENV = "KVSHARE_VLLM_MATCH_UNIT"
OWN_CONNECTOR = dict(kv_connector="KvshareConnector", kv_role="kv_both",
                     kv_connector_module_path="kvshare_vllm.connector")


def _scheduler(model_dir, monkeypatch, num_blocks: int, unit: int = UNIT, host_pages: int = 0,
               connector: bool = API == "0.23.0", specs: dict | None = None):
    monkeypatch.setenv(ENV, str(unit))
    kv_transfer = dict(OWN_CONNECTOR, kv_connector_extra_config={"num_host_pages": host_pages}) \
        if connector else None
    return make_scheduler(model_dir, kvshare=True, num_blocks=num_blocks, block_size=BS,
                          max_num_seqs=4, max_num_batched_tokens=64, max_model_len=2048,
                          kv_transfer=kv_transfer, specs=specs)


def _copies(out, num_groups: int = 1):
    """The step's copies as (src, dst, tokens, kind), from the running release's channel:
    kvshare's KV connector where it runs (always on 0.23), vLLM's block copies otherwise."""
    if API == "0.23.0" or out.kv_connector_metadata is not None:
        return connector_copies(out.kv_connector_metadata, num_groups)
    d2d = lib.KVS_COPY_KIND_DEVICE_TO_DEVICE
    return [(c.src_block_id, c.dst_block_id, BS, d2d)
            for c in out.kv_cache_block_copies or ()]


def _workload(rng):
    """Prompts on four shared prefixes of any length, and conversations returning with their
    history plus a new message (the units of their last, partly filled page are a hit)."""
    items = []
    requests = shared_prefix_requests(rng, 24, lambda: rng.randrange(20, 90),
                                      lambda: rng.randrange(1, 30), lambda: rng.randrange(1, 10))
    for i, r in enumerate(requests):
        items.append(r)
        if i % 3 == 2:  # the next turn of an earlier request
            base, k = f"r{i - 1}", i

            def turn(done, base=base, k=k):
                r = done.get(base)
                if r is None:
                    return None
                more = [rng.randrange(3, 30000) for _ in range(rng.randrange(1, 20))]
                return make_request(f"t{k}", list(r.all_token_ids) + more,
                                    max_tokens=rng.randrange(1, 10), hash_blocks=False)

            items.append(turn)
    return items


def _run(model_dir, monkeypatch, seed: int, apply_copies: bool = True, host_pages: int = 0,
         unit: int = UNIT, num_blocks: int = 24, model: str | None = None,
         connector: bool = API == "0.23.0"):
    """The workload under the shadow worker.  ``model``: a model of several groups
    (``harness.MODELS``: full attention beside windows or chunks of 32 tokens, kvshare's groups
    manager), every group's table checked where the group reads (``shadow.skipped``: one
    entry per group)."""
    import harness as h

    specs = h.layer_specs(model, size=32) if model else None
    s = _scheduler(model_dir, monkeypatch, num_blocks, unit=unit, host_pages=host_pages,
                   specs=specs, connector=connector)
    mgr = s.kv_cache_manager
    assert type(mgr).__name__ == "KvshareKVCacheManager"
    ng = mgr.num_kv_cache_groups
    skipped = [(lambda c, g=g: mgr._skipped(g, c)) for g in range(ng)] if model \
        else [lambda c: 0]
    rng = random.Random(seed)
    shadow = ShadowWorker(num_blocks, host_pages, BS, apply_copies, skipped)
    shadow_run(s, shadow, _workload(rng), rng, lambda out: _copies(out, ng))
    mgr.check()
    return mgr.kvshare_stats(), shadow, sum(shadow.hits.values())


@pytest.mark.parametrize("seed", range(4))
def test_partial_copies_reach_the_worker(tiny_model_dir, monkeypatch, seed):
    stats, shadow, _ = _run(tiny_model_dir, monkeypatch, seed)
    assert stats["unit_hits"] > 0 and stats["pending_copies"] == 0
    if API == "0.23.0":
        assert shadow.partial == stats["unit_hits"]


@pytest.mark.parametrize("seed", range(2))
def test_more_hits_than_whole_blocks(tiny_model_dir, monkeypatch, seed):
    """Without cache pressure a sub-page hit only adds to a whole-block one.  (Under pressure
    the two runs evict differently: a finished request's last, partly filled page stays cached
    for its units, where with whole blocks it is free.)"""
    stats, _, hits = _run(tiny_model_dir, monkeypatch, seed, num_blocks=400)
    _, _, whole = _run(tiny_model_dir, monkeypatch, seed, unit=0, num_blocks=400)
    assert hits == whole + stats["unit_hit_tokens"] and stats["unit_hit_tokens"] > 0


@pytest.mark.skipif(API != "0.23.0", reason="the host tier runs on vLLM 0.23 (its connector)")
@pytest.mark.parametrize("seed", range(2))
def test_partial_copies_beside_the_host_tier(tiny_model_dir, monkeypatch, seed):
    """Units copied from device or host pages, in one queue with demotions and promotions."""
    stats, shadow, _ = _run(tiny_model_dir, monkeypatch, seed, host_pages=64)
    assert stats["unit_hits"] > 0 and stats["demotions"] > 0
    assert shadow.promotions == stats["promotions"]


def test_skipped_copies_are_caught(tiny_model_dir, monkeypatch):
    """The checks can fail: the same run with the copies dropped."""
    with pytest.raises(AssertionError, match="does not hold tokens"):
        _run(tiny_model_dir, monkeypatch, 0, apply_copies=False)


def test_lookup_announces_the_units_and_allocation_takes_them(tiny_model_dir, monkeypatch):
    s = _scheduler(tiny_model_dir, monkeypatch, 24)
    mgr = s.kv_cache_manager
    prompt = list(range(100, 100 + 2 * BS + 10))
    rng = random.Random(0)
    shadow = ShadowWorker(24, 0, BS)
    shadow_run(s, shadow, [make_request("a", prompt, max_tokens=1, hash_blocks=False)], rng,
               _copies)
    # 2 blocks and 9 more tokens of "a" (10 prompt tokens, the last token's KV not computed):
    # a prompt sharing 2 blocks + 9 tokens hits 2 blocks + 2 units.
    b = make_request("b", prompt[:2 * BS + 9] + [7, 8, 9], max_tokens=1, hash_blocks=False)
    res = mgr.get_computed_blocks(b)
    assert res[1] == 2 * BS + 2 * UNIT and len(res[0].blocks[0]) == 2
    shadow_run(s, shadow, [b], rng, _copies)
    assert shadow.hits["b"] == 2 * BS + 2 * UNIT
    assert mgr.kvshare_stats()["unit_hit_tokens"] == 2 * UNIT


@pytest.mark.parametrize("value", ["5", "-4", "x", "32"])
def test_bad_unit_is_refused(tiny_model_dir, monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=ENV):
        make_scheduler(tiny_model_dir, kvshare=True, num_blocks=24, block_size=BS)


@pytest.mark.skipif(API != "0.23.0", reason="vLLM 0.32 runs the copies itself")
def test_needs_the_connector_on_0_23(tiny_model_dir, monkeypatch):
    with pytest.raises(ValueError, match="KvshareConnector"):
        _scheduler(tiny_model_dir, monkeypatch, 24, connector=False)


def test_whole_block_unit_is_whole_block_hits(tiny_model_dir, monkeypatch):
    """A unit of the block size is the default: whole-block hits, no connector needed."""
    s = _scheduler(tiny_model_dir, monkeypatch, 24, unit=BS, connector=False)
    assert s.kv_cache_manager.cache.stats()["unit_hits"] == 0
    assert s.kv_cache_manager._unit == 0


@pytest.mark.parametrize("model", ["gpt-oss", "llama4"])
@pytest.mark.parametrize("seed", range(2))
def test_groups_take_sub_page_hits(tiny_model_dir, monkeypatch, model, seed):
    """Sliding windows / chunked local attention beside full attention: each group's new page
    receives the units of its own cached page (copies of both groups in one queue); every
    group's table holds the tokens it reads; without pressure the units only add to the
    whole-block hits."""
    stats, shadow, hits = _run(tiny_model_dir, monkeypatch, seed, num_blocks=400, model=model)
    ng = len(shadow.skipped)
    assert ng > 1 and stats["unit_hits"] > 0 and stats["pending_copies"] == 0
    if API == "0.23.0":  # vLLM 0.32's block copies are whole blocks
        assert shadow.partial == ng * stats["unit_hits"]  # one copy per group
    _, _, whole = _run(tiny_model_dir, monkeypatch, seed, unit=0, num_blocks=400, model=model)
    assert hits == whole + stats["unit_hit_tokens"]


@pytest.mark.parametrize("seed", range(2))
def test_groups_take_sub_page_hits_under_pressure_and_beside_the_host_tier(
        tiny_model_dir, monkeypatch, seed):
    """Under pressure, with kvshare's connector and its host tier (on vLLM 0.32 too, where the
    connector then carries the partial copies with the host tier's, not vLLM's block copies)."""
    stats, _, _ = _run(tiny_model_dir, monkeypatch, seed, num_blocks=40, host_pages=48,
                       model="gpt-oss", connector=True)
    assert stats["unit_hits"] > 0 and stats["demotions"] > 0


def test_groups_skipped_copies_are_caught(tiny_model_dir, monkeypatch):
    with pytest.raises(AssertionError, match="does not hold tokens"):
        _run(tiny_model_dir, monkeypatch, 0, apply_copies=False, num_blocks=48, model="gpt-oss")


@pytest.mark.skipif(API != "0.23.0", reason="kvshare's connector runs on 0.23")
def test_pool_tier_state_groups_and_groups_without_the_connector_are_refused(tiny_model_dir,
                                                                           monkeypatch):
    monkeypatch.setenv(ENV, str(UNIT))
    pool = dict(OWN_CONNECTOR, kv_load_failure_policy="recompute",
                kv_connector_extra_config={"pool": {"master": "127.0.0.1:1"}})
    with pytest.raises(ValueError, match=f"{ENV}=4 with the pool tier"):
        make_scheduler(tiny_model_dir, kvshare=True, num_blocks=24, block_size=BS,
                       kv_transfer=pool)
    import harness as h

    # Several groups: on 0.23 the copies need kvshare's connector; a state page is whole or
    # nothing.
    with pytest.raises(ValueError, match=f"{ENV}=4: on vLLM 0.23.0 the partial copies"):
        make_scheduler(tiny_model_dir, kvshare=True, num_blocks=48, block_size=BS,
                       max_model_len=400, specs=h.layer_specs("gpt-oss", size=64))
    with pytest.raises(ValueError, match=f"{ENV}=4: sub-page hits with Mamba"):
        make_scheduler(tiny_model_dir, kvshare=True, num_blocks=200, block_size=BS,
                       max_model_len=2048, mamba_cache_mode="all",
                       specs=h.mamba_layer_specs("qwen3-next", "all", max_model_len=2048))
