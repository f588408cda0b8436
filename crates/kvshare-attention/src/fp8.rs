//! The fp8 KV element types, [`Fp8E4M3`] and [`Fp8E5M2`] (OCP 8-bit floating point, the
//! formats of vLLM's `kv_cache_dtype` `fp8_e4m3` and `fp8_e5m2`), and their two conversions.
//!
//! Both read through one idea: an fp8 code is an IEEE binary16 (f16) value with fewer bits, so
//! its **f16 image** ([`Fp8::f16_bits`]) is a few shifts and the CPU's f16 conversion (F16C,
//! AVX-512) does the rest.
//!
//! * E5M2 (sign, 5 exponent bits, bias 15, 2 mantissa bits) *is* the upper byte of an f16:
//!   the image is `code << 8`, the code's value exactly, infinities and NaNs included.
//! * E4M3 "fn" (sign, 4 exponent bits, bias 7, 3 mantissa bits, no infinity, NaN = `S.1111.111`,
//!   largest finite 448) placed in an f16's exponent and upper mantissa bits
//!   (`sign << 15 | magnitude << 7`) reads as its value times `2^(7 - 15) = 2^-8`, subnormals
//!   included (an e4m3 subnormal `m/8 * 2^-6` lands on the f16 subnormal `m/8 * 2^-14`). The
//!   NaN codes get an all-ones f16 exponent. The factor `2^8` ([`Fp8::UNIT`]) is never applied
//!   per element: the kernels fold it, with the layer's scales, into the query and the output.
//!
//! Writing rounds an f32 to the nearest code, ties to even, directly from the f32 (no double
//! rounding through f16); a magnitude past the largest finite code (infinities too) saturates
//! to it, as vLLM's saturating conversion does, and NaN stays NaN.

use half::f16;

/// An 8-bit float E4M3 "fn" (bias 7, no infinity, largest finite 448), as stored in a
/// quantized KV cache. The bits are the code.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Fp8E4M3(pub u8);

/// An 8-bit float E5M2 (bias 15, the upper byte of an f16), as stored in a quantized KV cache.
/// The bits are the code.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Fp8E5M2(pub u8);

/// What the two fp8 formats share: their f16 image and their rounding from f32.
pub trait Fp8: Copy + Send + Sync + 'static {
    /// Explicit mantissa bits (3 or 2): a finite value in the normal range is stored with a
    /// relative error of at most `2^-(MANTISSA_BITS + 1)`.
    const MANTISSA_BITS: u32;
    /// The smallest normal exponent (`1 - bias`): below `2^MIN_EXP` values are subnormal, spaced
    /// `2^(MIN_EXP - MANTISSA_BITS)` apart.
    const MIN_EXP: i32;
    /// The largest finite value (448 or 57344).
    const MAX: f32;
    /// The value of the f16 image's 1: a code's value is its f16 image times `UNIT`.
    const UNIT: f32;
    /// The code.
    fn to_bits(self) -> u8;
    /// The element with code `b`.
    fn from_bits(b: u8) -> Self;
    /// The code's f16 image (see the module documentation).
    fn f16_bits(b: u8) -> u16;
    /// The magnitude bits of the NaN code that writing a NaN stores (with the NaN's sign).
    const NAN: u8;

    /// The element's value.
    fn to_f32(self) -> f32 {
        f16::from_bits(Self::f16_bits(self.to_bits())).to_f32() * Self::UNIT
    }

    /// `x` rounded to the nearest code, ties to even; beyond the largest finite magnitude,
    /// that magnitude with `x`'s sign; NaN gives a NaN code.
    ///
    /// Branch-free (selects only), so that a loop over a row compiles to vector code on each
    /// kernel path (`cpu/quantize.rs`) with the same result as one element at a time.
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        let m = Self::MANTISSA_BITS as i32;
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let a = f32::from_bits(bits & 0x7fff_ffff);
        // The spacing of codes around `a`: `2^(e - m)` in the binade `[2^e, 2^(e+1))`, the
        // subnormal spacing below `2^MIN_EXP` (zero and f32 subnormals included); infinities
        // and NaNs read as e = 128. Scaling by a power of two is exact, so the one rounding is
        // `round_ties_even`; past the largest finite code it saturates.
        let e = (((bits >> 23) & 0xff) as i32 - 127).max(Self::MIN_EXP);
        let r = (a * pow2(m - e)).round_ties_even() * pow2(e - m);
        // (A select rather than `min`, whose NaN rule costs a vector blend; a NaN is replaced
        // below.)
        let r = if r > Self::MAX { Self::MAX } else { r };
        // `r` is a code's value: its fields, or its multiple of the subnormal spacing.
        let rb = r.to_bits() as i32;
        let re = (rb >> 23) - 127;
        let normal = ((re - Self::MIN_EXP + 1) << m) | ((rb >> (23 - m)) & ((1 << m) - 1));
        // Below `2^MIN_EXP`, `r` is `k` times the subnormal spacing, `k < 2^m`: adding `2^23`
        // to `k` as a float puts `k` in the mantissa's low bits exactly (no float-to-int
        // conversion, which vector code would do one lane at a time).
        let subnormal = ((r * pow2(m - Self::MIN_EXP) + pow2(23)).to_bits() as i32) & 0xff;
        let mag = if re >= Self::MIN_EXP {
            normal
        } else {
            subnormal
        };
        let mag = if a.is_nan() { Self::NAN } else { mag as u8 };
        Self::from_bits(mag | sign)
    }
}

/// `2^e` for `e` in f32's normal range.
#[inline(always)]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

impl Fp8 for Fp8E4M3 {
    const MANTISSA_BITS: u32 = 3;
    const MIN_EXP: i32 = -6;
    const MAX: f32 = 448.0;
    const UNIT: f32 = 256.0;
    const NAN: u8 = 0x7f;
    fn to_bits(self) -> u8 {
        self.0
    }
    fn from_bits(b: u8) -> Self {
        Fp8E4M3(b)
    }
    #[inline(always)]
    fn f16_bits(b: u8) -> u16 {
        let (sign, mag) = ((b as u16 & 0x80) << 8, b as u16 & 0x7f);
        let nan = if mag == 0x7f { 0x7c00 } else { 0 };
        sign | mag << 7 | nan
    }
}

impl Fp8 for Fp8E5M2 {
    const MANTISSA_BITS: u32 = 2;
    const MIN_EXP: i32 = -14;
    const MAX: f32 = 57344.0;
    const UNIT: f32 = 1.0;
    /// A quiet NaN.
    const NAN: u8 = 0x7e;
    fn to_bits(self) -> u8 {
        self.0
    }
    fn from_bits(b: u8) -> Self {
        Fp8E5M2(b)
    }
    #[inline(always)]
    fn f16_bits(b: u8) -> u16 {
        (b as u16) << 8
    }
}

/// Views codes as elements (the C layer's and the tools' buffers are bytes).
pub fn e4m3_slice(b: &[u8]) -> &[Fp8E4M3] {
    // SAFETY: `Fp8E4M3` is `repr(transparent)` over `u8`: same size, alignment and validity.
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len()) }
}

/// As [`e4m3_slice`], mutable.
pub fn e4m3_slice_mut(b: &mut [u8]) -> &mut [Fp8E4M3] {
    // SAFETY: as in `e4m3_slice`; the result borrows `b` mutably for its whole life.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), b.len()) }
}

/// Views codes as elements (the C layer's and the tools' buffers are bytes).
pub fn e5m2_slice(b: &[u8]) -> &[Fp8E5M2] {
    // SAFETY: `Fp8E5M2` is `repr(transparent)` over `u8`: same size, alignment and validity.
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len()) }
}

/// As [`e5m2_slice`], mutable.
pub fn e5m2_slice_mut(b: &mut [u8]) -> &mut [Fp8E5M2] {
    // SAFETY: as in `e5m2_slice`; the result borrows `b` mutably for its whole life.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), b.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code's value from its definition (sign, exponent field, mantissa field), not
    /// through the f16 image.
    fn reference<T: Fp8>(b: u8) -> f64 {
        let (ebits, m) = (7 - T::MANTISSA_BITS, T::MANTISSA_BITS);
        let bias = 1 - T::MIN_EXP;
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((b >> m) & ((1 << ebits) - 1)) as i32;
        let f = (b & ((1 << m) - 1)) as f64 / (1 << m) as f64;
        let emax = (1 << ebits) - 1;
        if m == 3 && e == emax && f * 8.0 == 7.0 {
            return f64::NAN; // e4m3fn: only S.1111.111 is NaN, the rest of the top binade is finite
        }
        if m == 2 && e == emax {
            return if f == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        if e == 0 {
            sign * f * 2f64.powi(1 - bias)
        } else {
            sign * (1.0 + f) * 2f64.powi(e - bias)
        }
    }

    fn every_code<T: Fp8>() {
        for b in 0..=255u8 {
            let want = reference::<T>(b);
            let got = T::from_bits(b).to_f32() as f64;
            if want.is_nan() {
                assert!(got.is_nan(), "code {b:#04x}");
                assert!(T::from_f32(got as f32).to_f32().is_nan());
                continue;
            }
            assert_eq!(got, want, "code {b:#04x}");
            if want.is_finite() {
                // Every finite code is its own rounding (both zeros keep their sign).
                assert_eq!(T::from_f32(got as f32).to_bits(), b, "code {b:#04x}");
            }
        }
    }

    #[test]
    fn every_code_reads_its_value_and_writes_back() {
        every_code::<Fp8E4M3>();
        every_code::<Fp8E5M2>();
    }

    /// The codes' finite non-negative values, in order.
    fn finite<T: Fp8>() -> Vec<f64> {
        let mut v: Vec<f64> = (0..0x80u8)
            .map(reference::<T>)
            .filter(|x| x.is_finite())
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }

    /// Rounds against the sorted table: nearest, ties to the even code, saturating.
    fn round_by_table<T: Fp8>(x: f32) -> f64 {
        round_in::<T>(&finite::<T>(), x)
    }

    fn round_in<T: Fp8>(t: &[f64], x: f32) -> f64 {
        let a = (x as f64).abs();
        let s = if x.is_sign_negative() { -1.0 } else { 1.0 };
        if a >= *t.last().unwrap() {
            return s * t.last().unwrap();
        }
        let i = t.partition_point(|&v| v <= a) - 1;
        let (lo, hi) = (t[i], t[i + 1]);
        let pick = if a - lo < hi - a {
            lo
        } else if a - lo > hi - a {
            hi
        } else if T::from_f32(lo as f32).to_bits() & 1 == 0 {
            lo
        } else {
            hi
        };
        s * pick
    }

    fn rounding<T: Fp8>() {
        let t = finite::<T>();
        let mut xs: Vec<f32> = vec![f32::INFINITY, f32::MAX, 1e-30, 0.0];
        for w in t.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let mid = (lo + hi) / 2.0;
            for x in [
                mid,
                mid * (1.0 + 1e-7),
                mid * (1.0 - 1e-7),
                lo + (hi - lo) * 0.3,
            ] {
                xs.push(x as f32);
            }
        }
        let top = *t.last().unwrap();
        xs.extend([top * 1.01, top * 1.2, top * 3.0].map(|x| x as f32));
        for x in xs {
            for x in [x, -x] {
                let got = T::from_f32(x).to_f32() as f64;
                assert_eq!(got, round_by_table::<T>(x), "x = {x:e}");
                assert_eq!(got.is_sign_negative(), x.is_sign_negative(), "x = {x:e}");
            }
        }
        assert!(T::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn writing_rounds_to_nearest_even_and_saturates() {
        rounding::<Fp8E4M3>();
        rounding::<Fp8E5M2>();
    }

    /// Every 4,093rd f32 bit pattern (about a million, every sign, binade, subnormals and NaNs
    /// among them) writes the table's rounding, its sign kept, and NaNs a NaN code.
    fn sweep<T: Fp8>() {
        let t = finite::<T>();
        for bits in (0..=u32::MAX).step_by(4093) {
            let x = f32::from_bits(bits);
            let got = T::from_f32(x);
            if x.is_nan() {
                assert!(got.to_f32().is_nan(), "{bits:#010x}");
                assert_eq!(
                    got.to_bits() & 0x80 != 0,
                    x.is_sign_negative(),
                    "{bits:#010x}"
                );
                continue;
            }
            let got = got.to_f32() as f64;
            assert_eq!(got, round_in::<T>(&t, x), "{bits:#010x}");
            assert_eq!(got.is_sign_negative(), x.is_sign_negative(), "{bits:#010x}");
        }
    }

    #[test]
    fn writing_sweeps_the_f32_bit_patterns() {
        sweep::<Fp8E4M3>();
        sweep::<Fp8E5M2>();
    }
}
