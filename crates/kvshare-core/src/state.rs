//! The cache state behind the lock and the helpers every operation shares: taking and releasing
//! pages (with demotion of evicted cached pages to the host tier, and vLLM's duplicates), index
//! updates (with events), copies and events queues, and the stats.
//!
//! Sequences are in `begin.rs` and `sequences.rs` (swaps in `swap.rs`), prefix hits in
//! `hit.rs`, the page API (external holders, pins, prefetch) in `pages.rs`, the per-step views in
//! `batch.rs`, the checker in `check.rs`. Every public operation validates everything first and
//! mutates only once it cannot fail, so an error leaves the state exactly as it was.

use std::collections::VecDeque;

use super::alloc::try_vec;
use super::config::{Config, GroupKind, GroupSpec};
use super::copies::{CopyKind, PageCopy, Queued};
use super::error::{Error, Result};
use super::events::{Event, EventKind, EventQueue};
use super::hashing::{DigestMap, IdMap};
use super::pool::{Holder, PagePool, PageState};
use super::pooltier::PoolTier;
use super::prefix::{root_hash, Entry, PrefixIndex, Removed};
use super::rules::{rules_of, Rules};
use super::seq::Seq;
use super::stats::{Counters, GroupCounters, GroupStats, Stats};
use super::tier::Tier;

/// The page every pool reserves when `reserve_null_page` is on (vLLM's `null_block`): what
/// released positions of a device table show.
pub const NULL_PAGE: u32 = 0;

/// One group: its rules, its pool and the bytes of its pages.
#[derive(Debug)]
pub(crate) struct Group {
    pub rules: Box<dyn Rules>,
    pub kind: GroupKind,
    pub pool: usize,
    pub page_bytes: u64,
    /// The group's lookup set is EAGLE's (one of its groups is): hits drop a page.
    pub eagle: bool,
}

/// Pages of one size: both tiers, their prefix indices (every group of the pool registers in
/// them, its entries keyed apart by group), and vLLM's duplicates.
#[derive(Debug)]
pub(crate) struct Pool {
    pub device: PagePool,
    pub host: PagePool,
    pub index: PrefixIndex,
    pub host_index: PrefixIndex,
    /// Pages filled with content their group already had registered (two sequences computed
    /// the same page), kept as vLLM keeps them when `skip_cached_writes` is off: `(group,
    /// digest)` key -> pages, oldest first. When the registered page is evicted, the oldest
    /// duplicate takes its place in the index.
    pub dups: DigestMap<Vec<u32>>,
    /// Per device page: the group and digest it duplicates.
    pub dup_of: Vec<Option<(u32, u128)>>,
}

/// How a released page rejoins its pool when nothing else holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// A sequence ends (or a holder lets go): in vLLM's order, every page goes behind the
    /// cached ones.
    Free,
    /// A position a group no longer reads: pages without cached content are reused first.
    Skip,
}

/// A page of a prefix hit, in the tier it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub tier: Tier,
    pub page: u32,
}

/// Everything the cache manages. Not thread-safe by itself: [`super::Cache`] wraps it in a lock.
#[derive(Debug)]
pub struct State {
    pub(crate) cfg: Config,
    /// Tokens per page.
    pub(crate) ps: usize,
    pub(crate) groups: Vec<Group>,
    /// Groups of one kind and page size, looked up together (vLLM's sets), full attention first.
    pub(crate) sets: Vec<Vec<usize>>,
    /// One full-attention group: the plain model, with its own fast prefix walk.
    pub(crate) plain: bool,
    pub(crate) pools: Vec<Pool>,
    pub(crate) seqs: IdMap<Seq>,
    /// Stamp of the current batch call, to spot a sequence listed twice without a set.
    pub(crate) batch_stamp: u64,
    /// Sequences with full pages awaiting [`State::commit`] (defer-commit mode).
    pub(crate) uncommitted: Vec<u64>,
    /// Page copies queued for the engine (demotions, promotions, unit hits): `take_copies`.
    pub(crate) copies: VecDeque<Queued>,
    pub(crate) events: EventQueue,
    /// Pinned prefixes: pin id -> its device pages as `(group, page)`.
    pub(crate) pins: IdMap<Vec<(u32, u32)>>,
    pub(crate) next_pin: u64,
    pub(crate) counters: Counters,
    pub(crate) group_counters: Vec<GroupCounters>,
    /// Per state group: digests registered since the step began (vLLM's same-step rule).
    pub(crate) this_step: Vec<DigestMap<()>>,
    /// The chain digest every first page hangs off (`root_hash()`).
    pub(crate) root: u128,
    /// Reused buffer for hashing a page's tokens (no allocation per page).
    pub(crate) hash_scratch: Vec<u8>,
    /// Reused buffer for the fresh pages a begin takes (no allocation per request).
    pub(crate) page_scratch: Vec<u32>,
    /// The pool tier, when configured.
    pub(crate) pooltier: Option<Box<PoolTier>>,
}

impl State {
    /// A fresh state; the config must be valid.
    pub fn new(cfg: Config) -> Result<Self> {
        cfg.validate()?;
        let caching = cfg.enable_prefix_caching;
        let host_index_on = caching && cfg.num_host_pages > 0;
        let specs = cfg.group_specs();
        // Lookup sets: groups of one kind and page size (vLLM's groups of equal specs), EAGLE's
        // when any of them is.
        let same = |a: &GroupSpec, b: &GroupSpec| (a.kind, a.page_bytes) == (b.kind, b.page_bytes);
        let mut sets: Vec<Vec<usize>> = Vec::new();
        for (g, spec) in specs.iter().enumerate() {
            match sets.iter_mut().find(|s| same(&specs[s[0]], spec)) {
                Some(s) => s.push(g),
                None => sets.push(vec![g]),
            }
        }
        // A stable sort, as vLLM's `list.sort`: full attention first, then first appearance.
        sets.sort_by_key(|s| specs[s[0]].kind != GroupKind::Full);
        let set_eagle = |g: usize| {
            sets.iter()
                .find(|s| s.contains(&g))
                .is_some_and(|s| s.iter().any(|&m| specs[m].eagle))
        };
        let mut groups = Vec::with_capacity(specs.len());
        let mut pool_bytes: Vec<u64> = Vec::new();
        for (g, spec) in specs.iter().enumerate() {
            let bytes = cfg.group_page_bytes(spec);
            let pool = match pool_bytes.iter().position(|&b| b == bytes) {
                Some(p) => p,
                None => {
                    pool_bytes.push(bytes);
                    pool_bytes.len() - 1
                }
            };
            let eagle = set_eagle(g);
            groups.push(Group {
                rules: rules_of(spec.kind, eagle),
                kind: spec.kind,
                pool,
                page_bytes: bytes,
                eagle,
            });
        }
        let mut pools = Vec::with_capacity(pool_bytes.len());
        // Parents are held back behind their children, but not in vLLM's own order.
        let leaves_first = caching && !cfg.vllm_free_order;
        let policy = cfg.eviction_policy;
        for p in 0..pool_bytes.len() {
            let n_dev = cfg.num_device_pages;
            let n_host = cfg.num_host_pages;
            // Full-attention groups of the pool: their pages need their parents.
            let chained = groups
                .iter()
                .enumerate()
                .filter(|(_, g)| g.pool == p && g.kind == GroupKind::Full)
                .fold(0u32, |m, (i, _)| m | (1 << i));
            pools.push(Pool {
                device: PagePool::new(
                    Tier::Device,
                    n_dev,
                    cfg.reserve_null_page,
                    "num_device_pages",
                    policy,
                    leaves_first,
                )?,
                host: PagePool::new(
                    Tier::Host,
                    n_host,
                    false,
                    "num_host_pages",
                    policy,
                    leaves_first,
                )?,
                index: PrefixIndex::new(
                    if caching { n_dev } else { 0 },
                    cfg.page_size,
                    cfg.unit(),
                    chained,
                    "num_device_pages",
                )?,
                host_index: PrefixIndex::new(
                    if host_index_on { n_host } else { 0 },
                    cfg.page_size,
                    cfg.unit(),
                    chained,
                    "num_host_pages",
                )?,
                dups: DigestMap::default(),
                dup_of: try_vec(
                    if caching { n_dev as usize } else { 0 },
                    None,
                    "num_device_pages",
                )?,
            });
        }
        let n = groups.len();
        Ok(State {
            ps: cfg.page_size as usize,
            plain: n == 1 && groups[0].kind == GroupKind::Full,
            groups,
            sets,
            pools,
            seqs: IdMap::default(),
            batch_stamp: 0,
            uncommitted: Vec::new(),
            copies: VecDeque::new(),
            events: EventQueue::new(cfg.enable_events),
            pins: IdMap::default(),
            next_pin: 1,
            counters: Counters::default(),
            group_counters: vec![GroupCounters::default(); n],
            this_step: vec![DigestMap::default(); n],
            root: root_hash(),
            hash_scratch: Vec::with_capacity(32 + 4 * cfg.page_size as usize),
            page_scratch: Vec::new(),
            pooltier: cfg.pool.as_ref().map(|p| Box::new(PoolTier::new(&cfg, p))),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Number of groups (1 for a plain model).
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// Number of page pools (groups of equal page bytes share one).
    pub fn num_pools(&self) -> usize {
        self.pools.len()
    }

    /// The device pages of pool `pool` (for stats and tests).
    pub fn pool(&self, pool: usize) -> Option<&PagePool> {
        self.pools.get(pool).map(|p| &p.device)
    }

    /// The kind of `group`.
    pub fn group_kind(&self, group: usize) -> Result<GroupKind> {
        self.check_group(group)?;
        Ok(self.groups[group].kind)
    }

    /// The pool of `group`.
    pub fn pool_of(&self, group: usize) -> Result<usize> {
        self.check_group(group)?;
        Ok(self.groups[group].pool)
    }

    pub(crate) fn check_group(&self, group: usize) -> Result<()> {
        if group >= self.groups.len() {
            return Err(Error::arg(
                "group",
                format!("{group} is not below the {} groups", self.groups.len()),
            ));
        }
        Ok(())
    }

    /// Evicted device pages are demoted to the host tier, and prefix walks look there too.
    pub(crate) fn host_cache(&self) -> bool {
        self.host_index_on() && self.cfg.demote_to_host
    }

    /// The host tier has a prefix index: swap-outs register their full pages there and share
    /// content already present (with or without demotion).
    pub(crate) fn host_index_on(&self) -> bool {
        self.cfg.enable_prefix_caching && self.cfg.num_host_pages > 0
    }

    /// Whether released positions show the null page.
    pub(crate) fn is_null(&self, page: u32) -> bool {
        self.cfg.reserve_null_page && page == NULL_PAGE
    }

    pub(crate) fn pool_tier(&self, pool: usize, tier: Tier) -> &PagePool {
        match tier {
            Tier::Device => &self.pools[pool].device,
            Tier::Host => &self.pools[pool].host,
        }
    }

    /// Whether device page `page` of `pool` carries a digest (registered, or a duplicate):
    /// vLLM's `block.block_hash is not None`.
    #[inline]
    pub(crate) fn has_digest(&self, pool: usize, page: u32) -> bool {
        self.cfg.enable_prefix_caching
            && (self.pools[pool].index.is_registered(page)
                || self.pools[pool].dup_of[page as usize].is_some())
    }

    pub(crate) fn is_registered_in(&self, pool: usize, tier: Tier, page: u32) -> bool {
        match tier {
            Tier::Device => self.has_digest(pool, page),
            Tier::Host => self.host_index_on() && self.pools[pool].host_index.is_registered(page),
        }
    }

    /// Refuses when `pool`'s `tier` cannot supply `needed` pages, `reserved` of its evictable
    /// pages being about to be taken by the caller.
    pub(crate) fn ensure_available(
        &self,
        pool: usize,
        tier: Tier,
        needed: usize,
        reserved: usize,
    ) -> Result<()> {
        let available = self
            .pool_tier(pool, tier)
            .available()
            .saturating_sub(reserved);
        if needed > available {
            return Err(Error::NoSpace {
                tier,
                needed,
                available,
            });
        }
        Ok(())
    }

    // ---- index updates (with events) ----

    /// Registers `page` of `pool`'s `tier` for group `group`; returns whether it was new. A
    /// device page kept as a duplicate already carries its content's digest (vLLM's
    /// `block_hash` is set once) and is not registered again. Emits `Stored`.
    pub(crate) fn index_insert(
        &mut self,
        pool: usize,
        tier: Tier,
        group: u32,
        page: u32,
        e: Entry<'_>,
    ) -> bool {
        let p = &mut self.pools[pool];
        if tier == Tier::Device && p.dup_of[page as usize].is_some() {
            return false;
        }
        let (ix, pp) = match tier {
            Tier::Device => (&mut p.index, &mut p.device),
            Tier::Host => (&mut p.host_index, &mut p.host),
        };
        if !ix.insert(page, group, e) {
            return false;
        }
        pp.note_content(page, PrefixIndex::key(group, e.hash));
        if tier == Tier::Device {
            self.counters.pages_registered += 1;
            self.group_counters[group as usize].stored += 1;
        }
        self.events.push(Event {
            kind: EventKind::Stored,
            tier,
            hash: e.hash,
            parent: e.parent,
            lora_id: e.lora,
            num_tokens: e.tokens.len() as u32,
            page,
            group,
        });
        true
    }

    /// Records `page` as a duplicate of the registered content `(group, hash)` (vLLM keeps it
    /// with its digest). Emits `Stored`, as vLLM does for every page it caches.
    pub(crate) fn dup_insert(&mut self, pool: usize, group: u32, page: u32, e: Entry<'_>) {
        let p = &mut self.pools[pool];
        let key = PrefixIndex::key(group, e.hash);
        p.dups.entry(key).or_default().push(page);
        p.dup_of[page as usize] = Some((group, e.hash));
        self.group_counters[group as usize].stored += 1;
        self.events.push(Event {
            kind: EventKind::Stored,
            tier: Tier::Device,
            hash: e.hash,
            parent: e.parent,
            lora_id: e.lora,
            num_tokens: e.tokens.len() as u32,
            page,
            group,
        });
    }

    fn removed_event(&mut self, tier: Tier, group: u32, hash: u128, page: u32) {
        self.events.push(Event {
            kind: EventKind::Removed,
            tier,
            hash,
            parent: 0,
            lora_id: 0,
            num_tokens: self.ps as u32,
            page,
            group,
        });
    }

    /// Drops `page`'s entry in `pool`'s `tier`, if any (a parent held back for it is offered
    /// again when it was its last child). Emits `Removed`.
    pub(crate) fn index_remove(&mut self, pool: usize, tier: Tier, page: u32) {
        let p = &mut self.pools[pool];
        let (ix, pp) = match tier {
            Tier::Device => (&mut p.index, &mut p.device),
            Tier::Host => (&mut p.host_index, &mut p.host),
        };
        let published = ix.hash_of(page).map(|hash| (hash, ix.group_of(page)));
        if let Some(Removed {
            parent_leaf: Some(parent),
        }) = ix.remove(page)
        {
            pp.unhold(parent);
        }
        // A partial entry was never published: it goes without an event.
        if let Some((hash, group)) = published {
            self.removed_event(tier, group, hash, page);
        }
    }

    // ---- taking and releasing pages ----

    /// Takes one device page of `pool` for `holder`, evicting the least valuable cached page if
    /// the free list is empty (demoting it to the host tier when configured); a page popped with
    /// a digest loses it (vLLM's `_maybe_evict_cached_block`: the oldest duplicate of a
    /// registered page takes its place in the index). The caller has checked availability.
    pub(crate) fn take_device(&mut self, pool: usize, holder: Holder) -> u32 {
        let Pool { device, index, .. } = &mut self.pools[pool];
        let (page, evicted) = device
            .take(holder, &mut |p| index.has_child(p))
            .expect("availability checked by caller");
        if evicted && self.cfg.enable_prefix_caching {
            self.evict(pool, page);
        }
        page
    }

    /// The content of device page `page` of `pool` leaves the cache: a duplicate leaves its
    /// list; a registered page is demoted (when configured) and leaves the index, the oldest
    /// duplicate of its content taking its place.
    fn evict(&mut self, pool: usize, page: u32) {
        self.unlist(pool, page, true);
    }

    /// [`evict`](Self::evict)'s work; `evicting`: counted as an eviction, and demoted when
    /// configured (a page unregistered for wrong KV is neither).
    fn unlist(&mut self, pool: usize, page: u32, evicting: bool) {
        if let Some((g, hash)) = self.pools[pool].dup_of[page as usize].take() {
            let key = PrefixIndex::key(g, hash);
            let p = &mut self.pools[pool];
            let list = p.dups.get_mut(&key).expect("duplicate listed");
            list.retain(|&x| x != page);
            if list.is_empty() {
                p.dups.remove(&key);
            }
            if evicting {
                self.counters.evictions += 1;
                self.group_counters[g as usize].evictions += 1;
            }
            self.removed_event(Tier::Device, g, hash, page);
            return;
        }
        let Some(e) = self.pools[pool].index.entry(page) else {
            // A partial entry (published by no event), or no content at all (a page parked
            // behind the cached ones in vLLM's order).
            let p = &mut self.pools[pool];
            if let Some(r) = p.index.remove(page) {
                self.counters.evictions += u64::from(evicting);
                if let Some(parent) = r.parent_leaf {
                    p.device.unhold(parent);
                }
            }
            return;
        };
        let (g, hash, parent, extra, lora) = (e.group, e.hash, e.parent, e.extra, e.lora);
        let key = PrefixIndex::key(g, hash);
        // The duplicate holds the same tokens; it takes over the evicted page's entry.
        let heir_tokens = self.pools[pool]
            .dups
            .contains_key(&key)
            .then(|| e.tokens.to_vec());
        if evicting {
            self.counters.evictions += 1;
            self.group_counters[g as usize].evictions += 1;
            self.demote(pool, page);
        }
        self.index_remove(pool, Tier::Device, page);
        if let Some(tokens) = heir_tokens {
            let p = &mut self.pools[pool];
            let list = p.dups.get_mut(&key).expect("checked above");
            let next = list.remove(0);
            if list.is_empty() {
                p.dups.remove(&key);
            }
            p.dup_of[next as usize] = None;
            let entry = Entry {
                hash,
                parent,
                extra,
                lora,
                tokens: &tokens,
            };
            let ok = p.index.insert(next, g, entry);
            debug_assert!(ok, "a duplicate's digest is free once its page left");
        }
    }

    /// Drops device page `page`'s entry of `pool` (a duplicate's listing, a partial entry or a
    /// registered page, whose oldest duplicate takes over), without demoting it, and frees the
    /// page if nothing holds it. Returns whether an entry was dropped.
    pub(crate) fn drop_entry(&mut self, pool: usize, page: u32) -> bool {
        let p = &self.pools[pool];
        let dup = p.dup_of.get(page as usize).is_some_and(Option::is_some);
        let dropped = if dup || p.index.is_registered(page) {
            self.unlist(pool, page, false);
            true
        } else {
            false
        };
        self.pools[pool].device.uncache(page);
        dropped
    }

    /// Takes one host page of `pool` (evicting the least valuable cached host page if needed).
    /// The caller has checked availability.
    pub(crate) fn take_host(&mut self, pool: usize, holder: Holder) -> u32 {
        let Pool {
            host, host_index, ..
        } = &mut self.pools[pool];
        let (page, evicted) = host
            .take(holder, &mut |p| host_index.has_child(p))
            .expect("availability checked by caller");
        if evicted {
            self.counters.host_evictions += 1;
            self.index_remove(pool, Tier::Host, page);
        }
        page
    }

    /// Copies the entry of evicted device page `page` of `pool` to a host page and queues the
    /// copy, when the host tier caches pages, has room, and does not hold that content already.
    fn demote(&mut self, pool: usize, page: u32) {
        if !self.host_cache() {
            return;
        }
        let p = &self.pools[pool];
        let Some(e) = p.index.entry(page) else {
            return;
        };
        if p.host_index.contains(e.group, e.hash) || p.host.available() == 0 {
            return;
        }
        let (group, hash, tokens) = (e.group, e.hash, e.tokens.to_vec());
        let hp = self.take_host(pool, Holder::Seq);
        self.copy_entry_across(pool, Tier::Device, page, hp);
        self.pools[pool].host.release(hp, Holder::Seq, true);
        self.counters.demotions += 1;
        self.pool_store(group as usize, Tier::Host, hp, hash, &tokens);
    }

    /// Registers page `dst` of the other tier of `pool` under the index entry of page `src` of
    /// tier `from`, and queues the whole-page copy `src` -> `dst`: the shared half of a demotion
    /// (device to host) and a promotion (host to device). `src` must be registered.
    pub(crate) fn copy_entry_across(&mut self, pool: usize, from: Tier, src: u32, dst: u32) {
        let p = &self.pools[pool];
        let (index, to, kind) = match from {
            Tier::Device => (&p.index, Tier::Host, CopyKind::DeviceToHost),
            Tier::Host => (&p.host_index, Tier::Device, CopyKind::HostToDevice),
        };
        let e = index.entry(src).expect("the copied page is registered");
        let (group, hash, parent, extra, lora) = (e.group, e.hash, e.parent, e.extra, e.lora);
        let tokens = e.tokens.to_vec();
        self.index_insert(
            pool,
            to,
            group,
            dst,
            Entry {
                hash,
                parent,
                extra,
                lora,
                tokens: &tokens,
            },
        );
        self.copies.push_back(Queued {
            copy: PageCopy {
                src_page: src,
                dst_page: dst,
                num_tokens: self.ps as u32,
                kind,
                group,
            },
            holds_src: false,
        });
    }

    /// Drops one `holder` reference on device page `page` of `pool`; `how` says where it goes
    /// when that was the last one.
    #[inline]
    pub(crate) fn release_device(&mut self, pool: usize, page: u32, holder: Holder, how: Release) {
        let digest = self.has_digest(pool, page);
        let back = digest
            || (self.cfg.vllm_free_order && !self.cfg.vllm_uncached_first && how == Release::Free);
        self.pools[pool].device.release(page, holder, back);
    }

    /// Drops one sequence reference on host page `page` of `pool` (registered content stays
    /// cached there).
    pub(crate) fn release_host(&mut self, pool: usize, page: u32) {
        let registered = self.is_registered_in(pool, Tier::Host, page);
        self.pools[pool].host.release(page, Holder::Seq, registered);
    }

    /// Releases a group's positions in order, vLLM's way for positions it no longer reads:
    /// pages with cached content to the back of the reuse order in order, the others to its
    /// front keeping their order.
    pub(crate) fn release_split(&mut self, pool: usize, pages: &[u32], holder: Holder) {
        let (cached, uncached): (Vec<u32>, Vec<u32>) =
            pages.iter().partition(|&&p| self.has_digest(pool, p));
        for p in cached {
            self.pools[pool].device.release(p, holder, true);
        }
        for &p in uncached.iter().rev() {
            self.release_device(pool, p, holder, Release::Skip);
        }
    }

    // ---- queues ----

    /// Removes and returns up to `max` queued page copies (demotions, promotions, unit hits),
    /// oldest first. Execute them in order, before the copies returned by the calls that follow
    /// and before the step's KV writes.
    ///
    /// A unit hit's copy holds its source page until it is taken here; the reference is dropped
    /// now, so the source may be evicted by the next allocation: execute the copies first.
    pub fn take_copies(&mut self, max: usize) -> Vec<PageCopy> {
        let n = max.min(self.copies.len());
        let taken: Vec<Queued> = self.copies.drain(..n).collect();
        for q in &taken {
            if q.holds_src {
                self.release_copy_source(q.copy);
            }
        }
        taken.into_iter().map(|q| q.copy).collect()
    }

    /// Drops the reference a queued copy held on its source page.
    fn release_copy_source(&mut self, c: PageCopy) {
        let pool = self.groups[c.group as usize].pool;
        match c.kind {
            CopyKind::HostToDevice => self.release_host(pool, c.src_page),
            _ => self.release_device(pool, c.src_page, Holder::Seq, Release::Free),
        }
    }

    /// Removes and returns up to `max` queued index events, oldest first.
    pub fn take_events(&mut self, max: usize) -> Vec<Event> {
        self.events.take(max)
    }

    /// Every `(tier, group, chain digest)` registered now, in no particular order (for
    /// diagnostics and for checking an event consumer's view). Duplicates count once.
    pub fn registered_hashes(&self) -> Vec<(Tier, u32, u128)> {
        let mut out = Vec::new();
        for p in &self.pools {
            out.extend(p.index.entries().map(|(g, h, _)| (Tier::Device, g, h)));
            out.extend(p.host_index.entries().map(|(g, h, _)| (Tier::Host, g, h)));
        }
        out
    }

    // ---- stats ----

    /// Pages an allocation for `group` in `tier` can take now: free plus evictable cached pages
    /// of its pool (in O(1)).
    pub fn available(&self, tier: Tier, group: usize) -> Result<usize> {
        self.check_group(group)?;
        Ok(self.pool_tier(self.groups[group].pool, tier).available())
    }

    /// A consistent snapshot of pool figures (totals over the pools) and counters.
    pub fn stats(&self) -> Stats {
        let mut logical = 0u64;
        let mut swapped = 0u64;
        for s in self.seqs.values() {
            match s.tier {
                Tier::Device => logical += s.tokens.len() as u64,
                Tier::Host => swapped += 1,
            }
        }
        let mut counters = self.counters;
        counters.events_dropped = self.events.dropped();
        let sum = |f: &dyn Fn(&Pool) -> usize| self.pools.iter().map(f).sum::<usize>() as u64;
        Stats {
            device_pages_total: sum(&|p| p.device.num_pages() as usize),
            device_pages_free: sum(&|p| p.device.num_free()),
            device_pages_cached: sum(&|p| p.device.num_cached()),
            device_pages_in_use: sum(&|p| p.device.num_in_use()),
            device_pages_shared: sum(&|p| p.device.num_shared()),
            device_pages_pinned: sum(&|p| p.device.num_pinned()),
            host_pages_total: sum(&|p| p.host.num_pages() as usize),
            host_pages_free: sum(&|p| p.host.num_free()),
            host_pages_cached: sum(&|p| p.host.num_cached()),
            host_pages_in_use: sum(&|p| p.host.num_in_use()),
            index_pages: sum(&|p| p.index.len()),
            host_index_pages: sum(&|p| p.host_index.len()),
            num_seqs: self.seqs.len() as u64,
            num_seqs_swapped: swapped,
            logical_tokens: logical,
            physical_tokens: sum(&|p| p.device.num_in_use()) * self.ps as u64,
            page_bytes: self.groups[0].page_bytes,
            pending_copies: self.copies.len() as u64,
            pending_events: self.events.len() as u64,
            counters,
        }
    }

    /// Stats of `group`.
    pub fn group_stats(&self, group: usize) -> Result<GroupStats> {
        self.check_group(group)?;
        let pool = self.groups[group].pool;
        let p = &self.pools[pool];
        let mut held = 0u64;
        let mut distinct = std::collections::HashSet::new();
        for s in self.seqs.values().filter(|s| s.tier == Tier::Device) {
            for &page in s.tables[group].iter().filter(|&&x| !self.is_null(x)) {
                held += 1;
                distinct.insert(page);
            }
        }
        Ok(GroupStats {
            pool: pool as u32,
            page_bytes: self.groups[group].page_bytes,
            pool_pages_total: p.device.num_pages() as u64,
            pool_pages_free: p.device.available() as u64,
            pool_pages_in_use: p.device.num_in_use() as u64,
            pages_held: held,
            pages_distinct: distinct.len() as u64,
            pages_registered: p.index.group_len(group as u32) as u64,
            host_pages_registered: p.host_index.group_len(group as u32) as u64,
            counters: self.group_counters[group],
        })
    }

    /// Refcount, state and registration of page `page` of `group`'s pool in `tier`.
    pub fn page_info(&self, tier: Tier, group: usize, page: u32) -> Result<(u32, PageState, bool)> {
        self.check_group(group)?;
        let pool = self.groups[group].pool;
        let pp = self.pool_tier(pool, tier);
        if page >= pp.num_pages() {
            return Err(Error::PageOutOfRange {
                tier,
                page,
                num_pages: pp.num_pages(),
            });
        }
        let registered = self.is_registered_in(pool, tier, page);
        Ok((pp.refcount(page), pp.state(page), registered))
    }
}
