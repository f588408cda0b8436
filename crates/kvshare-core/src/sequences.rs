//! Sequences: registration of full pages (and dedup), fork, free, release of positions a group
//! no longer reads, priorities and accessors. Begins (with the prefix hit) are in `begin.rs`,
//! appends in `append.rs`, swaps between tiers in `swap.rs`, the batch views in `batch.rs`.

use std::ops::Range;

use super::config::{WindowRetention, MAX_RETENTION_BOUNDARIES};
use super::error::{Error, Result};
use super::pool::{Holder, PRIORITIES};
use super::prefix::{has_placeholder, Entry};
use super::seq::{Seq, SeqInfo, HOST_NULL};
use super::state::{Release, State, NULL_PAGE};
use super::tier::Tier;

/// `BufferTooSmall` for the out-buffer `what` when `needed` entries do not fit in `capacity`.
pub(crate) fn check_room(what: &'static str, needed: usize, capacity: usize) -> Result<()> {
    if needed > capacity {
        return Err(Error::BufferTooSmall {
            what,
            needed,
            capacity,
        });
    }
    Ok(())
}

/// Tokens held by position `j` of a sequence of `len` tokens.
pub(crate) fn tokens_in_page(len: usize, j: usize, ps: usize) -> u32 {
    len.saturating_sub(j * ps).min(ps) as u32
}

impl State {
    pub(crate) fn seq(&self, id: u64) -> Result<&Seq> {
        self.seqs.get(&id).ok_or(Error::SeqNotFound(id))
    }

    /// The sequence, when it lives on `tier` (`SeqWrongTier` otherwise).
    pub(crate) fn seq_on(&self, id: u64, tier: Tier) -> Result<&Seq> {
        let s = self.seq(id)?;
        if s.tier != tier {
            return Err(Error::SeqWrongTier {
                seq: id,
                tier: s.tier,
                needed: tier,
            });
        }
        Ok(s)
    }

    pub(crate) fn device_seq(&self, id: u64) -> Result<&Seq> {
        self.seq_on(id, Tier::Device)
    }

    /// Align mode ignores lookahead slots (vLLM: no draft model has mamba layers), so a table
    /// grown with them would lose the page alignment: refused.
    pub(crate) fn check_lookahead(&self, lookahead: usize) -> Result<()> {
        let align = self
            .groups
            .iter()
            .any(|g| g.kind == super::config::GroupKind::State(super::config::StateMode::Align));
        if lookahead > 0 && align {
            return Err(Error::arg(
                "lookahead_slots",
                "a state group in mode align takes no lookahead slots",
            ));
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

    /// Offers the sequence's newly full pages to every group's index (or queues them for
    /// [`commit`](Self::commit) in defer-commit mode).
    pub(crate) fn register_full_pages(&mut self, id: u64) {
        if !self.cfg.enable_prefix_caching {
            return;
        }
        let Some(mut s) = self.seqs.remove(&id) else {
            return;
        };
        self.register_seq(id, &mut s);
        self.seqs.insert(id, s);
    }

    /// [`register_full_pages`](Self::register_full_pages) of a sequence taken out of the map
    /// (every caller holds it by value for the whole operation).
    pub(crate) fn register_seq(&mut self, id: u64, s: &mut Seq) {
        if !self.cfg.enable_prefix_caching {
            return;
        }
        if self.cfg.defer_commit {
            // Pages a commit could register: the final ones, no further than the hashing went
            // once it stopped at a placeholder.
            let mut full = s.final_pages(self.ps);
            if s.hash_stopped {
                full = full.min(s.keys.len());
            }
            let behind = s.offered.iter().any(|&o| o < full);
            if !s.pending && behind {
                s.pending = true;
                self.uncommitted.push(id);
            }
            return;
        }
        self.register_now(s);
    }

    /// vLLM's `cache_blocks`, groups in order: hashes the newly full pages, then registers each
    /// group's pages at positions not offered yet. A page whose content the group has already
    /// registered is switched to that page (dedup, with `skip_cached_writes`), kept as a
    /// duplicate (vLLM's way, with `vllm_free_order`), or left unregistered.
    fn register_now(&mut self, s: &mut Seq) {
        let ps = self.ps;
        if !s.hash_stopped && s.keys.len() < s.tokens.len() / ps {
            let keys = std::mem::take(&mut s.keys);
            let (keys, stopped) = self.page_keys(&s.tokens, s.extra.as_deref(), &keys);
            (s.keys, s.hash_stopped) = (keys, stopped);
        }
        let full = s.keys.len().min(s.final_pages(ps));
        let lora = s.lora();
        // Nothing from the first loading position on is matchable before the loads settle;
        // positions loaded from the pool are not stored back.
        let (gate, loaded) = match s.pool.as_deref() {
            Some(p) if p.loading() => (p.start, 0..0),
            Some(p) => (usize::MAX, p.start..p.end),
            None => (usize::MAX, 0..0),
        };
        let retention = self.cfg.window_retention;
        for g in 0..self.groups.len() {
            let to = full.min(s.tables[g].len()).min(gate);
            let from = s.offered[g].min(to);
            for j in from..to {
                if self.groups[g].rules.retains(j, ps, retention, &s.retain) {
                    self.offer_page(s, g, j, lora, &loaded);
                }
            }
            s.offered[g] = s.offered[g].max(to);
        }
    }

    /// Offers the sequence's full page `j` of group `g` to the group's index: registered, or
    /// (its content registered already) switched to the registered page (dedup), kept as a
    /// duplicate (vLLM's order), or left unregistered. Positions in `loaded` came from the pool
    /// tier and are not stored back.
    fn offer_page(&mut self, s: &mut Seq, g: usize, j: usize, lora: u64, loaded: &Range<usize>) {
        let ps = self.ps;
        let pool = self.groups[g].pool;
        let dedup = self.cfg.skip_cached_writes;
        let page = s.tables[g][j];
        if self.is_null(page) {
            return;
        }
        let k = s.keys[j];
        if self.groups[g].rules.is_state() {
            self.this_step[g].insert(k.hash, ());
        }
        let tokens = &s.tokens[j * ps..(j + 1) * ps];
        let entry = Entry {
            hash: k.hash,
            parent: s.parent(j, self.root),
            extra: k.extra,
            lora,
            tokens,
        };
        let g32 = g as u32;
        if self.index_insert(pool, Tier::Device, g32, page, entry) {
            if !loaded.contains(&j) {
                self.pool_store(g, Tier::Device, page, k.hash, tokens);
            }
            return;
        }
        let p = &self.pools[pool];
        if p.index.is_registered(page) || p.dup_of[page as usize].is_some() {
            return;
        }
        if dedup {
            // The same content is already cached in another page (two requests filled
            // identical pages independently): share that one and free this copy. The
            // slot mapping hides the page from KV writes, so the tokens of this step
            // that filled it never write into the shared page. A canonical page at the
            // reference limit is not shared: this copy is kept.
            let canonical = p.index.lookup(g32, k.hash, k.extra, tokens);
            let shareable = |c: u32| c != page && p.device.check_acquire([c]).is_ok();
            if let Some(c) = canonical.filter(|&c| shareable(c)) {
                self.pools[pool].device.acquire(c, Holder::Seq);
                self.release_device(pool, page, Holder::Seq, Release::Free);
                s.tables[g][j] = c;
                s.borrowed[g].push(j as u32);
                self.counters.dedup_pages += 1;
            }
        } else if self.cfg.vllm_free_order {
            // Same content as a registered page: a duplicate, as vLLM keeps it.
            self.dup_insert(pool, g32, page, entry);
        }
    }

    /// Sets the sequence's retention boundaries: token positions a later lookup can end at (at
    /// most [`MAX_RETENTION_BOUNDARIES`]). Under sparse window retention
    /// ([`WindowRetention::Sparse`]) a sliding-window group registers the tail of pages before
    /// each; the full pages the sequence offered already that the new boundaries retain are
    /// registered now, so a caller may set them right after the sequence begins. Pages
    /// registered before stay registered. vLLM 0.32 retains the tails before a prompt's last
    /// token and before a lookup's shared-prefix junction. Refused (nothing changes) for an
    /// unknown or swapped-out sequence, too many boundaries, or a cache without sparse
    /// retention.
    pub fn set_retention(&mut self, id: u64, boundaries: &[usize]) -> Result<()> {
        if !matches!(self.cfg.window_retention, WindowRetention::Sparse { .. }) {
            return Err(Error::arg(
                "window_retention",
                "retention boundaries need sparse window retention",
            ));
        }
        if boundaries.len() > MAX_RETENTION_BOUNDARIES {
            return Err(Error::arg(
                "num_boundaries",
                format!(
                    "{} boundaries, at most {MAX_RETENTION_BOUNDARIES}",
                    boundaries.len()
                ),
            ));
        }
        self.device_seq(id)?;
        let mut s = self.seqs.remove(&id).expect("checked");
        let old = std::mem::replace(&mut s.retain, boundaries.to_vec());
        if self.cfg.enable_prefix_caching {
            let (ps, retention, lora) = (self.ps, self.cfg.window_retention, s.lora());
            let loaded = s.pool.as_deref().map_or(0..0, |p| p.start..p.end);
            for g in 0..self.groups.len() {
                for j in 0..s.offered[g].min(s.tables[g].len()) {
                    let rules = &self.groups[g].rules;
                    let added = rules.retains(j, ps, retention, &s.retain)
                        && !rules.retains(j, ps, retention, &old);
                    if added {
                        self.offer_page(&mut s, g, j, lora, &loaded);
                    }
                }
            }
        }
        self.seqs.insert(id, s);
        Ok(())
    }

    /// Tells the cache that the KV of the sequence's first `num_computed` tokens is written. A
    /// sequence's tokens count as computed until this is called; from then on only its pages
    /// within its first `num_computed` tokens are registered as prefix hits (at the next
    /// [`commit`](Self::commit) with deferred commits), stored to the pool tier, or shared by
    /// content when it is swapped: an engine that gives a prompt whole and computes it a chunk
    /// per step (MindIE's chunked prefill) never lets another request read KV it has not
    /// written. Pages registered before stay registered. Refused (nothing changes) for an
    /// unknown sequence or more tokens than it holds.
    pub fn set_computed(&mut self, id: u64, num_computed: usize) -> Result<()> {
        let s = self.seqs.get(&id).ok_or(Error::SeqNotFound(id))?;
        if num_computed > s.tokens.len() {
            return Err(Error::arg(
                "num_computed_tokens",
                format!(
                    "{num_computed} tokens computed, sequence {id} holds {}",
                    s.tokens.len()
                ),
            ));
        }
        let mut s = self.seqs.remove(&id).expect("checked");
        s.computed = num_computed;
        if s.tier == Tier::Device {
            self.register_seq(id, &mut s);
        }
        self.seqs.insert(id, s);
        Ok(())
    }

    /// Makes every page that filled up since the last commit matchable (MindIE's
    /// `MarkBlocksAsComputed`), and hands out the write-through stores of the pages registered
    /// since the last commit (the engine commits once their KV is written). A no-op unless the
    /// config defers commits or writes through to a pool tier.
    pub fn commit(&mut self) {
        self.commit_pages();
        self.pool_release_staged();
    }

    fn commit_pages(&mut self) {
        let pending = std::mem::take(&mut self.uncommitted);
        for id in pending {
            // Entries of freed (or freed and reused) ids are stale: only flagged sequences count.
            let on_device = match self.seqs.get_mut(&id) {
                Some(s) if s.pending => {
                    s.pending = false;
                    s.tier == Tier::Device
                }
                _ => continue,
            };
            if on_device {
                let mut s = self.seqs.remove(&id).expect("live sequence");
                self.register_now(&mut s);
                self.seqs.insert(id, s);
            }
        }
    }

    /// Creates `child` sharing every page of `parent` in every group (beam search, parallel
    /// sampling). Writes into shared pages later copy them on write (a state group's running
    /// state included).
    pub fn fork(&mut self, parent: u64, child: u64) -> Result<()> {
        if self.seqs.contains_key(&child) {
            return Err(Error::SeqExists(child));
        }
        self.check_not_loading(parent)?;
        let s = self.device_seq(parent)?;
        for (g, t) in s.tables.iter().enumerate() {
            let pool = self.groups[g].pool;
            let live = t.iter().copied().filter(|&p| !self.is_null(p));
            self.pools[pool].device.check_acquire(live)?;
        }
        let mut s = s.clone();
        for (g, t) in s.tables.iter().enumerate() {
            let pool = self.groups[g].pool;
            for &p in t {
                if !self.is_null(p) {
                    self.pools[pool].device.acquire(p, Holder::Seq);
                }
            }
        }
        s.pending = false;
        s.stamp = 0;
        self.seqs.insert(child, s);
        self.register_full_pages(child);
        Ok(())
    }

    /// Ends a sequence: releases its pages, groups in order, each table last position first, so
    /// the deepest cached pages of a chain are evicted before its shared head (vLLM's
    /// `coordinator.free`; a sliding-window group sends its pages without cached content to the
    /// front of the reuse order, as vLLM's `SlidingWindowManager.free` does).
    ///
    /// With `defer_commit`, full pages not yet committed are not registered: their KV may never
    /// have been computed.
    ///
    /// With a match unit below the page size, the whole units of each attention group's last,
    /// never-full page are kept matchable (a partial entry: the next turn of a conversation
    /// repeats them), when the sequence is its only holder.
    pub fn free(&mut self, id: u64) -> Result<()> {
        self.end(id, false)
    }

    /// Ends a sequence as vLLM 0.32's scheduler ends a request whose free it deferred
    /// (`pop_blocks_for_free`: every group's blocks in one list, in group order, handed back
    /// later to `block_pool.free_blocks` reversed). The pages are released as that one list,
    /// from the last group's last position to the first group's first, and each pool places
    /// the pages this frees in one go, as `free_blocks` does: with `vllm_uncached_first`,
    /// those with cached content to the back of the reuse order in list order and the others
    /// to its front keeping theirs; otherwise each where `free` sends a full-attention group's
    /// page. No group kind's own free rule applies: vLLM's single-type managers never see
    /// these blocks again. A cache of one full-attention group frees as [`State::free`] does;
    /// everything else (partial entries, a pool load, a swapped-out sequence) is as there.
    pub fn free_deferred(&mut self, id: u64) -> Result<()> {
        self.end(id, true)
    }

    fn end(&mut self, id: u64, as_one_list: bool) -> Result<()> {
        let s = self.seqs.remove(&id).ok_or(Error::SeqNotFound(id))?;
        if let Some(p) = s.pool.as_deref().filter(|p| p.loading()) {
            self.pool_orphan(&p.tickets);
        }
        if s.tier == Tier::Device {
            self.keep_partial_pages(&s);
            if as_one_list {
                self.release_as_one_list(&s.tables);
                return Ok(());
            }
        }
        for (g, t) in s.tables.iter().enumerate() {
            let pool = self.groups[g].pool;
            match s.tier {
                Tier::Device => {
                    if self.cfg.vllm_uncached_first || self.groups[g].rules.free_prepends_uncached()
                    {
                        let rev: Vec<u32> = t
                            .iter()
                            .rev()
                            .copied()
                            .filter(|&p| !self.is_null(p))
                            .collect();
                        self.release_split(pool, &rev, Holder::Seq);
                    } else {
                        for &p in t.iter().rev() {
                            if !self.is_null(p) {
                                self.release_device(pool, p, Holder::Seq, Release::Free);
                            }
                        }
                    }
                }
                Tier::Host => {
                    for &p in t.iter().rev().filter(|&&p| p != HOST_NULL) {
                        self.release_host(pool, p);
                    }
                }
            }
        }
        Ok(())
    }

    /// `block_pool.free_blocks` of `tables` concatenated in group order and reversed: per pool
    /// (groups whose pages differ in bytes have pools of their own), one placement of its pages.
    fn release_as_one_list(&mut self, tables: &[Vec<u32>]) {
        let mut by_pool: Vec<(usize, Vec<u32>)> = Vec::new();
        for (g, t) in tables.iter().enumerate().rev() {
            let pool = self.groups[g].pool;
            let at = match by_pool.iter().position(|(p, _)| *p == pool) {
                Some(i) => i,
                None => {
                    by_pool.push((pool, Vec::new()));
                    by_pool.len() - 1
                }
            };
            let live = t.iter().rev().copied().filter(|&p| !self.is_null(p));
            by_pool[at].1.extend(live);
        }
        for (pool, pages) in by_pool {
            if self.cfg.vllm_uncached_first {
                self.release_split(pool, &pages, Holder::Seq);
            } else {
                for p in pages {
                    self.release_device(pool, p, Holder::Seq, Release::Free);
                }
            }
        }
    }

    /// Registers the whole units of `s`'s first unregistered position, in each attention group,
    /// as a partial entry (see `prefix.rs`), when units are finer than pages, pages fill up
    /// without deferred commits, and the page is a never-full page `s` alone holds, free of
    /// placeholder tokens.
    fn keep_partial_pages(&mut self, s: &Seq) {
        let (ps, unit) = (self.ps, self.cfg.unit());
        if !self.cfg.enable_prefix_caching || self.cfg.defer_commit || unit == ps {
            return;
        }
        let j = s.keys.len();
        let start = j * ps;
        let units = s.tokens.len().min(s.computed).saturating_sub(start) / unit;
        if s.hash_stopped || units == 0 || s.tokens.len() - start >= ps || j >= s.len() {
            return;
        }
        let tokens = &s.tokens[start..start + units * unit];
        if has_placeholder(tokens) {
            return;
        }
        let parent = s.parent(j, self.root);
        let extra = s.extra.as_ref().map_or(0, |x| x.page_digest(j, ps));
        for g in 0..self.groups.len() {
            let pool = self.groups[g].pool;
            let page = s.tables[g][j];
            if self.is_null(page) || self.pools[pool].device.refcount(page) != 1 {
                continue;
            }
            self.pools[pool]
                .index
                .insert_partial(page, g as u32, parent, extra, s.lora(), tokens);
        }
    }

    /// vLLM's `remove_skipped_blocks(total_computed_tokens)`: every group replaces the positions
    /// it no longer reads at `num_computed` by the null page (from the last skipped position
    /// down to the first one already null) and returns them to its pool: pages with cached
    /// content to the back of the reuse order (still matchable), the others to its front. An
    /// align state group also lets go of its previous step's state page. Returns the pages
    /// released.
    pub fn release_skipped(&mut self, id: u64, num_computed: usize) -> Result<usize> {
        self.device_seq(id)?;
        let mut released = 0;
        for g in 0..self.groups.len() {
            let pool = self.groups[g].pool;
            let skipped = self.groups[g].rules.skipped_tokens(num_computed) / self.ps;
            let s = self.seqs.get_mut(&id).expect("checked");
            let t = &mut s.tables[g];
            let skipped = skipped.min(t.len());
            let mut pages = Vec::new();
            for i in (0..skipped).rev() {
                let p = t[i];
                if self.cfg.reserve_null_page && p == NULL_PAGE {
                    break;
                }
                pages.push(p);
                t[i] = NULL_PAGE;
            }
            released += pages.len();
            self.group_counters[g].released += pages.len() as u64;
            self.release_split(pool, &pages, Holder::Seq);
            released += self.release_stale_state(id, g, num_computed);
        }
        Ok(released)
    }

    /// Align's extra release (`Rules::stale_state`), to the back of the reuse order as vLLM's
    /// `free_blocks` does (outside vLLM's order, a page with no cached content is free). Returns
    /// the pages released (0 or 1).
    fn release_stale_state(&mut self, id: u64, g: usize, num_computed: usize) -> usize {
        let mut s = self.seqs.remove(&id).expect("checked");
        let n = self.release_stale(&mut s, g, num_computed);
        self.seqs.insert(id, s);
        n
    }

    /// [`release_stale_state`](Self::release_stale_state) of a sequence held by value.
    pub(crate) fn release_stale(&mut self, s: &mut Seq, g: usize, num_computed: usize) -> usize {
        let Some(i) = self.groups[g].rules.stale_state(
            &s.tables[g],
            &s.grow[g],
            num_computed,
            self.ps,
            NULL_PAGE,
        ) else {
            return 0;
        };
        let pool = self.groups[g].pool;
        let page = std::mem::replace(&mut s.tables[g][i], NULL_PAGE);
        self.release_device(pool, page, Holder::Seq, Release::Free);
        self.group_counters[g].released += 1;
        1
    }

    /// Sets the retention priority of a sequence (0 ..= 3, higher is kept longer): its pages,
    /// once unreferenced and cached, are evicted only after every cached page of lower priority.
    /// A page shared by several sequences keeps the highest priority any of them gave it.
    pub fn set_priority(&mut self, id: u64, priority: u8) -> Result<()> {
        if priority >= PRIORITIES {
            return Err(Error::arg(
                "priority",
                format!("{priority} is not in 0..{PRIORITIES}"),
            ));
        }
        let s = self.device_seq(id)?;
        let tables = s.tables.clone();
        self.seqs.get_mut(&id).expect("checked").priority = priority;
        for (g, t) in tables.iter().enumerate() {
            let pool = self.groups[g].pool;
            let live: Vec<u32> = t.iter().copied().filter(|&p| !self.is_null(p)).collect();
            for p in live {
                self.pools[pool].device.raise_priority(p, priority);
            }
        }
        Ok(())
    }

    /// The block table (page ids) of a sequence in `group`: the null page at released
    /// positions of a device table, `u32::MAX` at those of a swapped-out one.
    pub fn seq_pages(&self, id: u64, group: usize) -> Result<&[u32]> {
        self.check_group(group)?;
        Ok(&self.seq(id)?.tables[group])
    }

    /// The token ids of a sequence.
    pub fn seq_tokens(&self, id: u64) -> Result<&[i32]> {
        Ok(&self.seq(id)?.tokens)
    }

    /// A sequence's shape.
    pub fn seq_info(&self, id: u64) -> Result<SeqInfo> {
        let s = self.seq(id)?;
        Ok(SeqInfo {
            num_tokens: s.tokens.len(),
            num_pages: s.len(),
            matched_tokens: s.matched_tokens,
            tier: s.tier,
        })
    }

    /// Live sequence ids (any order).
    pub fn seq_ids(&self) -> Vec<u64> {
        self.seqs.keys().copied().collect()
    }

    /// The page holding a sequence's running state in state group `group`: the last live
    /// entry of its table.
    pub fn state_page(&self, id: u64, group: usize) -> Result<u32> {
        self.check_group(group)?;
        if !self.groups[group].rules.is_state() {
            return Err(Error::arg(
                "group",
                format!("group {group} is not a state group"),
            ));
        }
        let s = self.device_seq(id)?;
        s.tables[group]
            .iter()
            .rev()
            .copied()
            .find(|&p| !self.is_null(p))
            .ok_or_else(|| Error::arg("seq_id", format!("sequence {id} holds no state page yet")))
    }
}
