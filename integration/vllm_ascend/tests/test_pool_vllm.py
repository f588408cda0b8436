"""The pool tier from kvshare's vLLM KV connector, in vLLM's real CPU engine: a real
mooncake_master bound to 127.0.0.1 and two vLLM engine processes, each with kvshare's manager
and KV connector (its own cache) on that master, inside a fresh network namespace
(pool_real/vllm_driver.py). A conversation started on engine a continues on engine b, and b
loads a's pages from the pool (as does a third engine whose engine core runs in a process of
its own); every request's tokens equal those of a reference engine with
vLLM's own manager (greedy); then the engine holding a conversation's pages is killed and then
the master: b computes instead, with the same tokens, and counts the failures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_pool_mooncake import _mooncake_venv, _namespace_reason

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def run(installed, tmp_path_factory):
    reason = _namespace_reason()
    if reason:
        print(f"pool vLLM-engine test skipped: {reason}")
        pytest.skip(reason)
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
    from engine_e2e import write_tiny_model

    model = write_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")))
    venv = _mooncake_venv()
    binary = os.path.join(venv, "kvs-path", "mooncake", "mooncake_master")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([installed,
                                                       os.path.join(venv, "kvs-path")]))
    env.setdefault("MC_RPC_TIMEOUT_MS", "3000")
    env.setdefault("MC_RPC_CONNECT_TIMEOUT_MS", "3000")
    env.setdefault("MC_TCP_STATUS_TIMEOUT_SEC", "5")
    cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
           sys.executable, os.path.join(HERE, "pool_real", "vllm_driver.py"), binary,
           sys.executable, model]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for s in out["steps"]:
        print({k: s[k] for k in ("engine", "cached", "pool", "s")})
    print(out["reference"]["cached"], out["prefill"]["s"])
    return out


def test_tokens_equal_vllms_own_manager(run):
    got = [s["tokens"][0] for s in run["steps"]]
    assert got == run["reference"]["tokens"]


def test_a_conversation_continues_on_another_engine_from_the_pool(run):
    """b finds a's pages under the same store keys."""
    first, on_b = run["steps"][:2]
    assert first["pool"]["manager"] == "KvshareKVCacheManager"
    assert on_b["pool"]["manager"] == "KvshareKVCacheManager"
    # a computed the first turn's 70 prompt tokens and 7 of its 8 output tokens: its full
    # pages (4 of 16 tokens, 2 of 32) are stored.
    pages = 77 // run["block"]
    assert first["cached"] == [0]
    assert first["pool"]["stores_ok"] >= pages
    # b's prefix hit is a's full pages, loaded from the pool.
    assert on_b["cached"] == [pages * run["block"]]
    assert on_b["pool"]["hit_pages"] == pages and on_b["pool"]["loads_ok"] == pages
    assert not on_b["pool"]["load_failures"]


def test_an_engine_core_in_its_own_process_loads_from_the_pool(run):
    """vLLM's default: the engine core (scheduler, connector, Mooncake client) in a process of
    its own. A fresh engine asked the second turn loads its full pages, which a and b stored,
    with the reference's tokens; it then leaves, and a's next stores all land."""
    m = run["separate"]
    assert m["cached"] == [(98 - 1) // run["block"] * run["block"]], m
    assert m["tokens"][0] == run["reference"]["tokens"][1]
    after = run["steps"][2]["pool"]
    assert after["stores_ok"] > run["steps"][0]["pool"]["stores_ok"], after
    assert after["store_failures"] == {}, after


def test_a_killed_holder_and_master_cost_recomputation(run):
    assert run["a_killed"] and run["master_killed"]
    before, after_holder, after_master = run["steps"][1], run["steps"][3], run["steps"][4]
    # The pool lists the dead holder's pages but cannot read those in its segment (Mooncake
    # places a value in any client's segment, so some may live in b's): each such load fails,
    # is counted, and vLLM computes from the first failed block (kv_load_failure_policy
    # "recompute"); the tokens are the reference's (test_tokens_equal_vllms_own_manager).
    # Where the values live is Mooncake's choice (measured: 3 of the 6 pages in a's segment):
    # every listed page is either loaded or counted as a failed transfer.
    new = after_holder["pool"]["hit_pages"] - before["pool"]["hit_pages"]
    loaded = after_holder["pool"]["loads_ok"] - before["pool"]["loads_ok"]
    failed = after_holder["pool"]["load_failures"].get("transfer", 0)
    assert new > 0 and loaded + failed == new, (new, loaded, failed)
    assert after_holder["pool"]["failures_seen"] == after_holder["pool"]["load_failures"]
    # Asked once: the failed keys count as missing in the scheduler (no lookup-load loop): at
    # most the full pages of the second conversation's 100 + 7 computed tokens.
    assert after_holder["pool"]["hit_pages"] - before["pool"]["hit_pages"] <= 107 // run["block"]
    # The master gone: the lookup fails, the breaker opens, the prompt is computed.
    assert after_master["cached"] == [0]
    assert after_master["pool"]["breaker_trips"] >= 1


def test_readme_block_runs_verbatim():
    """README.md's "engines on a shared pool" block, run as written from the repository root,
    inside a fresh network namespace (the Mooncake client's transfer sockets listen on every
    interface)."""
    import re

    reason = _namespace_reason()
    if reason:
        pytest.skip(reason)
    root = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    m = re.search(r"<!-- test: pool-engines -->\s*```bash\n(.*?)```", readme, re.S)
    assert m, "README.md lost its 'pool-engines' block"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "KVSHARE_VLLM", "KVSHARE_VLLM_OPS", "VLLM_LOGGING_LEVEL")}
    res = subprocess.run(["unshare", "-n", "sh", "-c",
                          'ip link set lo up && exec bash -euo pipefail -c "$1"', "sh",
                          m.group(1)], cwd=root, env=env, capture_output=True, text=True,
                         timeout=1200)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("engine ")]
    assert len(lines) == 2, out[-3000:]
    assert lines[0].startswith("engine a: cached 0, loaded 0 pages"), lines
    assert lines[1].startswith("engine b: cached 64, loaded 2 pages"), lines


def _config(pool=None, policy="recompute", tp=1, pp=1, caching=True, cache_dtype="auto",
            connector="KvshareConnector"):
    from types import SimpleNamespace as NS

    extra = {"num_host_pages": 8}
    if pool is not None:
        extra["pool"] = pool
    return NS(kv_transfer_config=NS(kv_connector=connector, kv_connector_extra_config=extra,
                                    kv_load_failure_policy=policy),
              parallel_config=NS(tensor_parallel_size=tp, pipeline_parallel_size=pp),
              cache_config=NS(enable_prefix_caching=caching, cache_dtype=cache_dtype),
              model_config=NS(model="/m", revision=None, dtype="float32"))


@pytest.mark.parametrize("kw, why", [
    (dict(pool={}), "master"),
    (dict(pool={"master": "127.0.0.1"}), "master"),
    (dict(pool={"master": "h:1", "store": "sometimes"}), "store"),
    (dict(pool={"master": "h:1", "masterr": 1}), "unknown pool settings"),
    (dict(pool={"master": "h:1"}, policy="fail"), "kv_load_failure_policy"),
    (dict(pool={"master": "h:1"}, tp=2), "tensor and pipeline"),
    (dict(pool={"master": "h:1"}, pp=2), "tensor and pipeline"),
    (dict(pool={"master": "h:1"}, caching=False), "prefix caching"),
    (dict(pool={"master": "h:1"}, cache_dtype="fp8"), "fp8"),
    (dict(pool={"master": "h:1", "mac_key": "zz"}), "hex"),
    (dict(pool={"master": "h:1", "batch": 0}), "batch"),
    (dict(pool="h:1"), "dict"),
])
def test_configurations_the_pool_cannot_serve_are_refused(kw, why):
    from kvshare_vllm.pool_tier import pool_settings

    with pytest.raises(ValueError, match=why):
        pool_settings(_config(**kw))


def test_pool_settings_name_the_layout_and_model():
    from kvshare_vllm.pool_tier import pool_settings

    assert pool_settings(_config()) is None
    assert pool_settings(_config(pool={"master": "h:1"}, connector="Other")) is None
    s = pool_settings(_config(pool={"master": "h:1", "mac_key": "ab"}))
    assert s["cache"]["identity"] == "vllm|/m@|float32|auto|vllm-cpu"
    assert s["cache"]["store"] == "write_through" and s["mac_key"] == b"\xab"
