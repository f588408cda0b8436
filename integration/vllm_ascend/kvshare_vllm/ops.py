"""kvshare's paged attention, KV write and page copy on torch tensors (vLLM / vLLM-Ascend).

Each op is one ``kvs_`` launch: tensors cross as ``data_ptr()`` plus explicit shapes and strides
(in elements) and a dtype code; nothing is copied except small host arrays (context lengths,
query starts) and, where asked for, an int64 block table narrowed to int32.

* :func:`paged_attention`: decode (``query_start_loc=None``, one query token per sequence) or
  varlen prefill / chunked prefill (causal within each sequence) over paged K/V caches.
* :func:`reshape_and_cache`: scatters new K/V into the caches by slot mapping (vLLM's
  ``reshape_and_cache``; negative slots are padding and are skipped).
* :func:`copy_pages`: the page copies kvshare's cache manager reports (copy-on-write, swap).

An engine that runs both every step on the same caches keeps one :class:`KvCaches` per layer
(the caches checked once) and builds one :class:`AttentionBatch` per step (block table and
lengths checked and converted once for all layers), then calls :meth:`KvCaches.write` and
:meth:`KvCaches.attend`: only the step's own tensors are checked per call. The two functions
above are exactly that, made for one call.

Backends: CPU tensors run on one cached CPU ``kvs_backend`` per process (synchronous), whose
work runs on torch's own OpenMP threads (``kvs_backend_new_cpu_team`` given the
``GOMP_parallel`` of the OpenMP runtime torch loaded) rather than on threads of kvshare's own,
which would compete with torch's spinning ones for the cores; ``KVSHARE_OPS_CPU_TEAM=own`` keeps
kvshare's own pool (also used when no OpenMP runtime is found). NPU
tensors (``device.type == "npu"``, torch_npu) run on an ASCEND ``kvs_backend`` bound to the
tensor's device, launched on ``torch.npu.current_stream(device).npu_stream`` (asynchronous, like
any NPU op). **The NPU path has never run**: it was written against torch_npu's documented API
and kvshare's Ascend backend (itself verified only against an emulated CANN runtime).

Cache layout: each of K and V is indexed ``[num_blocks, block_size, num_kv_heads, head_dim]``
(vLLM's and vllm-ascend 0.23.0's per-layer layout; a fused ``kv_cache[2, ...]`` is passed as
``kv_cache[0], kv_cache[1]``). Any strides with a contiguous ``head_dim`` are accepted, so a
heads-major cache ``[num_blocks, num_kv_heads, block_size, head_dim]`` is passed as
``cache.transpose(1, 2)``. NPU private formats (FRACTAL_NZ) are refused.

Errors: arguments are checked first (devices, dtypes, ranks, shapes; ``ops_checks.py``) and raise
:class:`OpsArgumentError` (a ``ValueError``; ``TypeError`` subclass :class:`OpsDtypeError` for
dtypes) whose ``field`` names the argument; kvshare's own validation raises
:class:`kvshare.KvsError` subclasses (``AttnInvalidArgumentError``, ``UnsupportedError``, ...)
carrying the library's message, which names the field of the C struct.

The ``ascend_*`` functions at the end are the hooks the vllm-ascend 0.23.0 patch
(``integration/vllm_ascend/patches/``) calls when ``KVSHARE_VLLM_OPS=1``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any

import torch

import kvshare
from kvshare import check, ffi, lib

from .ops_checks import (_DTYPES, KV_FORMATS, OpsArgumentError, OpsDtypeError, _check_device,
                         _dtype_code, _host_i32, _layout, _outer_strides, _same_device, _tensor,
                         _tokens_heads, _torch_npu)

__all__ = [
    "paged_attention", "reshape_and_cache", "copy_pages", "KvCaches", "AttentionBatch",
    "OpsArgumentError", "OpsDtypeError",
    "enabled", "cpu_backend", "backend_for", "describe_backend", "huge_pages",
    "ascend_decode", "ascend_kv_write",
]

log = logging.getLogger("vllm.kvshare_vllm.ops")  # see kvshare_vllm.logger

ENV_ENABLE = "KVSHARE_VLLM_OPS"
ENV_CPU_THREADS = "KVSHARE_OPS_CPU_THREADS"
# "openmp" (the default): the CPU backend runs on torch's OpenMP team; "own": its own pool.
ENV_CPU_TEAM = "KVSHARE_OPS_CPU_TEAM"
# "0" keeps kvshare's CPU attention backend from asking for 2 MiB pages on vLLM's KV cache.
ENV_HUGE_PAGES = "KVSHARE_CPU_HUGE_PAGES"

_SLOT_TYPES = {torch.int32: lib.KVS_INDEX_TYPE_INT32, torch.int64: lib.KVS_INDEX_TYPE_INT64}
_COPY_KINDS = {
    "d2d": lib.KVS_COPY_KIND_DEVICE_TO_DEVICE,
    "d2h": lib.KVS_COPY_KIND_DEVICE_TO_HOST,
    "h2d": lib.KVS_COPY_KIND_HOST_TO_DEVICE,
}
# cffi parses a C type string with pycparser the first time it sees it (about a millisecond
# each) and caches it: parse the ones every step uses here, at import, instead of in the engine's
# first step (whose attention otherwise took 14 ms more). The per-call ones are kept as type
# objects, which ffi.new / ffi.cast take without looking the string up again.
_VOID_P = ffi.typeof("void *")
_CONST_VOID_P = ffi.typeof("const void *")
_CONST_I32_P = ffi.typeof("const int32_t *")
_ATTENTION_ARGS = ffi.typeof("kvs_attention_args *")
_KV_WRITE_ARGS = ffi.typeof("kvs_kv_write_args *")
_KV_SCALES = ffi.typeof("kvs_kv_scales *")
for _ctype in ("kvs_kv_layout *", "kvs_huge_pages_report *", "size_t *", "char[]",
               "kvs_backend **", "kvs_backend_options *", "kvs_cpu_team *",
               "kvs_cpu_parallel_fn"):
    ffi.typeof(_ctype)
del _ctype


def enabled() -> bool:
    """Whether ``KVSHARE_VLLM_OPS=1`` (read on every call: cheap, and tests can flip it)."""
    return os.environ.get(ENV_ENABLE, "") == "1"


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------

_lock = threading.Lock()
_backends: dict[Any, Any] = {}  # (pid, kind, device index) -> kvs_backend* (ffi.gc)


# The OpenMP runtime's library object (ctypes), kept so it is never closed while kvshare may
# call into it.
_openmp_libs: list[Any] = []


def _openmp_parallel() -> tuple[int | None, str]:
    """``(address of GOMP_parallel, where it came from)`` of the OpenMP runtime this process has
    loaded for torch (libgomp in PyTorch's Linux wheels; LLVM's libomp and Intel's libiomp5
    export it too), or ``(None, why not)``."""
    if not torch._C.has_openmp:
        return None, "torch was built without OpenMP"
    names = ("libgomp", "libiomp5", "libomp")
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if any(n in line for n in names)}
    except OSError as e:
        return None, f"cannot read /proc/self/maps: {e}"
    paths = sorted(p for p in paths if os.path.basename(p).startswith(names))
    if not paths:
        return None, "no OpenMP runtime is loaded"
    # torch's own copy first (its wheels ship one under torch/lib).
    torch_dir = os.path.dirname(torch.__file__)
    paths.sort(key=lambda p: not p.startswith(torch_dir))
    import ctypes  # a symbol's address without parsing C declarations (cffi's cdef costs ~30 ms)

    try:
        rt = ctypes.CDLL(paths[0])  # already loaded: the same library, one more reference
        addr = ctypes.cast(rt.GOMP_parallel, ctypes.c_void_p).value
    except (OSError, AttributeError) as e:
        return None, f"{paths[0]} has no GOMP_parallel: {e}"
    _openmp_libs.append(rt)
    return addr, paths[0]


def _new_cpu_backend():
    """The CPU backend: on torch's OpenMP team unless ``KVSHARE_OPS_CPU_TEAM=own`` or no OpenMP
    runtime is found (then kvshare's own pool); threads: ``$KVSHARE_OPS_CPU_THREADS``, else
    torch's thread count (team) or the machine's (own pool)."""
    threads = int(os.environ.get(ENV_CPU_THREADS, "0") or 0)
    how = os.environ.get(ENV_CPU_TEAM, "openmp") or "openmp"
    if how not in ("openmp", "own"):
        raise OpsArgumentError(ENV_CPU_TEAM, f"{how!r} is not 'openmp' or 'own'")
    if how == "openmp":
        addr, where = _openmp_parallel()
        if addr is not None:
            team = ffi.new("kvs_cpu_team *")
            team.parallel = ffi.cast("kvs_cpu_parallel_fn", addr)
            team.num_threads = threads or torch.get_num_threads()
            out = ffi.new("kvs_backend **")
            check(lib.kvs_backend_new_cpu_team(team, out), "kvs_backend_new_cpu_team")
            log.info("kvshare ops: CPU backend on torch's OpenMP team (%d threads, GOMP_parallel "
                     "of %s)", team.num_threads, where)
            return ffi.gc(out[0], lib.kvs_backend_free)
        log.info("kvshare ops: CPU backend on its own threads: %s", where)
    return _kvs_backend_new(lib.KVS_BACKEND_KIND_CPU, num_threads=threads)


def _kvs_backend_new(kind: int, *, num_threads: int = 0, device_id: int = 0):
    """``kvs_backend_new`` of ``kind`` with these options, freed with the returned object."""
    opts = ffi.new("kvs_backend_options *")
    opts.num_threads, opts.device_id = num_threads, device_id
    out = ffi.new("kvs_backend **")
    check(lib.kvs_backend_new(kind, opts, out), "kvs_backend_new")
    return ffi.gc(out[0], lib.kvs_backend_free)


def _new_backend(kind: int, device_id: int = 0):
    if kind == lib.KVS_BACKEND_KIND_CPU:
        return _new_cpu_backend()
    return _kvs_backend_new(kind, device_id=device_id)


def _cached_backend(kind: int, device_id: int):
    # Keyed by pid: a forked child must not use the parent's worker threads (they do not exist
    # there); it makes its own backend.
    key = (os.getpid(), kind, device_id)
    b = _backends.get(key)
    if b is None:
        with _lock:
            b = _backends.get(key)
            if b is None:
                b = _new_backend(kind, device_id)
                _backends[key] = b
    return b


def cpu_backend():
    """The process's CPU ``kvs_backend*`` (see :func:`_new_cpu_backend`)."""
    return _cached_backend(lib.KVS_BACKEND_KIND_CPU, 0)


def backend_for(device: torch.device):
    """``(kvs_backend*, stream)`` for tensors on ``device``: the CPU backend and NULL, or the
    ASCEND backend bound to the NPU's index and its current stream (untested: no NPU here)."""
    if device.type == "cpu":
        return cpu_backend(), ffi.NULL
    if device.type == "npu":  # pragma: no cover - needs torch_npu and an Ascend NPU
        _torch_npu()
        index = device.index if device.index is not None else torch.npu.current_device()
        b = _cached_backend(lib.KVS_BACKEND_KIND_ASCEND, int(index))
        stream = torch.npu.current_stream(index).npu_stream
        return b, ffi.cast(_VOID_P, int(stream))
    raise OpsArgumentError("device", f"{device} is not supported: kvshare ops take CPU tensors, "
                                     "or NPU tensors (torch_npu) for the Ascend backend")


def describe_backend(device: torch.device | str = "cpu") -> str:
    """``kvs_backend_describe`` of the backend used for ``device`` (for logs)."""
    b, _ = backend_for(torch.device(device))
    n = ffi.new("size_t *")
    check(lib.kvs_backend_describe(b, ffi.NULL, 0, n), "kvs_backend_describe")
    buf = ffi.new("char[]", n[0] + 1)
    check(lib.kvs_backend_describe(b, buf, n[0] + 1, n), "kvs_backend_describe")
    return ffi.string(buf).decode()


def huge_pages(t: torch.Tensor, *, collapse: bool = True) -> tuple[int, int]:
    """``kvs_cpu_huge_pages`` on all the memory of a CPU tensor's storage (a KV cache: the whole
    allocation, whatever view ``t`` is): asks Linux for 2 MiB pages there, and with ``collapse``
    (``KVS_HUGE_PAGES_MODE_COLLAPSE``) moves the pages already written onto them now, contents
    kept. Returns ``(advised_bytes, huge_bytes)``: the whole 2 MiB pages inside the storage and
    how many bytes of them are on huge pages afterwards. Raises :class:`OpsArgumentError` for a
    tensor not on the CPU, :class:`kvshare.UnsupportedError` where the kernel has no
    transparent huge pages."""
    t = _tensor("t", t)
    if t.device.type != "cpu":
        raise OpsArgumentError("t", f"is on {t.device}: huge pages are for host (CPU) memory")
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return 0, 0
    report = ffi.new("kvs_huge_pages_report *")
    mode = lib.KVS_HUGE_PAGES_MODE_COLLAPSE if collapse else lib.KVS_HUGE_PAGES_MODE_ADVISE
    check(lib.kvs_cpu_huge_pages(ffi.cast(_VOID_P, storage.data_ptr()), storage.nbytes(), mode,
                                 report), "kvs_cpu_huge_pages")
    return int(report.advised_bytes), int(report.huge_bytes)


# ---------------------------------------------------------------------------------------------
# Argument checks (the rest: ops_checks.py)
# ---------------------------------------------------------------------------------------------

def _i32_ptr(t: torch.Tensor):
    return ffi.cast(_CONST_I32_P, t.data_ptr())


# ---------------------------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------------------------

class KvCaches:
    """One layer's K and V caches, checked once (tensors, device, dtype, shape, strides) and held
    as kvshare's ``kvs_kv_layout``.

    :func:`paged_attention` and :func:`reshape_and_cache` build one per call. An engine that calls
    both on the same caches every step (kvshare's CPU attention backend) keeps one per layer for
    as long as its cache tensor lives and calls :meth:`attend` and :meth:`write` on it, so only
    the step's own tensors are checked per call. The caches' shape, strides and storage must not
    change while it is kept (vLLM allocates its KV cache once).

    Quantized caches: ``kv_format`` ``"fp8_e4m3"`` or ``"fp8_e5m2"`` names what a uint8 cache
    pair holds (vLLM allocates its fp8 caches as uint8); ``float8_e4m3fn`` / ``float8_e5m2``
    tensors need no name. :meth:`write` and :meth:`attend` then take the layer's per-tensor
    ``k_scale`` and ``v_scale`` (vLLM's ``layer._k_scale_float``, ``_v_scale_float``): the write
    stores ``round(x / scale)`` (to nearest, ties to even, saturating), attention reads the
    stored bytes and folds the scales into the query and the output
    (``kvs_kv_write_scaled``, ``kvs_attention_launch_scaled``; no dequantized copy)."""

    __slots__ = ("key_cache", "value_cache", "device", "layout", "_key_ptr", "_value_ptr",
                 "_cpu", "_scales")

    def __init__(self, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 kv_format: str | None = None) -> None:
        self.key_cache = _tensor("key_cache", key_cache)
        self.value_cache = _tensor("value_cache", value_cache)
        self.device = _check_device("key_cache", key_cache)
        _same_device(self.device, value_cache=value_cache)
        _check_device("value_cache", value_cache)
        self.layout = _layout(key_cache, value_cache, kv_format)
        self._key_ptr = ffi.cast(_VOID_P, key_cache.data_ptr())
        self._value_ptr = ffi.cast(_VOID_P, value_cache.data_ptr())
        self._cpu = self.device.type == "cpu"
        # (k_scale, v_scale, their kvs_kv_scales): the last scales asked for, kept since an
        # engine's layer passes the same two every step.
        self._scales: tuple = (1.0, 1.0, ffi.NULL)

    @property
    def quantized(self) -> bool:
        """Whether the caches hold a quantized format (``kv_format`` or a float8 dtype)."""
        return self.layout.dtype in KV_FORMATS.values()

    def _kv_scales(self, k_scale: float, v_scale: float):
        """The ``kvs_kv_scales *`` of these per-tensor scales (NULL for 1 and 1: an unscaled
        cache); kvshare checks them (finite, > 0) at the launch."""
        kept_k, kept_v, kept = self._scales
        if k_scale == kept_k and v_scale == kept_v:
            return kept
        for field, x in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not isinstance(x, (int, float)):
                raise OpsArgumentError(field, f"{x!r} is not a number")
        sc = ffi.NULL
        if (k_scale, v_scale) != (1.0, 1.0):
            sc = ffi.new(_KV_SCALES)
            sc.k_scale, sc.v_scale = float(k_scale), float(v_scale)
            sc.k_channel_scales = sc.v_channel_scales = ffi.NULL
        self._scales = (k_scale, v_scale, sc)
        return sc

    def _backend(self):
        """``backend_for(self.device)``, without reading the device's type on every call."""
        return (cpu_backend(), ffi.NULL) if self._cpu else backend_for(self.device)

    def attend(self, query: torch.Tensor, out: torch.Tensor, batch: "AttentionBatch", *,
               scale: float, num_kv_heads: int, softcap: float = 0.0,
               sliding_window: int = 0, k_scale: float = 1.0,
               v_scale: float = 1.0) -> torch.Tensor:
        """Paged attention of ``batch``'s sequences over these caches into ``out`` (arguments as
        in :func:`paged_attention`; ``k_scale``, ``v_scale``: the caches' per-tensor scales, as
        given to :meth:`write`); returns ``out``."""
        query, out = _tensor("query", query), _tensor("out", out)
        device = _check_device("query", query)
        if out.device != device:
            _same_device(device, out=out)
        _check_device("out", out)
        if self.device != device:
            raise OpsArgumentError("key_cache", f"is on {self.device}, the query on {device}")
        if batch.device != device:
            raise OpsArgumentError("block_table", f"is on {batch.device}, the query on {device}")
        q_code, o_code = _dtype_code("query", query), _dtype_code("out", out)
        lay = self.layout
        head_dim = lay.head_dim
        if num_kv_heads != lay.num_kv_heads:
            raise OpsArgumentError("num_kv_heads", f"is {num_kv_heads}, but key_cache has "
                                                   f"{lay.num_kv_heads} kv heads (dimension 2)")
        q_rows, num_heads, q_ts, q_hs = _tokens_heads("query", query, head_dim)
        o_rows, o_heads, o_ts, o_hs = _tokens_heads("out", out, head_dim)
        if o_heads != num_heads:
            raise OpsArgumentError("out", f"has {o_heads} heads, query has {num_heads}")
        num_tokens = batch.num_tokens
        if num_tokens == 0:
            return out
        if q_rows < num_tokens:
            raise OpsArgumentError("query", f"has {q_rows} rows for {num_tokens} query tokens")
        if o_rows < num_tokens:
            raise OpsArgumentError("out", f"has {o_rows} rows for {num_tokens} query tokens")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise OpsArgumentError("scale", f"{scale!r} is not a finite number > 0")

        a = ffi.new(_ATTENTION_ARGS)
        a.num_seqs, a.num_tokens, a.num_heads = batch.num_seqs, num_tokens, num_heads
        a.query = ffi.cast(_CONST_VOID_P, query.data_ptr())
        a.query_dtype, a.query_token_stride, a.query_head_stride = q_code, q_ts, q_hs
        a.output = ffi.cast(_VOID_P, out.data_ptr())
        a.output_dtype, a.output_token_stride, a.output_head_stride = o_code, o_ts, o_hs
        a.key_cache, a.value_cache = self._key_ptr, self._value_ptr
        a.cache = lay[0]
        a.block_table = batch.block_table_ptr
        a.max_pages_per_seq = batch.max_pages_per_seq
        a.block_table_stride = batch.block_table_stride
        a.context_lens = batch.context_lens_ptr
        a.query_start_loc = batch.query_start_loc_ptr
        a.scale = float(scale)
        a.softcap = float(softcap or 0.0)
        a.sliding_window = int(sliding_window or 0)
        backend, stream = self._backend()
        sc = self._kv_scales(k_scale, v_scale)
        if sc is ffi.NULL:
            check(lib.kvs_attention_launch(backend, a, stream), "kvs_attention_launch")
        else:
            check(lib.kvs_attention_launch_scaled(backend, a, sc, stream),
                  "kvs_attention_launch_scaled")
        # `batch` holds its host arrays; the CPU backend is done with them here, the Ascend
        # backend reads them during the call and enqueues the rest.
        return out

    def write(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, *,
              k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        """Writes new K/V into these caches (arguments as in :func:`reshape_and_cache`), each
        key divided by ``k_scale`` and each value by ``v_scale`` as it is stored."""
        key, value = _tensor("key", key), _tensor("value", value)
        slot_mapping = _tensor("slot_mapping", slot_mapping)
        device = self.device
        if key.device != device or value.device != device or slot_mapping.device != device:
            _same_device(device, key=key, value=value, slot_mapping=slot_mapping)
        _check_device("key", key)
        _check_device("value", value)
        src_code = _dtype_code("key", key)
        if value.dtype != key.dtype:
            raise OpsDtypeError("value", f"dtype {value.dtype} differs from key's {key.dtype}")
        lay = self.layout
        if value.shape != key.shape:
            raise OpsArgumentError("value", f"shape {tuple(value.shape)} differs from key's "
                                            f"{tuple(key.shape)}")
        rows, heads, ts, hs = _tokens_heads("key", key, lay.head_dim)
        if value.stride() != key.stride():
            _, _, vts, vhs = _tokens_heads("value", value, lay.head_dim)
            if (vts, vhs) != (ts, hs):
                raise OpsArgumentError("value", f"strides {tuple(value.stride())} differ from "
                                                f"key's {tuple(key.stride())}")
        if heads != lay.num_kv_heads:
            raise OpsArgumentError("key", f"has {heads} heads, the cache has {lay.num_kv_heads} "
                                          "kv heads")
        itype = _SLOT_TYPES.get(slot_mapping.dtype)
        if itype is None:
            raise OpsDtypeError("slot_mapping", f"dtype {slot_mapping.dtype} is not int32 or "
                                                "int64")
        if slot_mapping.dim() != 1:
            raise OpsArgumentError("slot_mapping", f"expected [num_tokens], got shape "
                                                   f"{tuple(slot_mapping.shape)}")
        num_tokens = int(slot_mapping.shape[0])
        if num_tokens == 0:
            return
        if slot_mapping.stride(0) != 1:
            slot_mapping = slot_mapping.contiguous()
        if rows < num_tokens:
            raise OpsArgumentError("key", f"has {rows} rows for {num_tokens} slots")

        a = ffi.new(_KV_WRITE_ARGS)
        a.num_tokens = num_tokens
        a.key = ffi.cast(_CONST_VOID_P, key.data_ptr())
        a.value = ffi.cast(_CONST_VOID_P, value.data_ptr())
        a.src_dtype, a.src_token_stride, a.src_head_stride = src_code, ts, hs
        a.key_cache, a.value_cache = self._key_ptr, self._value_ptr
        a.cache = lay[0]
        a.slot_mapping = ffi.cast(_CONST_VOID_P, slot_mapping.data_ptr())
        a.slot_mapping_type = itype
        backend, stream = self._backend()
        sc = self._kv_scales(k_scale, v_scale)
        if sc is ffi.NULL:
            check(lib.kvs_kv_write(backend, a, stream), "kvs_kv_write")
        else:
            check(lib.kvs_kv_write_scaled(backend, a, sc, stream), "kvs_kv_write_scaled")


class AttentionBatch:
    """One step's sequences for :meth:`KvCaches.attend`: the block table, the KV lengths and the
    query starts, checked and converted to host int32 once and shared by every layer of the step
    (arguments as in :func:`paged_attention`). ``num_seqs`` and ``num_tokens`` are the
    sequences and query tokens of the launch."""

    __slots__ = ("device", "num_seqs", "num_tokens", "max_pages_per_seq", "block_table_stride",
                 "block_table_ptr", "context_lens_ptr", "query_start_loc_ptr", "_keep")

    def __init__(self, block_table: torch.Tensor, seq_lens: Any,
                 query_start_loc: Any = None) -> None:
        block_table = _tensor("block_table", block_table)
        self.device = _check_device("block_table", block_table)
        if block_table.dtype == torch.int64:
            block_table = block_table.to(torch.int32)
        elif block_table.dtype != torch.int32:
            raise OpsDtypeError("block_table", f"dtype {block_table.dtype} is not int32 (or "
                                               "int64)")
        if block_table.dim() != 2:
            raise OpsArgumentError("block_table", f"expected [num_seqs, max_blocks], got shape "
                                                  f"{tuple(block_table.shape)}")
        rows, cols = block_table.shape
        if cols > 1 and block_table.stride(1) != 1:
            block_table = block_table.contiguous()
        (self.block_table_stride,) = _outer_strides("block_table", block_table, ("num_seqs",))
        self.max_pages_per_seq = int(cols)
        lens = _host_i32("seq_lens", seq_lens)
        self.num_seqs = num_seqs = int(lens.shape[0])
        starts = None
        self.num_tokens = num_seqs
        if num_seqs:
            if rows < num_seqs:
                raise OpsArgumentError("block_table", f"has {block_table.shape[0]} rows for "
                                                      f"{num_seqs} sequences")
            if query_start_loc is not None:
                starts = _host_i32("query_start_loc", query_start_loc)
                if starts.shape[0] != num_seqs + 1:
                    raise OpsArgumentError("query_start_loc", f"has {starts.shape[0]} entries, "
                                                              f"expected num_seqs + 1 = "
                                                              f"{num_seqs + 1}")
        self.block_table_ptr = _i32_ptr(block_table)
        self.context_lens_ptr = _i32_ptr(lens)
        self.query_start_loc_ptr = ffi.NULL if starts is None else _i32_ptr(starts)
        if starts is not None:
            # The last start, read through the pointer (indexing the tensor costs more).
            self.num_tokens = int(self.query_start_loc_ptr[num_seqs])
        self._keep = (block_table, lens, starts)  # the pointers' memory


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_table: torch.Tensor, seq_lens: Any, out: torch.Tensor, *,
                    scale: float, num_kv_heads: int, query_start_loc: Any = None,
                    softcap: float = 0.0, sliding_window: int = 0) -> torch.Tensor:
    """Paged attention of one layer into ``out``; returns ``out``.

    * ``query``, ``out``: ``[num_tokens, num_heads, head_dim]`` (or ``[num_tokens, num_heads *
      head_dim]``), float32 / float16 / bfloat16 (may differ), ``head_dim`` contiguous. Only the
      first ``num_tokens`` rows are read / written (``num_seqs`` for decode, else
      ``query_start_loc[-1]``); extra (padding) rows are left alone.
    * ``key_cache``, ``value_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]`` views
      (any strides, ``head_dim`` contiguous), same dtype; ``num_kv_heads`` must match.
    * ``block_table``: int32 (int64 is narrowed, a copy) ``[>= num_seqs, max_blocks]`` on the
      query's device; row ``i`` lists sequence ``i``'s blocks, padding past
      ``ceil(seq_lens[i] / block_size)`` is not read.
    * ``seq_lens``: ``[num_seqs]`` KV lengths, this step's tokens included (written first with
      :func:`reshape_and_cache`); a tensor (any device, any integer dtype), list or array,
      converted to host int32.
    * ``query_start_loc``: ``None`` for decode, else ``[num_seqs + 1]`` cumulative query starts
      (host int32 after conversion); query token ``j`` of a sequence of length ``L`` with ``q``
      query tokens sits at position ``L - q + j`` (causal).
    * ``scale``: multiplier of ``q·k``; ``softcap`` > 0 caps logits ``c * tanh(s / c)``;
      ``sliding_window`` > 0 limits each token to that many most recent positions.

    GQA/MQA: ``num_heads`` is a multiple of ``num_kv_heads``. One call is
    ``KvCaches(key_cache, value_cache).attend(query, out, AttentionBatch(block_table, seq_lens,
    query_start_loc), ...)``.
    """
    caches = KvCaches(key_cache, value_cache)
    batch = AttentionBatch(block_table, seq_lens, query_start_loc)
    return caches.attend(query, out, batch, scale=scale, num_kv_heads=int(num_kv_heads),
                         softcap=softcap, sliding_window=sliding_window)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Writes new K/V into one layer's paged caches (vLLM's ``reshape_and_cache``).

    * ``key``, ``value``: ``[>= num_tokens, num_kv_heads, head_dim]`` (or ``[T, kv_heads *
      head_dim]``), same shape and strides, float32 / float16 / bfloat16 (converted to the cache
      dtype, round to nearest).
    * ``key_cache``, ``value_cache``: as in :func:`paged_attention`.
    * ``slot_mapping``: int32 or int64 ``[num_tokens]`` on the caches' device; token ``i`` goes to
      block ``slot // block_size``, offset ``slot % block_size``; negative slots (-1) are padding
      and skipped. ``num_tokens = slot_mapping.numel()`` (vLLM's convention: extra key rows are
      padding).
    """
    KvCaches(key_cache, value_cache).write(key, value, slot_mapping)


def copy_pages(key_cache: torch.Tensor, value_cache: torch.Tensor, copies: Any, *,
               host_key_cache: torch.Tensor | None = None,
               host_value_cache: torch.Tensor | None = None,
               kv_format: str | None = None) -> None:
    """Executes page copies on one layer's caches (call once per layer).

    ``copies`` is either a sequence of ``(src_page, dst_page, num_tokens, kind[, group])`` as
    kvshare's manager reports them (``kvshare.Cache.take_copies`` / ``seq_append``; the group
    says which layers' caches the copy is for, the caller's choice here; ``kind`` a
    ``KVS_COPY_KIND_*`` value or ``"d2d"``/``"d2h"``/``"h2d"``), or an integer tensor ``[n, 2]``
    of ``(src, dst)`` whole-page device copies (vLLM's ``copy_blocks`` argument).
    Host caches (for d2h/h2d) have the device caches' per-page shape, dtype and strides; on
    Ascend they must be page-locked host memory (``pin_memory()``). ``kv_format`` names the fp8
    format a uint8 cache pair holds (as :class:`KvCaches`; vLLM allocates its fp8 caches as
    uint8): the copies move one byte an element.
    """
    key_cache, value_cache = _tensor("key_cache", key_cache), _tensor("value_cache", value_cache)
    device = _check_device("key_cache", key_cache)
    _same_device(device, value_cache=value_cache)
    lay = _layout(key_cache, value_cache, kv_format)
    page_size = lay.page_size
    if isinstance(copies, torch.Tensor):
        if copies.dim() != 2 or copies.shape[1] != 2 or copies.dtype.is_floating_point:
            raise OpsArgumentError("copies", f"a tensor must be integer [n, 2] (src, dst), got "
                                             f"{copies.dtype} {tuple(copies.shape)}")
        rows = [(int(s), int(d), page_size, lib.KVS_COPY_KIND_DEVICE_TO_DEVICE)
                for s, d in copies.to("cpu").tolist()]
    else:
        rows = []
        for i, c in enumerate(copies):
            try:
                src, dst, n, kind = c if len(c) != 5 else c[:4]
            except (TypeError, ValueError):
                raise OpsArgumentError("copies", f"copies[{i}] = {c!r} is not (src_page, "
                                                 "dst_page, num_tokens, kind)") from None
            if isinstance(kind, str):
                if kind not in _COPY_KINDS:
                    raise OpsArgumentError("copies", f"copies[{i}] kind {kind!r} is not one of "
                                                     f"{sorted(_COPY_KINDS)}")
                kind = _COPY_KINDS[kind]
            rows.append((int(src), int(dst), int(n), int(kind)))
    if not rows:
        return
    a = ffi.new("kvs_kv_copy_args *")
    a.key_cache = ffi.cast(_VOID_P, key_cache.data_ptr())
    a.value_cache = ffi.cast(_VOID_P, value_cache.data_ptr())
    a.cache = lay[0]
    if host_key_cache is not None or host_value_cache is not None:
        if host_key_cache is None or host_value_cache is None:
            raise OpsArgumentError("host_key_cache" if host_key_cache is None
                                   else "host_value_cache", "both host caches are needed")
        for f, t in (("host_key_cache", host_key_cache), ("host_value_cache", host_value_cache)):
            _tensor(f, t)
            if t.device.type != "cpu":
                raise OpsArgumentError(f, f"is on {t.device}; host caches are CPU tensors")
            if t.dtype != key_cache.dtype:
                raise OpsDtypeError(f, f"dtype {t.dtype} differs from key_cache's "
                                       f"{key_cache.dtype}")
            if tuple(t.shape[1:]) != tuple(key_cache.shape[1:]) or \
                    (t.shape[0] > 1 and tuple(t.stride()) != tuple(key_cache.stride())):
                raise OpsArgumentError(f, f"shape {tuple(t.shape)} / strides {tuple(t.stride())} "
                                          "do not match key_cache's per-page shape "
                                          f"{tuple(key_cache.shape[1:])} and strides "
                                          f"{tuple(key_cache.stride())}")
        if host_value_cache.shape != host_key_cache.shape:
            raise OpsArgumentError("host_value_cache", "shape differs from host_key_cache's")
        a.host_key_cache = ffi.cast(_VOID_P, host_key_cache.data_ptr())
        a.host_value_cache = ffi.cast(_VOID_P, host_value_cache.data_ptr())
        a.num_host_pages = int(host_key_cache.shape[0])
    arr = ffi.new("kvs_copy[]", len(rows))
    for i, (src, dst, n, kind) in enumerate(rows):
        arr[i].src_page, arr[i].dst_page, arr[i].num_tokens, arr[i].kind = src, dst, n, kind
    backend, stream = backend_for(device)
    check(lib.kvs_kv_copy(backend, a, arr, len(rows), stream), "kvs_kv_copy")


# ---------------------------------------------------------------------------------------------
# vllm-ascend 0.23.0 hooks (called by patches/vllm-ascend-0.23.0-kvshare-ops.patch)
# ---------------------------------------------------------------------------------------------

_warned: set[str] = set()
_unavailable: str | None = None  # set once the backend cannot be created: stop trying
# kvshare refusals after which vllm-ascend's own op runs (nothing was written).
_FALLBACK_ERRORS = (kvshare.UnsupportedError, kvshare.BackendUnavailableError)


def _fallback(what: str, why: str) -> bool:
    if what not in _warned:
        _warned.add(what)
        log.warning("kvshare ops: %s falls back to vllm-ascend's own op: %s", what, why)
    return False


def _refused(what: str, e: kvshare.KvsError) -> bool:
    global _unavailable
    if isinstance(e, kvshare.BackendUnavailableError) and e.func == "kvs_backend_new":
        _unavailable = str(e)
    return _fallback(what, str(e))


def ascend_kv_write(impl: Any, key: torch.Tensor, value: torch.Tensor,
                    slot_mapping: torch.Tensor) -> bool:
    """KV write of ``AscendAttentionBackendImpl`` through :func:`reshape_and_cache`.

    Returns True when done, False (nothing written) when vllm-ascend's own op must run: an
    unsupported cache dtype (int8 C8 quantisation) or layout, or kvshare refusing the launch
    (``UnsupportedError``, or ``BackendUnavailableError``: no CANN / no
    ``aclnnScatterPaKvCache``; logged once; a backend that cannot be created is not retried).
    On the NPU, key/value are first made contiguous in the cache dtype (CANN's scatter needs it).
    """
    if _unavailable is not None:
        return _fallback("kv write", _unavailable)
    kc, vc = getattr(impl, "key_cache", None), getattr(impl, "value_cache", None)
    if kc is None or vc is None:
        return _fallback("kv write", "no key/value cache bound to the layer")
    if kc.dtype not in _DTYPES or key.dtype not in _DTYPES:
        return _fallback("kv write", f"cache dtype {kc.dtype} / key dtype {key.dtype}")
    if kc.device.type != "cpu":  # pragma: no cover - NPU only
        # aclnnScatterPaKvCache takes contiguous K/V of the cache dtype (vllm-ascend's key and
        # value are strided views of the fused qkv projection); vllm-ascend's A5 path copies too.
        key = key.to(kc.dtype).contiguous()
        value = value.to(kc.dtype).contiguous()
    try:
        reshape_and_cache(key, value, kc, vc, slot_mapping)
    except _FALLBACK_ERRORS as e:
        return _refused("kv write", e)
    return True


def ascend_decode(impl: Any, query: torch.Tensor, attn_metadata: Any,
                  output: torch.Tensor) -> bool:
    """Decode attention of ``AscendAttentionBackendImpl`` (state ``DecodeOnly``) through
    :func:`paged_attention`; returns True when ``output`` was written, False when
    vllm-ascend's own kernel must run instead (nothing written).

    Taken over: causal decoder self-attention, one query token per request, float caches, no
    attention sinks, ALiBi, hamming-sparse / kvcomp or context parallelism. The first
    ``num_decodes`` rows (real requests) are computed from ``seq_lens[:num_decodes]`` and
    ``block_tables[:num_decodes]``; rows past them (graph padding, trimmed downstream by
    vllm-ascend) are zeroed.
    """
    if _unavailable is not None:
        return _fallback("decode", _unavailable)
    kc, vc = getattr(impl, "key_cache", None), getattr(impl, "value_cache", None)
    if kc is None or vc is None:
        return _fallback("decode", "no key/value cache bound to the layer")
    if kc.dtype not in _DTYPES or query.dtype not in _DTYPES:
        return _fallback("decode", f"cache dtype {kc.dtype} / query dtype {query.dtype}")
    if getattr(impl, "sinks", None) is not None or getattr(impl, "alibi_slopes", None) is not None:
        return _fallback("decode", "attention sinks / ALiBi")
    if getattr(impl, "enable_hamming_sparse", False):
        return _fallback("decode", "hamming-sparse (kvcomp) attention")
    attn_type = str(getattr(impl, "attn_type", "decoder")).lower()
    if "decoder" not in attn_type or "encoder" in attn_type:
        return _fallback("decode", f"attention type {attn_type}")
    if not getattr(attn_metadata, "causal", True):
        return _fallback("decode", "non-causal attention")
    if getattr(attn_metadata, "decode_meta", None) is not None or \
            getattr(attn_metadata, "prefill", None) is not None:
        return _fallback("decode", "context-parallel metadata")
    n = int(getattr(attn_metadata, "num_decodes", 0) or 0)
    if n <= 0 or getattr(attn_metadata, "num_prefills", 0) or \
            int(getattr(attn_metadata, "num_decode_tokens", n)) != n:
        return _fallback("decode", "not a pure one-token-per-request decode batch")
    seq_lens = attn_metadata.seq_lens
    if seq_lens is None:
        seq_lens = attn_metadata.seq_lens_list
    try:
        paged_attention(query[:n], kc, vc, attn_metadata.block_tables[:n], seq_lens[:n],
                        output[:n], scale=impl.scale, num_kv_heads=impl.num_kv_heads,
                        sliding_window=int(getattr(impl, "sliding_window", None) or 0))
    except _FALLBACK_ERRORS as e:
        return _refused("decode", e)
    if output.shape[0] > n:
        output[n:].zero_()
    return True
