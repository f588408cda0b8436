//! The kernel paths against a naive computation, and the split-K merge.

use super::*;
use half::f16;
use kvshare_core::DType;

/// A seeded stream of f32 in [-1, 1) (a 32-bit LCG's top 24 bits), for test data.
pub(super) fn uniform(mut seed: u32) -> impl FnMut() -> f32 {
    move || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
    }
}

/// Every path this machine runs (8 and 16 lanes) against a naive computation, with a head_dim that is not
/// a multiple of 8 (tail loops), masking, a window and a soft cap; with the query as f32 and
/// as bf16 (which `avx512` scores by bf16 pairs where the CPU has AVX512_BF16).
#[test]
fn scalar_and_simd_paths_match_naive() {
    // 70: scalar tails; 64: the vector horizontal sums; 88: an odd number of vector chunks
    // (11 of 8 lanes, 5 of 16 and a tail), the score loop's single-chunk turn; 80: 5 chunks of
    // 16 and no tail (the single-chunk turn, then the transposed sum). The bf16 pairs take
    // 32 and the multiples of 32 (one, two, three and four chunks) and refuse the rest.
    if !Isa::Avx512.bf16_pairs() {
        println!("bf16 pair scores: skipped (this CPU lacks AVX-512 with AVX512_BF16)");
    }
    for (d, bf16_query) in [70usize, 64, 88, 80, 96, 32, 128]
        .into_iter()
        .flat_map(|d| [(d, false), (d, true)])
    {
        let (ps, hk) = (16usize, 2usize);
        let layout = CacheLayout::dense(DType::BF16, 4, ps, hk, d);
        let mut rnd = uniform(5);
        let n = 4 * ps * hk * d;
        let k: Vec<bf16> = (0..n).map(|_| bf16::from_f32(rnd())).collect();
        let v: Vec<bf16> = (0..n).map(|_| bf16::from_f32(rnd())).collect();
        let pages = [2, 0, 3];
        // A bf16 query is read as f32 and scaled (`cpu.rs` `item_rows`); the pairs take it
        // unscaled, with the scale.
        let scale = 0.3f32;
        let qb: Vec<bf16> = (0..8 * d).map(|_| bf16::from_f32(rnd())).collect();
        let q: Vec<f32> = if bf16_query {
            qb.iter().map(|x| x.to_f32() * scale).collect()
        } else {
            (0..8 * d).map(|_| rnd() * scale).collect()
        };
        let lo = [0, 0, 5, 5, 0, 0, 30, 30];
        let hi = [40, 40, 41, 41, 42, 42, 43, 43];
        let kv = SeqKv {
            k: &k,
            v: &v,
            pages: &pages,
            layout: &layout,
            softcap: 1.5,
            row_scales: None,
        };
        // Runs of 8 (one group), and 4, 2, 1, 1 (every group size) over two kv heads.
        for heads in [[1usize; 8], [1, 1, 1, 1, 0, 0, 1, 0]] {
            let mut want = vec![0f32; 8 * d];
            for r in 0..8 {
                let at = |t: usize| {
                    pages[t / ps] as usize * layout.page_stride
                        + (t % ps) * layout.slot_stride
                        + heads[r] * layout.head_stride
                };
                let s: Vec<f64> = (lo[r]..hi[r])
                    .map(|t| {
                        let x: f64 = (0..d)
                            .map(|i| q[r * d + i] as f64 * k[at(t) + i].to_f64())
                            .sum();
                        1.5 * (x / 1.5).tanh()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = p.iter().sum();
                for i in 0..d {
                    let o: f64 = (lo[r]..hi[r])
                        .zip(&p)
                        .map(|(t, p)| p * v[at(t) + i].to_f64())
                        .sum();
                    want[r * d + i] = (o / l) as f32;
                }
            }
            let rows = |r: std::ops::Range<usize>| Rows {
                q: &q[r.start * d..r.end * d],
                lo: &lo[r.clone()],
                hi: &hi[r.clone()],
                kv_head: &heads[r.clone()],
                q_bf16: bf16_query.then(|| (&qb[r.start * d..r.end * d], scale)),
            };
            let mut results = Vec::new();
            for isa in Isa::all() {
                if let Err(why) = isa.check() {
                    println!("kernel path {}: skipped: {why}", isa.name());
                    continue;
                }
                let mut all = vec![0f32; 8 * d];
                attend(isa, &kv, &rows(0..8), &mut all);
                results.push((isa, "8 rows", all));
                let mut split = vec![0f32; 8 * d];
                for r in 0..8 {
                    attend(isa, &kv, &rows(r..r + 1), &mut split[r * d..(r + 1) * d]);
                }
                results.push((isa, "one row", split));
            }
            // `amx` runs these (decode) rows on its vector path: the same results, bit for bit.
            for (isa, how, got) in &results {
                let Some(same) = results
                    .iter()
                    .find(|(i, h, _)| *i != *isa && *i == isa.vector() && h == how)
                else {
                    continue;
                };
                let differ = got.iter().zip(&same.2).filter(|(a, b)| a != b).count();
                assert_eq!(
                    differ,
                    0,
                    "{} {how} d {d}: {differ} values differ from {}",
                    isa.name(),
                    same.0.name()
                );
            }
            // The bf16 pair values (avx512 with AVX512_BF16, and so amx's decode rows where
            // that is its vector path; bf16 query, head dim a multiple of 32) multiply
            // probabilities rounded to bf16 (relative error up to 2^-8 each, in the sum too):
            // an output moves by at most 2^-8 * max |v - out| <= 2 * 2^-8 (|v| <= 1), and by
            // about a twentieth of that on average over these 40-key rows. A wrong column, token
            // or probability is off by far more.
            let pairs = bf16_query && d % 32 == 0 && Isa::Avx512.bf16_pairs();
            for (isa, how, got) in &results {
                let pair_values = isa.vector() == Isa::Avx512 && pairs;
                let isa = isa.name();
                let tol = if pair_values { 8e-3 } else { 1e-5 };
                let mut total = 0f64;
                for i in 0..8 * d {
                    let err = (got[i] - want[i]).abs();
                    total += err as f64;
                    assert!(
                        err < tol,
                        "{isa} {how} d {d} bf16 query {bf16_query} pair values {pair_values} \
                         [{i}]: {} vs {}",
                        got[i],
                        want[i]
                    );
                }
                let mean = total / (8 * d) as f64;
                if pair_values {
                    println!("{isa} {how} d {d}: pair values, mean |error| {mean:.1e}");
                    assert!(mean < 4e-4, "{isa} {how} d {d}: mean |error| {mean:.1e}");
                }
            }
        }
    }
}

/// The bf16 pair values where rounding cannot move them: all keys zero, so every visible
/// probability is exactly 1 (a bf16) and each output is the plain mean of the row's V rows,
/// in element order. Odd token counts (a last token paired with itself), ranges starting
/// mid-block, two blocks of a page and every group size of `avx512` (1, 2, 4, 8 rows).
#[test]
fn pair_values_with_exact_probabilities_give_the_mean() {
    if !Isa::Avx512.bf16_pairs() {
        println!("bf16 pair values: skipped (this CPU lacks AVX-512 with AVX512_BF16)");
        return;
    }
    for d in [32usize, 64, 96, 128] {
        let (ps, hk) = (64usize, 2usize);
        let layout = CacheLayout::dense(DType::BF16, 2, ps, hk, d);
        let mut rnd = uniform(11);
        let n = 2 * ps * hk * d;
        let k = vec![bf16::ZERO; n];
        let v: Vec<bf16> = (0..n).map(|_| bf16::from_f32(rnd())).collect();
        let pages = [1, 0];
        let qb: Vec<bf16> = (0..8 * d).map(|_| bf16::from_f32(rnd())).collect();
        let q: Vec<f32> = qb.iter().map(|x| x.to_f32() * 0.5).collect();
        let lo = [0, 3, 0, 7, 0, 1, 33, 0];
        let hi = [37, 37, 64, 70, 1, 2, 99, 128];
        let heads = [1usize, 1, 1, 1, 1, 1, 1, 1];
        let kv = SeqKv {
            k: &k,
            v: &v,
            pages: &pages,
            layout: &layout,
            softcap: 0.0,
            row_scales: None,
        };
        let at = |t: usize| layout.offset(pages[t / ps] as usize, t % ps, 1);
        for group in [8usize, 4, 2, 1] {
            for r0 in (0..8).step_by(group) {
                let rr = r0..r0 + group;
                let rows = Rows {
                    q: &q[rr.start * d..rr.end * d],
                    lo: &lo[rr.clone()],
                    hi: &hi[rr.clone()],
                    kv_head: &heads[rr.clone()],
                    q_bf16: Some((&qb[rr.start * d..rr.end * d], 0.5)),
                };
                let mut out = vec![0f32; group * d];
                attend(Isa::Avx512, &kv, &rows, &mut out);
                for r in rr.clone() {
                    for i in 0..d {
                        let mean = (lo[r]..hi[r]).map(|t| v[at(t) + i].to_f64()).sum::<f64>()
                            / (hi[r] - lo[r]) as f64;
                        let got = out[(r - r0) * d + i];
                        assert!(
                            (got as f64 - mean).abs() < 1e-6,
                            "d {d} group {group} row {r} [{i}]: {got} vs {mean}"
                        );
                    }
                }
            }
        }
    }
}

/// Split-K: partial states over disjoint position ranges merge to the one-pass result,
/// including ranges a row does not see (empty parts) and a row seeing nothing at all.
#[test]
fn partials_over_split_ranges_merge_exactly() {
    let (ps, hk, d) = (16usize, 1usize, 64usize);
    let layout = CacheLayout::dense(DType::F32, 8, ps, hk, d);
    let mut rnd = uniform(9);
    let n = 8 * ps * hk * d;
    let k: Vec<f32> = (0..n).map(|_| rnd()).collect();
    let v: Vec<f32> = (0..n).map(|_| rnd()).collect();
    let pages = [5, 1, 7, 0, 2, 6];
    let q: Vec<f32> = (0..4 * d).map(|_| rnd()).collect();
    // Row 3 sees nothing in [40, 70): its last part is empty for it.
    let (lo, hi) = ([0usize, 10, 0, 0], [90usize, 90, 33, 40]);
    let kv = SeqKv {
        k: &k,
        v: &v,
        pages: &pages,
        layout: &layout,
        softcap: 0.0,
        row_scales: None,
    };
    let heads = [0usize; 4];
    for isa in Isa::all().into_iter().filter(|i| i.check().is_ok()) {
        let rows = Rows {
            q: &q,
            lo: &lo,
            hi: &hi,
            kv_head: &heads,
            q_bf16: None,
        };
        let mut whole = vec![0f32; 4 * d];
        attend(isa, &kv, &rows, &mut whole);
        let cuts = [0usize, 17, 40, 70, 96];
        let mut parts = Vec::new();
        for w in cuts.windows(2) {
            let plo: Vec<usize> = lo.iter().map(|&x| x.clamp(w[0], w[1])).collect();
            let phi: Vec<usize> = hi.iter().map(|&x| x.clamp(w[0], w[1])).collect();
            let prow = Rows {
                q: &q,
                lo: &plo,
                hi: &phi,
                kv_head: &heads,
                q_bf16: None,
            };
            let (mut acc, mut m, mut l) = (vec![0f32; 4 * d], vec![0f32; 4], vec![0f32; 4]);
            attend_partial(isa, &kv, &prow, &mut acc, &mut m, &mut l);
            parts.push((acc, m, l));
        }
        assert_eq!(
            parts[3].1[3],
            f32::NEG_INFINITY,
            "row 3 sees nothing in [70, 96)"
        );
        assert_eq!(parts[3].2[3], 0.0);
        for r in 0..4 {
            let rp: Vec<(&[f32], f32, f32)> = parts
                .iter()
                .map(|(a, m, l)| (&a[r * d..(r + 1) * d], m[r], l[r]))
                .collect();
            let mut merged = vec![0f32; d];
            merge_partials(&rp, &mut merged);
            for i in 0..d {
                let (a, b) = (merged[i], whole[r * d + i]);
                assert!(
                    (a - b).abs() < 1e-6,
                    "{} row {r} [{i}]: {a} vs {b}",
                    isa.name()
                );
            }
        }
    }
    let mut none = vec![1f32; 4];
    merge_partials(&[(&[2.0; 4], f32::NEG_INFINITY, 0.0)], &mut none);
    assert_eq!(none, [0.0; 4]);
}

/// Where [`split_pairs`] puts element `i` of a `d`-wide row with `w` lanes (the definition).
fn split_order(i: usize, d: usize, w: usize) -> usize {
    let pairs = d / (2 * w) * (2 * w);
    if i >= pairs {
        return i;
    }
    let (b, o) = (i / (2 * w) * (2 * w), i % (2 * w));
    b + if o % 2 == 0 { o / 2 } else { w + o / 2 }
}

/// The pair order, both ways, against its definition (rows with and without a part past the
/// last whole pair); and the bf16 pair loads of every path this machine has against it.
#[test]
fn split_pairs_follow_the_definition() {
    for (w, d) in [
        (8usize, 16usize),
        (8, 70),
        (16, 32),
        (16, 88),
        (8, 128),
        (16, 128),
    ] {
        let x: Vec<f32> = (0..3 * d).map(|i| i as f32).collect();
        let mut y = x.clone();
        split_pairs::<false>(w, &mut y, d);
        for r in 0..3 {
            for i in 0..d {
                assert_eq!(y[r * d + split_order(i, d, w)], x[r * d + i], "w {w} d {d}");
            }
        }
        split_pairs::<true>(w, &mut y, d);
        assert_eq!(y, x);
    }
    assert_eq!(split_order(3, 20, 8), 9);
    assert_eq!(split_order(17, 20, 8), 17);
    let v: Vec<bf16> = (0..32).map(|i| bf16::from_f32(i as f32 - 7.5)).collect();
    let want = |w: usize| {
        let mut y: Vec<f32> = v[..2 * w].iter().map(|x| x.to_f32()).collect();
        split_pairs::<false>(w, &mut y, 2 * w);
        y
    };
    // The paths that split bf16 pairs (avx2), and those that do not.
    assert!(!Portable::<8>::split::<bf16>() && !Portable::<16>::split::<bf16>());
    #[cfg(target_arch = "x86_64")]
    {
        use super::avx2::Avx2 as Avx2Lanes;
        use std::arch::x86_64::_mm256_storeu_ps;
        assert!(Avx2Lanes::split::<bf16>() && !Avx2Lanes::split::<f16>());
        assert!(!super::avx512::Avx512::split::<bf16>());
        if Isa::Avx2.check().is_ok() {
            // SAFETY: 32 valid reads; the CPU has AVX2.
            let y = unsafe {
                let [a, b] = Avx2Lanes::load_kv2(v.as_ptr());
                let mut y = [0f32; 16];
                _mm256_storeu_ps(y.as_mut_ptr(), a);
                _mm256_storeu_ps(y.as_mut_ptr().add(8), b);
                y
            };
            assert_eq!(y.to_vec(), want(8));
        } else {
            println!("avx2 pair load: skipped (this CPU lacks it)");
        }
    }
}

/// `Lanes::transpose` (the tiled kernel's K tile) against its definition on every lane type
/// this machine runs.
#[test]
fn transposes_follow_the_definition() {
    fn check<L: Lanes>(what: &str) {
        let w = L::W;
        let x: Vec<f32> = (0..w * w).map(|i| i as f32).collect();
        let mut got = vec![0f32; w * w];
        // SAFETY: every load and store is W floats inside `x` / `got`; the caller checked
        // the CPU's features.
        unsafe {
            let mut a = [L::splat(-1.0); 16];
            for i in 0..w {
                a[i] = L::load(x.as_ptr().add(i * w));
            }
            L::transpose(&mut a);
            for i in 0..w {
                L::store(got.as_mut_ptr().add(i * w), a[i]);
            }
            // `a[W..]` is left alone.
            let mut rest = [0f32; 16];
            for i in w..16 {
                L::store(rest.as_mut_ptr(), a[i]);
                assert_eq!(rest[..w], vec![-1.0; w][..], "{what}: a[{i}]");
            }
        }
        for i in 0..w {
            for j in 0..w {
                assert_eq!(got[i * w + j], x[j * w + i], "{what}: row {i} lane {j}");
            }
        }
    }
    check::<Portable<8>>("portable");
    check::<Portable<16>>("portable16");
    #[cfg(target_arch = "x86_64")]
    {
        if Isa::Avx2.check().is_ok() {
            check::<super::avx2::Avx2>("avx2");
        } else {
            println!("avx2 transpose: skipped (this CPU lacks it)");
        }
        if Isa::Avx512.check().is_ok() {
            check::<super::avx512::Avx512>("avx512");
        } else {
            println!("avx512 transpose: skipped (this CPU lacks it)");
        }
    }
}
