"""The compiled page hand-over (``kvshare_vllm/_fast.c``) against the Python one in
``twins.py``: the same status, pages and request state for random appends, and bad input
raising before anything changes."""

from __future__ import annotations

import os
import random
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


def use_mode(monkeypatch, pure: bool) -> None:
    """Managers built after this use the Python twins (``pure``) or the compiled calls."""
    if pure:
        monkeypatch.setenv("KVSHARE_VLLM_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("KVSHARE_VLLM_PURE_PYTHON", raising=False)


@pytest.fixture(params=[False, True], ids=["compiled", "python"])
def pure(request, monkeypatch) -> bool:
    """Runs a test once with the compiled calls (skipped when not built), once with the twins."""
    if not request.param and mgr_mod._fast is None:
        pytest.skip("kvshare_vllm._fast not built")
    use_mode(monkeypatch, request.param)
    return request.param


def make_manager(monkeypatch, *, pure: bool, num_blocks: int = 64) -> KvshareKVCacheManager:
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    use_mode(monkeypatch, pure)
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


fast_only = pytest.mark.skipif(mgr_mod._fast is None, reason="kvshare_vllm._fast not built")


def test_fast_built_when_required(monkeypatch):
    """scripts/test-python builds the extension and sets KVSHARE_VLLM_REQUIRE_FAST: a broken
    build must fail here rather than pass every test on the Python fallback."""
    if not os.environ.get("KVSHARE_VLLM_REQUIRE_FAST"):
        pytest.skip("KVSHARE_VLLM_REQUIRE_FAST not set")
    assert mgr_mod._fast is not None, "kvshare_vllm._fast did not import"
    m = make_manager(monkeypatch, pure=False)
    assert type(m._append).__name__ == "builtin_function_or_method"
    assert type(m._cross).__name__ == "builtin_function_or_method"
    assert type(m._match).__name__ == "builtin_function_or_method"
    assert type(m._open).__name__ == "builtin_function_or_method"
    p = make_manager(monkeypatch, pure=True)
    assert p._append.__func__ is KvshareKVCacheManager._append
    assert p._cross.__func__ is KvshareKVCacheManager._cross
    assert p._match.__func__ is KvshareKVCacheManager._match
    assert p._open.__func__ is KvshareKVCacheManager._open


@fast_only
@pytest.mark.parametrize("seed", range(4))
def test_fast_matches_python(monkeypatch, seed):
    rng = random.Random(seed)
    fast = make_manager(monkeypatch, pure=False)
    slow = make_manager(monkeypatch, pure=True)
    system = [rng.randrange(3, 30000) for _ in range(rng.randint(0, 40))]
    live: dict[int, tuple[_Req, _Req, list[int]]] = {}
    seq = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.15 or not live:
            seq += 1
            prompt = system + [rng.randrange(3, 30000) for _ in range(rng.randint(1, 40))]
            try:
                a = begin(fast, seq, prompt)
            except kvshare.NoSpaceError:
                with pytest.raises(kvshare.NoSpaceError):
                    begin(slow, seq, prompt)
                continue
            b = begin(slow, seq, prompt)
            assert state(a) == state(b)
            live[seq] = (a, b, list(prompt))
        elif op < 0.25:
            s = rng.choice(list(live))
            a, b, _ = live.pop(s)
            kvshare.check(lib.kvs_seq_free(fast._h, a.seq), "kvs_seq_free")
            kvshare.check(lib.kvs_seq_free(slow._h, b.seq), "kvs_seq_free")
        elif op < 0.6:
            s = rng.choice(list(live))
            a, b, ids = live[s]
            ids.extend(rng.randrange(3, 30000) for _ in range(rng.choice((1, 1, 1, 3, 17, 90))))
            known = rng.randint(a.n, len(ids))  # a chunk, or a whole run of tokens
            lookahead = rng.choice((0, 0, 0, 1, 5, 40))
            got = fast._append(a, ids, known, lookahead)
            want = slow._append(b, ids, known, lookahead)
            assert (got[0], list(got[1])) == (want[0], list(want[1]))
            assert state(a) == state(b)
            if got[0]:
                assert got[0] == kvshare.STATUS["KVS_STATUS_NO_SPACE"]
        else:  # a running request's step: main may run past the known ids (drafts)
            s = rng.choice(list(live))
            a, b, ids = live[s]
            ids.extend(rng.randrange(3, 30000) for _ in range(rng.choice((0, 1, 1, 16, 40))))
            main = rng.randint(a.n, len(ids) + rng.choice((0, 0, 3)))
            la = rng.choice((0, 0, 1, 4, 50))
            mml = rng.choice((4096, main + la, main, max(main - 5, a.n)))
            got = fast._cross(a, ids, main, la, mml)
            want = slow._cross(b, ids, main, la, mml)
            assert got[0] == want[0]
            assert [x.block_id for x in got[1]] == [x.block_id for x in want[1]]
            assert all(blk is fast._blocks[p] for blk, p in zip(got[1], a.pages[-len(got[1]):]))
            assert state(a) == state(b)
            if got[0]:
                assert got[0] == kvshare.STATUS["KVS_STATUS_NO_SPACE"] and got[1] == []
        assert fast.cache.stats() == slow.cache.stats()
    fast.check()
    slow.check()


@fast_only
@pytest.mark.parametrize("seed", range(3))
def test_fast_match_matches_python(monkeypatch, seed):
    """Appender.match against _match: the same status, packed ids and hit blocks for prompts
    sharing prefixes (with and without extra keys) while the index fills and evicts."""
    rng = random.Random(seed)
    fast = make_manager(monkeypatch, pure=False, num_blocks=40)
    slow = make_manager(monkeypatch, pure=True, num_blocks=40)
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
        got = fast._match(prompt, _extra_addr(extra), cap)
        want = slow._match(prompt, _extra_addr(extra), cap)
        assert got[0] == want[0] == 0 and got[1] == want[1] == kvshare.pack_i32(prompt)
        assert [b.block_id for b in got[2]] == [b.block_id for b in want[2]]
        assert all(b is fast._blocks[b.block_id] for b in got[2])
        for m in (fast, slow):  # register the prompt, then free it (cached, evictable)
            toks = kvshare.pack_i32(prompt)
            rc = lib.kvs_seq_begin(m._h, seq, ffi.from_buffer("int32_t[]", toks) if prompt
                                   else ffi.NULL, len(prompt), extra.ptr if extra else ffi.NULL,
                                   0, 0, ffi.NULL)
            if rc == 0:
                kvshare.check(lib.kvs_seq_free(m._h, seq), "kvs_seq_free")
        seen.append((prompt, extra))
        assert fast.cache.stats() == slow.cache.stats()
    fast.check()


@fast_only
@pytest.mark.parametrize("seed", range(3))
def test_fast_begin_matches_python(monkeypatch, seed):
    """Appender.begin against _open: the same statuses, matched tokens, blocks, request state
    and cache for admissions with prefix hits, lookahead, extra keys and running out of room."""
    rng = random.Random(seed)
    fast = make_manager(monkeypatch, pure=False, num_blocks=48)
    slow = make_manager(monkeypatch, pure=True, num_blocks=48)
    system = [rng.randrange(3, 30000) for _ in range(rng.choice((0, 16, 40)))]
    salt = kvshare.ExtraKeys(salt=b"t")
    live: list[tuple[_Req, _Req]] = []
    prompts: list[list[int]] = []
    for seq in range(1, 200):
        if live and rng.random() < 0.35:
            a, b = live.pop(rng.randrange(len(live)))
            kvshare.check(lib.kvs_seq_free(fast._h, a.seq), "kvs_seq_free")
            kvshare.check(lib.kvs_seq_free(slow._h, b.seq), "kvs_seq_free")
            continue
        base = rng.choice(prompts) if prompts and rng.random() < 0.5 else system
        prompt = base[:rng.randint(0, len(base))] + [rng.randrange(3, 30000)
                                                     for _ in range(rng.randint(1, 70))]
        prompts.append(prompt)
        extra = salt if rng.random() < 0.2 else None
        ea = _extra_addr(extra)
        rc, toks, hits = fast._match(prompt, ea, len(prompt) - 1)
        assert rc == 0
        max_match = rng.choice((len(hits) * BS, len(hits) * BS, 0, len(prompt)))
        lookahead, first = rng.choice((0, 0, 1, 30)), rng.choice((len(hits), 0))
        if rng.random() < 0.3:
            toks = memoryview(toks)  # as _tokens hands a view of the pending bytes
        a, b = _Req(seq, extra), _Req(seq, extra)
        got = fast._open(a, toks, ea, max_match, lookahead, first)
        want = slow._open(b, toks, ea, max_match, lookahead, first)
        assert got[:3] == want[:3]
        assert [x.block_id for x in got[3]] == [x.block_id for x in want[3]]
        assert all(x is fast._blocks[x.block_id] for x in got[3])
        assert state(a) == state(b)
        if got[0] == 0:
            assert got[3] == [fast._blocks[p] for p in a.pages[first:]] or got[1]
            live.append((a, b))
        else:
            assert got[0] == kvshare.STATUS["KVS_STATUS_NO_SPACE"]
            assert state(a) == (0, [], b"", -1) and got[3] == []
        assert fast.cache.stats() == slow.cache.stats()
    fast.check()
    slow.check()


@fast_only
def test_fast_begin_bad_input(monkeypatch):
    m = make_manager(monkeypatch, pure=False, num_blocks=8)
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


@fast_only
def test_fast_match_bad_input(monkeypatch):
    m = make_manager(monkeypatch, pure=False, num_blocks=8)
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


@fast_only
def test_fast_bad_input_changes_nothing(monkeypatch):
    m = make_manager(monkeypatch, pure=False, num_blocks=8)
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


@fast_only
def test_fast_append_after_bad_input(monkeypatch):
    m = make_manager(monkeypatch, pure=False, num_blocks=8)
    st = begin(m, 1, list(range(3, 23)))
    ids = list(range(3, 23)) + [40, 41]
    with pytest.raises(ValueError):
        m._append(st, ids, 30, 0)
    # A good append goes through after a refused one.
    rc, new = m._append(st, ids, 22, 12)
    assert rc == 0 and len(new) == 1 and st.pages[-1] == new[0]
    assert (st.n, st.quiet) == (22, 31)
    m.check()


@fast_only
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


def test_twins_refuse_bad_input_alike(monkeypatch, pure):
    """The argument checks every compiled call makes, made by its Python twin too: the same
    exception, raised before kvshare or the request state changes."""
    m = make_manager(monkeypatch, pure=pure, num_blocks=8)
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


def test_begin_failing_after_kvshare_began_leaks_nothing(pure, tiny_model_dir):
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
