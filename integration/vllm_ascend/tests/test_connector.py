"""kvshare's KV connector (``kvshare_vllm.connector``) without an engine.

* Scheduler side, model-based: vLLM's real ``Scheduler`` with kvshare's manager and the
  connector selected by a ``KVTransferConfig``, under a device budget far below the working
  set, and a shadow worker that executes each step's shipped copies on a model of the KV (each
  page holds a label: the tokens whose KV it carries) and then "computes" the step's tokens
  into the block table.  Before each step every computed token of every scheduled request must
  sit in its block table with the right label: a promotion that did not bring back the demoted
  page, a copy shipped late or out of order, or a page reused before its demotion ran would
  break it.
* Worker side, model-based: ``register_kv_caches`` + ``start_load_kv`` on random KV tensors in
  the layouts the connector knows (kvshare's ``[2, blocks, ...]`` through ``kvs_kv_copy``,
  vLLM CPU's interleaved one through torch), random copy lists, against the same copies applied
  one by one with torch.
"""

from __future__ import annotations

import random
import struct
from types import SimpleNamespace

import pytest
import torch

from harness import (ShadowWorker, connector_copies, make_request, make_vllm_config,
                     shadow_run, shared_prefix_requests)
from kvshare import lib
from kvshare_vllm import connector as conn_mod
from kvshare_vllm import plugin
from kvshare_vllm.connector import KvshareConnector, KvshareConnectorMetadata
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.structured_output import StructuredOutputManager

BS = 16
D2H, H2D = lib.KVS_COPY_KIND_DEVICE_TO_HOST, lib.KVS_COPY_KIND_HOST_TO_DEVICE
D2D = lib.KVS_COPY_KIND_DEVICE_TO_DEVICE


def _ktc(num_host_pages=64, **extra) -> KVTransferConfig:
    return KVTransferConfig(kv_connector="KvshareConnector", kv_role="kv_both",
                            kv_connector_module_path="kvshare_vllm.connector",
                            kv_connector_extra_config=dict(extra, num_host_pages=num_host_pages))


def _scheduler(model_dir, num_blocks: int, host_pages: int, kvshare: bool = True,
               max_num_seqs: int = 4, budget: int = 96):
    vllm_config = make_vllm_config(model_dir, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=budget, max_model_len=2048)
    vllm_config.kv_transfer_config = _ktc(host_pages)
    # Set after construction: what VllmConfig decides when it is built with the connector.
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    if kvshare:
        plugin.apply()
    try:
        return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         block_size=BS, log_stats=True,
                         structured_output_manager=StructuredOutputManager(vllm_config))
    finally:
        if kvshare:
            plugin.remove()


def _run(model_dir, seed: int, apply_copies: bool = True):
    num_blocks, host_pages = 20, 128
    s = _scheduler(model_dir, num_blocks, host_pages)
    mgr = s.kv_cache_manager
    assert type(mgr).__name__ == "KvshareKVCacheManager" and mgr.host_tier is not None
    assert isinstance(s.connector, KvshareConnector)
    rng = random.Random(seed)
    # A few shared prefixes (system prompts, documents) of 3-8 blocks; each request takes one
    # plus a private tail, and they return after others pushed them out of 19 device blocks.
    pending = list(shared_prefix_requests(rng, 40, lambda: rng.randrange(3, 9) * BS,
                                          lambda: rng.randrange(1, 40),
                                          lambda: rng.randrange(1, 12)))
    shadow = ShadowWorker(num_blocks, host_pages, BS, apply_copies)
    shadow_run(s, shadow, pending, rng, lambda out: connector_copies(out.kv_connector_metadata))
    mgr.check()
    return mgr.kvshare_stats(), shadow, s.connector


@pytest.mark.parametrize("seed", range(6))
def test_shipped_copies_keep_every_hit_right(tiny_model_dir, seed):
    stats, shadow, connector = _run(tiny_model_dir, seed)
    # The workload exercises the host tier: pages went down and came back, some by prefetch.
    assert stats["demotions"] > 0 and stats["promotions"] > 0
    assert shadow.promotions == stats["promotions"]
    assert stats["pending_copies"] == 0


def test_skipped_copies_are_caught(tiny_model_dir):
    """The check above can fail: the same run with the shipped copies dropped."""
    with pytest.raises(AssertionError, match="does not hold tokens"):
        _run(tiny_model_dir, 0, apply_copies=False)


def test_waiting_requests_are_prefetched(tiny_model_dir):
    """A waiting request's host-tier prefix is promoted while another request runs."""
    s = _scheduler(tiny_model_dir, 16, 64, max_num_seqs=1)

    hit = {}  # request id -> tokens computed before its first step (its prefix hit)

    def run_all(rs):
        by_id = {r.request_id: r for r in rs}
        for r in rs:
            s.add_request(r)
        while any(not r.is_finished() for r in rs):
            out = s.schedule()
            ids = list(out.num_scheduled_tokens)
            for i in ids:
                hit.setdefault(i, by_id[i].num_computed_tokens - out.num_scheduled_tokens[i])
            sampled = [[7] if by_id[i].num_computed_tokens >= by_id[i].num_tokens else []
                       for i in ids]
            s.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                pooler_output=[]))

    doc = list(range(100, 100 + 6 * BS))
    run_all([make_request("a", doc + [1, 2, 3], max_tokens=1, hash_blocks=False)])
    # b takes every device page: doc's six cached pages go to the host tier.
    run_all([make_request("b", list(range(5000, 5000 + 14 * BS)) + [4, 5], max_tokens=1,
                          hash_blocks=False)])
    assert s.kv_cache_manager.kvshare_stats()["demotions"] >= 6
    before = s.connector.prefetched_pages
    c = make_request("c", list(range(9000, 9020)), max_tokens=8, hash_blocks=False)
    d = make_request("d", doc + [8], max_tokens=1, hash_blocks=False)
    run_all([c, d])  # d waits behind c (max_num_seqs=1): its prefix is prefetched meanwhile
    assert s.connector.prefetched_pages - before == 6
    assert hit["d"] == 6 * BS


def test_host_pages_option(tiny_model_dir):
    assert conn_mod.host_pages(SimpleNamespace(kv_transfer_config=None)) is None
    assert conn_mod.host_pages(SimpleNamespace(kv_transfer_config=_ktc(7))) == 7
    assert conn_mod.host_pages(SimpleNamespace(kv_transfer_config=_ktc(0))) == 0
    no_pages = _ktc()
    del no_pages.kv_connector_extra_config["num_host_pages"]
    assert conn_mod.host_pages(SimpleNamespace(kv_transfer_config=no_pages)) == 0
    for bad in (-1, "8", None, True):
        with pytest.raises(ValueError, match="num_host_pages"):
            conn_mod.host_pages(SimpleNamespace(kv_transfer_config=_ktc(bad)))


def test_connector_needs_kvshare_manager(tiny_model_dir):
    """With vLLM's own manager the connector refuses to run (it would copy nothing)."""
    with pytest.raises(RuntimeError, match="needs kvshare's KV-cache manager"):
        _scheduler(tiny_model_dir, 32, 16, kvshare=False)


def test_without_connector_no_host_tier(tiny_model_dir):
    from harness import make_scheduler

    s = make_scheduler(tiny_model_dir, kvshare=True, num_blocks=32)
    assert s.kv_cache_manager.host_tier is None
    assert s.kv_cache_manager.cache.stats()["host_pages_total"] == 0


# ------------------------------------------------------------------ worker side
def _worker(spec, host_pages: int, cache_dtype: str = "auto") -> KvshareConnector:
    kcc = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec)])
    cfg = SimpleNamespace(kv_transfer_config=_ktc(host_pages),
                          cache_config=SimpleNamespace(cache_dtype=cache_dtype))
    return KvshareConnector(cfg, KVConnectorRole.WORKER, kcc)


def _shape(layout: str, blocks: int, heads: int, hd: int) -> tuple:
    return (2, blocks, BS, heads, hd) if layout == "kvshare" else (blocks, heads, BS, 2 * hd)


@pytest.mark.parametrize("layout", ["kvshare", "vllm_cpu"])
@pytest.mark.parametrize("cache_dtype", ["auto", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("seed", range(4))
def test_worker_copies_match_torch(layout, cache_dtype, seed):
    """Random copy lists (demotions, promotions, sub-page hits' partial copies) against
    torch's; an fp8 cache (vLLM's uint8 tensor, random bytes: every
    code, NaN and infinity included) is copied byte for byte, into a host pool of one byte an
    element."""
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    blocks, host_pages, heads, hd = 10, 6, 2, 8
    spec = SimpleNamespace(block_size=BS, num_kv_heads=heads, head_size=hd)
    shape = _shape(layout, blocks, heads, hd)
    fp8 = cache_dtype != "auto"
    dtype = torch.uint8 if fp8 else torch.float32

    def new():
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8) if fp8 \
            else torch.randn(shape, generator=g)

    caches = {f"l{i}": new() for i in range(3)}
    w = _worker(spec, host_pages, cache_dtype)
    w.register_kv_caches(caches)
    dim = 1 if layout == "kvshare" else 0
    host_shape = [host_pages if i == dim else s for i, s in enumerate(shape)]
    pools = [t for layer in w._layers for t in layer.host]
    assert len(pools) == 3 and all(t.dtype == dtype and list(t.shape) == host_shape
                                   for t in pools)
    if fp8:  # one byte an element: the host pool holds host_pages pages of the cache's bytes
        page_bytes = caches["l0"].select(dim, 0).nbytes
        assert all(t.nbytes == host_pages * page_bytes == t.numel() for t in pools)
    ref = {k: v.clone() for k, v in caches.items()}
    ref_host = {k: torch.zeros(host_shape, dtype=dtype) for k in caches}
    # First a page down and back up into another block: byte-identical to the original.
    first = [(3, 1, BS, D2H, 0), (1, 7, BS, H2D, 0)]
    original = caches["l1"].select(dim, 3).clone()
    for step in range(6):
        rows = list(first) if step == 0 else []
        for _ in range(0 if step == 0 else rng.randrange(0, 12)):
            kind = rng.choice([D2H, H2D, D2D])
            src = rng.randrange(host_pages if kind == H2D else blocks)
            dst = rng.randrange(host_pages if kind == D2H else blocks)
            # A sub-page hit's units: the first slots, from a device or host page.
            n = BS if kind == D2H or rng.random() < 0.5 else rng.randrange(1, BS // 4) * 4
            rows.append((src, dst, n, kind, 0))
        for src, dst, n, kind, _ in rows:
            # kvshare's layout takes the first n slots (dimension 1 of a page); vLLM's CPU
            # layout copies whole blocks (its kernels order a block's slots their own way).
            def cut(t):
                return t[:, :n] if layout == "kvshare" else t

            for k in caches:
                d, h = ref[k], ref_host[k]
                if kind == D2H:
                    cut(h.select(dim, dst)).copy_(cut(d.select(dim, src)))
                elif kind == H2D:
                    cut(d.select(dim, dst)).copy_(cut(h.select(dim, src)))
                else:
                    cut(d.select(dim, dst)).copy_(cut(d.select(dim, src)))
        w.bind_connector_metadata(KvshareConnectorMetadata(
            b"".join(struct.pack("<5I", *r) for r in rows)))
        w.start_load_kv(None)
        w.clear_connector_metadata()
        if step == 0:
            assert torch.equal(caches["l1"].select(dim, 7), original)
        for k, layer in zip(caches, w._layers):
            assert torch.equal(caches[k], ref[k]), k
            assert torch.equal(layer.host[0], ref_host[k]), k
    assert w.copies_done > 0


@pytest.mark.parametrize("layout", ["kvshare", "vllm_cpu"])
def test_worker_refuses_uint8_cache_without_format(layout):
    """A uint8 cache of an engine whose kv_cache_dtype names no fp8 format: its bytes could be
    anything, so the connector refuses it rather than copy it as some format."""
    spec = SimpleNamespace(block_size=BS, num_kv_heads=2, head_size=8)
    w = _worker(spec, 4)
    with pytest.raises(TypeError, match="uint8 needs kv_format"):
        w.register_kv_caches({"l0": torch.zeros(_shape(layout, 3, 2, 8), dtype=torch.uint8)})


@pytest.mark.parametrize("cache_dtype", ["fp8_inc", "fp8_ds_mla", "int8_per_token_head",
                                         "fp8_per_token_head", "turboquant_k8v4", "nvfp4"])
def test_connector_refuses_cache_dtypes_it_cannot_carry(cache_dtype):
    spec = SimpleNamespace(block_size=BS, num_kv_heads=2, head_size=8)
    with pytest.raises(ValueError, match=f"kv_cache_dtype '{cache_dtype}' is not a format"):
        _worker(spec, 4, cache_dtype)


def test_worker_refuses_unknown_layout():
    spec = SimpleNamespace(block_size=BS, num_kv_heads=2, head_size=8)
    w = _worker(spec, 4)
    with pytest.raises(NotImplementedError, match="not a layout"):
        w.register_kv_caches({"l0": torch.zeros(3, 5, 7)})


def _hybrid_run(model_dir, host_pages: int, reset: list | None = None):
    """A sliding-window + full model (gpt-oss layout, window 64) under pressure: six
    conversations sharing a 192-token system prompt, two turns each (with ``reset``, a list,
    the prefix cache reset between them; the manager's stats then land in the list).  Returns
    the outputs, the manager, (lookups, hit tokens, looked-up tokens) and the copies shipped
    per step."""
    import harness as h

    kt = None if not host_pages else dict(
        kv_connector="KvshareConnector", kv_connector_module_path="kvshare_vllm.connector",
        kv_role="kv_both", kv_connector_extra_config={"num_host_pages": host_pages})
    s = h.make_scheduler(model_dir, kvshare=True, num_blocks=48, max_model_len=400,
                         specs=h.layer_specs("gpt-oss", size=64), kv_transfer=kt)
    m = s.kv_cache_manager
    assert type(m).__name__ == "KvshareKVCacheManager"
    looked = [0, 0, 0]
    real = m.get_computed_blocks

    def counted(r):
        res = real(r)  # (blocks, hit), vLLM 0.32 adds the shared-prefix boundary
        looked[0] += 1
        looked[1] += res[1]
        looked[2] += r.num_tokens
        return res

    m.get_computed_blocks = counted
    rng = random.Random(0)
    system = [rng.randrange(3, 30000) for _ in range(192)]
    hist = {c: system + [rng.randrange(3, 30000) for _ in range(24)] for c in range(6)}
    reqs, shipped = {}, []
    for turn in range(2):
        for c in range(6):
            r = h.make_request(f"c{c}t{turn}", hist[c], max_tokens=64, hash_blocks=False)
            reqs[r.request_id] = r
            s.add_request(r)
        for _ in range(400):
            if not s.has_unfinished_requests():
                break
            out, _ = h.step(s, reqs)
            meta = out.kv_connector_metadata
            if meta is not None:
                shipped.extend(struct.iter_unpack("<5I", meta.copies))
            m.check()
        for c in range(6):
            r = reqs[f"c{c}t{turn}"]
            assert r.is_finished()
            hist[c] = list(r.all_token_ids) + [rng.randrange(3, 30000) for _ in range(24)]
        if reset is not None and not turn:
            cache = m.cache
            assert s.reset_prefix_cache()
            assert m.cache is cache and m.kvshare_stats()["index_pages"] == 0
            shipped.clear()
            reset.append(m.kvshare_stats())
    return {k: list(r.output_token_ids) for k, r in reqs.items()}, m, looked, shipped


def test_hybrid_model_gets_the_host_tier(tiny_model_dir):
    """kvshare's connector keeps vLLM's KV-cache groups (``SupportsHMA``) and the hybrid manager
    gets the host tier: the same outputs as without it, pages demoted and promoted, every copy
    shipped (with a group of the model), the manager's mirror checked every step, and fewer
    tokens recomputed."""
    plain_out, plain, plain_looked, none = _hybrid_run(tiny_model_dir, 0)
    host_out, m, looked, shipped = _hybrid_run(tiny_model_dir, 256)
    assert plain.host_tier is None and not none
    assert m.host_tier is not None and host_out == plain_out
    st = m.kvshare_stats()
    assert st["demotions"] > 0 and st["promotions"] > 0 and st["host_hit_tokens"] > 0
    assert len(shipped) == st["demotions"] + st["promotions"]
    assert {c[3] for c in shipped} == {D2H, H2D} and {c[4] for c in shipped} <= {0, 1}
    assert looked[2] - looked[1] < plain_looked[2] - plain_looked[1]


def test_hybrid_host_tier_after_a_prefix_cache_reset(tiny_model_dir):
    """A prefix-cache reset clears kvshare's cache in place (its device and host
    indexes): the second turn's copies are its own demotions and promotions, shipped, with the
    outputs of the run without the host tier."""
    plain_out, _, _, _ = _hybrid_run(tiny_model_dir, 0, reset=[])
    at_reset = []
    host_out, m, _, shipped = _hybrid_run(tiny_model_dir, 256, reset=at_reset)
    assert host_out == plain_out
    st, before = m.kvshare_stats(), at_reset[0]
    moved = st["demotions"] - before["demotions"] + st["promotions"] - before["promotions"]
    assert st["demotions"] > before["demotions"] and len(shipped) == moved


def test_the_last_connector_half_closes_the_pool_client(monkeypatch):
    """vLLM's ``shutdown`` of each connector half releases the process's Mooncake client: the
    staging buffer of each half is unregistered, the last release closes the client (which
    unmounts its segment); a close that hangs (a master gone) is not waited for past
    ``CLOSE_WAIT_S``; with the breaker open nothing is asked of the store."""
    import threading
    import time

    from kvshare_vllm import pool_tier

    class Client:
        def __init__(self):
            self.closed = 0

        def close(self):
            self.closed += 1

    class IO:
        def __init__(self, open_=False):
            self.breaker = SimpleNamespace(is_open=lambda: open_)
            self.closed = 0

        def close(self):
            self.closed += 1

    settings = {"master": "h:1", "local_host": "127.0.0.1"}
    key = ("h:1", "127.0.0.1")
    client = Client()
    monkeypatch.setitem(pool_tier._CLIENTS, key, [client, 2])  # scheduler and worker halves
    sched, worker = IO(), IO()
    pool_tier.release_client(settings, sched)
    assert sched.closed == 1 and client.closed == 0 and key in pool_tier._CLIENTS
    pool_tier.release_client(settings, worker)
    assert worker.closed == 1 and client.closed == 1 and key not in pool_tier._CLIENTS
    pool_tier.release_client(settings, IO())  # released already: nothing
    assert client.closed == 1

    gate = threading.Event()
    hanging = SimpleNamespace(close=gate.wait)
    monkeypatch.setitem(pool_tier._CLIENTS, key, [hanging, 1])
    monkeypatch.setattr(pool_tier, "CLOSE_WAIT_S", 0.2)
    t = time.monotonic()
    pool_tier.release_client(settings, IO())
    assert time.monotonic() - t < 2.0 and key not in pool_tier._CLIENTS
    gate.set()

    dead = Client()
    monkeypatch.setitem(pool_tier._CLIENTS, key, [dead, 1])
    io = IO(open_=True)
    pool_tier.release_client(settings, io)
    assert dead.closed == 0 and io.closed == 0 and key not in pool_tier._CLIENTS
