//! The replay's settings ([`ReplayConfig`]) and the check, before anything runs, that every
//! request fits the device on its own ([`check_fits`]).

use kvshare_core::Config;

use super::model::Geometry;
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
            reserve_null_page: false,
            defer_commit: false,
            skip_cached_writes: self.skip_cached_writes,
            demote_to_host: self.demote_to_host,
            enable_events: false,
            match_unit: self.match_unit,
            groups: Vec::new(),
            vllm_free_order: false,
            eviction_policy: kvshare_core::EvictionPolicy::Lru,
        }
    }

    /// The match unit in tokens (the page size when `match_unit` is 0).
    pub fn unit(&self) -> u32 {
        match self.match_unit {
            0 => self.page_size,
            u => u,
        }
    }

    /// Bytes of K plus V of one page over all layers.
    pub fn page_bytes(&self) -> u64 {
        self.geometry.token_bytes() * self.page_size as u64
    }
}

/// Checks before anything runs that every request fits the device on its own (at its end, with
/// no sharing), so the replay can always make progress.
pub fn check_fits(reqs: &[Request], cfg: &ReplayConfig) -> Result<(), String> {
    let ps = cfg.page_size as usize;
    for r in reqs {
        let end: usize = (0..r.outputs.len())
            .map(|b| r.final_len(b).div_ceil(ps))
            .sum();
        let need = end + r.outputs.len();
        if need > cfg.device_pages as usize {
            let at = if r.line > 0 {
                format!("line {}: ", r.line)
            } else {
                String::new()
            };
            return Err(format!(
                "{at}request {:?} needs {need} pages of {ps} tokens ({end} at its end plus one of \
                 headroom per sample) but the device has {} (--device-pages)",
                r.id, cfg.device_pages
            ));
        }
    }
    Ok(())
}
