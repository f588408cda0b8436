"""The pool tier inside vLLM: kvshare's KV connector (:mod:`kvshare_vllm.connector`) loading and
storing full pages through Mooncake Store, in vLLM's connector call order.

Where each half runs, and why:

* **The scheduler process** asks the pool. ``get_num_new_matched_tokens`` is where vLLM wants
  the number of external tokens, synchronously, before it allocates: kvshare's manager (whose
  cache was built with the pool settings) gives the store keys of the prompt's full pages after
  the local hit (``kvs_pool_lookup``), and one ``batch_is_exist`` says which exist.  The
  leading run of existing pages is the external hit.  Only the scheduler knows the prefix
  chain, the salt and LoRA of a request and which pages the cache registers, so keys and
  store work (``kvs_pool_take_work`` after ``kvs_cache_commit``) come from here.
* **The worker process** moves the bytes: it holds the KV tensors, so a page's value (that
  block of every layer) is read and written there, by :class:`kvshare.pool.PoolTransfers`
  (verification, circuit breaker and negative cache included).  The scheduler ships keys,
  block ids and token ids in the step's metadata; no KV crosses between the processes.

Loads are asynchronous in vLLM's sense (``load_kv_async``): the request waits in
``WAITING_FOR_REMOTE_KVS`` while its external pages are not cached (``delay_cache_blocks``:
kvshare registers none of them), the worker loads them in ``start_load_kv`` and reports the
request in ``get_finished``; a page that failed verification or was missing is reported by
``get_block_ids_with_load_errors``, and vLLM (``kv_load_failure_policy`` ``recompute``, which
the pool requires) truncates the request's computed tokens at the first failed block and
computes the rest.  Wrong KV is never used and the output does not change.

Stores: with ``write_through`` each page the cache registers goes to the pool once its step's
KV is written (``wait_for_save``); with ``on_demotion`` the cached pages demoted to the host
tier do, read from the host pool after the demotion copy.  A page being stored keeps a
reference in kvshare until the worker's outcome comes back in its worker metadata
(``build_connector_worker_meta`` → ``update_connector_output`` → ``kvs_pool_done``), so it is
never reused under the transfer.  Pages that came from the pool are not stored back: the
scheduler keeps the keys each live request loaded and drops them one step after the request
finishes (the step whose commit hands out the store work of its last registered pages), or
at once when the load failed, so that the recomputed page is stored (a rejected entry has
been removed by the worker's :class:`~kvshare.pool.PoolTransfers`).

Settings (``kv_connector_extra_config["pool"]``): ``master`` (required, ``host:port`` of
``mooncake_master``), ``local_host`` (default ``127.0.0.1``), ``namespace`` (default
``vllm``), ``store`` (``write_through``, ``on_demotion``, ``read_only``), ``identity`` (the
model's identity in keys; default the model path and revision), ``mac_key`` (hex: the
deployment key every engine shares), ``segment_bytes`` / ``buffer_bytes`` (the client's
global segment and local buffer), ``cooldown_s`` (the breaker's), ``batch`` (pages per
transfer call).  The KV-transfer config must set ``kv_load_failure_policy="recompute"``
(vLLM 0.23 defaults to ``fail``).  The pool takes one worker (tensor and pipeline parallel
size 1), one full-attention KV-cache group, prefix caching on, and ``float32`` / ``float16`` /
``bfloat16`` caches; anything else is refused when the engine starts.
"""

from __future__ import annotations

import contextvars
import os
import time
from dataclasses import dataclass, field

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

NAME = "KvshareConnector"
STORES = ("write_through", "on_demotion", "read_only")
SETTINGS = {"master", "local_host", "namespace", "store", "identity", "mac_key",
            "segment_bytes", "buffer_bytes", "cooldown_s", "batch"}
# The pool settings of the manager being built (``kvshare.Cache(pool=...)``), set by the
# plugin around ``Scheduler.__init__`` like ``host_tier.HOST_PAGES``; None without a pool.
POOL: contextvars.ContextVar[dict | None] = contextvars.ContextVar("kvshare_pool", default=None)


def manager_pool(unit: int, num_groups: int) -> dict | None:
    """The pool settings of the manager being built (``POOL``), None without a pool.  Raises
    ValueError for what the pool cannot serve: sub-page hits (``unit``: the pool stores and
    loads whole pages) and several KV-cache groups."""
    from .base import MATCH_UNIT_ENV

    pool = POOL.get()
    if pool is None:
        return None
    if unit:
        raise ValueError(f"kvshare_vllm: {MATCH_UNIT_ENV}={unit} with the pool tier: "
                         "the pool stores and loads whole pages; unset one of them")
    if num_groups != 1:
        raise ValueError(f"{NAME}: the pool tier takes one full-attention KV-cache group; "
                         f"this model has {num_groups}")
    return pool


def _layout_tag(vllm_config) -> str:
    """The KV layout a page's bytes are in: kvshare's attention backend's, or the platform's."""
    if os.environ.get("KVSHARE_VLLM_OPS", "0") == "1":
        return "kvshare-nhd"
    from vllm.platforms import current_platform

    return f"vllm-{current_platform.device_type}"


def pool_settings(vllm_config) -> dict | None:
    """The validated pool settings of a config that selects kvshare's connector with a
    ``pool``; None without one.  Raises ValueError naming what the pool cannot serve."""
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    if ktc is None or ktc.kv_connector != NAME:
        return None
    raw = (ktc.kv_connector_extra_config or {}).get("pool")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{NAME}: kv_connector_extra_config['pool'] must be a dict")
    unknown = set(raw) - SETTINGS
    if unknown:
        raise ValueError(f"{NAME}: unknown pool settings {sorted(unknown)} (known: "
                         f"{', '.join(sorted(SETTINGS))})")
    master = raw.get("master")
    if not isinstance(master, str) or ":" not in master:
        raise ValueError(f"{NAME}: pool['master'] must be mooncake_master's 'host:port', "
                         f"got {master!r}")
    store = raw.get("store", "write_through")
    if store not in STORES:
        raise ValueError(f"{NAME}: pool['store'] must be one of {', '.join(STORES)}, "
                         f"got {store!r}")
    if getattr(ktc, "kv_load_failure_policy", "recompute") != "recompute":
        raise ValueError(f"{NAME}: the pool tier needs kv_load_failure_policy='recompute' in "
                         "the KV-transfer config (vLLM's default 'fail' ends a request whose "
                         "pool page is missing or unverified instead of computing it)")
    pc = vllm_config.parallel_config
    if pc.tensor_parallel_size != 1 or pc.pipeline_parallel_size != 1:
        raise ValueError(f"{NAME}: the pool tier serves one worker (tensor and pipeline "
                         f"parallel size 1), got tp={pc.tensor_parallel_size} "
                         f"pp={pc.pipeline_parallel_size}")
    cc = vllm_config.cache_config
    if not cc.enable_prefix_caching:
        raise ValueError(f"{NAME}: the pool tier needs prefix caching on "
                         "(enable_prefix_caching)")
    if cc.cache_dtype not in ("auto", "float16", "bfloat16"):
        raise ValueError(f"{NAME}: the pool tier carries float32, float16 and bfloat16 KV "
                         f"caches, not kv_cache_dtype {cc.cache_dtype!r} (a quantized page "
                         "means its values times scales its key does not name)")
    mac = raw.get("mac_key", "")
    try:
        mac_key = bytes.fromhex(mac)
    except (TypeError, ValueError):
        raise ValueError(f"{NAME}: pool['mac_key'] must be a hex string") from None
    mc = vllm_config.model_config
    ident = raw.get("identity") or f"{mc.model}@{mc.revision or ''}"
    layout = _layout_tag(vllm_config)
    # Everything that changes a page's bytes and that kvshare's key does not already name
    # (page size, page bytes, dtype and ranks are in the key's identity digest).
    identity = f"vllm|{ident}|{mc.dtype}|{cc.cache_dtype}|{layout}"
    batch = int(raw.get("batch", 16))
    if batch <= 0:
        raise ValueError(f"{NAME}: pool['batch'] must be > 0")
    return {"cache": {"namespace": str(raw.get("namespace", "vllm")), "identity": identity,
                      "store": store},
            "master": master, "local_host": str(raw.get("local_host", "127.0.0.1")),
            "mac_key": mac_key, "segment_bytes": int(raw.get("segment_bytes", 32 << 20)),
            "buffer_bytes": int(raw.get("buffer_bytes", 16 << 20)),
            "cooldown_s": float(raw.get("cooldown_s", 5.0)), "batch": batch,
            "layout": layout}


# One Mooncake client per process and master (a process-wide fact: the scheduler's and the
# worker's connectors share it when vLLM runs both in one process), with its number of users.
_CLIENTS: dict[tuple[str, str], list] = {}
# How long a connector's shutdown waits for the client's close (a client whose master is gone
# can hang in it; the process then exits without it).
CLOSE_WAIT_S = 5.0


def _client_key(settings: dict) -> tuple[str, str]:
    return settings["master"], settings["local_host"]


def store_client(settings: dict):
    """The process's ``MooncakeDistributedStore`` for ``settings``' master, set up once; each
    call is one user until :func:`release_client`."""
    key = _client_key(settings)
    held = _CLIENTS.get(key)
    if held is not None:
        held[1] += 1
        return held[0]
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise ImportError(f"{NAME}: the pool tier needs Mooncake Store's client "
                          "(mooncake.store; scripts/setup-mooncake-venv, and Debian's "
                          f"libibverbs1 and librdmacm1): {e}") from e
    client = MooncakeDistributedStore()
    rc = client.setup(settings["local_host"], "P2PHANDSHAKE", settings["segment_bytes"],
                      settings["buffer_bytes"], "tcp", "", settings["master"])
    if rc != 0:
        raise RuntimeError(f"{NAME}: Mooncake Store setup against {settings['master']} "
                           f"failed ({rc})")
    _CLIENTS[key] = [client, 1]
    return client


def release_client(settings: dict, io) -> None:
    """A connector half is done with the pool (vLLM's ``shutdown``): ``io``'s staging buffer
    is unregistered, and the process's last user closes the client, which unmounts its
    segment: the master stops placing other engines' values in memory that is about to go
    (they would fail to store, and later to load, until the master's client TTL passed). Not
    with the circuit breaker open (the master is not answering), and not waiting more than
    ``CLOSE_WAIT_S`` for it."""
    import threading

    key = _client_key(settings)
    held = _CLIENTS.get(key)
    if held is None:
        return
    if not io.breaker.is_open():
        io.close()
    held[1] -= 1
    if held[1] > 0:
        return
    del _CLIENTS[key]
    if io.breaker.is_open():
        return
    closer = threading.Thread(target=held[0].close, name="kvshare-pool-close", daemon=True)
    closer.start()
    closer.join(CLOSE_WAIT_S)


def _transfers(settings: dict, client, page_size: int, page_bytes: int, batch: int):
    from kvshare.pool import Breaker, PoolTransfers

    return PoolTransfers(client, page_size, page_bytes, mac_key=settings["mac_key"],
                         batch=batch, breaker=Breaker(cooldown_s=settings["cooldown_s"]))


def _chain_hash(key: str) -> int:
    """A key's page chain digest ``h_i`` (its last 32 hex digits)."""
    return int(key.rsplit("/", 1)[1], 16)


@dataclass
class PoolStep:
    """One step's pool transfers, in the connector's metadata: loads per request (each item:
    ``key``, ``hash``, ``tokens``, ``block``) and stores (``ticket``, ``key``, ``hash``,
    ``tokens``, ``tier``, ``page``)."""

    loads: dict[str, list[dict]] = field(default_factory=dict)
    stores: list[dict] = field(default_factory=list)


@dataclass
class PoolOutcomes(KVConnectorWorkerMetadata):
    """Back to the scheduler: the worker's store outcomes (ticket → stored) and the keys whose
    load failed (key → cause)."""

    stores: dict[int, bool] = field(default_factory=dict)
    failed_loads: dict[str, str] = field(default_factory=dict)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        if isinstance(other, PoolOutcomes):
            merged = dict(self.stores)
            for t, ok in other.stores.items():
                merged[t] = merged.get(t, True) and ok
            return PoolOutcomes(merged, {**self.failed_loads, **other.failed_loads})
        return self


class SchedulerPool:
    """The scheduler's half: lookups, the step's loads and stores, outcomes."""

    def __init__(self, settings: dict, manager):
        self.settings = settings
        self.mgr = manager
        self.cache = manager.cache  # kept for the manager's life (a reset clears it in place)
        if not getattr(self.cache, "pooled", False):
            raise RuntimeError(f"{NAME}: kvshare's manager was built without the pool "
                               "settings (the plugin sets them around Scheduler.__init__)")
        self.io = _transfers(settings, store_client(settings), self.cache.page_size, 0, 1)
        self._found: dict[str, list[dict]] = {}   # request id -> its pool pages, unallocated
        self._loads: dict[str, list[dict]] = {}   # this step's loads
        # Keys loaded and not failed, never stored back: per live request, and how many live
        # requests loaded each; a finished request's keys go after the next step's stores.
        self._loaded: dict[str, list[str]] = {}
        self._loaded_keys: dict[str, int] = {}
        self._finished: list[str] = []
        self.hit_pages = 0
        self.load_failures: dict[str, int] = {}  # reported by the worker, by cause
        self.stores_shipped = 0
        self.stores_skipped = 0

    def close(self) -> None:
        release_client(self.settings, self.io)

    def matched(self, request, num_computed_tokens: int) -> int:
        """External tokens: the run of the prompt's next full pages the pool holds."""
        from .base import _token_ids

        self._found.pop(request.request_id, None)
        if request.skip_reading_prefix_cache or not self.mgr.enable_caching:
            return 0
        tokens = _token_ids(request)
        bs = self.cache.page_size
        extra = self.mgr._extra_for(request)
        first, keys = self.cache.pool_lookup(tokens, extra, len(tokens) - 1)
        if not keys or first * bs != num_computed_tokens:
            return 0  # no full page after the local hit, or the local view moved
        hits = self.io.lookup([k for _, _, k in keys])
        pages = []
        for (pos, _group, key), hit in zip(keys, hits):
            if not hit:
                break
            pages.append({"key": key, "hash": _chain_hash(key), "position": pos,
                          "tokens": list(tokens[pos * bs:(pos + 1) * bs])})
        if pages:
            self._found[request.request_id] = pages
        return len(pages) * bs

    def allocated(self, request, blocks, num_external_tokens: int) -> None:
        pages = self._found.pop(request.request_id, None)
        if not pages or not num_external_tokens:
            return
        ids = blocks.get_block_ids()[0]
        n = num_external_tokens // self.cache.page_size
        items = [dict(p, block=ids[p["position"]]) for p in pages[:n]]
        self._loads[request.request_id] = items
        keys = self._loaded.setdefault(request.request_id, [])
        for p in items:
            keys.append(p["key"])
            self._loaded_keys[p["key"]] = self._loaded_keys.get(p["key"], 0) + 1
        self.hit_pages += len(items)

    def forget(self, request_id: str) -> None:
        """The request finished: its loaded keys go after the next step's stores."""
        self._found.pop(request_id, None)
        if request_id in self._loaded:
            self._finished.append(request_id)

    def _release(self, key: str) -> None:
        n = self._loaded_keys.get(key, 0)
        if n > 1:
            self._loaded_keys[key] = n - 1
        else:
            self._loaded_keys.pop(key, None)

    def step(self) -> PoolStep:
        """This step's loads, and the store work the cache handed out since the last step."""
        self.cache.commit()
        stores = []
        while True:
            work = self.cache.pool_take_work(256)
            if not work:
                break
            for w in work:
                if w["op"] != "store":  # loads come from matched(), never from the cache
                    self.cache.pool_done(w["ticket"], False)
                elif w["key"] in self._loaded_keys:
                    self.cache.pool_done(w["ticket"], True)  # the pool holds it already
                    self.stores_skipped += 1
                else:
                    stores.append({k: w[k] for k in ("ticket", "key", "hash", "tokens",
                                                     "tier", "page")})
        self.stores_shipped += len(stores)
        for rid in self._finished:
            for key in self._loaded.pop(rid, ()):
                self._release(key)
        self._finished.clear()
        loads, self._loads = self._loads, {}
        return PoolStep(loads, stores)

    def outcomes(self, meta) -> None:
        """Reports the worker's store outcomes to kvshare (the pages' references drop), and
        counts a key whose load failed as missing for the negative cache's time.

        NOTE: without that, a request whose first pool page fails would loop: vLLM frees a
        request whose every external token failed and looks it up again, and the pool would
        list the same page (a dead holder's, a corrupt one) again."""
        if isinstance(meta, PoolOutcomes):
            for ticket, ok in meta.stores.items():
                self.cache.pool_done(ticket, ok)
            until = self.io.clock() + self.io.negative_ttl_s
            for key, cause in meta.failed_loads.items():
                self.io.negative[key] = until
                self._loaded_keys.pop(key, None)  # the recomputed page is stored
                self.load_failures[cause] = self.load_failures.get(cause, 0) + 1


class WorkerPool:
    """The worker's half: a page's value is that block of every KV tensor, in the order vLLM
    registered them, in the tensors' own layout and dtype."""

    def __init__(self, settings: dict, device_parts, host_parts, page_size: int):
        self.settings = settings
        self.device_parts = device_parts  # per KV tensor: [(tensor, blocks dim)], device
        self.host_parts = host_parts      # the same for the host pool (None: no host tier)
        self.page_bytes = sum(_part_bytes(t, d) for t, d in device_parts)
        self.io = _transfers(settings, store_client(settings), page_size, self.page_bytes,
                             settings["batch"])
        self._pending_stores: list[dict] = []
        self._outcomes: dict[int, bool] = {}
        self._failed_keys: dict[str, str] = {}
        self._finished: set[str] = set()
        self._errors: set[int] = set()
        self.load_s = 0.0
        self.store_s = 0.0

    def close(self) -> None:
        release_client(self.settings, self.io)

    def _read(self, parts, page: int) -> bytes:
        return b"".join(t.select(d, page).contiguous().view(torch.uint8).numpy().tobytes()
                        for t, d in parts)

    def _write(self, parts, page: int, data: bytes) -> None:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        at = 0
        for t, d in parts:
            dst = t.select(d, page)
            n = _part_bytes(t, d)
            dst.view(torch.uint8).reshape(-1).copy_(buf[at:at + n])
            at += n

    def load(self, step: PoolStep) -> None:
        """Loads the step's pages into their blocks (the metadata's requests then finish
        receiving; failed blocks are reported as load errors)."""
        if not step.loads:
            return
        t0 = time.perf_counter()
        items = [it for its in step.loads.values() for it in its]
        causes = self.io.load(items, lambda _w: self.page_bytes,
                              lambda w, p: self._write(self.device_parts, w["block"], p))
        for w, cause in zip(items, causes):
            if cause:
                self._errors.add(w["block"])
                self._failed_keys[w["key"]] = cause
        self._finished.update(step.loads)
        self.load_s += time.perf_counter() - t0

    def queue_stores(self, step: PoolStep) -> None:
        self._pending_stores += step.stores

    def store(self) -> None:
        """Stores the queued pages (their KV is written: called after the forward pass)."""
        if not self._pending_stores:
            return
        t0 = time.perf_counter()
        work, self._pending_stores = self._pending_stores, []
        readable = []
        for w in work:  # a host page without a host pool to read it from fails
            if w["tier"] == 0 or self.host_parts is not None:
                readable.append(w)
            else:
                self._outcomes[w["ticket"]] = False
        oks = self.io.store_values(readable, lambda w: self._read(
            self.device_parts if w["tier"] == 0 else self.host_parts, w["page"]))
        for w, ok in zip(readable, oks):
            self._outcomes[w["ticket"]] = ok
        self.store_s += time.perf_counter() - t0

    def finished(self) -> set[str] | None:
        done, self._finished = self._finished, set()
        return done or None

    def load_errors(self) -> set[int]:
        errs, self._errors = self._errors, set()
        return errs

    def worker_meta(self) -> PoolOutcomes | None:
        if not self._outcomes and not self._failed_keys:
            return None
        out = PoolOutcomes(self._outcomes, self._failed_keys)
        self._outcomes, self._failed_keys = {}, {}
        return out


def _part_bytes(t, dim: int) -> int:
    return t.select(dim, 0).numel() * t.element_size()
