//! The work plan of one attention launch: which items the threads run, and which of them are
//! parts of one split sequence whose partial softmaxes are merged afterwards.
//!
//! A *unit* is some query tokens of one sequence (enough for 8 rows of one kv head) against
//! all its kv heads. Decode is memory-bound, so what matters is that every thread streams K/V
//! all the time:
//!
//! * **Split-K.** A unit whose key span is longer than [`CHUNK`] tokens is cut into chunks of
//!   about that many tokens (rounded to whole pages and kernel blocks), one item each; the
//!   items' unnormalised states are merged exactly afterwards
//!   ([`super::kernel::merge_partials`]). So 2 sequences of 32k tokens become 32 items,
//!   not 2, and two threads stay busy. The cut depends on the sequence alone,
//!   never on the thread count, so results do not change with the number of threads
//!   (tests/attention.rs `thread_counts_agree`).
//! * **Head split.** If there are still fewer than 4 items per thread (few short sequences),
//!   every item's kv heads are divided too; that changes no arithmetic.
//! * **Order.** Items run longest first from one shared counter (the pool's), so the short ones
//!   fill the gaps at the end ("longest processing time first"): for many short sequences the
//!   threads finish within about one short item of each other.
//!
//! * **Prefill.** A sequence with at least [`TILED_MIN_TOKENS`] query tokens (prefill, chunked
//!   prefill) is cut into units of [`TILED_ROWS`] rows per kv head (not 8) that run the tiled
//!   kernel (`kernel/tiled.rs`): there, each converted K/V tile is reused by every row of the
//!   unit, so bigger units convert less per row. Decode rows keep the decode kernel.
//!
//! Costs: a merge reads `parts x rows x head_dim` floats per split unit, about `group / CHUNK`
//! of the K/V bytes the unit read (under 1% for GQA 4).

use crate::params::SeqSpan;

/// Target key tokens per item when a unit's keys are split (before rounding to pages), for
/// decode rows and tiled (prefill) units alike. Each split part costs a merge, a fresh
/// accumulator, the item's own setup and, in decode, a first block with nothing prefetching
/// it; 2048 against 512, one process alternating both (Zen 4, page 128, best of 10-12): decode
/// 32 x 4096 and 2 x 32768 bf16 1.04-1.14x, f16 and f32 0.99-1.08x (4096: 1.03-1.10x, below
/// 2048); prefill 2 x 1024 bf16 1.04-1.08x, f32 1.01-1.04x. The cost: fewer items for many
/// threads on few long sequences (the head split below still divides them).
pub(crate) const CHUNK: usize = 2048;

/// Query tokens from which a sequence's rows run the tiled (prefill) kernel.
pub(crate) const TILED_MIN_TOKENS: usize = 8;

/// Rows per kv head of a tiled unit (a multiple of both engines' row blocks, 6 and 16).
pub(crate) const TILED_ROWS: usize = 192;

/// One unit of parallel work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    pub seq: usize,
    /// First query token of the item, relative to the sequence.
    pub q0: usize,
    /// Query tokens.
    pub qn: usize,
    /// First kv head.
    pub h0: usize,
    /// Kv heads.
    pub hn: usize,
    /// Key positions `k0..k1` this item attends to (intersected with each row's own range).
    pub k0: usize,
    pub k1: usize,
    /// Index of this item's partial state when it is one part of a split; `None`: the item
    /// covers its rows' whole range and writes the output itself.
    pub part: Option<usize>,
    /// Whether the rows run the tiled (prefill) kernel.
    pub tiled: bool,
}

/// The parts of one split: items with the same rows over consecutive key ranges, whose states
/// are `parts` (indices into the partial storage, in key order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    /// The rows (the item fields other than `k0`, `k1`, `part`) of every part.
    pub rows: Item,
    pub parts: std::ops::Range<usize>,
}

/// What a launch runs.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Longest first.
    pub items: Vec<Item>,
    pub splits: Vec<Split>,
    /// Partial states needed (the sum of the splits' parts).
    pub num_parts: usize,
}

/// The key range of query token `qi` of `seq` (position `ctx_len - q_len + qi`).
pub(crate) fn row_range(seq: &SeqSpan, qi: usize, window: usize) -> (usize, usize) {
    let pos = seq.ctx_len - seq.q_len + qi;
    let lo = if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    };
    (lo, pos + 1)
}

/// Plans a launch over `seqs` with `group` query heads per kv head, `kv_heads` kv heads,
/// pages of `page_size` tokens, a sliding `window` (0: none), on `threads` threads; sequences
/// with at least `tiled_min` query tokens run the tiled kernel ([`TILED_MIN_TOKENS`] by
/// default; `usize::MAX`: never, which the benchmark uses as its baseline).
pub(crate) fn plan(
    seqs: &[SeqSpan],
    group: usize,
    kv_heads: usize,
    page_size: usize,
    window: usize,
    threads: usize,
    tiled_min: usize,
) -> Plan {
    let mut units: Vec<(Item, usize)> = Vec::new(); // (unit, number of chunks)
    for (s, seq) in seqs.iter().enumerate() {
        let tiled = seq.q_len >= tiled_min;
        // Query tokens per unit: enough for 8 rows of one kv head (one register group) for
        // decode rows, TILED_ROWS for the tiled kernel.
        let rows = if tiled {
            TILED_ROWS
        } else {
            super::kernel::ROWS_PER_PASS
        };
        let qb = rows.div_ceil(group).max(1);
        for q0 in (0..seq.q_len).step_by(qb) {
            let qn = qb.min(seq.q_len - q0);
            let (k0, _) = row_range(seq, q0, window);
            let (_, k1) = row_range(seq, q0 + qn - 1, window);
            let unit = Item {
                seq: s,
                q0,
                qn,
                h0: 0,
                hn: kv_heads,
                k0,
                k1,
                part: None,
                tiled,
            };
            units.push((unit, chunks_of(k0, k1, chunk_len(page_size)).len()));
        }
    }
    let items_before_heads: usize = units.iter().map(|u| u.1).sum();
    let want = 4 * threads;
    let splits = if threads > 1 {
        want.div_ceil(items_before_heads.max(1)).clamp(1, kv_heads)
    } else {
        1
    };
    let hn = kv_heads.div_ceil(splits);
    let mut p = Plan::default();
    for (unit, n) in units {
        for h0 in (0..kv_heads).step_by(hn) {
            let rows = Item {
                h0,
                hn: hn.min(kv_heads - h0),
                ..unit
            };
            if n == 1 {
                p.items.push(rows);
                continue;
            }
            let first = p.num_parts;
            let chunk = chunk_len(page_size);
            for (i, (k0, k1)) in chunks_of(unit.k0, unit.k1, chunk).into_iter().enumerate() {
                p.items.push(Item {
                    k0,
                    k1,
                    part: Some(first + i),
                    ..rows
                });
            }
            p.num_parts += n;
            p.splits.push(Split {
                rows,
                parts: first..first + n,
            });
        }
    }
    // Longest first: key span times rows (prefill rows late in a long sequence see the most).
    p.items
        .sort_by_key(|it| std::cmp::Reverse((it.k1 - it.k0) * it.hn * it.qn));
    p
}

/// The chunk length for pages of `page_size` tokens: [`CHUNK`] rounded up to whole pages and
/// whole 32-token kernel blocks when pages are small; for pages longer than a chunk (e.g. one
/// contiguous page per sequence) to whole kernel blocks only, so such sequences split too.
pub(crate) fn chunk_len(page_size: usize) -> usize {
    let align = if page_size <= CHUNK {
        page_size * 32usize.div_ceil(page_size)
    } else {
        32
    };
    CHUNK.next_multiple_of(align)
}

/// `k0..k1` cut at multiples of `chunk` (a multiple of the alignment) into pieces of at most
/// `chunk` tokens; a last piece shorter than a quarter chunk joins the one before, so no item
/// is tiny. Never empty (an empty range gives one empty piece).
fn chunks_of(k0: usize, k1: usize, chunk: usize) -> Vec<(usize, usize)> {
    let mut cuts = vec![k0];
    let mut c = (k0 / chunk + 1) * chunk;
    while c < k1 {
        cuts.push(c);
        c += chunk;
    }
    if cuts.len() > 1 && k1 - cuts[cuts.len() - 1] < chunk / 4 {
        cuts.pop();
    }
    if cuts.len() > 1 && cuts[1] - cuts[0] < chunk / 4 {
        cuts.remove(1);
    }
    cuts.push(k1);
    cuts.windows(2).map(|w| (w[0], w[1])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spans(lens: &[(usize, usize)]) -> Vec<SeqSpan> {
        let mut q_start = 0;
        lens.iter()
            .map(|&(q_len, ctx_len)| {
                let s = SeqSpan {
                    q_start,
                    q_len,
                    ctx_len,
                };
                q_start += q_len;
                s
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Every (sequence, query token, kv head, key position) a row sees is covered by
        /// exactly one item; split parts are consecutive, aligned and each in one split.
        #[test]
        fn items_cover_every_row_and_position_once(
            lens in proptest::collection::vec((1usize..10, 0usize..3000), 1..4),
            group in prop::sample::select(vec![1usize, 4, 8]),
            kv_heads in 1usize..4,
            page_size in prop::sample::select(vec![16usize, 24, 128, 2048]),
            window in prop::sample::select(vec![0usize, 300]),
            threads in 1usize..5,
            tiled_min in prop::sample::select(vec![1usize, 8, usize::MAX]),
        ) {
            let lens: Vec<(usize, usize)> =
                lens.into_iter().map(|(q, c)| (q, q + c)).collect();
            let seqs = spans(&lens);
            let p = plan(&seqs, group, kv_heads, page_size, window, threads, tiled_min);
            let mut seen = std::collections::HashMap::new();
            for it in &p.items {
                for qi in it.q0..it.q0 + it.qn {
                    let (lo, hi) = row_range(&seqs[it.seq], qi, window);
                    for h in it.h0..it.h0 + it.hn {
                        for k in lo.max(it.k0)..hi.min(it.k1) {
                            *seen.entry((it.seq, qi, h, k)).or_insert(0) += 1;
                        }
                    }
                }
            }
            let mut want = 0;
            for (s, seq) in seqs.iter().enumerate() {
                for qi in 0..seq.q_len {
                    let (lo, hi) = row_range(seq, qi, window);
                    want += (hi - lo) * kv_heads;
                    for h in 0..kv_heads {
                        for k in lo..hi {
                            prop_assert_eq!(seen.get(&(s, qi, h, k)), Some(&1));
                        }
                    }
                }
            }
            prop_assert_eq!(seen.len(), want);
            // Parts: each index once, in key order within its split, same rows.
            let mut owner = vec![None; p.num_parts];
            for (si, sp) in p.splits.iter().enumerate() {
                prop_assert!(sp.parts.len() >= 2);
                let mut last = sp.rows.k0;
                for part in sp.parts.clone() {
                    prop_assert!(owner[part].is_none());
                    owner[part] = Some(si);
                    let it = p.items.iter().find(|i| i.part == Some(part)).unwrap();
                    prop_assert_eq!(Item { k0: sp.rows.k0, k1: sp.rows.k1, part: None, ..*it }, sp.rows);
                    prop_assert_eq!(it.k0, last);
                    prop_assert!(it.k1 - it.k0 <= chunk_len(page_size) * 3 / 2);
                    last = it.k1;
                }
                prop_assert_eq!(last, sp.rows.k1);
            }
            prop_assert!(owner.iter().all(|o| o.is_some()));
        }

        /// The key cuts do not depend on the thread count (results do not either).
        #[test]
        fn cuts_ignore_thread_count(ctx in 1usize..5000, threads in 2usize..9) {
            let seqs = spans(&[(1, ctx)]);
            let cuts = |t| {
                let mut c: Vec<(usize, usize)> =
                    plan(&seqs, 4, 2, 16, 0, t, TILED_MIN_TOKENS).items.iter().map(|i| (i.k0, i.k1)).collect();
                c.sort();
                c.dedup();
                c
            };
            prop_assert_eq!(cuts(1), cuts(threads));
        }
    }

    #[test]
    fn prefill_units_cut_at_the_chunk() {
        // 2 x 1024 prefill: 22 units per sequence, none cut.
        let p = plan(
            &spans(&[(1024, 1024), (1024, 1024)]),
            4,
            8,
            128,
            0,
            2,
            TILED_MIN_TOKENS,
        );
        assert!(p.splits.is_empty() && p.items.iter().all(|i| i.tiled));
        // A 16-token chunk after 5000 cached tokens: cut at 2048 and 4096 (the last piece
        // is long enough to stand alone).
        let p = plan(&spans(&[(16, 5016)]), 4, 8, 16, 0, 2, TILED_MIN_TOKENS);
        let mut cuts: Vec<(usize, usize)> = p.items.iter().map(|i| (i.k0, i.k1)).collect();
        cuts.sort();
        cuts.dedup();
        assert_eq!(cuts, [(0, 2048), (2048, 4096), (4096, 5016)]);
        assert!(!p.splits.is_empty() && p.splits.iter().all(|s| s.parts.len() == 3));
    }

    #[test]
    fn few_long_sequences_give_every_thread_work() {
        // 2 sequences x 32k tokens, decode, page 128: 16 chunks of 2048 each.
        let seqs = spans(&[(1, 32768), (1, 32768)]);
        let p = plan(&seqs, 4, 8, 128, 0, 2, TILED_MIN_TOKENS);
        assert_eq!(p.items.len(), 32);
        assert_eq!(p.splits.len(), 2);
        assert!(p.items.iter().all(|i| i.k1 - i.k0 == 2048 && i.hn == 8));
        // Many short sequences: no split, all heads together.
        let seqs = spans(&vec![(1, 300); 64]);
        let p = plan(&seqs, 4, 8, 16, 0, 2, TILED_MIN_TOKENS);
        assert_eq!(p.items.len(), 64);
        assert!(p.splits.is_empty() && p.items.iter().all(|i| i.hn == 8));
        // One contiguous 32768-token page per sequence splits the same way.
        let p = plan(
            &spans(&[(1, 32768), (1, 32768)]),
            4,
            8,
            32768,
            0,
            2,
            TILED_MIN_TOKENS,
        );
        assert_eq!(p.items.len(), 32);
        // One short sequence on 4 threads: heads divided.
        let p = plan(&spans(&[(1, 100)]), 4, 8, 16, 0, 4, TILED_MIN_TOKENS);
        assert_eq!(p.items.len(), 8);
    }
}
