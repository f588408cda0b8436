//! The rules of each attention kind, behind one trait: which of a sequence's pages a group still
//! needs, how a prefix hit is found for it, how its block table grows, which page an append
//! writes, and how its released pages are reused. vLLM keeps the same split (one
//! `SingleTypeKVCacheManager` per attention kind under one coordinator); the formulas below are
//! vLLM 0.23's, with one page size for every group and no speculative blocks.
//!
//! Everything else — tiers, copy-on-write, pins, priorities, events, the prefix index — is the
//! same for every kind and lives in the manager, which asks a group's [`Rules`] only these
//! questions.

use std::fmt::Debug;
use std::ops::Range;

use super::config::{GroupKind, StateMode, WindowRetention};

/// The pages of a hit in one group: positions `first_live..len` hold cached pages, positions
/// before `first_live` are the null page (computed KV the group no longer reads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Span {
    /// Positions of the hit (its length in pages).
    pub len: usize,
    /// First position that holds a page.
    pub first_live: usize,
}

/// Looks pages up for a set of groups that share a kind (vLLM's `get_cached_block(hash,
/// group_ids)`): position `j` is cached when every group of the set holds it.
pub(crate) trait Probe {
    /// Whether every group of the set holds page `j` in some tier.
    fn has(&mut self, j: usize) -> bool;

    /// The longest run of cached positions `from, from + 1, …`, stopping before `to`.
    fn run(&mut self, from: usize, to: usize) -> usize {
        (from..to).take_while(|&j| self.has(j)).count()
    }
}

/// What a state group remembers of a sequence between steps (align mode: vLLM's
/// `last_state_block_idx` and `_allocated_block_reqs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GrowState {
    /// The previous step's state position (align).
    pub last: Option<usize>,
    /// Whether the group ever allocated for the sequence (align).
    pub allocated: bool,
}

/// The rules of one attention kind.
pub(crate) trait Rules: Debug + Send + Sync {
    /// Tokens at the start of a sequence the group no longer reads once `computed` tokens have
    /// KV (vLLM's `get_num_skipped_tokens`): the next token attends to none of them.
    fn skipped_tokens(&self, computed: usize) -> usize;

    /// The group's part of the longest prefix hit of at most `max_len` tokens (vLLM's
    /// `find_longest_cache_hit` of the kind), probing the cache through `probe`.
    fn find_hit(&self, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span;

    /// [`find_hit`](Self::find_hit) for an EAGLE group (vLLM's `drop_eagle_block`): the hit less
    /// its last page, which the draft model recomputes. Only the kinds a config lets be EAGLE's
    /// are asked (full attention and sliding windows).
    fn find_hit_dropping(&self, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
        drop_last(self.find_hit(max_len, ps, probe))
    }

    /// Pages the table takes at a begin whose tables are `total` positions long, for a prompt
    /// of `num_tokens` tokens whose hit gave this group `hit_len` positions.
    fn begin_pages(&self, total: usize, hit_len: usize, num_tokens: usize, ps: usize) -> usize {
        let _ = (num_tokens, ps);
        total.saturating_sub(hit_len)
    }

    /// The length a begin grows the table to (the state kinds grow to the tokens only).
    fn begin_len(&self, total: usize, num_tokens: usize, ps: usize) -> usize {
        let _ = (num_tokens, ps);
        total
    }

    /// Pages an append takes to grow a table of `table` to `want` positions.
    fn grow_pages(&self, table: &[u32], want: usize) -> usize {
        want.saturating_sub(table.len())
    }

    /// Grows `table` to `want` positions, taking pages with `take`. The caller has checked that
    /// [`grow_pages`](Self::grow_pages) pages are available.
    fn grow(
        &self,
        table: &mut Vec<u32>,
        want: usize,
        st: &mut GrowState,
        null: u32,
        take: &mut dyn FnMut() -> u32,
    ) {
        let _ = (st, null);
        while table.len() < want {
            table.push(take());
        }
    }

    /// Positions an append of `n` tokens to a sequence of `old` tokens writes into, in a table of
    /// `len` positions before the append grows it (copy-on-write replaces a shared one first).
    /// An empty table (a sequence begun with no token) has none.
    fn written(&self, old: usize, n: usize, len: usize, ps: usize) -> Range<usize> {
        if n == 0 || len == 0 {
            return 0..0;
        }
        let last = ((old + n - 1) / ps).min(len.saturating_sub(1));
        (old / ps).min(last + 1)..last + 1
    }

    /// Slots of a shared page at position `j` that its copy must carry, when an append of a
    /// sequence of `old` tokens writes into it: the tokens already in it (0: nothing to copy, a
    /// new page suffices).
    fn copy_tokens(&self, j: usize, old: usize, ps: usize) -> u32 {
        if j == old / ps {
            (old % ps) as u32
        } else {
            0
        }
    }

    /// Whether the sequence's `free` returns the pages without cached content to the front of
    /// the reuse order even in vLLM's order (vLLM's `SlidingWindowManager.free`).
    fn free_prepends_uncached(&self) -> bool {
        false
    }

    /// Whether the group registers a sequence's full page `j` as a prefix hit under
    /// `retention`, `boundaries` being the sequence's retention boundaries (token positions).
    /// Every page but for sliding windows.
    fn retains(
        &self,
        j: usize,
        ps: usize,
        retention: WindowRetention,
        boundaries: &[usize],
    ) -> bool {
        let _ = (j, ps, retention, boundaries);
        true
    }

    /// Whether the group holds recurrent state rather than per-token KV: it keeps checkpoints
    /// only at page boundaries (no sub-page hits) and a hit's state is usable only after the
    /// step that wrote it (vLLM's same-step rule).
    fn is_state(&self) -> bool {
        false
    }

    /// The align mode's extra release at `num_computed` tokens: the position of the previous
    /// step's state page once the state moved past it (`last_state_block_idx < cdiv(n, ps) -
    /// 1`), if it still holds a page.
    fn stale_state(
        &self,
        table: &[u32],
        st: &GrowState,
        num_computed: usize,
        ps: usize,
        null: u32,
    ) -> Option<usize> {
        let _ = (table, st, num_computed, ps, null);
        None
    }
}

/// `span` less its last position (none left of an empty one).
fn drop_last(span: Span) -> Span {
    let len = span.len.saturating_sub(1);
    Span {
        len,
        first_live: span.first_live.min(len),
    }
}

/// The rules of `kind`; `eagle` when the group's lookup set is EAGLE's (it shapes which pages a
/// sliding window registers).
pub(crate) fn rules_of(kind: GroupKind, eagle: bool) -> Box<dyn Rules> {
    match kind {
        GroupKind::Full => Box::new(Full),
        GroupKind::SlidingWindow(w) => Box::new(Window {
            window: w as usize,
            eagle,
        }),
        GroupKind::ChunkedLocal(c) => Box::new(Chunked(c as usize)),
        GroupKind::State(StateMode::All) => Box::new(StateAll),
        GroupKind::State(StateMode::Align) => Box::new(StateAlign),
        GroupKind::State(StateMode::None) => Box::new(StateNone),
    }
}

/// Full attention (MLA too): every page from the first on.
#[derive(Debug)]
struct Full;

impl Rules for Full {
    fn skipped_tokens(&self, _computed: usize) -> usize {
        0
    }

    /// `FullAttentionManager.find_longest_cache_hit`: cached pages from the first on.
    fn find_hit(&self, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
        Span {
            len: probe.run(0, max_len / ps),
            first_live: 0,
        }
    }
}

/// Sliding-window attention over the last `window` tokens.
#[derive(Debug)]
struct Window {
    window: usize,
    /// The group's lookup set is EAGLE's: its hits need one page more before the drop.
    eagle: bool,
}

impl Window {
    /// Cached pages a hit needs before its end: `cdiv(window - 1, page_size)`, one more for
    /// EAGLE (vLLM's `_contiguous_blocks_for_hit`).
    fn need(&self, ps: usize, eagle: bool) -> usize {
        (self.window - 1).div_ceil(ps) + usize::from(eagle)
    }

    /// The rightmost run of `need` cached pages ending at or before `max_len`, null before it;
    /// without such a run, the run starting at page 0.
    fn run_hit(need: usize, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
        let mut run = 0;
        for i in (0..max_len / ps).rev() {
            if probe.has(i) {
                run += 1;
                if run >= need {
                    return Span {
                        len: i + run,
                        first_live: i,
                    };
                }
            } else {
                run = 0;
            }
        }
        Span {
            len: run,
            first_live: 0,
        }
    }
}

impl Rules for Window {
    fn skipped_tokens(&self, computed: usize) -> usize {
        (computed + 1).saturating_sub(self.window)
    }

    /// `SlidingWindowManager.find_longest_cache_hit`: the rightmost run of `cdiv(window - 1,
    /// page_size)` cached pages ending at or before `max_len`, null before it; without such a
    /// run, the run starting at page 0 (shorter than the window).
    fn find_hit(&self, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
        Self::run_hit(self.need(ps, false), max_len, ps, probe)
    }

    /// With `drop_eagle_block`: a run one page longer, then its last page dropped.
    fn find_hit_dropping(&self, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
        drop_last(Self::run_hit(self.need(ps, true), max_len, ps, probe))
    }

    fn free_prepends_uncached(&self) -> bool {
        true
    }

    /// `SlidingWindowManager.reachable_block_mask` (vLLM 0.32, hits aligned to the page): under
    /// sparse retention, the pages of a hit's tail (`cdiv(window - 1, page_size)` pages, one
    /// more for EAGLE) ending at a page boundary that is a multiple of the segment, or at the
    /// page boundary at or before a retention boundary; for EAGLE each tail ends one page
    /// later, on the page its lookup peeks at and drops.
    fn retains(
        &self,
        j: usize,
        ps: usize,
        retention: WindowRetention,
        boundaries: &[usize],
    ) -> bool {
        let WindowRetention::Sparse { segment_pages } = retention else {
            return true;
        };
        let need = self.need(ps, self.eagle);
        let shift = usize::from(self.eagle);
        let k = segment_pages as usize;
        if k > 0 && (need >= k || (j >= shift && (j - shift) % k >= k - need)) {
            return true;
        }
        boundaries
            .iter()
            .any(|&b| j < b / ps + shift && j + need >= b / ps + shift)
    }
}

/// Chunked local attention over chunks of `0` tokens (a multiple of the page size).
#[derive(Debug)]
struct Chunked(usize);

impl Rules for Chunked {
    fn skipped_tokens(&self, computed: usize) -> usize {
        computed / self.0 * self.0
    }

    /// `ChunkedLocalAttentionManager.find_longest_cache_hit`: pages before the chunk holding
    /// `max_len` are null (computed and out of reach); cached pages from the chunk start on.
    fn find_hit(&self, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
        let start = max_len / self.0 * self.0 / ps;
        Span {
            len: start + probe.run(start, max_len / ps),
            first_live: start,
        }
    }
}

/// `MambaManager.find_longest_cache_hit` for the caching modes: the rightmost page `j` cached
/// with `(j + 1) * page_size <= max_len` (one page size, so vLLM's alignment test always
/// passes); null before it.
fn state_hit(max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
    for i in (0..max_len / ps).rev() {
        if probe.has(i) {
            return Span {
                len: i + 1,
                first_live: i,
            };
        }
    }
    Span::default()
}

/// State group, mode "all": a page per page of tokens, every full page cached, only the page of
/// the last computed token kept (`get_num_skipped_tokens(n) = n - 1`).
#[derive(Debug)]
struct StateAll;

impl Rules for StateAll {
    fn skipped_tokens(&self, computed: usize) -> usize {
        computed.saturating_sub(1)
    }

    fn find_hit(&self, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
        state_hit(max_len, ps, probe)
    }

    /// The running state is read and rewritten whole.
    fn copy_tokens(&self, j: usize, old: usize, ps: usize) -> u32 {
        if j == old / ps && !old.is_multiple_of(ps) {
            ps as u32
        } else {
            0
        }
    }

    fn is_state(&self) -> bool {
        true
    }
}

/// State group, mode "align": the running state in one page at the table's last position, at
/// most one new page per step, the previous step's page kept until the next release.
#[derive(Debug)]
struct StateAlign;

impl Rules for StateAlign {
    fn skipped_tokens(&self, computed: usize) -> usize {
        computed.saturating_sub(1)
    }

    fn find_hit(&self, max_len: usize, ps: usize, probe: &mut dyn Probe) -> Span {
        state_hit(max_len, ps, probe)
    }

    /// `MambaManager.get_num_blocks_to_allocate`, align: 1 when any block is missing.
    fn begin_pages(&self, _total: usize, hit_len: usize, num_tokens: usize, ps: usize) -> usize {
        usize::from(num_tokens.div_ceil(ps) > hit_len)
    }

    fn begin_len(&self, _total: usize, num_tokens: usize, ps: usize) -> usize {
        num_tokens.div_ceil(ps)
    }

    /// At most one new page a step, whatever the tokens.
    fn grow_pages(&self, table: &[u32], want: usize) -> usize {
        usize::from(want > table.len())
    }

    /// `MambaManager.allocate_new_blocks`: remembers the previous state position, pads nulls
    /// and takes one page for the new last position.
    fn grow(
        &self,
        table: &mut Vec<u32>,
        want: usize,
        st: &mut GrowState,
        null: u32,
        take: &mut dyn FnMut() -> u32,
    ) {
        if want <= table.len() {
            return;
        }
        if st.allocated || !table.is_empty() {
            st.last = Some(table.len() - 1);
        }
        table.resize(want - 1, null);
        table.push(take());
        st.allocated = true;
    }

    /// The running state at the last position. A step that grows the table writes the new
    /// state into the new position's fresh page and reads the previous one, which stays the
    /// sequence's own: when the sequence's tokens end inside that position, the state in it
    /// becomes the checkpoint of the sequence's own tokens there, so a shared one is copied
    /// first, as when the step writes it. When they fill the position, its page already holds
    /// the checkpoint after them, the same for every holder (a hit on it, or a fork), and the
    /// step only reads it (vLLM's align mode copies it into the new page on the device).
    fn written(&self, old: usize, n: usize, len: usize, ps: usize) -> Range<usize> {
        if n == 0 || len == 0 || old >= len * ps {
            return 0..0;
        }
        len - 1..len
    }

    fn copy_tokens(&self, _j: usize, _old: usize, ps: usize) -> u32 {
        ps as u32
    }

    fn is_state(&self) -> bool {
        true
    }

    fn stale_state(
        &self,
        table: &[u32],
        st: &GrowState,
        num_computed: usize,
        ps: usize,
        null: u32,
    ) -> Option<usize> {
        let i = st.last?;
        let bound = num_computed.div_ceil(ps);
        let live = table.get(i).is_some_and(|&p| p != null);
        (bound > 0 && i < bound - 1 && live).then_some(i)
    }
}

/// State group, mode "none" (prefix caching off): one page per sequence for its whole life, at
/// the table's last position.
#[derive(Debug)]
struct StateNone;

impl Rules for StateNone {
    /// The one page stays wherever the sequence is.
    fn skipped_tokens(&self, _computed: usize) -> usize {
        0
    }

    /// Never cached, never hit.
    fn find_hit(&self, _max_len: usize, _ps: usize, _probe: &mut dyn Probe) -> Span {
        Span::default()
    }

    fn begin_pages(&self, total: usize, _hit_len: usize, _num_tokens: usize, _ps: usize) -> usize {
        total.min(1)
    }

    /// One page for the whole sequence, taken when the table first grows.
    fn grow_pages(&self, table: &[u32], want: usize) -> usize {
        usize::from(table.is_empty() && want > 0)
    }

    /// The one page (taken the first time) moves to the last position.
    fn grow(
        &self,
        table: &mut Vec<u32>,
        want: usize,
        _st: &mut GrowState,
        null: u32,
        take: &mut dyn FnMut() -> u32,
    ) {
        if want <= table.len() {
            return;
        }
        let page = match table.last() {
            Some(&p) if p != null => p,
            _ => take(),
        };
        table.fill(null);
        table.resize(want - 1, null);
        table.push(page);
    }

    /// The one page is read and rewritten every step.
    fn written(&self, _old: usize, n: usize, len: usize, _ps: usize) -> Range<usize> {
        if n == 0 || len == 0 {
            return 0..0;
        }
        len - 1..len
    }

    fn copy_tokens(&self, _j: usize, _old: usize, ps: usize) -> u32 {
        ps as u32
    }

    fn is_state(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_tokens_match_vllm_examples() {
        // SlidingWindowManager.get_num_skipped_tokens: window 4, 7 computed -> 4.
        let w = rules_of(GroupKind::SlidingWindow(4), false);
        assert_eq!((w.skipped_tokens(7), w.skipped_tokens(2)), (4, 0));
        // ChunkedLocalAttentionManager: chunk 8 -> 13: 8, 8: 8, 7: 0.
        let c = rules_of(GroupKind::ChunkedLocal(8), false);
        assert_eq!(
            (
                c.skipped_tokens(13),
                c.skipped_tokens(8),
                c.skipped_tokens(7)
            ),
            (8, 8, 0)
        );
        assert_eq!(rules_of(GroupKind::Full, false).skipped_tokens(1 << 20), 0);
        // MambaManager.get_num_skipped_tokens: n - 1 (nothing at 0); "none" keeps its page.
        for m in [StateMode::All, StateMode::Align] {
            let s = rules_of(GroupKind::State(m), false);
            assert_eq!((s.skipped_tokens(7), s.skipped_tokens(0)), (6, 0));
        }
        assert_eq!(
            rules_of(GroupKind::State(StateMode::None), false).skipped_tokens(99),
            0
        );
    }

    struct Cached(Vec<bool>);

    impl Probe for Cached {
        fn has(&mut self, j: usize) -> bool {
            self.0.get(j).copied().unwrap_or(false)
        }
    }

    #[test]
    fn hits_follow_each_kind() {
        // Pages 0..6 cached but page 2; page size 4, max 24 tokens (6 pages).
        let mut p = Cached(vec![true, true, false, true, true, true]);
        let full = rules_of(GroupKind::Full, false).find_hit(24, 4, &mut p);
        assert_eq!(
            full,
            Span {
                len: 2,
                first_live: 0
            }
        );
        // Window 9 needs cdiv(8, 4) = 2 pages: the rightmost run 4..6.
        let win = rules_of(GroupKind::SlidingWindow(9), false).find_hit(24, 4, &mut p);
        assert_eq!(
            win,
            Span {
                len: 6,
                first_live: 4
            }
        );
        // EAGLE: full attention drops the last page of its hit; window 9 needs a run of 3
        // pages (3..6) and drops its last.
        let span = |len, first_live| Span { len, first_live };
        let full_e = rules_of(GroupKind::Full, true).find_hit_dropping(24, 4, &mut p);
        assert_eq!(full_e, span(1, 0));
        let win_e = rules_of(GroupKind::SlidingWindow(9), true);
        assert_eq!(win_e.find_hit_dropping(24, 4, &mut p), span(5, 3));
        // No run of 3 before page 5: the run from page 0 (pages 0..2), less its last page.
        assert_eq!(win_e.find_hit_dropping(20, 4, &mut p), span(1, 0));
        assert_eq!(
            win_e.find_hit_dropping(24, 4, &mut Cached(vec![false; 6])),
            span(0, 0)
        );
        // Chunk 8 (2 pages): max 24 -> chunk start 24 = page 6: nothing to look up.
        let ch = rules_of(GroupKind::ChunkedLocal(8), false).find_hit(24, 4, &mut p);
        assert_eq!(
            ch,
            Span {
                len: 6,
                first_live: 6
            }
        );
        let ch = rules_of(GroupKind::ChunkedLocal(8), false).find_hit(20, 4, &mut p);
        assert_eq!(
            ch,
            Span {
                len: 5,
                first_live: 4
            }
        );
        let st = rules_of(GroupKind::State(StateMode::All), false).find_hit(12, 4, &mut p);
        assert_eq!(
            st,
            Span {
                len: 2,
                first_live: 1
            }
        );
        let none = rules_of(GroupKind::State(StateMode::None), false).find_hit(24, 4, &mut p);
        assert_eq!(none, Span::default());
    }

    #[test]
    fn align_grows_one_page_a_step_and_remembers_the_last_state() {
        let r = rules_of(GroupKind::State(StateMode::Align), false);
        let mut t = vec![];
        let mut st = GrowState::default();
        let mut next = 10;
        let mut take = || {
            next += 1;
            next
        };
        r.grow(&mut t, 3, &mut st, 0, &mut take);
        assert_eq!((t.clone(), st.last), (vec![0, 0, 11], None));
        r.grow(&mut t, 5, &mut st, 0, &mut take);
        assert_eq!((t.clone(), st.last), (vec![0, 0, 11, 0, 12], Some(2)));
        assert_eq!(r.stale_state(&t, &st, 17, 4, 0), Some(2));
        assert_eq!(r.stale_state(&t, &st, 12, 4, 0), None);
        let n = rules_of(GroupKind::State(StateMode::None), false);
        let mut t = vec![];
        n.grow(&mut t, 2, &mut st, 0, &mut take);
        n.grow(&mut t, 4, &mut st, 0, &mut take);
        assert_eq!(t, vec![0, 0, 0, 13]);
    }

    /// vLLM 0.32's `SlidingWindowManager.reachable_block_mask` (alignment one block), line for
    /// line, over blocks `start..end`.
    fn vllm_mask(
        start: usize,
        end: usize,
        (window, eagle): (usize, bool),
        bs: usize,
        interval: Option<usize>,
        bounds: &[usize],
    ) -> Option<Vec<bool>> {
        let need = (window - 1).div_ceil(bs) + usize::from(eagle);
        let shift = usize::from(eagle);
        let mut mask = vec![false; end - start];
        let segment = match interval {
            None => Some(bs),
            Some(0) => None,
            Some(i) => Some(i),
        };
        if let Some(seg) = segment {
            let per = seg / bs;
            if need >= per {
                return None;
            }
            for i in start..end {
                if i >= shift && (i - shift) % per >= per - need {
                    mask[i - start] = true;
                }
            }
        }
        if interval.is_some() {
            for &b in bounds {
                let e = b / bs * bs / bs + shift;
                for j in start.max(e.saturating_sub(need))..end.min(e) {
                    mask[j - start] = true;
                }
            }
        }
        Some(mask)
    }

    #[test]
    fn window_retention_matches_vllm_mask() {
        let bs = 16;
        for (window, eagle) in [1, 2, 16, 17, 33, 64, 100, 128]
            .into_iter()
            .flat_map(|w| [(w, false), (w, true)])
        {
            let w = rules_of(GroupKind::SlidingWindow(window as u32), eagle);
            for interval in [None, Some(0), Some(16), Some(32), Some(64), Some(256)] {
                let retention = match interval {
                    None => WindowRetention::Dense,
                    Some(i) => WindowRetention::Sparse {
                        segment_pages: (i / bs) as u32,
                    },
                };
                if window == 1 && interval.is_none() {
                    // vLLM 0.32's dense mask keeps nothing of a one-token window (no tail);
                    // kvshare's dense retention is 0.23's: every full page.
                    continue;
                }
                for bounds in [&[][..], &[99][..], &[127, 40][..], &[5, 300, 301][..]] {
                    let mask = vllm_mask(0, 40, (window, eagle), bs, interval, bounds);
                    for j in 0..40 {
                        let want = mask.as_ref().is_none_or(|m| m[j]);
                        assert_eq!(
                            w.retains(j, bs, retention, bounds),
                            want,
                            "window {window}, eagle {eagle}, interval {interval:?}, \
                             bounds {bounds:?}, page {j}"
                        );
                    }
                }
            }
        }
        let full = rules_of(GroupKind::Full, false);
        let sparse = WindowRetention::Sparse { segment_pages: 0 };
        assert!(full.retains(3, bs, sparse, &[]));
    }
}
