"""Runs one call of a native x86-64 function of this process under an emulated CPU (BochsCPU,
through bochscpu-python 0.4.0), so that code for instructions this machine lacks (AVX-512)
executes here. The test suite uses it for kvshare's avx512 CPU kernel path
(test_ops_emulated.py); test_x86emu.py checks it.

    import x86emu
    rax = x86emu.call(fn_addr, [arg0, arg1, ...])   # SysV ABI, up to 6 integer/pointer args
    x86emu.last_stats   # {'instructions': N, 'seconds': t, 'mips': ..., 'remapped': ..., ...}
    lib = x86emu.CffiLib(cffi_lib, ffi, path)       # a cffi library whose calls are emulated

The emulated CPU is one of the Bochs CPU models in MODELS, chosen by X86EMU_CPU_MODEL before the
first call: by default Cannon Lake (this build's default: AVX-512 F/CD/BW/DQ/VL/IFMA/VBMI), up to
Sapphire Rapids (a Xeon: + VNNI, AVX512_BF16, AVX512_FP16); 64-bit user mode. `cpuid()` asks it.
No model of this build has AMX: the wheel's Bochs was compiled without it (no tile instruction
decodes, and even the Sapphire Rapids model reports no amx_tile), so tile instructions are #UD. Guest virtual addresses are host virtual addresses: the guest reads and
writes this process's real memory (anonymous memory, the heap, stacks, and the shared objects
named in LIBRARIES: libc, the loader, libgcc_s, plus the library under test); every such page
is bound before the guest runs. The guest's thread-local storage, and so its malloc arena, is
a parked thread's (_GuestThread), not the caller's: state a library keeps per thread (an error
message) is read back by an emulated call too.

Two defects of this Bochs build are worked around, both checked: EVEX gathers with an index
register above 15 (#UD here; re-run with a low one, _GatherFix) and VDPBF16PS's 8-bit
displacement, which it scales by 4 instead of the operand size (a silent wrong read; the scale
is measured on models with AVX512_BF16 and the guest runs patched copies of the code pages
that hold one, _Disp8Fix). `last_stats['map_bf16_disp8_patched']` counts those instructions.

Any guest exception (#UD, #GP, #PF outside the mapped set, ...), a `syscall` instruction (#UD:
the guest cannot make system calls; its malloc arena is grown beforehand so that malloc needs
none), `hlt` or an interrupt raises EmulationError naming the vector and the instruction's
address. One call at a time (a lock); a guest that never returns is stopped by the caller's
own timeout (the tests' pytest-timeout).

The guest's memory (bochscpu loaded and its C API declared, the page tables that bind the
host's mappings, the VDPBF16PS disp8 fix) is x86emu_mem.py's; this module runs the CPU.
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading
import time

from x86emu_mem import (_EXC_CB_T, _HLT_CB_T, _INT_CB_T, _MISSING_CB_T, _U64, _VP, EmulationError,
                       LIBRARIES, PAGE, _disp8, _flush_icaches, _Hooks, _host_fs_base, _lib, _libc,
                       _mem, _mmap, _PhysMem, _symbol, bochscpu)

__all__ = ["call", "cpuid", "EmulationError", "last_stats", "CffiLib", "MODELS", "MODEL_ENV",
           "DEFAULT_MODEL"]


def _stack_scan(n=96):
    """The code addresses found among the guest stack's top `n` words (return addresses,
    mostly), symbolized: a rough backtrace for error messages."""
    rsp = _lib.bochscpu_cpu_rsp(_cpu)
    lo, hi = _stack, _stack + _STACK_SIZE
    out = []
    for i in range(n):
        a = rsp + 8 * i
        if not lo <= a < hi:
            break
        sym = _symbol(ctypes.c_uint64.from_address(a).value)
        if sym and sym not in out:
            out.append(sym)
    return out

# ----------------------------------------------------------------------------------------
# Bochs internals used for instruction count / faulting RIP (offsets into the global
# BX_CPU_C object `bx_cpu`, read from this build's cpu_loop disassembly and verified at
# runtime by _calibrate(); disabled if the check fails).
# ----------------------------------------------------------------------------------------
_BX_CPU = ctypes.addressof(ctypes.c_char.in_dll(_lib, "bx_cpu"))
_OFF_RIP, _OFF_PREV_RIP, _OFF_ICOUNT = 0xD8, 0x110, 0x128
_have_icount = False


def _rd64(a):
    return ctypes.c_uint64.from_address(a).value


def _icount():
    return _rd64(_BX_CPU + _OFF_ICOUNT) if _have_icount else None



# vxorps ymm0,ymm0,ymm0 ; vmovups zmm1,[rdi] ; vdpbf16ps zmm0,zmm1,[rsi+0x40] (disp8 = 1) ;
# vmovups [rdx],zmm0 ; vzeroupper ; ret
_BF16_DISP8_PROBE = bytes.fromhex("c5fc57c0" "62f17c48100f" "62f27648524601" "62f17c481102"
                                  "c5f877" "c3")


def _probe_bf16_disp8():
    """Sets _disp8.scale: the bytes the emulated CPU moves VDPBF16PS's address per unit of
    disp8 (64 per the SDM). Only on models with AVX512_BF16 (CPUID 7.1 EAX bit 5)."""
    if not cpuid(7, 1)[0] & (1 << 5):
        return
    code = _mmap(PAGE, 7)
    ctypes.memmove(code, _BF16_DISP8_PROBE, len(_BF16_DISP8_PROBE))
    ones = (ctypes.c_uint16 * 32)(*([0x3F80] * 32))                   # bf16 1.0
    # bf16 value i at element i (exact): lane 0 = b[o] + b[o + 1] for an offset of 2o bytes.
    vals = (ctypes.c_uint16 * 96)(*(struct.unpack("<I", struct.pack("<f", float(i)))[0] >> 16
                                    for i in range(96)))
    out = (ctypes.c_float * 16)()
    call(code, [ctypes.addressof(ones), ctypes.addressof(vals), ctypes.addressof(out)])
    _disp8.scale = int(out[0] - 1) // 2 * 2
    if _disp8.scale != 64:
        _pm.maps_key = None   # the next call binds the patched copies of pages bound already


# ----------------------------------------------------------------------------------------
# CPU / run
# ----------------------------------------------------------------------------------------
_lock = threading.RLock()
_pm = _PhysMem()
_sess = None
_init_error = None   # a failed start-up (the model check): raised again by every later call
_cpu = None
_stack = None
_STACK_SIZE = 1 << 20
_SENTINEL = None
_scratch = None
_run_info = {}
last_stats = {}

_VEC_NAMES = {0: "#DE", 1: "#DB", 2: "NMI", 3: "#BP", 4: "#OF", 5: "#BR", 6: "#UD", 7: "#NM",
              8: "#DF", 10: "#TS", 11: "#NP", 12: "#SS", 13: "#GP", 14: "#PF", 16: "#MF",
              17: "#AC", 18: "#MC", 19: "#XM", 21: "#CP"}


def _on_missing(gpa):
    # Every page the tables map is bound before the run, so this is a bug of this module: bind
    # a scratch page so that Bochs does not panic, and stop the CPU (the call raises).
    _mem.page_insert(gpa & ~(PAGE - 1), _scratch)
    _run_info.setdefault("error", ("missing-gpa", gpa))
    _lib.bochscpu_cpu_stop(_cpu)


def _on_exception(ctx, cpu_id, vector, error):
    if "exc" not in _run_info:
        _run_info["exc"] = (vector, error, _lib.bochscpu_cpu_rip(_cpu),
                            _rd64(_BX_CPU + _OFF_PREV_RIP) if _have_icount else None,
                            _lib.bochscpu_cpu_cr2(_cpu))
    _lib.bochscpu_cpu_stop(_cpu)


def _on_interrupt(ctx, cpu_id, vector):
    _run_info.setdefault("intr", (vector, _lib.bochscpu_cpu_rip(_cpu)))
    _lib.bochscpu_cpu_stop(_cpu)


def _on_hlt(ctx, cpu_id):
    _run_info.setdefault("hlt", _lib.bochscpu_cpu_rip(_cpu))
    _lib.bochscpu_cpu_stop(_cpu)


_cb_missing = _MISSING_CB_T(_on_missing)
_cb_exc = _EXC_CB_T(_on_exception)
_cb_int = _INT_CB_T(_on_interrupt)
_cb_hlt = _HLT_CB_T(_on_hlt)
_hooks = _Hooks()
_hooks.exception = ctypes.cast(_cb_exc, _VP)
_hooks.interrupt = ctypes.cast(_cb_int, _VP)
_hooks.hlt = ctypes.cast(_cb_hlt, _VP)
_hook_list = (ctypes.c_void_p * 2)(ctypes.addressof(_hooks), None)


def _seg(sel, attr):
    s = bochscpu.Segment()
    s.present, s.selector, s.base, s.limit, s.attr = True, sel, 0, 0xFFFFFFFF, attr
    return s


class _GuestThread:
    """A parked host thread whose identity the guest takes: its thread-local storage (FS base),
    hence its own malloc arena and tcache. The guest runs glibc's malloc on this process's
    memory and takes the locks of the arena it uses; it cannot make the futex system call that
    contention needs, and a guest stopped by a fault may leave a lock taken. With an arena of
    its own (never touched by a host thread: this one only sleeps), neither can block the host.
    The arena is grown here first, natively, so that the guest's allocations (up to 32 MiB each:
    the mmap threshold is raised to glibc's maximum) need no system call."""

    GROW = 48 << 20

    def __init__(self):
        _libc.malloc.restype = _VP
        _libc.malloc.argtypes = [ctypes.c_size_t]
        _libc.free.argtypes = [_VP]
        _libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        # Nothing is given back to the system below 1 GiB of free top (a trim is madvise or
        # munmap), and allocations up to 32 MiB come from the arena.
        if not (_libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
                and _libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)):
            raise OSError("mallopt refused the thresholds")
        ready, self._park = threading.Event(), threading.Event()
        self.fs_base, self.block, self.error = None, None, None

        def run():
            try:
                self.fs_base = _host_fs_base()
                blocks = [_libc.malloc(1 << 20) for _ in range(self.GROW >> 20)]
                if not all(blocks):
                    raise MemoryError("malloc failed")
                self.block = blocks[0]
                for blk in blocks:
                    _libc.free(blk)
            except Exception as e:  # noqa: BLE001 (reported by the constructor)
                self.error = e
            ready.set()
            self._park.wait()

        threading.Thread(target=run, name="x86emu-guest", daemon=True).start()
        ready.wait()
        if self.error is not None:
            raise EmulationError(f"guest thread: {self.error}")
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith("[heap]"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    if lo <= self.block < hi:
                        raise EmulationError("the guest thread shares the main malloc arena "
                                             "(glibc's arena limit reached)")


# ----------------------------------------------------------------------------------------
# CPU model. Bochs picks the CPUID model from the "cpu.model" parameter when the CPU is
# created, by its index in Bochs' CPU database (cpudb.h). bochscpu declares that parameter with
# an older, shorter list of names (it ends at index 27, which this build's database calls
# Cannon Lake; the list lacks two entries, so its names are off by two and its range stops
# short); the index is what counts. So the range is widened and the index set directly, before
# the CPU exists, and the result is checked against the brand string the guest reads with
# CPUID (a wrong index fails at start-up, never silently).
# ----------------------------------------------------------------------------------------
# name -> (index in this build's cpudb, part of the CPUID brand string)
MODELS = {
    "cannonlake": (27, "i3-8121U"),               # this build's default: AVX-512 F/CD/BW/DQ/VL/IFMA/VBMI
    "icelake": (28, "i7-1065G7"),                 # + VNNI, VBMI2, BITALG, VPOPCNTDQ
    "tigerlake": (29, "i5-1135G7"),               # + VP2INTERSECT
    "sapphire_rapids": (30, "Xeon(R) w9-3475X"),  # + AVX512_BF16, AVX512_FP16 (no AMX here)
}
MODEL_ENV = "X86EMU_CPU_MODEL"  # a MODELS name; default DEFAULT_MODEL
DEFAULT_MODEL = "cannonlake"    # the build's own default (cpu.model = 27)
model = None       # the emulated model's name, once the CPU exists
cpu_brand = None   # its CPUID brand string

_get_param_enum = getattr(_lib, "_ZN13bx_real_sim_c14get_param_enumEPKcP10bx_param_c")
_get_param_enum.restype = _VP      # bx_real_sim_c::get_param_enum(name, base): ignores `this`
_get_param_enum.argtypes = [_VP, ctypes.c_char_p, _VP]
_param_set_range = getattr(_lib, "_ZN14bx_param_num_c9set_rangeEmm")
_param_set_range.restype = None
_param_set_range.argtypes = [_VP, _U64, _U64]
_param_set = getattr(_lib, "_ZN15bx_param_enum_c3setEl")
_param_set.restype = None
_param_set.argtypes = [_VP, ctypes.c_int64]
_param_get = getattr(_lib, "_ZN14bx_param_num_c3getEv")
_param_get.restype = ctypes.c_int32
_param_get.argtypes = [_VP]


def _select_model(name):
    if name not in MODELS:
        raise EmulationError(f"{MODEL_ENV}={name!r}: no such model (one of {', '.join(MODELS)})")
    idx = MODELS[name][0]
    p = _get_param_enum(None, b"cpu.model", None)
    if not p:
        raise EmulationError("bochscpu has no cpu.model parameter")
    _param_set_range(p, 0, max(i for i, _ in MODELS.values()))
    _param_set(p, idx)
    if _param_get(p) != idx:
        raise EmulationError(f"cpu.model refused index {idx} ({name})")


# cpuid(leaf=edi, subleaf=esi) -> out[0..4] = eax, ebx, ecx, edx (out = rdx)
_CPUID_CODE = bytes.fromhex(
    "53"            # push rbx
    "89f8"          # mov eax, edi
    "89f1"          # mov ecx, esi
    "4989d0"        # mov r8, rdx
    "0fa2"          # cpuid
    "418900"        # mov [r8], eax
    "41895804"      # mov [r8+4], ebx
    "41894808"      # mov [r8+8], ecx
    "4189500c"      # mov [r8+12], edx
    "5b"            # pop rbx
    "c3")           # ret
_cpuid_fn = None


def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
    """(eax, ebx, ecx, edx) of CPUID as the emulated CPU answers it."""
    out = (ctypes.c_uint32 * 4)()
    with _lock:
        _init()
        call(_cpuid_fn, [leaf, subleaf, ctypes.addressof(out)])
    return tuple(out)


def _check_model(name):
    global model, cpu_brand
    regs = b"".join(struct.pack("<4I", *cpuid(0x80000002 + i)) for i in range(3))
    brand = regs.split(b"\0")[0].decode("ascii", "replace").strip()
    if MODELS[name][1] not in brand:
        raise EmulationError(f"asked for the {name} model, the emulated CPU says {brand!r}")
    model, cpu_brand = name, brand


def _init():
    global _sess, _cpu, _stack, _SENTINEL, _scratch, _gather_code, _guest, _cpuid_fn
    global _init_error
    if _init_error is not None:
        raise _init_error
    if _sess is not None:
        return
    name = os.environ.get(MODEL_ENV) or DEFAULT_MODEL
    _select_model(name)
    _guest = _GuestThread()
    _sess = bochscpu.Session()                # creates Bochs CPU #0 (its CPUID model: above)
    _cpu = _lib.bochscpu_cpu_from(0)          # raw handle for run/stop from ctypes
    _lib.bochscpu_mem_missing_page(_cb_missing)
    _stack = _mmap(_STACK_SIZE)
    _SENTINEL = _mmap(PAGE, 0)                # PROT_NONE -> never in the guest page tables
    _scratch = _mmap(PAGE)
    _gather_code = _mmap(PAGE, 7)             # rwx: re-encoded gathers (see _GatherFix)
    _cpuid_fn = _mmap(PAGE, 7)                # the CPUID helper's code (cpuid())
    ctypes.memmove(_cpuid_fn, _CPUID_CODE, len(_CPUID_CODE))
    _calibrate()
    try:
        _check_model(name)
    except EmulationError as e:
        _init_error = e  # never run later calls on a CPU that is not the one asked for
        raise
    _probe_bf16_disp8()


def _make_state(rip, args, rsp):
    st = bochscpu.State()
    st.cr0 = 0x80050033           # PG|AM|WP|NE|ET|MP|PE
    st.cr4 = (1 << 5) | (1 << 9) | (1 << 10) | (1 << 18)  # PAE|OSFXSR|OSXMMEXCPT|OSXSAVE
    st.efer = (1 << 8) | (1 << 10) | (1 << 11)            # LME|LMA|NXE (SCE=0 -> syscall #UD)
    st.xcr0 = 0xE7                # x87|SSE|AVX|opmask|ZMM_Hi256|Hi16_ZMM
    st.mxcsr = 0x1F80
    st.mxcsr_mask = 0xFFFF
    st.fpcw = 0x037F
    st.fptw = 0xFFFF              # Bochs full tag word: all empty
    st.pat = 0x0007040600070406
    st.cr3 = _pm.pml4[0]
    st.cs = _seg(0x33, 0x20FB)    # 64-bit code, DPL3 (user mode: privileged insns #GP)
    data = _seg(0x2B, 0xC0F3)
    st.ss, st.ds, st.es = data, data, data
    fs = _seg(0, 0xC0F3)
    fs.base = _guest.fs_base
    st.fs = fs
    st.gs = _seg(0, 0xC0F3)
    st.rflags = 0x202
    st.rip = rip
    st.rsp = rsp
    regs = ["rdi", "rsi", "rdx", "rcx", "r8", "r9"]
    for r, v in zip(regs, args):
        setattr(st, r, v & 0xFFFFFFFFFFFFFFFF)
    return st


def _start(fn_addr, args):
    """Puts the CPU at the function's entry: arguments, a fresh stack whose return address is
    the sentinel."""
    top = (_stack + _STACK_SIZE - 64) & ~0xF
    rsp = top - 8                                 # as after `call`: rsp % 16 == 8
    ctypes.c_uint64.from_address(rsp).value = _SENTINEL
    _sess.cpu.state = _make_state(fn_addr, args, rsp)   # set_state flushes the TLB


def _go():
    """Runs from the current state until the CPU stops (the sentinel fetch fault, another
    exception). Returns (seconds, instructions, what the hooks saw).

    Nothing else of this process runs Python meanwhile (no watchdog thread): the guest runs
    glibc's malloc on this process's heap and takes its locks, and contention on them needs
    the futex system call, which the guest cannot make. A guest that never returns is stopped
    by the caller's own timeout (the tests' pytest-timeout kills the process)."""
    _flush_icaches()   # host-side writes to code are invisible to Bochs' SMC detection
    _run_info.clear()
    ic0 = _icount()
    t0 = time.perf_counter()
    _lib.bochscpu_cpu_run(_cpu, _hook_list)
    dt = time.perf_counter() - t0
    n = None if ic0 is None else _icount() - ic0
    return dt, n, dict(_run_info)


# ----------------------------------------------------------------------------------------
# EVEX gathers with an index register above 15: this Bochs build raises #UD on them (it
# applies the "unused EVEX.V' must be 1" rule to VSIB, where V' extends the index register;
# hardware and the SDM accept them, and compilers emit them). Such a gather is run by Bochs
# itself with the index copied into a low register: the instruction, re-encoded with that
# register, runs from a scratch page followed by int3; then the low register gets its value
# back and execution continues after the original instruction.
# ----------------------------------------------------------------------------------------
_ZMM = ctypes.c_uint64 * 8
_lib.bochscpu_cpu_zmm.restype = None
_lib.bochscpu_cpu_zmm.argtypes = [_VP, ctypes.c_size_t, ctypes.POINTER(_ZMM)]
_lib.bochscpu_cpu_set_zmm.restype = None
_lib.bochscpu_cpu_set_zmm.argtypes = [_VP, ctypes.c_size_t, ctypes.POINTER(_ZMM)]
_lib.bochscpu_cpu_set_rip.restype = None
_lib.bochscpu_cpu_set_rip.argtypes = [_VP, _U64]


def _zmm(i):
    z = _ZMM()
    _lib.bochscpu_cpu_zmm(_cpu, i, ctypes.byref(z))
    return z


def _high_index_gather(code: bytes):
    """(length, destination, index register, the bytes re-encoded for index register `t`)
    when `code` starts with an EVEX gather (0F38 90-93, VSIB) whose index register is 16-31;
    else None."""
    if len(code) < 7 or code[0] != 0x62:
        return None
    p0, p1, p2, op, modrm, sib = code[1:7]
    if p0 & 3 != 2 or p1 & 3 != 1 or op not in (0x90, 0x91, 0x92, 0x93) or p2 & 0x08:
        return None                           # not map 0F38 / 66, not a gather, low index
    mod, rm, base = modrm >> 6, modrm & 7, sib & 7
    if mod == 3 or rm != 4:
        return None
    disp = 4 if mod == 2 or (mod == 0 and base == 5) else 1 if mod == 1 else 0
    n = 7 + disp
    dst = ((modrm >> 3) & 7) | (0 if p0 & 0x80 else 8) | (0 if p0 & 0x10 else 16)
    index = ((sib >> 3) & 7) | (0 if p0 & 0x40 else 8) | 16

    def encode(t):
        q0 = (p0 & ~0x40) | (0 if t & 8 else 0x40)
        return bytes([0x62, q0, p1, p2 | 0x08, op, modrm, (sib & 0xC7) | ((t & 7) << 3)]) \
            + code[7:n]

    return n, dst, index, encode


class _GatherFix:
    def __init__(self):
        self.pending = None   # (low register, its saved value, where to continue, int3 address)
        self.count = 0

    def handle(self, exc) -> bool:
        vec, _err, rip, prev_rip, _cr2 = exc
        at = prev_rip if prev_rip is not None else rip
        if self.pending is not None:
            t, saved, cont, trap = self.pending
            if vec != 3 or trap not in (rip - 1, rip):
                return False
            _lib.bochscpu_cpu_set_zmm(_cpu, t, ctypes.byref(saved))
            _lib.bochscpu_cpu_set_rip(_cpu, cont)
            self.pending = None
            self.count += 1
            return True
        if vec != 6:
            return False
        g = _high_index_gather(ctypes.string_at(at, 16))
        if g is None:
            return False
        n, dst, index, encode = g
        t = 0 if dst != 0 else 1
        saved = _zmm(t)
        _lib.bochscpu_cpu_set_zmm(_cpu, t, ctypes.byref(_zmm(index)))
        code = encode(t) + b"\xcc"
        ctypes.memmove(_gather_code, code, len(code))
        self.pending = (t, saved, at + n, _gather_code + len(code) - 1)
        _lib.bochscpu_cpu_set_rip(_cpu, _gather_code)
        return True


def _calibrate():
    """Check the bx_cpu field offsets on a known sequence; disable icount if they differ."""
    global _have_icount
    code = _mmap(PAGE, 7)
    # mov ecx, 1000 ; l: dec ecx ; jnz l ; mov eax, 7 ; ret   -> 1 + 2*1000 + 1 + 1 insns
    prog = b"\xb9\xe8\x03\x00\x00\xff\xc9\x75\xfc\xb8\x07\x00\x00\x00\xc3"
    ctypes.memmove(code, prog, len(prog))
    _pm.sync()
    _sess.cpu.state = _make_state(code, [], (_stack + _STACK_SIZE - 72) & ~0xF | 8)
    ok = _rd64(_BX_CPU + _OFF_RIP) == code
    _have_icount = ok
    if ok:
        try:
            r = call(code, [])
        except EmulationError:
            _have_icount = False
            return
        # the sentinel fetch fault counts as one more instruction
        n = last_stats.get("instructions")
        _have_icount = r == 7 and n in (2003, 2004)
        _calibrate.measured = n


def call(fn_addr: int, args: list[int] = ()) -> int:
    """Emulate fn_addr(*args) (SysV x86-64, integer/pointer args only); return rax."""
    if len(args) > 6:
        raise ValueError("at most 6 integer arguments")
    with _lock:
        _init()
        remapped = _pm.sync()
        _start(fn_addr, list(args))
        fix = _GatherFix()
        dt, n = 0.0, 0
        while True:
            d, k, info = _go()
            dt += d
            n = None if k is None or n is None else n + k
            # int3 reaches the interrupt hook (a software interrupt), faults the exception hook.
            stop = info.get("exc")
            if stop is None and "intr" in info:
                stop = (info["intr"][0], 0, info["intr"][1], None, 0)
            if stop is None or not fix.handle(stop):
                break
        last_stats.clear()
        last_stats.update({"instructions": n, "seconds": dt, "gathers_rerun": fix.count,
                           "mips": (n / dt / 1e6) if (n and dt) else None,
                           "remapped": remapped, **{"map_" + k: v for k, v in _pm.stats.items()}})
        exc = info.get("exc")
        if exc is not None:
            vec, err, rip, prev_rip, cr2 = exc
            if vec == 14 and cr2 == _SENTINEL and rip == _SENTINEL:
                return _lib.bochscpu_cpu_rax(_cpu)
            at = prev_rip if prev_rip is not None else rip
            what = _VEC_NAMES.get(vec, "vector %d" % vec)
            extra = ""
            try:
                op = ctypes.string_at(at, 2)
                if vec == 6 and op == b"\x0f\x05":
                    extra = " (syscall instruction, number %d)" % _lib.bochscpu_cpu_rax(_cpu)
                extra += " bytes=%s" % ctypes.string_at(at, 8).hex()
            except Exception:
                pass
            if vec == 14:
                extra += " cr2=%#x err=%#x" % (cr2, err)
            extra += "; in %s; called from: %s" % (_symbol(at), ", ".join(_stack_scan()[:12]))
            raise EmulationError("guest exception %s (vector %d, error %#x) at rip=%#x%s after %s instructions"
                                 % (what, vec, err, at, extra, n))
        if "intr" in info:
            vec, rip = info["intr"]
            if vec == 3 and rip - 1 in _disp8.unfixable:
                raise EmulationError("this Bochs build scales VDPBF16PS's disp8 by %d, not the "
                                     "operand size, and the displacement cannot be rescaled: %s"
                                     % (_disp8.scale, _disp8.unfixable[rip - 1]))
            raise EmulationError("guest interrupt vector %d at rip=%#x" % info["intr"])
        if "hlt" in info:
            raise EmulationError("guest hlt at rip=%#x" % info["hlt"])
        if "error" in info:
            raise EmulationError("guest touched unknown guest-physical address %#x" % info["error"][1])
        raise EmulationError("emulation stopped unexpectedly at rip=%#x" % _lib.bochscpu_cpu_rip(_cpu))



# ----------------------------------------------------------------------------------------
# Helpers for callers
# ----------------------------------------------------------------------------------------
class CffiLib:
    """A cffi ``lib`` (ABI mode) whose functions run under the emulator: each call converts
    the arguments (integers, pointers, arrays; ``None`` is NULL) to 64-bit integers, runs the
    function with :func:`call` and converts rax back to the declared result type. Functions
    named in ``native``, and everything that is not a function (constants), pass through.
    ``calls`` and ``instructions`` count what ran emulated. ``path`` is the shared object's
    file, added to :data:`LIBRARIES` (the guest may touch its pages)."""

    def __init__(self, lib, ffi, path, native=()):
        self._lib, self._ffi, self._native = lib, ffi, frozenset(native)
        name = os.path.basename(path)
        if name not in LIBRARIES:
            LIBRARIES.append(name)
        self.calls = 0
        self.instructions = 0

    def _arg(self, a):
        if a is None:
            return 0
        if isinstance(a, int):
            return a & 0xFFFF_FFFF_FFFF_FFFF
        kind = self._ffi.typeof(a).kind
        if kind in ("pointer", "function", "array"):
            return int(self._ffi.cast("uintptr_t", a))
        return int(a) & 0xFFFF_FFFF_FFFF_FFFF

    def __getattr__(self, name):
        f = getattr(self._lib, name)
        if name in self._native or not isinstance(f, self._ffi.CData):
            return f
        t = self._ffi.typeof(f)
        if t.kind != "function":
            return f
        if t.ellipsis or len(t.args) > 6 or any(
                a.kind in ("struct", "union") or a.cname in ("float", "double") for a in t.args):
            raise TypeError(f"{name}: only up to 6 integer or pointer arguments can be emulated")
        addr = int(self._ffi.cast("uintptr_t", f))
        res = t.result

        def emulated(*args):
            if len(args) != len(t.args):
                raise TypeError(f"{name}() takes {len(t.args)} arguments ({len(args)} given)")
            rax = call(addr, [self._arg(a) for a in args])
            self.calls += 1
            self.instructions += last_stats.get("instructions") or 0
            if res.kind == "pointer":
                return self._ffi.cast(res, rax)
            if res.kind == "void":
                return None
            bits = 8 * self._ffi.sizeof(res)
            v = rax & ((1 << bits) - 1)
            unsigned = res.kind == "primitive" and (res.cname.startswith("uint")
                                                    or res.cname in ("size_t", "_Bool", "bool"))
            if not unsigned and v >> (bits - 1):
                v -= 1 << bits
            return v

        emulated.__name__ = name
        return emulated


def _cleanup():
    # Drop nanobind objects before interpreter teardown (otherwise a segfault at exit).
    global _sess
    _sess = None
    import gc
    gc.collect()


import atexit  # noqa: E402
atexit.register(_cleanup)
