//! Sequences: begin (with the prefix hit), registration of full pages (and dedup), fork, free,
//! release of positions a group no longer reads, priorities and accessors. Appends are in
//! `append.rs`, swaps between tiers in `swap.rs`, the batch views in `batch.rs`.

use super::alloc::try_copy;
use super::config::MAX_GROUPS;
use super::error::{Error, Result};
use super::pool::{Holder, PRIORITIES};
use super::pooltier::PoolAnswer;
use super::prefix::{has_placeholder, Entry, ExtraKeys};
use super::rules::GrowState;
use super::seq::{BeginInfo, PageKey, Seq, SeqInfo, HOST_NULL};
use super::state::{Hit, Release, State, NULL_PAGE};
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

    /// Starts sequence `id` with its prompt: matches the longest cached prefix every group can
    /// serve, shares those pages, and allocates pages for the rest and `lookahead` more slots.
    /// All or nothing.
    ///
    /// With a match unit below the page size, a prefix that goes on inside a cached page for
    /// whole units also counts (a page no sequence holds: a held page may have filled in this
    /// step, and a copy runs before the step's KV writes): the sequence's first new page of
    /// each group receives those units by a partial copy queued for
    /// [`take_copies`](Self::take_copies) (the copy holds its source page until taken); the
    /// page is the sequence's own and is registered once full, like any other.
    ///
    /// The reported `matched_tokens` (what the engine may skip computing) is at most
    /// `max_match_tokens`. A plain model with `skip_cached_writes` shares every cached full page
    /// even past that limit, and the slot mapping hides its slots (-1); otherwise only whole
    /// pages within the limit are shared.
    pub fn begin(
        &mut self,
        id: u64,
        tokens: &[i32],
        extra: Option<ExtraKeys>,
        max_match_tokens: usize,
        lookahead: usize,
    ) -> Result<BeginInfo> {
        self.begin_at(id, tokens, extra, max_match_tokens, lookahead, 0, None)
    }

    /// [`begin`](Self::begin) of a sequence whose first `computed` tokens have KV once the call
    /// returns, whether found cached or written by the engine from elsewhere (vLLM's KV
    /// connectors load the tokens after the hit into the sequence's slots): each group's table
    /// gets the null page wherever the group no longer reads at `computed` (a window's dropped
    /// positions take no page, as in vLLM's `allocate_new_computed_blocks`), and the admission
    /// check counts the pages that remain. `computed` at most the hit changes nothing; a unit
    /// hit is dropped when a group's window leaves its page behind. Refused
    /// (`InvalidArgument`) for `computed` past the prompt and its lookahead slots, and for a
    /// nonzero `computed` on a cache with a state group.
    pub fn begin_computed(
        &mut self,
        id: u64,
        tokens: &[i32],
        extra: Option<ExtraKeys>,
        max_match_tokens: usize,
        lookahead: usize,
        computed: usize,
    ) -> Result<BeginInfo> {
        self.begin_at(
            id,
            tokens,
            extra,
            max_match_tokens,
            lookahead,
            computed,
            None,
        )
    }

    /// [`begin`](Self::begin) with the store's answer to a [`pool_lookup`](Self::pool_lookup)
    /// of the same prompt: the run of positions, from where the local hit ends, whose keys the
    /// store holds in every group is matched too, its pages loading (see [`crate::pooltier`]).
    /// An answer that starts after the local hit's end loads nothing. Refused without a pool
    /// tier or with an answer that is not a whole number of positions.
    pub fn begin_pooled(
        &mut self,
        id: u64,
        tokens: &[i32],
        extra: Option<ExtraKeys>,
        max_match_tokens: usize,
        lookahead: usize,
        answer: Option<PoolAnswer<'_>>,
    ) -> Result<BeginInfo> {
        self.begin_at(id, tokens, extra, max_match_tokens, lookahead, 0, answer)
    }

    #[allow(clippy::too_many_arguments)]
    fn begin_at(
        &mut self,
        id: u64,
        tokens: &[i32],
        extra: Option<ExtraKeys>,
        max_match_tokens: usize,
        lookahead: usize,
        computed: usize,
        answer: Option<PoolAnswer<'_>>,
    ) -> Result<BeginInfo> {
        if self.seqs.contains_key(&id) {
            return Err(Error::SeqExists(id));
        }
        let slots = tokens.len().checked_add(lookahead).ok_or_else(|| {
            Error::arg(
                "lookahead_slots",
                format!("{} + {lookahead} overflow", tokens.len()),
            )
        })?;
        self.check_lookahead(lookahead)?;
        if computed > slots {
            return Err(Error::arg(
                "computed_tokens",
                format!("{computed} past the {slots} slots of the prompt and its lookahead"),
            ));
        }
        if computed > 0 && self.groups.iter().any(|g| g.rules.is_state()) {
            return Err(Error::arg(
                "computed_tokens",
                "a state group's state is the engine's own once computed; begin with the hit",
            ));
        }
        let extra = extra.filter(|x| !x.is_empty()).map(Box::new);
        let ps = self.ps;
        let ng = self.groups.len();
        let limit = tokens.len().min(max_match_tokens);
        // The hit, per group: positions (None: the null page) and the pages' keys.
        let (positions, keys, stopped): (Vec<Vec<Option<Hit>>>, Vec<PageKey>, bool) = if self.plain
        {
            let max_pages = if self.cfg.skip_cached_writes {
                tokens.len() / ps
            } else {
                limit / ps
            };
            let walked = self.walk(tokens, extra.as_deref(), max_pages, true);
            let keys = walked.iter().map(|(_, k)| *k).collect();
            (
                vec![walked.into_iter().map(|(h, _)| Some(h)).collect()],
                keys,
                false,
            )
        } else {
            let (keys, stopped) = if self.cfg.enable_prefix_caching {
                self.page_keys(tokens, extra.as_deref(), &[])
            } else {
                (Vec::new(), false)
            };
            let hit = self.groups_hit(&keys, tokens, limit, true);
            (hit.groups, keys, stopped)
        };
        let hit_pages = positions.iter().map(Vec::len).max().unwrap_or(0);
        // Pages after the local hit that the pool holds: their keys, hashed to the end.
        let (keys, stopped, run) = match answer {
            Some(a) => {
                let (keys, stopped) = self.page_keys(tokens, extra.as_deref(), &keys);
                let run = self.pool_run(&a, hit_pages, limit, keys.len())?;
                (keys, stopped, run)
            }
            None => (keys, stopped, 0),
        };
        // A hit can run past the hashed pages (chunked local attention never looks up the pages
        // before its chunk): then no page key continues it inside a page.
        let parent = match hit_pages {
            0 => Some(self.root),
            n => keys.get(n - 1).map(|k| k.hash),
        };
        let mut units = match parent {
            // Whole pages from the pool beat a part of one.
            Some(parent) if run == 0 => {
                self.unit_hits(tokens, extra.as_deref(), parent, hit_pages, limit)
            }
            _ => Vec::new(),
        };
        // A unit copy lands in the page after the hit: not where a window no longer reads.
        if (0..ng).any(|g| self.groups[g].rules.skipped_tokens(computed) / ps > hit_pages) {
            units.clear();
        }
        let unit_tokens = units.first().map_or(0, |u| u.tokens);
        let hit_tokens = (hit_pages + run) * ps;
        let matched = (hit_tokens + unit_tokens).min(max_match_tokens);
        let total = slots.div_ceil(ps);
        // The tokens with KV once the call returns, which set what each window drops.
        let reads_at = matched.max(computed);
        self.state_gate(&keys, &positions)?;
        // Per group: skipped positions, fresh pages; per pool: needs and reserved cached pages.
        let np = self.pools.len();
        // Pools and groups number at most MAX_GROUPS: the counts live on the stack.
        let (mut need, mut reserved) = ([0usize; MAX_GROUPS], [0usize; MAX_GROUPS]);
        // Per group: hits dropped (the null page); the first fresh position.
        let (mut skip, mut start) = ([0usize; MAX_GROUPS], [0usize; MAX_GROUPS]);
        let mut new_pages = 0;
        let mut promoted = 0;
        for g in 0..ng {
            let pool = self.groups[g].pool;
            let pos = &positions[g];
            let rules = &self.groups[g].rules;
            let dropped = rules.skipped_tokens(reads_at) / ps;
            skip[g] = dropped.min(pos.len());
            start[g] = dropped.min(total).max(pos.len());
            let fresh = rules.begin_pages(total, start[g], tokens.len(), ps);
            let live = || pos[skip[g]..].iter().flatten();
            let host = live().filter(|h| h.tier == Tier::Host).count();
            promoted += host;
            need[pool] += fresh + host;
            new_pages += fresh;
            reserved[pool] += self.cached_among(pool, live());
            self.pools[pool]
                .device
                .check_acquire(live().filter(|h| h.tier == Tier::Device).map(|h| h.page))?;
        }
        for (g, u) in units.iter().enumerate() {
            let pool = self.groups[g].pool;
            // Holding a cached device source takes it off the evictable set, like a device hit.
            if u.tier == Tier::Device && self.pools[pool].device.refcount(u.page) == 0 {
                reserved[pool] += 1;
            }
            self.pool_tier(pool, u.tier).check_acquire([u.page])?;
        }
        for p in 0..np {
            self.ensure_available(p, Tier::Device, need[p], reserved[p])?;
        }
        let owned = try_copy(tokens, "tokens")?;
        // Nothing can fail from here.
        if self.cfg.enable_prefix_caching {
            self.counters.prefix_queries += 1;
            self.counters.prefix_query_tokens += tokens.len() as u64;
            // Pool pages count once loaded (`PoolStats::hit_tokens`).
            self.counters.prefix_hit_tokens += matched.saturating_sub(run * ps) as u64;
        }
        // Unit sources are held first, so that no promotion, demotion or allocation below can
        // evict them before their copies are queued.
        for (g, &u) in units.iter().enumerate() {
            self.hold_unit_source(g, u);
        }
        // Every group's hits are held before any page is taken: a promotion or a fresh page of
        // one group must not evict a cached page another group's hit found.
        for (g, pos) in positions.iter().enumerate() {
            self.hold_hits(g, pos[skip[g]..].iter().flatten(), Holder::Seq);
        }
        let mut tables = Vec::with_capacity(ng);
        let mut grow = vec![GrowState::default(); ng];
        for (g, pos) in positions.iter().enumerate() {
            let mut t: Vec<u32> = Vec::with_capacity(total.max(pos.len()));
            // Positions before a group's live run stay null; the live hits are its pages.
            t.resize(skip[g], NULL_PAGE);
            self.promote_held(g, pos[skip[g]..].iter().copied(), Holder::Seq, &mut t);
            t.resize(start[g], NULL_PAGE); // dropped positions past the hit
            tables.push(t);
        }
        // vLLM's order: with tokens computed past the hit, every group's pages for them first
        // (`allocate_new_computed_blocks`), then every group's for the rest.
        let upto = computed.div_ceil(ps).min(total);
        let ends: &[usize] = if computed > matched && upto < total {
            &[upto, total]
        } else {
            &[total]
        };
        for &end in ends {
            for (g, t) in tables.iter_mut().enumerate() {
                let pool = self.groups[g].pool;
                let rules = &self.groups[g].rules;
                let want = rules.begin_len(end, tokens.len(), ps);
                let n = rules.begin_pages(end, t.len(), tokens.len(), ps);
                let mut taken = std::mem::take(&mut self.page_scratch);
                taken.clear();
                taken.extend((0..n).map(|_| self.take_device(pool, Holder::Seq)));
                let mut it = taken.drain(..);
                self.groups[g]
                    .rules
                    .grow(t, want, &mut grow[g], NULL_PAGE, &mut || {
                        it.next().expect("begin takes the pages its rules count")
                    });
                debug_assert!(it.next().is_none(), "every page taken is placed");
                drop(it);
                self.page_scratch = taken;
            }
        }
        for (g, &u) in units.iter().enumerate() {
            // The new page after the shared ones receives the cached units.
            let dst = tables[g][hit_pages];
            self.queue_unit_copy(g, u, dst);
        }
        let answered = answer.map_or(0, |a| a.hits.iter().filter(|&&h| h).count());
        let pool = (answer.is_some()).then(|| {
            Box::new(self.queue_loads(
                id,
                hit_pages..hit_pages + run,
                &tables,
                &keys,
                tokens,
                answered,
            ))
        });
        let seq = Seq {
            tokens: owned,
            extra,
            keys,
            hash_stopped: stopped,
            tables,
            offered: vec![hit_pages; ng],
            grow,
            borrowed: vec![Vec::new(); ng],
            tier: Tier::Device,
            pending: false,
            computed: usize::MAX,
            matched_tokens: matched,
            cached_tokens: hit_tokens,
            stamp: 0,
            priority: 0,
            pool: pool.filter(|p| p.loading()),
        };
        let mut seq = seq;
        self.register_seq(id, &mut seq);
        self.seqs.insert(id, seq);
        Ok(BeginInfo {
            matched_tokens: matched,
            num_pages: total,
            new_pages,
            promoted_pages: promoted,
            unit_tokens,
            pool_pages: run,
        })
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
    fn state_gate(&self, keys: &[PageKey], positions: &[Vec<Option<Hit>>]) -> Result<()> {
        for (g, pos) in positions.iter().enumerate() {
            if !self.groups[g].rules.is_state() {
                continue;
            }
            let Some(last) = pos.len().checked_sub(1).and_then(|j| keys.get(j)) else {
                continue;
            };
            if self.this_step[g].contains_key(&last.hash) {
                let pool = &self.pools[self.groups[g].pool].device;
                return Err(Error::NoSpace {
                    tier: Tier::Device,
                    needed: pool.num_pages() as usize + 1,
                    available: pool.available(),
                });
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
        let dedup = self.cfg.skip_cached_writes;
        let full = s.keys.len().min(s.final_pages(ps));
        let lora = s.lora();
        // Nothing from the first loading position on is matchable before the loads settle;
        // positions loaded from the pool are not stored back.
        let (gate, loaded) = match s.pool.as_deref() {
            Some(p) if p.loading() => (p.start, 0..0),
            Some(p) => (usize::MAX, p.start..p.end),
            None => (usize::MAX, 0..0),
        };
        for g in 0..self.groups.len() {
            let pool = self.groups[g].pool;
            let state = self.groups[g].rules.is_state();
            let to = full.min(s.tables[g].len()).min(gate);
            let from = s.offered[g].min(to);
            for j in from..to {
                let page = s.tables[g][j];
                if self.is_null(page) {
                    continue;
                }
                let k = s.keys[j];
                if state {
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
                    continue;
                }
                let p = &self.pools[pool];
                if p.index.is_registered(page) || p.dup_of[page as usize].is_some() {
                    continue;
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
            s.offered[g] = s.offered[g].max(to);
        }
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
        let s = self.seqs.remove(&id).ok_or(Error::SeqNotFound(id))?;
        if let Some(p) = s.pool.as_deref().filter(|p| p.loading()) {
            self.pool_orphan(&p.tickets);
        }
        if s.tier == Tier::Device {
            self.keep_partial_pages(&s);
        }
        for (g, t) in s.tables.iter().enumerate() {
            let pool = self.groups[g].pool;
            match s.tier {
                Tier::Device => {
                    if self.groups[g].rules.free_prepends_uncached() {
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
