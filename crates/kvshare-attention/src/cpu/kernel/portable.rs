//! The portable lanes: plain `[f32; N]` arrays (N = 8 or 16), which the compiler vectorises for
//! the build target (SSE2 on x86-64, NEON on aarch64). `Portable<8>` is the `portable` path;
//! `Portable<16>` runs the 16-lane algorithm of the AVX-512 path (group sizes, score batches,
//! tails) on any machine, so it is tested where AVX-512 is missing.

use super::{KvElem, Lanes};

/// `N` f32 lanes in an array.
pub(super) struct Portable<const N: usize>;

impl<const N: usize> Lanes for Portable<N> {
    const W: usize = N;
    type V = [f32; N];
    #[inline(always)]
    unsafe fn zero() -> [f32; N] {
        [0.0; N]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> [f32; N] {
        [x; N]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> [f32; N] {
        // SAFETY: `p` is valid for `N` f32 reads (the `Lanes::load` contract); `read_unaligned`
        // takes any alignment.
        unsafe { p.cast::<[f32; N]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; N]) {
        // SAFETY: `p` is valid for `N` f32 writes (the `Lanes::store` contract); `write_unaligned`
        // takes any alignment.
        unsafe { p.cast::<[f32; N]>().write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn fma(a: [f32; N], b: [f32; N], c: [f32; N]) -> [f32; N] {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    unsafe fn hsum(v: [f32; N]) -> f32 {
        // Pairwise halves, as a vector unit sums.
        let mut v = v;
        let mut w = N;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                v[i] += v[i + w];
            }
        }
        v[0]
    }
    #[inline(always)]
    unsafe fn transpose(a: &mut [[f32; N]; 16]) {
        for i in 0..N {
            for j in i + 1..N {
                let x = a[i][j];
                a[i][j] = a[j][i];
                a[j][i] = x;
            }
        }
    }
    #[inline(always)]
    unsafe fn hmax(v: [f32; N]) -> f32 {
        let mut v = v;
        let mut w = N;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                v[i] = v[i].max(v[i + w]);
            }
        }
        v[0]
    }
    #[inline(always)]
    unsafe fn hsum_w(a: &[[f32; N]; 16]) -> [f32; N] {
        // SAFETY: `hsum` on these lanes is plain array code, which needs no CPU feature.
        unsafe { std::array::from_fn(|i| Self::hsum(a[i])) }
    }
    #[inline(always)]
    unsafe fn add(a: [f32; N], b: [f32; N]) -> [f32; N] {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    unsafe fn sub(a: [f32; N], b: [f32; N]) -> [f32; N] {
        std::array::from_fn(|i| a[i] - b[i])
    }
    #[inline(always)]
    unsafe fn max(a: [f32; N], b: [f32; N]) -> [f32; N] {
        std::array::from_fn(|i| a[i].max(b[i]))
    }
    #[inline(always)]
    unsafe fn exp(v: [f32; N]) -> [f32; N] {
        v.map(f32::exp)
    }
    #[inline(always)]
    unsafe fn load_kv<T: KvElem>(p: *const T) -> [f32; N] {
        // SAFETY: `p` is valid for `N` reads of `T` (the `Lanes::load_kv` contract), so `p + i` for
        // `i < N` is in bounds; `T` is a plain `Copy` value.
        unsafe { std::array::from_fn(|i| p.add(i).read().to_f32()) }
    }
}
