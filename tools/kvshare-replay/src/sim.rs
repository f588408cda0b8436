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

use kvshare_core::{Cache, Error, ExtraKeys, PageCopy, Stats};

use super::config::{check_fits, ReplayConfig};
use super::ideal::IdealTracker;
use super::model::{Forward, Model};
use super::outcome::{Outcome, Progress, RequestStats, StepPages};
use super::requests::{seq_id, turn_numbers, Phase, RequestState, SampleSeq};
use super::trace::Request;

/// New tokens of one sample in a forward launch: the last `count` tokens of sample `sample` of
/// request `request` (a prefill's uncached prompt tokens, or a decode's one token).
#[derive(Debug, Clone, Copy)]
struct NewTokens {
    request: usize,
    sample: usize,
    count: usize,
}

/// The replay in progress.
struct Sim<'a> {
    reqs: &'a [Request],
    cfg: &'a ReplayConfig,
    /// Tokens per page.
    page_size: usize,
    cache: Cache,
    model: &'a mut dyn Model,
    ideal: IdealTracker,
    /// Per request, in trace order.
    state: Vec<RequestState>,
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

impl Sim<'_> {
    /// Runs `f` on the locked cache state, timing it and attributing the time to `owners`.
    fn mgr<T>(
        &mut self,
        owners: &[usize],
        f: impl FnOnce(&mut kvshare_core::State) -> Result<T, Error>,
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
    /// and before the step's KV write, and the partial copies of hits ending inside a page
    /// (`match_unit`). Only a host tier or a match unit below the page size queues copies.
    fn drain_queued(&mut self, owners: &[usize]) -> Result<(), String> {
        if self.cfg.host_pages == 0 && self.cfg.unit() == self.cfg.page_size {
            return Ok(());
        }
        let queued = self
            .mgr(owners, |s| Ok(s.take_copies(usize::MAX)))
            .map_err(|e| format!("take_copies: {e}"))?;
        if queued.is_empty() {
            return Ok(());
        }
        // A promotion (host hit) gives the request a device page: count it as allocated. (A
        // unit hit's copy fills a page `begin` already counted; it is never a whole page.)
        let promoted = queued
            .iter()
            .filter(|c| {
                c.kind == kvshare_core::CopyKind::HostToDevice && c.num_tokens == self.cfg.page_size
            })
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
            .map(|&i| self.state[i].samples.iter().filter(|s| !s.done).count())
            .sum()
    }

    fn tokens_of(&self, i: usize, b: usize) -> Vec<i32> {
        let r = &self.reqs[i];
        let s = &self.state[i].samples[b];
        let mut t = Vec::with_capacity(s.len);
        t.extend_from_slice(&r.prompt);
        t.extend_from_slice(&r.outputs[b][..s.out]);
        t
    }

    fn arrivals(&mut self, next: &mut usize) {
        while *next < self.reqs.len() && self.reqs[*next].arrival_ms <= self.now {
            let i = *next;
            *next += 1;
            let ready = self.prev_in_session[i].is_none_or(|p| self.state[p].phase == Phase::Done);
            if ready {
                self.state[i].phase = Phase::Queued;
                self.queue.push_back(i);
            } else {
                self.state[i].phase = Phase::Blocked;
            }
        }
    }

    fn track(&mut self, i: usize, b: usize) {
        let toks = self.tokens_of(i, b);
        let r = &self.reqs[i];
        self.ideal.insert(
            self.state[i].samples[b].seq,
            i as u64,
            &r.salt,
            r.lora,
            &toks,
        );
    }

    /// One forward launch over the new tokens of each item.
    fn forward(&mut self, items: &[NewTokens], decode: bool) -> Result<(), String> {
        if items.is_empty() {
            return Ok(());
        }
        let ids: Vec<u64> = items
            .iter()
            .map(|n| self.state[n.request].samples[n.sample].seq)
            .collect();
        let q: Vec<u32> = items.iter().map(|n| n.count as u32).collect();
        let owners: Vec<usize> = items.iter().map(|n| n.request).collect();
        let total: usize = q.iter().map(|&x| x as usize).sum();
        let max_pages = items
            .iter()
            .map(|n| {
                self.state[n.request].samples[n.sample]
                    .len
                    .div_ceil(self.page_size)
            })
            .max()
            .unwrap_or(1);
        let mut slots = vec![0i64; total];
        let mut table = vec![0i32; ids.len() * max_pages];
        let mut ctx = vec![0i32; ids.len()];
        self.mgr(&owners, |s| s.slot_mapping(0, &ids, &q, &mut slots))
            .map_err(|e| format!("slot_mapping: {e}"))?;
        self.mgr(&owners, |s| {
            s.block_tables(0, &ids, max_pages, -1, &mut table, &mut ctx)
        })
        .map_err(|e| format!("block_tables: {e}"))?;
        let mut tokens = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut starts = Vec::with_capacity(ids.len() + 1);
        starts.push(0i32);
        let mut work = Vec::with_capacity(items.len());
        for (
            k,
            &NewTokens {
                request: i,
                sample: b,
                count: qn,
            },
        ) in items.iter().enumerate()
        {
            let len = self.state[i].samples[b].len;
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
                .map(|n| self.tokens_of(n.request, n.sample))
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
        for (k, n) in items.iter().enumerate() {
            let i = n.request;
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
            let pages: usize = self.state[i]
                .samples
                .iter()
                .filter(|s| !s.done)
                .map(|s| s.len.div_ceil(self.page_size))
                .sum();
            let live = self.state[i].samples.iter().filter(|s| !s.done).count();
            if self.available() < pages + self.running_samples() + live {
                break;
            }
            self.swapped.pop_front();
            let ids: Vec<u64> = self.state[i]
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
            for b in 0..self.state[i].samples.len() {
                if !self.state[i].samples[b].done {
                    self.track(i, b);
                }
            }
            self.state[i].phase = Phase::Running;
            self.running.push(i);
        }
        Ok(())
    }

    /// Admits queued requests; returns the new prompt tokens to prefill.
    fn admit(&mut self) -> Result<Vec<NewTokens>, String> {
        let mut items = Vec::new();
        while self.running.len() < self.cfg.concurrency && self.swapped.is_empty() {
            let Some(&i) = self.queue.front() else { break };
            let r = &self.reqs[i];
            let nsamp = r.outputs.len();
            // Which samples to begin: a fresh request (or one preempted before its samples
            // diverged) begins sample 0 and forks the rest after the prefill; a request
            // recomputed after divergence begins each unfinished sample.
            let diverged = self.state[i].samples.iter().any(|s| s.out > 0);
            let begins: Vec<usize> = if diverged {
                (0..nsamp)
                    .filter(|&b| !self.state[i].samples[b].done)
                    .collect()
            } else {
                vec![0]
            };
            // Conservative room check (no prefix hits assumed), keeping one page per running
            // sample for the next decode step.
            let need: usize = begins
                .iter()
                .map(|&b| self.state[i].samples[b].len.div_ceil(self.page_size))
                .sum::<usize>()
                + nsamp;
            if self.available() < need + self.running_samples() {
                break;
            }
            self.queue.pop_front();
            for &b in &begins {
                let toks = self.tokens_of(i, b);
                let seq = self.state[i].samples[b].seq;
                let extra = self.state[i].extra.clone();
                let max_match = toks.len() - 1;
                let info = self
                    .mgr(&[i], |s| s.begin(seq, &toks, extra, max_match, 0))
                    .map_err(|e| format!("begin of {:?}: {e}", self.reqs[i].id))?;
                let st = &mut self.stats[i];
                st.query_tokens += toks.len() as u64;
                st.hit_tokens += info.matched_tokens as u64;
                st.allocated_pages += info.new_pages as u64;
                self.track(i, b);
                self.drain_queued(&[i])?;
                items.push(NewTokens {
                    request: i,
                    sample: b,
                    count: toks.len() - info.matched_tokens,
                });
            }
            if !self.state[i].started {
                self.stats[i].start_ms = self.now;
                self.state[i].started = true;
            }
            self.admitted += 1;
            self.state[i].admitted_order = self.admitted;
            self.state[i].phase = Phase::Running;
            self.state[i].fresh = true;
            self.running.push(i);
        }
        Ok(items)
    }

    /// Forks the unbegun samples of freshly prefilled requests.
    fn forks(&mut self, items: &[NewTokens]) -> Result<(), String> {
        for &NewTokens {
            request: i,
            sample: b,
            ..
        } in items
        {
            if b != 0 || self.state[i].samples.iter().any(|s| s.out > 0) {
                continue;
            }
            let parent = self.state[i].samples[0].seq;
            for c in 1..self.state[i].samples.len() {
                let child = self.state[i].samples[c].seq;
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
        let live: Vec<usize> = (0..self.state[i].samples.len())
            .filter(|&b| !self.state[i].samples[b].done)
            .collect();
        let pages: usize = live
            .iter()
            .map(|&b| self.state[i].samples[b].len.div_ceil(self.page_size))
            .sum();
        let host = self.state_stats();
        let host_free = (host.host_pages_free + host.host_pages_cached) as usize;
        for &b in &live {
            self.ideal.remove(self.state[i].samples[b].seq);
        }
        if pages <= host_free {
            for &b in &live {
                let seq = self.state[i].samples[b].seq;
                let mut c = std::mem::take(&mut self.copies);
                self.mgr(&[i], |s| s.swap_out(seq, &mut c, usize::MAX))
                    .map_err(|e| format!("swap_out of {:?}: {e}", self.reqs[i].id))?;
                self.copies = c;
                self.drain_queued(&[i])?;
                self.copy(&[i])?;
            }
            self.state[i].phase = Phase::Swapped;
            self.swapped.push_back(i);
            self.out.swaps += 1;
        } else {
            for &b in &live {
                let seq = self.state[i].samples[b].seq;
                self.mgr(&[i], |s| s.free(seq))
                    .map_err(|e| format!("free of {:?}: {e}", self.reqs[i].id))?;
            }
            // Samples not begun yet (forked later) restart from the prompt with sample 0.
            if !self.state[i].samples.iter().any(|s| s.out > 0) {
                for s in &mut self.state[i].samples {
                    s.len = self.reqs[i].prompt.len();
                }
            }
            self.state[i].phase = Phase::Queued;
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
                if self.state[i].fresh {
                    continue;
                }
                for (b, s) in self.state[i].samples.iter().enumerate() {
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
                .map(|&(i, b)| self.state[i].samples[b].seq)
                .collect();
            let toks: Vec<i32> = batch
                .iter()
                .map(|&(i, b)| self.reqs[i].outputs[b][self.state[i].samples[b].out])
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
                        .max_by_key(|&i| self.state[i].admitted_order)
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
                        let s = &self.state[i].samples[b];
                        let pages = lock.seq_pages(s.seq, 0).map_err(|e| e.to_string())?;
                        if pages.get(s.len / self.page_size) == Some(&c.dst_page) {
                            self.stats[i].allocated_pages += 1;
                        }
                    }
                }
            }
            self.drain_queued(&owners)?;
            self.copy(&owners)?;
            let mut items = Vec::with_capacity(batch.len());
            for (k, &(i, b)) in batch.iter().enumerate() {
                let s = &mut self.state[i].samples[b];
                if s.len.is_multiple_of(self.page_size) {
                    self.stats[i].allocated_pages += 1;
                }
                s.len += 1;
                s.out += 1;
                let seq = s.seq;
                self.ideal.push(seq, toks[k]);
                items.push(NewTokens {
                    request: i,
                    sample: b,
                    count: 1,
                });
            }
            return self.forward(&items, true);
        }
    }

    /// Frees finished samples and requests.
    fn finish(&mut self) -> Result<(), String> {
        let end = self.now + self.cfg.step_ms;
        let running = self.running.clone();
        for i in running {
            for b in 0..self.state[i].samples.len() {
                let s = &self.state[i].samples[b];
                if s.done || s.out < self.reqs[i].outputs[b].len() {
                    continue;
                }
                let seq = s.seq;
                self.mgr(&[i], |st| st.free(seq))
                    .map_err(|e| format!("free of {:?}: {e}", self.reqs[i].id))?;
                self.ideal.remove(seq);
                self.state[i].samples[b].done = true;
            }
            if self.state[i].samples.iter().all(|s| s.done) {
                self.state[i].phase = Phase::Done;
                self.stats[i].finish_ms = end;
                self.running.retain(|&x| x != i);
                if let Some(n) = self.next_in_session[i] {
                    if self.state[n].phase == Phase::Blocked {
                        self.state[n].phase = Phase::Queued;
                        self.queue.push_back(n);
                    }
                }
            }
        }
        Ok(())
    }

    /// Records the pages in use after step `step` and compares kvshare with the ideal.
    fn record_pages(&mut self, step: u64) -> Result<(), String> {
        let s = self.state_stats();
        let kvshare = s.device_pages_in_use as u32;
        let ideal = self.ideal.pages() as u32;
        let block_entries: u64 = {
            let lock = self.cache.lock().map_err(|e| e.to_string())?;
            let mut n = 0u64;
            for &i in &self.running {
                for smp in &self.state[i].samples {
                    if !smp.done {
                        n += lock.seq_pages(smp.seq, 0).map_err(|e| e.to_string())?.len() as u64;
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
        self.out.per_step.push(StepPages {
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
    let state = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| RequestState {
            phase: Phase::NotArrived,
            samples: (0..r.outputs.len())
                .map(|b| SampleSeq {
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
        page_size: ps,
        cache,
        model,
        ideal: IdealTracker::new(ps),
        state,
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
            per_step: Vec::new(),
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
            sim.state[i].fresh = false;
        }
        sim.swap_ins()?;
        let items = sim.admit()?;
        if sim.running.is_empty() {
            return Err("replay stalled: nothing could be admitted on an empty device".into());
        }
        sim.forward(&items, false)?;
        sim.forks(&items)?;
        sim.decode()?;
        sim.record_pages(step)?;
        sim.finish()?;
        done = sim.state.iter().filter(|s| s.phase == Phase::Done).count();
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
