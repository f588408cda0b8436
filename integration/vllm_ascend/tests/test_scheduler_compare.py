"""The installed vLLM's own Scheduler (0.23.0 or 0.32.0) with vLLM's KVCacheManager and with
kvshare's, in lockstep on the same requests: every step must schedule the same tokens, report the
same prefix hits, hand out the same number of blocks, preempt and finish the same requests, and
produce the same tokens."""

from __future__ import annotations

import random

import pytest

import harness as h
from vllm.v1.request import RequestStatus


class NotManaged(Exception):
    """The plugin handed the configuration back to vLLM's own manager."""


class Pair:
    """The same workload on two schedulers; compares every step.  ``require_kvshare=False``
    lets the second side fall back to vLLM's manager; ``vllm_only`` runs vLLM's manager on both
    sides (checks a workload on vLLM alone)."""

    def __init__(self, model_dir, hash_algo="sha256", require_kvshare=True, vllm_only=False,
                 **kw):
        self.hash_algo = hash_algo
        self.ref = h.make_scheduler(model_dir, kvshare=False, **kw)
        self.kvs = h.make_scheduler(model_dir, kvshare=not vllm_only, **kw)
        self.managed = type(self.kvs.kv_cache_manager).__name__ == "KvshareKVCacheManager"
        if require_kvshare and not vllm_only and not self.managed:
            raise NotManaged(type(self.kvs.kv_cache_manager).__name__)
        # With KV events on, the plugin keeps vLLM's request block hasher (events carry its
        # hashes); otherwise kvshare's side runs without it, as the plugin runs the engine.
        self.kvs_hashes = bool(kw.get("kv_events")) or not self.managed
        self.num_blocks = kw.get("num_blocks", 1000)
        self.peak_blocks = [0, 0]  # most blocks in use (null block excluded) at a step's end
        self.nulls = 0  # released (null) block-table entries seen on vLLM's side
        # running requests whose lookup set a shared-prefix boundary (vLLM 0.32), per step
        self.junctions = 0
        self.reqs_ref: dict = {}
        self.reqs_kvs: dict = {}
        self.block_size = kw.get("block_size", 16)
        self.steps = 0
        self.hits = [0, 0]
        self.queries = [0, 0]
        self.peak_usage = [0.0, 0.0]
        self.preemptions = 0
        self.zeroed = 0  # block ids handed out for KV zeroing, summed (equal on both sides)
        self.finished: dict[str, list[int]] = {}
        # vLLM 0.32's PrefillStats.num_cache_creation_tokens, summed (equal on both sides).
        self.cache_created = 0

    def add(self, rid, prompt, max_tokens=8, **kw):
        for reqs, s, hashes in ((self.reqs_ref, self.ref, True),
                                (self.reqs_kvs, self.kvs, self.kvs_hashes)):
            r = h.make_request(rid, prompt, max_tokens=max_tokens, block_size=self.block_size,
                               hash_blocks=hashes, hash_algo=self.hash_algo, **kw)
            reqs[rid] = r
            s.add_request(r)

    def abort(self, rid):
        for s in (self.ref, self.kvs):
            s.finish_requests([rid], RequestStatus.FINISHED_ABORTED)

    in_flight = None  # when set, called on each side between its schedule and its update
    overlap = False  # two batches in flight (h.step)

    def step(self):
        o1, e1 = h.step(self.ref, self.reqs_ref, self.in_flight, self.overlap)
        o2, e2 = h.step(self.kvs, self.reqs_kvs, self.in_flight, self.overlap)
        self.steps += 1
        where = f"step {self.steps}"
        assert o1.num_scheduled_tokens == o2.num_scheduled_tokens, where
        assert o1.total_num_scheduled_tokens == o2.total_num_scheduled_tokens, where
        n1 = {r.req_id: (r.num_computed_tokens, [len(b) for b in r.block_ids])
              for r in o1.scheduled_new_reqs}
        n2 = {r.req_id: (r.num_computed_tokens, [len(b) for b in r.block_ids])
              for r in o2.scheduled_new_reqs}
        assert n1 == n2, f"{where}: new requests (computed tokens, block counts) differ"
        c1, c2 = o1.scheduled_cached_reqs, o2.scheduled_cached_reqs
        assert c1.req_ids == c2.req_ids, where
        assert c1.num_computed_tokens == c2.num_computed_tokens, where
        nb1 = [None if b is None else [len(x) for x in b] for b in c1.new_block_ids]
        nb2 = [None if b is None else [len(x) for x in b] for b in c2.new_block_ids]
        assert nb1 == nb2, f"{where}: new block counts of running requests differ"
        assert o1.preempted_req_ids == o2.preempted_req_ids, where
        # KV zeroing (a cache that needs it): the same block ids in the same order (kvshare
        # hands out free pages in vLLM's order).
        z1 = getattr(o1, "new_block_ids_to_zero", None)
        z2 = getattr(o2, "new_block_ids_to_zero", None)
        assert z1 == z2, f"{where}: blocks to zero {z1} vs {z2}"
        self.zeroed += len(z1 or ())
        # Cascade attention's shared prefix, for every request holding blocks.
        assert o1.num_common_prefix_blocks == o2.num_common_prefix_blocks, where
        for r in self.ref.running:
            rid = r.request_id
            assert self.ref.kv_cache_manager.get_num_common_prefix_blocks(rid) == \
                self.kvs.kv_cache_manager.get_num_common_prefix_blocks(rid), where
            # Per group: the same table length, and the null block (id 0: a position released
            # out of a window, or skipped by a hit) at the same positions.
            t1 = self.ref.kv_cache_manager.get_block_ids(rid)
            t2 = self.kvs.kv_cache_manager.get_block_ids(rid)
            p1 = [[b == 0 for b in g] for g in t1]
            assert p1 == [[b == 0 for b in g] for g in t2], f"{where}: {rid}'s block tables"
            self.nulls += sum(map(sum, p1))
            if not h.CASCADE:  # vLLM 0.32: where the longest group's hit ended, if it lagged
                j = r.shared_prefix_boundary
                assert j == self.reqs_kvs[rid].shared_prefix_boundary, \
                    f"{where}: {rid}'s shared-prefix boundary"
                self.junctions += bool(j)
                # The prefill stats' cached-token estimate (registered blocks held).
                assert self.ref.kv_cache_manager.estimate_cached_tokens(r) == \
                    self.kvs.kv_cache_manager.estimate_cached_tokens(self.reqs_kvs[rid]), \
                    f"{where}: {rid}'s cached-token estimate"
        self.preemptions += len(o1.preempted_req_ids or ())
        assert o1.finished_req_ids == o2.finished_req_ids, where
        # Same tokens out.
        t1 = _tokens(e1)
        t2 = _tokens(e2)
        assert t1 == t2, f"{where}: token results differ"
        self.cache_created += sum(st.get("num_cache_creation_tokens", 0)
                                  for _, _, st in t1.values() if st is not None)
        # Same block accounting and hits.
        u1, u2 = self.ref.kv_cache_manager.usage, self.kvs.kv_cache_manager.usage
        assert u1 == pytest.approx(u2), f"{where}: usage {u1} vs {u2}"
        self.peak_usage = [max(self.peak_usage[0], u1), max(self.peak_usage[1], u2)]
        used = [round(u * (self.num_blocks - 1)) for u in (u1, u2)]
        self.peak_blocks = [max(a, b) for a, b in zip(self.peak_blocks, used)]
        for i, e in enumerate((e1, e2)):
            h_, q_ = _prefix_stats(e)
            self.hits[i] += h_
            self.queries[i] += q_
        assert self.hits[0] == self.hits[1], f"{where}: prefix hits {self.hits}"
        if self.managed:
            self.kvs.kv_cache_manager.check()
        for rid, toks in t1.items():
            if rid in self.reqs_ref and self.reqs_ref[rid].is_finished():
                self.finished[rid] = list(self.reqs_ref[rid].all_token_ids)
        return o1, o2

    def run_until_idle(self, limit=10_000):
        for _ in range(limit):
            if not self.ref.has_unfinished_requests() and not self.kvs.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("did not drain")


def _prefix_stats(eco) -> tuple[int, int]:
    """(hits, queries) the scheduler reported this step (it drains make_prefix_cache_stats)."""
    h_ = q_ = 0
    for co in eco.values():
        st = co.scheduler_stats.prefix_cache_stats if co.scheduler_stats else None
        if st is not None:
            h_ += st.hits
            q_ += st.queries
    return h_, q_


def _tokens(eco) -> dict:
    """Each output's tokens, finish reason and prefill breakdown (``PrefillStats``: cached
    tokens; on vLLM 0.32 also the tokens computed into the prefix cache, which the scheduler
    asks the manager for with ``estimate_cached_tokens``)."""
    out = {}
    for client_outputs in eco.values():
        for o in client_outputs.outputs:
            stats = getattr(o, "prefill_stats", None)
            out[o.request_id] = (list(o.new_token_ids), o.finish_reason,
                                 None if stats is None else vars(stats))
    return out


def conversations(pair: Pair, num_convs: int, turns: int, system: list[int], seed: int,
                  max_tokens=12, user_len=(5, 40), abort_every=0):
    """Multi-turn chat: turn t+1's prompt is turn t's prompt + its answer + a new user message;
    every conversation starts with the same system prompt."""
    rng = random.Random(seed)
    history = {c: system + [rng.randrange(3, 30000) for _ in range(rng.randint(*user_len))]
               for c in range(num_convs)}
    turn = {c: 0 for c in range(num_convs)}
    live: dict[str, int] = {}
    n_abort = 0

    def submit(c):
        rid = f"c{c}t{turn[c]}"
        pair.add(rid, history[c], max_tokens=max_tokens)
        live[rid] = c

    for c in range(num_convs):
        submit(c)
    while live:
        pair.step()
        if abort_every and pair.steps % abort_every == 0:
            running = sorted(r for r in live if not pair.reqs_ref[r].is_finished())
            if running:
                victim = running[n_abort % len(running)]
                n_abort += 1
                pair.abort(victim)
        for rid in list(live):
            r = pair.reqs_ref[rid]
            if r.is_finished():
                c = live.pop(rid)
                turn[c] += 1
                history[c] = list(r.all_token_ids) + [rng.randrange(3, 30000)
                                                      for _ in range(rng.randint(*user_len))]
                if turn[c] < turns:
                    submit(c)
    pair.run_until_idle()


class Single:
    """One scheduler driven alone (for workloads where the two managers legitimately diverge)."""

    def __init__(self, model_dir, kvshare, **kw):
        self.s = h.make_scheduler(model_dir, kvshare=kvshare, **kw)
        self.reqs: dict = {}
        self.reqs_ref = self.reqs
        self.block_size = kw.get("block_size", 16)
        self.steps = 0
        self.hits = self.queries = self.preemptions = 0
        self.peak_usage = 0.0
        self.kvshare = kvshare

    def add(self, rid, prompt, max_tokens=8, **kw):
        r = h.make_request(rid, prompt, max_tokens=max_tokens, block_size=self.block_size,
                           hash_blocks=not self.kvshare, **kw)
        self.reqs[rid] = r
        self.s.add_request(r)

    def abort(self, rid):
        self.s.finish_requests([rid], RequestStatus.FINISHED_ABORTED)

    def step(self):
        o, e = h.step(self.s, self.reqs)
        self.steps += 1
        h_, q_ = _prefix_stats(e)
        self.hits += h_
        self.queries += q_
        self.preemptions += len(o.preempted_req_ids or ())
        self.peak_usage = max(self.peak_usage, self.s.kv_cache_manager.usage)
        if self.kvshare:
            self.s.kv_cache_manager.check()
        return o, e

    def run_until_idle(self, limit=10_000):
        for _ in range(limit):
            if not self.s.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("did not drain")


def compare_under_pressure(model_dir, workload, **kw):
    """Runs ``workload`` on each manager alone: same token results for every request, and
    kvshare's prefix hits at least vLLM's (kvshare evicts a cached page only when no free page
    is left; vLLM 0.23 queues freed uncached blocks behind cached ones and evicts earlier)."""
    ref, kvs = Single(model_dir, False, **kw), Single(model_dir, True, **kw)
    workload(ref)
    workload(kvs)
    assert set(ref.reqs) == set(kvs.reqs)
    for rid, r in ref.reqs.items():
        assert list(r.all_token_ids) == list(kvs.reqs[rid].all_token_ids), rid
        assert r.status == kvs.reqs[rid].status, rid
    assert kvs.hits >= ref.hits, (kvs.hits, ref.hits)
    st = kvs.s.kv_cache_manager.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0
    return ref, kvs


def test_multi_turn_prefix_hits(tiny_model_dir):
    pair = Pair(tiny_model_dir, num_blocks=2000)
    rng = random.Random(1)
    system = [rng.randrange(3, 30000) for _ in range(100)]
    conversations(pair, num_convs=6, turns=4, system=system, seed=2)
    assert pair.hits[0] > 0 and pair.hits[0] == pair.hits[1]
    assert pair.queries[0] == pair.queries[1]
    assert pair.cache_created > 0 or h.API == "0.23.0"  # 0.23 does not count them


def test_preemption_under_memory_pressure(tiny_model_dir):
    rng = random.Random(3)
    system = [rng.randrange(3, 30000) for _ in range(40)]
    ref, kvs = compare_under_pressure(
        tiny_model_dir,
        lambda d: conversations(d, num_convs=8, turns=3, system=system, seed=4, max_tokens=40),
        num_blocks=48, max_num_seqs=8)
    assert ref.preemptions > 0 and kvs.preemptions > 0, "the workload must preempt"
    assert kvs.peak_usage <= 1.0


def test_preemption_lockstep_without_cache_pressure(tiny_model_dir):
    """Preemption where eviction order cannot matter (prefix caching off): exact lockstep."""
    pair = Pair(tiny_model_dir, num_blocks=48, max_num_seqs=8, enable_prefix_caching=False)
    rng = random.Random(3)
    system = [rng.randrange(3, 30000) for _ in range(40)]
    conversations(pair, num_convs=8, turns=2, system=system, seed=4, max_tokens=40)
    assert pair.preemptions > 0


def test_chunked_prefill_and_full_sequence_gate(tiny_model_dir):
    rng = random.Random(5)
    system = [rng.randrange(3, 30000) for _ in range(70)]
    compare_under_pressure(
        tiny_model_dir,
        lambda d: conversations(d, num_convs=5, turns=3, system=system, seed=6, max_tokens=20,
                                user_len=(20, 120)),
        num_blocks=40, max_num_batched_tokens=64, max_num_seqs=4)


def test_chunked_prefill_lockstep(tiny_model_dir):
    pair = Pair(tiny_model_dir, num_blocks=400, max_num_batched_tokens=64, max_num_seqs=4)
    rng = random.Random(5)
    system = [rng.randrange(3, 30000) for _ in range(70)]
    conversations(pair, num_convs=5, turns=3, system=system, seed=6, max_tokens=20,
                  user_len=(20, 120))
    assert pair.hits[0] == pair.hits[1] > 0


def test_abort_and_finish(tiny_model_dir):
    pair = Pair(tiny_model_dir, num_blocks=300)
    rng = random.Random(7)
    system = [rng.randrange(3, 30000) for _ in range(33)]
    conversations(pair, num_convs=5, turns=3, system=system, seed=8, max_tokens=20, abort_every=7)
    st = pair.kvs.kv_cache_manager.kvshare_stats()
    assert st["num_seqs"] == 0 and st["device_pages_in_use"] == 0


def test_reset_prefix_cache(tiny_model_dir):
    pair = Pair(tiny_model_dir, num_blocks=300)
    prompt = list(range(100, 180))
    pair.add("a", prompt)
    pair.step()
    # Running request holds blocks: both refuse.
    assert pair.ref.kv_cache_manager.reset_prefix_cache() is False
    assert pair.kvs.kv_cache_manager.reset_prefix_cache() is False
    pair.run_until_idle()
    pair.add("b", prompt)
    o1, o2 = pair.step()
    assert o2.scheduled_new_reqs[0].num_computed_tokens == 64  # a hit before the reset
    pair.run_until_idle()
    assert pair.ref.reset_prefix_cache() is True
    assert pair.kvs.reset_prefix_cache() is True
    for s in (pair.ref, pair.kvs):
        assert s.kv_cache_manager.make_prefix_cache_stats().reset is True
    pair.add("c", prompt)
    o1, o2 = pair.step()
    assert o2.scheduled_new_reqs[0].num_computed_tokens == 0  # no hit after it
    pair.run_until_idle()


def _start_a(pair: Pair, steps: int) -> list[int]:
    """Request ``a`` (a 20-token prompt, then one token per step) after ``steps`` steps; returns
    its first 32 tokens (two pages).  Step 13 fills its second page (token 31's KV): kvshare
    gets no native call for that step, the page's registration waits."""
    pair.add("a", list(range(1000, 1020)), max_tokens=30)
    for _ in range(steps):
        pair.step()
    prefix = list(pair.reqs_ref["a"].all_token_ids)[:32]
    assert prefix == list(pair.reqs_kvs["a"].all_token_ids)[:32] and len(prefix) == 32
    return prefix


def test_page_filled_without_a_call_is_found_by_a_match_in_the_same_step(tiny_model_dir):
    """vLLM's manager caches the block during allocate_slots, so a request scheduled later in
    the same step hits it; kvshare registers the waiting page before that lookup."""
    pair = Pair(tiny_model_dir, num_blocks=300)
    prefix = _start_a(pair, 12)
    pair.add("b", prefix + list(range(2000, 2010)))
    o1, o2 = pair.step()  # a fills page 2, then b is matched
    assert [r.num_computed_tokens for r in o2.scheduled_new_reqs] == [32]
    pair.run_until_idle()


def test_page_filled_without_a_call_is_cached_at_free(tiny_model_dir):
    pair = Pair(tiny_model_dir, num_blocks=300)
    prefix = _start_a(pair, 13)
    mgr = pair.kvs.kv_cache_manager
    assert "a" in mgr._dirty and mgr._reqs["a"].n < 32  # full, not yet registered
    pair.abort("a")
    assert not mgr._dirty
    pair.add("b", prefix + list(range(2000, 2010)))
    o1, o2 = pair.step()
    assert [r.num_computed_tokens for r in o2.scheduled_new_reqs] == [32]
    pair.run_until_idle()


def test_page_waiting_to_register_survives_a_refused_crossing(tiny_model_dir):
    """Five usable blocks, two requests running: ``r1`` fills a page with no native call (its
    registration waits), then needs a new page when none is free: the crossing is refused
    whole, the scheduler preempts ``r1`` itself, and its pages go back.  The filled page must
    still register (vLLM cached it when it filled), so ``r1`` resumes on both managers with the
    same two-page hit."""
    pair = Pair(tiny_model_dir, num_blocks=6, max_num_seqs=2)
    for rid, prompt, max_tokens, steps in (("r0", range(1000, 1028), 14, 1),
                                           ("r1", range(2000, 2022), 37, 5),
                                           ("r2", range(3000, 3026), 13, 6)):
        pair.add(rid, list(prompt), max_tokens=max_tokens)
        for _ in range(steps):
            pair.step()
    pair.run_until_idle()
    assert pair.preemptions > 0  # and every step scheduled the same tokens (Pair.step)


@pytest.mark.skipif(not h.CASCADE, reason="vLLM 0.32 removed cascade attention: the scheduler "
                    "reports no common prefix and both managers answer 0 (Pair.step compares)")
def test_common_prefix_follows_arrivals_and_departures(tiny_model_dir):
    """Cascade attention's shared prefix (get_num_common_prefix_blocks, kept between steps by
    the adapter) shrinks when a request with another prefix arrives and grows back when it
    leaves; Pair.step compares it with vLLM's for every running request."""
    pair = Pair(tiny_model_dir, num_blocks=300)
    system = list(range(3000, 3048))  # 3 pages
    pair.add("a", system + [1, 2, 3], max_tokens=40)
    pair.add("b", system + [4, 5, 6, 7], max_tokens=40)
    o1, o2 = pair.step()
    pair.step()
    o1, o2 = pair.step()
    assert o2.num_common_prefix_blocks == [3]
    pair.add("c", list(range(5000, 5020)), max_tokens=3)
    o1, o2 = pair.step()
    assert o2.num_common_prefix_blocks == [0]
    for _ in range(4):
        o1, o2 = pair.step()
    assert "c" in o2.finished_req_ids or pair.reqs_kvs["c"].is_finished()
    o1, o2 = pair.step()
    assert o2.num_common_prefix_blocks == [3]
    pair.run_until_idle()


def test_salt_and_lora_isolate(tiny_model_dir):
    from vllm.lora.request import LoRARequest

    pair = Pair(tiny_model_dir, num_blocks=300)
    prompt = list(range(500, 580))
    pair.add("x", prompt, cache_salt="tenant-a")
    pair.run_until_idle()
    pair.add("y", prompt, cache_salt="tenant-b")
    o1, o2 = pair.step()
    assert o2.scheduled_new_reqs[0].num_computed_tokens == 0
    pair.run_until_idle()
    pair.add("z", prompt, cache_salt="tenant-a")
    o1, o2 = pair.step()
    assert o2.scheduled_new_reqs[0].num_computed_tokens == 64
    pair.run_until_idle()
    lora = LoRARequest("ad", 1, "/nonexistent")
    pair.add("l", prompt, lora_request=lora)
    o1, o2 = pair.step()
    assert o2.scheduled_new_reqs[0].num_computed_tokens == 0
    pair.run_until_idle()


def test_kv_events(tiny_model_dir):
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    pair = Pair(tiny_model_dir, num_blocks=400, kv_events=True)
    rng = random.Random(9)
    system = [rng.randrange(3, 30000) for _ in range(48)]
    stored_tokens = [[], []]
    live_hashes = set()
    n_removed = [0, 0]

    published = [[], []]
    for i, s in enumerate((pair.ref, pair.kvs)):
        # The scheduler drains take_events() every step and publishes a KVEventBatch.
        s.kv_event_publisher.publish = (lambda lst: lambda batch: lst.extend(batch.events))(
            published[i])

    def drain():
        for i, s in enumerate((pair.ref, pair.kvs)):
            evs = published[i] + s.kv_cache_manager.take_events()
            published[i].clear()
            for ev in evs:
                if isinstance(ev, BlockStored):
                    for k, hsh in enumerate(ev.block_hashes):
                        stored_tokens[i].append(tuple(ev.token_ids[k * 16:(k + 1) * 16]))
                        if i == 1:
                            assert ev.medium == "GPU" and ev.block_size == 16
                            live_hashes.add(hsh)
                elif isinstance(ev, BlockRemoved):
                    n_removed[i] += len(ev.block_hashes)
                    if i == 1:
                        for hsh in ev.block_hashes:
                            live_hashes.remove(hsh)
                elif isinstance(ev, AllBlocksCleared) and i == 1:
                    live_hashes.clear()

    orig_step = pair.step

    def step():
        r = orig_step()
        drain()
        return r

    pair.step = step
    conversations(pair, num_convs=4, turns=3, system=system, seed=10, max_tokens=30)
    drain()
    # Same blocks stored, with the same token ids, in the same order.
    assert stored_tokens[0] == stored_tokens[1]
    assert all(len(t) == 16 for t in stored_tokens[1])
    assert n_removed[0] == n_removed[1]
    assert len(stored_tokens[1]) > 0
    # Replaying kvshare's events reproduces its index.
    assert len(live_hashes) == pair.kvs.kv_cache_manager.kvshare_stats()["index_pages"]
    assert pair.ref.reset_prefix_cache() and pair.kvs.reset_prefix_cache()
    drain()
    assert not live_hashes


def _event_fields(ev) -> tuple:
    """Every field of a vLLM KV event, with its type: what a consumer can see of it."""
    return (type(ev).__name__,) + tuple((f, getattr(ev, f)) for f in ev.__struct_fields__)


def _lockstep_events(pair: Pair) -> list[list[tuple]]:
    """Makes every ``pair.step()`` compare the two schedulers' published KV events field by
    field (the scheduler drains ``take_events()`` each step into a KVEventBatch); returns the
    streams seen so far (both equal)."""
    published = [[], []]
    for i, s in enumerate((pair.ref, pair.kvs)):
        s.kv_event_publisher.publish = (lambda lst: lambda batch: lst.extend(batch.events))(
            published[i])
    seen: list[list[tuple]] = [[], []]
    orig_step = pair.step

    def step():
        r = orig_step()
        streams = []
        for i, s in enumerate((pair.ref, pair.kvs)):
            evs = published[i] + s.kv_cache_manager.take_events()
            published[i].clear()
            streams.append([_event_fields(e) for e in evs])
            seen[i].extend(streams[-1])
        assert streams[0] == streams[1], f"step {pair.steps}: KV events differ"
        return r

    pair.step = step
    return seen


@pytest.mark.parametrize("batched", [8192, 24])
@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
def test_kv_events_match_vllm(tiny_model_dir, algo, batched):
    """With KV events on, kvshare's stream equals vLLM's field by field every step (block
    hashes under the configured algorithm, parent chain, token ids, extra keys: cache salt on
    the first block, LoRA on every block), including removals under eviction pressure and the
    clear of a prefix-cache reset.  Chunked prefill (24-token budget) splits a prompt's stores
    over several events.  Every request ends with 16k+1 tokens (its blocks all full and
    cached at free), so the two managers' eviction orders agree and the lockstep holds."""
    from vllm.lora.request import LoRARequest

    pair = Pair(tiny_model_dir, hash_algo=algo, num_blocks=24, max_num_seqs=2,
                max_num_batched_tokens=batched, kv_events=True)
    seen = _lockstep_events(pair)
    rng = random.Random(21)
    system = [rng.randrange(3, 30000) for _ in range(32)]
    lora = LoRARequest("ad", 1, "/nonexistent")
    kinds = [{}, {"cache_salt": "tenant-a"}, {"lora_request": lora}, {"cache_salt": "tenant-b"}]
    prompts = []
    for k in range(10):
        tail = [rng.randrange(3, 30000) for _ in range(17)]
        prompts.append((system + tail, kinds[k % len(kinds)]))
    # Two waves: the second repeats the first's prompts (hits where the blocks survived).
    for wave in range(2):
        for k, (prompt, kw) in enumerate(prompts):
            pair.add(f"w{wave}r{k}", prompt, max_tokens=16, **kw)  # 49 + 16 = 65 tokens
            if k % 2:
                pair.run_until_idle()
        pair.run_until_idle()
    assert pair.ref.reset_prefix_cache() and pair.kvs.reset_prefix_cache()
    pair.step()  # drains (and compares) the reset's events
    stream = seen[1]
    assert stream == seen[0]
    stored = [dict(e[1:]) for e in stream if e[0] == "BlockStored"]
    removed = [e for e in stream if e[0] == "BlockRemoved"]
    assert stored and len(removed) >= 10, "the workload must evict"
    assert stream[-1][0] == "AllBlocksCleared"
    assert pair.hits[1] > 0
    extra = [k for ev in stored for k in ev["extra_keys"] if k]
    assert ("tenant-a",) in extra and ("tenant-b",) in extra
    assert any("ad" in k for k in extra)
    assert any(ev["parent_block_hash"] is not None for ev in stored)
    if batched < 49:
        assert any(len(ev["block_hashes"]) == 1 and ev["parent_block_hash"] is not None
                   for ev in stored)


def test_async_scheduling(tiny_model_dir):
    pair = Pair(tiny_model_dir, num_blocks=200, async_scheduling=True)
    rng = random.Random(11)
    system = [rng.randrange(3, 30000) for _ in range(50)]
    conversations(pair, num_convs=4, turns=3, system=system, seed=12)
    assert pair.hits[0] == pair.hits[1]


def test_lookahead_slots_match_vllm(tiny_model_dir):
    """Speculative-decoding lookahead slots, at admission and on every decode step: the same
    new-block counts and usage as vLLM's manager, driven directly (no scheduler)."""
    counts = []
    for kvshare in (False, True):
        m = h.make_scheduler(tiny_model_dir, kvshare=kvshare, num_blocks=64).kv_cache_manager
        r = h.make_request("a", list(range(100, 130)), hash_blocks=not kvshare)
        blocks, hit = h.lookup(m, r)
        seen = []
        new = m.allocate_slots(r, 30 - hit, hit, blocks, num_lookahead_tokens=5)
        seen.append((len(new.blocks[0]), round(m.usage, 6)))
        r.num_computed_tokens = 30
        for step in range(40):
            r.append_output_token_ids(7 + step)
            new = m.allocate_slots(r, 1, num_lookahead_tokens=5)
            seen.append((len(new.blocks[0]), round(m.usage, 6)))
            r.num_computed_tokens += 1
        if kvshare:
            m.check()
        counts.append(seen)
    assert counts[0] == counts[1]
    assert sum(n for n, _ in counts[1]) == _ceil_div(30 + 40 + 5, 16)


def _ceil_div(a, b):
    return -(-a // b)


NEW_SCHEDULER_ONLY = pytest.mark.skipif(
    h.API == "0.23.0", reason="vLLM 0.23's scheduler has no admission watermark, deferred "
    "frees or kv_cache_report_mode")


@NEW_SCHEDULER_ONLY
@pytest.mark.parametrize("caching", [False, True])
def test_watermark_admission_lockstep(tiny_model_dir, caching):
    """vLLM 0.32's admission watermark (a quarter of the blocks kept free when admitting a
    waiting or preempted request while others run), under memory pressure: the same requests
    admitted and finished at the same steps.  The same workload without the watermark
    schedules differently (it preempts), so the watermark decides admissions here."""
    runs = []
    for watermark in (0.25, 0.0):
        pair = Pair(tiny_model_dir, num_blocks=48, max_num_seqs=8,
                    enable_prefix_caching=caching, watermark=watermark)
        assert pair.kvs.kv_cache_manager.watermark_blocks == int(watermark * 48)
        rng = random.Random(3)
        system = [rng.randrange(3, 30000) for _ in range(40)]
        conversations(pair, num_convs=8, turns=2, system=system, seed=4, max_tokens=40)
        runs.append((pair.steps, pair.preemptions))
    assert runs[0] != runs[1] and runs[1][1] > 0, runs


@NEW_SCHEDULER_ONLY
def test_cached_block_events_for_full_report_mode(tiny_model_dir):
    """A request asking for ``kv_cache_report_mode == "full"`` gets a ``BlockStored`` for the
    prefix hit it reuses, field by field as vLLM publishes it; another request does not."""
    pair = Pair(tiny_model_dir, num_blocks=64, kv_events=True)
    seen = _lockstep_events(pair)
    prompt = list(range(700, 772))  # 4 pages and a partial one
    pair.add("a", prompt, max_tokens=4)
    pair.run_until_idle()
    for rid, extra in (("b", None), ("c", {"kv_cache_report_mode": "full"})):
        n = len(seen[1])
        pair.add(rid, prompt, max_tokens=4, extra_args=extra)
        pair.step()
        reused = [dict(e[1:]) for e in seen[1][n:]
                  if e[0] == "BlockStored" and dict(e[1:])["parent_block_hash"] is None]
        assert len(reused) == (1 if extra else 0), seen[1][n:]
        pair.run_until_idle()
    assert len(reused[0]["block_hashes"]) == 4 and reused[0]["token_ids"] == prompt[:64]


@NEW_SCHEDULER_ONLY
def test_deferred_free_matches_vllm(tiny_model_dir):
    """vLLM 0.32's deferred free (``pop_blocks_for_free``, then the blocks back through
    ``block_pool.free_blocks`` reversed), driven directly: the popped request's blocks stay
    held (usage, hits on them, a refused prefix-cache reset), then are cached as a free
    would cache them (the same hits after eviction pressure)."""
    seen = []
    for kvshare in (False, True):
        m = h.make_scheduler(tiny_model_dir, kvshare=kvshare, num_blocks=12).kv_cache_manager

        def admit(rid, prompt):
            return h.admit(m, rid, prompt, kvshare)

        a, _ = admit("a", list(range(100, 150)))  # 3 full pages and a partial one
        popped = m.pop_blocks_for_free(a)
        log = [len(popped), m.get_block_ids("a"), round(m.usage, 6)]
        b, hit = admit("b", list(range(100, 150)))  # a's full pages, still held
        log += [hit, round(m.usage, 6), m.reset_prefix_cache()]
        log.append(h.return_popped(m, popped, kvshare))
        m.free(b)
        c, hit = admit("c", list(range(900, 1030)))  # 9 pages: evicts some cached ones
        log += [hit, round(m.usage, 6)]
        m.free(c)
        d, hit = admit("d", list(range(100, 150)))
        log += [hit, round(m.usage, 6)]
        if kvshare:
            m.check()
        seen.append(log)
    assert seen[0] == seen[1]
    assert seen[1][:2] == [4, ([],)] and seen[1][3] == 48 and seen[1][5] is False


@NEW_SCHEDULER_ONLY
@pytest.mark.parametrize("model", [None, "gpt-oss", "llama4"])
def test_zeroing_ids_match_vllm(tiny_model_dir, model):
    """A cache that needs KV zeroing (vLLM: Mamba layers or mixed precision; forced here), both
    managers driven directly, on one full-attention group and on several (sliding window 32 or
    chunks of 32 beside full attention): every allocation's blocks handed out for zeroing in
    every attention group, group after group, except an asynchronous load's external-token
    blocks in the groups the scheduler names (``skip_zeroing_group_ids``: the load writes
    them), and ``record_blocks_for_zeroing`` after a failed load (a window's null blocks
    included).  The two managers hand out the same block ids (kvshare takes free pages in
    vLLM's order)."""
    specs = h.layer_specs(model, size=32) if model else None
    groups = 2 if model else 1
    skips = [(), *((g,) for g in range(groups)), tuple(range(groups))]
    seen = []
    for kvshare in (False, True):
        m = h.make_scheduler(tiny_model_dir, kvshare=kvshare, num_blocks=200, specs=specs,
                             zeroing=True).kv_cache_manager
        log = []
        a = h.make_request("a", list(range(100, 140)), hash_blocks=not kvshare)
        blocks, hit = h.lookup(m, a)
        m.allocate_slots(a, 40 - hit, hit, blocks)
        log.append((m.take_new_block_ids(), m.get_block_ids("a")))
        for i, skip in enumerate(skips):  # asynchronous loads of 80 tokens after a hit of 32
            r = h.make_request(f"r{i}", list(range(100, 132)) + list(range(500 + 100 * i,
                                                                           590 + 100 * i)),
                               hash_blocks=not kvshare)
            blocks, hit = h.lookup(m, r)
            assert m.allocate_slots(r, 0, hit, blocks, num_external_computed_tokens=80,
                                    delay_cache_blocks=True, skip_zeroing_group_ids=skip)
            log.append((hit, m.take_new_block_ids(), m.get_block_ids(r.request_id)))
        m.record_blocks_for_zeroing("r1", 64)  # r1's load failed after its fourth block
        log.append(m.take_new_block_ids())
        m.record_blocks_for_zeroing("r2", 0)
        log.append(m.take_new_block_ids())
        log.append(m.take_new_block_ids())  # drained
        seen.append(log)
    assert seen[0] == seen[1]
    log = seen[0]
    assert log[0][0] == [b for t in log[0][1] for b in t] and log[-1] == []
    for (hit, zeroed, tables), skip in zip(log[1:], skips):
        assert hit == 32
        # The blocks past the hit, but the external tokens' (7 blocks) where the load writes
        # them; a window's nulls are none of them.
        assert zeroed == [b for g, t in enumerate(tables)
                          for b in (t[7:] if g in skip else t[2:]) if b]
    assert log[-3] == [b for t in log[2][2] for b in t[4:]]
    assert log[-2] == [b for t in log[3][2] for b in t]
    if model:
        assert 0 in log[-2], "the window's null blocks are handed out again"


@NEW_SCHEDULER_ONLY
def test_connector_lookups_match_vllm(tiny_model_dir):
    """What vLLM 0.32's scheduler asks the manager for on a KV connector's behalf, both
    managers driven directly: the connector's lookup (one group: never diverged), a hit cut to
    a block boundary, a finished request's blocks covering its computed tokens."""
    seen = []
    for kvshare in (False, True):
        m = h.make_scheduler(tiny_model_dir, kvshare=kvshare, num_blocks=32).kv_cache_manager
        a = h.make_request("a", list(range(100, 150)), hash_blocks=not kvshare)
        blocks, hit = h.lookup(m, a)
        assert m.allocate_slots(a, 50 - hit, hit, blocks) is not None
        a.num_computed_tokens = 50
        b = h.make_request("b", list(range(100, 160)), hash_blocks=not kvshare)
        blocks, hit, boundary, diverged = m.get_computed_blocks_for_connector(b)
        held = m.get_block_ids("a")[0]
        cut = m.truncate_computed_blocks(blocks, 32).get_block_ids()[0]
        log = [hit, boundary, diverged, blocks.get_block_ids()[0] == held[:3],
               cut == held[:2], m.truncate_computed_blocks(blocks, 0).blocks == ((),) or
               m.truncate_computed_blocks(blocks, 0).get_block_ids() == ([],),
               m.get_block_ids_for_computed_tokens("a", 33) == (held[:3],),
               m.get_block_ids_for_computed_tokens("a", 50) == (held,),
               m.get_block_ids_for_computed_tokens("zz", 16) == ([],)]
        if kvshare:  # refused, as vLLM asserts
            with pytest.raises(ValueError, match="not a multiple of the block size"):
                m.truncate_computed_blocks(blocks, 20)
            with pytest.raises(ValueError, match=r"to 4 blocks of a hit of \[3\]"):
                m.truncate_computed_blocks(blocks, 64)
        seen.append(log)
    assert seen[0] == seen[1] == [48, 0, False] + [True] * 6
