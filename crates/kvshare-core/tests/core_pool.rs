//! The pool tier through the core's Rust API: a model of two engines, each with its own cache
//! and its own KV contents, sharing one in-memory store that loses entries, answers lookups
//! with lies and holds corrupted values. Each page's KV is modelled by a digest of what it
//! would hold (the salt and every token up to the page's end), computed by the test alone, so
//! a page that reads as matched with the wrong KV is caught whatever the cache believes.

use std::collections::HashMap;

use kvshare_core::{
    Config, CopyKind, Error, ExtraKeys, PoolAnswer, PoolConfig, PoolOp, PoolWork, Ranks, State,
    StorePolicy, Tier,
};
use proptest::prelude::*;

const PS: usize = 4;

/// What a page's KV would be for the prompt prefix `tokens` (ending at the page's end) under
/// `salt`: FNV-1a over both.
fn kv_of(salt: u8, tokens: &[i32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ u64::from(salt);
    for t in tokens {
        for b in t.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// A value in the store: the header a loader verifies, and the payload with its digest.
#[derive(Debug, Clone)]
struct Value {
    hash: u128,
    tokens: Vec<i32>,
    payload: u64,
    digest: u64,
}

fn digest_of(payload: u64) -> u64 {
    payload.rotate_left(17) ^ 0x5bd1_e995
}

/// The shared store, as the engine-side runtime sees it.
#[derive(Debug, Default)]
struct Store {
    values: HashMap<String, Value>,
}

fn pool_cfg(identity: &[u8], store: StorePolicy) -> PoolConfig {
    PoolConfig {
        namespace: "test".into(),
        identity: identity.to_vec(),
        ranks: Ranks::default(),
        store,
    }
}

fn cache(device: u32, host: u32, store: StorePolicy, identity: &[u8]) -> State {
    State::new(Config {
        page_size: PS as u32,
        num_device_pages: device,
        num_host_pages: host,
        skip_cached_writes: false,
        pool: Some(pool_cfg(identity, store)),
        ..Config::default()
    })
    .unwrap()
}

/// A live sequence of an engine.
struct Live {
    tokens: Vec<i32>,
    salt: u8,
    /// Loads outstanding: not computed, not checked yet.
    waiting: bool,
}

/// One engine: its cache, what its device and host pages hold, its sequences.
struct Engine {
    s: State,
    dev: Vec<Option<u64>>,
    host: Vec<Option<u64>>,
    live: HashMap<u64, Live>,
}

impl Engine {
    fn new(s: State, device: usize, host: usize) -> Self {
        Engine {
            s,
            dev: vec![None; device],
            host: vec![None; host],
            live: HashMap::new(),
        }
    }

    fn run_copies(&mut self) {
        for c in self.s.take_copies(usize::MAX) {
            let (src, dst) = (c.src_page as usize, c.dst_page as usize);
            match c.kind {
                CopyKind::DeviceToHost => self.host[dst] = self.dev[src],
                CopyKind::HostToDevice => self.dev[dst] = self.host[src],
                CopyKind::DeviceToDevice => self.dev[dst] = self.dev[src],
            }
        }
    }

    /// Runs a store: the page must hold exactly the KV its key names.
    fn store(&mut self, w: &PoolWork, store: &mut Store, salt_of: &HashMap<u128, u64>) {
        let kv = match w.tier {
            Tier::Device => self.dev[w.page as usize],
            Tier::Host => self.host[w.page as usize],
        };
        let kv = kv.expect("a stored page holds KV");
        assert_eq!(
            Some(&kv),
            salt_of.get(&w.hash),
            "a store reads the KV its key names"
        );
        store.values.entry(w.key.clone()).or_insert(Value {
            hash: w.hash,
            tokens: w.tokens.clone(),
            payload: kv,
            digest: digest_of(kv),
        });
    }

    /// Runs a load as the runtime does: the value's header and payload digest are verified.
    fn load(&mut self, w: &PoolWork, store: &Store) -> bool {
        match store.values.get(&w.key) {
            Some(v)
                if v.hash == w.hash && v.tokens == w.tokens && v.digest == digest_of(v.payload) =>
            {
                self.dev[w.page as usize] = Some(v.payload);
                true
            }
            Some(_) => {
                // A partly written destination is what a failed load may leave behind.
                self.dev[w.page as usize] = Some(0xdead);
                false
            }
            None => false,
        }
    }

    /// The engine's step for a settled sequence: the KV of every token not matched is computed
    /// into the sequence's pages; then every matched page must hold the right KV.
    fn compute(&mut self, id: u64) {
        let l = &self.live[&id];
        let info = self.s.seq_info(id).unwrap();
        let pages = self.s.seq_pages(id, 0).unwrap().to_vec();
        for (j, &p) in pages.iter().enumerate() {
            let end = ((j + 1) * PS).min(l.tokens.len());
            if end <= j * PS {
                break;
            }
            let want = kv_of(l.salt, &l.tokens[..end]);
            if end <= info.matched_tokens {
                assert_eq!(
                    self.dev[p as usize],
                    Some(want),
                    "matched page {j} of seq {id}"
                );
            } else {
                self.dev[p as usize] = Some(want);
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Engine `e` begins a prompt of these page chunks (plus a partial tail) under `salt`.
    Begin {
        e: usize,
        chunks: Vec<u8>,
        tail: usize,
        salt: u8,
        lie: bool,
    },
    /// Engine `e` reports up to `n` of its outstanding loads, the `k`-th first.
    Report { e: usize, n: usize, k: usize },
    /// Engine `e` frees its `k`-th sequence.
    Free { e: usize, k: usize },
    /// Engine `e` commits and runs the stores handed out.
    Commit { e: usize, fail: bool },
    /// The store loses its `k`-th entry.
    Lose { k: usize },
    /// The store's `k`-th entry gets a corrupted payload.
    Corrupt { k: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, prop::collection::vec(0..3u8, 0..7), 0..PS, 0..2u8, prop::bool::weighted(0.15))
            .prop_map(|(e, chunks, tail, salt, lie)| Op::Begin { e, chunks, tail, salt, lie }),
        3 => (0..2usize, 1..6usize, 0..16usize).prop_map(|(e, n, k)| Op::Report { e, n, k }),
        2 => (0..2usize, 0..8usize).prop_map(|(e, k)| Op::Free { e, k }),
        2 => (0..2usize, prop::bool::weighted(0.1)).prop_map(|(e, fail)| Op::Commit { e, fail }),
        1 => (0..64usize).prop_map(|k| Op::Lose { k }),
        1 => (0..64usize).prop_map(|k| Op::Corrupt { k }),
    ]
}

fn prompt(chunks: &[u8], tail: usize) -> Vec<i32> {
    // Chunk c at position j: tokens that depend on both, so equal chunk lists share prefixes.
    let mut t: Vec<i32> = Vec::new();
    for &c in chunks {
        t.extend((0..PS as i32).map(|i| i32::from(c) * 100 + i));
    }
    t.extend((0..tail as i32).map(|i| 1000 + i));
    t.push(7777); // the last token is always computed
    t
}

struct World {
    engines: Vec<Engine>,
    reference: State,
    store: Store,
    /// Every chain digest ever handed out in a transfer, with the KV its page must hold.
    kv_of_hash: HashMap<u128, u64>,
    outstanding: Vec<Vec<PoolWork>>,
    next_id: u64,
}

impl World {
    fn new(policy: StorePolicy) -> World {
        let (dev, host) = (
            24u32,
            if policy == StorePolicy::OnDemotion {
                8
            } else {
                0
            },
        );
        let engines = (0..2)
            .map(|_| {
                Engine::new(
                    cache(dev, host, policy, b"tiny"),
                    dev as usize,
                    host as usize,
                )
            })
            .collect();
        World {
            engines,
            reference: cache(dev, host, policy, b"tiny"),
            store: Store::default(),
            kv_of_hash: HashMap::new(),
            outstanding: vec![Vec::new(), Vec::new()],
            next_id: 1,
        }
    }

    /// Takes engine `e`'s transfers: stores run now, loads wait for a report.
    fn take_work(&mut self, e: usize, fail_stores: bool) {
        let eng = &mut self.engines[e];
        eng.run_copies();
        for w in eng.s.take_pool_work(usize::MAX) {
            match w.op {
                PoolOp::Load => self.outstanding[e].push(w),
                PoolOp::Store => {
                    if !fail_stores {
                        eng.store(&w, &mut self.store, &self.kv_of_hash);
                    }
                    eng.s.pool_done(w.ticket, !fail_stores).unwrap();
                }
            }
        }
    }

    fn settle_ready(&mut self, e: usize) {
        let eng = &mut self.engines[e];
        let ready: Vec<u64> = eng
            .live
            .iter()
            .filter(|(id, l)| l.waiting && eng.s.pool_loading(**id).unwrap() == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            eng.live.get_mut(&id).unwrap().waiting = false;
            eng.compute(id);
        }
    }

    fn apply(&mut self, op: &Op) {
        match op.clone() {
            Op::Begin {
                e,
                chunks,
                tail,
                salt,
                lie,
            } => {
                let tokens = prompt(&chunks, tail);
                let extra = (salt > 0).then(|| ExtraKeys {
                    salt: vec![salt],
                    ..ExtraKeys::default()
                });
                let limit = tokens.len() - 1;
                let eng = &mut self.engines[e];
                let look = eng
                    .s
                    .pool_lookup(&tokens, extra.as_ref(), limit, usize::MAX)
                    .unwrap();
                let hits: Vec<bool> = look
                    .keys
                    .iter()
                    .map(|k| lie || self.store.values.contains_key(&k.key))
                    .collect();
                // The KV each full page's key names, from a cache that never caches anything
                // (its lookups name every full page): the oracle for stores.
                let all = self
                    .reference
                    .pool_lookup(&tokens, extra.as_ref(), usize::MAX, usize::MAX)
                    .unwrap();
                for k in &all.keys {
                    let end = (k.position + 1) * PS;
                    let hash = u128::from_str_radix(k.key.rsplit('/').next().unwrap(), 16).unwrap();
                    self.kv_of_hash.insert(hash, kv_of(salt, &tokens[..end]));
                }
                let answer = PoolAnswer {
                    first_page: look.first_page,
                    hits: &hits,
                };
                let id = self.next_id;
                match eng
                    .s
                    .begin_pooled(id, &tokens, extra, limit, 0, Some(answer))
                {
                    Ok(b) => {
                        self.next_id += 1;
                        assert!(b.matched_tokens <= limit);
                        eng.live.insert(
                            id,
                            Live {
                                tokens,
                                salt,
                                waiting: true,
                            },
                        );
                    }
                    Err(Error::NoSpace { .. }) => {}
                    Err(err) => panic!("begin: {err}"),
                }
                self.take_work(e, false);
                self.settle_ready(e);
            }
            Op::Report { e, n, k } => {
                for _ in 0..n {
                    let out = &mut self.outstanding[e];
                    if out.is_empty() {
                        break;
                    }
                    let w = out.remove(k % out.len());
                    let ok = self.engines[e].load(&w, &self.store);
                    self.engines[e].s.pool_done(w.ticket, ok).unwrap();
                }
                self.settle_ready(e);
            }
            Op::Free { e, k } => {
                let eng = &mut self.engines[e];
                let mut ids: Vec<u64> = eng.live.keys().copied().collect();
                ids.sort_unstable();
                if let Some(&id) = ids.get(k % ids.len().max(1)) {
                    eng.s.free(id).unwrap();
                    eng.live.remove(&id);
                }
            }
            Op::Commit { e, fail } => {
                self.engines[e].s.commit();
                self.take_work(e, fail);
            }
            Op::Lose { k } => {
                let mut keys: Vec<String> = self.store.values.keys().cloned().collect();
                keys.sort();
                if !keys.is_empty() {
                    self.store.values.remove(&keys[k % keys.len()]);
                }
            }
            Op::Corrupt { k } => {
                let mut keys: Vec<String> = self.store.values.keys().cloned().collect();
                keys.sort();
                if !keys.is_empty() {
                    self.store
                        .values
                        .get_mut(&keys[k % keys.len()])
                        .unwrap()
                        .payload ^= 1;
                }
            }
        }
        for eng in &self.engines {
            eng.s.check().unwrap();
        }
    }

    /// Every transfer reported, every sequence freed: nothing is held.
    fn drain(&mut self) {
        for e in 0..2 {
            for w in std::mem::take(&mut self.outstanding[e]) {
                self.engines[e].s.pool_done(w.ticket, false).unwrap();
            }
            self.settle_ready(e);
            let ids: Vec<u64> = self.engines[e].live.keys().copied().collect();
            for id in ids {
                self.engines[e].s.free(id).unwrap();
            }
            self.engines[e].live.clear();
            self.engines[e].s.commit();
            self.take_work(e, false);
            let st = self.engines[e].s.stats();
            assert_eq!(st.device_pages_in_use, 0, "engine {e}: pages still held");
            let ps = self.engines[e].s.pool_stats().unwrap();
            assert_eq!((ps.pending, ps.queued), (0, 0));
            assert_eq!(ps.loads, ps.loads_ok + ps.loads_failed);
            assert_eq!(ps.stores, ps.stores_ok + ps.stores_failed);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn two_engines_one_store_never_serve_wrong_kv(
        ops in prop::collection::vec(op(), 1..70),
        policy in prop_oneof![Just(StorePolicy::WriteThrough), Just(StorePolicy::OnDemotion)],
    ) {
        let mut w = World::new(policy);
        for op in &ops {
            w.apply(op);
        }
        w.drain();
    }
}

/// Engine `a` computes `tokens` and commits; the stores it hands out go to `store`.
fn compute_and_store(a: &mut State, id: u64, tokens: &[i32], store: &mut HashMap<String, u128>) {
    a.begin(id, tokens, None, tokens.len() - 1, 0).unwrap();
    a.commit();
    for w in a.take_pool_work(usize::MAX) {
        assert_eq!(w.op, PoolOp::Store);
        store.insert(w.key.clone(), w.hash);
        a.pool_done(w.ticket, true).unwrap();
    }
}

fn answer_from(store: &HashMap<String, u128>, keys: &[kvshare_core::PoolKey]) -> Vec<bool> {
    keys.iter().map(|k| store.contains_key(&k.key)).collect()
}

#[test]
fn a_conversation_continues_on_another_engine_from_the_pool() {
    let mut a = cache(32, 0, StorePolicy::WriteThrough, b"m");
    let mut b = cache(32, 0, StorePolicy::WriteThrough, b"m");
    let mut store = HashMap::new();
    let turn1: Vec<i32> = (0..18).collect(); // 4 full pages + 2
    compute_and_store(&mut a, 1, &turn1, &mut store);
    assert_eq!(store.len(), 4);
    // The next turn lands on engine b: its 4 + 1 full pages are looked up, 4 hit.
    let turn2: Vec<i32> = (0..23).collect();
    let look = b.pool_lookup(&turn2, None, 22, usize::MAX).unwrap();
    assert_eq!((look.first_page, look.keys.len()), (0, 5));
    let hits = answer_from(&store, &look.keys);
    let info = b
        .begin_pooled(
            7,
            &turn2,
            None,
            22,
            0,
            Some(PoolAnswer {
                first_page: 0,
                hits: &hits,
            }),
        )
        .unwrap();
    assert_eq!(
        (info.matched_tokens, info.pool_pages, info.new_pages),
        (16, 4, 6)
    );
    let work = b.take_pool_work(usize::MAX);
    assert_eq!(work.len(), 4);
    let pages = b.seq_pages(7, 0).unwrap().to_vec();
    for (j, w) in work.iter().enumerate() {
        assert_eq!(
            (w.op, w.tier, w.page),
            (PoolOp::Load, Tier::Device, pages[j])
        );
        assert_eq!(store[&w.key], w.hash);
        assert_eq!(w.tokens, turn2[j * PS..(j + 1) * PS]);
    }
    assert_eq!(b.pool_loading(7).unwrap(), 4);
    // Loading pages are not matchable, and a loading sequence is neither forked nor swapped.
    assert_eq!(
        b.pool_lookup(&turn2, None, 22, usize::MAX)
            .unwrap()
            .first_page,
        0
    );
    assert!(b.fork(7, 8).is_err());
    let mut copies = Vec::new();
    assert!(b.swap_out(7, &mut copies, 64).is_err());
    b.check().unwrap();
    for w in &work {
        b.pool_done(w.ticket, true).unwrap();
    }
    assert_eq!(b.pool_loading(7).unwrap(), 0);
    assert_eq!(b.seq_info(7).unwrap().matched_tokens, 16);
    // Settled: the loaded pages are matchable locally; only the computed page is stored.
    assert_eq!(
        b.pool_lookup(&turn2, None, 22, usize::MAX)
            .unwrap()
            .first_page,
        5
    );
    b.commit();
    let stores = b.take_pool_work(usize::MAX);
    assert_eq!(stores.len(), 1);
    assert_eq!(stores[0].page, pages[4]);
    b.pool_done(stores[0].ticket, true).unwrap();
    let st = b.pool_stats().unwrap();
    assert_eq!(
        (st.loads, st.loads_ok, st.hit_tokens, st.stores),
        (4, 4, 16, 1)
    );
    assert_eq!((st.pending, st.queued), (0, 0));
    b.check().unwrap();
}

#[test]
fn a_failed_load_ends_the_match_there_and_the_rest_is_computed() {
    let mut b = cache(32, 0, StorePolicy::WriteThrough, b"m");
    let tokens: Vec<i32> = (0..21).collect();
    let look = b.pool_lookup(&tokens, None, 20, usize::MAX).unwrap();
    // The store claims all five pages; the third one fails to load (evicted, or a bad value).
    let hits = vec![true; look.keys.len()];
    let info = b
        .begin_pooled(
            1,
            &tokens,
            None,
            20,
            0,
            Some(PoolAnswer {
                first_page: 0,
                hits: &hits,
            }),
        )
        .unwrap();
    assert_eq!((info.matched_tokens, info.pool_pages), (20, 5));
    let work = b.take_pool_work(usize::MAX);
    for w in work.iter().rev() {
        b.pool_done(w.ticket, w.tokens[0] != 8).unwrap();
    }
    let s = b.seq_info(1).unwrap();
    assert_eq!(s.matched_tokens, 8);
    let st = b.pool_stats().unwrap();
    assert_eq!((st.loads_ok, st.loads_failed, st.hit_tokens), (4, 1, 8));
    // Pages from the failed one on are the sequence's to compute: stored once written.
    b.commit();
    let stored: Vec<u32> = b
        .take_pool_work(usize::MAX)
        .iter()
        .map(|w| w.page)
        .collect();
    assert_eq!(stored, b.seq_pages(1, 0).unwrap()[2..5]);
    b.check().unwrap();
}

#[test]
fn a_sequence_freed_while_loading_keeps_its_pages_until_the_loads_report() {
    let mut b = cache(16, 0, StorePolicy::ReadOnly, b"m");
    let tokens: Vec<i32> = (0..13).collect();
    let look = b.pool_lookup(&tokens, None, 12, usize::MAX).unwrap();
    let hits = vec![true; look.keys.len()];
    b.begin_pooled(
        1,
        &tokens,
        None,
        12,
        0,
        Some(PoolAnswer {
            first_page: 0,
            hits: &hits,
        }),
    )
    .unwrap();
    let work = b.take_pool_work(usize::MAX);
    assert_eq!(work.len(), 3);
    b.free(1).unwrap();
    assert_eq!(b.stats().device_pages_in_use, 3);
    b.check().unwrap();
    for w in &work {
        b.pool_done(w.ticket, true).unwrap();
    }
    // Nobody registers pages of a freed sequence: they are free, not cached.
    let st = b.stats();
    assert_eq!((st.device_pages_in_use, st.index_pages), (0, 0));
    b.check().unwrap();
}

#[test]
fn refused_calls_change_nothing() {
    let mut b = cache(16, 0, StorePolicy::ReadOnly, b"m");
    let tokens: Vec<i32> = (0..13).collect();
    let look = b.pool_lookup(&tokens, None, 12, usize::MAX).unwrap();
    assert_eq!(look.keys.len(), 3);
    let before = (b.stats(), b.pool_stats());
    // Too many keys for the caller's room: refused, not counted.
    assert!(matches!(
        b.pool_lookup(&tokens, None, 12, 2),
        Err(Error::BufferTooSmall { needed: 3, .. })
    ));
    // Unknown ticket; an answer that is not whole positions (here with two groups it would be).
    assert!(matches!(
        b.pool_done(99, true),
        Err(Error::InvalidArgument { .. })
    ));
    let mut two = State::new(Config {
        page_size: PS as u32,
        num_device_pages: 16,
        groups: vec![kvshare_core::GroupSpec::FULL; 2],
        skip_cached_writes: false,
        pool: Some(pool_cfg(b"m", StorePolicy::ReadOnly)),
        ..Config::default()
    })
    .unwrap();
    let hits = [true; 3];
    let r = two.begin_pooled(
        1,
        &tokens,
        None,
        12,
        0,
        Some(PoolAnswer {
            first_page: 0,
            hits: &hits,
        }),
    );
    assert!(matches!(r, Err(Error::InvalidArgument { .. })));
    assert!(two.seq_info(1).is_err());
    assert_eq!((b.stats(), b.pool_stats()), before);
    // A ticket still queued cannot be reported; once handed out it can, once.
    b.begin_pooled(
        1,
        &tokens,
        None,
        12,
        0,
        Some(PoolAnswer {
            first_page: 0,
            hits: &[true; 3],
        }),
    )
    .unwrap();
    assert!(b.pool_done(1, true).is_err());
    let w = b.take_pool_work(1);
    b.pool_done(w[0].ticket, true).unwrap();
    assert!(b.pool_done(w[0].ticket, true).is_err());
    // Without a pool tier every pool call is refused.
    let mut plain = State::new(Config::default()).unwrap();
    assert!(matches!(
        plain.pool_lookup(&tokens, None, 12, usize::MAX),
        Err(Error::Unsupported(_))
    ));
    assert!(plain.pool_stats().is_none());
    b.check().unwrap();
}

#[test]
fn keys_keep_models_layouts_ranks_and_tenants_apart() {
    let tokens: Vec<i32> = (0..9).collect();
    let keys = |cfg: Config, extra: Option<&ExtraKeys>| {
        let mut s = State::new(cfg).unwrap();
        s.pool_lookup(&tokens, extra, 8, usize::MAX).unwrap().keys[0]
            .key
            .clone()
    };
    let base = || Config {
        page_size: PS as u32,
        num_device_pages: 16,
        pool: Some(pool_cfg(b"m", StorePolicy::ReadOnly)),
        ..Config::default()
    };
    let k0 = keys(base(), None);
    assert!(k0.starts_with("kvs1/test/"), "{k0}");
    assert!(k0.contains("/0-0-0-0/g0/"), "{k0}");
    let mut other = vec![];
    let mut c = base();
    c.pool.as_mut().unwrap().identity = b"m2".to_vec();
    other.push(keys(c, None));
    let mut c = base();
    c.dtype = kvshare_core::DType::BF16;
    other.push(keys(c, None));
    let mut c = base();
    c.head_dim = 64;
    other.push(keys(c, None));
    let mut c = base();
    c.pool.as_mut().unwrap().ranks.tp = (1, 2);
    other.push(keys(c, None));
    let mut c = base();
    c.pool.as_mut().unwrap().ranks.pp = (0, 2);
    other.push(keys(c, None));
    let salted = ExtraKeys {
        salt: b"tenant".to_vec(),
        ..ExtraKeys::default()
    };
    other.push(keys(base(), Some(&salted)));
    let lora = ExtraKeys {
        lora_id: 3,
        ..ExtraKeys::default()
    };
    other.push(keys(base(), Some(&lora)));
    for k in &other {
        assert_ne!(k, &k0);
    }
    // The same configuration gives the same key in another cache (another process).
    assert_eq!(keys(base(), None), k0);
}

#[test]
fn bad_pool_settings_are_refused() {
    let with = |f: &dyn Fn(&mut Config)| {
        let mut c = Config {
            pool: Some(pool_cfg(b"m", StorePolicy::ReadOnly)),
            ..Config::default()
        };
        f(&mut c);
        matches!(
            State::new(c),
            Err(Error::InvalidConfig { field: "pool", .. })
        )
    };
    assert!(!with(&|_| {}));
    assert!(with(&|c| c.pool.as_mut().unwrap().namespace = "a/b".into()));
    assert!(with(&|c| c.pool.as_mut().unwrap().namespace = String::new()));
    assert!(with(&|c| c.pool.as_mut().unwrap().identity = Vec::new()));
    assert!(with(&|c| c.pool.as_mut().unwrap().ranks.tp = (2, 2)));
    assert!(with(
        &|c| c.pool.as_mut().unwrap().store = StorePolicy::OnDemotion
    ));
    assert!(with(&|c| c.enable_prefix_caching = false));
    // Quantized pages: the key does not name the engine's scales.
    for dtype in [
        kvshare_core::DType::Fp8E4M3,
        kvshare_core::DType::Fp8E5M2,
        kvshare_core::DType::Int8,
        kvshare_core::DType::Int8PerTokenHead,
    ] {
        assert!(with(&|c| c.dtype = dtype), "{dtype:?}");
    }
    assert!(!with(&|c| c.dtype = kvshare_core::DType::BF16));
    assert!(with(&|c| {
        c.reserve_null_page = true;
        c.groups = vec![
            kvshare_core::GroupSpec::FULL,
            kvshare_core::GroupSpec {
                kind: kvshare_core::GroupKind::SlidingWindow(8),
                page_bytes: 0,
                eagle: false,
            },
        ];
    }));
}
