//! Per-group views an engine reads every step: block tables, slot mappings, and stats. Each
//! validates every sequence and buffer before writing anything.

use super::super::error::{Error, Result};
use super::super::seq::check_room_named;
use super::hybrid::{Hybrid, NULL_PAGE};

/// A group's share of the cache (and its pool's totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// The group's pool.
    pub pool: u32,
    /// Pages of that pool, the null page included.
    pub pool_pages_total: u64,
    /// Unreferenced pages of the pool, cached ones included (vLLM's `get_num_free_blocks`).
    pub pool_pages_free: u64,
    /// Referenced pages of the pool (all its groups).
    pub pool_pages_in_use: u64,
    /// Non-null entries of this group's tables over all sequences (a page shared by k
    /// sequences counts k times).
    pub pages_held: u64,
    /// Distinct pages this group's tables hold.
    pub pages_distinct: u64,
    /// Entries of this group's prefix index.
    pub pages_registered: u64,
    /// Cumulative: pages released out of the window.
    pub pages_released: u64,
    /// Cumulative: registered pages of this group evicted for reuse.
    pub evictions: u64,
    /// Cumulative: tokens matched by sequence begins (the same for every group).
    pub prefix_hit_tokens: u64,
    /// Cumulative: sequence begins that looked up the index.
    pub prefix_queries: u64,
    /// Live sequences.
    pub num_seqs: u64,
}

impl Hybrid {
    /// Stats of `group`.
    pub fn stats(&self, group: usize) -> Result<GroupStats> {
        self.check_group(group)?;
        let pool = self.pool_of[group];
        let p = &self.pools[pool];
        let mut held = 0u64;
        let mut distinct = std::collections::HashSet::new();
        for s in self.seqs.values() {
            for &page in s.tables[group].iter().filter(|&&x| x != NULL_PAGE) {
                held += 1;
                distinct.insert(page);
            }
        }
        Ok(GroupStats {
            pool: pool as u32,
            pool_pages_total: p.num_pages() as u64,
            pool_pages_free: p.available() as u64,
            pool_pages_in_use: p.num_in_use() as u64,
            pages_held: held,
            pages_distinct: distinct.len() as u64,
            pages_registered: self.indices[group].len() as u64,
            pages_released: self.counters[group].released,
            evictions: self.counters[group].evictions,
            prefix_hit_tokens: self.prefix_hit_tokens,
            prefix_queries: self.prefix_queries,
            num_seqs: self.seqs.len() as u64,
        })
    }

    /// Fills `table` (row-major `[ids.len(), max_pages]`) with each sequence's page ids in
    /// `group` (the null page at released positions), padded with `pad`, and `context_lens` (if
    /// not empty) with token counts. Writes nothing on error.
    pub fn block_tables(
        &self,
        group: usize,
        ids: &[u64],
        max_pages: usize,
        pad: i32,
        table: &mut [i32],
        context_lens: &mut [i32],
    ) -> Result<()> {
        self.check_group(group)?;
        let needed = ids
            .len()
            .checked_mul(max_pages)
            .ok_or_else(|| Error::arg("max_pages_per_seq", "overflow"))?;
        check_room_named("table_out", needed, table.len())?;
        if !context_lens.is_empty() {
            check_room_named("context_lens_out", ids.len(), context_lens.len())?;
        }
        for &id in ids {
            let s = self.seq(id)?;
            if s.tables[group].len() > max_pages {
                return Err(Error::arg(
                    "max_pages_per_seq",
                    format!(
                        "sequence {id} has {} pages, more than {max_pages}",
                        s.tables[group].len()
                    ),
                ));
            }
            if s.tokens.len() > i32::MAX as usize {
                return Err(Error::arg(
                    "seq_ids",
                    format!("sequence {id} is too long for int32 lengths"),
                ));
            }
        }
        for (i, &id) in ids.iter().enumerate() {
            let s = &self.seqs[&id];
            let t = &s.tables[group];
            let row = &mut table[i * max_pages..(i + 1) * max_pages];
            for (dst, &p) in row.iter_mut().zip(t) {
                *dst = p as i32;
            }
            row[t.len()..].fill(pad);
            if !context_lens.is_empty() {
                context_lens[i] = s.tokens.len() as i32;
            }
        }
        Ok(())
    }

    /// Slot ids (`page * page_size + offset`) in `group` of the last `query_lens[i]` tokens of
    /// each sequence, concatenated; -1 for a token at a released position and for the padding
    /// after them. Returns the number of query slots. Writes nothing on error.
    pub fn slot_mapping(
        &self,
        group: usize,
        ids: &[u64],
        query_lens: &[u32],
        out: &mut [i64],
    ) -> Result<usize> {
        self.check_group(group)?;
        if ids.len() != query_lens.len() {
            return Err(Error::arg(
                "query_lens",
                format!(
                    "{} query lengths for {} sequences",
                    query_lens.len(),
                    ids.len()
                ),
            ));
        }
        let mut total = 0usize;
        for (&id, &q) in ids.iter().zip(query_lens) {
            let s = self.seq(id)?;
            if q as usize > s.tokens.len() {
                return Err(Error::arg(
                    "query_lens",
                    format!(
                        "{q} query tokens for sequence {id} of {} tokens",
                        s.tokens.len()
                    ),
                ));
            }
            total += q as usize;
        }
        check_room_named("slots_out", total, out.len())?;
        let ps = self.ps;
        let mut k = 0;
        for (&id, &q) in ids.iter().zip(query_lens) {
            let s = &self.seqs[&id];
            let len = s.tokens.len();
            for pos in len - q as usize..len {
                let page = s.tables[group][pos / ps];
                out[k] = if page == NULL_PAGE {
                    -1
                } else {
                    page as i64 * ps as i64 + (pos % ps) as i64
                };
                k += 1;
            }
        }
        out[k..].fill(-1);
        Ok(total)
    }
}
