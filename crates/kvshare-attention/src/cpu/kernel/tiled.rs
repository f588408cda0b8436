//! The tiled (flash-attention) kernel for prefill and chunked-prefill rows: many query rows of
//! one sequence against its paged K/V, computed as small matrix products.
//!
//! The K/V is walked in tiles of up to [`Engine::KT`] tokens (128 for the vector engines, 32 for
//! AMX; a tile's rows are gathered through the block table, so tiles cross pages: with pages of
//! 16 tokens, tiles of one page ran 1.2x slower on Zen 4). For each tile and kv head, the tile
//! is converted once (f32 for the vector engine, bf16 pairs for the bf16 pair engine
//! (`bf16dot.rs`), bf16 in AMX's layout for the tile engine) and then used by every row block
//! of that head: scores `S = Q K^T` as a register-blocked product, the causal / window mask
//! per tile (skipped when the whole tile is inside every row's range, and blocks that see none
//! of the tile are skipped), an online softmax per row, and `O += P V` as a second blocked
//! product. The products are an [`Engine`]: [`Fma`] (f32 FMAs on the CPU path's lanes,
//! `MR x 2W` accumulators: 8 lanes on `avx2`/`portable`, 16 on `avx512`/`portable16`), the
//! bf16 pair engine (`bf16dot.rs`: `avx512` with AVX512_BF16, bf16 query and cache) or the AMX
//! engine (`amx.rs`).
//!
//! The result is the same unnormalised online-softmax state as the decode kernel's
//! (`kernel::attend_partial`), so split-K merging and normalisation are shared.

#![allow(clippy::needless_range_loop)]

use super::{KvElem, Lanes, Rows, SeqKv};

/// Key tokens per tile of the f32 engine ([`Fma`]) and the bf16 pair engine: the scores' row
/// stride. Longer tiles spread each row's softmax steps over more products: one thread, 2 x 1024
/// causal, Zen 4, against 32-token tiles: 1.05-1.06x f32 and 1.03-1.08x bf16 with 128, 1.04 /
/// 1.06x with 64 (pages of 128 tokens; 1.2x with pages of 16, whose tiles were one page).
pub(super) const KT: usize = 128;

/// The longest tile any engine takes ([`Engine::KT`]).
pub(super) const KT_MAX: usize = 128;

/// The two matrix products of the tiled algorithm, on one kv head's tile at a time.
pub(super) trait Engine<T: KvElem> {
    /// Rows per block (at most).
    const MR: usize;
    /// Key tokens per tile (at most [`KT_MAX`]): the row stride of the score blocks.
    const KT: usize;
    /// Called once per launch with every row's (scaled) query, `n` rows of `d`.
    ///
    /// # Safety
    /// The CPU must have the engine's features.
    unsafe fn queries(&mut self, q: &[f32], n: usize, d: usize);
    /// Takes the tile `k[t]`, `v[t]` (`t < k.len() <= KT`, rows of `d`).
    ///
    /// # Safety
    /// As [`Engine::queries`].
    unsafe fn kv_tile(&mut self, k: &[&[T]], v: &[&[T]], d: usize);
    /// `s[r * KT + t] = q[r0 + r] . k[t]` for `r < mr`, `t < nb` (other entries: anything);
    /// `q` holds rows `r0..r0 + mr` (the f32 queries given to [`Engine::queries`]).
    ///
    /// # Safety
    /// As [`Engine::queries`]; `r0 + mr <= n`, `mr <= MR`, `nb` at most the tile's length
    /// (the keys the block sees up to).
    unsafe fn scores(&mut self, q: &[f32], r0: usize, mr: usize, nb: usize, s: &mut [f32]);
    /// `acc[r * d..][..d] += sum_t p[r * KT + t] v[t]` for `r < mr`, `t < nb`.
    ///
    /// # Safety
    /// As [`Engine::scores`].
    unsafe fn values(&mut self, mr: usize, nb: usize, p: &[f32], acc: &mut [f32]);
    /// Whether the engine multiplies rounded probabilities ([`Engine::round_p`]); the softmax
    /// denominator then sums the rounded values, so that it matches what the product uses.
    const ROUNDS_P: bool = false;
    /// The value the engine multiplies in place of probability `p` (bf16 rounding for AMX).
    #[inline(always)]
    fn round_p(p: f32) -> f32 {
        p
    }
}

/// Runs the tiled algorithm: the unnormalised state of every row as `kernel::attend_partial`
/// defines it.
///
/// # Safety
/// The CPU must have `L`'s and `E`'s features; lengths as `kernel::attend_partial` checks.
// Inlined into each path's `#[target_feature]` wrapper, so that the lanes' intrinsics inline.
#[inline(always)]
pub(super) unsafe fn run<L: Lanes, T: KvElem, E: Engine<T>>(
    e: &mut E,
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m_out: &mut [f32],
    l_out: &mut [f32],
) {
    // SAFETY: the caller gives `L`'s and `E`'s features and the lengths `kernel::attend_partial`
    // checks; the engines and `softmax` check the slices they index.
    unsafe {
        // The softmax steps by W lanes and the f32 engine's score blocks by 2W keys.
        const {
            assert!(
                L::W <= 16 && E::KT.is_multiple_of(2 * L::W) && E::KT <= KT_MAX,
                "lanes must divide half a tile"
            )
        };
        let lay = kv.layout;
        let d = lay.head_dim;
        let n = rows.lo.len();
        out[..n * d].fill(0.0);
        m_out[..n].fill(f32::NEG_INFINITY);
        l_out[..n].fill(0.0);
        if n == 0 {
            return;
        }
        e.queries(&rows.q[..n * d], n, d);
        // Runs of rows of one kv head: (kv head, first row, end row, lowest lo, highest hi).
        let mut runs = Vec::new();
        let mut r = 0;
        while r < n {
            let kh = rows.kv_head[r];
            let end = r + rows.kv_head[r..].iter().take_while(|&&h| h == kh).count();
            let lo = rows.lo[r..end].iter().copied().min().unwrap_or(0);
            let hi = rows.hi[r..end].iter().copied().max().unwrap_or(0);
            runs.push((kh, r, end, lo, hi));
            r = end;
        }
        let start = runs.iter().map(|x| x.3).min().unwrap_or(0);
        let end = runs.iter().map(|x| x.4).max().unwrap_or(0);
        let mut s = vec![0f32; E::MR * E::KT];
        let mut krows: [&[T]; KT_MAX] = [&[]; KT_MAX];
        let mut vrows: [&[T]; KT_MAX] = [&[]; KT_MAX];
        // The tile's K and V row scales (an int8 per-token-head cache; else unused).
        let mut kscale = [1f32; KT_MAX];
        let mut vscale = [1f32; KT_MAX];
        let mut pos = start;
        while pos < end {
            let nb = E::KT.min(end - pos);
            for &(kh, r0, r1, lo, hi) in &runs {
                if pos >= hi || pos + nb <= lo {
                    continue;
                }
                for t in 0..nb {
                    let (page, slot) = ((pos + t) / lay.page_size, (pos + t) % lay.page_size);
                    let off = kv.pages[page] as usize * lay.page_stride
                        + slot * lay.slot_stride
                        + kh * lay.head_stride;
                    krows[t] = &kv.k[off..off + d];
                    vrows[t] = &kv.v[off..off + d];
                    if let Some(rs) = kv.row_scales {
                        (kscale[t], vscale[t]) = rs.at(off, d);
                    }
                }
                e.kv_tile(&krows[..nb], &vrows[..nb], d);
                let mut rb = r0;
                while rb < r1 {
                    let mr = E::MR.min(r1 - rb);
                    let rr = rb..rb + mr;
                    let blo = rows.lo[rr.clone()].iter().copied().min().unwrap_or(0);
                    let bhi = rows.hi[rr.clone()].iter().copied().max().unwrap_or(0);
                    if pos < bhi && pos + nb > blo {
                        // Keys past the block's last visible one (on the causal diagonal) are
                        // neither scored nor summed.
                        let nb = nb.min(bhi - pos);
                        e.scores(&rows.q[rb * d..(rb + mr) * d], rb, mr, nb, &mut s);
                        let row_scales = kv.row_scales.is_some();
                        if row_scales {
                            // Each key's scores times its K row's scale (before cap and mask).
                            row_scale::<T, E>(&mut s, mr, &kscale[..nb]);
                        }
                        let acc = &mut out[rb * d..(rb + mr) * d];
                        softmax::<L, T, E>(
                            kv.softcap,
                            (pos, nb),
                            (&rows.lo[rr.clone()], &rows.hi[rr.clone()]),
                            &mut s[..mr * E::KT],
                            (&mut m_out[rr.clone()], &mut l_out[rr]),
                            acc,
                        );
                        if row_scales {
                            // The value product takes each probability times its V row's
                            // scale; the softmax sums took them as they are.
                            row_scale::<T, E>(&mut s, mr, &vscale[..nb]);
                        }
                        e.values(mr, nb, &s, acc);
                    }
                    rb += mr;
                }
            }
            pos += nb;
        }
    }
}

/// Turns the scores of one block (`s[r * E::KT + t]`, keys `pos..pos + nb`) into probabilities
/// against each row's running maximum, rescaling the row's accumulator and sum when the
/// maximum grows. Entries a row does not see (mask, padding) become 0.
///
/// # Safety
/// The CPU must have `L`'s features; `s` holds `lo.len()` rows of `E::KT` with `E::KT` a
/// multiple of `W`.
#[inline(always)]
unsafe fn softmax<L: Lanes, T: KvElem, E: Engine<T>>(
    softcap: f32,
    (pos, nb): (usize, usize),
    (lo, hi): (&[usize], &[usize]),
    s: &mut [f32],
    (m, l): (&mut [f32], &mut [f32]),
    acc: &mut [f32],
) {
    // SAFETY: the caller gives `L`'s features; each vector load and store is at `c < nw` inside
    // `sr`, a slice of `nw` values (`nw <= E::KT`, a multiple of `W`), and `scale` gets a row of
    // `acc`.
    unsafe {
        let mr = lo.len();
        let d = acc.len() / mr;
        // The vectors that hold the block's keys; the engines read no probability past `nb`.
        let nw = nb.next_multiple_of(L::W);
        for r in 0..mr {
            let sr = &mut s[r * E::KT..r * E::KT + nw];
            sr[nb..].fill(f32::NEG_INFINITY);
            if softcap > 0.0 {
                for x in &mut sr[..nb] {
                    *x = softcap * (*x / softcap).tanh();
                }
            }
            if pos < lo[r] || pos + nb > hi[r] {
                for t in 0..nb {
                    if pos + t < lo[r] || pos + t >= hi[r] {
                        sr[t] = f32::NEG_INFINITY;
                    }
                }
            }
            let mut mx = L::splat(f32::NEG_INFINITY);
            for c in (0..nw).step_by(L::W) {
                mx = L::max(mx, L::load(sr.as_ptr().add(c)));
            }
            let bm = L::hmax(mx);
            if bm == f32::NEG_INFINITY {
                sr.fill(0.0);
                continue;
            }
            if bm > m[r] {
                if m[r] > f32::NEG_INFINITY {
                    let alpha = (m[r] - bm).exp();
                    l[r] *= alpha;
                    scale::<L>(&mut acc[r * d..(r + 1) * d], alpha);
                }
                m[r] = bm;
            }
            let shift = L::splat(m[r]);
            let mut sum = L::zero();
            for c in (0..nw).step_by(L::W) {
                let p = L::exp(L::sub(L::load(sr.as_ptr().add(c)), shift));
                L::store(sr.as_mut_ptr().add(c), p);
                sum = L::add(sum, p);
            }
            if E::ROUNDS_P {
                // The engine multiplies rounded probabilities; sum those.
                let mut tot = 0f32;
                for x in &mut sr[..nb] {
                    *x = E::round_p(*x);
                    tot += *x;
                }
                l[r] += tot;
            } else {
                l[r] += L::hsum(sum);
            }
        }
    }
}

/// `s[r * E::KT + t] *= x[t]` for the `mr` rows of a score block and its `x.len()` keys (an
/// int8 per-token-head cache's row scales).
#[inline(always)]
fn row_scale<T: KvElem, E: Engine<T>>(s: &mut [f32], mr: usize, x: &[f32]) {
    for row in s.chunks_exact_mut(E::KT).take(mr) {
        row.iter_mut().zip(x).for_each(|(p, x)| *p *= x);
    }
}

/// `x *= a`.
///
/// # Safety
/// The CPU must have `L`'s features.
#[inline(always)]
unsafe fn scale<L: Lanes>(x: &mut [f32], a: f32) {
    // SAFETY: the caller gives `L`'s features; every vector at `c` lies in `x[..nw]`, `nw` a
    // multiple of `W` no larger than `x.len()`.
    unsafe {
        let nw = x.len() / L::W * L::W;
        let (av, z) = (L::splat(a), L::zero());
        for c in (0..nw).step_by(L::W) {
            let p = x.as_mut_ptr().add(c);
            L::store(p, L::fma(L::load(p), av, z));
        }
        x[nw..].iter_mut().for_each(|v| *v *= a);
    }
}

/// The f32 engine: the tile converted to f32 once (K transposed, so a score block is a
/// broadcast-FMA product), `MR x 2W` register blocks for both products (`W` = the lanes'
/// width: 16 keys or columns per block on the 8-lane paths, 32 on the 16-lane ones).
pub(super) struct Fma<L> {
    d: usize,
    /// K tile transposed: `kt[c * KT + t]`.
    kt: Vec<f32>,
    /// V tile: `vt[t * d + c]`.
    vt: Vec<f32>,
    _l: std::marker::PhantomData<L>,
}

impl<L> Fma<L> {
    pub(super) fn new(d: usize) -> Self {
        Fma {
            d,
            kt: vec![0.0; d * KT],
            vt: vec![0.0; d * KT],
            _l: std::marker::PhantomData,
        }
    }
}

/// Rows per block of the f32 engine: 6 x 2 vectors = 12 accumulators (of 16 AVX2 registers;
/// AVX-512 has 32, but more rows cut few instructions: each row's broadcast feeds only its
/// own NV FMAs).
pub(super) const FMA_MR: usize = 6;

/// Converts one K/V row to f32.
///
/// # Safety
/// The CPU must have `L`'s features; `src.len() >= dst.len()`.
#[inline(always)]
unsafe fn convert<L: Lanes, T: KvElem>(src: &[T], dst: &mut [f32]) {
    // SAFETY: the caller gives `L`'s features; `src` is cut to `d = dst.len()` (which panics if
    // shorter) and each vector at `c + W <= dw <= d` lies inside both.
    unsafe {
        let d = dst.len();
        let src = &src[..d];
        let dw = d / L::W * L::W;
        for c in (0..dw).step_by(L::W) {
            L::store(dst.as_mut_ptr().add(c), L::load_kv(src.as_ptr().add(c)));
        }
        for c in dw..d {
            dst[c] = src[c].to_f32();
        }
    }
}

impl<L: Lanes> Fma<L> {
    /// Takes the V half of a tile (as [`Engine::kv_tile`]): rows converted to f32.
    ///
    /// # Safety
    /// The CPU must have `L`'s features.
    #[inline(always)]
    pub(super) unsafe fn v_tile<T: KvElem>(&mut self, v: &[&[T]], d: usize) {
        // SAFETY: the caller gives `L`'s features, as `convert` needs; the assert keeps each row's
        // `vt` slice in bounds.
        unsafe {
            assert!(v.len() <= KT && self.vt.len() >= v.len() * d);
            for (t, vr) in v.iter().enumerate() {
                convert::<L, T>(vr, &mut self.vt[t * d..(t + 1) * d]);
            }
        }
    }
}

impl<L: Lanes, T: KvElem> Engine<T> for Fma<L> {
    const MR: usize = FMA_MR;
    const KT: usize = KT;

    #[inline(always)]
    unsafe fn queries(&mut self, _q: &[f32], _n: usize, d: usize) {
        self.d = d;
    }

    #[inline(always)]
    unsafe fn kv_tile(&mut self, k: &[&[T]], v: &[&[T]], d: usize) {
        // SAFETY: the caller gives `L`'s features (the `Engine` contract); the asserts put every K
        // row at `d` or more values and `kt` at `d * KT`, so the loads at `c + W <= dw`, the stores
        // at `(c + j) * KT + t0` and the unchecked element moves (`c < d`, `t < nb <= KT`) are in
        // bounds.
        unsafe {
            let (w, nb) = (L::W, k.len());
            assert!(nb <= KT && self.kt.len() >= d * KT && self.vt.len() >= nb * d);
            assert!(k.iter().chain(v).all(|r| r.len() >= d));
            // K transposed by W x W blocks: W rows' chunks converted, transposed in registers and
            // stored as columns (element by element, the transpose took 7.7k cycles a tile on
            // avx512: 7% of a 192-row unit's time).
            let (tw, dw) = (nb / w * w, d / w * w);
            let mut a = [L::zero(); 16];
            for t0 in (0..tw).step_by(w) {
                for c in (0..dw).step_by(w) {
                    for i in 0..w {
                        a[i] = L::load_kv(k[t0 + i].as_ptr().add(c));
                    }
                    L::transpose(&mut a);
                    for j in 0..w {
                        L::store(self.kt.as_mut_ptr().add((c + j) * KT + t0), a[j]);
                    }
                }
            }
            // The rest one by one: the dims past the last whole chunk, and every dim of the
            // tokens past the last whole block.
            for t in 0..nb {
                for c in if t < tw { dw } else { 0 }..d {
                    *self.kt.get_unchecked_mut(c * KT + t) = k[t].get_unchecked(c).to_f32();
                }
            }
            self.v_tile(v, d);
        }
    }

    #[inline(always)]
    unsafe fn scores(&mut self, q: &[f32], _r0: usize, mr: usize, nb: usize, s: &mut [f32]) {
        // SAFETY: the caller gives `L`'s features (the `Engine` contract), as `qk` needs; `qk`
        // asserts its slices' lengths before it reads through pointers, and `j + NV * W <= KT`
        // holds for each block taken.
        unsafe {
            let d = self.d;
            let q = &q[..mr * d];
            assert!(s.len() >= mr * KT && self.kt.len() >= d * KT);
            macro_rules! keys {
                ($nv:literal, $j:expr) => {
                    match mr {
                        6 => qk::<L, 6, $nv>(q, &self.kt, d, $j, s),
                        5 => qk::<L, 5, $nv>(q, &self.kt, d, $j, s),
                        4 => qk::<L, 4, $nv>(q, &self.kt, d, $j, s),
                        3 => qk::<L, 3, $nv>(q, &self.kt, d, $j, s),
                        2 => qk::<L, 2, $nv>(q, &self.kt, d, $j, s),
                        _ => qk::<L, 1, $nv>(q, &self.kt, d, $j, s),
                    }
                };
            }
            // Blocks of 2W keys; a last W or fewer (a short tile: a page of 16 tokens on the
            // 16-lane paths) takes one vector, not two.
            let mut j = 0;
            while j < nb {
                if nb - j > L::W {
                    keys!(2, j);
                    j += 2 * L::W;
                } else {
                    keys!(1, j);
                    j += L::W;
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn values(&mut self, mr: usize, nb: usize, p: &[f32], acc: &mut [f32]) {
        // SAFETY: the caller gives `L`'s features (the `Engine` contract), as `pv` needs; `pv`
        // asserts its slices' lengths before it reads through pointers, and every `c` taken leaves
        // `c + W * U <= d`.
        unsafe {
            let d = self.d;
            assert!(acc.len() >= mr * d && p.len() >= mr * KT && self.vt.len() >= nb * d);
            let w = L::W;
            let (d2w, dw) = (d / (2 * w) * 2 * w, d / w * w);
            let vt = &self.vt[..nb * d];
            macro_rules! cols {
                ($u:literal, $c:expr) => {
                    match mr {
                        6 => pv::<L, 6, $u>(p, vt, nb, d, $c, acc),
                        5 => pv::<L, 5, $u>(p, vt, nb, d, $c, acc),
                        4 => pv::<L, 4, $u>(p, vt, nb, d, $c, acc),
                        3 => pv::<L, 3, $u>(p, vt, nb, d, $c, acc),
                        2 => pv::<L, 2, $u>(p, vt, nb, d, $c, acc),
                        _ => pv::<L, 1, $u>(p, vt, nb, d, $c, acc),
                    }
                };
            }
            for c in (0..d2w).step_by(2 * w) {
                cols!(2, c);
            }
            if dw > d2w {
                cols!(1, d2w);
            }
            for r in 0..mr {
                for c in dw..d {
                    let mut x = acc[r * d + c];
                    for t in 0..nb {
                        x += p[r * KT + t] * vt[t * d + c];
                    }
                    acc[r * d + c] = x;
                }
            }
        }
    }
}

/// Scores of `M` rows against the `NV * W` keys `j..j + NV * W` of the transposed tile:
/// `s[r * KT + j + i] = sum_c q[r][c] kt[c][j + i]`, `NV * M` accumulators.
///
/// # Safety
/// The CPU must have `L`'s features.
#[inline(always)]
unsafe fn qk<L: Lanes, const M: usize, const NV: usize>(
    q: &[f32],
    kt: &[f32],
    d: usize,
    j: usize,
    s: &mut [f32],
) {
    // SAFETY: the caller gives `L`'s features; the assert keeps every read of `q` (`r * d + c`, `r
    // < M`, `c < d`) and `kt` (`c * KT + j + v * W + W <= d * KT`) and every store to `s` (`r * KT
    // + j + NV * W <= M * KT`) in bounds.
    unsafe {
        let w = L::W;
        assert!(q.len() >= M * d && kt.len() >= d * KT && j + NV * w <= KT && s.len() >= M * KT);
        let mut a = [[L::zero(); NV]; M];
        let (qp, kp) = (q.as_ptr(), kt.as_ptr().add(j));
        for c in 0..d {
            let mut b = [L::zero(); NV];
            for v in 0..NV {
                b[v] = L::load(kp.add(c * KT + v * w));
            }
            for r in 0..M {
                let x = L::splat(*qp.add(r * d + c));
                for v in 0..NV {
                    a[r][v] = L::fma(x, b[v], a[r][v]);
                }
            }
        }
        for r in 0..M {
            for v in 0..NV {
                L::store(s.as_mut_ptr().add(r * KT + j + v * w), a[r][v]);
            }
        }
    }
}

/// `acc[r][c..c + WU] += sum_{t < nb} p[r][t] v[t][c..c + WU]` for `M` rows, `M * U`
/// accumulators. Plain loops, not `std::array::from_fn`: see `Avx512::hsum_w`.
///
/// # Safety
/// The CPU must have `L`'s features.
#[inline(always)]
unsafe fn pv<L: Lanes, const M: usize, const U: usize>(
    p: &[f32],
    vt: &[f32],
    nb: usize,
    d: usize,
    c: usize,
    acc: &mut [f32],
) {
    // SAFETY: the caller gives `L`'s features; the assert keeps every access to `acc` (`r * d + c +
    // W * U <= M * d`), `vt` (`t * d + c + W * U`, `t < nb`) and `p` (`r * KT + t`) in bounds.
    unsafe {
        let w = L::W;
        assert!(c + w * U <= d && vt.len() >= nb * d && p.len() >= M * KT && acc.len() >= M * d);
        let ap = acc.as_mut_ptr();
        let mut a = [[L::zero(); U]; M];
        for r in 0..M {
            for u in 0..U {
                a[r][u] = L::load(ap.add(r * d + c + w * u));
            }
        }
        for t in 0..nb {
            let mut vv = [L::zero(); U];
            for u in 0..U {
                vv[u] = L::load(vt.as_ptr().add(t * d + c + w * u));
            }
            for r in 0..M {
                let x = L::splat(*p.get_unchecked(r * KT + t));
                for u in 0..U {
                    a[r][u] = L::fma(x, vv[u], a[r][u]);
                }
            }
        }
        for r in 0..M {
            for u in 0..U {
                L::store(ap.add(r * d + c + w * u), a[r][u]);
            }
        }
    }
}

#[cfg(test)]
#[path = "tiled_tests.rs"]
mod tests;
