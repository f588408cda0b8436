"""Shared fixtures: a local config.json for a tiny model, and vLLM Schedulers built with vLLM's
own KVCacheManager or with kvshare's (the plugin's swap applied around construction)."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import pytest  # noqa: E402

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    return str(d)


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """A folder with the binding and the plugin installed as real distributions (the plugin's
    ``vllm.general_plugins`` entry point included), for subprocesses' ``PYTHONPATH``."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
    from engine_e2e import install_plugin

    return install_plugin(str(tmp_path_factory.mktemp("site")))
