//! What a replay reports: pages in use per step ([`StepPages`]) and their peaks and means
//! ([`Series`]), per-request results ([`RequestStats`]), per KV-cache group ([`GroupMemory`]),
//! the offline reference ([`Reference`]), the whole run ([`Outcome`]) and progress while it runs
//! ([`Progress`]).

use kvshare_core::{GroupKind, Stats};

/// Pages in use after one step (one point of the memory plot).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepPages {
    /// Step number (0-based).
    pub step: u64,
    /// Simulated time at the end of the step.
    pub time_ms: f64,
    /// kvshare: device pages with refcount > 0.
    pub kvshare: u32,
    /// Every live sample holding its own copy of its tokens.
    pub no_sharing: u32,
    /// Distinct token-prefix pages of live samples.
    pub ideal: u32,
    /// Unreferenced pages kept for prefix hits.
    pub cached: u32,
    /// Requests running (on the device).
    pub running: u32,
}

impl StepPages {
    /// One point for two: each count's larger value, the later point's step and time.
    pub fn merge(&self, later: &StepPages) -> StepPages {
        StepPages {
            step: later.step,
            time_ms: later.time_ms,
            kvshare: self.kvshare.max(later.kvshare),
            no_sharing: self.no_sharing.max(later.no_sharing),
            ideal: self.ideal.max(later.ideal),
            cached: self.cached.max(later.cached),
            running: self.running.max(later.running),
        }
    }
}

/// Peak and mean of the three page series over every step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Series {
    /// Peak without sharing.
    pub no_sharing_peak: u32,
    /// Peak of kvshare.
    pub kvshare_peak: u32,
    /// Peak of the ideal.
    pub ideal_peak: u32,
    /// Mean without sharing (over steps).
    pub no_sharing_avg: f64,
    /// Mean of kvshare.
    pub kvshare_avg: f64,
    /// Mean of the ideal.
    pub ideal_avg: f64,
    /// Steps counted.
    pub steps: u64,
    sums: [u64; 3],
}

impl Series {
    /// Counts one step.
    pub fn add(&mut self, p: &StepPages) {
        self.no_sharing_peak = self.no_sharing_peak.max(p.no_sharing);
        self.kvshare_peak = self.kvshare_peak.max(p.kvshare);
        self.ideal_peak = self.ideal_peak.max(p.ideal);
        self.steps += 1;
        for (s, v) in self.sums.iter_mut().zip([p.no_sharing, p.kvshare, p.ideal]) {
            *s += v as u64;
        }
        let n = self.steps as f64;
        self.no_sharing_avg = self.sums[0] as f64 / n;
        self.kvshare_avg = self.sums[1] as f64 / n;
        self.ideal_avg = self.sums[2] as f64 / n;
    }
}

/// Memory of one KV-cache group over the replay (a plain model: its one full-attention group,
/// whose pages are the device pages in use).
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
    /// Pages released out of the window (or chunk, or as stale states) over the replay.
    pub released: u64,
    steps: u64,
    sums: [u64; 2],
}

impl GroupMemory {
    /// A group of `kind` before the first step.
    pub fn new(kind: GroupKind) -> Self {
        GroupMemory {
            kind,
            peak_pages: 0,
            mean_pages: 0.0,
            ideal_peak: 0,
            ideal_mean: 0.0,
            released: 0,
            steps: 0,
            sums: [0; 2],
        }
    }

    /// Counts one step: `held` distinct pages, the ideal's `ideal`, `released` so far.
    pub fn record(&mut self, held: u64, ideal: u64, released: u64) {
        self.peak_pages = self.peak_pages.max(held);
        self.ideal_peak = self.ideal_peak.max(ideal);
        self.released = released;
        self.steps += 1;
        self.sums[0] += held;
        self.sums[1] += ideal;
        self.mean_pages = self.sums[0] as f64 / self.steps as f64;
        self.ideal_mean = self.sums[1] as f64 / self.steps as f64;
    }
}

/// The offline reference of a run ([`super::offline`]): the hits Belady's rule gets on the same
/// requests with the same room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference {
    /// Prompt tokens hit.
    pub hit_tokens: u64,
    /// Pages hit.
    pub hit_pages: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Tokens hit by the model's LRU on the same log (a cross-check against the core's LRU).
    pub lru_model_hit_tokens: u64,
    /// Events recorded.
    pub events: u64,
    /// Distinct page contents seen.
    pub distinct_pages: u64,
    /// Bytes the log took.
    pub log_bytes: u64,
}

/// What one request did.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestStats {
    /// Request id.
    pub id: String,
    /// 1-based position of the request in its conversation.
    pub turn: usize,
    /// Parallel samples.
    pub samples: usize,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens over all samples.
    pub output_tokens: usize,
    /// Pages it would hold at its end with no sharing (each sample its own copy; in a cache of
    /// groups, in every group).
    pub no_reuse_pages: u64,
    /// Pages the cache manager allocated for it (prefix hits and forked pages excluded;
    /// copy-on-write copies, swap-in copies and recomputation after preemption included).
    pub allocated_pages: u64,
    /// Prompt tokens offered to prefix matching (every `begin`).
    pub query_tokens: u64,
    /// Of those, tokens found cached.
    pub hit_tokens: u64,
    /// Time in cache-manager calls attributed to it (batched calls split evenly).
    pub mgr_ns: u64,
    /// Cache-manager calls attributed to it (a batched call counts once per sample in it).
    pub mgr_calls: u64,
    /// Time in the model (KV write + attention + copies) attributed to it, by attention work.
    pub attn_ns: u64,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Arrival on the simulated clock.
    pub arrival_ms: f64,
    /// Admission (first prefill step start).
    pub start_ms: f64,
    /// End of its last step.
    pub finish_ms: f64,
}

/// Results of a replay.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Per request, in trace order.
    pub requests: Vec<RequestStats>,
    /// Pages in use, one point per step (up to a bound: beyond it, each point is the maximum of
    /// consecutive steps, see `sim.rs`).
    pub per_step: Vec<StepPages>,
    /// Peaks and means of the page series over every step.
    pub series: Series,
    /// Per KV-cache group (one for a plain model).
    pub groups: Vec<GroupMemory>,
    /// The offline reference, when recorded.
    pub reference: Option<Reference>,
    /// Most requests in flight (arrived, not finished) at once.
    pub peak_live: u64,
    /// Cache-manager stats at the end.
    pub final_stats: Stats,
    /// Steps run.
    pub steps: u64,
    /// Simulated time at the end.
    pub sim_ms: f64,
    /// Steps where kvshare's pages in use differed from the ideal.
    pub gap_steps: u64,
    /// Largest `kvshare - ideal` seen (negative: kvshare below the ideal, a bug in either).
    pub max_gap: i64,
    /// Smallest `kvshare - ideal` seen.
    pub min_gap: i64,
    /// First step with a gap.
    pub first_gap_step: Option<u64>,
    /// Preemptions that swapped a request out.
    pub swaps: u64,
    /// Preemptions that freed a request for recomputation.
    pub recomputes: u64,
    /// Most block-table entries held by live sequences at once.
    pub peak_block_entries: u64,
    /// Most prefix-index entries at once.
    pub peak_index_entries: u64,
    /// Time in cache-manager calls.
    pub mgr_ns: u64,
    /// Cache-manager calls.
    pub mgr_calls: u64,
    /// Model time in prefill launches (KV write + attention).
    pub prefill_ns: u64,
    /// Model time in decode launches.
    pub decode_ns: u64,
    /// Model time in page copies.
    pub copy_ns: u64,
    /// Wall time of the whole replay.
    pub wall_ns: u64,
    /// Of the prompt tokens hit, those whose pages were promoted from the host tier.
    pub host_hit_tokens: u64,
    /// Of the prompt tokens hit, those loaded from the pool tier (the rest were on the device).
    pub pool_hit_tokens: u64,
}

impl Outcome {
    /// A replay of a cache of `kinds` groups before its first step.
    pub fn new(final_stats: Stats, kinds: &[GroupKind]) -> Self {
        Outcome {
            requests: Vec::new(),
            per_step: Vec::new(),
            series: Series::default(),
            groups: kinds.iter().map(|&k| GroupMemory::new(k)).collect(),
            reference: None,
            peak_live: 0,
            final_stats,
            steps: 0,
            sim_ms: 0.0,
            gap_steps: 0,
            max_gap: 0,
            min_gap: 0,
            first_gap_step: None,
            swaps: 0,
            recomputes: 0,
            peak_block_entries: 0,
            peak_index_entries: 0,
            mgr_ns: 0,
            mgr_calls: 0,
            prefill_ns: 0,
            decode_ns: 0,
            copy_ns: 0,
            wall_ns: 0,
            host_hit_tokens: 0,
            pool_hit_tokens: 0,
        }
    }

    /// Prompt tokens hit, over all requests.
    pub fn hit_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.hit_tokens).sum()
    }

    /// Prompt tokens looked up, over all requests.
    pub fn query_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.query_tokens).sum()
    }

    /// Mean over steps of the summed per-group distinct pages, weighted by each group's share
    /// of layers (1 / groups): the memory in full-model pages (pages of every layer).
    pub fn mean_model_pages(&self) -> f64 {
        self.groups.iter().map(|g| g.mean_pages).sum::<f64>() / self.groups.len().max(1) as f64
    }

    /// The same at the peak step of each group (an upper bound of the peak of the sum).
    pub fn peak_model_pages(&self) -> f64 {
        self.groups.iter().map(|g| g.peak_pages as f64).sum::<f64>()
            / self.groups.len().max(1) as f64
    }
}

/// Progress of a running replay.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Requests finished.
    pub done: usize,
    /// Requests in the workload.
    pub total: usize,
    /// Steps so far.
    pub step: u64,
}
