# Run by `kvshare-bench attention --prefill` with a Python that has torch: args DIR SEQS CTX
# KV_HEADS HEAD_DIM HEADS PAGE_SIZE THREADS ITERS DTYPE. DIR holds kvshare's paged K/V as f32
# (k.bin, v.bin; values exact in DTYPE), its page table (table.bin, int32 [seqs, ctx/page]), the
# query (q.bin, f32 [seqs*ctx, heads, dim]) and kvshare's output (out.bin, f32). Times torch's
# causal scaled_dot_product_attention in DTYPE (best of ITERS) on the same logical Q/K/V and prints
# one JSON line after the marker KVSBENCH.
import json, sys, time
import numpy as np, torch
d, seqs, ctx, hk, dim, h, ps, threads, iters = sys.argv[1], *map(int, sys.argv[2:10])
dt = {"f32": torch.float32, "bf16": torch.bfloat16}[sys.argv[10]]
torch.set_num_threads(threads)
load = lambda n: torch.from_numpy(np.fromfile(f"{d}/{n}.bin", dtype=np.float32))
table = torch.from_numpy(np.fromfile(f"{d}/table.bin", dtype=np.int32).astype(np.int64))
gather = lambda x: x.view(-1, ps, hk, dim)[table].view(seqs, ctx, hk, dim).permute(0, 2, 1, 3)
k = gather(load("k")).to(dt).contiguous()
v = gather(load("v")).to(dt).contiguous()
q = load("q").view(seqs, ctx, h, dim).permute(0, 2, 1, 3).to(dt).contiguous()
ref = load("out").view(seqs, ctx, h, dim).permute(0, 2, 1, 3)
sdpa = torch.nn.functional.scaled_dot_product_attention
with torch.inference_mode():
    out = sdpa(q, k, v, is_causal=True, enable_gqa=True)
    best = float("inf")
    for _ in range(iters):
        t = time.perf_counter()
        sdpa(q, k, v, is_causal=True, enable_gqa=True)
        best = min(best, time.perf_counter() - t)
diff = (out.float() - ref).abs().max().item()
print("KVSBENCH", json.dumps({"version": torch.__version__, "ms": best * 1e3, "max_diff": diff}))
