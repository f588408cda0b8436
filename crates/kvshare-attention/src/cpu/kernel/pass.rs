//! The single-pass kernel's body, generic over the lanes: the row groups and their
//! online-softmax state ([`attend_impl`]), one K/V block for a group ([`block`]), the score
//! product ([`qk`], or a [`Scores`] of another path) and the value product ([`pv`]).

// Index loops over small fixed arrays read more plainly than iterator chains in SIMD code.
#![allow(clippy::needless_range_loop)]

use half::bf16;

use super::prefetch::{self, Ahead};
use super::{split_pairs, KvElem, Lanes, Rows, SeqKv, BT, ROWS_PER_PASS, SUB};

/// Online-softmax state of up to 8 adjacent rows of one kv head.
pub(super) struct Group {
    r0: usize,
    ng: usize,
    kv_head: usize,
    start: usize,
    end: usize,
    m: [f32; ROWS_PER_PASS],
    l: [f32; ROWS_PER_PASS],
}

/// How [`block`] takes a block's scores: `s[t * NG + r]` = row `r`'s (scaled) query times the
/// K row at `krows[t]`, for `TT` rows that are valid for `d` reads.
pub(super) trait Scores<T: KvElem> {
    /// # Safety
    /// The CPU must have `L`'s features; each `krows[t]` valid for `d` reads; `b.q` holds the
    /// group's `NG` rows of `d`.
    unsafe fn qk<L: Lanes, const NG: usize, const TT: usize>(
        b: &Block<'_>,
        krows: [*const T; TT],
        d: usize,
        s: &mut [f32],
    );
    /// Whether the values go through [`Scores::pv`] (bf16 pairs) instead of the f32 [`pv`]:
    /// then [`block`] rounds the probabilities with [`Scores::round_p`] before summing them,
    /// and [`attend_impl`] puts the accumulators back in element order with
    /// [`Scores::finish`].
    const PAIR_VALUES: bool = false;
    /// Rounds the probabilities `p` (a multiple of 16 values) to what [`Scores::pv`] multiplies.
    ///
    /// # Safety
    /// The CPU must have the features of the path that runs this scorer.
    #[inline(always)]
    unsafe fn round_p(_p: &mut [f32]) {}
    /// `acc[r][..d] += sum_t p[t * NG + r] v[t]` over the `nt <= SUB` V rows
    /// `v[t] = v0 + t * ss`, for `NG` rows (`U`: [`block`]'s chunks of 16 columns per value
    /// step), in the pair engine's accumulator order.
    ///
    /// # Safety
    /// As [`Scores::round_p`]; the `nt` V rows `v0 + t * ss` valid for `d` reads; `acc` holds
    /// `NG` rows of `d`.
    #[inline(always)]
    unsafe fn pv<const NG: usize, const U: usize>(
        _acc: &mut [f32],
        _v: (*const T, usize, usize),
        _p: &[f32],
        _d: usize,
    ) {
        unreachable!("only called where PAIR_VALUES is true")
    }
    /// Puts rows of `d` accumulators from [`Scores::pv`]'s order back in element order.
    #[inline(always)]
    fn finish(_out: &mut [f32], _d: usize) {}
}

/// Scores from the f32 query rows ([`qk`]): every path and K/V type.
pub(super) struct F32Scores;

impl<T: KvElem> Scores<T> for F32Scores {
    #[inline(always)]
    unsafe fn qk<L: Lanes, const NG: usize, const TT: usize>(
        b: &Block<'_>,
        krows: [*const T; TT],
        d: usize,
        s: &mut [f32],
    ) {
        // SAFETY: the caller gives `L`'s features and `krows` valid for `d` reads (the `Scores::qk`
        // contract), which is what `qk` needs; `b.q` is the group's rows.
        unsafe { qk::<L, T, NG, TT>(b.q, krows, d, s) }
    }
}

/// # Safety
/// The CPU must have `L`'s and `S`'s features; `rows` and `out`, `m_out`, `l_out` as
/// [`attend_partial`] checks them (`kv`'s rows are checked against `kv.k` and `kv.v` in
/// [`block`]).
#[inline(always)]
pub(super) unsafe fn attend_impl<L: Lanes, T: KvElem, S: Scores<T>>(
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m_out: &mut [f32],
    l_out: &mut [f32],
) {
    // SAFETY: the caller gives `L`'s and `S`'s features and the checked lengths; every K/V pointer
    // is formed in `block`, which checks its rows against `kv.k` and `kv.v` first, and the
    // prefetches only hint addresses.
    unsafe {
        let lay = kv.layout;
        let d = lay.head_dim;
        let n = rows.lo.len();
        let mut groups = Vec::new();
        let mut r = 0;
        while r < n {
            let kh = rows.kv_head[r];
            let run = (r..n.min(r + ROWS_PER_PASS))
                .take_while(|&i| rows.kv_head[i] == kh)
                .count();
            let ng = [8, 4, 2, 1].into_iter().find(|&g| g <= run).unwrap_or(1);
            groups.push(Group {
                r0: r,
                ng,
                kv_head: kh,
                start: rows.lo[r..r + ng].iter().copied().min().unwrap_or(0),
                end: rows.hi[r..r + ng].iter().copied().max().unwrap_or(0),
                m: [f32::NEG_INFINITY; ROWS_PER_PASS],
                l: [0.0; ROWS_PER_PASS],
            });
            r += ng;
        }
        out[..n * d].fill(0.0);
        // Split pairs (bf16): the query rows in the order the K/V chunks load in.
        let w = L::W;
        let split_q: Vec<f32>;
        let q = if L::split::<T>() && d >= 2 * w {
            let mut x = rows.q[..n * d].to_vec();
            split_pairs::<false>(w, &mut x, d);
            split_q = x;
            &split_q[..]
        } else {
            rows.q
        };
        let start = groups.iter().map(|g| g.start).min().unwrap_or(0);
        let end = groups.iter().map(|g| g.end).max().unwrap_or(0);
        // The heads the groups read, whose rows of the next block are prefetched.
        let h_lo = groups.iter().map(|g| g.kv_head).min().unwrap_or(0);
        let h_hi = groups.iter().map(|g| g.kv_head).max().unwrap_or(0);
        let rows_at = |base: usize, tokens: usize| {
            let (ss, hs) = (lay.slot_stride, lay.head_stride);
            prefetch::Rows::block(base, tokens, ss, h_lo, h_hi + 1 - h_lo, hs, d)
        };
        let block_at = |pos: usize| {
            let slot = pos % lay.page_size;
            let page = kv.pages[pos / lay.page_size] as usize;
            (
                page * lay.page_stride + slot * lay.slot_stride,
                BT.min(lay.page_size - slot).min(end - pos),
            )
        };
        let mut pos = start;
        if pos < end {
            // The first block has nobody to prefetch it: request it at once.
            let (base, nb) = block_at(pos);
            Ahead::new(kv.k, kv.v, rows_at(base, nb)).finish();
        }
        while pos < end {
            let (base, nb) = block_at(pos);
            // The next block (same page or the next one): every group requests its share of its
            // lines while it computes this one.
            let next = pos + nb;
            let mut ahead = if next < end {
                let (nbase, nn) = block_at(next);
                Ahead::new(kv.k, kv.v, rows_at(nbase, nn))
            } else {
                Ahead::default()
            };
            let sees = |g: &Group| pos < g.end && pos + nb > g.start;
            let mut busy = groups.iter().filter(|g| sees(g)).count();
            for g in groups.iter_mut() {
                if !sees(g) {
                    continue;
                }
                let rr = g.r0..g.r0 + g.ng;
                let b = Block {
                    base: base + g.kv_head * lay.head_stride,
                    pos,
                    n: nb,
                    q: &q[rr.start * d..rr.end * d],
                    q_bf16: rows
                        .q_bf16
                        .map(|(qb, sc)| (&qb[rr.start * d..rr.end * d], sc)),
                    lo: &rows.lo[rr.clone()],
                    hi: &rows.hi[rr.clone()],
                };
                let acc = &mut out[rr.start * d..rr.end * d];
                // This group's share of the next block's lines, spread over its tokens.
                let per_tok = ahead.left().div_ceil(busy).div_ceil(2 * nb);
                busy -= 1;
                let pf = (&mut ahead, per_tok);
                // (rows, tokens per score step, chunks per value step): rows x tokens = W score
                // accumulators (one transposed horizontal sum), about W value accumulators.
                let (m, l) = (&mut g.m, &mut g.l);
                match (L::W, g.ng) {
                    (8, 8) => block::<L, T, S, 8, 1, 1>(kv, &b, acc, m, l, pf),
                    (8, 4) => block::<L, T, S, 4, 2, 2>(kv, &b, acc, m, l, pf),
                    (8, 2) => block::<L, T, S, 2, 4, 4>(kv, &b, acc, m, l, pf),
                    (8, _) => block::<L, T, S, 1, 8, 8>(kv, &b, acc, m, l, pf),
                    (_, 8) => block::<L, T, S, 8, 2, 2>(kv, &b, acc, m, l, pf),
                    (_, 4) => block::<L, T, S, 4, 4, 4>(kv, &b, acc, m, l, pf),
                    (_, 2) => block::<L, T, S, 2, 8, 4>(kv, &b, acc, m, l, pf),
                    _ => block::<L, T, S, 1, 16, 8>(kv, &b, acc, m, l, pf),
                }
            }
            ahead.finish();
            pos += nb;
        }
        for g in &groups {
            for r in 0..g.ng {
                m_out[g.r0 + r] = g.m[r];
                l_out[g.r0 + r] = g.l[r];
            }
        }
        if L::split::<T>() && d >= 2 * w {
            // The accumulators back in element order.
            split_pairs::<true>(w, &mut out[..n * d], d);
        }
        if S::PAIR_VALUES {
            S::finish(&mut out[..n * d], d);
        }
    }
}

/// One K/V block for one row group.
pub(super) struct Block<'a> {
    /// Element offset of the block's first row for the group's kv head.
    pub(super) base: usize,
    /// Position of the first token.
    pub(super) pos: usize,
    /// Tokens.
    pub(super) n: usize,
    pub(super) q: &'a [f32],
    /// The group's rows of [`Rows::q_bf16`] and the scale.
    pub(super) q_bf16: Option<(&'a [bf16], f32)>,
    pub(super) lo: &'a [usize],
    pub(super) hi: &'a [usize],
}

/// Scores of `TT` K rows against `NG` query rows: `s[t * NG + r] = q[r] . k[t]`. Each K chunk
/// is converted once and used by every row; `TT * NG` independent accumulators hide the FMA
/// latency. `q` holds `NG * d` values; each `krows[t]` must be valid for `d` reads (`block`
/// checks its whole block once: per-row slices cost a bounds check and two stores per row).
///
/// # Safety
/// The CPU must have `L`'s features; each `krows[t]` valid for `d` reads of `T`.
#[inline(always)]
pub(super) unsafe fn qk<L: Lanes, T: KvElem, const NG: usize, const TT: usize>(
    q: &[f32],
    krows: [*const T; TT],
    d: usize,
    s: &mut [f32],
) {
    // SAFETY: the caller gives `L`'s features and `krows[t]` valid for `d` reads; every chunk read
    // is at `c + 2W <= dw <= d` (or `c + W <= dw`) and the tail reads `dw..d`; `q` and `s` are
    // slices, `s` checked for `W` before the vector store.
    unsafe {
        let w = L::W;
        let dw = d / w * w;
        let q = &q[..NG * d];
        // Accumulator `t * NG + r`; one flat array, so that the transposed sum takes it as it is
        // (building a second array from a nested one kept both in memory, 3 stores per
        // accumulator and call).
        const { assert!(TT * NG <= 16) };
        let mut a = [L::zero(); 16];
        let mut c = 0;
        // Two chunks per turn: the loop's own 3 instructions were a sixth of it.
        while c + 2 * w <= dw {
            if L::split::<T>() {
                qk_pair::<L, T, NG, TT>(&mut a, q, krows, d, c);
            } else {
                qk_chunk::<L, T, NG, TT>(&mut a, q, krows, d, c);
                qk_chunk::<L, T, NG, TT>(&mut a, q, krows, d, c + w);
            }
            c += 2 * w;
        }
        if c < dw {
            qk_chunk::<L, T, NG, TT>(&mut a, q, krows, d, c);
        }
        if TT * NG == w && dw == d {
            assert!(s.len() >= w);
            L::store(s.as_mut_ptr(), L::hsum_w(&a));
            return;
        }
        // The sums first, in a loop simple enough to unroll: an accumulator indexed inside the
        // loops below would keep the whole array in memory for the common path too.
        let mut sums = [0f32; 16];
        for i in 0..TT * NG {
            sums[i] = L::hsum(a[i]);
        }
        for t in 0..TT {
            for r in 0..NG {
                let mut x = sums[t * NG + r];
                for c in dw..d {
                    x += q[r * d + c] * (*krows[t].add(c)).to_f32();
                }
                s[t * NG + r] = x;
            }
        }
    }
}

/// One `W`-wide chunk at `c` of [`qk`]: `a[t * NG + r] += q[r][c..] * k[t][c..]`.
///
/// # Safety
/// As [`qk`]; `c + W <= d`.
#[inline(always)]
pub(super) unsafe fn qk_chunk<L: Lanes, T: KvElem, const NG: usize, const TT: usize>(
    a: &mut [L::V; 16],
    q: &[f32],
    krows: [*const T; TT],
    d: usize,
    c: usize,
) {
    // SAFETY: the caller gives `L`'s features, `krows[t]` valid for `d` reads and `c + W <= d`, so
    // each `W`-wide load at `krows[t] + c` is in bounds; `qk_fma` gets the same `c`.
    unsafe {
        // Plain loops around the loads, not `std::array::from_fn`: a closure does not inherit
        // the caller's target features, and one LLVM keeps out of line turns each intrinsic of
        // the conversion into a call (the fp8 E4M3 conversion, a few more instructions than
        // f16's, ran 6x slower so). See `Avx512::hsum_w`.
        let mut kk = [L::zero(); TT];
        for t in 0..TT {
            kk[t] = L::load_kv(krows[t].add(c));
        }
        qk_fma::<L, NG, TT>(a, q, kk, d, c);
    }
}

/// The chunk pair at `c` of [`qk`] through [`Lanes::load_kv2`] (for [`Lanes::split`], whose
/// query rows are in [`split_pairs`]).
///
/// # Safety
/// As [`qk`]; `c + 2W <= d`.
#[inline(always)]
pub(super) unsafe fn qk_pair<L: Lanes, T: KvElem, const NG: usize, const TT: usize>(
    a: &mut [L::V; 16],
    q: &[f32],
    krows: [*const T; TT],
    d: usize,
    c: usize,
) {
    // SAFETY: the caller gives `L`'s features, `krows[t]` valid for `d` reads and `c + 2W <= d`, so
    // each `2W`-wide pair load at `krows[t] + c` is in bounds; `qk_fma` gets `c` and `c + W`.
    unsafe {
        // Plain loops around the loads: see `qk_chunk`.
        let mut kk = [[L::zero(); 2]; TT];
        for t in 0..TT {
            kk[t] = L::load_kv2(krows[t].add(c));
        }
        for h in 0..2 {
            qk_fma::<L, NG, TT>(a, q, std::array::from_fn(|t| kk[t][h]), d, c + h * L::W);
        }
    }
}

/// `a[t * NG + r] += q[r][c..c + W] * kk[t]`: the products of one converted chunk per token.
///
/// # Safety
/// The CPU must have `L`'s features; `q` holds `NG` rows of `d` with `c + W <= d`.
#[inline(always)]
pub(super) unsafe fn qk_fma<L: Lanes, const NG: usize, const TT: usize>(
    a: &mut [L::V; 16],
    q: &[f32],
    kk: [L::V; TT],
    d: usize,
    c: usize,
) {
    // SAFETY: the caller gives `L`'s features, `q` holds `NG` rows of `d` and `c + W <= d`, so the
    // `W` f32 at `r * d + c` lie inside `q`.
    unsafe {
        for r in 0..NG {
            let qq = L::load(q.as_ptr().add(r * d + c));
            for t in 0..TT {
                a[t * NG + r] = L::fma(qq, kk[t], a[t * NG + r]);
            }
        }
    }
}

/// The `U` chunks at `c..c + U * W` of the row at `row`, as the kernel keeps them: in order,
/// or in [`split_pairs`] for [`Lanes::split`] inside the row's whole pairs (`c < pairs`, the pairs'
/// end). Needs `U` even and `c` a multiple of `2W`, or `U == 1`.
///
/// # Safety
/// The CPU must have `L`'s features; `row` valid for `c + U * W` reads of `T`.
#[inline(always)]
pub(super) unsafe fn load_chunks<L: Lanes, T: KvElem, const U: usize>(
    row: *const T,
    c: usize,
    pairs: usize,
) -> [L::V; U] {
    // SAFETY: the caller gives `L`'s features and `row` valid for `c + U * W` reads; a half pair
    // starts at `c - h * W >= 0` and ends at `c + W`, a whole pair at `c + W * u` ends within `c +
    // U * W`.
    unsafe {
        let w = L::W;
        if !L::split::<T>() || c >= pairs {
            // A plain loop around the loads: see `qk_chunk`.
            let mut vv = [L::zero(); U];
            for u in 0..U {
                vv[u] = L::load_kv(row.add(c + w * u));
            }
            return vv;
        }
        let mut vv = [L::zero(); U];
        if U == 1 {
            // One half of a pair: the even elements when `c` starts the pair, else the odd ones.
            let h = c / w % 2;
            vv[0] = L::load_kv2(row.add(c - h * w))[h];
        } else {
            for u in (0..U).step_by(2) {
                [vv[u], vv[u + 1]] = L::load_kv2(row.add(c + w * u));
            }
        }
        vv
    }
}

/// `acc[r][c..c + WU] += sum_t p[t * NG + r] * v[t][c..c + WU]` (`W` = `L::W`) over the
/// `nt` V rows `v[t] = v0 + t * ss`: each V chunk converted once for all rows, `NG * U`
/// independent accumulators. Needs `c + WU <= d` and every row valid for `d` reads (`block`
/// checks its whole block once).
///
/// # Safety
/// The CPU must have `L`'s features; the `nt` V rows `v0 + t * ss` valid for `d` reads of `T`.
#[inline(always)]
pub(super) unsafe fn pv<L: Lanes, T: KvElem, const NG: usize, const U: usize>(
    acc: &mut [f32],
    (v0, ss, nt): (*const T, usize, usize),
    p: &[f32],
    c: usize,
    d: usize,
) {
    // SAFETY: the caller gives `L`'s features and the `nt` rows valid for `d` reads; the assert
    // keeps every `acc` access inside `NG` rows of `d` at `c + W * U <= d`, and `p` holds `nt * NG`
    // values.
    unsafe {
        let w = L::W;
        assert!(c + w * U <= d && acc.len() >= NG * d && p.len() >= nt * NG);
        let mut a: [[L::V; U]; NG] = std::array::from_fn(|r| {
            std::array::from_fn(|u| L::load(acc.as_ptr().add(r * d + c + w * u)))
        });
        // A whole sub-block (the usual case) with its count known, so the loop unrolls.
        if nt == SUB {
            pv_rows::<L, T, NG, U>(&mut a, (v0, ss, SUB), p, c, d);
        } else {
            pv_rows::<L, T, NG, U>(&mut a, (v0, ss, nt), p, c, d);
        }
        for (r, ar) in a.iter().enumerate() {
            for (u, v) in ar.iter().enumerate() {
                L::store(acc.as_mut_ptr().add(r * d + c + w * u), *v);
            }
        }
    }
}

/// [`pv`]'s loop over the rows. A function, not a closure: a closure does not inherit the
/// caller's target features, and while the `from_fn` closures around one intrinsic here are
/// inlined (checked in the disassembly), a closure around this loop was not (6.60M → 7.45M
/// instructions per test launch).
///
/// # Safety
/// As [`pv`], whose assert holds here: `c + W * U <= d`, `p.len() >= nt * NG`.
#[inline(always)]
pub(super) unsafe fn pv_rows<L: Lanes, T: KvElem, const NG: usize, const U: usize>(
    a: &mut [[L::V; U]; NG],
    (v0, ss, nt): (*const T, usize, usize),
    p: &[f32],
    c: usize,
    d: usize,
) {
    // SAFETY: the caller gives `L`'s features, rows valid for `d` reads with `c + W * U <= d` (so
    // `load_chunks` stays in each row) and `p.len() >= nt * NG` (so `get_unchecked(t * NG + r)` is
    // in bounds: `t < nt`, `r < NG`).
    unsafe {
        let pairs = d / (2 * L::W) * (2 * L::W);
        for t in 0..nt {
            let vv = load_chunks::<L, T, U>(v0.add(t * ss), c, pairs);
            for (r, ar) in a.iter_mut().enumerate() {
                let pp = L::splat(*p.get_unchecked(t * NG + r));
                for u in 0..U {
                    ar[u] = L::fma(pp, vv[u], ar[u]);
                }
            }
        }
    }
}

/// Advances the online softmax of `NG` rows (`TT` tokens per score step, `U` chunks per value
/// step) over one block. Every pointer read is inside `b.q`, `acc`, or the block's K/V rows,
/// which are checked to lie inside `kv.k` and `kv.v` once, up front.
///
/// # Safety
/// The CPU must have `L`'s and `S`'s features; `acc` holds `NG` rows of `d`; `b`'s rows are
/// those of one group of [`attend_impl`] (its `q`, `lo`, `hi` hold `NG` rows).
#[inline(always)]
pub(super) unsafe fn block<
    L: Lanes,
    T: KvElem,
    S: Scores<T>,
    const NG: usize,
    const TT: usize,
    const U: usize,
>(
    kv: &SeqKv<'_, T>,
    b: &Block<'_>,
    acc: &mut [f32],
    m: &mut [f32; ROWS_PER_PASS],
    l: &mut [f32; ROWS_PER_PASS],
    (ahead, per_tok): (&mut Ahead, usize),
) {
    // SAFETY: the caller gives `L`'s and `S`'s features; the K and V rows of the block are checked
    // to lie inside `kv.k` and `kv.v` above (the last row, `base + (n - 1) * ss + d`), so every row
    // pointer handed to `qk`, `pv` and `S` is valid for `d` reads; `acc` and the scores are slices.
    unsafe {
        let lay = kv.layout;
        let d = lay.head_dim;
        let w = L::W;
        let dw = d / w * w;
        let du = d / (w * U) * (w * U);
        let acc = &mut acc[..NG * d];
        let lo: [usize; NG] = std::array::from_fn(|r| b.lo[r]);
        let hi: [usize; NG] = std::array::from_fn(|r| b.hi[r]);
        let (all_lo, all_hi) = (
            lo.iter().copied().max().unwrap_or(0),
            hi.iter().copied().min().unwrap_or(0),
        );
        let (base, pos, n) = (b.base, b.pos, b.n.min(BT));
        if n == 0 {
            return;
        }
        // Row `t` of the block is `base + t * ss .. + d` in K and in V: the last one inside both
        // slices means all are (a caller bug otherwise: the launch validated the layout).
        let ss = lay.slot_stride;
        let last = (n - 1)
            .checked_mul(ss)
            .and_then(|x| x.checked_add(base))
            .and_then(|x| x.checked_add(d));
        assert!(last.is_some_and(|e| e <= kv.k.len() && e <= kv.v.len()));
        let (k0, v0) = (kv.k.as_ptr().add(base), kv.v.as_ptr().add(base));
        let mut s = [0f32; BT * ROWS_PER_PASS];
        // Scores (the next block's lines requested as we go: see `prefetch.rs`).
        let mut t = 0;
        while t + TT <= n {
            ahead.step(per_tok * TT);
            let kr = std::array::from_fn(|i| k0.add((t + i) * ss));
            S::qk::<L, NG, TT>(b, kr, d, &mut s[t * NG..(t + TT) * NG]);
            t += TT;
        }
        while t < n {
            ahead.step(per_tok);
            S::qk::<L, NG, 1>(b, [k0.add(t * ss)], d, &mut s[t * NG..(t + 1) * NG]);
            t += 1;
        }
        // An int8 per-token-head cache: each position's score times its K row's scale (before
        // the cap and the mask), its V row's scale kept for the value product.
        let mut vscale = [1f32; BT];
        if let Some(rs) = kv.row_scales {
            for t in 0..n {
                let (ks, vs) = rs.at(base + t * ss, d);
                for r in 0..NG {
                    s[t * NG + r] *= ks;
                }
                vscale[t] = vs;
            }
        }
        let sp = &mut s[..(n * NG).div_ceil(w) * w];
        sp[n * NG..].fill(f32::NEG_INFINITY);
        let s = &mut sp[..n * NG];
        if kv.softcap > 0.0 {
            let cap = kv.softcap;
            for x in s.iter_mut() {
                *x = cap * (*x / cap).tanh();
            }
        }
        if pos < all_lo || pos + n > all_hi {
            for t in 0..n {
                for r in 0..NG {
                    if pos + t < lo[r] || pos + t >= hi[r] {
                        s[t * NG + r] = f32::NEG_INFINITY;
                    }
                }
            }
        }
        // Online softmax, vectorised over the t-major scores: lane i of every W-chunk belongs
        // to row i % NG (W is a multiple of NG); the padding lanes hold -inf.
        let chunks = sp.len() / w;
        let mut mx = L::splat(f32::NEG_INFINITY);
        for c in 0..chunks {
            mx = L::max(mx, L::load(sp.as_ptr().add(c * w)));
        }
        let mut lanes = [0f32; 16];
        L::store(lanes.as_mut_ptr(), mx);
        for r in 0..NG {
            let bm = (r..w)
                .step_by(NG)
                .map(|i| lanes[i])
                .fold(f32::NEG_INFINITY, f32::max);
            if bm > m[r] {
                if m[r] > f32::NEG_INFINITY {
                    let alpha = (m[r] - bm).exp();
                    l[r] *= alpha;
                    acc[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= alpha);
                }
                m[r] = bm;
            }
        }
        let shift: [f32; 16] = std::array::from_fn(|i| {
            if m[i % NG] > f32::NEG_INFINITY {
                m[i % NG]
            } else {
                0.0
            }
        });
        let shift = L::load(shift.as_ptr());
        let mut sum = L::zero();
        for c in 0..chunks {
            let p = L::exp(L::sub(L::load(sp.as_ptr().add(c * w)), shift));
            L::store(sp.as_mut_ptr().add(c * w), p);
            if !S::PAIR_VALUES {
                sum = L::add(sum, p);
            }
        }
        if S::PAIR_VALUES {
            // The sums take the probabilities the values multiply.
            S::round_p(sp);
            for c in 0..chunks {
                sum = L::add(sum, L::load(sp.as_ptr().add(c * w)));
            }
        }
        L::store(lanes.as_mut_ptr(), sum);
        for i in 0..w {
            l[i % NG] += lanes[i];
        }
        if kv.row_scales.is_some() {
            // The value product takes each probability times its V row's scale; the sums above
            // took them as they are.
            for t in 0..n {
                for r in 0..NG {
                    sp[t * NG + r] *= vscale[t];
                }
            }
        }
        let s = &sp[..n * NG];
        // Values, SUB tokens at a time: the rows of one block are a slot stride apart (2 KiB in
        // the usual layout), so all 32 map to two L1 sets and would evict each other between the
        // passes over a row's chunks; SUB rows fit the ways, and the accumulators' extra loads and
        // stores per SUB tokens cost little.
        let mut t0 = 0;
        while t0 < n {
            let t1 = n.min(t0 + SUB);
            let (vr, st) = ((v0.add(t0 * ss), ss, t1 - t0), &s[t0 * NG..t1 * NG]);
            ahead.step(per_tok * (t1 - t0));
            if S::PAIR_VALUES {
                S::pv::<NG, U>(acc, vr, st, d);
            } else {
                let mut c = 0;
                while c < du {
                    pv::<L, T, NG, U>(acc, vr, st, c, d);
                    c += w * U;
                }
                while c < dw {
                    pv::<L, T, NG, 1>(acc, vr, st, c, d);
                    c += w;
                }
            }
            t0 = t1;
        }
        for c in dw..d {
            for t in 0..n {
                let v = (*v0.add(t * ss + c)).to_f32();
                for r in 0..NG {
                    acc[r * d + c] += s[t * NG + r] * v;
                }
            }
        }
    }
}
