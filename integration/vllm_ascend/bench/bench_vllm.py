#!/usr/bin/env python3
"""Replays one multi-turn chat workload through vLLM 0.23.0's Scheduler with vLLM's built-in
KVCacheManager and with kvshare's, in one run, and prints a final single-line JSON object.

KV-cache management time is the time spent inside the manager's methods the scheduler calls
(every public method and the ``usage`` property, timed with perf_counter_ns; the timer's own
cost is the same on both sides) plus the engine's block hasher: vLLM's prefix cache needs
``Request.block_hashes`` (SHA-256 per full block, computed as tokens arrive), which the
plugin switches off when kvshare manages the cache (kvshare hashes inside its own calls), so
the kvshare side runs its requests without it, as the engine does.

The two schedulers run in lockstep: one step of one, then one step of the other, so the
machine's noise (it comes in phases of seconds) falls on both alike, and each side's caches are
as cold at its next step as an engine's are after a model step.  The side going first in every
step runs measurably slower, so the order alternates between repeats (an even number).

Reported: ``speedup`` = (vLLM manager + hasher) / (kvshare manager + hasher, i.e. none), and
``speedup_manager_only``, the managers' methods alone: geometric means over the repeats of
each repeat's ratio.  Per-side microseconds per step are medians.

``--model qwen3-next|nemotron-h|jamba [--mamba-mode all|none]`` runs a Mamba / linear-attention
hybrid (``harness.mamba_layer_specs``) the same way.

``--model gpt-oss|gemma3|llama4|mla`` runs a hybrid model's KV-cache groups (``harness.MODELS``,
grouped by vLLM's own ``get_kv_cache_groups``; ``--window N`` overrides its window / chunk):
vLLM's side then runs its ``HybridKVCacheCoordinator``.  Default: one full-attention group.

Usage: bench_vllm.py [--quick] [--convs N] [--turns T] [--repeats R] [--model M [--window N]]
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
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import logging  # noqa: E402

logging.disable(logging.WARNING)

# The manager's methods the scheduler calls: vLLM 0.23's, then those 0.32 added (a method the
# installed manager lacks is not timed).
TIMED = ("get_computed_blocks", "allocate_slots", "free", "get_blocks", "get_block_ids",
         "take_events", "make_prefix_cache_stats", "reset_prefix_cache", "new_step_starts",
         "take_new_block_ids", "cache_blocks", "get_num_common_prefix_blocks",
         "remove_skipped_blocks", "estimate_cached_tokens", "record_prefix_cache_stats",
         "take_kv_cache_block_copies", "take_boundary_state_offloads",
         "get_block_ids_for_computed_tokens", "pop_blocks_for_free")


class Clock:
    ns = 0
    depth = 0
    per_method: dict = {}


def instrument(mgr, clock: Clock):
    cls = type(mgr)
    pc = time.perf_counter_ns

    clock.per_method = {}

    def wrap(name, fn):
        # Only the outermost timed call counts: a method calling another timed method (e.g.
        # allocate_slots reading usage) must not be counted twice.
        def timed(*a, **k):
            if clock.depth:
                return fn(*a, **k)
            clock.depth += 1
            t = pc()
            try:
                return fn(*a, **k)
            finally:
                dt = pc() - t
                clock.depth -= 1
                clock.ns += dt
                clock.per_method[name] = clock.per_method.get(name, 0) + dt
        return timed

    ns = {name: wrap(name, getattr(cls, name)) for name in TIMED if hasattr(cls, name)}
    ns["usage"] = property(wrap("usage", cls.usage.fget))
    mgr.__class__ = type("Timed" + cls.__name__, (cls,), ns)


def side(model_dir, kvshare: bool, args, seed=1):
    """One side of the comparison as a generator: yields after each scheduler step, returns
    (StopIteration value) its figures.  The workload is the same for both sides."""
    import harness as h
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.utils.hashing import sha256

    extra = {}
    if args.model in h.MAMBA_MODELS:  # Mamba / linear-attention state groups
        mml = args.max_model_len or 8192
        specs = h.mamba_layer_specs(args.model, args.mamba_mode, max_model_len=mml)
        extra = dict(mamba_cache_mode=args.mamba_mode, max_model_len=mml,
                     enable_prefix_caching=args.mamba_mode != "none")
    else:
        specs = h.layer_specs(args.model, size=args.window) if args.model else None
        extra = dict(max_model_len=args.max_model_len)
    s = h.make_scheduler(model_dir, kvshare=kvshare, num_blocks=args.blocks,
                         max_num_seqs=args.convs, max_num_batched_tokens=4096, specs=specs,
                         **extra)
    clock, hclock = Clock(), Clock()
    instrument(s.kv_cache_manager, clock)
    base_hasher = get_request_block_hasher(16, sha256)

    def hasher(req):
        t = time.perf_counter_ns()
        try:
            return base_hasher(req)
        finally:
            hclock.ns += time.perf_counter_ns() - t

    # As the engine runs with the plugin: no block hasher on kvshare's side (plugin.py).
    hashes = not kvshare

    rng = random.Random(seed)
    system = [rng.randrange(3, 30000) for _ in range(args.system)]
    hist = {c: system + [rng.randrange(3, 30000) for _ in range(rng.randint(20, 200))]
            for c in range(args.convs)}
    turn = dict.fromkeys(range(args.convs), 0)
    reqs, live = {}, {}
    hits = queries = steps = peak = 0
    n_usable = args.blocks - 1

    def submit(c):
        rid = f"c{c}t{turn[c]}"
        r = h.make_request(rid, hist[c], max_tokens=args.max_tokens, block_hasher=hasher,
                           hash_blocks=hashes)
        reqs[rid] = r
        live[rid] = c
        s.add_request(r)

    yield  # built: the driver freezes the GC heap once both sides exist
    for c in range(args.convs):
        submit(c)
    while live or s.has_unfinished_requests():
        out, eco = h.step(s, reqs)
        steps += 1
        for co in eco.values():
            st = co.scheduler_stats.prefix_cache_stats if co.scheduler_stats else None
            if st is not None:
                hits += st.hits
                queries += st.queries
            if co.scheduler_stats is not None:
                peak = max(peak, round(co.scheduler_stats.kv_cache_usage * n_usable))
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
    tokens = {rid: list(r.all_token_ids) for rid, r in reqs.items()}
    who = "kvshare" if kvshare else "vllm"
    top = sorted(clock.per_method.items(), key=lambda kv: -kv[1])[:6]
    print(f"{who:8} per step: " + ", ".join(f"{k} {v / 1e3 / max(steps, 1):.1f} us" for k, v in top),
          file=sys.stderr)
    return dict(steps=steps, kv_ns=clock.ns, hasher_ns=hclock.ns, hits=hits, queries=queries,
                peak=peak, tokens=tokens, manager=type(s.kv_cache_manager).__mro__[1].__name__)


def lockstep(model_dir, args, sides: dict) -> dict:
    """Runs the sides (name -> kvshare flag, in this order) one scheduler step each in turn, so
    that the machine's noise (it comes in phases of seconds) falls on both alike; returns
    name -> figures.  The side going first in every step runs measurably slower (about 5-20%
    here), so callers alternate the order between repeats."""
    return run_in_lockstep({name: side(model_dir, flag, args) for name, flag in sides.items()})


def run_in_lockstep(gens: dict) -> dict:
    """Drives generators (name -> a side that yields once when built, then once per scheduler
    step, and returns its figures) one step each in turn until all are done; returns name ->
    figures.  The heap is frozen after every side is built, as ``EngineCore.__init__`` does
    once the engine is built."""
    import gc
    from vllm.utils.gc_utils import freeze_gc_heap

    for g in gens.values():
        next(g)
    freeze_gc_heap()
    out = {}
    while len(out) < len(gens):
        for name, g in gens.items():
            if name not in out:
                try:
                    next(g)
                except StopIteration as done:
                    out[name] = done.value
    gc.unfreeze()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--convs", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", choices=("gpt-oss", "gemma3", "llama4", "mla", "qwen3-next",
                                        "nemotron-h", "jamba"), default=None,
                    help="a hybrid model's KV-cache groups (default: one full-attention group)")
    ap.add_argument("--mamba-mode", choices=("all", "none", "align"), default="all",
                    help="mamba_cache_mode of a Mamba hybrid (none: prefix caching off)")
    ap.add_argument("--window", type=int, default=None, help="the model's window / chunk")
    ap.add_argument("--max-model-len", type=int, default=None)
    args = ap.parse_args()
    if args.quick:
        args.convs, args.turns, args.repeats, args.max_tokens = 8, 2, 1, 16
    from conftest import TINY_CONFIG

    model_dir = tempfile.mkdtemp(prefix="kvshare-bench-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(TINY_CONFIG, f)
    # Noise on these machines comes in phases of seconds: the two sides run in lockstep (one
    # scheduler step each in turn, which side goes first alternating between repeats, so
    # repeats come in pairs) and the ratio is the geometric mean over the repeats of each
    # repeat's ratio; per-side times are medians.
    repeats = max(2, args.repeats + args.repeats % 2)
    pairs = [lockstep(model_dir, args, {"vllm": False, "kvshare": True} if i % 2 == 0
                      else {"kvshare": True, "vllm": False})
             for i in range(repeats)]

    def per_step(r, key):
        return r[key] / 1e3 / r["steps"]

    def med(xs):
        return statistics.median(xs)

    def gmean(xs):
        return statistics.geometric_mean(xs)

    v_us = med([per_step(p["vllm"], "kv_ns") for p in pairs])
    k_us = med([per_step(p["kvshare"], "kv_ns") for p in pairs])
    vh_us = med([per_step(p["vllm"], "hasher_ns") for p in pairs])
    kh_us = med([per_step(p["kvshare"], "hasher_ns") for p in pairs])
    total = [(per_step(p["vllm"], "kv_ns") + per_step(p["vllm"], "hasher_ns"))
             / (per_step(p["kvshare"], "kv_ns") + per_step(p["kvshare"], "hasher_ns"))
             for p in pairs]
    manager = [per_step(p["vllm"], "kv_ns") / per_step(p["kvshare"], "kv_ns") for p in pairs]
    v, k = pairs[0]["vllm"], pairs[0]["kvshare"]
    for name, r in pairs[0].items():
        print(f"{name:8s} steps {r['steps']:5d}  hit rate {r['hits'] / max(r['queries'], 1):.4f}"
              f"  peak blocks {r['peak']}", file=sys.stderr)
    print("speedup per pair: " + ", ".join(f"{x:.2f}" for x in total)
          + "  (manager only: " + ", ".join(f"{x:.2f}" for x in manager) + ")",
          file=sys.stderr)
    out = {
        "bench": "vllm",
        "vllm_version": __import__("vllm").__version__,
        "model": args.model or "full-attention", "window": args.window,
        "mamba_cache_mode": args.mamba_mode if args.model in ("qwen3-next", "nemotron-h",
                                                                "jamba") else None,
        "managers": {"vllm": v["manager"], "kvshare": k["manager"]},
        "workload": {"conversations": args.convs, "turns": args.turns,
                     "system_tokens": args.system, "max_tokens": args.max_tokens,
                     "blocks": args.blocks, "block_size": 16},
        "steps": {"vllm": v["steps"], "kvshare": k["steps"]},
        "vllm_kv_us_per_step": round(v_us + vh_us, 2),
        "kvshare_kv_us_per_step": round(k_us + kh_us, 2),
        "speedup": round(gmean(total), 2),
        "vllm_manager_us_per_step": round(v_us, 2),
        "kvshare_manager_us_per_step": round(k_us, 2),
        "speedup_manager_only": round(gmean(manager), 2),
        "pairs": len(pairs),
        "vllm_hasher_us_per_step": round(vh_us, 2),
        "kvshare_hasher_us_per_step": round(kh_us, 2),
        "hit_rate": {"vllm": round(v["hits"] / max(v["queries"], 1), 4),
                     "kvshare": round(k["hits"] / max(k["queries"], 1), 4)},
        "peak_blocks": {"vllm": v["peak"], "kvshare": k["peak"]},
        "same_tokens": all(p["vllm"]["tokens"] == p["kvshare"]["tokens"] for p in pairs),
    }
    print(json.dumps(out))
    # The managers must agree on the workload: a difference is a failure, not a figure.
    if not (out["same_tokens"] and out["hit_rate"]["vllm"] == out["hit_rate"]["kvshare"]
            and out["peak_blocks"]["vllm"] == out["peak_blocks"]["kvshare"]):
        sys.exit("bench_vllm.py: the managers' tokens, hits or peak blocks differ")


if __name__ == "__main__":
    main()
