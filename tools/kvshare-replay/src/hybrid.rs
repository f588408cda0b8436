//! `kvshare-replay --window W --full-every K` (or `--chunk C`): the workload replayed through
//! a cache of KV-cache groups (`kvshare_core::State` with groups) for a hybrid model, next to the same
//! workload on a full-attention model of the same size, in one run.
//!
//! The hybrid model has K groups of equal layer count: one full-attention group and K - 1
//! sliding-window (window W) or chunked-local (chunk C) groups (Gemma 3: `--window 1024
//! --full-every 6`; gpt-oss: `--window 128 --full-every 2`; Llama 4: `--chunk 8192
//! --full-every 4`). A page of a group holds its 1/K of the layers, so both runs get the same
//! bytes: the hybrid pool K times the pages of the full model's. The engine is vLLM's shape:
//! a request's prompt is matched and prefilled at admission, then one token per step; before
//! each step a sequence releases what its window no longer reads
//! (`release_skipped(len)`); a step that finds no page preempts the newest running request
//! (recomputed later from its prompt plus what it generated). Memory columns per group: pages
//! held (distinct) at peak and on average over steps, and the ideal computed per group
//! independently of the cache: the distinct pages the live sequences need for their next token
//! (every page for full attention; the pages touching the last W tokens, or the current chunk),
//! full pages shared by content; for a state group (`--state all|align`, Mamba / linear
//! attention) the one page holding the state after the last token.

use std::collections::{HashSet, VecDeque};

use kvshare_core::{Config, GroupKind, GroupSpec, State};
use kvshare_core::prefix::{chain_hash, root_hash};
use kvshare_core::Error;

use super::trace::Request;

/// Settings of a hybrid replay.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridReplayConfig {
    /// The groups (the full model: one full-attention group).
    pub kinds: Vec<GroupKind>,
    /// Tokens per page.
    pub page_size: u32,
    /// Pages in the pool (the null page included).
    pub num_pages: u32,
    /// Most requests running at once.
    pub concurrency: usize,
    /// Simulated duration of one engine step (arrivals are on this clock).
    pub step_ms: f64,
    /// Run the invariant checker after every step.
    pub check: bool,
}

/// Memory of one group over the replay.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupMemory {
    /// The group's kind.
    pub kind: GroupKind,
    /// Most distinct pages its tables held in one step.
    pub peak_pages: u64,
    /// Mean over steps of the distinct pages held.
    pub mean_pages: f64,
    /// Most pages the ideal needed in one step.
    pub ideal_peak: u64,
    /// Mean over steps of the ideal.
    pub ideal_mean: f64,
    /// Pages released out of the window over the replay.
    pub released: u64,
}

/// What a hybrid replay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridOutcome {
    /// Per group.
    pub groups: Vec<GroupMemory>,
    /// Engine steps.
    pub steps: u64,
    /// Prompt tokens matched in the cache (hits) and prompt tokens looked up.
    pub hit_tokens: u64,
    /// Prompt tokens looked up (admissions and re-admissions).
    pub query_tokens: u64,
    /// Requests preempted for lack of pages.
    pub preemptions: u64,
    /// Most pool pages referenced in one step, and the mean over steps.
    pub peak_in_use: u64,
    /// Mean over steps of the pool pages referenced.
    pub mean_in_use: f64,
}

impl HybridOutcome {
    /// Mean of the summed per-group distinct pages, weighted by each group's share of layers
    /// (1 / groups): the memory in full-model pages (pages of every layer).
    pub fn mean_model_pages(&self) -> f64 {
        self.groups.iter().map(|g| g.mean_pages).sum::<f64>() / self.groups.len() as f64
    }

    /// The same at the peak step of each group (an upper bound of the peak of the sum).
    pub fn peak_model_pages(&self) -> f64 {
        self.groups.iter().map(|g| g.peak_pages as f64).sum::<f64>() / self.groups.len() as f64
    }
}

struct Run {
    req: usize,
    seq: u64,
    /// Tokens of the sequence (prompt plus generated so far).
    tokens: Vec<i32>,
    produced: usize,
    /// Chain digests of its full pages (for the ideal).
    hashes: Vec<u128>,
}

fn extend_hashes(r: &mut Run, ps: usize, scratch: &mut Vec<u8>) {
    let mut parent = r.hashes.last().copied().unwrap_or_else(root_hash);
    for c in r.tokens.chunks_exact(ps).skip(r.hashes.len()) {
        parent = chain_hash(parent, 0, c, scratch);
        r.hashes.push(parent);
    }
}

/// First page a group needs for the next token of a sequence of `len` tokens.
fn first_needed(kind: GroupKind, len: usize, ps: usize) -> usize {
    match kind {
        GroupKind::Full => 0,
        GroupKind::SlidingWindow(w) => len.saturating_sub(w as usize) / ps,
        GroupKind::ChunkedLocal(c) => len.saturating_sub(1) / c as usize * c as usize / ps,
        // The page holding the state after the last token.
        GroupKind::State(_) => len.saturating_sub(1) / ps,
    }
}

/// Replays the first sample of every request (forks are not modelled here).
pub fn replay_groups(reqs: &[Request], cfg: &HybridReplayConfig) -> Result<HybridOutcome, String> {
    let ps = cfg.page_size as usize;
    let ng = cfg.kinds.len();
    for r in reqs {
        let pages = r.final_len(0).div_ceil(ps) * ng;
        if pages + ng > cfg.num_pages as usize - 1 {
            return Err(format!(
                "request {:?} needs {pages} pages at its end but the pool has {}",
                r.id,
                cfg.num_pages - 1
            ));
        }
    }
    let mut h = State::new(Config {
        page_size: cfg.page_size,
        num_device_pages: cfg.num_pages,
        reserve_null_page: true,
        skip_cached_writes: false,
        vllm_free_order: true,
        groups: cfg
            .kinds
            .iter()
            .map(|&kind| GroupSpec {
                kind,
                page_bytes: 1,
            })
            .collect(),
        ..Config::default()
    })
    .map_err(|e| e.to_string())?;
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| reqs[a].arrival_ms.total_cmp(&reqs[b].arrival_ms));
    let mut arriving: VecDeque<usize> = order.into();
    // Preempted requests come back first, with what they generated so far.
    let mut retry: VecDeque<(usize, usize)> = VecDeque::new();
    let mut running: Vec<Run> = Vec::new();
    let (mut done, mut step, mut next_seq) = (0usize, 0u64, 1u64);
    let mut out = HybridOutcome {
        groups: cfg
            .kinds
            .iter()
            .map(|&kind| GroupMemory {
                kind,
                peak_pages: 0,
                mean_pages: 0.0,
                ideal_peak: 0,
                ideal_mean: 0.0,
                released: 0,
            })
            .collect(),
        steps: 0,
        hit_tokens: 0,
        query_tokens: 0,
        preemptions: 0,
        peak_in_use: 0,
        mean_in_use: 0.0,
    };
    let mut scratch = Vec::new();
    let (mut sum_held, mut sum_ideal, mut sum_in_use) = (vec![0u64; ng], vec![0u64; ng], 0u64);
    while done < reqs.len() {
        let now = step as f64 * cfg.step_ms;
        // State checkpoints registered last step become matchable (vLLM's new_step_starts).
        h.new_step();
        // Admissions (prefill this step).
        let mut admitted = 0;
        while running.len() < cfg.concurrency {
            let (req, produced) = match retry.front() {
                Some(&r) => r,
                None => match arriving.front() {
                    Some(&i) if reqs[i].arrival_ms <= now => (i, 0),
                    _ => break,
                },
            };
            let r = &reqs[req];
            let mut tokens = r.prompt.clone();
            tokens.extend_from_slice(&r.outputs[0][..produced]);
            let seq = next_seq;
            match h.begin(seq, &tokens, None, tokens.len().saturating_sub(1), 0) {
                Ok(b) => {
                    out.hit_tokens += b.matched_tokens as u64;
                    out.query_tokens += tokens.len() as u64;
                }
                Err(Error::NoSpace { .. }) => break,
                Err(e) => return Err(e.to_string()),
            }
            next_seq += 1;
            if retry.pop_front().is_none() {
                arriving.pop_front();
            }
            running.push(Run {
                req,
                seq,
                tokens,
                produced,
                hashes: Vec::new(),
            });
            admitted += 1;
        }
        // Decode steps of the requests admitted before this step.
        let mut i = 0;
        while i < running.len() - admitted.min(running.len()) {
            let r = &running[i];
            let output = &reqs[r.req].outputs[0];
            if r.produced == output.len() {
                h.free(r.seq).map_err(|e| e.to_string())?;
                running.remove(i);
                done += 1;
                continue;
            }
            let tok = output[r.produced];
            h.release_skipped(r.seq, r.tokens.len())
                .map_err(|e| e.to_string())?;
            match h.append(r.seq, &[tok], 0, &mut Vec::new(), 0) {
                Ok(()) => {
                    let r = &mut running[i];
                    r.tokens.push(tok);
                    r.produced += 1;
                    i += 1;
                }
                Err(Error::NoSpace { .. }) => {
                    // vLLM's preemption: the newest running request is recomputed later.
                    let victim = running.pop().expect("running is not empty");
                    h.free(victim.seq).map_err(|e| e.to_string())?;
                    retry.push_front((victim.req, victim.produced));
                    out.preemptions += 1;
                    admitted = admitted.saturating_sub(1);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        if cfg.check {
            h.check().map_err(|e| format!("step {step}: {e}"))?;
        }
        // Memory of this step.
        for r in &mut running {
            extend_hashes(r, ps, &mut scratch);
        }
        for (g, m) in out.groups.iter_mut().enumerate() {
            let s = h.group_stats(g).map_err(|e| e.to_string())?;
            m.peak_pages = m.peak_pages.max(s.pages_distinct);
            sum_held[g] += s.pages_distinct;
            m.released = s.counters.released;
            let mut need: HashSet<(usize, u128)> = HashSet::new();
            let mut partial = 0u64;
            for r in &running {
                let len = r.tokens.len();
                for j in first_needed(m.kind, len, ps)..len.div_ceil(ps) {
                    match r.hashes.get(j) {
                        Some(&hash) => {
                            need.insert((j, hash));
                        }
                        None => partial += 1,
                    }
                }
            }
            let ideal = need.len() as u64 + partial;
            m.ideal_peak = m.ideal_peak.max(ideal);
            sum_ideal[g] += ideal;
        }
        let in_use = h.pool(0).map_or(0, |p| p.num_in_use() as u64);
        out.peak_in_use = out.peak_in_use.max(in_use);
        sum_in_use += in_use;
        step += 1;
        if step > 50_000_000 {
            return Err("the replay does not progress".into());
        }
    }
    out.steps = step;
    for (g, m) in out.groups.iter_mut().enumerate() {
        m.mean_pages = sum_held[g] as f64 / step.max(1) as f64;
        m.ideal_mean = sum_ideal[g] as f64 / step.max(1) as f64;
    }
    out.mean_in_use = sum_in_use as f64 / step.max(1) as f64;
    Ok(out)
}

/// The groups of a hybrid model: one full-attention group and `full_every - 1` groups of
/// `local` (a sliding window or chunked local attention).
pub fn hybrid_kinds(local: GroupKind, full_every: u32) -> Vec<GroupKind> {
    let mut k = vec![GroupKind::Full];
    k.extend(std::iter::repeat_n(
        local,
        full_every.saturating_sub(1) as usize,
    ));
    k
}

/// The report of a hybrid run next to the full-attention run of the same model size.
pub fn format_hybrid(hy: &HybridOutcome, full: &HybridOutcome, ps: u32) -> String {
    let mut s = String::new();
    let name = |k: GroupKind| match k {
        GroupKind::Full => "full".to_string(),
        GroupKind::SlidingWindow(w) => format!("sliding window {w}"),
        GroupKind::ChunkedLocal(c) => format!("chunked local {c}"),
        GroupKind::State(m) => format!("state ({m:?})").to_lowercase(),
    };
    s.push_str(&format!(
        "hybrid model, {} groups of equal layers ({}-token pages; a group page holds 1/{} of the layers)\n",
        hy.groups.len(),
        ps,
        hy.groups.len()
    ));
    s.push_str(
        "group  kind                 peak pages  mean pages  ideal peak  ideal mean  released\n",
    );
    for (g, m) in hy.groups.iter().enumerate() {
        s.push_str(&format!(
            "{g:>5}  {:<20} {:>10} {:>11.1} {:>11} {:>11.1} {:>9}\n",
            name(m.kind),
            m.peak_pages,
            m.mean_pages,
            m.ideal_peak,
            m.ideal_mean,
            m.released
        ));
    }
    let f = &full.groups[0];
    s.push_str(&format!(
        "full-attention model of the same size: peak {} pages, mean {:.1} (ideal peak {}, mean {:.1})\n",
        f.peak_pages, f.mean_pages, f.ideal_peak, f.ideal_mean
    ));
    let (hm, fm) = (hy.mean_model_pages(), full.mean_model_pages());
    let (hp, fp) = (hy.peak_model_pages(), full.peak_model_pages());
    s.push_str(&format!(
        "KV memory in full-model pages (all layers): hybrid mean {hm:.1} vs full {fm:.1} ({:.1}% saved), peak {hp:.1} vs {fp:.1} ({:.1}% saved)\n",
        100.0 * (1.0 - hm / fm.max(1e-9)),
        100.0 * (1.0 - hp / fp.max(1e-9))
    ));
    s.push_str(&format!(
        "prefix hits: hybrid {:.1}% of prompt tokens, full {:.1}%; preemptions: hybrid {}, full {}; steps: {} / {}\n",
        100.0 * hy.hit_tokens as f64 / hy.query_tokens.max(1) as f64,
        100.0 * full.hit_tokens as f64 / full.query_tokens.max(1) as f64,
        hy.preemptions,
        full.preemptions,
        hy.steps,
        full.steps
    ));
    s
}
