"""The manager's mirror of vLLM's block tables (``GroupTables``, mixed into
``manager.KvshareKVCacheManager``): per request and group the page ids kvshare holds (0 at
the null page), a refcount per page (how many live tables hold it) and the kept free count,
and vLLM's arithmetic on them: skipped positions, admission counts, the release out of a
window, the shared prefix, the quiet bound of a decode step.  kvshare holds the pages; the
mirror answers vLLM's questions without a native call, and ``check`` compares the two."""

from __future__ import annotations

from array import array
from collections import Counter

import kvshare
from kvshare import lib

from .startup import require as _require_supported_vllm_and_native

_require_supported_vllm_and_native()  # before vLLM's imports: an unsupported vLLM is named

from vllm.v1.core.kv_cache_manager import KVCacheBlocks

from .base import _cdiv, _common_prefix
from .state_groups import align_blocks_to_allocate, align_release, skipped_tokens, vllm_table


class _HReq:
    """A request's kvshare sequence: id, tokens handed over (``n``), extra keys, a mirror of
    its block table per group (page ids, 0 for the null page), ``quiet``: the most tokens
    a running step can reach with no native call (``GroupTables._quiet``), -1 until computed
    again after a call that changed ``n`` or the tables, and ``room``: the most it can reach
    with no native call but the registration of pages that filled (computed with ``quiet``)."""

    __slots__ = ("seq", "n", "extra", "tables", "quiet", "room")  # n // bs: blocks cached

    def __init__(self, seq: int, extra, num_groups: int):
        self.seq = seq
        self.n = 0
        self.extra = extra
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.quiet = -1
        self.room = 0


class GroupTables:
    """The block-table mirror and vLLM's arithmetic on it; the state it reads (``_reqs``,
    ``_refs``, ``_windows``, ``cache``, ...) is the manager's (``manager.py``)."""

    def _skipped(self, g: int, c: int) -> int:
        kind, w = self._windows[g]
        if kind == "sliding_window":
            return max(0, c - w + 1)
        if kind == "chunked_local":
            return c // w * w
        if kind == "state":
            return skipped_tokens(w, c)
        return 0

    def _kept(self, g: int, z: int) -> int:
        """The most computed tokens at which windowed group ``g`` still reads position ``z``
        (its skipped tokens end inside or before it)."""
        kind, w = self._windows[g]
        bs = self.block_size
        if kind == "sliding_window":
            return z * bs + bs - 1 + w - 1
        return (z * bs + bs - 1) // w * w + w - 1  # chunked local

    def _quiet(self, st: _HReq) -> int:
        """The most tokens (computed plus new) ``st`` can reach in a running step that changes
        nothing (``_fast.Groups.running`` would return at once): the slots exist, no page
        fills with known tokens, and at the computed tokens (less than that bound) every
        position a window skips is already null, so ``_release`` has nothing to drop.  The
        skipped positions only grow with the computed tokens, which bounds them here.  Each
        part only grows over a request's life (tables gain nulls at the front and pages at the
        end, tokens are only added), so a bound kept across a change is never above the true
        one: invalidating it after a call is for speed, not for correctness.

        Also sets ``st.room``: the same bound without the page fill, and such that no window
        skips a page of tokens not yet handed over (from ``st.n``'s page on) while the
        computed tokens stay within it, so a page that fills there can register at a later
        call (``allocate_slots``' deferral): vLLM would have cached it before dropping it."""
        bs = self.block_size
        slots = min(map(len, st.tables)) * bs
        q = min(slots, (st.n // bs + 1) * bs - 1)
        room = slots
        first = st.n // bs  # the first page of tokens not handed over
        for g in self._windowed:
            room = min(room, self._kept(g, first))
            t = st.tables[g]
            z = t.count(0)  # null positions: leading ones, as windows drop from the front
            if any(t[:z]):  # a held page among them: the first held position
                z = next(i for i, p in enumerate(t) if p)
            if z == len(t):
                continue  # nothing held to drop (the table does not grow in a quiet step)
            c = self._kept(g, z)
            q = min(q, c + 1)  # computed tokens <= c when computed + new <= c + 1
            room = min(room, c + 1)
        st.room = room
        return q

    def _capacity(self) -> int:
        """vLLM's ``get_num_free_blocks``: unreferenced pages of the pool, cached ones
        included, the null page not.  Kept until the next call that changes the pool."""
        a = self._avail
        if a is None:
            rc = lib.kvs_cache_group_stats(self.cache.handle, 0, self._stats_out)
            if rc:
                kvshare.check(rc, "kvs_cache_group_stats")
            a = self._avail = self._stats_out.pool_pages_free
        return a

    def _evictable(self, blocks) -> int:
        """Hit blocks no live table holds (vLLM: ``ref_cnt == 0``, not null)."""
        refs = self._refs
        return sum(1 for b in blocks if b.block_id and not refs[b.block_id])

    def _blocks_to_allocate(self, st: _HReq | None, num_tokens: int, hits, total_computed: int,
                            cap: bool, seen: dict | None = None) -> int:
        """vLLM's ``coordinator.get_num_blocks_to_allocate`` (sum over the groups).  ``seen``
        keeps a request's evictable hit counts between the admission's two checks."""
        bs = self.block_size
        n = 0
        views = self.coordinator.single_type_managers
        for g in range(self.num_kv_cache_groups):
            if g in self._single:  # vLLM: one block of max_model_len tokens, at admission
                n += st is None
                continue
            if g in self._align:
                hit = hits[g] if hits and st is None else ()
                held = len(st.tables[g]) if st is not None else 0
                n += align_blocks_to_allocate(held, hit, num_tokens, bs, self._evictable)
                continue
            need = _cdiv(num_tokens, bs)
            gcap = views[g]._max_admission_blocks_per_request if cap else None
            if gcap is not None:
                need = min(need, gcap)
            held = len(st.tables[g]) if st is not None else 0
            if st is not None:  # a running request: no new hits
                n += max(need - held, 0)
                continue
            hit = hits[g] if hits else ()
            skipped = self._skipped(g, total_computed) // bs
            n += max(need - max(skipped, len(hit)), 0)
            e = seen.get((g, skipped)) if seen is not None else None
            if e is None:
                e = self._evictable(hit[skipped:])
                if seen is not None:
                    seen[g, skipped] = e
            n += e
        return n

    def _refresh(self, st: _HReq) -> list[list[int]]:
        """Re-reads the request's tables from kvshare; returns each group's positions past the
        old length (the pages added).  Keeps the page refcount mirror and the kept free count
        (a page going from no holder to one leaves vLLM's free count, and back)."""
        added = []
        delta: Counter = Counter()
        for g in range(self.num_kv_cache_groups):
            old = st.tables[g]
            new = list(self.cache.seq_pages(st.seq, g))
            delta.update(p for p in new if p)
            delta.subtract(p for p in old if p)
            if g in self._single:  # the state page moves to the table's end: not a new block
                added.append([] if old else vllm_table(new))
            else:
                added.append(new[len(old):])
            st.tables[g] = new
        refs = self._refs
        for p, d in delta.items():
            if d:
                self._ref(refs, p, d)
        return added

    def _ref(self, refs: array, p: int, d: int) -> None:
        """Adds ``d`` holders to page ``p`` in the mirror, and the kept free count follows."""
        before = refs[p]
        after = refs[p] = before + d
        if self._avail is not None and (before == 0) != (after == 0):
            self._avail += 1 if after == 0 else -1

    def _handed(self, added: list[list[int]]) -> KVCacheBlocks:
        if not any(added):
            return self.empty_kv_cache_blocks
        if self._zero_new:
            for g, pages in enumerate(added):
                self._zero(g, pages)
        blocks = self._blocks
        return KVCacheBlocks(tuple([blocks[p] for p in pages] for pages in added))

    def _handed_blocks(self, added) -> KVCacheBlocks:
        """``_handed`` of the compiled calls' ``added`` (block objects per group, or None)."""
        if added is None or not any(added):
            return self.empty_kv_cache_blocks
        if self._zero_new:
            for g, objs in enumerate(added):
                self._zero(g, [b.block_id for b in objs])
        return KVCacheBlocks(tuple(added))

    def _release(self, st: _HReq, total_computed: int) -> None:
        """vLLM's ``remove_skipped_blocks``: positions out of every window become null.  The
        mirror follows the same rule as kvshare (from the last skipped position down to the
        first null one) without reading the tables back; ``check`` compares them."""
        if not self._windowed:
            return
        bs, refs = self.block_size, self._refs
        todo = False
        for g in self._windowed:
            t = st.tables[g]
            k = min(self._skipped(g, total_computed) // bs, len(t))
            if k and (t[k - 1] or (g in self._align and any(t[:k]))):
                todo = True
                break
        if not todo:
            return  # nothing to release: no native call
        released = self.cache.seq_release_skipped(st.seq, total_computed)
        n = 0
        for g in self._windowed:
            t = st.tables[g]
            i = min(self._skipped(g, total_computed) // bs, len(t)) - 1
            if g in self._align:
                n += align_release(t, i + 1, lambda p: self._ref(refs, p, -1))
                continue
            while i >= 0 and t[i]:
                self._ref(refs, t[i], -1)
                t[i] = 0
                n += 1
                i -= 1
        if n != released:
            raise AssertionError(f"kvshare_vllm: kvshare released {released} pages, the "
                                 f"mirror {n}")

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Full-attention groups: leading pages every request with pages holds (vLLM's
        ``ref_cnt == len(req_to_blocks)``); windowed groups: 0, as vLLM.

        A page every table holds sits at the same position in each (its tokens'), so the
        count is the common prefix of all the group's tables: that of the lexicographically
        smallest and largest.  Kept between calls (``_common``): a new table can only shorten
        it (``_common_with``), a free lengthen it (dropped, recomputed here); a growing table's
        new pages are its own, past the shared prefix, while another request lives."""
        st = self._reqs.get(running_request_id)
        out = [0] * self.num_kv_cache_groups
        if st is None or not self.enable_caching:  # vLLM's no-prefix-cache coordinator: 0s
            return out
        if len(self._reqs) == 1:
            return [len(t) if full else 0 for t, full in zip(st.tables, self._full)]
        common = self._common
        if common is None:
            common = self._common = {}
            for g, full in enumerate(self._full):
                if full:
                    tables = [o.tables[g] for o in self._reqs.values()]
                    lo, hi = min(tables), max(tables)
                    common[g] = lo[:_common_prefix(lo, hi)]
        for g, prefix in common.items():
            out[g] = len(prefix)
        return out

    def _common_with(self, st: _HReq) -> None:
        """A request began: the kept shared prefix shortens to what its tables share."""
        common = self._common
        if common is not None:
            for g, prefix in common.items():
                del prefix[_common_prefix(prefix, st.tables[g]):]

    def _vllm_tables(self, st: _HReq) -> list[list[int]]:
        """The request's tables as vLLM holds them ("none" state groups: one block)."""
        if not self._single:
            return st.tables
        return [vllm_table(t) if g in self._single else t for g, t in enumerate(st.tables)]

    def check(self) -> None:
        """kvshare's invariant check, plus the mirrored tables and refcounts against it."""
        self.cache.check()
        refs: Counter = Counter()
        for st in [*self._reqs.values(), *self._popped]:  # popped: held until freed
            for g, t in enumerate(st.tables):
                got = list(self.cache.seq_pages(st.seq, g))
                if got != t:
                    raise AssertionError(f"kvshare_vllm: sequence {st.seq} group {g}: table "
                                         f"{got} but mirrored {t}")
                refs.update(p for p in t if p)
        if any(self._refs[p] != refs[p] for p in range(self.num_blocks)):
            raise AssertionError("kvshare_vllm: page refcount mirror differs from the tables")
        kept, self._avail = self._avail, None
        if kept is not None and kept != self._capacity():
            raise AssertionError(f"kvshare_vllm: kept free count {kept} but kvshare counts "
                                 f"{self._avail}")
