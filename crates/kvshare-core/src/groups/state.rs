//! The rules of state groups (Mamba / linear attention), vLLM 0.23's `MambaManager` per
//! `mamba_cache_mode`, with one page size (vLLM's `mamba_block_size = block_size` under prefix
//! caching) and no speculative blocks:
//!
//! * all: the generic rules with `n - 1` skipped tokens (`spec.rs`), the rightmost-checkpoint
//!   hit (`hit.rs`), and the same-step gate below.
//! * align: one new page per step at most (the running state, at the table's last position,
//!   nulls padded before it), the previous step's page kept until the next release
//!   (`last_state_block_idx`), checkpoints registered when a step ends on a page boundary.
//! * none: one page per sequence for its whole life, at the table's last position.

use super::super::error::{Error, Result};
use super::super::pool::Holder;
use super::hybrid::{HSeq, Hybrid, PageKey, NULL_PAGE};
use super::spec::{GroupKind, StateMode};

impl Hybrid {
    /// Fresh pages group `g` takes at a begin of `num_tokens` tokens whose tables are `total`
    /// long, with `fresh` positions after the hit and `hit_len` hit entries in `g`.
    pub(super) fn fresh_pages(
        &self,
        g: usize,
        total: usize,
        fresh: usize,
        num_tokens: usize,
        hit_len: usize,
    ) -> usize {
        match self.cfg.groups[g].kind {
            GroupKind::State(StateMode::None) => total.min(1),
            // MambaManager.get_num_blocks_to_allocate, align: 1 when any block is missing.
            GroupKind::State(StateMode::Align) => {
                usize::from(num_tokens.div_ceil(self.ps) > hit_len)
            }
            _ => fresh,
        }
    }

    /// Grows a "none" or "align" state group's table `t` to `want` positions.
    /// None: the one page (taken the first time) moves to the last position.
    /// Align (`MambaManager.allocate_new_blocks`): remembers the previous state position,
    /// pads nulls and takes one page for the new last position. Availability was checked.
    pub(super) fn state_grow(
        &mut self,
        g: usize,
        t: &mut Vec<u32>,
        want: usize,
        last: &mut Option<usize>,
        alloc: &mut bool,
    ) {
        if want <= t.len() {
            return;
        }
        let pool = self.pool_of[g];
        match self.cfg.groups[g].kind {
            GroupKind::State(StateMode::None) => {
                let page = match t.last() {
                    Some(&p) if p != NULL_PAGE => p,
                    _ => self.take(pool),
                };
                t.fill(NULL_PAGE);
                t.resize(want - 1, NULL_PAGE);
                t.push(page);
            }
            GroupKind::State(StateMode::Align) => {
                if *alloc || !t.is_empty() {
                    *last = Some(t.len() - 1);
                }
                t.resize(want - 1, NULL_PAGE);
                let page = self.take(pool);
                t.push(page);
                *alloc = true;
            }
            k => unreachable!("state_grow on {k:?}"),
        }
    }

    /// The position of the previous step's state page that align's extra release frees at
    /// `num_computed` tokens (`MambaManager.remove_skipped_blocks`: once the state moved past
    /// it, `last_state_block_idx < cdiv(n, ps) - 1`), if it still holds a page.
    pub(super) fn stale_state(&self, s: &HSeq, g: usize, num_computed: usize) -> Option<usize> {
        let i = s.state_last[g]?;
        let bound = num_computed.div_ceil(self.ps);
        let live = s.tables[g].get(i).is_some_and(|&p| p != NULL_PAGE);
        (bound > 0 && i < bound - 1 && live).then_some(i)
    }

    /// Align's extra release (see [`Self::stale_state`]), to the back of the queue as vLLM's
    /// `free_blocks` does. Returns the pages released (0 or 1).
    pub(super) fn release_last_state(&mut self, id: u64, g: usize, num_computed: usize) -> usize {
        let Some(i) = self.stale_state(&self.seqs[&id], g, num_computed) else {
            return 0;
        };
        let s = self.seqs.get_mut(&id).expect("checked");
        let page = std::mem::replace(&mut s.tables[g][i], NULL_PAGE);
        self.pools[self.pool_of[g]].release(page, Holder::Seq, true);
        self.counters[g].released += 1;
        1
    }

    /// What an append to `s` growing the tables to `want` positions releases before it takes
    /// any page: each growing align group's state page of two steps ago, which vLLM's
    /// `allocate_slots` releases at its start (`remove_skipped_blocks` at the tokens computed,
    /// all of them at an append) and which the new state position would otherwise make the
    /// group forget. Returns those groups and, per pool, the pages that come back (a page
    /// comes back when this was its last reference).
    pub(super) fn append_releases(&self, s: &HSeq, want: usize) -> (Vec<usize>, Vec<usize>) {
        let (mut groups, mut back) = (Vec::new(), vec![0; self.pools.len()]);
        for (g, t) in s.tables.iter().enumerate() {
            if self.cfg.groups[g].kind != GroupKind::State(StateMode::Align) || want <= t.len() {
                continue;
            }
            if let Some(i) = self.stale_state(s, g, s.tokens.len()) {
                let pool = self.pool_of[g];
                back[pool] += usize::from(self.pools[pool].refcount(t[i]) == 1);
                groups.push(g);
            }
        }
        (groups, back)
    }

    /// Align mode ignores lookahead slots (vLLM: no draft model has mamba layers), so a table
    /// grown with them would lose the page alignment: refused.
    pub(super) fn check_lookahead(&self, lookahead: usize) -> Result<()> {
        let align = self
            .cfg
            .groups
            .iter()
            .any(|g| g.kind == GroupKind::State(StateMode::Align));
        if lookahead > 0 && align {
            return Err(Error::arg(
                "lookahead_slots",
                "a state group in mode align takes no lookahead slots",
            ));
        }
        Ok(())
    }

    /// vLLM's same-step rule for state groups (`MambaManager.get_num_blocks_to_allocate`
    /// answers `num_gpu_blocks + 1`): a hit whose state page's digest was registered in this
    /// step (by any page: duplicates too) is not usable yet (the state is written by this
    /// step's forward pass), so the begin fails with `NoSpace`, before anything changes, and
    /// the engine retries in a later step.
    ///
    /// Only a state group's hit ends at a looked-up page: without one the hit may run past the
    /// pages the prompt hashes (chunked local attention never looks up the pages before the
    /// chunk of the first token to compute), so a digest is read only for a state group's hit.
    pub(super) fn state_gate(&self, keys: &[PageKey], blocks: &[Vec<u32>]) -> Result<()> {
        for (g, b) in blocks.iter().enumerate() {
            if let GroupKind::State(_) = self.cfg.groups[g].kind {
                // vLLM reads `new_computed_blocks[-1].block_hash`: the digest of the state
                // group's last hit page, which it found by that page's key.
                let Some(last) = b.len().checked_sub(1).and_then(|j| keys.get(j)) else {
                    continue;
                };
                if self.this_step[g].contains(&last.hash) {
                    let pool = &self.pools[self.pool_of[g]];
                    return Err(Error::NoSpace {
                        tier: super::super::config::Tier::Device,
                        needed: pool.num_pages() as usize + 1,
                        available: pool.available(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Starts a scheduler step: states registered before now become usable by hits (vLLM's
    /// `KVCacheManager.new_step_starts`).
    pub fn new_step(&mut self) {
        for s in &mut self.this_step {
            s.clear();
        }
    }

    /// The page holding a sequence's running state in state group `group`: the last non-null
    /// entry of its table.
    pub fn state_page(&self, id: u64, group: usize) -> Result<u32> {
        self.check_group(group)?;
        if !matches!(self.cfg.groups[group].kind, GroupKind::State(_)) {
            return Err(Error::arg(
                "group",
                format!("group {group} is not a state group"),
            ));
        }
        self.seq(id)?.tables[group]
            .iter()
            .rev()
            .copied()
            .find(|&p| p != NULL_PAGE)
            .ok_or_else(|| Error::arg("seq_id", format!("sequence {id} holds no state page yet")))
    }
}
