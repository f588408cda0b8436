"""``Hybrid``: the Python face of ``kvs_hybrid`` (a cache of KV-cache groups for hybrid models).

Groups are given as ``(kind, window, page_bytes)`` tuples or ``{"kind", "window", "page_bytes"}``
dicts, ``kind`` one of ``"full"``, ``"sliding_window"``, ``"chunked_local"``, ``"state"`` (or the
``KVS_GROUP_KIND_*`` value); the list order is the engine's ``group_idx``.  A ``"state"`` group
(Mamba / linear attention) takes its ``mamba_cache_mode`` in place of the window: ``"none"``,
``"all"`` (or the ``KVS_STATE_MODE_*`` value), e.g. ``("state", "all", page_bytes)`` or
``{"kind": "state", "mode": "all", "page_bytes": page_bytes}``.  Every method is one
``kvs_hybrid_`` call; errors raise the package's :class:`KvsError` subclasses.
"""

from __future__ import annotations

from array import array
from typing import Any

from . import SIZE_MAX, ExtraKeys, _extra, _struct_dict, check, ffi, i32_buffer, lib

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


def _group(g: Any) -> tuple[int, int, int]:
    if isinstance(g, dict):
        kind, page_bytes = g["kind"], g["page_bytes"]
        window = g["mode"] if "mode" in g else g.get("window", 0)
    else:
        kind, window, page_bytes = g
    k = KINDS[kind] if isinstance(kind, str) else int(kind)
    if isinstance(window, str):
        window = STATE_MODES[window]
    return k, int(window), int(page_bytes)


class Hybrid:
    """Owns a ``kvs_hybrid*`` (``handle``); freed by :meth:`close` or garbage collection."""

    def __init__(self, page_size: int, num_pages: int, groups, enable_prefix_caching: bool = True,
                 enable_events: bool = False):
        specs = [_group(g) for g in groups]
        arr = ffi.new("kvs_group[]", max(len(specs), 1))
        for i, (k, w, b) in enumerate(specs):
            arr[i].kind, arr[i].window, arr[i].page_bytes = k, w, b
        cfg = ffi.new("kvs_hybrid_config *")
        cfg.page_size, cfg.num_pages = page_size, num_pages
        cfg.enable_prefix_caching, cfg.enable_events = enable_prefix_caching, enable_events
        cfg.groups, cfg.num_groups = arr, len(specs)
        out = ffi.new("kvs_hybrid **")
        check(lib.kvs_hybrid_new(cfg, out), "kvs_hybrid_new")
        self.handle = ffi.gc(out[0], lib.kvs_hybrid_free)
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_groups = len(specs)
        self._events = ffi.new("kvs_group_event[]", 1024)

    def close(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            ffi.gc(h, None)
            lib.kvs_hybrid_free(h)

    def check(self) -> None:
        check(lib.kvs_hybrid_check(self.handle), "kvs_hybrid_check")

    def group_info(self, group: int) -> dict[str, Any]:
        info = ffi.new("kvs_group_info *")
        check(lib.kvs_hybrid_group_info(self.handle, group, info), "kvs_hybrid_group_info")
        d = _struct_dict(info)
        d["kind"] = KIND_NAMES[d["kind"]]
        if d["kind"] == "state":
            d["mode"] = STATE_MODE_NAMES[d["window"]]
        return d

    def new_step(self) -> None:
        """Starts a scheduler step (vLLM's ``new_step_starts``): state checkpoints registered
        before now may be hit; until then a begin hitting one fails with ``NoSpaceError``."""
        check(lib.kvs_hybrid_new_step(self.handle), "kvs_hybrid_new_step")

    def seq_state_page(self, seq_id: int, group: int) -> int:
        """The page holding the sequence's running state in state group ``group``."""
        page = ffi.new("uint32_t *")
        check(lib.kvs_hybrid_seq_state_page(self.handle, seq_id, group, page),
              "kvs_hybrid_seq_state_page")
        return page[0]

    def match(self, tokens, max_tokens: int = SIZE_MAX,
              extra: ExtraKeys | None = None) -> tuple[int, list[array]]:
        """The hit ``N`` and each group's ``N // page_size`` pages (0: the null page)."""
        t, nt, _k = i32_buffer(tokens)
        cap = nt // self.page_size
        pages = array("I", bytes(4 * cap * self.num_groups))
        n = ffi.new("size_t *")
        check(lib.kvs_hybrid_match(self.handle, t, nt, _extra(extra), max_tokens,
                                   ffi.from_buffer("uint32_t[]", pages) if cap else ffi.NULL,
                                   len(pages), cap, n), "kvs_hybrid_match")
        k = n[0] // self.page_size
        return n[0], [pages[g * cap:g * cap + k] for g in range(self.num_groups)]

    def seq_begin(self, seq_id: int, tokens, max_match_tokens: int = SIZE_MAX,
                  lookahead_slots: int = 0, extra: ExtraKeys | None = None) -> dict[str, int]:
        t, nt, _k = i32_buffer(tokens)
        info = ffi.new("kvs_hybrid_begin_info *")
        check(lib.kvs_hybrid_seq_begin(self.handle, seq_id, t, nt, _extra(extra), max_match_tokens,
                                       lookahead_slots, info), "kvs_hybrid_seq_begin")
        return _struct_dict(info)

    def seq_release_skipped(self, seq_id: int, num_computed_tokens: int) -> int:
        n = ffi.new("size_t *")
        check(lib.kvs_hybrid_seq_release_skipped(self.handle, seq_id, num_computed_tokens, n),
              "kvs_hybrid_seq_release_skipped")
        return n[0]

    def seq_append(self, seq_id: int, tokens, lookahead_slots: int = 0) -> None:
        t, nt, _k = i32_buffer(tokens)
        check(lib.kvs_hybrid_seq_append(self.handle, seq_id, t, nt, lookahead_slots),
              "kvs_hybrid_seq_append")

    def seq_append_need(self, seq_id: int, num_tokens: int, lookahead_slots: int = 0) -> int:
        n = ffi.new("size_t *")
        check(lib.kvs_hybrid_seq_append_need(self.handle, seq_id, num_tokens, lookahead_slots, n),
              "kvs_hybrid_seq_append_need")
        return n[0]

    def seq_free(self, seq_id: int) -> None:
        check(lib.kvs_hybrid_seq_free(self.handle, seq_id), "kvs_hybrid_seq_free")

    def seq_info(self, seq_id: int) -> dict[str, int]:
        info = ffi.new("kvs_hybrid_seq_info *")
        check(lib.kvs_hybrid_seq_get_info(self.handle, seq_id, info), "kvs_hybrid_seq_get_info")
        return _struct_dict(info)

    def seq_pages(self, seq_id: int, group: int) -> array:
        cap = self.seq_info(seq_id)["num_pages"]
        out = array("I", bytes(4 * cap))
        n = ffi.new("size_t *")
        check(lib.kvs_hybrid_seq_pages(self.handle, seq_id, group,
                                       ffi.from_buffer("uint32_t[]", out) if cap else ffi.NULL,
                                       cap, n), "kvs_hybrid_seq_pages")
        del out[n[0]:]
        return out

    def block_tables(self, group: int, seq_ids, max_pages: int, pad_page: int = -1):
        ids = array("Q", seq_ids)
        table = array("i", bytes(4 * len(ids) * max_pages))
        lens = array("i", bytes(4 * len(ids)))
        check(lib.kvs_hybrid_block_tables(
            self.handle, group, ffi.from_buffer("uint64_t[]", ids) if ids else ffi.NULL, len(ids),
            max_pages, pad_page, ffi.from_buffer("int32_t[]", table) if table else ffi.NULL,
            len(table), ffi.from_buffer("int32_t[]", lens) if lens else ffi.NULL, len(lens)),
            "kvs_hybrid_block_tables")
        return table, lens

    def slot_mapping(self, group: int, seq_ids, query_lens, num_slots: int | None = None):
        ids, ql = array("Q", seq_ids), array("I", query_lens)
        total = sum(ql) if num_slots is None else num_slots
        slots = array("q", bytes(8 * total))
        check(lib.kvs_hybrid_slot_mapping(
            self.handle, group, ffi.from_buffer("uint64_t[]", ids) if ids else ffi.NULL,
            ffi.from_buffer("uint32_t[]", ql) if ql else ffi.NULL, len(ids),
            ffi.from_buffer("int64_t[]", slots) if total else ffi.NULL, total, ffi.NULL),
            "kvs_hybrid_slot_mapping")
        return slots

    def stats(self, group: int) -> dict[str, int]:
        s = ffi.new("kvs_group_stats *")
        check(lib.kvs_hybrid_stats(self.handle, group, s), "kvs_hybrid_stats")
        return _struct_dict(s)

    def take_events(self) -> list[dict[str, Any]]:
        out, n = [], ffi.new("size_t *")
        while True:
            check(lib.kvs_hybrid_take_events(self.handle, self._events, len(self._events), n),
                  "kvs_hybrid_take_events")
            for e in self._events[0:n[0]]:
                d = _struct_dict(e)
                d["group_kind"] = KIND_NAMES[d["group_kind"]]
                d["hash"] = d["hash_hi"] << 64 | d["hash_lo"]
                d["parent"] = d["parent_hi"] << 64 | d["parent_lo"]
                out.append(d)
            if n[0] < len(self._events):
                return out
