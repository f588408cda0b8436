//! The pool tier: a store shared by several engines (Mooncake Store) behind the device and host
//! tiers. The cache never talks to the store; it decides what to look up, load and store, and
//! the engine side (a small runtime) moves the bytes and reports back:
//!
//! 1. **Lookup.** [`State::pool_lookup`] walks the prompt through the local tiers, as a begin
//!    would, and returns the store keys of the full pages after the local hit (up to the match
//!    limit), position-major, one key per group. The runtime asks the store about all of them
//!    in one batched query. Read-only: nothing is reserved between the lookup and the begin.
//! 2. **Load.** [`State::begin_pooled`] takes the answer (one bit per key). The longest run of
//!    positions, right after the local hit, that every group's key hit becomes device pages of
//!    the sequence that are loading: counted as matched, unmatchable (not in the index) and held
//!    by one extra reference each until [`State::pool_done`] reports the load. Each load is a
//!    [`PoolWork`] for [`State::take_pool_work`]. When the last load of the sequence is
//!    reported, the sequence settles: its match ends at the first position whose load failed
//!    (a failed load loses nothing: the engine computes from there), the loaded pages before it
//!    are registered, the rest like any prompt page. The engine runs the sequence only once
//!    [`State::pool_loading`] says 0 (vLLM's asynchronous load: the request waits for its KV).
//! 3. **Store.** With [`StorePolicy::WriteThrough`], every page the sequence registers in the
//!    device index (not the ones it loaded) is handed out as a store at the next
//!    [`State::commit`], the engine's statement that the step's KV is written; with
//!    [`StorePolicy::OnDemotion`], every page demoted to the host tier, at once (read it after
//!    executing the demotion's copy from `take_copies`). The page keeps a reference until the
//!    engine reports the read done ([`State::pool_done`]), so it is never reused under the
//!    transfer.
//!
//! The two-step shape (a read-only lookup, then a begin with the answer) is vLLM's connector
//! shape (`get_num_new_matched_tokens` asks the store synchronously, `update_state_after_alloc`
//! starts asynchronous loads, `get_finished` and `get_block_ids_with_load_errors` report them),
//! without a half-begun sequence holding pages while the engine waits on the store: the begin
//! walks the local tiers again and uses the answer only from where its own hit ends.
//!
//! ## Keys
//!
//! ```text
//! kvs1/{namespace}/{identity digest, 32 hex}/{tp}-{pp}-{pcp}-{dcp}/g{group}/{h_i, 32 hex}
//! ```
//!
//! `h_i` is the page's chain digest (`prefix.rs`: it folds in the LoRA id, the cache salt and
//! the multimodal items, so tenants and adapters stay apart in the store as they do locally).
//! The identity digest of each group is
//! `xxh3_128(b"kvs-pool-identity-v1" ‖ identity length u64 LE ‖ identity ‖ page_size u32 LE ‖
//! page_bytes u64 LE ‖ dtype u8 ‖ kind u8 ‖ window u32 LE ‖ (rank u32 LE ‖ size u32 LE) for tp,
//! pp, pcp, dcp)`; `identity` is the caller's opaque model and layout identity (model, revision,
//! KV layout, quantisation). Two caches that differ in any of these never share an entry.
//!
//! The pool tier takes full-attention groups only: a window or a state is not a prefix of
//! pages a later prompt walks from its first page.

use std::collections::VecDeque;

use xxhash_rust::xxh3::xxh3_128;

use super::config::{Config, DType, GroupKind};
use super::error::{Error, Result};
use super::hashing::IdMap;
use super::pool::Holder;
use super::prefix::ExtraKeys;
use super::seq::PageKey;
use super::sequences::check_room;
use super::state::{Release, State};
use super::tier::Tier;

/// When pages are written to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorePolicy {
    /// Never: the cache only reads the pool.
    ReadOnly,
    /// Every page registered in the device index (handed out at the next commit).
    WriteThrough,
    /// Every cached page demoted to the host tier (needs a host tier with demotion).
    OnDemotion,
}

/// This rank's place in the engine's parallelism; part of every key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranks {
    /// Tensor-parallel rank and size.
    pub tp: (u32, u32),
    /// Pipeline-parallel rank and size.
    pub pp: (u32, u32),
    /// Prefill context-parallel rank and size.
    pub pcp: (u32, u32),
    /// Decode context-parallel rank and size.
    pub dcp: (u32, u32),
}

impl Default for Ranks {
    fn default() -> Self {
        Ranks {
            tp: (0, 1),
            pp: (0, 1),
            pcp: (0, 1),
            dcp: (0, 1),
        }
    }
}

impl Ranks {
    fn all(&self) -> [(u32, u32); 4] {
        [self.tp, self.pp, self.pcp, self.dcp]
    }
}

/// The pool tier's settings ([`Config::pool`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Deployment namespace: 1 to 128 characters of `[A-Za-z0-9._-]`.
    pub namespace: String,
    /// The model and layout identity (opaque, 1 to 4096 bytes): engines share entries only
    /// when it is equal.
    pub identity: Vec<u8>,
    /// This rank.
    pub ranks: Ranks,
    /// When pages are written.
    pub store: StorePolicy,
}

/// Longest namespace accepted.
pub const MAX_NAMESPACE: usize = 128;
/// Longest identity accepted.
pub const MAX_IDENTITY: usize = 4096;

impl PoolConfig {
    /// Checks the settings against the cache's configuration.
    pub(crate) fn validate(&self, cfg: &Config) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::InvalidConfig {
                field: "pool",
                reason,
            })
        };
        let ns = &self.namespace;
        let ns_ok = ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ns.is_empty() || ns.len() > MAX_NAMESPACE || !ns_ok {
            return bad(format!(
                "namespace {ns:?} is not 1 to {MAX_NAMESPACE} characters of [A-Za-z0-9._-]"
            ));
        }
        if self.identity.is_empty() || self.identity.len() > MAX_IDENTITY {
            return bad(format!(
                "identity has {} bytes, not 1 to {MAX_IDENTITY}",
                self.identity.len()
            ));
        }
        for (name, (rank, size)) in ["tp", "pp", "pcp", "dcp"].iter().zip(self.ranks.all()) {
            if size == 0 || rank >= size {
                return bad(format!("{name} rank {rank} is not below its size {size}"));
            }
        }
        if !cfg.enable_prefix_caching {
            return bad("the pool tier needs enable_prefix_caching".into());
        }
        if cfg.group_specs().iter().any(|g| g.kind != GroupKind::Full) {
            return bad("the pool tier takes full-attention groups only".into());
        }
        if cfg.dtype.size_bytes() == 1 {
            // A quantized page means its values times the engine's scales, which the key does
            // not name: two engines with other scales would read each other's pages wrongly.
            return bad(format!(
                "the pool tier takes f32, f16 and bf16 pages only, not {:?}",
                cfg.dtype
            ));
        }
        let demotes = cfg.num_host_pages > 0 && cfg.demote_to_host;
        if self.store == StorePolicy::OnDemotion && !demotes {
            return bad("store on demotion needs host pages with demote_to_host".into());
        }
        Ok(())
    }

    /// The identity digest of a group of `cfg` with `page_bytes` bytes per page.
    fn identity_digest(&self, cfg: &Config, kind: GroupKind, page_bytes: u64) -> u128 {
        let mut b = Vec::with_capacity(64 + self.identity.len());
        b.extend_from_slice(b"kvs-pool-identity-v1");
        b.extend_from_slice(&(self.identity.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.identity);
        b.extend_from_slice(&cfg.page_size.to_le_bytes());
        b.extend_from_slice(&page_bytes.to_le_bytes());
        b.push(match cfg.dtype {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::Fp8E4M3 => 3,
            DType::Fp8E5M2 => 4,
            DType::Int8 => 5,
            DType::Int8PerTokenHead => 6,
        });
        b.push(match kind {
            GroupKind::Full => 0,
            GroupKind::SlidingWindow(_) => 1,
            GroupKind::ChunkedLocal(_) => 2,
            GroupKind::State(_) => 3,
        });
        b.extend_from_slice(&kind.window().to_le_bytes());
        for (rank, size) in self.ranks.all() {
            b.extend_from_slice(&rank.to_le_bytes());
            b.extend_from_slice(&size.to_le_bytes());
        }
        xxh3_128(&b)
    }
}

/// One key of a lookup: the store key of `group`'s page at `position` of the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKey {
    /// Page position in the prompt.
    pub position: usize,
    /// The group.
    pub group: u32,
    /// The store key.
    pub key: String,
}

/// What [`State::pool_lookup`] asks the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolLookup {
    /// The first position asked about (where the local hit ends).
    pub first_page: usize,
    /// The keys, position-major (every group of a position, then the next position).
    pub keys: Vec<PoolKey>,
}

/// The store's answer to a lookup, for [`State::begin_pooled`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolAnswer<'a> {
    /// The lookup's `first_page`.
    pub first_page: usize,
    /// One entry per key of the lookup, in its order: whether the store holds it.
    pub hits: &'a [bool],
}

/// What a [`PoolWork`] asks the engine to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolOp {
    /// Read the entry `key` into device page `page` of the group (verify it first).
    Load,
    /// Write page `page` of tier `tier` of the group under `key` (a store that finds the key
    /// present stores nothing and is reported done).
    Store,
}

/// One transfer between the pool and a page, reported with [`State::pool_done`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolWork {
    /// What to report it under.
    pub ticket: u64,
    /// Load or store.
    pub op: PoolOp,
    /// The group whose layers hold the KV.
    pub group: u32,
    /// The page's tier: the device for loads, the device or the host for stores.
    pub tier: Tier,
    /// The page id in that tier of the group's pool.
    pub page: u32,
    /// The store key.
    pub key: String,
    /// The page's chain digest `h_i` (also in the key).
    pub hash: u128,
    /// The page's token ids (what a stored value carries and a load verifies).
    pub tokens: Vec<i32>,
}

/// Pool-tier counters, monotonically increasing, and what is outstanding now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Lookups made.
    pub lookups: u64,
    /// Keys those lookups asked about.
    pub lookup_keys: u64,
    /// Keys the answers given to begins reported present.
    pub answered_hits: u64,
    /// Loads queued.
    pub loads: u64,
    /// Loads reported done.
    pub loads_ok: u64,
    /// Loads reported failed (missing, unreachable, or failing verification).
    pub loads_failed: u64,
    /// Prompt tokens served from the pool (settled loads before the first failure).
    pub hit_tokens: u64,
    /// Stores handed out.
    pub stores: u64,
    /// Stores reported done.
    pub stores_ok: u64,
    /// Stores reported failed.
    pub stores_failed: u64,
    /// Transfers handed out or queued and not reported yet.
    pub pending: u64,
    /// Of those, waiting for `take_pool_work`.
    pub queued: u64,
}

/// A transfer not reported yet: the page it holds.
#[derive(Debug, Clone, Copy)]
struct Pending {
    op: PoolOp,
    /// The loading sequence (None once it was freed).
    seq: Option<u64>,
    position: usize,
    group: u32,
    tier: Tier,
    page: u32,
}

/// The pool tier's state in [`State`].
#[derive(Debug)]
pub(crate) struct PoolTier {
    cfg: PoolConfig,
    /// Per group: the key up to the chain digest.
    prefixes: Vec<String>,
    pending: IdMap<Pending>,
    next_ticket: u64,
    queue: VecDeque<PoolWork>,
    /// Write-through stores waiting for the next commit.
    staged: Vec<PoolWork>,
    stats: PoolStats,
}

/// A sequence's loads from the pool.
#[derive(Debug, Clone)]
pub(crate) struct SeqPool {
    /// The first loaded position.
    pub start: usize,
    /// One past the last position loaded (before settling) or loaded without a failure (after).
    pub end: usize,
    /// Loads not reported yet (0: settled).
    pub outstanding: usize,
    /// The first position whose load failed (`end` while none did).
    pub failed_from: usize,
    /// The loads' tickets.
    pub tickets: Vec<u64>,
}

impl SeqPool {
    /// Loads are outstanding: nothing at or after `start` may be registered.
    pub fn loading(&self) -> bool {
        self.outstanding > 0
    }
}

impl PoolTier {
    pub(crate) fn new(cfg: &Config, pool: &PoolConfig) -> Self {
        let r = pool.ranks;
        let prefixes = cfg
            .group_specs()
            .iter()
            .enumerate()
            .map(|(g, spec)| {
                let id = pool.identity_digest(cfg, spec.kind, cfg.group_page_bytes(spec));
                format!(
                    "kvs1/{}/{id:032x}/{}-{}-{}-{}/g{g}/",
                    pool.namespace, r.tp.0, r.pp.0, r.pcp.0, r.dcp.0
                )
            })
            .collect();
        PoolTier {
            cfg: pool.clone(),
            prefixes,
            pending: IdMap::default(),
            next_ticket: 1,
            queue: VecDeque::new(),
            staged: Vec::new(),
            stats: PoolStats::default(),
        }
    }

    fn key(&self, group: usize, hash: u128) -> String {
        format!("{}{hash:032x}", self.prefixes[group])
    }

    fn ticket(&mut self) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }
}

impl State {
    fn tier_mut(&mut self) -> Result<&mut PoolTier> {
        self.pooltier
            .as_deref_mut()
            .ok_or_else(|| Error::Unsupported("the cache has no pool tier (Config::pool)".into()))
    }

    /// The store keys of the prompt's full pages after its local hit (at most
    /// `max_match_tokens` tokens in all), position-major; empty when the local tiers hold
    /// them all. Refused (`BufferTooSmall`, nothing counted) when there are more than
    /// `max_keys`. Read-only but for hashing and the lookup counters.
    pub fn pool_lookup(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        max_match_tokens: usize,
        max_keys: usize,
    ) -> Result<PoolLookup> {
        self.tier_mut()?;
        let limit = tokens.len().min(max_match_tokens);
        let (hit_pages, keys) = self.local_hit(tokens, extra, limit);
        let last = limit / self.ps;
        let mut out = PoolLookup {
            first_page: hit_pages,
            keys: Vec::new(),
        };
        let tier = self.pooltier.as_deref_mut().expect("checked");
        let needed = last.min(keys.len()).saturating_sub(hit_pages) * tier.prefixes.len();
        check_room("keys_out", needed, max_keys)?;
        for (j, k) in keys.iter().enumerate().take(last).skip(hit_pages) {
            for g in 0..tier.prefixes.len() {
                out.keys.push(PoolKey {
                    position: j,
                    group: g as u32,
                    key: tier.key(g, k.hash),
                });
            }
        }
        tier.stats.lookups += 1;
        tier.stats.lookup_keys += out.keys.len() as u64;
        Ok(out)
    }

    /// Pages of `tokens`' local hit (plain walk or the groups' fixed point, both tiers) and the
    /// keys of every full page up to the first placeholder.
    fn local_hit(
        &mut self,
        tokens: &[i32],
        extra: Option<&ExtraKeys>,
        limit: usize,
    ) -> (usize, Vec<PageKey>) {
        let (keys, _) = self.page_keys(tokens, extra, &[]);
        let hit = if self.plain {
            self.walk(tokens, extra, limit / self.ps, true).len()
        } else {
            let hit = self.groups_hit(&keys, tokens, limit, true, false);
            hit.groups.iter().map(Vec::len).max().unwrap_or(0)
        };
        (hit, keys)
    }

    /// How many positions from `hit_pages` the answer lets a begin load, with at most `limit`
    /// tokens matched and `keys` hashed pages. Refuses an answer of the wrong shape or without
    /// a pool tier.
    pub(crate) fn pool_run(
        &self,
        a: &PoolAnswer<'_>,
        hit_pages: usize,
        limit: usize,
        keys: usize,
    ) -> Result<usize> {
        let Some(tier) = self.pooltier.as_deref() else {
            return Err(Error::Unsupported(
                "the cache has no pool tier (Config::pool)".into(),
            ));
        };
        let ng = tier.prefixes.len();
        if !a.hits.len().is_multiple_of(ng) {
            return Err(Error::arg(
                "hits",
                format!(
                    "{} entries are not a whole number of {ng} groups",
                    a.hits.len()
                ),
            ));
        }
        if hit_pages < a.first_page {
            return Ok(0);
        }
        let max = (limit / self.ps).min(keys).saturating_sub(hit_pages);
        let run = a
            .hits
            .chunks_exact(ng)
            .skip(hit_pages - a.first_page)
            .take(max)
            .take_while(|pos| pos.iter().all(|&h| h))
            .count();
        Ok(run)
    }

    /// Queues the loads of `positions` of a sequence being begun (every
    /// group's page there is fresh) and holds each page once more. Returns its record.
    pub(crate) fn queue_loads(
        &mut self,
        id: u64,
        positions: std::ops::Range<usize>,
        tables: &[Vec<u32>],
        keys: &[PageKey],
        tokens: &[i32],
        answered: usize,
    ) -> SeqPool {
        let ps = self.ps;
        let (start, end) = (positions.start, positions.end);
        let mut tickets = Vec::with_capacity(positions.len() * tables.len());
        for j in positions {
            for (g, t) in tables.iter().enumerate() {
                let page = t[j];
                let pool = self.groups[g].pool;
                self.pools[pool].device.acquire(page, Holder::Seq);
                let tier = self.pooltier.as_deref_mut().expect("checked by pool_run");
                let ticket = tier.ticket();
                tier.pending.insert(
                    ticket,
                    Pending {
                        op: PoolOp::Load,
                        seq: Some(id),
                        position: j,
                        group: g as u32,
                        tier: Tier::Device,
                        page,
                    },
                );
                tier.queue.push_back(PoolWork {
                    ticket,
                    op: PoolOp::Load,
                    group: g as u32,
                    tier: Tier::Device,
                    page,
                    key: tier.key(g, keys[j].hash),
                    hash: keys[j].hash,
                    tokens: tokens[j * ps..(j + 1) * ps].to_vec(),
                });
                tier.stats.loads += 1;
                tickets.push(ticket);
            }
        }
        if let Some(tier) = self.pooltier.as_deref_mut() {
            tier.stats.answered_hits += answered as u64;
        }
        SeqPool {
            start,
            end,
            outstanding: tickets.len(),
            failed_from: end,
            tickets,
        }
    }

    /// Holds `page` of `group` (device or host) and stages (write-through) or queues (demotion)
    /// its store. No-op without a pool tier or when the policy does not store this way.
    pub(crate) fn pool_store(
        &mut self,
        group: usize,
        tier_of_page: Tier,
        page: u32,
        hash: u128,
        tokens: &[i32],
    ) {
        let policy = match self.pooltier.as_deref() {
            Some(t) => t.cfg.store,
            None => return,
        };
        let wanted = match tier_of_page {
            Tier::Device => StorePolicy::WriteThrough,
            Tier::Host => StorePolicy::OnDemotion,
        };
        if policy != wanted {
            return;
        }
        let pool = self.groups[group].pool;
        match tier_of_page {
            Tier::Device => self.pools[pool].device.acquire(page, Holder::Seq),
            Tier::Host => self.pools[pool].host.acquire(page, Holder::Seq),
        }
        let tier = self.pooltier.as_deref_mut().expect("checked");
        let ticket = tier.ticket();
        tier.pending.insert(
            ticket,
            Pending {
                op: PoolOp::Store,
                seq: None,
                position: 0,
                group: group as u32,
                tier: tier_of_page,
                page,
            },
        );
        let work = PoolWork {
            ticket,
            op: PoolOp::Store,
            group: group as u32,
            tier: tier_of_page,
            page,
            key: tier.key(group, hash),
            hash,
            tokens: tokens.to_vec(),
        };
        tier.stats.stores += 1;
        match tier_of_page {
            Tier::Device => tier.staged.push(work),
            Tier::Host => tier.queue.push_back(work),
        }
    }

    /// Hands the staged write-through stores out (their KV is written): part of `commit`.
    pub(crate) fn pool_release_staged(&mut self) {
        if let Some(t) = self.pooltier.as_deref_mut() {
            let staged = std::mem::take(&mut t.staged);
            t.queue.extend(staged);
        }
    }

    /// Removes and returns up to `max` queued transfers, oldest first. Loads may run at once;
    /// a store reads its page as it is now (a demoted page after its demotion copy from
    /// `take_copies` has run). Empty without a pool tier.
    pub fn take_pool_work(&mut self, max: usize) -> Vec<PoolWork> {
        match self.pooltier.as_deref_mut() {
            Some(t) => {
                let n = max.min(t.queue.len());
                t.queue.drain(..n).collect()
            }
            None => Vec::new(),
        }
    }

    /// Reports transfer `ticket` done (`ok`) or failed. Drops the page reference it held; the
    /// last load of a sequence settles it (see the module doc). An unknown ticket (never
    /// issued, reported already, or still queued) is refused and changes nothing.
    pub fn pool_done(&mut self, ticket: u64, ok: bool) -> Result<()> {
        let tier = self.tier_mut()?;
        let waiting = tier.queue.iter().chain(&tier.staged);
        if waiting.clone().any(|w| w.ticket == ticket) {
            return Err(Error::arg(
                "ticket",
                format!("{ticket} has not been handed out by take_pool_work"),
            ));
        }
        let p = tier
            .pending
            .remove(&ticket)
            .ok_or_else(|| Error::arg("ticket", format!("{ticket} is not outstanding")))?;
        match (p.op, ok) {
            (PoolOp::Load, true) => tier.stats.loads_ok += 1,
            (PoolOp::Load, false) => tier.stats.loads_failed += 1,
            (PoolOp::Store, true) => tier.stats.stores_ok += 1,
            (PoolOp::Store, false) => tier.stats.stores_failed += 1,
        }
        let pool = self.groups[p.group as usize].pool;
        match p.tier {
            Tier::Device => self.release_device(pool, p.page, Holder::Seq, Release::Free),
            Tier::Host => self.release_host(pool, p.page),
        }
        if let Some(id) = p.seq {
            self.load_reported(id, p.position, ok);
        }
        Ok(())
    }

    fn load_reported(&mut self, id: u64, position: usize, ok: bool) {
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        let Some(sp) = s.pool.as_deref_mut() else {
            return;
        };
        if !ok {
            sp.failed_from = sp.failed_from.min(position);
        }
        sp.outstanding -= 1;
        if sp.outstanding > 0 {
            return;
        }
        // Settled: the match ends at the first failed position.
        let ps = self.ps;
        sp.end = sp.failed_from;
        sp.tickets = Vec::new();
        let served = (sp.end - sp.start) * ps;
        let end_tokens = sp.end * ps;
        s.matched_tokens = s.matched_tokens.min(end_tokens);
        s.cached_tokens = s.cached_tokens.min(end_tokens);
        if let Some(t) = self.pooltier.as_deref_mut() {
            t.stats.hit_tokens += served as u64;
        }
        self.register_full_pages(id);
    }

    /// A sequence being freed with loads outstanding: those loads keep their page references
    /// until reported, and report to nobody.
    pub(crate) fn pool_orphan(&mut self, tickets: &[u64]) {
        if let Some(t) = self.pooltier.as_deref_mut() {
            for tk in tickets {
                if let Some(p) = t.pending.get_mut(tk) {
                    p.seq = None;
                }
            }
        }
    }

    /// Loads of sequence `id` not reported yet (the engine runs it only at 0).
    pub fn pool_loading(&self, id: u64) -> Result<usize> {
        let s = self.seq(id)?;
        Ok(s.pool.as_ref().map_or(0, |p| p.outstanding))
    }

    /// Refuses an operation that copies or shares a sequence's pages while it loads.
    pub(crate) fn check_not_loading(&self, id: u64) -> Result<()> {
        let n = self.pool_loading(id)?;
        if n > 0 {
            return Err(Error::arg(
                "seq_id",
                format!("sequence {id} waits for {n} loads from the pool"),
            ));
        }
        Ok(())
    }

    /// Pool-tier counters; None without a pool tier.
    pub fn pool_stats(&self) -> Option<PoolStats> {
        self.pooltier.as_deref().map(|t| PoolStats {
            pending: t.pending.len() as u64,
            queued: t.queue.len() as u64,
            ..t.stats
        })
    }

    /// The page references outstanding transfers hold, as `(tier, group, page)` (the checker).
    pub(crate) fn pool_holds(&self) -> Vec<(Tier, u32, u32)> {
        self.pooltier.as_deref().map_or(Vec::new(), |t| {
            t.pending
                .values()
                .map(|p| (p.tier, p.group, p.page))
                .collect()
        })
    }
}
