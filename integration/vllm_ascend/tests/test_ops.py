"""kvshare_vllm.ops on CPU tensors against a plain torch reference.

The reference gathers each sequence's K/V through its block table, in float64, and applies
softmax attention with the causal positions of paged attention (query token j of a sequence of
length L with q query tokens sits at L - q + j); an end-to-end test also checks against
torch's scaled_dot_product_attention on contiguous K/V. The NPU path is not exercised (no NPU).
"""

from __future__ import annotations

import math
import os
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import kvshare
from kvshare_vllm import ops

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ATOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.5e-2}


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------

def ref_attention(query, key_cache, value_cache, block_table, seq_lens, query_start_loc=None, *,
                  scale, softcap=0.0, sliding_window=0):
    """float64 [num_tokens, num_heads, head_dim]."""
    nb, bs, hk, d = key_cache.shape
    h = query.shape[1]
    g = h // hk
    lens = [int(x) for x in seq_lens]
    starts = list(range(len(lens) + 1)) if query_start_loc is None else \
        [int(x) for x in query_start_loc]
    out = torch.zeros(starts[-1], h, d, dtype=torch.float64)
    for s, L in enumerate(lens):
        a, b = starts[s], starts[s + 1]
        if b == a:
            continue
        pages = [int(p) for p in block_table[s][: math.ceil(L / bs)]]
        K = torch.cat([key_cache[p] for p in pages])[:L].double().repeat_interleave(g, dim=1)
        V = torch.cat([value_cache[p] for p in pages])[:L].double().repeat_interleave(g, dim=1)
        q = query[a:b].double()
        sc = torch.einsum("qhd,lhd->hql", q, K) * scale
        if softcap:
            sc = softcap * torch.tanh(sc / softcap)
        qpos = torch.arange(L - (b - a), L).view(-1, 1)
        kpos = torch.arange(L).view(1, -1)
        mask = kpos <= qpos
        if sliding_window:
            mask &= kpos > qpos - sliding_window
        sc = sc.masked_fill(~mask, float("-inf"))
        out[a:b] = torch.einsum("hql,lhd->qhd", sc.softmax(-1), V)
    return out


def make_batch(lens, *, num_blocks, block_size, share_prefix_pages=0, seed=0, max_blocks=None):
    """Block table with shuffled page ids; the first ``share_prefix_pages`` pages of every
    sequence are the same pages (a shared prefix)."""
    rng = random.Random(seed)
    free = list(range(1, num_blocks))  # page 0 stays unused (vLLM's null block)
    rng.shuffle(free)
    shared = [free.pop() for _ in range(share_prefix_pages)]
    need = [math.ceil(L / block_size) for L in lens]
    width = max_blocks or max(need)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    for s, n in enumerate(need):
        own = [free.pop() for _ in range(n - min(n, len(shared)))]
        row = shared[: min(n, len(shared))] + own
        table[s, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return table


def caches(num_blocks, block_size, hk, d, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, block_size, hk, d, generator=g).to(dtype)
    v = torch.randn(num_blocks, block_size, hk, d, generator=g).to(dtype)
    return k, v


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("h,hk", [(4, 4), (8, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
def test_decode_matches_reference(dtype, h, hk):
    d, bs, nb = 32, 16, 64
    lens = [1, 16, 17, 45, 100, 33]
    bt = make_batch(lens, num_blocks=nb, block_size=bs, share_prefix_pages=1, seed=3,
                    max_blocks=8)
    # sequences 2..5 share their first page; 1 shares it too (16 tokens = exactly that page)
    kc, vc = caches(nb, bs, hk, d, dtype)
    q = torch.randn(len(lens), h, d).to(dtype)
    out = torch.full_like(q, float("nan"))
    scale = 1 / math.sqrt(d)
    r = ops.paged_attention(q, kc, vc, bt, torch.tensor(lens), out, scale=scale, num_kv_heads=hk)
    assert r is out
    ref = ref_attention(q, kc, vc, bt, lens, scale=scale)
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_and_chunked_prefill_match_reference(dtype):
    h, hk, d, bs, nb = 8, 2, 64, 8, 96
    # (context length, query length): full prefill, chunked prefill, decode, prefix hit
    seqs = [(37, 37), (50, 10), (20, 1), (64, 5), (9, 9)]
    lens = [L for L, _ in seqs]
    qsl = [0]
    for _, q in seqs:
        qsl.append(qsl[-1] + q)
    bt = make_batch(lens, num_blocks=nb, block_size=bs, share_prefix_pages=2, seed=5)
    kc, vc = caches(nb, bs, hk, d, dtype, seed=7)
    q = torch.randn(qsl[-1], h, d).to(dtype)
    out = torch.empty_like(q)
    ops.paged_attention(q, kc, vc, bt, lens, out, scale=0.1, num_kv_heads=hk,
                        query_start_loc=torch.tensor(qsl))
    ref = ref_attention(q, kc, vc, bt, lens, qsl, scale=0.1)
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=0)


def test_softcap_and_sliding_window():
    h, hk, d, bs, nb = 4, 2, 16, 4, 40
    lens, qsl = [30, 12], [0, 6, 7]
    bt = make_batch(lens, num_blocks=nb, block_size=bs, seed=9)
    kc, vc = caches(nb, bs, hk, d, torch.float32, seed=2)
    q = torch.randn(7, h, d) * 3
    out = torch.empty_like(q)
    ops.paged_attention(q, kc, vc, bt, lens, out, scale=0.5, num_kv_heads=hk,
                        query_start_loc=qsl, softcap=5.0, sliding_window=7)
    ref = ref_attention(q, kc, vc, bt, lens, qsl, scale=0.5, softcap=5.0, sliding_window=7)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=0)


def test_strided_views_padding_rows_and_int64_block_table():
    """query as a view of a fused qkv tensor, 2-D output, a heads-major cache passed as a
    transposed view, an int64 block table with extra rows, padded query rows left alone."""
    h, hk, d, bs, nb = 4, 2, 16, 8, 32
    lens = [9, 30, 1]
    bt = make_batch(lens, num_blocks=nb, block_size=bs, seed=4, max_blocks=6)
    bt64 = torch.cat([bt, torch.zeros(2, 6, dtype=torch.int32)]).to(torch.int64)
    kc_hnd = torch.randn(nb, hk, bs, d)  # CANN's BnNBsD / vLLM's HND
    vc_hnd = torch.randn(nb, hk, bs, d)
    kc, vc = kc_hnd.transpose(1, 2), vc_hnd.transpose(1, 2)
    qkv = torch.randn(5, (h + 2 * hk) * d)  # 2 padding rows
    q = qkv[:, : h * d].view(5, h, d)
    out = torch.full((5, h * d), 7.0)
    ops.paged_attention(q, kc, vc, bt64, lens, out, scale=0.25, num_kv_heads=hk)
    ref = ref_attention(q[:3], kc.contiguous(), vc.contiguous(), bt, lens, scale=0.25)
    torch.testing.assert_close(out[:3].view(3, h, d).double(), ref, atol=2e-5, rtol=0)
    assert torch.all(out[3:] == 7.0)


def test_mixed_dtypes_query_and_output():
    h, hk, d, bs, nb = 4, 1, 16, 4, 16
    lens = [7, 13]
    bt = make_batch(lens, num_blocks=nb, block_size=bs, seed=1)
    kc, vc = caches(nb, bs, hk, d, torch.bfloat16)
    q = torch.randn(2, h, d, dtype=torch.float16)
    out = torch.empty(2, h, d, dtype=torch.float32)
    ops.paged_attention(q, kc, vc, bt, lens, out, scale=0.25, num_kv_heads=hk)
    ref = ref_attention(q, kc, vc, bt, lens, scale=0.25)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# KV write, end to end
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reshape_and_cache_with_padding_slots(dtype, slot_dtype):
    hk, d, bs, nb = 2, 16, 4, 10
    kc = torch.zeros(nb, bs, hk, d, dtype=dtype)
    vc = torch.zeros(nb, bs, hk, d, dtype=dtype)
    # a fused projection: key/value are strided views sharing one token stride
    kv = torch.randn(6, 2 * hk * d + 8)
    key = kv[:, : hk * d].view(6, hk, d)
    value = kv[:, hk * d: 2 * hk * d].view(6, hk, d)
    slots = torch.tensor([13, -1, 0, 39, -1, 22], dtype=slot_dtype)
    ops.reshape_and_cache(key, value, kc, vc, slots)
    ek = torch.zeros_like(kc)
    ev = torch.zeros_like(vc)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            ek[s // bs, s % bs] = key[i].to(dtype)
            ev[s // bs, s % bs] = value[i].to(dtype)
    assert torch.equal(kc, ek) and torch.equal(vc, ev)
    # fewer slots than key rows: only slot_mapping.numel() tokens are written (vLLM's rule)
    ops.reshape_and_cache(key, value, kc, vc, slots[:1] * 0 + 5)
    assert torch.equal(kc[1, 1], key[0].to(dtype)) and torch.equal(kc[3], ek[3])
    ops.reshape_and_cache(key, value, kc, vc, torch.empty(0, dtype=slot_dtype))  # no-op


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_write_then_attend_matches_sdpa(dtype):
    """Two requests sharing a prefix: prefill (with a cached prefix), then decode steps, all
    through reshape_and_cache + paged_attention, against SDPA on contiguous K/V."""
    h, hk, d, bs, nb = 8, 2, 32, 4, 64
    g = torch.Generator().manual_seed(11)
    prefix, tails = 12, [5, 9]  # prefix = 3 full shared pages
    kc = torch.zeros(nb, bs, hk, d, dtype=dtype)
    vc = torch.zeros_like(kc)
    free = list(range(1, nb))
    random.Random(2).shuffle(free)
    shared = [free.pop() for _ in range(prefix // bs)]
    pk = torch.randn(prefix, hk, d, generator=g)
    pv = torch.randn(prefix, hk, d, generator=g)
    slots = torch.tensor([shared[i // bs] * bs + i % bs for i in range(prefix)])
    ops.reshape_and_cache(pk, pv, kc, vc, slots)
    tables = [list(shared), list(shared)]
    full_k = [pk.clone(), pk.clone()]
    full_v = [pv.clone(), pv.clone()]

    def slot_of(s, pos):
        while len(tables[s]) * bs <= pos:
            tables[s].append(free.pop())
        return tables[s][pos // bs] * bs + pos % bs

    def step(qlens):
        lens = [full_k[s].shape[0] + qlens[s] for s in range(2)]
        ks = [torch.randn(qlens[s], hk, d, generator=g) for s in range(2)]
        vs = [torch.randn(qlens[s], hk, d, generator=g) for s in range(2)]
        slots = torch.tensor([slot_of(s, lens[s] - qlens[s] + i)
                              for s in range(2) for i in range(qlens[s])], dtype=torch.int32)
        ops.reshape_and_cache(torch.cat(ks), torch.cat(vs), kc, vc, slots)
        for s in range(2):
            full_k[s] = torch.cat([full_k[s], ks[s]])
            full_v[s] = torch.cat([full_v[s], vs[s]])
        q = torch.randn(sum(qlens), h, d, generator=g).to(dtype)
        out = torch.empty_like(q)
        width = max(len(t) for t in tables)
        bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        qsl = None if qlens == [1, 1] else [0, qlens[0], qlens[0] + qlens[1]]
        ops.paged_attention(q, kc, vc, bt, lens, out, scale=1 / math.sqrt(d), num_kv_heads=hk,
                            query_start_loc=qsl)
        a = 0
        for s in range(2):
            qs = q[a: a + qlens[s]].double().transpose(0, 1)  # [h, q, d]
            K = full_k[s].to(dtype).double().transpose(0, 1)
            V = full_v[s].to(dtype).double().transpose(0, 1)
            L, n = K.shape[1], qlens[s]
            mask = torch.arange(L).view(1, -1) <= torch.arange(L - n, L).view(-1, 1)
            ref = F.scaled_dot_product_attention(qs, K, V, attn_mask=mask, enable_gqa=True)
            torch.testing.assert_close(out[a: a + n].double(), ref.transpose(0, 1),
                                       atol=ATOL[dtype], rtol=0)
            a += n

    step(tails)   # prefill of each tail after the cached prefix
    for _ in range(5):
        step([1, 1])  # decode, crossing page boundaries


def test_kept_caches_and_one_batch_per_step_match_the_per_call_ops():
    """What kvshare's CPU attention backend does: each layer keeps its KvCaches across steps,
    each step's AttentionBatch is built once and serves every layer; the results are those of
    the per-call ops, bit for bit, and the reference's."""
    h, hk, d, bs, nb = 8, 2, 32, 4, 64
    g = torch.Generator().manual_seed(21)
    layers = [caches(nb, bs, hk, d, torch.bfloat16, seed=s) for s in (1, 2)]
    twins = [(k.clone(), v.clone()) for k, v in layers]  # written by the per-call ops
    kept = [ops.KvCaches(k, v) for k, v in layers]
    lens = [0, 0, 0]
    tables = make_batch([40, 40, 40], num_blocks=nb, block_size=bs, seed=8)
    for step, qlens in enumerate([[7, 3, 12], [1, 1, 1], [1, 5, 1], [1, 1, 1]]):
        lens = [L + q for L, q in zip(lens, qlens)]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        slots = torch.tensor([int(tables[s][p // bs]) * bs + p % bs for s in range(3)
                              for p in range(lens[s] - qlens[s], lens[s])])
        # vLLM's buffers: wider than the step, padding rows past its tokens
        bt = torch.cat([tables, torch.zeros(2, tables.shape[1], dtype=torch.int32)])
        batch = ops.AttentionBatch(bt[:3], torch.tensor(lens, dtype=torch.int32),
                                   torch.tensor(qsl, dtype=torch.int32))
        assert (batch.num_seqs, batch.num_tokens) == (3, qsl[-1])
        t = qsl[-1]
        for layer in range(2):
            k = torch.randn(t + 2, hk, d, generator=g)
            v = torch.randn(t + 2, hk, d, generator=g)
            q = torch.randn(t + 2, h, d, generator=g).to(torch.bfloat16)
            out = torch.full((t + 2, h * d), 5.0, dtype=torch.bfloat16)
            kept[layer].write(k, v, slots)
            kept[layer].attend(q, out, batch, scale=0.2, num_kv_heads=hk)
            tk, tv = twins[layer]
            ops.reshape_and_cache(k, v, tk, tv, slots)
            want = torch.empty(t, h, d, dtype=torch.bfloat16)
            ops.paged_attention(q[:t], tk, tv, tables, lens, want, scale=0.2, num_kv_heads=hk,
                                query_start_loc=qsl)
            assert torch.equal(layers[layer][0], tk) and torch.equal(layers[layer][1], tv)
            assert torch.equal(out[:t].view(t, h, d), want), (step, layer)
            assert torch.all(out[t:] == 5.0)  # padding rows left alone
            ref = ref_attention(q[:t], tk, tv, tables, lens, qsl, scale=0.2)
            torch.testing.assert_close(out[:t].view(t, h, d).double(), ref,
                                       atol=ATOL[torch.bfloat16], rtol=0)


def test_attention_batch_reads_every_form_of_its_inputs():
    """AttentionBatch's pointers and counts for each form the arrays come in: int32 tensors as
    vLLM's CPU engine passes them (used as they are), int64, lists, strided views, a column-
    strided and a single-row block table (converted); rows repeated by a stride of 0 are
    refused."""
    table = torch.tensor([[4, 5, 6], [7, 8, 9], [1, 2, 3]], dtype=torch.int32)
    lens, starts = [9, 5, 12], [0, 2, 3, 7]
    wide = torch.zeros(3, 6, dtype=torch.int32)
    wide[:, ::2] = table
    tables = [table, table.to(torch.int64), wide[:, ::2], torch.cat([table, table])[:3]]
    seqs = [lambda x: torch.tensor(x, dtype=torch.int32), lambda x: x,
            lambda x: torch.tensor(x, dtype=torch.int64),
            lambda x: torch.tensor([v for v in x for _ in (0, 1)], dtype=torch.int32)[::2]]
    for bt in tables:
        for form in seqs:
            for with_starts in (False, True):
                b = ops.AttentionBatch(bt, form(lens), form(starts) if with_starts else None)
                assert (b.num_seqs, b.max_pages_per_seq) == (3, 3)
                assert b.num_tokens == (7 if with_starts else 3)
                got = [[b.block_table_ptr[r * b.block_table_stride + c] for c in range(3)]
                       for r in range(3)]
                assert got == table.tolist()
                assert [b.context_lens_ptr[i] for i in range(3)] == lens
                if with_starts:
                    assert [b.query_start_loc_ptr[i] for i in range(4)] == starts
                else:
                    assert b.query_start_loc_ptr == ops.ffi.NULL
    one = ops.AttentionBatch(table[1:2], [5], torch.tensor([0, 1], dtype=torch.int32))
    assert (one.num_seqs, one.num_tokens, [one.block_table_ptr[c] for c in range(3)]) == \
        (1, 1, [7, 8, 9])
    with pytest.raises(ops.OpsArgumentError) as e:
        ops.AttentionBatch(table[:1].expand(3, 3), lens)
    assert e.value.field == "block_table"
    assert ops.AttentionBatch(table, []).num_seqs == 0


def test_kept_caches_check_each_calls_tensors():
    kc, vc = caches(8, 4, 2, 8, torch.float32)
    kept = ops.KvCaches(kc, vc)
    batch = ops.AttentionBatch(torch.tensor([[1, 2], [3, 0]], dtype=torch.int32), [6, 3])
    q, out = torch.randn(2, 4, 8), torch.empty(2, 4, 8)
    kept.attend(q, out, batch, scale=0.3, num_kv_heads=2)
    for call, field in [
        (lambda: kept.attend(q[:1], out, batch, scale=0.3, num_kv_heads=2), "query"),
        (lambda: kept.attend(q, out.double(), batch, scale=0.3, num_kv_heads=2), "out"),
        (lambda: kept.attend(q, torch.empty(2, 4, 8, device="meta"), batch, scale=0.3,
                             num_kv_heads=2), "out"),
        (lambda: kept.attend(q, out, batch, scale=0.3, num_kv_heads=1), "num_kv_heads"),
        (lambda: kept.attend(q, out, batch, scale=float("nan"), num_kv_heads=2), "scale"),
        (lambda: kept.write(torch.randn(2, 2, 4), torch.randn(2, 2, 4),
                            torch.tensor([0, 1])), "key"),
        (lambda: ops.AttentionBatch(torch.tensor([[1, 2]], dtype=torch.int32), [6, 3]),
         "block_table"),
        (lambda: ops.AttentionBatch(torch.tensor([[1]], dtype=torch.int32), [1], [0, 1, 2]),
         "query_start_loc"),
    ]:
        with pytest.raises(ops.OpsArgumentError) as e:
            call()
        assert e.value.field == field
    with pytest.raises(kvshare.AttnInvalidArgumentError):  # kvshare's own checks still run
        kept.attend(q, out, ops.AttentionBatch(torch.tensor([[1, 99], [3, 0]],
                                                            dtype=torch.int32), [6, 3]),
                    scale=0.3, num_kv_heads=2)


def test_backend_keeps_a_layers_caches_until_vllm_passes_another_tensor():
    """kvshare_vllm.cpu_attn's forward, called as vLLM calls it: a layer's checked caches are
    made once and made again for a new cache tensor (vLLM re-binding its KV cache)."""
    cpu_attn = pytest.importorskip("kvshare_vllm.cpu_attn")
    h, hk, d, bs, nb = 4, 2, 16, 4, 8
    impl = cpu_attn.KvshareCPUAttentionImpl(h, d, 0.25, hk, None, None, "auto")
    slots = torch.tensor([5, 6], dtype=torch.int64)
    meta = cpu_attn.KvshareCPUMetadata(
        num_actual_tokens=2, slot_mapping=slots,
        batch=ops.AttentionBatch(torch.tensor([[0, 1, 2]], dtype=torch.int32), [7],
                                 torch.tensor([0, 2], dtype=torch.int32)))
    q, k, v = torch.randn(2, h, d), torch.randn(2, hk, d), torch.randn(2, hk, d)
    outs = []
    for kv in (torch.zeros(2, nb, bs, hk, d), torch.zeros(2, nb, bs, hk, d)):
        kv[:, 0, :] = 1.0
        kv[:, 1, 0] = 2.0
        out = torch.empty(2, h * d)
        impl.forward(None, q, k, v, kv, meta, out)
        assert impl._caches[0] is kv
        assert torch.equal(kv[0, 1, 1:3], k) and torch.equal(kv[1, 1, 1:3], v)  # this tensor
        ref = ref_attention(q, kv[0], kv[1], torch.tensor([[0, 1, 2]]), [7], [0, 2], scale=0.25)
        torch.testing.assert_close(out.view(2, h, d).double(), ref, atol=2e-5, rtol=0)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("release", ["0.23.0", "0.32.0"])
def test_backend_reads_each_releases_kv_cache_layout(monkeypatch, release):
    """The layer's KV-cache tensor in the layout vLLM hands it on each release
    (``compat.VllmSupport.attention_cache``): 0.23's ``[2, blocks, block_size, kv_heads,
    head_dim]``; 0.32's fused ``[blocks, kv_heads, block_size, 2 * head_dim]``, read as each
    (block, head)'s K rows then its V rows, which kvshare's write takes as interleaved caches.
    The write lands where that layout says, nothing else changes, and attention reads it back."""
    from kvshare_vllm import compat

    cpu_attn = pytest.importorskip("kvshare_vllm.cpu_attn")
    monkeypatch.setattr(compat, "support", lambda version=None: compat.VLLM_SUPPORT[release])
    h, hk, d, bs, nb = 4, 2, 16, 4, 3
    g = torch.Generator().manual_seed(5)
    fused = compat.VLLM_SUPPORT[release].attention_cache == "fused"

    def views(t):  # the K and V caches of a layer's tensor, [blocks, block_size, kv_heads, d]
        if fused:
            rows = t.view(nb, hk, 2 * bs, d)
            return rows[:, :, :bs].transpose(1, 2), rows[:, :, bs:].transpose(1, 2)
        return t[0], t[1]

    kv = torch.randn(*((nb, hk, bs, 2 * d) if fused else (2, nb, bs, hk, d)), generator=g)
    before = kv.clone()
    impl = cpu_attn.KvshareCPUAttentionImpl(h, d, 0.25, hk, None, None, "auto")
    slots = torch.tensor([5, 6, 11], dtype=torch.int64)
    meta = cpu_attn.KvshareCPUMetadata(
        num_actual_tokens=3, slot_mapping=slots,
        batch=ops.AttentionBatch(torch.tensor([[0, 1, 2]], dtype=torch.int32), [12],
                                 torch.tensor([0, 3], dtype=torch.int32)))
    q, k, v = torch.randn(3, h, d), torch.randn(3, hk, d), torch.randn(3, hk, d)
    out = torch.empty(3, h * d)
    impl.forward(None, q, k, v, kv, meta, out)
    (kc, vc), (kc0, vc0) = views(kv), views(before)
    written = torch.zeros(nb, bs, dtype=torch.bool)
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(kc[slot // bs, slot % bs], k[i])
        assert torch.equal(vc[slot // bs, slot % bs], v[i])
        written[slot // bs, slot % bs] = True
    assert torch.equal(kc[~written], kc0[~written]) and torch.equal(vc[~written], vc0[~written])
    ref = ref_attention(q, kc, vc, torch.tensor([[0, 1, 2]]), [12], [0, 3], scale=0.25)
    torch.testing.assert_close(out.view(3, h, d).double(), ref, atol=2e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# Page copies
# ---------------------------------------------------------------------------------------------

def test_copy_pages_device_and_host():
    hk, d, bs, nb = 2, 8, 4, 8
    kc, vc = caches(nb, bs, hk, d, torch.float16, seed=3)
    k0, v0 = kc.clone(), vc.clone()
    ops.copy_pages(kc, vc, [(1, 2, bs, "d2d"), (3, 4, 2, kvshare.lib.KVS_COPY_KIND_DEVICE_TO_DEVICE)])
    assert torch.equal(kc[2], k0[1]) and torch.equal(vc[2], v0[1])
    assert torch.equal(kc[4, :2], k0[3, :2]) and torch.equal(kc[4, 2:], k0[4, 2:])
    ops.copy_pages(kc, vc, torch.tensor([[5, 6]]))
    assert torch.equal(kc[6], kc[5]) and torch.equal(vc[6], vc[5])
    hkc, hvc = torch.zeros(3, bs, hk, d, dtype=torch.float16), torch.zeros(3, bs, hk, d, dtype=torch.float16)
    ops.copy_pages(kc, vc, [(7, 1, bs, "d2h")], host_key_cache=hkc, host_value_cache=hvc)
    assert torch.equal(hkc[1], kc[7]) and torch.equal(hvc[1], vc[7])
    ops.copy_pages(kc, vc, [(1, 0, bs, "h2d")], host_key_cache=hkc, host_value_cache=hvc)
    assert torch.equal(kc[0], k0[7])
    ops.copy_pages(kc, vc, [])  # nothing
    with pytest.raises(kvshare.AttnInvalidArgumentError, match="copies"):
        ops.copy_pages(kc, vc, [(1, 99, bs, "d2d")])
    with pytest.raises(ops.OpsArgumentError) as e:
        ops.copy_pages(kc, vc, [(1, 2, bs, "sideways")])
    assert e.value.field == "copies"


@pytest.mark.parametrize("kv_format", ["fp8_e4m3", "fp8_e5m2"])
def test_copy_pages_fp8_caches_move_their_bytes(kv_format):
    """vLLM's uint8 fp8 caches: copies of every byte value (NaN and infinity codes included)
    are byte-identical, device to device, to host and back; a uint8 pair needs its format."""
    hk, d, bs, nb = 2, 8, 4, 8
    g = torch.Generator().manual_seed(11)
    kc, vc = (torch.randint(0, 256, (nb, bs, hk, d), generator=g, dtype=torch.uint8)
              for _ in range(2))
    k0, v0 = kc.clone(), vc.clone()
    hkc, hvc = (torch.zeros(3, bs, hk, d, dtype=torch.uint8) for _ in range(2))
    ops.copy_pages(kc, vc, [(7, 1, bs, "d2h"), (2, 5, bs, "d2d"), (1, 0, bs, "h2d")],
                   host_key_cache=hkc, host_value_cache=hvc, kv_format=kv_format)
    assert torch.equal(hkc[1], k0[7]) and torch.equal(hvc[1], v0[7])
    assert torch.equal(kc[5], k0[2]) and torch.equal(vc[5], v0[2])
    assert torch.equal(kc[0], k0[7]) and torch.equal(vc[0], v0[7])
    with pytest.raises(ops.OpsDtypeError, match="needs kv_format"):
        ops.copy_pages(kc, vc, [(1, 2, bs, "d2d")])


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

def _attn_args(**over):
    h, hk, d, bs, nb = 4, 2, 8, 4, 8
    kc, vc = caches(nb, bs, hk, d, torch.float32)
    a = dict(query=torch.randn(2, h, d), key_cache=kc, value_cache=vc,
             block_table=torch.tensor([[1, 2], [3, 0]], dtype=torch.int32), seq_lens=[6, 3],
             out=torch.empty(2, h, d), scale=0.3, num_kv_heads=hk)
    a.update(over)
    return a


def _call(**over):
    a = _attn_args(**over)
    return ops.paged_attention(a.pop("query"), a.pop("key_cache"), a.pop("value_cache"),
                               a.pop("block_table"), a.pop("seq_lens"), a.pop("out"), **a)


@pytest.mark.parametrize("over,field", [
    (dict(query=torch.randn(2, 4, 8, dtype=torch.float64)), "query"),
    (dict(out=torch.empty(2, 4, 8, dtype=torch.int32)), "out"),
    (dict(key_cache=torch.zeros(8, 4, 2, 8, dtype=torch.int8),
          value_cache=torch.zeros(8, 4, 2, 8, dtype=torch.int8)), "key_cache"),
    (dict(value_cache=torch.zeros(8, 4, 2, 8, dtype=torch.float16)), "value_cache"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.float32)), "block_table"),
    (dict(seq_lens=torch.tensor([6.0, 3.0])), "seq_lens"),
], ids=["query", "out", "cache-int8", "value-dtype", "block-table", "seq-lens"])
def test_wrong_dtype_names_the_field(over, field):
    with pytest.raises(ops.OpsDtypeError) as e:
        _call(**over)
    assert e.value.field == field and field in str(e.value)
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("over,field", [
    (dict(query=torch.empty(2, 4, 8, device="meta")), "query"),
    (dict(out=torch.empty(2, 4, 8, device="meta")), "out"),
    (dict(key_cache=torch.empty(8, 4, 2, 8, device="meta")), "key_cache"),
    (dict(block_table=torch.empty(2, 2, dtype=torch.int32, device="meta")), "block_table"),
], ids=["query", "out", "key_cache", "block_table"])
def test_non_cpu_tensor_without_npu(over, field):
    with pytest.raises(ops.OpsArgumentError) as e:
        _call(**over)
    assert e.value.field == field and "meta" in str(e.value)


@pytest.mark.parametrize("over,field", [
    (dict(num_kv_heads=4), "num_kv_heads"),
    (dict(query=torch.randn(1, 4, 8)), "query"),
    (dict(query=torch.randn(2, 4, 16)), "query"),
    (dict(out=torch.empty(2, 2, 8)), "out"),
    (dict(value_cache=torch.zeros(8, 4, 2, 16)), "value_cache"),
    (dict(key_cache=torch.zeros(8, 4, 16)), "key_cache"),
    (dict(block_table=torch.tensor([[1, 2]], dtype=torch.int32)), "block_table"),
    (dict(query_start_loc=[0, 1]), "query_start_loc"),
    (dict(scale=0.0), "scale"),
    (dict(query=torch.randn(2, 4, 8).expand(2, 4, 8).transpose(0, 2).contiguous()
          .transpose(0, 2)), "query"),
], ids=["num_kv_heads", "rows", "head_dim", "out-heads", "value-shape", "cache-rank",
        "block-rows", "qsl-len", "scale", "head-dim-not-contiguous"])
def test_shape_mismatch_names_the_field(over, field):
    with pytest.raises(ops.OpsArgumentError) as e:
        _call(**over)
    assert e.value.field == field


@pytest.mark.parametrize("over,field", [
    (dict(query=torch.randn(2, 3, 8), out=torch.empty(2, 3, 8)), "num_heads"),
    (dict(block_table=torch.tensor([[1, 99], [3, 0]], dtype=torch.int32)), "block_table"),
    (dict(seq_lens=[6, 9]), "context_lens"),
    (dict(query_start_loc=[1, 2, 2]), "query_start_loc"),
    (dict(query_start_loc=[0, 2, 1]), "query_start_loc"),
], ids=["gqa-ratio", "page-id", "too-long", "qsl-first", "qsl-decreasing"])
def test_kvshare_validation_names_the_field(over, field):
    with pytest.raises(kvshare.AttnInvalidArgumentError) as e:
        _call(**over)
    assert field in e.value.message and e.value.func == "kvs_attention_launch"


def test_kv_write_errors():
    kc, vc = caches(8, 4, 2, 8, torch.float16)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32)
    cases = [
        (dict(slot_mapping=slots.float()), ops.OpsDtypeError, "slot_mapping"),
        (dict(key=key.double(), value=value.double()), ops.OpsDtypeError, "key"),
        (dict(value=value.half()), ops.OpsDtypeError, "value"),
        (dict(key=torch.randn(3, 3, 8), value=torch.randn(3, 3, 8)), ops.OpsArgumentError, "key"),
        (dict(value=torch.randn(4, 2, 8)), ops.OpsArgumentError, "value"),
        (dict(slot_mapping=torch.arange(5, dtype=torch.int32)), ops.OpsArgumentError, "key"),
        (dict(slot_mapping=slots.view(3, 1)), ops.OpsArgumentError, "slot_mapping"),
        (dict(key_cache=torch.empty(8, 4, 2, 8, device="meta")), ops.OpsArgumentError,
         "key_cache"),
        (dict(slot_mapping=torch.empty(3, dtype=torch.int32, device="meta")),
         ops.OpsArgumentError, "slot_mapping"),
    ]
    for over, exc, field in cases:
        a = dict(key=key, value=value, key_cache=kc, value_cache=vc, slot_mapping=slots)
        a.update(over)
        with pytest.raises(exc) as e:
            ops.reshape_and_cache(**a)
        assert e.value.field == field, (over, e.value)
    with pytest.raises(kvshare.AttnInvalidArgumentError) as e:
        ops.reshape_and_cache(key, value, kc, vc, torch.tensor([0, 32, 1]))
    assert "slot_mapping" in e.value.message
    assert torch.all(kc[0] == caches(8, 4, 2, 8, torch.float16)[0][0])  # nothing written


def test_cpu_backend_is_cached():
    assert ops.cpu_backend() == ops.cpu_backend()
    assert ops.describe_backend("cpu").startswith("cpu")


@pytest.fixture
def fresh_backends(monkeypatch):
    """An empty backend cache for the test (the process's backends are put back after)."""
    saved = dict(ops._backends)
    ops._backends.clear()
    yield monkeypatch
    ops._backends.clear()
    ops._backends.update(saved)


def _split_k_case():
    """A decode batch with a sequence long enough to be split across threads, and its inputs."""
    lens, bs, hk, d = [3000, 7, 130], 16, 2, 64
    nb = sum(math.ceil(L / bs) for L in lens) + 3
    bt = make_batch(lens, num_blocks=nb, block_size=bs, share_prefix_pages=2, seed=11)
    kc, vc = caches(nb, bs, hk, d, torch.float16, seed=12)
    torch.manual_seed(13)
    q = torch.randn(len(lens), 8, d).to(torch.float16)
    return q, kc, vc, bt, lens


def test_cpu_backend_runs_on_torchs_openmp_team(fresh_backends):
    """By default the CPU backend runs on torch's OpenMP threads (``GOMP_parallel`` of the
    runtime torch loaded), with torch's thread count; ``KVSHARE_OPS_CPU_TEAM=own`` gives
    kvshare's own pool; both compute the same bits (the work split depends only on the thread
    count); an unknown value is refused by name."""
    monkeypatch = fresh_backends
    monkeypatch.delenv(ops.ENV_CPU_TEAM, raising=False)
    monkeypatch.setenv(ops.ENV_CPU_THREADS, "2")
    addr, where = ops._openmp_parallel()
    assert addr, where
    assert os.path.basename(where).startswith(("libgomp", "libiomp5", "libomp")), where
    q, kc, vc, bt, lens = _split_k_case()
    outs = {}
    for how in ("openmp", "own"):
        monkeypatch.setenv(ops.ENV_CPU_TEAM, how)
        ops._backends.clear()
        text = ops.describe_backend("cpu")
        want = "2 threads (the host's team" if how == "openmp" else "2 threads (its own pool)"
        assert want in text, text
        out = torch.zeros_like(q)
        ops.paged_attention(q, kc, vc, bt, lens, out, scale=0.125, num_kv_heads=2)
        outs[how] = out
    assert torch.equal(outs["openmp"], outs["own"])
    ref = ref_attention(q, kc, vc, bt, lens, scale=0.125)
    torch.testing.assert_close(outs["openmp"].float(), ref.float(), atol=2e-3, rtol=2e-3)
    monkeypatch.delenv(ops.ENV_CPU_THREADS)
    monkeypatch.delenv(ops.ENV_CPU_TEAM)
    ops._backends.clear()
    assert f"{torch.get_num_threads()} threads (the host's team" in ops.describe_backend("cpu")
    monkeypatch.setenv(ops.ENV_CPU_TEAM, "tbb")
    ops._backends.clear()
    with pytest.raises(ops.OpsArgumentError) as e:
        ops.cpu_backend()
    assert e.value.field == ops.ENV_CPU_TEAM


# ---------------------------------------------------------------------------------------------
# vllm-ascend hooks (what the patch calls), driven with CPU tensors
# ---------------------------------------------------------------------------------------------

def _impl_and_meta(dtype=torch.float16, n=3, padded=5):
    h, hk, d, bs, nb = 8, 2, 16, 16, 24
    kc, vc = caches(nb, bs, hk, d, dtype)
    lens = [5, 40, 17][:n]
    bt = make_batch(lens, num_blocks=nb, block_size=bs, seed=8, max_blocks=4)
    # vllm-ascend pads block_tables / seq_lens for a dummy graph-padding request
    bt = torch.cat([bt, torch.zeros(1, 4, dtype=torch.int32)])
    impl = SimpleNamespace(key_cache=kc, value_cache=vc, scale=0.25, num_heads=h, num_kv_heads=hk,
                           sliding_window=None, sinks=None, alibi_slopes=None,
                           enable_hamming_sparse=False, attn_type="decoder")
    meta = SimpleNamespace(num_decodes=n, num_decode_tokens=n, num_prefills=0, causal=True,
                           block_tables=bt, seq_lens=torch.tensor(lens + [1]),
                           seq_lens_list=lens + [1], decode_meta=None, prefill=None)
    q = torch.randn(padded, h, d).to(dtype)
    return impl, meta, q, lens


def test_ascend_decode_hook():
    impl, meta, q, lens = _impl_and_meta()
    out = torch.full_like(q, 3.0)
    assert ops.ascend_decode(impl, q, meta, out)
    ref = ref_attention(q[:3], impl.key_cache, impl.value_cache, meta.block_tables, lens,
                        scale=0.25)
    torch.testing.assert_close(out[:3].double(), ref, atol=ATOL[torch.float16], rtol=0)
    assert torch.all(out[3:] == 0)


@pytest.mark.parametrize("change", [
    dict(sinks=torch.zeros(8)), dict(alibi_slopes=torch.zeros(8)),
    dict(enable_hamming_sparse=True), dict(attn_type="encoder_decoder"),
    dict(key_cache=torch.zeros(24, 16, 2, 16, dtype=torch.int8)),
    dict(meta_num_prefills=1), dict(meta_causal=False),
], ids=["sinks", "alibi", "hamming", "cross", "int8-cache", "prefills", "non-causal"])
def test_ascend_decode_hook_falls_back_without_writing(change):
    impl, meta, q, _ = _impl_and_meta()
    for k, v in change.items():
        if k.startswith("meta_"):
            setattr(meta, k[5:], v)
        else:
            setattr(impl, k, v)
    out = torch.full_like(q, 3.0)
    assert not ops.ascend_decode(impl, q, meta, out)
    assert torch.all(out == 3.0)


def test_ascend_kv_write_hook():
    impl, _, _, _ = _impl_and_meta(dtype=torch.bfloat16)
    key, value = torch.randn(2, 2, 16), torch.randn(2, 2, 16)
    assert ops.ascend_kv_write(impl, key, value, torch.tensor([17, -1], dtype=torch.int32))
    assert torch.equal(impl.key_cache[1, 1], key[0].bfloat16())
    impl.key_cache = torch.zeros(24, 16, 2, 16, dtype=torch.int8)
    assert not ops.ascend_kv_write(impl, key, value, torch.tensor([17, -1], dtype=torch.int32))


def test_enabled_reads_the_environment(monkeypatch):
    monkeypatch.delenv(ops.ENV_ENABLE, raising=False)
    assert not ops.enabled()
    monkeypatch.setenv(ops.ENV_ENABLE, "1")
    assert ops.enabled()


def test_ascend_hooks_fall_back_on_kvshare_refusals(monkeypatch):
    """UNSUPPORTED from the backend -> vllm-ascend's op (nothing written); a backend that cannot
    be created (no CANN) is not retried."""
    impl, meta, q, _ = _impl_and_meta()
    unsupported = kvshare.UnsupportedError("Ascend backend: softcap",
                                           kvshare.STATUS["KVS_STATUS_UNSUPPORTED"],
                                           "kvs_attention_launch")
    unavailable = kvshare.BackendUnavailableError(
        "libascendcl.so not found", kvshare.STATUS["KVS_STATUS_BACKEND_UNAVAILABLE"],
        "kvs_backend_new")
    calls = []

    def raising(exc):
        def f(*a, **k):
            calls.append(exc)
            raise exc
        return f

    monkeypatch.setattr(ops, "_unavailable", None)
    monkeypatch.setattr(ops, "paged_attention", raising(unsupported))
    out = torch.full_like(q, 3.0)
    assert not ops.ascend_decode(impl, q, meta, out) and torch.all(out == 3.0)
    assert ops._unavailable is None
    monkeypatch.setattr(ops, "reshape_and_cache", raising(unavailable))
    key = torch.randn(1, 2, 16)
    assert not ops.ascend_kv_write(impl, key, key, torch.tensor([3]))
    assert ops._unavailable and len(calls) == 2
    assert not ops.ascend_kv_write(impl, key, key, torch.tensor([3]))
    assert not ops.ascend_decode(impl, q, meta, out)
    assert len(calls) == 2  # not retried
    # anything else is a real error and propagates
    monkeypatch.setattr(ops, "_unavailable", None)
    monkeypatch.setattr(ops, "paged_attention", raising(ValueError("bug")))
    with pytest.raises(ValueError):
        ops.ascend_decode(impl, q, meta, out)


def test_huge_pages_on_a_written_cache_keeps_its_contents():
    # A KV cache as vLLM allocates it (zeroed by torch, then written), 16 MiB: its whole
    # 2 MiB pages are advised and collapsed; the values never change.
    cache = torch.arange(4 << 20, dtype=torch.float32).view(2, 256, 16, 2, 256)
    want = cache.clone()
    nbytes = cache.untyped_storage().nbytes()
    advised, huge = ops.huge_pages(cache)
    assert nbytes - (4 << 20) < advised <= nbytes and advised % (2 << 20) == 0
    assert 0 <= huge <= advised
    assert torch.equal(cache, want)
    # A view asks for its whole storage, as the per-layer K and V halves do.
    assert ops.huge_pages(cache[1], collapse=False)[0] == advised
    assert torch.equal(cache, want)
    # Too small to hold a whole 2 MiB page: nothing to ask.
    assert ops.huge_pages(torch.ones(1000)) == (0, 0)
    assert ops.huge_pages(torch.empty(0)) == (0, 0)


def test_huge_pages_refuses_what_is_not_host_memory():
    with pytest.raises(ops.OpsArgumentError, match="t"):
        ops.huge_pages([1, 2, 3])
    with pytest.raises(ops.OpsArgumentError, match="meta"):
        ops.huge_pages(torch.empty(1 << 20, device="meta"))


def test_outer_strides_are_the_tensors_with_size_one_dimensions_dense():
    """``_outer_strides`` (every launch's stride check) against the rule written out: a
    dimension of size > 1 keeps its stride, one of size 1 gets the dense stride; broadcast
    dimensions and a strided last dimension are refused."""
    names = ("a", "b", "c")
    for shape in [(3, 4, 5, 8), (1, 4, 5, 8), (3, 1, 1, 8), (1, 1, 1, 8), (2, 3, 1, 1)]:
        base = torch.empty(*[2 * s for s in shape[:-1]], shape[-1])
        for t in (base[:shape[0], :shape[1], :shape[2]], base[::2, ::2, ::2],
                  torch.empty(*shape)):
            want = [t.stride(i) if t.shape[i] > 1 else
                    math.prod(max(s, 1) for s in t.shape[i + 1:]) for i in range(3)]
            assert ops._outer_strides("t", t, names) == want, (shape, t.stride())
    with pytest.raises(ops.OpsArgumentError, match="broadcast"):
        ops._outer_strides("t", torch.empty(1, 4, 5, 8).expand(3, 4, 5, 8), names)
    with pytest.raises(ops.OpsArgumentError, match="must be contiguous"):
        ops._outer_strides("t", torch.empty(3, 4, 5, 16)[..., ::2], names)
