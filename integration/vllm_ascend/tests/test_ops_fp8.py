"""kvshare_vllm.ops and the CPU attention backend on fp8 caches (vLLM's ``kv_cache_dtype`` fp8,
fp8_e4m3, fp8_e5m2: uint8 tensors with per-tensor ``k_scale`` / ``v_scale``): the write
quantizes to the nearest code, attention reads the stored values with the scales, against the
float64 reference of test_ops.py on those values; and what the backend refuses.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import kvshare
from kvshare_vllm import ops

from test_ops import caches, make_batch, ref_attention

FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def fp8_codes(x: torch.Tensor, scale: float, fmt: str) -> torch.Tensor:
    """The bytes kvshare's write stores for ``x`` with per-tensor ``scale``: ``x / scale`` in
    f32, rounded to nearest (ties to even, torch's conversion), saturated to the largest finite
    value."""
    t = FP8[fmt]
    big = torch.finfo(t).max
    return (x.float() / scale).clamp(-big, big).to(t).view(torch.uint8)


def fp8_values(codes: torch.Tensor, scale: float, fmt: str) -> torch.Tensor:
    """What fp8 ``codes`` stand for, in float64."""
    return codes.view(FP8[fmt]).double() * scale


def kernel_rounding(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, *,
                    scale):
    """float64 ``[num_tokens, num_heads, 1]``: how far the CPU backend's output row may be from
    the float64 attention over the stored values (docs/quantized-kv.md, "Accuracy", with exact
    stored values). The ``amx`` path's tiled prefill rounds the query and the probabilities to
    bf16, whose rounding errs by at most ``u = 2^-8`` relative: ``D = u s max_t sum_j |q_j|
    |k_tj|``, error ``(e^(2D) - 1 + u + 2^-14) max_t |v_t|``; the other paths, f32 arithmetic
    only (``2^-14 max_t |v_t|``). Which path a launch takes is the backend's choice, so the
    larger of the two is allowed (a decode row, whose query is not rounded, gets the f32
    one)."""
    nb, bs, hk, d = key_cache.shape
    h = query.shape[1]
    g = h // hk
    out = torch.zeros(int(query_start_loc[-1]), h, 1, dtype=torch.float64)
    for s_, L in enumerate(int(x) for x in seq_lens):
        a, b = int(query_start_loc[s_]), int(query_start_loc[s_ + 1])
        pages = [int(p) for p in block_table[s_][: math.ceil(L / bs)]]
        K = torch.cat([key_cache[p] for p in pages])[:L].double().repeat_interleave(g, dim=1)
        V = torch.cat([value_cache[p] for p in pages])[:L].double().repeat_interleave(g, dim=1)
        qk = torch.einsum("qhd,lhd->qhl", query[a:b].double().abs(), K.abs())
        dd = 2 ** -8 * scale * qk.amax(-1, keepdim=True) if b - a > 1 else 0 * qk[..., :1]
        vmax = V.abs().amax(dim=(0, 2)).view(1, h, 1)
        out[a:b] = (torch.expm1(2 * dd) + (2 ** -8 if b - a > 1 else 0) + 2 ** -14) * vmax
    return out


@pytest.mark.parametrize("fmt", sorted(FP8))
@pytest.mark.parametrize("qdtype", [torch.float32, torch.bfloat16], ids=str)
def test_fp8_cache_write_quantizes_and_attention_reads_the_stored_values(fmt, qdtype):
    """A uint8 cache pair holding ``fmt`` with per-tensor scales (vLLM's fp8 layout): the write
    stores exactly the rounded codes, and prefill + decode over ragged, shared-prefix pages match
    the float64 reference on the stored values (dequantized in the reference only); against
    the values before the write they stay within the format's bound (docs/quantized-kv.md)."""
    h, hk, d, bs, nb = 8, 2, 64, 16, 40
    g = torch.Generator().manual_seed(5)
    k_scale, v_scale = 0.05, 0.0125
    kc = torch.zeros(nb, bs, hk, d, dtype=torch.uint8)
    vc = torch.zeros_like(kc)
    caches_ = ops.KvCaches(kc, vc, fmt)
    assert caches_.quantized
    lens = [1, 17, 40, 71]
    table = make_batch(lens, num_blocks=nb, block_size=bs, share_prefix_pages=1, seed=4)
    # Channel amplitudes 0.05 to 8 (some codes subnormal, some large) in K; V of unit scale.
    amp = torch.logspace(math.log10(0.05), math.log10(8), d)
    full_k = torch.randn(nb * bs, hk, d, generator=g) * amp
    full_v = torch.randn(nb * bs, hk, d, generator=g)
    slots = torch.tensor([int(table[s][p // bs]) * bs + p % bs
                          for s, L in enumerate(lens) for p in range(L)], dtype=torch.int64)
    # Sequences 1..3 share their first page: write it once (sequence 1's tokens), skip the rest.
    seen, rows = set(), []
    for i, sl in enumerate(slots.tolist()):
        rows.append(i if sl not in seen else -1)
        seen.add(sl)
    keep = torch.tensor([r for r in rows if r >= 0])
    k_new, v_new = full_k[keep], full_v[keep]
    caches_.write(k_new.to(qdtype), v_new.to(qdtype), slots[keep], k_scale=k_scale,
                  v_scale=v_scale)
    flat_k, flat_v = kc.view(-1, hk, d), vc.view(-1, hk, d)
    assert torch.equal(flat_k[slots[keep]], fp8_codes(k_new.to(qdtype), k_scale, fmt))
    assert torch.equal(flat_v[slots[keep]], fp8_codes(v_new.to(qdtype), v_scale, fmt))
    kd = fp8_values(kc, k_scale, fmt).view(nb, bs, hk, d)
    vd = fp8_values(vc, v_scale, fmt).view(nb, bs, hk, d)
    for qlens in ([1, 1, 1, 1], [1, 5, 16, 30]):  # decode, then prefill after cached tokens
        starts = [0]
        for n in qlens:
            starts.append(starts[-1] + n)
        q = (torch.rand(starts[-1], h, d, generator=g) * 2 - 1).to(qdtype)
        out = torch.empty(starts[-1], h, d, dtype=qdtype)
        batch = ops.AttentionBatch(table, lens, torch.tensor(starts, dtype=torch.int32))
        caches_.attend(q, out, batch, scale=1 / math.sqrt(d), num_kv_heads=hk,
                       k_scale=k_scale, v_scale=v_scale)
        ref = ref_attention(q, kd, vd, table, lens, starts, scale=1 / math.sqrt(d))
        tol = kernel_rounding(q, kd, vd, table, lens, starts, scale=1 / math.sqrt(d))
        if qdtype == torch.bfloat16:  # the output's own rounding: half a bf16 step, 2^-8
            tol = tol + 2 ** -8 * ref.abs()
        err = (out.double() - ref).abs()
        assert (err <= tol + 1e-7).all(), (err - tol).max()
        # The same scales on the other side: a cache read with a wrong k_scale is far off.
        wrong = torch.empty_like(out)
        caches_.attend(q, wrong, batch, scale=1 / math.sqrt(d), num_kv_heads=hk,
                       k_scale=2 * k_scale, v_scale=v_scale)
        assert ((wrong.double() - ref).abs() > tol).any()
        assert (wrong.double() - ref).abs().max() > 5 * tol.max()


def test_fp8_cache_checks_format_dtype_and_scales():
    kc = torch.zeros(4, 16, 2, 32, dtype=torch.uint8)
    with pytest.raises(ops.OpsDtypeError, match="kv_format") as e:
        ops.KvCaches(kc, kc.clone())
    assert e.value.field == "key_cache"
    with pytest.raises(ops.OpsArgumentError) as e:
        ops.KvCaches(kc, kc.clone(), "int4")
    assert e.value.field == "kv_format"
    with pytest.raises(ops.OpsDtypeError) as e:
        ops.KvCaches(kc.half(), kc.half(), "fp8_e4m3")
    assert e.value.field == "key_cache"
    with pytest.raises(ops.OpsDtypeError):  # a float8 tensor of the other format
        ops.KvCaches(kc.view(torch.float8_e5m2), kc.view(torch.float8_e5m2), "fp8_e4m3")
    # A float8 tensor names its own format; an unquantized cache is not quantized.
    assert ops.KvCaches(kc.view(torch.float8_e5m2), kc.view(torch.float8_e5m2)).quantized
    assert not ops.KvCaches(kc.float(), kc.float()).quantized
    caches_ = ops.KvCaches(kc, kc.clone(), "fp8_e4m3")
    key = torch.ones(2, 2, 32)
    slots = torch.tensor([3, 4])
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(kvshare.AttnInvalidArgumentError, match="k_scale"):
            caches_.write(key, key, slots, k_scale=bad, v_scale=1.0)
    assert not kc.any()  # nothing written on a refused call
    with pytest.raises(ops.OpsArgumentError) as e:
        caches_.write(key, key, slots, k_scale=1.0, v_scale="1")
    assert e.value.field == "v_scale"


@pytest.mark.parametrize("kv_cache_dtype,fmt", [("fp8", "fp8_e4m3"), ("fp8_e4m3", "fp8_e4m3"),
                                                ("fp8_e5m2", "fp8_e5m2")])
def test_backend_takes_vllms_fp8_kv_cache_dtypes_with_the_layers_scales(kv_cache_dtype, fmt):
    """kvshare_vllm.cpu_attn's forward on vLLM's uint8 fp8 cache ``[2, blocks, block_size,
    kv_heads, head_dim]``: the layer's ``_k_scale_float``/``_v_scale_float`` reach the write and
    the kernel (read at every step), and the output is the float64 reference on the stored
    values."""
    cpu_attn = pytest.importorskip("kvshare_vllm.cpu_attn")
    assert kv_cache_dtype in cpu_attn.KvshareCPUAttentionBackend.supported_kv_cache_dtypes
    h, hk, d, bs, nb = 4, 2, 32, 16, 6
    impl = cpu_attn.KvshareCPUAttentionImpl(h, d, 0.2, hk, None, None, kv_cache_dtype)
    g = torch.Generator().manual_seed(9)
    kv = torch.zeros(2, nb, bs, hk, d, dtype=torch.uint8)
    table = torch.tensor([[3, 1]], dtype=torch.int32)
    n = 20
    slots = torch.tensor([int(table[0][p // bs]) * bs + p % bs for p in range(n)])
    meta = cpu_attn.KvshareCPUMetadata(
        num_actual_tokens=n, slot_mapping=slots,
        batch=ops.AttentionBatch(table, [n], torch.tensor([0, n], dtype=torch.int32)))
    q, k, v = (torch.randn(n, x, d, generator=g) for x in (h, hk, hk))
    k = k * 3
    for k_scale, v_scale in ((1.0, 1.0), (0.02, 0.005)):
        layer = SimpleNamespace(_k_scale_float=k_scale, _v_scale_float=v_scale)
        out = torch.empty(n, h * d)
        impl.forward(layer, q, k, v, kv, meta, out)
        assert torch.equal(kv[0].view(-1, hk, d)[slots], fp8_codes(k, k_scale, fmt))
        assert torch.equal(kv[1].view(-1, hk, d)[slots], fp8_codes(v, v_scale, fmt))
        kd, vd = fp8_values(kv[0], k_scale, fmt), fp8_values(kv[1], v_scale, fmt)
        ref = ref_attention(q, kd, vd, table, [n], [0, n], scale=0.2)
        tol = kernel_rounding(q, kd, vd, table, [n], [0, n], scale=0.2)
        err = (out.view(n, h, d).double() - ref).abs()
        assert (err <= tol + 1e-7).all(), (err - tol).max()


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_inc", "fp8_ds_mla", "int8_per_token_head",
                                            "fp8_per_token_head", "nvfp4", "bfloat16"])
def test_backend_refuses_kv_cache_dtypes_it_does_not_store(kv_cache_dtype):
    cpu_attn = pytest.importorskip("kvshare_vllm.cpu_attn")
    assert kv_cache_dtype not in cpu_attn.KvshareCPUAttentionBackend.supported_kv_cache_dtypes
    with pytest.raises(NotImplementedError, match=f"kv_cache_dtype '{kv_cache_dtype}'"):
        cpu_attn.KvshareCPUAttentionImpl(4, 32, 0.2, 2, None, None, kv_cache_dtype)
