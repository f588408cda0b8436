//! The invariant checker behind `kvs_cache_check`: recomputes every derived fact from first
//! principles and reports the first disagreement.

use super::alloc::try_vec;
use super::config::{GroupKind, StateMode};
use super::copies::CopyKind;
use super::error::{Error, Result};
use super::pool::{PagePool, PageState};
use super::prefix::PrefixIndex;
use super::seq::{Seq, HOST_NULL};
use super::state::{State, NULL_PAGE};
use super::tier::Tier;

fn violation(msg: String) -> Result<()> {
    Err(Error::InvariantViolation(msg))
}

/// No group holds the page.
const NO_GROUP: u32 = u32::MAX;

/// Per tier (device, host) and pool: sequence holders of each page, and the group whose tables
/// hold it.
struct Holders {
    count: [Vec<Vec<u32>>; 2],
    owner: [Vec<Vec<u32>>; 2],
}

impl State {
    /// Verifies: every sequence has one table per group, all as long, covering its tokens;
    /// released (null) positions only where the group's kind releases (a prefix for windows,
    /// chunks and "all" states; an "align" state group's last position and at most one more
    /// live; a "none" state group exactly one page, at the last position); a page of either tier
    /// is held by the tables of one group only and registered for that group; a held registered
    /// page carries the digest of its position; refcount = sequence + external + pin holders
    /// for every page; each page is on exactly the list its state says (free / the evictable set
    /// of its priority: the eviction policy's structures or its held parents / none when in
    /// use); the policy's own bookkeeping agrees with its structures; a held-back parent has a
    /// registered child in its tier's index; cached ⇔ registered for unreferenced pages (vLLM's
    /// reuse order also parks pages without content behind the cached ones); list lengths and
    /// counters agree with a full recount; free + cached + in use = usable pages; every index
    /// entry (both tiers) points at a page registered under that digest, and the child counts
    /// of both indices agree with a recount of their entries; duplicates are listed both ways
    /// under a registered digest; pins hold what the pin table says.
    pub fn check(&self) -> Result<()> {
        let np = self.pools.len();
        let mut h = Holders {
            count: [Vec::with_capacity(np), Vec::with_capacity(np)],
            owner: [Vec::with_capacity(np), Vec::with_capacity(np)],
        };
        for p in &self.pools {
            h.count[0].push(try_vec(
                p.device.num_pages() as usize,
                0u32,
                "num_device_pages",
            )?);
            h.count[1].push(try_vec(
                p.host.num_pages() as usize,
                0u32,
                "num_host_pages",
            )?);
            h.owner[0].push(try_vec(
                p.device.num_pages() as usize,
                NO_GROUP,
                "num_device_pages",
            )?);
            h.owner[1].push(try_vec(
                p.host.num_pages() as usize,
                NO_GROUP,
                "num_host_pages",
            )?);
        }
        for (&id, s) in &self.seqs {
            self.check_seq(id, s, &mut h)?;
        }
        // A queued unit-hit copy holds its source page until taken.
        for q in &self.copies {
            if q.holds_src {
                let pool = self.groups[q.copy.group as usize].pool;
                let t = usize::from(q.copy.kind == CopyKind::HostToDevice);
                let pp = [&self.pools[pool].device, &self.pools[pool].host][t];
                if pp.check_id(q.copy.src_page).is_err() {
                    return violation(format!("queued copy: bad source page {}", q.copy.src_page));
                }
                h.count[t][pool][q.copy.src_page as usize] += 1;
            }
        }
        // An outstanding pool transfer holds its page until reported.
        for (tier, g, page) in self.pool_holds() {
            let pool = self.groups[g as usize].pool;
            let t = usize::from(tier == Tier::Host);
            let pp = [&self.pools[pool].device, &self.pools[pool].host][t];
            if pp.check_id(page).is_err() {
                return violation(format!("pool transfer: bad page {page}"));
            }
            h.count[t][pool][page as usize] += 1;
        }
        let mut pins: Vec<Vec<u32>> = Vec::with_capacity(np);
        for p in &self.pools {
            pins.push(try_vec(
                p.device.num_pages() as usize,
                0u32,
                "num_device_pages",
            )?);
        }
        for (&id, pages) in &self.pins {
            for &(g, p) in pages {
                let Some(grp) = self.groups.get(g as usize) else {
                    return violation(format!("pin {id}: bad group {g}"));
                };
                if self.pools[grp.pool].device.check_id(p).is_err() {
                    return violation(format!("pin {id}: bad page id {p}"));
                }
                pins[grp.pool][p as usize] += 1;
            }
        }
        for (pi, pool) in self.pools.iter().enumerate() {
            for p in 0..pool.device.num_pages() {
                if pool.device.pins(p) != pins[pi][p as usize] {
                    return violation(format!(
                        "pool {pi} device page {p}: {} pins recorded, {} in the pin table",
                        pool.device.pins(p),
                        pins[pi][p as usize]
                    ));
                }
            }
            self.check_pool(pi, &pool.device, &h.count[0][pi])?;
            self.check_pool(pi, &pool.host, &h.count[1][pi])?;
            self.check_indices(pi, [&h.owner[0][pi], &h.owner[1][pi]])?;
        }
        // The commit queue may hold ids of sequences freed (or freed and reused) since; what must
        // hold is that every sequence flagged pending is queued.
        for (&id, s) in &self.seqs {
            if s.pending && !self.uncommitted.contains(&id) {
                return violation(format!(
                    "sequence {id} is flagged pending but not queued for commit"
                ));
            }
        }
        Ok(())
    }

    fn check_seq(&self, id: u64, s: &Seq, h: &mut Holders) -> Result<()> {
        let ps = self.ps;
        let ng = self.groups.len();
        if s.tables.len() != ng
            || s.offered.len() != ng
            || s.grow.len() != ng
            || s.borrowed.len() != ng
        {
            return violation(format!(
                "sequence {id}: per-group records of the wrong count"
            ));
        }
        let len = s.len();
        if len < s.tokens.len().div_ceil(ps) {
            return violation(format!(
                "sequence {id}: {len} pages cannot hold {} tokens",
                s.tokens.len()
            ));
        }
        if s.keys.len() > s.tokens.len() / ps {
            return violation(format!("sequence {id}: more page digests than full pages"));
        }
        let t_ix = usize::from(s.tier == Tier::Host);
        for (g, t) in s.tables.iter().enumerate() {
            if t.len() != len {
                return violation(format!(
                    "sequence {id}: group {g} has {} pages, group 0 {len}",
                    t.len()
                ));
            }
            let pool = self.groups[g].pool;
            let null = |p: u32| match s.tier {
                Tier::Device => self.is_null(p),
                Tier::Host => p == HOST_NULL,
            };
            let nulls = t.iter().take_while(|&&p| null(p)).count();
            let live = t.iter().filter(|&&p| !null(p)).count();
            match self.groups[g].kind {
                GroupKind::Full if nulls > 0 || live != t.len() => {
                    return violation(format!(
                        "sequence {id}: full-attention group {g} holds a released position"
                    ));
                }
                // The running state at the end, and at most the previous step's page.
                GroupKind::State(StateMode::Align)
                    if live > 2 || t.last().is_some_and(|&p| null(p) && live > 0) =>
                {
                    return violation(format!(
                        "sequence {id}: state group {g} (mode align) holds {live} pages, not the last one and at most one more"
                    ));
                }
                GroupKind::State(StateMode::Align) => {}
                GroupKind::State(StateMode::None) if !t.is_empty() && nulls + 1 != t.len() => {
                    return violation(format!(
                        "sequence {id}: state group {g} (mode none) holds {live} pages, not one at the end"
                    ));
                }
                _ if t[nulls..].iter().any(|&p| null(p)) => {
                    return violation(format!(
                        "sequence {id}: group {g} has a released position after a live one"
                    ));
                }
                _ => {}
            }
            let pp = [&self.pools[pool].device, &self.pools[pool].host][t_ix];
            for (j, &p) in t.iter().enumerate() {
                if null(p) {
                    continue;
                }
                if pp.check_id(p).is_err() {
                    return violation(format!(
                        "sequence {id}: group {g}: bad {} page id {p}",
                        s.tier
                    ));
                }
                h.count[t_ix][pool][p as usize] += 1;
                let o = &mut h.owner[t_ix][pool][p as usize];
                if *o != NO_GROUP && *o != g as u32 {
                    return violation(format!(
                        "{} page {p} of pool {pool} held by groups {o} and {g}",
                        s.tier
                    ));
                }
                *o = g as u32;
                if s.tier == Tier::Host || !self.cfg.enable_prefix_caching {
                    continue;
                }
                let pl = &self.pools[pool];
                let digest = match (pl.index.hash_of(p), pl.dup_of[p as usize]) {
                    (Some(hash), _) => Some((pl.index.group_of(p), hash)),
                    (None, d) => d,
                };
                if let (Some((dg, hash)), Some(k)) = (digest, s.keys.get(j)) {
                    if dg != g as u32 || hash != k.hash {
                        return violation(format!(
                            "sequence {id}: group {g} page {p} at {j} is registered under another group or digest"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn check_indices(&self, pi: usize, owner: [&[u32]; 2]) -> Result<()> {
        let pool = &self.pools[pi];
        for (tier, ix, pp) in [
            (Tier::Device, &pool.index, &pool.device),
            (Tier::Host, &pool.host_index, &pool.host),
        ] {
            if !self.cfg.enable_prefix_caching && !ix.is_empty() {
                return violation(format!(
                    "prefix caching is off but the {tier} index has entries"
                ));
            }
            for (g, hash, p) in ix.entries() {
                if pp.check_id(p).is_err() || ix.hash_of(p) != Some(hash) || ix.group_of(p) != g {
                    return violation(format!("pool {pi} {tier} index entry {hash:032x} of group {g} points at page {p}, which is not registered under it"));
                }
                if self.groups.get(g as usize).is_none_or(|grp| grp.pool != pi) {
                    return violation(format!(
                        "pool {pi} {tier} index entry {hash:032x}: group {g} is not a group of the pool"
                    ));
                }
                let o = owner[usize::from(tier == Tier::Host)][p as usize];
                if o != NO_GROUP && o != g {
                    return violation(format!(
                        "pool {pi}: {tier} page {p} registered for group {g} is held by group {o}"
                    ));
                }
            }
            if let Some((key, counted, actual)) = ix.stray_child_count() {
                return violation(format!(
                    "pool {pi} {tier} index: parent key {key:032x} counts {counted} children but {actual} entries hang off it"
                ));
            }
            if let Some((g, p)) = ix.stray_unit_key() {
                return violation(format!(
                    "pool {pi} {tier} unit key {g:032x} and page {p} disagree (a listed page without that unit prefix, broken links, or a registered page's key left out)"
                ));
            }
            if ix.registered_count() != ix.len() + ix.partial_len() {
                return violation(format!(
                    "pool {pi} {tier}: {} pages flagged registered but the index has {} entries and {} partial ones",
                    ix.registered_count(),
                    ix.len(),
                    ix.partial_len()
                ));
            }
        }
        for (&key, pages) in &pool.dups {
            if pages.is_empty() {
                return violation(format!("pool {pi}: an empty duplicate list"));
            }
            for &p in pages {
                let Some((g, hash)) = pool.dup_of[p as usize] else {
                    return violation(format!("pool {pi}: duplicate page {p} is not marked"));
                };
                if PrefixIndex::key(g, hash) != key
                    || pool.index.is_registered(p)
                    || pool.index.find(g, hash).is_none()
                {
                    return violation(format!(
                        "pool {pi}: duplicate page {p} is not recorded as one of a registered page"
                    ));
                }
            }
        }
        for (p, m) in pool.dup_of.iter().enumerate() {
            if let Some((g, hash)) = *m {
                let listed = pool
                    .dups
                    .get(&PrefixIndex::key(g, hash))
                    .is_some_and(|l| l.contains(&(p as u32)));
                if !listed {
                    return violation(format!(
                        "pool {pi}: page {p} marked a duplicate of group {g} but not listed"
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_pool(&self, pi: usize, pool: &PagePool, seq_holders: &[u32]) -> Result<()> {
        let tier = pool.tier();
        let Some((free, cached)) = pool.lists() else {
            return violation(format!("pool {pi} {tier} page lists are corrupt"));
        };
        if let Err(e) = pool.check_policy() {
            return violation(format!(
                "pool {pi} {tier} eviction policy {:?}: {e}",
                pool.policy()
            ));
        }
        let index = match tier {
            Tier::Device => &self.pools[pi].index,
            Tier::Host => &self.pools[pi].host_index,
        };
        // 0: on no list; 1: free; 2 + k: cached list k. Any page seen twice is an error.
        let mut on = try_vec(pool.num_pages() as usize, 0u8, "num_pages")?;
        let mut mark = |p: u32, m: u8| -> Result<()> {
            if on[p as usize] != 0 {
                return violation(format!("pool {pi} {tier} page {p} is on two lists"));
            }
            on[p as usize] = m;
            Ok(())
        };
        for &p in &free {
            mark(p, 1)?;
        }
        for (k, list) in cached.iter().enumerate() {
            for &p in list {
                mark(p, 2 + k as u8)?;
            }
        }
        let parked = self.cfg.vllm_free_order && tier == Tier::Device;
        let (mut n_in_use, mut n_shared, mut n_pinned) = (0usize, 0usize, 0usize);
        let refs: u64 = (0..pool.num_pages())
            .map(|p| u64::from(pool.refcount(p)))
            .sum();
        if refs != pool.num_refs() {
            return violation(format!(
                "pool {pi} {tier}: references {} recorded, {refs} counted",
                pool.num_refs()
            ));
        }
        for p in 0..pool.num_pages() {
            let i = p as usize;
            let rc = pool.refcount(p);
            let registered = self.is_registered_in(pi, tier, p);
            if Some(p) == pool.padding() {
                if p != NULL_PAGE || rc != 0 || on[i] != 0 || registered || seq_holders[i] != 0 {
                    return violation(format!(
                        "pool {pi}: padding page {p} is in use, listed or registered"
                    ));
                }
                continue;
            }
            let expect = seq_holders[i] + pool.ext_refs(p) + pool.pins(p);
            if rc != expect {
                return violation(format!(
                    "pool {pi} {tier} page {p}: refcount {rc} but {} sequence + {} external + {} pin holders",
                    seq_holders[i],
                    pool.ext_refs(p),
                    pool.pins(p)
                ));
            }
            let state = pool.state(p);
            match (rc, on[i]) {
                (0, 1) if !registered && state == PageState::Free => {}
                (0, m) if m >= 2 && (registered || parked) && state == PageState::Cached => {
                    let k = m - 2;
                    if pool.cached_list(p) != Some(k) || pool.priority(p) != k {
                        return violation(format!(
                            "pool {pi} {tier} page {p}: on cached list {k} but priority {}",
                            pool.priority(p)
                        ));
                    }
                    if pool.is_held(p) && !index.has_child(p) {
                        return violation(format!(
                            "pool {pi} {tier} page {p}: held back as a parent but has no registered child"
                        ));
                    }
                }
                (0, _) => {
                    return violation(format!(
                        "pool {pi} {tier} page {p}: unreferenced, registered={registered}, list mark {}, state {state:?}",
                        on[i]
                    ))
                }
                (_, 0) if state == PageState::InUse => {
                    n_in_use += 1;
                    n_shared += usize::from(rc > 1);
                    n_pinned += usize::from(pool.pins(p) > 0);
                }
                _ => {
                    return violation(format!(
                        "pool {pi} {tier} page {p}: refcount {rc} but on a list (mark {})",
                        on[i]
                    ))
                }
            }
        }
        if n_in_use != pool.num_in_use()
            || n_shared != pool.num_shared()
            || n_pinned != pool.num_pinned()
        {
            return violation(format!(
                "pool {pi} {tier} counters: in use/shared/pinned {}/{}/{} recorded, {n_in_use}/{n_shared}/{n_pinned} counted",
                pool.num_in_use(),
                pool.num_shared(),
                pool.num_pinned()
            ));
        }
        let n_cached: usize = cached.iter().map(Vec::len).sum();
        let usable = self.cfg.usable_pages(tier) as usize;
        if free.len() + n_cached + n_in_use != usable {
            return violation(format!(
                "pool {pi} {tier}: free {} + cached {n_cached} + in use {n_in_use} != usable {usable}",
                free.len()
            ));
        }
        if free.len() != pool.num_free() || n_cached != pool.num_cached() {
            return violation(format!(
                "pool {pi} {tier}: list length counters disagree with the lists"
            ));
        }
        Ok(())
    }
}
