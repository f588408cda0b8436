"""Drives kvshare_vllm._fast and its Groups (built with AddressSanitizer + UBSan, loaded from
the path given as argv[1], no torch or vLLM in the process): random begins, running steps,
appends, releases, frees and matches on a two-group cache (sliding window 32 / full), each
checked against kvshare through the binding (tables, the page refcount mirror, the free count),
plus bad input, and pack_i32 on edge and bad ids.  Run by tests/test_fast.py under
LD_PRELOAD=libasan; any memory error aborts the process."""

import importlib.machinery
import importlib.util
import random
import sys
from array import array
from collections import Counter

import kvshare
from kvshare import ffi, lib

spec = importlib.util.spec_from_file_location(
    "_fast", sys.argv[1],
    loader=importlib.machinery.ExtensionFileLoader("_fast", sys.argv[1]))
fg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fg)

BS, PAGES = 16, 96
hy = kvshare.Cache(page_size=BS, num_device_pages=PAGES, reserve_null_page=True,
                   vllm_free_order=True, groups=[("sliding_window", 32, 4096), ("full", 0, 4096)])
refs = array("I", bytes(4 * PAGES))
blocks = [object() for _ in range(PAGES)]
fns = tuple(int(ffi.cast("uintptr_t", ffi.addressof(lib, f"kvs_{n}"))) for n in (
    "seq_append", "seq_get_info", "seq_pages", "seq_release_skipped", "seq_free",
    "seq_begin_computed", "prefix_find"))
g = fg.Groups(int(ffi.cast("uintptr_t", hy.handle)), fns, BS, PAGES, ((1, 32), (0, 0)), refs,
              blocks)


class St:  # group_tables.py's _HReq
    __slots__ = ("seq", "n", "extra", "tables")

    def __init__(self, seq):
        self.seq, self.n, self.extra, self.tables = seq, 0, None, [[], []]


def free_count():
    return hy.group_stats(0)["pool_pages_free"]


def check(live, avail):
    want = Counter()
    for st, _ in live.values():
        for gi in range(2):
            assert st.tables[gi] == list(hy.seq_pages(st.seq, gi)), (st.seq, gi)
            want.update(p for p in st.tables[gi] if p)
    assert all(refs[p] == want[p] for p in range(PAGES))
    assert avail == free_count(), (avail, free_count())
    hy.check()


rng = random.Random(5)
system = [rng.randrange(3, 30000) for _ in range(50)]
live = {}
avail = free_count()
for seq in range(1, 500):
    op = rng.random()
    if op < 0.25 or not live:
        ids = system + [rng.randrange(3, 30000) for _ in range(rng.randint(1, 60))]
        rc, hit, rows = g.match(ids, 0, len(ids) - 1)
        assert rc == 0 and hit % BS == 0 and len(rows) == 2
        n_hit, want_rows = hy.prefix_find(ids, len(ids) - 1)
        assert n_hit == hit
        assert [[blocks[p] for p in r] for r in want_rows] == [list(r) for r in rows]
        st = St(seq)
        first = rng.choice((0, hit // BS))
        la = rng.choice((0, 5))
        computed = rng.choice((0, hit, len(ids), len(ids) + la))  # tokens with KV at the begin
        rc, matched, rows, avail = g.begin(st, ids, len(ids), 0, hit, la, first, computed, avail)
        if rc:
            assert st.n == 0 and st.tables == [[], []] and rows is None
            continue
        assert matched == hit and st.n == len(ids)
        assert list(rows) == [[blocks[p] for p in t[first:]] for t in st.tables]
        live[seq] = (st, ids)
    elif op < 0.75:
        st, ids = live[rng.choice(list(live))]
        ids.extend(rng.randrange(3, 30000) for _ in range(rng.randint(1, 20)))
        known = rng.randint(st.n, len(ids))
        room, rc, appended, added, avail = g.running(st, ids, max(0, st.n - 1), known + 2, known,
                                                     avail)
        if room and appended:
            assert rc == 0 and st.n == known
            assert added is None or [len(a) for a in added][0] == len(added[1])
    elif op < 0.85:
        st, ids = live[rng.choice(list(live))]
        rc, added, avail = g.append(st, ids, len(ids), 0, avail)
        assert rc or st.n == len(ids)
        _, avail = g.release(st, st.n, avail)
    else:
        st, _ = live.pop(rng.choice(list(live)))
        rc, avail = g.free(st, avail)
        assert rc == 0
    check(live, avail)

st, ids = next(iter(live.values()))
for fn, args, exc in [
        (g.running, (st, ids, -1, 1, 1, avail), ValueError),
        (g.running, (st, ids, 0, 1, 1, None), ValueError),
        (g.append, (st, ids, len(ids) + 5, 0, avail), ValueError),
        (g.append, (st, ids + ["x"], len(ids) + 1, 0, avail), TypeError),
        (g.append, (st, range(5), len(ids) + 1, 0, avail), TypeError),
        (g.begin, (st, ids, 3, 0, 0, 0, 0, 0, avail), ValueError),
        (g.match, (ids, -1, 3), OverflowError),
        (g.match, ("abc", 0, 3), TypeError),
        (g.free, (object(), avail), AttributeError)]:
    try:
        fn(*args)
    except exc:
        pass
    else:
        raise AssertionError((fn, args))
    check(live, avail)
for st, _ in live.values():
    rc, avail = g.free(st, avail)
    assert rc == 0
check({}, avail)
assert not any(refs)
for bad in ([2 ** 40], ["x"], [None]):
    try:
        fg.pack_i32(bad)
    except (OverflowError, TypeError):
        pass
    else:
        raise AssertionError(bad)
# An __index__ that shrinks a long list while it is packed (the read-ahead must follow the
# list's current size, not the size it started with).
for at in (3, 100, 190):
    long_ids = list(range(1000, 1200))

    class Shrink:
        def __index__(self):
            del long_ids[at - 2:]
            return 0

    long_ids[at] = Shrink()
    try:
        fg.pack_i32(long_ids)
    except RuntimeError:
        pass
    else:
        raise AssertionError("shrunk list packed")
edges = [0, 1, -1, 2 ** 30 - 1, 2 ** 30, -(2 ** 30), 2 ** 31 - 1, -(2 ** 31)] * 20
assert fg.pack_i32(edges) == kvshare.pack_i32(edges)
print("ok")
