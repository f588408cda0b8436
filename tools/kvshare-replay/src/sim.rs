//! The replay loop: a step-based engine simulation driving the cache manager and the model, for
//! a plain model and for a hybrid model's KV-cache groups alike.
//!
//! Requests are read from their source as the simulated clock reaches their arrival, and a
//! request's state is dropped when it finishes, so memory follows the requests in flight, not
//! the trace (see [`replay_source`]). Each step (one engine iteration, `step_ms` of simulated
//! time; wall time never steers the schedule, so results are deterministic):
//!
//! 1. requests whose `arrival_ms` has passed arrive; a turn whose conversation's previous turn
//!    has not finished waits for it (a chat client sends turn k+1 after reading reply k), then
//!    joins the queue, in the order [`Schedule`](super::requests::Schedule) says;
//! 2. swapped-out requests come back first (`swap_in`, host→device copies);
//! 3. queued requests are admitted while fewer than `concurrency` run and the device has room
//!    (a plain model: room for the whole prompt and a page per running sample, counted without
//!    hits; a cache of groups: `begin` succeeds, as vLLM admits): `begin` matches the longest
//!    cached prefix (at most `prompt - 1` tokens: the engine recomputes the last prompt token
//!    for its logits, as vLLM does) and allocates the rest; the new tokens are prefilled in one
//!    batch (slot mapping → KV write, block tables → attention); a parallel-sampling request
//!    then `fork`s one sequence per extra sample;
//! 4. every request admitted in an earlier step decodes one token per sample (a cache of groups
//!    first releases what each group no longer reads, `release_skipped`): one `append_batch`
//!    (copy-on-write copies executed first), then KV write + attention. When the device is full,
//!    the most recently admitted request is preempted: swapped out if the host tier has room,
//!    else freed and recomputed later (back to the queue's head);
//! 5. pages in use are sampled: kvshare (`device_pages_in_use`), no sharing (every live sample
//!    holding its own copy) and the ideal ([`IdealTracker`]; per group for a cache of groups),
//!    and kvshare is compared with the ideal (a request that appended its last token is still
//!    counted, at its largest);
//! 6. samples that appended their last token are freed; a request finishes with its last sample.
//!
//! With [`ReplayConfig::reference`], the loop also records an [`AccessLog`] and computes the
//! offline reference after the run ([`super::offline`]).
//!
//! Files: this one holds the state and the phases; `run.rs` builds the state, runs one step and
//! returns the outcome; `begin.rs` begins a sequence (with a pool tier: lookup, begin, loads);
//! `launch.rs` and `record.rs` the model's side and the per-step records; `router.rs` several
//! engines on one clock behind a router ([`replay_engines`]).

mod begin;
mod launch;
mod record;
mod router;
mod run;

pub use router::replay_engines;

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use kvshare_core::prefix::{chain_hash, root_hash};
use kvshare_core::{Cache, Error, ExtraKeys, PageCopy, Stats};

use super::config::ReplayConfig;
use super::engines::PoolStore;
use super::ideal::IdealTracker;
use super::model::Model;
use super::offline::AccessLog;
use super::outcome::{Outcome, Progress, RequestStats, StepPages};
use super::requests::{seq_id, Phase, Queue, RequestState, SampleSeq};
use super::source::{RequestSource, VecSource};
use super::trace::Request;

/// New tokens of one sample in a forward launch: the last `count` tokens of sample `sample` of
/// request `request` (a prefill's uncached prompt tokens, or a decode's one token).
#[derive(Debug, Clone, Copy)]
struct NewTokens {
    request: usize,
    sample: usize,
    count: usize,
}

/// A request in flight: arrived and not finished.
struct Live {
    req: Request,
    st: RequestState,
}

/// A conversation seen so far: its order (the trace index of its first turn), its turns, and
/// its latest turn.
struct Session {
    order: usize,
    turns: usize,
    last: usize,
}

/// Points of the memory plot kept at most (pairs are merged by their maximum beyond).
const MAX_POINTS: usize = 8192;

/// The replay in progress.
struct Sim<'a> {
    cfg: &'a ReplayConfig,
    /// Tokens per page.
    page_size: usize,
    cache: Cache,
    model: &'a mut dyn Model,
    ideal: IdealTracker,
    src: &'a mut dyn RequestSource,
    /// The next request of the source, read but not arrived yet.
    pending: Option<Request>,
    /// Requests arrived so far (the next one's trace index).
    arrived: usize,
    live: HashMap<usize, Live>,
    sessions: HashMap<String, Session>,
    queue: Queue,
    swapped: VecDeque<usize>,
    running: Vec<usize>,
    admitted: u64,
    now: f64,
    out: Outcome,
    copies: Vec<PageCopy>,
    done: usize,
    /// Per-page keys are kept (the offline reference, the per-group ideal).
    keyed: bool,
    log: Option<AccessLog>,
    /// Steps merged into each plot point, and the point being merged.
    merge: u64,
    bucket: Option<(StepPages, u64)>,
    scratch: Vec<u8>,
    /// The pool store shared with other engines (None: no pool tier).
    pool: Option<&'a RefCell<PoolStore>>,
    /// Requests finished, in the order they finished (read by a router).
    finished: Vec<usize>,
}

impl Sim<'_> {
    fn lv(&self, i: usize) -> &Live {
        self.live.get(&i).expect("a request in flight")
    }

    fn lv_mut(&mut self, i: usize) -> &mut Live {
        self.live.get_mut(&i).expect("a request in flight")
    }

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
                self.out.requests[o].mgr_ns += share;
                self.out.requests[o].mgr_calls += 1;
            }
        }
        r
    }

    fn state_stats(&self) -> Stats {
        self.cache.lock().expect("cache lock").stats()
    }

    fn available(&self) -> usize {
        let s = self.state_stats();
        (s.device_pages_free + s.device_pages_cached) as usize
    }

    /// Records the room the cache has for cached pages now (the offline reference).
    fn note_room(&mut self) {
        if self.log.is_none() {
            return;
        }
        let s = self.state_stats();
        let room = (s.device_pages_total + s.host_pages_total)
            .saturating_sub(s.device_pages_in_use + s.host_pages_in_use);
        if let Some(log) = &mut self.log {
            log.room(room);
        }
    }

    fn running_samples(&self) -> usize {
        self.running
            .iter()
            .map(|&i| self.lv(i).st.samples.iter().filter(|s| !s.done).count())
            .sum()
    }

    fn tokens_of(&self, i: usize, b: usize) -> Vec<i32> {
        let l = self.lv(i);
        let s = &l.st.samples[b];
        let mut t = Vec::with_capacity(s.len);
        t.extend_from_slice(&l.req.prompt);
        t.extend_from_slice(&l.req.outputs[b][..s.out]);
        t
    }

    /// Extends sample `b` of request `i`'s page keys to its full pages.
    fn extend_keys(&mut self, i: usize, b: usize) {
        if !self.keyed {
            return;
        }
        let ps = self.page_size;
        let toks = self.tokens_of(i, b);
        let mut scratch = std::mem::take(&mut self.scratch);
        let l = self.lv_mut(i);
        let extra = l.st.extra.clone();
        let keys = &mut l.st.samples[b].keys;
        let mut parent = keys.last().copied().unwrap_or_else(root_hash);
        for j in keys.len()..toks.len() / ps {
            let e = extra.as_ref().map_or(0, |x| x.page_digest(j, ps));
            parent = chain_hash(parent, e, &toks[j * ps..(j + 1) * ps], &mut scratch);
            keys.push(parent);
        }
        self.scratch = scratch;
    }

    /// Reads requests whose arrival time has come and queues (or parks) them.
    fn arrivals(&mut self) -> Result<(), String> {
        loop {
            if self.pending.is_none() {
                self.pending = self.src.next_request()?;
            }
            match &self.pending {
                Some(r) if r.arrival_ms <= self.now => {}
                _ => return Ok(()),
            }
            let r = self.pending.take().expect("checked");
            let i = self.arrived;
            self.arrived += 1;
            let (conversation, prev) = match &r.session {
                None => ((i, 1), None),
                Some(s) => {
                    let e = self.sessions.entry(s.clone()).or_insert(Session {
                        order: i,
                        turns: 0,
                        last: usize::MAX,
                    });
                    e.turns += 1;
                    let prev = (e.last != usize::MAX).then_some(e.last);
                    e.last = i;
                    ((e.order, e.turns), prev)
                }
            };
            let ps = self.page_size;
            self.out.requests.push(RequestStats {
                id: r.id.clone(),
                turn: conversation.1,
                samples: r.outputs.len(),
                prompt_tokens: r.prompt.len(),
                output_tokens: r.outputs.iter().map(Vec::len).sum(),
                // In the cache's pages: every group holds its own copy.
                no_reuse_pages: (0..r.outputs.len())
                    .map(|b| r.final_len(b).div_ceil(ps) as u64)
                    .sum::<u64>()
                    * self.cfg.num_groups() as u64,
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
            });
            let waiting = prev.filter(|p| self.live.contains_key(p));
            let st = RequestState {
                phase: if waiting.is_some() {
                    Phase::Blocked
                } else {
                    Phase::Queued
                },
                samples: (0..r.outputs.len())
                    .map(|b| SampleSeq {
                        seq: seq_id(i, b),
                        len: r.prompt.len(),
                        out: 0,
                        done: false,
                        keys: Vec::new(),
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
                next_turn: None,
                conversation,
            };
            match waiting {
                Some(p) => self.lv_mut(p).st.next_turn = Some(i),
                None => self.queue.push(i, conversation),
            }
            self.live.insert(i, Live { req: r, st });
            self.out.peak_live = self.out.peak_live.max(self.live.len() as u64);
        }
    }

    fn track(&mut self, i: usize, b: usize) {
        let toks = self.tokens_of(i, b);
        let l = self.lv(i);
        let (seq, salt, lora) = (l.st.samples[b].seq, l.req.salt.clone(), l.req.lora);
        self.ideal.insert(seq, i as u64, &salt, lora, &toks);
    }

    /// Tries to bring swapped-out requests back, oldest preemption first.
    fn swap_ins(&mut self) -> Result<(), String> {
        while let Some(&i) = self.swapped.front() {
            if self.running.len() >= self.cfg.concurrency {
                break;
            }
            let live: Vec<usize> = (0..self.lv(i).st.samples.len())
                .filter(|&b| !self.lv(i).st.samples[b].done)
                .collect();
            let pages: usize = live
                .iter()
                .map(|&b| self.lv(i).st.samples[b].len.div_ceil(self.page_size))
                .sum::<usize>()
                * self.cfg.num_groups();
            if self.available() < pages + self.running_samples() + live.len() {
                break;
            }
            self.swapped.pop_front();
            for &b in &live {
                let id = self.lv(i).st.samples[b].seq;
                let mut c = std::mem::take(&mut self.copies);
                self.mgr(&[i], |s| s.swap_in(id, &mut c, usize::MAX))
                    .map_err(|e| format!("swap_in of {:?}: {e}", self.lv(i).req.id))?;
                self.out.requests[i].allocated_pages += c.len() as u64;
                self.copies = c;
                self.drain_queued(&[i])?;
                self.copy(&[i])?;
                self.note_room();
            }
            for &b in &live {
                self.track(i, b);
            }
            self.lv_mut(i).st.phase = Phase::Running;
            self.running.push(i);
        }
        Ok(())
    }

    /// Frees sample `b` of request `i`'s sequence.
    fn free_sample(&mut self, i: usize, b: usize) -> Result<(), String> {
        let seq = self.lv(i).st.samples[b].seq;
        self.mgr(&[i], |st| st.free(seq))
            .map_err(|e| format!("free of {:?}: {e}", self.lv(i).req.id))?;
        if let Some(log) = &mut self.log {
            log.free(seq);
        }
        self.note_room();
        Ok(())
    }

    /// Admits queued requests; returns the new prompt tokens to prefill.
    fn admit(&mut self) -> Result<Vec<NewTokens>, String> {
        let mut items = Vec::new();
        while self.running.len() < self.cfg.concurrency && self.swapped.is_empty() {
            let Some(i) = self.queue.front() else { break };
            let nsamp = self.lv(i).req.outputs.len();
            // Which samples to begin: a fresh request (or one preempted before its samples
            // diverged) begins sample 0 and forks the rest after the prefill; a request
            // recomputed after divergence begins each unfinished sample.
            let samples = &self.lv(i).st.samples;
            let diverged = samples.iter().any(|s| s.out > 0);
            let begins: Vec<usize> = if diverged {
                (0..nsamp).filter(|&b| !samples[b].done).collect()
            } else {
                vec![0]
            };
            if self.cfg.groups.is_empty() {
                // Conservative room check (no prefix hits assumed), keeping one page per
                // running sample for the next decode step.
                let need: usize = begins
                    .iter()
                    .map(|&b| samples[b].len.div_ceil(self.page_size))
                    .sum::<usize>()
                    + nsamp;
                if self.available() < need + self.running_samples() {
                    break;
                }
            }
            let mut begun = Vec::with_capacity(begins.len());
            for &b in &begins {
                match self.begin(i, b)? {
                    Some(n) => begun.push(n),
                    None => break,
                }
            }
            if begun.len() < begins.len() {
                // A cache of groups found no room: undo this request's begins, wait.
                for n in begun {
                    self.ideal.remove(self.lv(i).st.samples[n.sample].seq);
                    self.free_sample(i, n.sample)?;
                }
                break;
            }
            items.extend(begun);
            self.queue.pop();
            let now = self.now;
            if !self.lv(i).st.started {
                self.out.requests[i].start_ms = now;
            }
            self.admitted += 1;
            let order = self.admitted;
            let st = &mut self.lv_mut(i).st;
            st.started = true;
            st.admitted_order = order;
            st.phase = Phase::Running;
            st.fresh = true;
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
            if b != 0 || self.lv(i).st.samples.iter().any(|s| s.out > 0) {
                continue;
            }
            let parent = self.lv(i).st.samples[0].seq;
            for c in 1..self.lv(i).st.samples.len() {
                let child = self.lv(i).st.samples[c].seq;
                self.mgr(&[i], |s| s.fork(parent, child))
                    .map_err(|e| format!("fork of {:?}: {e}", self.lv(i).req.id))?;
                if let Some(log) = &mut self.log {
                    log.fork(parent, child);
                }
                let keys = self.lv(i).st.samples[0].keys.clone();
                self.lv_mut(i).st.samples[c].keys = keys;
                self.track(i, c);
            }
        }
        Ok(())
    }

    /// Takes request `i` off the device: swap out if the host has room, else free it for
    /// recomputation (back to the queue's head).
    fn preempt(&mut self, i: usize) -> Result<(), String> {
        self.running.retain(|&x| x != i);
        self.out.requests[i].preemptions += 1;
        let live: Vec<usize> = (0..self.lv(i).st.samples.len())
            .filter(|&b| !self.lv(i).st.samples[b].done)
            .collect();
        let pages: usize = live
            .iter()
            .map(|&b| self.lv(i).st.samples[b].len.div_ceil(self.page_size))
            .sum::<usize>()
            * self.cfg.num_groups();
        let host = self.state_stats();
        let host_free = (host.host_pages_free + host.host_pages_cached) as usize;
        for &b in &live {
            self.ideal.remove(self.lv(i).st.samples[b].seq);
        }
        if pages <= host_free {
            for &b in &live {
                let seq = self.lv(i).st.samples[b].seq;
                let mut c = std::mem::take(&mut self.copies);
                self.mgr(&[i], |s| s.swap_out(seq, &mut c, usize::MAX))
                    .map_err(|e| format!("swap_out of {:?}: {e}", self.lv(i).req.id))?;
                self.copies = c;
                self.drain_queued(&[i])?;
                self.copy(&[i])?;
                self.note_room();
            }
            self.lv_mut(i).st.phase = Phase::Swapped;
            self.swapped.push_back(i);
            self.out.swaps += 1;
        } else {
            for &b in &live {
                self.free_sample(i, b)?;
            }
            // Samples not begun yet (forked later) restart from the prompt with sample 0.
            let l = self.lv_mut(i);
            if !l.st.samples.iter().any(|s| s.out > 0) {
                let n = l.req.prompt.len();
                for s in &mut l.st.samples {
                    s.len = n;
                }
            }
            l.st.phase = Phase::Queued;
            self.queue.push_head(i);
            self.out.recomputes += 1;
        }
        Ok(())
    }

    /// One decode step for the requests admitted before this step.
    fn decode(&mut self) -> Result<(), String> {
        loop {
            let mut batch: Vec<(usize, usize)> = Vec::new();
            for &i in &self.running {
                let l = self.lv(i);
                if l.st.fresh {
                    continue;
                }
                for (b, s) in l.st.samples.iter().enumerate() {
                    if !s.done && s.out < l.req.outputs[b].len() {
                        batch.push((i, b));
                    }
                }
            }
            if batch.is_empty() {
                return Ok(());
            }
            let ids: Vec<u64> = batch
                .iter()
                .map(|&(i, b)| self.lv(i).st.samples[b].seq)
                .collect();
            let toks: Vec<i32> = batch
                .iter()
                .map(|&(i, b)| {
                    let l = self.lv(i);
                    l.req.outputs[b][l.st.samples[b].out]
                })
                .collect();
            let owners: Vec<usize> = batch.iter().map(|&(i, _)| i).collect();
            if !self.cfg.groups.is_empty() {
                // Each group lets go of the pages it no longer reads before the step.
                for &(i, b) in &batch {
                    let s = &self.lv(i).st.samples[b];
                    let (seq, len) = (s.seq, s.len);
                    self.mgr(&[i], |st| st.release_skipped(seq, len))
                        .map_err(|e| format!("release_skipped: {e}"))?;
                }
            }
            // One copy-on-write copy per sample and group at most (a forked sample's shared
            // last page, in every group that holds it).
            let max_copies = ids.len() * self.cfg.num_groups();
            let mut c = std::mem::take(&mut self.copies);
            let r = self.mgr(&owners, |s| s.append_batch(&ids, &toks, &mut c, max_copies));
            self.copies = c;
            match r {
                Ok(()) => {}
                Err(Error::NoSpace { .. }) => {
                    let victim = self
                        .running
                        .iter()
                        .copied()
                        .max_by_key(|&i| self.lv(i).st.admitted_order)
                        .expect("a running request");
                    if self.running.len() == 1 {
                        return Err(format!(
                            "request {:?} cannot continue alone on {} device pages",
                            self.lv(victim).req.id,
                            self.cfg.device_pages
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
                // Pages are counted in group 0 (as the new pages below).
                for c in self.copies.iter().filter(|c| c.group == 0) {
                    for &(i, b) in &batch {
                        let s = &self.live[&i].st.samples[b];
                        let pages = lock.seq_pages(s.seq, 0).map_err(|e| e.to_string())?;
                        if pages.get(s.len / self.page_size) == Some(&c.dst_page) {
                            self.out.requests[i].allocated_pages += 1;
                        }
                    }
                }
            }
            self.drain_queued(&owners)?;
            self.copy(&owners)?;
            let mut items = Vec::with_capacity(batch.len());
            let mut filled = Vec::new();
            for (k, &(i, b)) in batch.iter().enumerate() {
                let ps = self.page_size;
                let s = &mut self.lv_mut(i).st.samples[b];
                let new_page = s.len.is_multiple_of(ps);
                s.len += 1;
                s.out += 1;
                let (seq, full) = (s.seq, s.len.is_multiple_of(ps));
                if new_page {
                    self.out.requests[i].allocated_pages += 1;
                }
                if full {
                    filled.push((i, b));
                }
                self.ideal.push(seq, toks[k]);
                items.push(NewTokens {
                    request: i,
                    sample: b,
                    count: 1,
                });
            }
            for (i, b) in filled {
                self.extend_keys(i, b);
                if let Some(log) = &mut self.log {
                    let s = &self.live[&i].st.samples[b];
                    log.fill(s.seq, *s.keys.last().expect("a full page"));
                }
            }
            self.note_room();
            return self.forward(&items, true);
        }
    }

    /// Frees finished samples and requests.
    fn finish(&mut self) -> Result<(), String> {
        let end = self.now + self.cfg.step_ms;
        let running = self.running.clone();
        for i in running {
            for b in 0..self.lv(i).st.samples.len() {
                let l = self.lv(i);
                let s = &l.st.samples[b];
                if s.done || s.out < l.req.outputs[b].len() {
                    continue;
                }
                let seq = s.seq;
                self.free_sample(i, b)?;
                self.ideal.remove(seq);
                self.lv_mut(i).st.samples[b].done = true;
            }
            if self.lv(i).st.samples.iter().all(|s| s.done) {
                self.out.requests[i].finish_ms = end;
                self.running.retain(|&x| x != i);
                let l = self.live.remove(&i).expect("running");
                self.done += 1;
                self.finished.push(i);
                if let Some(n) = l.st.next_turn {
                    let nl = self.lv_mut(n);
                    if nl.st.phase == Phase::Blocked {
                        nl.st.phase = Phase::Queued;
                        let conv = nl.st.conversation;
                        self.queue.push(n, conv);
                    }
                }
            }
        }
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
    replay_source(&mut VecSource::new(reqs), cfg, model, progress)
}

/// Replays the requests of `src` (in arrival order, read as the simulated clock reaches them)
/// on a fresh cache, running `model` for every step, and calls `progress` after every step.
///
/// Memory: the requests in flight (arrived and not finished: their tokens, sequences and the
/// ideal's pages), about 150 bytes per request for the per-request report, at most 8,192 plot
/// points (`MAX_POINTS`); with [`ReplayConfig::reference`], the access log (about 4 bytes per
/// page a `begin` covers, 24 per other event, 36 per distinct page). Each step costs time in
/// the requests in flight, not in the trace.
pub fn replay_source(
    src: &mut dyn RequestSource,
    cfg: &ReplayConfig,
    model: &mut dyn Model,
    progress: &mut dyn FnMut(Progress),
) -> Result<Outcome, String> {
    let wall = Instant::now();
    src.check_fits(cfg)?;
    let total = src.len();
    let mut sim = Sim::new(cfg, model, src, None)?;
    let mut step = 0u64;
    while sim.done < total {
        sim.arrivals()?;
        if sim.idle() {
            // Idle: jump to the next arrival.
            match &sim.pending {
                Some(r) => {
                    sim.now = sim.now.max(r.arrival_ms);
                    continue;
                }
                None => return Err("replay stalled: requests blocked with nothing running".into()),
            }
        }
        sim.step(step)?;
        sim.now += cfg.step_ms;
        step += 1;
        progress(Progress {
            done: sim.done,
            total,
            step,
        });
    }
    sim.into_outcome(step, wall)
}
