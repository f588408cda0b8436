//! Several engines behind a router, with or without one shared pool (`--engines N
//! --pool-pages M --route R`): each engine is its own replay of the cache manager (its own
//! [`kvshare_core::State`], scheduler and clock step), all on one simulated clock, and a router
//! sends each request to one of them. With a pool, every engine's cache has a pool tier
//! ([`kvshare_core::pooltier`]) over one [`PoolStore`]: the cache decides what is stored (every
//! page registered in its device index, write-through) and what a begin looks up (the prompt's
//! full pages after its local device and host hit); the store is modelled as `M` entries, one
//! per page, with LRU eviction.
//!
//! A turn of a conversation is sent when its previous turn has finished (a chat client sends
//! turn k+1 after reading reply k): the router holds it until then, whatever the routing, so
//! one engine behind the router is the single-engine replay.

use std::collections::{BTreeMap, HashMap};

use kvshare_core::{PoolConfig, Ranks, StorePolicy};

use super::outcome::Outcome;

/// How the router picks an engine for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Requests in turn: the k-th request to engine k mod N.
    RoundRobin,
    /// Every turn of a conversation to one engine (conversations in turn by their first
    /// request; a request without a session as round-robin).
    Session,
    /// The engine whose cache (device and host) holds the longest prefix of the prompt; ties
    /// to the engine with the fewest requests in flight, then the lowest index.
    KvAware,
}

impl Route {
    /// Every routing, in the order a comparison lists them.
    pub const ALL: [Route; 3] = [Route::RoundRobin, Route::Session, Route::KvAware];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Route::RoundRobin => "round-robin",
            Route::Session => "session",
            Route::KvAware => "kv-aware",
        }
    }

    /// Parses [`name`](Self::name).
    pub fn from_name(s: &str) -> Option<Self> {
        Route::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// The engines and their pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Engines {
    /// Engines (at least 1).
    pub engines: usize,
    /// Pool entries (pages; 0: no pool).
    pub pool_pages: usize,
    /// The routing.
    pub route: Route,
}

/// The pool tier's settings of every engine: one namespace and model identity, so every engine
/// reads every other engine's entries; write-through stores.
pub fn pool_config() -> PoolConfig {
    PoolConfig {
        namespace: "replay".into(),
        identity: b"kvshare-replay".to_vec(),
        ranks: Ranks::default(),
        store: StorePolicy::WriteThrough,
    }
}

/// What the shared store did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Keys written (a key already present is not written again: the first writer wins).
    pub stored: u64,
    /// Entries evicted to make room (least recently stored or loaded first).
    pub evictions: u64,
    /// Loads asked.
    pub loads: u64,
    /// Loads that found their key.
    pub loads_ok: u64,
    /// Most entries held at once.
    pub peak_entries: u64,
}

/// The pool store: at most `capacity` entries (one per page), evicted least recently used
/// first. Storing an entry and loading it use it; an existence query does not.
#[derive(Debug, Clone, Default)]
pub struct PoolStore {
    capacity: usize,
    clock: u64,
    /// Key → the last use's tick.
    entries: HashMap<String, u64>,
    /// Tick → key, oldest first.
    order: BTreeMap<u64, String>,
    /// What it did.
    pub stats: StoreStats,
}

impl PoolStore {
    /// An empty store of `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        PoolStore {
            capacity,
            ..PoolStore::default()
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` is held (the batched existence query; no use).
    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    fn touch(&mut self, key: &str) {
        self.clock += 1;
        if let Some(t) = self.entries.get_mut(key) {
            self.order.remove(t);
            *t = self.clock;
            self.order.insert(self.clock, key.to_string());
        }
    }

    /// Loads `key`: whether it is held (a use).
    pub fn get(&mut self, key: &str) -> bool {
        self.stats.loads += 1;
        let held = self.contains(key);
        if held {
            self.stats.loads_ok += 1;
            self.touch(key);
        }
        held
    }

    /// Stores `key`, evicting the least recently used entry when full; a key already held is
    /// left as it is.
    pub fn put(&mut self, key: String) {
        if self.capacity == 0 || self.contains(&key) {
            return;
        }
        while self.entries.len() >= self.capacity {
            let (_, old) = self.order.pop_first().expect("a full store has entries");
            self.entries.remove(&old);
            self.stats.evictions += 1;
        }
        self.clock += 1;
        self.entries.insert(key.clone(), self.clock);
        self.order.insert(self.clock, key);
        self.stats.stored += 1;
        self.stats.peak_entries = self.stats.peak_entries.max(self.entries.len() as u64);
    }
}

/// What a run of several engines reports.
#[derive(Debug, Clone)]
pub struct EnginesOutcome {
    /// The settings.
    pub set: Engines,
    /// Each engine's replay (its requests, in the order they reached it).
    pub engines: Vec<Outcome>,
    /// The pool store's counters (zero without a pool).
    pub store: StoreStats,
    /// Steps of the shared clock.
    pub steps: u64,
    /// Simulated time at the end.
    pub sim_ms: f64,
}

impl EnginesOutcome {
    fn sum(&self, f: impl Fn(&Outcome) -> u64) -> u64 {
        self.engines.iter().map(f).sum()
    }

    /// Prompt tokens looked up.
    pub fn query_tokens(&self) -> u64 {
        self.sum(Outcome::query_tokens)
    }

    /// Prompt tokens hit, every tier.
    pub fn hit_tokens(&self) -> u64 {
        self.sum(Outcome::hit_tokens)
    }

    /// Prompt tokens hit in the pool tier.
    pub fn pool_hit_tokens(&self) -> u64 {
        self.sum(|o| o.pool_hit_tokens)
    }

    /// Prompt tokens hit in the host tier (promoted).
    pub fn host_hit_tokens(&self) -> u64 {
        self.sum(|o| o.host_hit_tokens)
    }

    /// Prompt tokens hit on the device.
    pub fn device_hit_tokens(&self) -> u64 {
        self.hit_tokens() - self.pool_hit_tokens() - self.host_hit_tokens()
    }

    /// Prompt tokens computed rather than found in any tier.
    pub fn recomputed_tokens(&self) -> u64 {
        self.query_tokens() - self.hit_tokens()
    }

    /// Requests each engine served.
    pub fn requests_per_engine(&self) -> Vec<usize> {
        self.engines.iter().map(|o| o.requests.len()).collect()
    }

    /// Evictions over all engines' device tiers.
    pub fn evictions(&self) -> u64 {
        self.sum(|o| o.final_stats.counters.evictions)
    }

    /// Preemptions over all engines.
    pub fn preemptions(&self) -> u64 {
        self.sum(|o| o.swaps + o.recomputes)
    }
}

fn pct(x: u64, of: u64) -> f64 {
    100.0 * x as f64 / of.max(1) as f64
}

/// One table row per run: routing, pool, hits per tier, recomputed tokens.
pub fn format_engines(runs: &[EnginesOutcome]) -> String {
    let mut s = format!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>12} {:>10} {:>12} {:>14}\n",
        "route",
        "pool pages",
        "device",
        "host",
        "pool",
        "all tiers",
        "hit rate",
        "recomputed",
        "evictions",
        "pool stored",
        "requests/eng"
    );
    for r in runs {
        let per = r.requests_per_engine();
        let (lo, hi) = (
            per.iter().min().copied().unwrap_or(0),
            per.iter().max().copied().unwrap_or(0),
        );
        s.push_str(&format!(
            "{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8.1}% {:>12} {:>10} {:>12} {:>14}\n",
            r.set.route.name(),
            r.set.pool_pages,
            r.device_hit_tokens(),
            r.host_hit_tokens(),
            r.pool_hit_tokens(),
            r.hit_tokens(),
            pct(r.hit_tokens(), r.query_tokens()),
            r.recomputed_tokens(),
            r.evictions(),
            r.store.stored,
            format!("{lo}-{hi}")
        ));
    }
    s
}

/// One run as JSON.
pub fn json_engines(r: &EnginesOutcome) -> serde_json::Value {
    serde_json::json!({
        "route": r.set.route.name(),
        "engines": r.set.engines,
        "pool_pages": r.set.pool_pages,
        "query_tokens": r.query_tokens(),
        "hit_tokens": r.hit_tokens(),
        "device_hit_tokens": r.device_hit_tokens(),
        "host_hit_tokens": r.host_hit_tokens(),
        "pool_hit_tokens": r.pool_hit_tokens(),
        "recomputed_tokens": r.recomputed_tokens(),
        "evictions": r.evictions(),
        "preemptions": r.preemptions(),
        "requests_per_engine": r.requests_per_engine(),
        "pool_stored": r.store.stored,
        "pool_evictions": r.store.evictions,
        "pool_loads": r.store.loads,
        "pool_loads_ok": r.store.loads_ok,
        "pool_peak_entries": r.store.peak_entries,
        "steps": r.steps,
    })
}
