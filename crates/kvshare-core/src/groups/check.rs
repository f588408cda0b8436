//! The invariant checker of a cache of groups: recomputes every derived fact from the
//! sequences' tables and reports the first disagreement.

use super::super::alloc::try_vec;
use super::super::error::{Error, Result};
use super::super::pool::PageState;
use super::hybrid::{Hybrid, NULL_PAGE};
use super::spec::{GroupKind, StateMode};

fn violation(msg: String) -> Result<()> {
    Err(Error::InvariantViolation(msg))
}

/// No group holds the page (in the per-pool owner arrays).
const NO_GROUP: u32 = u32::MAX;

impl Hybrid {
    /// Verifies: every group's table of a sequence has the same length and covers its tokens;
    /// null entries only form a prefix and only in window and state groups (an "align" state
    /// group: its last position and at most one more live); a "none" state group holds
    /// exactly one page, at the last position; a page is held by the tables
    /// of one group only and registered in at most one group's index, that group's when held;
    /// refcount = holders; every unreferenced page is on exactly one list (the free list only
    /// when registered nowhere); list lengths and counters agree with a recount; every index
    /// entry points at a page registered under it; a held registered page carries the digest of
    /// its position.
    pub fn check(&self) -> Result<()> {
        let ps = self.ps;
        let n = self.cfg.num_pages as usize;
        let mut holders = Vec::with_capacity(self.pools.len());
        let mut owner = Vec::with_capacity(self.pools.len());
        for _ in &self.pools {
            holders.push(try_vec(n, 0u32, "num_pages")?);
            owner.push(try_vec(n, NO_GROUP, "num_pages")?);
        }
        for (&id, s) in &self.seqs {
            let len = s.tables[0].len();
            if len < s.tokens.len().div_ceil(ps) || s.keys.len() > s.tokens.len() / ps {
                return violation(format!(
                    "sequence {id}: {len} pages for {} tokens",
                    s.tokens.len()
                ));
            }
            for (g, t) in s.tables.iter().enumerate() {
                if t.len() != len {
                    return violation(format!(
                        "sequence {id}: group {g} has {} pages, group 0 {len}",
                        t.len()
                    ));
                }
                let nulls = t.iter().take_while(|&&p| p == NULL_PAGE).count();
                let kind = self.cfg.groups[g].kind;
                if kind == GroupKind::State(StateMode::Align) {
                    // The running state at the end, and at most the previous step's page.
                    let live = t.iter().filter(|&&p| p != NULL_PAGE).count();
                    if live > 2 || t.last().is_some_and(|&p| p == NULL_PAGE && live > 0) {
                        return violation(format!(
                            "sequence {id}: state group {g} (mode align) holds {live} pages, not the last one and at most one more"
                        ));
                    }
                } else if t[nulls..].contains(&NULL_PAGE) {
                    return violation(format!(
                        "sequence {id}: group {g} has a null page after a real one"
                    ));
                }
                if nulls > 0 && kind == GroupKind::Full {
                    return violation(format!(
                        "sequence {id}: full-attention group {g} holds the null page"
                    ));
                }
                if kind == GroupKind::State(StateMode::None)
                    && !t.is_empty()
                    && nulls + 1 != t.len()
                {
                    return violation(format!(
                        "sequence {id}: state group {g} (mode none) holds {} pages, not one at the end",
                        t.len() - nulls
                    ));
                }
                let pool = self.pool_of[g];
                for (j, &p) in t.iter().enumerate().skip(nulls) {
                    if p == NULL_PAGE {
                        continue; // align: a released previous state
                    }
                    if self.pools[pool].check_id(p).is_err() {
                        return violation(format!("sequence {id}: group {g}: bad page id {p}"));
                    }
                    let o = &mut owner[pool][p as usize];
                    if *o != NO_GROUP && *o != g as u32 {
                        return violation(format!(
                            "page {p} of pool {pool} held by groups {o} and {g}"
                        ));
                    }
                    *o = g as u32;
                    holders[pool][p as usize] += 1;
                    // Without prefix caching the indices have no pages to ask about.
                    let digest = if self.cfg.enable_prefix_caching {
                        self.indices[g]
                            .hash_of(p)
                            .or(self.dup_of[pool][p as usize].map(|(_, h)| h))
                    } else {
                        None
                    };
                    if let (Some(h), Some(k)) = (digest, s.keys.get(j)) {
                        if h != k.hash {
                            return violation(format!("sequence {id}: group {g} page {p} at {j} is registered under another digest"));
                        }
                    }
                }
            }
        }
        for (g, ix) in self.indices.iter().enumerate() {
            for (h, p) in ix.entries() {
                if ix.hash_of(p) != Some(h) {
                    return violation(format!("group {g}: index entry {h:032x} points at page {p}, not registered under it"));
                }
                let pool = self.pool_of[g];
                let o = owner[pool][p as usize];
                if o != NO_GROUP && o != g as u32 {
                    return violation(format!(
                        "group {g}: registered page {p} is held by group {o}"
                    ));
                }
                if let Some(&other) = self.pool_groups[pool]
                    .iter()
                    .find(|&&x| x != g && self.indices[x].is_registered(p))
                {
                    return violation(format!("page {p} registered in groups {g} and {other}"));
                }
            }
            if ix.registered_count() != ix.len() {
                return violation(format!(
                    "group {g}: registered flags disagree with the index"
                ));
            }
        }
        for (g, dups) in self.dups.iter().enumerate() {
            let pool = self.pool_of[g];
            for (&h, pages) in dups {
                if pages.is_empty() || self.indices[g].find(h).is_none() {
                    return violation(format!(
                        "group {g}: duplicates of {h:032x} without a registered page"
                    ));
                }
                for &p in pages {
                    if self.dup_of[pool][p as usize] != Some((g as u32, h))
                        || self.indices[g].is_registered(p)
                    {
                        return violation(format!(
                            "group {g}: duplicate page {p} is not recorded as one"
                        ));
                    }
                }
            }
        }
        for (pool, marks) in self.dup_of.iter().enumerate() {
            for (p, m) in marks.iter().enumerate() {
                if let Some((g, h)) = *m {
                    let listed = self.dups[g as usize]
                        .get(&h)
                        .is_some_and(|l| l.contains(&(p as u32)));
                    if !listed || self.pool_of[g as usize] != pool {
                        return violation(format!(
                            "pool {pool}: page {p} marked a duplicate of group {g} but not listed"
                        ));
                    }
                }
            }
        }
        for (pi, pool) in self.pools.iter().enumerate() {
            let Some((free, back)) = pool.lists() else {
                return violation(format!("pool {pi}: lists are corrupt"));
            };
            let mut on = try_vec(n, 0u8, "num_pages")?;
            for (m, list) in std::iter::once(&free).chain(back.iter()).enumerate() {
                for &p in list {
                    if on[p as usize] != 0 {
                        return violation(format!("pool {pi}: page {p} on two lists"));
                    }
                    if m > 1 {
                        return violation(format!(
                            "pool {pi}: page {p} on priority list {}",
                            m - 1
                        ));
                    }
                    on[p as usize] = 1 + m as u8;
                }
            }
            let mut in_use = 0;
            for p in 0..pool.num_pages() {
                let i = p as usize;
                let registered = self.cfg.enable_prefix_caching
                    && (self.pool_groups[pi]
                        .iter()
                        .any(|&g| self.indices[g].is_registered(p))
                        || self.dup_of[pi][i].is_some());
                let rc = pool.refcount(p);
                if Some(p) == pool.padding() {
                    if rc != 0 || on[i] != 0 || registered || holders[pi][i] != 0 {
                        return violation(format!(
                            "pool {pi}: null page is in use, listed or registered"
                        ));
                    }
                    continue;
                }
                if rc != holders[pi][i] || pool.ext_refs(p) != 0 || pool.pins(p) != 0 {
                    return violation(format!(
                        "pool {pi}: page {p}: refcount {rc}, {} table holders",
                        holders[pi][i]
                    ));
                }
                match (rc, on[i], pool.state(p)) {
                    (0, 1, PageState::Free) if !registered => {}
                    (0, 2, PageState::Cached) => {}
                    (0, m, st) => {
                        return violation(format!("pool {pi}: page {p} unreferenced, list {m}, {st:?}, registered={registered}"));
                    }
                    (_, 0, PageState::InUse) => in_use += 1,
                    (_, m, _) => {
                        return violation(format!("pool {pi}: page {p} referenced but on list {m}"))
                    }
                }
            }
            if in_use != pool.num_in_use()
                || free.len() != pool.num_free()
                || back[0].len() != pool.num_cached()
                || free.len() + back[0].len() + in_use + 1 != n
            {
                return violation(format!("pool {pi}: counters disagree with a recount"));
            }
        }
        Ok(())
    }
}
