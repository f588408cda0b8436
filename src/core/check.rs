//! The invariant checker behind `kvs_cache_check`: recomputes every derived fact from first
//! principles and reports the first disagreement.

use super::config::Tier;
use super::error::{Error, Result};
use super::pool::{PagePool, PageState};
use super::state::State;

fn violation(msg: String) -> Result<()> {
    Err(Error::InvariantViolation(msg))
}

impl State {
    /// Verifies: refcount = sequence holders + external holders for every page; each page is on
    /// exactly the list its state says (free / cached-LRU / none when in use); cached ⇔
    /// registered for unreferenced pages; list lengths and counters agree with a full recount;
    /// free + cached + in use = usable pages; every index entry points at a page registered under
    /// that digest; every sequence's pages are valid and cover its tokens.
    pub fn check(&self) -> Result<()> {
        let ps = self.ps;
        let mut holders = [
            vec![0u32; self.dev.num_pages() as usize],
            vec![0u32; self.host.num_pages() as usize],
        ];
        for (&id, s) in &self.seqs {
            let t = match s.tier {
                Tier::Device => 0,
                Tier::Host => 1,
            };
            let pool = self.pool(s.tier);
            if s.pages.len() < s.tokens.len().div_ceil(ps) {
                return violation(format!(
                    "sequence {id}: {} pages cannot hold {} tokens",
                    s.pages.len(),
                    s.tokens.len()
                ));
            }
            if s.hashes.len() > s.tokens.len() / ps {
                return violation(format!("sequence {id}: more page digests than full pages"));
            }
            for &p in &s.pages {
                if pool.check_id(p).is_err() {
                    return violation(format!("sequence {id}: bad {} page id {p}", s.tier));
                }
                holders[t][p as usize] += 1;
            }
        }
        self.check_pool(&self.dev, &holders[0])?;
        self.check_pool(&self.host, &holders[1])?;

        if self.cfg.enable_prefix_caching {
            for (h, p) in self.index.entries() {
                if self.dev.check_id(p).is_err() || self.index.hash_of(p) != Some(h) {
                    return violation(format!(
                        "index entry {h:032x} points at page {p}, which is not registered under it"
                    ));
                }
            }
            if self.index.registered_count() != self.index.len() {
                return violation(format!(
                    "{} pages flagged registered but the index has {} entries",
                    self.index.registered_count(),
                    self.index.len()
                ));
            }
        } else if !self.index.is_empty() {
            return violation("prefix caching is off but the index has entries".into());
        }
        for &id in &self.pending {
            if let Some(s) = self.seqs.get(&id) {
                if !s.pending {
                    return violation(format!(
                        "sequence {id} queued for commit but not flagged pending"
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_pool(&self, pool: &PagePool, seq_holders: &[u32]) -> Result<()> {
        let tier = pool.tier();
        let Some((free, cached)) = pool.lists() else {
            return violation(format!("{tier} page lists are corrupt"));
        };
        let mut on = vec![0u8; pool.num_pages() as usize];
        for &p in &free {
            on[p as usize] |= 1;
        }
        for &p in &cached {
            on[p as usize] |= 2;
        }
        let (mut n_in_use, mut n_shared) = (0usize, 0usize);
        for p in 0..pool.num_pages() {
            let i = p as usize;
            let rc = pool.refcount(p);
            let registered = tier == Tier::Device && self.is_registered(p);
            if Some(p) == pool.padding() {
                if rc != 0 || on[i] != 0 || registered || seq_holders[i] != 0 {
                    return violation(format!("padding page {p} is in use, listed or registered"));
                }
                continue;
            }
            let expect = seq_holders[i] + pool.ext_refs(p);
            if rc != expect {
                return violation(format!(
                    "{tier} page {p}: refcount {rc} but {} sequence holders + {} external holders",
                    seq_holders[i],
                    pool.ext_refs(p)
                ));
            }
            let state = pool.state(p);
            match (rc, on[i]) {
                (0, 1) if !registered && state == PageState::Free => {}
                (0, 2) if registered && state == PageState::Cached => {}
                (0, _) => {
                    return violation(format!(
                        "{tier} page {p}: unreferenced, registered={registered}, list mask {}, state {state:?}",
                        on[i]
                    ))
                }
                (_, 0) if state == PageState::InUse => {
                    n_in_use += 1;
                    if rc > 1 {
                        n_shared += 1;
                    }
                }
                _ => return violation(format!("{tier} page {p}: refcount {rc} but on a list (mask {})", on[i])),
            }
        }
        if n_in_use != pool.num_in_use() || n_shared != pool.num_shared() {
            return violation(format!(
                "{tier} counters: in use {} / shared {} recorded, {n_in_use} / {n_shared} counted",
                pool.num_in_use(),
                pool.num_shared()
            ));
        }
        let usable = self.cfg.usable_pages(tier) as usize;
        if free.len() + cached.len() + n_in_use != usable {
            return violation(format!(
                "{tier}: free {} + cached {} + in use {n_in_use} != usable {usable}",
                free.len(),
                cached.len()
            ));
        }
        if free.len() != pool.num_free() || cached.len() != pool.num_cached() {
            return violation(format!(
                "{tier}: list length counters disagree with the lists"
            ));
        }
        Ok(())
    }
}
