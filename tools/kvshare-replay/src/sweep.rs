//! The article's section-5 tables from measured runs: memory saving against the share ratio
//! (5.1), and saving, time and index size against the page size (5.2).

use std::fmt::Write as _;

use super::model::Model;
use super::report::{median_mgr_us, series, total_row, turn_rows};
use super::trace::Request;
use super::workload::SharedPrefixWorkload;
use super::{replay, Outcome, Progress, ReplayConfig};

/// Builds the model for one run (its caches depend on the page count and size).
pub type ModelFactory<'a> = dyn FnMut(&ReplayConfig) -> Result<Box<dyn Model>, String> + 'a;

/// One measured run of a sweep.
#[derive(Debug, Clone)]
pub struct SweepRow {
    /// The swept value (share ratio in percent, or page size).
    pub value: u32,
    /// The run's settings.
    pub cfg: ReplayConfig,
    /// What it measured.
    pub out: Outcome,
}

fn mib(pages: u64, page_bytes: u64) -> f64 {
    (pages * page_bytes) as f64 / (1u64 << 20) as f64
}

/// Share ratios 10, 30, 50, 70, 90 %: `requests` concurrent requests of `total_tokens` tokens
/// whose first `ratio` is common; the device holds them all without eviction.
pub fn share_ratio(
    base: &ReplayConfig,
    requests: usize,
    total_tokens: usize,
    output_tokens: usize,
    seed: u64,
    model: &mut ModelFactory<'_>,
    progress: &mut dyn FnMut(usize, Progress),
) -> Result<Vec<SweepRow>, String> {
    let mut rows = Vec::new();
    for (k, ratio) in [10u32, 30, 50, 70, 90].into_iter().enumerate() {
        let w = SharedPrefixWorkload {
            requests,
            total_tokens,
            output_tokens,
            share_ratio: ratio as f64 / 100.0,
            vocab: 32000,
            seed,
        };
        let reqs = w.generate();
        let ps = base.page_size as usize;
        let cfg = ReplayConfig {
            device_pages: (requests * (total_tokens.div_ceil(ps) + 2)) as u32,
            concurrency: requests,
            ..base.clone()
        };
        let mut m = model(&cfg)?;
        let out = replay(&reqs, &cfg, m.as_mut(), &mut |p| progress(k, p))?;
        rows.push(SweepRow {
            value: ratio,
            cfg,
            out,
        });
    }
    Ok(rows)
}

/// The share-ratio table (peaks over the run: every request is live at once).
pub fn format_share_ratio(rows: &[SweepRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "share  prefix hit  unit hits  no reuse MiB  kvshare MiB  ideal MiB  saving  mgr us/req  attn ms/req"
    );
    for r in rows {
        let pb = r.cfg.page_bytes();
        let se = series(&r.out);
        let tot = total_row(&turn_rows(&r.out));
        let _ = writeln!(
            s,
            "{:>4}%  {:>9.1}%  {:>9}  {:>12.1}  {:>11.1}  {:>9.1}  {:>5.1}%  {:>10.1}  {:>11.2}{}",
            r.value,
            tot.hit_pct(),
            r.out.final_stats.counters.unit_hits,
            mib(se.no_sharing_peak as u64, pb),
            mib(se.kvshare_peak as u64, pb),
            mib(se.ideal_peak as u64, pb),
            100.0 * (1.0 - se.kvshare_peak as f64 / se.no_sharing_peak.max(1) as f64),
            median_mgr_us(&r.out, None),
            tot.attn_ms_per_req(),
            if r.out.gap_steps > 0 {
                "  (kvshare != ideal)"
            } else {
                ""
            }
        );
    }
    s
}

/// The runs of the page-size sweep: page sizes 8..128 with the same device memory
/// (`device_tokens` token slots) and whole-page hits; with a match unit in `base`, each page
/// size it divides and exceeds runs a second time with hits in that unit.
pub fn page_size_configs(base: &ReplayConfig, device_tokens: u64) -> Vec<ReplayConfig> {
    let mut runs = Vec::new();
    for ps in [8u32, 16, 32, 64, 128] {
        let whole = ReplayConfig {
            page_size: ps,
            device_pages: (device_tokens / ps as u64) as u32,
            match_unit: 0,
            ..base.clone()
        };
        let u = base.match_unit;
        if u > 0 && u < ps && ps.is_multiple_of(u) {
            runs.push(whole.clone());
            runs.push(ReplayConfig {
                match_unit: u,
                ..whole
            });
        } else {
            runs.push(whole);
        }
    }
    runs
}

/// The page-size sweep: every run of [`page_size_configs`] on one workload.
pub fn page_size(
    base: &ReplayConfig,
    reqs: &[Request],
    device_tokens: u64,
    model: &mut ModelFactory<'_>,
    progress: &mut dyn FnMut(usize, Progress),
) -> Result<Vec<SweepRow>, String> {
    let mut rows = Vec::new();
    for (k, cfg) in page_size_configs(base, device_tokens)
        .into_iter()
        .enumerate()
    {
        let ps = cfg.page_size;
        let mut m = model(&cfg)?;
        let out = replay(reqs, &cfg, m.as_mut(), &mut |p| progress(k, p))?;
        rows.push(SweepRow {
            value: ps,
            cfg,
            out,
        });
    }
    Ok(rows)
}

/// Bytes one prefix-index entry holds: chain digest and extra digest (16 + 16), the page's
/// token ids kept for verification (4 per token) and the page id (4).
pub fn index_entry_bytes(page_size: u32) -> u64 {
    36 + 4 * page_size as u64
}

/// The page-size table.
pub fn format_page_size(rows: &[SweepRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "page  unit  saving  prefix hit  unit hits  peak MiB  evictions  mgr us/req  attn ms/req  block tables KiB  index entries  index KiB"
    );
    for r in rows {
        let pb = r.cfg.page_bytes();
        let se = series(&r.out);
        let tot = total_row(&turn_rows(&r.out));
        let _ = writeln!(
            s,
            "{:>4}  {:>4}  {:>5.1}%  {:>9.1}%  {:>9}  {:>8.1}  {:>9}  {:>10.1}  {:>11.2}  {:>16.1}  {:>13}  {:>9.1}{}",
            r.value,
            r.cfg.unit(),
            tot.saving_pct(),
            tot.hit_pct(),
            r.out.final_stats.counters.unit_hits,
            mib(se.kvshare_peak as u64, pb),
            r.out.final_stats.counters.evictions,
            median_mgr_us(&r.out, None),
            tot.attn_ms_per_req(),
            r.out.peak_block_entries as f64 * 4.0 / 1024.0,
            r.out.peak_index_entries,
            (r.out.peak_index_entries * index_entry_bytes(r.value)) as f64 / 1024.0,
            if r.out.gap_steps > 0 { "  (kvshare != ideal)" } else { "" }
        );
    }
    s
}
