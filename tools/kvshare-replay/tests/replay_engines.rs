//! Several engines behind a router, with and without a shared pool: one engine without a pool
//! is the single-engine replay exactly, whatever the routing; the hits split into device, host
//! and pool tiers that add up; the pool store never holds more than its pages; and on chat
//! workloads a pool never loses hits on the same routing.

use kvshare_core::EvictionPolicy;
use kvshare_replay::engines::{Engines, EnginesOutcome, PoolStore, Route};
use kvshare_replay::trace::Request;
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::{replay, replay_engines, NoModel, ReplayConfig, VecSource};
use proptest::prelude::*;

fn chat(seed: u64, users: usize, turns: usize, system: usize) -> Vec<Request> {
    ChatWorkload {
        users,
        turns,
        system_tokens: system,
        user_tokens: (20, 80),
        output_tokens: (10, 60),
        think_ms: (0, 400),
        seed,
        ..ChatWorkload::default()
    }
    .generate()
}

fn cfg(device_pages: u32, host_pages: u32) -> ReplayConfig {
    ReplayConfig {
        page_size: 16,
        device_pages,
        host_pages,
        concurrency: 4,
        policy: EvictionPolicy::Lru,
        check: true,
        ..ReplayConfig::default()
    }
}

fn engines(
    reqs: &[Request],
    c: &ReplayConfig,
    n: usize,
    pool: usize,
    route: Route,
) -> EnginesOutcome {
    let set = Engines {
        engines: n,
        pool_pages: pool,
        route,
    };
    replay_engines(&mut VecSource::new(reqs), c, &set, &mut |_| {}).unwrap()
}

fn tiers_add_up(r: &EnginesOutcome, total_requests: usize) {
    assert_eq!(
        r.device_hit_tokens() + r.host_hit_tokens() + r.pool_hit_tokens(),
        r.hit_tokens()
    );
    assert_eq!(r.recomputed_tokens() + r.hit_tokens(), r.query_tokens());
    assert_eq!(
        r.requests_per_engine().iter().sum::<usize>(),
        total_requests
    );
    assert!(r.store.peak_entries <= r.set.pool_pages as u64);
    if r.set.pool_pages == 0 {
        assert_eq!(r.pool_hit_tokens(), 0);
        assert_eq!(r.store.stored, 0);
    }
}

#[test]
fn one_engine_without_a_pool_is_the_single_engine_replay() {
    let reqs = chat(7, 6, 6, 256);
    for (pages, host) in [(120, 0), (90, 0), (90, 200), (400, 0)] {
        let c = cfg(pages, host);
        let single = replay(&reqs, &c, &mut NoModel, &mut |_| {}).unwrap();
        for route in Route::ALL {
            let r = engines(&reqs, &c, 1, 0, route);
            let e = &r.engines[0];
            tiers_add_up(&r, reqs.len());
            assert_eq!(r.steps, single.steps, "{pages}/{host} {route:?}");
            assert_eq!(e.hit_tokens(), single.hit_tokens());
            assert_eq!(e.query_tokens(), single.query_tokens());
            assert_eq!(e.host_hit_tokens, single.host_hit_tokens);
            assert_eq!(e.final_stats.counters, single.final_stats.counters);
            assert_eq!((e.swaps, e.recomputes), (single.swaps, single.recomputes));
            let by_id = |o: &kvshare_replay::Outcome| {
                let mut v: Vec<(String, u64, u64, f64)> = o
                    .requests
                    .iter()
                    .map(|q| (q.id.clone(), q.hit_tokens, q.query_tokens, q.finish_ms))
                    .collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v
            };
            assert_eq!(by_id(e), by_id(&single), "{pages}/{host} {route:?}");
        }
    }
}

#[test]
fn the_pool_store_evicts_the_least_recently_used_entry() {
    let mut s = PoolStore::new(2);
    s.put("a".into());
    s.put("b".into());
    assert!(s.get("a"));
    s.put("c".into());
    assert!(s.contains("a") && !s.contains("b") && s.contains("c"));
    s.put("a".into());
    assert_eq!((s.len(), s.stats.stored, s.stats.evictions), (2, 3, 1));
    assert!(!s.get("b"));
    assert_eq!((s.stats.loads, s.stats.loads_ok), (2, 1));
    let mut none = PoolStore::new(0);
    none.put("a".into());
    assert!(none.is_empty());
}

#[test]
fn a_conversation_moved_to_another_engine_loads_its_history_from_the_pool() {
    // Round-robin over 2 engines sends consecutive turns of one conversation to different
    // engines: without a pool only the system prompt the engine saw before hits; with one, the
    // whole history does.
    let reqs = chat(3, 1, 6, 64);
    let c = cfg(400, 0);
    let single = replay(&reqs, &c, &mut NoModel, &mut |_| {}).unwrap();
    let without = engines(&reqs, &c, 2, 0, Route::RoundRobin);
    let with = engines(&reqs, &c, 2, 1000, Route::RoundRobin);
    tiers_add_up(&without, reqs.len());
    tiers_add_up(&with, reqs.len());
    assert_eq!(with.requests_per_engine(), vec![3, 3]);
    assert!(without.hit_tokens() < single.hit_tokens());
    assert_eq!(with.hit_tokens(), single.hit_tokens());
    assert!(with.pool_hit_tokens() > 0);
    // Session routing keeps the conversation on one engine: the pool has nothing to add.
    let session = engines(&reqs, &c, 2, 1000, Route::Session);
    assert_eq!(session.hit_tokens(), single.hit_tokens());
    assert_eq!(session.pool_hit_tokens(), 0);
}

#[test]
fn kv_aware_routing_weighs_the_cached_prefix_against_the_load() {
    // Every prompt starts with the same system prompt. Routing by the longest cached prefix
    // alone would send everything to the first engine that cached it; counted against the load,
    // every engine serves a share, and conversations mostly return to the engine that holds
    // their history, so more is hit than by round-robin.
    let reqs = chat(11, 16, 5, 512);
    let c = cfg(300, 0);
    let kv = engines(&reqs, &c, 4, 0, Route::KvAware);
    let rr = engines(&reqs, &c, 4, 0, Route::RoundRobin);
    tiers_add_up(&kv, reqs.len());
    let per = kv.requests_per_engine();
    let fair = reqs.len() / 4;
    assert!(
        per.iter().all(|&n| n >= fair / 2 && n <= fair * 2),
        "requests per engine {per:?}, {} requests",
        reqs.len()
    );
    assert!(
        kv.hit_tokens() > rr.hit_tokens(),
        "kv-aware {} vs round-robin {}",
        kv.hit_tokens(),
        rr.hit_tokens()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn a_pool_never_loses_hits_on_the_same_routing(
        seed in 0u64..1000, users in 2usize..7, turns in 2usize..6, system in 0usize..300,
        n in 1usize..5, pages in 60u32..200, pool in 1usize..600, r in 0usize..3,
    ) {
        let reqs = chat(seed, users, turns, system);
        let c = cfg(pages, 0);
        let route = Route::ALL[r];
        let set = |pool_pages| Engines { engines: n, pool_pages, route };
        let without = match replay_engines(&mut VecSource::new(&reqs), &c, &set(0), &mut |_| {}) {
            Ok(o) => o,
            // The device is too small for the longest request.
            Err(e) if e.contains("needs") => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(e)),
        };
        let with = replay_engines(&mut VecSource::new(&reqs), &c, &set(pool), &mut |_| {})
            .map_err(TestCaseError::fail)?;
        tiers_add_up(&without, reqs.len());
        tiers_add_up(&with, reqs.len());
        prop_assert!(
            with.hit_tokens() >= without.hit_tokens(),
            "{:?} x{}: {} hit tokens with a pool of {}, {} without",
            route, n, with.hit_tokens(), pool, without.hit_tokens()
        );
    }
}
