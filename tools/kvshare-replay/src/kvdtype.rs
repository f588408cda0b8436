//! `--kv-dtype`: the same requests on a KV cache of one page format against bf16 at the same
//! device byte budget. Each format's page bytes come from the cache manager
//! ([`kvshare_core::Config::page_bytes`]: a quantized page is its one-byte elements alone; its
//! scales are per layer, held by the engine, outside the pages), so the budget buys
//! `budget / page bytes` device pages of each format, and the replay reports what those pages
//! hold: pages, prefix hits, recomputed prompt tokens and KV memory.
//!
//! Both runs are the cache manager alone (no attention): hits do not depend on the KV values.

use kvshare_core::DType;

use super::config::ReplayConfig;
use super::model::{dtype_name, NoModel};
use super::outcome::{Outcome, Progress};
use super::sim::replay_source;
use super::source::RequestSource;

/// The format every run is compared with.
pub const BASELINE: DType = DType::BF16;

/// One format's run at the budget.
#[derive(Debug, Clone)]
pub struct DtypeRun {
    /// The page format.
    pub dtype: DType,
    /// Bytes of one page (the cache manager's).
    pub page_bytes: u64,
    /// The replay's settings (its device pages: what the budget buys).
    pub cfg: ReplayConfig,
    /// What the replay reported.
    pub out: Outcome,
}

impl DtypeRun {
    /// Device pages the budget bought.
    pub fn pages(&self) -> u32 {
        self.cfg.device_pages
    }

    /// Bytes of those pages (at most the budget).
    pub fn kv_bytes(&self) -> u64 {
        self.cfg.device_pages as u64 * self.page_bytes
    }

    /// Bytes of the most pages in use at once.
    pub fn peak_bytes(&self) -> u64 {
        self.out.series.kvshare_peak as u64 * self.page_bytes
    }

    /// Prompt tokens computed rather than found cached.
    pub fn recomputed_tokens(&self) -> u64 {
        self.out.query_tokens() - self.out.hit_tokens()
    }

    /// Prefix hits as a fraction of prompt tokens.
    pub fn hit_rate(&self) -> f64 {
        self.out.hit_tokens() as f64 / self.out.query_tokens().max(1) as f64
    }
}

/// `base` with pages of `dtype`, as many as `budget` bytes hold. Refused when the budget holds
/// no page or more than the cache accepts.
pub fn budget_config(
    base: &ReplayConfig,
    dtype: DType,
    budget: u64,
) -> Result<ReplayConfig, String> {
    let mut cfg = base.clone();
    cfg.geometry.dtype = dtype;
    let page_bytes = cfg.page_bytes();
    let pages = budget / page_bytes;
    let max = kvshare_core::config::MAX_PAGES as u64;
    if pages == 0 || pages > max {
        return Err(format!(
            "--kv-bytes: {budget} bytes hold {pages} {} pages of {page_bytes} bytes; the cache takes 1 to {max}",
            dtype_name(dtype)
        ));
    }
    cfg.device_pages = pages as u32;
    Ok(cfg)
}

/// Replays `src` with bf16 pages and with `dtype` pages, each as many as `budget` bytes hold
/// (bf16 first; the source is rewound between the runs). `progress` gets the run's index.
pub fn compare(
    src: &mut dyn RequestSource,
    base: &ReplayConfig,
    dtype: DType,
    budget: u64,
    progress: &mut dyn FnMut(usize, Progress),
) -> Result<[DtypeRun; 2], String> {
    let mut run = |k: usize, d: DType, src: &mut dyn RequestSource| -> Result<DtypeRun, String> {
        let cfg = ReplayConfig {
            reference: false,
            ..budget_config(base, d, budget)?
        };
        let out = replay_source(src, &cfg, &mut NoModel, &mut |p| progress(k, p)).map_err(|e| {
            format!(
                "{} pages at {budget} bytes (--kv-bytes): {e}",
                dtype_name(d)
            )
        })?;
        Ok(DtypeRun {
            dtype: d,
            page_bytes: cfg.page_bytes(),
            cfg,
            out,
        })
    };
    let base_run = run(0, BASELINE, src)?;
    src.rewind()?;
    let other = run(1, dtype, src)?;
    Ok([base_run, other])
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// The side-by-side table.
pub fn format_compare(runs: &[DtypeRun], budget: u64) -> String {
    let mut s = format!(
        "device KV budget {budget} bytes ({:.2} MiB) for every format; cache manager only\n\n",
        mib(budget)
    );
    s.push_str(&format!(
        "{:<19} {:>10} {:>12} {:>14} {:>14} {:>12} {:>9} {:>12} {:>10}\n",
        "dtype",
        "page bytes",
        "device pages",
        "KV MiB",
        "peak used MiB",
        "hit tokens",
        "hit rate",
        "recomputed",
        "evictions"
    ));
    for r in runs {
        s.push_str(&format!(
            "{:<19} {:>10} {:>12} {:>14.2} {:>14.2} {:>12} {:>8.1}% {:>12} {:>10}\n",
            dtype_name(r.dtype),
            r.page_bytes,
            r.pages(),
            mib(r.kv_bytes()),
            mib(r.peak_bytes()),
            r.out.hit_tokens(),
            100.0 * r.hit_rate(),
            r.recomputed_tokens(),
            r.out.final_stats.counters.evictions
        ));
    }
    s
}

/// The runs as JSON (one object per format).
pub fn json_compare(runs: &[DtypeRun], budget: u64) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            serde_json::json!({
                "dtype": dtype_name(r.dtype),
                "page_bytes": r.page_bytes,
                "device_pages": r.pages(),
                "kv_bytes": r.kv_bytes(),
                "peak_kv_bytes": r.peak_bytes(),
                "query_tokens": r.out.query_tokens(),
                "hit_tokens": r.out.hit_tokens(),
                "hit_rate": r.hit_rate(),
                "recomputed_tokens": r.recomputed_tokens(),
                "evictions": r.out.final_stats.counters.evictions,
                "preemptions": r.out.swaps + r.out.recomputes,
            })
        })
        .collect();
    serde_json::json!({"kv_budget_bytes": budget, "runs": rows})
}
