"""Python binding of libkvshare, the paged prefix-sharing KV-cache manager.

The C declarations are read from the generated header ``kvshare.h`` with cffi (ABI mode, no
compiler needed at run time), so the header stays the single source of truth.  At import the
library's ``kvs_abi_version()`` is checked against the header's ``KVS_ABI_VERSION``.

Every non-OK ``kvs_status`` is raised as a subclass of :class:`KvsError` (one class per status,
named after it: ``KVS_STATUS_NO_SPACE`` -> :class:`NoSpaceError`) carrying
``kvs_last_error_message()``.

Lookup order of the library: ``$KVSHARE_LIB``; ``libkvshare.so`` next to this package; the
repository's ``target/release`` then ``target/debug``.  Of the header: ``$KVSHARE_HEADER``;
``kvshare.h`` next to this package; the repository's ``include/kvshare.h``.

Token arrays cross as buffers (``array('i')``, ``numpy.int32`` arrays, ``bytes``), never per
element: see :func:`i32_buffer`.  ``ffi`` and ``lib`` are exported for callers (such as the vLLM
adapter) that keep their own preallocated buffers on hot paths.
"""

from __future__ import annotations

import os
import struct
from array import array
from typing import Any

from cffi import FFI

from . import _header

__all__ = [
    "ffi", "lib", "HEADER_PATH", "LIB_PATH", "ABI_VERSION", "MAX_PAGE_SIZE", "VERSION", "KvsError",
    "check", "status_error", "Cache", "config_default", "i32_buffer", "u32_buffer", "pack_i32",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.abspath(os.path.join(_HERE, "..", "..", ".."))


def _first_existing(*paths: str | None) -> str | None:
    for p in paths:
        if p and os.path.isfile(p):
            return p
    return None


def _find_header() -> str:
    p = _first_existing(os.environ.get("KVSHARE_HEADER"), os.path.join(_HERE, "kvshare.h"),
                        os.path.join(_REPO, "include", "kvshare.h"))
    if p is None:
        raise ImportError("kvshare: kvshare.h not found (set KVSHARE_HEADER, or install a wheel "
                          "that bundles it, or use the repository checkout)")
    return p


def _find_library() -> str:
    env = os.environ.get("KVSHARE_LIB")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"kvshare: KVSHARE_LIB={env!r} is not a file")
        return env
    p = _first_existing(os.path.join(_HERE, "libkvshare.so"),
                        os.path.join(_REPO, "target", "release", "libkvshare.so"),
                        os.path.join(_REPO, "target", "debug", "libkvshare.so"))
    if p is None:
        raise ImportError("kvshare: libkvshare.so not found: set KVSHARE_LIB, put it next to the "
                          "kvshare package, or run `cargo build --release` in the repository")
    return p


HEADER_PATH = _find_header()
LIB_PATH = _find_library()

with open(HEADER_PATH, encoding="utf-8") as _f:
    _HEADER_TEXT = _f.read()
MACROS = _header.int_macros(_HEADER_TEXT)
ABI_VERSION: int = MACROS["KVS_ABI_VERSION"]
#: The largest page size (tokens per page) the library accepts (``KVS_MAX_PAGE_SIZE``).
MAX_PAGE_SIZE: int = MACROS["KVS_MAX_PAGE_SIZE"]
#: ``kvs_group.flags``: an EAGLE / MTP group (its prefix hits end a page earlier).
GROUP_EAGLE: int = MACROS["KVS_GROUP_EAGLE"]

ffi = FFI()
ffi.cdef(_header.cdef_text(HEADER_PATH))
lib: Any = ffi.dlopen(LIB_PATH)

if lib.kvs_abi_version() != ABI_VERSION:
    raise ImportError(
        f"kvshare: {LIB_PATH} has ABI version {lib.kvs_abi_version()}, but {HEADER_PATH} "
        f"declares KVS_ABI_VERSION {ABI_VERSION}; rebuild the library or use the matching header")

VERSION: str = ffi.string(lib.kvs_version()).decode()


# ---------------------------------------------------------------------------------------------
# Statuses -> exceptions (one class per status of the header's enum)
# ---------------------------------------------------------------------------------------------

class KvsError(Exception):
    """A ``kvs_`` call returned a non-OK status.

    ``status`` is the number, ``status_name`` its ``KVS_STATUS_*`` name, ``message`` the
    library's ``kvs_last_error_message()`` for the failed call.
    """

    status: int = -1
    status_name: str = "KVS_STATUS_UNKNOWN"

    def __init__(self, message: str, status: int | None = None, func: str | None = None):
        if status is not None:
            self.status = status
            self.status_name = ffi.string(lib.kvs_status_str(status)).decode()
        self.message = message
        self.func = func
        where = f"{func}: " if func else ""
        super().__init__(f"{where}{self.status_name}: {message}")


def _class_name(status_name: str) -> str:
    words = status_name[len("KVS_STATUS_"):].split("_")
    name = "".join(w.capitalize() for w in words)
    return name if name.endswith("Error") else name + "Error"


_STATUS_CLASSES: dict[int, type[KvsError]] = {}
STATUS: dict[str, int] = {}
for _name, _value in sorted(ffi.typeof("enum kvs_status").relements.items(), key=lambda kv: kv[1]):
    STATUS[_name] = _value
    if _value == 0:
        continue
    _cls = type(_class_name(_name), (KvsError,),
                {"status": _value, "status_name": _name,
                 "__doc__": f"Raised for ``{_name}`` ({_value})."})
    _cls.__module__ = __name__
    globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)
    _STATUS_CLASSES[_value] = _cls


def status_error(status: int, func: str | None = None) -> KvsError:
    """The exception for a failed status, with this thread's last error message."""
    msg = ffi.string(lib.kvs_last_error_message()).decode("utf-8", "replace")
    cls = _STATUS_CLASSES.get(status, KvsError)
    return cls(msg, status, func)


def check(status: int, func: str | None = None) -> None:
    """Raises the status's :class:`KvsError` subclass unless it is ``KVS_STATUS_OK``."""
    if status:
        raise status_error(status, func)


# ---------------------------------------------------------------------------------------------
# Buffers
# ---------------------------------------------------------------------------------------------

def _pack(values, code: str) -> bytes:
    """4-byte integers (``struct``/``array`` type code ``code``) in native order, converted in
    one C-level call: ``struct.pack``, about 3x faster than ``array(code, list)`` on long
    lists.  Values it refuses go through ``array``, which raises its usual error."""
    try:
        return struct.pack(f"{len(values)}{code}", *values)
    except struct.error:
        return array(code, values).tobytes()


def pack_i32(values) -> bytes:
    """Token ids (a list, tuple or range) as int32 bytes in native order."""
    return _pack(values, "i")


def _typed_buffer(obj: Any, ctype: str, code: str, itemsize: int):
    """(cdata pointer, element count, keepalive) for a buffer of 4-byte integers."""
    if obj is None:
        return ffi.NULL, 0, None
    if isinstance(obj, (list, tuple, range)):
        obj = _pack(obj, code)  # one C-level conversion, not a Python loop per element
    mv = memoryview(obj)
    if mv.itemsize != itemsize and not (mv.format in ("B", "b", "c") and mv.nbytes % itemsize == 0):
        raise TypeError(f"expected a buffer of {itemsize}-byte integers, got format {mv.format!r}")
    n = mv.nbytes // itemsize
    if n == 0:
        return ffi.NULL, 0, None
    return ffi.from_buffer(ctype, obj), n, obj


def i32_buffer(obj: Any):
    """``(int32_t*, n, keepalive)`` for tokens: array('i'), numpy int32, bytes, or a list."""
    return _typed_buffer(obj, "int32_t[]", "i", 4)


def u32_buffer(obj: Any):
    """``(uint32_t*, n, keepalive)`` for page ids."""
    return _typed_buffer(obj, "uint32_t[]", "I", 4)


def config_default(**fields: Any):
    """A ``kvs_config`` (cdata) from ``kvs_config_default()`` with ``fields`` overridden."""
    cfg = ffi.new("kvs_config *", lib.kvs_config_default())
    for k, v in fields.items():
        if not hasattr(cfg, k):
            raise AttributeError(f"kvs_config has no field {k!r}")
        setattr(cfg, k, v)
    return cfg


def _struct_dict(cdata: Any) -> dict[str, Any]:
    t = ffi.typeof(cdata)
    if t.kind == "pointer":
        t = t.item
    return {f: getattr(cdata, f) for f, _ in t.fields}


class ExtraKeys:
    """A ``kvs_extra_keys`` and the memory it points to (kept alive with it).

    ``mm_items`` is a sequence of ``(hash_lo, hash_hi, offset, length)``.
    """

    __slots__ = ("ptr", "_keep")

    def __init__(self, lora_id: int = 0, salt: bytes | None = None, mm_items=()):
        ek = ffi.new("kvs_extra_keys *")
        keep: list[Any] = [ek]
        ek.lora_id = lora_id
        if salt:
            buf = ffi.new("uint8_t[]", salt)
            keep.append(buf)
            ek.salt, ek.salt_len = buf, len(salt)
        items = list(mm_items)
        if items:
            arr = ffi.new("kvs_mm_item[]", len(items))
            for i, (lo, hi, off, ln) in enumerate(items):
                arr[i].hash_lo, arr[i].hash_hi, arr[i].offset, arr[i].length = lo, hi, off, ln
            keep.append(arr)
            ek.mm_items, ek.num_mm_items = arr, len(items)
        self.ptr = ek
        self._keep = keep

    @property
    def is_empty(self) -> bool:
        return self.ptr.lora_id == 0 and self.ptr.salt_len == 0 and self.ptr.num_mm_items == 0


def _extra(extra: ExtraKeys | None):
    return ffi.NULL if extra is None else extra.ptr


SIZE_MAX = int(ffi.cast("size_t", -1))

KINDS = {
    "full": lib.KVS_GROUP_KIND_FULL,
    "sliding_window": lib.KVS_GROUP_KIND_SLIDING_WINDOW,
    "chunked_local": lib.KVS_GROUP_KIND_CHUNKED_LOCAL,
    "state": lib.KVS_GROUP_KIND_STATE,
}
KIND_NAMES = {v: k for k, v in KINDS.items()}
STATE_MODES = {
    "none": lib.KVS_STATE_MODE_NONE,
    "all": lib.KVS_STATE_MODE_ALL,
    "align": lib.KVS_STATE_MODE_ALIGN,
}
STATE_MODE_NAMES = {v: k for k, v in STATE_MODES.items()}


def group_spec(g: Any) -> tuple[int, int, int, int]:
    """``(kind, window, page_bytes, flags)`` numbers of one group given as a tuple or a dict.

    ``kind`` is ``"full"``, ``"sliding_window"``, ``"chunked_local"``, ``"state"`` or the
    ``KVS_GROUP_KIND_*`` value; a ``"state"`` group (Mamba / linear attention) takes its
    ``mamba_cache_mode`` (``"none"``, ``"all"``, ``"align"`` or the ``KVS_STATE_MODE_*`` value)
    in place of the window: ``("state", "all", page_bytes)`` or ``{"kind": "state", "mode":
    "all", "page_bytes": page_bytes}``.  ``page_bytes`` 0: the geometry's.  An EAGLE / MTP
    group (``KVS_GROUP_EAGLE``: a hit ends a page earlier for the draft model to recompute) adds
    ``True`` as a fourth tuple item or ``"eagle": True``."""
    if isinstance(g, dict):
        kind, page_bytes, eagle = g["kind"], g.get("page_bytes", 0), g.get("eagle", False)
        window = g["mode"] if "mode" in g else g.get("window", 0)
    else:
        kind, window, page_bytes, *rest = g
        if len(rest) > 1:
            raise ValueError(f"group {g!r}: (kind, window, page_bytes[, eagle])")
        eagle = rest[0] if rest else False
    k = KINDS[kind] if isinstance(kind, str) else int(kind)
    if isinstance(window, str):
        window = STATE_MODES[window]
    return k, int(window), int(page_bytes), GROUP_EAGLE if eagle else 0


def _copy_tuple(c) -> tuple[int, int, int, int, int]:
    return (c.src_page, c.dst_page, c.num_tokens, c.kind, c.group)


POOL_STORES = {"read_only": 0, "write_through": 1, "on_demotion": 2}


def _pool_config(pool: dict):
    """(``kvs_pool_config*``, keepalive) from ``{"namespace": str, "identity": bytes | str,
    "store": "read_only" | "write_through" | "on_demotion", "tp": (rank, size), "pp": ...,
    "pcp": ..., "dcp": ...}`` (ranks default to ``(0, 1)``)."""
    unknown = set(pool) - {"namespace", "identity", "store", "tp", "pp", "pcp", "dcp"}
    if unknown:
        raise KeyError(f"pool settings: unknown {sorted(unknown)}")
    ns = pool["namespace"].encode()
    ident = pool["identity"]
    ident = ident.encode() if isinstance(ident, str) else bytes(ident)
    keep = [ffi.from_buffer("uint8_t[]", ns) if ns else ffi.NULL,
            ffi.from_buffer("uint8_t[]", ident) if ident else ffi.NULL]
    pc = ffi.new("kvs_pool_config *")
    pc.key_namespace, pc.key_namespace_len = keep[0], len(ns)
    pc.identity, pc.identity_len = keep[1], len(ident)
    for dim in ("tp", "pp", "pcp", "dcp"):
        rank, size = pool.get(dim, (0, 1))
        setattr(pc, f"{dim}_rank", rank)
        setattr(pc, f"{dim}_size", size)
    store = pool.get("store", "write_through")
    pc.store = POOL_STORES[store] if isinstance(store, str) else store
    return pc, (keep, ns, ident)


class Cache:
    """Owns a ``kvs_cache*``: every method is one ``kvs_`` call; errors raise :class:`KvsError`.

    One cache serves one or many KV-cache groups: ``groups`` (a list of :func:`group_spec`
    tuples or dicts, in the engine's ``group_idx`` order) is the config's ``groups``; without
    it the cache has one full-attention group.  Per-group calls take ``group`` (default 0).
    ``handle`` is the raw ``kvs_cache*`` for direct ``lib`` calls on hot paths.  The cache is
    freed by :meth:`close` (or garbage collection).

    Page copies come back as ``(src_page, dst_page, num_tokens, kind, group)`` tuples.
    """

    def __init__(self, config: Any = None, groups=None, pool: dict | None = None,
                 **fields: Any):
        if config is not None and fields:
            raise TypeError("Cache: give a config or fields, not both")
        cfg = ffi.new("kvs_config *", config[0]) if config is not None \
            else config_default(**fields)
        arr = None
        if groups is not None:
            specs = [group_spec(g) for g in groups]
            arr = ffi.new("kvs_group[]", max(len(specs), 1))
            for i, (k, w, b, f) in enumerate(specs):
                arr[i].kind, arr[i].window, arr[i].page_bytes, arr[i].flags = k, w, b, f
            cfg.groups, cfg.num_groups = arr, len(specs)
        out = ffi.new("kvs_cache **")
        if pool is None:
            check(lib.kvs_cache_new(cfg, out), "kvs_cache_new")
        else:
            pc, _keep = _pool_config(pool)
            check(lib.kvs_cache_new_pooled(cfg, pc, out), "kvs_cache_new_pooled")
        self.pooled = pool is not None
        self.handle = ffi.gc(out[0], lib.kvs_cache_free)
        c = ffi.new("kvs_config *")
        check(lib.kvs_cache_get_config(self.handle, c), "kvs_cache_get_config")
        self.config = _struct_dict(c)
        del self.config["groups"]  # NULL: the groups are read with group_info
        self.page_size: int = c.page_size
        self.num_groups: int = c.num_groups
        self._copies = ffi.new("kvs_copy[]", 64)
        self._events = ffi.new("kvs_event[]", 1024)

    def close(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            ffi.gc(h, None)  # detaches the destructor in place (and returns None)
            lib.kvs_cache_free(h)

    # -- cache ----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Totals over every pool and group (``kvs_stats``)."""
        s = ffi.new("kvs_stats *")
        check(lib.kvs_cache_stats(self.handle, s), "kvs_cache_stats")
        return _struct_dict(s)

    def group_info(self, group: int) -> dict[str, Any]:
        """Kind (a :data:`KINDS` name), window (state groups: also ``mode``), page bytes, pool,
        flags (``eagle``: whether it is an EAGLE group)."""
        info = ffi.new("kvs_group_info *")
        check(lib.kvs_cache_group_info(self.handle, group, info), "kvs_cache_group_info")
        d = _struct_dict(info)
        d["kind"] = KIND_NAMES[d["kind"]]
        d["eagle"] = bool(d["flags"] & GROUP_EAGLE)
        if d["kind"] == "state":
            d["mode"] = STATE_MODE_NAMES[d["window"]]
        return d

    def group_stats(self, group: int) -> dict[str, int]:
        s = ffi.new("kvs_group_stats *")
        check(lib.kvs_cache_group_stats(self.handle, group, s), "kvs_cache_group_stats")
        return _struct_dict(s)

    def available(self, tier: int = 0, group: int = 0) -> int:
        """Free plus evictable pages of ``group``'s pool in ``tier``."""
        n = ffi.new("size_t *")
        check(lib.kvs_cache_available(self.handle, tier, group, n), "kvs_cache_available")
        return n[0]

    def check(self) -> None:
        check(lib.kvs_cache_check(self.handle), "kvs_cache_check")

    def commit(self) -> None:
        check(lib.kvs_cache_commit(self.handle), "kvs_cache_commit")

    def new_step(self) -> None:
        """Starts a scheduler step (vLLM's ``new_step_starts``): state checkpoints registered
        before now may be hit; until then a begin hitting one fails with ``NoSpaceError``."""
        check(lib.kvs_cache_new_step(self.handle), "kvs_cache_new_step")

    def take_copies(self) -> list[tuple[int, int, int, int, int]]:
        out, n = [], ffi.new("size_t *")
        while True:
            check(lib.kvs_cache_take_copies(self.handle, self._copies, len(self._copies), n),
                  "kvs_cache_take_copies")
            out.extend(_copy_tuple(c) for c in self._copies[0:n[0]])
            if n[0] < len(self._copies):
                return out

    def take_events(self) -> list[dict[str, int]]:
        """Queued events as dicts of ``kvs_event``'s fields plus ``hash`` and ``parent`` (the
        128-bit values)."""
        out, n = [], ffi.new("size_t *")
        while True:
            check(lib.kvs_cache_take_events(self.handle, self._events, len(self._events), n),
                  "kvs_cache_take_events")
            for e in self._events[0:n[0]]:
                d = _struct_dict(e)
                d["hash"] = d["hash_hi"] << 64 | d["hash_lo"]
                d["parent"] = d["parent_hi"] << 64 | d["parent_lo"]
                out.append(d)
            if n[0] < len(self._events):
                return out

    def block_tables(self, seq_ids, max_pages: int, pad_page: int = -1, group: int = 0):
        ids = array("Q", seq_ids)
        table = array("i", bytes(4 * len(ids) * max_pages))
        lens = array("i", bytes(4 * len(ids)))
        check(lib.kvs_cache_block_tables(
            self.handle, group, ffi.from_buffer("uint64_t[]", ids) if ids else ffi.NULL,
            len(ids), max_pages, pad_page,
            ffi.from_buffer("int32_t[]", table) if table else ffi.NULL, len(table),
            ffi.from_buffer("int32_t[]", lens) if lens else ffi.NULL, len(lens)),
            "kvs_cache_block_tables")
        return table, lens

    def slot_mapping(self, seq_ids, query_lens, num_slots: int | None = None, group: int = 0):
        ids, ql = array("Q", seq_ids), array("I", query_lens)
        total = sum(ql) if num_slots is None else num_slots
        slots = array("q", bytes(8 * total))
        check(lib.kvs_cache_slot_mapping(
            self.handle, group, ffi.from_buffer("uint64_t[]", ids) if ids else ffi.NULL,
            ffi.from_buffer("uint32_t[]", ql) if ql else ffi.NULL, len(ids),
            ffi.from_buffer("int64_t[]", slots) if total else ffi.NULL, total,
            ffi.NULL), "kvs_cache_slot_mapping")
        return slots

    # -- pages ----------------------------------------------------------------------------
    def pages_alloc(self, n: int, group: int = 0) -> array:
        out = array("I", bytes(4 * n))
        check(lib.kvs_pages_alloc(self.handle, group, n,
                                  ffi.from_buffer("uint32_t[]", out) if n else ffi.NULL, n),
              "kvs_pages_alloc")
        return out

    def pages_acquire(self, pages, group: int = 0) -> None:
        p, n, _k = u32_buffer(pages)
        check(lib.kvs_pages_acquire(self.handle, group, p, n), "kvs_pages_acquire")

    def pages_release(self, pages, group: int = 0) -> None:
        p, n, _k = u32_buffer(pages)
        check(lib.kvs_pages_release(self.handle, group, p, n), "kvs_pages_release")

    def page_info(self, page: int, tier: int = 0, group: int = 0) -> dict[str, Any]:
        info = ffi.new("kvs_page_info *")
        check(lib.kvs_page_get_info(self.handle, tier, group, page, info), "kvs_page_get_info")
        return _struct_dict(info)

    # -- prefix index ---------------------------------------------------------------------
    def prefix_register(self, tokens, pages, extra: ExtraKeys | None = None,
                        group: int = 0) -> int:
        t, nt, _k1 = i32_buffer(tokens)
        p, np_, _k2 = u32_buffer(pages)
        out = ffi.new("size_t *")
        check(lib.kvs_prefix_register(self.handle, group, t, nt, p, np_, _extra(extra), out),
              "kvs_prefix_register")
        return out[0]

    def prefix_match(self, tokens, extra: ExtraKeys | None = None, max_tokens: int = SIZE_MAX,
                     acquire: bool = False, group: int = 0) -> tuple[array, int]:
        t, nt, _k = i32_buffer(tokens)
        cap = nt // self.page_size
        pages = array("I", bytes(4 * cap))
        npg, nm = ffi.new("size_t *"), ffi.new("size_t *")
        check(lib.kvs_prefix_match(self.handle, group, t, nt, _extra(extra), max_tokens, acquire,
                                   ffi.from_buffer("uint32_t[]", pages) if cap else ffi.NULL,
                                   cap, npg, nm), "kvs_prefix_match")
        del pages[npg[0]:]
        return pages, nm[0]

    def prefix_find(self, tokens, max_tokens: int = SIZE_MAX,
                    extra: ExtraKeys | None = None) -> tuple[int, list[array]]:
        """The read-only hit over every group: ``N`` tokens and each group's ``N // page_size``
        pages (0: the null page, a position the group no longer reads)."""
        t, nt, _k = i32_buffer(tokens)
        cap = nt // self.page_size
        pages = array("I", bytes(4 * cap * self.num_groups))
        n = ffi.new("size_t *")
        check(lib.kvs_prefix_find(self.handle, t, nt, _extra(extra), max_tokens,
                                  ffi.from_buffer("uint32_t[]", pages) if cap else ffi.NULL,
                                  len(pages), cap, n), "kvs_prefix_find")
        k = n[0] // self.page_size
        return n[0], [pages[g * cap:g * cap + k] for g in range(self.num_groups)]

    def prefix_clear(self) -> None:
        check(lib.kvs_prefix_clear(self.handle), "kvs_prefix_clear")

    def prefix_pin(self, tokens, extra: ExtraKeys | None = None) -> tuple[int, int]:
        t, nt, _k = i32_buffer(tokens)
        pin, n = ffi.new("uint64_t *"), ffi.new("size_t *")
        check(lib.kvs_prefix_pin(self.handle, t, nt, _extra(extra), pin, n), "kvs_prefix_pin")
        return pin[0], n[0]

    def prefix_unpin(self, pin_id: int) -> None:
        check(lib.kvs_prefix_unpin(self.handle, pin_id), "kvs_prefix_unpin")

    def prefix_prefetch(self, tokens, extra: ExtraKeys | None = None) -> int:
        t, nt, _k = i32_buffer(tokens)
        n = ffi.new("size_t *")
        check(lib.kvs_prefix_prefetch(self.handle, t, nt, _extra(extra), n), "kvs_prefix_prefetch")
        return n[0]

    # -- sequences ------------------------------------------------------------------------
    def seq_begin(self, seq_id: int, tokens, extra: ExtraKeys | None = None,
                  max_match_tokens: int = SIZE_MAX, lookahead_slots: int = 0,
                  computed_tokens: int = 0) -> dict[str, int]:
        """``kvs_seq_begin_computed`` (``kvs_seq_begin`` with ``computed_tokens`` 0): the first
        ``computed_tokens`` tokens have KV once the call returns (the hit's, and those a KV
        connector loads into the slots), so windows take no page where they no longer read."""
        t, nt, _k = i32_buffer(tokens)
        info = ffi.new("kvs_seq_info *")
        check(lib.kvs_seq_begin_computed(self.handle, seq_id, t, nt, _extra(extra),
                                         max_match_tokens, lookahead_slots, computed_tokens,
                                         info), "kvs_seq_begin_computed")
        return _struct_dict(info)

    def seq_append(self, seq_id: int, tokens, lookahead_slots: int = 0) -> list[tuple]:
        t, nt, _k = i32_buffer(tokens)
        copies, n = self._copies, ffi.new("size_t *")
        rc = lib.kvs_seq_append(self.handle, seq_id, t, nt, lookahead_slots, copies,
                                len(copies), n)
        if rc == STATUS["KVS_STATUS_BUFFER_TOO_SMALL"]:  # refused whole: retry with room
            copies = ffi.new("kvs_copy[]", self.seq_append_need(seq_id, nt, lookahead_slots)[1])
            rc = lib.kvs_seq_append(self.handle, seq_id, t, nt, lookahead_slots, copies,
                                    len(copies), n)
        check(rc, "kvs_seq_append")
        return [_copy_tuple(c) for c in copies[0:n[0]]]

    def seq_append_need(self, seq_id: int, num_tokens: int,
                        lookahead_slots: int = 0) -> tuple[int, int]:
        """``(pages needed, copies it would queue)`` for appending ``num_tokens`` tokens."""
        pages, copies = ffi.new("size_t *"), ffi.new("size_t *")
        check(lib.kvs_seq_append_need(self.handle, seq_id, num_tokens, lookahead_slots, pages,
                                      copies), "kvs_seq_append_need")
        return pages[0], copies[0]

    def seq_append_batch(self, seq_ids, tokens) -> list[tuple]:
        ids = array("Q", seq_ids)
        t, nt, _k = i32_buffer(tokens)
        copies = ffi.new("kvs_copy[]", max(len(ids) * self.num_groups, 1))
        n = ffi.new("size_t *")
        id_buf = ffi.from_buffer("uint64_t[]", ids) if ids else ffi.NULL
        check(lib.kvs_seq_append_batch(self.handle, id_buf, len(ids), t, nt, copies,
                                       len(copies), n), "kvs_seq_append_batch")
        return [_copy_tuple(c) for c in copies[0:n[0]]]

    def seq_fork(self, parent_id: int, child_id: int) -> None:
        check(lib.kvs_seq_fork(self.handle, parent_id, child_id), "kvs_seq_fork")

    def seq_free(self, seq_id: int) -> None:
        check(lib.kvs_seq_free(self.handle, seq_id), "kvs_seq_free")

    def seq_free_deferred(self, seq_id: int) -> None:
        """Ends a sequence as vLLM 0.32 ends a request whose free it deferred: every group's
        pages released as one list, last group first (``kvs_seq_free_deferred``)."""
        check(lib.kvs_seq_free_deferred(self.handle, seq_id), "kvs_seq_free_deferred")

    def seq_release_skipped(self, seq_id: int, num_computed_tokens: int) -> int:
        """Releases the positions no group reads any more once ``num_computed_tokens`` are
        computed (vLLM's ``remove_skipped_blocks``); returns the pages released."""
        n = ffi.new("size_t *")
        check(lib.kvs_seq_release_skipped(self.handle, seq_id, num_computed_tokens, n),
              "kvs_seq_release_skipped")
        return n[0]

    def seq_set_computed(self, seq_id: int, num_computed_tokens: int) -> None:
        """The KV of the sequence's first ``num_computed_tokens`` tokens is written: only its
        full pages within them (and its prefix hit) become hits, go to the pool tier, or are
        shared by content on a swap."""
        check(lib.kvs_seq_set_computed(self.handle, seq_id, num_computed_tokens),
              "kvs_seq_set_computed")

    def seq_set_retention(self, seq_id: int, boundaries) -> None:
        """The sequence's retention boundaries (token positions, at most
        ``MACROS["KVS_MAX_RETENTION_BOUNDARIES"]``): with sparse ``window_retention``, the
        sliding-window groups register the tail of pages before each (those of its full pages
        already offered now)."""
        b = list(boundaries)
        check(lib.kvs_seq_set_retention(self.handle, seq_id, ffi.new("size_t[]", b) if b
                                        else ffi.NULL, len(b)), "kvs_seq_set_retention")

    def _swap(self, fn, name: str, seq_id: int) -> list[tuple]:
        cap = self.seq_info(seq_id)["num_pages"] * self.num_groups
        copies = ffi.new("kvs_copy[]", max(cap, 1))
        n = ffi.new("size_t *")
        check(fn(self.handle, seq_id, copies, len(copies), n), name)
        return [_copy_tuple(c) for c in copies[0:n[0]]]

    def seq_swap_out(self, seq_id: int) -> list[tuple]:
        return self._swap(lib.kvs_seq_swap_out, "kvs_seq_swap_out", seq_id)

    def seq_swap_in(self, seq_id: int) -> list[tuple]:
        return self._swap(lib.kvs_seq_swap_in, "kvs_seq_swap_in", seq_id)

    def seq_set_priority(self, seq_id: int, priority: int) -> None:
        check(lib.kvs_seq_set_priority(self.handle, seq_id, priority), "kvs_seq_set_priority")

    def seq_info(self, seq_id: int) -> dict[str, int]:
        info = ffi.new("kvs_seq_info *")
        check(lib.kvs_seq_get_info(self.handle, seq_id, info), "kvs_seq_get_info")
        return _struct_dict(info)

    def seq_pages(self, seq_id: int, group: int = 0) -> array:
        """The sequence's block table in ``group`` (0 at released positions on the device,
        ``0xFFFFFFFF`` on the host)."""
        cap = self.seq_info(seq_id)["num_pages"]
        out = array("I", bytes(4 * cap))
        n = ffi.new("size_t *")
        check(lib.kvs_seq_pages(self.handle, group, seq_id,
                                ffi.from_buffer("uint32_t[]", out) if cap else ffi.NULL, cap, n),
              "kvs_seq_pages")
        del out[n[0]:]
        return out

    # -- pool tier (a cache made with ``pool=``; kvshare/pool.py moves the bytes) -----------
    def pool_lookup(self, tokens, extra: ExtraKeys | None = None,
                    max_match_tokens: int = SIZE_MAX) -> tuple[int, list[tuple[int, int, str]]]:
        """``(first_page, [(position, group, key), ...])``: the store keys after the local hit."""
        t, nt, _k = i32_buffer(tokens)
        cap = max(nt // self.page_size, 1) * max(self.num_groups, 1)
        keys = ffi.new("kvs_pool_key[]", cap)
        n, first = ffi.new("size_t *"), ffi.new("size_t *")
        check(lib.kvs_pool_lookup(self.handle, t, nt, _extra(extra), max_match_tokens, keys, cap,
                                  n, first), "kvs_pool_lookup")
        return first[0], [(keys[i].position, keys[i].group,
                           ffi.string(keys[i].key, keys[i].key_len).decode()) for i in range(n[0])]

    def seq_begin_pooled(self, seq_id: int, tokens, first_page: int, hits,
                         extra: ExtraKeys | None = None, max_match_tokens: int = SIZE_MAX,
                         lookahead_slots: int = 0) -> dict[str, int]:
        """:meth:`seq_begin` with the store's answer (``hits``: one 0/1 per lookup key); the
        result has ``pool_pages``, the positions loading."""
        t, nt, _k = i32_buffer(tokens)
        hb = bytes(1 if h else 0 for h in hits)
        hp = ffi.from_buffer("uint8_t[]", hb) if hb else ffi.NULL
        info, pages = ffi.new("kvs_seq_info *"), ffi.new("size_t *")
        check(lib.kvs_seq_begin_pooled(self.handle, seq_id, t, nt, _extra(extra),
                                       max_match_tokens, lookahead_slots, first_page, hp,
                                       len(hb), info, pages), "kvs_seq_begin_pooled")
        return dict(_struct_dict(info), pool_pages=pages[0])

    def pool_take_work(self, max_items: int = 64) -> list[dict[str, Any]]:
        """Queued transfers: dicts with ``ticket, op ("load"/"store"), group, tier, page,
        key, hash`` (the 128-bit chain digest) and ``tokens`` (the page's token ids)."""
        ps = self.page_size
        work = ffi.new("kvs_pool_work[]", max_items)
        toks = ffi.new("int32_t[]", max_items * ps)
        n = ffi.new("size_t *")
        check(lib.kvs_pool_take_work(self.handle, work, max_items, toks, max_items * ps, n),
              "kvs_pool_take_work")
        out = []
        for i in range(n[0]):
            w = work[i]
            out.append({"ticket": w.ticket, "op": ("load", "store")[w.op], "group": w.group,
                        "tier": w.tier, "page": w.page,
                        "key": ffi.string(w.key, w.key_len).decode(),
                        "hash": w.hash_lo | (w.hash_hi << 64),
                        "tokens": list(toks[i * ps:i * ps + w.num_tokens])})
        return out

    def pool_done(self, ticket: int, ok: bool) -> None:
        check(lib.kvs_pool_done(self.handle, ticket, ok), "kvs_pool_done")

    def seq_pool_loading(self, seq_id: int) -> int:
        n = ffi.new("size_t *")
        check(lib.kvs_seq_pool_loading(self.handle, seq_id, n), "kvs_seq_pool_loading")
        return n[0]

    def pool_stats(self) -> dict[str, int]:
        s = ffi.new("kvs_pool_stats *")
        check(lib.kvs_cache_pool_stats(self.handle, s), "kvs_cache_pool_stats")
        return _struct_dict(s)

    def seq_state_page(self, seq_id: int, group: int) -> int:
        """The page holding the sequence's running state in state group ``group``."""
        page = ffi.new("uint32_t *")
        check(lib.kvs_seq_state_page(self.handle, seq_id, group, page), "kvs_seq_state_page")
        return page[0]


__all__ += ["ExtraKeys", "SIZE_MAX", "KINDS", "STATE_MODES", "POOL_STORES", "GROUP_EAGLE",
            "group_spec"]
