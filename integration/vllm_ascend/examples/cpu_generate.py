"""vLLM's CPU engine generating with kvshare's KV-cache manager (``KVSHARE_VLLM=1``) and
kvshare's attention (``KVSHARE_VLLM_OPS=1``): the end-to-end example of docs/vllm.md.

Four requests share a 256-token system prompt; the first one's full blocks are cached, so the
other three print ``cached 256`` (vLLM's own ``num_cached_tokens``). The model is the tests'
tiny Llama (``bench/engine_e2e.py``), written to a temporary folder; point ``--model`` at any
local model folder instead (then prompts can be text, with its tokenizer).
"""

import argparse
import os
import shutil
import sys
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a local model folder (default: a tiny Llama written here)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    from engine_e2e import write_tiny_model

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tmp = tempfile.mkdtemp(prefix="kvshare-example-")
    try:
        model = a.model or write_tiny_model(os.path.join(tmp, "tiny-llama"))
        llm = LLM(model=model, skip_tokenizer_init=True, enable_prefix_caching=True,
                  enforce_eager=True, max_model_len=1024, max_num_batched_tokens=256,
                  kv_cache_memory_bytes=64 << 20, dtype="float32")
        system = list(range(3, 259))
        first = llm.generate([TokensPrompt(prompt_token_ids=system + [1000] * 8)],
                             SamplingParams(max_tokens=8, temperature=0, detokenize=False))
        rest = llm.generate([TokensPrompt(prompt_token_ids=system + [1000 + i] * 8)
                             for i in range(1, 4)],
                            SamplingParams(max_tokens=8, temperature=0, detokenize=False))
        for i, o in enumerate(first + rest):
            print(f"request {i}: cached {o.num_cached_tokens}, generated "
                  f"{list(o.outputs[0].token_ids)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
