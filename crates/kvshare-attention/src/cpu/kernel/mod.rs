//! The inner attention kernel: the query rows of one sequence (each query head of each query
//! token) against that sequence's paged K/V, in a single pass with an online softmax
//! (flash-decoding style).
//!
//! Rows that share a kv head (GQA/MQA heads, and several query tokens in prefill) form groups
//! of up to 8; each K/V row is converted to f32 once per group (F16C for f16, a shift for
//! bf16) and used by every row of the group. The K/V is walked block by block (up to 32 tokens
//! of one page) and each block serves all groups before the next, so memory is read as one
//! stream. The same generic code, over a lane width `W` of 8 or 16 f32 ([`Lanes`]), is
//! compiled once per CPU path ([`Isa`]): 8 lanes with AVX2+FMA+F16C intrinsics (`avx2`),
//! 16 lanes with AVX-512F intrinsics (`avx512`), and plain `[f32; 8]` / `[f32; 16]` arrays
//! (`portable`; the compiler vectorises them for the baseline target, e.g. SSE2 or NEON; the
//! 16-lane one runs the AVX-512 path's algorithm on machines without AVX-512);
//! [`attend_partial`] dispatches on the backend's path.
//!
//! Besides the normalised output ([`attend`]), the kernel returns the unnormalised online-softmax
//! state of each row ([`attend_partial`]); [`merge_partials`] combines the states of disjoint key
//! ranges exactly, which is how a long sequence is split across threads (`cpu/plan.rs`).

// Index loops over small fixed arrays read more plainly than iterator chains in SIMD code.
#![allow(clippy::needless_range_loop)]

use half::bf16;

use super::isa::Isa;
use crate::CacheLayout;

/// Tokens per K/V block (a block never crosses a page).
const BT: usize = 32;
/// Tokens per value sub-block (see `block`).
const SUB: usize = 8;
/// Query rows (query heads of one kv head, times tokens) one kernel pass processes together.
/// Not a head-ratio limit: the CPU takes any ratio (CANN's limit is
/// `ascend::plan::MAX_HEADS_PER_KV_HEAD`).
pub(crate) const ROWS_PER_PASS: usize = 8;

/// Puts the whole chunk pairs (`2w` values, `w` = 8 or 16) of each `d`-wide row of `x` in the
/// order a kernel keeps them when it loads its K/V chunk pairs split ([`Lanes::split`]):
/// the pair's even elements first, then its odd ones (`INVERSE`: back in element order).
/// Elements past a row's last whole pair stay in place. The query rows are put in this order
/// before the dot products and the outputs back after, so each K/V chunk meets the query
/// values (and each V chunk the accumulator lanes) of its own elements.
fn split_pairs<const INVERSE: bool>(w: usize, x: &mut [f32], d: usize) {
    if w == 8 {
        split_pairs_of::<16, INVERSE>(x, d)
    } else {
        split_pairs_of::<32, INVERSE>(x, d)
    }
}

/// [`split_pairs`] for pairs of `P` values (a fixed size, so that the moves unroll).
fn split_pairs_of<const P: usize, const INVERSE: bool>(x: &mut [f32], d: usize) {
    for row in x.chunks_exact_mut(d) {
        for pair in row.chunks_exact_mut(P) {
            let pair: &mut [f32; P] = pair.try_into().expect("chunks of P");
            let src = *pair;
            for j in 0..P / 2 {
                if INVERSE {
                    (pair[2 * j], pair[2 * j + 1]) = (src[j], src[P / 2 + j]);
                } else {
                    (pair[j], pair[P / 2 + j]) = (src[2 * j], src[2 * j + 1]);
                }
            }
        }
    }
}

/// `W` f32 lanes (8 or 16). All methods are `unsafe`: pointers must be valid for `W`
/// elements, and the intrinsics implementations need their CPU features.
trait Lanes {
    /// Lanes per vector: 8 or 16 (the kernel's chunking needs a power of two that is a
    /// multiple of every group size, 1 to 8).
    const W: usize;
    type V: Copy;
    /// # Safety
    /// The CPU must have the features of `Self`'s path (none for the portable lanes).
    unsafe fn zero() -> Self::V;
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn splat(x: f32) -> Self::V;
    /// # Safety
    /// As [`Self::zero`]; `p` valid for `W` reads of f32 (any alignment).
    unsafe fn load(p: *const f32) -> Self::V;
    /// # Safety
    /// As [`Self::zero`]; `p` valid for `W` writes of f32 (any alignment).
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c`.
    ///
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn hsum(v: Self::V) -> f32;
    /// The largest lane of `v` (as [`Self::max`] lane by lane, halves folded in pairs).
    ///
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn hmax(v: Self::V) -> f32;
    /// Lane `i` of the result is the sum of the lanes of `a[i]`, for `i < W` (`a[W..]` is not
    /// read).
    ///
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn hsum_w(a: &[Self::V; 16]) -> Self::V;
    /// Transposes the `W x W` block `a[..W]` in place: lane `j` of `a[i]` and lane `i` of
    /// `a[j]` swap (`a[W..]` is not touched).
    ///
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn transpose(a: &mut [Self::V; 16]);
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `exp` per lane; `-inf` (and anything below about -87) gives 0.
    ///
    /// # Safety
    /// As [`Self::zero`].
    unsafe fn exp(v: Self::V) -> Self::V;
    /// Loads `W` elements of `T` as f32.
    ///
    /// # Safety
    /// As [`Self::zero`]; `p` valid for `W` reads of `T`.
    unsafe fn load_kv<T: KvElem>(p: *const T) -> Self::V;
    /// Whether these lanes load the chunk pairs of types that offer it split
    /// ([`KvElem::SPLIT`]): the AVX2 path does (measured: the conversions' share of the core
    /// drops); the AVX-512 path does not (its count of executed instructions went
    /// up 6% under the emulator, and on a Zen 4 it ran 1.00-1.05x slower), nor the portable ones.
    const SPLITS: bool = false;
    /// Whether [`Self::load_kv2`] splits `T`'s pairs.
    fn split<T: KvElem>() -> bool {
        Self::SPLITS && T::SPLIT
    }
    /// The `2W` elements at `p` as two vectors: in order, or the even and the odd elements
    /// when [`Self::split`] ([`split_pairs`]).
    ///
    /// # Safety
    /// As [`Self::zero`]; `p` valid for `2W` reads of `T`.
    unsafe fn load_kv2<T: KvElem>(p: *const T) -> [Self::V; 2] {
        // SAFETY: the caller gives `p` valid for `2W` reads, so both halves `p..p + W` and `p +
        // W..p + 2W` are in bounds; the features are the caller's, as `load_kv` needs.
        unsafe { [Self::load_kv(p), Self::load_kv(p.add(Self::W))] }
    }
}

mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod bf16dot;
mod portable;
mod prefetch;
use portable::Portable;
mod elem;
mod pass;
pub(crate) use elem::KvElem;
use pass::{attend_impl, F32Scores};
#[cfg(target_arch = "x86_64")]
use pass::{Block, Scores};
pub(crate) mod tiled;
/// The 8-lane portable lanes (the tiled kernel's portable engine).
type Scalar = Portable<8>;

/// One sequence's K/V (all kv heads).
pub(crate) struct SeqKv<'a, T> {
    pub k: &'a [T],
    pub v: &'a [T],
    /// Block-table entries the sequence uses (validated page ids).
    pub pages: &'a [i32],
    pub layout: &'a CacheLayout,
    /// Logit soft cap (0 = off).
    pub softcap: f32,
    /// The K and V caches as int8 bytes when each `(slot, head)` row keeps its f32 scale after
    /// its `head_dim` codes (an int8 per-token-head cache, [`row_scale`]); `None` otherwise.
    /// The kernels multiply a position's score by its K row's scale after the dot product, and
    /// its probability by its V row's scale in the value product only (the softmax sum takes
    /// the probabilities as they are).
    pub row_scales: Option<RowScales<'a>>,
}

/// The K and V caches of an int8 per-token-head cache, whose rows' scales [`row_scale`] reads.
#[derive(Clone, Copy)]
pub(crate) struct RowScales<'a> {
    pub k: &'a [i8],
    pub v: &'a [i8],
}

impl RowScales<'_> {
    /// The scales of the K and V rows at element offset `off` (rows of `d` codes).
    #[inline(always)]
    pub(crate) fn at(&self, off: usize, d: usize) -> (f32, f32) {
        (row_scale(self.k, off, d), row_scale(self.v, off, d))
    }
}

/// The f32 scale kept after the `d` codes of the row at `off`: 4 bytes, little-endian (a
/// bounds-checked read: the layout's validation left room for it).
#[inline(always)]
pub(crate) fn row_scale(cache: &[i8], off: usize, d: usize) -> f32 {
    let b = &cache[off + d..off + d + 4];
    f32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

impl<T: KvElem> SeqKv<'_, T> {
    /// The same K/V typed as bf16, when `T` is bf16 (the pair engines' input).
    pub(crate) fn as_bf16(&self) -> Option<SeqKv<'_, bf16>> {
        let (k, v) = (T::as_bf16(self.k)?, T::as_bf16(self.v)?);
        Some(SeqKv {
            k,
            v,
            pages: self.pages,
            layout: self.layout,
            softcap: self.softcap,
            row_scales: self.row_scales,
        })
    }
}

/// Query rows of one sequence. Row `r` has query `q[r*d..][..d]` (already multiplied by the
/// scale), reads kv head `kv_head[r]` and sees positions `lo[r]..hi[r]`. Rows of one kv head
/// should be adjacent: runs of up to 8 of them share every K/V read.
pub(crate) struct Rows<'a> {
    pub q: &'a [f32],
    pub lo: &'a [usize],
    pub hi: &'a [usize],
    pub kv_head: &'a [usize],
    /// The same queries as the caller gave them in bf16, before the scale, and the scale
    /// (`q[i] = scale * q_bf16[i]`); set when the query input is bf16. The bf16 pair engines
    /// (`bf16dot.rs`: the tiled kernel's and the decode scores) multiply these (exact
    /// products) instead of `q`.
    pub q_bf16: Option<(&'a [half::bf16], f32)>,
}

/// Attends every row; writes the normalised output of row `r` to `out[r*d..][..d]`.
///
/// The sequence's K/V is walked once, block by block (a block is up to 32 tokens of one page),
/// and each block is used by every row group before moving on, so memory is read as one
/// stream per sequence (all heads of a token slot are adjacent in the usual layout).
#[cfg(test)]
pub(crate) fn attend<T: KvElem>(isa: Isa, kv: &SeqKv<'_, T>, rows: &Rows<'_>, out: &mut [f32]) {
    let n = rows.lo.len();
    let (mut m, mut l) = (vec![0f32; n], vec![0f32; n]);
    attend_partial(isa, kv, rows, out, &mut m, &mut l);
    normalize(kv.layout.head_dim, &l, out);
}

/// Divides each row of `out` (`d` floats) by its softmax sum `l[r]` (0 when the row saw
/// nothing): the end of [`attend`] and of the tiled kernel's whole-range items.
pub(crate) fn normalize(d: usize, l: &[f32], out: &mut [f32]) {
    for r in 0..l.len() {
        let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
        out[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= inv);
    }
}

/// The online-softmax state of every row, not normalised: `out[r*d..][..d]` gets
/// `sum_t exp(s_t - m[r]) v_t`, `m[r]` the largest score seen (`-inf` when the row sees no
/// position) and `l[r]` the sum `sum_t exp(s_t - m[r])` (0 then). States of disjoint position
/// ranges of one row merge exactly (see [`merge_partials`]); split-K decoding relies on it.
pub(crate) fn attend_partial<T: KvElem>(
    isa: Isa,
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    let isa = checked_path(isa, kv.layout.head_dim, rows, out, m, l);
    match isa.vector() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            // A bf16 query against a bf16 cache runs on bf16 pairs where the CPU can.
            if bf16dot::run_if_able(false, kv, rows, out, m, l) {
                return;
            }
            // SAFETY: check() found the features; the lengths are checked above and in `block`.
            unsafe { attend_avx512(kv, rows, out, m, l) }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { attend_avx2(kv, rows, out, m, l) },
        // SAFETY: the lengths are checked above and in `block`.
        Isa::Portable16 => unsafe {
            attend_impl::<Portable<16>, T, F32Scores>(kv, rows, out, m, l)
        },
        // SAFETY: as above.
        _ => unsafe { attend_impl::<Portable<8>, T, F32Scores>(kv, rows, out, m, l) },
    }
}

/// The tiled kernel's entry: as `kernel::attend_partial` (same arguments, same result up to
/// rounding), on the backend's path: `amx` runs the AMX engine where its pairs hold the cache's
/// values exactly (bf16 pairs for a bf16, fp8 or int8 cache; f16 pairs for an f16 cache on a CPU with
/// AMX-FP16 when every scaled query fits f16's range, see `amx.rs`) and its vector path
/// ([`Isa::vector`]) otherwise; the vector paths run the f32 [`tiled::Fma`] engine on their lanes
/// (`avx512` the bf16 pair engine for a bf16 query and cache where it can).
pub(crate) fn attend_partial_tiled<T: KvElem>(
    isa: Isa,
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    let d = kv.layout.head_dim;
    let isa = checked_path(isa, d, rows, out, m, l);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check() found AMX, the tile permission and AVX2/FMA/F16C; lengths checked
        // above and by slicing in `tiled::run`.
        Isa::Amx => {
            use amx::{Bf16Pairs, F16Pairs};
            if T::BF16_EXACT {
                // A bf16, fp8 or int8 cache: bf16 pairs hold its K/V exactly.
                // SAFETY: as above.
                unsafe { amx_avx2::<T, Bf16Pairs>(kv, rows, out, m, l) }
            } else if T::F16 && isa.amx_fp16() && fits_f16(&rows.q[..rows.lo.len() * d]) {
                // SAFETY: as above, and CPUID reports AMX-FP16.
                unsafe { amx_avx2::<T, F16Pairs>(kv, rows, out, m, l) }
            } else {
                // An f32 cache, or an f16 one without f16 tiles: bf16 pairs would round its
                // K/V to bf16 (a row that sees one key would get that V rounded to bf16), so
                // the vector path's engine, with the cache type's accuracy.
                attend_partial_tiled(isa.vector(), kv, rows, out, m, l)
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check() found the features; as above.
        Isa::Avx512 => {
            // A bf16 query against a bf16 cache multiplies bf16 pairs where the CPU can.
            if bf16dot::run_if_able(true, kv, rows, out, m, l) {
                return;
            }
            // SAFETY: check() found the features; as above.
            unsafe { fma_avx512(kv, rows, out, m, l) }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { fma_avx2(kv, rows, out, m, l) },
        // SAFETY: lengths as above.
        Isa::Portable16 => unsafe {
            tiled::run::<Portable<16>, T, _>(
                &mut tiled::Fma::<Portable<16>>::new(d),
                kv,
                rows,
                out,
                m,
                l,
            )
        },
        // SAFETY: lengths as above.
        _ => unsafe {
            tiled::run::<Scalar, T, _>(&mut tiled::Fma::<Scalar>::new(d), kv, rows, out, m, l)
        },
    }
}

/// [`tiled::run`] with the f32 engine on the AVX2 lanes, compiled with their features.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; lengths as `kernel::attend_partial` checks them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fma_avx2<T: KvElem>(
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this function's features are the AVX2 lanes' and the engine's, and the caller checked
    // the lengths.
    unsafe {
        let mut e = tiled::Fma::<avx2::Avx2>::new(kv.layout.head_dim);
        tiled::run::<avx2::Avx2, T, _>(&mut e, kv, rows, out, m, l)
    }
}

/// [`tiled::run`] with the f32 engine on the AVX-512 lanes, compiled with their features.
///
/// # Safety
/// The CPU must have AVX-512F/VL, AVX2, FMA and F16C; lengths as `kernel::attend_partial`
/// checks them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn fma_avx512<T: KvElem>(
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this function's features are the AVX-512 lanes' and the engine's, and the caller
    // checked the lengths.
    unsafe {
        // The 16-lane engine: 32-key score blocks, 32-column value blocks.
        let mut e = tiled::Fma::<avx512::Avx512>::new(kv.layout.head_dim);
        tiled::run::<avx512::Avx512, T, _>(&mut e, kv, rows, out, m, l)
    }
}

/// Whether every value of `q` is within f16's range (so rounds to a finite f16; NaN is not):
/// the AMX engine's f16 pairs take the scaled queries.
fn fits_f16(q: &[f32]) -> bool {
    let max = half::f16::MAX.to_f32();
    q.iter().all(|x| x.abs() <= max)
}

/// [`tiled::run`] with the AMX engine (hardware tiles, pairs `P`) on the AVX2 lanes.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AMX with the tile permission granted (`Isa::Amx`),
/// and AMX-FP16 for f16 pairs; lengths as `kernel::attend_partial` checks them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn amx_avx2<T: KvElem, P: amx::Pair>(
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this function's features are the AVX2 lanes'; the caller checked AMX (and AMX-FP16
    // for f16 pairs) and the lengths.
    unsafe {
        let mut e = amx::Amx::<_, P>::new(amx::AsmTiles, kv.layout.head_dim);
        tiled::run::<avx2::Avx2, T, _>(&mut e, kv, rows, out, m, l)
    }
}

/// What both kernels' entries ([`attend_partial`], [`attend_partial_tiled`]) check first: the
/// row arrays agree in length and `out`, `m`, `l` hold every row (panics otherwise: a caller
/// bug, never input). Returns the path to run: `isa`, or the portable path when the machine
/// lacks it (so a value naming a missing path never faults; `check()` is a cached load).
pub(crate) fn checked_path(
    isa: Isa,
    d: usize,
    rows: &Rows<'_>,
    out: &[f32],
    m: &[f32],
    l: &[f32],
) -> Isa {
    let n = rows.lo.len();
    assert!(rows.hi.len() == n && rows.kv_head.len() == n);
    assert!(rows.q.len() >= n * d && out.len() >= n * d);
    assert!(m.len() >= n && l.len() >= n);
    if isa.check().is_ok() {
        isa
    } else {
        Isa::Portable
    }
}

/// Merges the partial states of one row over disjoint position ranges into the normalised
/// output: with `M = max_i m_i` and `w_i = exp(m_i - M)`,
/// `out = sum_i w_i acc_i / sum_i w_i l_i` (zeros when no part saw a position), which is the
/// softmax over the union of the ranges.
pub(crate) fn merge_partials(parts: &[(&[f32], f32, f32)], out: &mut [f32]) {
    let mx = parts.iter().map(|p| p.1).fold(f32::NEG_INFINITY, f32::max);
    out.fill(0.0);
    if mx == f32::NEG_INFINITY {
        return;
    }
    let mut l = 0f32;
    for &(acc, m, pl) in parts {
        if m == f32::NEG_INFINITY {
            continue;
        }
        let w = (m - mx).exp();
        l += w * pl;
        out.iter_mut().zip(acc).for_each(|(o, a)| *o += w * a);
    }
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
    out.iter_mut().for_each(|x| *x *= inv);
}

/// [`attend_impl`] on the AVX2 lanes, compiled with their features.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; lengths as [`attend_partial`] checks them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2<T: KvElem>(
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this function's features are the AVX2 lanes' features, and the caller checked the
    // lengths.
    unsafe { attend_impl::<avx2::Avx2, T, F32Scores>(kv, rows, out, m, l) }
}

/// [`attend_impl`] on the AVX-512 lanes, compiled with their features.
///
/// # Safety
/// The CPU must have AVX-512F/VL, AVX2, FMA and F16C; lengths as [`attend_partial`] checks them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn attend_avx512<T: KvElem>(
    kv: &SeqKv<'_, T>,
    rows: &Rows<'_>,
    out: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this function's features are the AVX-512 lanes' features, and the caller checked the
    // lengths.
    unsafe { attend_impl::<avx512::Avx512, T, F32Scores>(kv, rows, out, m, l) }
}

#[cfg(test)]
mod tests;
