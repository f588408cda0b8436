"""The hybrid manager's native calls (``kvshare_vllm/_fast_groups.c``, ``Groups``) against bad
input: every refusal raises before kvshare, the request state or the page refcount mirror
changes, and the manager keeps working after it.  Their results on good input are the lockstep
tests' (``test_hybrid_compare.py::test_lockstep`` against vLLM, every step, with
``check()`` comparing the mirror to kvshare)."""

from __future__ import annotations

from array import array

import pytest

import asan_drive
import harness as h
from kvshare_vllm import hybrid as hybrid_mod

@pytest.fixture
def mgr(tiny_model_dir):
    """A hybrid manager (gpt-oss layout, window 32) on the compiled calls, holding one request
    that has released out-of-window pages."""
    s = h.make_scheduler(tiny_model_dir, kvshare=True, num_blocks=64,
                         specs=h.layer_specs("gpt-oss", size=32))
    m = s.kv_cache_manager
    assert type(m).__name__ == "KvshareHybridKVCacheManager" and m._fast is not None
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
    bad = hybrid_mod._HReq(st.seq, None, 2)
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
    G = hybrid_mod._fast.Groups
    good = m._fast
    addr = int(hybrid_mod.ffi.cast("uintptr_t", m.cache.handle))
    fns = tuple(int(hybrid_mod.ffi.cast("uintptr_t", hybrid_mod.ffi.addressof(
        hybrid_mod.lib, f"kvs_{n}"))) for n in (
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


def test_fast_groups_under_asan(tmp_path):
    """_fast_groups.c's Groups (in the module with _fast.c) built with
    -fsanitize=address,undefined and driven by tests/fast_asan/drive_groups.py in a process of
    its own (the sanitizer runtime preloaded)."""
    asan_drive.build_and_drive(tmp_path, "_fast", "drive_groups.py")
