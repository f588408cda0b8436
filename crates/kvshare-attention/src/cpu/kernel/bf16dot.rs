//! The bf16 pair engines, on the `avx512` path of CPUs with AVX512_BF16, for a bf16 query
//! against a bf16 cache: products by `vdpbf16ps` (16 lanes, each adding the products of one
//! bf16 pair to an f32 accumulator). Two users: the tiled (prefill) kernel's engine ([`Dot`]:
//! scores `Q K^T` by pairs, values by the f32 engine, [`Fma`]) and the decode kernel ([`Pairs`]:
//! scores and values `P V` by pairs).
//!
//! Exactness. The products of two bf16 are exact in f32 and `vdpbf16ps` adds them to f32
//! accumulators with round-to-nearest-even, as the f32 engine's FMAs do on the same values
//! converted; only the order of the additions differs (pairs of head-dim elements), and inputs
//! below f32's normal range are read as zero (bf16 subnormals, under 1.2e-38). The query is
//! taken as the caller gave it ([`Rows::q_bf16`], before the scale) and the scale multiplies
//! each score, so no score input is rounded to bf16 that was not bf16 already. Decode's values
//! multiply the probabilities rounded to bf16 (`vcvtneps2bf16`, as the AMX engine does in
//! prefill), and the softmax sum adds the same rounded values: each probability moves by at
//! most 2^-8 of itself (bf16 keeps 8 significant bits), so an output by at most 2^-8 of the
//! largest `|v - out|`, about the
//! rounding of a bf16 output (the kernel tests bound it; mean 1.4e-4 for V in [-1, 1]).
//! Prefill's values stay f32.
//!
//! Decode scores. The K rows are read in place: a 64-byte chunk of a row is 16 pairs in element
//! order, and so is the query's chunk, so `vdpbf16ps` on the two adds 16 partial sums per
//! query row and key; the transposed horizontal sum of the decode kernel's 16 accumulators
//! (`Lanes::hsum_w`) gives their 16 scores. Per key and kv head with 4 query rows of 128, that
//! is 16 `vdpbf16ps` where the f32 scores take 32 FMAs and 8 conversions.
//!
//! Decode values ([`pv_cols`]). Two tokens' V chunks of 32 are interleaved by `vpunpcklwd` /
//! `vpunpckhwd` into two vectors of 16 (token t, token t + 1) pairs, and each row's
//! probabilities of the two tokens are one broadcast pair, so one `vdpbf16ps` adds both tokens'
//! products to 16 accumulators. Per key and kv head at 4 rows of 128: 16 `vdpbf16ps` and 4
//! unpacks where the f32 values take 32 FMAs and 8 conversions. The unpacks work within
//! 128-bit lanes, so the accumulators hold their columns in [`pair_column`] order until
//! `Scores::finish` puts each row back in element order.
//!
//! Layout (tiled). The K tile is stored as pairs, transposed: `kp[j * KT + t]` holds elements `2j`
//! (low half) and `2j + 1` (high half) of key `t`'s row, so a score block is a broadcast of
//! one query pair times 16 keys' pairs, `d / 2` steps per block where the f32 engine takes
//! `d`. The transpose is the f32 one on the pairs' bits (shuffles move bits, they do not
//! round). The head dim must be even (the path falls back to the f32 engine otherwise).
//!
//! Timed on Zen 4: `vdpbf16ps zmm` issues one per cycle, as `vfmadd231ps zmm`, so the score
//! half of a block takes half the cycles (docs/performance.md has the AVX-512 figures).

#![allow(clippy::needless_range_loop)]

use half::bf16;
use std::arch::x86_64::*;

use super::avx512::Avx512;
use super::tiled::{Engine, Fma, FMA_MR, KT};
use super::{Block, KvElem, Lanes, Rows, Scores, SeqKv, SUB};
use crate::cpu::isa::Isa;

/// The bf16 pair engine (see the module doc).
pub(super) struct Dot<'q> {
    /// The V tile and the value product.
    fma: Fma<Avx512>,
    /// The queries, unscaled bf16 rows of `d` ([`Rows::q_bf16`]).
    q: &'q [bf16],
    scale: f32,
    d: usize,
    /// K tile as transposed pairs: `kp[j * KT + t]`.
    kp: Vec<u32>,
}

impl<'q> Dot<'q> {
    /// `None` when the engine cannot run `rows`: no bf16 query, or an odd head dim.
    pub(super) fn new(d: usize, rows: &Rows<'q>) -> Option<Self> {
        let (q, scale) = rows.q_bf16?;
        if !d.is_multiple_of(2) || q.len() < rows.lo.len() * d {
            return None;
        }
        Some(Dot {
            fma: Fma::new(d),
            q,
            scale,
            d,
            kp: vec![0; d / 2 * KT],
        })
    }
}

impl Engine<bf16> for Dot<'_> {
    const MR: usize = FMA_MR;
    const KT: usize = KT;

    #[inline(always)]
    unsafe fn queries(&mut self, q: &[f32], n: usize, d: usize) {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and AVX512_BF16 (the `Engine` contract
        // of this engine, which only `run_avx512` builds), as the f32 engine needs.
        unsafe {
            assert!(d == self.d && self.q.len() >= n * d);
            <Fma<Avx512> as Engine<bf16>>::queries(&mut self.fma, q, n, d);
        }
    }

    #[inline(always)]
    unsafe fn kv_tile(&mut self, k: &[&[bf16]], v: &[&[bf16]], d: usize) {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and AVX512_BF16 (the `Engine` contract
        // of this engine, which only `run_avx512` builds); the pair loads and stores stay inside
        // the rows and `kp` by the asserts above them.
        unsafe {
            let nb = k.len();
            let dp = d / 2;
            assert!(nb <= KT && d == self.d && self.kp.len() >= dp * KT);
            assert!(k.iter().all(|r| r.len() >= d));
            // 16 keys x 16 pairs at a time: each key's 32 elements loaded as 16 pairs, the block
            // transposed on the pairs' bits, stored as 16 rows of pairs.
            let (tw, pw) = (nb / 16 * 16, dp / 16 * 16);
            let mut a = [_mm512_setzero_ps(); 16];
            for t0 in (0..tw).step_by(16) {
                for j0 in (0..pw).step_by(16) {
                    for i in 0..16 {
                        a[i] = _mm512_loadu_ps(k[t0 + i].as_ptr().add(2 * j0).cast());
                    }
                    Avx512::transpose(&mut a);
                    for j in 0..16 {
                        _mm512_storeu_ps(self.kp.as_mut_ptr().add((j0 + j) * KT + t0).cast(), a[j]);
                    }
                }
            }
            // The pairs past the last whole block, and every pair of keys past the last 16.
            for t in 0..nb {
                for j in if t < tw { pw } else { 0 }..dp {
                    let (lo, hi) = (k[t][2 * j].to_bits(), k[t][2 * j + 1].to_bits());
                    *self.kp.get_unchecked_mut(j * KT + t) = lo as u32 | (hi as u32) << 16;
                }
            }
            self.fma.v_tile(v, d);
        }
    }

    #[inline(always)]
    unsafe fn scores(&mut self, _q: &[f32], r0: usize, mr: usize, nb: usize, s: &mut [f32]) {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and AVX512_BF16 (the `Engine` contract
        // of this engine, which only `run_avx512` builds), as `dot` needs; `dot` asserts its
        // slices' lengths before it reads through pointers.
        unsafe {
            let d = self.d;
            let q = &self.q[r0 * d..(r0 + mr) * d];
            let (kp, sc) = (&self.kp[..], self.scale);
            macro_rules! keys {
                ($nv:literal, $j:expr) => {
                    match mr {
                        6 => dot::<6, $nv>(q, kp, d, $j, sc, s),
                        5 => dot::<5, $nv>(q, kp, d, $j, sc, s),
                        4 => dot::<4, $nv>(q, kp, d, $j, sc, s),
                        3 => dot::<3, $nv>(q, kp, d, $j, sc, s),
                        2 => dot::<2, $nv>(q, kp, d, $j, sc, s),
                        _ => dot::<1, $nv>(q, kp, d, $j, sc, s),
                    }
                };
            }
            // As the f32 engine: blocks of 32 keys, a last 16 or fewer in one vector.
            let mut j = 0;
            while j < nb {
                if nb - j > 16 {
                    keys!(2, j);
                    j += 32;
                } else {
                    keys!(1, j);
                    j += 16;
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn values(&mut self, mr: usize, nb: usize, p: &[f32], acc: &mut [f32]) {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and AVX512_BF16 (the `Engine` contract
        // of this engine, which only `run_avx512` builds), as the f32 engine needs.
        unsafe {
            <Fma<Avx512> as Engine<bf16>>::values(&mut self.fma, mr, nb, p, acc);
        }
    }
}

/// 32 bf16 (16 pairs) from their bits.
#[inline(always)]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 64 plain bytes; every bit pattern is a valid value of either.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// `s[r * KT + j + i] = scale * sum_c q[r][c] k[j + i][c]` for `M` rows and the `NV * 16`
/// keys from `j`, by pairs: `NV * M` accumulators.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16.
#[inline(always)]
unsafe fn dot<const M: usize, const NV: usize>(
    q: &[bf16],
    kp: &[u32],
    d: usize,
    j: usize,
    scale: f32,
    s: &mut [f32],
) {
    // SAFETY: the caller has AVX-512F and AVX512_BF16; the asserts keep every query pair read (`r *
    // d + 2 * c + 2 <= M * d`), `kp` read (`c * KT + j + v * 16 + 16 <= d / 2 * KT`) and score
    // store (`r * KT + j + NV * 16 <= M * KT`) in bounds.
    unsafe {
        assert!(q.len() >= M * d && kp.len() >= d / 2 * KT && j + NV * 16 <= KT);
        assert!(s.len() >= M * KT);
        let mut a = [[_mm512_setzero_ps(); NV]; M];
        let (qp, kq) = (q.as_ptr(), kp.as_ptr().add(j));
        for c in 0..d / 2 {
            let mut b = [bh(_mm512_setzero_si512()); NV];
            for v in 0..NV {
                b[v] = bh(_mm512_loadu_si512(kq.add(c * KT + v * 16).cast()));
            }
            for r in 0..M {
                // Elements 2c (low half) and 2c + 1 (high half) of row r, as the keys' pairs.
                let pair = qp.add(r * d + 2 * c).cast::<i32>().read_unaligned();
                let x = bh(_mm512_set1_epi32(pair));
                for v in 0..NV {
                    a[r][v] = _mm512_dpbf16_ps(a[r][v], x, b[v]);
                }
            }
        }
        let sv = _mm512_set1_ps(scale);
        for r in 0..M {
            for v in 0..NV {
                _mm512_storeu_ps(
                    s.as_mut_ptr().add(r * KT + j + v * 16),
                    _mm512_mul_ps(a[r][v], sv),
                );
            }
        }
    }
}

/// The decode kernel's scores and values by bf16 pairs (see the module doc): the group's
/// unscaled bf16 query rows ([`Block::q_bf16`]) times the K rows as stored, then the scale; the
/// probabilities rounded to bf16 times pairs of V rows.
pub(super) struct Pairs;

/// Elements per chunk of [`Pairs`]: 16 pairs, one `vdpbf16ps`.
const PAIR_CHUNK: usize = 32;

impl Scores<bf16> for Pairs {
    #[inline(always)]
    unsafe fn qk<L: Lanes, const NG: usize, const TT: usize>(
        b: &Block<'_>,
        krows: [*const bf16; TT],
        d: usize,
        s: &mut [f32],
    ) {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and AVX512_BF16 (the contract of
        // `Scores`; only `run_avx512` uses these scores); `krows[t]` are valid for `d` reads, `d` a
        // multiple of 32, so each 32-element load at `c < d` is in bounds, and the asserts cover
        // `q` and `s`.
        unsafe {
            const { assert!(TT * NG <= 16) };
            let (q, scale) = b.q_bf16.expect("run_avx512 checked the bf16 query");
            assert!(q.len() >= NG * d && d.is_multiple_of(PAIR_CHUNK) && s.len() >= TT * NG);
            let mut a = [_mm512_setzero_ps(); 16];
            for c in (0..d).step_by(PAIR_CHUNK) {
                let kk: [__m512bh; TT] =
                    std::array::from_fn(|t| bh(_mm512_loadu_si512(krows[t].add(c).cast())));
                for r in 0..NG {
                    let qq = bh(_mm512_loadu_si512(q.as_ptr().add(r * d + c).cast()));
                    for t in 0..TT {
                        a[t * NG + r] = _mm512_dpbf16_ps(a[t * NG + r], qq, kk[t]);
                    }
                }
            }
            let sc = _mm512_set1_ps(scale);
            if TT * NG == 16 {
                _mm512_storeu_ps(s.as_mut_ptr(), _mm512_mul_ps(Avx512::hsum_w(&a), sc));
            } else {
                for i in 0..TT * NG {
                    s[i] = Avx512::hsum(a[i]) * scale;
                }
            }
        }
    }

    const PAIR_VALUES: bool = true;

    #[inline(always)]
    unsafe fn round_p(p: &mut [f32]) {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and AVX512_BF16 (the contract of
        // `Scores`; only `run_avx512` uses these scores); `p.len()` is a multiple of 16, so each
        // 16-lane load and store is inside `p`; the transmute is between two 32-byte vector types.
        unsafe {
            assert!(p.len().is_multiple_of(16));
            for c in (0..p.len()).step_by(16) {
                let x = _mm512_loadu_ps(p.as_ptr().add(c));
                // Round to nearest even in bf16 (`vcvtneps2bf16`), then back to f32 exactly.
                let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
                let back = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
                _mm512_storeu_ps(p.as_mut_ptr().add(c), _mm512_castsi512_ps(back));
            }
        }
    }

    #[inline(always)]
    unsafe fn pv<const NG: usize, const U: usize>(
        acc: &mut [f32],
        (v0, ss, nt): (*const bf16, usize, usize),
        p: &[f32],
        d: usize,
    ) {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and AVX512_BF16 (the contract of
        // `Scores`; only `run_avx512` uses these scores); the V rows are valid for `d` reads (the
        // `Scores::pv` contract) and the asserts bound `acc`, `p` and `nt`, which `pv_cols` checks
        // again.
        unsafe {
            const { assert!(NG <= 8) };
            assert!(nt <= SUB && p.len() >= nt * NG && acc.len() >= NG * d);
            assert!(d.is_multiple_of(PAIR_CHUNK));
            // pp[i][r]: the probabilities of tokens 2i (low half) and 2i + 1 (high half; 0 past
            // the last token) of row r, as one bf16 pair. They are bf16 values already (round_p).
            // Built a token pair at a time: the NG rows of a token are contiguous in `p`, loaded
            // under a mask of NG lanes (lanes past NG are neither read nor used).
            let mut pp = [[0i32; 8]; SUB / 2];
            let rows: __mmask8 = ((1u32 << NG) - 1) as __mmask8;
            let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
            for (i, pair) in pp.iter_mut().enumerate().take(nt.div_ceil(2)) {
                // In bounds: token 2i + 1 < nt is read only when it exists (p.len() >= nt * NG).
                let even = _mm256_maskz_loadu_epi32(rows, p.as_ptr().add(2 * i * NG).cast());
                let odd = if 2 * i + 1 < nt {
                    _mm256_maskz_loadu_epi32(rows, p.as_ptr().add((2 * i + 1) * NG).cast())
                } else {
                    _mm256_setzero_si256()
                };
                let both =
                    _mm256_or_si256(_mm256_srli_epi32::<16>(even), _mm256_and_si256(odd, high));
                _mm256_storeu_si256(pair.as_mut_ptr().cast(), both);
            }
            // Columns in steps of the f32 path's U chunks of 16 (U / 2 chunks of 32 here), the
            // rest one chunk of 32 at a time.
            let step = PAIR_CHUNK * (U / 2).max(1);
            let mut c = 0;
            while c + step <= d {
                match U {
                    8 => pv_cols::<NG, 4>(acc, (v0, ss, nt), &pp, c, d),
                    4 => pv_cols::<NG, 2>(acc, (v0, ss, nt), &pp, c, d),
                    _ => pv_cols::<NG, 1>(acc, (v0, ss, nt), &pp, c, d),
                }
                c += step;
            }
            while c < d {
                pv_cols::<NG, 1>(acc, (v0, ss, nt), &pp, c, d);
                c += PAIR_CHUNK;
            }
        }
    }

    fn finish(out: &mut [f32], d: usize) {
        for row in out.chunks_exact_mut(d) {
            for chunk in row.chunks_exact_mut(PAIR_CHUNK) {
                let chunk: &mut [f32; PAIR_CHUNK] = chunk.try_into().expect("chunks of 32");
                let held = *chunk;
                for (j, x) in held.into_iter().enumerate() {
                    chunk[pair_column(j)] = x;
                }
            }
        }
    }
}

/// The column (within its chunk of 32) that lane `j` of [`pv_cols`]'s two accumulators of a
/// chunk holds (`j < 16`: the first, from `vpunpcklwd`; else the second, from `vpunpckhwd`):
/// per 128-bit lane `L`, the low unpack interleaves the rows' words `8L..8L + 4`, the high one
/// words `8L + 4..8L + 8`.
fn pair_column(j: usize) -> usize {
    let (half, k) = (j / 16, j % 16);
    8 * (k / 4) + 4 * half + k % 4
}

/// [`Pairs`]' values for columns `c..c + 32 C` of `NG` rows: each pair of V rows (tokens 2i
/// and 2i + 1, the last alone paired with itself at probability 0) interleaved by
/// `vpunpcklwd` / `vpunpckhwd` into 16 bf16 pairs per vector, times the rows' probability
/// pairs by `vdpbf16ps`: `NG * 2C` accumulators, kept in memory in [`pair_column`] order.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; the `nt` V rows `v0 + t * ss` valid for `d`
/// reads.
#[inline(always)]
unsafe fn pv_cols<const NG: usize, const C: usize>(
    acc: &mut [f32],
    (v0, ss, nt): (*const bf16, usize, usize),
    pp: &[[i32; 8]; SUB / 2],
    c: usize,
    d: usize,
) {
    // SAFETY: the caller has AVX-512F and AVX512_BF16 and gives rows valid for `d` reads; the
    // assert keeps every load and store of `acc` (`r * d + c + 32 * C <= NG * d`) and of the V rows
    // (`c + 32 * C <= d`, row `< nt`) in bounds.
    unsafe {
        assert!(c + PAIR_CHUNK * C <= d && acc.len() >= NG * d && nt <= SUB);
        let ap = acc.as_mut_ptr();
        let mut a = [[[_mm512_setzero_ps(); 2]; C]; NG];
        for r in 0..NG {
            for u in 0..C {
                for h in 0..2 {
                    a[r][u][h] = _mm512_loadu_ps(ap.add(r * d + c + PAIR_CHUNK * u + 16 * h));
                }
            }
        }
        for i in 0..nt.div_ceil(2) {
            let ra = v0.add(2 * i * ss);
            let rb = if 2 * i + 1 < nt {
                v0.add((2 * i + 1) * ss)
            } else {
                ra
            };
            let mut lo = [_mm512_setzero_si512(); C];
            let mut hi = [_mm512_setzero_si512(); C];
            for u in 0..C {
                let x = _mm512_loadu_si512(ra.add(c + PAIR_CHUNK * u).cast());
                let y = _mm512_loadu_si512(rb.add(c + PAIR_CHUNK * u).cast());
                lo[u] = _mm512_unpacklo_epi16(x, y);
                hi[u] = _mm512_unpackhi_epi16(x, y);
            }
            for r in 0..NG {
                let pr = bh(_mm512_set1_epi32(pp[i][r]));
                for u in 0..C {
                    a[r][u][0] = _mm512_dpbf16_ps(a[r][u][0], pr, bh(lo[u]));
                    a[r][u][1] = _mm512_dpbf16_ps(a[r][u][1], pr, bh(hi[u]));
                }
            }
        }
        for r in 0..NG {
            for u in 0..C {
                for h in 0..2 {
                    _mm512_storeu_ps(ap.add(r * d + c + PAIR_CHUNK * u + 16 * h), a[r][u][h]);
                }
            }
        }
    }
}

/// Runs the pairs where they can run: [`run_avx512`] on a CPU with AVX-512 and AVX512_BF16 and
/// a bf16 cache. `false` (nothing written) when they cannot: another CPU, another K/V type, or
/// rows [`run_avx512`] refuses. The callers check the lengths, as for their own paths.
pub(super) fn run_if_able<T: KvElem>(
    tiled: bool,
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) -> bool {
    if !Isa::Avx512.bf16_pairs() {
        return false;
    }
    let Some(kv) = kv.as_bf16() else {
        return false;
    };
    // SAFETY: bf16_pairs() found AVX512_BF16 and the avx512 path's features.
    unsafe { run_avx512(tiled, &kv, rows, out, m, l) }.is_some()
}

/// Runs the tiled algorithm with the pair engine (`tiled`) or the decode kernel with [`Pairs`]
/// scores; `None` (nothing written) when the pairs cannot run these rows: no bf16 query, an odd
/// head dim ([`Dot::new`]) or, for decode, one that is not a multiple of 32.
///
/// # Safety
/// The CPU must have AVX-512F/VL, AVX512_BF16 and the AVX2 set; lengths as
/// `kernel::attend_partial` checks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bf16")]
pub(super) unsafe fn run_avx512(
    tiled: bool,
    kv: &SeqKv<'_, bf16>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) -> Option<()> {
    // SAFETY: this function has the features of the AVX-512 lanes and of both engines, and the
    // caller checked the lengths.
    unsafe {
        let d = kv.layout.head_dim;
        if tiled {
            let mut e = Dot::new(d, rows)?;
            super::tiled::run::<Avx512, bf16, _>(&mut e, kv, rows, out, m, l);
        } else {
            let (q, _) = rows.q_bf16?;
            if !d.is_multiple_of(PAIR_CHUNK) || q.len() < rows.lo.len() * d {
                return None;
            }
            super::attend_impl::<Avx512, bf16, Pairs>(kv, rows, out, m, l);
        }
        Some(())
    }
}
