"""Runs inside a fresh network namespace (``unshare -n``, loopback up): a real mooncake_master
on 127.0.0.1, two vLLM CPU engines with kvshare's manager and KV connector on it (each loads
what the other stored) and a reference engine with vLLM's own manager (vllm_engine.py), then a
conversation that moves between the engines, the engine holding pages killed, and the master
killed. Prints one JSON object with every reply.

    vllm_driver.py MOONCAKE_MASTER_BINARY PYTHON MODEL_DIR [measure]

With ``measure``: instead, load time per page from the pool against computing it (docs/
performance.md): a stores prompts of 25 pages, b runs each again (its pages from the pool),
then fresh prompts of the same length; prints the times.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from driver import METRICS, RPC, wait_port  # noqa: E402


class Engine:
    def __init__(self, python, model, master, name, *extra):
        self.name = name
        self.block = None
        self.p = subprocess.Popen([python, os.path.join(HERE, "vllm_engine.py"), model, master,
                                   *extra],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        while True:  # vLLM logs to stdout too (passed on to stderr): replies start '{"op"
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit(f"engine {name} did not start")
            if line.startswith('{"op": "ready"'):
                self.block = json.loads(line)["block"]
                return
            sys.stderr.write(line)

    def generate(self, prompts, max_tokens=8):
        self.p.stdin.write(json.dumps({"op": "generate", "prompts": prompts,
                                       "max_tokens": max_tokens}) + "\n")
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit(f"engine {self.name} died")
            if line.startswith('{"op": "generate"'):
                return dict(json.loads(line), engine=self.name)
            sys.stderr.write(line)

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def close(self):
        if self.p.poll() is not None:
            return
        try:
            self.p.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.p.stdin.flush()
            self.p.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


def ids(seed, n):
    return [(seed * 7919 + 31 * i) % 2000 + 3 for i in range(n)]


def measure(a, b, rounds=5, pages=25):
    """Per page: b's worker time loading from the pool (batch_get_into, verification, the copy
    into every layer's block), and b's wall time for a fresh prompt of ``pages`` pages with one
    output token (prefill), against the same prompt with all but its last page loaded."""
    n = pages * a.block + 1
    prompts = [ids(100 + r, n) for r in range(rounds)]
    a.generate(prompts, max_tokens=1)                              # computed and stored on a
    b.generate([ids(99, n)], max_tokens=1)                         # b warmed up
    before = b.generate([], max_tokens=1)["pool"]
    hit = b.generate(prompts, max_tokens=1)                        # from the pool
    fresh = b.generate([ids(200 + r, n) for r in range(rounds)], max_tokens=1)
    loaded = hit["pool"]["loads_ok"] - before["loads_ok"]
    return {"pages_per_prompt": pages, "block": a.block, "rounds": rounds, "pages_loaded": loaded,
            "load_ms_per_page": 1e3 * (hit["pool"]["load_s"] - before["load_s"]) / loaded,
            "prefill_ms_per_page": 1e3 * sum(fresh["s"]) / (rounds * pages),
            "request_ms_fresh": [1e3 * x for x in fresh["s"]],
            "request_ms_from_pool": [1e3 * x for x in hit["s"]],
            "cached_from_pool": hit["cached"], "page_bytes": hit["pool"]["page_bytes"]}


def main():
    binary, python, model = sys.argv[1], sys.argv[2], sys.argv[3]
    measuring = sys.argv[4:] == ["measure"]
    master = subprocess.Popen(
        [binary, f"--rpc_port={RPC}", f"--metrics_port={METRICS}",
         "--enable_http_metadata_server=false", "--enable_kv_events=false", "--enable_ha=false",
         "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1",
         "--http_metadata_server_host=127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engines = []
    out = {"steps": [], "block": None}
    steps = out["steps"]
    try:
        wait_port(RPC, master)
        addr = f"127.0.0.1:{RPC}"
        a = Engine(python, model, addr, "a")
        engines.append(a)
        b = Engine(python, model, addr, "b")
        engines.append(b)
        out["block"] = a.block
        if measuring:
            out = measure(a, b)
            return
        system = ids(1, 64)
        t1 = system + ids(2, 6)                                   # 70 tokens
        s = a.generate([t1])                                      # computed on a, stored
        steps.append(s)
        t2 = t1 + s["tokens"][0] + ids(3, 20)                     # 98 tokens
        s = b.generate([t2])                                      # b: a's pages from the pool
        steps.append(s)
        m = Engine(python, model, addr, "m", "mp")                # engine core in a process
        engines.append(m)
        out["separate"] = m.generate([t2])                        # a's and b's pages
        m.close()
        c1 = ids(4, 100)                                          # a second conversation
        s = a.generate([c1])
        steps.append(s)
        a.kill()                                                  # the holder of c1's pages
        out["a_killed"] = True
        c2 = c1 + s["tokens"][0] + ids(5, 10)
        steps.append(b.generate([c2]))                            # listed, unreadable: computed
        master.send_signal(signal.SIGKILL)
        master.wait()
        out["master_killed"] = True
        t3 = ids(6, 80)
        steps.append(b.generate([t3]))                            # no master: computed
        ref = Engine(python, model, "none", "ref")
        engines.append(ref)
        out["reference"] = ref.generate([t1, t2, c1, c2, t3])
        # Prefill time of fresh prompts on the reference engine (vLLM's own manager), for the
        # load-against-recompute comparison: 1 page and 25 pages, no prefix hit.
        out["prefill"] = ref.generate([ids(7, 16), ids(8, 400)], max_tokens=1)
    finally:
        for e in engines:
            e.close()
        if master.poll() is None:
            master.kill()
            master.wait()
        print(json.dumps(out))


if __name__ == "__main__":
    main()
