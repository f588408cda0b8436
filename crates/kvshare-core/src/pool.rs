//! One tier's page pool: flat per-page metadata, refcounts, the free list and the evictable set.
//!
//! * `FREE`: refcount 0, no content worth keeping. Allocation takes the head; pages freed
//!   without a prefix-index entry go back to the head (LIFO reuse, warm in caches).
//! * Cached: refcount 0 but registered in the prefix index, evictable. Which one an allocation
//!   takes when the free list is empty is [`evict`](super::evict)'s business: the lowest
//!   retention priority first, leaves before their parents, then the configured
//!   [`EvictionPolicy`]. A prefix hit takes a page out of the evictable set.
//!
//! Every operation here is O(1) per page but LFU's (O(log n)); finding a victim is O(priorities)
//! plus the candidates held back (amortized O(1), see `evict.rs`). The pool trusts its caller
//! (`State`) to have validated ids and states; it `debug_assert!`s them.

use super::alloc::try_vec;
use super::error::{Error, Result};
pub use super::evict::PRIORITIES;
use super::evict::{held_list, EvictionPolicy, Policies, Policy, POLICY_LISTS};
use super::list::Links;
use super::tier::Tier;

const FREE: usize = 0;
/// `loc` of a page in no evictable structure.
const NOT_CACHED: u8 = u8::MAX;
/// `loc` bit of a cached page held back (it has a registered child); the low bits are its class.
const HELD: u8 = 0x80;

/// Where a page stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// On the free list.
    Free,
    /// Unreferenced but registered in the prefix index (evictable).
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
    /// Where a cached page is: its class (retention priority), `HELD | class`, or `NOT_CACHED`.
    loc: Vec<u8>,
    /// Retention priority it will be cached with when released.
    prio: Vec<u8>,
    /// The free list, the held lists and the policy's lists.
    links: Links,
    policy: Policies,
    /// Parents are held back while they have a registered child (see `evict.rs`).
    leaves_first: bool,
    in_use: usize,
    shared: usize,
    pinned: usize,
    /// Sum of the refcounts: while it plus the references about to be taken stays within
    /// `u32::MAX`, no page's count can overflow (the cheap path of `check_acquire`).
    refs: u64,
}

impl PagePool {
    /// `num_pages` free pages; page 0 reserved as padding when `reserve_padding`; cached pages
    /// evicted in `policy`'s order, parents held back while they have a registered child when
    /// `leaves_first`. `OutOfMemory` naming `what` (the caller's config field for the page count:
    /// each cache has its own) when the metadata cannot be allocated.
    pub fn new(
        tier: Tier,
        num_pages: u32,
        reserve_padding: bool,
        what: &'static str,
        policy: EvictionPolicy,
        leaves_first: bool,
    ) -> Result<Self> {
        let n = num_pages as usize;
        // Everything first, so a refusal happens before the free list is threaded.
        let refcount = try_vec(n, 0, what)?;
        let ext_refs = try_vec(n, 0, what)?;
        let pins = try_vec(n, 0, what)?;
        let loc = try_vec(n, NOT_CACHED, what)?;
        let prio = try_vec(n, 0, what)?;
        let policy = Policies::new(policy, num_pages, what)?;
        let lists = POLICY_LISTS + policy.lists() * PRIORITIES as usize;
        let mut links = Links::new(num_pages, lists as u32, what)?;
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
            loc,
            prio,
            links,
            policy,
            leaves_first,
            in_use: 0,
            refs: 0,
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
        } else if self.loc[page as usize] != NOT_CACHED {
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

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy.kind()
    }

    /// Unreferenced cached (evictable) pages, all priorities.
    pub fn num_cached(&self) -> usize {
        let p = &self.policy;
        (0..PRIORITIES)
            .map(|k| p.len(&self.links, k) + self.links.len(held_list(k)))
            .sum()
    }

    /// Pages with refcount > 0.
    pub fn num_in_use(&self) -> usize {
        self.in_use
    }

    /// Sum of the pages' reference counts.
    pub fn num_refs(&self) -> u64 {
        self.refs
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

    /// The next victim: the lowest class with a cached page; in it, the policy's first candidate
    /// that `has_child` says is a leaf (parents it offers first are held back), else the oldest
    /// held parent.
    fn pop_victim(&mut self, has_child: &mut impl FnMut(u32) -> bool) -> Option<u32> {
        for k in 0..PRIORITIES {
            while let Some(p) = self.policy.pop(&mut self.links, k) {
                if self.leaves_first && has_child(p) {
                    self.links.push_back(held_list(k), p);
                    self.loc[p as usize] = HELD | k;
                    continue;
                }
                self.policy.evicted(p, k);
                return Some(p);
            }
            if let Some(p) = self.links.pop_front(held_list(k)) {
                self.policy.evicted(p, k);
                return Some(p);
            }
        }
        None
    }

    /// Takes a page at refcount 1: the free head, else the victim the eviction order picks
    /// (`has_child` answers whether a cached page's content has a registered child in this
    /// tier's index). Returns the page and whether it was evicted from the cache (the caller must
    /// then drop its index entry, or demote it).
    pub fn take(
        &mut self,
        holder: Holder,
        has_child: &mut impl FnMut(u32) -> bool,
    ) -> Option<(u32, bool)> {
        let (page, evicted) = match self.links.pop_front(FREE) {
            Some(p) => (p, false),
            None => {
                let p = self.pop_victim(has_child)?;
                self.loc[p as usize] = NOT_CACHED;
                (p, true)
            }
        };
        let i = page as usize;
        debug_assert_eq!(self.refcount[i], 0);
        self.prio[i] = 0;
        self.policy.reset(page);
        self.in_use += 1;
        self.refcount[i] = 1;
        self.refs += 1;
        self.add_holder(page, holder);
        Some((page, evicted))
    }

    /// Takes a cached page out of the evictable set (its class's policy order, or its held list).
    #[inline]
    fn leave_cached(&mut self, page: u32) {
        let l = self.loc[page as usize];
        debug_assert!(l != NOT_CACHED, "page {page} is not cached");
        if l & HELD != 0 {
            self.links.remove(held_list(l & !HELD), page);
        } else {
            self.policy.remove(&mut self.links, page, l);
        }
        self.loc[page as usize] = NOT_CACHED;
    }

    /// A held-back parent whose last registered child left the index: offered first again.
    /// Nothing happens to a page that is not held back.
    pub fn unhold(&mut self, page: u32) {
        let l = self.loc[page as usize];
        if l != NOT_CACHED && l & HELD != 0 {
            let k = l & !HELD;
            self.links.remove(held_list(k), page);
            self.policy.push_front(&mut self.links, page, k);
            self.loc[page as usize] = k;
        }
    }

    /// Tells the policy the index key of the content page `page` now holds (S3-FIFO remembers
    /// the keys of evicted contents).
    pub fn note_content(&mut self, page: u32, key: u128) {
        self.policy.content(page, key);
    }

    #[inline]
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
        if self.refs + n <= u64::from(u32::MAX) {
            return Ok(());
        }
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

    /// Adds a reference to an in-use or cached page (a cached page leaves the evictable set); the
    /// policy counts it as a use. The caller has made sure the count cannot overflow
    /// ([`check_acquire`](Self::check_acquire)).
    #[inline]
    pub fn acquire(&mut self, page: u32, holder: Holder) {
        let i = page as usize;
        self.policy.used(page);
        match self.refcount[i] {
            0 => {
                self.leave_cached(page);
                self.in_use += 1;
            }
            1 => self.shared += 1,
            _ => {}
        }
        self.refcount[i] += 1;
        self.refs += 1;
        self.add_holder(page, holder);
    }

    /// Drops a reference. At zero the page joins the evictable set of its priority if
    /// `registered`, else the free head. The caller has checked the count for `holder`.
    #[inline]
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
        self.refs -= 1;
        match self.refcount[i] {
            0 => {
                self.in_use -= 1;
                if registered {
                    let k = self.prio[i];
                    self.policy.insert(&mut self.links, page, k);
                    self.loc[i] = k;
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
        self.refs = self.refs - u64::from(self.refcount[i]) + u64::from(refs);
        self.refcount[i] = refs;
    }

    /// Undoes [`take_ext`](Self::take_ext).
    pub fn restore_ext(&mut self, page: u32) {
        self.ext_refs[page as usize] += 1;
    }

    /// Moves an unreferenced cached page to the free list's head (its index entry was dropped).
    pub fn uncache(&mut self, page: u32) {
        self.uncache_to(page, false);
    }

    /// Moves an unreferenced cached page to the free list, at its head or (`back`) its tail.
    pub fn uncache_to(&mut self, page: u32, back: bool) {
        let i = page as usize;
        if self.refcount[i] == 0 && self.loc[i] != NOT_CACHED {
            self.leave_cached(page);
            self.prio[i] = 0;
            if back {
                self.links.push_back(FREE, page);
            } else {
                self.links.push_front(FREE, page);
            }
        }
    }

    /// A use of an unreferenced cached page without a holder: the policy moves it as if it had
    /// been used and released again (LRU: to the most recent end).
    pub fn touch(&mut self, page: u32) {
        let l = self.loc[page as usize];
        if self.refcount[page as usize] == 0 && l != NOT_CACHED && l & HELD == 0 {
            self.policy.touch(&mut self.links, page, l);
        }
    }

    /// The free list and, per priority, its cached pages (the policy's order, then the held
    /// parents), head first; `None` if links are corrupt.
    pub fn lists(&self) -> Option<(Vec<u32>, Vec<Vec<u32>>)> {
        let free = self.links.collect(FREE)?;
        let p = &self.policy;
        let cached = (0..PRIORITIES)
            .map(|k| {
                let mut v = p.order(&self.links, k)?;
                v.extend(self.links.collect(held_list(k))?);
                Some(v)
            })
            .collect::<Option<Vec<_>>>()?;
        Some((free, cached))
    }

    /// Which priority's cached pages a page claims to be among (`None` if not cached), for the
    /// checker.
    pub fn cached_list(&self, page: u32) -> Option<u8> {
        let l = self.loc[page as usize];
        (l != NOT_CACHED).then_some(l & !HELD)
    }

    /// Whether a cached page is held back as a parent.
    pub fn is_held(&self, page: u32) -> bool {
        let l = self.loc[page as usize];
        l != NOT_CACHED && l & HELD != 0
    }

    /// Pages held back as parents.
    pub fn num_held(&self) -> usize {
        (0..PRIORITIES).map(|k| self.links.len(held_list(k))).sum()
    }

    /// The policy's own bookkeeping agrees with its structures, and every page in a class's
    /// order or held list says so (for the checker).
    pub fn check_policy(&self) -> std::result::Result<(), String> {
        let p = &self.policy;
        for k in 0..PRIORITIES {
            p.check(&self.links, k)?;
            let order = p
                .order(&self.links, k)
                .ok_or_else(|| format!("class {k}: the policy's links are corrupt"))?;
            if let Some(x) = order.iter().find(|&&x| self.loc[x as usize] != k) {
                return Err(format!(
                    "page {x} is in class {k}'s order but located {:#x}",
                    self.loc[*x as usize]
                ));
            }
            let held = self
                .links
                .collect(held_list(k))
                .ok_or_else(|| format!("class {k}: the held list is corrupt"))?;
            if let Some(x) = held.iter().find(|&&x| self.loc[x as usize] != HELD | k) {
                return Err(format!(
                    "page {x} is held in class {k} but located {:#x}",
                    self.loc[*x as usize]
                ));
            }
            if !self.leaves_first && !held.is_empty() {
                return Err(format!("class {k} holds parents back without leaves first"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(tier: Tier, n: u32, padding: bool, policy: EvictionPolicy) -> PagePool {
        PagePool::new(tier, n, padding, "test", policy, true).unwrap()
    }

    fn take(p: &mut PagePool) -> Option<(u32, bool)> {
        p.take(Holder::Seq, &mut |_| false)
    }

    #[test]
    fn take_prefers_free_then_lru() {
        let mut p = pool(Tier::Device, 4, true, EvictionPolicy::Lru);
        assert_eq!(p.available(), 3);
        let a = take(&mut p).unwrap();
        let b = take(&mut p).unwrap();
        let c = take(&mut p).unwrap();
        assert_eq!((a, b, c), ((1, false), (2, false), (3, false)));
        assert!(take(&mut p).is_none());
        p.release(2, Holder::Seq, true);
        p.release(1, Holder::Seq, true);
        p.release(3, Holder::Seq, false);
        assert_eq!(p.state(3), PageState::Free);
        assert_eq!(p.state(2), PageState::Cached);
        assert_eq!(take(&mut p), Some((3, false)));
        assert_eq!(take(&mut p), Some((2, true)));
        p.acquire(1, Holder::External);
        assert_eq!(p.state(1), PageState::InUse);
        assert_eq!(p.ext_refs(1), 1);
        assert_eq!(p.available(), 0);
        assert_eq!(p.check_id(0), Err(Error::PaddingPage { page: 0 }));
        assert!(matches!(p.check_id(4), Err(Error::PageOutOfRange { .. })));
        p.check_policy().unwrap();
    }

    #[test]
    fn lower_priority_is_evicted_first_under_every_policy() {
        for policy in EvictionPolicy::ALL {
            let mut p = pool(Tier::Device, 3, false, policy);
            for _ in 0..3 {
                take(&mut p).unwrap();
            }
            p.raise_priority(0, 2);
            p.raise_priority(1, 9); // clamped to the top priority
            assert_eq!(p.priority(1), PRIORITIES - 1);
            // Page 1 is used more than the others: no policy may prefer that over priority.
            p.acquire(1, Holder::Seq);
            p.release(1, Holder::Seq, true);
            for page in 0..3 {
                p.release(page, Holder::Seq, true);
            }
            assert_eq!(take(&mut p), Some((2, true)), "{policy:?}");
            assert_eq!(take(&mut p), Some((0, true)), "{policy:?}");
            assert_eq!(take(&mut p), Some((1, true)), "{policy:?}");
        }
    }

    #[test]
    fn parents_are_held_back_until_their_last_child_leaves() {
        for policy in EvictionPolicy::ALL {
            let mut p = pool(Tier::Device, 4, false, policy);
            for _ in 0..4 {
                take(&mut p).unwrap();
            }
            // Release order puts the parents (0, 1) first in every policy's order.
            for page in 0..4 {
                p.release(page, Holder::Seq, true);
            }
            // 0 is the parent of 2 and 3; 1 of nothing but is held as long as `kids` says.
            let mut kids: [u32; 4] = [2, 0, 0, 0];
            let v = p.take(Holder::Seq, &mut |x| kids[x as usize] > 0).unwrap();
            assert_eq!(v, (1, true), "{policy:?}: the first leaf");
            assert!(p.is_held(0));
            assert_eq!(p.num_cached(), 3);
            p.check_policy().unwrap();
            // Child 2 leaves: 0 still has 3.
            let v = p.take(Holder::Seq, &mut |x| kids[x as usize] > 0).unwrap();
            assert_eq!(v, (2, true), "{policy:?}");
            kids[0] = 1;
            let v = p.take(Holder::Seq, &mut |x| kids[x as usize] > 0).unwrap();
            assert_eq!(v, (3, true), "{policy:?}");
            kids[0] = 0;
            p.unhold(0);
            assert!(!p.is_held(0));
            p.check_policy().unwrap();
            let v = p.take(Holder::Seq, &mut |x| kids[x as usize] > 0);
            assert_eq!(v, Some((0, true)), "{policy:?}");
        }
    }

    #[test]
    fn without_leaves_a_held_parent_goes() {
        let mut p = pool(Tier::Device, 2, false, EvictionPolicy::Lru);
        take(&mut p).unwrap();
        take(&mut p).unwrap();
        p.release(0, Holder::Seq, true);
        // Page 0's child (page 1) is held by a sequence: 0 is still the only candidate.
        assert_eq!(p.take(Holder::Seq, &mut |x| x == 0), Some((0, true)));
        assert_eq!(p.num_held(), 0);
        // Without leaves first, nothing is held back.
        let mut q =
            PagePool::new(Tier::Device, 2, false, "test", EvictionPolicy::Lru, false).unwrap();
        take(&mut q).unwrap();
        take(&mut q).unwrap();
        q.release(0, Holder::Seq, true);
        q.release(1, Holder::Seq, true);
        assert_eq!(q.take(Holder::Seq, &mut |_| true), Some((0, true)));
        q.check_policy().unwrap();
    }

    #[test]
    fn shared_and_pinned_counters() {
        let mut p = pool(Tier::Host, 2, false, EvictionPolicy::Lru);
        let (a, _) = take(&mut p).unwrap();
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
