//! Sequences: begin (with the prefix hit), registration of full pages (and dedup), append with
//! copy-on-write, fork, free, release of positions a group no longer reads, priorities and
//! accessors. Swapping between tiers is in `swap.rs`; the batch views are in `batch.rs`.

use super::alloc::try_copy;
use super::copies::{CopyKind, PageCopy};
use super::error::{Error, Result};
use super::pool::{Holder, PRIORITIES};
use super::prefix::{Entry, ExtraKeys};
use super::rules::GrowState;
use super::seq::{AppendNeed, BeginInfo, PageKey, Seq, SeqInfo, HOST_NULL};
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

/// What an append would take: per pool, new capacity plus copy-on-write replacements, the
/// copies it would report, and the pages an align state group releases first.
#[derive(Debug, Default)]
struct AppendPlan {
    need: Vec<usize>,
    copies: usize,
    /// Align groups whose stale state page goes first.
    stale: Vec<usize>,
    /// Per pool: pages those releases give back.
    back: Vec<usize>,
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
    fn check_lookahead(&self, lookahead: usize) -> Result<()> {
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
        // A hit can run past the hashed pages (chunked local attention never looks up the pages
        // before its chunk): then no page key continues it inside a page.
        let parent = match hit_pages {
            0 => Some(self.root),
            n => keys.get(n - 1).map(|k| k.hash),
        };
        let units = match parent {
            Some(parent) => self.unit_hits(tokens, extra.as_deref(), parent, hit_pages, limit),
            None => Vec::new(),
        };
        let unit_tokens = units.first().map_or(0, |u| u.tokens);
        let hit_tokens = hit_pages * ps;
        let matched = (hit_tokens + unit_tokens).min(max_match_tokens);
        let total = slots.div_ceil(ps);
        self.state_gate(&keys, &positions)?;
        // Per group: skipped positions, fresh pages; per pool: needs and reserved cached pages.
        let np = self.pools.len();
        let (mut need, mut reserved) = (vec![0usize; np], vec![0usize; np]);
        let mut skip = vec![0; ng];
        let mut new_pages = 0;
        let mut promoted = 0;
        for g in 0..ng {
            let pool = self.groups[g].pool;
            let pos = &positions[g];
            let rules = &self.groups[g].rules;
            skip[g] = (rules.skipped_tokens(matched) / ps).min(pos.len());
            let fresh = rules.begin_pages(total, pos.len(), tokens.len(), ps);
            let live: Vec<Hit> = pos[skip[g]..].iter().flatten().copied().collect();
            let host = live.iter().filter(|h| h.tier == Tier::Host).count();
            promoted += host;
            need[pool] += fresh + host;
            new_pages += fresh;
            reserved[pool] += self.cached_among(pool, &live);
            self.pools[pool].device.check_acquire(
                live.iter()
                    .filter(|h| h.tier == Tier::Device)
                    .map(|h| h.page),
            )?;
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
            self.counters.prefix_hit_tokens += matched as u64;
        }
        // Unit sources are held first, so that no promotion, demotion or allocation below can
        // evict them before their copies are queued.
        for (g, &u) in units.iter().enumerate() {
            self.hold_unit_source(g, u);
        }
        // Every group's hits are held before any page is taken: a promotion or a fresh page of
        // one group must not evict a cached page another group's hit found.
        let live: Vec<Vec<Hit>> = (0..ng)
            .map(|g| positions[g][skip[g]..].iter().flatten().copied().collect())
            .collect();
        for (g, hits) in live.iter().enumerate() {
            self.hold_hits(g, hits, Holder::Seq);
        }
        let mut tables = Vec::with_capacity(ng);
        let mut grow = vec![GrowState::default(); ng];
        for g in 0..ng {
            let pos = &positions[g];
            let mut pages = self.promote_held(g, &live[g], Holder::Seq).into_iter();
            let mut t: Vec<u32> = Vec::with_capacity(total.max(pos.len()));
            t.resize(skip[g], NULL_PAGE);
            // Positions before a group's live run stay null; the live hits are its pages.
            for h in &pos[skip[g]..] {
                t.push(match h {
                    None => NULL_PAGE,
                    Some(_) => pages.next().expect("one page per live hit"),
                });
            }
            tables.push(t);
        }
        for g in 0..ng {
            let pool = self.groups[g].pool;
            let hit_len = positions[g].len();
            let want = self.groups[g].rules.begin_len(total, tokens.len(), ps);
            let n = self.groups[g]
                .rules
                .begin_pages(total, hit_len, tokens.len(), ps);
            let taken: Vec<u32> = (0..n)
                .map(|_| self.take_device(pool, Holder::Seq))
                .collect();
            let mut it = taken.into_iter();
            let t = &mut tables[g];
            self.groups[g]
                .rules
                .grow(t, want, &mut grow[g], NULL_PAGE, &mut || {
                    it.next().expect("begin takes the pages its rules count")
                });
            debug_assert!(it.next().is_none(), "every page taken is placed");
            if let Some(&u) = units.get(g) {
                // The new page after the shared ones receives the cached units.
                let dst = tables[g][hit_pages];
                self.queue_unit_copy(g, u, dst);
            }
        }
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
            matched_tokens: matched,
            cached_tokens: hit_tokens,
            stamp: 0,
            priority: 0,
        };
        self.seqs.insert(id, seq);
        self.register_full_pages(id);
        Ok(BeginInfo {
            matched_tokens: matched,
            num_pages: total,
            new_pages,
            promoted_pages: promoted,
            unit_tokens,
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
        if self.cfg.defer_commit {
            if let Some(s) = self.seqs.get_mut(&id) {
                let full = s.tokens.len() / self.ps;
                let behind = s.offered.iter().any(|&o| o < full);
                if !s.pending && !s.hash_stopped && behind {
                    s.pending = true;
                    self.uncommitted.push(id);
                }
            }
            return;
        }
        self.register_now(id);
    }

    /// vLLM's `cache_blocks`, groups in order: hashes the newly full pages, then registers each
    /// group's pages at positions not offered yet. A page whose content the group has already
    /// registered is switched to that page (dedup, with `skip_cached_writes`), kept as a
    /// duplicate (vLLM's way, with `vllm_free_order`), or left unregistered.
    fn register_now(&mut self, id: u64) {
        let ps = self.ps;
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        if !s.hash_stopped && s.keys.len() < s.tokens.len() / ps {
            let (tokens, extra, keys) = (
                std::mem::take(&mut s.tokens),
                s.extra.take(),
                std::mem::take(&mut s.keys),
            );
            let (keys, stopped) = self.page_keys(&tokens, extra.as_deref(), &keys);
            let s = self.seqs.get_mut(&id).expect("live sequence");
            (s.tokens, s.extra, s.keys, s.hash_stopped) = (tokens, extra, keys, stopped);
        }
        let dedup = self.cfg.skip_cached_writes;
        let full = self.seqs[&id].keys.len();
        for g in 0..self.groups.len() {
            let pool = self.groups[g].pool;
            let state = self.groups[g].rules.is_state();
            let (from, to) = {
                let s = &self.seqs[&id];
                (s.offered[g], full.min(s.tables[g].len()))
            };
            for j in from..to {
                let s = &self.seqs[&id];
                let page = s.tables[g][j];
                if self.is_null(page) {
                    continue;
                }
                let k = s.keys[j];
                if state {
                    self.this_step[g].insert(k.hash, ());
                }
                let parent = s.parent(j, self.root);
                let lora = s.lora();
                let tokens = s.tokens[j * ps..(j + 1) * ps].to_vec();
                let entry = Entry {
                    hash: k.hash,
                    parent,
                    extra: k.extra,
                    lora,
                    tokens: &tokens,
                };
                let g32 = g as u32;
                if self.index_insert(pool, Tier::Device, g32, page, entry) {
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
                    let canonical = p.index.lookup(g32, k.hash, k.extra, &tokens);
                    let shareable = |c: u32| c != page && p.device.check_acquire([c]).is_ok();
                    if let Some(c) = canonical.filter(|&c| shareable(c)) {
                        self.pools[pool].device.acquire(c, Holder::Seq);
                        self.release_device(pool, page, Holder::Seq, Release::Free);
                        let s = self.seqs.get_mut(&id).expect("live sequence");
                        s.tables[g][j] = c;
                        s.borrowed[g].push(j as u32);
                        self.counters.dedup_pages += 1;
                    }
                } else if self.cfg.vllm_free_order {
                    // Same content as a registered page: a duplicate, as vLLM keeps it.
                    self.dup_insert(pool, g32, page, entry);
                }
            }
            let s = self.seqs.get_mut(&id).expect("live sequence");
            s.offered[g] = s.offered[g].max(to);
        }
    }

    /// Makes every page that filled up since the last commit matchable (MindIE's
    /// `MarkBlocksAsComputed`). A no-op unless the config defers commits.
    pub fn commit(&mut self) {
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
                self.register_now(id);
            }
        }
    }

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
        let np = self.pools.len();
        let mut plan = AppendPlan {
            need: vec![0; np],
            back: vec![0; np],
            ..AppendPlan::default()
        };
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
                    plan.stale.push(g);
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
        for (p, &n) in plan.need.iter().enumerate() {
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
        stale: &[usize],
        copies: &mut Vec<PageCopy>,
    ) {
        let ps = self.ps;
        let old = self.seqs[&id].tokens.len();
        let n = tokens.len();
        let want = (old + n + lookahead).div_ceil(ps);
        for &g in stale {
            self.release_stale_state(id, g, old);
        }
        let prio = self.seqs[&id].priority;
        for g in 0..self.groups.len() {
            let pool = self.groups[g].pool;
            let len = self.seqs[&id].tables[g].len();
            let span = self.groups[g].rules.written(old, n, len, ps);
            for j in span {
                let src = self.seqs[&id].tables[g][j];
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
                self.seqs.get_mut(&id).expect("checked").tables[g][j] = dst;
            }
            let need = self.groups[g]
                .rules
                .grow_pages(&self.seqs[&id].tables[g], want);
            let fresh: Vec<u32> = (0..need)
                .map(|_| {
                    let p = self.take_device(pool, Holder::Seq);
                    self.pools[pool].device.raise_priority(p, prio);
                    p
                })
                .collect();
            let s = self.seqs.get_mut(&id).expect("checked");
            let mut it = fresh.into_iter();
            let (table, st) = (&mut s.tables[g], &mut s.grow[g]);
            self.groups[g]
                .rules
                .grow(table, want, st, NULL_PAGE, &mut || {
                    it.next().expect("append takes the pages its rules count")
                });
        }
        let s = self.seqs.get_mut(&id).expect("checked");
        s.tokens.extend_from_slice(tokens);
        self.register_full_pages(id);
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
        self.append_unchecked(id, tokens, lookahead, &plan.stale, copies);
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
        let np = self.pools.len();
        let (mut need, mut back) = (vec![0usize; np], vec![0usize; np]);
        let mut n_copies = 0;
        let mut stale: Vec<Vec<usize>> = Vec::with_capacity(ids.len());
        // Shared pages the batch writes into: (pool, page, whether its tokens must be copied).
        let mut shared: Vec<(usize, u32, bool)> = Vec::new();
        self.batch_stamp += 1;
        let stamp = self.batch_stamp;
        for &id in ids {
            let s = self.device_seq(id)?;
            if s.stamp == stamp {
                return Err(Error::arg(
                    "seq_ids",
                    format!("sequence {id} appears twice in the batch"),
                ));
            }
            self.seqs.get_mut(&id).expect("checked").stamp = stamp;
            let s = &self.seqs[&id];
            let plan = self.append_plan(s, 1, 0)?;
            let old = s.tokens.len();
            let want = (old + 1).div_ceil(self.ps);
            for (g, t) in s.tables.iter().enumerate() {
                let grp = &self.groups[g];
                let grows = grp.rules.grow_pages(t, want);
                need[grp.pool] += grows;
                for j in grp.rules.written(old, 1, t.len(), self.ps) {
                    let p = t[j];
                    if !self.is_null(p) && self.pools[grp.pool].device.refcount(p) > 1 {
                        let data = grp.rules.copy_tokens(j, old, self.ps) > 0;
                        shared.push((grp.pool, p, data));
                    }
                }
            }
            for (p, b) in plan.back.iter().enumerate() {
                back[p] += b;
            }
            stale.push(plan.stale);
        }
        // w writers into a page with r holders copy min(w, r - 1) times: the last holder left
        // writes in place.
        shared.sort_unstable();
        for run in shared.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let (pool, page, data) = run[0];
            let rc = self.pools[pool].device.refcount(page) as usize;
            let c = run.len().min(rc - 1);
            need[pool] += c;
            if data {
                n_copies += c;
            }
        }
        check_room("copies_out", n_copies, max_copies)?;
        self.ensure_plan(&AppendPlan {
            need,
            back,
            ..AppendPlan::default()
        })?;
        for &id in ids {
            self.reserve_tokens(id, 1)?;
        }
        for (i, &id) in ids.iter().enumerate() {
            self.append_unchecked(id, &tokens[i..i + 1], 0, &stale[i], copies);
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

    /// Creates `child` sharing every page of `parent` in every group (beam search, parallel
    /// sampling). Writes into shared pages later copy them on write (a state group's running
    /// state included).
    pub fn fork(&mut self, parent: u64, child: u64) -> Result<()> {
        if self.seqs.contains_key(&child) {
            return Err(Error::SeqExists(child));
        }
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
        if s.tier == Tier::Device {
            self.keep_partial_pages(&s);
        }
        for (g, t) in s.tables.iter().enumerate() {
            let pool = self.groups[g].pool;
            match s.tier {
                Tier::Device => {
                    let rev: Vec<u32> = t
                        .iter()
                        .rev()
                        .copied()
                        .filter(|&p| !self.is_null(p))
                        .collect();
                    if self.groups[g].rules.free_prepends_uncached() {
                        self.release_split(pool, &rev, Holder::Seq);
                    } else {
                        for p in rev {
                            self.release_device(pool, p, Holder::Seq, Release::Free);
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
        let units = s.tokens.len().saturating_sub(start) / unit;
        if s.hash_stopped || units == 0 || s.tokens.len() - start >= ps || j >= s.len() {
            return;
        }
        let tokens = &s.tokens[start..start + units * unit];
        if tokens.iter().any(|&t| t < 0) {
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

    /// Align's extra release (`Rules::stale_state`), as vLLM's `free_blocks` does: to the back
    /// of the reuse order in vLLM's order; in kvshare's, a page without cached content is free.
    /// Returns the pages released (0 or 1).
    fn release_stale_state(&mut self, id: u64, g: usize, num_computed: usize) -> usize {
        let s = &self.seqs[&id];
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
        let s = self.seqs.get_mut(&id).expect("checked");
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
