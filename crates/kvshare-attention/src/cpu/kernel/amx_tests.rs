//! The software tiles ([`SoftTiles`]) against the instructions: the SDM's definition written
//! out, and the hardware where the CPU has AMX.

use super::*;

/// The software `tdpbf16ps` and `tdpfp16ps` against the SDM's definition written out
/// directly, with configured shapes smaller than the maximum, and their shape checks.
#[test]
fn soft_tiles_follow_the_instruction() {
    // The smallest positive subnormal times 1.0: `tdpbf16ps` reads the bf16 one as zero,
    // `tdpfp16ps` keeps the f16 one (2^-24, a normal f32).
    soft_dp_follows_the_instruction::<Bf16Pairs>(0.0);
    soft_dp_follows_the_instruction::<F16Pairs>(2f32.powi(-24));
}

/// One of [`soft_tiles_follow_the_instruction`]'s instructions: `P`'s pair product, whose
/// smallest positive subnormal input times 1.0 gives `smallest_times_one`.
fn soft_dp_follows_the_instruction<P: Pair>(smallest_times_one: f32) {
    // SAFETY: software tiles: a shape or configuration error panics, nothing else.
    let dp = |x: &mut SoftTiles| unsafe { P::dp::<SoftTiles, 0, 1, 2>(x) };
    let mut cfg = TileConfig::palette1();
    // C: 5 rows x 12 f32; A: 5 rows x 7 pairs; B: 7 rows x 12 pairs.
    for (t, r, cb) in [(0, 5, 48), (1, 5, 28), (2, 7, 48)] {
        cfg.rows[t] = r;
        cfg.colsb[t] = cb;
    }
    let mut unit = super::super::tests::uniform(77);
    let mut rnd = move || 2.0 * unit();
    // Every 5th input element is below 1.2e-4, about half of them f16 subnormals (which
    // `tdpfp16ps` keeps; as bf16 they are normal numbers). Each as its bits and its value.
    let mut i = 0;
    let mut elem = || {
        i += 1;
        let x = if i % 5 == 0 { rnd() * 6e-5 } else { rnd() };
        (P::bits(x), P::round(x))
    };
    let (a, av): (Vec<u16>, Vec<f32>) = (0..16 * 32).map(|_| elem()).unzip();
    let (b, bv): (Vec<u16>, Vec<f32>) = (0..16 * 32).map(|_| elem()).unzip();
    let c0: Vec<f32> = (0..16 * 16).map(|_| rnd()).collect();
    let mut x = SoftTiles::new();
    let mut got = vec![f32::NAN; 16 * 16];
    // SAFETY: software tiles; every buffer holds 16 rows of 64 bytes, the most a tile moves.
    unsafe {
        x.config(&cfg);
        x.load::<0>(c0.as_ptr().cast(), 64);
        x.load::<1>(a.as_ptr().cast(), 64);
        x.load::<2>(b.as_ptr().cast(), 64);
        dp(&mut x);
        x.store::<0>(got.as_mut_ptr().cast(), 64);
    }
    for m in 0..16 {
        for n in 0..16 {
            if m >= 5 || n >= 12 {
                assert!(
                    got[m * 16 + n].is_nan(),
                    "store wrote outside the tile shape"
                );
                continue;
            }
            // The even and the odd products summed apart by FMAs from zero, then added, then
            // added to C.
            let (mut even, mut odd) = (0f32, 0f32);
            for k in 0..7 {
                even = av[m * 32 + 2 * k].mul_add(bv[k * 32 + 2 * n], even);
                odd = av[m * 32 + 2 * k + 1].mul_add(bv[k * 32 + 2 * n + 1], odd);
            }
            let want = c0[m * 16 + n] + (even + odd);
            assert_eq!(got[m * 16 + n], want, "[{m}][{n}]");
        }
    }
    // Subnormal inputs: the smallest positive subnormal (bits 1) times 1.0.
    let mut small = vec![0u16; 16 * 32];
    let mut one = vec![0u16; 16 * 32];
    small[0] = 1;
    one[0] = P::bits(1.0);
    let mut got = vec![f32::NAN; 16 * 16];
    // SAFETY: as above.
    unsafe {
        x.zero::<0>();
        x.load::<1>(small.as_ptr().cast(), 64);
        x.load::<2>(one.as_ptr().cast(), 64);
        dp(&mut x);
        x.store::<0>(got.as_mut_ptr().cast(), 64);
    }
    assert_eq!(got[0], smallest_times_one);
    // A denormal f32 in C is read as zero: 2^-128 plus the product 2^-7 * 2^-118 = 2^-125 is
    // 2^-125, not 1.125 * 2^-125 (as on the hardware). Pairs of bf16 only: a product of two
    // f16 is 0 or at least 2^-48, beside which 2^-128 is lost in rounding either way.
    if P::round(2f32.powi(-118)) != 0.0 {
        let mut c = vec![0f32; 16 * 16];
        c[0] = 2f32.powi(-128);
        let (mut a, mut b) = (vec![0u16; 16 * 32], vec![0u16; 16 * 32]);
        a[0] = P::bits(2f32.powi(-7));
        b[0] = P::bits(2f32.powi(-118));
        // SAFETY: as above.
        unsafe {
            x.load::<0>(c.as_ptr().cast(), 64);
            x.load::<1>(a.as_ptr().cast(), 64);
            x.load::<2>(b.as_ptr().cast(), 64);
            dp(&mut x);
            x.store::<0>(c.as_mut_ptr().cast(), 64);
        }
        assert_eq!(c[0], 2f32.powi(-125));
    }
    // A and B not matching (A has 7 pairs, B 5 rows) is a fault, like the hardware's #UD.
    cfg.rows[2] = 5;
    // SAFETY: software tiles, which panic on the mismatch and touch no memory here.
    let bad = std::panic::catch_unwind(move || unsafe {
        let mut x = SoftTiles::new();
        x.config(&cfg);
        dp(&mut x);
    });
    assert!(bad.is_err());
}

/// On a CPU whose kernel grants AMX tiles: single `tdpbf16ps` (and `tdpfp16ps` where CPUID
/// has AMX-FP16) on the hardware against [`SoftTiles`], bit for bit, on random tiles of the
/// largest shape and of a smaller one: inputs near 1 (as the kernel's), over a wide range,
/// and over every exponent of the pair type (denormal inputs, products that underflow), C
/// random with denormals among it.
#[test]
fn soft_tiles_match_the_hardware_instruction() {
    use crate::cpu::Isa;
    if let Err(why) = Isa::Amx.check() {
        println!("amx hardware tiles: skipped: {why}");
        return;
    }
    // bf16 has f32's exponents (denormal below 2^-126); f16 is denormal below 2^-14.
    soft_matches_hardware::<Bf16Pairs>("tdpbf16ps", -134, 40);
    if Isa::Amx.amx_fp16() {
        soft_matches_hardware::<F16Pairs>("tdpfp16ps", -25, 15);
    } else {
        println!("amx hardware tiles, tdpfp16ps: skipped: the CPU lacks amx_fp16");
    }
}

/// [`soft_tiles_match_the_hardware_instruction`] for `P`, whose inputs go down to `2^emin`
/// and up to `2^(emax + 1)`.
#[cfg(target_arch = "x86_64")]
fn soft_matches_hardware<P: Pair>(name: &str, emin: i32, emax: i32) {
    use super::super::amx::AsmTiles;
    let mut unit = super::super::tests::uniform(4321);
    // +-(1 + u) 2^e, e uniform in lo..=hi.
    let mut value = move |lo: i32, hi: i32| {
        let e = lo + (((unit() + 1.0) / 2.0 * (hi - lo + 1) as f32) as i32).min(hi - lo);
        let x = (1.0 + (unit() as f64 + 1.0) / 2.0) * 2f64.powi(e);
        (if unit() < 0.0 { -x } else { x }) as f32
    };
    // C: 16 x 16 f32; A: 16 rows x 16 pairs; B: 16 rows x 16 pairs; or C 5 x 12, A 5 x 7,
    // B 7 x 12.
    let full = [(0, 16, 64), (1, 16, 64), (2, 16, 64)];
    let part = [(0, 5, 48), (1, 5, 28), (2, 7, 48)];
    let (mut outputs, mut tiles) = (0, 0);
    for shape in [full, part] {
        let mut cfg = TileConfig::palette1();
        for (t, r, cb) in shape {
            cfg.rows[t] = r;
            cfg.colsb[t] = cb;
        }
        // Exponents of A and B, and of C (denormal f32 below 2^-126).
        for (lo, hi, clo, chi) in [
            (-2, 1, -3, 3),
            (-20, 20, -40, 40),
            (emin, emax, -135, 2 * emax),
        ] {
            for i in 0..100 {
                let a: Vec<u16> = (0..16 * 32).map(|_| P::bits(value(lo, hi))).collect();
                let b: Vec<u16> = (0..16 * 32).map(|_| P::bits(value(lo, hi))).collect();
                let c: Vec<f32> = (0..16 * 16)
                    .map(|j| {
                        if (i + j) % 4 == 0 {
                            0.0
                        } else {
                            value(clo, chi)
                        }
                    })
                    .collect();
                // SAFETY: Isa::Amx checked out (AMX and the tile permission; AMX-FP16 for
                // `tdpfp16ps`); the configuration is palette 1 with three compatible tiles;
                // every load and store stays inside 16 rows of 64 bytes at stride 64 of `a`,
                // `b`, `c` and the result (1024 bytes each). The software tiles panic on error.
                let (hw, soft) = unsafe {
                    (
                        dp_on::<_, P>(&mut AsmTiles, &cfg, &c, &a, &b),
                        dp_on::<_, P>(&mut SoftTiles::new(), &cfg, &c, &a, &b),
                    )
                };
                for k in 0..16 * 16 {
                    assert_eq!(
                        hw[k].to_bits(),
                        soft[k].to_bits(),
                        "{name} C {}x{} 2^{lo}..2^{hi} tile {i} [{}][{}]: hardware {:e}, \
                         software {:e}",
                        shape[0].1,
                        shape[0].2 / 4,
                        k / 16,
                        k % 16,
                        hw[k],
                        soft[k]
                    );
                }
                outputs += shape[0].1 as usize * shape[0].2 as usize / 4;
                tiles += 1;
            }
        }
    }
    println!("amx hardware tiles, {name}: {tiles} products, {outputs} outputs bit for bit");
}

#[cfg(not(target_arch = "x86_64"))]
fn soft_matches_hardware<P: Pair>(_: &str, _: i32, _: i32) {
    unreachable!("Isa::Amx checks out only on x86-64")
}

/// C (16 x 16 f32, `c` as loaded) after `P`'s product of A and B (16 x 32 elements each) on
/// tiles `x`, configured by `cfg` for tiles 0 (C), 1 (A) and 2 (B).
///
/// # Safety
/// As [`Tiles::config`] and [`Pair::dp`] for `x`; `cfg` valid for that product.
unsafe fn dp_on<X: Tiles, P: Pair>(
    x: &mut X,
    cfg: &TileConfig,
    c: &[f32],
    a: &[u16],
    b: &[u16],
) -> Vec<f32> {
    // SAFETY: the caller meets `Tiles::config` and `Pair::dp` for `x` with `cfg`, which shapes
    // tiles 0 to 2 at most 16 rows of 64 bytes; the asserts and `out` give `c`, `a`, `b` and
    // `out` 16 rows of 64 bytes each, so every load and the store at a stride of 64 stay inside.
    unsafe {
        assert!(c.len() >= 16 * 16 && a.len() >= 16 * 32 && b.len() >= 16 * 32);
        let mut out = c[..16 * 16].to_vec();
        x.config(cfg);
        x.load::<0>(c.as_ptr().cast(), 64);
        x.load::<1>(a.as_ptr().cast(), 64);
        x.load::<2>(b.as_ptr().cast(), 64);
        P::dp::<X, 0, 1, 2>(x);
        x.store::<0>(out.as_mut_ptr().cast(), 64);
        x.release();
        out
    }
}
