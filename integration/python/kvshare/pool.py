"""The engine-side runtime of kvshare's pool tier: it runs a cache's pool work against Mooncake
Store (``mooncake.store.MooncakeDistributedStore``) and reports back.

kvshare decides what to look up, load and store (``Cache.pool_lookup``,
``Cache.seq_begin_pooled``, ``Cache.pool_take_work``); :class:`PoolRuntime` moves the bytes:

* a lookup is one ``batch_is_exist`` for every key of the prompt;
* loads are one ``batch_get_into`` into a staging buffer; each value is copied out of it (the
  staging buffer is registered with the client, so other processes on the pool network can
  write into it) and verified before its payload reaches the page: size (a value larger than
  the buffer the client refuses, ``INVALID_PARAMS`` -600: a wrong size too), magic, format
  version, the key it was written under, the page's chain digest and token ids, and a digest
  of all of it (HMAC-SHA-256 under the deployment key when one is configured, under the empty
  key otherwise). Any mismatch reports the load failed and the engine recomputes, and the
  entry is removed (``remove``, forced past the lease the load itself took) so that the
  recomputed page can be stored under its key again;
* stores are one ``batch_put_from`` of header and payload, then one ``batch_is_exist`` of the
  keys put. The client reports a put of a key the master already holds as success and stores
  nothing: a complete entry (the first writer wins until eviction) counts as stored, a key
  still held by an unfinished put (a writer that died between Mooncake's put start and end:
  the key reads as absent, ``get`` answers ``REPLICA_IS_NOT_READY`` -703, ``remove`` refuses,
  until the master's ``put_start_discard_timeout_sec`` has passed) as failed, ``"not stored"``.

A failed RPC (``RPC_FAIL`` -900, ``RPC_TIMEOUT`` -901) opens a circuit breaker: for
``cooldown_s`` the pool is treated as absent (lookups miss without asking, loads fail, stores
are skipped), so a dead or hung master costs one timeout, not one per request. A key whose
load failed for a holder that went away (``TRANSFER_FAIL`` -800) counts as missing for
``negative_ttl_s`` (the master keeps listing a dead holder's entries for its client TTL).

``pages`` is the engine's KV memory: an object with ``page_bytes(group) -> int``,
``read(tier, group, page) -> bytes`` and ``write(group, page, data)``.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import SIZE_MAX

MAGIC = b"KVS1"
FORMAT_VERSION = 1
# magic, version, header length, payload length, page size, tokens, sha256(key), h_i, digest
_HEAD = struct.Struct("<4sHHQII32s16s32s")
_DIGEST_AT = _HEAD.size - 32

RPC_FAIL, RPC_TIMEOUT, TRANSFER_FAIL, OBJECT_NOT_FOUND = -900, -901, -800, -704
REPLICA_IS_NOT_READY = -703
# batch_get_into's answer for a value larger than its buffer ("Buffer too small"): an entry of
# another size than this key's page can have, so it fails verification like a short one.
INVALID_PARAMS = -600
_LOAD_CAUSES = {OBJECT_NOT_FOUND: "missing", REPLICA_IS_NOT_READY: "not ready",
                TRANSFER_FAIL: "transfer", RPC_FAIL: "rpc", RPC_TIMEOUT: "timeout"}


def header_len(page_size: int) -> int:
    """Bytes of a value's header for pages of ``page_size`` tokens."""
    return _HEAD.size + 4 * page_size


def _digest(mac_key: bytes, head_wo_digest: bytes, tokens: bytes, payload: bytes) -> bytes:
    m = hmac.new(mac_key, head_wo_digest, hashlib.sha256)
    m.update(tokens)
    m.update(payload)
    return m.digest()


def encode_value(work: dict, payload: bytes, page_size: int, mac_key: bytes = b"") -> bytes:
    """The stored value of one page: header (with the page's token ids) then the payload."""
    tokens = struct.pack(f"<{len(work['tokens'])}i", *work["tokens"])
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, header_len(page_size), len(payload), page_size,
                      len(work["tokens"]), hashlib.sha256(work["key"].encode()).digest(),
                      work["hash"].to_bytes(16, "little"), b"\0" * 32)[:_DIGEST_AT]
    return head + _digest(mac_key, head, tokens, payload) + tokens + payload


def verify_value(work: dict, value: bytes, page_size: int, payload_len: int,
                 mac_key: bytes = b"") -> tuple[bytes | None, str]:
    """``(payload, "")`` when ``value`` is the page ``work`` names, else ``(None, reason)``."""
    hl = header_len(page_size)
    if len(value) != hl + payload_len:
        return None, "size"
    magic, ver, hlen, plen, ps, nt, key_d, chain, digest = _HEAD.unpack_from(value)
    if magic != MAGIC or ver != FORMAT_VERSION or hlen != hl:
        return None, "format"
    if plen != payload_len or ps != page_size or nt != len(work["tokens"]):
        return None, "format"
    if key_d != hashlib.sha256(work["key"].encode()).digest():
        return None, "key"
    if chain != work["hash"].to_bytes(16, "little"):
        return None, "chain"
    tokens = value[_HEAD.size:hl]
    if tokens != struct.pack(f"<{nt}i", *work["tokens"]):
        return None, "tokens"
    payload = value[hl:]
    want = _digest(mac_key, value[:_DIGEST_AT], tokens, payload)
    if not hmac.compare_digest(digest, want):
        return None, "digest"
    return payload, ""


@dataclass
class Breaker:
    """Opens for ``cooldown_s`` after an RPC failure; while open the pool is absent."""
    cooldown_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    open_until: float = 0.0
    trips: int = 0

    def is_open(self) -> bool:
        return self.clock() < self.open_until

    def trip(self) -> None:
        self.open_until = self.clock() + self.cooldown_s
        self.trips += 1


@dataclass
class RuntimeStats:
    """What the runtime saw, by cause (kvshare's own counters are ``Cache.pool_stats()``)."""
    lookups: int = 0
    lookups_skipped: int = 0
    loads_ok: int = 0
    load_failures: dict[str, int] = field(default_factory=dict)
    stores_ok: int = 0
    store_failures: dict[str, int] = field(default_factory=dict)
    removed: int = 0  # entries that failed verification, removed so they can be stored again
    remove_failures: dict[str, int] = field(default_factory=dict)

    def fail(self, table: dict[str, int], cause: str) -> None:
        table[cause] = table.get(cause, 0) + 1


class _Staging:
    """A page-aligned host buffer, registered with the client for ``*_into``/``*_from``."""

    def __init__(self, store: Any, size: int):
        self.size = size
        self.raw = ctypes.create_string_buffer(size + 4096)
        self.ptr = (ctypes.addressof(self.raw) + 4095) & ~4095
        self.store = store
        self.registered = store.register_buffer(self.ptr, size) == 0

    def close(self) -> None:
        if self.registered:
            self.store.unregister_buffer(self.ptr)
            self.registered = False


class PoolTransfers:
    """The store-facing half of the pool tier, without a cache: one batched existence query,
    verified loads and stores of values in kvshare's format, the circuit breaker and the
    negative cache. :class:`PoolRuntime` runs a cache's work with it; kvshare's vLLM KV
    connector runs its worker's loads and stores with it (``kvshare_vllm.pool_tier``).

    An item is a dict with ``key``, ``hash`` (the page's 128-bit chain digest) and ``tokens``
    (the page's token ids), the fields of ``Cache.pool_take_work``'s work."""

    def __init__(self, store: Any, page_size: int, max_page_bytes: int, *,
                 mac_key: bytes = b"", batch: int = 16, breaker: Breaker | None = None,
                 negative_ttl_s: float = 15.0, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.page_size = page_size
        self.mac_key = mac_key
        self.batch = batch
        self.clock = clock
        self.breaker = breaker if breaker is not None else Breaker(clock=clock)
        self.negative_ttl_s = negative_ttl_s
        self.negative: dict[str, float] = {}
        self.stats = RuntimeStats()
        self.slot = header_len(page_size) + max_page_bytes
        self.staging = _Staging(store, self.slot * batch)

    def close(self) -> None:
        """Unregisters the staging buffer; call before closing the store."""
        self.staging.close()

    def _rpc_failed(self, codes) -> bool:
        if any(c in (RPC_FAIL, RPC_TIMEOUT) for c in codes):
            self.breaker.trip()
            return True
        return False

    def _missing(self, key: str) -> bool:
        until = self.negative.get(key)
        if until is None:
            return False
        if self.clock() >= until:
            del self.negative[key]
            return False
        return True

    def lookup(self, keys: list[str]) -> list[bool]:
        """One batched existence query; all misses while the breaker is open."""
        if not keys:
            return []
        if self.breaker.is_open():
            self.stats.lookups_skipped += 1
            return [False] * len(keys)
        self.stats.lookups += 1
        try:
            codes = list(self.store.batch_is_exist(keys))
        except Exception:  # noqa: BLE001 - a client that raises is a failed RPC
            codes = [RPC_FAIL]
        if len(codes) != len(keys) or self._rpc_failed(codes):
            return [False] * len(keys)
        return [c == 1 and not self._missing(k) for c, k in zip(codes, keys)]

    def load(self, items: list[dict], payload_bytes: Callable[[dict], int],
             write: Callable[[dict, bytes], None]) -> list[str]:
        """Loads ``items`` (``batch`` per ``batch_get_into``), verifies each value and hands
        each verified payload to ``write(item, payload)``. Returns one cause per item: ``""``
        for a page written, else why it was not (counted in :attr:`stats`)."""
        out = []
        for i in range(0, len(items), self.batch):
            out += self._load_batch(items[i:i + self.batch], payload_bytes, write)
        return out

    def _fail_load(self, cause: str) -> str:
        self.stats.fail(self.stats.load_failures, cause)
        return cause

    def _load_batch(self, items, payload_bytes, write) -> list[str]:
        ps = self.page_size
        causes: list[str | None] = [None] * len(items)
        todo = []
        for i, w in enumerate(items):
            if self.breaker.is_open():
                causes[i] = self._fail_load("breaker")
            elif self._missing(w["key"]):
                causes[i] = self._fail_load("negative")
            else:
                todo.append(i)
        if not todo:
            return causes  # type: ignore[return-value]
        sizes = [header_len(ps) + payload_bytes(items[i]) for i in todo]
        ptrs = [self.staging.ptr + j * self.slot for j in range(len(todo))]
        try:
            codes = list(self.store.batch_get_into([items[i]["key"] for i in todo], ptrs,
                                                   sizes))
        except Exception:  # noqa: BLE001 - a client that raises is a failed RPC
            codes = []
        if len(codes) != len(todo):
            codes = [RPC_FAIL] * len(todo)
        self._rpc_failed(codes)
        for i, ptr, size, code in zip(todo, ptrs, sizes, codes):
            w = items[i]
            if code < 0 and code != INVALID_PARAMS:
                if code == TRANSFER_FAIL or code == RPC_TIMEOUT:
                    self.negative[w["key"]] = self.clock() + self.negative_ttl_s
                causes[i] = self._fail_load(_LOAD_CAUSES.get(code, f"error {code}"))
                continue
            if code != size:  # shorter, or larger than the buffer (INVALID_PARAMS)
                payload, why = None, "size"
            else:
                # A private copy: the registered staging buffer stays writable by the network.
                value = ctypes.string_at(ptr, size)
                payload, why = verify_value(w, value, ps, size - header_len(ps), self.mac_key)
            if payload is None:
                causes[i] = self._fail_load(why)
                self._remove_bad(w["key"])
                continue
            write(w, payload)
            self.stats.loads_ok += 1
            causes[i] = ""
        return causes  # type: ignore[return-value]

    def _remove_bad(self, key: str) -> None:
        """Removes the entry under ``key`` that failed verification for the page ``key``
        names, so that the recomputed page can be stored under it (a put of a present key
        stores nothing). Forced: the load just read it, and its lease (Mooncake's
        ``default_kv_lease_ttl``) would refuse a plain remove."""
        if self.breaker.is_open():
            self.stats.fail(self.stats.remove_failures, "breaker")
            return
        try:
            code = self.store.remove(key, True)
        except Exception:  # noqa: BLE001 - a client that raises is a failed RPC
            code = RPC_FAIL
        if code == 0:
            self.stats.removed += 1
        else:
            self._rpc_failed([code])
            self.stats.fail(self.stats.remove_failures, f"error {code}")

    def store_values(self, items: list[dict], read: Callable[[dict], bytes]) -> list[bool]:
        """Stores ``items`` (``read(item)``: the page's payload), ``batch`` per
        ``batch_put_from``; skipped while the breaker is open. Returns one ok per item."""
        out = []
        for i in range(0, len(items), self.batch):
            out += self._store_batch(items[i:i + self.batch], read)
        return out

    def _store_batch(self, items, read) -> list[bool]:
        ps = self.page_size
        if self.breaker.is_open():
            for _ in items:
                self.stats.fail(self.stats.store_failures, "breaker")
            return [False] * len(items)
        keys, ptrs, sizes = [], [], []
        for i, w in enumerate(items):
            value = encode_value(w, bytes(read(w)), ps, self.mac_key)
            ptr = self.staging.ptr + i * self.slot
            ctypes.memmove(ptr, value, len(value))
            keys.append(w["key"])
            ptrs.append(ptr)
            sizes.append(len(value))
        try:
            codes = self.store.batch_put_from(keys, ptrs, sizes)
        except Exception:  # noqa: BLE001 - a client that raises is a failed RPC
            codes = RPC_FAIL
        codes = list(codes) if isinstance(codes, (list, tuple)) else [codes] * len(keys)
        if len(codes) != len(keys):
            codes = [RPC_FAIL] * len(keys)
        if not self._rpc_failed(codes):
            codes = self._confirm_stored(keys, codes)
        oks = []
        for code in codes:
            ok = code == 0
            if ok:
                self.stats.stores_ok += 1
            else:
                self.stats.fail(self.stats.store_failures, code if isinstance(code, str)
                                else f"error {code}")
            oks.append(ok)
        return oks

    def _confirm_stored(self, keys: list[str], codes: list) -> list:
        """``codes`` with ``"not stored"`` for each key put "successfully" that the master
        does not list as complete: another writer's put of it never ended."""
        put = [j for j, c in enumerate(codes) if c == 0]
        if not put:
            return codes
        try:
            exist = list(self.store.batch_is_exist([keys[j] for j in put]))
        except Exception:  # noqa: BLE001 - a client that raises is a failed RPC
            exist = [RPC_FAIL]
        if len(exist) != len(put) or self._rpc_failed(exist):
            exist = [RPC_FAIL] * len(put)
        codes = list(codes)
        for j, e in zip(put, exist):
            if e != 1:
                codes[j] = "not stored" if e == 0 else e
        return codes


class PoolRuntime(PoolTransfers):
    """Runs ``cache``'s pool work against ``store`` (a ``MooncakeDistributedStore`` set up by
    the caller, or anything with its ``batch_is_exist``, ``batch_get_into``,
    ``batch_put_from``, ``remove``, ``register_buffer`` and ``unregister_buffer``)."""

    def __init__(self, cache: Any, store: Any, pages: Any, *, mac_key: bytes = b"",
                 batch: int = 16, breaker: Breaker | None = None,
                 negative_ttl_s: float = 15.0, clock: Callable[[], float] = time.monotonic):
        biggest = max(pages.page_bytes(g) for g in range(max(cache.num_groups, 1)))
        super().__init__(store, cache.page_size, biggest, mac_key=mac_key, batch=batch,
                         breaker=breaker, negative_ttl_s=negative_ttl_s, clock=clock)
        self.cache, self.pages = cache, pages

    def begin(self, seq_id: int, tokens, extra=None, max_match_tokens: int = SIZE_MAX,
              lookahead_slots: int = 0) -> dict[str, int]:
        """``Cache.seq_begin_pooled`` after a lookup in the local tiers and the store; then
        runs the loads (see :meth:`pump`). The sequence may run once
        ``cache.seq_pool_loading(seq_id)`` is 0; its match is ``cache.seq_info``'s."""
        first, keys = self.cache.pool_lookup(tokens, extra, max_match_tokens)
        hits = self.lookup([k for _, _, k in keys])
        info = self.cache.seq_begin_pooled(seq_id, tokens, first, hits, extra,
                                           max_match_tokens, lookahead_slots)
        self.pump()
        return info

    def pump(self) -> int:
        """Takes every queued transfer, runs it and reports it. Returns how many ran."""
        done = 0
        while True:
            work = self.cache.pool_take_work(self.batch)
            if not work:
                return done
            loads = [w for w in work if w["op"] == "load"]
            stores = [w for w in work if w["op"] == "store"]
            if loads:
                causes = self.load(loads, lambda w: self.pages.page_bytes(w["group"]),
                                   lambda w, p: self.pages.write(w["group"], w["page"], p))
                for w, cause in zip(loads, causes):
                    self.cache.pool_done(w["ticket"], not cause)
            if stores:
                oks = self.store_values(
                    stores, lambda w: self.pages.read(w["tier"], w["group"], w["page"]))
                for w, ok in zip(stores, oks):
                    self.cache.pool_done(w["ticket"], ok)
            done += len(work)
