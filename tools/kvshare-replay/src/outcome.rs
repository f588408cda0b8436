//! What a replay reports: pages in use per step ([`StepPages`]), per-request results
//! ([`RequestStats`]), the whole run ([`Outcome`]) and progress while it runs ([`Progress`]).

use kvshare_core::Stats;

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
    /// Pages it would hold at its end with no sharing (each sample its own copy).
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
    /// Pages in use, one entry per step.
    pub per_step: Vec<StepPages>,
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
