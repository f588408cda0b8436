//! The AVX2 lanes: AVX2 + FMA + F16C intrinsics, 8 f32 lanes in a `__m256` (f16 converted by
//! `vcvtph2ps`, bf16 16 at a time as split pairs: a shift and an AND, `KvElem::load8x2_avx2`).

use super::{KvElem, Lanes};
use std::arch::x86_64::*;

/// The AVX2 path's lanes (needs AVX2, FMA and F16C).
pub(super) struct Avx2;

/// `exp(r)` for `|r| <= ln 2 / 2`: the Cephes degree-6 polynomial.
///
/// # Safety
/// The CPU must have AVX and FMA.
#[inline(always)]
unsafe fn poly(r: __m256) -> __m256 {
    // SAFETY: the caller has AVX and FMA; these intrinsics touch no memory.
    unsafe {
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        _mm256_fmadd_ps(
            p,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        )
    }
}

/// `exp` per lane; lanes below -87 (and `-inf`) give 0.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    // SAFETY: the caller has AVX2 and FMA, which these intrinsics and `poly` need; they touch no
    // memory.
    unsafe {
        // Cephes expf: range reduction by ln 2 (split in two constants), degree-6 polynomial;
        // relative error about 2e-7 on the range used here (x <= 0).
        let zero = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.0));
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
            _mm256_set1_ps(88.0),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let p = poly(r);
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(e)))
    }
}

/// Lane `i` of the result is the sum of the lanes of `a[i]` (a transposed horizontal sum).
///
/// # Safety
/// The CPU must have AVX.
#[inline(always)]
pub(super) unsafe fn hsum8(a: &[__m256; 8]) -> __m256 {
    // SAFETY: the caller has AVX; these intrinsics touch no memory.
    unsafe {
        // hadd pairs: [a0 a0 a1 a1 | ...] partial sums, then lane halves added.
        let h01 = _mm256_hadd_ps(a[0], a[1]);
        let h23 = _mm256_hadd_ps(a[2], a[3]);
        let h45 = _mm256_hadd_ps(a[4], a[5]);
        let h67 = _mm256_hadd_ps(a[6], a[7]);
        let h0123 = _mm256_hadd_ps(h01, h23);
        let h4567 = _mm256_hadd_ps(h45, h67);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(h0123, h4567),
            _mm256_permute2f128_ps::<0x31>(h0123, h4567),
        )
    }
}

impl Lanes for Avx2 {
    const W: usize = 8;
    const SPLITS: bool = true;
    type V = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: `p` is valid for 8 f32 reads and the CPU has AVX (the `Lanes::load` contract);
        // `loadu` takes any alignment.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: `p` is valid for 8 f32 writes and the CPU has AVX (the `Lanes::store` contract);
        // `storeu` takes any alignment.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    unsafe fn transpose(a: &mut [__m256; 16]) {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe {
            // 4 x 4 blocks within each 128-bit half (unpack, shuffle), then the halves swapped.
            let mut t = [_mm256_setzero_ps(); 8];
            for i in 0..4 {
                t[2 * i] = _mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]);
            }
            let mut u = [_mm256_setzero_ps(); 8];
            for j in 0..2 {
                let b = 4 * j;
                u[b] = _mm256_shuffle_ps::<0x44>(t[b], t[b + 2]);
                u[b + 1] = _mm256_shuffle_ps::<0xee>(t[b], t[b + 2]);
                u[b + 2] = _mm256_shuffle_ps::<0x44>(t[b + 1], t[b + 3]);
                u[b + 3] = _mm256_shuffle_ps::<0xee>(t[b + 1], t[b + 3]);
            }
            // u[m] (rows 0-3) and u[4 + m] (rows 4-7) hold column m in their low halves and
            // column 4 + m in their high halves.
            for m in 0..4 {
                a[m] = _mm256_permute2f128_ps::<0x20>(u[m], u[4 + m]);
                a[4 + m] = _mm256_permute2f128_ps::<0x31>(u[m], u[4 + m]);
            }
        }
    }
    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe {
            let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_max_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    unsafe fn hsum_w(a: &[__m256; 16]) -> __m256 {
        // SAFETY: the caller has AVX2 (the `Lanes` contract), which `hsum8` needs.
        unsafe { hsum8(&[a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller runs on a CPU with AVX2, FMA and F16C (the `Lanes` contract of this
        // path); these intrinsics need no more and touch no memory.
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn exp(v: __m256) -> __m256 {
        // SAFETY: the caller has AVX2 and FMA (the `Lanes` contract), which `exp8` needs.
        unsafe { exp8(v) }
    }
    #[inline(always)]
    unsafe fn load_kv<T: KvElem>(p: *const T) -> __m256 {
        // SAFETY: `p` is valid for 8 reads and the CPU has AVX2, FMA and F16C (the `Lanes::load_kv`
        // contract), as `load8_avx2` needs.
        unsafe { T::load8_avx2(p) }
    }
    #[inline(always)]
    unsafe fn load_kv2<T: KvElem>(p: *const T) -> [__m256; 2] {
        // SAFETY: `p` is valid for 16 reads and the CPU has AVX2, FMA and F16C (the
        // `Lanes::load_kv2` contract), as `load8x2_avx2` needs.
        unsafe { T::load8x2_avx2(p) }
    }
}
