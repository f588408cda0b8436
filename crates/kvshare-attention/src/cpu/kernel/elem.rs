//! The KV element types (f32, f16, bf16, fp8 E4M3 and E5M2, int8): their conversion to f32,
//! one element at a time and as AVX2 / AVX-512 vectors. An fp8 element converts through its f16
//! image (`crate::fp8`): a few integer shifts, then the CPU's f16 conversion; its scale is
//! never applied here (see [`KvElem::UNIT`]).

use half::{bf16, f16};

use crate::fp8::{Fp8, Fp8E4M3, Fp8E5M2};

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
    /// Whether every element, as [`Self::to_f32`] reads it, is a bf16 value, so that the AMX
    /// engine's bf16 pairs take this cache's K/V exactly (bf16, and fp8, whose values have at
    /// most 3 mantissa bits and lie far inside bf16's normal range).
    const BF16_EXACT: bool = false;
    /// The value of 1 as the conversions read it: an element stands for `UNIT` times what
    /// [`Self::to_f32`] and the loads return. 1 except for E4M3, which reads as its f16 image,
    /// `2^-8` of its value. The kernel's callers fold `UNIT` and the cache's scales into the
    /// query (K) and the output (V), so no element is ever multiplied by it.
    const UNIT: f32 = 1.0;
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
    const BF16_EXACT: bool = true;
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

impl KvElem for Fp8E5M2 {
    const BF16_EXACT: bool = true;
    const UNIT: f32 = <Self as Fp8>::UNIT;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::from_bits(<Self as Fp8>::f16_bits(self.0)).to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: `p` is valid for 8 one-byte reads, the 8 bytes loaded (unaligned), and the CPU
        // has AVX2 and F16C (the `load8_avx2` contract).
        unsafe {
            use std::arch::x86_64::*;
            // Byte i becomes the upper byte of 16-bit lane i: its f16 image.
            let x = _mm_loadl_epi64(p.cast::<__m128i>());
            _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), x))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_avx512(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: `p` is valid for 16 one-byte reads, the 16 bytes loaded (unaligned); the CPU has
        // AVX-512F and, on the path that calls this (`avx512`, whose check requires them), AVX2.
        unsafe {
            use std::arch::x86_64::*;
            let x = _mm_loadu_si128(p.cast::<__m128i>());
            _mm512_cvtph_ps(_mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(x)))
        }
    }
}

impl KvElem for Fp8E4M3 {
    const BF16_EXACT: bool = true;
    const UNIT: f32 = <Self as Fp8>::UNIT;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::from_bits(<Self as Fp8>::f16_bits(self.0)).to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: `p` is valid for 8 one-byte reads, the 8 bytes loaded (unaligned), and the CPU
        // has AVX2 and F16C (the `load8_avx2` contract).
        unsafe {
            use std::arch::x86_64::*;
            // Sign-extended and shifted by 7: `s s m6..m0 0000000`, the image with bit 14 set to
            // the sign; clearing it gives `sign << 15 | magnitude << 7`. A NaN code (magnitude
            // 0x7f) sets it instead (an all-ones exponent, a NaN): adding 1 to the magnitude
            // field carries into bit 14 exactly then.
            let t = _mm_slli_epi16::<7>(_mm_cvtepi8_epi16(_mm_loadl_epi64(p.cast::<__m128i>())));
            let h = _mm_and_si128(t, _mm_set1_epi16(0xbfff_u16 as i16));
            let nan = _mm_and_si128(
                _mm_add_epi16(h, _mm_set1_epi16(0x0080)),
                _mm_set1_epi16(0x4000),
            );
            _mm256_cvtph_ps(_mm_or_si128(h, nan))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_avx512(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: `p` is valid for 16 one-byte reads, the 16 bytes loaded (unaligned); the CPU has
        // AVX-512F and, on the path that calls this (`avx512`, whose check requires them),
        // AVX-512VL and AVX2.
        unsafe {
            use std::arch::x86_64::*;
            // As `load8_avx2`; one `vpternlogd` ORs in bit 14 of the carry.
            let t =
                _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast::<__m128i>())));
            let h = _mm256_and_si256(t, _mm256_set1_epi16(0xbfff_u16 as i16));
            let carry = _mm256_add_epi16(h, _mm256_set1_epi16(0x0080));
            // A | (B & C), with A = h, B = carry, C = the bit-14 mask.
            let h = _mm256_ternarylogic_epi32::<0xf8>(h, carry, _mm256_set1_epi16(0x4000));
            _mm512_cvtph_ps(h)
        }
    }
}

impl KvElem for i8 {
    /// Every int8 is an integer of at most 8 significant bits: a bf16 value.
    const BF16_EXACT: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: `p` is valid for 8 one-byte reads, the 8 bytes loaded (unaligned), and the CPU
        // has AVX2 (the `load8_avx2` contract).
        unsafe {
            use std::arch::x86_64::*;
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast::<__m128i>())))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_avx512(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: `p` is valid for 16 one-byte reads, the 16 bytes loaded (unaligned), and the
        // CPU has AVX-512F (the `load16_avx512` contract).
        unsafe {
            use std::arch::x86_64::*;
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast::<__m128i>())))
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Every code, 16 at a time, through each vector load the CPU has: the same f32 as the
    /// scalar conversion, bit for bit (NaNs as NaNs).
    fn every_code<T: KvElem + Fp8>() {
        let codes: Vec<T> = (0..=255u8).map(T::from_bits).collect();
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
            for c in (0..256).step_by(8) {
                let mut out = [0f32; 8];
                // SAFETY: features detected above; `c + 8 <= 256` codes.
                unsafe {
                    use std::arch::x86_64::*;
                    _mm256_storeu_ps(out.as_mut_ptr(), T::load8_avx2(codes.as_ptr().add(c)));
                }
                for i in 0..8 {
                    check::<T>(out[i], (c + i) as u8);
                }
            }
        }
        if crate::cpu::Isa::Avx512.check().is_ok() {
            for c in (0..256).step_by(16) {
                let mut out = [0f32; 16];
                // SAFETY: the `avx512` path's features are present; `c + 16 <= 256` codes.
                unsafe { store16(&mut out, codes.as_ptr().add(c)) };
                for i in 0..16 {
                    check::<T>(out[i], (c + i) as u8);
                }
            }
        }
    }

    /// # Safety
    /// The CPU has the `avx512` path's features; `p` valid for 16 reads.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    unsafe fn store16<T: KvElem>(out: &mut [f32; 16], p: *const T) {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm512_storeu_ps(out.as_mut_ptr(), T::load16_avx512(p)) }
    }

    fn check<T: KvElem + Fp8>(got: f32, b: u8) {
        let want = KvElem::to_f32(T::from_bits(b));
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "code {b:#04x}: {got} != {want}"
        );
        // The scalar read times UNIT is the code's value.
        let value = Fp8::to_f32(T::from_bits(b));
        assert!(
            (want * <T as KvElem>::UNIT).to_bits() == value.to_bits() || value.is_nan(),
            "code {b:#04x}"
        );
    }

    #[test]
    fn fp8_vector_loads_match_the_scalar_read() {
        every_code::<Fp8E4M3>();
        every_code::<Fp8E5M2>();
    }

    /// Every int8 through each vector load the CPU has: its value.
    #[test]
    fn int8_vector_loads_read_every_value() {
        let all: Vec<i8> = (i8::MIN..=i8::MAX).collect();
        if std::is_x86_feature_detected!("avx2") {
            for c in (0..256).step_by(8) {
                let mut out = [0f32; 8];
                // SAFETY: AVX2 detected above; `c + 8 <= 256` values.
                unsafe {
                    use std::arch::x86_64::*;
                    _mm256_storeu_ps(out.as_mut_ptr(), i8::load8_avx2(all.as_ptr().add(c)));
                }
                for i in 0..8 {
                    assert_eq!(out[i], all[c + i] as f32);
                }
            }
        }
        if crate::cpu::Isa::Avx512.check().is_ok() {
            for c in (0..256).step_by(16) {
                let mut out = [0f32; 16];
                // SAFETY: the `avx512` path's features are present; `c + 16 <= 256` values.
                unsafe { store16(&mut out, all.as_ptr().add(c)) };
                for i in 0..16 {
                    assert_eq!(out[i], all[c + i] as f32);
                }
            }
        }
    }
}
