"""Instructions the CPU backend executes per attention launch, per kernel path, counted exactly
by the x86 emulator the tests use (tests/x86emu.py, BochsCPU): a deterministic measure of how
much work each path does, for paths this machine cannot run natively (avx512). Not a time: an
emulator says nothing about speed.

    cd integration/vllm_ascend
    X86EMU_CPU_MODEL=sapphire_rapids PYTHONPATH=tests:../python:. \\
        $(../../scripts/setup-vllm-venv)/bin/python bench/count_instructions.py

Shapes: decode of 4 sequences x 512 tokens and a 1 x 256 causal prefill, 32 query heads over
8 KV heads x 128, page 16, one thread; f16, bf16 and f32. Each launch runs once to warm up,
then once counted. The library is the repository's target/release build unless $KVSHARE_LIB
names another.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["KVSHARE_OPS_CPU_THREADS"] = "1"

import torch  # noqa: E402

import kvshare  # noqa: E402
import x86emu  # noqa: E402
from kvshare_vllm import ops  # noqa: E402
from test_ops_emulated import launch_instructions  # noqa: E402

EMU = x86emu.CffiLib(kvshare.lib, kvshare.ffi, kvshare.LIB_PATH, native={"kvs_backend_free"})
ops.lib = EMU
kvshare.lib = EMU

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def count(isa: str, dtype, prefill: bool) -> int:
    n, _ = launch_instructions(EMU, isa, dtype, prefill, heads=32, kv_heads=8,
                               ctx=256 if prefill else 512, seqs=4)
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", default="avx2,avx512",
                    help="comma-separated kernel paths (portable, portable16, avx2, avx512)")
    ap.add_argument("--dtypes", default="f16,bf16,f32")
    args = ap.parse_args()
    paths = args.paths.split(",")
    x86emu.cpuid(0)  # creates the emulated CPU (X86EMU_CPU_MODEL)
    if not x86emu.last_stats.get("instructions"):
        print("the emulator's instruction counter is off here (x86emu._calibrate)",
              file=sys.stderr)
        return 1
    print(f"emulated CPU: {x86emu.model} ({x86emu.cpu_brand}); library {kvshare.LIB_PATH}")
    for prefill in (False, True):
        for name in args.dtypes.split(","):
            n = {p: count(p, DTYPES[name], prefill) for p in paths}
            cells = "  ".join(f"{p} {v:>11,}" for p, v in n.items())
            ratio = (f"  avx512/avx2 {n['avx512'] / n['avx2']:.3f}"
                     if "avx512" in n and "avx2" in n else "")
            print(f"{'prefill 1x256' if prefill else 'decode 4x512':<14} {name:<5} {cells}{ratio}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
