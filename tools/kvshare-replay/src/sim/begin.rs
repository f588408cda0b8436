//! Beginning a sample's sequence: the prefix hit (device, host and, with a pool tier, the pool),
//! the tokens left to prefill, and the pool tier's transfers against the shared store.
//!
//! With a pool, a begin is the pool tier's two steps back to back: `pool_lookup` (the keys of
//! the prompt's full pages after the local hit), the store's answer, `begin_pooled` with it,
//! then every load the cache hands out, each reported done at once when the store still holds
//! its key (the simulated clock does not advance within a step, so a load never waits).

use std::cell::RefCell;

use kvshare_core::{BeginInfo, Error, PoolAnswer, PoolOp, State};

use super::{NewTokens, Sim};
use crate::engines::PoolStore;

/// Runs every transfer the cache hands out against `store`: a load succeeds when the store
/// holds its key, a store writes its key.
pub(super) fn run_pool_work(s: &mut State, store: &RefCell<PoolStore>) -> Result<(), Error> {
    for w in s.take_pool_work(usize::MAX) {
        let ok = match w.op {
            PoolOp::Load => store.borrow_mut().get(&w.key),
            PoolOp::Store => {
                store.borrow_mut().put(w.key);
                true
            }
        };
        s.pool_done(w.ticket, ok)?;
    }
    Ok(())
}

impl Sim<'_> {
    /// Begins sample `b` of request `i`; `Ok(None)` when a cache of groups has no room.
    pub(super) fn begin(&mut self, i: usize, b: usize) -> Result<Option<NewTokens>, String> {
        let toks = self.tokens_of(i, b);
        let seq = self.lv(i).st.samples[b].seq;
        let extra = self.lv(i).st.extra.clone();
        let max_match = toks.len() - 1;
        let pool = self.pool;
        let r = self.mgr(&[i], |s| match pool {
            None => s.begin(seq, &toks, extra, max_match, 0),
            Some(store) => {
                let look = s.pool_lookup(&toks, extra.as_ref(), max_match, usize::MAX)?;
                let hits: Vec<bool> = {
                    let st = store.borrow();
                    look.keys.iter().map(|k| st.contains(&k.key)).collect()
                };
                let answer = PoolAnswer {
                    first_page: look.first_page,
                    hits: &hits,
                };
                let info = s.begin_pooled(seq, &toks, extra, max_match, 0, Some(answer))?;
                run_pool_work(s, store)?;
                // Settled: the match ends before the first load that failed.
                let matched = s.seq_info(seq)?.matched_tokens;
                Ok(BeginInfo {
                    matched_tokens: matched,
                    ..info
                })
            }
        });
        let info = match r {
            Ok(info) => info,
            Err(Error::NoSpace { .. }) if !self.cfg.groups.is_empty() => return Ok(None),
            Err(e) => return Err(format!("begin of {:?}: {e}", self.lv(i).req.id)),
        };
        // The hit by tier: the pool's positions follow the local hit; promoted pages were on
        // the host; the rest were on the device.
        let ps = self.page_size;
        let pool_tokens = (info.pool_pages * ps).min(info.matched_tokens);
        let host_tokens = (info.promoted_pages * ps).min(info.matched_tokens - pool_tokens);
        self.out.pool_hit_tokens += pool_tokens as u64;
        self.out.host_hit_tokens += host_tokens as u64;
        let st = &mut self.out.requests[i];
        st.query_tokens += toks.len() as u64;
        st.hit_tokens += info.matched_tokens as u64;
        st.allocated_pages += info.new_pages as u64;
        self.track(i, b);
        self.drain_queued(&[i])?;
        self.extend_keys(i, b);
        if self.log.is_some() {
            let walk = if self.cfg.skip_cached_writes {
                toks.len() / ps
            } else {
                max_match.min(toks.len()) / ps
            };
            let keys = self.lv(i).st.samples[b].keys[..toks.len() / ps].to_vec();
            if let Some(log) = &mut self.log {
                log.begin(seq, &keys, walk, max_match);
            }
            self.note_room();
        }
        Ok(Some(NewTokens {
            request: i,
            sample: b,
            count: toks.len() - info.matched_tokens,
        }))
    }
}
