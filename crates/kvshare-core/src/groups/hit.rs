//! The longest prefix hit across groups: vLLM 0.23's `HybridKVCacheCoordinator`
//! `find_longest_cache_hit` (an iteration to a fixed point) over each attention kind's
//! `find_longest_cache_hit`, with one page size and no EAGLE. Read-only.
//!
//! A hit of N tokens needs every full-attention page of the first N tokens, for a sliding
//! window W the `cdiv(W - 1, page_size)` pages before N, and for chunked local attention the
//! pages of N's chunk before N, and for a state group the checkpoint at exactly N; the longest
//! N every group accepts wins.

use super::hybrid::{Hybrid, PageKey, NULL_PAGE};
use super::spec::{GroupKind, StateMode};

/// Pages per member group of a lookup set: `[member][position]`.
type SetPages = Vec<Vec<u32>>;

impl Hybrid {
    /// Page `j` in every group of `set`, or `None` when some group lacks it (vLLM's
    /// `get_cached_block(hash, group_ids)`).
    fn lookup_set(
        &self,
        set: &[usize],
        keys: &[PageKey],
        tokens: &[i32],
        j: usize,
    ) -> Option<Vec<u32>> {
        let k = keys.get(j)?;
        let chunk = &tokens[j * self.ps..(j + 1) * self.ps];
        set.iter()
            .map(|&g| self.indices[g].lookup(k.hash, k.extra, chunk))
            .collect()
    }

    /// `FullAttentionManager.find_longest_cache_hit`: cached pages from the first on.
    fn hit_full(
        &self,
        set: &[usize],
        keys: &[PageKey],
        tokens: &[i32],
        max_len: usize,
    ) -> SetPages {
        let mut out = vec![Vec::new(); set.len()];
        for j in 0..max_len / self.ps {
            let Some(pages) = self.lookup_set(set, keys, tokens, j) else {
                break;
            };
            for (o, p) in out.iter_mut().zip(pages) {
                o.push(p);
            }
        }
        out
    }

    /// `SlidingWindowManager.find_longest_cache_hit`: the rightmost run of
    /// `cdiv(window - 1, page_size)` cached pages ending at or before `max_len`; null before it.
    /// Without such a run, the run starting at page 0 (shorter than the window).
    fn hit_window(
        &self,
        set: &[usize],
        keys: &[PageKey],
        tokens: &[i32],
        max_len: usize,
        window: u32,
    ) -> SetPages {
        let need = (window as usize - 1).div_ceil(self.ps);
        let max_blocks = max_len / self.ps;
        let mut out = vec![vec![NULL_PAGE; max_blocks]; set.len()];
        let mut run = 0;
        for i in (0..max_blocks).rev() {
            match self.lookup_set(set, keys, tokens, i) {
                Some(pages) => {
                    for (o, p) in out.iter_mut().zip(pages) {
                        o[i] = p;
                    }
                    run += 1;
                    if run >= need {
                        for o in &mut out {
                            o.truncate(i + run);
                        }
                        return out;
                    }
                }
                None => run = 0,
            }
        }
        for o in &mut out {
            o.truncate(run);
        }
        out
    }

    /// `ChunkedLocalAttentionManager.find_longest_cache_hit`: pages before the chunk holding
    /// `max_len` are null (computed and out of reach); cached pages from the chunk start on.
    fn hit_chunk(
        &self,
        set: &[usize],
        keys: &[PageKey],
        tokens: &[i32],
        max_len: usize,
        chunk: u32,
    ) -> SetPages {
        let c = chunk as usize;
        let start = max_len / c * c / self.ps;
        let mut out = vec![vec![NULL_PAGE; start]; set.len()];
        for j in start..max_len / self.ps {
            let Some(pages) = self.lookup_set(set, keys, tokens, j) else {
                break;
            };
            for (o, p) in out.iter_mut().zip(pages) {
                o.push(p);
            }
        }
        out
    }

    /// `MambaManager.find_longest_cache_hit`: the rightmost page `j` cached in every group of
    /// the set with `(j + 1) * page_size <= max_len` (one page size, so vLLM's alignment test
    /// always passes); null before it. A "none" group never caches, so it never hits.
    fn hit_state(
        &self,
        set: &[usize],
        keys: &[PageKey],
        tokens: &[i32],
        max_len: usize,
        mode: StateMode,
    ) -> SetPages {
        let mut out = vec![Vec::new(); set.len()];
        if mode == StateMode::None {
            return out;
        }
        for i in (0..max_len / self.ps).rev() {
            if let Some(pages) = self.lookup_set(set, keys, tokens, i) {
                for (o, p) in out.iter_mut().zip(pages) {
                    o.resize(i, NULL_PAGE);
                    o.push(p);
                }
                break;
            }
        }
        out
    }

    /// The fixed point: each lookup set (full attention first) accepts the current length or
    /// shortens it; repeat until none shortens it. Returns the hit in tokens and each group's
    /// pages for it.
    pub(super) fn longest_hit(
        &self,
        keys: &[PageKey],
        tokens: &[i32],
        max_len: usize,
    ) -> (usize, Vec<Vec<u32>>) {
        let kind = |set: &Vec<usize>| self.cfg.groups[set[0]].kind;
        let mut found: Vec<Option<Vec<u32>>> = vec![None; self.num_groups()];
        let simple = self.sets.len() == 2 && kind(&self.sets[0]) == GroupKind::Full;
        let mut hit = max_len;
        loop {
            let mut curr = hit;
            for set in &self.sets {
                let k = kind(set);
                if k == GroupKind::Full && found[set[0]].is_some() {
                    curr = curr / self.ps * self.ps;
                    continue;
                }
                let pages = match k {
                    GroupKind::Full => self.hit_full(set, keys, tokens, curr),
                    GroupKind::SlidingWindow(w) => self.hit_window(set, keys, tokens, curr, w),
                    GroupKind::ChunkedLocal(c) => self.hit_chunk(set, keys, tokens, curr, c),
                    GroupKind::State(m) => self.hit_state(set, keys, tokens, curr, m),
                };
                curr = pages[0].len() * self.ps;
                for (&g, p) in set.iter().zip(pages) {
                    found[g] = Some(p);
                }
            }
            if curr >= hit {
                break;
            }
            hit = curr;
            if simple {
                break;
            }
        }
        if kind(&self.sets[0]) == GroupKind::Full {
            for &g in &self.sets[0] {
                if let Some(p) = &mut found[g] {
                    p.truncate(hit / self.ps);
                }
            }
        }
        (
            hit,
            found.into_iter().map(Option::unwrap_or_default).collect(),
        )
    }
}
