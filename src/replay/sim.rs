//! The replay loop: a step-based engine simulation driving the cache manager and the model.
//!
//! Each step (one engine iteration, `step_ms` of simulated time; wall time never steers the
//! schedule, so results are deterministic):
//!
//! 1. requests whose `arrival_ms` has passed, and whose conversation's previous turn has
//!    finished, join the queue (a chat client sends turn k+1 after reading reply k);
//! 2. swapped-out requests come back first (`swap_in`, host→device copies);
//! 3. queued requests are admitted in order while fewer than `concurrency` run and the device has
//!    room: `begin` matches the longest cached prefix (at most `prompt - 1` tokens: the engine
//!    recomputes the last prompt token for its logits, as vLLM does) and allocates the rest;
//!    the new tokens are prefilled in one batch (slot mapping → KV write, block tables →
//!    attention); a parallel-sampling request then `fork`s one sequence per extra sample;
//! 4. every request admitted in an earlier step decodes one token per sample: one
//!    `append_batch` (copy-on-write copies executed first), then KV write + attention. When the
//!    device is full, the most recently admitted request is preempted: swapped out if the host
//!    tier has room, else freed and recomputed later;
//! 5. pages in use are sampled: kvshare (`device_pages_in_use`), no sharing (every live sample
//!    holding its own copy) and the ideal ([`IdealTracker`]), and kvshare is compared with the
//!    ideal (a request that appended its last token is still counted, at its largest);
//! 6. samples that appended their last token are freed; a request finishes with its last sample.

use std::collections::VecDeque;
use std::time::Instant;

use crate::core::{Cache, Config, Error, ExtraKeys, PageCopy, Stats};

use super::ideal::IdealTracker;
use super::model::{Forward, Geometry, Model};
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
        }
    }

    /// Bytes of K plus V of one page over all layers.
    pub fn page_bytes(&self) -> u64 {
        self.geometry.token_bytes() * self.page_size as u64
    }
}

/// Pages in use after one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
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
    /// One per step.
    pub samples: Vec<Sample>,
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

#[derive(Debug, Clone)]
struct Sample1 {
    seq: u64,
    len: usize,
    /// Output tokens appended.
    out: usize,
    done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    NotArrived,
    Blocked,
    Queued,
    Running,
    Swapped,
    Done,
}

#[derive(Debug, Clone)]
struct ReqState {
    phase: Phase,
    samples: Vec<Sample1>,
    /// Started (begin called) at least once.
    started: bool,
    /// Admitted (or swapped in) during the current step: no decode this step.
    fresh: bool,
    admitted_order: u64,
    extra: Option<ExtraKeys>,
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

fn turn_numbers(reqs: &[Request]) -> (Vec<usize>, Vec<Option<usize>>) {
    let mut last: std::collections::HashMap<&str, (usize, usize)> = Default::default();
    let mut turn = Vec::with_capacity(reqs.len());
    let mut prev = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        match &r.session {
            None => {
                turn.push(1);
                prev.push(None);
            }
            Some(s) => {
                let e = last.get(s.as_str()).copied();
                turn.push(e.map_or(1, |(_, t)| t + 1));
                prev.push(e.map(|(j, _)| j));
                last.insert(s.as_str(), (i, e.map_or(1, |(_, t)| t + 1)));
            }
        }
    }
    (turn, prev)
}

struct Sim<'a> {
    reqs: &'a [Request],
    cfg: &'a ReplayConfig,
    ps: usize,
    cache: Cache,
    model: &'a mut dyn Model,
    ideal: IdealTracker,
    st: Vec<ReqState>,
    stats: Vec<RequestStats>,
    /// Successor in the same conversation.
    next_in_session: Vec<Option<usize>>,
    prev_in_session: Vec<Option<usize>>,
    queue: VecDeque<usize>,
    swapped: VecDeque<usize>,
    running: Vec<usize>,
    admitted: u64,
    now: f64,
    out: Outcome,
    copies: Vec<PageCopy>,
}

fn seq_id(req: usize, sample: usize) -> u64 {
    ((req as u64) << 16) | sample as u64
}

impl Sim<'_> {
    /// Runs `f` on the locked cache state, timing it and attributing the time to `owners`.
    fn mgr<T>(
        &mut self,
        owners: &[usize],
        f: impl FnOnce(&mut crate::core::State) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let t = Instant::now();
        let r = self.cache.lock().and_then(|mut s| f(&mut s));
        let ns = t.elapsed().as_nanos() as u64;
        self.out.mgr_ns += ns;
        self.out.mgr_calls += 1;
        if !owners.is_empty() {
            let share = ns / owners.len() as u64;
            for &o in owners {
                self.stats[o].mgr_ns += share;
                self.stats[o].mgr_calls += 1;
            }
        }
        r
    }

    /// Executes the copies the cache manager queued (demotions of evicted pages to the host
    /// tier, promotions of host hits), which must run before any copy returned by a later call
    /// and before the step's KV write. Only a host tier queues copies.
    fn drain_queued(&mut self, owners: &[usize]) -> Result<(), String> {
        if self.cfg.host_pages == 0 {
            return Ok(());
        }
        let queued = self
            .mgr(owners, |s| Ok(s.take_copies(usize::MAX)))
            .map_err(|e| format!("take_copies: {e}"))?;
        if queued.is_empty() {
            return Ok(());
        }
        // A promotion (host hit) gives the request a device page: count it as allocated.
        let promoted = queued
            .iter()
            .filter(|c| c.kind == crate::core::CopyKind::HostToDevice)
            .count() as u64;
        if let [o] = owners {
            self.stats[*o].allocated_pages += promoted;
        }
        let returned = std::mem::replace(&mut self.copies, queued);
        self.copy(owners)?;
        self.copies = returned;
        Ok(())
    }

    fn state_stats(&self) -> Stats {
        self.cache.lock().expect("cache lock").stats()
    }

    fn available(&self) -> usize {
        let s = self.state_stats();
        (s.device_pages_free + s.device_pages_cached) as usize
    }

    fn running_samples(&self) -> usize {
        self.running
            .iter()
            .map(|&i| self.st[i].samples.iter().filter(|s| !s.done).count())
            .sum()
    }

    fn tokens_of(&self, i: usize, b: usize) -> Vec<i32> {
        let r = &self.reqs[i];
        let s = &self.st[i].samples[b];
        let mut t = Vec::with_capacity(s.len);
        t.extend_from_slice(&r.prompt);
        t.extend_from_slice(&r.outputs[b][..s.out]);
        t
    }

    fn arrivals(&mut self, next: &mut usize) {
        while *next < self.reqs.len() && self.reqs[*next].arrival_ms <= self.now {
            let i = *next;
            *next += 1;
            let ready = self.prev_in_session[i].is_none_or(|p| self.st[p].phase == Phase::Done);
            if ready {
                self.st[i].phase = Phase::Queued;
                self.queue.push_back(i);
            } else {
                self.st[i].phase = Phase::Blocked;
            }
        }
    }

    fn track(&mut self, i: usize, b: usize) {
        let toks = self.tokens_of(i, b);
        let r = &self.reqs[i];
        self.ideal
            .insert(self.st[i].samples[b].seq, i as u64, &r.salt, r.lora, &toks);
    }

    /// One forward launch over `(request, sample, new tokens)`.
    fn forward(&mut self, items: &[(usize, usize, usize)], decode: bool) -> Result<(), String> {
        if items.is_empty() {
            return Ok(());
        }
        let ids: Vec<u64> = items
            .iter()
            .map(|&(i, b, _)| self.st[i].samples[b].seq)
            .collect();
        let q: Vec<u32> = items.iter().map(|&(_, _, q)| q as u32).collect();
        let owners: Vec<usize> = items.iter().map(|&(i, _, _)| i).collect();
        let total: usize = q.iter().map(|&x| x as usize).sum();
        let max_pages = items
            .iter()
            .map(|&(i, b, _)| self.st[i].samples[b].len.div_ceil(self.ps))
            .max()
            .unwrap_or(1);
        let mut slots = vec![0i64; total];
        let mut table = vec![0i32; ids.len() * max_pages];
        let mut ctx = vec![0i32; ids.len()];
        self.mgr(&owners, |s| s.slot_mapping(&ids, &q, &mut slots))
            .map_err(|e| format!("slot_mapping: {e}"))?;
        self.mgr(&owners, |s| {
            s.block_tables(&ids, max_pages, -1, &mut table, &mut ctx)
        })
        .map_err(|e| format!("block_tables: {e}"))?;
        let mut tokens = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut starts = Vec::with_capacity(ids.len() + 1);
        starts.push(0i32);
        let mut work = Vec::with_capacity(items.len());
        for (k, &(i, b, qn)) in items.iter().enumerate() {
            let len = self.st[i].samples[b].len;
            debug_assert_eq!(ctx[k] as usize, len);
            let all = self.tokens_of(i, b);
            tokens.extend_from_slice(&all[len - qn..]);
            positions.extend((len - qn..len).map(|p| p as i32));
            starts.push(tokens.len() as i32);
            // Attention work: each new token attends to its causal prefix.
            work.push(qn as f64 * (len as f64 - qn as f64 / 2.0 + 0.5));
        }
        let history: Vec<Vec<i32>> = if self.model.wants_history() {
            items
                .iter()
                .map(|&(i, b, _)| self.tokens_of(i, b))
                .collect()
        } else {
            Vec::new()
        };
        let f = Forward {
            decode,
            num_seqs: ids.len(),
            tokens: &tokens,
            positions: &positions,
            query_start: &starts,
            context_lens: &ctx,
            slots: &slots,
            block_table: &table,
            max_pages,
            history: &history,
        };
        let t = Instant::now();
        self.model.forward(&f)?;
        let ns = t.elapsed().as_nanos() as u64;
        if decode {
            self.out.decode_ns += ns;
        } else {
            self.out.prefill_ns += ns;
        }
        let sum: f64 = work.iter().sum::<f64>().max(1e-9);
        for (k, &(i, _, _)) in items.iter().enumerate() {
            self.stats[i].attn_ns += (ns as f64 * work[k] / sum) as u64;
        }
        Ok(())
    }

    fn copy(&mut self, owners: &[usize]) -> Result<(), String> {
        if self.copies.is_empty() {
            return Ok(());
        }
        let copies = std::mem::take(&mut self.copies);
        let t = Instant::now();
        self.model.copy_pages(&copies)?;
        let ns = t.elapsed().as_nanos() as u64;
        self.out.copy_ns += ns;
        for &o in owners {
            self.stats[o].attn_ns += ns / owners.len().max(1) as u64;
        }
        Ok(())
    }

    /// Tries to bring swapped-out requests back, oldest preemption first.
    fn swap_ins(&mut self) -> Result<(), String> {
        while let Some(&i) = self.swapped.front() {
            if self.running.len() >= self.cfg.concurrency {
                break;
            }
            let pages: usize = self.st[i]
                .samples
                .iter()
                .filter(|s| !s.done)
                .map(|s| s.len.div_ceil(self.ps))
                .sum();
            let live = self.st[i].samples.iter().filter(|s| !s.done).count();
            if self.available() < pages + self.running_samples() + live {
                break;
            }
            self.swapped.pop_front();
            let ids: Vec<u64> = self.st[i]
                .samples
                .iter()
                .filter(|s| !s.done)
                .map(|s| s.seq)
                .collect();
            for id in ids {
                let mut c = std::mem::take(&mut self.copies);
                self.mgr(&[i], |s| s.swap_in(id, &mut c, usize::MAX))
                    .map_err(|e| format!("swap_in of {:?}: {e}", self.reqs[i].id))?;
                self.stats[i].allocated_pages += c.len() as u64;
                self.copies = c;
                self.drain_queued(&[i])?;
                self.copy(&[i])?;
            }
            for b in 0..self.st[i].samples.len() {
                if !self.st[i].samples[b].done {
                    self.track(i, b);
                }
            }
            self.st[i].phase = Phase::Running;
            self.running.push(i);
        }
        Ok(())
    }

    /// Admits queued requests; returns the prefill items `(request, sample, new tokens)`.
    fn admit(&mut self) -> Result<Vec<(usize, usize, usize)>, String> {
        let mut items = Vec::new();
        while self.running.len() < self.cfg.concurrency && self.swapped.is_empty() {
            let Some(&i) = self.queue.front() else { break };
            let r = &self.reqs[i];
            let nsamp = r.outputs.len();
            // Which samples to begin: a fresh request (or one preempted before its samples
            // diverged) begins sample 0 and forks the rest after the prefill; a request
            // recomputed after divergence begins each unfinished sample.
            let diverged = self.st[i].samples.iter().any(|s| s.out > 0);
            let begins: Vec<usize> = if diverged {
                (0..nsamp)
                    .filter(|&b| !self.st[i].samples[b].done)
                    .collect()
            } else {
                vec![0]
            };
            // Conservative room check (no prefix hits assumed), keeping one page per running
            // sample for the next decode step.
            let need: usize = begins
                .iter()
                .map(|&b| self.st[i].samples[b].len.div_ceil(self.ps))
                .sum::<usize>()
                + nsamp;
            if self.available() < need + self.running_samples() {
                break;
            }
            self.queue.pop_front();
            for &b in &begins {
                let toks = self.tokens_of(i, b);
                let seq = self.st[i].samples[b].seq;
                let extra = self.st[i].extra.clone();
                let max_match = toks.len() - 1;
                let info = self
                    .mgr(&[i], |s| s.begin(seq, &toks, extra, max_match))
                    .map_err(|e| format!("begin of {:?}: {e}", self.reqs[i].id))?;
                let st = &mut self.stats[i];
                st.query_tokens += toks.len() as u64;
                st.hit_tokens += info.matched_tokens as u64;
                st.allocated_pages += info.new_pages as u64;
                self.track(i, b);
                self.drain_queued(&[i])?;
                items.push((i, b, toks.len() - info.matched_tokens));
            }
            if !self.st[i].started {
                self.stats[i].start_ms = self.now;
                self.st[i].started = true;
            }
            self.admitted += 1;
            self.st[i].admitted_order = self.admitted;
            self.st[i].phase = Phase::Running;
            self.st[i].fresh = true;
            self.running.push(i);
        }
        Ok(items)
    }

    /// Forks the unbegun samples of freshly prefilled requests.
    fn forks(&mut self, items: &[(usize, usize, usize)]) -> Result<(), String> {
        for &(i, b, _) in items {
            if b != 0 || self.st[i].samples.iter().any(|s| s.out > 0) {
                continue;
            }
            let parent = self.st[i].samples[0].seq;
            for c in 1..self.st[i].samples.len() {
                let child = self.st[i].samples[c].seq;
                self.mgr(&[i], |s| s.fork(parent, child))
                    .map_err(|e| format!("fork of {:?}: {e}", self.reqs[i].id))?;
                self.track(i, c);
            }
        }
        Ok(())
    }

    /// Takes request `i` off the device: swap out if the host has room, else free it for
    /// recomputation (back to the queue front).
    fn preempt(&mut self, i: usize) -> Result<(), String> {
        self.running.retain(|&x| x != i);
        self.stats[i].preemptions += 1;
        let live: Vec<usize> = (0..self.st[i].samples.len())
            .filter(|&b| !self.st[i].samples[b].done)
            .collect();
        let pages: usize = live
            .iter()
            .map(|&b| self.st[i].samples[b].len.div_ceil(self.ps))
            .sum();
        let host = self.state_stats();
        let host_free = (host.host_pages_free + host.host_pages_cached) as usize;
        for &b in &live {
            self.ideal.remove(self.st[i].samples[b].seq);
        }
        if pages <= host_free {
            for &b in &live {
                let seq = self.st[i].samples[b].seq;
                let mut c = std::mem::take(&mut self.copies);
                self.mgr(&[i], |s| s.swap_out(seq, &mut c, usize::MAX))
                    .map_err(|e| format!("swap_out of {:?}: {e}", self.reqs[i].id))?;
                self.copies = c;
                self.drain_queued(&[i])?;
                self.copy(&[i])?;
            }
            self.st[i].phase = Phase::Swapped;
            self.swapped.push_back(i);
            self.out.swaps += 1;
        } else {
            for &b in &live {
                let seq = self.st[i].samples[b].seq;
                self.mgr(&[i], |s| s.free(seq))
                    .map_err(|e| format!("free of {:?}: {e}", self.reqs[i].id))?;
            }
            // Samples not begun yet (forked later) restart from the prompt with sample 0.
            if !self.st[i].samples.iter().any(|s| s.out > 0) {
                for s in &mut self.st[i].samples {
                    s.len = self.reqs[i].prompt.len();
                }
            }
            self.st[i].phase = Phase::Queued;
            self.queue.push_front(i);
            self.out.recomputes += 1;
        }
        Ok(())
    }

    /// One decode step for the requests admitted before this step.
    fn decode(&mut self) -> Result<(), String> {
        loop {
            let mut batch: Vec<(usize, usize)> = Vec::new();
            for &i in &self.running {
                if self.st[i].fresh {
                    continue;
                }
                for (b, s) in self.st[i].samples.iter().enumerate() {
                    if !s.done && s.out < self.reqs[i].outputs[b].len() {
                        batch.push((i, b));
                    }
                }
            }
            if batch.is_empty() {
                return Ok(());
            }
            let ids: Vec<u64> = batch
                .iter()
                .map(|&(i, b)| self.st[i].samples[b].seq)
                .collect();
            let toks: Vec<i32> = batch
                .iter()
                .map(|&(i, b)| self.reqs[i].outputs[b][self.st[i].samples[b].out])
                .collect();
            let owners: Vec<usize> = batch.iter().map(|&(i, _)| i).collect();
            let mut c = std::mem::take(&mut self.copies);
            let r = self.mgr(&owners, |s| s.append_batch(&ids, &toks, &mut c, ids.len()));
            self.copies = c;
            match r {
                Ok(()) => {}
                Err(Error::NoSpace { .. }) => {
                    let victim = self
                        .running
                        .iter()
                        .copied()
                        .max_by_key(|&i| self.st[i].admitted_order)
                        .expect("a running request");
                    if self.running.len() == 1 {
                        return Err(format!(
                            "request {:?} cannot continue alone on {} device pages",
                            self.reqs[victim].id, self.cfg.device_pages
                        ));
                    }
                    self.preempt(victim)?;
                    continue;
                }
                Err(e) => return Err(format!("append_batch: {e}")),
            }
            // Attribute copy-on-write copies to the sample whose page was replaced.
            if !self.copies.is_empty() {
                let lock = self.cache.lock().map_err(|e| e.to_string())?;
                for c in &self.copies {
                    for &(i, b) in &batch {
                        let s = &self.st[i].samples[b];
                        let pages = lock.seq_pages(s.seq).map_err(|e| e.to_string())?;
                        if pages.get(s.len / self.ps) == Some(&c.dst) {
                            self.stats[i].allocated_pages += 1;
                        }
                    }
                }
            }
            self.drain_queued(&owners)?;
            self.copy(&owners)?;
            let mut items = Vec::with_capacity(batch.len());
            for (k, &(i, b)) in batch.iter().enumerate() {
                let s = &mut self.st[i].samples[b];
                if s.len % self.ps == 0 {
                    self.stats[i].allocated_pages += 1;
                }
                s.len += 1;
                s.out += 1;
                let seq = s.seq;
                self.ideal.push(seq, toks[k]);
                items.push((i, b, 1));
            }
            return self.forward(&items, true);
        }
    }

    /// Frees finished samples and requests.
    fn finish(&mut self) -> Result<(), String> {
        let end = self.now + self.cfg.step_ms;
        let running = self.running.clone();
        for i in running {
            for b in 0..self.st[i].samples.len() {
                let s = &self.st[i].samples[b];
                if s.done || s.out < self.reqs[i].outputs[b].len() {
                    continue;
                }
                let seq = s.seq;
                self.mgr(&[i], |st| st.free(seq))
                    .map_err(|e| format!("free of {:?}: {e}", self.reqs[i].id))?;
                self.ideal.remove(seq);
                self.st[i].samples[b].done = true;
            }
            if self.st[i].samples.iter().all(|s| s.done) {
                self.st[i].phase = Phase::Done;
                self.stats[i].finish_ms = end;
                self.running.retain(|&x| x != i);
                if let Some(n) = self.next_in_session[i] {
                    if self.st[n].phase == Phase::Blocked {
                        self.st[n].phase = Phase::Queued;
                        self.queue.push_back(n);
                    }
                }
            }
        }
        Ok(())
    }

    fn sample(&mut self, step: u64) -> Result<(), String> {
        let s = self.state_stats();
        let kvshare = s.device_pages_in_use as u32;
        let ideal = self.ideal.pages() as u32;
        let block_entries: u64 = {
            let lock = self.cache.lock().map_err(|e| e.to_string())?;
            let mut n = 0u64;
            for &i in &self.running {
                for smp in &self.st[i].samples {
                    if !smp.done {
                        n += lock.seq_pages(smp.seq).map_err(|e| e.to_string())?.len() as u64;
                    }
                }
            }
            if self.cfg.check {
                lock.check()
                    .map_err(|e| format!("cache check after step {step}: {e}"))?;
            }
            n
        };
        self.out.peak_block_entries = self.out.peak_block_entries.max(block_entries);
        self.out.peak_index_entries = self.out.peak_index_entries.max(s.index_pages);
        let gap = kvshare as i64 - ideal as i64;
        if gap != 0 {
            self.out.gap_steps += 1;
            self.out.first_gap_step.get_or_insert(step);
        }
        self.out.max_gap = self.out.max_gap.max(gap);
        self.out.min_gap = self.out.min_gap.min(gap);
        self.out.samples.push(Sample {
            step,
            time_ms: self.now + self.cfg.step_ms,
            kvshare,
            no_sharing: self.ideal.unshared_pages() as u32,
            ideal,
            cached: s.device_pages_cached as u32,
            running: self.running.len() as u32,
        });
        Ok(())
    }
}

/// Replays `reqs` (in arrival order) on a fresh cache, running `model` for every step, and
/// calls `progress` after every step.
pub fn replay(
    reqs: &[Request],
    cfg: &ReplayConfig,
    model: &mut dyn Model,
    progress: &mut dyn FnMut(Progress),
) -> Result<Outcome, String> {
    let wall = Instant::now();
    if cfg.concurrency == 0 {
        return Err("concurrency must be at least 1".into());
    }
    if !(cfg.step_ms.is_finite() && cfg.step_ms > 0.0) {
        return Err("step_ms must be a positive number".into());
    }
    check_fits(reqs, cfg)?;
    let cache = Cache::new(cfg.cache_config()).map_err(|e| e.to_string())?;
    let (turns, prev) = turn_numbers(reqs);
    let mut next = vec![None; reqs.len()];
    for (i, p) in prev.iter().enumerate() {
        if let Some(p) = *p {
            next[p] = Some(i);
        }
    }
    let ps = cfg.page_size as usize;
    let st = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| ReqState {
            phase: Phase::NotArrived,
            samples: (0..r.outputs.len())
                .map(|b| Sample1 {
                    seq: seq_id(i, b),
                    len: r.prompt.len(),
                    out: 0,
                    done: false,
                })
                .collect(),
            started: false,
            fresh: false,
            admitted_order: 0,
            extra: (!r.salt.is_empty() || r.lora != 0).then(|| ExtraKeys {
                lora_id: r.lora,
                salt: r.salt.as_bytes().to_vec(),
                mm: Vec::new(),
            }),
        })
        .collect();
    let stats = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| RequestStats {
            id: r.id.clone(),
            turn: turns[i],
            samples: r.outputs.len(),
            prompt_tokens: r.prompt.len(),
            output_tokens: r.outputs.iter().map(Vec::len).sum(),
            no_reuse_pages: (0..r.outputs.len())
                .map(|b| r.final_len(b).div_ceil(ps) as u64)
                .sum(),
            allocated_pages: 0,
            query_tokens: 0,
            hit_tokens: 0,
            mgr_ns: 0,
            mgr_calls: 0,
            attn_ns: 0,
            preemptions: 0,
            arrival_ms: r.arrival_ms,
            start_ms: 0.0,
            finish_ms: 0.0,
        })
        .collect();
    let final_stats = cache.lock().map_err(|e| e.to_string())?.stats();
    let mut sim = Sim {
        reqs,
        cfg,
        ps,
        cache,
        model,
        ideal: IdealTracker::new(ps),
        st,
        stats,
        next_in_session: next,
        prev_in_session: prev,
        queue: VecDeque::new(),
        swapped: VecDeque::new(),
        running: Vec::new(),
        admitted: 0,
        now: 0.0,
        out: Outcome {
            requests: Vec::new(),
            samples: Vec::new(),
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
        },
        copies: Vec::new(),
    };
    let mut next_arrival = 0usize;
    let mut step = 0u64;
    let mut done = 0usize;
    while done < reqs.len() {
        sim.arrivals(&mut next_arrival);
        if sim.running.is_empty() && sim.queue.is_empty() && sim.swapped.is_empty() {
            // Idle: jump to the next arrival.
            match reqs.get(next_arrival) {
                Some(r) => {
                    sim.now = sim.now.max(r.arrival_ms);
                    continue;
                }
                None => return Err("replay stalled: requests blocked with nothing running".into()),
            }
        }
        for &i in &sim.running {
            sim.st[i].fresh = false;
        }
        sim.swap_ins()?;
        let items = sim.admit()?;
        if sim.running.is_empty() {
            return Err("replay stalled: nothing could be admitted on an empty device".into());
        }
        sim.forward(&items, false)?;
        sim.forks(&items)?;
        sim.decode()?;
        sim.sample(step)?;
        sim.finish()?;
        done = sim.st.iter().filter(|s| s.phase == Phase::Done).count();
        sim.now += cfg.step_ms;
        step += 1;
        progress(Progress {
            done,
            total: reqs.len(),
            step,
        });
    }
    let mut out = sim.out;
    out.final_stats = sim.cache.lock().map_err(|e| e.to_string())?.stats();
    out.steps = step;
    out.sim_ms = sim.now;
    out.requests = sim.stats;
    out.wall_ns = wall.elapsed().as_nanos() as u64;
    Ok(out)
}
