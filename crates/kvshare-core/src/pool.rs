//! One tier's page pool: flat per-page metadata, refcounts, and intrusive lists.
//!
//! * `FREE`: refcount 0, no content worth keeping. Allocation takes the head; pages freed
//!   without a prefix-index entry go back to the head (LIFO reuse, warm in caches).
//! * `CACHED[k]`, one list per retention priority `k` (0 = evicted first): refcount 0 but
//!   registered in the prefix index, each in LRU order. Eviction takes the head of the lowest
//!   non-empty priority; released pages join the tail of their priority's list; a prefix hit
//!   removes a page from the middle.
//!
//! Every operation here is O(1) per page (O(priorities) to find a victim). The pool trusts its
//! caller (`State`) to have validated ids and states; it `debug_assert!`s them.

use super::alloc::try_vec;
use super::error::{Error, Result};
use super::list::Links;
use super::tier::Tier;

const FREE: usize = 0;
const NOT_CACHED: u8 = u8::MAX;

/// Number of retention priorities (0 ..= `PRIORITIES - 1`; higher is kept longer).
pub const PRIORITIES: u8 = 4;

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

/// Who holds a reference; the checker recounts each kind separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A sequence's block table (or the cache itself, transiently, during one call).
    Seq,
    /// The caller, through the page API.
    External,
    /// A pinned prefix.
    Pin,
}

/// Pages of one tier.
#[derive(Debug, Clone)]
pub struct PagePool {
    tier: Tier,
    num_pages: u32,
    padding: Option<u32>,
    refcount: Vec<u32>,
    ext_refs: Vec<u32>,
    pins: Vec<u32>,
    /// Priority list the page is on, or `NOT_CACHED`.
    cached_on: Vec<u8>,
    /// Retention priority it will be cached with when released.
    prio: Vec<u8>,
    links: Links,
    in_use: usize,
    shared: usize,
    pinned: usize,
}

impl PagePool {
    /// `num_pages` free pages; page 0 reserved as padding when `reserve_padding`.
    /// `OutOfMemory` naming `what` (the caller's config field for the page count: each cache
    /// has its own) when the metadata cannot be allocated.
    pub fn new(
        tier: Tier,
        num_pages: u32,
        reserve_padding: bool,
        what: &'static str,
    ) -> Result<Self> {
        let n = num_pages as usize;
        // Everything first, so a refusal happens before the free list is threaded.
        let refcount = try_vec(n, 0, what)?;
        let ext_refs = try_vec(n, 0, what)?;
        let pins = try_vec(n, 0, what)?;
        let cached_on = try_vec(n, NOT_CACHED, what)?;
        let prio = try_vec(n, 0, what)?;
        let mut links = Links::new(num_pages, 1 + PRIORITIES as u32, what)?;
        let padding = reserve_padding.then_some(0);
        for p in 0..num_pages {
            if Some(p) != padding {
                links.push_back(FREE, p);
            }
        }
        Ok(PagePool {
            tier,
            num_pages,
            padding,
            refcount,
            ext_refs,
            pins,
            cached_on,
            prio,
            links,
            in_use: 0,
            shared: 0,
            pinned: 0,
        })
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
        } else if self.cached_on[page as usize] != NOT_CACHED {
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

    /// References held by pinned prefixes.
    pub fn pins(&self, page: u32) -> u32 {
        self.pins[page as usize]
    }

    /// Retention priority the page is (or will be) cached with.
    pub fn priority(&self, page: u32) -> u8 {
        self.prio[page as usize]
    }

    /// Raises the page's retention priority to at least `prio` (clamped).
    pub fn raise_priority(&mut self, page: u32, prio: u8) {
        let p = &mut self.prio[page as usize];
        *p = (*p).max(prio.min(PRIORITIES - 1));
    }

    /// Pages on the free list.
    pub fn num_free(&self) -> usize {
        self.links.len(FREE)
    }

    /// Unreferenced cached (evictable) pages, all priorities.
    pub fn num_cached(&self) -> usize {
        (0..PRIORITIES)
            .map(|k| self.links.len(1 + k as usize))
            .sum()
    }

    /// Pages with refcount > 0.
    pub fn num_in_use(&self) -> usize {
        self.in_use
    }

    /// Pages with refcount > 1.
    pub fn num_shared(&self) -> usize {
        self.shared
    }

    /// Pages with at least one pin.
    pub fn num_pinned(&self) -> usize {
        self.pinned
    }

    /// Pages an allocation can take: free plus evictable.
    pub fn available(&self) -> usize {
        self.num_free() + self.num_cached()
    }

    fn pop_victim(&mut self) -> Option<u32> {
        (0..PRIORITIES).find_map(|k| self.links.pop_front(1 + k as usize))
    }

    /// Takes a page at refcount 1: the free head, else the LRU cached page of the lowest
    /// priority. Returns the page and whether it was evicted from the cache (the caller must then
    /// drop its index entry, or demote it).
    pub fn take(&mut self, holder: Holder) -> Option<(u32, bool)> {
        let (page, evicted) = match self.links.pop_front(FREE) {
            Some(p) => (p, false),
            None => {
                let p = self.pop_victim()?;
                self.cached_on[p as usize] = NOT_CACHED;
                (p, true)
            }
        };
        let i = page as usize;
        debug_assert_eq!(self.refcount[i], 0);
        self.prio[i] = 0;
        self.in_use += 1;
        self.refcount[i] = 1;
        self.add_holder(page, holder);
        Some((page, evicted))
    }

    fn add_holder(&mut self, page: u32, holder: Holder) {
        let i = page as usize;
        match holder {
            Holder::Seq => {}
            Holder::External => self.ext_refs[i] += 1,
            Holder::Pin => {
                if self.pins[i] == 0 {
                    self.pinned += 1;
                }
                self.pins[i] += 1;
            }
        }
    }

    /// Refuses, with `RefcountOverflow`, a batch of acquires that would take some page's 32-bit
    /// reference count past `u32::MAX`: `pages` lists each page once per reference to add (so a
    /// page listed twice gains two). Ids must be valid. Sorting is needed only when a page is
    /// within `pages.len()` of the limit, which no real workload reaches.
    pub fn check_acquire<I>(&self, pages: I) -> Result<()>
    where
        I: IntoIterator<Item = u32>,
        I::IntoIter: Clone,
    {
        let pages = pages.into_iter();
        let n = pages.clone().count() as u64;
        let near = |p: u32| u64::from(self.refcount[p as usize]) + n > u64::from(u32::MAX);
        if !pages.clone().any(near) {
            return Ok(());
        }
        let mut sorted: Vec<u32> = pages.collect();
        sorted.sort_unstable();
        for run in sorted.chunk_by(|a, b| a == b) {
            let (page, adding) = (run[0], run.len() as u64);
            let refcount = self.refcount[page as usize];
            if u64::from(refcount) + adding > u64::from(u32::MAX) {
                return Err(Error::RefcountOverflow {
                    page,
                    refcount,
                    adding,
                });
            }
        }
        Ok(())
    }

    /// Adds a reference to an in-use or cached page (a cached page leaves its LRU list). The
    /// caller has made sure the count cannot overflow ([`check_acquire`](Self::check_acquire)).
    pub fn acquire(&mut self, page: u32, holder: Holder) {
        let i = page as usize;
        match self.refcount[i] {
            0 => {
                let k = self.cached_on[i];
                debug_assert!(k != NOT_CACHED, "acquire of free page {page}");
                self.links.remove(1 + k as usize, page);
                self.cached_on[i] = NOT_CACHED;
                self.in_use += 1;
            }
            1 => self.shared += 1,
            _ => {}
        }
        self.refcount[i] += 1;
        self.add_holder(page, holder);
    }

    /// Drops a reference. At zero the page joins the tail of its priority's LRU list if
    /// `registered`, else the free head. The caller has checked the count for `holder`.
    pub fn release(&mut self, page: u32, holder: Holder, registered: bool) {
        let i = page as usize;
        debug_assert!(self.refcount[i] > 0, "release of page {page} at refcount 0");
        match holder {
            Holder::Seq => {}
            Holder::External => {
                debug_assert!(self.ext_refs[i] > 0);
                self.ext_refs[i] -= 1;
            }
            Holder::Pin => {
                debug_assert!(self.pins[i] > 0);
                self.pins[i] -= 1;
                if self.pins[i] == 0 {
                    self.pinned -= 1;
                }
            }
        }
        self.refcount[i] -= 1;
        match self.refcount[i] {
            0 => {
                self.in_use -= 1;
                if registered {
                    let k = self.prio[i];
                    self.links.push_back(1 + k as usize, page);
                    self.cached_on[i] = k;
                } else {
                    self.prio[i] = 0;
                    self.links.push_front(FREE, page);
                }
            }
            1 => self.shared -= 1,
            _ => {}
        }
    }

    /// Removes one external reference mark without releasing the page (the caller releases it
    /// next as `Holder::Seq`). False, changing nothing, if there is none left.
    pub fn take_ext(&mut self, page: u32) -> bool {
        let e = &mut self.ext_refs[page as usize];
        if *e == 0 {
            return false;
        }
        *e -= 1;
        true
    }

    /// Sets a page's counts as if `refs` external holders held it (tests of the overflow checks,
    /// which would otherwise need 2^32 calls).
    #[cfg(test)]
    pub(crate) fn force_external_refs(&mut self, page: u32, refs: u32) {
        let i = page as usize;
        assert!(
            self.refcount[i] > 0 && refs > 1,
            "test helper: page must be in use"
        );
        if self.refcount[i] == 1 {
            self.shared += 1;
        }
        self.ext_refs[i] = refs - (self.refcount[i] - self.ext_refs[i]);
        self.refcount[i] = refs;
    }

    /// Undoes [`take_ext`](Self::take_ext).
    pub fn restore_ext(&mut self, page: u32) {
        self.ext_refs[page as usize] += 1;
    }

    /// Moves an unreferenced cached page to the free list (its index entry was dropped).
    pub fn uncache(&mut self, page: u32) {
        let i = page as usize;
        let k = self.cached_on[i];
        if self.refcount[i] == 0 && k != NOT_CACHED {
            self.links.remove(1 + k as usize, page);
            self.cached_on[i] = NOT_CACHED;
            self.prio[i] = 0;
            self.links.push_front(FREE, page);
        }
    }

    /// Moves an unreferenced cached page to the MRU end of its list (a touch without a holder).
    pub fn touch(&mut self, page: u32) {
        let k = self.cached_on[page as usize];
        if self.refcount[page as usize] == 0 && k != NOT_CACHED {
            self.links.remove(1 + k as usize, page);
            self.links.push_back(1 + k as usize, page);
        }
    }

    /// The free list and each priority's cached list, head first; `None` if links are corrupt.
    pub fn lists(&self) -> Option<(Vec<u32>, Vec<Vec<u32>>)> {
        let free = self.links.collect(FREE)?;
        let cached = (0..PRIORITIES)
            .map(|k| self.links.collect(1 + k as usize))
            .collect::<Option<Vec<_>>>()?;
        Some((free, cached))
    }

    /// Which cached list a page claims to be on (`None` if not cached), for the checker.
    pub fn cached_list(&self, page: u32) -> Option<u8> {
        let k = self.cached_on[page as usize];
        (k != NOT_CACHED).then_some(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_prefers_free_then_lru() {
        let mut p = PagePool::new(Tier::Device, 4, true, "test").unwrap();
        assert_eq!(p.available(), 3);
        let a = p.take(Holder::Seq).unwrap();
        let b = p.take(Holder::Seq).unwrap();
        let c = p.take(Holder::Seq).unwrap();
        assert_eq!((a, b, c), ((1, false), (2, false), (3, false)));
        assert!(p.take(Holder::Seq).is_none());
        p.release(2, Holder::Seq, true);
        p.release(1, Holder::Seq, true);
        p.release(3, Holder::Seq, false);
        assert_eq!(p.state(3), PageState::Free);
        assert_eq!(p.state(2), PageState::Cached);
        assert_eq!(p.take(Holder::Seq), Some((3, false)));
        assert_eq!(p.take(Holder::Seq), Some((2, true)));
        p.acquire(1, Holder::External);
        assert_eq!(p.state(1), PageState::InUse);
        assert_eq!(p.ext_refs(1), 1);
        assert_eq!(p.available(), 0);
        assert_eq!(p.check_id(0), Err(Error::PaddingPage { page: 0 }));
        assert!(matches!(p.check_id(4), Err(Error::PageOutOfRange { .. })));
    }

    #[test]
    fn lower_priority_is_evicted_first() {
        let mut p = PagePool::new(Tier::Device, 3, false, "test").unwrap();
        for _ in 0..3 {
            p.take(Holder::Seq).unwrap();
        }
        p.raise_priority(0, 2);
        p.raise_priority(1, 9); // clamped to the top priority
        assert_eq!(p.priority(1), PRIORITIES - 1);
        for page in 0..3 {
            p.release(page, Holder::Seq, true);
        }
        assert_eq!(p.take(Holder::Seq), Some((2, true)));
        assert_eq!(p.take(Holder::Seq), Some((0, true)));
        assert_eq!(p.take(Holder::Seq), Some((1, true)));
    }

    #[test]
    fn shared_and_pinned_counters() {
        let mut p = PagePool::new(Tier::Host, 2, false, "test").unwrap();
        let (a, _) = p.take(Holder::Seq).unwrap();
        p.acquire(a, Holder::Pin);
        p.acquire(a, Holder::Pin);
        assert_eq!((p.num_shared(), p.num_pinned(), p.pins(a)), (1, 1, 2));
        p.release(a, Holder::Pin, false);
        p.release(a, Holder::Pin, false);
        assert_eq!((p.num_shared(), p.num_pinned()), (0, 0));
        p.release(a, Holder::Seq, false);
        assert_eq!(p.num_in_use(), 0);
        assert_eq!(p.num_free(), 2);
    }
}
