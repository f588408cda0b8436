//! Per-group views an engine reads every step: block tables, slot mappings, and stats. Each
//! validates every sequence and buffer before writing anything.

use super::super::batch::{fill_block_tables, fill_slot_mapping, TableView};
use super::super::error::Result;
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
        fill_block_tables(ids, max_pages, pad, table, context_lens, |id| {
            self.table_view(group, id)
        })
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
        let ps = self.ps;
        fill_slot_mapping(
            ids,
            query_lens,
            ps,
            out,
            |id| self.table_view(group, id),
            |id, pos| self.seqs[&id].tables[group][pos / ps] == NULL_PAGE,
        )
    }

    fn table_view(&self, group: usize, id: u64) -> Result<TableView<'_>> {
        let s = self.seq(id)?;
        Ok(TableView {
            pages: &s.tables[group],
            num_tokens: s.tokens.len(),
        })
    }
}
