#!/usr/bin/env python3
"""The step-time cost of KV connectors' external tokens: vLLM 0.23.0's Scheduler with vLLM's
offloading connector (CPU spec; the worker side is the fake worker of
``tests/test_connector_lockstep.py``, completing load and store jobs one step after they are
issued) and vLLM's KVCacheManager vs kvshare's, in lockstep in one run, and prints a final
single-line JSON object.

Workload: ``--prompts`` distinct prompts of ``--prompt-len`` tokens run once (the connector
stores their blocks to the CPU tier); both device prefix caches are reset; then ``--waves``
times the same prompts plus a token or more run again, with a reset after each: each is
admitted with all of its prompt blocks as external tokens loaded asynchronously
(``delay_cache_blocks``, WAITING_FOR_REMOTE_KVS, ``cache_blocks`` when the load lands), then
computes its last token and samples ``--max-tokens`` tokens (1 by default, so the timed steps
are the external-token path: admission, load, caching, one token).  Only those waves are
timed, not the steps that complete the last stores.

Timed per side (``bench_vllm.instrument``): the manager's methods the scheduler calls
(``manager``), and the whole scheduler step (``schedule`` + ``update_from_output``, connector
and manager included; ``step``).  Both sides keep vLLM's block hasher (the connector reads
``block_hashes``), so it is not counted.  Ratios are kvshare / vLLM (below 1: kvshare is
cheaper), geometric means over the repeats, the side going first alternating.

Usage: bench_connector.py [--repeats R] [--prompts N] [--prompt-len L] [--max-tokens T]
                          [--waves W] [--blocks B]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_vllm  # noqa: E402  (sets sys.path and the environment as the other benches)


def side(model_dir, kvshare: bool, args):
    import harness as h
    import test_connector_lockstep as t
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    s = h.make_scheduler(model_dir, kvshare=kvshare, num_blocks=args.blocks,
                         max_num_seqs=args.prompts, max_num_batched_tokens=8192,
                         kv_transfer=t.offloading_config(args.blocks * 2))
    worker = t.OffloadingWorker(load_delay=1, store_delay=1)
    clock = bench_vllm.Clock()
    bench_vllm.instrument(s.kv_cache_manager, clock)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 30000) for _ in range(args.prompt_len)]
               for _ in range(args.prompts)]
    reqs = {}
    timed = dict(step_ns=0, steps=0, waiting_steps=0)

    def one_step(count: bool):
        t0 = time.perf_counter_ns()
        o = s.schedule()
        ids = list(o.num_scheduled_tokens)
        sampled = [[h.token_for(r, reqs[r].num_tokens)]
                   if reqs[r].num_computed_tokens >= reqs[r].num_tokens else [] for r in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled, logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=[],
                                kv_connector_output=worker.after(o))
        s.update_from_output(o, mro)
        if count:
            timed["step_ns"] += time.perf_counter_ns() - t0
            timed["steps"] += 1
            timed["waiting_steps"] += any(q.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                                          for q in s.requests.values())

    yield
    kept = (0, {})
    for wave in range(1 + args.waves):
        for k, p in enumerate(prompts):
            rid = f"w{wave}r{k}"
            reqs[rid] = h.make_request(rid, p + [7] * wave, max_tokens=args.max_tokens)
            s.add_request(reqs[rid])
        if wave == 1:
            clock.ns, clock.per_method = 0, {}
        while s.has_unfinished_requests():
            one_step(bool(wave))
            yield
        kept = (clock.ns, dict(clock.per_method))  # the stores' steps below are not timed
        for _ in range(2):  # the last stores complete
            one_step(False)
            yield
        assert s.reset_prefix_cache()
        clock.ns, clock.per_method = kept
    return dict(manager_ns=clock.ns, step_ns=timed["step_ns"], steps=timed["steps"],
                waiting_steps=timed["waiting_steps"], loads=worker.loads, stores=worker.stores,
                per_method={k: v for k, v in clock.per_method.items()},
                tokens={r: list(q.all_token_ids) for r, q in reqs.items()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--waves", type=int, default=4, help="timed waves (each all external)")
    args = ap.parse_args()
    import tempfile

    import conftest

    model_dir = tempfile.mkdtemp()
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(conftest.TINY_CONFIG, f)
    mgr_ratios, step_ratios, rows = [], [], []
    for rep in range(args.repeats):
        order = ("vllm", "kvshare") if rep % 2 == 0 else ("kvshare", "vllm")
        res = bench_vllm.run_in_lockstep(
            {name: side(model_dir, name == "kvshare", args) for name in order})
        v, k = res["vllm"], res["kvshare"]
        assert v["tokens"] == k["tokens"], "the two sides produced different tokens"
        assert v["loads"] == k["loads"] == args.prompts * args.waves
        assert v["steps"] == k["steps"]
        mgr_ratios.append(k["manager_ns"] / v["manager_ns"])
        step_ratios.append(k["step_ns"] / v["step_ns"])
        rows.append(dict(first=order[0], steps=v["steps"], waiting_steps=v["waiting_steps"],
                         vllm_manager_us_per_step=round(v["manager_ns"] / 1e3 / v["steps"], 1),
                         kvshare_manager_us_per_step=round(k["manager_ns"] / 1e3 / k["steps"], 1),
                         vllm_step_us=round(v["step_ns"] / 1e3 / v["steps"], 1),
                         kvshare_step_us=round(k["step_ns"] / 1e3 / k["steps"], 1),
                         vllm_us={m: round(n / 1e3) for m, n in v["per_method"].items()},
                         kvshare_us={m: round(n / 1e3) for m, n in k["per_method"].items()}))
        print(json.dumps(rows[-1]), file=sys.stderr)

    def gmean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    print(json.dumps(dict(prompts=args.prompts, prompt_len=args.prompt_len,
                          max_tokens=args.max_tokens, repeats=args.repeats,
                          external_tokens_per_prompt=args.prompt_len // 16 * 16,
                          manager_ratio_kvshare_over_vllm=round(gmean(mgr_ratios), 3),
                          step_ratio_kvshare_over_vllm=round(gmean(step_ratios), 3),
                          runs=rows)))


if __name__ == "__main__":
    main()
