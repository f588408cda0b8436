//! The unit index of [`PrefixIndex`]: each registered page's unit keys (its first `k` units
//! under its parent, for hits shorter than a page), the per-key lists linked through the pages,
//! and the longest unit prefix lookup.

use super::*;

impl PrefixIndex {
    /// The slot of page `page`'s key-`k` node (`k` 1-based) in the link arrays.
    pub(super) fn node(&self, k: usize, page: u32) -> usize {
        (k - 1) * self.num_pages + page as usize
    }

    /// Appends registered page `page` to the list of each of its unit keys.
    pub(super) fn link_units(&mut self, page: u32) {
        for (i, g) in self.own_unit_keys(page).into_iter().enumerate() {
            let k = i + 1;
            let node = self.node(k, page);
            match self.units.entry(g) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(UnitList {
                        first: page,
                        last: page,
                        k: k as u32,
                    });
                    self.unit_prev[node] = NONE;
                    self.unit_next[node] = NONE;
                }
                // Keys of different lengths never collide but for a 128-bit digest collision;
                // then the page is left out of that list (it is only missed, never wrong).
                std::collections::hash_map::Entry::Occupied(mut o) if o.get().k == k as u32 => {
                    let list = o.get_mut();
                    let tail = (k - 1) * self.num_pages + list.last as usize;
                    self.unit_next[tail] = page;
                    self.unit_prev[node] = list.last;
                    self.unit_next[node] = NONE;
                    list.last = page;
                }
                std::collections::hash_map::Entry::Occupied(_) => {}
            }
        }
    }

    /// Takes registered page `page` out of the list of each of its unit keys.
    pub(super) fn unlink_units(&mut self, page: u32) {
        for (i, g) in self.own_unit_keys(page).into_iter().enumerate() {
            let node = self.node(i + 1, page);
            let (prev, next) = (self.unit_prev[node], self.unit_next[node]);
            if prev == UNLINKED {
                continue;
            }
            let base = i * self.num_pages;
            let std::collections::hash_map::Entry::Occupied(mut o) = self.units.entry(g) else {
                debug_assert!(false, "a linked node's key is listed");
                continue;
            };
            let list = o.get_mut();
            if prev == NONE {
                list.first = next;
            } else {
                self.unit_next[base + prev as usize] = next;
            }
            if next == NONE {
                list.last = prev;
            } else {
                self.unit_prev[base + next as usize] = prev;
            }
            if list.first == NONE {
                o.remove();
            }
            self.unit_prev[node] = UNLINKED;
            self.unit_next[node] = NONE;
        }
    }

    /// Unit keys `g_1 .. g_k` of registered page `page`: every proper unit prefix of a full
    /// page, every unit of a partial entry; recomputed from its stored entry.
    pub(super) fn own_unit_keys(&mut self, page: u32) -> Vec<u128> {
        let m = self.meta[page as usize];
        let n = (self.page_size / self.unit - 1).min(m.len as usize / self.unit);
        let mut keys = Vec::new();
        if n == 0 {
            return keys;
        }
        let s = page as usize * self.page_size;
        let tokens = &self.tokens[s..s + self.page_size];
        unit_keys(
            m.parent,
            m.extra,
            tokens,
            self.unit,
            n,
            &mut self.scratch,
            &mut keys,
        );
        for k in &mut keys {
            *k = Self::key(m.group, *k);
        }
        keys
    }

    /// The longest unit prefix of `tokens` (the query's tokens of one page, up to a page; fewer
    /// than a page is fine) cached in a page that `accept` takes, whose parent digest is
    /// `parent` and extra digest is `extra`, limited to fewer than a whole page. `None` when not
    /// even one unit matches or the unit is the page size.
    pub fn lookup_units(
        &self,
        group: u32,
        parent: u128,
        extra: u128,
        tokens: &[i32],
        scratch: &mut Vec<u8>,
        accept: impl Fn(u32) -> bool,
    ) -> Option<UnitHit> {
        let n = (self.page_size / self.unit - 1).min(tokens.len() / self.unit);
        if n == 0 || self.units.is_empty() {
            return None;
        }
        let mut keys = Vec::with_capacity(n);
        unit_keys(parent, extra, tokens, self.unit, n, scratch, &mut keys);
        keys.iter().enumerate().rev().find_map(|(i, g)| {
            let list = self.units.get(&Self::key(group, *g))?;
            let k = i + 1;
            if list.k as usize != k {
                return None;
            }
            let len = k * self.unit;
            let mut page = list.first;
            while page != NONE {
                let m = &self.meta[page as usize];
                let s = page as usize * self.page_size;
                let ok = self.registered[page as usize]
                    && len <= m.len as usize
                    && m.parent == parent
                    && m.extra == extra
                    && m.group == group
                    && self.tokens[s..s + len] == tokens[..len]
                    && accept(page);
                if ok {
                    return Some(UnitHit { page, tokens: len });
                }
                page = self.unit_next[self.node(k, page)];
            }
            None
        })
    }
}
