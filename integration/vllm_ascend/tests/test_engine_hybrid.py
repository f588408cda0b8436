"""vLLM's CPU engine on a hybrid model (two KV-cache groups: sliding window + full attention),
with vLLM's hybrid manager and with kvshare's (``KvshareKVCacheManager``).

The tiny Llama of ``bench/engine_e2e.py`` with ``layer_types`` (Mistral / gpt-oss layout): even
layers attend to the last 64 tokens, odd layers to all.  vLLM builds a sliding-window group and a
full-attention group; its CPU attention backend computes the windowed layers.  kvshare's manager
must be invisible to the output: the same tokens, without and with cache pressure
(preemptions); without pressure also the same prefix hits and, every step, the same scheduled
requests and blocks in use (both managers release out-of-window blocks at the same steps).
Under pressure kvshare's host tier (its KV connector) keeps evicted blocks of both groups on the
host: the same tokens, less recomputation."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import engine_e2e  # noqa: E402
import harness  # noqa: E402

WINDOW = 64
WORKLOAD = dict(convs=4, turns=3, system_tokens=192, user_tokens=24, output_tokens=24,
                max_model_len=1024, sliding_window=WINDOW, extras=True, trace=True)
PRESSURE_BLOCKS = 24  # of 16 tokens per group (vLLM's budget is for both groups: 48 blocks)
HOST_PAGES = 256
# max_model_len: what 48 blocks hold for one request (vLLM 0.32 counts a window's blocks for
# the in-flight tokens too: 384 at most here).
PRESSURE = dict(kv_blocks=PRESSURE_BLOCKS, max_model_len=384, convs=6, turns=2,
                output_tokens=64, extras=False)

CONFIGS = {
    "off": dict(kvshare=False),
    "on": dict(kvshare=True),
    # Longer answers grow running requests past the free blocks (preemptions); max_model_len
    # within what 48 blocks hold for one request (vLLM checks it at start).
    "off_pressure": dict(kvshare=False, **PRESSURE),
    "on_pressure": dict(kvshare=True, **PRESSURE),
    "host_pressure": dict(kvshare=True, host_pages=HOST_PAGES, **PRESSURE),
}


@pytest.fixture(scope="module")
def engine(installed, tmp_path_factory):
    model = engine_e2e.write_tiny_model(str(tmp_path_factory.mktemp("tiny-hybrid")),
                                        sliding_window=WINDOW)
    return harness.engine_runs(installed, model, WORKLOAD, CONFIGS)


def _steps(res) -> list:
    """The engine's trace (per step: scheduled (request, tokens), preempted, blocks in use)
    with vLLM's request ids stripped of their random suffix (``<index>-<random>``)."""
    def rid(r):
        return r.split("-")[0]
    return [([(rid(r), n) for r, n in sched], [rid(r) for r in pre], used)
            for sched, pre, used in res["trace"]]


def test_hybrid_same_tokens_hits_and_blocks(engine):
    off, _ = engine("off")
    on, log = engine("on")
    assert off["kv_groups"] == on["kv_groups"] == 2
    assert off["manager"] == "KVCacheManager"
    assert on["manager"] == "KvshareKVCacheManager", log[-3000:]
    assert on["tokens"] == off["tokens"]
    assert on["cached"] == off["cached"]
    assert (on["prefix_queries"], on["prefix_hits"]) == (off["prefix_queries"],
                                                         off["prefix_hits"])
    # Every step: the same requests scheduled, the same preemptions, the same blocks in use.
    assert _steps(on) == _steps(off)
    # The workload shares and slides: hits on the system prompt and on the history, and
    # conversations longer than the window hold fewer blocks than their length needs.
    assert off["cached"]["c1t0"] >= 176 and off["cached"]["c0t2"] > off["cached"]["c0t1"]
    assert len({tuple(off["tokens"][f"c{c}t0"]) for c in range(WORKLOAD["convs"])}) > 1


def test_hybrid_under_pressure(engine):
    off, _ = engine("off_pressure")
    on, _ = engine("on_pressure")
    assert on["manager"] == "KvshareKVCacheManager"
    assert off["preemptions"] > 0 and on["preemptions"] > 0, "the workload must preempt"
    # The same tokens, and the same schedule every step: several conversations compute the
    # system prompt at once, vLLM keeps every copy of a block computed twice, and kvshare's
    # groups keep duplicates the same way (docs/vllm.md, "Duplicate blocks").
    assert on["tokens"] == off["tokens"]
    assert _steps(on) == _steps(off)


def test_hybrid_host_tier_more_hits_same_tokens(engine):
    """The hybrid model under the same pressure with kvshare's host tier: vLLM's tokens, pages
    demoted and promoted (every copy run by the worker), less recomputation than kvshare without
    it."""
    host, log = engine("host_pressure")
    on, _ = engine("on_pressure")
    off, _ = engine("off_pressure")
    assert host["manager"] == "KvshareKVCacheManager", log[-3000:]
    assert f"host tier of {HOST_PAGES} pages" in log
    assert host["tokens"] == off["tokens"]
    st = host["kvshare_stats"]
    assert st["demotions"] > 0 and st["promotions"] > 0 and st["host_hit_tokens"] > 0
    assert host["connector"]["copies"] == st["demotions"] + st["promotions"]
    assert on["kvshare_stats"]["demotions"] == on["kvshare_stats"]["promotions"] == 0
    # Less recomputed (vLLM's counters). Not "more hits": without the host tier this workload
    # preempts more, and every lookup of a request re-admitted, or waiting for room, counts its
    # hit again.
    assert host["prefix_queries"] - host["prefix_hits"] < on["prefix_queries"] - on["prefix_hits"]
