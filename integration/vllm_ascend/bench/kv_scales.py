"""Per-tensor KV scales in ``engine_e2e``'s in-process engine: set them on every attention
layer as a checkpoint would, read them back, or make kvshare's attention read its caches with
wrong ones (to show a comparison detects it)."""

from __future__ import annotations


def wrong_kv_scales(fault: str) -> None:
    """Makes kvshare's attention read its caches with wrong per-tensor scales (``fault``: "swap"
    or "double", see DEFAULTS), its write left alone."""
    from kvshare_vllm import ops

    attend = ops.KvCaches.attend

    def wrong(self, *a, k_scale=1.0, v_scale=1.0, **k):
        if fault == "swap":
            k_scale, v_scale = v_scale, k_scale
        elif fault == "double":
            k_scale = 2 * k_scale
        else:
            raise ValueError(f"engine_e2e: kv_scale_fault {fault!r} is not swap or double")
        return attend(self, *a, k_scale=k_scale, v_scale=v_scale, **k)
    ops.KvCaches.attend = wrong


def set_kv_scales(llm, k_scale: float, v_scale: float) -> None:
    """Gives every attention layer of the in-process engine these per-tensor scales, as a
    checkpoint's ``k_scale``/``v_scale`` would (vLLM's ``calculate_kv_scales`` takes them from
    the profiling forward, whose attention output no backend writes, so from layer 1 on they
    are not reproducible)."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
        .model_runner
    for _, m in runner.model.named_modules():
        if hasattr(m, "_k_scale_float"):
            m._k_scale.fill_(k_scale)
            m._v_scale.fill_(v_scale)
            m._k_scale_float, m._v_scale_float = float(k_scale), float(v_scale)


def kv_scales(llm) -> list:
    """Each attention layer's ``(k_scale, v_scale)`` (vLLM's ``_k_scale_float``/``_v_scale_float``)
    in the in-process engine's model."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
        .model_runner
    return [(m._k_scale_float, m._v_scale_float) for _, m in runner.model.named_modules()
            if hasattr(m, "_k_scale_float")]
