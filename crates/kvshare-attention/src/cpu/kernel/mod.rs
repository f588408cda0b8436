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

use half::{bf16, f16};

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

/// A KV element type.
pub(crate) trait KvElem: Copy + Send + Sync + 'static {
    /// Whether a chunk pair (`2W` elements) of this type loads as its even and its odd elements
    /// ([`Self::load8x2_avx2`]) rather than in order (see [`split_pairs`]). bf16 does: a bf16
    /// is the upper half of an f32, so one load gives 16 values through one shift (the even
    /// ones) and one AND (the odd ones), where widening them in order takes a zero-extend and a
    /// shift per 8.
    const SPLIT: bool = false;
    /// Whether this is f16 (the AMX engine multiplies an f16 cache in f16 pairs where the
    /// CPU has AMX-FP16, `tiled.rs`).
    const F16: bool = false;
    fn to_f32(self) -> f32;
    /// The slice as bf16 when `Self` is bf16 (the tiled kernel's pair engine takes bf16 only).
    fn as_bf16(s: &[Self]) -> Option<&[bf16]> {
        let _ = s;
        None
    }
    /// Loads 8 elements as f32.
    ///
    /// # Safety
    /// `p` must be valid for 8 reads; the CPU must have AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8_avx2(p: *const Self) -> std::arch::x86_64::__m256;
    /// Loads 16 elements as f32.
    ///
    /// # Safety
    /// `p` must be valid for 16 reads; the CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16_avx512(p: *const Self) -> std::arch::x86_64::__m512;
    /// 16 elements as two vectors of 8: in order, or even and odd ones when [`Self::SPLIT`].
    ///
    /// # Safety
    /// As [`Self::load8_avx2`], for 16 reads.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2_avx2(p: *const Self) -> [std::arch::x86_64::__m256; 2] {
        // SAFETY: `p` is valid for 16 reads (this method's contract), so `p + 8` is in bounds and
        // both halves are valid for 8; the caller has AVX2, FMA and F16C, as `load8_avx2` needs.
        unsafe { [Self::load8_avx2(p), Self::load8_avx2(p.add(8))] }
    }
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: `p` is valid for 8 f32 reads and the CPU has AVX (the `load8_avx2` contract);
        // `loadu` takes any alignment.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_avx512(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: `p` is valid for 16 f32 reads and the CPU has AVX-512F (the `load16_avx512`
        // contract); `loadu` takes any alignment.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

impl KvElem for f16 {
    const F16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: `p` is valid for 8 f16 reads, the 16 bytes loaded (unaligned), and the CPU has
        // F16C (the `load8_avx2` contract).
        unsafe {
            use std::arch::x86_64::*;
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>()))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_avx512(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: `p` is valid for 16 f16 reads, the 32 bytes loaded (unaligned), and the CPU has
        // AVX-512F (the `load16_avx512` contract).
        unsafe {
            use std::arch::x86_64::*;
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>()))
        }
    }
}

impl KvElem for bf16 {
    const SPLIT: bool = true;
    fn as_bf16(s: &[Self]) -> Option<&[bf16]> {
        Some(s)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: `p` is valid for 8 bf16 reads, the 16 bytes loaded (unaligned), and the CPU has
        // AVX2 (the `load8_avx2` contract).
        unsafe {
            use std::arch::x86_64::*;
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast::<__m128i>()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_avx512(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: `p` is valid for 16 bf16 reads, the 32 bytes loaded (unaligned), and the CPU has
        // AVX-512F (the `load16_avx512` contract).
        unsafe {
            use std::arch::x86_64::*;
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast::<__m256i>()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2_avx2(p: *const Self) -> [std::arch::x86_64::__m256; 2] {
        // SAFETY: `p` is valid for 16 bf16 reads, the 32 bytes loaded (unaligned), and the CPU has
        // AVX2 (the `load8x2_avx2` contract), which `high_halves` needs too.
        unsafe {
            use std::arch::x86_64::*;
            // 32-bit lane i holds element 2i in its low half and 2i + 1 in its high half.
            let x = _mm256_loadu_si256(p.cast::<__m256i>());
            [
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)),
                high_halves(_mm256_castsi256_ps(x)),
            ]
        }
    }
}

/// The high 16-bit half of each 32-bit lane of `x` (the low one zeroed): `vandps` with a mask
/// read from memory, written as such. LLVM turns an AND with this mask (whole 16-bit halves)
/// into `vpblendw` with zero, which on Zen 1 shares the FMA pipes (measured with
/// `scripts/fma-probe.c`: a turn of 8 FMAs with the split-pair conversion 9.9 cycles with the
/// blend, 7.8–7.9 with an AND; the FMAs alone 7.9); and a mask passed in a register was
/// re-broadcast from the constant pool before every AND (a second instruction per 16 values in
/// the decode loops), where the memory operand folds that load into the AND. Inlined where the
/// caller has AVX.
///
/// # Safety
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn high_halves(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    // SAFETY: the caller has AVX (`vandps ymm`); the asm reads only the 32 aligned bytes of
    // `HIGH_HALVES`, a static, and writes no memory, as its options say.
    unsafe {
        #[repr(C, align(32))]
        struct Mask([u32; 8]);
        static HIGH_HALVES: Mask = Mask([0xffff_0000; 8]);
        let r;
        std::arch::asm!(
            "vandps {r}, {x}, ymmword ptr [rip + {m}]",
            r = lateout(ymm_reg) r,
            x = in(ymm_reg) x,
            m = sym HIGH_HALVES,
            options(pure, readonly, nostack, preserves_flags)
        );
        r
    }
}

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
    /// drops, see README); the AVX-512 path does not (its count of executed instructions went
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
use prefetch::Ahead;
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

/// What both kernels' entries ([`attend_partial`], `tiled::attend_partial`) check first: the
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

/// Online-softmax state of up to 8 adjacent rows of one kv head.
struct Group {
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
trait Scores<T: KvElem> {
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
struct F32Scores;

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
unsafe fn attend_impl<L: Lanes, T: KvElem, S: Scores<T>>(
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
struct Block<'a> {
    /// Element offset of the block's first row for the group's kv head.
    base: usize,
    /// Position of the first token.
    pos: usize,
    /// Tokens.
    n: usize,
    q: &'a [f32],
    /// The group's rows of [`Rows::q_bf16`] and the scale.
    q_bf16: Option<(&'a [bf16], f32)>,
    lo: &'a [usize],
    hi: &'a [usize],
}

/// Scores of `TT` K rows against `NG` query rows: `s[t * NG + r] = q[r] . k[t]`. Each K chunk
/// is converted once and used by every row; `TT * NG` independent accumulators hide the FMA
/// latency. `q` holds `NG * d` values; each `krows[t]` must be valid for `d` reads (`block`
/// checks its whole block once: per-row slices cost a bounds check and two stores per row).
///
/// # Safety
/// The CPU must have `L`'s features; each `krows[t]` valid for `d` reads of `T`.
#[inline(always)]
unsafe fn qk<L: Lanes, T: KvElem, const NG: usize, const TT: usize>(
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
unsafe fn qk_chunk<L: Lanes, T: KvElem, const NG: usize, const TT: usize>(
    a: &mut [L::V; 16],
    q: &[f32],
    krows: [*const T; TT],
    d: usize,
    c: usize,
) {
    // SAFETY: the caller gives `L`'s features, `krows[t]` valid for `d` reads and `c + W <= d`, so
    // each `W`-wide load at `krows[t] + c` is in bounds; `qk_fma` gets the same `c`.
    unsafe {
        let kk: [L::V; TT] = std::array::from_fn(|t| L::load_kv(krows[t].add(c)));
        qk_fma::<L, NG, TT>(a, q, kk, d, c);
    }
}

/// The chunk pair at `c` of [`qk`] through [`Lanes::load_kv2`] (for [`Lanes::split`], whose
/// query rows are in [`split_pairs`]).
///
/// # Safety
/// As [`qk`]; `c + 2W <= d`.
#[inline(always)]
unsafe fn qk_pair<L: Lanes, T: KvElem, const NG: usize, const TT: usize>(
    a: &mut [L::V; 16],
    q: &[f32],
    krows: [*const T; TT],
    d: usize,
    c: usize,
) {
    // SAFETY: the caller gives `L`'s features, `krows[t]` valid for `d` reads and `c + 2W <= d`, so
    // each `2W`-wide pair load at `krows[t] + c` is in bounds; `qk_fma` gets `c` and `c + W`.
    unsafe {
        let kk: [[L::V; 2]; TT] = std::array::from_fn(|t| L::load_kv2(krows[t].add(c)));
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
unsafe fn qk_fma<L: Lanes, const NG: usize, const TT: usize>(
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
unsafe fn load_chunks<L: Lanes, T: KvElem, const U: usize>(
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
            return std::array::from_fn(|u| L::load_kv(row.add(c + w * u)));
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
unsafe fn pv<L: Lanes, T: KvElem, const NG: usize, const U: usize>(
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
unsafe fn pv_rows<L: Lanes, T: KvElem, const NG: usize, const U: usize>(
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
unsafe fn block<
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

#[cfg(test)]
mod tests;
