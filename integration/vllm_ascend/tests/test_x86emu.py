"""The emulator harness (x86emu.py) the avx512 kernel test relies on: AVX-512 instructions run
under it against scalar references run natively, bit for bit (x86emu_selftest.c, built here
twice with the C compiler), its error reports, and the re-run of EVEX gathers with an index
register above 15 that this Bochs build refuses.

Runs in this (native) pytest process: it calls no kvshare code, so the library's CPU-feature
answers here stay the host's.
"""

from __future__ import annotations

import ctypes
import os
import random
import struct
import subprocess
import sys

import pytest

import x86emu

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "x86emu_selftest.c")
AVX_FLAGS = ["-O2", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mf16c", "-mfma",
             "-mamx-tile", "-shared", "-fPIC"]


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("x86emu")
    avx, ref = str(d / "libx86emu_avx512.so"), str(d / "libx86emu_ref.so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, *AVX_FLAGS, "-o", avx, SRC], check=True)
    subprocess.run([cc, "-O2", "-DSELFTEST_REF", "-shared", "-fPIC", "-o", ref, SRC, "-lm"],
                   check=True)
    x86emu.LIBRARIES.append("libx86emu_avx512.so")
    return ctypes.CDLL(avx), ctypes.CDLL(ref)


rng = random.Random(1234)


def addr(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def fbuf(vals):
    return (ctypes.c_float * len(vals))(*vals)


def floats(n, lo=-100.0, hi=100.0):
    return [struct.unpack("<f", struct.pack("<f", rng.uniform(lo, hi)))[0] for _ in range(n)]


def emulated(libs, name, *args):
    a = [ctypes.addressof(x) if isinstance(x, ctypes.Array) else int(x) for x in args]
    return x86emu.call(addr(libs[0], name), a)


def native(libs, name, *args, restype=None):
    f = getattr(libs[1], name)
    f.restype = restype
    return f(*[ctypes.byref(x) if isinstance(x, ctypes.Array) else ctypes.c_size_t(x)
               for x in args])


def test_cvtph_ps(libs):
    n = 256
    hs = [rng.randrange(0, 1 << 16) for _ in range(n - 8)]
    hs += [0x0000, 0x8000, 0x0001, 0x03FF, 0x7C00, 0xFC00, 0x3C00, 0x7BFF]  # ±0, subnormals, ±inf
    h = (ctypes.c_uint16 * n)(*hs)
    out, ref = (ctypes.c_float * n)(), (ctypes.c_float * n)()
    emulated(libs, "k_cvtph_ps", h, out, n)
    native(libs, "k_cvtph_ps", h, ref, n)
    assert bytes(out) == bytes(ref)


def test_scalef_and_fmadd(libs):
    n = 256
    a, b, c = fbuf(floats(n)), fbuf(floats(n, -20.0, 20.0)), fbuf(floats(n))
    for name, args in [("k_scalef", (a, b)), ("k_fmadd", (a, b, c))]:
        out, ref = (ctypes.c_float * n)(), (ctypes.c_float * n)()
        emulated(libs, name, *args, out, n)
        native(libs, name, *args, ref, n)
        assert bytes(out) == bytes(ref), name


@pytest.mark.parametrize("n", [0, 1, 5, 16, 17, 31, 40])
def test_masked_load_store(libs, n):
    src = fbuf(floats(48))
    out, ref = fbuf([-7.0] * 48), fbuf([-7.0] * 48)
    emulated(libs, "k_masked", src, out, n)
    native(libs, "k_masked", src, ref, n)
    assert bytes(out) == bytes(ref)
    assert list(out)[n:] == [-7.0] * (48 - n)


def test_masked_load_next_to_an_unmapped_page(libs):
    """Masked-off lanes on an unmapped page do not fault (as on hardware)."""
    base = x86emu._mmap(2 * 4096)
    ctypes.CDLL(None).munmap(ctypes.c_void_p(base + 4096), ctypes.c_size_t(4096))
    src = base + 4096 - 3 * 4
    for i in range(3):
        ctypes.c_float.from_address(src + 4 * i).value = float(i + 1)
    out = fbuf([0.0] * 16)
    x86emu.call(addr(libs[0], "k_masked"), [src, ctypes.addressof(out), 3])
    assert list(out)[:4] == [3.0, 5.0, 7.0, 0.0]


def test_reduce_permute_and_bf16(libs):
    a = fbuf(floats(4096))
    got = emulated(libs, "k_reduce_add", a, 4096) & 0xFFFF_FFFF
    assert got == native(libs, "k_reduce_add", a, 4096, restype=ctypes.c_uint32)
    a16 = fbuf(floats(16))
    idx = (ctypes.c_int32 * 16)(*[rng.randrange(-64, 64) for _ in range(16)])
    out, ref = (ctypes.c_float * 16)(), (ctypes.c_float * 16)()
    emulated(libs, "k_permute", a16, idx, out)
    native(libs, "k_permute", a16, idx, ref)
    assert bytes(out) == bytes(ref)
    src = (ctypes.c_uint16 * 64)(*[rng.randrange(0, 1 << 16) for _ in range(64)])
    out, ref = (ctypes.c_float * 64)(), (ctypes.c_float * 64)()
    emulated(libs, "k_bf16", src, out, 64)
    native(libs, "k_bf16", src, ref, 64)
    assert bytes(out) == bytes(ref)


def test_thread_local_storage_is_the_guest_threads(libs):
    """The guest's thread-local storage persists across calls and is not the caller's."""
    avx = libs[0]
    avx.tls_set.argtypes = [ctypes.c_int64]
    avx.tls_get.restype = ctypes.c_int64
    avx.tls_set(1234567)  # plain scalar code: safe natively (this thread's variable)
    x86emu.call(addr(avx, "tls_set"), [40])
    assert x86emu.call(addr(avx, "tls_add"), [2]) == 42
    assert x86emu.call(addr(avx, "tls_get"), []) == 42
    assert avx.tls_get() == 1234567


def test_new_mappings_between_calls(libs):
    n = 1 << 20  # 4 MiB buffers: new mappings after the earlier calls
    a = fbuf([1.5] * n)
    out = (ctypes.c_float * n)()
    emulated(libs, "k_fmadd", a, a, a, out, n)
    assert x86emu.last_stats["remapped"]
    assert out[0] == 1.5 * 1.5 + 1.5 and out[n - 1] == out[0]


@pytest.mark.parametrize("mask", [0xFF, 0x5A, 0x01, 0x00])
def test_gather_with_a_high_index_register_qword(libs, mask):
    base = (ctypes.c_int64 * 64)(*[1000 + 7 * i for i in range(64)])
    idx = (ctypes.c_int32 * 16)(*[rng.randrange(0, 64) for _ in range(16)])
    out, ref = (ctypes.c_int64 * 8)(), (ctypes.c_int64 * 8)()
    z0, z0_ref = (ctypes.c_int64 * 8)(), (ctypes.c_int64 * 8)()
    k = emulated(libs, "g_qword_high", base, idx, out, mask, -5, z0)
    native(libs, "g_qword_high", base, idx, ref, mask, -5 & (2**64 - 1), z0_ref)
    assert list(out) == list(ref)
    assert list(z0) == list(z0_ref), "the borrowed low register was not restored"
    assert k == 0, "the gather leaves its mask register zero"
    assert x86emu.last_stats["gathers_rerun"] == 1


@pytest.mark.parametrize("mask", [0xFFFF, 0xA5C3])
def test_gather_with_a_high_index_register_dword(libs, mask):
    base = (ctypes.c_int32 * 80)(*[-500 + 3 * i for i in range(80)])
    idx = (ctypes.c_int32 * 16)(*[rng.randrange(0, 64) for _ in range(16)])
    out, ref = (ctypes.c_int32 * 16)(), (ctypes.c_int32 * 16)()
    z0, z0_ref = (ctypes.c_int64 * 8)(), (ctypes.c_int64 * 8)()
    k = emulated(libs, "g_dword_high", base, idx, out, mask, 77, z0)
    native(libs, "g_dword_high", base, idx, ref, mask, 77, z0_ref)
    assert list(out) == list(ref)
    assert list(z0) == list(z0_ref)
    assert k == 0


def test_faults_are_reported_with_the_address(libs):
    ro = x86emu._mmap(4096, 1)  # PROT_READ
    src = fbuf([1.0] * 16)
    with pytest.raises(x86emu.EmulationError, match="#PF") as e:
        x86emu.call(addr(libs[0], "k_masked"), [ctypes.addressof(src), ro, 16])
    cr2 = int(str(e.value).split("cr2=")[1].split()[0], 16)
    assert ro <= cr2 < ro + 4096
    with pytest.raises(x86emu.EmulationError, match="#PF") as e:
        x86emu.call(addr(libs[0], "k_masked"), [0, ctypes.addressof(src), 16])  # a NULL read
    assert int(str(e.value).split("cr2=")[1].split()[0], 16) < 64


def test_system_calls_are_refused():
    getpid = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
    with pytest.raises(x86emu.EmulationError, match="syscall"):
        x86emu.call(getpid, [])


def test_amx_is_not_emulated(libs):
    """This Bochs build has no AMX: `ldtilecfg` is #UD (the reason the AMX path is not run
    under the emulator); the model's CPUID says so too. The Sapphire Rapids model's answer is
    checked in test_models."""
    cfg = (ctypes.c_uint8 * 64)()
    cfg[0] = 1
    with pytest.raises(x86emu.EmulationError, match="#UD"):
        x86emu.call(addr(libs[0], "amx_loadcfg"), [ctypes.addressof(cfg)])
    assert not x86emu.cpuid(7)[3] >> 24 & 1  # amx_tile


def test_default_model():
    """Without X86EMU_CPU_MODEL the CPU is this build's default, Cannon Lake, checked by its
    brand string: AVX-512 F/BW/DQ/VL (leaf 7 EBX bits 16, 30, 17, 31), no AVX512_FP16."""
    if os.environ.get(x86emu.MODEL_ENV):
        pytest.skip(f"{x86emu.MODEL_ENV} is set")
    _, ebx, _, edx = x86emu.cpuid(7)
    assert x86emu.model == x86emu.DEFAULT_MODEL == "cannonlake" and "i3-8121U" in x86emu.cpu_brand, x86emu.cpu_brand
    assert all(ebx >> b & 1 for b in (16, 17, 30, 31)) and not edx >> 23 & 1


def _model_env(model):
    """This process's environment for a child Python on emulated CPU model `model`."""
    env = dict(os.environ, **{x86emu.MODEL_ENV: model})
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


MODEL_PROBE = r"""
import ctypes, os, sys, x86emu
_, ebx, ecx, edx = x86emu.cpuid(7)
eax71 = x86emu.cpuid(7, 1)[0]
cfg = (ctypes.c_uint8 * 64)(1)
lib = ctypes.CDLL(sys.argv[1])
x86emu.LIBRARIES.append(os.path.basename(sys.argv[1]))
try:
    x86emu.call(ctypes.cast(lib.amx_loadcfg, ctypes.c_void_p).value, [ctypes.addressof(cfg)])
    amx = "ran"
except x86emu.EmulationError as e:
    amx = "#UD" if "#UD" in str(e) else str(e)
print(x86emu.model, "|", x86emu.cpu_brand, "|", ebx >> 16 & 1, ecx >> 11 & 1, eax71 >> 5 & 1,
      edx >> 23 & 1, edx >> 24 & 1, "|", amx)
"""


@pytest.mark.parametrize("model,brand,bits", [
    # avx512f, avx512_vnni, avx512_bf16, avx512_fp16, amx_tile
    ("icelake", "i7-1065G7", "1 1 0 0 0"),
    ("tigerlake", "i5-1135G7", "1 1 0 0 0"),
    ("sapphire_rapids", "Xeon(R) w9-3475X", "1 1 1 1 0"),
])
def test_models(libs, model, brand, bits):
    """X86EMU_CPU_MODEL picks the model (in a fresh process: the CPU is created once): its
    brand string and CPUID leaf 7 bits; and `ldtilecfg` is #UD even on Sapphire Rapids."""
    r = subprocess.run([sys.executable, "-c", MODEL_PROBE, libs[0]._name], env=_model_env(model),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    got = [x.strip() for x in r.stdout.strip().splitlines()[-1].split("|")]
    assert got[0] == model and brand in got[1], got
    assert got[2] == bits and got[3] == "#UD", got


def test_unknown_model_is_refused():
    r = subprocess.run([sys.executable, "-c", "import x86emu; x86emu.cpuid(0)"],
                       env=_model_env("pentium"), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "no such model" in r.stderr, r.stderr[-2000:]


def test_instruction_count(libs):
    libs[1].spin.restype = ctypes.c_uint64
    libs[1].spin.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    n = 200_000
    assert x86emu.call(addr(libs[0], "spin"), [n, 7]) == libs[1].spin(n, 7)
    st = x86emu.last_stats
    print(f"emulated {st['instructions']} instructions in {st['seconds']:.3f} s")
    # The loop body is a handful of instructions per iteration (whatever the compiler made).
    assert 3 * n <= st["instructions"] <= 8 * n + 100
