//! Swapping sequences between tiers: swap-out (sharing content the host tier already indexes),
//! swap-in (sharing content still cached on the device), and their capacity queries.

use super::super::config::Tier;
use super::super::error::Result;
use super::super::pool::Holder;
use super::super::state::State;
use super::{check_room, tokens_in_page, CopyKind, PageCopy, Seq};

/// What a swap would do (see `State::swap_plan`).
#[derive(Debug)]
struct SwapPlan {
    /// Per page of the sequence, the page of the destination tier already holding its content
    /// (shared instead of copied), if any.
    shared: Vec<Option<u32>>,
    /// Pages the swap takes in the destination tier (the pages not shared).
    new_pages: usize,
    /// How many of the shared pages are unreferenced (cached): taking them shrinks the
    /// evictable set.
    cached_shared: usize,
}

impl State {
    /// What a swap of `s` to tier `to` would do: for each page, the page of `to` already
    /// holding its content (shared instead of copied: full hashed pages only, when `to`'s index
    /// is on — the host index for a swap-out, the device index for a swap-in), the pages of `to`
    /// it takes, and how many of the shared ones are unreferenced (evictable) now.
    fn swap_plan(&self, s: &Seq, to: Tier) -> SwapPlan {
        let (index, pool, indexed) = match to {
            Tier::Host => (&self.host_index, &self.host, self.host_index_on()),
            Tier::Device => (&self.index, &self.device, self.cfg.enable_prefix_caching),
        };
        let ps = self.page_size;
        let mut shared: Vec<Option<u32>> = vec![None; s.pages.len()];
        if indexed {
            for (j, h) in s.hashes.iter().enumerate() {
                let e = s.extra_digest(j, ps);
                shared[j] = index.lookup(*h, e, &s.tokens[j * ps..(j + 1) * ps]);
            }
        }
        let num_shared = shared.iter().flatten().count();
        let cached_shared = shared
            .iter()
            .flatten()
            .filter(|&&p| pool.refcount(p) == 0)
            .count();
        SwapPlan {
            new_pages: s.pages.len() - num_shared,
            cached_shared,
            shared,
        }
    }

    /// Host pages [`swap_out`](Self::swap_out) would take now, and the host pages it can have
    /// (free plus evictable, not counting the cached ones it would share). Read-only.
    pub fn swap_out_need(&self, id: u64) -> Result<(usize, usize)> {
        let s = self.device_seq(id)?;
        let plan = self.swap_plan(s, Tier::Host);
        Ok((plan.new_pages, self.host.available() - plan.cached_shared))
    }

    /// Moves a sequence's pages to the host tier. A full page whose content the host tier holds
    /// already (registered in its index by an earlier swap-out or a demotion) is shared: no copy,
    /// no new page. Every other page gets a new host page and one device→host copy, and its
    /// content is registered in the host index (when prefix caching is on) for later swap-outs to
    /// share. Shared device pages stay with their other holders; registered ones stay cached. All
    /// or nothing (`NoSpace` on the host tier).
    pub fn swap_out(
        &mut self,
        id: u64,
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
    ) -> Result<()> {
        let s = self.device_seq(id)?;
        let SwapPlan {
            shared: hits,
            new_pages: need,
            cached_shared: cached_hits,
        } = self.swap_plan(s, Tier::Host);
        let n = s.pages.len();
        check_room(need, max_copies)?;
        self.ensure_available(Tier::Host, need, cached_hits)?;
        self.host.check_acquire(hits.iter().flatten().copied())?;
        let mut s = self.seqs.remove(&id).expect("checked");
        for &h in hits.iter().flatten() {
            self.host.acquire(h, Holder::Seq);
        }
        let len = s.tokens.len();
        let ps = self.page_size;
        let mut host_pages = Vec::with_capacity(n);
        for (j, &p) in s.pages.iter().enumerate() {
            if let Some(h) = hits[j] {
                host_pages.push(h);
                continue;
            }
            let h = self.take_host(Holder::Seq);
            copies.push(PageCopy {
                src_page: p,
                dst_page: h,
                num_tokens: tokens_in_page(len, j, ps),
                kind: CopyKind::DeviceToHost,
            });
            host_pages.push(h);
        }
        if self.host_index_on() {
            for (j, &h) in s.hashes.iter().enumerate() {
                if hits[j].is_none() {
                    let parent = if j == 0 { self.root } else { s.hashes[j - 1] };
                    let entry = s.page_entry(j, ps, h, parent);
                    self.index_insert(Tier::Host, host_pages[j], entry);
                }
            }
        }
        for &p in s.pages.iter().rev() {
            self.release_device(p, Holder::Seq);
        }
        s.pages = host_pages;
        s.tier = Tier::Host;
        self.counters.swap_out_pages += need as u64;
        self.seqs.insert(id, s);
        Ok(())
    }

    /// Drops one sequence reference on a host page (registered content stays cached there).
    pub(super) fn release_host(&mut self, page: u32) {
        let registered = self.is_registered_in(Tier::Host, page);
        self.host.release(page, Holder::Seq, registered);
    }

    /// Device pages [`swap_in`](Self::swap_in) would take now, and the pages it can have (free
    /// plus evictable, not counting the cached pages it would share). Read-only.
    pub fn swap_in_need(&self, id: u64) -> Result<(usize, usize)> {
        let s = self.seq_on(id, Tier::Host)?;
        let plan = self.swap_plan(s, Tier::Device);
        Ok((plan.new_pages, self.device.available() - plan.cached_shared))
    }

    /// Brings a swapped-out sequence back to device pages. Full pages whose content is cached on
    /// the device are shared instead of copied; the others get new pages and a host→device copy
    /// each. All or nothing (`NoSpace` on the device tier).
    pub fn swap_in(
        &mut self,
        id: u64,
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
    ) -> Result<()> {
        let s = self.seq_on(id, Tier::Host)?;
        let SwapPlan {
            shared: hits,
            new_pages: need,
            cached_shared: cached_hits,
        } = self.swap_plan(s, Tier::Device);
        let ps = self.page_size;
        let hit_pages: Vec<u32> = hits.iter().flatten().copied().collect();
        check_room(need, max_copies)?;
        self.ensure_available(Tier::Device, need, cached_hits)?;
        self.device.check_acquire(hit_pages.iter().copied())?;

        let mut s = self.seqs.remove(&id).expect("checked");
        for &p in &hit_pages {
            self.device.acquire(p, Holder::Seq);
        }
        let len = s.tokens.len();
        let mut dev_pages = Vec::with_capacity(s.pages.len());
        let mut copied = 0u64;
        for (j, &h) in s.pages.iter().enumerate() {
            match hits[j] {
                Some(p) => dev_pages.push(p),
                None => {
                    let d = self.take_device(Holder::Seq);
                    copies.push(PageCopy {
                        src_page: h,
                        dst_page: d,
                        num_tokens: tokens_in_page(len, j, ps),
                        kind: CopyKind::HostToDevice,
                    });
                    copied += 1;
                    dev_pages.push(d);
                }
            }
        }
        for &h in s.pages.iter().rev() {
            self.release_host(h);
        }
        if self.cfg.enable_prefix_caching {
            for (j, &h) in s.hashes.iter().enumerate() {
                if hits[j].is_none() {
                    let parent = if j == 0 { self.root } else { s.hashes[j - 1] };
                    let entry = s.page_entry(j, ps, h, parent);
                    self.index_insert(Tier::Device, dev_pages[j], entry);
                }
            }
        }
        s.pages = dev_pages;
        s.tier = Tier::Device;
        self.counters.swap_in_pages += copied;
        self.seqs.insert(id, s);
        self.register_full_pages(id);
        Ok(())
    }
}
