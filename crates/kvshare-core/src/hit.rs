//! Prefix hits: the longest cached prefix of a prompt across tiers and groups, and hits that end
//! inside a page (`match_unit`). Read-only but for hashing; [`State::materialize`] then takes
//! the hit's pages (promoting host-tier ones).
//!
//! A plain model (one full-attention group) walks its index page after page ([`State::walk`]).
//! A cache of several groups finds the longest hit every group can serve: vLLM 0.23's
//! `HybridKVCacheCoordinator.find_longest_cache_hit`, an iteration to a fixed point over the
//! lookup sets (groups of equal specs), each asking its kind's [`Rules::find_hit`]
//! (`rules.rs`) through a [`Probe`] that looks each position up on the device, then (with a host
//! cache) on the host. In an engine's lookup ([`State::find_hit`]) an EAGLE set drops the last
//! page of its hit once per candidate length (vLLM's `eagle_verified`), looking one page
//! further first; a begin then takes the hit it is given (a fixed point without the drop
//! returns that hit, page for page).

use super::copies::{CopyKind, PageCopy, Queued};
use super::pool::Holder;
use super::prefix::{chain_hash, has_placeholder, ExtraKeys};
use super::rules::{Probe, Span};
use super::seq::PageKey;
use super::state::{Hit, State, NULL_PAGE};
use super::tier::Tier;

/// Pages of a prefix walk hashed before their lookups (see [`State::walk`]).
const WALK_GROUP: usize = 8;

/// One page of a prefix walk's group: its key, then the device page it finds (unverified until
/// the group's lookups are done).
#[derive(Debug, Clone, Copy)]
struct WalkPage {
    key: PageKey,
    found: Option<u32>,
}

/// A prefix hit ending inside a page, in one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnitMatch {
    /// Tier of `page`.
    pub tier: Tier,
    /// The cached page holding the matched units.
    pub page: u32,
    /// Tokens matched in it (whole units, fewer than a page).
    pub tokens: usize,
}

/// The longest hit across groups: each group's positions for it (`None`: the null page, a
/// position the group no longer reads).
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupsHit {
    pub groups: Vec<Vec<Option<Hit>>>,
}

impl GroupsHit {
    /// Every page of the hit, with its group.
    pub fn pages(&self) -> impl Iterator<Item = (usize, Hit)> + '_ {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(g, v)| v.iter().flatten().map(move |h| (g, *h)))
    }
}

/// The lookups of one set of groups, remembered per position so the fixed point never looks a
/// page up twice.
struct SetProbe<'a> {
    state: &'a State,
    set: &'a [usize],
    keys: &'a [PageKey],
    tokens: &'a [i32],
    host: bool,
    /// Per position: not looked up yet, a miss, or each member's hit.
    seen: &'a mut Vec<Option<Option<Vec<Hit>>>>,
}

impl Probe for SetProbe<'_> {
    fn has(&mut self, j: usize) -> bool {
        if j >= self.keys.len() {
            return false;
        }
        if self.seen.len() <= j {
            self.seen.resize(j + 1, None);
        }
        if let Some(r) = &self.seen[j] {
            return r.is_some();
        }
        let k = self.keys[j];
        let ps = self.state.ps;
        let chunk = &self.tokens[j * ps..(j + 1) * ps];
        let found: Option<Vec<Hit>> =
            self.set
                .iter()
                .map(|&g| {
                    let pool = &self.state.pools[self.state.groups[g].pool];
                    let g32 = g as u32;
                    match pool.index.lookup(g32, k.hash, k.extra, chunk) {
                        Some(page) => Some(Hit {
                            tier: Tier::Device,
                            page,
                        }),
                        None if self.host => pool
                            .host_index
                            .lookup(g32, k.hash, k.extra, chunk)
                            .map(|page| Hit {
                                tier: Tier::Host,
                                page,
                            }),
                        None => None,
                    }
                })
                .collect();
        let hit = found.is_some();
        self.seen[j] = Some(found);
        hit
    }
}

impl State {
    /// Keys of the full pages of `tokens` after `from`, up to the first page holding a
    /// placeholder (a negative token). Also reports whether such a page stopped the hashing.
    pub(crate) fn page_keys(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        from: &[PageKey],
    ) -> (Vec<PageKey>, bool) {
        let ps = self.ps;
        let mut keys = Vec::with_capacity(tokens.len() / ps);
        keys.extend_from_slice(from);
        let mut parent = keys.last().map_or(self.root, |k| k.hash);
        for (i, chunk) in tokens.chunks_exact(ps).enumerate().skip(keys.len()) {
            if has_placeholder(chunk) {
                return (keys, true);
            }
            let e = extra.map_or(0, |x| x.page_digest(i, ps));
            parent = chain_hash(parent, e, chunk, &mut self.hash_scratch);
            keys.push(PageKey {
                hash: parent,
                extra: e,
            });
        }
        (keys, false)
    }

    /// The plain model's walk along `tokens` for at most `max_pages` pages: each page is looked
    /// up on the device, then (with a host cache and `tiers`) on the host. Returns the hit
    /// pages with their keys.
    ///
    /// Pages go in groups of [`WALK_GROUP`]: the group's chain digests first (they depend on the
    /// tokens alone), then its device lookups, which are independent of each other, so their
    /// cache misses overlap instead of following one another (the index is cold when an engine
    /// calls between model steps). A miss ends the walk; at most one group is hashed past it.
    pub(crate) fn walk(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_pages: usize,
        tiers: bool,
    ) -> Vec<(Hit, PageKey)> {
        if !self.cfg.enable_prefix_caching {
            return Vec::new();
        }
        let ps = self.ps;
        let mut hits = Vec::with_capacity(max_pages.min(tokens.len() / ps));
        let host = tiers && self.host_cache();
        let mut parent = self.root;
        let mut chunks = tokens.chunks_exact(ps).take(max_pages).enumerate();
        let mut group = [WalkPage {
            key: PageKey { hash: 0, extra: 0 },
            found: None,
        }; WALK_GROUP];
        loop {
            // Digests of the next group, up to a page holding a placeholder (negative) token.
            let mut len = 0;
            let mut last = false;
            let first = hits.len();
            for (i, chunk) in chunks.by_ref() {
                if has_placeholder(chunk) {
                    last = true;
                    break;
                }
                let e = extra.map_or(0, |x| x.page_digest(i, ps));
                parent = chain_hash(parent, e, chunk, &mut self.hash_scratch);
                group[len] = WalkPage {
                    key: PageKey {
                        hash: parent,
                        extra: e,
                    },
                    found: None,
                };
                len += 1;
                if len == WALK_GROUP {
                    break;
                }
            }
            let pool = &self.pools[0];
            for g in &mut group[..len] {
                g.found = pool.index.find(0, g.key.hash);
            }
            for (j, w) in group[..len].iter().enumerate() {
                let chunk = &tokens[(first + j) * ps..(first + j + 1) * ps];
                let dev = w
                    .found
                    .filter(|&p| pool.index.verify(p, 0, w.key.extra, chunk));
                let hit = match dev {
                    Some(page) => Hit {
                        tier: Tier::Device,
                        page,
                    },
                    None => match host
                        .then(|| pool.host_index.lookup(0, w.key.hash, w.key.extra, chunk))
                        .flatten()
                    {
                        Some(page) => Hit {
                            tier: Tier::Host,
                            page,
                        },
                        None => return hits,
                    },
                };
                hits.push((hit, w.key));
            }
            if last || len < WALK_GROUP {
                return hits;
            }
        }
    }

    /// The longest hit of at most `max_len` tokens across the groups (`keys`: the prompt's page
    /// keys), looking host pages up too when `tiers`; with `eagle`, an engine's lookup: EAGLE
    /// sets drop their last hit page (a begin takes the hit it is given, without a drop).
    /// Read-only.
    pub(crate) fn groups_hit(
        &self,
        keys: &[PageKey],
        tokens: &[i32],
        max_len: usize,
        tiers: bool,
        eagle: bool,
    ) -> GroupsHit {
        let ng = self.groups.len();
        if !self.cfg.enable_prefix_caching {
            return GroupsHit {
                groups: vec![Vec::new(); ng],
            };
        }
        let host = tiers && self.host_cache();
        let ps = self.ps;
        let mut seen: Vec<Vec<Option<Option<Vec<Hit>>>>> = vec![Vec::new(); self.sets.len()];
        let mut spans: Vec<Option<Span>> = vec![None; self.sets.len()];
        let kind = |s: usize| self.groups[self.sets[s][0]].kind;
        let full = |s: usize| kind(s) == super::config::GroupKind::Full;
        let simple = self.sets.len() == 2 && full(0);
        let mut hit = max_len;
        // Sets (bits) whose EAGLE drop holds at the current candidate: each drops at most once
        // per candidate length (vLLM's `eagle_verified`).
        let mut verified = 0u32;
        loop {
            let mut curr = hit;
            for (s, set) in self.sets.iter().enumerate() {
                if full(s) && spans[s].is_some() {
                    // A full set's earlier answer is a prefix of any shorter one.
                    curr = curr / ps * ps;
                    continue;
                }
                let mut probe = SetProbe {
                    state: self,
                    set,
                    keys,
                    tokens,
                    host,
                    seen: &mut seen[s],
                };
                let (rules, bit) = (&self.groups[set[0]].rules, 1u32 << s);
                let drop = eagle && self.groups[set[0]].eagle && verified & bit == 0;
                let span = if drop {
                    // EAGLE looks one page further, then drops the last hit page.
                    let span = rules.find_hit_dropping((curr + ps).min(max_len), ps, &mut probe);
                    verified |= bit;
                    span
                } else {
                    let span = rules.find_hit(curr, ps, &mut probe);
                    if span.len * ps < curr {
                        verified = 0; // the candidate shrank: every drop is checked again
                    }
                    span
                };
                curr = span.len * ps;
                spans[s] = Some(span);
            }
            if curr >= hit {
                break;
            }
            hit = curr;
            if simple {
                break;
            }
        }
        let len = hit / ps;
        let mut groups = vec![Vec::new(); ng];
        for (s, set) in self.sets.iter().enumerate() {
            let mut span = spans[s].unwrap_or_default();
            if full(s) {
                span.len = span.len.min(len);
            }
            // A span with no live position may never have been looked up (a chunk starting at
            // the hit's end needs no page), so `seen` is read for live positions only.
            let live: &[_] = if span.first_live < span.len {
                &seen[s][span.first_live..span.len]
            } else {
                &[]
            };
            for (m, &g) in set.iter().enumerate() {
                let mut v = vec![None; span.first_live.min(span.len)];
                for r in live {
                    let h = r
                        .as_ref()
                        .and_then(|r| r.as_ref())
                        .map(|hits| hits[m])
                        .expect("a span's live positions were looked up and found");
                    v.push(Some(h));
                }
                groups[g] = v;
            }
        }
        GroupsHit { groups }
    }

    /// The longest unit prefix of page `hit_pages` of `tokens` (within the first `limit`
    /// tokens), after a page-aligned hit of `hit_pages` pages, cached in every group (each
    /// group's own source page), when units are finer than pages. Only unreferenced sources: a
    /// page some sequence holds may have filled in this very step, and its KV is written only
    /// after the step's copies have run (a page shared whole is read after the writes, a copied
    /// one before). A cached page's KV was written before its last holder let it go, or is the
    /// target of a copy queued earlier. Read-only but for hashing.
    pub(crate) fn unit_hits(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        parent: u128,
        hit_pages: usize,
        limit: usize,
    ) -> Vec<UnitMatch> {
        let ps = self.ps;
        if !self.cfg.enable_prefix_caching || self.cfg.unit() == ps {
            return Vec::new();
        }
        let start = hit_pages * ps;
        let end = tokens.len().min(limit).min(start + ps);
        let Some(chunk) = tokens.get(start..end) else {
            return Vec::new();
        };
        let chunk = &chunk[..chunk.iter().position(|&t| t < 0).unwrap_or(chunk.len())];
        let e = extra.map_or(0, |x| x.page_digest(hit_pages, ps));
        let host_on = self.host_cache();
        let mut out = Vec::with_capacity(self.groups.len());
        for g in 0..self.groups.len() {
            let p = &self.pools[self.groups[g].pool];
            let (device, host) = (&p.device, &p.host);
            let g32 = g as u32;
            let dev = p
                .index
                .lookup_units(g32, parent, e, chunk, &mut self.hash_scratch, |x| {
                    device.refcount(x) == 0
                });
            let hst = if host_on {
                p.host_index
                    .lookup_units(g32, parent, e, chunk, &mut self.hash_scratch, |x| {
                        host.refcount(x) == 0
                    })
            } else {
                None
            };
            // The longer hit wins; the device one on a tie (no cross-tier read).
            let best = match (dev, hst) {
                (Some(d), Some(h)) if h.tokens > d.tokens => (Tier::Host, h),
                (Some(d), _) => (Tier::Device, d),
                (None, Some(h)) => (Tier::Host, h),
                (None, None) => return Vec::new(),
            };
            out.push(UnitMatch {
                tier: best.0,
                page: best.1.page,
                tokens: best.1.tokens,
            });
        }
        // Every group copies as many tokens as the shortest group holds.
        let n = out.iter().map(|u| u.tokens).min().unwrap_or(0);
        for u in &mut out {
            u.tokens = n;
        }
        out
    }

    /// Number of cached (refcount 0) device pages among `hits` of pool `pool`: taking them
    /// shrinks the evictable set, which availability checks must account for.
    pub(crate) fn cached_among<'a>(
        &self,
        pool: usize,
        hits: impl IntoIterator<Item = &'a Hit>,
    ) -> usize {
        let d = &self.pools[pool].device;
        hits.into_iter()
            .filter(|h| h.tier == Tier::Device && d.refcount(h.page) == 0)
            .count()
    }

    /// Takes a `holder` reference on every hit of group `group`, promoting host hits to new
    /// device pages (their host→device copies are queued and the device index learns them).
    /// Returns the device pages in order. The caller has checked device availability for the
    /// host hits and that the device hits can take one more reference.
    pub(crate) fn materialize(&mut self, group: usize, hits: &[Hit], holder: Holder) -> Vec<u32> {
        self.hold_hits(group, hits, holder);
        let mut pages = Vec::with_capacity(hits.len());
        self.promote_held(group, hits.iter().copied().map(Some), holder, &mut pages);
        pages
    }

    /// The first half of [`materialize`](Self::materialize): a `holder` reference on every
    /// device hit, and a transient hold on every host hit, so that nothing taken afterwards (a
    /// promotion, a demotion, another group's page) can evict them. Hits of every group of a
    /// begin are held before any page is taken.
    pub(crate) fn hold_hits<'a>(
        &mut self,
        group: usize,
        hits: impl IntoIterator<Item = &'a Hit>,
        holder: Holder,
    ) {
        let pool = self.groups[group].pool;
        for h in hits {
            match h.tier {
                Tier::Device => self.pools[pool].device.acquire(h.page, holder),
                Tier::Host => self.pools[pool].host.acquire(h.page, Holder::Seq),
            }
        }
    }

    /// The second half of [`materialize`](Self::materialize): promotes the held host hits and
    /// drops their transient holds. Appends the device page of each position to `pages` in
    /// order (the null page where a position has no hit).
    pub(crate) fn promote_held(
        &mut self,
        group: usize,
        positions: impl Iterator<Item = Option<Hit>> + Clone,
        holder: Holder,
        pages: &mut Vec<u32>,
    ) {
        let pool = self.groups[group].pool;
        for h in positions.clone() {
            let page = match h {
                None => NULL_PAGE,
                Some(h) if h.tier == Tier::Device => h.page,
                Some(h) => {
                    let d = self.take_device(pool, holder);
                    self.copy_entry_across(pool, Tier::Host, h.page, d);
                    self.counters.promotions += 1;
                    self.counters.host_hit_tokens += self.ps as u64;
                    d
                }
            };
            pages.push(page);
        }
        for h in positions.flatten() {
            if h.tier == Tier::Host {
                self.release_host(pool, h.page);
            }
        }
    }

    /// Takes the reference a unit hit's copy holds on its source page of group `group` (see
    /// `Queued`). The caller has checked that the page can take one more reference.
    pub(crate) fn hold_unit_source(&mut self, group: usize, u: UnitMatch) {
        let p = &mut self.pools[self.groups[group].pool];
        match u.tier {
            Tier::Device => p.device.acquire(u.page, Holder::Seq),
            Tier::Host => p.host.acquire(u.page, Holder::Seq),
        }
    }

    /// Queues the copy of a unit hit's tokens from its held source page into `dst` (a new
    /// device page of the sequence in group `group`); `take_copies` drops the hold.
    pub(crate) fn queue_unit_copy(&mut self, group: usize, u: UnitMatch, dst: u32) {
        let kind = match u.tier {
            Tier::Device => CopyKind::DeviceToDevice,
            Tier::Host => CopyKind::HostToDevice,
        };
        self.copies.push_back(Queued {
            copy: PageCopy {
                src_page: u.page,
                dst_page: dst,
                num_tokens: u.tokens as u32,
                kind,
                group: group as u32,
            },
            holds_src: true,
        });
        if group == 0 {
            self.counters.unit_hits += 1;
            self.counters.unit_hit_tokens += u.tokens as u64;
        }
    }
}
