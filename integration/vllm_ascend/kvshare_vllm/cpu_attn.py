"""kvshare's KV write and paged attention as an attention backend of vLLM's CPU platform.

vLLM's CPU platform always answers ``CPU_ATTN`` (``CpuPlatform.get_attn_backend_cls``), so with
``KVSHARE_VLLM_OPS=1`` the plugin re-registers that name to :class:`KvshareCPUAttentionBackend`
(``vllm.v1.attention.backends.registry.register_backend``, vLLM's own override hook) in every
vLLM process; nothing else in vLLM changes.

The KV-cache layout is the version layer's (``compat.VllmSupport.attention_cache``):

* vLLM 0.23: the backend owns the layout it asks vLLM to allocate (``get_kv_cache_shape``):
  ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` per layer, K then V, each half the
  ``[num_blocks, block_size, heads, head_dim]`` paged layout kvshare's ops read and write
  directly.
* vLLM 0.32: vLLM allocates every layer's cache itself, in its CPU layout ``[num_blocks,
  num_kv_heads, block_size, 2 * head_dim]`` (a backend chooses only the order of those
  dimensions; vLLM's own CPU backend's order is kept). The backend reads each ``(block, head)``'s
  ``2 * block_size`` rows of ``head_dim`` as its K rows, then its V rows: two views with the
  same strides (token stride ``head_dim``, head stride ``2 * block_size * head_dim``), V
  ``block_size * head_dim`` elements after K, which kvshare's KV write takes as caches that
  interleave without sharing an element. The write is part of the forward
  (``forward_includes_kv_cache_update``), as on 0.23.

Every step of a layer is two kvshare launches on the whole batch:

* :func:`kvshare_vllm.ops.reshape_and_cache`: the new tokens' K/V scattered by vLLM's slot
  mapping (negative slots are padding);
* :func:`kvshare_vllm.ops.paged_attention` in its varlen form: decode, prefill and chunked
  prefill requests in one call (causal within each request, GQA, sliding window, soft cap).

The KV cache should sit on 2 MiB pages: decode reads one kv head of every token, 256 bytes every
2 KiB in this layout, so on 4 KiB pages nearly every read of a long sequence misses the TLB.
Two steps get it there; ``KVSHARE_CPU_HUGE_PAGES=0`` turns both off:

* :func:`register` sets ``THP_MEM_ALLOC_ENABLE=1`` (unless the environment sets it already).
  torch reads it at a process's first allocation and from then on advises its allocations of 2
  MiB and more for huge pages, so the cache vLLM zeroes is faulted in on them, at no cost. That
  reaches the worker of vLLM's multiprocess engine (the default), which starts after the plugin
  loads and is spawned (vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``); an
  in-process engine has allocated before, and needs it in its environment at start.
* The first time a layer's step sees its KV cache, the backend checks how much of it is on huge
  pages (:func:`kvshare_vllm.ops.huge_pages`, advise only: a walk of the range's page tables)
  and, if not all of it, moves it there (``MADV_COLLAPSE``, contents kept: a synchronous copy,
  tens to hundreds of ms per layer on two vCPUs). The first layer logs which of the two happened.

fp8 KV caches (``kv_cache_dtype`` ``fp8`` = ``fp8_e4m3``, or ``fp8_e5m2``; the fp8 types of
vLLM's CPU backend): vLLM allocates the cache as uint8 in this layout, the KV write quantizes
with the layer's per-tensor scales (``layer._k_scale_float``, ``_v_scale_float``, read at every
step since vLLM's ``calculate_kv_scales`` sets them at the first forward) and attention reads
the fp8 bytes and applies the scales inside kvshare's kernel (:class:`kvshare_vllm.ops.KvCaches`).
The write rounds to nearest; vLLM 0.23's own CPU write truncates toward zero, so the two
backends store values up to one fp8 step apart (docs/vllm.md has the measured effect).

Decoder self-attention only: encoder, encoder-only and cross attention, ALiBi, attention sinks
and the ``kv_cache_dtype`` values kvshare does not store (``fp8_inc``, ``fp8_ds_mla``,
per-token-head int8/fp8, the turboquant and nvfp4 formats, and any other) are refused when the
layer is built, naming what is unsupported.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.v1.attention.backend import (
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

import kvshare

from . import compat, ops
from .ops_checks import VLLM_FP8_CACHE_DTYPES

logger = logging.getLogger("vllm.kvshare_vllm")

BACKEND_PATH = "kvshare_vllm.cpu_attn.KvshareCPUAttentionBackend"

# Logged once per process, when a model's first layer gets kvshare's backend.
ENGAGED = "kvshare_vllm: attention (KV write, paged attention) runs in kvshare"
_engaged_pids: set[int] = set()

# torch's CPU allocator (c10 alloc_cpu): set before a process's first allocation, it has every
# allocation of 2 MiB and more madvise(MADV_HUGEPAGE)d as it is made (module doc).
THP_ENV = "THP_MEM_ALLOC_ENABLE"

# vLLM's kv_cache_dtype -> the cache format kvshare stores (None: the model's dtype, unscaled).
KV_CACHE_DTYPES: dict[str, str | None] = {"auto": None, **VLLM_FP8_CACHE_DTYPES}


class KvshareCPUAttentionBackend(CPUAttentionBackend):
    """vLLM's ``CPU_ATTN`` slot, served by kvshare's CPU backend (module doc)."""

    # Dtypes, block sizes (multiples of 16 on vLLM 0.23, of 32 on 0.32) and head sizes are vLLM's
    # CPU backend's, inherited; on 0.32 so is the KV-cache layout (supported_kv_cache_layouts).
    supported_kv_cache_dtypes: ClassVar[list] = list(KV_CACHE_DTYPES)
    # vLLM 0.32: the forward writes the step's K/V (vLLM's CPU backend has vLLM call a separate
    # do_kv_cache_update); vLLM 0.23 does not read it.
    forward_includes_kv_cache_update: ClassVar[bool] = True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_non_causal(cls) -> bool:
        return False

    @staticmethod
    def get_impl_cls() -> type["KvshareCPUAttentionImpl"]:
        return KvshareCPUAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["KvshareCPUMetadataBuilder"]:
        return KvshareCPUMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        """The layout vLLM 0.23 allocates for the backend (vLLM 0.32 no longer asks)."""
        return 2, num_blocks, block_size, num_kv_heads, head_size

    @classmethod
    def get_required_kv_cache_layout(cls):
        return None


@dataclass
class KvshareCPUMetadata:
    """One step's batch, as kvshare's varlen launch takes it, built once for every layer."""

    num_actual_tokens: int
    slot_mapping: torch.Tensor  # [num_actual_tokens]
    # Block table, KV lengths (this step's tokens included) and query starts as host int32,
    # checked once per step (vLLM's CPU tensors are int32 already: no copy).
    batch: ops.AttentionBatch


class KvshareCPUMetadataBuilder(AttentionMetadataBuilder[KvshareCPUMetadata]):
    """vLLM's common metadata, checked and converted once per step for all layers; decodes and
    prefills need no reordering, since one varlen launch serves both."""

    # vLLM's AttentionMetadataBuilder declares __init__ abstract: a builder must define one.
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> KvshareCPUMetadata:
        m = common_attn_metadata
        if getattr(m, "causal", True) is not True:  # vLLM 0.32: a tensor for dynamic causality
            raise NotImplementedError("kvshare's CPU attention backend computes causal decoder "
                                      "attention only")
        n = m.num_reqs
        return KvshareCPUMetadata(
            num_actual_tokens=m.num_actual_tokens,
            slot_mapping=m.slot_mapping[:m.num_actual_tokens],
            batch=ops.AttentionBatch(m.block_table_tensor[:n], m.seq_lens[:n],
                                     m.query_start_loc[:n + 1]))


class KvshareCPUAttentionImpl(AttentionImpl):
    """One layer: the KV write, then paged attention, each one kvshare launch."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes, sliding_window, kv_cache_dtype: str, logits_soft_cap=None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name=None,
                 sinks=None) -> None:
        unsupported = [what for what, bad in (
            (f"attention type {attn_type}", attn_type != AttentionType.DECODER),
            ("ALiBi", alibi_slopes is not None),
            ("attention sinks", sinks is not None),
            (f"kv_cache_dtype {kv_cache_dtype!r} (it stores {', '.join(KV_CACHE_DTYPES)})",
             kv_cache_dtype not in KV_CACHE_DTYPES)) if bad]
        if unsupported:
            raise NotImplementedError("kvshare's CPU attention backend does not support "
                                      + ", ".join(unsupported))
        # The cache format kvshare stores (None: the model's dtype, no scales).
        self.kv_format = KV_CACHE_DTYPES[kv_cache_dtype]
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = int(sliding_window or 0)
        self.softcap = float(logits_soft_cap or 0.0)
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        # (vLLM's kv_cache tensor, its ops.KvCaches): made at the first step, and again whenever
        # vLLM passes another cache tensor (it passes the same object every step).
        self._caches: tuple = (None, None)
        # The process's CPU backend now, at model construction (after vLLM's worker has set
        # torch's threads), not at the first step.
        ops.cpu_backend()
        if os.getpid() not in _engaged_pids:
            _engaged_pids.add(os.getpid())
            logger.info(ENGAGED)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: KvshareCPUMetadata | None,
                output: torch.Tensor, output_scale=None, output_block_scale=None) -> torch.Tensor:
        """``query`` ``[T, heads, head_dim]``, ``key``/``value`` ``[T, kv_heads, head_dim]``,
        ``kv_cache`` in the version's layout (module doc); writes ``output`` ``[T, heads *
        head_dim]`` (rows past the batch's tokens are left alone)."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported by kvshare's "
                                      "CPU attention backend")
        if attn_metadata is None:  # vLLM's profiling / warm-up pass
            return output
        seen, caches = self._caches
        if seen is not kv_cache:  # the first step, or vLLM bound another cache tensor
            caches = _layer_caches(kv_cache, self.kv_format)
            self._caches = (kv_cache, caches)
        # vLLM's per-tensor scales apply to its fp8 caches only (an unquantized cache ignores
        # a checkpoint's scales there too).
        k_scale = v_scale = 1.0
        if self.kv_format is not None:
            k_scale, v_scale = layer._k_scale_float, layer._v_scale_float
        n = attn_metadata.num_actual_tokens
        if self.kv_sharing_target_layer_name is None and key is not None and value is not None:
            caches.write(key, value, attn_metadata.slot_mapping, k_scale=k_scale,
                         v_scale=v_scale)
        if n == 0:
            return output
        # Only the batch's n rows are read and written: no views of query and output needed.
        caches.attend(query, output, attn_metadata.batch, scale=self.scale,
                      num_kv_heads=self.num_kv_heads, softcap=self.softcap,
                      sliding_window=self.sliding_window, k_scale=k_scale, v_scale=v_scale)
        return output


def _layer_caches(kv_cache: torch.Tensor, kv_format: str | None) -> ops.KvCaches:
    """A layer's KV-cache tensor as kvshare's checked cache pair (``kv_format``: the fp8 format
    of vLLM's uint8 cache, or None), on huge pages (once per cache tensor: vLLM passes the same
    one every step). The tensor is in the running vLLM's layout (``compat.VllmSupport
    .attention_cache``, module doc): ``kv_cache[2, ...]`` split into K and V, or the fused
    ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]`` read as each (block, head)'s K
    rows, then its V rows."""
    _on_huge_pages(kv_cache)
    if compat.support().attention_cache == "fused":
        blocks, heads, block_size, width = kv_cache.shape
        rows = kv_cache.view(blocks, heads, 2 * block_size, width // 2)
        # [num_blocks, block_size, num_kv_heads, head_dim] views: kvshare's paged indexing.
        return ops.KvCaches(rows[:, :, :block_size].transpose(1, 2),
                            rows[:, :, block_size:].transpose(1, 2), kv_format)
    return ops.KvCaches(kv_cache[0], kv_cache[1], kv_format)


# KV caches already asked for huge pages: (pid, storage address). Keyed by pid so that a forked
# worker asks for its own memory.
_huge_seen: set[tuple[int, int]] = set()


def _on_huge_pages(kv_cache: torch.Tensor) -> None:
    """Once per KV-cache allocation: what of it is on 2 MiB pages, collapsed there if not all
    (module doc); the first logs."""
    key = (os.getpid(), kv_cache.untyped_storage().data_ptr())
    if key in _huge_seen:
        return
    first = not any(pid == key[0] for pid, _ in _huge_seen)
    _huge_seen.add(key)
    if os.environ.get(ops.ENV_HUGE_PAGES, "1") == "0":
        if first:
            logger.info("kvshare_vllm: KV cache left on the kernel's default pages (%s=0)",
                        ops.ENV_HUGE_PAGES)
        return
    try:
        advised, huge = ops.huge_pages(kv_cache, collapse=False)
        how = "faulted in on them when vLLM zeroed it"
        if huge < advised:
            t0 = time.perf_counter()
            _, huge = ops.huge_pages(kv_cache, collapse=True)
            how = (f"collapsed onto them in {(time.perf_counter() - t0) * 1e3:.0f} ms at its first "
                   f"step; {THP_ENV}=1 in the engine's environment avoids this")
    except kvshare.KvsError as e:
        if first:
            logger.info("kvshare_vllm: KV cache stays on 4 KiB pages: %s", e)
        return
    log = logger.info if first else logger.debug
    log("kvshare_vllm: KV cache on 2 MiB pages: %d of %d MiB of a layer's cache (%s)",
        huge >> 20, kv_cache.untyped_storage().nbytes() >> 20, how)


def register() -> None:
    """Serves vLLM's ``CPU_ATTN`` with :class:`KvshareCPUAttentionBackend` and has torch
    allocate on huge pages from here on in this process and those it starts (module doc;
    idempotent)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
    if os.environ.get(ops.ENV_HUGE_PAGES, "1") != "0":
        os.environ.setdefault(THP_ENV, "1")
