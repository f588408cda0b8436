//! Swapping sequences between tiers: swap-out (sharing content the host tier already indexes),
//! swap-in (sharing content still cached on the device), and their capacity queries.

use super::super::config::Tier;
use super::super::error::Result;
use super::super::pool::Holder;
use super::super::prefix::Entry;
use super::super::state::State;
use super::{check_room, tokens_in_page, CopyKind, PageCopy, Seq};

impl State {
    /// For each page of a device sequence, the host page already holding its content (a
    /// swap-out shares it instead of copying; full hashed pages only, when the host tier has an
    /// index); the host pages a swap-out takes; and how many of the shared ones are currently
    /// unreferenced (evictable).
    fn swap_out_plan(&self, s: &Seq) -> (Vec<Option<u32>>, usize, usize) {
        let ps = self.ps;
        let mut hits: Vec<Option<u32>> = vec![None; s.pages.len()];
        if self.host_index_on() {
            for (j, h) in s.hashes.iter().enumerate() {
                let e = s.extra.as_ref().map_or(0, |x| x.page_digest(j, ps));
                hits[j] = self
                    .host_index
                    .lookup(*h, e, &s.tokens[j * ps..(j + 1) * ps]);
            }
        }
        let shared = hits.iter().flatten().count();
        let cached = hits
            .iter()
            .flatten()
            .filter(|&&p| self.host.refcount(p) == 0)
            .count();
        (hits, s.pages.len() - shared, cached)
    }

    /// Host pages [`swap_out`](Self::swap_out) would take now, and the host pages it can have
    /// (free plus evictable, not counting the cached ones it would share). Read-only.
    pub fn swap_out_need(&self, id: u64) -> Result<(usize, usize)> {
        let s = self.device_seq(id)?;
        let (_, need, cached_hits) = self.swap_out_plan(s);
        Ok((need, self.host.available() - cached_hits))
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
        let (hits, need, cached_hits) = self.swap_out_plan(s);
        let n = s.pages.len();
        check_room(need, max_copies)?;
        self.ensure_available(Tier::Host, need, cached_hits)?;
        self.host.check_acquire(hits.iter().flatten().copied())?;
        let mut s = self.seqs.remove(&id).expect("checked");
        for &h in hits.iter().flatten() {
            self.host.acquire(h, Holder::Seq);
        }
        let len = s.tokens.len();
        let ps = self.ps;
        let mut host_pages = Vec::with_capacity(n);
        for (j, &p) in s.pages.iter().enumerate() {
            if let Some(h) = hits[j] {
                host_pages.push(h);
                continue;
            }
            let h = self.take_host(Holder::Seq);
            copies.push(PageCopy {
                src: p,
                dst: h,
                num_tokens: tokens_in_page(len, j, ps),
                kind: CopyKind::DeviceToHost,
            });
            host_pages.push(h);
        }
        if self.host_index_on() {
            for (j, &h) in s.hashes.iter().enumerate() {
                if hits[j].is_none() {
                    let e = s.extra.as_ref().map_or(0, |x| x.page_digest(j, ps));
                    let entry = Entry {
                        hash: h,
                        parent: if j == 0 { self.root } else { s.hashes[j - 1] },
                        extra: e,
                        lora: s.extra.as_ref().map_or(0, |x| x.lora_id),
                        tokens: &s.tokens[j * ps..(j + 1) * ps],
                    };
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

    /// For each page of a swapped-out sequence, the device page already caching its content (a
    /// swap-in shares it instead of copying); the device pages a swap-in takes; and how many of
    /// the shared ones are currently unreferenced (evictable).
    fn swap_in_plan(&self, s: &Seq) -> (Vec<Option<u32>>, usize, usize) {
        let ps = self.ps;
        let mut hits: Vec<Option<u32>> = vec![None; s.pages.len()];
        if self.cfg.enable_prefix_caching {
            for (j, h) in s.hashes.iter().enumerate() {
                let e = s.extra.as_ref().map_or(0, |x| x.page_digest(j, ps));
                hits[j] = self.index.lookup(*h, e, &s.tokens[j * ps..(j + 1) * ps]);
            }
        }
        let shared = hits.iter().flatten().count();
        let cached = hits
            .iter()
            .flatten()
            .filter(|&&p| self.dev.refcount(p) == 0)
            .count();
        (hits, s.pages.len() - shared, cached)
    }

    /// Device pages [`swap_in`](Self::swap_in) would take now, and the pages it can have (free
    /// plus evictable, not counting the cached pages it would share). Read-only.
    pub fn swap_in_need(&self, id: u64) -> Result<(usize, usize)> {
        let s = self.seq_on(id, Tier::Host)?;
        let (_, need, cached_hits) = self.swap_in_plan(s);
        Ok((need, self.dev.available() - cached_hits))
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
        let (hits, need, cached_hits) = self.swap_in_plan(s);
        let ps = self.ps;
        let hit_pages: Vec<u32> = hits.iter().flatten().copied().collect();
        check_room(need, max_copies)?;
        self.ensure_available(Tier::Device, need, cached_hits)?;
        self.dev.check_acquire(hit_pages.iter().copied())?;

        let mut s = self.seqs.remove(&id).expect("checked");
        for &p in &hit_pages {
            self.dev.acquire(p, Holder::Seq);
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
                        src: h,
                        dst: d,
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
                    let e = s.extra.as_ref().map_or(0, |x| x.page_digest(j, ps));
                    let entry = Entry {
                        hash: h,
                        parent: if j == 0 { self.root } else { s.hashes[j - 1] },
                        extra: e,
                        lora: s.extra.as_ref().map_or(0, |x| x.lora_id),
                        tokens: &s.tokens[j * ps..(j + 1) * ps],
                    };
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
