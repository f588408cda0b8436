//! The batch builders an engine calls every step: block tables (each sequence's page ids in a
//! group, padded) and the slot mapping (where each new token's KV goes). Read-only; each
//! validates every sequence and buffer before writing anything.

use super::error::{Error, Result};
use super::seq::Seq;
use super::sequences::check_room;
use super::state::State;

impl State {
    /// The device-resident sequences of `ids`, in order (one lookup each).
    fn batch_seqs(&self, ids: &[u64]) -> Result<Vec<&Seq>> {
        ids.iter().map(|&id| self.device_seq(id)).collect()
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
        check_room("table_out", needed, table.len())?;
        if !context_lens.is_empty() {
            check_room("context_lens_out", ids.len(), context_lens.len())?;
        }
        let seqs = self.batch_seqs(ids)?;
        for (&id, s) in ids.iter().zip(&seqs) {
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
        for (i, s) in seqs.iter().enumerate() {
            let pages = &s.tables[group];
            let row = &mut table[i * max_pages..(i + 1) * max_pages];
            for (dst, &p) in row.iter_mut().zip(pages) {
                *dst = p as i32;
            }
            row[pages.len()..].fill(pad);
            if !context_lens.is_empty() {
                context_lens[i] = s.tokens.len() as i32;
            }
        }
        Ok(())
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
        let seqs = self.batch_seqs(ids)?;
        let mut total = 0usize;
        for ((&id, &q), s) in ids.iter().zip(query_lens).zip(&seqs) {
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
        check_room("slots_out", total, out.len())?;
        let ps = self.ps;
        let mut k = 0;
        for (&q, s) in query_lens.iter().zip(&seqs) {
            let len = s.tokens.len();
            let pages = &s.tables[group];
            let borrowed = &s.borrowed[group];
            for pos in len - q as usize..len {
                let j = pos / ps;
                let p = pages[j];
                let hidden = pos < s.cached_tokens
                    || self.is_null(p)
                    || (!borrowed.is_empty() && borrowed.binary_search(&(j as u32)).is_ok());
                out[k] = if hidden {
                    -1
                } else {
                    p as i64 * ps as i64 + (pos % ps) as i64
                };
                k += 1;
            }
        }
        out[k..].fill(-1);
        Ok(total)
    }
}
