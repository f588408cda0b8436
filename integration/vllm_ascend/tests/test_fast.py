"""The native page hand-over (``kvshare_vllm/_fast.c``, ``Appender``) against kvshare itself:
after random appends, admissions and lookups the request state it keeps (pages, tokens, packed
table, ``quiet``) is the sequence kvshare holds, read through the binding; lookups and
admissions give what the binding's own calls give on a cache with the same history; bad input
raises before anything changes."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
import torch

import kvshare
from kvshare import ffi, lib
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

from kvshare_vllm import manager as mgr_mod
from kvshare_vllm.manager import KvshareKVCacheManager, _Req, _extra_addr

import asan_drive

BS = 16
NO_SPACE = kvshare.STATUS["KVS_STATUS_NO_SPACE"]


def make_manager(num_blocks: int = 64) -> KvshareKVCacheManager:
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    return KvshareKVCacheManager(cfg, max_model_len=4096, scheduler_block_size=BS,
                                 hash_block_size=BS)


def begin(m: KvshareKVCacheManager, seq: int, prompt: list[int]) -> _Req:
    """A sequence holding ``prompt`` (hits shared), as ``_begin`` leaves it."""
    info = ffi.new("kvs_seq_info *")
    toks = kvshare.pack_i32(prompt)
    kvshare.check(lib.kvs_seq_begin(m._h, seq, ffi.from_buffer("int32_t[]", toks), len(prompt),
                                    ffi.NULL, max(len(prompt) - 1, 0), 0, info), "kvs_seq_begin")
    st = _Req(seq, None)
    st.n = len(prompt)
    rc, _ = m._append(st, (), st.n, 0)  # reads the block table
    assert rc == 0
    return st


def state(st: _Req):
    return (st.n, list(st.pages), st.raw, st.quiet)


def kvshare_state(m: KvshareKVCacheManager, st: _Req):
    """What ``state(st)`` must be: the sequence as kvshare holds it."""
    pages = list(m.cache.seq_pages(st.seq))
    n = m.cache.seq_info(st.seq)["num_tokens"]
    fill = (n // BS + 1) * BS
    return (n, pages, struct.pack(f"{len(pages)}I", *pages), min(len(pages) * BS, fill - 1))


@pytest.mark.parametrize("seed", range(4))
def test_append_and_cross_keep_kvshare_state(seed):
    """``_append`` / ``_cross`` on random requests: the request state is kvshare's sequence, the
    pages returned are the ones added, a refusal is NO_SPACE with nothing changed."""
    rng = random.Random(seed)
    m = make_manager()
    system = [rng.randrange(3, 30000) for _ in range(rng.randint(0, 40))]
    live: dict[int, tuple[_Req, list[int]]] = {}
    seq = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.15 or not live:
            seq += 1
            prompt = system + [rng.randrange(3, 30000) for _ in range(rng.randint(1, 40))]
            try:
                a = begin(m, seq, prompt)
            except kvshare.NoSpaceError:
                continue
            assert state(a) == kvshare_state(m, a)
            live[seq] = (a, list(prompt))
        elif op < 0.25:
            s = rng.choice(list(live))
            a, _ = live.pop(s)
            kvshare.check(lib.kvs_seq_free(m._h, a.seq), "kvs_seq_free")
        elif op < 0.6:
            s = rng.choice(list(live))
            a, ids = live[s]
            ids.extend(rng.randrange(3, 30000) for _ in range(rng.choice((1, 1, 1, 3, 17, 90))))
            known = rng.randint(a.n, len(ids))  # a chunk, or a whole run of tokens
            lookahead = rng.choice((0, 0, 0, 1, 5, 40))
            before = state(a)
            rc, new = m._append(a, ids, known, lookahead)
            assert state(a) == kvshare_state(m, a)
            if rc:
                assert rc == NO_SPACE and state(a) == before and not new
            else:
                assert a.n == known and list(new) == a.pages[len(before[1]):]
                assert len(a.pages) * BS >= known + lookahead
        else:  # a running request's step: main may run past the known ids (drafts)
            s = rng.choice(list(live))
            a, ids = live[s]
            ids.extend(rng.randrange(3, 30000) for _ in range(rng.choice((0, 1, 1, 16, 40))))
            main = rng.randint(a.n, len(ids) + rng.choice((0, 0, 3)))
            la = rng.choice((0, 0, 1, 4, 50))
            mml = rng.choice((4096, main + la, main, max(main - 5, a.n)))
            before = state(a)
            rc, blocks = m._cross(a, ids, main, la, mml)
            assert state(a) == kvshare_state(m, a)
            if rc:
                assert rc == NO_SPACE and blocks == [] and state(a) == before
            else:
                assert [b.block_id for b in blocks] == a.pages[len(before[1]):]
                assert all(b is m._blocks[b.block_id] for b in blocks)
                assert len(a.pages) * BS >= min(main + la, mml)
        m.cache.check()
    m.check()


def _binding_cache(m: KvshareKVCacheManager) -> kvshare.Cache:
    """A cache configured as ``m``'s, driven through the binding's own calls."""
    return kvshare.Cache(**{k: v for k, v in m.cache.config.items() if k != "num_groups"})


@pytest.mark.parametrize("seed", range(3))
def test_match_gives_the_bindings_hit(seed):
    """Appender.match against ``Cache.prefix_match`` on a cache with the same history: the same
    hit blocks and packed ids for prompts sharing prefixes (with and without extra keys)
    while the index fills and evicts."""
    rng = random.Random(seed)
    m = make_manager(num_blocks=40)
    ref = _binding_cache(m)
    system = [rng.randrange(3, 30000) for _ in range(rng.choice((0, 16, 50)))]
    salts = [None, kvshare.ExtraKeys(salt=b"tenant"), kvshare.ExtraKeys(lora_id=3)]
    seen: list[tuple[list[int], Any]] = []
    for seq in range(1, 150):
        if seen and rng.random() < 0.5:
            base, extra = rng.choice(seen)
            prompt = base[:rng.randint(0, len(base))] + [rng.randrange(3, 30000)
                                                         for _ in range(rng.randint(0, 20))]
        else:
            prompt = system + [rng.randrange(3, 30000) for _ in range(rng.randint(0, 60))]
            extra = rng.choice(salts)
        cap = rng.choice((max(len(prompt) - 1, 0), len(prompt), 0, 17))
        rc, packed, hits = m._match(prompt, _extra_addr(extra), cap)
        want, n = ref.prefix_match(prompt, extra, max_tokens=cap)
        assert rc == 0 and packed == kvshare.pack_i32(prompt)
        assert [b.block_id for b in hits] == list(want) and n == len(want) * BS
        assert all(b is m._blocks[b.block_id] for b in hits)
        toks = kvshare.pack_i32(prompt)  # register the prompt, then free it (cached, evictable)
        rc = lib.kvs_seq_begin(m._h, seq, ffi.from_buffer("int32_t[]", toks) if prompt
                               else ffi.NULL, len(prompt), extra.ptr if extra else ffi.NULL,
                               0, 0, ffi.NULL)
        if rc == 0:
            kvshare.check(lib.kvs_seq_free(m._h, seq), "kvs_seq_free")
        try:
            ref.seq_begin(seq, prompt, extra, max_match_tokens=0)
        except kvshare.NoSpaceError:
            assert rc == NO_SPACE
        else:
            assert rc == 0
            ref.seq_free(seq)
        assert m.cache.stats() == ref.stats()
    m.check()


@pytest.mark.parametrize("seed", range(3))
def test_begin_gives_the_bindings_sequence(seed):
    """Appender.begin against ``Cache.seq_begin`` + ``seq_append`` (the lookahead) on a cache
    with the same history: the same statuses, matched tokens, table and counters for admissions
    with prefix hits, lookahead, extra keys and running out of room; the blocks returned are
    the table from page ``first`` on."""
    rng = random.Random(seed)
    m = make_manager(num_blocks=48)
    ref = _binding_cache(m)
    system = [rng.randrange(3, 30000) for _ in range(rng.choice((0, 16, 40)))]
    salt = kvshare.ExtraKeys(salt=b"t")
    live: list[_Req] = []
    prompts: list[list[int]] = []
    for seq in range(1, 200):
        if live and rng.random() < 0.35:
            a = live.pop(rng.randrange(len(live)))
            kvshare.check(lib.kvs_seq_free(m._h, a.seq), "kvs_seq_free")
            ref.seq_free(a.seq)
            continue
        base = rng.choice(prompts) if prompts and rng.random() < 0.5 else system
        prompt = base[:rng.randint(0, len(base))] + [rng.randrange(3, 30000)
                                                     for _ in range(rng.randint(1, 70))]
        prompts.append(prompt)
        extra = salt if rng.random() < 0.2 else None
        ea = _extra_addr(extra)
        rc, toks, hits = m._match(prompt, ea, len(prompt) - 1)
        assert rc == 0
        max_match = rng.choice((len(hits) * BS, len(hits) * BS, 0, len(prompt)))
        lookahead, first = rng.choice((0, 0, 1, 30)), rng.choice((len(hits), 0))
        if rng.random() < 0.3:
            toks = memoryview(toks)  # as _tokens hands a view of the pending bytes
        a = _Req(seq, extra)
        brc, arc, matched, blocks = m._open(a, toks, ea, max_match, lookahead, first)
        try:
            info = ref.seq_begin(seq, prompt, extra, max_match_tokens=max_match)
        except kvshare.NoSpaceError:
            assert brc == NO_SPACE
            assert state(a) == (0, [], b"", -1) and blocks == []
        else:
            assert brc == 0 and matched == info["matched_tokens"]
            try:
                ref.seq_append(seq, [], lookahead)
            except kvshare.NoSpaceError:
                # The sequence began; the table is not read (the manager refuses this as a
                # bug: its gate checked room for the lookahead).
                assert arc == NO_SPACE and a.n == len(prompt) and a.pages == [] and blocks == []
            else:
                assert arc == 0
                assert blocks == [m._blocks[p] for p in a.pages[first:]]
                assert a.pages == list(ref.seq_pages(seq))
                assert state(a) == kvshare_state(m, a)
            live.append(a)
        assert m.cache.stats() == ref.stats()
    m.check()


def test_fast_begin_bad_input():
    m = make_manager(num_blocks=8)
    before = m.cache.stats()
    toks = kvshare.pack_i32(list(range(3, 23)))
    for args, exc in (((_Req(1, None), toks, 0, 0, 0), TypeError),
                      ((_Req(1, None), [1, 2], 0, 0, 0, 0), TypeError),
                      ((_Req(1, None), toks[:-1], 0, 0, 0, 0), ValueError),
                      ((_Req(1, None), toks, -1, 0, 0, 0), OverflowError),
                      ((_Req(1, None), toks, 0, -1, 0, 0), ValueError),
                      ((_Req(1, None), toks, 0, 0, -1, 0), ValueError),
                      ((_Req(1, None), toks, 0, 0, 0, -1), ValueError)):
        with pytest.raises(exc):
            m._open(*args)
    used = _Req(1, None)
    used.n = 3
    with pytest.raises(ValueError):
        m._open(used, toks, 0, 0, 0, 0)
    with pytest.raises(RuntimeError, match="begin"):  # an Appender built without begin_addr
        bare = mgr_mod._fast.Appender(int(ffi.cast("uintptr_t", m._h)), int(ffi.cast(
            "uintptr_t", ffi.addressof(lib, "kvs_seq_append_pages"))), BS, 8, m._blocks)
        bare.begin(_Req(1, None), toks, 0, 0, 0, 0)
    assert m.cache.stats() == before
    big = kvshare.pack_i32(list(range(3, 3 + 16 * 9)))  # 9 pages, 7 usable: NO_SPACE
    st = _Req(1, None)
    assert m._open(st, big, 0, 0, 0, 0) == (kvshare.STATUS["KVS_STATUS_NO_SPACE"], 0, 0, [])
    assert state(st) == (0, [], b"", -1) and m.cache.stats() == before
    rc, append_rc, matched, blocks = m._open(st, toks, 0, 0, 100, 0)  # begins; no room for 100 slots
    assert (rc, append_rc, matched, blocks) == (0, kvshare.STATUS["KVS_STATUS_NO_SPACE"], 0, [])
    assert st.n == 20 and st.pages == []
    again = _Req(1, None)  # the same sequence id twice: kvshare's status, nothing changed
    assert m._open(again, toks, 0, 0, 0, 0)[0] == kvshare.STATUS["KVS_STATUS_SEQ_EXISTS"]
    assert state(again) == (0, [], b"", -1)
    m.check()


def test_fast_match_bad_input():
    m = make_manager(num_blocks=8)
    before = m.cache.stats()
    for args, exc in (((list(range(5)), 0), TypeError), ((iter([1]), 0, 0), TypeError),
                      (([1, 2], -1, 0), OverflowError), (([1, 2], 0, -1), ValueError),
                      (([1, 2 ** 31], 0, 1), OverflowError), ((["x"], 0, 1), TypeError)):
        with pytest.raises(exc):
            m._match(*args)
    ids = [1, 2, 3]

    class Reenter:
        def __index__(self):
            m._match(ids[:2], 0, 1)
            return 4

    with pytest.raises(RuntimeError, match="re-entered"):
        m._match([1, Reenter()], 0, 1)
    with pytest.raises(RuntimeError, match="not initialised"):
        mgr_mod._fast.Appender.__new__(mgr_mod._fast.Appender).match(ids, 0, 2)
    with pytest.raises(RuntimeError, match="match_addr"):  # built without kvs_prefix_match
        mgr_mod._fast.Appender(int(ffi.cast("uintptr_t", m._h)), int(ffi.cast(
            "uintptr_t", ffi.addressof(lib, "kvs_seq_append_pages"))), BS, 8, m._blocks).match(
                ids, 0, 2)
    with pytest.raises(ValueError):
        mgr_mod._fast.Appender(0, 1, BS, 8, [])
    assert m.cache.stats() == before
    assert m._match([], 0, 0) == (0, b"", [])


def test_fast_bad_input_changes_nothing():
    m = make_manager(num_blocks=8)
    st = begin(m, 1, list(range(3, 23)))  # 20 tokens: 2 pages
    ids = list(range(3, 23)) + [40, 41]
    before_state, before_stats = state(st), m.cache.stats()

    def unchanged():
        assert state(st) == before_state
        assert m.cache.stats() == before_stats

    with pytest.raises(TypeError):
        m._append(st, ids, 22)
    with pytest.raises(TypeError):
        m._append(st, iter(ids), 22, 0)
    with pytest.raises(ValueError):
        m._append(st, ids, 30, 0)  # fewer ids than known
    with pytest.raises(ValueError):
        m._append(st, ids, 22, -1)
    with pytest.raises(OverflowError):
        m._append(st, ids[:20] + [2 ** 31, 5], 22, 0)
    with pytest.raises(TypeError):
        m._append(st, ids[:20] + ["x", 5], 22, 0)

    class Reenter:  # __index__ calling back into the same Appender: refused, nothing changed
        def __index__(self):
            m._append(st, ids, 22, 0)
            return 7

    with pytest.raises(RuntimeError, match="re-entered"):
        m._append(st, ids[:21] + [Reenter()], 22, 0)
    with pytest.raises(RuntimeError, match="not initialised"):
        mgr_mod._fast.Appender.__new__(mgr_mod._fast.Appender).append(st, ids, 22, 0)
    unchanged()
    # More slots than the cache has: kvshare's NO_SPACE, nothing changed.
    rc, new = m._append(st, ids, 22, 100)
    assert rc == kvshare.STATUS["KVS_STATUS_NO_SPACE"] and new == ()
    unchanged()
    # A sequence kvshare does not know: its status, nothing changed.
    ghost = _Req(99, None)
    rc, new = m._append(ghost, ids, 22, 0)
    assert rc == kvshare.STATUS["KVS_STATUS_SEQ_NOT_FOUND"] and new == ()
    assert state(ghost) == (0, [], b"", -1)
    unchanged()
    # cross: bad arguments raise before anything changes.
    with pytest.raises(TypeError):
        m._cross(st, ids, 22, 0)
    with pytest.raises(TypeError):
        m._cross(st, iter(ids), 22, 0, 4096)
    for args in ((-1, 0, 4096), (22, -1, 4096), (22, 0, -1)):
        with pytest.raises(ValueError):
            m._cross(st, ids, *args)
    with pytest.raises(OverflowError):
        m._cross(st, ids[:20] + [2 ** 31, 5], 22, 0, 4096)
    with pytest.raises(OverflowError):
        m._cross(st, ids, 2 ** 70, 0, 4096)
    with pytest.raises(RuntimeError, match="blocks"):  # an Appender built without the blocks
        bare = mgr_mod._fast.Appender(int(ffi.cast("uintptr_t", m._h)), int(ffi.cast(
            "uintptr_t", ffi.addressof(lib, "kvs_seq_append_pages"))), BS, 8)
        bare.cross(st, ids, 22, 0, 4096)
    with pytest.raises(TypeError):
        mgr_mod._fast.Appender(1, 1, BS, 8, (1, 2))
    with pytest.raises(ValueError):  # above kvshare's largest page size
        mgr_mod._fast.Appender(1, 1, kvshare.MAX_PAGE_SIZE + 1, 8)
    unchanged()
    rc, blocks = m._cross(st, ids, 22, 100, 4096)  # kvshare's NO_SPACE, nothing changed
    assert rc == kvshare.STATUS["KVS_STATUS_NO_SPACE"] and blocks == []
    unchanged()
    rc, blocks = m._cross(st, ids, 22, 100, 40)  # capped at 40 slots: one page more
    assert rc == 0 and [b.block_id for b in blocks] == st.pages[-1:] and st.n == 22
    m.check()


def test_fast_append_after_bad_input():
    m = make_manager(num_blocks=8)
    st = begin(m, 1, list(range(3, 23)))
    ids = list(range(3, 23)) + [40, 41]
    with pytest.raises(ValueError):
        m._append(st, ids, 30, 0)
    # A good append goes through after a refused one.
    rc, new = m._append(st, ids, 22, 12)
    assert rc == 0 and len(new) == 1 and st.pages[-1] == new[0]
    assert (st.n, st.quiet) == (22, 31)
    m.check()


def test_fast_pack_i32_matches_binding():
    fast = mgr_mod._fast.pack_i32
    rng = random.Random(7)
    for n in (0, 1, 17, 1000):
        ids = [rng.randrange(-2 ** 31, 2 ** 31) for _ in range(n)]
        assert fast(ids) == kvshare.pack_i32(ids) == fast(tuple(ids))
    assert fast([2 ** 31 - 1, -2 ** 31, True]) == kvshare.pack_i32([2 ** 31 - 1, -2 ** 31, 1])
    # Token-sized ids take the in-place read of one-digit ints: both signs, digit edges, zero.
    edges = [0, 1, -1, 2 ** 15 - 1, 2 ** 15, 2 ** 30 - 1, 2 ** 30, -(2 ** 30) + 1, -(2 ** 30)]
    ids = edges + [rng.randrange(-2 ** 30, 2 ** 30) for _ in range(300)]
    assert fast(ids) == kvshare.pack_i32(ids)

    class Sub(int):  # an int subclass is not read in place
        pass

    assert fast([Sub(7), Sub(-7), 8]) == kvshare.pack_i32([7, -7, 8])

    class Idx:  # an int-like (numpy scalars are such)
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    assert fast([Idx(5), 6]) == kvshare.pack_i32([5, 6])
    for bad, exc in (([2 ** 31], OverflowError), ([-2 ** 31 - 1], OverflowError),
                     ([2 ** 70], OverflowError), (["1"], TypeError), ([1.0], TypeError),
                     (iter([1]), TypeError)):
        with pytest.raises(exc):
            fast(bad)
        with pytest.raises(exc):
            kvshare.pack_i32(bad)

    ids = [1, 2, 3]

    class Shrink:  # __index__ empties the list being packed: an error, not a stale read
        def __index__(self):
            ids.clear()
            return 0

    ids[0] = Shrink()
    with pytest.raises(RuntimeError):
        fast(ids)
    long_ids = list(range(200))  # emptied while items past it are being read ahead

    class ShrinkLong:
        def __index__(self):
            long_ids.clear()
            return 0

    long_ids[100] = ShrinkLong()
    with pytest.raises(RuntimeError):
        fast(long_ids)


def test_fast_under_asan(tmp_path):
    """_fast.c built with -fsanitize=address,undefined and driven by tests/fast_asan/drive.py in
    a process of its own (the sanitizer runtime preloaded; no torch, no vLLM)."""
    asan_drive.build_and_drive(tmp_path, "_fast", "drive.py")


def test_bad_input_raises_before_anything_changes():
    """The argument checks every native call makes: the exception is raised before kvshare or
    the request state changes."""
    m = make_manager(num_blocks=8)
    st = begin(m, 1, list(range(3, 23)))
    ids = list(range(3, 23)) + [40, 41]
    toks = kvshare.pack_i32(ids[:20])
    before_state, before_stats = state(st), m.cache.stats()
    cases = [
        (m._append, (st, ids, 22, -1), ValueError),
        (m._append, (st, range(3, 25), 22, 0), TypeError),
        (m._append, (st, ids, 30, 0), ValueError),
        (m._cross, (st, ids, -1, 40, 4096), ValueError),
        (m._cross, (st, ids, 22, -1, 4096), ValueError),
        (m._cross, (st, ids, 22, 0, -1), ValueError),
        (m._cross, (st, range(3, 25), 22, 0, 4096), TypeError),
        (m._cross, (st, "abc", 22, 0, 4096), TypeError),
        (m._match, (ids, 0, -1), ValueError),
        (m._match, (ids, -1, 5), OverflowError),
        (m._match, (range(5), 0, 5), TypeError),
    ]
    for args, exc in (((0, -1, 0, 0), ValueError), ((0, 0, -1, 0), ValueError),
                      ((0, 0, 0, -1), ValueError), ((-1, 0, 0, 0), OverflowError)):
        cases.append((m._open, (_Req(2, None), toks) + args, exc))
    cases += [
        (m._open, (_Req(2, None), toks[:-1], 0, 0, 0, 0), ValueError),
        (m._open, (st, toks, 0, 0, 0, 0), ValueError),  # st already holds tokens
        (m._open, (_Req(2, None), [1, 2], 0, 0, 0, 0), TypeError),
    ]
    for fn, args, exc in cases:
        with pytest.raises(exc):
            fn(*args)
        assert state(st) == before_state, (fn, args)
        assert m.cache.stats() == before_stats, (fn, args)
    # A buffer of 4-byte items counts its bytes, as the compiled call does.
    fresh = _Req(2, None)
    rc, append_rc, matched, blocks = m._open(fresh, memoryview(toks).cast("i"), 0, 0, 0, 0)
    assert (rc, append_rc, fresh.n, len(fresh.pages)) == (0, 0, 20, 2)
    m.check()


def test_begin_failing_after_kvshare_began_leaks_nothing(tiny_model_dir):
    """An exception out of _open after kvs_seq_begin succeeded (a MemoryError can do that) ends
    the sequence kvshare began, so nothing outlives the failed admission."""
    import harness as h

    s = h.make_scheduler(tiny_model_dir, kvshare=True, num_blocks=64)
    m = s.kv_cache_manager
    real = m._open

    def fails_after_begin(*a):
        real(*a)
        raise MemoryError("planted")

    m._open = fails_after_begin
    r = h.make_request("r0", list(range(3, 60)), hash_blocks=False)
    blocks, hit = m.get_computed_blocks(r)
    with pytest.raises(MemoryError):
        m.allocate_slots(r, r.num_tokens - hit, hit, blocks)
    assert m.cache.stats()["num_seqs"] == 0 and "r0" not in m._reqs
    m.check()
    m._open = real  # and the next admission goes through
    assert m.allocate_slots(r, r.num_tokens - hit, hit, blocks) is not None
    assert m.cache.stats()["num_seqs"] == 1
    m.check()
