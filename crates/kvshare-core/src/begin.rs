//! Beginning a sequence: the prefix hit every group can serve (whole pages, the pool tier's run,
//! units inside a page), the admission check, the shared and fresh pages of every group's table,
//! and the positions a window no longer reads (at the hit, or at the tokens computed elsewhere).

use super::alloc::try_copy;
use super::config::MAX_GROUPS;
use super::error::{Error, Result};
use super::pool::Holder;
use super::pooltier::PoolAnswer;
use super::prefix::ExtraKeys;
use super::rules::GrowState;
use super::seq::{BeginInfo, PageKey, Seq};
use super::state::{Hit, State, NULL_PAGE};
use super::tier::Tier;

impl State {
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
    /// check counts the pages that remain. `computed` at most the hit changes nothing; a group
    /// whose window leaves a unit hit's page behind takes no copy of it. Refused
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
            let hit = self.groups_hit(&keys, tokens, limit, true, false);
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
        let units = match parent {
            // Whole pages from the pool beat a part of one.
            Some(parent) if run == 0 => {
                self.unit_hits(tokens, extra.as_deref(), parent, hit_pages, limit)
            }
            _ => Vec::new(),
        };
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
        // A unit copy lands in the page after the hit, in the groups that still read it there
        // (not where a window dropped it at the tokens computed elsewhere).
        let copied = |g: usize| start[g] <= hit_pages;
        for (g, u) in units.iter().enumerate().filter(|&(g, _)| copied(g)) {
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
        for (g, &u) in units.iter().enumerate().filter(|&(g, _)| copied(g)) {
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
        for (g, &u) in units.iter().enumerate().filter(|&(g, _)| copied(g)) {
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
            retain: Vec::new(),
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
}
