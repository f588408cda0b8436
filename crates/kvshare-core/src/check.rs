//! The invariant checker behind `kvs_cache_check`: recomputes every derived fact from first
//! principles and reports the first disagreement.

use super::alloc::try_vec;
use super::config::Tier;
use super::error::{Error, Result};
use super::pool::{PagePool, PageState};
use super::state::State;

fn violation(msg: String) -> Result<()> {
    Err(Error::InvariantViolation(msg))
}

impl State {
    /// Verifies: refcount = sequence + external + pin holders for every page; each page is on
    /// exactly the list its state says (free / the cached list of its priority / none when in
    /// use); cached ⇔ registered for unreferenced pages; list lengths and counters agree with a
    /// full recount; free + cached + in use = usable pages; every index entry (both tiers) points
    /// at a page registered under that digest; every sequence's pages are valid and cover its
    /// tokens; pins hold what the pin table says.
    pub fn check(&self) -> Result<()> {
        let ps = self.page_size;
        let mut holders = [
            try_vec(self.device.num_pages() as usize, 0u32, "num_device_pages")?,
            try_vec(self.host.num_pages() as usize, 0u32, "num_host_pages")?,
        ];
        for (&id, s) in &self.seqs {
            let t = usize::from(s.tier == Tier::Host);
            let pool = self.pool(s.tier);
            if s.pages.len() < s.tokens.len().div_ceil(ps) {
                return violation(format!(
                    "sequence {id}: {} pages cannot hold {} tokens",
                    s.pages.len(),
                    s.tokens.len()
                ));
            }
            if s.hashes.len() > s.tokens.len() / ps {
                return violation(format!("sequence {id}: more page digests than full pages"));
            }
            for &p in &s.pages {
                if pool.check_id(p).is_err() {
                    return violation(format!("sequence {id}: bad {} page id {p}", s.tier));
                }
                holders[t][p as usize] += 1;
            }
        }
        // A queued unit-hit copy holds its source page until taken.
        for q in &self.copies {
            if q.holds_src {
                let t = usize::from(q.copy.kind == super::seq::CopyKind::HostToDevice);
                let pool = [&self.device, &self.host][t];
                if pool.check_id(q.copy.src_page).is_err() {
                    return violation(format!("queued copy: bad source page {}", q.copy.src_page));
                }
                holders[t][q.copy.src_page as usize] += 1;
            }
        }
        let mut pins = try_vec(self.device.num_pages() as usize, 0u32, "num_device_pages")?;
        for (&id, pages) in &self.pins {
            for &p in pages {
                if self.device.check_id(p).is_err() {
                    return violation(format!("pin {id}: bad page id {p}"));
                }
                pins[p as usize] += 1;
            }
        }
        for p in 0..self.device.num_pages() {
            if self.device.pins(p) != pins[p as usize] {
                return violation(format!(
                    "device page {p}: {} pins recorded, {} in the pin table",
                    self.device.pins(p),
                    pins[p as usize]
                ));
            }
        }
        self.check_pool(&self.device, &holders[0])?;
        self.check_pool(&self.host, &holders[1])?;

        for (tier, ix, pool) in [
            (Tier::Device, &self.index, &self.device),
            (Tier::Host, &self.host_index, &self.host),
        ] {
            for (h, p) in ix.entries() {
                if pool.check_id(p).is_err() || ix.hash_of(p) != Some(h) {
                    return violation(format!("{tier} index entry {h:032x} points at page {p}, which is not registered under it"));
                }
            }
            if let Some((g, p)) = ix.stray_unit_key() {
                return violation(format!(
                    "{tier} unit key {g:032x} and page {p} disagree (a listed page without that unit prefix, broken links, or a registered page's key left out)"
                ));
            }
            if ix.registered_count() != ix.len() + ix.partial_len() {
                return violation(format!(
                    "{tier}: {} pages flagged registered but the index has {} entries and {} partial ones",
                    ix.registered_count(),
                    ix.len(),
                    ix.partial_len()
                ));
            }
        }
        if !self.cfg.enable_prefix_caching && !self.index.is_empty() {
            return violation("prefix caching is off but the index has entries".into());
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

    fn check_pool(&self, pool: &PagePool, seq_holders: &[u32]) -> Result<()> {
        let tier = pool.tier();
        let Some((free, cached)) = pool.lists() else {
            return violation(format!("{tier} page lists are corrupt"));
        };
        // 0: on no list; 1: free; 2 + k: cached list k. Any page seen twice is an error.
        let mut on = try_vec(pool.num_pages() as usize, 0u8, "num_pages")?;
        let mut mark = |p: u32, m: u8| -> Result<()> {
            if on[p as usize] != 0 {
                return violation(format!("{tier} page {p} is on two lists"));
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
        let (mut n_in_use, mut n_shared, mut n_pinned) = (0usize, 0usize, 0usize);
        for p in 0..pool.num_pages() {
            let i = p as usize;
            let rc = pool.refcount(p);
            let registered = self.is_registered_in(tier, p);
            if Some(p) == pool.padding() {
                if rc != 0 || on[i] != 0 || registered || seq_holders[i] != 0 {
                    return violation(format!("padding page {p} is in use, listed or registered"));
                }
                continue;
            }
            let expect = seq_holders[i] + pool.ext_refs(p) + pool.pins(p);
            if rc != expect {
                return violation(format!(
                    "{tier} page {p}: refcount {rc} but {} sequence + {} external + {} pin holders",
                    seq_holders[i],
                    pool.ext_refs(p),
                    pool.pins(p)
                ));
            }
            let state = pool.state(p);
            match (rc, on[i]) {
                (0, 1) if !registered && state == PageState::Free => {}
                (0, m) if m >= 2 && registered && state == PageState::Cached => {
                    let k = m - 2;
                    if pool.cached_list(p) != Some(k) || pool.priority(p) != k {
                        return violation(format!("{tier} page {p}: on cached list {k} but priority {}", pool.priority(p)));
                    }
                }
                (0, _) => {
                    return violation(format!(
                        "{tier} page {p}: unreferenced, registered={registered}, list mark {}, state {state:?}",
                        on[i]
                    ))
                }
                (_, 0) if state == PageState::InUse => {
                    n_in_use += 1;
                    n_shared += usize::from(rc > 1);
                    n_pinned += usize::from(pool.pins(p) > 0);
                }
                _ => return violation(format!("{tier} page {p}: refcount {rc} but on a list (mark {})", on[i])),
            }
        }
        if n_in_use != pool.num_in_use()
            || n_shared != pool.num_shared()
            || n_pinned != pool.num_pinned()
        {
            return violation(format!(
                "{tier} counters: in use/shared/pinned {}/{}/{} recorded, {n_in_use}/{n_shared}/{n_pinned} counted",
                pool.num_in_use(),
                pool.num_shared(),
                pool.num_pinned()
            ));
        }
        let n_cached: usize = cached.iter().map(Vec::len).sum();
        let usable = self.cfg.usable_pages(tier) as usize;
        if free.len() + n_cached + n_in_use != usable {
            return violation(format!(
                "{tier}: free {} + cached {n_cached} + in use {n_in_use} != usable {usable}",
                free.len()
            ));
        }
        if free.len() != pool.num_free() || n_cached != pool.num_cached() {
            return violation(format!(
                "{tier}: list length counters disagree with the lists"
            ));
        }
        Ok(())
    }
}
