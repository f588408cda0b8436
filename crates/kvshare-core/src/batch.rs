//! The batch builders an engine calls every step: block tables (each sequence's page ids,
//! padded) and the slot mapping (where each new token's KV goes). Read-only; each validates
//! every sequence and buffer before writing anything.

use super::error::{Error, Result};
use super::sequences::check_room;
use super::state::State;

/// What the batch builders read of one sequence: its block table (in the group asked for) and
/// its token count.
pub(crate) struct TableView<'a> {
    pub pages: &'a [u32],
    pub num_tokens: usize,
}

/// Fills `table` (row-major `[ids.len(), max_pages]`) with each sequence's page ids, padded
/// with `pad`, and `context_lens` (if not empty) with token counts; `view` finds a sequence (an
/// error for an unknown one). Checks every sequence and buffer first: writes nothing on error.
pub(crate) fn fill_block_tables<'a>(
    ids: &[u64],
    max_pages: usize,
    pad: i32,
    table: &mut [i32],
    context_lens: &mut [i32],
    view: impl Fn(u64) -> Result<TableView<'a>>,
) -> Result<()> {
    let needed = ids
        .len()
        .checked_mul(max_pages)
        .ok_or_else(|| Error::arg("max_pages_per_seq", "overflow"))?;
    check_room("table_out", needed, table.len())?;
    if !context_lens.is_empty() {
        check_room("context_lens_out", ids.len(), context_lens.len())?;
    }
    for &id in ids {
        let s = view(id)?;
        if s.pages.len() > max_pages {
            return Err(Error::arg(
                "max_pages_per_seq",
                format!(
                    "sequence {id} has {} pages, more than {max_pages}",
                    s.pages.len()
                ),
            ));
        }
        if s.num_tokens > i32::MAX as usize {
            return Err(Error::arg(
                "seq_ids",
                format!("sequence {id} is too long for int32 lengths"),
            ));
        }
    }
    for (i, &id) in ids.iter().enumerate() {
        let s = view(id)?;
        let row = &mut table[i * max_pages..(i + 1) * max_pages];
        for (dst, &p) in row.iter_mut().zip(s.pages) {
            *dst = p as i32;
        }
        row[s.pages.len()..].fill(pad);
        if !context_lens.is_empty() {
            context_lens[i] = s.num_tokens as i32;
        }
    }
    Ok(())
}

/// Fills `out` with the slot ids (`page * page_size + offset`) of the last `query_lens[i]`
/// tokens of each sequence, concatenated, then -1 up to its end (padding). A token for which
/// `hidden(id, pos)` holds gets -1 too (the caller's rule: a shared cached page, a released
/// position). Returns the number of query slots. Checks every sequence and buffer first:
/// writes nothing on error.
pub(crate) fn fill_slot_mapping<'a>(
    ids: &[u64],
    query_lens: &[u32],
    page_size: usize,
    out: &mut [i64],
    view: impl Fn(u64) -> Result<TableView<'a>>,
    hidden: impl Fn(u64, usize) -> bool,
) -> Result<usize> {
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
        let s = view(id)?;
        if q as usize > s.num_tokens {
            return Err(Error::arg(
                "query_lens",
                format!(
                    "{q} query tokens for sequence {id} of {} tokens",
                    s.num_tokens
                ),
            ));
        }
        total += q as usize;
    }
    check_room("slots_out", total, out.len())?;
    let ps = page_size;
    let mut k = 0;
    for (&id, &q) in ids.iter().zip(query_lens) {
        let s = view(id)?;
        let len = s.num_tokens;
        for pos in len - q as usize..len {
            out[k] = if hidden(id, pos) {
                -1
            } else {
                s.pages[pos / ps] as i64 * ps as i64 + (pos % ps) as i64
            };
            k += 1;
        }
    }
    out[k..].fill(-1);
    Ok(total)
}

impl State {
    fn table_view(&self, group: usize, id: u64) -> Result<TableView<'_>> {
        let s = self.device_seq(id)?;
        Ok(TableView {
            pages: &s.tables[group],
            num_tokens: s.tokens.len(),
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
    /// each sequence, concatenated; entries after them are set to -1 (padding). Tokens whose KV
    /// is already in a shared cached page (see `skip_cached_writes`) get -1 too, so recomputing
    /// them never overwrites shared KV, and so do tokens at a position the group released.
    /// Returns the number of query slots (the sum of `query_lens`). Writes nothing on error.
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
            |id, pos| {
                let s = &self.seqs[&id];
                let j = pos / ps;
                pos < s.cached_tokens
                    || self.is_null(s.tables[group][j])
                    || s.borrowed[group].binary_search(&(j as u32)).is_ok()
            },
        )
    }
}
