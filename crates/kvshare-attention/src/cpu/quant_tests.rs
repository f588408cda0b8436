//! Quantized caches (fp8 with per-tensor scales, int8 with per-channel ones, int8 with a scale
//! per (token, kv head) row kept in the pages) end to end on the CPU backend: new K/V written through [`Backend::kv_write`]
//! (quantized with the layer's scales) into shuffled pages, then attention through
//! [`Backend::attention`] on every kernel path this machine runs (decode rows, tiled prefill
//! rows, the AMX engine, split-K merges), against an f64 computation of the same attention.
//!
//! The reference is written here over the logical tensors (per-sequence `[ctx, kv_heads,
//! head_dim]` K/V, `[tokens, heads, head_dim]` queries), not over the kernel's rows as the
//! kernel tests' references are, because the backend's launch is what is checked: the page
//! table, the slot mapping, the write's rounding and the scales folded into the query and
//! output.
//!
//! Two checks per output element:
//! * **the kernel reads the pages exactly**: against the reference on the *stored* values
//!   (each code's value times its scale), the difference is the kernel's own arithmetic (f32;
//!   bf16 pairs on the AMX engine);
//! * **the format's error bound**: against the reference on the values *before* the write, the
//!   difference stays within [`Bound`], derived from the format's mantissa bits (below), never
//!   fitted to observed errors.
//!
//! # The bound
//!
//! A value `x` written with scale `c` is stored as `c * round(x / c)`, whose error is at most
//! `u |x| + a` with, for fp8, `u = 2^-(m + 1)` (`m` mantissa bits: 1/16 for E4M3, 1/8 for E5M2)
//! and `a = 2^(emin - m - 1) c` (half the subnormal spacing; `emin` = -6 for E4M3, -14 for
//! E5M2), and for int8 `u = 0` and `a = c / 2` (`c` the channel's scale times the per-tensor
//! one; per-token-head, the row's scale, which the write computes, times the per-tensor one:
//! `a` differs by position, and the value term takes its largest over the positions a row
//! sees), when `|x| / c` does not pass the largest value (the scales here are at least the
//! calibrated `amax / max`, `max` 448, 57344 or 127, so nothing saturates). For one output row with query `q` and
//! attention scale `s`:
//! * each score moves by at most `D_t = s sum_i |q_i| (u |k_ti| + a_k)`, so with `D = max_t D_t`
//!   each softmax weight moves by a factor within `e^(+-2D)`, and `sum_t |p'_t - p_t| <=
//!   e^(2D) - 1`;
//! * each value moves by at most `u |v_ti| + a_v`.
//!
//! Hence `|out'_i - out_i| <= (e^(2D) - 1) max_t |v_ti| + max_t (u |v_ti| + a_v)`. The AMX
//! engine's bf16 pairs round the query and the probabilities too (relative `2^-8` each, bf16's
//! unit roundoff): that adds `2^-8 s sum_i |q_i| |k'_ti|` to `D_t` and `2^-8` to the weights'
//! factor, on that path; with per-token-head rows it rounds each probability times its V row's
//! scale to bf16 once more (the softmax sum takes the probability alone), a further `2^-8` on
//! the weights there.
//! A soft cap moves no score by more than its argument moves (`|d/dx c tanh(x / c)| <= 1`) and
//! a sliding window only narrows the positions, so the bound holds with both.
//! The kernel's f32 arithmetic (its `exp`, sums of up to a few thousand terms) adds at most
//! `2^-14 max_t |v_ti|`.

use proptest::prelude::*;

use super::{CpuBackend, Isa};
use crate::fp8::{Fp8, Fp8E4M3, Fp8E5M2};
use crate::{
    AttnBatch, AttnBuffers, AttnParams, Backend, Buf, BufMut, CacheLayout, ChannelScales,
    KvCachesMut, KvScales, KvWrite, KvWriteParams, SlotMapping, TokenStrides,
};
use kvshare_core::DType;

/// One launch: sequences of `ctx[s]` tokens whose last `q_len[s]` are queries (1 each and
/// `varlen` false for decode).
#[derive(Clone, Debug)]
struct Case {
    format: DType,
    d: usize,
    ps: usize,
    kv_heads: usize,
    group: usize,
    ctx: Vec<usize>,
    q_len: Vec<usize>,
    varlen: bool,
    /// Amplitude of K and V (uniform in `[-a, a)`, `a` from 0.25 to 2 times `amp` by channel).
    amp: f32,
    /// Each scale is the calibrated `amax / max` times this (>= 1: nothing saturates; larger
    /// values push more of the values into the subnormals).
    headroom: f32,
    bf16_query: bool,
    /// Logit soft cap (0: off).
    softcap: f32,
    /// Sliding window (0: off).
    window: usize,
    /// int8 only: K and V centred away from 0 per channel (by -1.5 to 1.5 times its amplitude),
    /// written and read with per-channel offsets (CANN's `(code + offset) * scale`).
    offsets: bool,
    seed: u32,
}

/// The format's constants the bound needs: `(u, a / scale)`. int8 (to nearest, 1 apart):
/// no relative term, half a step absolute.
fn unit_errors(format: DType) -> (f64, f64) {
    fn of<T: Fp8>() -> (f64, f64) {
        let m = T::MANTISSA_BITS as i32;
        (2f64.powi(-(m + 1)), 2f64.powi(T::MIN_EXP - m - 1))
    }
    match format {
        DType::Fp8E4M3 => of::<Fp8E4M3>(),
        DType::Fp8E5M2 => of::<Fp8E5M2>(),
        DType::Int8 | DType::Int8PerTokenHead => (0.0, 0.5),
        d => panic!("{d:?} is not a quantized format"),
    }
}

/// The largest magnitude a scale of `amax / max` keeps (int8: 127, symmetric).
fn max_finite(format: DType) -> f32 {
    match format {
        DType::Fp8E4M3 => Fp8E4M3::MAX,
        DType::Fp8E5M2 => Fp8E5M2::MAX,
        _ => 127.0,
    }
}

/// The caches as bytes, read as the format's elements.
fn cache_buf(format: DType, b: &[u8]) -> Buf<'_> {
    // SAFETY: i8 and u8 have the same size, alignment and validity.
    let i8s: &[i8] = unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len()) };
    match format {
        DType::Fp8E4M3 => Buf::Fp8E4M3(crate::fp8::e4m3_slice(b)),
        DType::Fp8E5M2 => Buf::Fp8E5M2(crate::fp8::e5m2_slice(b)),
        DType::Int8PerTokenHead => Buf::I8Rows(i8s),
        _ => Buf::I8(i8s),
    }
}

fn cache_buf_mut(format: DType, b: &mut [u8]) -> BufMut<'_> {
    match format {
        DType::Fp8E4M3 => BufMut::Fp8E4M3(crate::fp8::e4m3_slice_mut(b)),
        DType::Fp8E5M2 => BufMut::Fp8E5M2(crate::fp8::e5m2_slice_mut(b)),
        format => {
            // SAFETY: as in `cache_buf`; the result borrows `b` mutably for its whole life.
            let i8s: &mut [i8] =
                unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), b.len()) };
            match format {
                DType::Int8PerTokenHead => BufMut::I8Rows(i8s),
                _ => BufMut::I8(i8s),
            }
        }
    }
}

fn code_value(format: DType, b: u8) -> f64 {
    match format {
        DType::Fp8E4M3 => Fp8E4M3(b).to_f32() as f64,
        DType::Fp8E5M2 => Fp8E5M2(b).to_f32() as f64,
        _ => b as i8 as f64,
    }
}

/// A case's inputs: the logical K/V per sequence and token (`[token][head][i]` flattened per
/// sequence), the queries, and what the backend stored.
struct Run {
    /// Per sequence, `[ctx, kv_heads, d]` before the write.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Per sequence, the stored values (code value times scale), same shape.
    k_stored: Vec<Vec<f64>>,
    v_stored: Vec<Vec<f64>>,
    /// `[tokens, heads, d]`, as the kernel reads it (bf16-rounded when the query is bf16).
    q: Vec<f32>,
    scale: f32,
    /// Per channel (`[kv_heads, d]`), the scale a stored code is multiplied by: the per-tensor
    /// scale times the channel's (int8), or the per-tensor scale alone (fp8).
    k_eff: Vec<f64>,
    v_eff: Vec<f64>,
    /// Per sequence, `[ctx, kv_heads]`: each row's own scale (int8 per-token-head: the one the
    /// write stored in the page; 1 for the other formats).
    k_row: Vec<Vec<f64>>,
    v_row: Vec<Vec<f64>>,
    /// Per path: the output `[tokens, heads, d]`.
    outs: Vec<(Isa, Vec<f32>)>,
}

fn run(c: &Case) -> Run {
    let (d, hk, ps) = (c.d, c.kv_heads, c.ps);
    let h = hk * c.group;
    let mut seed = c.seed | 1;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
    };
    let n = c.ctx.len();
    // Channels of different amplitudes (0.25 to 2 times `amp`, by kv head and index), so that
    // per-channel scales differ and a scale applied to the wrong channel shows.
    let chan = |e: usize| c.amp * (0.25 + ((e % (hk * d)) * 7 % 8) as f32 / 4.0);
    let int8 = c.format == DType::Int8;
    let asym = int8 && c.offsets;
    let centre = |e: usize| {
        let i = e % (hk * d);
        if asym {
            chan(e) * (i * 5 % 7) as f32 / 2.0 - chan(e) * 1.5
        } else {
            0.0
        }
    };
    let k: Vec<Vec<f32>> = c
        .ctx
        .iter()
        .map(|&l| {
            (0..l * hk * d)
                .map(|e| rnd() * chan(e) + centre(e))
                .collect()
        })
        .collect();
    let v: Vec<Vec<f32>> = c
        .ctx
        .iter()
        .map(|&l| {
            (0..l * hk * d)
                .map(|e| rnd() * chan(e) - centre(e))
                .collect()
        })
        .collect();
    let max = max_finite(c.format);
    let calibrated = |a: f32| (a / max * c.headroom).max(f32::MIN_POSITIVE);
    // int8: per-channel scales calibrated per (kv head, channel) and per-tensor scales of 0.5
    // and 2 (their product is the calibrated one); fp8: per-tensor scales calibrated. With
    // offsets, each channel's range is centred: the scale covers half its width and the offset
    // (in codes) is its midpoint divided by the scale.
    let channel_range = |x: &Vec<Vec<f32>>| -> Vec<(f32, f32)> {
        let mut a = vec![(f32::INFINITY, f32::NEG_INFINITY); hk * d];
        for seq in x {
            for (e, &y) in seq.iter().enumerate() {
                let r = &mut a[e % (hk * d)];
                *r = (r.0.min(y), r.1.max(y));
            }
        }
        a.iter()
            .map(|&(lo, hi)| if lo > hi { (0.0, 0.0) } else { (lo, hi) })
            .collect()
    };
    let (kr, vr) = (channel_range(&k), channel_range(&v));
    let half_width = |r: &[(f32, f32)]| -> Vec<f32> {
        r.iter()
            .map(|&(lo, hi)| {
                if asym {
                    (hi - lo) / 2.0
                } else {
                    lo.abs().max(hi.abs())
                }
            })
            .collect()
    };
    let (ka, va) = (half_width(&kr), half_width(&vr));
    let rows = c.format == DType::Int8PerTokenHead;
    let (scales, kch, vch) = if int8 {
        let s = KvScales::new(0.5, 2.0);
        let ch = |a: &[f32], t: f32| -> Vec<f32> { a.iter().map(|&x| calibrated(x) / t).collect() };
        (s, ch(&ka, s.k), ch(&va, s.v))
    } else if rows {
        // The write computes each row's scale; per-tensor scales multiply on top.
        (
            KvScales::new(0.5, 2.0),
            vec![1.0; hk * d],
            vec![1.0; hk * d],
        )
    } else {
        let all = |a: &[f32]| calibrated(a.iter().fold(0f32, |m, &y| m.max(y)));
        (
            KvScales::new(all(&ka), all(&va)),
            vec![1.0; hk * d],
            vec![1.0; hk * d],
        )
    };
    let offsets = |r: &[(f32, f32)], t: f32, ch: &[f32]| -> Vec<f32> {
        r.iter()
            .zip(ch)
            .map(|(&(lo, hi), &sc)| {
                if asym {
                    (lo + hi) / 2.0 / (t * sc)
                } else {
                    0.0
                }
            })
            .collect()
    };
    let (ko, vo) = (offsets(&kr, scales.k, &kch), offsets(&vr, scales.v, &vch));
    let channels = int8.then_some(ChannelScales {
        k: &kch,
        v: &vch,
        k_offsets: asym.then_some(&ko[..]),
        v_offsets: asym.then_some(&vo[..]),
    });
    let eff =
        |t: f32, ch: &[f32]| -> Vec<f64> { ch.iter().map(|&x| t as f64 * x as f64).collect() };
    let (k_eff, v_eff) = (eff(scales.k, &kch), eff(scales.v, &vch));
    // Pages: each sequence's pages drawn from one shuffled pool, with spare pages left over.
    let per_seq: Vec<usize> = c.ctx.iter().map(|l| l.div_ceil(ps)).collect();
    let max_pages = per_seq.iter().copied().max().unwrap_or(1).max(1);
    let num_pages = per_seq.iter().sum::<usize>() + 3;
    let mut pool: Vec<i32> = (0..num_pages as i32).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, (rnd().abs() * 1e6) as usize % (i + 1));
    }
    let mut table = vec![0i32; n * max_pages];
    let mut next = 0;
    for s in 0..n {
        for j in 0..per_seq[s] {
            table[s * max_pages + j] = pool[next];
            next += 1;
        }
    }
    let layout = CacheLayout::dense(c.format, num_pages, ps, hk, d);
    let elems = num_pages * layout.page_stride;
    let (mut kc, mut vc) = (vec![0u8; elems], vec![0u8; elems]);
    // One write of every token of every sequence: `[tokens, kv_heads, d]` and its slots.
    let (kn, vn): (Vec<f32>, Vec<f32>) = (k.concat(), v.concat());
    let slots: Vec<i64> = (0..n)
        .flat_map(|s| {
            let table = &table;
            (0..c.ctx[s])
                .map(move |t| table[s * max_pages + t / ps] as i64 * ps as i64 + (t % ps) as i64)
        })
        .collect();
    let wp = KvWriteParams {
        num_tokens: slots.len(),
        src_dtype: DType::F32,
        src_strides: TokenStrides::dense(hk, d),
        cache: layout,
        scales,
    };
    let be = CpuBackend::with_isa(1, Isa::Portable).unwrap();
    if !slots.is_empty() {
        let w = KvWrite::new(
            wp,
            Buf::F32(&kn),
            Buf::F32(&vn),
            SlotMapping::I64(&slots),
            KvCachesMut::Split {
                key: cache_buf_mut(c.format, &mut kc),
                value: cache_buf_mut(c.format, &mut vc),
            },
            channels,
        )
        .unwrap();
        be.kv_write(w).unwrap();
    }
    // Each row's own scale: the f32 after its codes (int8 per-token-head), else 1.
    let row_scales = |cache: &[u8]| -> Vec<Vec<f64>> {
        (0..n)
            .map(|s| {
                (0..c.ctx[s] * hk)
                    .map(|e| {
                        let (t, kh) = (e / hk, e % hk);
                        let page = table[s * max_pages + t / ps] as usize;
                        let at = layout.offset(page, t % ps, kh) + d;
                        match rows {
                            true => {
                                f32::from_le_bytes(cache[at..at + 4].try_into().unwrap()) as f64
                            }
                            false => 1.0,
                        }
                    })
                    .collect()
            })
            .collect()
    };
    let (k_row, v_row) = (row_scales(&kc), row_scales(&vc));
    let stored = |cache: &[u8], sc: &[f64], off: &[f32], row: &[Vec<f64>]| -> Vec<Vec<f64>> {
        (0..n)
            .map(|s| {
                (0..c.ctx[s] * hk * d)
                    .map(|e| {
                        let (t, hi) = (e / (hk * d), e % (hk * d));
                        let page = table[s * max_pages + t / ps] as usize;
                        let at = layout.offset(page, t % ps, hi / d) + hi % d;
                        let rs = row[s][t * hk + hi / d];
                        (code_value(c.format, cache[at]) + off[hi] as f64) * sc[hi] * rs
                    })
                    .collect()
            })
            .collect()
    };
    let (k_stored, v_stored) = (
        stored(&kc, &k_eff, &ko, &k_row),
        stored(&vc, &v_eff, &vo, &v_row),
    );

    let tokens: usize = c.q_len.iter().sum();
    let scale = 1.0 / (d as f32).sqrt();
    let mut q: Vec<f32> = (0..tokens * h * d).map(|_| rnd()).collect();
    let qb: Vec<half::bf16> = q.iter().map(|&x| half::bf16::from_f32(x)).collect();
    if c.bf16_query {
        q = qb.iter().map(|x| x.to_f32()).collect();
    }
    let mut starts = vec![0i32];
    for &l in &c.q_len {
        starts.push(starts.last().unwrap() + l as i32);
    }
    let ctx_lens: Vec<i32> = c.ctx.iter().map(|&l| l as i32).collect();
    let p = AttnParams {
        num_seqs: n,
        num_tokens: tokens,
        num_heads: h,
        query_dtype: if c.bf16_query {
            DType::BF16
        } else {
            DType::F32
        },
        query_strides: TokenStrides::dense(h, d),
        output_dtype: DType::F32,
        output_strides: TokenStrides::dense(h, d),
        cache: layout,
        max_pages_per_seq: max_pages,
        block_table_stride: max_pages,
        varlen: c.varlen,
        scale,
        softcap: c.softcap,
        sliding_window: c.window,
        kv_scales: scales,
    };
    let mut outs = Vec::new();
    for isa in Isa::all() {
        if isa.check().is_err() {
            continue;
        }
        let be = CpuBackend::with_isa(2, isa).unwrap();
        let mut out = vec![f32::NAN; tokens * h * d];
        let bufs = AttnBuffers {
            query: if c.bf16_query {
                Buf::BF16(&qb)
            } else {
                Buf::F32(&q)
            },
            key_cache: cache_buf(c.format, &kc),
            value_cache: cache_buf(c.format, &vc),
            block_table: &table,
            context_lens: &ctx_lens,
            query_start_loc: c.varlen.then_some(&starts[..]),
            output: BufMut::F32(&mut out),
            channel_scales: channels,
        };
        be.attention(AttnBatch::new(p, bufs).unwrap()).unwrap();
        outs.push((isa, out));
    }
    Run {
        k,
        v,
        k_stored,
        v_stored,
        q,
        scale,
        k_eff,
        v_eff,
        k_row,
        v_row,
        outs,
    }
}

/// The f64 attention over `(k, v)` of every output element, with the pieces of its bound: per
/// element `(want, max_t |v_ti|)`, per row `(D without the pair term, the pair term's sum
/// s sum_i |q_i| |k_hat_ti|)` where `k_hat` is what the kernel multiplies. `u` and `a_k` are
/// the stored values' error terms (0 for the kernel-only check).
struct Expected {
    want: Vec<f64>,
    vmax: Vec<f64>,
    /// Per element, the largest `a_v` over the positions its row sees.
    av: Vec<f64>,
    d0: Vec<f64>,
    dq: Vec<f64>,
}

/// `a_k`, `a_v`: per channel, times each row's own scale ([`Run::k_row`]).
fn expected(
    c: &Case,
    r: &Run,
    (k, v): (&[Vec<f64>], &[Vec<f64>]),
    u: f64,
    (a_k, a_v): (&[f64], &[f64]),
) -> Expected {
    let (d, hk) = (c.d, c.kv_heads);
    let h = hk * c.group;
    let tokens: usize = c.q_len.iter().sum();
    let mut e = Expected {
        want: vec![0.0; tokens * h * d],
        vmax: vec![0.0; tokens * h * d],
        av: vec![0.0; tokens * h * d],
        d0: vec![0.0; tokens * h],
        dq: vec![0.0; tokens * h],
    };
    let sc = r.scale as f64;
    let mut tok0 = 0;
    for s in 0..c.ctx.len() {
        let l = c.ctx[s];
        for qi in 0..c.q_len[s] {
            let pos = l - c.q_len[s] + qi;
            let tok = tok0 + qi;
            for head in 0..h {
                let row = tok * h + head;
                let kh = head / c.group;
                let q: Vec<f64> = r.q[row * d..][..d].iter().map(|&x| x as f64).collect();
                let at = |t: usize| (t * hk + kh) * d;
                let lo = match c.window {
                    0 => 0,
                    w => (pos + 1).saturating_sub(w),
                };
                let mut scores = Vec::with_capacity(pos + 1 - lo);
                for t in lo..=pos {
                    let (kt, kq) = (&k[s][at(t)..][..d], &r.k_stored[s][at(t)..][..d]);
                    let kr = r.k_row[s][t * hk + kh];
                    let (mut x, mut d0, mut dq) = (0f64, 0f64, 0f64);
                    for i in 0..d {
                        x += q[i] * kt[i];
                        d0 += q[i].abs() * (u * kt[i].abs() + a_k[kh * d + i] * kr);
                        dq += q[i].abs() * kq[i].abs();
                    }
                    let x = sc * x;
                    let cap = c.softcap as f64;
                    scores.push(if cap > 0.0 { cap * (x / cap).tanh() } else { x });
                    e.d0[row] = e.d0[row].max(sc * d0);
                    e.dq[row] = e.dq[row].max(sc * dq);
                }
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let lsum: f64 = p.iter().sum();
                for i in 0..d {
                    let (mut o, mut vm, mut av) = (0f64, 0f64, 0f64);
                    for t in lo..=pos {
                        let x = v[s][at(t) + i];
                        o += p[t - lo] * x;
                        vm = vm.max(x.abs());
                        av = av.max(a_v[kh * d + i] * r.v_row[s][t * hk + kh]);
                    }
                    e.want[row * d + i] = o / lsum;
                    e.vmax[row * d + i] = vm;
                    e.av[row * d + i] = av;
                }
            }
        }
        tok0 += c.q_len[s];
    }
    e
}

/// Checks every output of `got` against `e` with the bound of the module documentation:
/// `(e^(2D) - 1 + u) max_t |v_ti| + a_v + 2^-14 max_t |v_ti|`, `D` with the bf16 pairs'
/// rounding `pairs` (AMX: 2^-8; else 0), once more on the weights for per-token-head rows.
/// Returns the largest error as a fraction of its bound, and the largest error.
fn check(what: &str, c: &Case, got: &[f32], e: &Expected, u: f64, pairs: f64) -> (f64, f64) {
    let d = c.d;
    let (mut worst, mut max_err) = (0f64, 0f64);
    for (j, &g) in got.iter().enumerate() {
        let row = j / d;
        let big_d = e.d0[row] + pairs * e.dq[row];
        let rounds = if c.format == DType::Int8PerTokenHead {
            3.0
        } else {
            2.0
        };
        let weights = (2.0 * big_d + rounds * pairs).exp() - 1.0;
        let vmax = e.vmax[j];
        let bound = (weights + u + 2f64.powi(-14)) * vmax + e.av[j];
        let err = (g as f64 - e.want[j]).abs();
        assert!(
            err <= bound,
            "{what}: {c:?} row {row} [{}]: got {g}, want {}, error {err:e} above the bound \
             {bound:e}",
            j % d,
            e.want[j]
        );
        if bound > 0.0 {
            worst = worst.max(err / bound);
        }
        max_err = max_err.max(err);
    }
    (worst, max_err)
}

/// Both checks of the module documentation on every path; returns the largest fraction of
/// the format's bound that any output used, and the largest error against the values before the
/// write.
fn check_case(c: &Case) -> (f64, f64) {
    let r = run(c);
    let (u, a) = unit_errors(c.format);
    let to64 = |x: &Vec<Vec<f32>>| -> Vec<Vec<f64>> {
        x.iter()
            .map(|s| s.iter().map(|&y| y as f64).collect())
            .collect()
    };
    let zero = vec![0.0; c.kv_heads * c.d];
    let a_of = |eff: &[f64]| -> Vec<f64> { eff.iter().map(|x| a * x).collect() };
    let (a_k, a_v) = (a_of(&r.k_eff), a_of(&r.v_eff));
    let stored = expected(c, &r, (&r.k_stored, &r.v_stored), 0.0, (&zero, &zero));
    let (k, v) = (to64(&r.k), to64(&r.v));
    let format = expected(c, &r, (&k, &v), u, (&a_k, &a_v));
    let (mut worst, mut max_err) = (0f64, 0f64);
    for (isa, got) in &r.outs {
        let pairs = if *isa == Isa::Amx { 2f64.powi(-8) } else { 0.0 };
        let name = isa.name();
        check(
            &format!("{name}: stored values"),
            c,
            got,
            &stored,
            0.0,
            pairs,
        );
        let what = format!("{name}: {:?} bound", c.format);
        let w = check(&what, c, got, &format, u, pairs);
        worst = worst.max(w.0);
        max_err = max_err.max(w.1);
    }
    (worst, max_err)
}

fn format() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::Fp8E4M3, DType::Fp8E5M2, DType::Int8])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Decode: ragged context lengths, any page size, GQA groups, head dims with tails.
    #[test]
    fn quantized_decode_within_the_format_bound(
        format in format(),
        d in prop::sample::select(vec![8usize, 40, 64, 72, 128]),
        ps in prop::sample::select(vec![1usize, 5, 16, 33]),
        kv_heads in 1usize..3,
        group in prop::sample::select(vec![1usize, 2, 4, 8]),
        ctx in prop::collection::vec(1usize..200, 1..4),
        amp in prop::sample::select(vec![0.5f32, 2.0]),
        headroom in prop::sample::select(vec![1.0f32, 8.0, 300.0]),
        bf16_query in any::<bool>(),
        offsets in any::<bool>(),
        seed in any::<u32>(),
    ) {
        let q_len = vec![1; ctx.len()];
        check_case(&Case {
            format, d, ps, kv_heads, group, ctx, q_len, varlen: false, amp, headroom,
            bf16_query, softcap: 0.0, window: 0, offsets, seed,
        });
    }

    /// Prefill and mixed batches: query lengths from 1 to past the tiled kernel's threshold
    /// (8 tokens), after cached prefixes.
    #[test]
    fn quantized_prefill_within_the_format_bound(
        format in format(),
        d in prop::sample::select(vec![8usize, 40, 64, 72, 128]),
        ps in prop::sample::select(vec![1usize, 5, 16, 33]),
        kv_heads in 1usize..3,
        group in prop::sample::select(vec![1usize, 2, 4]),
        seqs in prop::collection::vec((0usize..60, 1usize..24), 1..3),
        amp in prop::sample::select(vec![0.5f32, 2.0]),
        headroom in prop::sample::select(vec![1.0f32, 8.0]),
        offsets in any::<bool>(),
        seed in any::<u32>(),
    ) {
        let ctx = seqs.iter().map(|&(prefix, q)| prefix + q).collect();
        let q_len = seqs.iter().map(|&(_, q)| q).collect();
        check_case(&Case {
            format, d, ps, kv_heads, group, ctx, q_len, varlen: true, amp, headroom,
            bf16_query: false, softcap: 0.0, window: 0, offsets, seed,
        });
    }
}

/// Long sequences (split into key chunks whose partial softmaxes are merged) in every format,
/// decode and a prefill chunk; prints how much of the bound the errors used.
#[test]
fn quantized_long_sequences_split_and_merge_within_the_bound() {
    let formats = [
        (DType::Fp8E4M3, false),
        (DType::Fp8E5M2, false),
        (DType::Int8, false),
        (DType::Int8, true),
        (DType::Int8PerTokenHead, false),
    ];
    for (format, offsets) in formats {
        for (varlen, q_len) in [(false, 1usize), (true, 9)] {
            let c = Case {
                format,
                d: 128,
                ps: 16,
                kv_heads: 2,
                group: 4,
                ctx: vec![2600, 37],
                q_len: vec![q_len, 1],
                varlen,
                amp: 1.0,
                headroom: 1.0,
                bf16_query: false,
                softcap: 0.0,
                window: 0,
                offsets,
                seed: 7,
            };
            let (used, err) = check_case(&c);
            println!(
                "{format:?}{} q_len {q_len}: largest error {err:.2e} (channel amplitudes 0.25 to 2), \
                 {used:.3} of its bound",
                if offsets { " with offsets" } else { "" }
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// int8 with a scale per (token, kv head) row, decode: GQA 1 to 8, head dims 8 to 128 (with
    /// tails), pages of 1 to 33 tokens, ragged lengths, with and without a soft cap and a sliding
    /// window.
    #[test]
    fn per_token_head_decode_within_the_bound(
        d in prop::sample::select(vec![8usize, 40, 64, 72, 128]),
        ps in prop::sample::select(vec![1usize, 5, 16, 33]),
        kv_heads in 1usize..3,
        group in prop::sample::select(vec![1usize, 2, 3, 4, 8]),
        ctx in prop::collection::vec(1usize..200, 1..4),
        amp in prop::sample::select(vec![1e-7f32, 0.5, 2.0, 300.0]),
        bf16_query in any::<bool>(),
        softcap in prop::sample::select(vec![0.0f32, 0.5, 30.0]),
        window in prop::sample::select(vec![0usize, 1, 17, 64]),
        seed in any::<u32>(),
    ) {
        let q_len = vec![1; ctx.len()];
        check_case(&Case {
            format: DType::Int8PerTokenHead, d, ps, kv_heads, group, ctx, q_len,
            varlen: false, amp, headroom: 1.0, bf16_query, softcap, window, offsets: false, seed,
        });
    }

    /// As above, prefill and mixed batches (query lengths past the tiled kernel's threshold,
    /// after cached prefixes).
    #[test]
    fn per_token_head_prefill_within_the_bound(
        d in prop::sample::select(vec![8usize, 40, 64, 72, 128]),
        ps in prop::sample::select(vec![1usize, 5, 16, 33]),
        kv_heads in 1usize..3,
        group in prop::sample::select(vec![1usize, 2, 4, 8]),
        seqs in prop::collection::vec((0usize..60, 1usize..24), 1..3),
        amp in prop::sample::select(vec![0.5f32, 2.0]),
        softcap in prop::sample::select(vec![0.0f32, 0.5, 30.0]),
        window in prop::sample::select(vec![0usize, 1, 17, 64]),
        seed in any::<u32>(),
    ) {
        let ctx = seqs.iter().map(|&(prefix, q)| prefix + q).collect();
        let q_len = seqs.iter().map(|&(_, q)| q).collect();
        check_case(&Case {
            format: DType::Int8PerTokenHead, d, ps, kv_heads, group, ctx, q_len,
            varlen: true, amp, headroom: 1.0, bf16_query: false, softcap, window, offsets: false,
            seed,
        });
    }
}
