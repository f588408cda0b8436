//! Shared by kvshare-core's integration tests: a plain cache, a cache with a host tier and
//! events, token ranges (`core_seq.rs`, `core_tiers.rs`); the group-cache geometry, the cache
//! built in vLLM's block-pool mode, vLLM's append and token sources (`core_groups.rs`,
//! `core_group_reads.rs`).
#![allow(dead_code)]

use kvshare_core::{Config, Error, EvictionPolicy, GroupSpec, State, WindowRetention};

pub const NULL: u32 = 0;

/// The cache's geometry in these tests: a page size, pages per pool, the groups.
pub struct HybridConfig {
    pub page_size: u32,
    pub num_pages: u32,
    pub groups: Vec<GroupSpec>,
    pub enable_prefix_caching: bool,
    pub enable_events: bool,
    /// `None`: vLLM's free order (LRU, duplicates kept); else kvshare's own order and this
    /// eviction policy (parents held back behind their children).
    pub policy: Option<EvictionPolicy>,
    /// With vLLM's order: newer vLLM's (0.32), every freed page without cached content first.
    pub uncached_first: bool,
    /// Sparse window retention (None: dense).
    pub retention: Option<WindowRetention>,
}

/// A cache of groups that keeps pages as vLLM's block pool does (or in kvshare's order with an
/// eviction policy).
pub struct Hybrid;

impl Hybrid {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(c: HybridConfig) -> Result<State, Error> {
        State::new(Config {
            page_size: c.page_size,
            num_device_pages: c.num_pages,
            groups: c.groups,
            enable_prefix_caching: c.enable_prefix_caching,
            enable_events: c.enable_events,
            reserve_null_page: true,
            skip_cached_writes: false,
            vllm_free_order: c.policy.is_none(),
            vllm_uncached_first: c.uncached_first,
            window_retention: c.retention.unwrap_or_default(),
            eviction_policy: c.policy.unwrap_or_default(),
            ..Config::default()
        })
    }
}

/// An append as vLLM's `allocate_slots` makes it (no copies: nothing is forked here).
pub fn append(h: &mut State, id: u64, tokens: &[i32], lookahead: usize) -> Result<(), Error> {
    let mut copies = Vec::new();
    h.append(id, tokens, lookahead, &mut copies, 0)
}

pub fn noise(seed: u32, n: usize) -> Vec<i32> {
    let mut x = seed as u64 | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 40) as i32 & 0x7fff
        })
        .collect()
}

pub fn doc(d: u8, len: usize) -> Vec<i32> {
    (0..len)
        .map(|i| 100_000 + d as i32 * 10_000 + (i as i32 % 9_973))
        .collect()
}

pub fn state(pages: u32, ps: u32, eviction_policy: EvictionPolicy) -> State {
    State::new(Config {
        page_size: ps,
        num_device_pages: pages,
        num_host_pages: 8,
        eviction_policy,
        ..Config::default()
    })
    .unwrap()
}

pub fn toks(range: std::ops::Range<i32>) -> Vec<i32> {
    range.collect()
}

pub fn tiered(device: u32, host: u32, eviction_policy: EvictionPolicy) -> State {
    State::new(Config {
        page_size: 4,
        num_device_pages: device,
        num_host_pages: host,
        enable_events: true,
        eviction_policy,
        ..Config::default()
    })
    .unwrap()
}
