//! Page-level operations for external holders (vLLM's BlockPool, ATB's KVCacheManager shape):
//! allocate, acquire, release, register, match, clear; pinning and prefetch of prefixes.

use super::config::Tier;
use super::error::{Error, Result};
use super::pool::{Holder, PageState};
use super::prefix::{chain_hash, Entry, ExtraKeys};
use super::state::{Match, State};

impl State {
    /// Allocates `n` device pages at refcount 1, all or nothing.
    pub fn alloc_pages(&mut self, n: usize) -> Result<Vec<u32>> {
        self.ensure_available(Tier::Device, n, 0)?;
        Ok((0..n).map(|_| self.take_device(Holder::External)).collect())
    }

    /// Adds one external reference to each page (in use, or cached: a cached page stops being
    /// evictable). All or nothing.
    pub fn acquire_pages(&mut self, pages: &[u32]) -> Result<()> {
        for &p in pages {
            self.device.check_id(p)?;
            if self.device.state(p) == PageState::Free {
                return Err(Error::PageNotAllocated {
                    tier: Tier::Device,
                    page: p,
                });
            }
        }
        self.device.check_acquire(pages.iter().copied())?;
        for &p in pages {
            self.device.acquire(p, Holder::External);
        }
        Ok(())
    }

    /// Drops one external reference from each page, in order (a page reaching 0 becomes cached
    /// if registered, else free). A page listed more times than it has external references is
    /// `RefcountUnderflow`, and then nothing is released.
    pub fn release_pages(&mut self, pages: &[u32]) -> Result<()> {
        for &p in pages {
            self.device.check_id(p)?;
        }
        // Take the external references first (a page listed more often than it is held runs out
        // here), undoing them all if one is missing; only then release.
        for (k, &p) in pages.iter().enumerate() {
            if !self.device.take_ext(p) {
                for &q in &pages[..k] {
                    self.device.restore_ext(q);
                }
                return Err(Error::RefcountUnderflow { page: p });
            }
        }
        for &p in pages {
            self.release_device(p, Holder::Seq);
        }
        Ok(())
    }

    /// Registers the full pages of a token sequence held in `pages` (page `i` holds tokens
    /// `i*page_size..(i+1)*page_size`). Pages already registered, pages whose content is already
    /// cached in another page, and pages with negative (placeholder) tokens — and everything after
    /// them — are skipped. Returns how many pages were newly registered.
    pub fn register(
        &mut self,
        tokens: &[i32],
        pages: &[u32],
        extra: Option<&ExtraKeys>,
    ) -> Result<usize> {
        if !self.cfg.enable_prefix_caching {
            return Err(Error::Unsupported(
                "prefix caching is disabled in this cache's config".into(),
            ));
        }
        let full = tokens.len() / self.page_size;
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
            self.device.check_id(p)?;
            if self.device.refcount(p) == 0 {
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
            let chunk = &tokens[i * self.page_size..(i + 1) * self.page_size];
            if chunk.iter().any(|&t| t < 0) {
                break;
            }
            let e = extra.map_or(0, |x| x.page_digest(i, self.page_size));
            let h = chain_hash(parent, e, chunk, &mut self.hash_scratch);
            if self.index_insert(
                Tier::Device,
                page,
                Entry {
                    hash: h,
                    parent,
                    extra: e,
                    lora,
                    tokens: chunk,
                },
            ) {
                added += 1;
            }
            parent = h;
        }
        Ok(added)
    }

    /// Longest cached prefix of `tokens` (at most `max_tokens` tokens, whole pages only).
    ///
    /// Without `acquire` this is a pure lookup of the device tier: the pages may be evicted by the
    /// next allocation. With `acquire`, each returned page gets an external reference (release it
    /// with [`release_pages`](Self::release_pages)), pages found only in the host tier are promoted
    /// to new device pages (copies queued, see [`take_copies`](Self::take_copies)) as far as
    /// device room allows, and the lookup counts in the stats. `BufferTooSmall` (before any
    /// change) if the match has more than `max_pages_out` pages.
    pub fn match_prefix(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_tokens: usize,
        acquire: bool,
        max_pages_out: usize,
    ) -> Result<Match> {
        let max_pages = tokens.len().min(max_tokens) / self.page_size;
        let mut hits = self.walk(tokens, extra, max_pages, acquire);
        if acquire {
            self.promotable(&mut hits, 0);
        }
        if hits.len() > max_pages_out {
            return Err(Error::BufferTooSmall {
                what: "pages_out",
                needed: hits.len(),
                capacity: max_pages_out,
            });
        }
        if acquire {
            self.check_hit_refs(&hits)?;
        }
        let hashes: Vec<u128> = hits.iter().map(|h| h.hash).collect();
        let promoted = hits.iter().filter(|h| h.tier == Tier::Host).count();
        let pages = if acquire {
            self.counters.prefix_queries += 1;
            self.counters.prefix_query_tokens += tokens.len() as u64;
            self.counters.prefix_hit_tokens += (hits.len() * self.page_size) as u64;
            self.materialize(&hits, Holder::External)
        } else {
            hits.iter().map(|h| h.page).collect()
        };
        Ok(Match {
            tokens: pages.len() * self.page_size,
            pages,
            hashes,
            promoted,
        })
    }

    /// Pins the cached prefix of `tokens` (whole pages; host pages are promoted first): its pages
    /// are never evicted until [`unpin`](Self::unpin) with the returned id. Returns the pin id and
    /// the number of pages pinned (0 if nothing of the prefix is cached: register it first).
    pub fn pin(&mut self, tokens: &[i32], extra: Option<&ExtraKeys>) -> Result<(u64, usize)> {
        let mut hits = self.walk(tokens, extra, usize::MAX, true);
        let wanted = hits.len();
        self.promotable(&mut hits, 0);
        if hits.len() < wanted {
            let host = wanted - hits.iter().filter(|h| h.tier == Tier::Device).count();
            return Err(Error::NoSpace {
                tier: Tier::Device,
                needed: host,
                available: self.device.available(),
            });
        }
        self.check_hit_refs(&hits)?;
        let pages = self.materialize(&hits, Holder::Pin);
        let id = self.next_pin;
        self.next_pin += 1;
        let n = pages.len();
        self.pins.insert(id, pages);
        Ok((id, n))
    }

    /// Releases a pin; its pages become evictable again (unless held otherwise).
    pub fn unpin(&mut self, pin_id: u64) -> Result<()> {
        let pages = self
            .pins
            .remove(&pin_id)
            .ok_or_else(|| Error::arg("pin_id", format!("no pin {pin_id}")))?;
        for &p in pages.iter().rev() {
            self.release_device(p, Holder::Pin);
        }
        Ok(())
    }

    /// Starts promoting the host-tier pages of `tokens`' cached prefix back to the device (as
    /// cached, unreferenced pages) so a request queued behind others finds them there; the copies
    /// are queued. Uses only room that is free or evictable; returns the pages promoted.
    pub fn prefetch(&mut self, tokens: &[i32], extra: Option<&ExtraKeys>) -> usize {
        let mut hits = self.walk(tokens, extra, usize::MAX, true);
        self.promotable(&mut hits, 0);
        let promoted = hits.iter().filter(|h| h.tier == Tier::Host).count();
        // A device page at the reference limit cannot take the transient hold: promote nothing.
        if promoted == 0 || self.check_hit_refs(&hits).is_err() {
            return 0;
        }
        let pages = self.materialize(&hits, Holder::Seq);
        for &p in pages.iter().rev() {
            self.release_device(p, Holder::Seq);
        }
        self.counters.prefetched += promoted as u64;
        promoted
    }

    /// Drops every prefix-index entry of both tiers. Unreferenced cached pages become free; pages
    /// in use (or pinned) stay with their holders but will not be matched again. Works at any time.
    pub fn clear_index(&mut self) {
        for tier in [Tier::Device, Tier::Host] {
            let pages = match tier {
                Tier::Device => self.index.clear(),
                Tier::Host => self.host_index.clear(),
            };
            for page in pages {
                match tier {
                    Tier::Device => self.device.uncache(page),
                    Tier::Host => self.host.uncache(page),
                }
            }
            self.events.push(super::events::Event {
                kind: super::events::EventKind::Cleared,
                tier,
                hash: 0,
                parent: 0,
                lora_id: 0,
                num_tokens: 0,
                page: 0,
            });
        }
        self.counters.index_clears += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    /// Issue 15, item 1: page size 4, 8 device pages, one page registered under 4 tokens and
    /// acquired up to the 32-bit limit (forced: 2^32 real calls take minutes). Every acquire past
    /// the limit must fail with `RefcountOverflow` and change nothing; before the fix the count
    /// wrapped to 0 (FREE yet registered) and the next `match(acquire)` panicked.
    #[test]
    fn acquire_never_wraps_the_refcount() {
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 8,
            ..Config::default()
        })
        .unwrap();
        let tokens = [1, 2, 3, 4];
        let p = s.alloc_pages(1).unwrap()[0];
        assert_eq!(s.register(&tokens, &[p], None).unwrap(), 1);
        s.device.force_external_refs(p, u32::MAX - 1);
        s.check().unwrap();
        let before = s.stats();

        let overflow = Err(Error::RefcountOverflow {
            page: p,
            refcount: u32::MAX - 1,
            adding: 2,
        });
        assert_eq!(s.acquire_pages(&[p, p]), overflow);
        assert_eq!(s.stats(), before);
        s.acquire_pages(&[p]).unwrap(); // exactly u32::MAX
        assert_eq!(s.device.refcount(p), u32::MAX);
        let full = |adding| {
            Err(Error::RefcountOverflow {
                page: p,
                refcount: u32::MAX,
                adding,
            })
        };
        assert_eq!(s.acquire_pages(&[p]), full(1));
        // Every other path that adds a holder to a cached page refuses the same way.
        assert_eq!(
            s.match_prefix(&tokens, None, 4, true, 1).map(|_| ()),
            full(1)
        );
        assert_eq!(s.pin(&tokens, None).map(|_| ()), full(1));
        assert_eq!(s.begin(7, &tokens, None, 4).map(|_| ()), full(1));
        assert_eq!(s.prefetch(&tokens, None), 0);
        // A lookup without a hold still works, and nothing changed.
        assert_eq!(
            s.match_prefix(&tokens, None, 4, false, 1).unwrap().pages,
            [p]
        );
        assert_eq!(s.device.refcount(p), u32::MAX);
        assert_eq!(s.page_info(Tier::Device, p).unwrap().1, PageState::InUse);
        s.check().unwrap();
        s.release_pages(&[p]).unwrap();
        s.match_prefix(&tokens, None, 4, true, 1).unwrap();
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
        s.begin(1, &[1, 2, 3, 4, 5], None, 0).unwrap();
        let p = s.seq_pages(1).unwrap()[1];
        s.device.force_external_refs(p, u32::MAX);
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
        s.begin(1, &[1, 2, 3, 4, 5], None, usize::MAX).unwrap();
        s.begin(2, &[1, 2, 3, 4, 6], None, usize::MAX).unwrap();
        let mut copies = Vec::new();
        s.swap_out(1, &mut copies, usize::MAX).unwrap();
        let h = s.seq_pages(1).unwrap()[0];
        s.host.force_external_refs(h, u32::MAX);
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
