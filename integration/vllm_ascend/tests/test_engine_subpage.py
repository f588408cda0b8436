"""Sub-page prefix hits in the real vLLM CPU engine (0.23.0 or 0.32.0, whichever this venv
holds): 128-token blocks, Ascend's default, with ``KVSHARE_VLLM_MATCH_UNIT=16``.

Each configuration runs in its own process (``bench/engine_e2e.py``): greedy multi-turn chat
on a 200-token system prompt (not a whole number of blocks), each turn's prompt the
conversation's history plus a new message, then parallel sampling and salted prompts.  With
whole-block hits a turn finds only the history's full 128-token blocks; with the unit it also
finds the whole 16-token units of the block the history ends in, copied into the request's own
block (vLLM 0.23: by kvshare's KV connector, configured with no host pages; vLLM 0.32: by vLLM's
own block copies).  The tokens must be those of vLLM's own manager at the same block size; the
hits at least its hits, and (a turn coming back to a finished conversation) those of vLLM with
the CPU kernel's smallest block (16 on 0.23, 32 on 0.32).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import engine_e2e  # noqa: E402
import harness  # noqa: E402

from kvshare_vllm import compat  # noqa: E402

SUPPORT = compat.support()
SMALL = engine_e2e.kernel_block_size()
BLOCK, UNIT = 128, 16
WORKLOAD = dict(convs=4, turns=3, system_tokens=200, user_tokens=24, output_tokens=10,
                max_model_len=512, block_size=BLOCK)
CONFIGS = {
    "vllm": dict(kvshare=False),
    "unit": dict(kvshare=True, match_unit=UNIT),
    "vllm_small": dict(kvshare=False, block_size=SMALL),
    # kvshare's attention backend: on 0.23 its KV layout, where the connector's partial copies
    # run in kvs_kv_copy (vLLM's CPU layout: torch slices).
    "unit_ops": dict(kvshare=True, kvshare_attention=True, match_unit=UNIT),
}


@pytest.fixture(scope="module")
def engine(installed, tmp_path_factory):
    model = engine_e2e.write_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")))
    return harness.engine_runs(installed, model, WORKLOAD, CONFIGS,
                               user_env=("VLLM_LOGGING_LEVEL",))


def _turns(res, first: int = 0) -> dict:
    return {k: v for k, v in res["cached"].items()
            if k.startswith("c") and int(k.split("t")[1]) >= first}


def _beside_vllm(unit, vllm) -> None:
    """The unit's run against vLLM's at block 128: the same tokens, at least vLLM's hits for
    every request; every turn after the first comes back to a finished conversation and hits
    its computed history (the last turn's prompt and all but its last generated token) down to
    a whole unit, past the last whole block; tenants stay apart inside a page as across
    pages."""
    assert unit["tokens"] == vllm["tokens"]
    assert all(unit["cached"][r] >= vllm["cached"][r] for r in vllm["cached"]), \
        {r: (vllm["cached"][r], unit["cached"][r]) for r in vllm["cached"]}
    w = WORKLOAD
    for r, n in _turns(unit, 1).items():
        turn = int(r.split("t")[1])
        prompt = w["system_tokens"] + w["user_tokens"] + (turn - 1) * (
            w["output_tokens"] + w["user_tokens"])
        assert n == (prompt + w["output_tokens"] - 1) // UNIT * UNIT, (r, n)
    assert sum(unit["cached"].values()) > sum(vllm["cached"].values())
    assert unit["cached"]["salt_b"] == 0 and unit["cached"]["salt_a1"] == 0


def test_tokens_unchanged_and_more_hits_at_block_128(engine):
    vllm, _ = engine("vllm")
    unit, log = engine("unit")
    assert unit["manager"] == "KvshareKVCacheManager"
    st = unit["kvshare_stats"]
    assert st["unit_hits"] > 0
    _beside_vllm(unit, vllm)
    if compat.manager_api() == "0.23.0":
        assert unit["connector"]["copies"] == st["unit_hits"]


def test_unit_hits_match_small_blocks(engine):
    """A returning turn hits at least what vLLM hits with the kernel's smallest block."""
    small, _ = engine("vllm_small")
    unit, _ = engine("unit")
    for r, n in _turns(small, 1).items():
        assert unit["cached"][r] >= n, (r, unit["cached"][r], n)


@pytest.mark.skipif(not SUPPORT.attention, reason=SUPPORT.attention_missing or "")
def test_kvshare_attention_with_unit_hits(engine):
    ops, log = engine("unit_ops")
    assert ops["attention"] == "KvshareCPUAttentionBackend"
    unit, _ = engine("unit")
    assert ops["tokens"] == unit["tokens"]
    assert ops["cached"] == unit["cached"]


WINDOW = 64
HYBRID_CONFIGS = {
    "vllm": dict(kvshare=False),
    "unit": dict(kvshare=True, match_unit=UNIT),
}
if SUPPORT.block_copies:  # vLLM 0.32: also kvshare's connector (a host tier) carrying the copies
    HYBRID_CONFIGS["unit_host"] = dict(kvshare=True, match_unit=UNIT, host_pages=64)


@pytest.fixture(scope="module")
def hybrid_engine(installed, tmp_path_factory):
    """The tiny Llama with even layers sliding over the last 64 tokens (two KV-cache groups);
    on vLLM 0.32 with dense window retention on both managers (under 0.32's default, sparse,
    a turn's window pages past its prompt are not kept, so hits stop at the prompt on both)."""
    model = engine_e2e.write_tiny_model(str(tmp_path_factory.mktemp("tiny-hybrid")),
                                        sliding_window=WINDOW)
    work = dict(WORKLOAD, sliding_window=WINDOW)
    if SUPPORT.block_copies:
        work["retention"] = None
    return harness.engine_runs(installed, model, work, HYBRID_CONFIGS,
                               user_env=("VLLM_LOGGING_LEVEL",))


def test_hybrid_model_tokens_unchanged_and_more_hits_at_block_128(hybrid_engine):
    """Sliding window + full attention at 128-token blocks: every group's new block receives
    the units of its own cached block (kvshare's connector copies both groups' on vLLM 0.23,
    vLLM's block copies on 0.32), the tokens are vLLM's, and a turn coming back to a finished
    conversation hits its history down to a whole unit where vLLM hits whole blocks."""
    vllm, _ = hybrid_engine("vllm")
    unit, log = hybrid_engine("unit")
    assert vllm["kv_groups"] == unit["kv_groups"] == 2
    assert unit["manager"] == "KvshareKVCacheManager", log[-3000:]
    st = unit["kvshare_stats"]
    assert st["unit_hits"] > 0 and st["pending_copies"] == 0
    if not SUPPORT.block_copies:
        assert unit["connector"]["copies"] == 2 * st["unit_hits"]
    _beside_vllm(unit, vllm)


@pytest.mark.skipif(not SUPPORT.block_copies, reason="on vLLM 0.23 the hybrid test above runs "
                    "the copies in kvshare's connector already")
def test_hybrid_model_unit_hits_through_kvshares_connector(hybrid_engine):
    """vLLM 0.32 with kvshare's connector and a host tier: the connector, not vLLM's block
    copies, carries both groups' partial copies (beside the host tier's), with vLLM's tokens
    and the same hits as through vLLM's block copies."""
    vllm, _ = hybrid_engine("vllm")
    unit, _ = hybrid_engine("unit")
    host, log = hybrid_engine("unit_host")
    assert host["manager"] == "KvshareKVCacheManager", log[-3000:]
    st = host["kvshare_stats"]
    moved = st["demotions"] + st["promotions"]
    assert st["unit_hits"] > 0 and st["pending_copies"] == 0
    assert host["connector"]["copies"] == 2 * st["unit_hits"] + moved
    _beside_vllm(host, vllm)
    assert host["cached"] == unit["cached"]
