//! The replay's settings ([`ReplayConfig`]) and the check, before anything runs, that every
//! request fits the device on its own ([`check_fits`]).

use kvshare_core::{Config, EvictionPolicy, GroupKind, GroupSpec, WindowRetention};

use super::model::Geometry;
use super::requests::Schedule;
use super::trace::Request;

/// Replay settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayConfig {
    /// Tokens per page.
    pub page_size: u32,
    /// Device pages.
    pub device_pages: u32,
    /// Host pages (swap space for preempted requests; 0: preemption recomputes).
    pub host_pages: u32,
    /// Most requests running at once.
    pub concurrency: usize,
    /// Simulated duration of one engine step.
    pub step_ms: f64,
    /// Model geometry (page bytes; the model's shapes).
    pub geometry: Geometry,
    /// Run the cache manager's invariant checker after every step.
    pub check: bool,
    /// The core's `skip_cached_writes`: a fully cached prompt shares its last page too and the
    /// recomputed last token's slot is hidden from the KV write (off: that page is allocated
    /// fresh and recomputed, as vLLM does).
    pub skip_cached_writes: bool,
    /// The core's `demote_to_host`: with host pages, an evicted cached page is copied to the
    /// host tier and promoted back on a later hit instead of being recomputed.
    pub demote_to_host: bool,
    /// The core's `match_unit`: hits in units of this many tokens (a divisor of the page size;
    /// 0: whole pages). A hit ending inside a page copies its units into a new page.
    pub match_unit: u32,
    /// The KV-cache groups of a hybrid model (empty: a plain model, one full-attention group).
    /// With groups, `device_pages` is the pool's page count, the null page included, and a
    /// request is admitted when its `begin` finds room (vLLM's way), not by the plain model's
    /// conservative count.
    pub groups: Vec<GroupKind>,
    /// The core's eviction policy.
    pub policy: EvictionPolicy,
    /// The order in which waiting requests are admitted.
    pub schedule: Schedule,
    /// Record what the cache is asked (page keys, holders, room) to compute the offline
    /// reference ([`super::offline`]) after the run: a plain model with whole-page hits only.
    pub reference: bool,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            page_size: 16,
            device_pages: 1024,
            host_pages: 0,
            concurrency: 8,
            step_ms: 20.0,
            geometry: Geometry::default(),
            check: false,
            skip_cached_writes: true,
            demote_to_host: true,
            match_unit: 0,
            groups: Vec::new(),
            policy: EvictionPolicy::Lru,
            schedule: Schedule::Fcfs,
            reference: false,
        }
    }
}

impl ReplayConfig {
    /// The cache manager's configuration.
    pub fn cache_config(&self) -> Config {
        Config {
            page_size: self.page_size,
            num_device_pages: self.device_pages,
            num_host_pages: self.host_pages,
            num_layers: self.geometry.layers,
            num_kv_heads: self.geometry.kv_heads,
            head_dim: self.geometry.head_dim,
            dtype: self.geometry.dtype,
            enable_prefix_caching: true,
            reserve_null_page: !self.groups.is_empty(),
            defer_commit: false,
            skip_cached_writes: self.skip_cached_writes,
            demote_to_host: self.demote_to_host,
            enable_events: false,
            match_unit: self.match_unit,
            groups: self
                .groups
                .iter()
                .map(|&kind| GroupSpec {
                    kind,
                    page_bytes: 0,
                    eagle: false,
                })
                .collect(),
            vllm_free_order: false,
            vllm_uncached_first: false,
            window_retention: WindowRetention::Dense,
            eviction_policy: self.policy,
            pool: None,
        }
    }

    /// Groups of the cache (1 for a plain model).
    pub fn num_groups(&self) -> usize {
        self.groups.len().max(1)
    }

    /// Device pages that can hold KV (the null page of a cache of groups excluded).
    pub fn usable_pages(&self) -> usize {
        self.device_pages as usize - usize::from(!self.groups.is_empty())
    }

    /// Pages a request needs at its end with no sharing, plus one of headroom per sample, in
    /// every group: `lens` are its samples' final lengths.
    pub fn pages_needed(&self, lens: impl Iterator<Item = usize>) -> usize {
        let ps = self.page_size as usize;
        let (mut pages, mut samples) = (0, 0);
        for l in lens {
            pages += l.div_ceil(ps);
            samples += 1;
        }
        (pages + samples) * self.num_groups()
    }

    /// Whether the offline reference can be computed for this configuration (a plain model,
    /// whole-page hits).
    pub fn reference_applies(&self) -> bool {
        self.groups.is_empty() && self.unit() == self.page_size
    }

    /// The match unit in tokens (the page size when `match_unit` is 0).
    pub fn unit(&self) -> u32 {
        match self.match_unit {
            0 => self.page_size,
            u => u,
        }
    }

    /// Bytes of K plus V of one page over all layers, as the cache manager computes them for
    /// the geometry's dtype ([`Config::page_bytes`]; `u64::MAX` on overflow, which no cache
    /// accepts).
    pub fn page_bytes(&self) -> u64 {
        self.cache_config().page_bytes().unwrap_or(u64::MAX)
    }

    /// Bytes of one page of the cache: a plain model's page, or a group's page of a hybrid
    /// model (the groups split the layers equally), the unit every page count of a report is in.
    pub fn cache_page_bytes(&self) -> u64 {
        self.page_bytes() / self.num_groups() as u64
    }
}

/// Checks before anything runs that every request fits the device on its own (at its end, with
/// no sharing), so the replay can always make progress.
pub fn check_fits(reqs: &[Request], cfg: &ReplayConfig) -> Result<(), String> {
    for r in reqs {
        let lens: Vec<usize> = (0..r.outputs.len()).map(|b| r.final_len(b)).collect();
        check_request(&r.id, r.line, &lens, cfg)?;
    }
    Ok(())
}

/// Refuses request `id` (on trace line `line`, 0: generated) whose samples end with `lens`
/// tokens when it cannot fit the device on its own.
pub fn check_request(
    id: &str,
    line: usize,
    lens: &[usize],
    cfg: &ReplayConfig,
) -> Result<(), String> {
    let ps = cfg.page_size as usize;
    let need = cfg.pages_needed(lens.iter().copied());
    if need <= cfg.usable_pages() {
        return Ok(());
    }
    let at = if line > 0 {
        format!("line {line}: ")
    } else {
        String::new()
    };
    let end = need / cfg.num_groups() - lens.len();
    let groups = if cfg.groups.is_empty() {
        String::new()
    } else {
        format!(" in each of {} groups", cfg.num_groups())
    };
    Err(format!(
        "{at}request {id:?} needs {need} pages of {ps} tokens ({end} at its end plus one of \
         headroom per sample{groups}) but the device has {} (--device-pages)",
        cfg.usable_pages()
    ))
}
