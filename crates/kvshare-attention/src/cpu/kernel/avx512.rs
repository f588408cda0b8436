//! The AVX-512 lanes: 16 f32 lanes in a `__m512` (AVX-512F; the path also requires VL and the
//! AVX2 set). f16 K/V is converted by `vcvtph2ps zmm` (16 values per instruction), bf16 by a
//! widening shift; `exp` scales by `vscalefps`. AVX512_FP16 arithmetic is not used, nor
//! AVX512_BF16 in decode: the kernel accumulates in f32 and converts each K/V vector once, which
//! these conversions already do in one or two instructions. Prefill of a bf16 query against a
//! bf16 cache scores by AVX512_BF16 pairs where the CPU has them (`bf16dot.rs`).
//!
//! Run and timed natively on a Zen 4 EPYC (docs/performance.md, "AVX-512": decode faster than
//! vLLM's AVX-512 build). bf16 is widened in order, not in split pairs
//! as on `avx2`: the split timed 1.00-1.05x slower there. On machines without AVX-512 this file runs in the
//! tests under an x86 emulator (BochsCPU; `integration/vllm_ascend/tests/test_ops_emulated.py`
//! emulates whole `kvs_attention_launch` calls on this path against the f64 reference, on an
//! emulated Cannon Lake and an emulated Sapphire Rapids), and the same 16-lane algorithm runs
//! natively through `portable::Portable<16>`. Never run on an Intel AVX-512 core.

use super::avx2::hsum8;
use super::{KvElem, Lanes};
use std::arch::x86_64::*;

/// The AVX-512 path's lanes (needs AVX-512F/VL, AVX2, FMA and F16C).
pub(super) struct Avx512;

/// `exp(r)` for `|r| <= ln 2 / 2`: the Cephes degree-6 polynomial (as `avx2::poly`).
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn poly16(r: __m512) -> __m512 {
    // SAFETY: the caller has AVX-512F; these intrinsics touch no memory.
    unsafe {
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_fmadd_ps(
            p,
            _mm512_mul_ps(r, r),
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        )
    }
}

/// `exp` per lane; lanes below -87 (and `-inf`) give 0.
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn exp16(x: __m512) -> __m512 {
    // SAFETY: the caller has AVX-512F, which these intrinsics and `poly16` need; they touch no
    // memory.
    unsafe {
        // As avx2::exp8; lanes below -87 (and -inf) are zeroed by mask, 2^n applied by vscalefps.
        let tiny: __mmask16 = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.0));
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
            _mm512_set1_ps(88.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        _mm512_maskz_mov_ps(!tiny, _mm512_scalef_ps(poly16(r), n))
    }
}

/// The upper 256 bits of `v` (AVX-512F only; `vextractf32x8` would need DQ).
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn high256(v: __m512) -> __m256 {
    // SAFETY: the caller has AVX-512F; these intrinsics touch no memory.
    unsafe { _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))) }
}

impl Lanes for Avx512 {
    const W: usize = 16;
    type V = __m512;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: `p` is valid for 16 f32 reads and the CPU has AVX-512F (the `Lanes::load`
        // contract); `loadu` takes any alignment.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: `p` is valid for 16 f32 writes and the CPU has AVX-512F (the `Lanes::store`
        // contract); `storeu` takes any alignment.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn hsum(v: __m512) -> f32 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    unsafe fn transpose(a: &mut [__m512; 16]) {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe {
            // 4 x 4 blocks within each 128-bit lane (unpack, shuffle), then the lanes gathered
            // in two 128-bit shuffles.
            let mut t = [_mm512_setzero_ps(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
            }
            let mut u = [_mm512_setzero_ps(); 16];
            for j in 0..4 {
                let b = 4 * j;
                u[b] = _mm512_shuffle_ps::<0x44>(t[b], t[b + 2]);
                u[b + 1] = _mm512_shuffle_ps::<0xee>(t[b], t[b + 2]);
                u[b + 2] = _mm512_shuffle_ps::<0x44>(t[b + 1], t[b + 3]);
                u[b + 3] = _mm512_shuffle_ps::<0xee>(t[b + 1], t[b + 3]);
            }
            // Lane k of u[4j + m] holds column 4k + m of rows 4j..4j + 4.
            for m in 0..4 {
                let v1 = _mm512_shuffle_f32x4::<0x88>(u[m], u[4 + m]);
                let v2 = _mm512_shuffle_f32x4::<0xdd>(u[m], u[4 + m]);
                let w1 = _mm512_shuffle_f32x4::<0x88>(u[8 + m], u[12 + m]);
                let w2 = _mm512_shuffle_f32x4::<0xdd>(u[8 + m], u[12 + m]);
                a[m] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
                a[4 + m] = _mm512_shuffle_f32x4::<0x88>(v2, w2);
                a[8 + m] = _mm512_shuffle_f32x4::<0xdd>(v1, w1);
                a[12 + m] = _mm512_shuffle_f32x4::<0xdd>(v2, w2);
            }
        }
    }
    #[inline(always)]
    unsafe fn hmax(v: __m512) -> f32 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    unsafe fn hsum_w(a: &[__m512; 16]) -> __m512 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory, and `hsum8` and
        // `high256` need no more.
        unsafe {
            // Fold each vector to 8 lanes, then two 8-way transposed sums (rows 0-7 and 8-15).
            // A plain loop, not `std::array::from_fn`: a closure does not inherit the caller's
            // target features, so its intrinsics cannot be inlined into it, and when the compiler
            // kept `from_fn` out of line each lane was a function call through memory (measured:
            // 42-47% of an avx512 decode launch's instructions; kernel.rs's `from_fn` calls are
            // inlined, so their intrinsics land in the target-feature function).
            let mut h = [_mm256_setzero_ps(); 16];
            for i in 0..16 {
                h[i] = _mm256_add_ps(_mm512_castps512_ps256(a[i]), high256(a[i]));
            }
            let lo = hsum8(&[h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
            let hi = hsum8(&[h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                _mm256_castps_pd(hi),
            ))
        }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller runs on a CPU with AVX-512F/VL and the AVX2 set (the `Lanes` contract
        // of this path); these intrinsics need no more and touch no memory.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn exp(v: __m512) -> __m512 {
        // SAFETY: the caller has AVX-512F (the `Lanes` contract), which `exp16` needs.
        unsafe { exp16(v) }
    }
    #[inline(always)]
    unsafe fn load_kv<T: KvElem>(p: *const T) -> __m512 {
        // SAFETY: `p` is valid for 16 reads and the CPU has AVX-512F (the `Lanes::load_kv`
        // contract), as `load16_avx512` needs.
        unsafe { T::load16_avx512(p) }
    }
}
