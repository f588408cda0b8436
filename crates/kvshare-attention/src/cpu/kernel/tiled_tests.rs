//! The tiled kernel against an f64 reference: the f32 engine on every vector path this machine
//! runs, and the AMX engine's whole algorithm (VNNI packing, tiling, tails, masking, softmax)
//! through [`SoftTiles`], which reproduce the tile instructions' semantics.

use half::{bf16, f16};
use proptest::prelude::*;

use super::super::amx::{Amx, Bf16Pairs, F16Pairs, Pair, SoftTiles};
#[cfg(target_arch = "x86_64")]
use super::super::avx2::Avx2;
#[cfg(target_arch = "x86_64")]
use super::super::avx512::Avx512;
use super::super::{Isa, Portable, Scalar};
use super::*;
use crate::CacheLayout;
use kvshare_core::DType;

/// A prefill case: `kv_heads` x `group` heads, query tokens `q_len` at the end of a sequence
/// of `ctx` tokens (a cached prefix of `ctx - q_len`), causal, optional window and soft cap.
#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    d: usize,
    ps: usize,
    kv_heads: usize,
    group: usize,
    ctx: usize,
    q_len: usize,
    window: usize,
    softcap: f32,
    seed: u32,
}

struct Data<T> {
    k: Vec<T>,
    v: Vec<T>,
    /// The stored values as f64 (what the reference uses).
    k64: Vec<f64>,
    v64: Vec<f64>,
    pages: Vec<i32>,
    layout: CacheLayout,
    q: Vec<f32>,
    /// For bf16 cases, the queries before the scale as bf16 (`q[i] = scale * qb[i]`, as the
    /// backend passes a bf16 query to the pair engine); else empty.
    qb: Vec<bf16>,
    scale: f32,
    lo: Vec<usize>,
    hi: Vec<usize>,
    kv_head: Vec<usize>,
}

impl<T> Data<T> {
    /// The case's K/V.
    fn kv(&self, c: &Case) -> SeqKv<'_, T> {
        SeqKv {
            k: &self.k,
            v: &self.v,
            pages: &self.pages,
            layout: &self.layout,
            softcap: c.softcap,
            row_scales: None,
        }
    }

    /// The case's rows, with `q_bf16` as given.
    fn rows<'a>(&'a self, q_bf16: Option<(&'a [bf16], f32)>) -> Rows<'a> {
        Rows {
            q: &self.q,
            lo: &self.lo,
            hi: &self.hi,
            kv_head: &self.kv_head,
            q_bf16,
        }
    }
}

fn data<T: KvElem>(c: &Case, from: impl Fn(f32) -> T) -> Data<T> {
    let mut seed = c.seed | 1;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
    };
    let npages = c.ctx.div_ceil(c.ps) + 2;
    let layout = CacheLayout::dense(c.dtype, npages, c.ps, c.kv_heads, c.d);
    let n = npages * c.ps * c.kv_heads * c.d;
    let k: Vec<T> = (0..n).map(|_| from(rnd())).collect();
    let v: Vec<T> = (0..n).map(|_| from(rnd())).collect();
    // A shuffled table: page i of the sequence is physical page (i * 7 + 3) % npages.
    let mut pages: Vec<i32> = (0..npages as i32).collect();
    for i in (1..pages.len()).rev() {
        pages.swap(i, (rnd().abs() * 1e6) as usize % (i + 1));
    }
    pages.truncate(c.ctx.div_ceil(c.ps));
    // Kernel row order: kv head, query token, the head's query heads.
    let rows = c.kv_heads * c.q_len * c.group;
    let (mut lo, mut hi, mut kv_head) = (vec![0; rows], vec![0; rows], vec![0; rows]);
    let scale = 1.0 / (c.d as f32).sqrt();
    let mut q: Vec<f32> = (0..rows * c.d).map(|_| rnd() * scale * 2.0).collect();
    let mut qb = Vec::new();
    if c.dtype == DType::BF16 {
        qb = q.iter().map(|x| bf16::from_f32(x / scale)).collect();
        q = qb.iter().map(|x| x.to_f32() * scale).collect();
    }
    for r in 0..rows {
        let (kh, qi) = (r / (c.q_len * c.group), r / c.group % c.q_len);
        let pos = c.ctx - c.q_len + qi;
        kv_head[r] = kh;
        hi[r] = pos + 1;
        lo[r] = if c.window > 0 {
            (pos + 1).saturating_sub(c.window)
        } else {
            0
        };
    }
    Data {
        k64: k.iter().map(|x| x.to_f32() as f64).collect(),
        v64: v.iter().map(|x| x.to_f32() as f64).collect(),
        k,
        v,
        pages,
        layout,
        q,
        qb,
        scale,
        lo,
        hi,
        kv_head,
    }
}

/// The f64 reference of every row (normalised), with each input passed through `round`.
fn reference<T>(c: &Case, x: &Data<T>, round: impl Fn(f64) -> f64) -> Vec<f64> {
    let (d, lay) = (c.d, &x.layout);
    let rows = x.lo.len();
    let mut out = vec![0f64; rows * d];
    for r in 0..rows {
        let at = |t: usize| {
            x.pages[t / c.ps] as usize * lay.page_stride
                + (t % c.ps) * lay.slot_stride
                + x.kv_head[r] * lay.head_stride
        };
        let s: Vec<f64> = (x.lo[r]..x.hi[r])
            .map(|t| {
                let s: f64 = (0..d)
                    .map(|i| round(x.q[r * d + i] as f64) * round(x.k64[at(t) + i]))
                    .sum();
                if c.softcap > 0.0 {
                    let cap = c.softcap as f64;
                    cap * (s / cap).tanh()
                } else {
                    s
                }
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|s| (s - m).exp()).collect();
        let l: f64 = p.iter().sum();
        for i in 0..d {
            let o: f64 = (x.lo[r]..x.hi[r])
                .zip(&p)
                .map(|(t, p)| p * round(x.v64[at(t) + i]))
                .sum();
            out[r * d + i] = o / l;
        }
    }
    out
}

/// Runs engine `e` on lanes `L` and returns the normalised rows.
fn run_engine<L: Lanes, T: KvElem, E: Engine<T>>(e: &mut E, c: &Case, x: &Data<T>) -> Vec<f32> {
    let kv = SeqKv {
        k: &x.k,
        v: &x.v,
        pages: &x.pages,
        layout: &x.layout,
        softcap: c.softcap,
        row_scales: None,
    };
    let rows = x.rows(None);
    let n = x.lo.len();
    let (mut out, mut m, mut l) = (vec![0f32; n * c.d], vec![0f32; n], vec![0f32; n]);
    // SAFETY: L and E are run only where the CPU has their features (the caller checks).
    unsafe { run::<L, T, E>(e, &kv, &rows, &mut out, &mut m, &mut l) };
    super::super::normalize(c.d, &l, &mut out);
    out
}

fn compare(what: &str, c: &Case, got: &[f32], want: &[f64], tol: f64) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what} {c:?} row {} [{}]: {g} vs {w}",
            i / c.d,
            i % c.d
        );
    }
}

fn bf64(x: f64) -> f64 {
    bf16::from_f64(x).to_f64()
}

/// Every engine this machine runs on one case.
fn check_case<T: KvElem>(c: &Case, from: impl Fn(f32) -> T) {
    let x = data(c, from);
    let exact = reference(c, &x, |v| v);
    // The f32 engine: inputs exact, f32 accumulation, polynomial exp.
    let tol = 2e-5;
    compare(
        "fma portable",
        c,
        &run_engine::<Scalar, T, _>(&mut Fma::<Scalar>::new(c.d), c, &x),
        &exact,
        tol,
    );
    // The 16-lane engine (32-key score and 32-column value blocks), as the avx512 path runs it.
    compare(
        "fma portable16",
        c,
        &run_engine::<Portable<16>, T, _>(&mut Fma::<Portable<16>>::new(c.d), c, &x),
        &exact,
        tol,
    );
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.check().is_ok() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        let got = unsafe { avx2_engine(c, &x) };
        compare("fma avx2", c, &got, &exact, tol);
    }
    // On a CPU with AVX-512 (on machines without it the avx512 engine runs under an x86
    // emulator: integration/vllm_ascend/tests/test_ops_emulated.py).
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx512.check().is_ok() {
        // SAFETY: the CPU has AVX-512F/VL, AVX2, FMA and F16C.
        let got = unsafe { avx512_engine(c, &x) };
        compare("fma avx512", c, &got, &exact, tol);
    }
    // The bf16 pair engine (bf16 query and cache, on a CPU with AVX512_BF16): exact products,
    // f32 sums, so the f32 engine's tolerance.
    #[cfg(target_arch = "x86_64")]
    if let Some(kb) = T::as_bf16(&x.k) {
        if Isa::Avx512.bf16_pairs() {
            // SAFETY: the CPU has AVX512_BF16 and the avx512 path's features.
            match unsafe { pair_engine(c, &x, kb, T::as_bf16(&x.v).unwrap()) } {
                Some(got) => compare("bf16 pairs avx512", c, &got, &exact, tol),
                None => assert!(c.d % 2 == 1, "refused d {}", c.d),
            }
        }
    }
    // The AMX algorithm through software tiles: against the reference on bf16-rounded
    // q/k/v, the probabilities rounded to bf16 too (relative 2^-8 per weight, so at most
    // 2^-8 * max |v - out| <= 2^-7 with |v| <= 1), and against the exact reference within bf16
    // accuracy.
    let got = amx_pairs::<Bf16Pairs, T>(c, &x);
    compare(
        "amx (software tiles)",
        c,
        &got,
        &reference(c, &x, bf64),
        8e-3,
    );
    compare("amx vs exact", c, &got, &exact, 3e-2);
    // An f16 cache on AMX-FP16 tiles (software `tdpfp16ps`): the K/V exact, the query and the
    // probabilities rounded to f16 (relative 2^-11 per weight, so at most about 5e-4 of
    // |v| <= 1).
    if T::F16 {
        let got = amx_pairs::<F16Pairs, T>(c, &x);
        compare(
            "amx fp16 (software tiles)",
            c,
            &got,
            &reference(c, &x, h64),
            1e-3,
        );
        compare("amx fp16 vs exact", c, &got, &exact, 4e-3);
    }
}

/// The AMX engine in pairs of `P`, through software tiles.
fn amx_pairs<P: Pair, T: KvElem>(c: &Case, x: &Data<T>) -> Vec<f32> {
    run_engine::<Scalar, T, _>(&mut Amx::<_, P>::new(SoftTiles::new(), c.d), c, x)
}

fn h64(x: f64) -> f64 {
    f16::from_f64(x).to_f64()
}

/// What the f16 tiles are for: on an f16 cache, AMX in f16 pairs is closer to the exact
/// attention than in bf16 pairs (which round the query, K, V and probabilities to 8 bits of
/// mantissa where f16 keeps 11 and the cache's values exact).
#[test]
fn amx_f16_pairs_beat_bf16_pairs_on_an_f16_cache() {
    for (seed, d, ctx, q_len) in [(5, 128, 300, 40), (6, 64, 129, 17), (7, 256, 90, 90)] {
        let c = Case {
            dtype: DType::F16,
            d,
            ps: 16,
            kv_heads: 2,
            group: 4,
            ctx,
            q_len,
            window: 0,
            softcap: 0.0,
            seed,
        };
        let x = data(&c, f16::from_f32);
        let exact = reference(&c, &x, |v| v);
        let err = |got: &[f32]| {
            got.iter()
                .zip(&exact)
                .map(|(&g, &w)| (g as f64 - w).abs())
                .fold(0f64, f64::max)
        };
        let bf = err(&amx_pairs::<Bf16Pairs, f16>(&c, &x));
        let fp = err(&amx_pairs::<F16Pairs, f16>(&c, &x));
        eprintln!("d {d} ctx {ctx}: max error bf16 pairs {bf:.2e}, f16 pairs {fp:.2e}");
        assert!(fp * 4.0 < bf, "f16 pairs {fp:e} against bf16 pairs {bf:e}");
    }
}

/// The f32 engine on the AVX2 lanes, compiled with their features.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_engine<T: KvElem>(c: &Case, x: &Data<T>) -> Vec<f32> {
    run_engine::<Avx2, T, _>(&mut Fma::<Avx2>::new(c.d), c, x)
}

/// The f32 engine on the AVX-512 lanes, compiled with their features.
///
/// # Safety
/// The CPU must have AVX-512F/VL, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn avx512_engine<T: KvElem>(c: &Case, x: &Data<T>) -> Vec<f32> {
    run_engine::<Avx512, T, _>(&mut Fma::<Avx512>::new(c.d), c, x)
}

/// The bf16 pair engine on `x` (bf16 K/V `k`, `v`): the normalised rows, or `None` where it
/// refuses the case (an odd head dim: the path then runs the f32 engine).
///
/// # Safety
/// The CPU must have AVX-512F/VL, AVX512_BF16 and the AVX2 set.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bf16")]
unsafe fn pair_engine<T>(c: &Case, x: &Data<T>, k: &[bf16], v: &[bf16]) -> Option<Vec<f32>> {
    // SAFETY: this function has `run_avx512`'s features; the rows and the outputs are made for
    // `x`'s rows, the lengths `run_avx512` needs.
    unsafe {
        let kv = SeqKv {
            k,
            v,
            pages: &x.pages,
            layout: &x.layout,
            softcap: c.softcap,
            row_scales: None,
        };
        let rows = x.rows(Some((&x.qb, x.scale)));
        let n = x.lo.len();
        let (mut out, mut m, mut l) = (vec![0f32; n * c.d], vec![0f32; n], vec![0f32; n]);
        super::super::bf16dot::run_avx512(true, &kv, &rows, &mut out, &mut m, &mut l)?;
        super::super::normalize(c.d, &l, &mut out);
        Some(out)
    }
}

fn check(c: Case) {
    match c.dtype {
        DType::F32 => check_case(&c, |x| x),
        DType::F16 => check_case(&c, f16::from_f32),
        _ => check_case(&c, bf16::from_f32),
    }
}

#[test]
fn prefill_dims_groups_pages_dtypes() {
    let mut seed = 1;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (d, ps) in [(64, 16), (128, 128), (256, 16)] {
            for group in [1, 4, 8] {
                seed += 1;
                // A cached prefix of 37 tokens and a 23-token chunk: row blocks of 6 and 16
                // both get tails, and tiles cross page boundaries.
                check(Case {
                    dtype,
                    d,
                    ps,
                    kv_heads: 2,
                    group,
                    ctx: 60,
                    q_len: 23,
                    window: 0,
                    softcap: 0.0,
                    seed,
                });
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Random shapes: head dims with tails (not multiples of 8, 16 or 32), any page size, full
    /// prefill or a chunk after a cached prefix, windows and soft caps.
    #[test]
    fn prefill_random_shapes(
        dtype in prop::sample::select(vec![DType::F32, DType::F16, DType::BF16]),
        d in prop::sample::select(vec![8usize, 15, 40, 64, 72, 100, 128]),
        ps in prop::sample::select(vec![1usize, 5, 16, 33, 128]),
        kv_heads in 1usize..3,
        group in prop::sample::select(vec![1usize, 2, 4, 8]),
        prefix in 0usize..70,
        q_len in 1usize..40,
        window in prop::sample::select(vec![0usize, 1, 17, 50]),
        softcap in prop::sample::select(vec![0.0f32, 2.0]),
        seed in any::<u32>(),
    ) {
        check(Case { dtype, d, ps, kv_heads, group, ctx: prefix + q_len, q_len, window, softcap, seed });
    }
}

/// The f16 pairs take the scaled queries only when each rounds to a finite f16.
#[test]
fn f16_pairs_need_queries_in_f16_range() {
    let max = f16::MAX.to_f32();
    assert!(super::super::fits_f16(&[0.0, -max, max, 1e-9, -3.5]));
    assert!(super::super::fits_f16(&[]));
    for bad in [max * 1.001, -70000.0, f32::INFINITY, f32::NAN] {
        assert!(!super::super::fits_f16(&[1.0, bad]), "{bad}");
    }
}

/// On a CPU whose kernel grants AMX tiles: the `amx` path's prefill puts a bf16 cache on the
/// tiles (its results are the AMX engine's, bit for bit) and an f32 cache, or an f16 one
/// without AMX-FP16, on its vector path (that path's results, bit for bit): bf16 pairs would
/// compute those below their precision. In a full prefill the first token's rows see one key,
/// so their output is that key's V exactly, which bf16 pairs would round.
#[test]
fn amx_path_tiles_only_what_its_pairs_hold_exactly() {
    if let Err(why) = Isa::Amx.check() {
        println!("amx prefill dispatch: skipped: {why}");
        return;
    }
    let case = |dtype| Case {
        dtype,
        d: 64,
        ps: 16,
        kv_heads: 2,
        group: 4,
        ctx: 40,
        q_len: 40,
        window: 0,
        softcap: 0.0,
        seed: 91,
    };
    let c = case(DType::F32);
    let x = data(&c, |v| v);
    let amx = path_rows(Isa::Amx, &c, &x, false);
    same_bits(
        "f32 cache",
        &amx,
        &path_rows(Isa::Amx.vector(), &c, &x, false),
    );
    first_rows_are_v(&c, &x, &amx);
    let c = case(DType::F16);
    let x = data(&c, f16::from_f32);
    let amx = path_rows(Isa::Amx, &c, &x, false);
    if !Isa::Amx.amx_fp16() {
        same_bits(
            "f16 cache",
            &amx,
            &path_rows(Isa::Amx.vector(), &c, &x, false),
        );
    }
    first_rows_are_v(&c, &x, &amx);
    let c = case(DType::BF16);
    let x = data(&c, bf16::from_f32);
    #[cfg(target_arch = "x86_64")]
    {
        let kv = x.kv(&c);
        let rows = x.rows(None);
        let n = x.lo.len();
        let (mut out, mut m, mut l) = (vec![0f32; n * c.d], vec![0f32; n], vec![0f32; n]);
        // SAFETY: Isa::Amx checked out (AMX, the tile permission, AVX2/FMA/F16C); the
        // lengths are the rows'.
        unsafe {
            super::super::amx_avx2::<bf16, super::super::amx::Bf16Pairs>(
                &kv, &rows, &mut out, &mut m, &mut l,
            )
        };
        super::super::normalize(c.d, &l, &mut out);
        same_bits("bf16 cache", &path_rows(Isa::Amx, &c, &x, false), &out);
    }
}

/// The tiled kernel's entry on path `isa` (with the bf16 query where `q_bf16` and there is
/// one): the normalised rows.
fn path_rows<T: KvElem>(isa: Isa, c: &Case, x: &Data<T>, q_bf16: bool) -> Vec<f32> {
    let kv = x.kv(c);
    let rows = x.rows((q_bf16 && !x.qb.is_empty()).then_some((&x.qb[..], x.scale)));
    let n = x.lo.len();
    let (mut out, mut m, mut l) = (vec![0f32; n * c.d], vec![0f32; n], vec![0f32; n]);
    super::super::attend_partial_tiled(isa, &kv, &rows, &mut out, &mut m, &mut l);
    super::super::normalize(c.d, &l, &mut out);
    out
}

/// Asserts `got` and `want` hold the same bits.
fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let differ = got
        .iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "{what}: {differ} of {} values differ", got.len());
}

/// The rows that see only key 0 (the first query token of a full prefill) hold its V exactly.
fn first_rows_are_v<T: KvElem>(c: &Case, x: &Data<T>, got: &[f32]) {
    for r in 0..x.lo.len() {
        if x.hi[r] - x.lo[r] != 1 {
            continue;
        }
        let lay = &x.layout;
        let off = x.pages[0] as usize * lay.page_stride + x.kv_head[r] * lay.head_stride;
        for i in 0..c.d {
            assert_eq!(
                got[r * c.d + i],
                x.v[off + i].to_f32(),
                "{c:?} row {r} [{i}]"
            );
        }
    }
}

/// On a CPU whose kernel grants AMX tiles: the whole AMX engine on the hardware tiles
/// ([`AsmTiles`](super::super::amx::AsmTiles)) against the same engine on [`SoftTiles`], over
/// bf16 and f16 caches (and an f32 one, rounded to bf16 pairs), the f16 pairs where CPUID has
/// AMX-FP16, head dims 64/128/256, pages 16/128, tails, windows and soft caps. Everything
/// but the tile instructions is the same code on both, and the software tiles round as the
/// instructions do, so the rows agree bit for bit; each case's largest error against the
/// f64 reference is printed.
#[test]
fn amx_hardware_tiles_match_software_tiles() {
    use crate::cpu::isa::Isa;
    if let Err(why) = Isa::Amx.check() {
        println!("amx hardware tiles: skipped: {why}");
        return;
    }
    let mut seed = 40;
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for (d, ps, ctx, q_len, window, softcap) in [
            (64, 16, 60, 23, 0, 0.0),
            (128, 128, 300, 129, 0, 0.0),
            (256, 16, 90, 90, 17, 2.0),
            (72, 33, 41, 17, 0, 0.0),
        ] {
            seed += 1;
            let c = Case {
                dtype,
                d,
                ps,
                kv_heads: 2,
                group: 4,
                ctx,
                q_len,
                window,
                softcap,
                seed,
            };
            match dtype {
                DType::F32 => hardware_vs_soft(&c, &data(&c, |x| x)),
                DType::F16 => hardware_vs_soft(&c, &data(&c, f16::from_f32)),
                _ => hardware_vs_soft(&c, &data(&c, bf16::from_f32)),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn hardware_vs_soft<T: KvElem>(c: &Case, x: &Data<T>) {
    use super::super::amx::AsmTiles;
    let mut pairs: Vec<(&str, Vec<f32>, Vec<f32>)> = vec![(
        "bf16 pairs",
        run_engine::<Scalar, T, _>(&mut Amx::<_, Bf16Pairs>::new(AsmTiles, c.d), c, x),
        amx_pairs::<Bf16Pairs, T>(c, x),
    )];
    if T::F16 && crate::cpu::isa::Isa::Amx.amx_fp16() {
        pairs.push((
            "f16 pairs",
            run_engine::<Scalar, T, _>(&mut Amx::<_, F16Pairs>::new(AsmTiles, c.d), c, x),
            amx_pairs::<F16Pairs, T>(c, x),
        ));
    }
    let exact = reference(c, x, |v| v);
    for (name, hw, soft) in pairs {
        let differ = hw
            .iter()
            .zip(&soft)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let err = hw
            .iter()
            .zip(&exact)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .fold(0f64, f64::max);
        println!(
            "amx hardware tiles, {name}, {:?} d {} ctx {} q {}: {differ} of {} values differ \
             from the software tiles; max |error| against f64 {err:.2e}",
            c.dtype,
            c.d,
            c.ctx,
            c.q_len,
            hw.len()
        );
        assert!(hw.iter().all(|v| v.is_finite()), "{name} {c:?}: not finite");
        assert_eq!(
            differ, 0,
            "{name} {c:?}: hardware and software tiles differ"
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn hardware_vs_soft<T: KvElem>(_: &Case, _: &Data<T>) {
    unreachable!("Isa::Amx checks out only on x86-64")
}
