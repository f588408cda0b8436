"""vLLM's CPU engine on a linear-attention hybrid (a tiny Qwen3-Next: 3 gated-delta-net layers
per full-attention layer, random seeded weights), with vLLM's manager and with kvshare's.

vLLM's CPU build runs Qwen3-Next's GDN layers (its only CPU linear-attention kernels) in
``mamba_cache_mode`` "none" (prefix caching off) or "align" (prefix caching on: Qwen3-Next has
no "all" support).  In "none" the two engines must produce the same tokens and, every step,
schedule the same requests with the same blocks in use.  With prefix caching on ("align",
lockstep-tested in ``test_mamba_compare.py`` against vLLM's Scheduler) vLLM's CPU engine itself
fails here: ``mamba_utils.batch_memcpy`` launches a Triton kernel, and Triton has no CPU
driver."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import engine_e2e  # noqa: E402

WORKLOAD = dict(qwen3_next=True, prefix_caching=False, convs=4, turns=2, system_tokens=160,
                user_tokens=24, output_tokens=16, max_model_len=1024, extras=False, trace=True)


@pytest.fixture(scope="module")
def engine(installed):
    env = dict(os.environ, PYTHONPATH=installed, VLLM_HOST_IP="127.0.0.1")
    cache = {}

    def get(**cfg):
        key = tuple(sorted(cfg.items()))
        if key not in cache:
            cache[key] = engine_e2e.run_in_subprocess(dict(WORKLOAD, **cfg), env=env)
        return cache[key]

    return get


def _steps(res) -> list:
    def rid(r):
        return r.split("-")[0]
    return [([(rid(r), n) for r, n in sched], [rid(r) for r in pre], used)
            for sched, pre, used in res["trace"]]


def test_qwen3_next_same_tokens_and_schedule(engine):
    off, _ = engine(kvshare=False)
    on, log = engine(kvshare=True)
    assert off["kv_groups"] == on["kv_groups"] == 4  # a state group per GDN layer + full
    assert off["manager"] == "KVCacheManager"
    assert on["manager"] == "KvshareKVCacheManager", log[-3000:]
    assert on["tokens"] == off["tokens"]
    assert _steps(on) == _steps(off)
    # The random weights still make prompts matter: not every conversation says the same.
    assert len({tuple(off["tokens"][f"c{c}t0"]) for c in range(WORKLOAD["convs"])}) > 1

