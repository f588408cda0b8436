//! The quantizing KV write's inner loop: one row of new values (f32) divided by the cache's
//! scales, less its channels' offsets, and rounded to the cache's 8-bit codes.
//!
//! One element-wise definition ([`Code::code`]: fp8 through [`Fp8::from_f32`], which is
//! branch-free; int8 rounded to nearest, ties to even, saturating, NaN to 0) in one loop
//! ([`row`]), compiled once for each kernel path: plain, and inside AVX2 and AVX-512 functions,
//! where the compiler turns the loop into 8- and 16-lane vector code. Every path stores the same
//! codes bit for bit (the tests below compare them on values that reach every branch).

use crate::fp8::{Fp8, Fp8E4M3, Fp8E5M2};

use super::isa::Isa;

/// An 8-bit code of a quantized cache.
pub(super) trait Code: Copy {
    /// `x` (already divided by the scales) rounded to the code.
    fn code(x: f32) -> Self;
}

impl Code for i8 {
    /// Nearest, ties to even, saturating to -128..=127, NaN to 0 (int8 has none): `x` clamped,
    /// then added to `1.5 * 2^23`, whose sum's one rounding is to the nearest integer, ties to
    /// even, and whose low mantissa bits are then that integer (two's complement). Selects and
    /// integer operations only: a float-to-int `as`, which saturates, runs one lane at a time
    /// in vector code.
    #[inline(always)]
    fn code(x: f32) -> i8 {
        const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
        let y = if x > 127.0 { 127.0 } else { x };
        let y = if y < -128.0 { -128.0 } else { y };
        let y = if x.is_nan() { 0.0 } else { y };
        (y + MAGIC).to_bits() as i8
    }
}

impl Code for Fp8E4M3 {
    #[inline(always)]
    fn code(x: f32) -> Self {
        Fp8::from_f32(x)
    }
}

impl Code for Fp8E5M2 {
    #[inline(always)]
    fn code(x: f32) -> Self {
        Fp8::from_f32(x)
    }
}

/// What divides and shifts a row: the cache's `scale`, per-channel scales (`n` of them) and
/// per-channel offsets in codes (`n`).
#[derive(Clone, Copy)]
pub(super) struct Scaling<'a> {
    pub scale: f32,
    pub channel: Option<&'a [f32]>,
    pub offset: Option<&'a [f32]>,
}

impl Scaling<'_> {
    /// `x[i] = x[i] / (scale * channel[i]) - offset[i]` in place (a cache of f16, bf16 or f32
    /// written with scales; their conversion follows).
    pub fn apply(&self, x: &mut [f32]) {
        let scale = self.scale;
        match self.channel {
            Some(c) => x.iter_mut().zip(c).for_each(|(x, c)| *x /= scale * c),
            None if scale != 1.0 => x.iter_mut().for_each(|x| *x /= scale),
            None => {}
        }
        if let Some(o) = self.offset {
            x.iter_mut().zip(o).for_each(|(x, o)| *x -= o);
        }
    }
}

/// `d[i] = code(x[i] / (scale * channel[i]) - offset[i])` for every `i` (a missing channel
/// scale is 1, a missing offset 0). The four cases are separate loops so that none branches
/// per element.
#[inline(always)]
fn row<Q: Code>(d: &mut [Q], x: &[f32], s: Scaling<'_>) {
    let n = d.len();
    let x = &x[..n];
    let scale = s.scale;
    match (s.channel, s.offset) {
        (None, None) => {
            for (d, &x) in d.iter_mut().zip(x) {
                *d = Q::code(x / scale);
            }
        }
        (Some(c), None) => {
            for ((d, &x), &c) in d.iter_mut().zip(x).zip(&c[..n]) {
                *d = Q::code(x / (scale * c));
            }
        }
        (None, Some(o)) => {
            for ((d, &x), &o) in d.iter_mut().zip(x).zip(&o[..n]) {
                *d = Q::code(x / scale - o);
            }
        }
        (Some(c), Some(o)) => {
            for (((d, &x), &c), &o) in d.iter_mut().zip(x).zip(&c[..n]).zip(&o[..n]) {
                *d = Q::code(x / (scale * c) - o);
            }
        }
    }
}

/// [`row`] in AVX2 code.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_avx2<Q: Code>(d: &mut [Q], x: &[f32], s: Scaling<'_>) {
    row(d, x, s)
}

/// [`row`] in AVX-512 code.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512VL (and the AVX2 set).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn row_avx512<Q: Code>(d: &mut [Q], x: &[f32], s: Scaling<'_>) {
    row(d, x, s)
}

/// Writes the codes of `x` (`d.len()` values, already in f32) with `s` into `d`, in the vector
/// code of `isa` when the machine runs it (the plain loop otherwise; `amx` writes with its
/// vector path).
pub(super) fn quantize<Q: Code>(isa: Isa, d: &mut [Q], x: &[f32], s: Scaling<'_>) {
    assert!(x.len() >= d.len());
    assert!(s.channel.is_none_or(|c| c.len() >= d.len()));
    assert!(s.offset.is_none_or(|o| o.len() >= d.len()));
    #[cfg(target_arch = "x86_64")]
    match isa.vector() {
        // SAFETY: the path's features were checked on this machine just now.
        Isa::Avx512 if Isa::Avx512.check().is_ok() => return unsafe { row_avx512(d, x, s) },
        // SAFETY: as above.
        Isa::Avx2 if Isa::Avx2.check().is_ok() => return unsafe { row_avx2(d, x, s) },
        _ => {}
    }
    let _ = isa;
    row(d, x, s)
}

/// The largest finite magnitude in `x` (0 when none), for an int8 per-token-head row's scale:
/// a maximum over the magnitudes' bit patterns, which order as the magnitudes do, with
/// infinities and NaNs (exponent all ones) counted as 0. Integer maxima, so the loop is vector
/// code on every path (a float maximum's NaN rule keeps it scalar).
#[inline(always)]
fn finite_amax_of(x: &[f32]) -> f32 {
    let mut m = 0u32;
    for &v in x {
        let b = v.to_bits() & 0x7fff_ffff;
        let b = if b < 0x7f80_0000 { b } else { 0 };
        m = m.max(b);
    }
    f32::from_bits(m)
}

/// [`finite_amax_of`] in AVX2 code.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn finite_amax_avx2(x: &[f32]) -> f32 {
    finite_amax_of(x)
}

/// [`finite_amax_of`] in AVX-512 code.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512VL (and the AVX2 set).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn finite_amax_avx512(x: &[f32]) -> f32 {
    finite_amax_of(x)
}

/// The largest finite `|x[i]|` (0 when none), in the vector code of `isa` where the machine
/// runs it.
pub(super) fn finite_amax(isa: Isa, x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match isa.vector() {
        // SAFETY: the path's features were checked on this machine just now.
        Isa::Avx512 if Isa::Avx512.check().is_ok() => return unsafe { finite_amax_avx512(x) },
        // SAFETY: as above.
        Isa::Avx2 if Isa::Avx2.check().is_ok() => return unsafe { finite_amax_avx2(x) },
        _ => {}
    }
    let _ = isa;
    finite_amax_of(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values that reach every branch of every code: zeros of both signs, f32 subnormals, the
    /// formats' subnormal ranges, exact ties, values past the largest code, infinities, NaNs,
    /// and a spread of ordinary values.
    fn values(n: usize) -> Vec<f32> {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let special = [
            0.0,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(0x7f_ffff),
            2f32.powi(-9) * 1.5,
            2f32.powi(-17) * 0.5,
            0.5,
            1.5,
            2.5,
            -3.5,
            127.5,
            -128.5,
            1.0625,
            448.0,
            464.0,
            57344.0,
            61440.0,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        (0..n)
            .map(|i| match i % 3 {
                0 => special[(i / 3) % special.len()],
                1 => f32::from_bits(next() as u32),
                _ => ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 600.0,
            })
            .collect()
    }

    fn paths() -> Vec<Isa> {
        let mut v = Vec::new();
        for isa in [Isa::Avx2, Isa::Avx512] {
            match isa.check() {
                Ok(()) => v.push(isa),
                Err(why) => println!("skipping the {} write: {why}", isa.name()),
            }
        }
        v
    }

    fn same_codes<Q: Code + PartialEq + std::fmt::Debug + Default>() {
        let n = 3 * 257 + 5; // every vector width's tail
        let x = values(n);
        let ch: Vec<f32> = (0..n).map(|i| 0.25 + (i % 7) as f32 * 0.375).collect();
        let off: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 3.5 - 7.0).collect();
        for scale in [1.0, 0.0625, 3.0] {
            for (c, o) in [
                (None, None),
                (Some(&ch[..]), None),
                (None, Some(&off[..])),
                (Some(&ch[..]), Some(&off[..])),
            ] {
                let s = Scaling {
                    scale,
                    channel: c,
                    offset: o,
                };
                let mut want = vec![Q::default(); n];
                for (i, w) in want.iter_mut().enumerate() {
                    let y = x[i] / (scale * c.map_or(1.0, |c| c[i])) - o.map_or(0.0, |o| o[i]);
                    *w = Q::code(y);
                }
                let mut plain = vec![Q::default(); n];
                quantize(Isa::Portable, &mut plain, &x, s);
                assert_eq!(plain, want);
                for isa in paths() {
                    for len in [n, 1, 15, 17, 64] {
                        let mut got = vec![Q::default(); len];
                        quantize(isa, &mut got, &x, s);
                        assert_eq!(got, want[..len], "{} len {len}", isa.name());
                    }
                }
            }
        }
    }

    #[test]
    fn every_path_stores_the_same_codes() {
        same_codes::<i8>();
        same_codes::<Fp8E4M3>();
        same_codes::<Fp8E5M2>();
    }

    /// The int8 code is the saturating rounding `round_ties_even(x) as i8` (NaN to 0) on the
    /// test values and on every 4,093rd f32 bit pattern.
    #[test]
    fn int8_codes_round_to_nearest_even_and_saturate() {
        let sweep = (0..=u32::MAX).step_by(4093).map(f32::from_bits);
        for x in values(3000).into_iter().chain(sweep) {
            assert_eq!(
                <i8 as Code>::code(x),
                x.round_ties_even() as i8,
                "{x:e} ({:#010x})",
                x.to_bits()
            );
        }
    }

    /// Every path's largest finite magnitude is the one the definition gives, infinities and
    /// NaNs left out, on rows of every tail length.
    #[test]
    fn finite_amax_leaves_out_infinities_and_nans() {
        let x = values(301);
        for len in [0, 1, 7, 16, 33, 301] {
            let row = &x[..len];
            let want = row
                .iter()
                .filter(|v| v.is_finite())
                .fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(finite_amax(Isa::Portable, row).to_bits(), want.to_bits());
            for isa in paths() {
                assert_eq!(
                    finite_amax(isa, row).to_bits(),
                    want.to_bits(),
                    "{}",
                    isa.name()
                );
            }
        }
    }
}
