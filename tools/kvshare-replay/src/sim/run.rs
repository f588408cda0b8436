//! A replay's state from its settings, one engine step, and the outcome at the end: what the
//! single-engine replay ([`super::replay_source`]) and the engines behind a router
//! ([`super::replay_engines`]) share.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use kvshare_core::{Cache, GroupKind};

use super::Sim;
use crate::config::ReplayConfig;
use crate::engines::PoolStore;
use crate::ideal::IdealTracker;
use crate::model::Model;
use crate::offline::{simulate, AccessLog, Rule};
use crate::outcome::{Outcome, Reference};
use crate::requests::Queue;
use crate::source::RequestSource;

impl<'a> Sim<'a> {
    /// A fresh cache and no request yet; `pool`: the store this engine's pool tier reads and
    /// writes (the cache config must then name a pool tier).
    pub(super) fn new(
        cfg: &'a ReplayConfig,
        model: &'a mut dyn Model,
        src: &'a mut dyn RequestSource,
        pool: Option<&'a RefCell<PoolStore>>,
    ) -> Result<Self, String> {
        if cfg.concurrency == 0 {
            return Err("concurrency must be at least 1".into());
        }
        if !(cfg.step_ms.is_finite() && cfg.step_ms > 0.0) {
            return Err("step_ms must be a positive number".into());
        }
        let mut cc = cfg.cache_config();
        if pool.is_some() {
            cc.pool = Some(crate::engines::pool_config());
        }
        let cache = Cache::new(cc).map_err(|e| e.to_string())?;
        let final_stats = cache.lock().map_err(|e| e.to_string())?.stats();
        let kinds = if cfg.groups.is_empty() {
            vec![GroupKind::Full]
        } else {
            cfg.groups.clone()
        };
        let reference = cfg.reference && cfg.reference_applies();
        Ok(Sim {
            cfg,
            page_size: cfg.page_size as usize,
            cache,
            model,
            ideal: IdealTracker::new(cfg.page_size as usize),
            src,
            pending: None,
            arrived: 0,
            live: HashMap::new(),
            sessions: HashMap::new(),
            queue: Queue::new(cfg.schedule),
            swapped: VecDeque::new(),
            running: Vec::new(),
            admitted: 0,
            now: 0.0,
            out: Outcome::new(final_stats, &kinds),
            copies: Vec::new(),
            done: 0,
            keyed: reference || !cfg.groups.is_empty(),
            log: reference.then(|| AccessLog::new(cfg.page_size)),
            merge: 1,
            bucket: None,
            scratch: Vec::new(),
            pool,
            finished: Vec::new(),
        })
    }

    /// Nothing running, queued or swapped out.
    pub(super) fn idle(&self) -> bool {
        self.running.is_empty() && self.queue.is_empty() && self.swapped.is_empty()
    }

    /// One engine step after this step's arrivals (see the module doc of [`super`]).
    pub(super) fn step(&mut self, step: u64) -> Result<(), String> {
        for &i in &self.running {
            self.live.get_mut(&i).expect("running").st.fresh = false;
        }
        if !self.cfg.groups.is_empty() {
            // States registered last step become matchable (vLLM's new_step_starts).
            self.mgr(&[], |s| {
                s.new_step();
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        }
        self.swap_ins()?;
        let items = self.admit()?;
        if self.running.is_empty() {
            return Err("replay stalled: nothing could be admitted on an empty device".into());
        }
        self.forward(&items, false)?;
        self.forks(&items)?;
        self.decode()?;
        self.record_pages(step)?;
        self.finish()?;
        if let Some(store) = self.pool {
            // The step's KV is written: the pages registered in it go to the pool.
            self.mgr(&[], |s| {
                s.commit();
                super::begin::run_pool_work(s, store)
            })
            .map_err(|e| format!("pool stores: {e}"))?;
        }
        Ok(())
    }

    /// What the replay reports, after `steps` steps begun at `wall`.
    pub(super) fn into_outcome(mut self, steps: u64, wall: Instant) -> Result<Outcome, String> {
        if let Some((b, _)) = self.bucket.take() {
            self.out.per_step.push(b);
        }
        let mut out = self.out;
        out.final_stats = self.cache.lock().map_err(|e| e.to_string())?.stats();
        out.steps = steps;
        out.sim_ms = self.now;
        out.wall_ns = wall.elapsed().as_nanos() as u64;
        if let Some(log) = self.log {
            let best = simulate(&log, Rule::Belady);
            let lru = simulate(&log, Rule::Lru);
            out.reference = Some(Reference {
                hit_tokens: best.tokens,
                hit_pages: best.pages,
                evictions: best.evictions,
                lru_model_hit_tokens: lru.tokens,
                events: log.len() as u64,
                distinct_pages: log.distinct_pages() as u64,
                log_bytes: log.bytes() as u64,
            });
        }
        Ok(out)
    }
}
