"""The argument checks of :mod:`kvshare_vllm.ops` (which re-exports the two errors): devices,
dtypes, ranks, shapes and strides checked before a ``kvs_`` launch, raising
:class:`OpsArgumentError` (a ``ValueError``) or :class:`OpsDtypeError` (also a ``TypeError``)
whose ``field`` names the argument, and the conversions they make (a host int32 array, a cache
pair's ``kvs_kv_layout``)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from kvshare import ffi, lib

_DTYPES = {
    torch.float32: lib.KVS_DTYPE_F32,
    torch.float16: lib.KVS_DTYPE_F16,
    torch.bfloat16: lib.KVS_DTYPE_BF16,
}
# Quantized KV caches: the formats a cache tensor may hold, by name (vLLM's ``kv_cache_dtype``
# spelling, "fp8" being "fp8_e4m3") and by torch dtype. vLLM allocates its fp8 caches as uint8,
# so a uint8 cache names its format (``kv_format``); a float8 tensor carries it.
KV_FORMATS = {
    "fp8_e4m3": lib.KVS_DTYPE_FP8_E4M3,
    "fp8_e5m2": lib.KVS_DTYPE_FP8_E5M2,
}
# vLLM's ``kv_cache_dtype`` names of those formats ("fp8" is "fp8_e4m3").
VLLM_FP8_CACHE_DTYPES = {
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}
_FP8_TORCH = {
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
}
_CPU = torch.device("cpu")
# torch_npu storage formats that are plain row-major memory (ACL_FORMAT_NCHW, ACL_FORMAT_ND).
_NPU_PLAIN_FORMATS = (0, 2)


class OpsArgumentError(ValueError):
    """An argument of a kvshare op is wrong (device, rank, shape, value); ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class OpsDtypeError(OpsArgumentError, TypeError):
    """A tensor of a kvshare op has an unsupported dtype; ``field`` names it."""


def _torch_npu():
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError as e:  # pragma: no cover - no torch_npu here
        raise RuntimeError(
            "kvshare ops: tensors are on an NPU but torch_npu cannot be imported "
            f"({e}); NPU tensors need torch_npu and CANN") from e
    return torch_npu


def _tensor(field: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise OpsArgumentError(field, f"expected a torch.Tensor, got {type(t).__name__}")
    return t


def _dtype_code(field: str, t: torch.Tensor) -> int:
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise OpsDtypeError(field, f"dtype {t.dtype} is not supported (float32, float16, "
                                   "bfloat16)")
    return code


def _same_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    for field, t in tensors.items():
        if t is not None and t.device != device:
            raise OpsArgumentError(field, f"is on {t.device}, the other tensors on {device}")


def _check_device(field: str, t: torch.Tensor) -> torch.device:
    if t.is_cpu:
        return _CPU
    if t.device.type not in ("cpu", "npu"):
        raise OpsArgumentError(field, f"is on {t.device}: kvshare ops take CPU tensors, or NPU "
                                      "tensors (torch_npu) for the Ascend backend")
    if t.device.type == "npu":  # pragma: no cover - needs torch_npu
        torch_npu = _torch_npu()
        fmt = torch_npu.get_npu_format(t)
        if fmt not in _NPU_PLAIN_FORMATS:
            raise OpsArgumentError(field, f"has NPU storage format {fmt} (e.g. 29 = FRACTAL_NZ); "
                                          "kvshare reads plain ND memory")
    return t.device


def _outer_strides(field: str, t: torch.Tensor, names: Sequence[str]) -> list[int]:
    """Strides (elements) of every dimension but the last, which must be contiguous; a
    dimension of size 1 gets the dense stride (its stride is never used)."""
    shape, strides = t.shape, t.stride()
    if shape and shape[-1] > 1 and strides[-1] != 1:
        raise OpsArgumentError(field, f"last dimension (head_dim) must be contiguous, its stride "
                                      f"is {strides[-1]}")
    n = len(names)
    out = list(strides[:n])
    if n and min(shape[:n]) > 1 and min(out) > 0:
        return out  # the common case, every size > 1: the strides as they are
    for i, name in enumerate(names):
        if shape[i] <= 1:
            out[i] = math.prod(max(int(x), 1) for x in shape[i + 1:])
        elif out[i] <= 0:
            raise OpsArgumentError(field, f"dimension {i} ({name}) has stride {out[i]}: "
                                          "broadcast (expanded) tensors are not supported")
    return out


def _tokens_heads(field: str, t: torch.Tensor, head_dim: int) -> tuple[int, int, int, int]:
    """``(rows, heads, token stride, head stride)`` of a ``[T, H, D]`` or ``[T, H*D]`` tensor."""
    shape = t.shape
    if len(shape) == 3:
        rows, heads, d = shape
        if d != head_dim:
            raise OpsArgumentError(field, f"head_dim is {d}, the cache's is {head_dim}")
        ts, hs, ds = t.stride()
        if ds == 1 and rows > 1 and heads > 1 and ts > 0 and hs > 0:
            return rows, heads, ts, hs  # every step's case, as _outer_strides would answer
        ts, hs = _outer_strides(field, t, ("tokens", "heads"))
        return rows, heads, ts, hs
    if len(shape) == 2:
        rows, width = shape
        if width % head_dim:
            raise OpsArgumentError(field, f"width {width} is not a multiple of the cache's "
                                          f"head_dim {head_dim}")
        ts, ws = t.stride()
        if not (ws == 1 and rows > 1 and ts > 0):
            (ts,) = _outer_strides(field, t, ("tokens",))
        return rows, width // head_dim, ts, head_dim
    raise OpsArgumentError(field, f"expected [num_tokens, num_heads, head_dim] (or "
                                  f"[num_tokens, num_heads * head_dim]), got shape "
                                  f"{tuple(t.shape)}")


def _cache_dtype_code(field: str, t: torch.Tensor, kv_format: str | None) -> int:
    """The ``kvs_dtype`` of a KV cache: its tensor's (f32, f16, bf16, float8_e4m3fn,
    float8_e5m2), or ``kv_format``'s for a uint8 tensor (or the float8 tensor of that format)."""
    if kv_format is None:
        if t.dtype in _FP8_TORCH:
            return KV_FORMATS[_FP8_TORCH[t.dtype]]
        if t.dtype == torch.uint8:
            raise OpsDtypeError(field, "dtype torch.uint8 needs kv_format (one of "
                                       f"{sorted(KV_FORMATS)}) to say what its bytes hold")
        return _dtype_code(field, t)
    code = KV_FORMATS.get(kv_format)
    if code is None:
        raise OpsArgumentError("kv_format", f"{kv_format!r} is not one of {sorted(KV_FORMATS)}")
    if t.dtype != torch.uint8 and _FP8_TORCH.get(t.dtype) != kv_format:
        raise OpsDtypeError(field, f"dtype {t.dtype} cannot hold kv_format {kv_format!r} "
                                   "(uint8, or the float8 dtype of that format)")
    return code


def _layout(key_cache: torch.Tensor, value_cache: torch.Tensor, kv_format: str | None = None):
    """The ``kvs_kv_layout`` of a K/V cache pair (same shape, strides and dtype); ``kv_format``
    names the quantized format a uint8 pair holds (:func:`_cache_dtype_code`)."""
    if key_cache.dim() != 4:
        raise OpsArgumentError("key_cache", "expected [num_blocks, block_size, num_kv_heads, "
                                            f"head_dim], got shape {tuple(key_cache.shape)}")
    if value_cache.shape != key_cache.shape:
        raise OpsArgumentError("value_cache", f"shape {tuple(value_cache.shape)} differs from "
                                              f"key_cache's {tuple(key_cache.shape)}")
    if value_cache.dtype != key_cache.dtype:
        raise OpsDtypeError("value_cache", f"dtype {value_cache.dtype} differs from key_cache's "
                                           f"{key_cache.dtype}")
    code = _cache_dtype_code("key_cache", key_cache, kv_format)
    names = ("num_blocks", "block_size", "num_kv_heads")
    ks = _outer_strides("key_cache", key_cache, names)
    vs = _outer_strides("value_cache", value_cache, names)
    if ks != vs:
        raise OpsArgumentError("value_cache", f"strides {tuple(value_cache.stride())} differ from "
                                              f"key_cache's {tuple(key_cache.stride())}")
    lay = ffi.new("kvs_kv_layout *")
    lay.dtype = code
    lay.num_pages, lay.page_size, lay.num_kv_heads, lay.head_dim = (int(x) for x in key_cache.shape)
    lay.page_stride, lay.slot_stride, lay.head_stride = ks
    return lay


def _host_i32(field: str, x: Any) -> torch.Tensor:
    """A contiguous host int32 tensor (copied from the device / converted when needed)."""
    if (isinstance(x, torch.Tensor) and x.dtype is torch.int32 and x.layout is torch.strided
            and x.is_cpu and x.dim() == 1 and x.is_contiguous()):
        return x  # what vLLM's CPU engine passes every step: nothing to convert
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise OpsDtypeError(field, f"dtype {x.dtype} is not an integer type")
        t = x.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")  # a device->host copy (synchronises that stream)
        t = t.to(torch.int32)
    else:
        try:
            t = torch.as_tensor(x, dtype=torch.int32)
        except (TypeError, ValueError, RuntimeError) as e:
            raise OpsArgumentError(field, f"cannot be read as int32 values: {e}") from e
    if t.dim() != 1:
        raise OpsArgumentError(field, f"expected one dimension, got shape {tuple(t.shape)}")
    return t.contiguous()
