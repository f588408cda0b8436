#!/usr/bin/env python3
"""What router-compatible KV events cost kvshare's vLLM manager, per stored block.

With KV events on, kvshare's manager publishes vLLM's own block hashes (``kvshare_vllm.events``):
the engine keeps vLLM's request block hasher (``Request.block_hashes`` under the configured
``prefix_caching_hash_algo``) and the manager translates each drained kvshare event.  With
events off there is neither.  This runs the same multi-turn chat workload through vLLM
0.23.0's Scheduler with kvshare's manager twice in one process, events off and events on, one
scheduler step of each in turn (the order alternating between repeats, as ``bench_vllm.py``
does), and reports for each hash algorithm:

  * ``us_per_stored_block``: (manager + hasher time, events on) - (the same, events off),
    divided by the blocks the events-on side published as stored (median over repeats);
  * ``hasher_us_per_hashed_block``: the hasher's time per block it hashed (every full block
    of every request, hits included, as in stock vLLM);
  * ``hasher_us_per_stored_block`` / ``translate_us_per_stored_block``: the two parts (the
    hasher's time, and the manager's extra time: draining and converting events);
  * ``ratio``: events-on time / events-off time (geometric mean over repeats).

Usage: bench_events.py [--quick] [--algos sha256,sha256_cbor,xxhash] [--repeats R]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_vllm as bv  # noqa: E402  (sets up paths and the CPU platform)


def side(model_dir, events: bool, algo: str, args, seed=1):
    """kvshare's scheduler with events on or off, as a generator yielding after each step."""
    import harness as h
    from vllm.distributed.kv_events import BlockStored
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    s = h.make_scheduler(model_dir, kvshare=True, num_blocks=args.blocks, kv_events=events,
                         max_num_seqs=args.convs, max_num_batched_tokens=4096)
    clock, hclock = bv.Clock(), bv.Clock()
    bv.instrument(s.kv_cache_manager, clock)
    base = get_request_block_hasher(16, get_hash_fn_by_name(algo))
    stored = [0]
    if events:
        s.kv_event_publisher.publish = lambda batch: stored.__setitem__(0, stored[0] + sum(
            len(e.block_hashes) for e in batch.events if isinstance(e, BlockStored)))

    def hasher(req):
        t = time.perf_counter_ns()
        try:
            return base(req)
        finally:
            hclock.ns += time.perf_counter_ns() - t

    rng = random.Random(seed)
    system = [rng.randrange(3, 30000) for _ in range(args.system)]
    hist = {c: system + [rng.randrange(3, 30000) for _ in range(rng.randint(20, 200))]
            for c in range(args.convs)}
    turn = dict.fromkeys(range(args.convs), 0)
    reqs, live = {}, {}
    steps = 0

    def submit(c):
        rid = f"c{c}t{turn[c]}"
        r = h.make_request(rid, hist[c], max_tokens=args.max_tokens, block_hasher=hasher,
                           hash_blocks=events, hash_algo=algo)
        reqs[rid] = r
        live[rid] = c
        s.add_request(r)

    yield
    for c in range(args.convs):
        submit(c)
    while live or s.has_unfinished_requests():
        h.step(s, reqs)
        steps += 1
        for rid in list(live):
            r = reqs[rid]
            if r.is_finished():
                c = live.pop(rid)
                turn[c] += 1
                hist[c] = list(r.all_token_ids) + [rng.randrange(3, 30000)
                                                   for _ in range(rng.randint(20, 200))]
                if turn[c] < args.turns:
                    submit(c)
        yield
    return dict(steps=steps, kv_ns=clock.ns, hasher_ns=hclock.ns, stored=stored[0],
                hashed=sum(len(r.block_hashes) for r in reqs.values()),
                tokens={rid: list(r.all_token_ids) for rid, r in reqs.items()})


def lockstep(model_dir, algo, args, order):
    return bv.run_in_lockstep({name: side(model_dir, name == "on", algo, args) for name in order})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--algos", default="sha256,sha256_cbor,xxhash")
    ap.add_argument("--convs", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--system", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    if args.quick:
        args.convs, args.turns, args.repeats, args.max_tokens = 8, 2, 2, 16
    from conftest import TINY_CONFIG

    model_dir = tempfile.mkdtemp(prefix="kvshare-bench-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(TINY_CONFIG, f)
    repeats = max(2, args.repeats + args.repeats % 2)
    result = {"bench": "vllm-events", "workload": {
        "conversations": args.convs, "turns": args.turns, "system_tokens": args.system,
        "max_tokens": args.max_tokens, "blocks": args.blocks, "block_size": 16}}
    for algo in args.algos.split(","):
        runs = [lockstep(model_dir, algo, args, ("off", "on") if i % 2 == 0 else ("on", "off"))
                for i in range(repeats)]
        assert all(r["on"]["tokens"] == r["off"]["tokens"] for r in runs)
        stored = runs[0]["on"]["stored"]
        assert stored > 0 and all(r["on"]["stored"] == stored for r in runs)

        def total(r):
            return r["kv_ns"] + r["hasher_ns"]

        per = [(total(r["on"]) - total(r["off"])) / 1e3 / stored for r in runs]
        hasher = [r["on"]["hasher_ns"] / 1e3 / stored for r in runs]
        translate = [(r["on"]["kv_ns"] - r["off"]["kv_ns"]) / 1e3 / stored for r in runs]
        hashed = runs[0]["on"]["hashed"]
        result[algo] = {
            "stored_blocks": stored,
            "hashed_blocks": hashed,
            "hasher_us_per_hashed_block": round(statistics.median(
                [r["on"]["hasher_ns"] / 1e3 / hashed for r in runs]), 2),
            "us_per_stored_block": round(statistics.median(per), 2),
            "hasher_us_per_stored_block": round(statistics.median(hasher), 2),
            "translate_us_per_stored_block": round(statistics.median(translate), 2),
            "ratio": round(statistics.geometric_mean(
                [total(r["on"]) / total(r["off"]) for r in runs]), 2),
            "off_us_per_step": round(statistics.median(
                [total(r["off"]) / 1e3 / r["off"]["steps"] for r in runs]), 2),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
