//! The model's side of a step: forward launches over the new tokens (slot mapping → KV write,
//! block tables → attention) and the page copies the cache manager queues.

use std::time::Instant;

use super::{NewTokens, Sim};
use crate::model::Forward;

impl Sim<'_> {
    /// Executes the copies the cache manager queued (demotions of evicted pages to the host
    /// tier, promotions of host hits), which must run before any copy returned by a later call
    /// and before the step's KV write, and the partial copies of hits ending inside a page
    /// (`match_unit`). Only a host tier or a match unit below the page size queues copies.
    pub(super) fn drain_queued(&mut self, owners: &[usize]) -> Result<(), String> {
        if self.cfg.host_pages == 0 && self.cfg.unit() == self.cfg.page_size {
            return Ok(());
        }
        let queued = self
            .mgr(owners, |s| Ok(s.take_copies(usize::MAX)))
            .map_err(|e| format!("take_copies: {e}"))?;
        if queued.is_empty() {
            return Ok(());
        }
        // A promotion (host hit) gives the request a device page: count it as allocated. (A
        // unit hit's copy fills a page `begin` already counted; it is never a whole page.)
        let promoted = queued
            .iter()
            .filter(|c| {
                c.kind == kvshare_core::CopyKind::HostToDevice && c.num_tokens == self.cfg.page_size
            })
            .count() as u64;
        if let [o] = owners {
            self.out.requests[*o].allocated_pages += promoted;
        }
        let returned = std::mem::replace(&mut self.copies, queued);
        self.copy(owners)?;
        self.copies = returned;
        Ok(())
    }

    /// One forward launch over the new tokens of each item.
    pub(super) fn forward(&mut self, items: &[NewTokens], decode: bool) -> Result<(), String> {
        if items.is_empty() {
            return Ok(());
        }
        let ids: Vec<u64> = items
            .iter()
            .map(|n| self.lv(n.request).st.samples[n.sample].seq)
            .collect();
        let q: Vec<u32> = items.iter().map(|n| n.count as u32).collect();
        let owners: Vec<usize> = items.iter().map(|n| n.request).collect();
        let total: usize = q.iter().map(|&x| x as usize).sum();
        let max_pages = items
            .iter()
            .map(|n| {
                self.lv(n.request).st.samples[n.sample]
                    .len
                    .div_ceil(self.page_size)
            })
            .max()
            .unwrap_or(1);
        let mut slots = vec![0i64; total];
        let mut table = vec![0i32; ids.len() * max_pages];
        let mut ctx = vec![0i32; ids.len()];
        self.mgr(&owners, |s| s.slot_mapping(0, &ids, &q, &mut slots))
            .map_err(|e| format!("slot_mapping: {e}"))?;
        self.mgr(&owners, |s| {
            s.block_tables(0, &ids, max_pages, -1, &mut table, &mut ctx)
        })
        .map_err(|e| format!("block_tables: {e}"))?;
        let mut tokens = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut starts = Vec::with_capacity(ids.len() + 1);
        starts.push(0i32);
        let mut work = Vec::with_capacity(items.len());
        for (
            k,
            &NewTokens {
                request: i,
                sample: b,
                count: qn,
            },
        ) in items.iter().enumerate()
        {
            let len = self.lv(i).st.samples[b].len;
            debug_assert_eq!(ctx[k] as usize, len);
            let all = self.tokens_of(i, b);
            tokens.extend_from_slice(&all[len - qn..]);
            positions.extend((len - qn..len).map(|p| p as i32));
            starts.push(tokens.len() as i32);
            // Attention work: each new token attends to its causal prefix.
            work.push(qn as f64 * (len as f64 - qn as f64 / 2.0 + 0.5));
        }
        let history: Vec<Vec<i32>> = if self.model.wants_history() {
            items
                .iter()
                .map(|n| self.tokens_of(n.request, n.sample))
                .collect()
        } else {
            Vec::new()
        };
        let f = Forward {
            decode,
            num_seqs: ids.len(),
            tokens: &tokens,
            positions: &positions,
            query_start: &starts,
            context_lens: &ctx,
            slots: &slots,
            block_table: &table,
            max_pages,
            history: &history,
        };
        let t = Instant::now();
        self.model.forward(&f)?;
        let ns = t.elapsed().as_nanos() as u64;
        if decode {
            self.out.decode_ns += ns;
        } else {
            self.out.prefill_ns += ns;
        }
        let sum: f64 = work.iter().sum::<f64>().max(1e-9);
        for (k, n) in items.iter().enumerate() {
            let i = n.request;
            self.out.requests[i].attn_ns += (ns as f64 * work[k] / sum) as u64;
        }
        Ok(())
    }

    pub(super) fn copy(&mut self, owners: &[usize]) -> Result<(), String> {
        if self.copies.is_empty() {
            return Ok(());
        }
        let copies = std::mem::take(&mut self.copies);
        let t = Instant::now();
        self.model.copy_pages(&copies)?;
        let ns = t.elapsed().as_nanos() as u64;
        self.out.copy_ns += ns;
        for &o in owners {
            self.out.requests[o].attn_ns += ns / owners.len().max(1) as u64;
        }
        Ok(())
    }
}
