"""fp8 KV caches in the real vLLM CPU engine: kvshare's attention backend against vLLM's own.

vLLM's CPU backend (0.23 and 0.32 alike) stores ``kv_cache_dtype`` ``fp8`` (= ``fp8_e4m3``) and
``fp8_e5m2`` caches on x86 with AVX-512 or AMX, per-tensor ``k_scale``/``v_scale``, block sizes
that are multiples of 32 for a float32 model (its ``vec`` kernel; ``vec16`` has no fp8). Each
run is one
process of ``bench/engine_e2e.py``'s ``scored`` workload on the tiny Llama (float32, 4 layers,
2 kv heads of 64): eight prompts sharing a 128-token system prompt, up to 368 tokens (chunked
prefill), each scored under teacher forcing (``prompt_logprobs``: every position, the same
context on both sides) and then generated greedily for 16 tokens. Every layer gets
``k_scale`` 0.05 and ``v_scale`` 0.025, as a checkpoint's scales would be set: about twice
what vLLM's ``calculate_kv_scales`` rule (``amax / 200`` for K, ``amax / 100`` for V) gives at
layer 0 (0.028 and 0.028), so K and V scales differ and values up to 22 (K) and 11 (V) are
stored unsaturated in E4M3. (``calculate_kv_scales`` itself takes the scales from the
profiling forward, whose attention output no backend writes: from layer 1 on they are not
reproducible from run to run.)

What is compared (kvshare's backend, ``KVSHARE_VLLM_OPS=1``, against vLLM's ``CPU_ATTN``, same
format and scales, and both against vLLM's run on a float32 cache): the teacher-forced logprobs
(largest and mean difference) and next-token argmax, and the greedy generations. The two
backends do not store the same bytes: kvshare's write rounds to nearest, vLLM's CPU write
truncates toward zero (checked below on vLLM's own op), so about half of the stored elements
differ by one fp8 step, and each side's logprobs move away from the float32-cache run by their
own rounding. The bound asserted (``within_bound``): kvshare's fp8 logprobs differ from vLLM's
by at most ``RATIO`` = 1.5 times what the format does to vLLM's run (two independent roundings
of about the same size differ by about sqrt(2) times one), and kvshare's are at least as close
to the float32-cache run as vLLM's (rounding to nearest errs by at most half of truncation's
step: E4M3 ``|x|/16`` against ``|x|/8``). A wrong scale in kvshare's attention read (K read
with V's scale and the reverse, the write right) fails it. Greedy generation is reported, not
asserted: this random-weight model's top two next tokens are often within the format's effect
of each other, so generations part within a few tokens even between vLLM's own fp8 and
float32-cache runs.

kvshare's manager on an fp8 cache runs on both vLLM releases (vLLM 0.32.0's CPU build stores
the same fp8 formats, with the same limits: its ``_get_attn_isa``): with vLLM's own attention
backend, a short multi-turn chat on a shared system prompt gives the tokens, prefix hits and
block count of vLLM's own manager on the same cache (kvshare's pages are vLLM's bytes, checked
when the manager is built). A ``kv_cache_dtype`` the manager cannot carry is refused at
start-up by name: on 0.32 the per-token-head modes, which vLLM's CPU build itself accepts (its
engine starts and generates with them).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import engine_e2e  # noqa: E402
import torch  # noqa: E402

from kvshare_vllm import compat  # noqa: E402

SUPPORT = compat.support()
NEEDS_ATTENTION = pytest.mark.skipif(not SUPPORT.attention, reason=SUPPORT.attention_missing)
FP8_CPU = torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()
NEEDS_FP8_CPU = pytest.mark.skipif(not FP8_CPU, reason="vLLM's CPU backend stores fp8 KV "
                                   "caches only on x86 with AVX-512 or AMX")

WORKLOAD = dict(scored=8, convs=1, turns=0, extras=False, system_tokens=128, output_tokens=16,
                max_model_len=512, block_size=32, kv_scales=[0.05, 0.025])
HOST_PAGES = 256
RETURN = dict(kvshare=True, kv_cache_dtype="fp8", scored=0, returns=2, convs=2, turns=0,
              system_tokens=256, user_tokens=24, output_tokens=10, kv_blocks=5)
# kvshare's manager with vLLM's attention backend against vLLM's manager: a short chat (three
# conversations, two turns, a 64-token shared system prompt), the layers' scales as above.
MANAGER = dict(scored=0, convs=3, turns=2, system_tokens=64, user_tokens=16, output_tokens=8,
               max_model_len=256)
CONFIGS = {
    "mgr_vllm_e4m3": dict(MANAGER, kvshare=False, kv_cache_dtype="fp8"),
    "mgr_kvs_e4m3": dict(MANAGER, kvshare=True, kv_cache_dtype="fp8"),
    "vllm_auto": dict(kvshare=False),
    "kvs_auto": dict(kvshare=True, kvshare_attention=True),
    "vllm_e4m3": dict(kvshare=False, kv_cache_dtype="fp8"),
    "kvs_e4m3": dict(kvshare=True, kvshare_attention=True, kv_cache_dtype="fp8"),
    "kvs_e4m3_swap": dict(kvshare=True, kvshare_attention=True, kv_cache_dtype="fp8",
                          kv_scale_fault="swap"),
    "vllm_e5m2": dict(kvshare=False, kv_cache_dtype="fp8_e5m2"),
    "kvs_e5m2": dict(kvshare=True, kvshare_attention=True, kv_cache_dtype="fp8_e5m2"),
    # Evict and return (engine_e2e's `returns`) on an fp8 cache of 20 blocks of 32 (kv_blocks
    # counts float32 blocks: 5 of them hold 20 fp8 blocks): a 280-token prompt, three unrelated
    # prompts of its size that push it out of the device cache, the prompt again; twice. Without
    # and with kvshare's KV connector's host tier, through kvshare's attention backend (its
    # [2, blocks, ...] layout, copied with kvs_kv_copy as fp8) and vLLM's (its interleaved
    # layout, copied whole blocks with torch).
    "kvs_e4m3_return": dict(RETURN, kvshare_attention=True),
    "kvs_e4m3_return_host": dict(RETURN, kvshare_attention=True, host_pages=HOST_PAGES),
    "vllm_e4m3_return": dict(RETURN),
    "vllm_e4m3_return_host": dict(RETURN, host_pages=HOST_PAGES),
}


@pytest.fixture(scope="module")
def engine(installed, tmp_path_factory):
    """Runs a configuration once (lazily) and returns its measurements."""
    model = engine_e2e.write_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")))
    env = dict(os.environ, PYTHONPATH=installed, VLLM_HOST_IP="127.0.0.1")
    cache = {}

    def get(name):
        if name not in cache:
            cfg = dict(WORKLOAD, model_dir=model, **CONFIGS[name])
            cache[name] = engine_e2e.run_in_subprocess(cfg, env=env)[0]
        return cache[name]

    return get


def compare(a: dict, b: dict) -> dict:
    """Token agreement and logprob differences of two scored runs: ``top1`` the fraction of
    prompt positions whose most likely next token is the same (teacher forced), ``agree`` the
    fraction of generated tokens before each request's first divergence, ``same`` the requests
    generating identical tokens, ``max``/``mean`` the largest and mean |difference| of the
    teacher-forced prompt logprobs, ``gen_max`` that of the generated tokens' logprobs before
    the first divergence."""
    agree = total = same = 0
    gen = []
    for name, ta in a["tokens"].items():
        tb = b["tokens"][name]
        n = 0
        while n < len(ta) and n < len(tb) and ta[n] == tb[n]:
            n += 1
        agree, total, same = agree + n, total + len(ta), same + (ta == tb)
        gen += [abs(x - y) for x, y in zip(a["gen_logprobs"][name][:n],
                                           b["gen_logprobs"][name][:n])]
    d = [abs(x - y) for name, la in a["prompt_logprobs"].items()
         for x, y in zip(la, b["prompt_logprobs"][name], strict=True)]
    top = [x == y for name, ta in a["prompt_top"].items()
           for x, y in zip(ta, b["prompt_top"][name], strict=True)]
    return dict(top1=sum(top) / len(top), agree=agree / total, same=same,
                requests=len(a["tokens"]), max=max(d), mean=sum(d) / len(d), positions=len(d),
                gen_max=max(gen, default=0.0))


def _line(what: str, c: dict) -> str:
    return (f"{what}: next-token argmax {c['top1']:.3f} agree over {c['positions']} "
            f"teacher-forced positions, logprob |diff| max {c['max']:.4g} mean "
            f"{c['mean']:.4g}; greedy generation {c['agree']:.3f} agree ({c['same']}/"
            f"{c['requests']} requests identical), logprob |diff| max {c['gen_max']:.4g}")


# kvshare's fp8 logprobs may differ from vLLM's by at most this many times vLLM's own fp8 run
# differs from its float32-cache run (largest and mean difference; module doc).
RATIO = 1.5


def within_bound(kvs: dict, ref: dict, auto: dict) -> bool:
    """The asserted bound (module doc): kvshare's fp8 run against vLLM's differs by at most
    ``RATIO`` times what the format does to vLLM's run (two independent roundings of about
    the same size differ by about sqrt(2) times one), and kvshare's is at least as close to the
    float32-cache run as vLLM's (rounding to nearest errs by at most half truncation's step)."""
    both, ref_auto, kvs_auto = compare(kvs, ref), compare(ref, auto), compare(kvs, auto)
    return (both["max"] <= RATIO * ref_auto["max"] and both["mean"] <= RATIO * ref_auto["mean"]
            and kvs_auto["mean"] <= ref_auto["mean"])


def _check(engine, fmt: str, capsys) -> None:
    auto, ref, kvs = engine("vllm_auto"), engine(f"vllm_{fmt}"), engine(f"kvs_{fmt}")
    assert ref["attention"] == "CPUAttentionBackend"
    assert kvs["attention"] == "KvshareCPUAttentionBackend"
    assert kvs["kv_scales"] == ref["kv_scales"] == [[0.05, 0.025]] * 4
    both, ref_auto = compare(kvs, ref), compare(ref, auto)
    with capsys.disabled():
        print(f"\n{fmt}: " + _line("kvshare fp8 vs vLLM fp8", both))
        print(f"{fmt}: " + _line("vLLM fp8 vs vLLM float32 cache", ref_auto))
        print(f"{fmt}: " + _line("kvshare fp8 vs vLLM float32 cache", compare(kvs, auto)))
    assert within_bound(kvs, ref, auto)


@NEEDS_FP8_CPU
def test_fp8_cache_kvshare_manager_same_tokens_as_vllms(engine):
    """kvshare's manager on an fp8 cache (``kv_cache_dtype`` fp8, vLLM's attention backend):
    the tokens, prefix hits and KV blocks of vLLM's own manager on the same cache."""
    ref, kvs = engine("mgr_vllm_e4m3"), engine("mgr_kvs_e4m3")
    assert (ref["manager"], kvs["manager"]) == ("KVCacheManager", "KvshareKVCacheManager")
    assert ref["attention"] == kvs["attention"] == "CPUAttentionBackend"
    assert kvs["kv_scales"] == ref["kv_scales"] == [[0.05, 0.025]] * 4
    assert kvs["kv_blocks_total"] == ref["kv_blocks_total"]
    assert kvs["tokens"] == ref["tokens"]
    assert kvs["cached"] == ref["cached"]
    assert (kvs["prefix_queries"], kvs["prefix_hits"]) == (ref["prefix_queries"],
                                                           ref["prefix_hits"])
    # The chat does share: the second turn hits its history.
    assert ref["cached"]["c0t1"] >= MANAGER["system_tokens"]


@pytest.mark.skipif(compat.manager_api() != "0.32.0",
                    reason="vLLM 0.23 has no per-token-head kv_cache_dtype")
@pytest.mark.skipif(not FP8_CPU, reason="vLLM's CPU backend refuses every quantized KV cache on "
                    "x86 without AVX-512 or AMX, before kvshare's manager is built")
@pytest.mark.parametrize("kv_cache_dtype", ["int8_per_token_head", "fp8_per_token_head"])
def test_manager_refuses_a_cache_dtype_it_cannot_carry_by_name(installed, tmp_path,
                                                              kv_cache_dtype):
    """vLLM 0.32's per-token-head caches keep their scales inside the page, which kvshare's
    manager does not size: the engine does not start, and the error names the value."""
    model = engine_e2e.write_tiny_model(str(tmp_path / "tiny-llama"))
    env = dict(os.environ, PYTHONPATH=installed, VLLM_HOST_IP="127.0.0.1")
    cfg = {**WORKLOAD, **MANAGER, "model_dir": model, "kvshare": True,
           "kv_cache_dtype": kv_cache_dtype, "kv_scales": None, "convs": 1, "turns": 1}
    with pytest.raises(RuntimeError) as err:
        engine_e2e.run_in_subprocess(cfg, env=env)
    assert (f"kvshare_vllm: kv_cache_dtype {kv_cache_dtype!r} (kvshare's manager carries auto, "
            "float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2)") in str(err.value)


@NEEDS_ATTENTION
@NEEDS_FP8_CPU
def test_fp8_e4m3_kvshare_attention_agrees_with_vllms(engine, capsys):
    _check(engine, "e4m3", capsys)


@NEEDS_ATTENTION
@NEEDS_FP8_CPU
def test_fp8_e5m2_kvshare_attention_agrees_with_vllms(engine, capsys):
    _check(engine, "e5m2", capsys)


@NEEDS_ATTENTION
def test_float32_cache_kvshare_matches_vllm(engine, capsys):
    """The same workload on float32 caches: the two backends' kernels agree to float32
    rounding, so what the fp8 runs differ by comes from the stored bytes."""
    kvs, ref = engine("kvs_auto"), engine("vllm_auto")
    c = compare(kvs, ref)
    with capsys.disabled():
        print("\nfloat32 cache: " + _line("kvshare vs vLLM", c))
    assert c["max"] <= 1e-4 and c["same"] == c["requests"]


@NEEDS_ATTENTION
@NEEDS_FP8_CPU
def test_a_wrong_scale_fails_the_bound(engine, capsys):
    """K read with V's scale and V with K's (the write right): outside the bound."""
    ref, auto, bad = engine("vllm_e4m3"), engine("vllm_auto"), engine("kvs_e4m3_swap")
    with capsys.disabled():
        print("\ne4m3: " + _line("kvshare with swapped scales vs vLLM fp8", compare(bad, ref)))
    assert not within_bound(bad, ref, auto)


@NEEDS_FP8_CPU
def test_vllms_cpu_fp8_write_truncates():
    """vLLM's own CPU ``reshape_and_cache`` (0.23 and 0.32) stores ``x / scale`` rounded toward
    zero, where kvshare's write rounds to nearest: checked on the multiset of stored codes (vLLM
    packs a block's K in its kernel's own order)."""
    from vllm import _custom_ops as vops

    g = torch.Generator().manual_seed(3)
    t, h, d, bs = 64, 2, 64, 32
    for kv_dtype, fp8 in (("fp8", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        key, value = torch.randn(t, h, d, generator=g), torch.randn(t, h, d, generator=g)
        cache = torch.zeros(t // bs, h, 2 * bs, d, dtype=torch.uint8)
        kc, vc = cache.chunk(2, dim=2)
        vops.cpu_attn_reshape_and_cache(key, value, kc, vc, torch.arange(t), "vec",
                                        k_scale=0.5, v_scale=0.25, kv_cache_dtype=kv_dtype)
        for stored, x in ((kc, key / 0.5), (vc, value / 0.25)):
            nearest = x.to(fp8)
            toward_zero = nearest.view(torch.uint8).clone()
            toward_zero[nearest.float().abs() > x.abs()] -= 1  # one code down in magnitude
            got = stored.reshape(-1).sort().values
            assert torch.equal(got, toward_zero.reshape(-1).sort().values)
            assert not torch.equal(got, nearest.view(torch.uint8).reshape(-1).sort().values)


@NEEDS_ATTENTION
@NEEDS_FP8_CPU
def test_fp8_cache_host_tier_hits_same_tokens(engine):
    """kvshare's KV connector on an fp8 cache: each returning prompt's prefix is hit from the
    host tier (nothing of it without one), every queued copy ran, and the tokens are those of
    the run of the same attention backend that recomputed it, on both backends' layouts."""
    for backend in ("kvs", "vllm"):
        name = f"{backend}_e4m3_return_host"
        host, plain = engine(name), engine(f"{backend}_e4m3_return")
        assert host["attention"] == plain["attention"] == \
            {"kvs": "KvshareCPUAttentionBackend", "vllm": "CPUAttentionBackend"}[backend]
        st = host["kvshare_stats"]
        assert st["demotions"] > 0 and st["promotions"] > 0 and st["host_hit_tokens"] > 0
        assert host["connector"]["copies"] == st["demotions"] + st["promotions"]
        for r in range(RETURN["returns"]):
            assert plain["cached"][f"ret{r}b"] == 0, plain["cached"]
            assert host["cached"][f"ret{r}b"] >= RETURN["system_tokens"], host["cached"]
        assert host["tokens"] == plain["tokens"], name
