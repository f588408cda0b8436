"""The scheduler-side half of kvshare's host tier inside vLLM: what the manager does when
:mod:`kvshare_vllm.connector` is configured (``num_host_pages > 0``).

kvshare demotes a cached device page chosen for eviction to a host page (it stays matchable
there) and promotes a host-tier hit back to a fresh device page; each move is a queued page
copy (``kvs_cache_take_copies``).  Here:

* :meth:`HostTier.promote` runs at the start of ``get_computed_blocks``: ``kvs_prefix_prefetch``
  of the prompt (all but the last token, which is recomputed for its logits) brings the
  host-tier pages of its cached prefix back to device pages, kept as cached unreferenced
  pages, using only free or evictable room.  The device-tier match that follows then finds
  them, so vLLM's scheduler sees ordinary computed blocks and nothing in its accounting
  changes.
* :meth:`HostTier.prefetch` is the same call for a request still waiting behind others
  (:class:`~kvshare_vllm.connector.KvshareConnector` asks for the first few waiting requests
  after each ``schedule``), so its copies run with this step and its admission finds the pages
  on the device.
* :meth:`HostTier.take_copies` drains the copy queue as packed ``kvs_copy`` records (20 bytes
  each), the form the connector ships in its metadata and the worker hands to ``kvs_kv_copy``:
  demotions, promotions and the partial copies of sub-page hits (``KVSHARE_VLLM_MATCH_UNIT``,
  ``base.match_unit_setting``).

Why ordering is enough (no completion report): every copy is queued inside ``schedule`` and
shipped with that step's metadata; the worker executes the list in queue order in
``start_load_kv``, before the step's forward pass writes KV into reused pages or reads promoted
ones, on the engine's stream (CPU: synchronously).  A demotion therefore reads its page before
the step that reuses it writes there, and a promotion lands before any attention reads it.
"""

from __future__ import annotations

import contextvars

import kvshare
from kvshare import ffi, lib

COPY_BYTES = ffi.sizeof("kvs_copy")
# The host pages of the manager being built: set by the plugin around ``Scheduler.__init__``
# from the connector's options (``plugin._wrap_scheduler_init``): None without kvshare's KV
# connector, its ``num_host_pages`` with it (0: no host tier, the connector still carries the
# manager's other copies).  A context variable because vLLM's manager constructor (whose
# signature kvshare's keeps exactly, see compat.py) has no view of the KV-transfer config; the
# scheduler builds its connector and then its manager.
HOST_PAGES: contextvars.ContextVar[int | None] = contextvars.ContextVar("kvshare_host_pages",
                                                                        default=None)


class CopyQueue:
    """Drains the queued page copies (``kvs_cache_take_copies``) of the cache ``handle`` (a
    manager keeps its cache for its life: a prefix-cache reset clears it in place)."""

    def __init__(self, handle, batch: int = 1024):
        self._h = handle
        self._buf = ffi.new("kvs_copy[]", batch)
        self._n = ffi.new("size_t *")

    def take(self) -> bytes:
        """Every queued page copy, oldest first, as packed ``kvs_copy`` records."""
        out = []
        cap = len(self._buf)
        h = self._h
        while True:
            rc = lib.kvs_cache_take_copies(h, self._buf, cap, self._n)
            if rc:
                kvshare.check(rc, "kvs_cache_take_copies")
            k = self._n[0]
            if k:
                out.append(ffi.buffer(self._buf, k * COPY_BYTES)[:])
            if k < cap:
                return b"".join(out)


class HostTier:
    """The host-tier calls of one kvshare manager (``KvshareKVCacheManager``, which owns the
    cache handle ``_h``) built with kvshare's KV connector; with 0 host pages only its copy hand-off does anything."""

    def __init__(self, manager, num_host_pages: int, batch: int = 1024):
        self._mgr = manager
        self.num_host_pages = num_host_pages
        self._copies = CopyQueue(manager._h, batch)
        self._promoted = ffi.new("size_t *")

    def _prefetch(self, ids, extra) -> int:
        """``kvs_prefix_prefetch`` of ``ids`` minus the last token; returns pages promoted."""
        n = max(len(ids) - 1, 0)
        if n < self._mgr.block_size or not self.num_host_pages:
            return 0
        toks = self._mgr._pack(ids[:n])
        rc = lib.kvs_prefix_prefetch(self._mgr._h, ffi.from_buffer("int32_t[]", toks), n,
                                     extra.ptr if extra is not None else ffi.NULL,
                                     self._promoted)
        if rc:
            kvshare.check(rc, "kvs_prefix_prefetch")
        got = self._promoted[0]
        if got:
            self._mgr._avail = None  # promotions may evict (and demote) cached pages
        return got

    def promote(self, ids, extra) -> int:
        """Before a prefix lookup: the request's host-tier prefix back on the device."""
        return self._prefetch(ids, extra)

    def prefetch(self, request) -> int:
        """For a waiting request: starts its promotions now (their copies ride this step)."""
        from .base import _token_ids

        if not self.num_host_pages or not self._mgr.enable_caching \
                or request.skip_reading_prefix_cache:
            return 0
        return self._prefetch(_token_ids(request), self._mgr._extra_for(request))

    def take_copies(self) -> bytes:
        """Every queued page copy, oldest first, as packed ``kvs_copy`` records.  A sub-page
        hit's copy held its source page until taken: the free count may grow."""
        rows = self._copies.take()
        if rows:
            self._mgr._avail = None
        return rows
