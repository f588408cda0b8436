//! Appends: one sequence's tokens (`append`, `append_pages`), one decode step of a batch
//! (`append_batch`), and the capacity query (`append_need`). An append replaces a shared page it
//! writes by a private copy first (copy-on-write), grows every group's table by its rules, and
//! registers the pages that filled up.

use super::config::MAX_GROUPS;
use super::copies::{CopyKind, PageCopy};
use super::error::{Error, Result};
use super::pool::Holder;
use super::seq::{AppendNeed, Seq};
use super::sequences::check_room;
use super::state::{Release, State, NULL_PAGE};
use super::tier::Tier;

/// Per-pool page counts (pools are at most the groups), kept on the stack: an append is the
/// hottest call, and most caches have one pool.
type PoolCounts = [usize; MAX_GROUPS];

/// What an append would take: per pool, new capacity plus copy-on-write replacements, the
/// copies it would report, and the pages an align state group releases first.
#[derive(Debug)]
struct AppendPlan {
    need: PoolCounts,
    copies: usize,
    /// Align groups whose stale state page goes first (bit `g` for group `g`).
    stale: u32,
    /// Per pool: pages those releases give back.
    back: PoolCounts,
}

impl Default for AppendPlan {
    fn default() -> Self {
        AppendPlan {
            need: [0; MAX_GROUPS],
            copies: 0,
            stale: 0,
            back: [0; MAX_GROUPS],
        }
    }
}

/// The groups of a bit set, lowest first.
fn groups_of(mask: u32) -> impl Iterator<Item = usize> {
    (0..MAX_GROUPS).filter(move |g| mask & (1 << g) != 0)
}

impl State {
    /// What an append of `n` tokens (plus `lookahead` reserved slots) to `s` takes.
    fn append_plan(&self, s: &Seq, n: usize, lookahead: usize) -> Result<AppendPlan> {
        self.check_lookahead(lookahead)?;
        let ps = self.ps;
        let old = s.tokens.len();
        let slots = old
            .checked_add(n)
            .ok_or_else(|| Error::arg("num_tokens", format!("{old} + {n} tokens overflow")))?
            .checked_add(lookahead)
            .ok_or_else(|| {
                Error::arg(
                    "lookahead_slots",
                    format!("{old} + {n} tokens + {lookahead} slots overflow"),
                )
            })?;
        let want = slots.div_ceil(ps);
        let mut plan = AppendPlan::default();
        for (g, t) in s.tables.iter().enumerate() {
            let grp = &self.groups[g];
            let dev = &self.pools[grp.pool].device;
            let grows = grp.rules.grow_pages(t, want);
            plan.need[grp.pool] += grows;
            if grows > 0 {
                // A growing align group first lets go of its state page of two steps ago,
                // which vLLM's `allocate_slots` releases at its start.
                if let Some(i) = grp.rules.stale_state(t, &s.grow[g], old, ps, NULL_PAGE) {
                    plan.back[grp.pool] += usize::from(dev.refcount(t[i]) == 1);
                    plan.stale |= 1 << g;
                }
            }
            for j in grp.rules.written(old, n, t.len(), ps) {
                let p = t[j];
                if !self.is_null(p) && dev.refcount(p) > 1 {
                    plan.need[grp.pool] += 1;
                    plan.copies += usize::from(grp.rules.copy_tokens(j, old, ps) > 0);
                }
            }
        }
        Ok(plan)
    }

    fn ensure_plan(&self, plan: &AppendPlan) -> Result<()> {
        for (p, &n) in plan.need[..self.pools.len()].iter().enumerate() {
            let available = self.pools[p].device.available() + plan.back[p];
            if n > available {
                return Err(Error::NoSpace {
                    tier: Tier::Device,
                    needed: n,
                    available,
                });
            }
        }
        Ok(())
    }

    /// Makes room for `n` more tokens in a live sequence's token list (`OutOfMemory` instead of
    /// an abort). Only capacity changes, which no operation can observe.
    fn reserve_tokens(&mut self, id: u64, n: usize) -> Result<()> {
        let s = self.seqs.get_mut(&id).ok_or(Error::SeqNotFound(id))?;
        s.tokens.try_reserve(n).map_err(|_| Error::OutOfMemory {
            what: "tokens",
            bytes: (n as u64).saturating_mul(4),
        })
    }

    /// Applies an append whose page needs were checked: stale align states go, shared pages
    /// the append writes are copied (copy-on-write), every group grows, and newly full pages are
    /// registered.
    fn append_unchecked(
        &mut self,
        id: u64,
        tokens: &[i32],
        lookahead: usize,
        stale: u32,
        copies: &mut Vec<PageCopy>,
    ) {
        let mut s = self.seqs.remove(&id).expect("checked");
        let ps = self.ps;
        let old = s.tokens.len();
        let n = tokens.len();
        let want = (old + n + lookahead).div_ceil(ps);
        for g in groups_of(stale) {
            self.release_stale(&mut s, g, old);
        }
        let prio = s.priority;
        let mut fresh = Vec::new();
        for g in 0..self.groups.len() {
            let pool = self.groups[g].pool;
            let rules = &self.groups[g].rules;
            let len = s.tables[g].len();
            let written = rules.written(old, n, len, ps);
            for j in written {
                let src = s.tables[g][j];
                if self.is_null(src) || self.pools[pool].device.refcount(src) <= 1 {
                    continue;
                }
                let dst = self.take_device(pool, Holder::Seq);
                self.pools[pool].device.raise_priority(dst, prio);
                let keep = self.groups[g].rules.copy_tokens(j, old, ps);
                if keep > 0 {
                    copies.push(PageCopy {
                        src_page: src,
                        dst_page: dst,
                        num_tokens: keep,
                        kind: CopyKind::DeviceToDevice,
                        group: g as u32,
                    });
                    self.counters.cow_copies += 1;
                }
                self.release_device(pool, src, Holder::Seq, Release::Free);
                s.tables[g][j] = dst;
            }
            let need = self.groups[g].rules.grow_pages(&s.tables[g], want);
            fresh.clear();
            for _ in 0..need {
                let p = self.take_device(pool, Holder::Seq);
                self.pools[pool].device.raise_priority(p, prio);
                fresh.push(p);
            }
            let mut it = fresh.iter().copied();
            self.groups[g].rules.grow(
                &mut s.tables[g],
                want,
                &mut s.grow[g],
                NULL_PAGE,
                &mut || it.next().expect("append takes the pages its rules count"),
            );
        }
        s.tokens.extend_from_slice(tokens);
        self.register_seq(id, &mut s);
        self.seqs.insert(id, s);
    }

    /// Appends tokens to a device-resident sequence, keeping room for `lookahead` more slots
    /// (speculative decoding). Writing into a page shared with another sequence copies it first;
    /// the copy is pushed to `copies`. All or nothing.
    ///
    /// `max_copies` is the room the caller has for copies: `BufferTooSmall` (before any change)
    /// if the append would report more.
    pub fn append(
        &mut self,
        id: u64,
        tokens: &[i32],
        lookahead: usize,
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
    ) -> Result<()> {
        let s = self.device_seq(id)?;
        let plan = self.append_plan(s, tokens.len(), lookahead)?;
        check_room("copies_out", plan.copies, max_copies)?;
        self.ensure_plan(&plan)?;
        self.reserve_tokens(id, tokens.len())?;
        self.append_unchecked(id, tokens, lookahead, plan.stale, copies);
        Ok(())
    }

    /// [`append`](Self::append), then the sequence's page ids in group 0 from index
    /// `first_page` on (the pages the append added when `first_page` is the page count before
    /// it). Fails before any change when `first_page` lies past the table the append would
    /// leave, or when the tail would not fit in `max_pages_out` (`BufferTooSmall`).
    #[allow(clippy::too_many_arguments)]
    pub fn append_pages(
        &mut self,
        id: u64,
        tokens: &[i32],
        lookahead: usize,
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
        first_page: usize,
        max_pages_out: usize,
    ) -> Result<&[u32]> {
        let s = self.device_seq(id)?;
        let want = (s.tokens.len() + tokens.len())
            .checked_add(lookahead)
            .map(|v| v.div_ceil(self.ps))
            .ok_or_else(|| Error::arg("lookahead_slots", "token count overflows"))?;
        let after = s.len().max(want);
        if first_page > after {
            return Err(Error::arg(
                "first_page",
                format!("{first_page} is past the {after} pages the sequence would hold"),
            ));
        }
        check_room("pages_out", after - first_page, max_pages_out)?;
        self.append(id, tokens, lookahead, copies, max_copies)?;
        Ok(&self.seq(id)?.tables[0][first_page..])
    }

    /// One decode step for a batch: appends `tokens[i]` to `ids[i]`. All or nothing across the
    /// whole batch.
    pub fn append_batch(
        &mut self,
        ids: &[u64],
        tokens: &[i32],
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
    ) -> Result<()> {
        if ids.len() != tokens.len() {
            return Err(Error::arg(
                "tokens",
                format!("{} tokens for {} sequences", tokens.len(), ids.len()),
            ));
        }
        let mut plan = AppendPlan::default();
        // Per sequence, the align groups whose stale state goes first (only with such groups).
        let mut stale: Vec<u32> = Vec::new();
        // Shared pages the batch writes into: (pool, page, whether its tokens must be copied).
        let mut shared: Vec<(usize, u32, bool)> = Vec::new();
        self.batch_stamp += 1;
        let stamp = self.batch_stamp;
        let ps = self.ps;
        for (i, &id) in ids.iter().enumerate() {
            self.device_seq(id)?;
            let s = self.seqs.get_mut(&id).expect("checked");
            if s.stamp == stamp {
                return Err(Error::arg(
                    "seq_ids",
                    format!("sequence {id} appears twice in the batch"),
                ));
            }
            s.stamp = stamp;
            let s = &self.seqs[&id];
            let old = s.tokens.len();
            let want = (old + 1).div_ceil(ps);
            let mut mask = 0u32;
            for (g, t) in s.tables.iter().enumerate() {
                let grp = &self.groups[g];
                let dev = &self.pools[grp.pool].device;
                let grows = grp.rules.grow_pages(t, want);
                plan.need[grp.pool] += grows;
                if grows > 0 {
                    if let Some(i) = grp.rules.stale_state(t, &s.grow[g], old, ps, NULL_PAGE) {
                        plan.back[grp.pool] += usize::from(dev.refcount(t[i]) == 1);
                        mask |= 1 << g;
                    }
                }
                for j in grp.rules.written(old, 1, t.len(), ps) {
                    let p = t[j];
                    if !self.is_null(p) && dev.refcount(p) > 1 {
                        let data = grp.rules.copy_tokens(j, old, ps) > 0;
                        shared.push((grp.pool, p, data));
                    }
                }
            }
            if mask != 0 {
                stale.resize(ids.len(), 0);
                stale[i] = mask;
            }
        }
        // w writers into a page with r holders copy min(w, r - 1) times: the last holder left
        // writes in place.
        shared.sort_unstable();
        for run in shared.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let (pool, page, data) = run[0];
            let rc = self.pools[pool].device.refcount(page) as usize;
            let c = run.len().min(rc - 1);
            plan.need[pool] += c;
            if data {
                plan.copies += c;
            }
        }
        check_room("copies_out", plan.copies, max_copies)?;
        self.ensure_plan(&plan)?;
        for &id in ids {
            self.reserve_tokens(id, 1)?;
        }
        for (i, &id) in ids.iter().enumerate() {
            let mask = stale.get(i).copied().unwrap_or(0);
            self.append_unchecked(id, &tokens[i..i + 1], 0, mask, copies);
        }
        Ok(())
    }

    /// Device pages and copies [`append`](Self::append) of `num_tokens` tokens with `lookahead`
    /// reserved slots would take now (a capacity check without the append). Read-only.
    pub fn append_need(&self, id: u64, num_tokens: usize, lookahead: usize) -> Result<AppendNeed> {
        let s = self.device_seq(id)?;
        let plan = self.append_plan(s, num_tokens, lookahead)?;
        let back: usize = plan.back.iter().sum();
        Ok(AppendNeed {
            pages: plan.need.iter().sum::<usize>().saturating_sub(back),
            copies: plan.copies,
        })
    }
}
