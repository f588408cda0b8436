"""Prefix hits at 128-token blocks with and without a match unit, in the real vLLM CPU engine.

``python subpage_e2e.py [--unit 16] [--convs 8] [--turns 4] [--sliding-window W] [--json]``
(in a vLLM venv, with ``KVSHARE_LIB`` / ``KVSHARE_HEADER`` set; the plugin is installed into a
scratch folder) runs ``engine_e2e``'s multi-turn chat once per configuration, each in its own
process: vLLM's manager at block 128, kvshare's at block 128 with whole-block hits and with
``KVSHARE_VLLM_MATCH_UNIT``, and vLLM's manager at the CPU kernel's smallest block (16 on
vLLM 0.23, 32 on 0.32).  ``--sliding-window W``: the hybrid model (even layers slide over the
last W tokens: two KV-cache groups, vLLM 0.23).  It prints vLLM's
own prefix-cache counters (hit tokens over looked-up tokens), the tokens recomputed, and
whether each run generated vLLM's block-128 tokens.  Exits non-zero when a run's tokens
differ.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import engine_e2e  # noqa: E402


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", type=int, default=16)
    ap.add_argument("--convs", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=200)
    ap.add_argument("--sliding-window", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    small = engine_e2e.kernel_block_size()
    work = dict(convs=a.convs, turns=a.turns, system_tokens=a.system_tokens, user_tokens=24,
                output_tokens=10, max_model_len=2048, block_size=128, extras=False,
                sliding_window=a.sliding_window)
    runs = {
        "vLLM, block 128": dict(kvshare=False),
        "kvshare, block 128": dict(kvshare=True),
        f"kvshare, block 128, unit {a.unit}": dict(kvshare=True, match_unit=a.unit),
        f"vLLM, block {small}": dict(kvshare=False, block_size=small),
    }
    with tempfile.TemporaryDirectory(prefix="kvshare-subpage-") as tmp:
        model = engine_e2e.write_tiny_model(os.path.join(tmp, "tiny-llama"),
                                            sliding_window=a.sliding_window)
        env = dict(os.environ, PYTHONPATH=engine_e2e.install_plugin(os.path.join(tmp, "site")))
        res = {name: engine_e2e.run_in_subprocess(dict(work, model_dir=model, **cfg),
                                                  env=env)[0]
               for name, cfg in runs.items()}
    ref = res["vLLM, block 128"]["tokens"]
    rows = []
    for name, r in res.items():
        q, h = r["prefix_queries"], r["prefix_hits"]
        rows.append(dict(run=name, queried=q, hits=h, hit_rate=h / q if q else 0.0,
                         recomputed=q - h, same_tokens=r["tokens"] == ref))
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        model = f", sliding window {a.sliding_window} + full" if a.sliding_window else ""
        print(f"{a.convs} conversations x {a.turns} turns, {a.system_tokens}-token system "
              f"prompt, 24-token messages, 10 generated tokens a turn{model}")
        print(f"{'run':30} {'looked up':>10} {'hit':>8} {'hit rate':>9} {'recomputed':>11} "
              f"{'tokens = vLLM 128':>18}")
        for w in rows:
            print(f"{w['run']:30} {w['queried']:10.0f} {w['hits']:8.0f} {w['hit_rate']:9.3f} "
                  f"{w['recomputed']:11.0f} {str(w['same_tokens']):>18}")
    return 0 if all(w["same_tokens"] for w in rows[:3]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
