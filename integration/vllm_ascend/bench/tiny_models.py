"""The tiny models the engine runs use: a 4-layer Llama (``MODEL``; optionally with sliding-window
layers, gpt-oss's layout) whose random weights ``write_tiny_model`` writes, and a tiny
Qwen3-Next (``QWEN3_NEXT``; vLLM's seeded "dummy" weights)."""

from __future__ import annotations

import json
import os

MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def write_tiny_model(path: str, seed: int = 0, sliding_window: int | None = None) -> str:
    """Writes ``config.json`` + ``model.safetensors`` of the tiny Llama into ``path``.
    ``sliding_window``: a hybrid model (gpt-oss's layout, Mistral's ``layer_types``): even
    layers attend to the last ``sliding_window`` tokens, odd layers to all of them; vLLM then
    builds two KV-cache groups (same weights as the full-attention model)."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    config = dict(MODEL)
    if sliding_window:
        config["sliding_window"] = sliding_window
        config["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                                 for i in range(MODEL["num_hidden_layers"])]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    g = torch.Generator().manual_seed(seed)
    hidden, inter, vocab = MODEL["hidden_size"], MODEL["intermediate_size"], MODEL["vocab_size"]
    head_dim = hidden // MODEL["num_attention_heads"]
    kv = MODEL["num_key_value_heads"] * head_dim

    def normal(*shape, std):
        return (torch.randn(*shape, generator=g) * std).contiguous()

    # Embeddings of unit scale and q/k projections of 0.15 give attention scores of a few units:
    # softmax rows that are far from uniform, so the KV a block table points at matters.
    w = {"model.embed_tokens.weight": normal(vocab, hidden, std=1.0),
         "lm_head.weight": normal(vocab, hidden, std=0.1),
         "model.norm.weight": torch.ones(hidden)}
    for i in range(MODEL["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(hidden, hidden, std=0.15)
        w[p + "self_attn.k_proj.weight"] = normal(kv, hidden, std=0.15)
        w[p + "self_attn.v_proj.weight"] = normal(kv, hidden, std=0.05)
        w[p + "self_attn.o_proj.weight"] = normal(hidden, hidden, std=0.05)
        w[p + "mlp.gate_proj.weight"] = normal(inter, hidden, std=0.05)
        w[p + "mlp.up_proj.weight"] = normal(inter, hidden, std=0.05)
        w[p + "mlp.down_proj.weight"] = normal(hidden, inter, std=0.05)
        w[p + "input_layernorm.weight"] = torch.ones(hidden)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    save_file(w, os.path.join(path, "model.safetensors"))
    return path


# The tiny Qwen3-Next: layers 0-2 gated delta net (linear attention, vLLM's CPU GDN kernels),
# layer 3 full attention; dense MLPs except layer 3's MoE (vLLM needs one MoE layer).  The CPU
# kernels want head sizes that are multiples of 32 (vLLM 0.32's gated delta net: linear-attention
# heads of 128), bf16 activations and an f32 SSM state.
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "vocab_size": MODEL["vocab_size"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "decoder_sparse_step": 1,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "num_experts_per_tok": 2, "num_experts": 4, "norm_topk_prob": True,
    "mlp_only_layers": [0, 1, 2], "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16", "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                        "rope_type": "default"},
    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
}


def write_qwen3_next(path: str) -> str:
    """Writes the tiny Qwen3-Next's ``config.json`` (weights: vLLM's seeded "dummy" loader)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(QWEN3_NEXT, f)
    return path
