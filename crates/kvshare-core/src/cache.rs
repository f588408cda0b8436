//! [`Cache`]: the thread-safe cache manager every adapter uses (one lock around [`State`]).
//!
//! Every call does a batch of work under one short critical section, so a scheduler thread and
//! worker threads can share one cache. A panic while the lock is held poisons the cache: later
//! calls fail with [`Error::Poisoned`] instead of trusting broken invariants.

use std::sync::{Mutex, MutexGuard};

use super::config::Config;
use super::error::{Error, Result};
use super::state::State;

/// A KV-cache manager. `Send + Sync`; share it with `Arc` or by reference.
#[derive(Debug)]
pub struct Cache {
    state: Mutex<State>,
    cfg: Config,
}

impl Cache {
    /// Validates `cfg` and builds an empty cache.
    pub fn new(cfg: Config) -> Result<Self> {
        Ok(Cache {
            state: Mutex::new(State::new(cfg.clone())?),
            cfg,
        })
    }

    /// The configuration (immutable after creation, readable without the lock).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Locks the state for a batch of operations.
    pub fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| Error::Poisoned)
    }

    /// Runs `f` on the locked state.
    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let mut guard = self.lock()?;
        f(&mut guard)
    }
}
