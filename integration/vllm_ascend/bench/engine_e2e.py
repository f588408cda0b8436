"""The real vLLM engine (vLLM's CPU build) end to end, with and without kvshare's manager.

One configuration runs in one process (``python engine_e2e.py run CONFIG.json OUT.json``): the
plugin's swap is process-wide and an engine's memory is only given back when its process ends.
The tests (``tests/test_engine.py``) and ``kvshare-bench vllm-e2e`` (``python engine_e2e.py
bench``) both drive it.

The model is a tiny Llama written here (``write_tiny_model``): a local ``config.json`` and a
``model.safetensors`` of seeded normal weights scaled so that attention is far from uniform and
greedy decoding does not collapse onto one token (vLLM's ``load_format="dummy"`` fills weights
with U(-1e-3, 1e-3), under which every logit is nearly equal). Prompts are token ids
(``skip_tokenizer_init``): nothing is downloaded.

The workload is multi-turn chat: ``convs`` conversations share a system prompt; each turn's
prompt is the conversation's whole history (previous prompt + generated tokens) plus a new user
message, and all conversations' turn k are submitted together. After the turns, two extra
requests exercise parallel sampling (``n > 1``, seeded) and tenant isolation (``cache_salt``).
With ``scored`` > 0, that many prompts (the system prompt plus a user message of its own length)
are scored instead of chatted: each prompt's logprobs under teacher forcing (vLLM's
``prompt_logprobs``), then greedy generation with each generated token's logprob; this is how
an fp8 KV cache (``kv_cache_dtype``) is compared between attention backends.

Measured per run (in-process engines; the multiprocess engine reports tokens, hits and logs):
  * ``tokens``: every request's generated ids, by request name;
  * ``cached``: vLLM's ``num_cached_tokens`` of each request (prefix hits);
  * ``prefix_queries`` / ``prefix_hits`` / ``preemptions``: vLLM's own counters;
  * ``sched_s`` / ``model_s`` / ``steps``: time in ``Scheduler.schedule`` +
    ``update_from_output`` against time in ``model_executor.execute_model``/``sample_tokens``;
  * ``attn_s`` / ``attn_build_s``: of ``model_s``, time in the CPU attention backend's
    ``forward`` (vLLM's or kvshare's: KV write and attention of every layer) and in its metadata
    builder (once per step), the part of a step an attention backend decides;
  * ``blocks_peak`` / ``blocks_mean``: KV blocks in use, sampled at every ``schedule``;
  * ``ttft_s``: mean time to first token (vLLM's histogram); ``wall_s``, ``gen_tokens``;
  * with ``scored``: ``prompt_logprobs`` / ``prompt_top`` / ``gen_logprobs`` by request name
    (:func:`_score`), and ``kv_scales``
    (each attention layer's ``(k_scale, v_scale)`` after the run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import kv_scales
from tiny_models import MODEL, QWEN3_NEXT, write_qwen3_next, write_tiny_model  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)

# Defaults of one run; a CONFIG file overrides any of them.
DEFAULTS = {
    "model_dir": None,          # written by write_tiny_model when None
    "kvshare": False,           # KVSHARE_VLLM=1: the plugin's manager
    "kvshare_attention": False,  # KVSHARE_VLLM_OPS=1: kvshare's attention backend
    "multiprocess": False,      # VLLM_ENABLE_V1_MULTIPROCESSING
    "kv_blocks": 1024,          # KV-cache size in blocks of 16 tokens (the pressure knob)
    "block_size": 16,
    "max_model_len": 1024,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 256,
    "convs": 8,
    "turns": 3,
    "system_tokens": 256,
    "user_tokens": 24,
    "output_tokens": 12,
    "extras": True,             # the n>1 and cache_salt requests after the turns
    "host_pages": 0,            # > 0: kvshare's KV connector with a host tier of that many pages
    "match_unit": 0,            # KVSHARE_VLLM_MATCH_UNIT: sub-page hits (on vLLM 0.23 through
                                # kvshare's KV connector, configured here with the host pages)
    "prefetch_waiting": 2,      # the connector's prefetch_waiting option
    "returns": 0,               # evict-and-return rounds before the turns (see run)
    "kv_transfer": None,        # a KV connector's KVTransferConfig fields (e.g. ExampleConnector)
    "replay": False,            # after the turns: reset the prefix cache, then send each last
                                # turn's prompt + its first generated token again (a KV
                                # connector that stored the prompt serves it; the device
                                # cache cannot)
    "seed": 0,
    "sliding_window": None,     # a hybrid model: even layers slide over this many tokens
    "retention": "default",     # vLLM 0.32's prefix_cache_retention_interval (None: dense;
                                # "default": the engine's own, 0)
    "qwen3_next": False,        # a tiny Qwen3-Next (3 gated-delta-net layers per full one, random
                                # "dummy" weights): Mamba-style state groups (write_qwen3_next)
    "prefix_caching": True,     # False: vLLM runs state groups in mamba_cache_mode "none"
    "kv_cache_dtype": "auto",   # vLLM's kv_cache_dtype (fp8, fp8_e4m3, fp8_e5m2: quantized KV)
    "kv_scales": None,          # [k_scale, v_scale] set on every attention layer once the
                                # engine is built (in-process engine only)
    "scored": 0,                # > 0: score that many prompts instead of the chat (module doc)
    "kv_scale_fault": None,     # a deliberately wrong scale in kvshare's attention read (not
                                # its write), to show a comparison detects one: "swap" (K read
                                # with v_scale and V with k_scale) or "double" (K with 2 k_scale)
}


def _cpu_moe_silu_workaround() -> None:
    """vLLM 0.23.0's CPU MoE (``cpu_fused_moe.forward_torch``, taken without the prepacked
    kernels) builds a ``SiluAndMul`` CustomOp inside the forward pass, which asserts that no
    vLLM config is current; the same function, without the CustomOp."""
    import torch.nn.functional as F
    try:
        from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    except ImportError:  # vLLM 0.32: the CPU MoE moved, and builds no CustomOp in the forward
        return
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    cpu_fused_moe._CPU_MOE_ACT_FN[MoEActivation.SILU] = \
        lambda x: F.silu(x[..., :x.shape[-1] // 2]) * x[..., x.shape[-1] // 2:]


def install_plugin(target: str, python: str = sys.executable) -> str:
    """Installs the ``kvshare`` binding and the ``kvshare_vllm`` plugin (with its
    ``vllm.general_plugins`` entry point, which is how every vLLM process finds it) into the
    folder ``target``, from this checkout, offline; put ``target`` on ``PYTHONPATH`` to use it."""
    import fcntl
    import tempfile

    binding = os.path.join(os.path.dirname(PKG), "python")
    # pip builds each package in its source folder (build/): processes installing at once (test
    # files in parallel workers) take turns.
    with open(os.path.join(tempfile.gettempdir(), "kvshare-install-plugin.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for pkg in (binding, PKG):
            subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                            "--no-build-isolation", "--no-index",
                            "--disable-pip-version-check", "--target", target, pkg], check=True)
    return target


def kernel_block_size() -> int:
    """The smallest block vLLM's CPU attention kernel takes: 16 on vLLM 0.23, 32 on 0.32."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return CPUAttentionBackend.get_supported_kernel_block_sizes()[0].base


def block_bytes(block_size: int) -> int:
    """Bytes of one KV block of the tiny model (K and V, every layer, float32)."""
    head_dim = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    return 2 * MODEL["num_hidden_layers"] * block_size * MODEL["num_key_value_heads"] \
        * head_dim * 4


# The KVCacheManager methods vLLM's Scheduler calls (`self.kv_cache_manager.*` in
# vllm/v1/core/sched/scheduler.py: 0.23's, then those 0.32 added), timed as the manager's share
# of a step (a method the installed manager lacks is skipped).
MANAGER_CALLS = ("allocate_slots", "cache_blocks", "evict_blocks", "free", "get_block_ids",
                 "get_blocks", "get_computed_blocks", "get_num_common_prefix_blocks",
                 "make_prefix_cache_stats", "new_step_starts", "remove_skipped_blocks",
                 "reset_prefix_cache", "take_events", "take_new_block_ids",
                 "estimate_cached_tokens", "finalize_partial_tail_offloads",
                 "get_block_ids_for_computed_tokens", "get_computed_blocks_for_connector",
                 "pop_blocks_for_free", "record_blocks_for_zeroing", "record_prefix_cache_stats",
                 "take_boundary_state_offloads", "take_kv_cache_block_copies",
                 "truncate_computed_blocks")


class _Timer:
    """Wraps the in-process engine's scheduler and executor to split step time; samples the
    KV blocks in use after every ``schedule`` (outside the timed region), and with ``trace``
    records each step's scheduled requests, preemptions and blocks."""

    def __init__(self, core, trace: bool = False):
        self.sched_s = 0.0
        self.model_s = 0.0
        self.steps = 0
        self.blocks = []
        self.trace = [] if trace else None
        sched = core.scheduler
        mgr = sched.kv_cache_manager
        self.total = total = mgr.block_pool.num_gpu_blocks - 1  # the null block is never in use
        self.manager = type(mgr).__name__
        self.scheduler = type(sched).__name__
        self.groups = len(sched.kv_cache_config.kv_cache_groups)

        def timed(obj, name, field):
            fn = getattr(obj, name)

            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    setattr(self, field, getattr(self, field) + time.perf_counter() - t)
            setattr(obj, name, wrapper)
            return wrapper

        # The manager's own time: every method the scheduler calls on it (and the coordinator's
        # block count), the outermost call only (a method calling another is counted once).
        self.mgr_calls = {}  # method -> [calls, seconds]
        depth = [0]

        def timed_manager(obj, name):
            fn = getattr(obj, name, None)
            if fn is None:
                return

            def wrapper(*a, **k):
                depth[0] += 1
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    depth[0] -= 1
                    if depth[0] == 0:
                        c = self.mgr_calls.setdefault(name, [0, 0.0])
                        c[0] += 1
                        c[1] += time.perf_counter() - t
            setattr(obj, name, wrapper)

        # What the wrapper itself adds to each call it times (two clocks, the bookkeeping),
        # measured on a method that does nothing and subtracted from every call.
        class _Nothing:
            def call(self):
                return None
        probe = _Nothing()
        timed_manager(probe, "call")
        t0 = time.perf_counter()
        for _ in range(20000):
            probe.call()
        bare = time.perf_counter()
        for _ in range(20000):
            _Nothing.call(probe)
        self.wrap_s = max(0.0, ((bare - t0) - (time.perf_counter() - bare)) / 20000)
        self.mgr_calls.clear()
        for name in MANAGER_CALLS:
            timed_manager(mgr, name)
        timed_manager(mgr.coordinator, "get_num_blocks_to_allocate")
        timed_schedule = timed(sched, "schedule", "sched_s")

        def schedule(*a, **k):  # vLLM 0.32: schedule(throttle_prefills=False)
            out = timed_schedule(*a, **k)
            self.steps += 1
            used = round(mgr.usage * total)
            self.blocks.append(used)
            if self.trace is not None:
                self.trace.append([sorted(out.num_scheduled_tokens.items()),
                                   sorted(getattr(out, "preempted_req_ids", None) or ()), used])
            return out
        sched.schedule = schedule
        timed(sched, "update_from_output", "sched_s")
        ex = core.model_executor
        timed(ex, "execute_model", "model_s")
        if hasattr(ex, "sample_tokens"):
            timed(ex, "sample_tokens", "model_s")


# Seconds in the CPU attention backends, in this process (see _time_attention).
_ATTN_S = {"forward": 0.0, "build": 0.0}


def _time_attention() -> None:
    """Adds the seconds of every ``forward`` of the CPU attention impls and every ``build`` of
    their metadata builders (vLLM's and kvshare's) to ``_ATTN_S``; wraps each method once per
    process."""
    from vllm.v1.attention.backends import cpu_attn

    classes = [(cpu_attn.CPUAttentionBackendImpl, "forward"),
               (cpu_attn.CPUAttentionMetadataBuilder, "build")]
    try:
        from kvshare_vllm import cpu_attn as kvs_attn
    except ImportError:  # the plugin is not installed: vLLM's backend only
        pass
    else:
        classes += [(kvs_attn.KvshareCPUAttentionImpl, "forward"),
                    (kvs_attn.KvshareCPUMetadataBuilder, "build")]
    for cls, name in classes:
        fn = cls.__dict__[name]
        if getattr(fn, "_kvs_timed", False):
            continue

        def timed(self, *a, _fn=fn, _key=name, **k):
            t = time.perf_counter()
            try:
                return _fn(self, *a, **k)
            finally:
                _ATTN_S[_key] += time.perf_counter() - t
        timed._kvs_timed = True
        setattr(cls, name, timed)


def _score(llm, cfg: dict, system: list, ids, tokens: dict, cached: dict) -> dict:
    """The ``scored`` workload (module doc): fills ``tokens`` and ``cached`` for each request;
    returns ``prompt_logprobs``, ``prompt_top`` and ``gen_logprobs``, by request name: the
    logprob of each prompt token (from the second on), the most likely token at each of those
    positions, and the logprob of each generated token."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    n = cfg["scored"]
    room = cfg["max_model_len"] - len(system) - cfg["output_tokens"]
    prompts = [system + ids(max(1, room * (i + 1) // n - 1)) for i in range(n)]
    forced = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, ignore_eos=True,
                            detokenize=False)
    greedy = SamplingParams(max_tokens=cfg["output_tokens"], temperature=0.0, logprobs=0,
                            ignore_eos=True, detokenize=False)
    plp, top, glp = {}, {}, {}
    for i, o in enumerate(llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                       forced, use_tqdm=False)):
        plp[f"s{i}"] = [d[t].logprob for d, t in zip(o.prompt_logprobs[1:], prompts[i][1:])]
        top[f"s{i}"] = [next(t for t, lp in d.items() if lp.rank == 1)
                        for d in o.prompt_logprobs[1:]]
    for i, o in enumerate(llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                       greedy, use_tqdm=False)):
        out = o.outputs[0]
        tokens[f"s{i}"] = list(out.token_ids)
        cached[f"s{i}"] = o.num_cached_tokens
        glp[f"s{i}"] = [d[t].logprob for d, t in zip(out.logprobs, out.token_ids)]
    return {"prompt_logprobs": plp, "prompt_top": top, "gen_logprobs": glp}


def _attention_backend(llm) -> str | None:
    """The attention backend class the in-process engine's model runner uses."""
    try:
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
            .model_runner
        return runner.attn_groups[0][0].backend.__name__
    except (AttributeError, IndexError, TypeError):
        return None


def _metric(metrics, name):
    for m in metrics:
        if m.name == name:
            if hasattr(m, "value"):
                return m.value
            if hasattr(m, "sum"):
                return (m.sum, m.count)
    return None


def run(cfg: dict) -> dict:
    """Runs one configuration in this process; returns the measurements (module doc)."""
    cfg = {**DEFAULTS, **cfg}
    os.environ["KVSHARE_VLLM"] = "1" if cfg["kvshare"] else "0"
    os.environ["KVSHARE_VLLM_OPS"] = "1" if cfg["kvshare_attention"] else "0"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg["multiprocess"] else "0"
    os.environ["KVSHARE_VLLM_MATCH_UNIT"] = str(cfg["match_unit"])
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    extra = {}
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if cfg["qwen3_next"]:
        _cpu_moe_silu_workaround()
        extra.update(load_format="dummy", mamba_ssm_cache_dtype="float32")
        cfg["model_dir"] = cfg["model_dir"] or write_qwen3_next(os.path.join(
            os.environ.get("TMPDIR", "/tmp"), f"kvshare-qwen3-next-{os.getpid()}"))
    model_dir = cfg["model_dir"] or write_tiny_model(
        os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kvshare-tiny-{os.getpid()}"), cfg["seed"],
        cfg["sliding_window"])
    if cfg["kv_transfer"]:
        from vllm.config import KVTransferConfig
        extra["kv_transfer_config"] = KVTransferConfig(**cfg["kv_transfer"])
    # kvshare's own connector (one connector: not with kv_transfer): the host tier, and the
    # channel of sub-page hits' copies where vLLM has no block copies of its own (0.23).
    own_connector = bool(cfg["host_pages"])
    if cfg["match_unit"] and cfg["kvshare"]:
        from kvshare_vllm import compat

        own_connector = own_connector or not compat.support().block_copies
    if own_connector:
        from vllm.config import KVTransferConfig

        if cfg["kv_transfer"]:
            raise ValueError("engine_e2e: host_pages and kv_transfer both select a connector")
        extra["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvshareConnector", kv_connector_module_path="kvshare_vllm.connector",
            kv_role="kv_both",
            kv_connector_extra_config={"num_host_pages": cfg["host_pages"],
                                       "prefetch_waiting": cfg["prefetch_waiting"]})
    if cfg["kv_cache_dtype"] != "auto":
        extra["kv_cache_dtype"] = cfg["kv_cache_dtype"]
    if cfg["retention"] != "default":
        extra["prefix_cache_retention_interval"] = cfg["retention"]
    if cfg["kv_scale_fault"]:
        kv_scales.wrong_kv_scales(cfg["kv_scale_fault"])
    t0 = time.perf_counter()
    if not cfg["qwen3_next"]:  # a hybrid's block size is vLLM's (attention page = state page)
        extra["block_size"] = cfg["block_size"]
    llm = LLM(model=model_dir, skip_tokenizer_init=True,
              enable_prefix_caching=cfg["prefix_caching"], max_model_len=cfg["max_model_len"],
              dtype="bfloat16" if cfg["qwen3_next"] else "float32",
              seed=cfg["seed"], enforce_eager=True, max_num_seqs=cfg["max_num_seqs"],
              max_num_batched_tokens=cfg["max_num_batched_tokens"], disable_log_stats=False,
              kv_cache_memory_bytes=cfg["kv_blocks"] * block_bytes(cfg["block_size"]), **extra)
    init_s = time.perf_counter() - t0
    if cfg["kv_scales"]:
        kv_scales.set_kv_scales(llm, *cfg["kv_scales"])
    timer = None
    if not cfg["multiprocess"]:
        timer = _Timer(llm.llm_engine.engine_core.engine_core, trace=bool(cfg.get("trace")))
        _time_attention()
    attn0 = dict(_ATTN_S)

    rng = np.random.default_rng(cfg["seed"] + 1)
    vocab = MODEL["vocab_size"]

    def ids(n):
        return rng.integers(3, vocab, n).tolist()

    system = ids(cfg["system_tokens"])
    history = [system + ids(cfg["user_tokens"]) for _ in range(cfg["convs"])]
    greedy = SamplingParams(max_tokens=cfg["output_tokens"], temperature=0.0, ignore_eos=True,
                            detokenize=False)
    tokens, cached = {}, {}
    gen_tokens = 0
    t0 = time.perf_counter()
    if cfg["returns"]:
        # Evict and return: each conversation's first prompt, then enough unrelated prompts to
        # push it out of a small device cache, then the same prompt again (its second run can
        # hit only what a host tier kept).
        for r in range(cfg["returns"]):
            first = history[r % len(history)]
            for name, prompt in ([(f"ret{r}a", first)]
                                 + [(f"ret{r}f{i}", ids(len(first))) for i in range(3)]
                                 + [(f"ret{r}b", first)]):
                o = llm.generate([TokensPrompt(prompt_token_ids=prompt)], greedy,
                                 use_tqdm=False)[0]
                tokens[name] = list(o.outputs[0].token_ids)
                cached[name] = o.num_cached_tokens
                gen_tokens += len(tokens[name])
    scored = _score(llm, cfg, system, ids, tokens, cached) if cfg["scored"] else {}
    replay = [None] * cfg["convs"]
    for turn in range(cfg["turns"]):
        outs = llm.generate([TokensPrompt(prompt_token_ids=h) for h in history], greedy,
                            use_tqdm=False)
        for c, o in enumerate(outs):
            name = f"c{c}t{turn}"
            out = list(o.outputs[0].token_ids)
            tokens[name] = out
            cached[name] = o.num_cached_tokens
            gen_tokens += len(out)
            replay[c] = history[c] + out[:1]
            history[c] = history[c] + out + ids(cfg["user_tokens"])
    if cfg["replay"]:
        assert llm.reset_prefix_cache()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in replay], greedy,
                            use_tqdm=False)
        for c, o in enumerate(outs):
            tokens[f"c{c}replay"] = list(o.outputs[0].token_ids)
            cached[f"c{c}replay"] = o.num_cached_tokens
    if cfg["extras"]:
        # Parallel sampling: n seeded samples share the prompt's blocks.
        sampled = SamplingParams(n=3, max_tokens=cfg["output_tokens"], temperature=1.0, seed=7,
                                 ignore_eos=True, detokenize=False)
        o = llm.generate([TokensPrompt(prompt_token_ids=history[0])], sampled, use_tqdm=False)[0]
        for i, s in enumerate(sorted(o.outputs, key=lambda s: s.index)):
            tokens[f"n3s{i}"] = list(s.token_ids)
        cached["n3"] = o.num_cached_tokens
        # Salted prompts: the same tokens under another tenant's salt share nothing.
        prompt = system + ids(cfg["user_tokens"])
        for name, salt in (("salt_a1", "tenant-a"), ("salt_b", "tenant-b"),
                           ("salt_a2", "tenant-a")):
            p = TokensPrompt(prompt_token_ids=prompt)
            p["cache_salt"] = salt
            o = llm.generate([p], greedy, use_tqdm=False)[0]
            tokens[name] = list(o.outputs[0].token_ids)
            cached[name] = o.num_cached_tokens
    wall_s = time.perf_counter() - t0

    metrics = llm.get_metrics()
    ttft = _metric(metrics, "vllm:time_to_first_token_seconds")
    res = {
        "config": cfg,
        "tokens": tokens,
        "cached": cached,
        "prefix_queries": _metric(metrics, "vllm:prefix_cache_queries"),
        "prefix_hits": _metric(metrics, "vllm:prefix_cache_hits"),
        "connector_queries": _metric(metrics, "vllm:external_prefix_cache_queries"),
        "connector_hits": _metric(metrics, "vllm:external_prefix_cache_hits"),
        "preemptions": _metric(metrics, "vllm:num_preemptions"),
        "ttft_s": ttft[0] / ttft[1] if ttft and ttft[1] else None,
        "wall_s": wall_s,
        "init_s": init_s,
        "gen_tokens": gen_tokens,
        **scored,
    }
    if timer is not None:
        core = llm.llm_engine.engine_core.engine_core
        mgr = core.scheduler.kv_cache_manager
        if hasattr(mgr, "kvshare_stats"):
            st = mgr.kvshare_stats()
            res["kvshare_stats"] = {k: st[k] for k in ("demotions", "promotions", "prefetched",
                                                      "host_hit_tokens", "evictions",
                                                      "unit_hits", "unit_hit_tokens",
                                                      "pending_copies")
                                    if k in st}
        if own_connector:
            from vllm.distributed.kv_transfer import get_kv_transfer_group

            w = get_kv_transfer_group()
            s = core.scheduler.connector
            res["connector"] = dict(copy_s=w.copy_s, copies=w.copies_done,
                                    steps_with_copies=w.steps_with_copies,
                                    prefetched_pages=s.prefetched_pages)
        res.update(attention=_attention_backend(llm))
        if cfg["scored"] or cfg["kv_scales"]:
            res["kv_scales"] = kv_scales.kv_scales(llm)
        res.update(scheduler=timer.scheduler, trace=timer.trace, kv_groups=timer.groups,
                   kv_blocks_total=timer.total + 1)
        res.update(attn_s=_ATTN_S["forward"] - attn0["forward"],
                   attn_build_s=_ATTN_S["build"] - attn0["build"])
        res.update(manager=timer.manager, sched_s=timer.sched_s, model_s=timer.model_s,
                   mgr_calls=timer.mgr_calls, mgr_wrap_s=timer.wrap_s,
                   steps=timer.steps, blocks_peak=max(timer.blocks, default=0),
                   blocks_mean=sum(timer.blocks) / max(len(timer.blocks), 1))
    return res


def run_in_subprocess(cfg: dict, python: str = sys.executable, env: dict | None = None,
                      timeout: float = 900) -> tuple[dict, str]:
    """Runs ``cfg`` in a fresh interpreter; returns (measurements, the process's output: stdout,
    where vLLM's default logging writes, then stderr)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        cfg_path, out_path = os.path.join(d, "cfg.json"), os.path.join(d, "out.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        proc = subprocess.run([python, os.path.abspath(__file__), "run", cfg_path, out_path],
                              env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"engine run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-6000:]}")
        with open(out_path) as f:
            return json.load(f), proc.stdout + proc.stderr


def _bench_env(site: str) -> dict:
    """The environment of every configuration a benchmark runs: the plugin on ``PYTHONPATH``,
    and torch allocating 2 MiB and larger tensors on huge pages (``THP_MEM_ALLOC_ENABLE=1``; a
    user's own setting is kept), for every configuration alike. With it kvshare's attention
    backend finds its KV cache on huge pages already. These engines run in-process, where the
    plugin loads after torch's first allocation, too late to set it (in the multiprocess engine
    the plugin sets it for the engine's worker)."""
    env = dict(os.environ, PYTHONPATH=site)
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    print(f"THP_MEM_ALLOC_ENABLE={env['THP_MEM_ALLOC_ENABLE']} in every configuration",
          file=sys.stderr)
    return env


def _manager_s(r: dict, call: str | None = None) -> float:
    """Seconds in the manager's calls (all, or one method), the wrapper's cost taken out."""
    calls = r["mgr_calls"].values() if call is None else [r["mgr_calls"].get(call, [0, 0.0])]
    return sum(max(0.0, s - n * r["mgr_wrap_s"]) for n, s in calls)


def _retention_arg(text: str):
    """``--retention-interval``: a token count, ``none`` (dense) or ``default``."""
    import argparse

    if text.isdigit():
        return int(text)
    if text.lower() in ("none", "default"):
        return None if text.lower() == "none" else "default"
    raise argparse.ArgumentTypeError(f"{text!r} is not a token count, 'none' or 'default'")


def bench(argv) -> int:
    """``kvshare-bench vllm-e2e``: both managers through the real engine, order alternating."""
    import argparse
    import statistics
    import tempfile

    ap = argparse.ArgumentParser(prog="kvshare-bench vllm-e2e")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each configuration")
    ap.add_argument("--convs", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--kv-blocks", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=None,
                    help="tokens per KV block (default: the smallest vLLM's CPU attention "
                    "kernel takes, 16 on vLLM 0.23 and 32 on 0.32)")
    ap.add_argument("--sliding-window", type=int, default=None, metavar="W",
                    help="a hybrid model: even layers slide over W tokens (two KV-cache groups)")
    ap.add_argument("--retention-interval", default="default", type=_retention_arg,
                    metavar="N|none",
                    help="vLLM 0.32's prefix_cache_retention_interval for the hybrid model's "
                    "window: tokens, or none (dense); default: the engine's own (0)")
    ap.add_argument("--quick", action="store_true", help="a small run for CI smoke tests")
    ap.add_argument("--json", action="store_true", help="print the raw measurements as JSON")
    a = ap.parse_args(argv)
    if a.block_size is None:
        a.block_size = kernel_block_size()
    if a.quick:
        a.repeats, a.convs, a.turns, a.system_tokens, a.output_tokens = 1, 4, 2, 128, 8
    configs = [("vLLM manager + vLLM attention", {"kvshare": False}),
               ("kvshare manager + vLLM attention", {"kvshare": True}),
               ("kvshare manager + kvshare attention",
                {"kvshare": True, "kvshare_attention": True})]
    with tempfile.TemporaryDirectory() as d:
        model = write_tiny_model(os.path.join(d, "model"), sliding_window=a.sliding_window)
        site = install_plugin(os.path.join(d, "site"))
        sys.path.insert(0, site)
        from kvshare_vllm import compat

        if not compat.support().attention:  # refused at start-up on this vLLM (the reason)
            print(f"kvshare attention left out: {compat.support().attention_missing}",
                  file=sys.stderr)
            configs = configs[:2]
        results = {name: [] for name, _ in configs}
        env = _bench_env(site)
        for rep in range(a.repeats):
            order = configs if rep % 2 == 0 else configs[::-1]
            for name, extra in order:
                cfg = dict(extra, model_dir=model, convs=a.convs, turns=a.turns,
                           system_tokens=a.system_tokens, output_tokens=a.output_tokens,
                           kv_blocks=a.kv_blocks, block_size=a.block_size, max_model_len=4096,
                           extras=False, max_num_seqs=max(16, a.convs),
                           max_num_batched_tokens=1024, sliding_window=a.sliding_window,
                           retention=a.retention_interval)
                res, log = run_in_subprocess(cfg, env=env)
                if extra["kvshare"] and not res.get("manager", "Kvshare").startswith("Kvshare"):
                    raise SystemExit(f"engine_e2e: {name} ran vLLM's {res['manager']}:\n"
                                     + "\n".join(line for line in log.splitlines()
                                                  if "kvshare_vllm" in line))
                results[name].append(res)
                print(f"  run {rep + 1}: {name}: {res['wall_s']:.2f} s", file=sys.stderr)
    if a.json:
        print(json.dumps(results, indent=1))
    ref = results[configs[0][0]][0]["tokens"]
    same = {name: all(r["tokens"] == ref for r in rs) for name, rs in results.items()}
    med = statistics.median
    model_name = (f"hybrid model (sliding window {a.sliding_window} + full attention)"
                  if a.sliding_window else "dense model")
    if a.retention_interval != "default":
        model_name += f", prefix_cache_retention_interval {a.retention_interval}"
    print(f"workload: {model_name}, {a.convs} conversations x {a.turns} turns, "
          f"{a.system_tokens}-token system prompt, {a.output_tokens} output tokens, "
          f"{a.kv_blocks} KV blocks of {a.block_size}; medians of {a.repeats} runs each, order "
          "alternating")
    print(f"{'configuration':36} {'tok/s':>8} {'TTFT ms':>8} {'sched us/step':>14} "
          f"{'mgr us/step':>12} {'model ms/step':>14} {'attn ms/step':>13} {'steps':>6} "
          f"{'hit rate':>9} {'blocks peak':>12} {'blocks mean':>12}")
    base = None
    for name, _ in configs:
        rs = results[name]
        row = dict(
            tps=med(r["gen_tokens"] / r["wall_s"] for r in rs),
            ttft=med(r["ttft_s"] * 1e3 for r in rs),
            sched=med(r["sched_s"] / r["steps"] * 1e6 for r in rs),
            mgr=med(_manager_s(r) / r["steps"] * 1e6 for r in rs),
            model=med(r["model_s"] / r["steps"] * 1e3 for r in rs),
            attn=med((r["attn_s"] + r["attn_build_s"]) / r["steps"] * 1e3 for r in rs),
            steps=med(r["steps"] for r in rs),
            hit=med(r["prefix_hits"] / r["prefix_queries"] for r in rs),
            peak=med(r["blocks_peak"] for r in rs),
            mean=med(r["blocks_mean"] for r in rs))
        base = base or row
        print(f"{name:36} {row['tps']:8.1f} {row['ttft']:8.1f} {row['sched']:14.1f} "
              f"{row['mgr']:12.1f} {row['model']:14.2f} {row['attn']:13.2f} {row['steps']:6.0f} "
              f"{row['hit']:9.4f} {row['peak']:12.0f} {row['mean']:12.1f}")
        if row is not base:
            print(f"{'  ratio to the first (x faster)':36} {row['tps'] / base['tps']:8.2f} "
                  f"{base['ttft'] / row['ttft']:8.2f} {base['sched'] / row['sched']:14.2f} "
                  f"{base['mgr'] / row['mgr']:12.2f} {base['model'] / row['model']:14.2f} "
                  f"{base['attn'] / row['attn']:13.2f}")
    print("the manager's time per step by call (us/step, calls/step), medians:")
    for name, _ in [c for c in configs if not c[1].get("kvshare_attention")]:
        rs = results[name]
        calls = sorted({c for r in rs for c in r["mgr_calls"]},
                       key=lambda c: -med(r["mgr_calls"].get(c, [0, 0.0])[1] for r in rs))
        parts = [f"{c} {med(_manager_s(r, c) / r['steps'] * 1e6 for r in rs):.1f} "
                 f"({med(r['mgr_calls'].get(c, [0, 0.0])[0] / r['steps'] for r in rs):.1f})"
                 for c in calls]
        print(f"  {name}: " + ", ".join(parts))
    print("  (the timing wrapper's own cost, measured in each run, is subtracted from every call: "
          f"{med(r['mgr_wrap_s'] for rs in results.values() for r in rs) * 1e9:.0f} ns)")
    for name, ok in same.items():
        print(f"generated tokens of '{name}' identical to the first's in every run: {ok}")
        if not ok:
            print("  first divergence: " + _first_divergence(ref, results[name][0]["tokens"]))
    # The managers must agree exactly; an attention kernel may round differently (reported above).
    return 0 if same[configs[1][0]] else 1


def bench_host_tier(argv) -> int:
    """``engine_e2e.py host-tier``: kvshare's manager with and without its KV connector's host
    tier, with a device budget below the working set (hits, recomputed prompt tokens), and
    without pressure (the connector's step-time cost when it copies nothing); vLLM's manager
    gives the reference tokens.  Order alternates between repeats; medians."""
    import argparse
    import statistics
    import tempfile

    ap = argparse.ArgumentParser(prog="engine_e2e.py host-tier")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--convs", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--kv-blocks", type=int, default=48, help="device budget under pressure")
    ap.add_argument("--host-pages", type=int, default=512)
    a = ap.parse_args(argv)
    host = {"host_pages": a.host_pages}
    configs = [("vLLM manager", "pressure", {"kvshare": False}),
               ("kvshare", "pressure", {"kvshare": True}),
               ("kvshare + host tier", "pressure", dict(host, kvshare=True)),
               ("kvshare", "no pressure", {"kvshare": True}),
               ("kvshare + host tier", "no pressure", dict(host, kvshare=True))]
    results = {(n, p): [] for n, p, _ in configs}
    with tempfile.TemporaryDirectory() as d:
        model = write_tiny_model(os.path.join(d, "model"))
        site = install_plugin(os.path.join(d, "site"))
        env = _bench_env(site)
        for rep in range(a.repeats):
            for name, p, extra in (configs if rep % 2 == 0 else configs[::-1]):
                cfg = dict(extra, model_dir=model, convs=a.convs, turns=a.turns,
                           system_tokens=a.system_tokens, output_tokens=a.output_tokens,
                           user_tokens=32, extras=False, max_model_len=16 * a.kv_blocks,
                           kv_blocks=a.kv_blocks if p == "pressure" else 4096)
                res, _ = run_in_subprocess(cfg, env=env)
                results[(name, p)].append(res)
                print(f"  run {rep + 1}: {name}, {p}: {res['wall_s']:.2f} s", file=sys.stderr)
    med = statistics.median
    ref = results[configs[0][:2]][0]["tokens"]
    print(f"workload: {a.convs} conversations x {a.turns} turns, {a.system_tokens}-token system "
          f"prompt, 32-token user turns, {a.output_tokens} output tokens; device budget "
          f"{a.kv_blocks} blocks of 16 under pressure (4096 without), host tier {a.host_pages} "
          f"pages; medians of {a.repeats} runs, order alternating")
    print(f"{'configuration':22} {'budget':12} {'hit rate':>9} {'recomputed':>11} "
          f"{'preempt':>8} {'promoted':>9} {'demoted':>8} {'step ms':>8} {'sched us':>9} "
          f"{'copy us':>8} {'same tokens':>12}")
    rows = {}
    for name, p, _ in configs:
        rs = results[(name, p)]
        st = [r.get("kvshare_stats") or {} for r in rs]
        con = [r.get("connector") or {} for r in rs]
        row = rows[(name, p)] = dict(
            hit=med(r["prefix_hits"] / r["prefix_queries"] for r in rs),
            recomputed=med(r["prefix_queries"] - r["prefix_hits"] for r in rs),
            preempt=med(r["preemptions"] for r in rs),
            promoted=med(s.get("promotions", 0) for s in st),
            demoted=med(s.get("demotions", 0) for s in st),
            step=med((r["sched_s"] + r["model_s"]) / r["steps"] * 1e3 for r in rs),
            sched=med(r["sched_s"] / r["steps"] * 1e6 for r in rs),
            copy=med(c.get("copy_s", 0.0) / r["steps"] * 1e6 for c, r in zip(con, rs)),
            same=all(r["tokens"] == ref for r in rs))
        print(f"{name:22} {p:12} {row['hit']:9.4f} {row['recomputed']:11.0f} "
              f"{row['preempt']:8.0f} {row['promoted']:9.0f} {row['demoted']:8.0f} "
              f"{row['step']:8.2f} {row['sched']:9.1f} {row['copy']:8.1f} {str(row['same']):>12}")
    base, conn = rows[("kvshare", "no pressure")], rows[("kvshare + host tier", "no pressure")]
    print(f"connector cost without pressure (no copies): step time "
          f"x{conn['step'] / base['step']:.3f}, scheduler time per step "
          f"x{conn['sched'] / base['sched']:.3f}")
    return 0 if all(r["same"] for r in rows.values()) else 1


def _first_divergence(a: dict, b: dict) -> str:
    for req in a:
        for i, (x, y) in enumerate(zip(a[req], b.get(req, []))):
            if x != y:
                return f"request {req}, output token {i}: {x} vs {y}"
    return "none (different requests or lengths)"


def main(argv) -> int:
    if len(argv) >= 3 and argv[0] == "run":
        with open(argv[1]) as f:
            cfg = json.load(f)
        res = run(cfg)
        with open(argv[2], "w") as f:
            json.dump(res, f)
        return 0
    if argv and argv[0] == "bench":
        return bench(argv[1:])
    if argv and argv[0] == "host-tier":
        return bench_host_tier(argv[1:])
    print("usage: engine_e2e.py run CONFIG.json OUT.json | bench [--quick] [--repeats N] ... | "
          "host-tier [--repeats N] ...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
