//! Sequences: the `Seq` record, begin (with the prefix match), append with copy-on-write,
//! fork, free, priorities and accessors. Swapping between tiers is in `seq/swap.rs`; the batch
//! block-table and slot-mapping builders are in `batch.rs`.

mod swap;

use super::alloc::try_copy;
use super::config::Tier;
use super::error::{Error, Result};
use super::pool::{Holder, PRIORITIES};
use super::prefix::{chain_hash, Entry, ExtraKeys};
use super::state::{insert_noted, State};

/// Direction of a page copy the engine (or a backend) must execute. One type for the cache
/// manager, which reports copies, and the attention backends, which execute them
/// (`attention::CopyKind` is this type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Copy-on-write inside the device tier.
    DeviceToDevice,
    /// Swap out.
    DeviceToHost,
    /// Swap in.
    HostToDevice,
}

/// Copy token slots `0..num_tokens` of page `src_page` into page `dst_page` (the C `kvs_copy`,
/// field for field; `attention::PageCopy` is this type). 0 tokens moves nothing (the page ids
/// are still checked by a backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageCopy {
    /// Source page id (in the source tier).
    pub src_page: u32,
    /// Destination page id (in the destination tier).
    pub dst_page: u32,
    /// Slots to copy from the start of the page (`page_size` = the whole page; may be 0 for a
    /// reserved page that holds no token yet).
    pub num_tokens: u32,
    /// Tiers of `src` and `dst`.
    pub kind: CopyKind,
}

/// One sequence (request, or one beam of it).
#[derive(Debug, Clone)]
pub struct Seq {
    pub(super) tokens: Vec<i32>,
    pub(super) pages: Vec<u32>,
    pub(super) tier: Tier,
    pub(super) extra: Option<Box<ExtraKeys>>,
    /// Chain digests of the first `hashes.len()` full pages (offered to the index already).
    pub(super) hashes: Vec<u128>,
    /// A page with a placeholder (negative) token was reached: no later page is hashed.
    pub(super) hash_stopped: bool,
    /// Full pages await [`State::commit`] (defer_commit mode).
    pub(super) pending: bool,
    pub(super) matched_tokens: usize,
    /// Tokens at the start whose KV sits in shared cached pages: their slots are never written.
    pub(super) cached_tokens: usize,
    /// Indices (ascending) of later pages switched to an identical cached page when they filled
    /// up: their slots are never written either.
    pub(super) borrowed: Vec<u32>,
    /// The batch call that last listed this sequence (duplicate detection).
    pub(super) stamp: u64,
    /// Retention priority its pages keep once cached (higher is evicted later).
    pub(super) priority: u8,
}

impl Seq {
    /// Extra-key digest of page `j` (0 without extra keys).
    pub(super) fn extra_digest(&self, j: usize, ps: usize) -> u128 {
        self.extra.as_ref().map_or(0, |x| x.page_digest(j, ps))
    }

    /// The index entry of full page `j`, whose chain digest is `hash` under `parent`: the one
    /// place a sequence's page becomes an [`Entry`].
    pub(super) fn page_entry(&self, j: usize, ps: usize, hash: u128, parent: u128) -> Entry<'_> {
        Entry {
            hash,
            parent,
            extra: self.extra_digest(j, ps),
            lora: self.extra.as_ref().map_or(0, |x| x.lora_id),
            tokens: &self.tokens[j * ps..(j + 1) * ps],
        }
    }
}

/// What [`State::begin`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BeginInfo {
    /// Prompt tokens whose KV was found cached (a multiple of the page size, or of the match
    /// unit when the hit ends inside a page).
    pub matched_tokens: usize,
    /// Pages in the sequence's block table.
    pub num_pages: usize,
    /// Pages newly allocated for tokens to compute (the rest are prefix hits).
    pub new_pages: usize,
    /// Prefix-hit pages promoted from the host tier (their copies are queued: `take_copies`).
    pub promoted_pages: usize,
    /// Tokens of `matched_tokens` found in the first units of a cached page and copied into
    /// the sequence's own page (one partial copy queued: `take_copies`); 0 with whole-page
    /// matching.
    pub unit_tokens: usize,
}

/// What [`State::append_need`] reports: what an append would take, without the append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendNeed {
    /// Device pages it would take (new capacity plus copy-on-write replacements).
    pub pages: usize,
    /// Page copies it would report (0 or 1).
    pub copies: usize,
}

/// The pages an append needs, split by reason (see `State::append_plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AppendPlan {
    /// New pages past the end of the block table.
    capacity_pages: usize,
    /// Replacements of shared pages the append would write into.
    cow_pages: usize,
}

/// A sequence's current shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqInfo {
    /// Tokens (prompt plus appended).
    pub num_tokens: usize,
    /// Pages in the block table (may exceed what the tokens need by reserved lookahead).
    pub num_pages: usize,
    /// Tokens matched in the prefix index at begin.
    pub matched_tokens: usize,
    /// Where the pages are.
    pub tier: Tier,
}

/// `BufferTooSmall` for `copies_out` when `needed` copies do not fit in `capacity`.
pub(super) fn check_room(needed: usize, capacity: usize) -> Result<()> {
    check_room_named("copies_out", needed, capacity)
}

/// `BufferTooSmall` for the out-buffer `what` when `needed` entries do not fit in `capacity`.
pub(super) fn check_room_named(what: &'static str, needed: usize, capacity: usize) -> Result<()> {
    if needed > capacity {
        return Err(Error::BufferTooSmall {
            what,
            needed,
            capacity,
        });
    }
    Ok(())
}

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// Tokens held by page `j` of a sequence of `len` tokens.
pub(super) fn tokens_in_page(len: usize, j: usize, ps: usize) -> u32 {
    len.saturating_sub(j * ps).min(ps) as u32
}

impl State {
    fn seq(&self, id: u64) -> Result<&Seq> {
        self.seqs.get(&id).ok_or(Error::SeqNotFound(id))
    }

    pub(super) fn device_seq(&self, id: u64) -> Result<&Seq> {
        self.seq_on(id, Tier::Device)
    }

    /// The sequence, when it lives on `tier` (`SeqWrongTier` otherwise).
    pub(super) fn seq_on(&self, id: u64, tier: Tier) -> Result<&Seq> {
        let s = self.seq(id)?;
        if s.tier != tier {
            return Err(Error::SeqWrongTier {
                seq: id,
                tier: s.tier,
                needed: tier,
            });
        }
        Ok(s)
    }

    /// Offers the sequence's newly full pages to the prefix index (or queues them for
    /// [`commit`](Self::commit) in defer-commit mode).
    pub(super) fn register_full_pages(&mut self, id: u64) {
        if !self.cfg.enable_prefix_caching {
            return;
        }
        if self.cfg.defer_commit {
            if let Some(s) = self.seqs.get_mut(&id) {
                let full = s.tokens.len() / self.page_size;
                if !s.pending && !s.hash_stopped && s.hashes.len() < full {
                    s.pending = true;
                    self.uncommitted.push(id);
                }
            }
            return;
        }
        self.register_now(id);
    }

    fn register_now(&mut self, id: u64) {
        let dedup = self.cfg.skip_cached_writes;
        let State {
            seqs,
            index,
            hash_scratch,
            root,
            page_size,
            counters,
            events,
            device,
            ..
        } = self;
        let Some(s) = seqs.get_mut(&id) else { return };
        let ps = *page_size;
        let full = s.tokens.len() / ps;
        while !s.hash_stopped && s.hashes.len() < full {
            let i = s.hashes.len();
            let chunk = &s.tokens[i * ps..(i + 1) * ps];
            if chunk.iter().any(|&t| t < 0) {
                s.hash_stopped = true;
                break;
            }
            let parent = s.hashes.last().copied().unwrap_or(*root);
            let h = chain_hash(parent, s.extra_digest(i, ps), chunk, hash_scratch);
            let entry = s.page_entry(i, ps, h, parent);
            let own = s.pages[i];
            if !insert_noted(index, events, counters, Tier::Device, own, entry) && dedup {
                // The same content is already cached in another page (two requests filled
                // identical pages independently): share that one and free this copy. The slot
                // mapping hides the page from KV writes, so the tokens of this step that filled
                // it never write into the shared page.
                let canonical = index.lookup(h, entry.extra, entry.tokens);
                // A canonical page at the reference limit is not shared: this copy is kept.
                let shareable = |c: u32| {
                    c != own && !index.is_registered(own) && device.check_acquire([c]).is_ok()
                };
                if let Some(c) = canonical.filter(|&c| shareable(c)) {
                    device.acquire(c, Holder::Seq);
                    device.release(own, Holder::Seq, false);
                    s.pages[i] = c;
                    s.borrowed.push(i as u32);
                    counters.dedup_pages += 1;
                }
            }
            s.hashes.push(h);
        }
    }

    /// Makes every page that filled up since the last commit matchable (MindIE's
    /// `MarkBlocksAsComputed`). A no-op unless the config defers commits.
    pub fn commit(&mut self) {
        let pending = std::mem::take(&mut self.uncommitted);
        for id in pending {
            // Entries of freed (or freed and reused) ids are stale: only flagged sequences count.
            let on_device = match self.seqs.get_mut(&id) {
                Some(s) if s.pending => {
                    s.pending = false;
                    s.tier == Tier::Device
                }
                _ => continue,
            };
            if on_device {
                self.register_now(id);
            }
        }
    }

    /// Starts sequence `id` with its prompt: matches the longest cached prefix, shares those
    /// pages, and allocates pages for the rest. All or nothing.
    ///
    /// With a match unit below the page size, a prefix that goes on inside a cached page for
    /// whole units also counts (a page no sequence holds: a held page may have filled in this
    /// step, and a copy runs before the step's KV writes): the sequence's first new page receives those units by a partial
    /// copy queued for [`take_copies`](Self::take_copies) (the copy holds its source page until
    /// taken); the page is the sequence's own and is registered once full, like any other.
    ///
    /// The reported `matched_tokens` (what the engine may skip computing) is at most
    /// `max_match_tokens`. With `skip_cached_writes` every cached full page is shared even past
    /// that limit, and the slot mapping hides its slots (-1); without it, only whole pages within
    /// the limit are shared.
    pub fn begin(
        &mut self,
        id: u64,
        tokens: &[i32],
        extra: Option<ExtraKeys>,
        max_match_tokens: usize,
    ) -> Result<BeginInfo> {
        if self.seqs.contains_key(&id) {
            return Err(Error::SeqExists(id));
        }
        let extra = extra.filter(|x| !x.is_empty()).map(Box::new);
        let max_pages = if self.cfg.skip_cached_writes {
            tokens.len() / self.page_size
        } else {
            tokens.len().min(max_match_tokens) / self.page_size
        };
        let hits = self.walk(tokens, extra.as_deref(), max_pages, true);
        // A hit ending inside page `hits.len()`: whole units, never past what may be skipped.
        let limit = tokens.len().min(max_match_tokens);
        let unit = self.walk_units(tokens, extra.as_deref(), &hits, limit);
        let hit_tokens = hits.len() * self.page_size;
        let unit_tokens = unit.map_or(0, |u| u.tokens);
        let matched = (hit_tokens + unit_tokens).min(max_match_tokens);
        let total = ceil_div(tokens.len(), self.page_size);
        let fresh = total - hits.len();
        let promoted = hits.iter().filter(|h| h.tier == Tier::Host).count();
        // Holding a cached device source takes it off the evictable set, like a device hit.
        let unit_cached = unit
            .filter(|u| u.tier == Tier::Device && self.device.refcount(u.page) == 0)
            .map_or(0, |_| 1);
        self.ensure_available(
            Tier::Device,
            fresh + promoted,
            self.cached_among(&hits) + unit_cached,
        )?;
        self.check_hit_refs(&hits)?;
        if let Some(u) = unit {
            self.pool(u.tier).check_acquire([u.page])?;
        }
        let owned = try_copy(tokens, "tokens")?;
        if self.cfg.enable_prefix_caching {
            self.counters.prefix_queries += 1;
            self.counters.prefix_query_tokens += tokens.len() as u64;
            self.counters.prefix_hit_tokens += matched as u64;
        }
        // The unit source is held first, so that no promotion, demotion or allocation below
        // can evict it before its copy is queued.
        if let Some(u) = unit {
            self.hold_unit_source(u);
        }
        let mut pages = self.materialize(&hits, Holder::Seq);
        for _ in 0..fresh {
            pages.push(self.take_device(Holder::Seq));
        }
        if let Some(u) = unit {
            // The new page after the shared ones receives the cached units.
            self.queue_unit_copy(u, pages[hits.len()]);
        }
        let hashes = hits.iter().map(|h| h.hash).collect();
        let seq = Seq {
            tokens: owned,
            pages,
            tier: Tier::Device,
            extra,
            hashes,
            hash_stopped: false,
            pending: false,
            matched_tokens: matched,
            cached_tokens: hit_tokens,
            borrowed: Vec::new(),
            stamp: 0,
            priority: 0,
        };
        self.seqs.insert(id, seq);
        self.register_full_pages(id);
        Ok(BeginInfo {
            matched_tokens: matched,
            num_pages: total,
            new_pages: fresh,
            promoted_pages: promoted,
            unit_tokens,
        })
    }

    /// Pages an append of `n` tokens (plus `lookahead` reserved slots) to `s` needs: new
    /// capacity pages and copy-on-write replacements of shared pages it would write into.
    fn append_plan(&self, s: &Seq, n: usize, lookahead: usize) -> Result<AppendPlan> {
        let ps = self.page_size;
        let old = s.tokens.len();
        let slots = old
            .checked_add(n)
            .and_then(|v| v.checked_add(lookahead))
            .ok_or_else(|| {
                Error::arg(
                    "lookahead_slots",
                    format!("{old} + {n} + {lookahead} slots overflow"),
                )
            })?;
        let cap = ceil_div(slots, ps).saturating_sub(s.pages.len());
        let mut cow = 0;
        if n > 0 {
            let last = ((old + n - 1) / ps).min(s.pages.len().saturating_sub(1));
            for j in old / ps..=last {
                if j < s.pages.len() && self.device.refcount(s.pages[j]) > 1 {
                    cow += 1;
                }
            }
        }
        Ok(AppendPlan {
            capacity_pages: cap,
            cow_pages: cow,
        })
    }

    /// Copies an append of `n` tokens would report (0 or 1: only a partially filled shared page
    /// needs its tokens copied).
    fn append_copies(&self, s: &Seq, n: usize) -> usize {
        let (old, j) = (s.tokens.len(), s.tokens.len() / self.page_size);
        usize::from(
            n > 0
                && old % self.page_size > 0
                && j < s.pages.len()
                && self.device.refcount(s.pages[j]) > 1,
        )
    }

    /// Makes room for `n` more tokens in a live sequence's token list (`OutOfMemory` instead of
    /// an abort). Only capacity changes, which no operation can observe.
    fn reserve_tokens(&mut self, id: u64, n: usize) -> Result<()> {
        let s = self.seqs.get_mut(&id).ok_or(Error::SeqNotFound(id))?;
        s.tokens.try_reserve(n).map_err(|_| Error::OutOfMemory {
            what: "tokens",
            bytes: (n as u64).saturating_mul(4),
        })
    }

    /// Applies an append whose page needs were checked.
    fn append_unchecked(
        &mut self,
        id: u64,
        tokens: &[i32],
        lookahead: usize,
        copies: &mut Vec<PageCopy>,
    ) {
        let ps = self.page_size;
        let (old, npages, prio) = {
            let s = &self.seqs[&id];
            (s.tokens.len(), s.pages.len(), s.priority)
        };
        let n = tokens.len();
        if n > 0 {
            let last = ((old + n - 1) / ps).min(npages.saturating_sub(1));
            for j in old / ps..=last {
                if j >= npages {
                    break;
                }
                let src = self.seqs[&id].pages[j];
                if self.device.refcount(src) <= 1 {
                    continue;
                }
                let dst = self.take_device(Holder::Seq);
                self.device.raise_priority(dst, prio);
                let keep = if j == old / ps { old % ps } else { 0 };
                if keep > 0 {
                    copies.push(PageCopy {
                        src_page: src,
                        dst_page: dst,
                        num_tokens: keep as u32,
                        kind: CopyKind::DeviceToDevice,
                    });
                    self.counters.cow_copies += 1;
                }
                self.release_device(src, Holder::Seq);
                self.seqs.get_mut(&id).expect("checked").pages[j] = dst;
            }
        }
        let want = ceil_div(old + n + lookahead, ps);
        let mut fresh = Vec::new();
        for _ in npages..want.max(npages) {
            let p = self.take_device(Holder::Seq);
            self.device.raise_priority(p, prio);
            fresh.push(p);
        }
        let s = self.seqs.get_mut(&id).expect("checked");
        s.pages.extend(fresh);
        s.tokens.extend_from_slice(tokens);
        self.register_full_pages(id);
    }

    /// Appends tokens to a device-resident sequence, keeping room for `lookahead` more slots
    /// (speculative decoding). Writing into a page shared with another sequence copies it first;
    /// the copy is pushed to `copies`. All or nothing.
    ///
    /// `max_copies` is the room the caller has for copies: `BufferTooSmall` (before any change)
    /// if the append would report more.
    pub fn append(
        &mut self,
        id: u64,
        tokens: &[i32],
        lookahead: usize,
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
    ) -> Result<()> {
        let s = self.device_seq(id)?;
        let plan = self.append_plan(s, tokens.len(), lookahead)?;
        check_room(self.append_copies(s, tokens.len()), max_copies)?;
        self.ensure_available(Tier::Device, plan.capacity_pages + plan.cow_pages, 0)?;
        self.reserve_tokens(id, tokens.len())?;
        self.append_unchecked(id, tokens, lookahead, copies);
        Ok(())
    }

    /// [`append`](Self::append), then the sequence's page ids from index `first_page` on (the
    /// pages the append added when `first_page` is the page count before it). Fails before any
    /// change when `first_page` lies past the table the append would leave, or when the tail
    /// would not fit in `max_pages_out` (`BufferTooSmall`).
    #[allow(clippy::too_many_arguments)]
    pub fn append_pages(
        &mut self,
        id: u64,
        tokens: &[i32],
        lookahead: usize,
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
        first_page: usize,
        max_pages_out: usize,
    ) -> Result<&[u32]> {
        let s = self.device_seq(id)?;
        let after = s.pages.len() + self.append_plan(s, tokens.len(), lookahead)?.capacity_pages;
        if first_page > after {
            return Err(Error::arg(
                "first_page",
                format!("{first_page} is past the {after} pages the sequence would hold"),
            ));
        }
        check_room_named("pages_out", after - first_page, max_pages_out)?;
        self.append(id, tokens, lookahead, copies, max_copies)?;
        Ok(&self.seq(id)?.pages[first_page..])
    }

    /// One decode step for a batch: appends `tokens[i]` to `ids[i]`. All or nothing across the
    /// whole batch; at most one copy per sequence is pushed.
    pub fn append_batch(
        &mut self,
        ids: &[u64],
        tokens: &[i32],
        copies: &mut Vec<PageCopy>,
        max_copies: usize,
    ) -> Result<()> {
        if ids.len() != tokens.len() {
            return Err(Error::arg(
                "tokens",
                format!("{} tokens for {} sequences", tokens.len(), ids.len()),
            ));
        }
        let (mut need, mut n_copies) = (0, 0);
        // Shared pages the batch writes into: (page, whether its tokens must be copied).
        let mut shared: Vec<(u32, bool)> = Vec::new();
        self.batch_stamp += 1;
        let stamp = self.batch_stamp;
        for &id in ids {
            let s = self.device_seq(id)?;
            if s.stamp == stamp {
                return Err(Error::arg(
                    "seq_ids",
                    format!("sequence {id} appears twice in the batch"),
                ));
            }
            self.seqs.get_mut(&id).expect("checked").stamp = stamp;
            let s = &self.seqs[&id];
            need += self.append_plan(s, 1, 0)?.capacity_pages;
            let j = s.tokens.len() / self.page_size;
            if j < s.pages.len() && self.device.refcount(s.pages[j]) > 1 {
                shared.push((s.pages[j], !s.tokens.len().is_multiple_of(self.page_size)));
            }
        }
        // w writers into a page with r holders copy min(w, r - 1) times: the last holder left
        // writes in place.
        shared.sort_unstable();
        for group in shared.chunk_by(|a, b| a.0 == b.0) {
            let (page, data) = group[0];
            let copies = group.len().min(self.device.refcount(page) as usize - 1);
            need += copies;
            if data {
                n_copies += copies;
            }
        }
        check_room(n_copies, max_copies)?;
        self.ensure_available(Tier::Device, need, 0)?;
        for &id in ids {
            self.reserve_tokens(id, 1)?;
        }
        for (i, &id) in ids.iter().enumerate() {
            self.append_unchecked(id, &tokens[i..i + 1], 0, copies);
        }
        Ok(())
    }

    /// Creates `child` sharing every page of `parent` (beam search, parallel sampling). Writes
    /// into shared pages later copy them on write.
    pub fn fork(&mut self, parent: u64, child: u64) -> Result<()> {
        if self.seqs.contains_key(&child) {
            return Err(Error::SeqExists(child));
        }
        let s = self.device_seq(parent)?;
        self.device.check_acquire(s.pages.iter().copied())?;
        let mut s = s.clone();
        for &p in &s.pages {
            self.device.acquire(p, Holder::Seq);
        }
        s.pending = false;
        self.seqs.insert(child, s);
        self.register_full_pages(child);
        Ok(())
    }

    /// Ends a sequence: releases its pages, last page first, so the deepest cached pages of a
    /// chain are evicted before its shared head.
    ///
    /// With `defer_commit`, full pages not yet committed are not registered: their KV may never
    /// have been computed.
    ///
    /// With a match unit below the page size, the whole units of its last, never-full page are
    /// kept matchable (a partial entry: the next turn of a conversation repeats them), when
    /// the sequence is its only holder.
    pub fn free(&mut self, id: u64) -> Result<()> {
        let s = self.seqs.remove(&id).ok_or(Error::SeqNotFound(id))?;
        if s.tier == Tier::Device {
            self.keep_partial_page(&s);
        }
        for &p in s.pages.iter().rev() {
            match s.tier {
                Tier::Device => self.release_device(p, Holder::Seq),
                Tier::Host => self.release_host(p),
            }
        }
        Ok(())
    }

    /// Registers the whole units of `s`'s first unregistered page as a partial entry (see
    /// `prefix.rs`), when units are finer than pages, pages fill up without deferred commits,
    /// and the page is a never-full page `s` alone holds, free of placeholder tokens.
    fn keep_partial_page(&mut self, s: &Seq) {
        let (ps, unit) = (self.page_size, self.cfg.unit());
        if !self.cfg.enable_prefix_caching || self.cfg.defer_commit || unit == ps {
            return;
        }
        let j = s.hashes.len();
        let start = j * ps;
        let units = s.tokens.len().saturating_sub(start) / unit;
        if s.hash_stopped || units == 0 || s.tokens.len() - start >= ps || j >= s.pages.len() {
            return;
        }
        let page = s.pages[j];
        let tokens = &s.tokens[start..start + units * unit];
        if self.device.refcount(page) != 1 || tokens.iter().any(|&t| t < 0) {
            return;
        }
        let parent = s.hashes.last().copied().unwrap_or(self.root);
        let lora = s.extra.as_ref().map_or(0, |x| x.lora_id);
        self.index
            .insert_partial(page, parent, s.extra_digest(j, ps), lora, tokens);
    }

    /// Device pages and copy-on-write copies [`append`](Self::append) of `num_tokens` tokens with
    /// `lookahead` reserved slots would take now (a capacity check without the append). Read-only.
    pub fn append_need(&self, id: u64, num_tokens: usize, lookahead: usize) -> Result<AppendNeed> {
        let s = self.device_seq(id)?;
        let plan = self.append_plan(s, num_tokens, lookahead)?;
        Ok(AppendNeed {
            pages: plan.capacity_pages + plan.cow_pages,
            copies: self.append_copies(s, num_tokens),
        })
    }

    /// Sets the retention priority of a sequence (0 ..= 3, higher is kept longer): its pages,
    /// once unreferenced and cached, are evicted only after every cached page of lower priority.
    /// A page shared by several sequences keeps the highest priority any of them gave it.
    pub fn set_priority(&mut self, id: u64, priority: u8) -> Result<()> {
        if priority >= PRIORITIES {
            return Err(Error::arg(
                "priority",
                format!("{priority} is not in 0..{PRIORITIES}"),
            ));
        }
        let s = self.device_seq(id)?;
        let pages = s.pages.clone();
        self.seqs.get_mut(&id).expect("checked").priority = priority;
        for p in pages {
            self.device.raise_priority(p, priority);
        }
        Ok(())
    }

    /// The block table (page ids) of a sequence.
    pub fn seq_pages(&self, id: u64) -> Result<&[u32]> {
        Ok(&self.seq(id)?.pages)
    }

    /// The token ids of a sequence.
    pub fn seq_tokens(&self, id: u64) -> Result<&[i32]> {
        Ok(&self.seq(id)?.tokens)
    }

    /// A sequence's shape.
    pub fn seq_info(&self, id: u64) -> Result<SeqInfo> {
        let s = self.seq(id)?;
        Ok(SeqInfo {
            num_tokens: s.tokens.len(),
            num_pages: s.pages.len(),
            matched_tokens: s.matched_tokens,
            tier: s.tier,
        })
    }
}
