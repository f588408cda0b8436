"""One vLLM CPU engine process for the pool tier's real-engine test, driven by JSON lines on
stdin (one reply line per command):

* ``{"op": "generate", "prompts": [[ids...], ...], "max_tokens": n}``: greedy generation, one
  request after the other; replies with each request's tokens and vLLM's ``num_cached_tokens``
  (local and external prefix hits), and the connector's pool counters.
* ``{"op": "exit"}``.

The engine's block is the smallest vLLM's CPU attention kernel takes (16 on vLLM 0.23, 32 on
0.32), announced in its ``ready`` line.

    vllm_engine.py MODEL_DIR MASTER|none [mp]

With a master: kvshare's manager and KV connector with a pool tier on that ``mooncake_master``
(``write_through``, a deployment key); with ``none``: vLLM's own manager and no connector (the
reference). With ``mp``: the engine core in a process of its own (vLLM's default), where this
process cannot read the connector's counters (replies carry none).  The manager's class is
named in each reply.
Each reply also has each request's wall time (``s``).
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

BLOCKS = 256


def main():
    model_dir, master = sys.argv[1], sys.argv[2]
    separate = "mp" in sys.argv[3:]
    pooled = master != "none"
    os.environ["KVSHARE_VLLM"] = "1" if pooled else "0"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if separate else "0"
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from engine_e2e import block_bytes, kernel_block_size
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    block = kernel_block_size()
    extra = {}
    if pooled:
        # Every engine with the deployment key: values carry HMAC-SHA-256 digests under it.
        pool = {"master": master, "namespace": "kvs-test", "store": "write_through",
                "cooldown_s": 60.0, "mac_key": "6b76732d74657374"}
        if separate:
            # A reader that leaves mid-run mounts no memory: whether its engine core process
            # closes its client before it is terminated depends on timing, and until the
            # master's client TTL passes it would keep placing values in a dead segment.
            pool["segment_bytes"] = 0
        extra["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvshareConnector", kv_connector_module_path="kvshare_vllm.connector",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config={"num_host_pages": 64,
                                       "pool": pool})
    llm = LLM(model=model_dir, skip_tokenizer_init=True, enable_prefix_caching=True,
              max_model_len=512, dtype="float32", seed=0, enforce_eager=True, max_num_seqs=4,
              max_num_batched_tokens=512, block_size=block,
              kv_cache_memory_bytes=BLOCKS * block_bytes(block), **extra)
    counted = pooled and not separate
    core = None if separate else llm.llm_engine.engine_core.engine_core
    worker = None
    if counted:
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        worker = get_kv_transfer_group()
    sched = core.scheduler.connector if counted else None

    def counters():
        if not counted:
            return {}
        s, w = sched.pool, worker.pool
        return {"hit_pages": s.hit_pages, "lookups": s.io.stats.lookups,
                "lookups_skipped": s.io.stats.lookups_skipped, "breaker_trips": s.io.breaker.trips,
                "stores_shipped": s.stores_shipped, "stores_skipped": s.stores_skipped,
                "loads_ok": w.io.stats.loads_ok, "load_failures": w.io.stats.load_failures,
                "stores_ok": w.io.stats.stores_ok, "store_failures": w.io.stats.store_failures,
                "load_s": w.load_s, "page_bytes": w.page_bytes, "failures_seen": s.load_failures,
                "kvshare": core.scheduler.kv_cache_manager.cache.pool_stats(),
                "manager": type(core.scheduler.kv_cache_manager).__name__}

    print(json.dumps({"op": "ready", "block": block}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        sp = SamplingParams(max_tokens=cmd.get("max_tokens", 8), temperature=0.0,
                            ignore_eos=True, detokenize=False)
        tokens, cached, secs = [], [], []
        for p in cmd["prompts"]:
            t0 = time.perf_counter()
            (o,) = llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)
            secs.append(time.perf_counter() - t0)
            tokens.append(list(o.outputs[0].token_ids))
            cached.append(o.num_cached_tokens)
        print(json.dumps({"op": cmd["op"], "tokens": tokens, "cached": cached, "s": secs,
                          "pool": counters()}), flush=True)
    if separate:
        llm.llm_engine.engine_core.shutdown()  # the engine core process, its client with it
    os._exit(0)  # the Mooncake client's threads; close() after a dead master can hang


if __name__ == "__main__":
    main()
