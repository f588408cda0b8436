//! Several engines on one clock behind a router (see [`crate::engines`]). Each engine is a
//! [`Sim`] whose request source is its own queue, filled by the router; each step the router
//! first sends the held turns whose previous turn finished (in the order those finished), then
//! the requests that arrived, and every engine with work runs one step.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use kvshare_core::ExtraKeys;

use super::Sim;
use crate::config::ReplayConfig;
use crate::engines::{Engines, EnginesOutcome, PoolStore, Route};
use crate::model::NoModel;
use crate::outcome::Progress;
use crate::source::{RequestSource, Sizes};
use crate::trace::Request;

/// An engine's requests, as the router sends them.
struct Feed<'q> {
    q: &'q RefCell<VecDeque<Request>>,
}

impl RequestSource for Feed<'_> {
    fn sizes(&self) -> Sizes {
        Sizes::default()
    }
    fn len(&self) -> usize {
        self.q.borrow().len()
    }
    fn next_request(&mut self) -> Result<Option<Request>, String> {
        Ok(self.q.borrow_mut().pop_front())
    }
    fn rewind(&mut self) -> Result<(), String> {
        Err("an engine's requests come from the router once".into())
    }
    fn check_fits(&self, _cfg: &ReplayConfig) -> Result<(), String> {
        Ok(())
    }
}

/// The router's state.
struct Router {
    route: Route,
    /// Requests sent so far (round-robin's counter).
    sent: usize,
    /// Conversations seen so far (session routing's counter) and their engine.
    session_engine: HashMap<String, usize>,
    /// Each conversation's latest turn sent: (engine, the engine's index of it).
    last_turn: HashMap<String, (usize, usize)>,
    /// The conversation of each turn in flight, by (engine, index).
    session_of: HashMap<(usize, usize), String>,
    /// Turns waiting for their conversation's previous turn, oldest first.
    held: HashMap<String, VecDeque<Request>>,
    /// Requests sent to each engine.
    per_engine: Vec<usize>,
}

fn extra(r: &Request) -> Option<ExtraKeys> {
    (!r.salt.is_empty() || r.lora != 0).then(|| ExtraKeys {
        lora_id: r.lora,
        salt: r.salt.as_bytes().to_vec(),
        mm: Vec::new(),
    })
}

/// The tokens a request puts through its engine: its prompt and every sample's output.
fn work(r: &Request) -> usize {
    r.prompt.len() + r.outputs.iter().map(Vec::len).sum::<usize>()
}

impl Router {
    /// Whether request `i` of engine `e` has been sent and not finished.
    fn in_flight(sims: &[Sim<'_>], (e, i): (usize, usize)) -> bool {
        i >= sims[e].arrived || sims[e].live.contains_key(&i)
    }

    /// The engine for `r` now.
    fn pick(
        &mut self,
        sims: &[Sim<'_>],
        feeds: &[RefCell<VecDeque<Request>>],
        r: &Request,
    ) -> usize {
        let n = sims.len();
        match (self.route, &r.session) {
            (Route::Session, Some(s)) => {
                let next = self.session_engine.len() % n;
                *self.session_engine.entry(s.clone()).or_insert(next)
            }
            (Route::RoundRobin | Route::Session, _) => self.sent % n,
            (Route::KvAware, _) => {
                // The engine with the least work for it: the prompt tokens it would compute
                // (those past its cached prefix) plus the tokens of the requests it has in
                // flight or queued, as KV-aware routers weigh prefix hits against load.
                let x = extra(r);
                let max = r.prompt.len().saturating_sub(1);
                let mut best = (usize::MAX, 0usize);
                for (e, sim) in sims.iter().enumerate() {
                    let cached = sim
                        .cache
                        .lock()
                        .map(|mut s| s.cached_prefix_tokens(&r.prompt, x.as_ref(), max))
                        .unwrap_or(0);
                    let load: usize = sim.live.values().map(|l| work(&l.req)).sum::<usize>()
                        + feeds[e].borrow().iter().map(work).sum::<usize>();
                    let cost = r.prompt.len() - cached + load;
                    if cost < best.0 {
                        best = (cost, e);
                    }
                }
                best.1
            }
        }
    }

    fn send(&mut self, sims: &[Sim<'_>], feeds: &[RefCell<VecDeque<Request>>], r: Request) {
        let e = self.pick(sims, feeds, &r);
        let i = self.per_engine[e];
        self.per_engine[e] += 1;
        self.sent += 1;
        if let Some(s) = &r.session {
            self.last_turn.insert(s.clone(), (e, i));
            self.session_of.insert((e, i), s.clone());
        }
        feeds[e].borrow_mut().push_back(r);
    }

    /// Sends `r` now, or holds it while its conversation has a turn in flight or held.
    fn arrive(&mut self, sims: &[Sim<'_>], feeds: &[RefCell<VecDeque<Request>>], r: Request) {
        if let Some(s) = &r.session {
            let waiting = self.held.get(s).is_some_and(|q| !q.is_empty())
                || self
                    .last_turn
                    .get(s)
                    .is_some_and(|&t| Self::in_flight(sims, t));
            if waiting {
                self.held.entry(s.clone()).or_default().push_back(r);
                return;
            }
        }
        self.send(sims, feeds, r);
    }

    /// Sends the held turns whose previous turn finished, in the order those finished.
    fn release(&mut self, sims: &mut [Sim<'_>], feeds: &[RefCell<VecDeque<Request>>]) {
        let mut finished = Vec::new();
        for (e, sim) in sims.iter_mut().enumerate() {
            finished.extend(sim.finished.drain(..).map(|i| (e, i)));
        }
        for t in finished {
            let Some(s) = self.session_of.remove(&t) else {
                continue;
            };
            if self.last_turn.get(&s) != Some(&t) {
                continue;
            }
            if let Some(r) = self.held.get_mut(&s).and_then(VecDeque::pop_front) {
                self.send(sims, feeds, r);
            }
        }
    }
}

/// Replays the requests of `src` on `set.engines` engines of `cfg` (the cache manager alone)
/// behind `set.route`, with a pool of `set.pool_pages` entries when above 0; `progress` after
/// every step of the shared clock.
pub fn replay_engines(
    src: &mut dyn RequestSource,
    cfg: &ReplayConfig,
    set: &Engines,
    progress: &mut dyn FnMut(Progress),
) -> Result<EnginesOutcome, String> {
    let wall = Instant::now();
    let n = set.engines;
    if n == 0 {
        return Err("engines must be at least 1".into());
    }
    if !cfg.groups.is_empty() {
        return Err("several engines run a plain model only (no KV-cache groups)".into());
    }
    src.check_fits(cfg)?;
    let total = src.len();
    let cfg = ReplayConfig {
        reference: false,
        ..cfg.clone()
    };
    let store = RefCell::new(PoolStore::new(set.pool_pages));
    let pool = (set.pool_pages > 0).then_some(&store);
    let feeds: Vec<RefCell<VecDeque<Request>>> =
        (0..n).map(|_| RefCell::new(VecDeque::new())).collect();
    let mut handles: Vec<Feed<'_>> = feeds.iter().map(|q| Feed { q }).collect();
    let mut models = vec![NoModel; n];
    let mut sims = handles
        .iter_mut()
        .zip(models.iter_mut())
        .map(|(h, m)| Sim::new(&cfg, m, h, pool))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("engine cache: {e}"))?;
    let mut router = Router {
        route: set.route,
        sent: 0,
        session_engine: HashMap::new(),
        last_turn: HashMap::new(),
        session_of: HashMap::new(),
        held: HashMap::new(),
        per_engine: vec![0; n],
    };
    let mut next: Option<Request> = None;
    let (mut now, mut step) = (0.0f64, 0u64);
    loop {
        let done: usize = sims.iter().map(|s| s.done).sum();
        if done >= total {
            break;
        }
        router.release(&mut sims, &feeds);
        loop {
            if next.is_none() {
                next = src.next_request()?;
            }
            match next.take() {
                Some(r) if r.arrival_ms <= now => router.arrive(&sims, &feeds, r),
                other => {
                    next = other;
                    break;
                }
            }
        }
        for s in sims.iter_mut() {
            s.now = now;
            s.arrivals()?;
        }
        if sims.iter().all(Sim::idle) {
            // Idle: jump to the next arrival.
            match &next {
                Some(r) => {
                    now = now.max(r.arrival_ms);
                    continue;
                }
                None => return Err("replay stalled: requests held with nothing running".into()),
            }
        }
        for s in sims.iter_mut().filter(|s| !s.idle()) {
            s.step(step)?;
        }
        now += cfg.step_ms;
        step += 1;
        progress(Progress {
            done: sims.iter().map(|s| s.done).sum(),
            total,
            step,
        });
    }
    let mut engines = Vec::with_capacity(n);
    for mut s in sims {
        s.now = now;
        engines.push(s.into_outcome(step, wall)?);
    }
    let stats = store.borrow().stats;
    Ok(EnginesOutcome {
        set: *set,
        engines,
        store: stats,
        steps: step,
        sim_ms: now,
    })
}
