//! Each eviction policy's cost per page, beside LRU's measured in the same run (LRU is the
//! floor of the other policies' rows: their "x floor" is the ratio to LRU).
//!
//! The workload keeps the cache under pressure: 4 sequences live at a time on 2,048 device pages
//! of 16 tokens; each prompt is one of 64 shared prefixes (drawn Zipf-like) of 8-64 pages plus
//! 1-16 pages of its own, begun, then freed: a page hit takes a cached page out of the evictable
//! set, every fresh page evicts one, every free puts the pages back. The figure is nanoseconds
//! per page the operations touch (hit, allocated or released); the policies run interleaved,
//! repeats alternating, and each reports its median.

use std::collections::VecDeque;
use std::time::Instant;

use kvshare_core::{Config, EvictionPolicy, State};
use kvshare_replay::rng::Rng;

use super::Row;

const PAGE: usize = 16;

/// A prompt: prefix `p` (its pages' tokens depend on `p` only) and `own` pages of its own.
fn prompt(p: u32, prefix_pages: usize, own: usize, salt: u32) -> Vec<i32> {
    let mut t = Vec::with_capacity((prefix_pages + own) * PAGE);
    for i in 0..prefix_pages * PAGE {
        t.push((p as i32) << 16 | i as i32);
    }
    for i in 0..own * PAGE {
        t.push(0x4000_0000 | ((salt as i32 & 0x3fff) << 16) | i as i32);
    }
    t
}

/// The prompts of one round set, drawn from `seed`.
fn prompts(rounds: usize, seed: u64) -> Vec<Vec<i32>> {
    let mut rng = Rng::new(seed);
    let lens: Vec<usize> = (0..64).map(|p| 8 + (p * 7) % 57).collect();
    (0..rounds)
        .map(|k| {
            // Zipf-like: prefix index = 64^u - 1 for u uniform.
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let p = (64f64.powf(u) - 1.0) as u32;
            let own = 1 + (rng.next_u64() % 16) as usize;
            prompt(p, lens[p as usize], own, k as u32)
        })
        .collect()
}

/// Runs the begin/free cycles of `prompts` under `policy`; returns (ns per page touched,
/// evictions).
fn run(policy: EvictionPolicy, prompts: &[Vec<i32>]) -> (f64, u64) {
    let mut s = State::new(Config {
        page_size: PAGE as u32,
        num_device_pages: 2048,
        eviction_policy: policy,
        ..Config::default()
    })
    .expect("a valid config");
    let mut live = VecDeque::new();
    let mut pages = 0u64;
    let t = Instant::now();
    for (k, toks) in prompts.iter().enumerate() {
        if live.len() == 4 {
            let id = live.pop_front().expect("four live");
            pages += s.seq_info(id).expect("live").num_pages as u64;
            s.free(id).expect("live");
        }
        let id = k as u64 + 1;
        let b = s
            .begin(id, toks, None, toks.len() - 1, 0)
            .expect("the workload fits");
        pages += b.num_pages as u64;
        live.push_back(id);
    }
    let ns = t.elapsed().as_nanos() as f64;
    s.check().expect("a consistent cache");
    (ns / pages as f64, s.stats().counters.evictions)
}

/// One row per policy: `begin_free_page_<policy>`, LRU's figure the floor of each.
pub(super) fn policy_rows(repeats: usize, quick: bool, rows: &mut Vec<Row>) {
    let rounds = if quick { 2_000 } else { 20_000 };
    let repeats = repeats.min(9);
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); EvictionPolicy::ALL.len()];
    for r in 0..repeats {
        let set = prompts(rounds, 42 + r as u64);
        for (j, policy) in EvictionPolicy::ALL.into_iter().enumerate() {
            let (ns, evictions) = run(policy, &set);
            assert!(evictions > 0, "{policy:?}: the workload must evict");
            times[j].push(ns);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let lru = median(&mut times[0].clone());
    for (j, policy) in EvictionPolicy::ALL.into_iter().enumerate() {
        let name = match policy {
            EvictionPolicy::Lru => "begin_free_page_lru",
            EvictionPolicy::Lfu => "begin_free_page_lfu",
            EvictionPolicy::S3Fifo => "begin_free_page_s3fifo",
        };
        rows.push(Row {
            name,
            unit: "page",
            ns: median(&mut times[j]),
            floor_ns: if policy == EvictionPolicy::Lru {
                f64::NAN
            } else {
                lru
            },
            target_ns: f64::NAN,
        });
    }
}
