//! The cache state behind the lock and the helpers every operation shares: taking and releasing
//! pages (with demotion of evicted cached pages to the host tier), index updates (with events),
//! and the tier-crossing prefix walk (with promotion back to the device).
//!
//! Page-level operations are in `pages.rs`, sequences in `seq.rs` (swaps in `seq/swap.rs`, batch
//! builders in `batch.rs`), the checker in `check.rs`.
//! Every public operation validates everything first and mutates only once it cannot fail, so an
//! error leaves the state exactly as it was.

use std::collections::VecDeque;

use super::config::{Config, Tier};
use super::error::{Error, Result};
use super::events::{Event, EventKind, EventQueue};
use super::hashing::IdMap;
use super::pool::{Holder, PagePool, PageState};
use super::prefix::{chain_hash, root_hash, Entry, ExtraKeys, PrefixIndex};
use super::seq::{CopyKind, PageCopy, Seq};
use super::stats::{Counters, Stats};

/// A prefix match: the pages found, their chain digests, and the tokens they cover.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    /// Device pages, in prefix order.
    pub pages: Vec<u32>,
    /// Chain digest `h_i` of each page.
    pub hashes: Vec<u128>,
    /// `pages.len() * page_size`.
    pub tokens: usize,
    /// How many of `pages` were promoted from the host tier (copies queued).
    pub promoted: usize,
}

/// Inserts into `ix` (the index of `tier`) and records the `Stored` event and counter. A free
/// function so callers holding other fields of [`State`] borrowed can use it.
pub(super) fn insert_noted(
    ix: &mut PrefixIndex,
    events: &mut EventQueue,
    counters: &mut Counters,
    tier: Tier,
    page: u32,
    e: Entry<'_>,
) -> bool {
    if !ix.insert(page, e) {
        return false;
    }
    if tier == Tier::Device {
        counters.pages_registered += 1;
    }
    events.push(Event {
        kind: EventKind::Stored,
        tier,
        hash: e.hash,
        parent: e.parent,
        lora_id: e.lora,
        num_tokens: e.tokens.len() as u32,
        page,
    });
    true
}

/// One page of a tier-crossing prefix walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hit {
    pub tier: Tier,
    pub page: u32,
    pub hash: u128,
}

/// A page copy waiting in the queue for `take_copies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Queued {
    pub copy: PageCopy,
    /// The copy holds a reference (`Holder::Seq`) on its source page until `take_copies` hands
    /// it out: the source of a unit hit is a page nobody else may hold, and without the
    /// reference an allocation later in the same step could evict it and reuse it as the
    /// destination of a copy the engine runs first (an append's copy-on-write). Held, it is
    /// neither evicted nor demoted before the engine has the copy; after that, the copy runs
    /// before any copy returned by a later call and before the step's KV writes.
    pub holds_src: bool,
}

/// A prefix hit ending inside a page (see [`State::walk_units`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UnitMatch {
    /// Tier of `page`.
    pub tier: Tier,
    /// The cached page holding the matched units.
    pub page: u32,
    /// Tokens matched in it (whole units, fewer than a page).
    pub tokens: usize,
}

/// Pages of a prefix walk hashed before their lookups (see [`State::walk`]).
const WALK_GROUP: usize = 8;

/// One page of a prefix walk's group: its digests, then the device page its digest finds
/// (unverified until the group's lookups are done).
#[derive(Debug, Clone, Copy, Default)]
struct WalkPage {
    /// Chain digest.
    hash: u128,
    /// Extra-key digest.
    extra: u128,
    /// The device page registered under `hash`, if any.
    found: Option<u32>,
}

/// Everything the cache manages. Not thread-safe by itself: [`super::Cache`] wraps it in a lock.
#[derive(Debug)]
pub struct State {
    pub(super) cfg: Config,
    /// Tokens per page (`cfg.page_size` as a `usize`).
    pub(super) page_size: usize,
    /// The device tier's pages.
    pub(super) device: PagePool,
    /// The host tier's pages (swap space, demoted cached pages).
    pub(super) host: PagePool,
    /// Registered device pages by chain digest.
    pub(super) index: PrefixIndex,
    /// Registered host pages by chain digest (demoted pages; empty without a host cache).
    pub(super) host_index: PrefixIndex,
    pub(super) seqs: IdMap<Seq>,
    /// Stamp of the current batch call, to spot a sequence listed twice without a set.
    pub(super) batch_stamp: u64,
    /// Sequences with full pages awaiting [`State::commit`] (defer-commit mode).
    pub(super) uncommitted: Vec<u64>,
    /// Page copies queued for the engine (demotions, promotions, unit hits): `take_copies`.
    pub(super) copies: VecDeque<Queued>,
    pub(super) events: EventQueue,
    /// Pinned prefixes: pin id -> its device pages.
    pub(super) pins: IdMap<Vec<u32>>,
    pub(super) next_pin: u64,
    pub(super) counters: Counters,
    /// The chain digest every first page hangs off (`root_hash()`).
    pub(super) root: u128,
    /// Reused buffer for hashing a page's tokens (no allocation per page).
    pub(super) hash_scratch: Vec<u8>,
}

impl State {
    /// A fresh state; the config must be valid.
    pub fn new(cfg: Config) -> Result<Self> {
        cfg.validate()?;
        let caching = cfg.enable_prefix_caching;
        let host_index_on = caching && cfg.num_host_pages > 0;
        Ok(State {
            page_size: cfg.page_size as usize,
            device: PagePool::new(
                Tier::Device,
                cfg.num_device_pages,
                cfg.reserve_null_page,
                "num_device_pages",
            )?,
            host: PagePool::new(Tier::Host, cfg.num_host_pages, false, "num_host_pages")?,
            index: PrefixIndex::new(
                if caching { cfg.num_device_pages } else { 0 },
                cfg.page_size,
                cfg.unit(),
                "num_device_pages",
            )?,
            host_index: PrefixIndex::new(
                if host_index_on { cfg.num_host_pages } else { 0 },
                cfg.page_size,
                cfg.unit(),
                "num_host_pages",
            )?,
            seqs: IdMap::default(),
            batch_stamp: 0,
            uncommitted: Vec::new(),
            copies: VecDeque::new(),
            events: EventQueue::new(cfg.enable_events),
            pins: IdMap::default(),
            next_pin: 1,
            counters: Counters::default(),
            root: root_hash(),
            hash_scratch: Vec::with_capacity(32 + 4 * cfg.page_size as usize),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Evicted device pages are demoted to the host tier, and prefix walks look there too.
    pub(super) fn host_cache(&self) -> bool {
        self.host_index_on() && self.cfg.demote_to_host
    }

    /// The host tier has a prefix index: swap-outs register their full pages there and share
    /// content already present (with or without demotion).
    pub(super) fn host_index_on(&self) -> bool {
        self.cfg.enable_prefix_caching && self.cfg.num_host_pages > 0
    }

    pub(super) fn pool(&self, tier: Tier) -> &PagePool {
        match tier {
            Tier::Device => &self.device,
            Tier::Host => &self.host,
        }
    }

    pub(super) fn is_registered(&self, page: u32) -> bool {
        self.cfg.enable_prefix_caching && self.index.is_registered(page)
    }

    pub(super) fn is_registered_in(&self, tier: Tier, page: u32) -> bool {
        match tier {
            Tier::Device => self.is_registered(page),
            Tier::Host => self.host_index_on() && self.host_index.is_registered(page),
        }
    }

    /// Refuses when `tier` cannot supply `needed` pages, `reserved` of its evictable pages being
    /// about to be taken by the caller.
    pub(super) fn ensure_available(
        &self,
        tier: Tier,
        needed: usize,
        reserved: usize,
    ) -> Result<()> {
        let available = self.pool(tier).available() - reserved;
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

    /// Registers `page` of `tier`; returns whether it was new. Emits `Stored`.
    pub(super) fn index_insert(&mut self, tier: Tier, page: u32, e: Entry<'_>) -> bool {
        let ix = match tier {
            Tier::Device => &mut self.index,
            Tier::Host => &mut self.host_index,
        };
        insert_noted(ix, &mut self.events, &mut self.counters, tier, page, e)
    }

    /// Drops `page`'s entry in `tier`, if any. Emits `Removed`.
    pub(super) fn index_remove(&mut self, tier: Tier, page: u32) {
        let ix = match tier {
            Tier::Device => &mut self.index,
            Tier::Host => &mut self.host_index,
        };
        let Some(hash) = ix.hash_of(page) else {
            // A partial entry was never published: it goes without an event.
            ix.remove(page);
            return;
        };
        ix.remove(page);
        self.events.push(Event {
            kind: EventKind::Removed,
            tier,
            hash,
            parent: 0,
            lora_id: 0,
            num_tokens: self.page_size as u32,
            page,
        });
    }

    // ---- taking and releasing pages ----

    /// Takes one device page for `holder`, evicting the LRU cached page of the lowest priority
    /// if the free list is empty (demoting it to the host tier when configured). The caller has
    /// checked availability.
    pub(super) fn take_device(&mut self, holder: Holder) -> u32 {
        let (page, evicted) = self
            .device
            .take(holder)
            .expect("availability checked by caller");
        if evicted {
            self.counters.evictions += 1;
            self.demote(page);
            self.index_remove(Tier::Device, page);
        }
        page
    }

    /// Takes one host page (evicting the LRU cached host page if needed). The caller has checked
    /// availability.
    pub(super) fn take_host(&mut self, holder: Holder) -> u32 {
        let (page, evicted) = self
            .host
            .take(holder)
            .expect("availability checked by caller");
        if evicted {
            self.counters.host_evictions += 1;
            self.index_remove(Tier::Host, page);
        }
        page
    }

    /// Copies the entry of evicted device page `page` to a host page and queues the copy, when
    /// the host tier caches pages, has room, and does not hold that content already.
    fn demote(&mut self, page: u32) {
        if !self.host_cache() {
            return;
        }
        let Some(e) = self.index.entry(page) else {
            return;
        };
        if self.host_index.contains(e.hash) || self.host.available() == 0 {
            return;
        }
        let hp = self.take_host(Holder::Seq);
        self.copy_entry_across(Tier::Device, page, hp);
        self.host.release(hp, Holder::Seq, true);
        self.counters.demotions += 1;
    }

    /// Registers page `dst` of the other tier under the index entry of page `src` of tier
    /// `from`, and queues the whole-page copy `src` -> `dst`: the shared half of a demotion
    /// (device to host) and a promotion (host to device). `src` must be registered.
    fn copy_entry_across(&mut self, from: Tier, src: u32, dst: u32) {
        let (index, to, kind) = match from {
            Tier::Device => (&self.index, Tier::Host, CopyKind::DeviceToHost),
            Tier::Host => (&self.host_index, Tier::Device, CopyKind::HostToDevice),
        };
        let e = index.entry(src).expect("the copied page is registered");
        let (hash, parent, extra, lora) = (e.hash, e.parent, e.extra, e.lora);
        let tokens = e.tokens.to_vec();
        self.index_insert(
            to,
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
                num_tokens: self.page_size as u32,
                kind,
            },
            holds_src: false,
        });
    }

    /// Drops one `holder` reference on a device page.
    pub(super) fn release_device(&mut self, page: u32, holder: Holder) {
        let registered = self.is_registered(page);
        self.device.release(page, holder, registered);
    }

    /// Number of cached (refcount 0) device pages among the device hits: taking them shrinks the
    /// evictable set, which availability checks must account for.
    pub(super) fn cached_among(&self, hits: &[Hit]) -> usize {
        hits.iter()
            .filter(|h| h.tier == Tier::Device && self.device.refcount(h.page) == 0)
            .count()
    }

    // ---- the prefix walk ----

    /// Walks the prefix index along `tokens` for at most `max_pages` pages: each page is looked
    /// up on the device, then (with a host cache) on the host. Read-only.
    ///
    /// Pages go in groups of [`WALK_GROUP`]: the group's chain digests first (they depend on the
    /// tokens alone), then its device lookups, which are independent of each other, so their
    /// cache misses overlap instead of following one another (the index is cold when an engine
    /// calls between model steps). A miss ends the walk; at most one group is hashed past it.
    pub(super) fn walk(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_pages: usize,
        tiers: bool,
    ) -> Vec<Hit> {
        let mut hits = Vec::new();
        if !self.cfg.enable_prefix_caching {
            return hits;
        }
        let host = tiers && self.host_cache();
        let ps = self.page_size;
        let mut parent = self.root;
        let mut chunks = tokens.chunks_exact(ps).take(max_pages).enumerate();
        let mut group = [WalkPage::default(); WALK_GROUP];
        loop {
            // Digests of the next group, up to a page holding a placeholder (negative) token.
            let mut len = 0;
            let mut last = false;
            let first = hits.len();
            for (i, chunk) in chunks.by_ref() {
                if chunk.iter().any(|&t| t < 0) {
                    last = true;
                    break;
                }
                let e = extra.map_or(0, |x| x.page_digest(i, ps));
                parent = chain_hash(parent, e, chunk, &mut self.hash_scratch);
                group[len] = WalkPage {
                    hash: parent,
                    extra: e,
                    found: None,
                };
                len += 1;
                if len == WALK_GROUP {
                    break;
                }
            }
            for g in &mut group[..len] {
                g.found = self.index.find(g.hash);
            }
            for (
                j,
                &WalkPage {
                    hash: h,
                    extra: e,
                    found,
                },
            ) in group[..len].iter().enumerate()
            {
                let chunk = &tokens[(first + j) * ps..(first + j + 1) * ps];
                let hit = match found.filter(|&p| self.index.verify(p, e, chunk)) {
                    Some(page) => Hit {
                        tier: Tier::Device,
                        page,
                        hash: h,
                    },
                    None => match host.then(|| self.host_index.lookup(h, e, chunk)).flatten() {
                        Some(page) => Hit {
                            tier: Tier::Host,
                            page,
                            hash: h,
                        },
                        None => return hits,
                    },
                };
                hits.push(hit);
            }
            if last || len < WALK_GROUP {
                return hits;
            }
        }
    }

    /// Keeps the longest prefix of `hits` whose host pages can be promoted, given `extra_needed`
    /// more device pages the caller will also take.
    pub(super) fn promotable(&self, hits: &mut Vec<Hit>, extra_needed: usize) {
        let mut room = self
            .device
            .available()
            .saturating_sub(self.cached_among(hits) + extra_needed);
        let keep = hits
            .iter()
            .position(|h| {
                if h.tier == Tier::Host {
                    if room == 0 {
                        return true;
                    }
                    room -= 1;
                }
                false
            })
            .unwrap_or(hits.len());
        hits.truncate(keep);
    }

    /// Refuses (`RefcountOverflow`) hits whose device pages cannot take one more reference:
    /// check before [`materialize`](Self::materialize).
    pub(super) fn check_hit_refs(&self, hits: &[Hit]) -> Result<()> {
        self.device.check_acquire(
            hits.iter()
                .filter(|h| h.tier == Tier::Device)
                .map(|h| h.page),
        )
    }

    /// Takes a `holder` reference on every hit, promoting host hits to new device pages (their
    /// host→device copies are queued and the device index learns them). Returns the device pages
    /// in order. The caller has checked device availability for the host hits.
    pub(super) fn materialize(&mut self, hits: &[Hit], holder: Holder) -> Vec<u32> {
        for h in hits {
            match h.tier {
                Tier::Device => self.device.acquire(h.page, holder),
                // Hold host hits so that demotions below cannot evict them.
                Tier::Host => self.host.acquire(h.page, Holder::Seq),
            }
        }
        let mut pages = Vec::with_capacity(hits.len());
        for h in hits {
            if h.tier == Tier::Device {
                pages.push(h.page);
                continue;
            }
            let d = self.take_device(holder);
            self.copy_entry_across(Tier::Host, h.page, d);
            self.counters.promotions += 1;
            self.counters.host_hit_tokens += self.page_size as u64;
            pages.push(d);
        }
        for h in hits {
            if h.tier == Tier::Host {
                let registered = self.is_registered_in(Tier::Host, h.page);
                self.host.release(h.page, Holder::Seq, registered);
            }
        }
        pages
    }

    /// Removes and returns up to `max` queued page copies (demotions and promotions), oldest
    /// first. Execute them in order, before the copies returned by the calls that follow and
    /// before the step's KV writes.
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
        match c.kind {
            CopyKind::HostToDevice => {
                let registered = self.is_registered_in(Tier::Host, c.src_page);
                self.host.release(c.src_page, Holder::Seq, registered);
            }
            _ => self.release_device(c.src_page, Holder::Seq),
        }
    }

    /// Looks for the longest unit prefix of page `i = hits.len()` of `tokens` (within the first
    /// `limit` tokens) cached in either tier after a page walk that found `hits`. Read-only.
    /// `None` with whole-page matching, when prefix caching is off, or when no unit matches.
    pub(super) fn walk_units(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        hits: &[Hit],
        limit: usize,
    ) -> Option<UnitMatch> {
        let ps = self.page_size;
        if !self.cfg.enable_prefix_caching || self.cfg.unit() == ps {
            return None;
        }
        let i = hits.len();
        let start = i * ps;
        let end = tokens.len().min(limit).min(start + ps);
        let chunk = tokens.get(start..end)?;
        let chunk = &chunk[..chunk.iter().position(|&t| t < 0).unwrap_or(chunk.len())];
        let parent = hits.last().map_or(self.root, |h| h.hash);
        let e = extra.map_or(0, |x| x.page_digest(i, ps));
        // Only unreferenced (cached) sources: a page some sequence holds may have filled in
        // this very step, and its KV is written only after the step's copies have run (a page
        // shared whole is read after the writes, a copied one before). A cached page's KV was
        // written before its last holder let it go, or is the target of a copy queued earlier.
        let (device, host) = (&self.device, &self.host);
        let dev = self
            .index
            .lookup_units(parent, e, chunk, &mut self.hash_scratch, |p| {
                device.refcount(p) == 0
            });
        let host = if self.host_cache() {
            self.host_index
                .lookup_units(parent, e, chunk, &mut self.hash_scratch, |p| {
                    host.refcount(p) == 0
                })
        } else {
            None
        };
        // The longer hit wins; the device one on a tie (no cross-tier read).
        let best = match (dev, host) {
            (Some(d), Some(h)) if h.tokens > d.tokens => Some((Tier::Host, h)),
            (Some(d), _) => Some((Tier::Device, d)),
            (None, Some(h)) => Some((Tier::Host, h)),
            (None, None) => None,
        }?;
        Some(UnitMatch {
            tier: best.0,
            page: best.1.page,
            tokens: best.1.tokens,
        })
    }

    /// Takes the reference a unit hit's copy holds on its source page (see [`Queued`]). The
    /// caller has checked that the page can take one more reference.
    pub(super) fn hold_unit_source(&mut self, u: UnitMatch) {
        match u.tier {
            Tier::Device => self.device.acquire(u.page, Holder::Seq),
            Tier::Host => self.host.acquire(u.page, Holder::Seq),
        }
    }

    /// Queues the copy of a unit hit's tokens from its held source page into `dst` (a new
    /// device page of the sequence); `take_copies` drops the hold.
    pub(super) fn queue_unit_copy(&mut self, u: UnitMatch, dst: u32) {
        let kind = match u.tier {
            Tier::Device => CopyKind::DeviceToDevice,
            Tier::Host => CopyKind::HostToDevice,
        };
        self.copies.push_back(Queued {
            copy: PageCopy {
                src_page: u.page,
                dst_page: dst,
                num_tokens: u.tokens as u32,
                kind,
            },
            holds_src: true,
        });
        self.counters.unit_hits += 1;
        self.counters.unit_hit_tokens += u.tokens as u64;
    }

    /// Removes and returns up to `max` queued index events, oldest first.
    pub fn take_events(&mut self, max: usize) -> Vec<Event> {
        self.events.take(max)
    }

    /// Every `(tier, chain digest)` registered now, in no particular order (for diagnostics and
    /// for checking an event consumer's view).
    pub fn registered_hashes(&self) -> Vec<(Tier, u128)> {
        let dev = self.index.entries().map(|(h, _)| (Tier::Device, h));
        dev.chain(self.host_index.entries().map(|(h, _)| (Tier::Host, h)))
            .collect()
    }

    /// Pages an allocation in `tier` can take now: free plus evictable cached pages (the
    /// `*_pages_free + *_pages_cached` of [`stats`](Self::stats), in O(1)).
    pub fn available(&self, tier: Tier) -> usize {
        self.pool(tier).available()
    }

    /// A consistent snapshot of pool figures and counters.
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
        Stats {
            device_pages_total: self.device.num_pages() as u64,
            device_pages_free: self.device.num_free() as u64,
            device_pages_cached: self.device.num_cached() as u64,
            device_pages_in_use: self.device.num_in_use() as u64,
            device_pages_shared: self.device.num_shared() as u64,
            device_pages_pinned: self.device.num_pinned() as u64,
            host_pages_total: self.host.num_pages() as u64,
            host_pages_free: self.host.num_free() as u64,
            host_pages_cached: self.host.num_cached() as u64,
            host_pages_in_use: self.host.num_in_use() as u64,
            index_pages: self.index.len() as u64,
            host_index_pages: self.host_index.len() as u64,
            num_seqs: self.seqs.len() as u64,
            num_seqs_swapped: swapped,
            logical_tokens: logical,
            physical_tokens: self.device.num_in_use() as u64 * self.page_size as u64,
            page_bytes: self.cfg.page_bytes().unwrap_or(0),
            pending_copies: self.copies.len() as u64,
            pending_events: self.events.len() as u64,
            counters,
        }
    }

    /// Refcount, state and registration of a page of `tier`.
    pub fn page_info(&self, tier: Tier, page: u32) -> Result<(u32, PageState, bool)> {
        let pool = self.pool(tier);
        if page >= pool.num_pages() {
            return Err(Error::PageOutOfRange {
                tier,
                page,
                num_pages: pool.num_pages(),
            });
        }
        let registered = self.is_registered_in(tier, page);
        Ok((pool.refcount(page), pool.state(page), registered))
    }
}
