"""Builds the installed vLLM's Schedulers (0.23.0 or 0.32.0) and drives them without a model
(outputs are synthesised).  What differs between the two in the scheduler's use of the manager
is asked of ``kvshare_vllm.compat`` (``API``, ``CASCADE``, ``lookup``)."""

from __future__ import annotations

import torch

from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                                        KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                        MLAAttentionSpec, SlidingWindowSpec)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.utils.hashing import get_hash_fn_by_name

from kvshare_vllm import compat, plugin

EOS = 2
# The vLLM release whose scheduler-manager interface is installed.
API = compat.manager_api()
# Cascade attention's shared prefix (get_num_common_prefix_blocks): vLLM 0.32 removed it.
CASCADE = API == "0.23.0"
_hash_algo = None  # the algorithm vLLM's NONE_HASH was last initialised with


def make_vllm_config(model_dir: str, *, block_size: int = 16, max_num_seqs: int = 16,
                     max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
                     enable_prefix_caching: bool = True, kv_events: bool = False,
                     async_scheduling: bool = False,
                     kv_transfer: dict | None = None, watermark: float = 0.0) -> VllmConfig:
    """``watermark``: vLLM 0.32's admission watermark (``SchedulerConfig.watermark``)."""
    model_config = ModelConfig(model=model_dir, dtype="float16", seed=42,
                               skip_tokenizer_init=True, max_model_len=max_model_len or 8192)
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len or 8192, enable_chunked_prefill=True,
        async_scheduling=async_scheduling, is_encoder_decoder=False,
        **({"watermark": watermark} if watermark else {}))
    cache_config = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9,
                               cache_dtype="auto", enable_prefix_caching=enable_prefix_caching)
    kv_events_config = None
    if kv_events:
        from vllm.config import KVEventsConfig
        kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    kv_transfer_config = None
    if kv_transfer is not None:  # KVTransferConfig's fields (kv_connector, kv_role, ...)
        from vllm.config import KVTransferConfig
        kv_transfer_config = KVTransferConfig(**kv_transfer)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, kv_events_config=kv_events_config,
                             kv_transfer_config=kv_transfer_config,
                             device_config=DeviceConfig(device="cpu"))
    return vllm_config


# Hybrid models' attention layers, as their vLLM model files declare them (window / chunk sizes
# from the published configs; heads and dtypes only set page bytes, which the scheduler never
# reads).  ``layer_specs`` turns one into vLLM's per-layer spec dict, which vLLM's own
# ``get_kv_cache_groups`` groups exactly as the engine does.
#   gpt-oss:  sliding window 128 and full attention alternating (24 layers: 2 groups)
#   gemma3:   5 sliding-window layers (window 1024) per full layer (30 layers: 6 groups)
#   llama4:   3 chunked-local layers (chunk 8192) per full (NoPE) layer (24 layers: 4 groups)
#   mla:      DeepSeek-like MLA (full attention, one latent vector per token: 1 group)
#   mistral:  every layer a sliding window of 4096 (Mistral 7B v0.1: 1 windowed group)
MODELS = {
    "mistral": ("sw", 4096, None, 8),
    "gpt-oss": ("sw", 128, 2, 24),
    "gemma3": ("sw", 1024, 6, 30),
    "llama4": ("chunk", 8192, 4, 24),
    "mla": ("mla", None, 1, 4),
}

# Mamba / linear-attention hybrids: (state backend, attention layers' positions, layers).  The
# state layers' page (conv + SSM state) is sized to equal one attention page, as vLLM's
# ``HybridAttentionMambaModelConfig`` makes it (it raises the attention block size and pads
# the state page until both are equal); vLLM groups the layers by page (``get_kv_cache_groups``).
#   qwen3-next: 3 gated-delta-net (linear attention) layers per full layer (8 layers: 4 groups)
#   nemotron-h: 6 Mamba2 layers per attention layer (28 layers: 7 groups)
#   jamba:      one attention layer in 8 (offset 4), the others Mamba1 (32 layers: 8 groups)
MAMBA_MODELS = {
    "qwen3-next": ("GDN_ATTN", lambda i: i % 4 == 3, 8, 4),
    "nemotron-h": ("MAMBA2", lambda i: i % 7 == 6, 28, 7),
    "jamba": ("MAMBA1", lambda i: i % 8 == 4, 32, 8),
}


def mamba_layer_specs(model: str, mode: str, block_size: int = 16,
                      max_model_len: int = 8192) -> dict:
    """vLLM's per-layer specs of a Mamba / linear-attention hybrid (a key of ``MAMBA_MODELS``)
    under ``mamba_cache_mode`` ``mode``: "all" / "align" (prefix caching on: the state's block
    size is the attention block size) or "none" (prefix caching off: one state block of
    ``max_model_len`` tokens), as ``MambaModelConfig.verify_and_update_config`` sets them."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    backend, is_attn, n, _ = MAMBA_MODELS[model]
    specs = {}
    state_block = max_model_len if mode == "none" else block_size
    for i in range(n):
        if is_attn(i):
            specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                block_size=block_size, num_kv_heads=8, head_size=64, dtype=torch.bfloat16)
        else:
            # conv state 8 KiB + recurrent state 24 KiB = one 32 KiB attention page
            specs[f"model.layers.{i}.mixer"] = MambaSpec(
                block_size=state_block, shapes=((16, 128), (48, 128)),
                dtypes=(torch.float32, torch.float32),
                mamba_type=MambaAttentionBackendEnum[backend], mamba_cache_mode=mode)
    return specs


def layer_specs(model: str, block_size: int = 16, size: int | None = None) -> dict:
    """vLLM's per-layer KV-cache specs of ``model`` (a key of ``MODELS``); ``size`` overrides
    the window / chunk (short ones exercise releases with short prompts)."""
    kind, default, period, n = MODELS[model]
    size = size or default
    specs = {}
    for i in range(n):
        name = f"model.layers.{i}.self_attn.attn"
        full = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=64,
                                 dtype=torch.bfloat16)
        if kind == "mla":
            specs[name] = MLAAttentionSpec(block_size=block_size, num_kv_heads=1,
                                           head_size=576, dtype=torch.bfloat16,
                                           cache_dtype_str="auto")
        elif period is not None and i % period == period - 1:
            specs[name] = full
        elif kind == "sw":
            specs[name] = SlidingWindowSpec(block_size=block_size, num_kv_heads=8,
                                            head_size=64, dtype=torch.bfloat16,
                                            sliding_window=size)
        else:
            specs[name] = ChunkedLocalAttentionSpec(block_size=block_size, num_kv_heads=8,
                                                    head_size=64, dtype=torch.bfloat16,
                                                    attention_chunk_size=size)
    return specs


class EagleConfig:
    """What vLLM's scheduler reads of an EAGLE ``SpeculativeConfig`` (0.23 and 0.32)."""

    method = "eagle"
    num_speculative_tokens_per_batch_size = None
    max_num_new_slots_for_drafting = 0  # EAGLE drafts serially: no extra query slots

    def __init__(self, num_speculative_tokens: int):
        self.num_speculative_tokens = num_speculative_tokens

    def use_eagle(self) -> bool:
        return True

    def use_eagle_block_drop(self) -> bool:
        return True

    def uses_draft_model(self) -> bool:
        return False

    def use_dflash(self) -> bool:
        return False

    def use_dspark(self) -> bool:
        return False

    def use_multi_module_mtp(self) -> bool:
        return False


class ZeroingKVCacheConfig(KVCacheConfig):
    """A ``KVCacheConfig`` that needs KV zeroing whatever its layers."""

    needs_kv_cache_zeroing = True


def make_scheduler(model_dir: str, *, kvshare: bool, num_blocks: int = 1000, block_size: int = 16,
                   max_num_seqs: int = 16, max_num_batched_tokens: int = 8192,
                   max_model_len: int | None = None, enable_prefix_caching: bool = True,
                   kv_events: bool = False, async_scheduling: bool = False,
                   kv_transfer: dict | None = None, specs: dict | None = None,
                   mamba_cache_mode: str | None = None, watermark: float = 0.0,
                   retention_interval: int | None = None, zeroing: bool = False,
                   eagle: int = 0, eagle_groups: str | None = None) -> Scheduler:
    """``kv_transfer``: a KV connector's ``KVTransferConfig`` fields; the scheduler then builds
    the connector's scheduler side (the KV tensor's size is declared: one float32 K and V
    value per slot, which offloading specs divide into per-block bytes).
    ``specs``: per-layer KV-cache specs (``layer_specs``), grouped by vLLM's own
    ``get_kv_cache_groups``; default one full-attention layer.  ``mamba_cache_mode``: the
    cache config's mode for specs with Mamba layers (``mamba_layer_specs``); the scheduler's
    block sizes are then resolved as EngineCore resolves them.  ``retention_interval``: vLLM
    0.32's ``prefix_cache_retention_interval`` (None, dense, unless given).  ``zeroing``: the
    cache needs KV zeroing (as vLLM's for Mamba layers or mixed precision): the scheduler hands
    new blocks out for zeroing every step (``SchedulerOutput.new_block_ids_to_zero``).
    ``eagle``: EAGLE speculative decoding with that many draft tokens, as the scheduler reads
    its config (``EagleConfig``): lookahead slots, and the manager drops a hit's last block.
    ``eagle_groups``: ``"full"`` or ``"window"``: the model marks those groups as EAGLE's
    (``is_eagle_group``), and only they drop the block."""
    vllm_config = make_vllm_config(
        model_dir, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        enable_prefix_caching=enable_prefix_caching, kv_events=kv_events,
        async_scheduling=async_scheduling, kv_transfer=kv_transfer, watermark=watermark)
    cache_config = vllm_config.cache_config
    if eagle:  # no draft model here: the config as the scheduler reads it
        object.__setattr__(vllm_config, "speculative_config", EagleConfig(eagle))
    if specs is None:
        groups = [KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))]
    else:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

        if API != "0.23.0" and cache_config.kv_cache_layout is None:
            cache_config.kv_cache_layout = "NHD"  # as the engine core resolves it on CPU
        groups = get_kv_cache_groups(vllm_config, dict(specs))
    if eagle_groups is not None:
        import dataclasses

        groups = [dataclasses.replace(g, is_eagle_group=(
            isinstance(g.kv_cache_spec, SlidingWindowSpec) == (eagle_groups == "window")))
            for g in groups]
    tensors = []
    if kv_transfer is not None:
        from vllm.v1.kv_cache_interface import KVCacheTensor
        page = block_size * 2 * 4
        tensors = [KVCacheTensor(size=num_blocks * page, shared_by=["layer"]) if API == "0.23.0"
                   else KVCacheTensor(size=num_blocks * page, layers=["layer"],
                                      layer_stride=num_blocks * page, block_stride=page)]
    config_cls = ZeroingKVCacheConfig if zeroing else KVCacheConfig
    kv_cache_config = config_cls(num_blocks=num_blocks, kv_cache_tensors=tensors,
                                 kv_cache_groups=groups)
    if retention_interval is not None:
        kv_cache_config.prefix_cache_retention_interval = retention_interval
    cache_config.num_gpu_blocks = num_blocks
    sched_kw = {}
    if mamba_cache_mode is not None:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

        cache_config.mamba_cache_mode = mamba_cache_mode
        cache_config.mamba_block_size = next(
            g.kv_cache_spec.block_size for g in groups
            if isinstance(g.kv_cache_spec, MambaSpec))
        block_size, sched_kw["hash_block_size"] = resolve_kv_cache_block_sizes(
            kv_cache_config, vllm_config)
    if kvshare:
        plugin.apply()
    try:
        cls = Scheduler
        if async_scheduling:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler
            cls = AsyncScheduler
        s = cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=block_size,
                log_stats=True, structured_output_manager=StructuredOutputManager(vllm_config),
                **sched_kw)
    finally:
        if kvshare:
            plugin.remove()
    return s


def make_request(req_id: str, prompt: list[int], max_tokens: int = 16, block_size: int = 16,
                 cache_salt: str | None = None, lora_request=None, block_hasher=None,
                 hash_blocks: bool = True, hash_algo: str = "sha256",
                 extra_args: dict | None = None) -> Request:
    """A request as EngineCore builds it; ``hash_blocks=False`` is what the plugin's engine
    does when kvshare manages the cache and KV events are off (no vLLM block hasher).
    ``hash_algo``: vLLM's ``prefix_caching_hash_algo`` (NONE_HASH is re-initialised with it
    when it changes, as EngineCore does at start).  ``extra_args``: the sampling parameters'
    ``extra_args`` (vLLM 0.32 reads ``kv_cache_report_mode`` there)."""
    global _hash_algo
    hash_fn = get_hash_fn_by_name(hash_algo)
    if _hash_algo != hash_algo:
        init_none_hash(hash_fn)
        _hash_algo = hash_algo
    sp = SamplingParams(ignore_eos=True, max_tokens=max_tokens, extra_args=extra_args)
    sp.update_from_generation_config({}, EOS)
    return Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp,
                   pooling_params=None, mm_features=None, cache_salt=cache_salt,
                   lora_request=lora_request,
                   block_hasher=None if not hash_blocks else
                   block_hasher or get_request_block_hasher(block_size, hash_fn))


def lookup(manager, request) -> tuple:
    """``manager.get_computed_blocks(request)`` as (blocks, hit tokens) on either release
    (vLLM 0.32 adds a third value, ``shared_prefix_boundary``: 0 for one group, which
    ``Pair.step`` compares for several) and, as the 0.32 scheduler does at admission, the
    lookup recorded in the prefix-cache stats."""
    res = manager.get_computed_blocks(request)
    if API == "0.23.0":
        return res
    blocks, hit, boundary = res
    assert boundary == 0 or len(blocks.blocks) > 1
    manager.record_prefix_cache_stats(request, hit)
    return blocks, hit


def admit(manager, rid: str, prompt: list[int], kvshare: bool):
    """A request of ``prompt`` looked up and given slots for all of it on ``manager`` directly
    (no scheduler), its tokens marked computed; returns (request, hit tokens)."""
    r = make_request(rid, prompt, hash_blocks=not kvshare)
    blocks, hit = lookup(manager, r)
    assert manager.allocate_slots(r, len(prompt) - hit, hit, blocks) is not None
    r.num_computed_tokens = len(prompt)
    return r, hit


def return_popped(manager, popped: list, kvshare: bool) -> float:
    """vLLM 0.32's end of a deferred free: the blocks ``pop_blocks_for_free`` gave back to
    the block pool, last first (on kvshare's manager, first in the wrong order: refused,
    nothing changed).  Returns the usage after."""
    import pytest

    if kvshare:
        with pytest.raises(ValueError, match="names no request's blocks"):
            manager.block_pool.free_blocks(popped)
        manager.check()
    manager.block_pool.free_blocks(reversed(popped))
    return round(manager.usage, 6)


def token_for(req_id: str, pos: int) -> int:
    """Deterministic 'sampled' token: the same for both managers."""
    return 3 + (hash((req_id, pos)) & 0x7FFF) % 30000


def fake_output(sched_out) -> ModelRunnerOutput:
    req_ids = list(sched_out.num_scheduled_tokens.keys())
    sampled = []
    for rid in req_ids:
        # A request whose prompt is not fully computed after this step samples nothing.
        sampled.append([])
    return req_ids, sampled


def step(s: Scheduler, requests: dict[str, Request], in_flight=None, overlap=False):
    """One engine step: schedule, then feed back one sampled token per request whose prefill
    finished; ``in_flight(s)``, when given, runs between the two, while the step's batch would
    be on the device.  With ``overlap`` two batches are in flight, as in an asynchronous
    engine's batch queue: the previous step's output is fed back after this schedule (an
    ``AsyncScheduler`` schedules on output placeholders meanwhile).  Returns the
    SchedulerOutput and the EngineCoreOutputs."""
    out = s.schedule()
    req_ids = list(out.num_scheduled_tokens.keys())
    sampled = []
    for rid in req_ids:
        r = requests[rid]
        done_prefill = r.num_computed_tokens >= r.num_tokens  # already advanced by schedule()
        sampled.append([token_for(rid, r.num_tokens)] if done_prefill else [])
    mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                            sampled_token_ids=sampled, logprobs=None,
                            prompt_logprobs_dict={}, pooler_output=[])
    if in_flight is not None:
        in_flight(s)
    if not overlap:
        return out, s.update_from_output(out, mro)
    prev, s.kvs_test_in_flight = getattr(s, "kvs_test_in_flight", None), (out, mro)
    return out, (s.update_from_output(*prev) if prev is not None else {})


def connector_copies(meta, num_groups: int = 1) -> list[tuple[int, int, int, int]]:
    """(src, dst, tokens, kind) of each ``kvs_copy`` kvshare's KV connector shipped in a step's
    metadata, each of one of the model's ``num_groups`` groups (page ids are the pool's, shared
    by every group)."""
    import struct

    rows = list(struct.iter_unpack("<5I", meta.copies))
    assert all(r[4] < num_groups for r in rows)
    return [r[:4] for r in rows]


class ShadowWorker:
    """A worker's KV as labels: ``dev[page]`` / ``host[page]`` is the token tuple whose KV the
    page holds (``None``: garbage).  ``apply`` runs a step's copies (``(src, dst, tokens,
    kind)``, kvs_copy kinds) in order; ``compute`` writes the step's tokens; ``check`` verifies
    a request's computed tokens before its step.  A partial copy (a sub-page hit's units) gives
    the destination the first ``tokens`` slots of the source page; a whole-page copy its
    label.  ``skipped[g](c)``: the tokens group ``g`` no longer reads once ``c`` are computed
    (a window's; its pages there may be the null block or stale)."""

    def __init__(self, num_blocks: int, host_pages: int, block_size: int,
                 apply_copies: bool = True, skipped=(lambda c: 0,)):
        self.skipped = skipped
        self.dev = [None] * num_blocks
        self.host = [None] * host_pages
        self.bs = block_size
        self.apply_copies = apply_copies
        self.promotions = 0    # whole pages host -> device
        self.partial = 0       # copies of fewer tokens than a page
        self.hits: dict = {}   # request id -> tokens computed before its first step

    def _cut(self, label, n: int):
        if label is None or n == self.bs:
            return label
        return label[:(len(label) - 1) // self.bs * self.bs + n]

    def apply(self, rows) -> None:
        from kvshare import lib

        for src, dst, n, kind in rows:
            assert 0 < n <= self.bs
            self.partial += n < self.bs
            if not self.apply_copies:
                continue
            if kind == lib.KVS_COPY_KIND_DEVICE_TO_HOST:
                assert n == self.bs, "a demotion moves a whole page"
                self.host[dst] = self.dev[src]
            elif kind == lib.KVS_COPY_KIND_HOST_TO_DEVICE:
                self.dev[dst] = self._cut(self.host[src], n)
                self.promotions += n == self.bs
            elif kind == lib.KVS_COPY_KIND_DEVICE_TO_DEVICE:
                self.dev[dst] = self._cut(self.dev[src], n)
            else:
                raise AssertionError(f"unexpected copy kind {kind}")

    def check(self, rid, tokens, table, computed: int, group: int = 0) -> None:
        bs = self.bs
        for i in range(self.skipped[group](computed) // bs, (computed + bs - 1) // bs):
            end = min((i + 1) * bs, computed)
            want = tuple(tokens[:end])
            got = self.dev[table[i]]
            assert got is not None and got[:end] == want, \
                f"{rid}: block {i} (page {table[i]}) does not hold tokens [0, {end})"

    def compute(self, tokens, table, start: int, end: int) -> None:
        for pos in range(start, end):
            page = table[pos // self.bs]
            assert page, f"token {pos} has the null block"
            self.dev[page] = tuple(tokens[:pos + 1])


def shadow_run(s, shadow: ShadowWorker, pending: list, rng, copies_of,
               max_steps: int = 3000) -> dict:
    """Drives scheduler ``s`` until ``pending`` is served, a few requests at a time, with
    ``shadow`` as the worker: each step's copies (``copies_of(scheduler output)`` as
    ``ShadowWorker.apply`` takes them) run first, then every scheduled request's computed
    tokens are checked and its new ones written.  An item of ``pending`` is a ``Request``, or a
    callable given the finished requests by id that returns one, or None until it can (a
    conversation's next turn).  Returns the finished requests by id."""
    mgr = s.kv_cache_manager
    reqs: dict = {}
    done: dict = {}
    pending = list(pending)
    for _ in range(max_steps):
        while pending and (not reqs or rng.random() < 0.3):
            r = pending[0] if isinstance(pending[0], Request) else pending[0](done)
            if r is None:
                break
            pending.pop(0)
            reqs[r.request_id] = r
            s.add_request(r)
        if not reqs and not pending:
            break
        out = s.schedule()
        shadow.apply(copies_of(out))
        sampled, ids = [], list(out.num_scheduled_tokens)
        for rid in ids:
            r = reqs[rid]
            n = out.num_scheduled_tokens[rid]
            end = r.num_computed_tokens  # schedule() advanced it already
            start = end - n
            tables = mgr.get_block_ids(rid)
            toks = list(r.all_token_ids)
            shadow.hits.setdefault(rid, start)
            for g, table in enumerate(tables):
                shadow.check(rid, toks, table, start, g)
            for table in tables:
                shadow.compute(toks, table, start, end)
            sampled.append([rng.randrange(3, 30000)] if end >= r.num_tokens else [])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled, logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=[])
        s.update_from_output(out, mro)
        for rid in [rid for rid, r in reqs.items() if r.is_finished()]:
            done[rid] = reqs.pop(rid)
    assert not reqs and not pending, "the workload did not finish"
    return done


def engine_runs(installed: str, model_dir: str, workload: dict, configs: dict,
                user_env: tuple[str, ...] = ()):
    """A getter running each named configuration of ``configs`` once, lazily, through
    ``bench/engine_e2e.py`` in a process of its own (the plugin from ``installed``, the model in
    ``model_dir``, ``workload`` under every configuration's own settings), returning
    (measurements, its log output).  ``user_env``: variables removed from the engines'
    environment, so that they run with vLLM's or torch's defaults, as a user has them."""
    import os

    import engine_e2e

    env = dict(os.environ, PYTHONPATH=installed, VLLM_HOST_IP="127.0.0.1")
    for name in user_env:
        env.pop(name, None)
    cache = {}

    def get(name):
        if name not in cache:
            cfg = dict(workload, model_dir=model_dir, **configs[name])
            cache[name] = engine_e2e.run_in_subprocess(cfg, env=env)
        return cache[name]

    return get


def shared_prefix_requests(rng, n: int, prefix_len, tail_len, max_tokens, num_prefixes: int = 4):
    """``n`` requests (``r0``, ``r1``, ...), each one of ``num_prefixes`` shared prefixes (system
    prompts, documents) plus a private tail, drawn from ``rng`` (``prefix_len``, ``tail_len``,
    ``max_tokens``: callables drawing each length), as the engine builds them when kvshare
    manages the cache (no vLLM block hasher).  A generator: the requests are drawn as taken."""
    prefixes = [[rng.randrange(3, 30000) for _ in range(prefix_len())]
                for _ in range(num_prefixes)]
    for i in range(n):
        p = rng.choice(prefixes)
        yield make_request(f"r{i}", p + [rng.randrange(3, 30000) for _ in range(tail_len())],
                           max_tokens=max_tokens(), hash_blocks=False)
