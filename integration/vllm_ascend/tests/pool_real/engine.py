"""One engine process for the pool tier's real-process test: its own kvshare cache with a pool
tier, its own paged KV memory, kvshare's CPU attention backend, and a Mooncake Store client.
Driven by JSON lines on stdin (one reply line per command):

* ``{"op": "run", "tokens": [...]}``: begins the prompt through the pool (lookup, begin, loads),
  computes the K/V of every token not matched into the sequence's pages, runs paged attention
  for the last token of every layer, and compares it with dense attention over K/V computed
  from the tokens alone; then commits, stores and frees. Replies with the match, the largest
  error and the counters.
  With ``"ballast": n``, its stores are put together with ``n`` values of 4 MiB (one
  ``batch_put_from``) and a ``{"op": "putting"}`` line goes out just before that call and a
  ``{"op": "put"}`` line after it: the driver kills the process in between.
* ``{"op": "poison", "tokens": [...], "page": p, "delta": d}``: replaces the pool's entry of
  the prompt's page ``p`` with the same value one byte short (``d`` -1) or with one zero byte
  more (``d`` 1) (``remove``, then ``put``).
* ``{"op": "exit"}``.

    engine.py MASTER [COOLDOWN_S [SEGMENT_BYTES]]

A writer started with ``SEGMENT_BYTES`` 0 mounts no memory: what it puts lands in the other
engines' segments.

The "model" is fixed random projections: K, V and Q of a token at a position are functions of
(token, position, layer) alone, seeded identically in every process, so a page loaded from
another engine holds exactly the K/V this engine would compute, and any other bytes show up
as an attention error.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))

import kvshare  # noqa: E402
from kvshare import pool as kp  # noqa: E402
from kvshare_vllm import ops  # noqa: E402
from mooncake.store import MooncakeDistributedStore  # noqa: E402

PS, LAYERS, KV_HEADS, HEADS, D, PAGES, VOCAB = 16, 2, 2, 4, 32, 64, 256


class Model:
    def __init__(self):
        g = torch.Generator().manual_seed(1234)
        self.emb = torch.randn(VOCAB, 64, generator=g)
        self.wk = torch.randn(LAYERS, 64, KV_HEADS * D, generator=g) / 8
        self.wv = torch.randn(LAYERS, 64, KV_HEADS * D, generator=g) / 8
        self.wq = torch.randn(LAYERS, 64, HEADS * D, generator=g) / 8

    def x(self, tokens, start):
        pos = torch.arange(start, start + len(tokens), dtype=torch.float32).view(-1, 1)
        freq = torch.arange(64, dtype=torch.float32).view(1, -1) / 64
        return self.emb[torch.tensor(tokens) % VOCAB] + torch.sin(pos * freq)

    def kv(self, tokens, start, layer):
        x = self.x(tokens, start)
        return ((x @ self.wk[layer]).view(-1, KV_HEADS, D),
                (x @ self.wv[layer]).view(-1, KV_HEADS, D))

    def q(self, token, pos, layer):
        return (self.x([token], pos) @ self.wq[layer]).view(1, HEADS, D)


class Pages:
    """The engine's KV memory: per layer ``[PAGES, PS, KV_HEADS, D]`` float32 K and V. A page's
    pool payload is every layer's K page then V page."""

    def __init__(self):
        self.k = [torch.zeros(PAGES, PS, KV_HEADS, D) for _ in range(LAYERS)]
        self.v = [torch.zeros(PAGES, PS, KV_HEADS, D) for _ in range(LAYERS)]
        self.one = PS * KV_HEADS * D * 4

    def page_bytes(self, group):
        return 2 * LAYERS * self.one

    def read(self, tier, group, page):
        parts = []
        for layer in range(LAYERS):
            parts.append(self.k[layer][page].numpy().tobytes())
            parts.append(self.v[layer][page].numpy().tobytes())
        return b"".join(parts)

    def write(self, group, page, data):
        flat = torch.frombuffer(bytearray(data), dtype=torch.float32)
        n = self.one // 4
        for layer in range(LAYERS):
            self.k[layer][page] = flat[(2 * layer) * n:(2 * layer + 1) * n].view(PS, KV_HEADS, D)
            self.v[layer][page] = flat[(2 * layer + 1) * n:(2 * layer + 2) * n].view(
                PS, KV_HEADS, D)


def dense(model, tokens, layer):
    k, v = model.kv(tokens, 0, layer)
    q = model.q(tokens[-1], len(tokens) - 1, layer)
    g = HEADS // KV_HEADS
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = torch.einsum("qhd,lhd->hql", q.double(), k) / math.sqrt(D)
    return torch.einsum("hql,lhd->qhd", s.softmax(-1), v)


class BallastStore:
    """The client, with every ``batch_put_from`` padded by ``n`` 4 MiB values so that the
    call lasts long enough to be killed in the middle, announced on stdout."""
    SIZE = 4 << 20

    def __init__(self, store, n, tag):
        self.store, self.n, self.tag = store, n, tag
        self.raw = bytearray(n * self.SIZE + 4096)
        self.buf = (ctypes.c_char * len(self.raw)).from_buffer(self.raw)
        self.ptr = (ctypes.addressof(self.buf) + 4095) & ~4095
        if store.register_buffer(self.ptr, n * self.SIZE) != 0:
            raise SystemExit("register ballast")

    def __getattr__(self, name):
        return getattr(self.store, name)

    def batch_put_from(self, keys, ptrs, sizes):
        extra = [f"kvs-test-ballast/{self.tag}/{j}" for j in range(self.n)]
        print(json.dumps({"op": "putting", "keys": len(keys), "ballast": self.n}), flush=True)
        codes = self.store.batch_put_from(
            list(keys) + extra, list(ptrs) + [self.ptr + j * self.SIZE for j in range(self.n)],
            list(sizes) + [self.SIZE] * self.n)
        print(json.dumps({"op": "put", "codes": list(codes)}), flush=True)
        return list(codes)[:len(keys)]


def poison(cache, store, tokens, page, delta):
    _first, keys = cache.pool_lookup(tokens, None, len(tokens) - 1)
    key = [k for p, _, k in keys if p == page][0]
    value = store.get(key)
    removed = store.remove(key, True)
    bad = value[:-1] if delta < 0 else value + b"\0"
    return {"op": "poison", "key": key, "size": len(value), "removed": removed,
            "put": store.put(key, bad), "now": store.get_size(key)}


def main():
    master = sys.argv[1]
    cooldown_s = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    segment = int(sys.argv[3]) if len(sys.argv) > 3 else 32 << 20
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, 16 << 20, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"mooncake setup: {rc}")
    cache = kvshare.Cache(page_size=PS, num_device_pages=PAGES, skip_cached_writes=False,
                          pool={"namespace": "kvs-test", "identity": "tiny-f32-dense",
                                "store": "write_through"})
    pages, model = Pages(), Model()
    rt = kp.PoolRuntime(cache, store, pages, breaker=kp.Breaker(cooldown_s=cooldown_s))
    print(json.dumps({"op": "ready"}), flush=True)
    sid = 0
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        tokens = cmd["tokens"]
        if cmd["op"] == "poison":
            print(json.dumps(poison(cache, store, tokens, cmd["page"], cmd["delta"])), flush=True)
            continue
        if cmd["op"] == "exists":  # what the master lists of the prompt's full pages
            _first, keys = cache.pool_lookup(tokens, None, len(tokens) - 1)
            print(json.dumps({"op": "exists",
                              "exist": list(store.batch_is_exist([k for _, _, k in keys]))}),
                  flush=True)
            continue
        sid += 1
        t0 = time.perf_counter()
        rt.begin(sid, tokens, max_match_tokens=len(tokens) - 1)
        loading = cache.seq_pool_loading(sid)
        matched = cache.seq_info(sid)["matched_tokens"]
        table = list(cache.seq_pages(sid))
        slots = torch.tensor([table[p // PS] * PS + p % PS for p in range(matched, len(tokens))])
        err = 0.0
        for layer in range(LAYERS):
            k, v = model.kv(tokens[matched:], matched, layer)
            ops.reshape_and_cache(k, v, pages.k[layer], pages.v[layer], slots)
            out = torch.zeros(1, HEADS, D)
            bt = torch.tensor([table], dtype=torch.int32)
            ops.paged_attention(model.q(tokens[-1], len(tokens) - 1, layer), pages.k[layer],
                                pages.v[layer], bt, [len(tokens)], out,
                                scale=1 / math.sqrt(D), num_kv_heads=KV_HEADS)
            err = max(err, (out.double() - dense(model, tokens, layer)).abs().max().item())
        cache.commit()
        if cmd.get("ballast"):
            # Keys of this process's own: a retried writer's put of a complete earlier
            # writer's ballast would store nothing and end at once.
            rt.store = BallastStore(store, cmd["ballast"], f"{os.getpid()}-{sid}")
        rt.pump()
        rt.store = store
        cache.seq_free(sid)
        cache.check()
        print(json.dumps({"op": "run", "matched": matched, "loading": loading, "err": err,
                          "ms": round((time.perf_counter() - t0) * 1e3, 1),
                          "pool": cache.pool_stats(),
                          "runtime": {"lookups": rt.stats.lookups,
                                      "lookups_skipped": rt.stats.lookups_skipped,
                                      "loads_ok": rt.stats.loads_ok,
                                      "load_failures": rt.stats.load_failures,
                                      "stores_ok": rt.stats.stores_ok,
                                      "store_failures": rt.stats.store_failures,
                                      "removed": rt.stats.removed,
                                      "breaker_trips": rt.breaker.trips}}), flush=True)
    rt.close()
    os._exit(0)  # the client's threads; close() after a dead master can hang


if __name__ == "__main__":
    main()
