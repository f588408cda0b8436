//! The AMX engine of the tiled kernel: both products on Intel AMX tiles, in bf16 pairs
//! (`tdpbf16ps`, AMX-BF16) or, for an f16 cache on a CPU with AMX-FP16, in f16 pairs
//! (`tdpfp16ps`): pairs of 16-bit values multiplied and summed into f32 accumulators.
//!
//! The pair format is [`Pair`]: [`Bf16Pairs`] or [`F16Pairs`]. Inputs are rounded to it
//! (round to nearest even): the query always, the K/V when stored in another type, and the
//! softmax probabilities; accumulation is f32. In bf16 pairs an f32 or f16 cache would be only
//! as exact as a bf16 cache (relative error of order `2^-8`), so the kernel gives this engine
//! a bf16 cache in bf16 pairs, or an f16 cache in f16 pairs, and nothing else (`tiled.rs`:
//! other caches run the vector path). With f16 pairs an f16 cache's K/V enter the products
//! exactly, and the query and probabilities lose at most `2^-11` of themselves (f16's
//! subnormal inputs are kept: `tdpfp16ps` does not flush them, as `tdpbf16ps` does); the
//! kernel picks f16 pairs only for an f16 cache whose scaled queries all lie in f16's range.
//! (The tests also run the engine on other caches through the software tiles.)
//!
//! Layout. Scores: A = the block's queries, `mr` rows of 32 pair elements (one 32-element
//! slice of the head dim); B = the K tile in AMX's VNNI layout, 16 rows (pairs of head-dim
//! elements) of 16 keys x 2 elements; C = 16 f32 scores per row; two C tiles cover the `KT` =
//! 32 keys. Values: A = the probabilities, `mr` rows of 32 elements (the keys); B = the V tile
//! in VNNI layout, 16 rows (key pairs) of 16 head-dim columns x 2 elements; C = 16 output
//! columns, added to the f32 accumulator after each tile (so the online-softmax rescaling
//! stays in f32). The head dim is zero-padded to a multiple of 32 and keys to 32, so tails
//! multiply zeros.
//!
//! The tile instructions sit behind the [`Tiles`] trait: [`AsmTiles`] issues them
//! (`ldtilecfg`, `tilezero`, `tileloadd`, `tdpbf16ps`, `tdpfp16ps`, `tilestored`,
//! `tilerelease`), and [`SoftTiles`] reproduces them in software (configured rows / bytes
//! per row, zeroing, and the pair products' exact rounding: the SDM's order of sums, denormals
//! flushed as the hardware flushes them), so that the whole algorithm is tested on machines
//! without AMX with the results `tdpbf16ps` gives, bit for bit.

#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};

use super::tiled::Engine;

/// Key tokens per tile: two 16-column C tiles of scores.
const KT: usize = 32;
use super::KvElem;

/// The 64-byte operand of `ldtilecfg` (palette 1).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TileConfig {
    pub palette: u8,
    pub start_row: u8,
    pub reserved: [u8; 14],
    /// Bytes per row of tiles 0..16 (8 exist in palette 1).
    pub colsb: [u16; 16],
    pub rows: [u8; 16],
}

impl TileConfig {
    /// Palette 1 with every tile unconfigured (0 rows, 0 bytes per row).
    pub(super) fn palette1() -> Self {
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        }
    }
}

/// Tile registers and the AMX operations the engine needs. Tile numbers are constants
/// (they are encoded in the instructions).
pub(super) trait Tiles {
    /// `ldtilecfg`.
    ///
    /// # Safety
    /// For the hardware: AMX and the process's tile permission; a valid palette-1 config.
    unsafe fn config(&mut self, cfg: &TileConfig);
    /// `tilezero tmmT`.
    ///
    /// # Safety
    /// As [`Tiles::config`], after it.
    unsafe fn zero<const T: u8>(&mut self);
    /// `tileloadd tmmT, [p + stride]`: row `r` from `p + r * stride`.
    ///
    /// # Safety
    /// As [`Tiles::zero`]; `p` valid for the configured rows x bytes at `stride`.
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize);
    /// `tdpbf16ps tmmC, tmmA, tmmB`.
    ///
    /// # Safety
    /// As [`Tiles::zero`]; the three shapes compatible.
    unsafe fn dpbf16<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tdpfp16ps tmmC, tmmA, tmmB` (AMX-FP16).
    ///
    /// # Safety
    /// As [`Tiles::dpbf16`], on a CPU with AMX-FP16.
    unsafe fn dpfp16<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tilestored [p + stride], tmmT`.
    ///
    /// # Safety
    /// As [`Tiles::load`], for writes.
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize);
    /// `tilerelease`.
    ///
    /// # Safety
    /// As [`Tiles::config`].
    unsafe fn release(&mut self);
}

/// The hardware tiles (`core::arch::asm!`). Runs only where `Isa::Amx` checks out (CPUID
/// amx_tile + amx_bf16 and the kernel granted tile data through `amx_permission`);
/// `tdpfp16ps` only where CPUID also reports amx_fp16 (`Isa::amx_fp16`).
#[cfg(target_arch = "x86_64")]
pub(super) struct AsmTiles;

#[cfg(target_arch = "x86_64")]
impl Tiles for AsmTiles {
    #[inline(always)]
    unsafe fn config(&mut self, cfg: &TileConfig) {
        // SAFETY: the caller runs on a CPU with AMX and the tile permission (the `Tiles` contract),
        // and `cfg` is a palette-1 config read from a live reference (64 bytes).
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) cfg as *const TileConfig,
            options(nostack, readonly, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn zero<const T: u8>(&mut self) {
        // SAFETY: the caller runs on a CPU with AMX and the tile permission (the `Tiles` contract),
        // after `config`; `tilezero` touches no memory.
        unsafe {
            std::arch::asm!("tilezero tmm{t}", t = const T, options(nostack, nomem, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize) {
        // SAFETY: the caller runs on a CPU with AMX and the tile permission (the `Tiles` contract),
        // after `config`, and `p` is valid for the configured rows x bytes at `stride`
        // (`Tiles::load`).
        unsafe {
            std::arch::asm!("tileloadd tmm{t}, [{p} + {s} * 1]", t = const T, p = in(reg) p,
            s = in(reg) stride, options(nostack, readonly, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn dpbf16<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: the caller runs on a CPU with AMX and the tile permission (the `Tiles` contract),
        // after `config`, with compatible shapes (`Tiles::dpbf16`); no memory is touched.
        unsafe {
            std::arch::asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A,
            b = const B, options(nostack, nomem, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn dpfp16<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: the caller runs on a CPU with AMX and the tile permission (the `Tiles` contract),
        // and AMX-FP16 (`Tiles::dpfp16`), after `config`, with compatible shapes; no memory is
        // touched.
        unsafe {
            std::arch::asm!("tdpfp16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A,
            b = const B, options(nostack, nomem, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize) {
        // SAFETY: the caller runs on a CPU with AMX and the tile permission (the `Tiles` contract),
        // after `config`, and `p` is valid for the configured rows x bytes of writes at `stride`
        // (`Tiles::store`).
        unsafe {
            std::arch::asm!("tilestored [{p} + {s} * 1], tmm{t}", t = const T, p = in(reg) p,
            s = in(reg) stride, options(nostack, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn release(&mut self) {
        // SAFETY: the caller runs on a CPU with AMX and the tile permission (the `Tiles` contract),
        // after `config`; `tilerelease` touches no memory.
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem, preserves_flags));
        }
    }
}

/// AMX tiles in software, with the hardware's semantics: 8 tiles of up to 16 rows x 64 bytes;
/// loads and stores move the configured rows x bytes and zero the rest of the tile;
/// `tdpbf16ps` and `tdpfp16ps` need `A.rows = C.rows`, `A.colsb / 4 = B.rows`,
/// `B.colsb = C.colsb`.
///
/// The arithmetic is the Intel SDM's Operation section for both instructions (not the
/// intrinsics guide's, which adds each product into `C` in turn): for each `C[m][n]`, two f32
/// sums start from zero, `even` of the products `a[m][2k] b[k][2n]` and `odd` of
/// `a[m][2k + 1] b[k][2n + 1]`, over `k` in order, each step an FMA (the product unrounded)
/// rounded to nearest even; then `C[m][n] += even + odd`, two more roundings. Every f32 result
/// is flushed to zero when denormal, and every f32 input too (`C` included); bf16 denormal
/// inputs are flushed, f16 ones kept. On a Xeon with AMX-BF16 this is `tdpbf16ps` bit for
/// bit: single products of random tiles over every bf16 exponent, denormals included
/// (`soft_tiles_match_the_hardware_instruction`), and the whole engine
/// (`amx_hardware_tiles_match_software_tiles`). The intrinsics guide's order rounds
/// differently in a quarter (inputs near 1) to half (wide exponents) of such outputs.
/// `tdpfp16ps` follows the same SDM text; no CPU with AMX-FP16 has checked it. A shape error
/// or an unconfigured tile panics (the hardware would fault). Test builds only.
#[cfg(test)]
pub(super) struct SoftTiles {
    cfg: Option<TileConfig>,
    data: [[[u8; 64]; 16]; 8],
}

#[cfg(test)]
impl SoftTiles {
    pub(super) fn new() -> Self {
        SoftTiles {
            cfg: None,
            data: [[[0; 64]; 16]; 8],
        }
    }

    fn shape(&self, t: u8) -> (usize, usize) {
        let cfg = self
            .cfg
            .as_ref()
            .expect("tile instruction before ldtilecfg");
        let (rows, colsb) = (
            cfg.rows[t as usize] as usize,
            cfg.colsb[t as usize] as usize,
        );
        assert!(rows > 0 && colsb > 0, "tile {t} is not configured");
        (rows, colsb)
    }

    /// The pair product `tdpbf16ps` / `tdpfp16ps` (`name`), an input element read by `elem`.
    fn dp(&mut self, c: u8, a: u8, b: u8, name: &str, elem: impl Fn(u16) -> f32) {
        let ((cr, cc), (ar, ac), (br, bc)) = (self.shape(c), self.shape(a), self.shape(b));
        assert!(
            ar == cr && ac / 4 == br && bc == cc,
            "{name} shapes C {cr}x{cc} A {ar}x{ac} B {br}x{bc}"
        );
        assert!(
            c != a && c != b && a != b,
            "{name} needs three distinct tiles"
        );
        let word = |t: &[[u8; 64]; 16], r: usize, i: usize| -> f32 {
            elem(u16::from_le_bytes([t[r][2 * i], t[r][2 * i + 1]]))
        };
        let (ta, tb) = (self.data[a as usize], self.data[b as usize]);
        let tc = &mut self.data[c as usize];
        for m in 0..cr {
            for n in 0..cc / 4 {
                // The even and the odd elements of the pairs in two sums from zero (one FMA
                // each per pair: the product enters unrounded), then those two added, then C.
                let (mut even, mut odd) = (0f32, 0f32);
                for k in 0..ac / 4 {
                    even = flush(word(&ta, m, 2 * k).mul_add(word(&tb, k, 2 * n), even));
                    odd = flush(word(&ta, m, 2 * k + 1).mul_add(word(&tb, k, 2 * n + 1), odd));
                }
                let c = f32::from_le_bytes(tc[m][4 * n..4 * n + 4].try_into().unwrap());
                let c = flush(flush(c) + flush(even + odd));
                tc[m][4 * n..4 * n + 4].copy_from_slice(&c.to_le_bytes());
            }
            tc[m][cc..].fill(0);
        }
        for m in cr..16 {
            tc[m] = [0; 64];
        }
    }
}

#[cfg(test)]
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

#[cfg(test)]
impl Tiles for SoftTiles {
    unsafe fn config(&mut self, cfg: &TileConfig) {
        assert_eq!(cfg.palette, 1, "palette 1 only");
        for t in 0..16 {
            let (r, c) = (cfg.rows[t] as usize, cfg.colsb[t] as usize);
            assert!(r <= 16 && c <= 64 && c % 4 == 0, "tile {t}: {r} x {c}");
            assert!(t < 8 || (r == 0 && c == 0), "palette 1 has 8 tiles");
        }
        self.cfg = Some(*cfg);
        self.data = [[[0; 64]; 16]; 8];
    }
    unsafe fn zero<const T: u8>(&mut self) {
        self.shape(T);
        self.data[T as usize] = [[0; 64]; 16];
    }
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize) {
        // SAFETY: `p` is valid for `rows` rows of `colsb` bytes at `stride` (the `Tiles::load`
        // contract), and each row goes into a tile row of 64 bytes, `colsb <= 64` (checked by
        // `config`).
        unsafe {
            let (rows, colsb) = self.shape(T);
            let tile = &mut self.data[T as usize];
            *tile = [[0; 64]; 16];
            for r in 0..rows {
                std::ptr::copy_nonoverlapping(p.add(r * stride), tile[r].as_mut_ptr(), colsb);
            }
        }
    }
    unsafe fn dpbf16<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.dp(C, A, B, "tdpbf16ps", |b| flush(bf16::from_bits(b).to_f32()))
    }
    unsafe fn dpfp16<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.dp(C, A, B, "tdpfp16ps", |b| f16::from_bits(b).to_f32())
    }
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize) {
        // SAFETY: `p` is valid for `rows` rows of `colsb` bytes of writes at `stride` (the
        // `Tiles::store` contract), read from a tile row of 64 bytes, `colsb <= 64`.
        unsafe {
            let (rows, colsb) = self.shape(T);
            for r in 0..rows {
                std::ptr::copy_nonoverlapping(
                    self.data[T as usize][r].as_ptr(),
                    p.add(r * stride),
                    colsb,
                );
            }
        }
    }
    unsafe fn release(&mut self) {
        self.cfg = None;
        self.data = [[[0; 64]; 16]; 8];
    }
}

/// Rows per block: a tile holds 16.
const AMX_MR: usize = 16;
/// Tile numbers: two score accumulators (keys 0..16, 16..32), the query slice, a K slice,
/// the probabilities, a V slice, an output accumulator.
const S0: u8 = 0;
const S1: u8 = 1;
const QA: u8 = 2;
const KB: u8 = 3;
const PA: u8 = 4;
const VB: u8 = 5;
const OC: u8 = 6;

/// The 16-bit element of the tiles' pairs, and its pair product.
pub(super) trait Pair {
    /// The element's bits for `x`, rounded to nearest even.
    fn bits(x: f32) -> u16;
    /// `x` rounded to the element, as an f32.
    fn round(x: f32) -> f32;
    /// `C += A B` by pairs of this element (`tdpbf16ps` / `tdpfp16ps`).
    ///
    /// # Safety
    /// As [`Tiles::dpbf16`] / [`Tiles::dpfp16`].
    unsafe fn dp<X: Tiles, const C: u8, const A: u8, const B: u8>(x: &mut X);
}

/// bf16 pairs (AMX-BF16, `tdpbf16ps`).
pub(super) struct Bf16Pairs;

impl Pair for Bf16Pairs {
    #[inline(always)]
    fn bits(x: f32) -> u16 {
        bf16::from_f32(x).to_bits()
    }
    #[inline(always)]
    fn round(x: f32) -> f32 {
        bf16::from_f32(x).to_f32()
    }
    #[inline(always)]
    unsafe fn dp<X: Tiles, const C: u8, const A: u8, const B: u8>(x: &mut X) {
        // SAFETY: the caller meets `Tiles::dpbf16`'s contract (`Pair::dp`).
        unsafe { x.dpbf16::<C, A, B>() }
    }
}

/// f16 pairs (AMX-FP16, `tdpfp16ps`).
pub(super) struct F16Pairs;

impl Pair for F16Pairs {
    #[inline(always)]
    fn bits(x: f32) -> u16 {
        f16::from_f32(x).to_bits()
    }
    #[inline(always)]
    fn round(x: f32) -> f32 {
        f16::from_f32(x).to_f32()
    }
    #[inline(always)]
    unsafe fn dp<X: Tiles, const C: u8, const A: u8, const B: u8>(x: &mut X) {
        // SAFETY: the caller meets `Tiles::dpfp16`'s contract, AMX-FP16 included (`Pair::dp`).
        unsafe { x.dpfp16::<C, A, B>() }
    }
}

/// The AMX engine over tiles `X`, in pairs of `P`.
pub(super) struct Amx<X: Tiles, P: Pair> {
    pair: std::marker::PhantomData<P>,
    tiles: X,
    /// Rows the current tile configuration is for (0: none loaded).
    configured: usize,
    d: usize,
    /// Head dim padded to a multiple of 32.
    dq: usize,
    /// Queries in `P`: `q[r * dq + c]`.
    q: Vec<u16>,
    /// K tile, VNNI: for key half `h`, head-dim slice `j`, pair `kk`, key `n`, element `i`:
    /// `k[(((h * (dq / 32) + j) * 16 + kk) * 16 + n) * 2 + i] = K[16h + n][32j + 2kk + i]`.
    k: Vec<u16>,
    /// V tile, VNNI: for column block `cb`, key pair `kk`, column `n`, element `i`:
    /// `v[((cb * 16 + kk) * 16 + n) * 2 + i] = V[2kk + i][16cb + n]`.
    v: Vec<u16>,
    /// Probabilities in `P`, `p[r * 32 + t]`.
    p: Vec<u16>,
    /// One output tile, `o[r * 16 + c]`.
    o: Vec<f32>,
    /// One converted row.
    row: Vec<f32>,
}

impl<X: Tiles, P: Pair> Amx<X, P> {
    pub(super) fn new(tiles: X, d: usize) -> Self {
        let dq = d.div_ceil(32) * 32;
        Amx {
            pair: std::marker::PhantomData,
            tiles,
            configured: 0,
            d,
            dq,
            q: Vec::new(),
            k: vec![0; KT * dq],
            v: vec![0; KT * dq],
            p: vec![0; AMX_MR * KT],
            o: vec![0.0; AMX_MR * 16],
            row: vec![0.0; d],
        }
    }

    /// Configures the tiles for blocks of `mr` rows.
    ///
    /// # Safety
    /// The CPU must have the tiles' features (`Tiles::config`).
    unsafe fn configure(&mut self, mr: usize) {
        // SAFETY: the caller gives the tiles' features; the config is palette 1 with every used
        // tile at most 16 rows (`mr <= AMX_MR`) of 64 bytes.
        unsafe {
            if self.configured == mr {
                return;
            }
            let mut cfg = TileConfig::palette1();
            for (t, rows) in [
                (S0, mr),
                (S1, mr),
                (QA, mr),
                (KB, 16),
                (PA, mr),
                (VB, 16),
                (OC, mr),
            ] {
                cfg.rows[t as usize] = rows as u8;
                cfg.colsb[t as usize] = 64;
            }
            self.tiles.config(&cfg);
            self.configured = mr;
        }
    }
}

impl<X: Tiles, P: Pair> Drop for Amx<X, P> {
    fn drop(&mut self) {
        if self.configured > 0 {
            // SAFETY: the tiles were configured by this engine, so the CPU runs AMX.
            unsafe { self.tiles.release() };
        }
    }
}

impl<X: Tiles, P: Pair, T: KvElem> Engine<T> for Amx<X, P> {
    const MR: usize = AMX_MR;
    const KT: usize = KT;

    unsafe fn queries(&mut self, q: &[f32], n: usize, d: usize) {
        assert_eq!(d, self.d);
        let dq = self.dq;
        self.q = vec![0; n * dq];
        for r in 0..n {
            for c in 0..d {
                self.q[r * dq + c] = P::bits(q[r * d + c]);
            }
        }
    }

    unsafe fn kv_tile(&mut self, k: &[&[T]], v: &[&[T]], d: usize) {
        let (dq, nch) = (self.dq, self.dq / 32);
        let nb = k.len();
        // Padding (keys past nb, columns past d) must be zero, not stale.
        self.k.fill(0);
        self.v.fill(0);
        for t in 0..nb {
            for c in 0..d {
                self.row[c] = k[t][c].to_f32();
            }
            let (h, n) = (t / 16, t % 16);
            for c in 0..d {
                let (j, kk, i) = (c / 32, c % 32 / 2, c % 2);
                self.k[(((h * nch + j) * 16 + kk) * 16 + n) * 2 + i] = P::bits(self.row[c]);
            }
            let (kk, i) = (t / 2, t % 2);
            for c in 0..d {
                let (cb, n) = (c / 16, c % 16);
                self.v[((cb * 16 + kk) * 16 + n) * 2 + i] = P::bits(v[t][c].to_f32());
            }
        }
        let _ = dq;
    }

    unsafe fn scores(&mut self, _q: &[f32], r0: usize, mr: usize, nb: usize, s: &mut [f32]) {
        // SAFETY: the caller gives the tiles' features (the `Engine` contract); the tiles are
        // configured for `mr` rows just above, every query load reads `mr` rows of 64 bytes at `(r0
        // + r) * dq + 32 * j` inside `q` (asserted), each K load 16 rows of 64 bytes inside `k`
        // (`KT * dq` values), and the score stores `mr` rows of 64 bytes at a stride of `KT * 4`
        // bytes inside `s` (asserted).
        unsafe {
            assert!(mr <= AMX_MR && s.len() >= mr * KT && (r0 + mr) * self.dq <= self.q.len());
            self.configure(mr);
            let (dq, nch) = (self.dq, self.dq / 32);
            let x = &mut self.tiles;
            x.zero::<S0>();
            x.zero::<S1>();
            for j in 0..nch {
                x.load::<QA>(self.q.as_ptr().add(r0 * dq + 32 * j).cast(), dq * 2);
                x.load::<KB>(self.k.as_ptr().add(j * 512).cast(), 64);
                P::dp::<X, S0, QA, KB>(x);
                if nb > 16 {
                    x.load::<KB>(self.k.as_ptr().add((nch + j) * 512).cast(), 64);
                    P::dp::<X, S1, QA, KB>(x);
                }
            }
            x.store::<S0>(s.as_mut_ptr().cast(), KT * 4);
            if nb > 16 {
                x.store::<S1>(s.as_mut_ptr().add(16).cast(), KT * 4);
            }
        }
    }

    unsafe fn values(&mut self, mr: usize, nb: usize, p: &[f32], acc: &mut [f32]) {
        // SAFETY: the caller gives the tiles' features (the `Engine` contract); the tiles are
        // configured for `mr` rows just above, the probability load reads `mr` rows of 64 bytes of
        // `p` (`AMX_MR * KT` values), each V load 16 rows of 64 bytes inside `v` (`KT * dq`
        // values), and each output store `mr` rows of 64 bytes inside `o` (`AMX_MR * 16` values).
        unsafe {
            let d = self.d;
            assert!(mr <= AMX_MR && p.len() >= mr * KT && acc.len() >= mr * d);
            self.configure(mr);
            for r in 0..mr {
                for t in 0..KT {
                    // Entries past nb are 0 (softmax), already `P` values (round_p).
                    self.p[r * 32 + t] = if t < nb { P::bits(p[r * KT + t]) } else { 0 };
                }
            }
            let x = &mut self.tiles;
            x.load::<PA>(self.p.as_ptr().cast(), 64);
            for cb in 0..d.div_ceil(16) {
                x.zero::<OC>();
                x.load::<VB>(self.v.as_ptr().add(cb * 512).cast(), 64);
                P::dp::<X, OC, PA, VB>(x);
                x.store::<OC>(self.o.as_mut_ptr().cast(), 64);
                let w = 16.min(d - 16 * cb);
                for r in 0..mr {
                    for c in 0..w {
                        acc[r * d + 16 * cb + c] += self.o[r * 16 + c];
                    }
                }
            }
        }
    }

    const ROUNDS_P: bool = true;
    #[inline(always)]
    fn round_p(p: f32) -> f32 {
        P::round(p)
    }
}

#[cfg(test)]
#[path = "amx_tests.rs"]
mod tests;
