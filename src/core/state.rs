//! The cache state behind the lock, and the page-level operations (allocate, acquire, release,
//! register, match, clear). Sequence operations are in `seq.rs`, the checker in `check.rs`.
//!
//! Every public operation validates everything first and mutates only once it cannot fail, so an
//! error leaves the state exactly as it was.

use super::config::{Config, Tier};
use super::error::{Error, Result};
use super::pool::{PagePool, PageState};
use super::prefix::{chain_hash, root_hash, ExtraKeys, IdMap, PrefixIndex};
use super::seq::Seq;
use super::stats::{Counters, Stats};

/// A prefix match: the pages found, their chain digests, and the tokens they cover.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    /// Device pages, in prefix order.
    pub pages: Vec<u32>,
    /// Chain digest `h_i` of each page.
    pub hashes: Vec<u128>,
    /// `pages.len() * page_size`.
    pub tokens: usize,
}

/// Everything the cache manages. Not thread-safe by itself: [`super::Cache`] wraps it in a lock.
#[derive(Debug)]
pub struct State {
    pub(super) cfg: Config,
    pub(super) ps: usize,
    pub(super) dev: PagePool,
    pub(super) host: PagePool,
    pub(super) index: PrefixIndex,
    pub(super) seqs: IdMap<Seq>,
    /// Stamp of the current batch call, to spot a sequence listed twice without a set.
    pub(super) batch_stamp: u64,
    pub(super) pending: Vec<u64>,
    pub(super) counters: Counters,
    pub(super) root: u128,
    pub(super) scratch: Vec<u8>,
}

impl State {
    /// A fresh state; the config must be valid.
    pub fn new(cfg: Config) -> Result<Self> {
        cfg.validate()?;
        Ok(State {
            ps: cfg.page_size as usize,
            dev: PagePool::new(Tier::Device, cfg.num_device_pages, cfg.reserve_null_page),
            host: PagePool::new(Tier::Host, cfg.num_host_pages, false),
            index: PrefixIndex::new(
                if cfg.enable_prefix_caching {
                    cfg.num_device_pages
                } else {
                    0
                },
                cfg.page_size,
            ),
            seqs: IdMap::default(),
            batch_stamp: 0,
            pending: Vec::new(),
            counters: Counters::default(),
            root: root_hash(),
            scratch: Vec::with_capacity(32 + 4 * cfg.page_size as usize),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub(super) fn pool(&self, tier: Tier) -> &PagePool {
        match tier {
            Tier::Device => &self.dev,
            Tier::Host => &self.host,
        }
    }

    pub(super) fn is_registered(&self, page: u32) -> bool {
        self.cfg.enable_prefix_caching && self.index.is_registered(page)
    }

    /// Refuses when `tier` cannot supply `needed` pages.
    pub(super) fn ensure_available(
        &self,
        tier: Tier,
        needed: usize,
        reserved_hits: usize,
    ) -> Result<()> {
        let pool = self.pool(tier);
        let available = pool.available() - reserved_hits;
        if needed > available {
            return Err(Error::NoSpace {
                tier,
                needed,
                available,
            });
        }
        Ok(())
    }

    /// Takes one device page (evicting the LRU cached page if the free list is empty). The
    /// caller has checked availability.
    pub(super) fn take_device(&mut self, external: bool) -> u32 {
        let (page, evicted) = self
            .dev
            .take(external)
            .expect("availability checked by caller");
        if evicted {
            self.index.remove(page);
            self.counters.evictions += 1;
        }
        page
    }

    /// Drops one reference on a device page.
    pub(super) fn release_device(&mut self, page: u32, external: bool) {
        let registered = self.is_registered(page);
        self.dev.release(page, external, registered);
    }

    /// Number of cached (refcount 0) pages among `pages`: acquiring them shrinks the evictable
    /// set, which availability checks must account for.
    pub(super) fn cached_among(&self, pages: &[u32]) -> usize {
        pages.iter().filter(|&&p| self.dev.refcount(p) == 0).count()
    }

    /// Walks the index along `tokens` for at most `max_pages` pages. Read-only.
    pub(super) fn walk(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_pages: usize,
    ) -> Match {
        let mut m = Match::default();
        if !self.cfg.enable_prefix_caching {
            return m;
        }
        let ps = self.ps;
        let mut parent = self.root;
        for (i, chunk) in tokens.chunks_exact(ps).take(max_pages).enumerate() {
            if chunk.iter().any(|&t| t < 0) {
                break;
            }
            let e = extra.map_or(0, |x| x.page_digest(i, ps));
            let h = chain_hash(parent, e, chunk, &mut self.scratch);
            match self.index.lookup(h, e, chunk) {
                Some(page) => {
                    m.pages.push(page);
                    m.hashes.push(h);
                    parent = h;
                }
                None => break,
            }
        }
        m.tokens = m.pages.len() * ps;
        m
    }

    // ---- page-level API (external holders) ----

    /// Allocates `n` device pages at refcount 1, all or nothing.
    pub fn alloc_pages(&mut self, n: usize) -> Result<Vec<u32>> {
        self.ensure_available(Tier::Device, n, 0)?;
        Ok((0..n).map(|_| self.take_device(true)).collect())
    }

    fn check_held_or_cached(&self, pages: &[u32]) -> Result<()> {
        for &p in pages {
            self.dev.check_id(p)?;
            if self.dev.state(p) == PageState::Free {
                return Err(Error::PageNotAllocated {
                    tier: Tier::Device,
                    page: p,
                });
            }
        }
        Ok(())
    }

    /// Adds one external reference to each page (in use, or cached: a cached page stops being
    /// evictable). All or nothing.
    pub fn acquire_pages(&mut self, pages: &[u32]) -> Result<()> {
        self.check_held_or_cached(pages)?;
        for &p in pages {
            self.dev.acquire(p, true);
        }
        Ok(())
    }

    /// Drops one external reference from each page, in order (a page reaching 0 becomes cached
    /// if registered, else free). A page listed more times than it has external references is
    /// `RefcountUnderflow`, and then nothing is released.
    pub fn release_pages(&mut self, pages: &[u32]) -> Result<()> {
        for &p in pages {
            self.dev.check_id(p)?;
        }
        // Take the external references first (a page listed more often than it is held runs out
        // here), undoing them all if one is missing; only then release.
        for (k, &p) in pages.iter().enumerate() {
            if !self.dev.take_ext(p) {
                for &q in &pages[..k] {
                    self.dev.restore_ext(q);
                }
                return Err(Error::RefcountUnderflow { page: p });
            }
        }
        for &p in pages {
            let registered = self.is_registered(p);
            self.dev.release(p, false, registered);
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
        let full = tokens.len() / self.ps;
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
            self.dev.check_id(p)?;
            if self.dev.refcount(p) == 0 {
                return Err(Error::PageNotAllocated {
                    tier: Tier::Device,
                    page: p,
                });
            }
        }
        let mut parent = self.root;
        let mut added = 0;
        for (i, &page) in pages.iter().enumerate() {
            let chunk = &tokens[i * self.ps..(i + 1) * self.ps];
            if chunk.iter().any(|&t| t < 0) {
                break;
            }
            let e = extra.map_or(0, |x| x.page_digest(i, self.ps));
            let h = chain_hash(parent, e, chunk, &mut self.scratch);
            if self.index.insert(page, h, e, chunk) {
                added += 1;
            }
            parent = h;
        }
        self.counters.pages_registered += added as u64;
        Ok(added)
    }

    /// Longest cached prefix of `tokens` (at most `max_tokens` tokens, whole pages only). With
    /// `acquire`, each returned page gets an external reference (release it with
    /// [`release_pages`](Self::release_pages)); without, the pages may be evicted by the next
    /// allocation.
    pub fn match_prefix(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_tokens: usize,
        acquire: bool,
    ) -> Match {
        let max_pages = tokens.len().min(max_tokens) / self.ps;
        let m = self.walk(tokens, extra, max_pages);
        if acquire {
            self.acquire_match(&m, tokens.len());
        }
        m
    }

    /// Takes one external reference on each page of a match made without `acquire` (with no
    /// change to the cache in between) and counts the lookup of `query_tokens` in the stats.
    pub fn acquire_match(&mut self, m: &Match, query_tokens: usize) {
        self.counters.prefix_queries += 1;
        self.counters.prefix_query_tokens += query_tokens as u64;
        self.counters.prefix_hit_tokens += m.tokens as u64;
        for &p in &m.pages {
            self.dev.acquire(p, true);
        }
    }

    /// Drops every prefix-index entry. Unreferenced cached pages become free; pages in use stay
    /// with their holders but will not be matched again. Works at any time.
    pub fn clear_index(&mut self) {
        for page in self.index.clear() {
            self.dev.uncache(page);
        }
        self.counters.index_clears += 1;
    }

    /// A consistent snapshot of pool figures and counters.
    pub fn stats(&self) -> Stats {
        let mut logical = 0u64;
        let mut swapped = 0u64;
        for s in self.seqs.values() {
            match s.tier {
                Tier::Device => logical += s.tokens.len() as u64,
                Tier::Host => swapped += 1,
            }
        }
        Stats {
            device_pages_total: self.dev.num_pages() as u64,
            device_pages_free: self.dev.num_free() as u64,
            device_pages_cached: self.dev.num_cached() as u64,
            device_pages_in_use: self.dev.num_in_use() as u64,
            device_pages_shared: self.dev.num_shared() as u64,
            host_pages_total: self.host.num_pages() as u64,
            host_pages_free: self.host.num_free() as u64,
            host_pages_in_use: self.host.num_in_use() as u64,
            index_pages: self.index.len() as u64,
            num_seqs: self.seqs.len() as u64,
            num_seqs_swapped: swapped,
            logical_tokens: logical,
            physical_tokens: self.dev.num_in_use() as u64 * self.ps as u64,
            page_bytes: self.cfg.page_bytes().unwrap_or(0),
            counters: self.counters,
        }
    }

    /// Refcount and state of a page of `tier`.
    pub fn page_info(&self, tier: Tier, page: u32) -> Result<(u32, PageState, bool)> {
        let pool = self.pool(tier);
        if page >= pool.num_pages() {
            return Err(Error::PageOutOfRange {
                tier,
                page,
                num_pages: pool.num_pages(),
            });
        }
        let registered = tier == Tier::Device && self.is_registered(page);
        Ok((pool.refcount(page), pool.state(page), registered))
    }
}
