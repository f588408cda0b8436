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


class Cache:
    """Owns a ``kvs_cache*``: every method is one ``kvs_`` call; errors raise :class:`KvsError`.

    ``handle`` is the raw ``kvs_cache*`` for direct ``lib`` calls on hot paths.  The cache is
    freed by :meth:`close` (or garbage collection).
    """

    def __init__(self, config: Any = None, **fields: Any):
        cfg = config if config is not None else config_default(**fields)
        out = ffi.new("kvs_cache **")
        check(lib.kvs_cache_new(cfg, out), "kvs_cache_new")
        self.handle = ffi.gc(out[0], lib.kvs_cache_free)
        c = ffi.new("kvs_config *")
        check(lib.kvs_cache_get_config(self.handle, c), "kvs_cache_get_config")
        self.config = _struct_dict(c)
        self.page_size: int = c.page_size
        self._copies = ffi.new("kvs_copy[]", 64)
        self._events = ffi.new("kvs_event[]", 1024)

    def close(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            ffi.gc(h, None)  # detaches the destructor in place (and returns None)
            lib.kvs_cache_free(h)

    # -- cache ----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        s = ffi.new("kvs_stats *")
        check(lib.kvs_cache_stats(self.handle, s), "kvs_cache_stats")
        return _struct_dict(s)

    def check(self) -> None:
        check(lib.kvs_cache_check(self.handle), "kvs_cache_check")

    def commit(self) -> None:
        check(lib.kvs_cache_commit(self.handle), "kvs_cache_commit")

    def take_copies(self) -> list[tuple[int, int, int, int]]:
        out, n = [], ffi.new("size_t *")
        while True:
            check(lib.kvs_cache_take_copies(self.handle, self._copies, len(self._copies), n),
                  "kvs_cache_take_copies")
            out.extend((c.src_page, c.dst_page, c.num_tokens, c.kind)
                       for c in self._copies[0:n[0]])
            if n[0] < len(self._copies):
                return out

    def take_events(self) -> list[dict[str, int]]:
        out, n = [], ffi.new("size_t *")
        while True:
            check(lib.kvs_cache_take_events(self.handle, self._events, len(self._events), n),
                  "kvs_cache_take_events")
            out.extend(_struct_dict(e) for e in self._events[0:n[0]])
            if n[0] < len(self._events):
                return out

    def block_tables(self, seq_ids, max_pages: int, pad_page: int = -1):
        ids = array("Q", seq_ids)
        table = array("i", bytes(4 * len(ids) * max_pages))
        lens = array("i", bytes(4 * len(ids)))
        check(lib.kvs_cache_block_tables(
            self.handle, ffi.from_buffer("uint64_t[]", ids), len(ids), max_pages, pad_page,
            ffi.from_buffer("int32_t[]", table), len(table),
            ffi.from_buffer("int32_t[]", lens), len(lens)), "kvs_cache_block_tables")
        return table, lens

    def slot_mapping(self, seq_ids, query_lens, num_slots: int | None = None):
        ids, ql = array("Q", seq_ids), array("I", query_lens)
        total = sum(ql) if num_slots is None else num_slots
        slots = array("q", bytes(8 * total))
        check(lib.kvs_cache_slot_mapping(
            self.handle, ffi.from_buffer("uint64_t[]", ids), ffi.from_buffer("uint32_t[]", ql),
            len(ids), ffi.from_buffer("int64_t[]", slots) if total else ffi.NULL, total,
            ffi.NULL), "kvs_cache_slot_mapping")
        return slots

    # -- pages ----------------------------------------------------------------------------
    def pages_alloc(self, n: int) -> array:
        out = array("I", bytes(4 * n))
        check(lib.kvs_pages_alloc(self.handle, n, ffi.from_buffer("uint32_t[]", out) if n else ffi.NULL, n),
              "kvs_pages_alloc")
        return out

    def pages_acquire(self, pages) -> None:
        p, n, _k = u32_buffer(pages)
        check(lib.kvs_pages_acquire(self.handle, p, n), "kvs_pages_acquire")

    def pages_release(self, pages) -> None:
        p, n, _k = u32_buffer(pages)
        check(lib.kvs_pages_release(self.handle, p, n), "kvs_pages_release")

    def page_info(self, page: int, tier: int = 0) -> dict[str, Any]:
        info = ffi.new("kvs_page_info *")
        check(lib.kvs_page_get_info(self.handle, tier, page, info), "kvs_page_get_info")
        return _struct_dict(info)

    # -- prefix index ---------------------------------------------------------------------
    def prefix_register(self, tokens, pages, extra: ExtraKeys | None = None) -> int:
        t, nt, _k1 = i32_buffer(tokens)
        p, np_, _k2 = u32_buffer(pages)
        out = ffi.new("size_t *")
        check(lib.kvs_prefix_register(self.handle, t, nt, p, np_, _extra(extra), out),
              "kvs_prefix_register")
        return out[0]

    def prefix_match(self, tokens, extra: ExtraKeys | None = None, max_tokens: int = SIZE_MAX,
                     acquire: bool = False) -> tuple[array, int]:
        t, nt, _k = i32_buffer(tokens)
        cap = nt // self.page_size
        pages = array("I", bytes(4 * cap))
        npg, nm = ffi.new("size_t *"), ffi.new("size_t *")
        check(lib.kvs_prefix_match(self.handle, t, nt, _extra(extra), max_tokens, acquire,
                                   ffi.from_buffer("uint32_t[]", pages) if cap else ffi.NULL,
                                   cap, npg, nm), "kvs_prefix_match")
        del pages[npg[0]:]
        return pages, nm[0]

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
                  max_match_tokens: int = SIZE_MAX) -> dict[str, int]:
        t, nt, _k = i32_buffer(tokens)
        info = ffi.new("kvs_seq_info *")
        check(lib.kvs_seq_begin(self.handle, seq_id, t, nt, _extra(extra), max_match_tokens, info),
              "kvs_seq_begin")
        return _struct_dict(info)

    def seq_append(self, seq_id: int, tokens, lookahead_slots: int = 0) -> list[tuple]:
        t, nt, _k = i32_buffer(tokens)
        n = ffi.new("size_t *")
        check(lib.kvs_seq_append(self.handle, seq_id, t, nt, lookahead_slots, self._copies,
                                 len(self._copies), n), "kvs_seq_append")
        return [(c.src_page, c.dst_page, c.num_tokens, c.kind) for c in self._copies[0:n[0]]]

    def seq_append_batch(self, seq_ids, tokens) -> list[tuple]:
        ids = array("Q", seq_ids)
        t, nt, _k = i32_buffer(tokens)
        copies = ffi.new("kvs_copy[]", max(len(ids), 1))
        n = ffi.new("size_t *")
        check(lib.kvs_seq_append_batch(self.handle, ffi.from_buffer("uint64_t[]", ids) if ids else ffi.NULL,
                                       len(ids), t, nt, copies, len(copies), n),
              "kvs_seq_append_batch")
        return [(c.src_page, c.dst_page, c.num_tokens, c.kind) for c in copies[0:n[0]]]

    def seq_fork(self, parent_id: int, child_id: int) -> None:
        check(lib.kvs_seq_fork(self.handle, parent_id, child_id), "kvs_seq_fork")

    def seq_free(self, seq_id: int) -> None:
        check(lib.kvs_seq_free(self.handle, seq_id), "kvs_seq_free")

    def _swap(self, fn, name: str, seq_id: int) -> list[tuple]:
        cap = self.seq_info(seq_id)["num_pages"]
        copies = ffi.new("kvs_copy[]", max(cap, 1))
        n = ffi.new("size_t *")
        check(fn(self.handle, seq_id, copies, len(copies), n), name)
        return [(c.src_page, c.dst_page, c.num_tokens, c.kind) for c in copies[0:n[0]]]

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

    def seq_pages(self, seq_id: int) -> array:
        cap = self.seq_info(seq_id)["num_pages"]
        out = array("I", bytes(4 * cap))
        n = ffi.new("size_t *")
        check(lib.kvs_seq_pages(self.handle, seq_id, ffi.from_buffer("uint32_t[]", out) if cap else ffi.NULL,
                                cap, n), "kvs_seq_pages")
        del out[n[0]:]
        return out


from .hybrid import Hybrid  # noqa: E402  (needs the names above)

__all__ += ["Hybrid", "ExtraKeys", "SIZE_MAX"]
