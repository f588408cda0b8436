"""kvshare's pool runtime (kvshare/pool.py) against an in-process store with Mooncake Store's
call shapes and return codes: two caches share pages through it, and every bad entry (lies,
truncated, corrupted, foreign, stale, unkeyed) or store failure ends in recomputation with the
right KV, never a page that holds wrong bytes."""

from __future__ import annotations

import ctypes
import hashlib

import numpy as np
import pytest

import kvshare
from kvshare import pool as kp

PS = 4
PAGE_BYTES = 64


class FakeStore:
    """Mooncake Store's batch calls on a dict: a put of a present key reports success and
    stores nothing; a key whose put never ended (``unfinished``) reads as absent, a put of it
    likewise reports success and stores nothing, and it cannot be removed."""

    def __init__(self):
        self.values: dict[str, bytes] = {}
        self.rpc_code = 0  # nonzero: every call fails with it
        self.calls = 0
        self.lost_on_get: set[str] = set()  # listed by batch_is_exist, gone at the load
        # held by a put that never ended: absent, and a put of it "succeeds" storing nothing
        self.unfinished: set[str] = set()
        self.removed: list[tuple[str, bool]] = []

    def register_buffer(self, ptr, size):
        return 0

    def unregister_buffer(self, ptr):
        return 0

    def batch_is_exist(self, keys):
        self.calls += 1
        if self.rpc_code:
            return [self.rpc_code] * len(keys)
        return [1 if k in self.values else 0 for k in keys]

    def batch_get_into(self, keys, ptrs, sizes):
        self.calls += 1
        if self.rpc_code:
            return [self.rpc_code] * len(keys)
        out = []
        for k, p, n in zip(keys, ptrs, sizes):
            v = self.values.get(k)
            if v is None or k in self.lost_on_get:
                out.append(kp.OBJECT_NOT_FOUND)
            elif len(v) > n:
                out.append(-600)
            else:
                ctypes.memmove(p, v, len(v))
                out.append(len(v))
        return out

    def batch_put_from(self, keys, ptrs, sizes):
        self.calls += 1
        if self.rpc_code:
            return [self.rpc_code] * len(keys)
        for k, p, n in zip(keys, ptrs, sizes):
            if k not in self.unfinished:
                self.values.setdefault(k, ctypes.string_at(p, n))
        return [0] * len(keys)

    def remove(self, key, force=False):
        self.calls += 1
        self.removed.append((key, force))
        if self.rpc_code:
            return self.rpc_code
        if key in self.unfinished:
            return kp.REPLICA_IS_NOT_READY
        return 0 if self.values.pop(key, None) is not None else kp.OBJECT_NOT_FOUND


def kv(tokens, salt=b"") -> bytes:
    """The KV a page holds after computing the prefix ``tokens`` (ending at the page's end)."""
    d = hashlib.sha256(salt + np.asarray(tokens, dtype=np.int32).tobytes()).digest()
    return (d * (PAGE_BYTES // len(d) + 1))[:PAGE_BYTES]


class Engine:
    """A cache and its KV memory; ``run`` begins a prompt through the pool and computes the
    rest, checking that every matched page holds the right KV."""

    def __init__(self, store, identity="tiny", mac_key=b"", store_policy="write_through",
                 clock=None):
        self.cache = kvshare.Cache(page_size=PS, num_device_pages=32, skip_cached_writes=False,
                                   pool={"namespace": "t", "identity": identity,
                                         "store": store_policy})
        self.dev = np.zeros((32, PAGE_BYTES), np.uint8)
        kw = {"clock": clock} if clock else {}
        self.rt = kp.PoolRuntime(self.cache, store, self, mac_key=mac_key, **kw)
        self.next_id = 1

    def page_bytes(self, group):
        return PAGE_BYTES

    def read(self, tier, group, page):
        assert tier == 0
        return self.dev[page].tobytes()

    def write(self, group, page, data):
        self.dev[page] = np.frombuffer(data, np.uint8)

    def run(self, tokens, salt=b"") -> int:
        """Returns the tokens matched; frees the sequence after committing its pages."""
        extra = kvshare.ExtraKeys(salt=salt) if salt else None
        sid = self.next_id
        self.next_id += 1
        self.rt.begin(sid, tokens, extra, max_match_tokens=len(tokens) - 1)
        assert self.cache.seq_pool_loading(sid) == 0
        matched = self.cache.seq_info(sid)["matched_tokens"]
        for j, page in enumerate(self.cache.seq_pages(sid)):
            end = min((j + 1) * PS, len(tokens))
            want = np.frombuffer(kv(tokens[:end], salt), np.uint8)
            if end <= matched:
                assert (self.dev[page] == want).all(), f"matched page {j} holds wrong KV"
            else:
                self.dev[page] = want
        self.cache.commit()
        self.rt.pump()
        self.cache.seq_free(sid)
        self.cache.check()
        return matched


def test_a_conversation_continues_on_another_engine():
    store = FakeStore()
    a, b = Engine(store), Engine(store)
    turn1 = list(range(100, 118))  # 4 full pages + 2
    assert a.run(turn1) == 0
    assert len(store.values) == 4
    turn2 = turn1 + list(range(500, 507))
    assert b.run(turn2) == 16
    st = b.cache.pool_stats()
    assert (st["loads_ok"], st["hit_tokens"], st["pending"]) == (4, 16, 0)
    assert b.rt.stats.loads_ok == 4
    # The next turn back on a: its own 4 pages locally, b's stored page from the pool.
    turn3 = turn2 + [9]
    assert a.run(turn3) == 24
    assert a.cache.pool_stats()["hit_tokens"] == 8


def _value_of(store, b, tokens, position):
    first, keys = b.cache.pool_lookup(tokens, None, len(tokens) - 1)
    return [k for p, _, k in keys if p == position][0]


@pytest.mark.parametrize("damage", ["truncated", "oversize", "payload", "tokens", "foreign",
                                    "lie", "lost", "version"])
def test_bad_entries_fall_back_to_recomputation(damage):
    store = FakeStore()
    a, b = Engine(store), Engine(store)
    t = list(range(1, 18))  # 4 full pages + 1
    a.run(t)
    k1 = _value_of(store, b, t, 1)
    k2 = _value_of(store, b, t, 2)
    if damage == "truncated":
        store.values[k1] = store.values[k1][:-1]
    elif damage == "oversize":  # the client refuses a value larger than the buffer
        store.values[k1] = store.values[k1] + b"\0"
    elif damage == "payload":
        v = bytearray(store.values[k1])
        v[-1] ^= 1
        store.values[k1] = bytes(v)
    elif damage == "tokens":  # a stale entry: another page's tokens under this key
        hl = kp.header_len(PS)
        v = bytearray(store.values[k1])
        v[kp._HEAD.size:hl] = store.values[k2][kp._HEAD.size:hl]
        store.values[k1] = bytes(v)
    elif damage == "foreign":  # a valid entry of another page, planted under this key
        store.values[k1] = store.values[k2]
    elif damage == "lie":  # listed, gone when loaded (evicted between lookup and load)
        store.lost_on_get.add(k1)
    elif damage == "lost":
        del store.values[k1]
    elif damage == "version":
        v = bytearray(store.values[k1])
        v[4] = 9
        store.values[k1] = bytes(v)
    assert b.run(t) == PS  # page 0 loads; page 1 does not; the rest is computed
    failures = b.rt.stats.load_failures
    if damage != "lost":
        assert sum(failures.values()) >= 1, failures
    if damage in ("truncated", "oversize"):
        assert failures == {"size": 1}, failures
    # An entry that failed verification was removed and b's recomputed page stored in its
    # place: the next engine loads every page. A load that failed for want of an entry
    # removes nothing and, with the key free, b's store filled it too.
    verified = damage not in ("lie", "lost")
    assert [k for k, _ in store.removed] == ([k1] if verified else [])
    assert all(force for _, force in store.removed)
    assert b.rt.stats.removed == (1 if verified else 0)
    if damage != "lie":
        c = Engine(store)
        assert c.run(t) == 16
        assert c.rt.stats.load_failures == {} and c.rt.stats.loads_ok == 4


def test_only_an_entry_that_fails_verification_is_removed():
    """A tenant's or another model's engine never removes an entry it cannot load: their
    keys differ, so neither reads the other's entries; an engine reading a valid entry under
    its own key verifies it and removes nothing."""
    store = FakeStore()
    t = list(range(1, 14))
    Engine(store).run(t)
    before = dict(store.values)
    assert Engine(store).run(t, salt=b"tenant-b") == 0
    assert Engine(store, identity="other-model").run(t) == 0
    assert Engine(store).run(t) == 12
    assert store.removed == []
    assert all(store.values[k] == v for k, v in before.items())


def test_a_store_over_an_unfinished_put_counts_as_failed():
    """The client reports a put of a key held by an unfinished put as success; the runtime
    asks the master and counts the store failed."""
    store = FakeStore()
    a = Engine(store)
    t = list(range(1, 14))
    first, keys = a.cache.pool_lookup(t, None, len(t) - 1)
    store.unfinished.add(keys[1][2])
    assert a.run(t) == 0
    assert a.rt.stats.store_failures == {"not stored": 1}
    assert a.rt.stats.stores_ok == 2
    assert a.cache.pool_stats()["stores_failed"] == 1
    assert keys[1][2] not in store.values
    assert Engine(store).run(t) == PS  # page 0 from the pool; page 1 absent: computed


def test_an_engine_with_a_key_rejects_entries_without_it():
    store = FakeStore()
    a, b = Engine(store), Engine(store, mac_key=b"deployment-secret")
    t = list(range(1, 14))
    a.run(t)
    assert b.run(t) == 0
    assert b.rt.stats.load_failures == {"digest": 3}
    keyed = FakeStore()
    assert Engine(keyed, mac_key=b"deployment-secret").run(t) == 0
    assert Engine(keyed, mac_key=b"deployment-secret").run(t) == 12
    assert Engine(keyed).run(t) == 0


def test_models_and_tenants_do_not_share_entries():
    store = FakeStore()
    a, b = Engine(store), Engine(store, identity="other-model")
    t = list(range(1, 14))
    a.run(t)
    assert b.run(t) == 0
    assert Engine(store).run(t, salt=b"tenant-b") == 0
    assert Engine(store).run(t) == 12


def test_a_failing_master_opens_the_breaker():
    now = [0.0]
    store = FakeStore()
    a = Engine(store)
    b = Engine(store, clock=lambda: now[0])
    prompts = [list(range(k * 100, k * 100 + 13)) for k in (1, 2, 3)]
    for t in prompts:
        a.run(t)
    store.rpc_code = kp.RPC_FAIL
    assert b.run(prompts[0]) == 0
    assert b.rt.breaker.trips == 1
    assert b.rt.stats.store_failures.get("breaker", 0) == 3  # its own pages: not stored
    store.rpc_code = 0
    calls = store.calls
    assert b.run(prompts[1]) == 0  # open: the store is not asked, the prompt is computed
    assert store.calls == calls
    assert b.rt.stats.lookups_skipped == 1
    now[0] += 10
    assert b.run(prompts[2]) == 12
    assert store.calls > calls


def test_values_verify_and_reject():
    w = {"key": "kvs1/t/x/0-0-0-0/g0/ab", "hash": 7 << 100 | 5, "tokens": [1, 2, 3, 4]}
    payload = bytes(range(64))
    v = kp.encode_value(w, payload, PS)
    assert kp.verify_value(w, v, PS, 64) == (payload, "")
    assert kp.verify_value(dict(w, key="kvs1/t/x/0-0-0-0/g0/cd"), v, PS, 64)[1] == "key"
    assert kp.verify_value(dict(w, hash=8), v, PS, 64)[1] == "chain"
    assert kp.verify_value(dict(w, tokens=[1, 2, 3, 5]), v, PS, 64)[1] == "tokens"
    assert kp.verify_value(w, v, PS, 65)[1] == "size"
    assert kp.verify_value(w, v, PS, 64, b"k")[1] == "digest"
    assert kp.verify_value(w, b"XXXX" + v[4:], PS, 64)[1] == "format"


class _Request:
    def __init__(self, rid, tokens):
        self.request_id, self._all_token_ids = rid, tokens
        self.skip_reading_prefix_cache = False


class _Blocks:
    def __init__(self, n):
        self.ids = list(range(1, n + 1))

    def get_block_ids(self):
        return [self.ids]


class _Manager:
    enable_caching = True

    def __init__(self):
        self.cache = kvshare.Cache(page_size=PS, num_device_pages=32, skip_cached_writes=False,
                                   pool={"namespace": "t", "identity": "tiny",
                                         "store": "write_through"})

    def _extra_for(self, request):
        return None


def test_the_connector_stores_back_a_failed_page_and_forgets_finished_requests(monkeypatch):
    """kvshare's vLLM connector (scheduler half) skips storing pages it loaded, but stores a
    page whose load failed (the worker removed a rejected entry), and holds the loaded keys
    of live requests only: a finished request's go after the next step."""
    from kvshare_vllm import pool_tier

    store = FakeStore()
    t = list(range(1, 18))  # 4 full pages + 1
    Engine(store).run(t)
    monkeypatch.setattr(pool_tier, "store_client", lambda settings: store)
    mgr = _Manager()
    sp = pool_tier.SchedulerPool({"mac_key": b"", "cooldown_s": 5.0}, mgr)
    req = _Request("r1", t)
    assert sp.matched(req, 0) == 16
    sp.allocated(req, _Blocks(5), 16)
    step = sp.step()
    keys = [w["key"] for w in step.loads["r1"]]
    assert len(keys) == 4 and len(sp._loaded_keys) == 4
    # The worker rejected page 1's entry; vLLM recomputes the request and the manager
    # registers its pages: page 1's store goes out, the three loaded pages' do not.
    sp.outcomes(pool_tier.PoolOutcomes(failed_loads={keys[1]: "size"}))
    mgr.cache.seq_begin(1, t)
    mgr.cache.seq_free(1)
    step = sp.step()
    assert [w["key"] for w in step.stores] == [keys[1]]
    assert sp.stores_skipped == 3
    # Finished: its keys go once the step after it has taken the store work.
    sp.forget("r1")
    assert len(sp._loaded_keys) == 3
    sp.step()
    assert sp._loaded_keys == {} and sp._loaded == {}
