//! Swapping sequences between tiers: swap-out (sharing content the host tier already indexes),
//! swap-in (sharing content still cached on the device), and their capacity queries. Every
//! group's live pages move; released positions stay released.

use super::copies::{CopyKind, PageCopy};
use super::error::Result;
use super::pool::Holder;
use super::prefix::Entry;
use super::seq::{Seq, HOST_NULL};
use super::sequences::{check_room, tokens_in_page};
use super::state::{Release, State, NULL_PAGE};
use super::tier::Tier;

/// What a swap would do (see `State::swap_plan`).
#[derive(Debug)]
struct SwapPlan {
    /// Per group and position, the page of the destination tier already holding its content
    /// (shared instead of copied), if any.
    shared: Vec<Vec<Option<u32>>>,
    /// Per pool: pages the swap takes in the destination tier (the live pages not shared).
    new_pages: Vec<usize>,
    /// Per pool: how many of the shared pages are unreferenced (cached): taking them shrinks
    /// the evictable set.
    cached_shared: Vec<usize>,
}

impl State {
    /// Whether table entry `p` of a table in `tier` holds a page.
    fn live(&self, tier: Tier, p: u32) -> bool {
        match tier {
            Tier::Device => !self.is_null(p),
            Tier::Host => p != HOST_NULL,
        }
    }

    /// What a swap of `s` to tier `to` would do: for each live page, the page of `to` already
    /// holding its content (shared instead of copied: full hashed pages only, when `to`'s index
    /// is on — the host index for a swap-out, the device index for a swap-in), the pages of `to`
    /// it takes, and how many of the shared ones are unreferenced (evictable) now.
    fn swap_plan(&self, s: &Seq, to: Tier) -> SwapPlan {
        let from = s.tier;
        let indexed = match to {
            Tier::Host => self.host_index_on(),
            Tier::Device => self.cfg.enable_prefix_caching,
        };
        let ps = self.ps;
        let np = self.pools.len();
        let mut plan = SwapPlan {
            shared: Vec::with_capacity(s.tables.len()),
            new_pages: vec![0; np],
            cached_shared: vec![0; np],
        };
        for (g, t) in s.tables.iter().enumerate() {
            let pool = self.groups[g].pool;
            let p = &self.pools[pool];
            let (index, dest) = match to {
                Tier::Host => (&p.host_index, &p.host),
                Tier::Device => (&p.index, &p.device),
            };
            let mut shared = vec![None; t.len()];
            for (j, &page) in t.iter().enumerate() {
                if !self.live(from, page) {
                    continue;
                }
                if indexed && j < s.keys.len().min(s.final_pages(ps)) {
                    let k = s.keys[j];
                    let chunk = &s.tokens[j * ps..(j + 1) * ps];
                    shared[j] = index.lookup(g as u32, k.hash, k.extra, chunk);
                }
                match shared[j] {
                    Some(d) if dest.refcount(d) == 0 => plan.cached_shared[pool] += 1,
                    Some(_) => {}
                    None => plan.new_pages[pool] += 1,
                }
            }
            plan.shared.push(shared);
        }
        plan
    }

    /// Pages [`swap_out`](Self::swap_out) would take in the host tier now (all pools), and the
    /// host pages it can have (free plus evictable, not counting the cached ones it would
    /// share; the scarcest pool's figure when there are several). Read-only.
    pub fn swap_out_need(&self, id: u64) -> Result<(usize, usize)> {
        let s = self.device_seq(id)?;
        Ok(self.need_of(&self.swap_plan(s, Tier::Host), Tier::Host))
    }

    /// Device pages [`swap_in`](Self::swap_in) would take now, and the pages it can have (free
    /// plus evictable, not counting the cached pages it would share). Read-only.
    pub fn swap_in_need(&self, id: u64) -> Result<(usize, usize)> {
        let s = self.seq_on(id, Tier::Host)?;
        Ok(self.need_of(&self.swap_plan(s, Tier::Device), Tier::Device))
    }

    /// The pages a swap takes, and the pages it can have: the tier's free plus evictable pages
    /// not counting the cached ones it would share (with several pools, each pool's room counts
    /// only up to what the swap takes there, so the swap fits exactly when the first figure is
    /// at most the second).
    fn need_of(&self, plan: &SwapPlan, tier: Tier) -> (usize, usize) {
        let need = plan.new_pages.iter().sum();
        let room = |p: usize| self.pool_tier(p, tier).available() - plan.cached_shared[p];
        let have = if self.pools.len() == 1 {
            room(0)
        } else {
            (0..self.pools.len())
                .map(|p| room(p).min(plan.new_pages[p]))
                .sum()
        };
        (need, have)
    }

    /// Takes the sequence's reference on every page of `tier` the swap shares, every group's,
    /// before the swap takes any page: a page taken for one position could otherwise evict a
    /// cached page another position (of any group) is about to share.
    fn hold_shared(&mut self, plan: &SwapPlan, tier: Tier) {
        for (g, shared) in plan.shared.iter().enumerate() {
            let pool = &mut self.pools[self.groups[g].pool];
            let pages = match tier {
                Tier::Device => &mut pool.device,
                Tier::Host => &mut pool.host,
            };
            for &p in shared.iter().flatten() {
                pages.acquire(p, Holder::Seq);
            }
        }
    }

    fn ensure_swap(&self, plan: &SwapPlan, tier: Tier) -> Result<()> {
        for p in 0..self.pools.len() {
            self.ensure_available(p, tier, plan.new_pages[p], plan.cached_shared[p])?;
        }
        Ok(())
    }

    /// Moves a sequence's pages to the host tier. A full page whose content the host tier holds
    /// already (registered in its index by an earlier swap-out or a demotion) is shared: no copy,
    /// no new page. Every other live page gets a new host page and one device→host copy, and
    /// its content is registered in the host index (when prefix caching is on) for later
    /// swap-outs to share. Shared device pages stay with their other holders; registered ones
    /// stay cached. All or nothing (`NoSpace` on the host tier).
    pub fn swap_out(
        &mut self,
        id: u64,
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
    ) -> Result<()> {
        self.check_not_loading(id)?;
        let s = self.device_seq(id)?;
        let plan = self.swap_plan(s, Tier::Host);
        check_room("copies_out", plan.new_pages.iter().sum(), max_copies)?;
        self.ensure_swap(&plan, Tier::Host)?;
        for (g, shared) in plan.shared.iter().enumerate() {
            let pool = self.groups[g].pool;
            self.pools[pool]
                .host
                .check_acquire(shared.iter().flatten().copied())?;
        }
        let mut s = self.seqs.remove(&id).expect("checked");
        let len = s.tokens.len();
        let ps = self.ps;
        let host_index = self.host_index_on();
        self.hold_shared(&plan, Tier::Host);
        for g in 0..s.tables.len() {
            let pool = self.groups[g].pool;
            let mut host_pages = Vec::with_capacity(s.tables[g].len());
            for (j, &p) in s.tables[g].iter().enumerate() {
                if !self.live(Tier::Device, p) {
                    host_pages.push(HOST_NULL);
                    continue;
                }
                if let Some(h) = plan.shared[g][j] {
                    host_pages.push(h);
                    continue;
                }
                let h = self.take_host(pool, Holder::Seq);
                self.counters.swap_out_pages += 1;
                copies.push(PageCopy {
                    src_page: p,
                    dst_page: h,
                    num_tokens: self.copy_len(g, len, j),
                    kind: CopyKind::DeviceToHost,
                    group: g as u32,
                });
                if host_index && j < s.keys.len().min(s.final_pages(ps)) {
                    let k = s.keys[j];
                    let tokens = s.tokens[j * ps..(j + 1) * ps].to_vec();
                    let entry = Entry {
                        hash: k.hash,
                        parent: s.parent(j, self.root),
                        extra: k.extra,
                        lora: s.lora(),
                        tokens: &tokens,
                    };
                    self.index_insert(pool, Tier::Host, g as u32, h, entry);
                }
                host_pages.push(h);
            }
            let old = std::mem::replace(&mut s.tables[g], host_pages);
            let live: Vec<u32> = old
                .into_iter()
                .filter(|&p| self.live(Tier::Device, p))
                .collect();
            for &p in live.iter().rev() {
                self.release_device(pool, p, Holder::Seq, Release::Free);
            }
        }
        s.tier = Tier::Host;
        self.seqs.insert(id, s);
        Ok(())
    }

    /// Slots a swap copies of position `j` of group `g` for a sequence of `len` tokens: the
    /// tokens in the page, a state page whole.
    fn copy_len(&self, g: usize, len: usize, j: usize) -> u32 {
        if self.groups[g].rules.is_state() {
            self.ps as u32
        } else {
            tokens_in_page(len, j, self.ps)
        }
    }

    /// Brings a swapped-out sequence back to device pages. Full pages whose content is cached on
    /// the device are shared instead of copied; the other live pages get new pages and a
    /// host→device copy each. All or nothing (`NoSpace` on the device tier).
    pub fn swap_in(
        &mut self,
        id: u64,
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
    ) -> Result<()> {
        let s = self.seq_on(id, Tier::Host)?;
        let plan = self.swap_plan(s, Tier::Device);
        check_room("copies_out", plan.new_pages.iter().sum(), max_copies)?;
        self.ensure_swap(&plan, Tier::Device)?;
        for (g, shared) in plan.shared.iter().enumerate() {
            let pool = self.groups[g].pool;
            self.pools[pool]
                .device
                .check_acquire(shared.iter().flatten().copied())?;
        }
        let mut s = self.seqs.remove(&id).expect("checked");
        let len = s.tokens.len();
        let ps = self.ps;
        let caching = self.cfg.enable_prefix_caching;
        self.hold_shared(&plan, Tier::Device);
        for g in 0..s.tables.len() {
            let pool = self.groups[g].pool;
            let mut dev_pages = Vec::with_capacity(s.tables[g].len());
            let mut copied = 0u64;
            for (j, &h) in s.tables[g].iter().enumerate() {
                if h == HOST_NULL {
                    dev_pages.push(NULL_PAGE);
                    continue;
                }
                if let Some(p) = plan.shared[g][j] {
                    dev_pages.push(p);
                    continue;
                }
                let d = self.take_device(pool, Holder::Seq);
                copies.push(PageCopy {
                    src_page: h,
                    dst_page: d,
                    num_tokens: self.copy_len(g, len, j),
                    kind: CopyKind::HostToDevice,
                    group: g as u32,
                });
                copied += 1;
                if caching && j < s.keys.len() && j < s.offered[g] {
                    let k = s.keys[j];
                    let tokens = s.tokens[j * ps..(j + 1) * ps].to_vec();
                    let entry = Entry {
                        hash: k.hash,
                        parent: s.parent(j, self.root),
                        extra: k.extra,
                        lora: s.lora(),
                        tokens: &tokens,
                    };
                    self.index_insert(pool, Tier::Device, g as u32, d, entry);
                }
                dev_pages.push(d);
            }
            let old = std::mem::replace(&mut s.tables[g], dev_pages);
            for &h in old.iter().rev().filter(|&&h| h != HOST_NULL) {
                self.release_host(pool, h);
            }
            self.counters.swap_in_pages += copied;
        }
        s.tier = Tier::Device;
        self.seqs.insert(id, s);
        self.register_full_pages(id);
        Ok(())
    }
}
