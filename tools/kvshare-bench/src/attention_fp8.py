# Prepended by `kvshare-bench attention` to attention_vllm.py and attention_prefill.py: what vLLM's
# CPU kernel makes of an fp8 cache (kv_cache_dtype fp8_e4m3 / fp8_e5m2, per-tensor scales 1), and
# the bound its output and kvshare's must meet when both hold the same stored codes.
import torch
def fp8_misread(ops, fmt, code_type, isa, dt, ps):
    """How vLLM's kernel reads each finite fp8 code: a one-token sequence whose value row holds
    every code (keys and query zero), so the output is the values as read. Returns the codes read
    as another value and the largest error."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = torch.where(torch.isfinite(codes.view(code_type).float()), codes, torch.zeros_like(codes))
    want = codes.view(code_type).float()
    kv1 = torch.zeros(1, 2, ps, 256, dtype=torch.uint8)
    k1, v1 = kv1.view(1, 2, 2 * ps, 128).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(torch.zeros(1, 2, 128, dtype=dt), want.view(1, 2, 128).to(dt), k1, v1,
                                   torch.tensor([0]), isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype=fmt)
    q1, o1 = torch.zeros(1, 2, 128, dtype=dt), torch.empty(1, 2, 128, dtype=dt)
    qsl1, sl1 = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    meta1 = ops.cpu_attn_get_scheduler_metadata(1, 2, 2, 128, sl1, dt, qsl1, True, -1, isa, True)
    ops.cpu_attention_with_kv_cache(q1, k1, v1, o1, qsl1, sl1, 1.0, True, None, (-1, -1),
                                    torch.zeros(1, 1, dtype=torch.int32), 0.0, meta1, None,
                                    k_scale=1.0, v_scale=1.0, kv_cache_dtype=fmt)
    err = (o1.float().view(-1) - want).abs()
    return int((err > 0).sum()), err.max().item()
def fp8_bound(D, q1, vmax, delta, dim):
    """The bound on |vLLM - kvshare| for rows whose largest sum_j |q_j| |k_tj| over their keys is
    D [rows, hk, g], with sum_j |q_j| = q1 [rows, hk, g] and max_t |v_t| over a kv head's
    channels vmax [hk], both sides reading the same stored codes (docs/quantized-kv.md,
    "Accuracy", with exact stored values, for each side): rounding the query and the
    probabilities to bf16 (u = 2^-8 relative each) moves a score by at most u s D and the weights
    by a factor within e^(2 u s D) and 1 + u; f32 arithmetic adds 2^-14 max |v|. vLLM's side
    also reads some codes as another value (fp8_misread: at most delta off), which moves its
    scores by s delta q1 more and its values by delta. The caller adds each side's output
    rounding."""
    u, s = 2.0 ** -8, dim ** -0.5
    ours = torch.expm1(2 * u * s * D) + u + 2.0 ** -14
    theirs = torch.expm1(2 * (u * s * D + s * delta * q1)) + u + 2.0 ** -14
    return ((ours + theirs) * vmax[None, :, None] + delta).max().item()
