"""The manager's native module (``kvshare_vllm/_fast.c``, ``_fast_groups.c``) against bad
input: every refusal of ``Groups`` raises before kvshare, the request state or the page refcount
mirror changes, and the manager keeps working after it; ``pack_i32`` packs as the binding does.
Their results on good input are the lockstep tests' (``test_hybrid_compare.py`` and
``test_scheduler_compare.py`` against vLLM, every step, with ``check()`` comparing the mirror to
kvshare)."""

from __future__ import annotations

import random
from array import array

import pytest

import kvshare

import asan_drive
import harness as h
from kvshare_vllm import manager as manager_mod

@pytest.fixture
def mgr(tiny_model_dir):
    """The manager on a hybrid model (gpt-oss layout, window 32) on the compiled calls, holding
    one request that has released out-of-window pages."""
    s = h.make_scheduler(tiny_model_dir, kvshare=True, num_blocks=64,
                         specs=h.layer_specs("gpt-oss", size=32))
    m = s.kv_cache_manager
    assert type(m).__name__ == "KvshareKVCacheManager" and m._fast is not None
    r = h.make_request("a", list(range(3, 3 + 70)), hash_blocks=False)
    assert m.allocate_slots(r, 70) is not None
    r.num_computed_tokens = 70
    m.remove_skipped_blocks("a", 70)
    assert any(0 in t for t in m._reqs["a"].tables), "the window group released positions"
    m.check()
    return m, r


def snapshot(m):
    st = m._reqs["a"]
    return ([list(t) for t in st.tables], st.n, bytes(m._refs), m._avail, m.cache.group_stats(0),
            m.cache.group_stats(1))


def test_bad_input_changes_nothing(mgr):
    m, r = mgr
    fast, st = m._fast, m._reqs["a"]
    ids = list(r.all_token_ids)
    before = snapshot(m)
    cases = [
        (fast.running, (st, ids, -1, 80, 70, 10), ValueError),
        (fast.running, (st, ids, 70, 80, 70, None), ValueError),  # avail must be known
        (fast.running, (st, ids, 70, 80, 70), TypeError),
        (fast.append, (st, range(3, 90), 80, 0, None), TypeError),
        (fast.append, (st, ids, 80, 0, None), ValueError),  # fewer ids than known
        (fast.append, (st, ids, 70, -1, None), ValueError),
        (fast.append, (st, ids + ["x"] * 10, 80, 0, None), TypeError),
        (fast.append, (st, ids + [2 ** 40] * 10, 80, 0, None), OverflowError),
        (fast.release, (st, -5, None), ValueError),
        (fast.begin, (st, ids, 70, 0, 70, 0, 0, 0, None), ValueError),  # st holds tokens
        (fast.begin, (st, ids, 70, -1, 70, 0, 0, 0, None), OverflowError),  # extra_addr first
        (fast.begin, (st, ids, 70, "x", 70, 0, 0, 0, None), TypeError),
        (fast.begin, (st, ids, 70, 0, 70, 0, 0, -1, None), ValueError),  # computed
        (fast.begin, (st, ids, 70, 0, 70, 0, 0, None), TypeError),  # 8 arguments
        (fast.match, (range(5), 0, 4), TypeError),
        (fast.match, (ids, -1, 4), OverflowError),
        (fast.match, (ids, 2 ** 64, 4), OverflowError),
        (fast.match, (ids, "x", 4), TypeError),
        (fast.match, (ids, 0, -1), ValueError),
        (fast.free, (object(), None), AttributeError),
    ]
    bad = manager_mod._HReq(st.seq, None, 2)
    bad.tables = [[]]  # one list for two groups
    cases.append((fast.free, (bad, None), TypeError))
    for fn, args, exc in cases:
        with pytest.raises(exc):
            fn(*args)
        assert snapshot(m) == before, (fn.__name__, args)
    m.check()
    # Still working: the next step, then the end of the request.
    r.append_output_token_ids(5)
    assert m.allocate_slots(r, 1) is not None
    m.check()
    m.free(r)
    m.check()
    assert not any(m._refs)


def test_groups_refuses_what_it_cannot_run(mgr):
    m, _ = mgr
    G = manager_mod._fast.Groups
    good = m._fast
    addr = int(manager_mod.ffi.cast("uintptr_t", m.cache.handle))
    fns = tuple(int(manager_mod.ffi.cast("uintptr_t", manager_mod.ffi.addressof(
        manager_mod.lib, f"kvs_{n}"))) for n in (
        "seq_append", "seq_get_info", "seq_pages", "seq_release_skipped", "seq_free",
        "seq_begin_computed", "prefix_find"))
    kinds = ((1, 32), (0, 0))
    refs = array("I", bytes(4 * m.num_blocks))
    with pytest.raises(ValueError):
        G(addr, fns[:6], 16, m.num_blocks, kinds, refs, m._blocks)
    with pytest.raises(ValueError):
        G(addr, fns, 16, m.num_blocks, ((3, 4), (0, 0)), refs, m._blocks)  # a STATE group
    with pytest.raises(ValueError):
        G(addr, fns, 16, m.num_blocks, ((1, 0), (0, 0)), refs, m._blocks)  # window 0
    with pytest.raises(ValueError):
        G(addr, fns, 16, m.num_blocks, kinds, array("H", bytes(2 * m.num_blocks)), m._blocks)
    with pytest.raises(ValueError):
        G(addr, fns, 16, m.num_blocks, kinds, refs, m._blocks[:3])
    with pytest.raises(ValueError):
        G(0, fns, 16, m.num_blocks, kinds, refs, m._blocks)
    with pytest.raises(RuntimeError):
        G.__new__(G).free(m._reqs["a"], None)  # not initialised
    with pytest.raises(RuntimeError):
        good.__init__(addr, fns, 16, m.num_blocks, kinds, refs, m._blocks)  # twice
    # The mirror it holds cannot be resized under it.
    with pytest.raises(BufferError):
        m._refs.append(0)
    m.check()


def test_fast_under_asan(tmp_path):
    """The module (_fast.c with _fast_groups.c's Groups) built with -fsanitize=address,undefined
    and driven by tests/fast_asan/drive_groups.py in a process of its own (the sanitizer runtime
    preloaded)."""
    asan_drive.build_and_drive(tmp_path, "_fast", "drive_groups.py")


def test_fast_pack_i32_matches_binding():
    fast = manager_mod._fast.pack_i32
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
