"""vLLM 0.23.0's Scheduler with a KV connector's scheduler side, with vLLM's KVCacheManager and
with kvshare's, in lockstep: external tokens (``num_external_computed_tokens``), asynchronous
loads (``delay_cache_blocks``, ``WAITING_FOR_REMOTE_KVS``), load failures and aborts while
receiving.  No worker runs: a fake worker per side reads *that side's* connector metadata each
step and reports what the connector's worker would (stores written, load jobs completed, a
failed block), so each side's connector sees only what its own scheduler produced.

Every step both sides must agree on the tokens scheduled, computed tokens, local and external
(connector) prefix hits, blocks in use, preemptions, request states, sampled tokens and the
connector metadata built, with block ids translated through the pairing of the two managers'
block tables (which must be one-to-one: two requests share a block on one side exactly when
they share it on the other).  A wrong hit from kvshare, e.g. a page of a transfer still in
flight found by a prefix lookup, surfaces as a different schedule or load job.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import harness as h
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import RequestStatus
from kvshare_vllm import compat

BS = 16


def example_config(path) -> dict:
    return {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(path)}}


def offloading_config(cpu_blocks: int, policy: str = "recompute", chunk: int = 1) -> dict:
    # CPUOffloadingSpec sizes its pool in bytes: one offloaded block (``chunk`` device blocks)
    # is chunk x BS slots x (K, V) x float32, on vLLM 0.32 rounded up to the memory page (its
    # shared offload region's alignment).
    block = chunk * BS * 2 * 4
    if compat.manager_api() != "0.23.0":
        import mmap

        block = -(-block // mmap.PAGESIZE) * mmap.PAGESIZE
    extra = {"cpu_bytes_to_use": cpu_blocks * block}
    if chunk > 1:
        extra["block_size"] = chunk * BS  # tokens per offloaded block
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_load_failure_policy": policy, "kv_connector_extra_config": extra}


class ExampleWorker:
    """The example connector's worker side: a store (``is_store``) writes the request's
    folder (the scheduler side's ``_found_match_for_prompt`` then sees it); loads are
    synchronous and need no report."""

    def __init__(self, connector):
        self.c = connector
        self.loads = 0

    def after(self, sched_out) -> KVConnectorOutput | None:
        for req in sched_out.kv_connector_metadata.requests:
            if req.is_store:
                self.c._generate_foldername_debug(req.token_ids, req.mm_hashes,
                                                  create_folder=True)
            else:
                self.loads += 1
        return None


class OffloadingWorker:
    """The offloading connector's worker side as the scheduler sees it: a load job completes
    ``load_delay`` steps after the step that issued it (and reports its request in
    ``finished_recving``), a store job ``store_delay`` steps after, a job in
    ``jobs_to_flush`` at once; every ``fail_every``-th load job reports the second block it
    was loading into (the first when it loads one) as invalid, as a failed transfer does."""

    def __init__(self, load_delay=1, store_delay=1, fail_every=0):
        self.load_delay, self.store_delay, self.fail_every = load_delay, store_delay, fail_every
        self.pending: dict[int, tuple[int, str | None, list[int] | None]] = {}
        self.step = 0
        self.loads = self.stores = self.failed = 0

    def after(self, sched_out) -> KVConnectorOutput:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata)

        meta = sched_out.kv_connector_metadata
        self.step += 1
        for jid, job in meta.load_jobs.items():
            self.loads += 1
            dst = np.asarray(_job_specs(job)[1].block_ids).tolist()
            bad = None
            if self.fail_every and self.loads % self.fail_every == 0:
                bad = [dst[1] if len(dst) > 1 else dst[0]]
            self.pending[jid] = (self.step + self.load_delay, job.req_id, bad)
        for jid in meta.store_jobs:
            self.stores += 1
            self.pending[jid] = (self.step + self.store_delay, None, None)
        for jid in meta.jobs_to_flush or ():
            if jid in self.pending:
                _, rid, bad = self.pending[jid]
                self.pending[jid] = (self.step, rid, bad)
        done = sorted(j for j, (due, _, _) in self.pending.items() if due <= self.step)
        wmeta = OffloadingWorkerMetadata()
        recving, invalid = set(), set()
        for jid in done:
            _, rid, bad = self.pending.pop(jid)
            wmeta.mark_completed(jid)
            if rid is not None:
                recving.add(rid)
            if bad:
                self.failed += 1
                invalid.update(bad)
        return KVConnectorOutput(finished_recving=recving or None,
                                 kv_connector_worker_meta=wmeta if done else None,
                                 invalid_block_ids=invalid)


class Side:
    def __init__(self, model_dir, kvshare: bool, kv_transfer: dict, worker, **kw):
        self.s = h.make_scheduler(model_dir, kvshare=kvshare, kv_transfer=kv_transfer, **kw)
        self.kvshare = kvshare
        self.reqs: dict = {}
        self.worker = worker(self.s.connector)
        self.hits = self.ext_hits = self.ext_queries = 0


def _block_map(ref: Side, kvs: Side, where: str) -> dict[int, int]:
    """vLLM's block id -> kvshare's page id, from every request's table in every group on
    either side; asserts the null block sits at the same positions and the pairing of the
    others is one-to-one."""
    fwd: dict[int, int] = {0: 0}
    back: dict[int, int] = {0: 0}
    for rid in sorted(set(ref.s.requests) | set(kvs.s.requests)):
        ga = ref.s.kv_cache_manager.get_block_ids(rid)
        gb = kvs.s.kv_cache_manager.get_block_ids(rid)
        assert len(ga) == len(gb), f"{where}: {len(ga)} vs {len(gb)} groups"
        for g, (a, b) in enumerate(zip(ga, gb)):
            assert len(a) == len(b), \
                f"{where}: {rid} holds {len(a)} vs {len(b)} blocks in group {g}"
            assert [x == 0 for x in a] == [y == 0 for y in b], \
                f"{where}: {rid}'s null blocks differ in group {g}"
            for x, y in zip(a, b):
                assert fwd.setdefault(x, y) == y and back.setdefault(y, x) == x, \
                    f"{where}: block sharing differs ({rid}, group {g})"
    return fwd


def _job_specs(job) -> tuple:
    """A transfer job's (source, destination) specs (vLLM 0.32 names them)."""
    if hasattr(job, "dst_spec"):
        return job.src_spec, job.dst_spec
    return job.transfer_spec


def _spec(spec, bmap) -> tuple:
    """A transfer spec as comparable data; GPU block ids through ``bmap``."""
    ids = np.asarray(spec.block_ids).tolist()
    if hasattr(spec, "group_sizes"):  # GPULoadStoreSpec
        return ("GPU", [bmap[b] for b in ids], list(spec.group_sizes),
                list(spec.block_indices))
    return (type(spec).__name__, ids)


def _meta(meta, bmap, bs: int) -> tuple:
    """A step's connector metadata as comparable data (block ids through ``bmap``)."""
    if hasattr(meta, "load_jobs"):  # OffloadingConnectorMetadata
        def jobs(d):
            return {j: (t.req_id, *(_spec(x, bmap) for x in _job_specs(t)))
                    for j, t in d.items()}
        return ("offload", jobs(meta.load_jobs), jobs(meta.store_jobs),
                sorted(meta.jobs_to_flush or ()))
    out = []
    for r in meta.requests:  # ExampleConnectorMetadata
        slots = r.slot_mapping.tolist()
        out.append((r.token_ids.tolist(), [bmap[s // bs] * bs + s % bs for s in slots],
                    r.is_store, list(r.mm_hashes)))
    return ("example", out)


# The connectors here are vLLM's own (not kvshare's).


class ConnPair:
    """The same workload on both sides, compared every step (see the module docstring)."""

    def __init__(self, model_dir, kv_transfer, worker, **kw):
        self.ref = Side(model_dir, False, kv_transfer(0), worker, **kw)
        self.kvs = Side(model_dir, True, kv_transfer(1), worker, **kw)
        assert type(self.kvs.s.kv_cache_manager).__name__ == "KvshareKVCacheManager"
        assert type(self.ref.s.kv_cache_manager).__name__ == "KVCacheManager"
        self.steps = 0
        self.waited_remote = 0  # request-steps spent in WAITING_FOR_REMOTE_KVS
        self.remote_nulls = 0  # those with a null block (a window dropped loaded tokens)
        self.preemptions = 0

    def add(self, rid, prompt, max_tokens=16, **kw):
        for side in (self.ref, self.kvs):
            # A connector reads vLLM's block hashes: the plugin keeps the hasher with one.
            r = h.make_request(rid, prompt, max_tokens=max_tokens, block_size=BS, **kw)
            side.reqs[rid] = r
            side.s.add_request(r)

    def abort(self, rid):
        for side in (self.ref, self.kvs):
            side.s.finish_requests([rid], RequestStatus.FINISHED_ABORTED)

    def status(self, rid):
        return self.ref.reqs[rid].status

    def step(self):
        self.steps += 1
        where = f"step {self.steps}"
        o1, o2 = self.ref.s.schedule(), self.kvs.s.schedule()
        assert o1.num_scheduled_tokens == o2.num_scheduled_tokens, where
        n1 = {r.req_id: (r.num_computed_tokens, len(r.block_ids[0])) for r in o1.scheduled_new_reqs}
        n2 = {r.req_id: (r.num_computed_tokens, len(r.block_ids[0])) for r in o2.scheduled_new_reqs}
        assert n1 == n2, f"{where}: new requests (computed tokens, blocks) differ"
        c1, c2 = o1.scheduled_cached_reqs, o2.scheduled_cached_reqs
        assert (c1.req_ids, c1.num_computed_tokens) == (c2.req_ids, c2.num_computed_tokens), where
        assert o1.preempted_req_ids == o2.preempted_req_ids, where
        self.preemptions += len(o1.preempted_req_ids or ())
        assert o1.finished_req_ids == o2.finished_req_ids, where
        # Every request's state and computed tokens (external tokens included: an async load
        # sets them at admission), and the blocks each holds, paired one-to-one.
        st1 = {r: (q.status, q.num_computed_tokens) for r, q in self.ref.s.requests.items()}
        st2 = {r: (q.status, q.num_computed_tokens) for r, q in self.kvs.s.requests.items()}
        assert st1 == st2, f"{where}: request states differ"
        remote = [r for r, (s, _) in st1.items() if s == RequestStatus.WAITING_FOR_REMOTE_KVS]
        self.waited_remote += len(remote)
        self.remote_nulls += sum(any(0 in t for t in self.ref.s.kv_cache_manager.get_block_ids(r))
                                 for r in remote)
        bmap = _block_map(self.ref, self.kvs, where)
        m1, m2 = o1.kv_connector_metadata, o2.kv_connector_metadata
        assert _meta(m1, bmap, BS) == _meta(m2, {v: v for v in bmap.values()}, BS), \
            f"{where}: connector metadata differs"
        ecos = []
        for side, o in ((self.ref, o1), (self.kvs, o2)):
            req_ids = list(o.num_scheduled_tokens)
            sampled = []
            for rid in req_ids:
                r = side.reqs[rid]
                sampled.append([h.token_for(rid, r.num_tokens)]
                               if r.num_computed_tokens >= r.num_tokens else [])
            mro = ModelRunnerOutput(req_ids=req_ids,
                                    req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                    sampled_token_ids=sampled, logprobs=None,
                                    prompt_logprobs_dict={}, pooler_output=[],
                                    kv_connector_output=side.worker.after(o))
            eco = side.s.update_from_output(o, mro)
            ecos.append(eco)
            for co in eco.values():
                st = co.scheduler_stats
                if st is None:
                    continue
                if st.prefix_cache_stats is not None:
                    side.hits += st.prefix_cache_stats.hits
                if st.connector_prefix_cache_stats is not None:
                    side.ext_hits += st.connector_prefix_cache_stats.hits
                    side.ext_queries += st.connector_prefix_cache_stats.queries
        assert _tokens(ecos[0]) == _tokens(ecos[1]), f"{where}: token results differ"
        assert (self.ref.hits, self.ref.ext_hits, self.ref.ext_queries) == \
            (self.kvs.hits, self.kvs.ext_hits, self.kvs.ext_queries), \
            f"{where}: local / external prefix hits differ"
        u1, u2 = self.ref.s.kv_cache_manager.usage, self.kvs.s.kv_cache_manager.usage
        assert u1 == pytest.approx(u2), f"{where}: usage {u1} vs {u2}"
        self.kvs.s.kv_cache_manager.check()
        return o1, o2

    def run_until_idle(self, limit=2000):
        for _ in range(limit):
            if not self.ref.s.has_unfinished_requests() and \
                    not self.kvs.s.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("did not drain")


def _tokens(eco) -> dict:
    return {o.request_id: (list(o.new_token_ids), o.finish_reason)
            for client in eco.values() for o in client.outputs}


def _prompts(seed: int, n: int) -> list[list[int]]:
    """``n`` prompts of 49 tokens (3 full blocks + 1) sharing a 32-token prefix by pairs; with
    16 output tokens every request ends with 4 full blocks, all cached at free, so the two
    managers' eviction orders agree (see test_scheduler_compare.test_kv_events_match_vllm)."""
    rng = random.Random(seed)
    heads = [[rng.randrange(3, 30000) for _ in range(32)] for _ in range((n + 1) // 2)]
    return [heads[k // 2] + [rng.randrange(3, 30000) for _ in range(17)] for k in range(n)]


def test_example_connector_lockstep(tiny_model_dir, tmp_path):
    """vLLM's example (shared-storage) connector: synchronous external loads.  It stores a
    prompt's first 48 tokens and finds them for a prompt one token longer (its "cached prompt
    + one generated token" convention), so later waves send the first wave's prompts plus a
    token.  With the device cache reset after the first wave, the second finds its 48 tokens
    in storage only: external tokens, allocated and cached in allocate_slots (the third wave
    then hits them locally)."""
    pair = ConnPair(tiny_model_dir, lambda i: example_config(tmp_path / f"side{i}"),
                    ExampleWorker, num_blocks=200, max_num_seqs=4)
    prompts = _prompts(1, 8)
    for wave in range(3):
        for k, p in enumerate(prompts):
            if wave:
                pair.add(f"w{wave}r{k}", p + [7], max_tokens=15)  # 65 tokens at the end
            else:
                pair.add(f"w{wave}r{k}", p)
            if k % 3 == 2:
                pair.step()
        pair.run_until_idle()
        if wave == 0:
            assert pair.ref.s.reset_prefix_cache() and pair.kvs.s.reset_prefix_cache()
    assert pair.ref.ext_hits > 0 and pair.ref.worker.loads > 0
    assert pair.ref.hits > 0


@pytest.mark.parametrize("num_blocks,policy,chunk", [(200, "recompute", 1), (200, "fail", 1),
                                                     (28, "recompute", 1), (28, "fail", 1),
                                                     (200, "recompute", 2)])
def test_offloading_connector_lockstep(tiny_model_dir, num_blocks, policy, chunk):
    """vLLM's offloading connector with its CPU spec: every prompt block is stored to the CPU
    tier; requests whose prefix left the device (a reset, or eviction with 28 blocks) load it
    back asynchronously (WAITING_FOR_REMOTE_KVS, delayed caching).  Load jobs take 2 steps, so
    requests with the same prefix arrive while the first load is in flight (the connector
    delays them; kvshare must not find the transfer's pages before cache_blocks); every 4th
    load fails one block (recompute: truncated and cached up to the failure, or freed; fail:
    the request ends with an error), and a request is aborted while receiving.  ``chunk`` 2:
    offloaded blocks of two device blocks (stores and loads in whole chunks).  With 28 blocks a
    failed request's never-cached pages rejoin the free queue where vLLM's do, so eviction
    stays in lockstep under pressure too."""
    pair = ConnPair(tiny_model_dir, lambda i: offloading_config(64, policy, chunk),
                    lambda c: OffloadingWorker(load_delay=2, store_delay=1, fail_every=4),
                    num_blocks=num_blocks, max_num_seqs=4)
    prompts = _prompts(2, 10)
    aborted = 0
    for wave in range(3):
        for k, p in enumerate(prompts):
            pair.add(f"w{wave}r{k}", p)
            if k % 2 == 1:
                pair.step()
                waiting = sorted(r for r, q in pair.ref.s.requests.items()
                                 if q.status == RequestStatus.WAITING_FOR_REMOTE_KVS)
                if waiting and wave >= 1 and aborted < 2:
                    pair.abort(waiting[0])
                    aborted += 1
        pair.run_until_idle()
        for _ in range(3):  # lets the last stores complete
            pair.step()
        if wave == 0 and num_blocks == 200:
            assert pair.ref.s.reset_prefix_cache() and pair.kvs.s.reset_prefix_cache()
    w = pair.ref.worker
    assert pair.ref.ext_hits > 0 and w.loads > 0 and w.stores > 0 and w.failed > 0
    assert pair.waited_remote > 0
    assert aborted > 0
    st = pair.kvs.s.kv_cache_manager.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0


def test_delayed_pages_are_not_found_before_the_load_lands(tiny_model_dir):
    """Driven directly: a request admitted with an asynchronous load holds pages for its
    external tokens, but a prefix lookup finds none of them until cache_blocks after the
    load; then it finds them all.  The block objects carry vLLM's block hash exactly on the
    locally cached pages (what the offloading connector reads to start its load)."""
    m = h.make_scheduler(tiny_model_dir, kvshare=True, num_blocks=64).kv_cache_manager
    assert type(m).__name__ == "KvshareKVCacheManager"
    prompt = list(range(100, 165))  # 65 tokens: 4 full blocks
    a = h.make_request("a", prompt)
    blocks, hit = h.lookup(m, a)
    assert hit == 0
    m.allocate_slots(a, 17, 0, blocks)  # computes the first 17 tokens: block 0 registered
    a.num_computed_tokens = 17
    m.free(a)
    b = h.make_request("b", prompt)
    blocks, hit = h.lookup(m, b)
    assert hit == 16
    new = m.allocate_slots(b, 0, hit, blocks, num_external_computed_tokens=48,
                           delay_cache_blocks=True)
    assert new is not None and not new.blocks[0]  # vLLM returns no block past the external
    table = m.get_blocks("b").blocks[0]
    assert len(table) == 4
    assert [blk.block_hash is not None for blk in table] == [True, False, False, False]
    assert table[0].block_hash[:-4] == b.block_hashes[0]
    c = h.make_request("c", prompt)
    assert h.lookup(m, c)[1] == 16  # the transfer's pages are not findable
    m._pending = None
    b.num_computed_tokens = 64
    m.cache_blocks(b, 64)
    assert h.lookup(m, c)[1] == 64
    m.check()


def test_a_connector_that_binds_vllms_internals_is_refused():
    """A scheduler side that takes vLLM's BlockPool (``bind_gpu_block_pool``) or KVCacheManager
    (``bind_kv_cache_manager``, vLLM 0.32's HiSparse connector) is refused by name; one that
    overrides neither is served."""
    from kvshare_vllm.plugin import connector_reason

    class TakesPool:
        def bind_gpu_block_pool(self, pool):
            pass

    class TakesManager:
        def bind_kv_cache_manager(self, manager):
            pass

    assert "BlockPool (bind_gpu_block_pool)" in connector_reason(TakesPool())
    assert "KVCacheManager (bind_kv_cache_manager)" in connector_reason(TakesManager())
    assert connector_reason(object()) is None and connector_reason(None) is None


@pytest.mark.parametrize("connector,managed", [("ExampleConnector", True),
                                               ("OffloadingConnector", True),
                                               ("SimpleCPUOffloadConnector", False)])
def test_plugin_serves_connectors_using_the_public_surface(tiny_model_dir, tmp_path, connector,
                                                           managed):
    """With a KV connector configured the plugin keeps kvshare's manager, except for a
    connector whose scheduler side takes vLLM's BlockPool (bind_gpu_block_pool): then
    vLLM's own manager is built."""
    cfgs = {"ExampleConnector": example_config(tmp_path),
            "OffloadingConnector": offloading_config(64),
            "SimpleCPUOffloadConnector": {"kv_connector": "SimpleCPUOffloadConnector",
                                          "kv_role": "kv_both",
                                          "kv_connector_extra_config":
                                              offloading_config(64)["kv_connector_extra_config"]}}
    s = h.make_scheduler(tiny_model_dir, kvshare=True, kv_transfer=cfgs[connector],
                         num_blocks=64)
    assert type(s.connector).__name__ == connector
    assert (type(s.kv_cache_manager).__name__ == "KvshareKVCacheManager") is managed


@pytest.mark.skipif(compat.manager_api() == "0.23.0", reason="vLLM 0.32's deferred frees")
def test_deferred_frees_keep_kvshare(tiny_model_dir, tmp_path, monkeypatch):
    """A consuming KV connector with several batches in flight (GPU async scheduling or
    pipeline parallelism; vLLM's CPU platform turns async scheduling off, so the config's
    ``max_concurrent_batches`` says 2 here) makes vLLM 0.32's scheduler defer block frees:
    the plugin keeps kvshare's manager (one group and several).  Sub-page hits through
    vLLM's block copies are refused there, naming the variable: vLLM holds a copy's source
    until the step in flight is done, kvshare does not."""
    from vllm.config import VllmConfig

    def build(in_flight, specs=None, kv_transfer=None):
        monkeypatch.setattr(VllmConfig, "max_concurrent_batches",
                            property(lambda self: in_flight))
        return h.make_scheduler(tiny_model_dir, kvshare=True, num_blocks=64, specs=specs,
                                kv_transfer=kv_transfer or example_config(tmp_path))

    # The offloading connector keeps vLLM's KV-cache groups (the example one merges them).
    for specs, name, kt in ((None, "KvshareKVCacheManager", None),
                            (h.layer_specs("gpt-oss", size=32), "KvshareKVCacheManager",
                             offloading_config(64))):
        s = build(2, specs, kt)
        assert s.defer_block_free and type(s.kv_cache_manager).__name__ == name
    monkeypatch.setenv("KVSHARE_VLLM_MATCH_UNIT", "8")
    with pytest.raises(ValueError, match="MATCH_UNIT=8: sub-page hits on a scheduler that "
                                         "defers block frees .*ExampleConnector"):
        build(2)
    s = build(1)
    assert not s.defer_block_free and s.kv_cache_manager._copy_queue is not None


@pytest.mark.parametrize("model,size,num_blocks", [("gpt-oss", 32, 400), ("gemma3", 64, 400),
                                                   ("gemma3", 64, 90), ("gemma3", 64, 60),
                                                   ("gpt-oss", 32, 30)])
def test_offloading_connector_lockstep_with_groups(tiny_model_dir, model, size, num_blocks):
    """vLLM's offloading connector on a model with several KV-cache groups (full attention
    next to sliding windows of 32 or 64 (vLLM's offloading connector takes no chunked local
    attention), as
    test_hybrid_compare builds them): kvshare's manager against vLLM's
    ``HybridKVCacheCoordinator``, every step.  Prompts of 97 tokens (65 shared by pairs) leave
    the window at admission, so external tokens the window drops are null blocks in the
    windowed group; loads take 2 steps (delayed caching) and requests with the same prefix
    arrive while a load is in flight.  No load fails: vLLM's own manager cannot take a failed
    block with several groups (its scheduler reads one block table).  With 90 blocks or
    fewer, the prefixes leave the device by eviction rather than by a reset; with 60 and 30,
    admissions hang on the pages the external tokens take: none where the window drops them
    (``kvs_seq_begin_computed``), as in vLLM."""
    pair = ConnPair(tiny_model_dir, lambda i: offloading_config(256),
                    lambda c: OffloadingWorker(load_delay=2, store_delay=1),
                    num_blocks=num_blocks, max_num_seqs=4,
                    specs=h.layer_specs(model, size=size))
    assert len(pair.kvs.s.kv_cache_manager.kv_cache_config.kv_cache_groups) > 1
    rng = random.Random(hash((model, num_blocks)) & 0xffff)
    heads = [[rng.randrange(3, 30000) for _ in range(65)] for _ in range(4)]
    prompts = [heads[k // 2] + [rng.randrange(3, 30000) for _ in range(32)] for k in range(8)]
    for wave in range(3):
        for k, p in enumerate(prompts):
            pair.add(f"w{wave}r{k}", p)
            if k % 2 == 1:
                pair.step()
        pair.run_until_idle()
        for _ in range(3):  # lets the last stores complete
            pair.step()
        if wave == 0 and num_blocks == 400:
            assert pair.ref.s.reset_prefix_cache() and pair.kvs.s.reset_prefix_cache()
    w = pair.ref.worker
    assert pair.ref.ext_hits > 0 and w.loads > 0 and w.stores > 0
    assert pair.waited_remote > 0 and pair.remote_nulls > 0
    assert pair.ref.hits > 0
    st = pair.kvs.s.kv_cache_manager.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0


@pytest.mark.parametrize("state", [False, True])
def test_plugin_serves_connectors_on_groups(tiny_model_dir, state):
    """With vLLM's offloading connector on a model of several groups the plugin builds
    kvshare's manager for attention groups (full + sliding window), and keeps vLLM's manager with
    Mamba / linear-attention state groups (external tokens load attention pages only)."""
    if state:
        kw = dict(specs=h.mamba_layer_specs("qwen3-next", "all", max_model_len=2048),
                  mamba_cache_mode="all", max_model_len=2048)
    else:
        kw = dict(specs=h.layer_specs("gpt-oss", size=32))
    s = h.make_scheduler(tiny_model_dir, kvshare=True, kv_transfer=offloading_config(64),
                         num_blocks=200, **kw)
    assert len(s.kv_cache_config.kv_cache_groups) > 1
    assert type(s.kv_cache_manager).__name__ == \
        ("KVCacheManager" if state else "KvshareKVCacheManager")


@pytest.mark.parametrize("held", [False, True])
def test_evict_blocks_drops_those_blocks_only(tiny_model_dir, held):
    """A failed load's blocks (``evict_blocks``) leave the prefix cache, the blocks before them
    stay: the next lookup of the prompt hits up to the first evicted block, with vLLM's manager
    and kvshare's alike, whether the request still held it or had ended."""
    prompt = list(range(100, 165))  # 4 full blocks + 1 token
    hits = {}
    for kvshare in (False, True):
        s = h.make_scheduler(tiny_model_dir, kvshare=kvshare, num_blocks=64)
        m = s.kv_cache_manager
        if kvshare:
            assert type(m).__name__ == "KvshareKVCacheManager"
        a = h.make_request("a", prompt)
        blocks, hit = h.lookup(m, a)
        assert hit == 0
        m.allocate_slots(a, len(prompt), 0, blocks)
        a.num_computed_tokens = len(prompt)
        m.cache_blocks(a, len(prompt))
        evicted = m.get_block_ids("a")[0][2]
        if held:
            m.evict_blocks({evicted})
        m.free(a)
        if not held:
            m.evict_blocks({evicted})
        hits[kvshare] = h.lookup(m, h.make_request("b", prompt))[1]
        if kvshare:
            m.check()
            assert m.cache.stats()["device_pages_in_use"] == 0
    assert hits[True] == hits[False] == 2 * BS
