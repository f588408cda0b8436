"""The Python twins of the compiled calls in ``_fast.c`` (``_fast.Appender``), and the request
state (``_Req``) both sides read and write.

``KvshareKVCacheManager`` inherits these methods; when ``_fast`` is built (and
``KVSHARE_VLLM_PURE_PYTHON`` is unset) it replaces ``_append``, ``_cross``, ``_open`` and
``_match`` on the instance with the compiled calls.  Each twin checks its arguments as the
compiled call does, before anything changes, and returns the same tuple; ``tests/test_fast.py``
runs both on two caches and compares.  A twin needs these manager attributes: ``_h`` (the cache
handle), ``_pages_buf``/``_max_pages`` (the block-table out-buffer), ``_num_pages_out``,
``_matched_out``, ``_num_copies_out`` (``size_t *`` out-cells), ``_info`` (a ``kvs_seq_info *``),
``_tokbuf`` (``_SMALL`` int32 slots), ``_blocks`` (block objects by id), ``_pack`` and
``block_size``.
"""

from __future__ import annotations

import kvshare
from kvshare import ffi, lib


def _token_ids(request) -> list[int]:
    """The request's token ids as a plain list (vLLM's own list behind the read-only
    ``all_token_ids`` view; a copy when a Request type has no such list)."""
    toks = getattr(request, "_all_token_ids", None)
    return toks if type(toks) is list else list(request.all_token_ids)


_SMALL = 64  # appends up to this many tokens are copied into a preallocated buffer


def _extra_addr(extra) -> int:
    """A ``kvshare.ExtraKeys``' ``kvs_extra_keys *`` as an int (0 for None), the form the
    compiled calls and their twins take."""
    return int(ffi.cast("uintptr_t", extra.ptr)) if extra is not None else 0


class _Req:
    """A request's kvshare sequence: id, block table (page ids), tokens appended so far (``n``)
    and ``quiet``: the largest token count the request can reach with no native call - its
    pages hold the slots and no page fills up with known tokens (which would register it).
    Tokens of a partly filled last page are handed to kvshare when the page fills (or when
    more pages are needed): until then nothing observable depends on them."""

    __slots__ = ("seq", "pages", "raw", "n", "extra", "quiet")

    def __init__(self, seq: int, extra):
        self.seq = seq
        self.pages: list[int] = []
        self.raw = b""  # the page ids as uint32 bytes (get_num_common_prefix_blocks)
        self.n = 0
        self.extra = extra
        self.quiet = -1

    def add_pages(self, new: list[int], raw: bytes) -> None:
        """Appends page ids, given both as ints and as their uint32 bytes."""
        self.pages.extend(new)
        self.raw += raw

    def settle(self, bs: int) -> None:
        """Recomputes ``quiet`` after ``n`` or ``pages`` changed."""
        fill = (self.n // bs + 1) * bs  # the token count that fills the current page
        self.quiet = min(len(self.pages) * bs, fill - 1)


class PythonTwins:
    """``_match``, ``_open``, ``_cross``, ``_append``: one native call each (``_open``: two),
    in Python; see the module docstring."""

    def _match(self, ids, extra_addr: int, max_tokens: int) -> tuple[int, bytes, list]:
        """``kvs_prefix_match`` of the token ids ``ids`` (``extra_addr``: a ``kvs_extra_keys *``
        as an int, 0 for none) up to ``max_tokens``, acquiring nothing: ``(status, the ids
        packed to int32, [block objects of the hit pages])``.  The compiled twin is
        ``_fast.Appender.match``."""
        if not isinstance(ids, (list, tuple)):
            raise TypeError("match: token ids must be a list or tuple")
        if extra_addr < 0:
            raise OverflowError("match: negative extra_addr")
        if max_tokens < 0:
            raise ValueError("match: negative max_tokens")
        toks = self._pack(ids)
        n = len(ids)
        rc = lib.kvs_prefix_match(self._h, 0, ffi.from_buffer("int32_t[]", toks) if n else ffi.NULL,
                                  n, ffi.cast("kvs_extra_keys *", extra_addr), max_tokens, False,
                                  self._pages_buf, self._max_pages, self._num_pages_out,
                                  self._matched_out)
        if rc:
            return rc, toks, []
        blocks = self._blocks
        return 0, toks, list(map(blocks.__getitem__, ffi.unpack(self._pages_buf, self._num_pages_out[0])))

    def _open(self, st: _Req, toks, extra_addr: int, max_match: int, lookahead: int,
              first: int) -> tuple[int, int, int, list]:
        """``kvs_seq_begin`` of sequence ``st.seq`` with the packed token ids ``toks`` (any
        buffer; ``extra_addr``: a ``kvs_extra_keys *`` as an int, 0 for none), then one append
        keeping ``lookahead`` slots and reading the block table into ``st``.  Returns ``(begin
        status, append status, matched tokens, [block objects of the table from page first
        on])``; on a begin failure nothing changed.  The compiled twin is
        ``_fast.Appender.begin``."""
        if extra_addr < 0:
            raise OverflowError("begin: negative extra_addr")
        if max_match < 0 or lookahead < 0 or first < 0:
            raise ValueError("begin: negative count")
        if st.n != 0:
            raise ValueError("begin: st already holds tokens")
        nbytes = memoryview(toks).nbytes
        if nbytes % 4:
            raise ValueError("begin: toks is not whole int32 values")
        known = nbytes // 4
        rc = lib.kvs_seq_begin(self._h, st.seq,
                               ffi.from_buffer("int32_t[]", toks) if known else ffi.NULL, known,
                               ffi.cast("kvs_extra_keys *", extra_addr), max_match, 0, self._info)
        if rc:
            return rc, 0, 0, []
        st.n = known
        matched = self._info.matched_tokens
        rc, table = self._append(st, (), known, lookahead)
        if rc:
            return 0, rc, matched, []
        blocks = self._blocks
        return 0, 0, matched, list(map(blocks.__getitem__, table[first:]))

    def _cross(self, st: _Req, ids, main: int, lookahead_tokens: int,
               max_model_len: int) -> tuple[int, list]:
        """One ``kvs_seq_append_pages`` for a running request: ``main`` tokens computed after
        this step plus ``lookahead_tokens`` slots (capped at ``max_model_len``); the known
        tokens among them (``ids`` holds the rest as drafts/placeholders) are handed over.
        Returns ``(status, the block objects added)``; on a failure nothing changed.
        The compiled twin is ``_fast.Appender.cross``."""
        if not isinstance(ids, (list, tuple)):
            raise TypeError("cross: token ids must be a list or tuple")
        if main < 0 or lookahead_tokens < 0 or max_model_len < 0:
            raise ValueError("cross: negative token count")
        need_slot = min(main + lookahead_tokens, max_model_len)
        known = min(main, len(ids))  # drafts/placeholders are not tokens yet
        rc, new = self._append(st, ids, known, max(need_slot - max(known, st.n), 0))
        if rc:
            return rc, []
        blocks = self._blocks
        return 0, list(map(blocks.__getitem__, new))

    def _token_ptr(self, ids: list[int], start: int, end: int):
        """``int32_t *`` to token ids ``start:end`` (NULL when empty); small runs go through
        the preallocated buffer."""
        n = end - start
        if n <= 0:
            return ffi.NULL
        if n <= _SMALL:
            buf = self._tokbuf
            buf[0:n] = ids[start:end]
            return buf
        return ffi.from_buffer("int32_t[]", kvshare.pack_i32(ids[start:end]))

    def _append(self, st: _Req, ids, known: int, lookahead: int) -> tuple[int, list[int]]:
        """One ``kvs_seq_append_pages``: hands kvshare the tokens ``ids[st.n:known]`` (none
        when ``known <= st.n``) and keeps ``lookahead`` slots past them; the pages it adds go
        into ``st``.  Returns ``(status, new page ids)``; on a failure nothing changed."""
        if lookahead < 0:
            raise ValueError("append: negative lookahead")
        old = st.n
        add = known - old if known > old else 0
        if add and not isinstance(ids, (list, tuple)):
            raise TypeError("append: token ids must be a list or tuple")
        if add and len(ids) < known:
            raise ValueError("append: fewer token ids than known")
        rc = lib.kvs_seq_append_pages(self._h, st.seq, self._token_ptr(ids, old, old + add), add,
                                      lookahead, ffi.NULL, 0, self._num_copies_out, len(st.pages),
                                      self._pages_buf, self._max_pages, self._num_pages_out)
        if rc:
            return rc, ()
        st.n = old + add
        k = self._num_pages_out[0]
        new = ffi.unpack(self._pages_buf, k) if k else ()
        if k:
            st.add_pages(new, ffi.buffer(self._pages_buf, 4 * k)[:])
        st.settle(self.block_size)
        return 0, new
