"""Drives kvshare_vllm/_fast.c built with AddressSanitizer + UBSan (loaded from the path given
as argv[1], no torch or vLLM in the process): random appends against a plain Python model of
the request state (``append``, ``cross``, ``begin``), prefix lookups (``match``) against the
binding's, every bad input, re-entry and packing.  Run by tests/test_fast.py under
LD_PRELOAD=libasan; any memory error aborts the process."""

import importlib.machinery
import importlib.util
import random
import sys

import kvshare
from kvshare import ffi, lib

spec = importlib.util.spec_from_file_location(
    "_fast", sys.argv[1], loader=importlib.machinery.ExtensionFileLoader("_fast", sys.argv[1]))
fast = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fast)

BS, PAGES = 16, 64


class St:  # the attributes the Appender reads and writes (manager._Req's)
    __slots__ = ("seq", "pages", "raw", "n", "extra", "quiet")

    def __init__(self, seq):
        self.seq, self.pages, self.raw, self.n, self.extra, self.quiet = seq, [], b"", 0, None, -1


cfg = kvshare.config_default(page_size=BS, num_device_pages=PAGES, num_host_pages=0,
                             reserve_null_page=True, enable_prefix_caching=True)
cache = kvshare.Cache(cfg)
h = cache.handle
blocks = [object() for _ in range(PAGES)]  # stand-ins for the manager's block objects
app = fast.Appender(int(ffi.cast("uintptr_t", h)),
                    int(ffi.cast("uintptr_t", ffi.addressof(lib, "kvs_seq_append_pages"))),
                    BS, PAGES, blocks,
                    int(ffi.cast("uintptr_t", ffi.addressof(lib, "kvs_seq_begin"))))
rng = random.Random(3)
system = [rng.randrange(3, 30000) for _ in range(40)]
live = {}
for seq in range(1, 400):
    op = rng.random()
    if op < 0.2 or not live:
        prompt = system + [rng.randrange(3, 30000) for _ in range(rng.randint(1, 40))]
        toks = fast.pack_i32(prompt)
        assert toks == kvshare.pack_i32(prompt)
        st = St(seq)
        view = memoryview(toks) if seq % 2 else toks
        la, first = rng.choice((0, 0, 3, 40)), rng.choice((0, 2))
        rc, rc2, matched, got = app.begin(st, view, 0, len(prompt) - 1, la, first)
        if rc:
            assert (st.n, st.pages, got) == (0, [], [])
            continue
        assert st.n == len(prompt) and matched % BS == 0 and matched < len(prompt)
        if rc2:
            kvshare.check(lib.kvs_seq_free(h, seq), "kvs_seq_free")
            continue
        assert got == [blocks[p] for p in st.pages[first:]]
        assert len(st.pages) * BS >= len(prompt) + la
        live[seq] = (st, prompt)
    elif op < 0.3:
        s = rng.choice(list(live))
        st, _ = live.pop(s)
        kvshare.check(lib.kvs_seq_free(h, st.seq), "kvs_seq_free")
    elif op < 0.6:  # cross: a running request's step, main possibly past the known ids
        s = rng.choice(list(live))
        st, ids = live[s]
        ids.extend(rng.randrange(3, 30000) for _ in range(rng.choice((0, 1, 16, 40))))
        main = rng.randint(st.n, len(ids) + 3)
        la, mml = rng.choice((0, 1, 50)), rng.choice((4096, main, main + 2))
        before = (st.n, list(st.pages), st.raw)
        rc, got = app.cross(st, ids, main, la, mml)
        if rc == 0:
            assert st.n == max(before[0], min(main, len(ids)))
            assert len(st.pages) * BS >= min(main + la, mml)
            assert got == [blocks[p] for p in st.pages[len(before[1]):]]
        else:
            assert (st.n, st.pages, st.raw) == before and got == []
    else:
        s = rng.choice(list(live))
        st, ids = live[s]
        ids.extend(rng.randrange(3, 30000) for _ in range(rng.choice((1, 3, 17, 90))))
        before = (st.n, list(st.pages), st.raw)
        rc, new = app.append(st, ids, rng.randint(st.n, len(ids)), rng.choice((0, 1, 40)))
        if rc == 0:
            assert st.pages == before[1] + list(new)
            assert st.raw == before[2] + b"".join(p.to_bytes(4, sys.byteorder) for p in new)
            fill = (st.n // BS + 1) * BS
            assert st.quiet == min(len(st.pages) * BS, fill - 1)
        else:
            assert (st.n, st.pages, st.raw) == before and new == ()
cache.check()

st, ids = next(iter(live.values()))
for args, exc in (((st, ids, st.n), TypeError), ((st, iter(ids + [5]), len(ids) + 1, 0), TypeError),
                  ((st, ids, len(ids) + 5, 0), ValueError), ((st, ids, len(ids), -1), ValueError),
                  ((st, ids + [2 ** 31], len(ids) + 1, 0), OverflowError)):
    try:
        app.append(*args)
    except exc:
        pass
    else:
        raise AssertionError(f"no error for {args[2:]}")
toks = kvshare.pack_i32(system)
for args, exc in (((St(999), toks, 0, 0, 0), TypeError), ((St(999), system, 0, 0, 0, 0), TypeError),
                  ((St(999), toks[:-2], 0, 0, 0, 0), ValueError),
                  ((St(999), toks, 0, 0, -1, 0), ValueError), ((st, toks, 0, 0, 0, 0), ValueError)):
    try:
        app.begin(*args)
    except exc:
        pass
    else:
        raise AssertionError(f"begin: no error for {args[2:]}")
for args, exc in (((st, ids, st.n, 0), TypeError), ((st, iter(ids), st.n, 0, 99), TypeError),
                  ((st, ids, -1, 0, 99), ValueError), ((st, ids, 2 ** 70, 0, 99), OverflowError),
                  ((st, ids + [2 ** 31], len(ids) + 1, 0, 4096), OverflowError)):
    try:
        app.cross(*args)
    except exc:
        pass
    else:
        raise AssertionError(f"cross: no error for {args[2:]}")


class Reenter:
    def __index__(self):
        app.append(st, ids, len(ids), 0)
        return 5


try:
    app.append(st, ids + [Reenter()], len(ids) + 1, 0)
except RuntimeError:
    pass
else:
    raise AssertionError("re-entry not refused")
try:
    fast.Appender.__new__(fast.Appender).append(st, ids, len(ids), 0)
except RuntimeError:
    pass
else:
    raise AssertionError("uninitialised Appender ran")
app.__init__(int(ffi.cast("uintptr_t", h)),
             int(ffi.cast("uintptr_t", ffi.addressof(lib, "kvs_seq_append_pages"))), BS, PAGES)
for bad in ([2 ** 40], ["x"], [None]):
    try:
        fast.pack_i32(bad)
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
        fast.pack_i32(long_ids)
    except RuntimeError:
        pass
    else:
        raise AssertionError("shrunk list packed")
# match: the hits of random prompts (live and freed ones' prefixes) equal the binding's (an
# Appender of its own: `app` was re-initialised above without the blocks and addresses).
matcher = fast.Appender(int(ffi.cast("uintptr_t", h)),
                        int(ffi.cast("uintptr_t", ffi.addressof(lib, "kvs_seq_append_pages"))),
                        BS, PAGES, blocks, 0,
                        int(ffi.cast("uintptr_t", ffi.addressof(lib, "kvs_prefix_match"))))
pages_buf, n1, n2 = ffi.new("uint32_t[]", PAGES), ffi.new("size_t *"), ffi.new("size_t *")
salted = kvshare.ExtraKeys(salt=b"s")
for i in range(300):
    prompt = system[:rng.randint(0, len(system))] + [rng.randrange(3, 30000)
                                                     for _ in range(rng.randint(0, 30))]
    if live and rng.random() < 0.5:
        _, ids = rng.choice(list(live.values()))
        prompt = ids[:rng.randint(0, len(ids))]
    extra = salted if rng.random() < 0.2 else None
    ea = int(ffi.cast("uintptr_t", extra.ptr)) if extra else 0
    cap = rng.choice((len(prompt), max(len(prompt) - 1, 0), 5))
    rc, packed, hits = matcher.match(prompt, ea, cap)
    toks = kvshare.pack_i32(prompt)
    want = lib.kvs_prefix_match(h, 0, ffi.from_buffer("int32_t[]", toks) if prompt else ffi.NULL,
                                len(prompt), extra.ptr if extra else ffi.NULL, cap, False,
                                pages_buf, PAGES, n1, n2)
    assert rc == want == 0 and packed == toks
    assert hits == [blocks[p] for p in ffi.unpack(pages_buf, n1[0])]
for args, exc in (((system, 0), TypeError), ((iter(system), 0, 1), TypeError),
                  ((system, -1, 1), OverflowError), ((system, 0, -1), ValueError),
                  ((system + [2 ** 31], 0, 1), OverflowError)):
    try:
        matcher.match(*args)
    except exc:
        pass
    else:
        raise AssertionError(f"match: no error for {args[1:]}")


class ReenterMatch:
    def __index__(self):
        matcher.match(system, 0, 1)
        return 5


try:
    matcher.match(system + [ReenterMatch()], 0, 1)
except RuntimeError:
    pass
else:
    raise AssertionError("match re-entry not refused")
edges = [0, 1, -1, 2 ** 30 - 1, 2 ** 30, -(2 ** 30), 2 ** 31 - 1, -(2 ** 31)] * 20
assert fast.pack_i32(edges) == kvshare.pack_i32(edges)
cache.check()
print("ok")
