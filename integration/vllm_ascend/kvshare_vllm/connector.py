"""``KvshareConnector``: kvshare's host tier inside the vLLM engine, as a vLLM v1 KV connector.

Selected with vLLM's usual KV-transfer config (kvshare's manager must be on: ``KVSHARE_VLLM=1``)::

    KVTransferConfig(kv_connector="KvshareConnector",
                     kv_connector_module_path="kvshare_vllm.connector", kv_role="kv_both",
                     kv_connector_extra_config={"num_host_pages": 4096})

Options (``kv_connector_extra_config``):

* ``num_host_pages`` (default 0): host pages (of one block of every layer each) in the pool
  the worker allocates, page-locked when the KV cache is not on the CPU; kvshare's manager is
  built with the same number (``num_host_pages``, ``demote_to_host``).  0 is no host tier: the
  connector then carries the partial copies of sub-page hits (``KVSHARE_VLLM_MATCH_UNIT``) and
  the pool tier's transfers.
* ``prefetch_waiting`` (default 2): waiting requests whose host-tier prefix is promoted after
  each ``schedule`` (``kvs_prefix_prefetch``), so their copies run with the current step.
* ``pool`` (optional): the pool tier on Mooncake Store, shared by engines (``master``,
  ``store``, ``namespace``, ...: :mod:`kvshare_vllm.pool_tier`).  The lookups (``kvs_pool_lookup``
  and one ``batch_is_exist``) and the store work run in the scheduler process, because vLLM
  asks ``get_num_new_matched_tokens`` there before allocating and only kvshare's manager there
  knows a request's prefix chain, salt and LoRA; the transfers run in the worker process,
  because it holds the KV tensors (``kvshare.pool.PoolTransfers``).  The metadata carries keys,
  token ids and block ids, never KV.

KV-cache formats (vLLM's ``cache_config.cache_dtype``, ``--kv-cache-dtype``): ``auto``,
``float16`` and ``bfloat16`` caches are copied in their tensors' dtype; ``fp8`` (=
``fp8_e4m3``) and ``fp8_e5m2`` caches, which vLLM allocates as uint8, are copied as that fp8
format, one byte an element, in host pages of the same bytes.  Any other ``kv_cache_dtype``
(``fp8_inc``, ``fp8_ds_mla``, the per-token-head, turboquant and nvfp4 formats) is refused
when the connector is built.

Scheduler side: the manager promotes a request's host-tier prefix when it looks the request up
(``host_tier.HostTier.promote``) and demotes evicted cached pages; every copy this queues in a
``schedule`` is drained (``kvs_cache_take_copies``) by :meth:`build_connector_meta` and shipped in
that step's :class:`KvshareConnectorMetadata`.  Host-tier hits are not "external": promoted
pages are ordinary device hits.  With a pool, ``get_num_new_matched_tokens`` answers the run of
the prompt's next full pages the pool holds (asked with one ``batch_is_exist``), loaded
asynchronously (``pool_tier``'s module doc).

Worker side: :meth:`register_kv_caches` allocates the host pool in the engine's own per-layer
layout and :meth:`start_load_kv` runs the step's copies, in order, on every layer with
``kvs_kv_copy`` (CPU tensors: kvshare's CPU backend; NPU tensors: the Ascend backend on the
current stream - **untested, no NPU here**) before the forward pass.  That order is what tells
the manager a copy is complete before its page is reused (see ``host_tier``'s module doc): no
completion report travels back.

Not covered: layerwise transfer (copies run whole before the step, not per layer), a copy
overlapping the forward pass on the CPU (the CPU backend is synchronous), disaggregated
prefill, KV-cache groups of different page layouts (Mamba / linear-attention state groups), and
use inside vLLM's ``MultiConnector``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvshare import check, ffi, lib
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from . import logger
from .ops_checks import VLLM_FP8_CACHE_DTYPES, _cache_dtype_code
from .pool_tier import PoolStep, SchedulerPool, WorkerPool, pool_settings

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from vllm.v1.core.sched.output import SchedulerOutput

NAME = "KvshareConnector"
MODULE = "kvshare_vllm.connector"


def host_pages(vllm_config) -> int | None:
    """``num_host_pages`` of a config that selects this connector (0 when not given: no host
    tier); None when it does not select it."""
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    if ktc is None or ktc.kv_connector != NAME:
        return None
    n = (ktc.kv_connector_extra_config or {}).get("num_host_pages", 0)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"{NAME}: kv_connector_extra_config['num_host_pages'] must be an "
                         f"int >= 0, got {n!r}")
    return n


# vLLM's kv_cache_dtype -> the fp8 format of its uint8 caches (None: the tensors' own dtype).
KV_CACHE_DTYPES: dict[str, str | None] = {"auto": None, "float16": None, "bfloat16": None,
                                          **VLLM_FP8_CACHE_DTYPES}


def kv_format(vllm_config) -> str | None:
    """The fp8 format (``"fp8_e4m3"``, ``"fp8_e5m2"``) of the engine's KV caches, from
    ``cache_config.cache_dtype``; None when the cache tensors' dtype says what they hold.
    Raises ValueError naming a ``kv_cache_dtype`` the connector cannot carry."""
    dtype = vllm_config.cache_config.cache_dtype
    if dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"{NAME}: kv_cache_dtype {dtype!r} is not a format kvshare's "
                         f"connector carries ({', '.join(KV_CACHE_DTYPES)})")
    return KV_CACHE_DTYPES[dtype]


@dataclass
class KvshareConnectorMetadata(KVConnectorMetadata):
    """One step's page copies, oldest first, as packed ``kvs_copy`` records (20 bytes each:
    src page, dst page, tokens, kind, group), ready for ``kvs_kv_copy``."""

    copies: bytes = b""
    pool: PoolStep | None = None  # the pool tier's loads and stores

    @property
    def num_copies(self) -> int:
        return len(self.copies) // ffi.sizeof("kvs_copy")


@dataclass
class _Layer:
    """One KV tensor and its host pool: ``args`` for ``kvs_kv_copy``, or (``args`` None) the
    device and host tensors whose blocks dimension 0 is copied block by block with torch."""

    args: Any  # kvs_kv_copy_args *, or None
    host: tuple  # the host tensors (the args point into them)
    device: Any = None  # the device tensor (torch path only)


def _kv_views(t, spec):
    """``(key, value)`` views ``[num_blocks, block_size, kv_heads, head_dim]`` of one layer's KV
    cache, and the index of its blocks dimension; ``None`` for an unknown layout."""
    bs, h, d = spec.block_size, spec.num_kv_heads, spec.head_size
    if isinstance(t, (tuple, list)) and len(t) == 2:  # vllm-ascend: (key_cache, value_cache)
        return (t[0], t[1]), 0
    if t.dim() == 5 and t.shape[0] == 2 and tuple(t.shape[2:]) == (bs, h, d):
        return (t[0], t[1]), 1  # [2, blocks, block_size, heads, head_dim] (kvshare's, GPU's)
    return None


def _interleaved(t, spec) -> bool:
    """vLLM's CPU backend's layout ``[blocks, heads, block_size, 2 * head_dim]`` (K then V in
    each row): K and V interleave, so no pair of disjoint K/V buffers describes it and
    ``kvs_kv_copy`` (which refuses overlapping buffers) cannot take it; whole blocks are
    copied with torch instead."""
    return not isinstance(t, (tuple, list)) and t.dim() == 4 and \
        tuple(t.shape[1:]) == (spec.num_kv_heads, spec.block_size, 2 * spec.head_size)


def _host_like(t, num_pages: int, dim: int):
    """A host tensor of ``t``'s layout with ``num_pages`` blocks (page-locked for an
    accelerator's cache)."""
    if isinstance(t, (tuple, list)):
        return tuple(_host_like(x, num_pages, 0) for x in t)
    shape = list(t.shape)
    shape[dim] = num_pages
    pin = t.device.type != "cpu"
    return torch.zeros(shape, dtype=t.dtype, device="cpu", pin_memory=pin)


_D2H = lib.KVS_COPY_KIND_DEVICE_TO_HOST
_H2D = lib.KVS_COPY_KIND_HOST_TO_DEVICE
_D2D = lib.KVS_COPY_KIND_DEVICE_TO_DEVICE


def _torch_copies(dev, host, rows) -> None:
    """Copies of whole blocks along dimension 0 of ``dev`` / ``host``, one at a time, in order
    (a block may be written and read again within one step's list).  A partial copy (a
    sub-page hit's units) copies the whole block too, as vLLM's own block copies do: vLLM's
    CPU kernels order a block's slots their own way (K and V halves, ISA-specific packing), and
    the slots past the units are the request's to write before anything reads them."""
    for src, dst, n, kind in rows:
        if n == 0:
            continue
        if kind == _D2H:
            host[dst].copy_(dev[src])
        elif kind == _H2D:
            dev[dst].copy_(host[src])
        elif kind == _D2D:
            dev[dst].copy_(dev[src])
        else:
            raise ValueError(f"{NAME}: unknown copy kind {kind}")


class KvshareConnector(KVConnectorBase_V1, SupportsHMA):
    """kvshare's host tier carried into the worker (module doc)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.num_host_pages = host_pages(vllm_config)
        self.kv_format = kv_format(vllm_config)
        self.prefetch_waiting = int(extra.get("prefetch_waiting", 2))
        if self.prefetch_waiting < 0:
            raise ValueError(f"{NAME}: prefetch_waiting must be >= 0")
        # Scheduler side.
        self._manager = None
        self._live: dict[str, Any] = {}     # request id -> Request, until finished
        self._waiting: dict[str, Any] = {}  # not scheduled yet (or preempted), arrival order
        self.prefetched_pages = 0
        self.pool_settings = pool_settings(vllm_config)
        self.pool: SchedulerPool | WorkerPool | None = None  # this side's half of the pool
        # Worker side.
        self._layers: list[_Layer] = []
        self._device = None
        self.copy_s = 0.0       # time in start_load_kv's copies
        self.copies_done = 0    # copies executed (each on every layer)
        self.steps_with_copies = 0

    # ------------------------------------------------------------------ scheduler side
    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        """Links the connector to kvshare's manager (its block pool view names it)."""
        from .manager import KvshareKVCacheManager

        mgr = getattr(gpu_block_pool, "_mgr", None)
        if not isinstance(mgr, KvshareKVCacheManager) \
                or mgr.host_tier is None:
            raise RuntimeError(
                f"{NAME} needs kvshare's KV-cache manager (KVSHARE_VLLM=1 and a configuration "
                "kvshare manages); the scheduler built "
                f"{type(mgr).__name__ if mgr is not None else type(gpu_block_pool).__name__}")
        if mgr.host_tier.num_host_pages != self.num_host_pages:
            raise RuntimeError(f"{NAME}: the manager has {mgr.host_tier.num_host_pages} host "
                               f"pages, the connector {self.num_host_pages}")
        if self.pool_settings is not None:
            if mgr.num_kv_cache_groups != 1:
                raise RuntimeError(f"{NAME}: the pool tier takes one full-attention KV-cache "
                                   f"group; this model has {mgr.num_kv_cache_groups}")
            self.pool = SchedulerPool(self.pool_settings, mgr)
        self._manager = mgr

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        """The pool's hit after the local one (loaded asynchronously); 0 without a pool.
        Host-tier hits were promoted by the manager's lookup: they are device hits already."""
        if self.pool is None:
            return 0, False
        n = self.pool.matched(request, num_computed_tokens)
        return n, n > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """Queues the loads of the pool pages into the blocks just allocated for them."""
        if self.pool is not None:
            self.pool.allocated(request, blocks, num_external_tokens)

    def update_connector_output(self, connector_output) -> None:
        """The worker's store outcomes, reported to kvshare."""
        if self.pool is not None:
            self.pool.outcomes(getattr(connector_output, "kv_connector_worker_meta", None))

    def on_new_request(self, request) -> None:
        self._live[request.request_id] = request
        self._waiting[request.request_id] = request

    def request_finished(self, request, block_ids):
        if self.pool is not None:
            self.pool.forget(request.request_id)
        self._live.pop(request.request_id, None)
        self._waiting.pop(request.request_id, None)
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        """``request_finished`` of a model with KV-cache groups (``SupportsHMA``: vLLM keeps its
        hybrid KV-cache groups with this connector, and kvshare's manager serves them)."""
        return self.request_finished(request, block_ids)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KvshareConnectorMetadata:
        """Prefetches the first waiting requests' host-tier prefixes, then ships every copy
        queued during this ``schedule``."""
        if self._manager is None:
            raise RuntimeError(f"{NAME}: no kvshare manager bound (bind_gpu_block_pool)")
        waiting = self._waiting
        for rid in scheduler_output.num_scheduled_tokens:
            waiting.pop(rid, None)
        for rid in scheduler_output.finished_req_ids:
            waiting.pop(rid, None)
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            req = self._live.get(rid)
            if req is not None:
                waiting[rid] = req
        if self.prefetch_waiting and waiting:
            tier = self._manager.host_tier
            for req in list(waiting.values())[:self.prefetch_waiting]:
                self.prefetched_pages += tier.prefetch(req)
        copies = self._manager.host_tier.take_copies()
        if copies and hasattr(scheduler_output, "has_sync_kv_loads"):
            # vLLM 0.32 starts a step's loads after its forward pass unless they feed it.
            scheduler_output.has_sync_kv_loads = True
        return KvshareConnectorMetadata(copies,
                                        self.pool.step() if self.pool is not None else None)

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Allocates the host pool, one host tensor per KV tensor in that tensor's layout and
        dtype (a uint8 fp8 cache: a uint8 pool, one byte an element)."""
        from . import ops

        groups = self._kv_cache_config.kv_cache_groups
        spec = groups[0].kv_cache_spec
        # Attention groups of one page geometry (the hybrid models kvshare manages): a page id
        # names the same block in every KV tensor, and a tensor shared by layers of several
        # groups is one tensor here, so each copy runs once per distinct tensor.
        def shape(s):
            return tuple(getattr(s, f, None)
                         for f in ("block_size", "num_kv_heads", "head_size", "page_size_bytes"))

        for g in groups[1:]:
            s = g.kv_cache_spec
            if shape(s) != shape(spec):
                raise NotImplementedError(f"{NAME}: KV-cache groups of different page layouts "
                                          f"({type(spec).__name__}, {type(s).__name__})")
        seen = set()
        layers = []
        for name, t in kv_caches.items():
            key = tuple(x.data_ptr() for x in t) if isinstance(t, (tuple, list)) \
                else t.data_ptr()
            if key in seen:  # layers sharing one KV tensor
                continue
            seen.add(key)
            # vLLM's fp8 caches are uint8 tensors: the engine's format says what they hold (a
            # uint8 cache of an engine without one is refused); any other dtype says it itself.
            first = t[0] if isinstance(t, (tuple, list)) else t
            fmt = self.kv_format if first.dtype == torch.uint8 else None
            if _interleaved(t, spec):
                _cache_dtype_code(f"layer {name}", t, fmt)
                host = _host_like(t, self.num_host_pages, 0)
                layers.append(_Layer(None, (host,), t))
                self._device = t.device
                continue
            found = _kv_views(t, spec)
            if found is None:
                raise NotImplementedError(
                    f"{NAME}: layer {name}: KV cache shape {tuple(t.shape)} is not a layout "
                    "kvshare's connector knows ([2, blocks, block_size, heads, head_dim], vLLM "
                    "CPU's [blocks, heads, block_size, 2 * head_dim], or a (key, value) pair)")
            (k, v), dim = found
            host = _host_like(t, self.num_host_pages, dim)
            (hk, hv), _ = _kv_views(host, spec)
            lay = ops._layout(k, v, fmt)
            hlay = ops._layout(hk, hv, fmt)
            if (hlay.page_stride, hlay.slot_stride, hlay.head_stride) != \
                    (lay.page_stride, lay.slot_stride, lay.head_stride):
                raise NotImplementedError(f"{NAME}: layer {name}: the host pool's strides differ "
                                          "from the KV cache's (a non-dense KV tensor)")
            a = ffi.new("kvs_kv_copy_args *")
            a.key_cache = ffi.cast("void *", k.data_ptr())
            a.value_cache = ffi.cast("void *", v.data_ptr())
            a.cache = lay[0]
            if self.num_host_pages:  # else NULL: no host pool
                a.host_key_cache = ffi.cast("void *", hk.data_ptr())
                a.host_value_cache = ffi.cast("void *", hv.data_ptr())
            a.num_host_pages = self.num_host_pages
            layers.append(_Layer(a, host if isinstance(host, tuple) else (host,)))
            self._device = k.device
        self._layers = layers
        if self.pool_settings is not None:
            self.pool = WorkerPool(self.pool_settings, *self._pool_parts(kv_caches, spec),
                                   spec.block_size)
        logger.info("kvshare_vllm: KV connector host pool: %d pages x %d KV tensors",
                    self.num_host_pages, len(layers))

    def start_load_kv(self, forward_context, **kwargs) -> None:
        """Runs this step's copies on every layer, in order, before the forward pass."""
        from . import ops

        meta = self._connector_metadata
        if self.pool is not None and isinstance(meta, KvshareConnectorMetadata):
            # Stores left by a step without a forward pass (their KV is written), then this
            # step's loads: into fresh blocks no copy below touches.
            self.pool.store()
            if meta.pool is not None:
                self.pool.load(meta.pool)
                self.pool.queue_stores(meta.pool)
        if not isinstance(meta, KvshareConnectorMetadata) or not meta.copies:
            return
        if not self._layers:
            raise RuntimeError(f"{NAME}: copies arrived before register_kv_caches")
        t0 = time.perf_counter()
        n = meta.num_copies
        arr = ffi.from_buffer("kvs_copy[]", meta.copies)
        backend, stream = ops.backend_for(self._device)
        rows = None
        for layer in self._layers:
            if layer.args is not None:
                check(lib.kvs_kv_copy(backend, layer.args, arr, n, stream), "kvs_kv_copy")
                continue
            if rows is None:
                rows = [(c.src_page, c.dst_page, c.num_tokens, c.kind) for c in arr[0:n]]
            _torch_copies(layer.device, layer.host[0], rows)
        self.copy_s += time.perf_counter() - t0
        self.copies_done += n
        self.steps_with_copies += 1

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing: every copy ran (CPU) or was queued ahead of the forward (NPU stream) in
        ``start_load_kv``."""

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        """Nothing: demotions are scheduled by the manager, not saved per layer."""

    def wait_for_save(self) -> None:
        """The pool's stores of this step (its KV is written); demotions ran in
        ``start_load_kv``."""
        if self.pool is not None:
            self.pool.store()

    def shutdown(self) -> None:
        """vLLM's shutdown of either side: this side's hold on the pool's client ends (the
        process's last one closes it, unmounting its segment; ``pool_tier.release_client``)."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.close()

    def get_finished(self, finished_req_ids):
        """Requests whose pool loads ran in this step's ``start_load_kv``."""
        if self.pool is None:
            return None, None
        return None, self.pool.finished()

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose pool load failed (missing, unreachable or unverified): recomputed."""
        return self.pool.load_errors() if self.pool is not None else set()

    def build_connector_worker_meta(self):
        """The store outcomes, for the scheduler's ``update_connector_output``."""
        return self.pool.worker_meta() if self.pool is not None else None

    def _pool_parts(self, kv_caches, spec):
        """Per distinct KV tensor, the (tensor, blocks dimension) pieces of a page, device and
        host; refuses a layout other than the one the pool's identity names."""
        want = self.pool_settings["layout"]
        dev, host, seen = [], [], set()
        layers = iter(self._layers)
        for name, t in kv_caches.items():
            key = tuple(x.data_ptr() for x in t) if isinstance(t, (tuple, list)) \
                else t.data_ptr()
            if key in seen:
                continue
            seen.add(key)
            layer = next(layers)
            if _interleaved(t, spec):
                if want != "vllm-cpu":
                    raise NotImplementedError(f"{NAME}: layer {name}: vLLM's CPU KV layout "
                                              f"under a pool identity of layout {want}")
                dev.append((t, 0))
                host.append((layer.host[0], 0))
                continue
            (k, v), _ = _kv_views(t, spec)
            (hk, hv), _ = _kv_views(layer.host if len(layer.host) == 2 else layer.host[0],
                                    spec)
            dev += [(k, 0), (v, 0)]
            host += [(hk, 0), (hv, 0)]
        return dev, host
