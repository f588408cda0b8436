//! Page-level operations for external holders (vLLM's BlockPool, ATB's KVCacheManager shape),
//! on one group's pages: allocate, acquire, release, register, match; and, across groups,
//! pinning and prefetch of prefixes and clearing the index.

use super::error::{Error, Result};
use super::events::{Event, EventKind};
use super::hit::GroupsHit;
use super::pool::{Holder, PageState};
use super::prefix::{chain_hash, has_placeholder, Entry, ExtraKeys};
use super::state::{Hit, Release, State, NULL_PAGE};
use super::tier::Tier;

/// A prefix match of one group: the pages found, their chain digests, and the tokens they cover.
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

impl State {
    /// Allocates `n` device pages of `group`'s pool at refcount 1, all or nothing.
    pub fn alloc_pages(&mut self, group: usize, n: usize) -> Result<Vec<u32>> {
        self.check_group(group)?;
        let pool = self.groups[group].pool;
        self.ensure_available(pool, Tier::Device, n, 0)?;
        Ok((0..n)
            .map(|_| self.take_device(pool, Holder::External))
            .collect())
    }

    /// Adds one external reference to each page of `group`'s pool (in use, or cached: a cached
    /// page stops being evictable). All or nothing.
    pub fn acquire_pages(&mut self, group: usize, pages: &[u32]) -> Result<()> {
        self.check_group(group)?;
        let dev = &self.pools[self.groups[group].pool].device;
        for &p in pages {
            dev.check_id(p)?;
            if dev.state(p) == PageState::Free {
                return Err(Error::PageNotAllocated {
                    tier: Tier::Device,
                    page: p,
                });
            }
        }
        dev.check_acquire(pages.iter().copied())?;
        let dev = &mut self.pools[self.groups[group].pool].device;
        for &p in pages {
            dev.acquire(p, Holder::External);
        }
        Ok(())
    }

    /// Drops one external reference from each page of `group`'s pool, in order (a page reaching
    /// 0 becomes cached if registered, else free). A page listed more times than it has external
    /// references is `RefcountUnderflow`, and then nothing is released.
    pub fn release_pages(&mut self, group: usize, pages: &[u32]) -> Result<()> {
        self.check_group(group)?;
        let pool = self.groups[group].pool;
        for &p in pages {
            self.pools[pool].device.check_id(p)?;
        }
        // Take the external references first (a page listed more often than it is held runs out
        // here), undoing them all if one is missing; only then release.
        for (k, &p) in pages.iter().enumerate() {
            if !self.pools[pool].device.take_ext(p) {
                for &q in &pages[..k] {
                    self.pools[pool].device.restore_ext(q);
                }
                return Err(Error::RefcountUnderflow { page: p });
            }
        }
        for &p in pages {
            self.release_device(pool, p, Holder::Seq, Release::Free);
        }
        Ok(())
    }

    /// Registers, in `group`'s index, the full pages of a token sequence held in `pages` (page
    /// `i` holds tokens `i*page_size..(i+1)*page_size`). Pages already registered, pages whose
    /// content is already cached in another page, pages a sequence holds (the sequence registers
    /// them under its own tokens), and pages with negative (placeholder) tokens — and everything
    /// after them — are skipped. Returns how many pages were newly registered.
    pub fn register(
        &mut self,
        group: usize,
        tokens: &[i32],
        pages: &[u32],
        extra: Option<&ExtraKeys>,
    ) -> Result<usize> {
        self.check_group(group)?;
        if !self.cfg.enable_prefix_caching {
            return Err(Error::Unsupported(
                "prefix caching is disabled in this cache's config".into(),
            ));
        }
        let ps = self.ps;
        let pool = self.groups[group].pool;
        let full = tokens.len() / ps;
        if pages.len() > full {
            return Err(Error::arg(
                "pages",
                format!(
                    "{} pages given but the tokens fill only {full} pages",
                    pages.len()
                ),
            ));
        }
        for &p in pages {
            self.pools[pool].device.check_id(p)?;
            if self.pools[pool].device.refcount(p) == 0 {
                return Err(Error::PageNotAllocated {
                    tier: Tier::Device,
                    page: p,
                });
            }
        }
        let lora = extra.map_or(0, |x| x.lora_id);
        let mut parent = self.root;
        let mut added = 0;
        for (i, &page) in pages.iter().enumerate() {
            let chunk = &tokens[i * ps..(i + 1) * ps];
            if has_placeholder(chunk) {
                break;
            }
            let e = extra.map_or(0, |x| x.page_digest(i, ps));
            let h = chain_hash(parent, e, chunk, &mut self.hash_scratch);
            let entry = Entry {
                hash: h,
                parent,
                extra: e,
                lora,
                tokens: chunk,
            };
            // NOTE: a sequence's page registered under the caller's tokens would hand the
            // sequence's KV to a later prompt with those tokens.
            let dev = &self.pools[pool].device;
            let seq_held = dev.refcount(page) > dev.ext_refs(page) + dev.pins(page);
            if !seq_held && self.index_insert(pool, Tier::Device, group as u32, page, entry) {
                added += 1;
            }
            parent = h;
        }
        Ok(added)
    }

    /// Drops the prefix-index entries of device pages `pages` of `group`'s pool, whichever of
    /// the pool's groups registered them (vLLM's `evict_blocks`: blocks whose KV a failed load
    /// left wrong). A page that holds no entry is skipped. An unreferenced page becomes free; a
    /// held one stays with its holders and is freed, not cached, when they let it go. A
    /// registered page's duplicate (the same content in another page) takes its entry; pages
    /// registered after it stay registered, unreachable by a prefix walk until a page of the
    /// same content is registered again. Removals are published as events. Returns the
    /// number of entries dropped. Refused (nothing changes) for a bad group, an out-of-range
    /// or padding page.
    pub fn unregister(&mut self, group: usize, pages: &[u32]) -> Result<usize> {
        self.check_group(group)?;
        let pool = self.groups[group].pool;
        for &p in pages {
            self.pools[pool].device.check_id(p)?;
        }
        if !self.cfg.enable_prefix_caching {
            return Ok(0); // nothing is ever registered
        }
        let mut n = 0;
        for &page in pages {
            n += usize::from(self.drop_entry(pool, page));
        }
        Ok(n)
    }

    /// Longest cached prefix of `tokens` in `group`'s index (at most `max_tokens` tokens, whole
    /// pages only, pages from the first on).
    ///
    /// Without `acquire` this is a pure lookup of the device tier: the pages may be evicted by the
    /// next allocation. With `acquire`, each returned page gets an external reference (release it
    /// with [`release_pages`](Self::release_pages)), pages found only in the host tier are promoted
    /// to new device pages (copies queued, see [`take_copies`](Self::take_copies)) as far as
    /// device room allows, and the lookup counts in the stats. `BufferTooSmall` (before any
    /// change) if the match has more than `max_pages_out` pages.
    pub fn match_prefix(
        &mut self,
        group: usize,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_tokens: usize,
        acquire: bool,
        max_pages_out: usize,
    ) -> Result<Match> {
        self.check_group(group)?;
        let ps = self.ps;
        let pool = self.groups[group].pool;
        let max_pages = tokens.len().min(max_tokens) / ps;
        let mut hits = self.group_walk(group, tokens, extra, max_pages, acquire);
        if acquire {
            let room = self.pools[pool]
                .device
                .available()
                .saturating_sub(self.cached_among(pool, hits.iter().map(|(h, _)| h)));
            promotable(&mut hits, room);
        }
        if hits.len() > max_pages_out {
            return Err(Error::BufferTooSmall {
                what: "pages_out",
                needed: hits.len(),
                capacity: max_pages_out,
            });
        }
        let list: Vec<Hit> = hits.iter().map(|(h, _)| *h).collect();
        if acquire {
            self.check_hit_refs(pool, &list)?;
        }
        let hashes: Vec<u128> = hits.iter().map(|(_, k)| *k).collect();
        let promoted = list.iter().filter(|h| h.tier == Tier::Host).count();
        let pages = if acquire {
            self.counters.prefix_queries += 1;
            self.counters.prefix_query_tokens += tokens.len() as u64;
            self.counters.prefix_hit_tokens += (list.len() * ps) as u64;
            self.materialize(group, &list, Holder::External)
        } else {
            list.iter().map(|h| h.page).collect()
        };
        Ok(Match {
            tokens: pages.len() * ps,
            pages,
            hashes,
            promoted,
        })
    }

    /// Walks `group`'s index along `tokens` from the first page (device, then host when
    /// `tiers` and a host cache), for at most `max_pages` pages: the hits and their digests.
    fn group_walk(
        &mut self,
        group: usize,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_pages: usize,
        tiers: bool,
    ) -> Vec<(Hit, u128)> {
        if group == 0 && self.plain {
            return self
                .walk(tokens, extra, max_pages, tiers)
                .into_iter()
                .map(|(h, k)| (h, k.hash))
                .collect();
        }
        let mut out = Vec::new();
        if !self.cfg.enable_prefix_caching {
            return out;
        }
        let ps = self.ps;
        let host = tiers && self.host_cache();
        let g = group as u32;
        let mut parent = self.root;
        for (i, chunk) in tokens.chunks_exact(ps).take(max_pages).enumerate() {
            if has_placeholder(chunk) {
                break;
            }
            let e = extra.map_or(0, |x| x.page_digest(i, ps));
            parent = chain_hash(parent, e, chunk, &mut self.hash_scratch);
            let p = &self.pools[self.groups[group].pool];
            let hit = match p.index.lookup(g, parent, e, chunk) {
                Some(page) => Hit {
                    tier: Tier::Device,
                    page,
                },
                None => match host
                    .then(|| p.host_index.lookup(g, parent, e, chunk))
                    .flatten()
                {
                    Some(page) => Hit {
                        tier: Tier::Host,
                        page,
                    },
                    None => break,
                },
            };
            out.push((hit, parent));
        }
        out
    }

    /// Refuses (`RefcountOverflow`) hits whose device pages cannot take one more reference:
    /// check before [`materialize`](Self::materialize).
    pub(crate) fn check_hit_refs(&self, pool: usize, hits: &[Hit]) -> Result<()> {
        self.pools[pool].device.check_acquire(
            hits.iter()
                .filter(|h| h.tier == Tier::Device)
                .map(|h| h.page),
        )
    }

    /// The cross-group hit of at most `max_tokens` tokens of `tokens` (every page of it; pages
    /// of the host tier too when `tiers`).
    fn prefix_hit(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_tokens: usize,
        tiers: bool,
    ) -> GroupsHit {
        self.prefix_hit_keyed(tokens, extra, max_tokens, tiers, false)
            .0
    }

    /// [`prefix_hit`](Self::prefix_hit) (with `eagle`, an engine's lookup: EAGLE sets drop their
    /// last hit page) and the chain digest a unit hit after it continues from:
    /// its last page's (the root for no page), `None` when the hit runs past the hashed pages
    /// (chunked local attention never looks up the pages before its chunk), as in a begin.
    fn prefix_hit_keyed(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_tokens: usize,
        tiers: bool,
        eagle: bool,
    ) -> (GroupsHit, Option<u128>) {
        let tokens = &tokens[..tokens.len().min(max_tokens)];
        if self.plain {
            let mut walked = self.walk(tokens, extra, usize::MAX, tiers);
            if eagle && self.groups[0].eagle {
                walked.pop(); // the fixed point of one full set: its hit less its last page
            }
            let parent = walked.last().map_or(self.root, |(_, k)| k.hash);
            let hit = GroupsHit {
                groups: vec![walked.into_iter().map(|(h, _)| Some(h)).collect()],
            };
            return (hit, Some(parent));
        }
        if !self.cfg.enable_prefix_caching {
            let hit = GroupsHit {
                groups: vec![Vec::new(); self.groups.len()],
            };
            return (hit, Some(self.root));
        }
        let (keys, _) = self.page_keys(tokens, extra, &[]);
        let hit = self.groups_hit(&keys, tokens, tokens.len(), tiers, eagle);
        let parent = match hit.groups.iter().map(Vec::len).max().unwrap_or(0) {
            0 => Some(self.root),
            n => keys.get(n - 1).map(|k| k.hash),
        };
        (hit, parent)
    }

    /// The longest prefix hit of `tokens` every group can serve, at most `max_tokens` tokens
    /// (vLLM's `get_computed_blocks`: pass `tokens.len() - 1`), in the device tier: what
    /// [`begin`](Self::begin) would take, before the same-step rule of state groups. Read-only:
    /// nothing is held, promoted or counted, so the pages may be evicted by the next allocation.
    /// Returns the hit in tokens and, per group, its pages for the hit's whole-page positions:
    /// [`NULL_PAGE`] where the group no longer reads the position. With `match_unit` below the
    /// page size the hit also counts the whole units a begin would copy from a cached page no
    /// sequence holds (device or host tier, as a begin picks them) into its first new page:
    /// then it is no multiple of the page size, and the pages cover its whole pages only. An
    /// EAGLE group's hit drops its last page (vLLM's `drop_eagle_block`); a begin capped at the
    /// hit found here then takes exactly it.
    pub fn find_hit(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_tokens: usize,
    ) -> (usize, Vec<Vec<u32>>) {
        let (hit, parent) = self.prefix_hit_keyed(tokens, extra, max_tokens, false, true);
        let n = hit.groups.iter().map(Vec::len).max().unwrap_or(0);
        let pages = hit
            .groups
            .iter()
            .map(|v| {
                let mut p: Vec<u32> = v.iter().map(|h| h.map_or(NULL_PAGE, |h| h.page)).collect();
                p.resize(n, NULL_PAGE);
                p
            })
            .collect();
        let limit = tokens.len().min(max_tokens);
        let units = match parent {
            Some(parent) => self.unit_hits(tokens, extra, parent, n, limit),
            None => Vec::new(),
        };
        (n * self.ps + units.first().map_or(0, |u| u.tokens), pages)
    }

    /// Tokens of the longest prefix hit of `tokens` every group can serve from the device and
    /// host tiers, at most `max_tokens` (whole pages): what a begin would match before any
    /// promotion, asked of several engines' caches by a KV-aware router. Read-only like
    /// [`find_hit`](Self::find_hit): nothing is held, promoted or counted.
    pub fn cached_prefix_tokens(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_tokens: usize,
    ) -> usize {
        let hit = self.prefix_hit(tokens, extra, max_tokens, true);
        hit.groups.iter().map(Vec::len).max().unwrap_or(0) * self.ps
    }

    /// Host hits of `hit` per pool, and whether every pool has room to promote them.
    fn promotions_fit(&self, hit: &GroupsHit) -> (usize, bool) {
        let np = self.pools.len();
        let (mut host, mut cached) = (vec![0; np], vec![Vec::new(); np]);
        for (g, h) in hit.pages() {
            let pool = self.groups[g].pool;
            match h.tier {
                Tier::Host => host[pool] += 1,
                Tier::Device => cached[pool].push(h),
            }
        }
        let fits = (0..np).all(|p| {
            let room = self.pools[p]
                .device
                .available()
                .saturating_sub(self.cached_among(p, &cached[p]));
            host[p] <= room
        });
        (host.iter().sum(), fits)
    }

    /// Pins the cached prefix of `tokens` (whole pages, every group's pages of the hit; host
    /// pages are promoted first): its pages are never evicted until [`unpin`](Self::unpin) with
    /// the returned id. Returns the pin id and the number of pages pinned (0 if nothing of the
    /// prefix is cached: register it first).
    pub fn pin(&mut self, tokens: &[i32], extra: Option<&ExtraKeys>) -> Result<(u64, usize)> {
        let hit = self.prefix_hit(tokens, extra, usize::MAX, true);
        let (host, fits) = self.promotions_fit(&hit);
        if !fits {
            let available = self
                .pools
                .iter()
                .map(|p| p.device.available())
                .min()
                .unwrap_or(0);
            return Err(Error::NoSpace {
                tier: Tier::Device,
                needed: host,
                available,
            });
        }
        for (g, v) in hit.groups.iter().enumerate() {
            let list: Vec<Hit> = v.iter().flatten().copied().collect();
            self.check_hit_refs(self.groups[g].pool, &list)?;
        }
        let mut held = Vec::new();
        for (g, v) in hit.groups.iter().enumerate() {
            let list: Vec<Hit> = v.iter().flatten().copied().collect();
            for p in self.materialize(g, &list, Holder::Pin) {
                held.push((g as u32, p));
            }
        }
        let id = self.next_pin;
        self.next_pin += 1;
        let n = held.len();
        self.pins.insert(id, held);
        Ok((id, n))
    }

    /// Releases a pin; its pages become evictable again (unless held otherwise).
    pub fn unpin(&mut self, pin_id: u64) -> Result<()> {
        let pages = self
            .pins
            .remove(&pin_id)
            .ok_or_else(|| Error::arg("pin_id", format!("no pin {pin_id}")))?;
        for &(g, p) in pages.iter().rev() {
            let pool = self.groups[g as usize].pool;
            self.release_device(pool, p, Holder::Pin, Release::Free);
        }
        Ok(())
    }

    /// Starts promoting the host-tier pages of `tokens`' cached prefix back to the device (as
    /// cached, unreferenced pages) so a request queued behind others finds them there; the copies
    /// are queued. Uses only room that is free or evictable; returns the pages promoted.
    pub fn prefetch(&mut self, tokens: &[i32], extra: Option<&ExtraKeys>) -> usize {
        let hit = self.prefix_hit(tokens, extra, usize::MAX, true);
        let (promoted, fits) = self.promotions_fit(&hit);
        if promoted == 0 || !fits {
            return 0;
        }
        // A device page at the reference limit cannot take the transient hold: promote nothing.
        for (g, v) in hit.groups.iter().enumerate() {
            let list: Vec<Hit> = v.iter().flatten().copied().collect();
            if self.check_hit_refs(self.groups[g].pool, &list).is_err() {
                return 0;
            }
        }
        for (g, v) in hit.groups.iter().enumerate() {
            let list: Vec<Hit> = v.iter().flatten().copied().collect();
            let pool = self.groups[g].pool;
            let pages = self.materialize(g, &list, Holder::Seq);
            for &p in pages.iter().rev() {
                self.release_device(pool, p, Holder::Seq, Release::Free);
            }
        }
        self.counters.prefetched += promoted as u64;
        promoted
    }

    /// Drops every prefix-index entry of both tiers, every group (and vLLM's duplicates).
    /// Unreferenced cached pages become free, at the free list's tail in the order they would
    /// have been evicted; pages in use (or pinned) stay with their holders but will not be
    /// matched again. Works at any time.
    pub fn clear_index(&mut self) {
        for tier in [Tier::Device, Tier::Host] {
            for pool in 0..self.pools.len() {
                let p = &mut self.pools[pool];
                let pages = match tier {
                    Tier::Device => {
                        // The eviction order, read before the index forgets the pages.
                        let order = p.device.lists().map(|(_, c)| c).unwrap_or_default();
                        let mut pages = p.index.clear();
                        p.dups.clear();
                        for (i, d) in p.dup_of.iter_mut().enumerate() {
                            if d.take().is_some() {
                                pages.push(i as u32);
                            }
                        }
                        // Every unreferenced page on the eviction lists (the cached ones, and
                        // under vLLM's 0.23 free order its queued uncached ones) joins the free
                        // list's tail in that order: vLLM's block pool keeps its free queue as
                        // it is when it forgets every hash.
                        for page in order.into_iter().flatten() {
                            p.device.uncache_to(page, true);
                        }
                        pages
                    }
                    Tier::Host => p.host_index.clear(),
                };
                for page in pages {
                    match tier {
                        Tier::Device => p.device.uncache(page),
                        Tier::Host => p.host.uncache(page),
                    }
                }
            }
            self.events.push(Event {
                kind: EventKind::Cleared,
                tier,
                hash: 0,
                parent: 0,
                lora_id: 0,
                num_tokens: 0,
                page: 0,
                group: 0,
            });
        }
        self.counters.index_clears += 1;
    }
}

/// Keeps the longest prefix of `hits` whose host pages fit in `room` device pages.
fn promotable(hits: &mut Vec<(Hit, u128)>, mut room: usize) {
    let keep = hits
        .iter()
        .position(|(h, _)| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    /// Page size 4, 8 device pages, one page registered under 4 tokens and
    /// acquired up to the 32-bit limit (forced: 2^32 real calls take minutes). Every acquire past
    /// the limit must fail with `RefcountOverflow` and change nothing: a count wrapped to 0 would
    /// leave the page FREE yet registered, and the next `match(acquire)` would panic.
    #[test]
    fn acquire_never_wraps_the_refcount() {
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 8,
            ..Config::default()
        })
        .unwrap();
        let tokens = [1, 2, 3, 4];
        let p = s.alloc_pages(0, 1).unwrap()[0];
        assert_eq!(s.register(0, &tokens, &[p], None).unwrap(), 1);
        s.pools[0].device.force_external_refs(p, u32::MAX - 1);
        s.check().unwrap();
        let before = s.stats();

        let overflow = Err(Error::RefcountOverflow {
            page: p,
            refcount: u32::MAX - 1,
            adding: 2,
        });
        assert_eq!(s.acquire_pages(0, &[p, p]), overflow);
        assert_eq!(s.stats(), before);
        s.acquire_pages(0, &[p]).unwrap(); // exactly u32::MAX
        assert_eq!(s.pools[0].device.refcount(p), u32::MAX);
        let full = |adding| {
            Err(Error::RefcountOverflow {
                page: p,
                refcount: u32::MAX,
                adding,
            })
        };
        assert_eq!(s.acquire_pages(0, &[p]), full(1));
        // Every other path that adds a holder to a cached page refuses the same way.
        assert_eq!(
            s.match_prefix(0, &tokens, None, 4, true, 1).map(|_| ()),
            full(1)
        );
        assert_eq!(s.pin(&tokens, None).map(|_| ()), full(1));
        assert_eq!(s.begin(7, &tokens, None, 4, 0).map(|_| ()), full(1));
        assert_eq!(s.prefetch(&tokens, None), 0);
        // A lookup without a hold still works, and nothing changed.
        assert_eq!(
            s.match_prefix(0, &tokens, None, 4, false, 1).unwrap().pages,
            [p]
        );
        assert_eq!(s.pools[0].device.refcount(p), u32::MAX);
        assert_eq!(s.page_info(Tier::Device, 0, p).unwrap().1, PageState::InUse);
        s.check().unwrap();
        s.release_pages(0, &[p]).unwrap();
        s.match_prefix(0, &tokens, None, 4, true, 1).unwrap();
        s.check().unwrap();
    }

    /// Fork adds a holder to every page of the parent: refused at the limit.
    #[test]
    fn fork_never_wraps_the_refcount() {
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 8,
            ..Config::default()
        })
        .unwrap();
        s.begin(1, &[1, 2, 3, 4, 5], None, 0, 0).unwrap();
        let p = s.seq_pages(1, 0).unwrap()[1];
        s.pools[0].device.force_external_refs(p, u32::MAX);
        assert!(matches!(
            s.fork(1, 2),
            Err(Error::RefcountOverflow { adding: 1, .. })
        ));
        assert!(s.seq_info(2).is_err());
        s.check().unwrap();
    }

    /// A swap-out sharing a host page (content already on the host) adds a holder to it:
    /// refused at the limit, changing nothing.
    #[test]
    fn swap_out_sharing_never_wraps_a_host_refcount() {
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 8,
            num_host_pages: 8,
            ..Config::default()
        })
        .unwrap();
        s.begin(1, &[1, 2, 3, 4, 5], None, usize::MAX, 0).unwrap();
        s.begin(2, &[1, 2, 3, 4, 6], None, usize::MAX, 0).unwrap();
        let mut copies = Vec::new();
        s.swap_out(1, &mut copies, usize::MAX).unwrap();
        let h = s.seq_pages(1, 0).unwrap()[0];
        s.pools[0].host.force_external_refs(h, u32::MAX);
        s.check().unwrap();
        let before = s.stats();
        assert!(matches!(
            s.swap_out(2, &mut copies, usize::MAX),
            Err(Error::RefcountOverflow { adding: 1, .. })
        ));
        assert_eq!(s.stats(), before);
        assert_eq!(s.seq_info(2).unwrap().tier, Tier::Device);
        s.check().unwrap();
    }
}
