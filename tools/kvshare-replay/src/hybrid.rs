//! `kvshare-replay --window W --full-every K` (or `--chunk C`, `--state MODE`): a hybrid model's
//! KV-cache groups, replayed by the same loop as a plain model ([`super::sim`]), next to the
//! full-attention model of the same size in the same run.
//!
//! The hybrid model has K groups of equal layer count: one full-attention group and K - 1
//! sliding-window (window W), chunked-local (chunk C) or state (Mamba / linear attention) groups
//! (Gemma 3: `--window 1024 --full-every 6`; gpt-oss: `--window 128 --full-every 2`; Llama 4:
//! `--chunk 8192 --full-every 4`; Qwen3-Next: `--state align --full-every 4`). A page of a group
//! holds its 1/K of the layers, so both runs get the same bytes: the hybrid pool K times the
//! pages of the full model's (plus the null page each). Both runs are caches of groups (the full
//! model one full-attention group), admitted the same way (a request runs when its `begin` finds
//! room), so the comparison is of the groups alone.
//!
//! Memory columns per group: pages held (distinct) at peak and on average over steps, and the
//! ideal computed per group independently of the cache: the distinct pages the live sequences
//! need for their next token (every page for full attention; the pages touching the last W
//! tokens, or the current chunk), full pages shared by content; for a state group the one page
//! holding the state after the last token.

use std::fmt::Write as _;

use kvshare_core::GroupKind;

use super::config::ReplayConfig;
use super::outcome::Outcome;

/// The groups of a hybrid model: one full-attention group and `full_every - 1` groups of
/// `local` (a sliding window, chunked local attention or a state).
pub fn hybrid_kinds(local: GroupKind, full_every: u32) -> Vec<GroupKind> {
    let mut k = vec![GroupKind::Full];
    k.extend(std::iter::repeat_n(
        local,
        full_every.saturating_sub(1) as usize,
    ));
    k
}

/// The two runs of a hybrid comparison from the plain model's settings (`pages`: the full
/// model's device pages): the full model as one full-attention group, and the hybrid model's
/// `kinds` with as many bytes.
pub fn hybrid_configs(
    base: &ReplayConfig,
    kinds: Vec<GroupKind>,
) -> Result<(ReplayConfig, ReplayConfig), String> {
    let pages = base.device_pages;
    let k = kinds.len() as u32;
    let full = ReplayConfig {
        groups: vec![GroupKind::Full],
        device_pages: pages.checked_add(1).ok_or("--device-pages too large")?,
        ..base.clone()
    };
    let hybrid = ReplayConfig {
        groups: kinds,
        device_pages: pages
            .checked_mul(k)
            .and_then(|p| p.checked_add(1))
            .ok_or("--device-pages too large")?,
        ..base.clone()
    };
    Ok((full, hybrid))
}

/// A group kind in words.
pub fn kind_name(k: GroupKind) -> String {
    match k {
        GroupKind::Full => "full".to_string(),
        GroupKind::SlidingWindow(w) => format!("sliding window {w}"),
        GroupKind::ChunkedLocal(c) => format!("chunked local {c}"),
        GroupKind::State(m) => format!("state ({m:?})").to_lowercase(),
    }
}

/// The per-group table of a run.
pub fn format_groups(out: &Outcome, ps: u32) -> String {
    let mut s = String::new();
    let n = out.groups.len();
    let _ = writeln!(
        s,
        "KV-cache groups: {n} of equal layers ({ps}-token pages; a group page holds 1/{n} of the layers)"
    );
    let _ = writeln!(
        s,
        "group  kind                 peak pages  mean pages  ideal peak  ideal mean  released"
    );
    for (g, m) in out.groups.iter().enumerate() {
        let _ = writeln!(
            s,
            "{g:>5}  {:<20} {:>10} {:>11.1} {:>11} {:>11.1} {:>9}",
            kind_name(m.kind),
            m.peak_pages,
            m.mean_pages,
            m.ideal_peak,
            m.ideal_mean,
            m.released
        );
    }
    s
}

/// The comparison of a hybrid run with the full-attention run of the same model size.
pub fn format_hybrid(hy: &Outcome, full: &Outcome) -> String {
    let mut s = String::new();
    let f = &full.groups[0];
    let _ = writeln!(
        s,
        "full-attention model of the same size: peak {} pages, mean {:.1} (ideal peak {}, mean {:.1})",
        f.peak_pages, f.mean_pages, f.ideal_peak, f.ideal_mean
    );
    let (hm, fm) = (hy.mean_model_pages(), full.mean_model_pages());
    let (hp, fp) = (hy.peak_model_pages(), full.peak_model_pages());
    let _ = writeln!(
        s,
        "KV memory in full-model pages (all layers): hybrid mean {hm:.1} vs full {fm:.1} ({:.1}% saved), peak {hp:.1} vs {fp:.1} ({:.1}% saved)",
        100.0 * (1.0 - hm / fm.max(1e-9)),
        100.0 * (1.0 - hp / fp.max(1e-9))
    );
    let pct = |o: &Outcome| 100.0 * o.hit_tokens() as f64 / o.query_tokens().max(1) as f64;
    let _ = writeln!(
        s,
        "prefix hits: hybrid {:.1}% of prompt tokens, full {:.1}%; preemptions: hybrid {}, full {}; steps: {} / {}",
        pct(hy),
        pct(full),
        hy.swaps + hy.recomputes,
        full.swaps + full.recomputes,
        hy.steps,
        full.steps
    );
    s
}
