//! The KV element types (f32, f16, bf16): their conversion to f32, one element at a time and
//! as AVX2 / AVX-512 vectors.

use half::{bf16, f16};

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
