//! Which cached page an allocation evicts: the eviction policies, behind one interface.
//!
//! A tier's unreferenced cached pages (refcount 0, registered in the prefix index) form its
//! evictable set. Three rules order it, strongest first:
//!
//! 1. **Retention priority** ([`PRIORITIES`] classes, 0 evicted first): a page of class `k` is
//!    evicted only when no page of a lower class is cached. Every policy keeps this order; the
//!    policy orders the pages *within* a class. ("Priority-aware LRU" is therefore not a policy of
//!    its own: it is [`EvictionPolicy::Lru`], and every other policy is priority-aware the same
//!    way.)
//! 2. **Leaves first** (full-attention pages only, off in vLLM's free order): a page whose
//!    content has a registered child in the same tier's index (the next page of some cached or
//!    held prefix) is evicted only when no leaf of its class is left. A full-attention hit walks
//!    pages from the first one, so evicting a parent before its child leaves the child cached
//!    but unreachable. The pool asks, for each candidate the policy offers, whether it has a
//!    child; a parent is *held back* (moved to its class's held list) and offered again — at the
//!    front of its policy's order — as soon as its last child leaves the index. When a class has
//!    no leaf at all (every cached parent has a descendant some sequence holds, which happens
//!    with duplicates, sliding windows or pins), the held parents go, oldest held first.
//! 3. **The policy** ([`EvictionPolicy`]): LRU, LFU with dynamic aging, or S3-FIFO.
//!
//! Costs per page operation: LRU O(1); S3-FIFO amortized O(1) (a page re-queued by the main
//! queue's second chance spends one of at most three uses each time; the ghost set is a hash map
//! and a FIFO); LFU O(log n) (a B-tree of `(value, stamp, page)` per class). Holding a parent back
//! is one index probe per candidate, and each cached page is held back at most once per stay in
//! the cache, so eviction stays amortized O(1) (LFU: O(log n)) per page.
//!
//! All policies share one [`Links`] with the pool's free list: an item sits in at most one list.
//! List ids: 0 the free list, `1 + k` the held parents of class `k`, then the policy's own lists
//! (`Policy::lists` per class).
//!
//! ## The policies
//!
//! * **LRU**: one list per class in release order (a page joins the tail when its last holder
//!   lets it go; a hit takes it off the list while it is held). Sequences release their last page
//!   first, so a chain's deepest page is older than its head. The default.
//! * **LFU with dynamic aging** (LFU-DA): a page's value is `L + uses`, where `uses` counts the
//!   references taken on its content since it was computed (prefix hits, forks, pins, page-API
//!   acquires) plus one, and `L` is the value of the class's last evicted page when it joined the
//!   cached set; the lowest value goes first, older first on ties. `L` only grows, so pages used
//!   often long ago age out against pages used a little recently. A prefix's first page is used at
//!   least as often as its later pages, so LFU orders chains leaves first by itself.
//! * **S3-FIFO** (Yang et al., SOSP'23): a small FIFO queue for pages used once and a main queue
//!   for pages used again, per class. A page joins the main queue when it is released after a hit
//!   (or touched while cached) or when its content was evicted from the small queue recently (a
//!   *ghost*: the tier remembers the index keys of that many pages as it has); otherwise the small
//!   queue. The small queue is evicted from while it holds at least a tenth of the class's pages
//!   (or the main queue is empty); the main queue gives a page with uses left a second chance
//!   (one use spent, back to its tail). One-hit pages (a prompt nobody repeats) thus leave before
//!   a conversation's history that was hit before.
//!
//! ARC was not chosen: its target size adapts against a cache of fixed size, but here the
//! evictable set grows and shrinks with the pages sequences hold at every step; S3-FIFO's queues
//! need no such target.

use std::collections::{BTreeSet, VecDeque};

use super::alloc::try_vec;
use super::error::Result;
use super::hashing::DigestMap;
use super::list::Links;

/// Number of retention priorities (0 ..= `PRIORITIES - 1`; higher is kept longer).
pub const PRIORITIES: u8 = 4;

/// The order in which a tier's unreferenced cached pages of one retention priority are evicted
/// (`Config::eviction_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EvictionPolicy {
    /// Least recently released first (the default; the only order `vllm_free_order` allows).
    #[default]
    Lru,
    /// Least frequently used first, with dynamic aging (LFU-DA).
    Lfu,
    /// S3-FIFO: a small FIFO for pages used once, a main FIFO with second chances, ghosts.
    S3Fifo,
}

impl EvictionPolicy {
    /// Every policy, in a fixed order (tests, sweeps).
    pub const ALL: [EvictionPolicy; 3] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::S3Fifo,
    ];

    /// Lower-case name: `lru`, `lfu`, `s3fifo`.
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::S3Fifo => "s3fifo",
        }
    }

    /// The policy called `name` (as [`name`](Self::name) writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The first list id a policy may use (after the free list and the held lists).
pub(crate) const POLICY_LISTS: usize = 1 + PRIORITIES as usize;

/// The held list of class `k`.
pub(crate) fn held_list(k: u8) -> usize {
    1 + k as usize
}

/// What one policy does with the pages of a tier. `class` is a retention priority; every page
/// id is valid; the pool calls each method only in the state it names (a page is inserted only
/// when it is in no list, removed only when the policy holds it).
pub(crate) trait Policy {
    /// Lists the policy threads through the shared [`Links`], per class.
    fn lists(&self) -> usize;
    /// The page starts holding new content (taken from the free list or evicted).
    fn reset(&mut self, page: u32);
    /// Someone takes a reference on the page's content (a hit, a fork, a pin, an acquire).
    fn used(&mut self, page: u32);
    /// The page's content has index key `key` (S3-FIFO's ghosts).
    fn content(&mut self, page: u32, key: u128);
    /// The page joins the evictable set of `class`.
    fn insert(&mut self, links: &mut Links, page: u32, class: u8);
    /// The page leaves the evictable set (a hit, or its content dropped).
    fn remove(&mut self, links: &mut Links, page: u32, class: u8);
    /// Takes the next candidate of `class` out of the order.
    fn pop(&mut self, links: &mut Links, class: u8) -> Option<u32>;
    /// Puts back a candidate [`pop`](Self::pop) returned and the pool held back, to be offered
    /// next.
    fn push_front(&mut self, links: &mut Links, page: u32, class: u8);
    /// The candidate was evicted (its content leaves the tier).
    fn evicted(&mut self, page: u32, class: u8);
    /// A use without a holder while cached: the page moves as if used and released again.
    fn touch(&mut self, links: &mut Links, page: u32, class: u8);
    /// Pages of `class` it holds.
    fn len(&self, links: &Links, class: u8) -> usize;
    /// Pages of `class` in eviction order (the first goes first, second chances aside); `None`
    /// if its structures are corrupt (for the invariant checker).
    fn order(&self, links: &Links, class: u8) -> Option<Vec<u32>>;
    /// Its own bookkeeping agrees with its structures (for the invariant checker).
    fn check(&self, links: &Links, class: u8) -> std::result::Result<(), String>;
}

/// LRU: one list per class, least recently released at the head.
#[derive(Debug, Clone)]
pub(crate) struct Lru;

impl Lru {
    fn list(class: u8) -> usize {
        POLICY_LISTS + class as usize
    }
}

impl Policy for Lru {
    fn lists(&self) -> usize {
        1
    }
    #[inline]
    fn reset(&mut self, _: u32) {}
    #[inline]
    fn used(&mut self, _: u32) {}
    fn content(&mut self, _: u32, _: u128) {}
    #[inline]
    fn insert(&mut self, links: &mut Links, page: u32, class: u8) {
        links.push_back(Self::list(class), page);
    }
    #[inline]
    fn remove(&mut self, links: &mut Links, page: u32, class: u8) {
        links.remove(Self::list(class), page);
    }
    #[inline]
    fn pop(&mut self, links: &mut Links, class: u8) -> Option<u32> {
        links.pop_front(Self::list(class))
    }
    #[inline]
    fn push_front(&mut self, links: &mut Links, page: u32, class: u8) {
        links.push_front(Self::list(class), page);
    }
    fn evicted(&mut self, _: u32, _: u8) {}
    #[inline]
    fn touch(&mut self, links: &mut Links, page: u32, class: u8) {
        links.remove(Self::list(class), page);
        links.push_back(Self::list(class), page);
    }
    fn len(&self, links: &Links, class: u8) -> usize {
        links.len(Self::list(class))
    }
    fn order(&self, links: &Links, class: u8) -> Option<Vec<u32>> {
        links.collect(Self::list(class))
    }
    fn check(&self, _: &Links, _: u8) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// LFU with dynamic aging: per class a B-tree of `(value, stamp, page)`.
#[derive(Debug, Clone)]
pub(crate) struct Lfu {
    /// References taken on each page's content since it was computed, plus one.
    uses: Vec<u32>,
    /// Each cached page's key in its class's tree.
    key: Vec<(u64, u64)>,
    trees: Vec<BTreeSet<(u64, u64, u32)>>,
    /// `L` per class: the value of the last evicted page.
    age: Vec<u64>,
    stamp: u64,
}

impl Lfu {
    fn new(n: u32, what: &'static str) -> Result<Self> {
        Ok(Lfu {
            uses: try_vec(n as usize, 1, what)?,
            key: try_vec(n as usize, (0, 0), what)?,
            trees: vec![BTreeSet::new(); PRIORITIES as usize],
            age: vec![0; PRIORITIES as usize],
            stamp: 0,
        })
    }

    fn enter(&mut self, page: u32, class: u8) {
        let i = page as usize;
        self.stamp += 1;
        let value = self.age[class as usize] + u64::from(self.uses[i]);
        self.key[i] = (value, self.stamp);
        self.trees[class as usize].insert((value, self.stamp, page));
    }

    fn leave(&mut self, page: u32, class: u8) {
        let (v, s) = self.key[page as usize];
        let removed = self.trees[class as usize].remove(&(v, s, page));
        debug_assert!(removed, "page {page} not in LFU class {class}");
    }
}

impl Policy for Lfu {
    fn lists(&self) -> usize {
        0
    }
    fn reset(&mut self, page: u32) {
        self.uses[page as usize] = 1;
    }
    fn used(&mut self, page: u32) {
        let u = &mut self.uses[page as usize];
        *u = u.saturating_add(1);
    }
    fn content(&mut self, _: u32, _: u128) {}
    fn insert(&mut self, _: &mut Links, page: u32, class: u8) {
        self.enter(page, class);
    }
    fn remove(&mut self, _: &mut Links, page: u32, class: u8) {
        self.leave(page, class);
    }
    fn pop(&mut self, _: &mut Links, class: u8) -> Option<u32> {
        self.trees[class as usize].pop_first().map(|(_, _, p)| p)
    }
    fn push_front(&mut self, _: &mut Links, page: u32, class: u8) {
        // Its key is unchanged, so it sorts where it was (first, unless lower values arrived).
        let (v, s) = self.key[page as usize];
        self.trees[class as usize].insert((v, s, page));
    }
    fn evicted(&mut self, page: u32, class: u8) {
        let a = &mut self.age[class as usize];
        *a = (*a).max(self.key[page as usize].0);
    }
    fn touch(&mut self, _: &mut Links, page: u32, class: u8) {
        self.leave(page, class);
        self.used(page);
        self.enter(page, class);
    }
    fn len(&self, _: &Links, class: u8) -> usize {
        self.trees[class as usize].len()
    }
    fn order(&self, _: &Links, class: u8) -> Option<Vec<u32>> {
        Some(self.trees[class as usize].iter().map(|t| t.2).collect())
    }
    fn check(&self, _: &Links, class: u8) -> std::result::Result<(), String> {
        for &(v, s, p) in &self.trees[class as usize] {
            if self.key.get(p as usize) != Some(&(v, s)) {
                return Err(format!(
                    "LFU class {class}: page {p} sorted under ({v}, {s}) but keyed {:?}",
                    self.key.get(p as usize)
                ));
            }
        }
        Ok(())
    }
}

/// The most uses S3-FIFO counts (two bits, as in the paper).
const S3_MAX_FREQ: u8 = 3;
/// Which S3-FIFO queue a page is (or was last) in.
const SMALL: u8 = 0;
const MAIN: u8 = 1;

/// S3-FIFO: per class a small and a main queue; ghosts per tier.
#[derive(Debug, Clone)]
pub(crate) struct S3Fifo {
    /// Uses since it last joined the cached set (capped).
    freq: Vec<u8>,
    /// Which queue it is in (or was taken from, while held back).
    queue: Vec<u8>,
    /// Joins the main queue when released: used again, or its content was a ghost.
    main_next: Vec<bool>,
    /// Index key of its content (0: none known).
    key: Vec<u128>,
    /// Keys of contents evicted from a small queue -> the stamp they were remembered with.
    ghosts: DigestMap<u64>,
    /// Ghost keys oldest first, with their stamps (an entry whose stamp no longer matches the
    /// map was forgotten or re-remembered since).
    ghost_fifo: VecDeque<(u128, u64)>,
    ghost_stamp: u64,
    /// Most ghosts remembered: the tier's page count.
    ghost_cap: usize,
}

impl S3Fifo {
    fn new(n: u32, what: &'static str) -> Result<Self> {
        Ok(S3Fifo {
            freq: try_vec(n as usize, 0, what)?,
            queue: try_vec(n as usize, SMALL, what)?,
            main_next: try_vec(n as usize, false, what)?,
            key: try_vec(n as usize, 0, what)?,
            ghosts: DigestMap::default(),
            ghost_fifo: VecDeque::new(),
            ghost_stamp: 0,
            ghost_cap: n as usize,
        })
    }

    fn list(class: u8, queue: u8) -> usize {
        POLICY_LISTS + 2 * class as usize + queue as usize
    }

    fn remember(&mut self, key: u128) {
        if self.ghost_cap == 0 {
            return;
        }
        self.ghost_stamp += 1;
        self.ghosts.insert(key, self.ghost_stamp);
        self.ghost_fifo.push_back((key, self.ghost_stamp));
        while self.ghosts.len() > self.ghost_cap || self.ghost_fifo.len() > 2 * self.ghost_cap {
            let Some((k, s)) = self.ghost_fifo.pop_front() else {
                break;
            };
            if self.ghosts.get(&k) == Some(&s) {
                self.ghosts.remove(&k);
            }
        }
    }

    /// Ghosts remembered now (tests).
    #[cfg(test)]
    fn num_ghosts(&self) -> usize {
        self.ghosts.len()
    }
}

impl Policy for S3Fifo {
    fn lists(&self) -> usize {
        2
    }
    fn reset(&mut self, page: u32) {
        let i = page as usize;
        self.freq[i] = 0;
        self.main_next[i] = false;
        self.key[i] = 0;
    }
    fn used(&mut self, page: u32) {
        let i = page as usize;
        self.freq[i] = (self.freq[i] + 1).min(S3_MAX_FREQ);
        self.main_next[i] = true;
    }
    fn content(&mut self, page: u32, key: u128) {
        let i = page as usize;
        self.key[i] = key;
        if self.ghosts.remove(&key).is_some() {
            self.main_next[i] = true;
        }
    }
    fn insert(&mut self, links: &mut Links, page: u32, class: u8) {
        let i = page as usize;
        let q = if self.main_next[i] { MAIN } else { SMALL };
        self.queue[i] = q;
        links.push_back(Self::list(class, q), page);
    }
    fn remove(&mut self, links: &mut Links, page: u32, class: u8) {
        links.remove(Self::list(class, self.queue[page as usize]), page);
    }
    fn pop(&mut self, links: &mut Links, class: u8) -> Option<u32> {
        let (s, m) = (Self::list(class, SMALL), Self::list(class, MAIN));
        loop {
            let small = links.len(s);
            let main = links.len(m);
            if small > 0 && (small * 10 >= small + main || main == 0) {
                let p = links.pop_front(s).expect("non-empty");
                let i = p as usize;
                if self.freq[i] > 0 {
                    // Touched while in the small queue: promoted.
                    self.freq[i] = 0;
                    self.queue[i] = MAIN;
                    links.push_back(m, p);
                    continue;
                }
                return Some(p);
            }
            let p = links.pop_front(m)?;
            let i = p as usize;
            if self.freq[i] > 0 {
                self.freq[i] -= 1;
                links.push_back(m, p);
                continue;
            }
            return Some(p);
        }
    }
    fn push_front(&mut self, links: &mut Links, page: u32, class: u8) {
        links.push_front(Self::list(class, self.queue[page as usize]), page);
    }
    fn evicted(&mut self, page: u32, _: u8) {
        let i = page as usize;
        if self.queue[i] == SMALL && self.key[i] != 0 {
            self.remember(self.key[i]);
        }
    }
    fn touch(&mut self, _: &mut Links, page: u32, _: u8) {
        self.used(page);
    }
    fn len(&self, links: &Links, class: u8) -> usize {
        links.len(Self::list(class, SMALL)) + links.len(Self::list(class, MAIN))
    }
    fn order(&self, links: &Links, class: u8) -> Option<Vec<u32>> {
        let mut v = links.collect(Self::list(class, SMALL))?;
        v.extend(links.collect(Self::list(class, MAIN))?);
        Some(v)
    }
    fn check(&self, links: &Links, class: u8) -> std::result::Result<(), String> {
        for q in [SMALL, MAIN] {
            let pages = links
                .collect(Self::list(class, q))
                .ok_or_else(|| format!("S3-FIFO class {class}: queue {q} links are corrupt"))?;
            if let Some(p) = pages.iter().find(|&&p| self.queue[p as usize] != q) {
                return Err(format!(
                    "S3-FIFO class {class}: page {p} is in queue {q} but marked {}",
                    self.queue[*p as usize]
                ));
            }
        }
        if self.ghosts.len() > self.ghost_cap {
            return Err(format!(
                "S3-FIFO: {} ghosts remembered, more than {}",
                self.ghosts.len(),
                self.ghost_cap
            ));
        }
        Ok(())
    }
}

/// The policy of one tier, dispatched by `match` (no allocation, no indirect call).
#[derive(Debug, Clone)]
pub(crate) enum Policies {
    Lru(Lru),
    Lfu(Lfu),
    S3Fifo(S3Fifo),
}

impl Policies {
    /// The state of `policy` for `n` pages; `OutOfMemory` naming `what` if it cannot be
    /// allocated.
    pub(crate) fn new(policy: EvictionPolicy, n: u32, what: &'static str) -> Result<Self> {
        Ok(match policy {
            EvictionPolicy::Lru => Policies::Lru(Lru),
            EvictionPolicy::Lfu => Policies::Lfu(Lfu::new(n, what)?),
            EvictionPolicy::S3Fifo => Policies::S3Fifo(S3Fifo::new(n, what)?),
        })
    }

    /// Which policy this is.
    pub(crate) fn kind(&self) -> EvictionPolicy {
        match self {
            Policies::Lru(_) => EvictionPolicy::Lru,
            Policies::Lfu(_) => EvictionPolicy::Lfu,
            Policies::S3Fifo(_) => EvictionPolicy::S3Fifo,
        }
    }

    /// Ghosts remembered (S3-FIFO; 0 otherwise), for tests.
    #[cfg(test)]
    pub(crate) fn num_ghosts(&self) -> usize {
        match self {
            Policies::S3Fifo(p) => p.num_ghosts(),
            _ => 0,
        }
    }
}

/// Static dispatch: each call is a `match` the compiler can inline (no indirect call on the
/// allocation path).
impl Policy for Policies {
    #[inline]
    fn lists(&self) -> usize {
        match self {
            Policies::Lru(p) => p.lists(),
            Policies::Lfu(p) => p.lists(),
            Policies::S3Fifo(p) => p.lists(),
        }
    }
    #[inline]
    fn reset(&mut self, page: u32) {
        match self {
            Policies::Lru(p) => p.reset(page),
            Policies::Lfu(p) => p.reset(page),
            Policies::S3Fifo(p) => p.reset(page),
        }
    }
    #[inline]
    fn used(&mut self, page: u32) {
        match self {
            Policies::Lru(p) => p.used(page),
            Policies::Lfu(p) => p.used(page),
            Policies::S3Fifo(p) => p.used(page),
        }
    }
    #[inline]
    fn content(&mut self, page: u32, key: u128) {
        match self {
            Policies::Lru(p) => p.content(page, key),
            Policies::Lfu(p) => p.content(page, key),
            Policies::S3Fifo(p) => p.content(page, key),
        }
    }
    #[inline]
    fn insert(&mut self, links: &mut Links, page: u32, class: u8) {
        match self {
            Policies::Lru(p) => p.insert(links, page, class),
            Policies::Lfu(p) => p.insert(links, page, class),
            Policies::S3Fifo(p) => p.insert(links, page, class),
        }
    }
    #[inline]
    fn remove(&mut self, links: &mut Links, page: u32, class: u8) {
        match self {
            Policies::Lru(p) => p.remove(links, page, class),
            Policies::Lfu(p) => p.remove(links, page, class),
            Policies::S3Fifo(p) => p.remove(links, page, class),
        }
    }
    #[inline]
    fn pop(&mut self, links: &mut Links, class: u8) -> Option<u32> {
        match self {
            Policies::Lru(p) => p.pop(links, class),
            Policies::Lfu(p) => p.pop(links, class),
            Policies::S3Fifo(p) => p.pop(links, class),
        }
    }
    #[inline]
    fn push_front(&mut self, links: &mut Links, page: u32, class: u8) {
        match self {
            Policies::Lru(p) => p.push_front(links, page, class),
            Policies::Lfu(p) => p.push_front(links, page, class),
            Policies::S3Fifo(p) => p.push_front(links, page, class),
        }
    }
    #[inline]
    fn evicted(&mut self, page: u32, class: u8) {
        match self {
            Policies::Lru(p) => p.evicted(page, class),
            Policies::Lfu(p) => p.evicted(page, class),
            Policies::S3Fifo(p) => p.evicted(page, class),
        }
    }
    #[inline]
    fn touch(&mut self, links: &mut Links, page: u32, class: u8) {
        match self {
            Policies::Lru(p) => p.touch(links, page, class),
            Policies::Lfu(p) => p.touch(links, page, class),
            Policies::S3Fifo(p) => p.touch(links, page, class),
        }
    }
    #[inline]
    fn len(&self, links: &Links, class: u8) -> usize {
        match self {
            Policies::Lru(p) => p.len(links, class),
            Policies::Lfu(p) => p.len(links, class),
            Policies::S3Fifo(p) => p.len(links, class),
        }
    }
    #[inline]
    fn order(&self, links: &Links, class: u8) -> Option<Vec<u32>> {
        match self {
            Policies::Lru(p) => p.order(links, class),
            Policies::Lfu(p) => p.order(links, class),
            Policies::S3Fifo(p) => p.order(links, class),
        }
    }
    #[inline]
    fn check(&self, links: &Links, class: u8) -> std::result::Result<(), String> {
        match self {
            Policies::Lru(p) => p.check(links, class),
            Policies::Lfu(p) => p.check(links, class),
            Policies::S3Fifo(p) => p.check(links, class),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(n: u32, p: &Policies) -> Links {
        let lists = POLICY_LISTS + p.lists() * PRIORITIES as usize;
        Links::new(n, lists as u32, "test").unwrap()
    }

    #[test]
    fn names_round_trip() {
        for p in EvictionPolicy::ALL {
            assert_eq!(EvictionPolicy::from_name(p.name()), Some(p));
        }
        assert_eq!(EvictionPolicy::from_name("arc"), None);
        assert_eq!(EvictionPolicy::default(), EvictionPolicy::Lru);
    }

    #[test]
    fn lfu_evicts_the_least_used_and_ages() {
        let mut p = Policies::new(EvictionPolicy::Lfu, 4, "test").unwrap();
        let mut l = links(4, &p);
        let f = &mut p;
        for page in 0..3 {
            f.reset(page);
        }
        f.used(0);
        f.used(0);
        f.used(1);
        for page in 0..3 {
            f.insert(&mut l, page, 0);
        }
        assert_eq!(f.order(&l, 0).unwrap(), vec![2, 1, 0]);
        let v = f.pop(&mut l, 0).unwrap();
        assert_eq!(v, 2);
        f.evicted(v, 0);
        // L is now 1: a fresh page (1 use) is worth 2, like page 1 (2 uses, entered at L = 0),
        // and sorts after it (newer).
        f.reset(3);
        f.insert(&mut l, 3, 0);
        assert_eq!(f.order(&l, 0).unwrap(), vec![1, 3, 0]);
        f.check(&l, 0).unwrap();
    }

    #[test]
    fn s3fifo_keeps_pages_used_again_and_remembers_ghosts() {
        let mut p = Policies::new(EvictionPolicy::S3Fifo, 8, "test").unwrap();
        let mut l = links(8, &p);
        {
            let f = &mut p;
            for page in 0..4 {
                f.reset(page);
                f.content(page, 100 + page as u128);
            }
            f.used(0); // hit once before its release: main queue
            for page in 0..4 {
                f.insert(&mut l, page, 0);
            }
            assert_eq!(f.order(&l, 0).unwrap(), vec![1, 2, 3, 0]);
            // The small queue (3 of 4) goes first, oldest first.
            let v = f.pop(&mut l, 0).unwrap();
            assert_eq!(v, 1);
            f.evicted(v, 0);
            f.check(&l, 0).unwrap();
        }
        assert_eq!(p.num_ghosts(), 1);
        let f = &mut p;
        // Content 101 comes back in another page: it remembers the ghost and joins main.
        f.reset(5);
        f.content(5, 101);
        f.insert(&mut l, 5, 0);
        assert_eq!(f.order(&l, 0).unwrap(), vec![2, 3, 0, 5]);
        // Main's head 0 has a use left: second chance, then 2 and 3 (small) go.
        assert_eq!(f.pop(&mut l, 0), Some(2));
        assert_eq!(f.pop(&mut l, 0), Some(3));
        assert_eq!(f.pop(&mut l, 0), Some(5));
        assert_eq!(f.pop(&mut l, 0), Some(0));
        assert_eq!(f.pop(&mut l, 0), None);
    }
}
