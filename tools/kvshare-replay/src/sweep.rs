//! Sweeps of measured runs: memory saving against the share ratio and saving, time and index
//! size against the page size (the article's section 5), and prefix hits against capacity for
//! every eviction policy and the offline reference.

use std::fmt::Write as _;

use kvshare_core::EvictionPolicy;

use super::model::Model;
use super::outcome::Reference;
use super::report::{median_mgr_us, series, total_row, turn_rows};
use super::source::RequestSource;
use super::workload::SharedPrefixWorkload;
use super::{replay, replay_source, Outcome, Progress, ReplayConfig};

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
    src: &mut dyn RequestSource,
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
        src.rewind()?;
        let out = replay_source(src, &cfg, m.as_mut(), &mut |p| progress(k, p))?;
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

/// One point of the capacity sweep: every policy's run at one device (and host) page count, and
/// the offline reference on the same requests.
#[derive(Debug, Clone)]
pub struct CapacityPoint {
    /// Device pages.
    pub device_pages: u32,
    /// Host pages.
    pub host_pages: u32,
    /// Each policy's run, in [`EvictionPolicy::ALL`] order.
    pub runs: Vec<(EvictionPolicy, Outcome)>,
    /// The offline reference (from the first run's log; every run served the same requests the
    /// same way: see [`schedules_agree`](Self::schedules_agree)).
    pub reference: Reference,
}

impl CapacityPoint {
    /// Prompt tokens looked up (the same in every run).
    pub fn query_tokens(&self) -> u64 {
        self.runs[0].1.query_tokens()
    }

    /// Hit tokens over prompt tokens, percent, of a run's `hits`.
    pub fn pct(&self, hits: u64) -> f64 {
        100.0 * hits as f64 / self.query_tokens().max(1) as f64
    }

    /// Whether every policy's run took the same steps, preemptions and lookups, as the offline
    /// reference assumes (the schedule does not depend on the policy).
    pub fn schedules_agree(&self) -> bool {
        let key = |o: &Outcome| (o.steps, o.swaps, o.recomputes, o.query_tokens());
        self.runs
            .iter()
            .all(|(_, o)| key(o) == key(&self.runs[0].1))
    }

    /// Whether the cache was under pressure here: the offline reference evicted.
    pub fn under_pressure(&self) -> bool {
        self.reference.evictions > 0
    }
}

/// Default capacities: six device page counts from `lo` (the smallest that fits the trace) to
/// `hi` (one that never evicts), evenly spaced on a log scale.
pub fn default_capacities(lo: u32, hi: u32) -> Vec<u32> {
    let hi = hi.max(lo);
    let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
    let mut v: Vec<u32> = (0..6)
        .map(|k| (l + (h - l) * k as f64 / 5.0).exp().round() as u32)
        .collect();
    v.dedup();
    v
}

/// Distinct full pages of `src`'s requests (prompts and outputs, by chain digest): with room for
/// these and the requests in flight, nothing is ever evicted. Reads the source once (and rewinds
/// it); holds 16 bytes per distinct page.
pub fn distinct_pages(src: &mut dyn RequestSource, page_size: u32) -> Result<usize, String> {
    use kvshare_core::prefix::{chain_hash, root_hash};
    let ps = page_size as usize;
    let mut seen = std::collections::HashSet::new();
    let mut scratch = Vec::new();
    src.rewind()?;
    while let Some(r) = src.next_request()? {
        let extra = (!r.salt.is_empty() || r.lora != 0).then(|| kvshare_core::ExtraKeys {
            lora_id: r.lora,
            salt: r.salt.as_bytes().to_vec(),
            mm: Vec::new(),
        });
        for out in &r.outputs {
            let mut h = root_hash();
            let toks = r
                .prompt
                .iter()
                .chain(out.iter())
                .copied()
                .collect::<Vec<i32>>();
            for (j, c) in toks.chunks_exact(ps).enumerate() {
                let e = extra.as_ref().map_or(0, |x| x.page_digest(j, ps));
                h = chain_hash(h, e, c, &mut scratch);
                seen.insert(h);
            }
        }
    }
    src.rewind()?;
    Ok(seen.len())
}

/// The capacity sweep: at each device page count of `capacities` (and, with `base.host_pages`
/// above 0, again with those host pages), every eviction policy on `src`, and the offline
/// reference. Runs without a model.
pub fn capacity(
    base: &ReplayConfig,
    src: &mut dyn RequestSource,
    capacities: &[u32],
    model: &mut ModelFactory<'_>,
    progress: &mut dyn FnMut(usize, Progress),
) -> Result<Vec<CapacityPoint>, String> {
    if !base.reference_applies() {
        return Err(
            "--sweep capacity needs a plain model with whole-page hits (no --window, \
             --chunk, --state or --match-unit below the page size): the offline reference \
             models those only"
                .into(),
        );
    }
    let hosts: Vec<u32> = if base.host_pages > 0 {
        vec![0, base.host_pages]
    } else {
        vec![0]
    };
    let mut points = Vec::new();
    let mut k = 0;
    for &host_pages in &hosts {
        for &device_pages in capacities {
            let mut runs = Vec::new();
            let mut reference = None;
            for (j, policy) in EvictionPolicy::ALL.into_iter().enumerate() {
                let cfg = ReplayConfig {
                    device_pages,
                    host_pages,
                    policy,
                    reference: j == 0,
                    ..base.clone()
                };
                let mut m = model(&cfg)?;
                src.rewind()?;
                let out = replay_source(src, &cfg, m.as_mut(), &mut |p| progress(k, p))?;
                k += 1;
                if j == 0 {
                    reference = out.reference;
                }
                runs.push((policy, out));
            }
            points.push(CapacityPoint {
                device_pages,
                host_pages,
                runs,
                reference: reference.ok_or("the first run recorded no reference")?,
            });
        }
    }
    Ok(points)
}

/// The capacity table: hits of each policy and of the offline reference, and each policy as a
/// fraction of the reference.
pub fn format_capacity(points: &[CapacityPoint]) -> String {
    let mut s = String::new();
    let names: Vec<&str> = EvictionPolicy::ALL.iter().map(|p| p.name()).collect();
    let _ = write!(s, "device  host  pressure");
    for n in &names {
        let _ = write!(s, "  {:>7}", format!("{n} %"));
    }
    let _ = write!(s, "  offline %");
    for n in &names {
        let _ = write!(s, "  {:>10}", format!("{n}/offline"));
    }
    let _ = writeln!(s, "  lru evictions");
    for p in points {
        let _ = write!(
            s,
            "{:>6}  {:>4}  {:>8}",
            p.device_pages,
            p.host_pages,
            if p.under_pressure() { "yes" } else { "no" }
        );
        for (_, o) in &p.runs {
            let _ = write!(s, "  {:>7.1}", p.pct(o.hit_tokens()));
        }
        let _ = write!(s, "  {:>9.1}", p.pct(p.reference.hit_tokens));
        for (_, o) in &p.runs {
            let _ = write!(
                s,
                "  {:>9.1}%",
                100.0 * o.hit_tokens() as f64 / p.reference.hit_tokens.max(1) as f64
            );
        }
        let _ = write!(s, "  {:>13}", p.runs[0].1.final_stats.counters.evictions);
        if !p.schedules_agree() {
            let _ = write!(s, "  (runs scheduled differently)");
        }
        let _ = writeln!(s);
    }
    s
}

/// The capacity plot: each policy's and the offline reference's prefix hits against device pages
/// (dashed: the same with host pages).
pub fn plot_capacity(points: &[CapacityPoint], title: &str) -> String {
    use super::svg::{plot_curves, Curve};
    const COLORS: [&str; 3] = ["#1f77b4", "#ff7f0e", "#2ca02c"];
    let mut curves = Vec::new();
    let mut hosts: Vec<u32> = points.iter().map(|p| p.host_pages).collect();
    hosts.dedup();
    for &host in &hosts {
        let at: Vec<&CapacityPoint> = points.iter().filter(|p| p.host_pages == host).collect();
        let suffix = if host > 0 {
            format!(" + {host} host")
        } else {
            String::new()
        };
        let dash = if host > 0 { "6 3" } else { "" };
        for (j, policy) in EvictionPolicy::ALL.iter().enumerate() {
            curves.push(Curve {
                name: format!("{}{suffix}", policy.name()),
                color: COLORS[j % COLORS.len()],
                dash,
                points: at
                    .iter()
                    .map(|p| (p.device_pages as f64, p.pct(p.runs[j].1.hit_tokens())))
                    .collect(),
            });
        }
        curves.push(Curve {
            name: format!("offline{suffix}"),
            color: "#111111",
            dash: if host > 0 { "2 3" } else { "8 4" },
            points: at
                .iter()
                .map(|p| (p.device_pages as f64, p.pct(p.reference.hit_tokens)))
                .collect(),
        });
    }
    plot_curves(
        title,
        "device pages",
        "prefix hits (% of prompt tokens)",
        &curves,
    )
}
