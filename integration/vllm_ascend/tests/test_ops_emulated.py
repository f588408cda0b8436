"""The CPU kernel's AVX-512 path, run under an x86 emulator against the float64 reference.

No machine this project is built on has AVX-512, so `kvs_attention_launch` on the `avx512` path
(16 f32 lanes: `vcvtph2ps zmm` for f16, a widening shift for bf16, `vscalefps` in exp; the decode
kernel and the tiled prefill kernel's 16-lane engine) is executed here by BochsCPU
(`bochscpu-python`, pinned in the venv recipe; `x86emu.py` runs one call of a native function
inside this process, guest addresses = host addresses). The whole C call is emulated: argument
validation, the plan, the kernels, the split-K merge and the output writes, on one thread.
Cases: every dtype; head dims 64/128/256; pages 16/128; GQA 1, 2, 4 and 8; ragged lengths around
page edges; shared prefix pages in shuffled tables; split-K (a key span over 2048 tokens is cut
whatever the thread count); prefill and chunked prefill on the tiled kernel; soft cap, sliding
window and a heads-major cache. A wrong result is an assertion against the reference; an
instruction the emulator refuses, a fault or a system call is an EmulationError naming it. And
the path's width is checked by count: the avx512 path must execute under 0.8x the instructions
of the avx2 path on the same decode and prefill launch (Bochs counts instructions exactly).

The parent test runs the cases below in a child pytest process per emulated CPU model with
``KVSHARE_CPU_ISA=avx512``, ``KVSHARE_OPS_CPU_THREADS=1``, ``KVSHARE_OPS_CPU_TEAM=own`` and every ``kvs_`` call of
`kvshare_vllm.ops` going through the emulator (a process whose CPU-feature answers came from the
emulated CPU must never run the library natively, and the library caches those answers per
process). Two models: Cannon Lake, a client CPU with AVX-512 (F/CD/BW/DQ/VL/IFMA/VBMI), and Sapphire
Rapids, the Xeon the avx512 path is meant for (it adds VNNI, AVX512_BF16 and AVX512_FP16; there
bf16 attention multiplies bf16 pairs, `vdpbf16ps`, `kernel/bf16dot.rs`: the tiled kernel's pair
engine in prefill, the decode kernel's pair scores and values in decode; a planted bug in either
fails that model's bf16 prefill or bf16 decode cases only). In the child the backend's
own description must name the avx512 path and the emulated CPU's flags, so a silent fallback to
another path, or the host's answers, fail.

Not covered here: AMX (this Bochs build has none, not even in its Sapphire Rapids model: forcing
`amx` is refused, checked below), and timing (an emulator says nothing about speed).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch

import kvshare
from kvshare_vllm import ops

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD_ENV = "KVSHARE_TEST_EMULATED_ISA"
CHILD = os.environ.get(CHILD_ENV)
child_only = pytest.mark.skipif(CHILD is None, reason=f"runs in the child run ({CHILD_ENV})")

# The one library call left native in the child: the backend's free, run by a GC finalizer
# (it never asks the CPU for its features). Everything else, the error message included (the
# guest's thread-local storage is the emulator's guest thread's), is emulated.
NATIVE = frozenset({"kvs_backend_free"})

if CHILD:
    import x86emu  # noqa: E402

    EMU_LIB = x86emu.CffiLib(kvshare.lib, kvshare.ffi, kvshare.LIB_PATH, native=NATIVE)
    ops.lib = EMU_LIB
    kvshare.lib = EMU_LIB  # kvshare.check() reads the error message through it


# ---------------------------------------------------------------------------------------------
# The parent: one child run per emulated path
# ---------------------------------------------------------------------------------------------

# The emulated models (x86emu.MODELS names) and the CPU flags the backend must report on each
# (kvshare's own list, `cpu_flags()` in src/attention/cpu/isa.rs).
MODEL_FLAGS = {
    "cannonlake": "avx2 fma f16c avx512f avx512vl",
    "sapphire_rapids": "avx2 fma f16c avx512f avx512vl avx512_bf16 avx512_fp16",
}


@pytest.mark.skipif(CHILD is not None, reason="the child run")
@pytest.mark.parametrize("model", list(MODEL_FLAGS))
def test_avx512_path_under_emulation(model):
    env = dict(os.environ)
    # One thread on kvshare's own pool (KVSHARE_OPS_CPU_TEAM=own): the emulator runs the calling
    # thread only, and never a host OpenMP runtime's code (test_ops.py covers the team).
    env.update({CHILD_ENV: "avx512", "KVSHARE_CPU_ISA": "avx512", "KVSHARE_OPS_CPU_THREADS": "1",
                "KVSHARE_OPS_CPU_TEAM": "own", "X86EMU_CPU_MODEL": model})
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "--timeout", "900",
         os.path.abspath(__file__)],
        cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True, timeout=1200)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-4000:]
    n = sum(1 for name in globals() if name.startswith("test_emulated_"))
    # Parametrized ones: once per case.
    want = n - 4 + len(DECODE) + len(PREFILL) + len(SPLIT) + len(INSTRUCTION_CASES)
    assert f"{want} passed" in r.stdout, r.stdout[-4000:]


# ---------------------------------------------------------------------------------------------
# The child: cases on the emulated path
# ---------------------------------------------------------------------------------------------

from test_ops import ATOL, caches, make_batch, ref_attention  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@child_only
def test_emulated_backend_runs_the_path():
    model = os.environ["X86EMU_CPU_MODEL"]
    x86emu.cpuid(0)  # the CPU exists (the model is checked against its brand string)
    assert x86emu.model == model, (x86emu.model, x86emu.cpu_brand)
    text = ops.describe_backend("cpu")
    assert f"kernel path {CHILD} (forced by KVSHARE_CPU_ISA)" in text, text
    assert "1 threads" in text, text
    # The emulated CPU's flags, exactly (not the host's: this machine has no avx512f).
    flags = re.search(r"CPU flags: ([a-z0-9_ ]+)", text)
    assert flags and flags.group(1).strip() == MODEL_FLAGS[model], text


@child_only
def test_emulated_amx_is_refused():
    """The emulated CPU has no AMX: forcing it is refused with the reason (never a fault)."""
    with pytest.raises(kvshare.KvsError, match="amx"):
        os.environ["KVSHARE_CPU_ISA"] = "amx"
        try:
            ops._new_backend(kvshare.lib.KVS_BACKEND_KIND_CPU)
        finally:
            os.environ["KVSHARE_CPU_ISA"] = CHILD


# (dtype, head_dim, page size, heads, kv heads): every dtype; head dims 64/128/256; pages 16 and
# 128; GQA 1, 4 and 8 (row groups of 1, 4 and 8 rows: every kernel shape of the 16-lane path).
DECODE = [
    (dt, d, bs, h, hk)
    for dt in DTYPES
    for d, bs, h, hk in [(64, 16, 4, 4), (128, 16, 8, 2), (256, 16, 8, 1), (64, 128, 8, 1),
                         (128, 128, 4, 4), (256, 128, 8, 2), (128, 16, 6, 3)]
]


@child_only
@pytest.mark.parametrize("dtype,d,bs,h,hk", DECODE, ids=str)
def test_emulated_decode(dtype, d, bs, h, hk):
    # Ragged lengths around page edges; sequences share their first page (shuffled table).
    lens = [1, bs - 1, bs, bs + 1, 2 * bs + 7, 37]
    nb = sum(math.ceil(L / bs) for L in lens) + 4
    bt = make_batch(lens, num_blocks=nb, block_size=bs, share_prefix_pages=1, seed=d + bs + h,
                    max_blocks=max(math.ceil(L / bs) for L in lens) + 1)
    kc, vc = caches(nb, bs, hk, d, dtype, seed=d * h)
    q = torch.randn(len(lens), h, d).to(dtype)
    out = torch.full_like(q, float("nan"))
    scale = 1 / math.sqrt(d)
    ops.paged_attention(q, kc, vc, bt, torch.tensor(lens), out, scale=scale, num_kv_heads=hk)
    ref = ref_attention(q, kc, vc, bt, lens, scale=scale)
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=0)


# Prefill and chunked prefill (sequences with 8+ query tokens run the tiled kernel's 16-lane
# engine; shorter ones the decode kernel), causal, with a cached prefix.
PREFILL = [(dt, d) for dt in DTYPES for d in (64, 128, 256)]


@child_only
@pytest.mark.parametrize("dtype,d", PREFILL, ids=str)
def test_emulated_prefill_and_chunked_prefill(dtype, d):
    h, hk, bs = 8, 2, 16
    seqs = [(37, 37), (50, 10), (20, 1), (40, 5), (9, 9)]
    lens = [L for L, _ in seqs]
    qsl = [0]
    for _, n in seqs:
        qsl.append(qsl[-1] + n)
    nb = sum(math.ceil(L / bs) for L in lens) + 4
    bt = make_batch(lens, num_blocks=nb, block_size=bs, share_prefix_pages=1, seed=d)
    kc, vc = caches(nb, bs, hk, d, dtype, seed=d + 1)
    q = torch.randn(qsl[-1], h, d).to(dtype)
    out = torch.full_like(q, float("nan"))
    ops.paged_attention(q, kc, vc, bt, lens, out, scale=0.1, num_kv_heads=hk,
                        query_start_loc=torch.tensor(qsl))
    ref = ref_attention(q, kc, vc, bt, lens, qsl, scale=0.1)
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=0)


# Split-K: a key span over 2048 tokens is cut into page-aligned chunks whatever the thread count,
# and the chunks' partial softmax states are merged.
SPLIT = [(dt, bs) for dt in DTYPES for bs in (16, 128)]


@child_only
@pytest.mark.parametrize("dtype,bs", SPLIT, ids=str)
def test_emulated_decode_split_k(dtype, bs):
    h, hk, d = 8, 2, 128
    lens = [2700, 530, 20]
    nb = sum(math.ceil(L / bs) for L in lens) + 2
    bt = make_batch(lens, num_blocks=nb, block_size=bs, share_prefix_pages=2, seed=bs)
    kc, vc = caches(nb, bs, hk, d, dtype, seed=bs + 3)
    q = torch.randn(len(lens), h, d).to(dtype)
    out = torch.full_like(q, float("nan"))
    ops.paged_attention(q, kc, vc, bt, lens, out, scale=1 / math.sqrt(d), num_kv_heads=hk)
    ref = ref_attention(q, kc, vc, bt, lens, scale=1 / math.sqrt(d))
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=0)


@child_only
def test_emulated_softcap_window_and_heads_major():
    dtype, h, hk, d, bs = torch.float16, 8, 2, 128, 16
    lens = [70, 33, 5]
    nb = 16
    bt = make_batch(lens, num_blocks=nb, block_size=bs, seed=11)
    kc, vc = caches(nb, bs, hk, d, dtype, seed=12)
    q = torch.randn(len(lens), h, d).to(dtype)
    out = torch.empty_like(q)
    ops.paged_attention(q, kc, vc, bt, lens, out, scale=0.2, num_kv_heads=hk, softcap=3.0,
                        sliding_window=24)
    ref = ref_attention(q, kc, vc, bt, lens, scale=0.2, softcap=3.0, sliding_window=24)
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=0)
    # The same cache stored heads-major ([blocks, kv heads, block, d]) and passed transposed.
    khm, vhm = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
    out2 = torch.empty_like(q)
    ops.paged_attention(q, khm.transpose(1, 2), vhm.transpose(1, 2), bt, lens, out2, scale=0.2,
                        num_kv_heads=hk, softcap=3.0, sliding_window=24)
    torch.testing.assert_close(out2, out, atol=0, rtol=0)


def launch_instructions(emu, isa, dtype, prefill, heads=16, kv_heads=4, ctx=256, seqs=2):
    """Instructions the emulated CPU executes (``emu``: the :class:`x86emu.CffiLib` that
    ``ops`` calls) for one launch on ``isa`` (a fresh backend forced to it; one warm-up launch
    first), and the launch's output: decode of ``seqs`` x ``ctx`` tokens or, with ``prefill``,
    one causal ``ctx``-token prefill; ``kv_heads`` x 128, page 16. Also used by
    bench/count_instructions.py."""
    d, bs = 128, 16
    lens, qsl = ([ctx], [0, ctx]) if prefill else ([ctx] * seqs, None)
    nb = sum(math.ceil(L / bs) for L in lens) + 2
    bt = make_batch(lens, num_blocks=nb, block_size=bs, seed=5)
    kc, vc = caches(nb, bs, kv_heads, d, dtype, seed=6)
    torch.manual_seed(7)
    q = torch.randn(qsl[-1] if prefill else len(lens), heads, d).to(dtype)
    out = torch.empty_like(q)
    kw = {"query_start_loc": torch.tensor(qsl)} if prefill else {}
    old_isa = os.environ.get("KVSHARE_CPU_ISA")
    os.environ["KVSHARE_CPU_ISA"] = isa
    saved = dict(ops._backends)
    ops._backends.clear()
    try:
        ops.paged_attention(q, kc, vc, bt, lens, out, scale=0.1, num_kv_heads=kv_heads, **kw)
        before = emu.instructions
        ops.paged_attention(q, kc, vc, bt, lens, out, scale=0.1, num_kv_heads=kv_heads, **kw)
        return emu.instructions - before, out
    finally:
        if old_isa is None:
            os.environ.pop("KVSHARE_CPU_ISA", None)
        else:
            os.environ["KVSHARE_CPU_ISA"] = old_isa
        ops._backends.clear()
        ops._backends.update(saved)


INSTRUCTION_CASES = [False, True]  # decode, prefill


@child_only
@pytest.mark.parametrize("prefill", INSTRUCTION_CASES, ids=["decode", "prefill"])
def test_emulated_avx512_runs_fewer_instructions(prefill):
    """The 16-lane path must execute clearly fewer instructions than the 8-lane one on the same
    launch (Bochs counts them exactly: deterministic, not a timing). Guards against the path
    quietly losing its width: a helper left out of line by the compiler made the avx512 decode
    run 1.1x avx2's instructions, and the tiled prefill kernel once ran 8-lane blocks on avx512
    (0.97x); now about 0.6x and 0.65x."""
    ctx = 64 if prefill else 256
    n2, out2 = launch_instructions(EMU_LIB, "avx2", torch.float16, prefill, ctx=ctx)
    n5, out5 = launch_instructions(EMU_LIB, "avx512", torch.float16, prefill, ctx=ctx)
    assert n2 > 0 and n5 > 0, "the emulator's instruction counter is off (x86emu._calibrate)"
    torch.testing.assert_close(out5.double(), out2.double(), atol=ATOL[torch.float16], rtol=0)
    print(f"{'prefill' if prefill else 'decode'}: avx2 {n2}, avx512 {n5} instructions "
          f"({n5 / n2:.3f})")
    assert n5 <= 0.8 * n2, (n5, n2)

