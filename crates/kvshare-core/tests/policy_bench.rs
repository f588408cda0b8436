//! Per-operation cost of each eviction policy as a ratio to LRU, measured in one run:
//!
//! ```text
//! KVS_BENCH=1 cargo test --release -p kvshare-core --test policy_bench -- --nocapture
//! ```
//!
//! (Without `KVS_BENCH` it runs one short round of each policy and checks the workload evicts,
//! so the harness itself stays tested.)
//!
//! The workload keeps the cache under pressure: 4 sequences live at a time on 2,048 device pages
//! of 16 tokens; each prompt is one of 64 shared prefixes (drawn Zipf-like) of 8-64 pages plus
//! 1-16 pages of its own, begun, then freed: a page hit takes a cached page out of the evictable
//! set, every fresh page evicts one, every free puts the pages back. The figure is nanoseconds
//! per page the operations touch (hit, allocated or released); the policies run interleaved,
//! repeats alternating, and each reports its median.

use std::time::Instant;

use kvshare_core::{Config, EvictionPolicy, State};

/// A prompt: prefix `p` (its pages' tokens depend on `p` only) and `own` pages of its own.
fn prompt(p: u32, prefix_pages: usize, own: usize, salt: u32, ps: usize) -> Vec<i32> {
    let mut t = Vec::with_capacity((prefix_pages + own) * ps);
    for i in 0..prefix_pages * ps {
        t.push((p as i32) << 16 | i as i32);
    }
    for i in 0..own * ps {
        t.push(0x4000_0000 | ((salt as i32 & 0x3fff) << 16) | i as i32);
    }
    t
}

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Runs `rounds` begin/free cycles; returns (ns per page touched, evictions).
fn run(policy: EvictionPolicy, rounds: usize, seed: u64) -> (f64, u64) {
    let ps = 16;
    let mut s = State::new(Config {
        page_size: ps as u32,
        num_device_pages: 2048,
        eviction_policy: policy,
        ..Config::default()
    })
    .unwrap();
    let mut rng = Rng(seed);
    let lens: Vec<usize> = (0..64).map(|p| 8 + (p * 7) % 57).collect();
    let prompts: Vec<Vec<i32>> = (0..rounds)
        .map(|k| {
            // Zipf-like: prefix index = 64^u - 1 for u uniform.
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            let p = (64f64.powf(u) - 1.0) as u32;
            let own = 1 + (rng.next() % 16) as usize;
            prompt(p, lens[p as usize], own, k as u32, ps)
        })
        .collect();
    let mut live: std::collections::VecDeque<u64> = Default::default();
    let mut pages = 0u64;
    let t = Instant::now();
    for (k, toks) in prompts.iter().enumerate() {
        if live.len() == 4 {
            let id = live.pop_front().unwrap();
            pages += s.seq_info(id).unwrap().num_pages as u64;
            s.free(id).unwrap();
        }
        let id = k as u64 + 1;
        let b = s.begin(id, toks, None, toks.len() - 1, 0).unwrap();
        pages += b.num_pages as u64;
        live.push_back(id);
    }
    let ns = t.elapsed().as_nanos() as f64;
    s.check().unwrap();
    (ns / pages as f64, s.stats().counters.evictions)
}

#[test]
fn eviction_policy_cost_per_page_against_lru() {
    let bench = std::env::var_os("KVS_BENCH").is_some();
    let (rounds, repeats) = if bench { (20_000, 9) } else { (300, 1) };
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); EvictionPolicy::ALL.len()];
    for r in 0..repeats {
        for (j, policy) in EvictionPolicy::ALL.into_iter().enumerate() {
            let (ns, evictions) = run(policy, rounds, 42 + r as u64);
            assert!(evictions > 0, "{policy:?}: the workload must evict");
            times[j].push(ns);
        }
    }
    if !bench {
        return;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let lru = median(&mut times[0].clone());
    println!(
        "eviction policy cost per page touched (begin + free under pressure), median of {repeats}:"
    );
    for (j, policy) in EvictionPolicy::ALL.into_iter().enumerate() {
        let m = median(&mut times[j]);
        println!(
            "  {:<7} {:>7.1} ns/page  {:.2}x LRU",
            policy.name(),
            m,
            m / lru
        );
    }
}
