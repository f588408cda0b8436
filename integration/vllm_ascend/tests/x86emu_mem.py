"""x86emu's guest memory (x86emu.py runs the CPU and re-exports EmulationError, LIBRARIES and
the helpers its callers use): bochscpu loaded and its C API declared (ctypes), libc helpers,
the guest's 4-level page tables binding the host's mappings (guest virtual addresses are host
virtual addresses), and the VDPBF16PS disp8 fix (_Disp8Fix) whose patched code pages they bind.
"""
from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import time
from array import array

PAGE = 0x1000
HUGE = 0x200000
# Shared objects (file-name prefixes) mapped into the guest besides anonymous memory: the C
# library, the loader (thread-local storage), libgcc_s (unwinding). Callers add the library
# under test (x86emu's :class:`CffiLib` adds the one it wraps when given its path).
SYSTEM_LIBRARIES = ("libc.so", "libc-", "ld-linux", "libgcc_s", "libm.so", "libm-")
LIBRARIES = list(SYSTEM_LIBRARIES)


class EmulationError(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------
# Import bochscpu. The 0.4.0 wheel (tagged manylinux_2_28) references the unversioned
# glibc-2.38 symbols __isoc23_strtoull / __isoc23_sscanf; on older glibc we build a tiny
# forwarding shim (isoc23_shim.c) and load it RTLD_GLOBAL before the extension.
# ----------------------------------------------------------------------------------------
_SHIM_SRC = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }
int __isoc23_sscanf(const char *s, const char *f, ...) {
    va_list ap; va_start(ap, f); int r = vsscanf(s, f, ap); va_end(ap); return r; }
"""


def _load_bochscpu():
    try:
        import bochscpu  # noqa: F401
    except ImportError as e:
        if "__isoc23" not in str(e):
            raise
        shim = os.environ.get("EMU_ISOC23_SHIM")
        if not shim:
            # Built per process into a temporary folder (a C compiler is needed; the tests
            # have one): nothing is written outside it.
            d = tempfile.mkdtemp(prefix="x86emu-shim-")
            src = os.path.join(d, "isoc23_shim.c")
            with open(src, "w") as f:
                f.write(_SHIM_SRC)
            shim = os.path.join(d, "libisoc23_shim.so")
            cc = os.environ.get("CC", "cc")
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", shim, src], check=True)
        ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)
        sys.modules.pop("bochscpu", None)
        import bochscpu  # noqa: F401
    import bochscpu
    import bochscpu.memory
    return bochscpu


bochscpu = _load_bochscpu()
_mem = bochscpu.memory
_lib = ctypes.CDLL(bochscpu._bochscpu.__file__)  # raw bochscpu-ffi C API (exported)

_VP, _U32, _U64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
_lib.bochscpu_cpu_from.restype = _VP
_lib.bochscpu_cpu_from.argtypes = [_U32]
_lib.bochscpu_cpu_run.restype = None
_lib.bochscpu_cpu_run.argtypes = [_VP, _VP]  # releases the GIL (plain ctypes call)
_lib.bochscpu_cpu_stop.restype = None
_lib.bochscpu_cpu_stop.argtypes = [_VP]
for _n in ("rip", "rsp", "rax", "cr2"):
    getattr(_lib, "bochscpu_cpu_" + _n).restype = _U64
    getattr(_lib, "bochscpu_cpu_" + _n).argtypes = [_VP]
_flush_icaches = getattr(_lib, "_Z12flushICachesv")  # Bochs flushICaches(): decoded-insn cache
_flush_icaches.restype = None
_flush_icaches.argtypes = []
_MISSING_CB_T = ctypes.CFUNCTYPE(None, _U64)
_lib.bochscpu_mem_missing_page.restype = None
_lib.bochscpu_mem_missing_page.argtypes = [_MISSING_CB_T]
_lib.bochscpu_mem_page_remove.restype = None
_lib.bochscpu_mem_page_remove.argtypes = [_U64]

# bochscpu_hooks_t (bochscpu-ffi src/hook.rs): ctx + 25 nullable fn pointers, in order.
_HOOK_FIELDS = ["reset", "hlt", "mwait", "cnear_branch_taken", "cnear_branch_not_taken",
                "ucnear_branch", "far_branch", "opcode", "interrupt", "exception",
                "hw_interrupt", "tlb_cntrl", "cache_cntrl", "prefetch_hint", "clflush",
                "before_execution", "after_execution", "repeat_iteration", "inp", "inp2",
                "outp", "lin_access", "phy_access", "wrmsr", "vmexit"]


class _Hooks(ctypes.Structure):
    _fields_ = [("ctx", _VP)] + [(n, _VP) for n in _HOOK_FIELDS]


_EXC_CB_T = ctypes.CFUNCTYPE(None, _VP, _U32, _U32, _U32)
_INT_CB_T = ctypes.CFUNCTYPE(None, _VP, _U32, _U32)
_HLT_CB_T = ctypes.CFUNCTYPE(None, _VP, _U32)

# ----------------------------------------------------------------------------------------
# libc helpers
# ----------------------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = _VP
_libc.mmap.argtypes = [_VP, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.syscall.restype = ctypes.c_long


def _mmap(size, prot=3):
    p = _libc.mmap(None, size, prot, 0x22, -1, 0)  # MAP_PRIVATE|MAP_ANONYMOUS
    if p in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    return p


def _host_fs_base():
    out = ctypes.c_uint64(0)
    r = _libc.syscall(ctypes.c_long(158), ctypes.c_long(0x1003), ctypes.byref(out))  # arch_prctl(ARCH_GET_FS)
    if r != 0:
        raise OSError(ctypes.get_errno(), "arch_prctl(ARCH_GET_FS) failed")
    return out.value



class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", _VP),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", _VP)]


def _symbol(a):
    info = _DlInfo()
    if not _libc.dladdr(_VP(a), ctypes.byref(info)) or not info.dli_fname:
        return None
    name = os.path.basename(info.dli_fname.decode(errors="replace"))
    if info.dli_sname:
        return "%s!%s+%#x" % (name, info.dli_sname.decode(errors="replace"), a - info.dli_saddr)
    return "%s+%#x" % (name, a - info.dli_fbase)


# ----------------------------------------------------------------------------------------
# Guest physical memory / page tables
# ----------------------------------------------------------------------------------------
_PT_GPA_BASE = 0x0010_0000      # page-table pages live at [1 MiB, 1 GiB)
_PT_GPA_LIMIT = 0x4000_0000
_DATA_GPA_BASE = 0x4000_0000    # 2 MiB "chunks" of guest-visible memory from 1 GiB up
_DATA_GPA_LIMIT = 1 << 39       # stay below Bochs' physical-address width
_P, _RW, _US, _PS = 1, 2, 4, 0x80
_NX = 1 << 63


class _PhysMem:
    def __init__(self):
        self.pt_pages = []          # [(gpa, hva)] pool, reused on rebuild
        self.pt_used = 0
        self.chunk_gpa = {}         # va 2MiB chunk -> gpa 2MiB chunk (permanent; VA==HVA)
        self.next_chunk = _DATA_GPA_BASE
        self.bound = {}             # gpa page -> the host page bound to it: its VA
                                    # (chunk_gpa never changes), or a patched copy (_Disp8Fix)
        self.maps_key = None
        self.pml4 = None
        self.stats = {}

    # -- table pages -------------------------------------------------------------------
    def _new_table(self):
        if self.pt_used == len(self.pt_pages):
            n = 512  # grow by 2 MiB of table pages
            base = _mmap(n * PAGE)
            g0 = _PT_GPA_BASE + len(self.pt_pages) * PAGE
            if g0 + n * PAGE > _PT_GPA_LIMIT:
                raise EmulationError("page-table pool exhausted")
            for i in range(n):
                _mem.page_insert(g0 + i * PAGE, base + i * PAGE)
                self.pt_pages.append((g0 + i * PAGE, base + i * PAGE))
        gpa, hva = self.pt_pages[self.pt_used]
        self.pt_used += 1
        ctypes.memset(hva, 0, PAGE)
        return gpa, hva

    def _chunk(self, va2m):
        g = self.chunk_gpa.get(va2m)
        if g is None:
            g = self.next_chunk
            if g + HUGE > _DATA_GPA_LIMIT:
                raise EmulationError("guest physical space exhausted (> 512 GiB mapped)")
            self.next_chunk += HUGE
            self.chunk_gpa[va2m] = g
        return g

    # -- /proc/self/maps ---------------------------------------------------------------
    @staticmethod
    def _read_maps():
        """The readable mappings the guest may touch: anonymous memory, the heap and stacks,
        and the shared objects whose file name starts with one of :data:`LIBRARIES` (the
        bulk of a process's mappings, e.g. torch's libraries, stays out: touching it faults
        with its address named)."""
        with open("/proc/self/maps", "rb") as f:
            text = f.read()
        regions = []
        for line in text.splitlines():
            parts = line.split(None, 5)
            rng, perms = parts[0], parts[1]
            name = parts[5].strip() if len(parts) > 5 else b""
            if perms[0:1] != b"r" or name in (b"[vsyscall]", b"[vvar]", b"[vvar_vclock]"):
                continue
            if name.startswith(b"/") and not os.path.basename(name).decode(
                    errors="replace").startswith(tuple(LIBRARIES)):
                continue
            lo, hi = (int(x, 16) for x in rng.split(b"-"))
            if hi > (1 << 47):
                continue
            regions.append((lo, hi, perms[1:2] == b"w", perms[2:3] == b"x"))
            if perms[2:3] == b"x" and name.startswith(b"/"):
                _disp8.note_code(lo, hi, os.path.basename(name).decode(errors="replace"))
        return text, regions

    # -- build 4-level tables for all readable host mappings ------------------------------
    def sync(self):
        text, regions = self._read_maps()
        if text == self.maps_key:
            return False
        t0 = time.perf_counter()
        self.pt_used = 0
        self.pml4 = self._new_table()
        tables = {}  # (level, index-prefix) -> (gpa, hva) ; level 1=pdpt, 2=pd, 3=pt

        def table(level, key, parent_hva, idx):
            t = tables.get((level, key))
            if t is None:
                t = self._new_table()
                tables[(level, key)] = t
                # intermediate entries: present|rw|user, permissions decided at the leaf
                ctypes.c_uint64.from_address(parent_hva + idx * 8).value = t[0] | _P | _RW | _US
            return t

        def pd_for(va):
            i4, i3 = (va >> 39) & 511, (va >> 30) & 511
            pdpt = table(1, i4, self.pml4[1], i4)
            return table(2, (i4, i3), pdpt[1], i3)

        # split regions into 2 MiB chunks: full uniform chunk -> 2 MiB page, else 4 KiB PTEs
        per_chunk = {}
        for lo, hi, w, x in regions:
            c = lo & ~(HUGE - 1)
            while c < hi:
                a, b = max(lo, c), min(hi, c + HUGE)
                per_chunk.setdefault(c, []).append((a, b, w, x))
                c += HUGE
        n4k = n2m = 0
        for c, parts in per_chunk.items():
            pd = pd_for(c)
            g = self._chunk(c)
            pdi = (c >> 21) & 511
            if len(parts) == 1 and parts[0][0] == c and parts[0][1] == c + HUGE:
                w, x = parts[0][2], parts[0][3]
                e = g | _P | _US | _PS | (_RW if w else 0) | (0 if x else _NX)
                ctypes.c_uint64.from_address(pd[1] + pdi * 8).value = e
                n2m += 1
                continue
            ptg, pth = self._new_table()
            ctypes.c_uint64.from_address(pd[1] + pdi * 8).value = ptg | _P | _RW | _US
            ents = array("Q", bytes(PAGE))
            for a, b, w, x in parts:
                i0, i1 = (a - c) >> 12, (b - c) >> 12
                fl = _P | _US | (_RW if w else 0)
                first = g + (a - c)
                vals = array("Q", range(first | fl, first + (i1 - i0) * PAGE, PAGE))
                if not x:
                    vals = array("Q", (v | _NX for v in vals))
                ents[i0:i1] = vals
                n4k += i1 - i0
            ctypes.memmove(pth, ents.tobytes(), PAGE)
        # Bind every mapped page now, natively: binding allocates (bochscpu's page map), which a
        # callback in the middle of the guest's run must not do (the guest may hold a malloc
        # lock: it runs glibc's malloc on this process's memory).
        _disp8.scan()
        n_new = 0
        for lo, hi, _, _ in regions:
            for va in range(lo, hi, PAGE):
                c = va & ~(HUGE - 1)
                gpa = self.chunk_gpa[c] + (va - c)
                hva = _disp8.page(va)
                if self.bound.get(gpa) != hva:
                    if gpa in self.bound:
                        _lib.bochscpu_mem_page_remove(gpa)
                    _mem.page_insert(gpa, hva)
                    self.bound[gpa] = hva
                    n_new += 1
        self.maps_key = text
        self.stats = {"regions": len(regions), "pages_2m": n2m, "pages_4k": n4k, "bound": n_new,
                      "table_pages": self.pt_used, "build_s": time.perf_counter() - t0,
                      "bf16_disp8_patched": _disp8.patched}
        return True


# ----------------------------------------------------------------------------------------
# VDPBF16PS with an 8-bit displacement: this Bochs build scales EVEX's compressed disp8 of
# VDPBF16PS (F3.0F38.W0 52) by 4 where the SDM scales a full-vector operand by its size (64 for
# zmm), so `vdpbf16ps zmm0, zmm1, [rsi+0x40]` (disp8 = 1) reads [rsi+4]: a wrong result, no
# fault. Compilers emit that form (an unrolled loop over a row's 64-byte chunks). The scale
# this build applies is measured once on the emulated CPU (_probe_bf16_disp8, on models with
# AVX512_BF16); where it is wrong, the guest sees a patched copy of every code page of the
# libraries under test that holds such an instruction (found by objdump over the mapped
# code), with the displacement rewritten so that the wrong scale gives the right address
# (disp8 * 64 / 4 must fit in a byte: disp8 -8..7). One that does not fit gets int3 in its
# place, and reaching it raises EmulationError naming it: never a silent wrong read. The host
# keeps running the original bytes (guest addresses are host addresses, but a guest page can
# be backed by other host memory).
# ----------------------------------------------------------------------------------------
class _Disp8Fix:
    def __init__(self):
        self.scale = None       # the scale Bochs applies (64 = right: nothing to patch)
        self.code = {}          # (lo, hi) -> library name, executable regions not yet scanned
        self.scanned = set()
        self.copies = {}        # code page VA -> host address of its patched copy
        self.unfixable = {}     # instruction VA -> description (int3 in the copy)
        self.patched = 0

    def note_code(self, lo, hi, name):
        # The system libraries hold no VDPBF16PS: only the libraries under test are scanned.
        if not name.startswith(SYSTEM_LIBRARIES) and (lo, hi) not in self.scanned:
            self.code[(lo, hi)] = name

    def page(self, va):
        """The host memory backing guest page `va`: its patched copy, or itself."""
        return self.copies.get(va, va)

    def scan(self):
        """Patches the code regions noted since the last scan, where the scale is wrong."""
        if self.scale in (None, 64):
            return
        for (lo, hi), name in list(self.code.items()):
            del self.code[(lo, hi)]
            self.scanned.add((lo, hi))
            for at in self._instructions(lo, hi):
                self._patch(at, "%s+%#x" % (name, at - lo))

    @staticmethod
    def _instructions(lo, hi):
        """Addresses of the VDPBF16PS with a memory operand in [lo, hi) (objdump's linear
        disassembly of the mapped bytes)."""
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            f.write(ctypes.string_at(lo, hi - lo))
            f.flush()
            out = subprocess.run(["objdump", "-D", "-b", "binary", "-m", "i386:x86-64",
                                  "--adjust-vma=%#x" % lo, f.name],
                                 capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if "vdpbf16ps" in line and "(" in line:
                yield int(line.split(":", 1)[0], 16)

    def _patch(self, at, where):
        b = ctypes.string_at(at, 8)
        p0, p1, p2, modrm = b[1], b[2], b[3], b[5]
        evex = b[0] == 0x62 and p0 & 3 == 2 and p1 & 0x83 == 2 and b[4] == 0x52
        if not evex or modrm >> 6 != 1 or p2 & 0x10:
            return                                  # not disp8, or a broadcast (scaled by 4)
        n = 16 << ((p2 >> 5) & 3)                   # the operand's size: 16, 32 or 64 bytes
        pos = 7 if modrm & 7 == 4 else 6            # after the SIB byte, if any
        disp = struct.unpack("b", b[pos:pos + 1])[0]
        new = disp * n // self.scale
        page = at & ~(PAGE - 1)
        # An instruction crossing a page is patched in both copies (each byte in its own page).
        for pg in {page, (at + pos) & ~(PAGE - 1)}:
            if pg not in self.copies:
                c = _mmap(PAGE)
                ctypes.memmove(c, pg, PAGE)
                self.copies[pg] = c
        if disp * n % self.scale == 0 and -128 <= new <= 127:
            ctypes.c_int8.from_address(self.copies[(at + pos) & ~(PAGE - 1)] + (at + pos) % PAGE).value = new
            self.patched += 1
        else:
            ctypes.c_uint8.from_address(self.copies[page] + at % PAGE).value = 0xCC
            self.unfixable[at] = "%s (mapping offset): vdpbf16ps with disp8 %d (x%d)" % (where, disp, n)


_disp8 = _Disp8Fix()
