//! The per-turn table, the totals block and the `--json` line.
//!
//! Per turn (the article's accounting, section 4.2): a request's KV memory *without reuse* is
//! the pages it would hold at its end with no sharing; *with reuse* it is the pages the cache
//! manager had to allocate for it (prefix hits and forked pages cost nothing). Summed over the
//! turns this gives the article's "10-turn total" (10.7 GB × 10 versus 10.7 + 0.9 × 9).

use std::fmt::Write as _;

use serde_json::{json, Value};

pub use super::outcome::Series;
use super::{Outcome, ReplayConfig};

/// Aggregates of the requests of one turn index (or of all of them).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnRow {
    /// 1-based turn index (0 for the total).
    pub turn: usize,
    /// Requests.
    pub requests: usize,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens (all samples).
    pub output_tokens: u64,
    /// Pages without reuse.
    pub no_reuse_pages: u64,
    /// Pages allocated by kvshare.
    pub kvshare_pages: u64,
    /// Prompt tokens offered to prefix matching.
    pub query_tokens: u64,
    /// Of those, found cached.
    pub hit_tokens: u64,
    /// Cache-manager time.
    pub mgr_ns: u64,
    /// Model time (KV write, attention, page copies).
    pub attn_ns: u64,
}

fn pct(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        100.0 * num / den
    } else {
        0.0
    }
}

impl TurnRow {
    /// Memory saved by reuse, percent.
    pub fn saving_pct(&self) -> f64 {
        pct(
            self.no_reuse_pages as f64 - self.kvshare_pages as f64,
            self.no_reuse_pages as f64,
        )
    }
    /// Prefix hit tokens over prompt tokens, percent.
    pub fn hit_pct(&self) -> f64 {
        pct(self.hit_tokens as f64, self.query_tokens as f64)
    }
    /// Cache-manager microseconds per request.
    pub fn mgr_us_per_req(&self) -> f64 {
        self.mgr_ns as f64 / 1e3 / self.requests.max(1) as f64
    }
    /// Model milliseconds per request.
    pub fn attn_ms_per_req(&self) -> f64 {
        self.attn_ns as f64 / 1e6 / self.requests.max(1) as f64
    }
    fn add(&mut self, o: &TurnRow) {
        self.requests += o.requests;
        self.prompt_tokens += o.prompt_tokens;
        self.output_tokens += o.output_tokens;
        self.no_reuse_pages += o.no_reuse_pages;
        self.kvshare_pages += o.kvshare_pages;
        self.query_tokens += o.query_tokens;
        self.hit_tokens += o.hit_tokens;
        self.mgr_ns += o.mgr_ns;
        self.attn_ns += o.attn_ns;
    }
}

/// Median cache-manager microseconds per request over the requests of `turn` (all when
/// `None`): robust to a request whose timed call was descheduled on a busy machine.
pub fn median_mgr_us(out: &Outcome, turn: Option<usize>) -> f64 {
    let mut v: Vec<u64> = out
        .requests
        .iter()
        .filter(|r| turn.is_none_or(|t| r.turn == t))
        .map(|r| r.mgr_ns)
        .collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let n = v.len();
    let m = if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0
    };
    m / 1e3
}

/// One row per turn index, in order.
pub fn turn_rows(out: &Outcome) -> Vec<TurnRow> {
    let turns = out.requests.iter().map(|r| r.turn).max().unwrap_or(0);
    let mut rows: Vec<TurnRow> = (1..=turns)
        .map(|t| TurnRow {
            turn: t,
            ..TurnRow::default()
        })
        .collect();
    for r in &out.requests {
        let row = &mut rows[r.turn - 1];
        row.add(&TurnRow {
            turn: r.turn,
            requests: 1,
            prompt_tokens: r.prompt_tokens as u64,
            output_tokens: r.output_tokens as u64,
            no_reuse_pages: r.no_reuse_pages,
            kvshare_pages: r.allocated_pages,
            query_tokens: r.query_tokens,
            hit_tokens: r.hit_tokens,
            mgr_ns: r.mgr_ns,
            attn_ns: r.attn_ns,
        });
    }
    rows
}

/// The sum of all rows.
pub fn total_row(rows: &[TurnRow]) -> TurnRow {
    let mut t = TurnRow::default();
    for r in rows {
        t.add(r);
    }
    t
}

/// Peaks and means of the sampled series.
pub fn series(out: &Outcome) -> Series {
    out.series
}

fn mib(pages: u64, page_bytes: u64) -> f64 {
    (pages * page_bytes) as f64 / (1u64 << 20) as f64
}

/// One sentence on kvshare versus the ideal.
pub fn ideal_verdict(out: &Outcome) -> String {
    if out.gap_steps == 0 {
        format!(
            "kvshare == ideal at every one of the {} steps",
            out.series.steps
        )
    } else {
        format!(
            "kvshare != ideal at {} of {} steps (first at step {}; kvshare - ideal from {:+} to {:+} pages)",
            out.gap_steps,
            out.series.steps,
            out.first_gap_step.unwrap_or(0),
            out.min_gap,
            out.max_gap
        )
    }
}

/// The per-turn table and the totals block.
pub fn format_report(
    out: &Outcome,
    cfg: &ReplayConfig,
    attention: bool,
    svg: Option<&str>,
) -> String {
    let pb = cfg.cache_page_bytes();
    let rows = turn_rows(out);
    let tot = total_row(&rows);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "turn  reqs  avg prompt  no reuse MiB  kvshare MiB  saving  prefix hit  mgr us/req  attn ms/req"
    );
    let line = |s: &mut String, label: String, r: &TurnRow, mgr_us: f64| {
        let _ = writeln!(
            s,
            "{label:>4}  {:>4}  {:>10.1}  {:>12.1}  {:>11.1}  {:>5.1}%  {:>9.1}%  {:>10.1}  {:>11.2}",
            r.requests,
            r.prompt_tokens as f64 / r.requests.max(1) as f64,
            mib(r.no_reuse_pages, pb),
            mib(r.kvshare_pages, pb),
            r.saving_pct(),
            r.hit_pct(),
            mgr_us,
            r.attn_ms_per_req(),
        );
    };
    for r in &rows {
        line(
            &mut s,
            r.turn.to_string(),
            r,
            median_mgr_us(out, Some(r.turn)),
        );
    }
    line(&mut s, "all".into(), &tot, median_mgr_us(out, None));
    let se = series(out);
    let f = &out.final_stats.counters;
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "KV memory, all turns: {:.1} MiB without reuse, {:.1} MiB with kvshare ({} vs {} pages of {} tokens, {} KiB each): {:.1}% saved",
        mib(tot.no_reuse_pages, pb),
        mib(tot.kvshare_pages, pb),
        tot.no_reuse_pages,
        tot.kvshare_pages,
        cfg.page_size,
        pb / 1024,
        tot.saving_pct()
    );
    let _ = writeln!(s, "device pages in use over time   peak (MiB)        mean");
    for (name, peak, avg) in [
        ("no sharing", se.no_sharing_peak, se.no_sharing_avg),
        ("kvshare", se.kvshare_peak, se.kvshare_avg),
        ("ideal", se.ideal_peak, se.ideal_avg),
    ] {
        let _ = writeln!(
            s,
            "  {name:<12} {peak:>16} ({:>7.1}) {avg:>11.1}",
            mib(peak as u64, pb)
        );
    }
    let _ = writeln!(s, "{}", ideal_verdict(out));
    let _ = writeln!(
        s,
        "prefix hits: {} of {} prompt tokens ({:.1}%){}",
        tot.hit_tokens,
        tot.query_tokens,
        tot.hit_pct(),
        if cfg.unit() < cfg.page_size {
            format!(
                "; match unit {}: {} hits ended inside a page, {} tokens copied by partial page copies",
                cfg.unit(),
                f.unit_hits,
                f.unit_hit_tokens
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "eviction policy {}, schedule {}{}",
        cfg.policy.name(),
        cfg.schedule.name(),
        match &out.reference {
            Some(r) => format!(
                "; offline reference (Belady) at this capacity: {} hit tokens ({:.1}%): {} reaches {:.1}% of it",
                r.hit_tokens,
                pct(r.hit_tokens as f64, tot.query_tokens as f64),
                cfg.policy.name(),
                pct(tot.hit_tokens as f64, r.hit_tokens as f64)
            ),
            None => String::new(),
        }
    );
    let _ = writeln!(
        s,
        "device {} pages, host {}: evictions {}, copy-on-write copies {}, preemptions {} ({} swapped, {} recomputed)",
        cfg.device_pages,
        cfg.host_pages,
        f.evictions,
        f.cow_copies,
        out.swaps + out.recomputes,
        out.swaps,
        out.recomputes
    );
    if cfg.host_pages > 0 {
        let _ = writeln!(
            s,
            "host tier: {} evicted pages demoted, {} promoted back on hits ({} hit tokens served from host)",
            f.demotions, f.promotions, f.host_hit_tokens
        );
    }
    let model_ns = out.prefill_ns + out.decode_ns + out.copy_ns;
    let _ = writeln!(
        s,
        "cache manager: {:.2} ms in {} calls ({:.2} us per call, {:.1} us per request){}",
        out.mgr_ns as f64 / 1e6,
        out.mgr_calls,
        out.mgr_ns as f64 / 1e3 / out.mgr_calls.max(1) as f64,
        out.mgr_ns as f64 / 1e3 / out.requests.len().max(1) as f64,
        if attention && model_ns > 1_000_000 {
            format!(
                ", {:.2}% of the model's time",
                100.0 * out.mgr_ns as f64 / model_ns as f64
            )
        } else {
            String::new()
        }
    );
    if attention {
        let _ = writeln!(
            s,
            "attention and KV write: {:.2} s (prefill {:.2} s, decode {:.2} s, page copies {:.3} s)",
            model_ns as f64 / 1e9,
            out.prefill_ns as f64 / 1e9,
            out.decode_ns as f64 / 1e9,
            out.copy_ns as f64 / 1e9
        );
    }
    let _ = writeln!(
        s,
        "simulated {:.1} s in {} steps of {} ms; wall time {:.2} s; at most {} requests in flight",
        out.sim_ms / 1e3,
        out.steps,
        cfg.step_ms,
        out.wall_ns as f64 / 1e9,
        out.peak_live
    );
    if !cfg.groups.is_empty() {
        let _ = writeln!(s);
        s.push_str(&super::hybrid::format_groups(out, cfg.page_size));
    }
    if let Some(p) = svg {
        let _ = writeln!(s, "plot: {p}");
    }
    s
}

/// The totals as one JSON object (`--json`).
pub fn json_totals(out: &Outcome, cfg: &ReplayConfig, attention: bool, svg: Option<&str>) -> Value {
    let pb = cfg.cache_page_bytes();
    let tot = total_row(&turn_rows(out));
    let se = series(out);
    let f = &out.final_stats.counters;
    let mut v = json!({
        "requests": out.requests.len(),
        "turns": out.requests.iter().map(|r| r.turn).max().unwrap_or(0),
        "page_size": cfg.page_size,
        "page_bytes": pb,
        "device_pages": cfg.device_pages,
        "host_pages": cfg.host_pages,
        "concurrency": cfg.concurrency,
        "attention": attention,
        "prompt_tokens": tot.prompt_tokens,
        "output_tokens": tot.output_tokens,
        "no_reuse_pages": tot.no_reuse_pages,
        "kvshare_pages": tot.kvshare_pages,
        "no_reuse_mib": mib(tot.no_reuse_pages, pb),
        "kvshare_mib": mib(tot.kvshare_pages, pb),
        "saving_pct": tot.saving_pct(),
        "query_tokens": tot.query_tokens,
        "hit_tokens": tot.hit_tokens,
        "prefix_hit_pct": tot.hit_pct(),
        "peak_pages": {"no_sharing": se.no_sharing_peak, "kvshare": se.kvshare_peak, "ideal": se.ideal_peak},
        "mean_pages": {"no_sharing": se.no_sharing_avg, "kvshare": se.kvshare_avg, "ideal": se.ideal_avg},
        "ideal_gap_steps": out.gap_steps,
        "ideal_gap_min": out.min_gap,
        "ideal_gap_max": out.max_gap,
        "evictions": f.evictions,
        "demotions": f.demotions,
        "promotions": f.promotions,
        "cow_copies": f.cow_copies,
        "swaps": out.swaps,
        "recomputes": out.recomputes,
        "index_pages_peak": out.peak_index_entries,
        "block_table_entries_peak": out.peak_block_entries,
        "mgr_ms": out.mgr_ns as f64 / 1e6,
        "mgr_calls": out.mgr_calls,
        "mgr_us_per_request": out.mgr_ns as f64 / 1e3 / out.requests.len().max(1) as f64,
        "mgr_us_per_request_median": median_mgr_us(out, None),
        "model_ms": (out.prefill_ns + out.decode_ns + out.copy_ns) as f64 / 1e6,
        "steps": out.steps,
        "sim_ms": out.sim_ms,
        "wall_ms": out.wall_ns as f64 / 1e6,
        "svg": svg,
    });
    // Apart: one more entry in the literal above passes `json!`'s recursion limit.
    v["match_unit"] = cfg.unit().into();
    v["unit_hits"] = f.unit_hits.into();
    v["unit_hit_tokens"] = f.unit_hit_tokens.into();
    v["policy"] = cfg.policy.name().into();
    v["schedule"] = cfg.schedule.name().into();
    v["peak_live_requests"] = out.peak_live.into();
    v["reference"] = match &out.reference {
        Some(r) => json!({
            "hit_tokens": r.hit_tokens,
            "hit_pct": pct(r.hit_tokens as f64, tot.query_tokens as f64),
            "hit_pages": r.hit_pages,
            "evictions": r.evictions,
            "policy_fraction_pct": pct(tot.hit_tokens as f64, r.hit_tokens as f64),
            "lru_model_hit_tokens": r.lru_model_hit_tokens,
            "events": r.events,
            "distinct_pages": r.distinct_pages,
            "log_bytes": r.log_bytes,
        }),
        None => Value::Null,
    };
    v["groups"] = out
        .groups
        .iter()
        .map(|g| {
            json!({
                "kind": super::hybrid::kind_name(g.kind),
                "peak_pages": g.peak_pages,
                "mean_pages": g.mean_pages,
                "ideal_peak": g.ideal_peak,
                "ideal_mean": g.ideal_mean,
                "released": g.released,
            })
        })
        .collect::<Vec<_>>()
        .into();
    v
}
