//! One tier's page pool: flat per-page metadata, refcounts, and two intrusive lists.
//!
//! * `FREE`: refcount 0, no content worth keeping. Allocation takes the head; pages freed
//!   without a prefix-index entry go back to the head (LIFO reuse, warm in caches).
//! * `CACHED`: refcount 0 but registered in the prefix index, in LRU order: eviction takes
//!   the head, pages released to 0 join the tail. A prefix hit removes a page from the middle.
//!
//! Every operation here is O(1) per page. The pool trusts its caller (`State`) to have validated
//! ids and states; it `debug_assert!`s them.

use super::config::Tier;
use super::error::{Error, Result};
use super::list::Links;

const FREE: usize = 0;
const CACHED: usize = 1;

/// Where a page stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// On the free list.
    Free,
    /// Unreferenced but registered in the prefix index (evictable, LRU).
    Cached,
    /// Held by at least one sequence or external holder.
    InUse,
    /// The reserved padding page: never allocated.
    Padding,
}

/// Pages of one tier.
#[derive(Debug, Clone)]
pub struct PagePool {
    tier: Tier,
    num_pages: u32,
    padding: Option<u32>,
    refcount: Vec<u32>,
    ext_refs: Vec<u32>,
    on_cached: Vec<bool>,
    links: Links,
    in_use: usize,
    shared: usize,
}

impl PagePool {
    /// `num_pages` free pages; page 0 reserved as padding when `reserve_padding`.
    pub fn new(tier: Tier, num_pages: u32, reserve_padding: bool) -> Self {
        let mut links = Links::new(num_pages, 2);
        let padding = reserve_padding.then_some(0);
        for p in 0..num_pages {
            if Some(p) != padding {
                links.push_back(FREE, p);
            }
        }
        PagePool {
            tier,
            num_pages,
            padding,
            refcount: vec![0; num_pages as usize],
            ext_refs: vec![0; num_pages as usize],
            on_cached: vec![false; num_pages as usize],
            links,
            in_use: 0,
            shared: 0,
        }
    }

    /// The tier this pool serves.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Total pages, padding included.
    pub fn num_pages(&self) -> u32 {
        self.num_pages
    }

    /// The padding page, if reserved.
    pub fn padding(&self) -> Option<u32> {
        self.padding
    }

    /// Refuses ids out of range and the padding page.
    pub fn check_id(&self, page: u32) -> Result<()> {
        if page >= self.num_pages {
            return Err(Error::PageOutOfRange {
                tier: self.tier,
                page,
                num_pages: self.num_pages,
            });
        }
        if Some(page) == self.padding {
            return Err(Error::PaddingPage { page });
        }
        Ok(())
    }

    /// The state of a valid page id.
    pub fn state(&self, page: u32) -> PageState {
        if Some(page) == self.padding {
            PageState::Padding
        } else if self.refcount[page as usize] > 0 {
            PageState::InUse
        } else if self.on_cached[page as usize] {
            PageState::Cached
        } else {
            PageState::Free
        }
    }

    /// Reference count of a valid page id.
    pub fn refcount(&self, page: u32) -> u32 {
        self.refcount[page as usize]
    }

    /// References held through the page API (not by sequences).
    pub fn ext_refs(&self, page: u32) -> u32 {
        self.ext_refs[page as usize]
    }

    /// Pages on the free list.
    pub fn num_free(&self) -> usize {
        self.links.len(FREE)
    }

    /// Unreferenced cached (evictable) pages.
    pub fn num_cached(&self) -> usize {
        self.links.len(CACHED)
    }

    /// Pages with refcount > 0.
    pub fn num_in_use(&self) -> usize {
        self.in_use
    }

    /// Pages with refcount > 1.
    pub fn num_shared(&self) -> usize {
        self.shared
    }

    /// Pages an allocation can take: free plus evictable.
    pub fn available(&self) -> usize {
        self.num_free() + self.num_cached()
    }

    /// The page the next [`take`](Self::take) would evict, if the free list is empty.
    pub fn next_victim(&self) -> Option<u32> {
        if self.num_free() > 0 {
            None
        } else {
            self.links.front(CACHED)
        }
    }

    /// Takes a page at refcount 1: the free head, else the LRU cached page. Returns the page and
    /// whether it was evicted from the cache (the caller must then drop its index entry).
    pub fn take(&mut self, external: bool) -> Option<(u32, bool)> {
        let (page, evicted) = match self.links.pop_front(FREE) {
            Some(p) => (p, false),
            None => {
                let p = self.links.pop_front(CACHED)?;
                self.on_cached[p as usize] = false;
                (p, true)
            }
        };
        debug_assert_eq!(self.refcount[page as usize], 0);
        self.refcount[page as usize] = 1;
        self.ext_refs[page as usize] = u32::from(external);
        self.in_use += 1;
        Some((page, evicted))
    }

    /// Adds a reference to an in-use or cached page (a cached page leaves the LRU list).
    pub fn acquire(&mut self, page: u32, external: bool) {
        let i = page as usize;
        match self.refcount[i] {
            0 => {
                debug_assert!(self.on_cached[i], "acquire of free page {page}");
                self.links.remove(CACHED, page);
                self.on_cached[i] = false;
                self.in_use += 1;
            }
            1 => self.shared += 1,
            _ => {}
        }
        self.refcount[i] += 1;
        if external {
            self.ext_refs[i] += 1;
        }
    }

    /// Drops a reference. At zero the page joins the LRU tail if `registered`, else the free
    /// head. The caller has checked the count (and `ext_refs` when `external`).
    pub fn release(&mut self, page: u32, external: bool, registered: bool) {
        let i = page as usize;
        debug_assert!(self.refcount[i] > 0, "release of page {page} at refcount 0");
        if external {
            debug_assert!(self.ext_refs(page) > 0);
            self.ext_refs[i] -= 1;
        }
        self.refcount[i] -= 1;
        match self.refcount[i] {
            0 => {
                self.in_use -= 1;
                if registered {
                    self.links.push_back(CACHED, page);
                    self.on_cached[i] = true;
                } else {
                    self.links.push_front(FREE, page);
                }
            }
            1 => self.shared -= 1,
            _ => {}
        }
    }

    /// Removes one external reference mark without releasing the page (the caller releases it
    /// next with `external = false`). False, changing nothing, if there is none left.
    pub fn take_ext(&mut self, page: u32) -> bool {
        let e = &mut self.ext_refs[page as usize];
        if *e == 0 {
            return false;
        }
        *e -= 1;
        true
    }

    /// Undoes [`take_ext`](Self::take_ext).
    pub fn restore_ext(&mut self, page: u32) {
        self.ext_refs[page as usize] += 1;
    }

    /// Moves an unreferenced cached page to the free list (its index entry was dropped).
    pub fn uncache(&mut self, page: u32) {
        if self.refcount[page as usize] == 0 && self.on_cached[page as usize] {
            self.links.remove(CACHED, page);
            self.on_cached[page as usize] = false;
            self.links.push_front(FREE, page);
        }
    }

    /// Free-list and cached-list contents, head first; `None` if links are corrupt.
    pub fn lists(&self) -> Option<(Vec<u32>, Vec<u32>)> {
        Some((self.links.collect(FREE)?, self.links.collect(CACHED)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_prefers_free_then_lru() {
        let mut p = PagePool::new(Tier::Device, 4, true);
        assert_eq!(p.available(), 3);
        let a = p.take(false).unwrap();
        let b = p.take(false).unwrap();
        let c = p.take(false).unwrap();
        assert_eq!((a, b, c), ((1, false), (2, false), (3, false)));
        assert!(p.take(false).is_none());
        p.release(2, false, true);
        p.release(1, false, true);
        p.release(3, false, false);
        assert_eq!(p.state(3), PageState::Free);
        assert_eq!(p.state(2), PageState::Cached);
        assert_eq!(p.take(false), Some((3, false)));
        assert_eq!(p.take(false), Some((2, true)));
        assert_eq!(p.next_victim(), Some(1));
        p.acquire(1, true);
        assert_eq!(p.state(1), PageState::InUse);
        assert_eq!(p.ext_refs(1), 1);
        assert_eq!(p.available(), 0);
        assert_eq!(p.check_id(0), Err(Error::PaddingPage { page: 0 }));
        assert!(matches!(p.check_id(4), Err(Error::PageOutOfRange { .. })));
    }

    #[test]
    fn shared_counter() {
        let mut p = PagePool::new(Tier::Host, 2, false);
        let (a, _) = p.take(false).unwrap();
        p.acquire(a, false);
        p.acquire(a, false);
        assert_eq!(p.num_shared(), 1);
        p.release(a, false, false);
        p.release(a, false, false);
        assert_eq!(p.num_shared(), 0);
        p.release(a, false, false);
        assert_eq!(p.num_in_use(), 0);
        assert_eq!(p.num_free(), 2);
    }
}
