"""Two vLLM CPU engines on one Mooncake Store pool, with kvshare's manager and KV connector: the
README's "engines on a shared pool" example.

Engine a (a process of its own) answers the first turn of a conversation and stores its full
pages in the pool; engine b (another process) answers the second turn and loads a's pages from
the pool instead of computing them. Each prints ``engine X: cached N`` (vLLM's own
``num_cached_tokens``: b's are a's pages, from the pool) and the pages it loaded. The model is
the tests' tiny Llama, written to a temporary folder, or ``--model DIR``; both engines must use
the same model (its path is part of the pool's keys unless ``identity`` is set).

    pool_engines.py --master HOST:PORT [--model DIR]
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# 70 tokens: 2 full blocks of 32 (a block both vLLM 0.23's and 0.32's CPU attention take).
TURN1 = list(range(3, 67)) + [500] * 6


def engine(master: str, model: str, prompt: list) -> dict:
    os.environ["KVSHARE_VLLM"] = "1"
    # The engine core in this process, so the example can read the connector's counters.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, skip_tokenizer_init=True, enable_prefix_caching=True,
              enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=64 << 20,
              dtype="float32", block_size=32,
              kv_transfer_config=KVTransferConfig(
                  kv_connector="KvshareConnector",
                  kv_connector_module_path="kvshare_vllm.connector", kv_role="kv_both",
                  kv_load_failure_policy="recompute",
                  kv_connector_extra_config={"num_host_pages": 64,
                                             "pool": {"master": master,
                                                      "namespace": "example"}}))
    (o,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                        SamplingParams(max_tokens=8, temperature=0, detokenize=False))
    pool = get_kv_transfer_group().pool
    return {"cached": o.num_cached_tokens, "tokens": list(o.outputs[0].token_ids),
            "loaded": pool.io.stats.loads_ok, "stored": pool.io.stats.stores_ok}


def wait_for(master: str, seconds: float = 30.0) -> None:
    host, port = master.rsplit(":", 1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"no mooncake_master at {master}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True, help="mooncake_master's HOST:PORT")
    ap.add_argument("--model", help="a local model folder (default: a tiny Llama written here)")
    ap.add_argument("--engine-prompt", help=argparse.SUPPRESS)  # one engine process's prompt
    a = ap.parse_args()
    if a.engine_prompt:
        res = engine(a.master, a.model, json.loads(a.engine_prompt))
        print("RESULT " + json.dumps(res), flush=True)
        # A stored page lives in some client's memory (Mooncake's global segments): an engine
        # stays up, holding its share of the pool, until it is told to go.
        sys.stdin.readline()
        os._exit(0)  # the Mooncake client's threads
    wait_for(a.master)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    from engine_e2e import write_tiny_model

    tmp = tempfile.mkdtemp(prefix="kvshare-pool-example-")
    engines = []
    try:
        model = a.model or write_tiny_model(os.path.join(tmp, "tiny-llama"))
        prompt = TURN1
        for name in ("a", "b"):
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--master",
                                  a.master, "--model", model, "--engine-prompt",
                                  json.dumps(prompt)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            engines.append(p)
            res = None
            for line in p.stdout:  # vLLM's log lines, then the result
                if line.startswith("RESULT "):
                    res = json.loads(line[len("RESULT "):])
                    break
            if res is None:
                print(f"engine {name} failed ({p.wait()})", file=sys.stderr)
                return 1
            print(f"engine {name}: cached {res['cached']}, loaded {res['loaded']} pages from "
                  f"the pool, stored {res['stored']}, generated {res['tokens']}")
            prompt = prompt + res["tokens"] + [700] * 20   # the next turn, on the other engine
    finally:
        for p in engines:
            if p.poll() is None:
                p.stdin.close()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
