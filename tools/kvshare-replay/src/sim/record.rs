//! What each step records: pages in use (kvshare, no sharing, the ideal; per group for a cache
//! of groups), the gap to the ideal, and the bounded plot series.

use std::collections::HashSet;

use kvshare_core::GroupKind;

use super::{Sim, MAX_POINTS};
use crate::outcome::StepPages;

impl Sim<'_> {
    /// The distinct pages each group needs now at best (every live sample's pages a token
    /// reads next, full pages shared by content), for a cache of groups.
    pub(super) fn group_ideal(&self) -> Vec<u64> {
        let ps = self.page_size;
        self.cfg
            .groups
            .iter()
            .map(|&kind| {
                let mut need: HashSet<(usize, u128)> = HashSet::new();
                let mut partial = 0u64;
                for &i in &self.running {
                    for s in self.lv(i).st.samples.iter().filter(|s| !s.done) {
                        for j in first_needed(kind, s.len, ps)..s.len.div_ceil(ps) {
                            match s.keys.get(j) {
                                Some(&k) => {
                                    need.insert((j, k));
                                }
                                None => partial += 1,
                            }
                        }
                    }
                }
                need.len() as u64 + partial
            })
            .collect()
    }

    /// Records the pages in use after step `step` and compares kvshare with the ideal.
    pub(super) fn record_pages(&mut self, step: u64) -> Result<(), String> {
        let s = self.state_stats();
        let kvshare = s.device_pages_in_use as u32;
        let groups = !self.cfg.groups.is_empty();
        let (ideal, no_sharing) = if groups {
            let per = self.group_ideal();
            for (g, &need) in per.iter().enumerate() {
                let gs = self
                    .cache
                    .lock()
                    .map_err(|e| e.to_string())?
                    .group_stats(g)
                    .map_err(|e| e.to_string())?;
                self.out.groups[g].record(gs.pages_distinct, need, gs.counters.released);
            }
            let ng = self.cfg.num_groups() as u32;
            (
                per.iter().sum::<u64>() as u32,
                self.ideal.unshared_pages() as u32 * ng,
            )
        } else {
            let ideal = self.ideal.pages() as u32;
            self.out.groups[0].record(kvshare as u64, ideal as u64, 0);
            (ideal, self.ideal.unshared_pages() as u32)
        };
        let block_entries: u64 = {
            let lock = self.cache.lock().map_err(|e| e.to_string())?;
            let mut n = 0u64;
            for &i in &self.running {
                for smp in &self.live[&i].st.samples {
                    if !smp.done {
                        n += lock.seq_pages(smp.seq, 0).map_err(|e| e.to_string())?.len() as u64;
                    }
                }
            }
            if self.cfg.check {
                lock.check()
                    .map_err(|e| format!("cache check after step {step}: {e}"))?;
            }
            n
        };
        self.out.peak_block_entries = self.out.peak_block_entries.max(block_entries);
        self.out.peak_index_entries = self.out.peak_index_entries.max(s.index_pages);
        let gap = kvshare as i64 - ideal as i64;
        if gap != 0 {
            self.out.gap_steps += 1;
            self.out.first_gap_step.get_or_insert(step);
        }
        self.out.max_gap = self.out.max_gap.max(gap);
        self.out.min_gap = self.out.min_gap.min(gap);
        let point = StepPages {
            step,
            time_ms: self.now + self.cfg.step_ms,
            kvshare,
            no_sharing,
            ideal,
            cached: s.device_pages_cached as u32,
            running: self.running.len() as u32,
        };
        self.out.series.add(&point);
        self.plot(point);
        Ok(())
    }

    /// Keeps `point` for the plot: every step up to [`MAX_POINTS`], then pairs merged by their
    /// maximum (the later one's step and time), so the plot stays bounded on any trace.
    fn plot(&mut self, point: StepPages) {
        let merged = match self.bucket.take() {
            None => (point, 1),
            Some((b, n)) => (b.merge(&point), n + 1),
        };
        if merged.1 < self.merge {
            self.bucket = Some(merged);
            return;
        }
        self.out.per_step.push(merged.0);
        if self.out.per_step.len() >= MAX_POINTS {
            let old = std::mem::take(&mut self.out.per_step);
            self.out.per_step = old.chunks(2).map(|c| c[0].merge(&c[c.len() - 1])).collect();
            self.merge *= 2;
        }
    }
}

/// First page a group needs for the next token of a sequence of `len` tokens.
fn first_needed(kind: GroupKind, len: usize, ps: usize) -> usize {
    match kind {
        GroupKind::Full => 0,
        GroupKind::SlidingWindow(w) => len.saturating_sub(w as usize) / ps,
        GroupKind::ChunkedLocal(c) => len.saturating_sub(1) / c as usize * c as usize / ps,
        // The page holding the state after the last token.
        GroupKind::State(_) => len.saturating_sub(1) / ps,
    }
}
