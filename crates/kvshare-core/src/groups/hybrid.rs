//! [`Hybrid`]: a cache made of KV-cache groups, and the sequence operations an engine calls.
//!
//! Composition over the single-group machinery: one [`PagePool`] per distinct page size in
//! bytes, one [`PrefixIndex`] per group (a page is registered in at most one group's index), and
//! per sequence one block table per group. The chain digests are the single-group cache's
//! (README, "Prefix keys"), the same for every group; the (digest, group) pair names a cached
//! page, as vLLM's `BlockHashWithGroupId` does.
//!
//! The pool is used as vLLM's single free queue: the free list is the queue's front part
//! (never-used pages, and pages vLLM prepends: unregistered pages a sliding-window group
//! releases), the priority-0 "cached" list its back part (every page vLLM appends: whatever a
//! full-attention group frees, registered or not, and registered window pages). Taking pops the
//! free list first, then the back part, which is exactly popping vLLM's queue head. Such a page
//! may sit on the back list unregistered; the hybrid checker knows that.
//!
//! Duplicates are kept as vLLM keeps them: a page filled with content its group already has
//! registered (two sequences computed the same page) is recorded as a duplicate of that digest;
//! when the registered page is evicted, the oldest duplicate takes its place in the index, and
//! a duplicate counts as cached (it has a digest) when released. So hits and the reuse order are
//! vLLM's even when identical pages are computed twice.
//!
//! Every operation validates everything first and mutates only once it cannot fail.

use std::collections::VecDeque;

use super::super::alloc::try_copy;
use super::super::config::Tier;
use super::super::error::{Error, Result};
use super::super::events::{EventKind, MAX_QUEUED_EVENTS};
use super::super::hashing::{DigestMap, IdMap};
use super::super::pool::{Holder, PagePool};
use super::super::prefix::{chain_hash, root_hash, Entry, ExtraKeys, PrefixIndex};
use super::spec::{GroupKind, HybridConfig, StateMode};

/// The page every pool reserves (vLLM's `null_block`): what released positions show.
pub const NULL_PAGE: u32 = 0;

/// One index change of one group (vLLM's `BlockStored` / `BlockRemoved`, with `group_idx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupEvent {
    /// Stored or Removed.
    pub kind: EventKind,
    /// The group whose index changed.
    pub group: u32,
    /// Chain digest of the page.
    pub hash: u128,
    /// Chain digest of the previous page (Stored only).
    pub parent: u128,
    /// LoRA id of the sequence that stored it (Stored only).
    pub lora_id: u64,
    /// Tokens in the page.
    pub num_tokens: u32,
    /// Page id in the group's pool.
    pub page: u32,
}

/// Cumulative counters of one group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCounters {
    /// Pages registered in the group's index.
    pub stored: u64,
    /// Registered pages evicted from the group's index to be reused.
    pub evictions: u64,
    /// Pages released because they fell out of the group's window.
    pub released: u64,
}

/// What a page of a prompt is looked up and registered under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PageKey {
    /// Chain digest.
    pub hash: u128,
    /// Extra-key digest.
    pub extra: u128,
}

/// A sequence: its tokens and one block table per group.
#[derive(Debug, Clone)]
pub(super) struct HSeq {
    pub tokens: Vec<i32>,
    pub extra: Option<Box<ExtraKeys>>,
    /// Keys of the full pages hashed so far (up to the first page holding a placeholder).
    pub keys: Vec<PageKey>,
    pub hash_stopped: bool,
    /// Per group: page ids, [`NULL_PAGE`] at positions released or skipped.
    pub tables: Vec<Vec<u32>>,
    /// Per group: positions below this were offered to the group's index.
    pub offered: Vec<usize>,
    pub matched: usize,
    /// Per state group in mode align: vLLM's `last_state_block_idx` (the previous step's state
    /// position) and whether it ever allocated (`_allocated_block_reqs`).
    pub state_last: Vec<Option<usize>>,
    pub state_alloc: Vec<bool>,
}

/// What [`Hybrid::begin`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridBegin {
    /// The hit: tokens the engine may skip computing.
    pub matched_tokens: usize,
    /// Length of every group's block table.
    pub num_pages: usize,
    /// Pages taken fresh, all groups together.
    pub new_pages: usize,
}

/// Everything a cache of groups manages. Not thread-safe by itself (the FFI wraps it in a lock).
#[derive(Debug)]
pub struct Hybrid {
    pub(super) cfg: HybridConfig,
    pub(super) ps: usize,
    /// Pool of each group.
    pub(super) pool_of: Vec<usize>,
    pub(super) pools: Vec<PagePool>,
    /// Groups of each pool.
    pub(super) pool_groups: Vec<Vec<usize>>,
    /// Prefix index of each group.
    pub(super) indices: Vec<PrefixIndex>,
    /// Per group: later pages holding a registered digest's content, oldest first.
    pub(super) dups: Vec<DigestMap<Vec<u32>>>,
    /// Per pool and page: the (group, digest) it duplicates, if any.
    pub(super) dup_of: Vec<Vec<Option<(u32, u128)>>>,
    /// Lookup sets: groups with identical specs, full-attention sets first (vLLM's
    /// `attention_groups` after its sort).
    pub(super) sets: Vec<Vec<usize>>,
    pub(super) seqs: IdMap<HSeq>,
    pub(super) events: VecDeque<GroupEvent>,
    pub(super) events_dropped: u64,
    pub(super) counters: Vec<GroupCounters>,
    pub(super) prefix_queries: u64,
    pub(super) prefix_hit_tokens: u64,
    /// Per group: digests a state group registered since the last [`Hybrid::new_step`]
    /// (vLLM's `MambaManager.cached_blocks_this_step`); empty for other kinds.
    pub(super) this_step: Vec<std::collections::HashSet<u128>>,
    root: u128,
    scratch: Vec<u8>,
}

fn no_space(needed: usize, available: usize) -> Error {
    Error::NoSpace {
        tier: Tier::Device,
        needed,
        available,
    }
}

impl Hybrid {
    /// Validates `cfg` and builds an empty cache.
    pub fn new(cfg: HybridConfig) -> Result<Self> {
        cfg.validate()?;
        let (pool_of, num_pools) = cfg.pools();
        let mut pools = Vec::with_capacity(num_pools);
        for _ in 0..num_pools {
            pools.push(PagePool::new(
                Tier::Device,
                cfg.num_pages,
                true,
                "num_pages",
            )?);
        }
        let mut pool_groups = vec![Vec::new(); num_pools];
        for (g, &p) in pool_of.iter().enumerate() {
            pool_groups[p].push(g);
        }
        let index_pages = if cfg.enable_prefix_caching {
            cfg.num_pages
        } else {
            0
        };
        let mut indices = Vec::with_capacity(cfg.groups.len());
        for _ in &cfg.groups {
            // Whole-page hits: the groups' caches take no `match_unit` (issue 19 is single-group).
            indices.push(PrefixIndex::new(
                index_pages,
                cfg.page_size,
                cfg.page_size as usize,
                "num_pages",
            )?);
        }
        let mut dup_of = Vec::with_capacity(num_pools);
        for _ in 0..num_pools {
            dup_of.push(super::super::alloc::try_vec(
                cfg.num_pages as usize,
                None,
                "num_pages",
            )?);
        }
        let mut sets: Vec<Vec<usize>> = Vec::new();
        for (g, spec) in cfg.groups.iter().enumerate() {
            match sets.iter_mut().find(|s| cfg.groups[s[0]] == *spec) {
                Some(s) => s.push(g),
                None => sets.push(vec![g]),
            }
        }
        // A stable sort, as vLLM's `list.sort`: full attention first, then first appearance.
        sets.sort_by_key(|s| cfg.groups[s[0]].kind != GroupKind::Full);
        Ok(Hybrid {
            ps: cfg.page_size as usize,
            pool_of,
            pools,
            pool_groups,
            indices,
            dups: vec![DigestMap::default(); cfg.groups.len()],
            dup_of,
            sets,
            seqs: IdMap::default(),
            events: VecDeque::new(),
            events_dropped: 0,
            counters: vec![GroupCounters::default(); cfg.groups.len()],
            prefix_queries: 0,
            prefix_hit_tokens: 0,
            this_step: vec![Default::default(); cfg.groups.len()],
            root: root_hash(),
            scratch: Vec::with_capacity(32 + 4 * cfg.page_size as usize),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HybridConfig {
        &self.cfg
    }

    /// Number of groups.
    pub fn num_groups(&self) -> usize {
        self.cfg.groups.len()
    }

    /// Number of pools.
    pub fn num_pools(&self) -> usize {
        self.pools.len()
    }

    /// The pool of `group`.
    pub fn pool_of(&self, group: usize) -> Result<usize> {
        self.check_group(group)?;
        Ok(self.pool_of[group])
    }

    /// A pool, for stats.
    pub fn pool(&self, pool: usize) -> Option<&PagePool> {
        self.pools.get(pool)
    }

    pub(super) fn check_group(&self, group: usize) -> Result<()> {
        if group >= self.cfg.groups.len() {
            return Err(Error::arg(
                "group",
                format!("{group} is not below the {} groups", self.cfg.groups.len()),
            ));
        }
        Ok(())
    }

    pub(super) fn seq(&self, id: u64) -> Result<&HSeq> {
        self.seqs.get(&id).ok_or(Error::SeqNotFound(id))
    }

    fn push_event(&mut self, e: GroupEvent) {
        if !self.cfg.enable_events {
            return;
        }
        if self.events.len() == MAX_QUEUED_EVENTS {
            self.events.pop_front();
            self.events_dropped += 1;
        }
        self.events.push_back(e);
    }

    /// Removes and returns up to `max` oldest events.
    pub fn take_events(&mut self, max: usize) -> Vec<GroupEvent> {
        let n = max.min(self.events.len());
        self.events.drain(..n).collect()
    }

    /// Events dropped because nobody drained the queue.
    pub fn events_dropped(&self) -> u64 {
        self.events_dropped
    }

    /// Keys of the full pages of `tokens`, up to the first page holding a placeholder (a
    /// negative token). Also reports whether such a page stopped the walk.
    pub(super) fn page_keys(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        from: &[PageKey],
    ) -> (Vec<PageKey>, bool) {
        let ps = self.ps;
        let mut keys = from.to_vec();
        let mut parent = keys.last().map_or(self.root, |k| k.hash);
        for (i, chunk) in tokens.chunks_exact(ps).enumerate().skip(keys.len()) {
            if chunk.iter().any(|&t| t < 0) {
                return (keys, true);
            }
            let e = extra.map_or(0, |x| x.page_digest(i, ps));
            parent = chain_hash(parent, e, chunk, &mut self.scratch);
            keys.push(PageKey {
                hash: parent,
                extra: e,
            });
        }
        (keys, false)
    }

    /// Whether `page` of group `g` carries a digest (registered, or a duplicate): vLLM's
    /// `block.block_hash is not None`.
    pub(super) fn has_hash(&self, g: usize, page: u32) -> bool {
        self.cfg.enable_prefix_caching
            && (self.indices[g].is_registered(page)
                || self.dup_of[self.pool_of[g]][page as usize].is_some())
    }

    /// Takes a page of `pool` for a sequence; a page popped with a digest loses it (vLLM's
    /// `_maybe_evict_cached_block`): a registered page leaves its group's index, the oldest
    /// duplicate of its content taking its place; a duplicate leaves its list. Availability
    /// was checked.
    pub(super) fn take(&mut self, pool: usize) -> u32 {
        let (page, _) = self.pools[pool]
            .take(Holder::Seq)
            .expect("availability checked by caller");
        if !self.cfg.enable_prefix_caching {
            return page;
        }
        let mut gone = None;
        if let Some((g, hash)) = self.dup_of[pool][page as usize].take() {
            let g = g as usize;
            let list = self.dups[g].get_mut(&hash).expect("duplicate listed");
            list.retain(|&p| p != page);
            if list.is_empty() {
                self.dups[g].remove(&hash);
            }
            gone = Some((g, hash));
        } else {
            for i in 0..self.pool_groups[pool].len() {
                let g = self.pool_groups[pool][i];
                let Some(e) = self.indices[g].entry(page) else {
                    continue;
                };
                let (hash, parent, extra, lora) = (e.hash, e.parent, e.extra, e.lora);
                let tokens = e.tokens.to_vec();
                self.indices[g].remove(page);
                if let Some(list) = self.dups[g].get_mut(&hash) {
                    let next = list.remove(0);
                    if list.is_empty() {
                        self.dups[g].remove(&hash);
                    }
                    self.dup_of[pool][next as usize] = None;
                    let entry = Entry {
                        hash,
                        parent,
                        extra,
                        lora,
                        tokens: &tokens,
                    };
                    let ok = self.indices[g].insert(next, entry);
                    debug_assert!(ok, "a duplicate's digest is free once its page left");
                }
                gone = Some((g, hash));
                break;
            }
        }
        if let Some((g, hash)) = gone {
            self.counters[g].evictions += 1;
            self.push_event(GroupEvent {
                kind: EventKind::Removed,
                group: g as u32,
                hash,
                parent: 0,
                lora_id: 0,
                num_tokens: self.ps as u32,
                page,
            });
        }
        page
    }

    /// The matched tokens of the longest hit of `tokens` (at most `max_tokens`) and each
    /// group's pages for it ([`NULL_PAGE`] where the group skips). Read-only but for hashing.
    pub fn find(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_tokens: usize,
    ) -> (usize, Vec<Vec<u32>>) {
        if !self.cfg.enable_prefix_caching {
            return (0, vec![Vec::new(); self.num_groups()]);
        }
        let (keys, _) = self.page_keys(tokens, extra, &[]);
        self.longest_hit(&keys, tokens, max_tokens.min(tokens.len()))
    }

    /// Starts sequence `id` with its known tokens: the longest hit across groups (at most
    /// `max_match_tokens`), then per group the null page where it skips, the hit pages, and fresh
    /// pages up to `tokens.len() + lookahead` slots; full pages are registered. All or nothing.
    pub fn begin(
        &mut self,
        id: u64,
        tokens: &[i32],
        extra: Option<ExtraKeys>,
        max_match_tokens: usize,
        lookahead: usize,
    ) -> Result<HybridBegin> {
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
        let (keys, stopped) = self.page_keys(tokens, extra.as_deref(), &[]);
        let max = max_match_tokens.min(tokens.len());
        let (hit, blocks) = if self.cfg.enable_prefix_caching {
            self.longest_hit(&keys, tokens, max)
        } else {
            (0, vec![Vec::new(); self.num_groups()])
        };
        let total = slots.div_ceil(self.ps);
        let hit_pages = hit / self.ps;
        let fresh = total.saturating_sub(hit_pages);
        self.state_gate(&keys, &blocks)?;
        let (mut need, mut reserved) = (vec![0; self.pools.len()], vec![0; self.pools.len()]);
        let mut skip = Vec::with_capacity(self.num_groups());
        let mut new_pages = 0;
        for (g, b) in blocks.iter().enumerate() {
            let pool = self.pool_of[g];
            let s = (self.cfg.groups[g].kind.skipped_tokens(hit) / self.ps).min(b.len());
            skip.push(s);
            let n = self.fresh_pages(g, total, fresh, tokens.len(), b.len());
            need[pool] += n;
            new_pages += n;
            let live = b[s..].iter().filter(|&&p| p != NULL_PAGE);
            reserved[pool] += live
                .clone()
                .filter(|&&p| self.pools[pool].refcount(p) == 0)
                .count();
            self.pools[pool].check_acquire(live.copied())?;
        }
        for (p, pool) in self.pools.iter().enumerate() {
            // vLLM's check: new blocks plus evictable hit blocks within the free count.
            if need[p] + reserved[p] > pool.available() {
                return Err(no_space(
                    need[p],
                    pool.available() - reserved[p].min(pool.available()),
                ));
            }
        }
        let owned = try_copy(tokens, "tokens")?;
        // Nothing can fail from here.
        if self.cfg.enable_prefix_caching {
            self.prefix_queries += 1;
            self.prefix_hit_tokens += hit as u64;
        }
        let mut tables = Vec::with_capacity(self.num_groups());
        for (g, b) in blocks.iter().enumerate() {
            let pool = self.pool_of[g];
            let mut t = vec![NULL_PAGE; skip[g]];
            t.reserve(total.max(skip[g]) - skip[g]);
            for &p in &b[skip[g]..] {
                if p != NULL_PAGE {
                    self.pools[pool].acquire(p, Holder::Seq);
                }
                t.push(p);
            }
            tables.push(t);
        }
        let mut state_last = vec![None; self.num_groups()];
        let mut state_alloc = vec![false; self.num_groups()];
        for (g, t) in tables.iter_mut().enumerate() {
            if let GroupKind::State(m @ (StateMode::None | StateMode::Align)) =
                self.cfg.groups[g].kind
            {
                let want = if m == StateMode::None {
                    total
                } else {
                    tokens.len().div_ceil(self.ps)
                };
                let (last, alloc) = (&mut state_last[g], &mut state_alloc[g]);
                self.state_grow(g, t, want, last, alloc);
                continue;
            }
            for _ in t.len()..total {
                t.push(self.take(self.pool_of[g]));
            }
        }
        let offered = vec![hit_pages; self.num_groups()];
        self.seqs.insert(
            id,
            HSeq {
                tokens: owned,
                extra,
                keys,
                hash_stopped: stopped,
                tables,
                offered,
                matched: hit,
                state_last,
                state_alloc,
            },
        );
        self.register(id);
        Ok(HybridBegin {
            matched_tokens: hit,
            num_pages: total,
            new_pages,
        })
    }

    /// Offers the newly full pages of every group to its index (vLLM's `cache_blocks`, groups
    /// in order).
    fn register(&mut self, id: u64) {
        if !self.cfg.enable_prefix_caching {
            return;
        }
        let s = self.seqs.get_mut(&id).expect("live sequence");
        if !s.hash_stopped && s.keys.len() < s.tokens.len() / self.ps {
            let (tokens, extra, keys) = (
                std::mem::take(&mut s.tokens),
                s.extra.take(),
                std::mem::take(&mut s.keys),
            );
            let (keys, stopped) = self.page_keys(&tokens, extra.as_deref(), &keys);
            let s = self.seqs.get_mut(&id).expect("live sequence");
            (s.tokens, s.extra, s.keys, s.hash_stopped) = (tokens, extra, keys, stopped);
        }
        let s = &self.seqs[&id];
        let full = s.keys.len();
        let lora = s.extra.as_ref().map_or(0, |x| x.lora_id);
        let mut stored = Vec::new();
        for g in 0..self.num_groups() {
            let s = &self.seqs[&id];
            for j in s.offered[g]..full.min(s.tables[g].len()) {
                let page = s.tables[g][j];
                if page == NULL_PAGE {
                    continue;
                }
                let k = s.keys[j];
                if let GroupKind::State(_) = self.cfg.groups[g].kind {
                    self.this_step[g].insert(k.hash);
                }
                let parent = if j == 0 {
                    self.root
                } else {
                    s.keys[j - 1].hash
                };
                let entry = Entry {
                    hash: k.hash,
                    parent,
                    extra: k.extra,
                    lora,
                    tokens: &s.tokens[j * self.ps..(j + 1) * self.ps],
                };
                if self.indices[g].insert(page, entry) {
                    stored.push((g, k.hash, parent, page));
                } else if !self.indices[g].is_registered(page)
                    && self.dup_of[self.pool_of[g]][page as usize].is_none()
                {
                    // Same content as a registered page: a duplicate, as vLLM keeps it.
                    self.dups[g].entry(k.hash).or_default().push(page);
                    self.dup_of[self.pool_of[g]][page as usize] = Some((g as u32, k.hash));
                    stored.push((g, k.hash, parent, page));
                }
            }
            let s = self.seqs.get_mut(&id).expect("live sequence");
            s.offered[g] = s.offered[g].max(full);
        }
        for (g, hash, parent, page) in stored {
            self.counters[g].stored += 1;
            self.push_event(GroupEvent {
                kind: EventKind::Stored,
                group: g as u32,
                hash,
                parent,
                lora_id: lora,
                num_tokens: self.ps as u32,
                page,
            });
        }
    }

    /// vLLM's `remove_skipped_blocks(total_computed_tokens)`: every group replaces the positions
    /// it skips at `num_computed` by the null page (from the last skipped position down to the
    /// first one already null) and returns them to its pool: registered pages to the back of
    /// the queue (still matchable), the others to its front. Returns the pages released.
    pub fn release_skipped(&mut self, id: u64, num_computed: usize) -> Result<usize> {
        self.seq(id)?;
        let mut released = 0;
        for g in 0..self.num_groups() {
            let kind = self.cfg.groups[g].kind;
            let s = self.seqs.get_mut(&id).expect("checked");
            let skipped = (kind.skipped_tokens(num_computed) / self.ps).min(s.tables[g].len());
            let mut pages = Vec::new();
            for i in (0..skipped).rev() {
                let p = s.tables[g][i];
                if p == NULL_PAGE {
                    break;
                }
                pages.push(p);
                s.tables[g][i] = NULL_PAGE;
            }
            released += pages.len();
            self.counters[g].released += pages.len() as u64;
            self.release_split(g, &pages);
            if self.cfg.groups[g].kind == GroupKind::State(StateMode::Align) {
                released += self.release_last_state(id, g, num_computed);
            }
        }
        Ok(released)
    }

    /// Frees `pages` of group `g` in order, vLLM's way for a window group: registered pages to
    /// the back of the queue in order, the others to its front keeping their order.
    pub(super) fn release_split(&mut self, g: usize, pages: &[u32]) {
        let pool = self.pool_of[g];
        let (cached, uncached): (Vec<u32>, Vec<u32>) =
            pages.iter().partition(|&&p| self.has_hash(g, p));
        for p in cached {
            self.pools[pool].release(p, Holder::Seq, true);
        }
        for &p in uncached.iter().rev() {
            self.pools[pool].release(p, Holder::Seq, false);
        }
    }

    /// Pages [`append`](Self::append) would take now, per pool.
    fn append_plan(&self, s: &HSeq, n: usize, lookahead: usize) -> Result<Vec<usize>> {
        self.check_lookahead(lookahead)?;
        let len = s.tokens.len();
        let slots = len
            .checked_add(n)
            .ok_or_else(|| Error::arg("num_tokens", format!("{len} + {n} tokens overflow")))?
            .checked_add(lookahead)
            .ok_or_else(|| {
                Error::arg(
                    "lookahead_slots",
                    format!("{len} + {n} tokens + {lookahead} slots overflow"),
                )
            })?;
        let want = slots.div_ceil(self.ps);
        let mut need = vec![0; self.pools.len()];
        for (g, t) in s.tables.iter().enumerate() {
            need[self.pool_of[g]] += match self.cfg.groups[g].kind {
                // One page for the whole sequence, taken when the table first grows.
                GroupKind::State(StateMode::None) => usize::from(t.is_empty() && want > 0),
                // vLLM's align mode: at most one new page a step, whatever the tokens.
                GroupKind::State(StateMode::Align) => usize::from(want > t.len()),
                _ => want.saturating_sub(t.len()),
            };
        }
        Ok(need)
    }

    /// Pages an append of `n` tokens with `lookahead` slots would take now (all pools).
    pub fn append_need(&self, id: u64, n: usize, lookahead: usize) -> Result<usize> {
        Ok(self.append_plan(self.seq(id)?, n, lookahead)?.iter().sum())
    }

    /// Appends tokens to a sequence and grows every group's table to `len + lookahead` slots
    /// (groups in order; vLLM's `allocate_new_blocks`), then registers newly full pages. A
    /// growing align state group first releases its state page of two steps ago (see
    /// `append_releases`), counted as available. All or nothing.
    pub fn append(&mut self, id: u64, tokens: &[i32], lookahead: usize) -> Result<()> {
        let s = self.seq(id)?;
        let need = self.append_plan(s, tokens.len(), lookahead)?;
        let want = (s.tokens.len() + tokens.len() + lookahead).div_ceil(self.ps);
        let (stale, back) = self.append_releases(s, want);
        for (p, &n) in need.iter().enumerate() {
            let available = self.pools[p].available() + back[p];
            if n > available {
                return Err(no_space(n, available));
            }
        }
        let s = self.seqs.get_mut(&id).expect("checked");
        s.tokens
            .try_reserve(tokens.len())
            .map_err(|_| Error::OutOfMemory {
                what: "tokens",
                bytes: (tokens.len() as u64).saturating_mul(4),
            })?;
        // Nothing can fail from here. Released before anything is taken, as vLLM does.
        let computed = self.seqs[&id].tokens.len();
        for g in stale {
            self.release_last_state(id, g, computed);
        }
        for g in 0..self.num_groups() {
            let have = self.seqs[&id].tables[g].len();
            if let GroupKind::State(StateMode::None | StateMode::Align) = self.cfg.groups[g].kind {
                let s = self.seqs.get_mut(&id).expect("checked");
                let mut t = std::mem::take(&mut s.tables[g]);
                let (mut last, mut alloc) = (s.state_last[g], s.state_alloc[g]);
                self.state_grow(g, &mut t, want, &mut last, &mut alloc);
                let s = self.seqs.get_mut(&id).expect("checked");
                (s.tables[g], s.state_last[g], s.state_alloc[g]) = (t, last, alloc);
                continue;
            }
            for _ in have..want {
                let p = self.take(self.pool_of[g]);
                self.seqs.get_mut(&id).expect("checked").tables[g].push(p);
            }
        }
        self.seqs
            .get_mut(&id)
            .expect("checked")
            .tokens
            .extend_from_slice(tokens);
        self.register(id);
        Ok(())
    }

    /// Ends a sequence: groups in order, each table last position first (vLLM's
    /// `coordinator.free`); a sliding-window group sends its unregistered pages to the front of
    /// the queue as vLLM's `SlidingWindowManager.free` does.
    pub fn free(&mut self, id: u64) -> Result<()> {
        let s = self.seqs.remove(&id).ok_or(Error::SeqNotFound(id))?;
        for (g, t) in s.tables.iter().enumerate() {
            let rev: Vec<u32> = t
                .iter()
                .rev()
                .copied()
                .filter(|&p| p != NULL_PAGE)
                .collect();
            match self.cfg.groups[g].kind {
                GroupKind::SlidingWindow(_) => self.release_split(g, &rev),
                GroupKind::Full | GroupKind::ChunkedLocal(_) | GroupKind::State(_) => {
                    let pool = self.pool_of[g];
                    for p in rev {
                        self.pools[pool].release(p, Holder::Seq, true);
                    }
                }
            }
        }
        Ok(())
    }

    /// One group's block table of a sequence ([`NULL_PAGE`] at released positions).
    pub fn seq_pages(&self, id: u64, group: usize) -> Result<&[u32]> {
        self.check_group(group)?;
        Ok(&self.seq(id)?.tables[group])
    }

    /// Token count, table length and matched tokens of a sequence.
    pub fn seq_info(&self, id: u64) -> Result<(usize, usize, usize)> {
        let s = self.seq(id)?;
        Ok((s.tokens.len(), s.tables[0].len(), s.matched))
    }

    /// Live sequence ids (any order).
    pub fn seq_ids(&self) -> Vec<u64> {
        self.seqs.keys().copied().collect()
    }
}
