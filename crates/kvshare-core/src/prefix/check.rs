//! Reads of [`PrefixIndex`] for the invariant checker: unit lists and child counts that
//! disagree with the pages.

use super::*;

impl PrefixIndex {
    /// The first unit key whose list disagrees with the pages (a listed page that is not
    /// registered or does not hold that key, links that do not pair up, a list end that is not
    /// its end), or the first key of a registered page that is in no list, as `(key, page)`,
    /// for the invariant checker.
    pub fn stray_unit_key(&self) -> Option<(u128, u32)> {
        let mut scratch = Vec::new();
        let keys_of = |p: u32, scratch: &mut Vec<u8>| {
            let m = &self.meta[p as usize];
            let mut keys = Vec::new();
            unit_keys(
                m.parent,
                m.extra,
                self.page_tokens(p),
                self.unit,
                (self.page_size / self.unit - 1).min(m.len as usize / self.unit),
                scratch,
                &mut keys,
            );
            for k in &mut keys {
                *k = Self::key(m.group, *k);
            }
            keys
        };
        let mut linked = 0usize;
        for (&g, list) in &self.units {
            let k = list.k as usize;
            let (mut prev, mut page) = (NONE, list.first);
            while page != NONE {
                let ok = (page as usize) < self.num_pages
                    && self.registered[page as usize]
                    && keys_of(page, &mut scratch).get(k - 1) == Some(&g)
                    && self.unit_prev[self.node(k, page)] == prev;
                if !ok || linked > self.unit_next.len() {
                    return Some((g, page));
                }
                linked += 1;
                prev = page;
                page = self.unit_next[self.node(k, page)];
            }
            if prev != list.last {
                return Some((g, list.last));
            }
        }
        for p in (0..self.num_pages as u32).filter(|&p| self.registered[p as usize]) {
            for (i, g) in keys_of(p, &mut scratch).into_iter().enumerate() {
                if self.unit_prev[self.node(i + 1, p)] == UNLINKED {
                    return Some((g, p));
                }
            }
        }
        None
    }

    /// The first `(key, counted, actual)` whose child count disagrees with a recount of the
    /// registered entries of chained groups by parent digest: a registered full page's count,
    /// or the orphans' count of a digest no page holds, for the invariant checker.
    pub fn stray_child_count(&self) -> Option<(u128, u32, u32)> {
        let mut count: DigestMap<u32> = DigestMap::default();
        for p in (0..self.num_pages).filter(|&p| self.registered[p]) {
            let m = &self.meta[p];
            if self.is_chained(m.group) {
                *count.entry(Self::key(m.group, m.parent)).or_insert(0) += 1;
            }
        }
        for p in (0..self.num_pages).filter(|&p| self.registered[p]) {
            let m = &self.meta[p];
            let key = Self::key(m.group, m.hash);
            let want = if self.is_chained(m.group) && !self.is_partial(p as u32) {
                count.remove(&key).unwrap_or(0)
            } else {
                0
            };
            if self.links[p].kids != want {
                return Some((key, self.links[p].kids, want));
            }
        }
        if let Some((&k, &n)) = self.orphans.iter().find(|(k, n)| count.get(k) != Some(n)) {
            return Some((k, n, count.get(&k).copied().unwrap_or(0)));
        }
        count
            .iter()
            .find(|(k, _)| !self.orphans.contains_key(k))
            .map(|(&k, &n)| (k, 0, n))
    }
}
