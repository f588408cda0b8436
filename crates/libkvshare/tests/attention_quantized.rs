//! Quantized caches (fp8 with per-tensor scales, int8 with per-channel ones, int8 with a scale
//! per (token, kv head) row kept in the pages) through the C exports: `kvs_kv_write_scaled` stores each new value as the code nearest `value / scale`,
//! `kvs_attention_launch_scaled` on those pages gives what `kvs_attention_launch` gives on an f32
//! cache holding the codes' values times the scales (the kernel's accuracy against the f64
//! reference is `kvshare-attention`'s `cpu/quant_tests.rs`), and bad scales, missing or
//! misplaced channel scales, or a quantized query are refused with nothing written.

// The `unsafe` blocks of these tests call the C ABI with buffers the test owns, sized as each
// call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use std::ffi::c_void;

use kvshare::attn_args::{kvs_attention_args, kvs_kv_layout, kvs_kv_scales, kvs_kv_write_args};
use kvshare::backend::kvs_backend;
use kvshare::enums::{kvs_dtype, kvs_status};
use kvshare_attention::{Fp8, Fp8E4M3, Fp8E5M2};
use support::attention::{last_error, new_backend, Rng};

const F32: u32 = kvs_dtype::F32 as u32;

/// Two sequences of 37 and 70 tokens on shuffled pages of 16, 2 kv heads x 64, GQA 4.
struct Setup {
    hk: usize,
    d: usize,
    h: usize,
    ps: usize,
    pages: usize,
    ctx: Vec<i32>,
    table: Vec<i32>,
    max_pages: usize,
    /// `[tokens, hk, d]` new K and V, every token of both sequences.
    key: Vec<f32>,
    value: Vec<f32>,
    slots: Vec<i64>,
    query: Vec<f32>,
}

fn setup() -> Setup {
    let (hk, d, group, ps) = (2usize, 64usize, 4usize, 16usize);
    let ctx = vec![37i32, 70];
    let max_pages = 5;
    let pages = 9;
    let mut rng = Rng(11);
    let mut ids: Vec<i32> = (0..pages as i32).collect();
    rng.shuffle(&mut ids);
    let mut table = vec![0i32; 2 * max_pages];
    let mut next = 0;
    for (s, &l) in ctx.iter().enumerate() {
        for j in 0..(l as usize).div_ceil(ps) {
            table[s * max_pages + j] = ids[next];
            next += 1;
        }
    }
    let mut slots = Vec::new();
    for (s, &l) in ctx.iter().enumerate() {
        for t in 0..l as usize {
            slots.push(table[s * max_pages + t / ps] as i64 * ps as i64 + (t % ps) as i64);
        }
    }
    let n = slots.len() * hk * d;
    let mut uni = || (rng.unit() * 2.0 - 1.0) as f32;
    let key: Vec<f32> = (0..n).map(|_| uni()).collect();
    let value: Vec<f32> = (0..n).map(|_| uni()).collect();
    let query: Vec<f32> = (0..2 * hk * group * d).map(|_| uni()).collect();
    Setup {
        hk,
        d,
        h: hk * group,
        ps,
        pages,
        ctx,
        table,
        max_pages,
        key,
        value,
        slots,
        query,
    }
}

impl Setup {
    fn layout(&self, dtype: u32) -> kvs_kv_layout {
        kvs_backend::kvs_kv_layout_dense(
            dtype,
            self.pages as u32,
            self.ps as u32,
            self.hk as u32,
            self.d as u32,
        )
    }

    fn write_args(&self, dtype: u32, k: *mut c_void, v: *mut c_void) -> kvs_kv_write_args {
        kvs_kv_write_args {
            num_tokens: self.slots.len() as u32,
            key: self.key.as_ptr().cast(),
            value: self.value.as_ptr().cast(),
            src_dtype: F32,
            src_token_stride: 0,
            src_head_stride: 0,
            key_cache: k,
            value_cache: v,
            cache: self.layout(dtype),
            slot_mapping: self.slots.as_ptr().cast(),
            slot_mapping_type: 1,
        }
    }

    fn attn_args(
        &self,
        dtype: u32,
        k: *const c_void,
        v: *const c_void,
        out: &mut [f32],
    ) -> kvs_attention_args {
        kvs_attention_args {
            num_seqs: 2,
            num_tokens: 2,
            num_heads: self.h as u32,
            query: self.query.as_ptr().cast(),
            query_dtype: F32,
            query_token_stride: 0,
            query_head_stride: 0,
            output: out.as_mut_ptr().cast(),
            output_dtype: F32,
            output_token_stride: 0,
            output_head_stride: 0,
            key_cache: k,
            value_cache: v,
            cache: self.layout(dtype),
            block_table: self.table.as_ptr(),
            max_pages_per_seq: self.max_pages as u32,
            block_table_stride: 0,
            context_lens: self.ctx.as_ptr(),
            query_start_loc: std::ptr::null(),
            scale: 1.0 / (self.d as f32).sqrt(),
            softcap: 0.0,
            sliding_window: 0,
        }
    }
}

/// Writes the setup's K/V into caches of `dtype` with per-tensor scales `(k_scale, v_scale)`
/// and per-channel ones `channels` when given, checks every stored code against `code(value /
/// its scale)`, then checks the scaled attention on those pages against the plain one on an f32
/// cache of `value(code) * scale`.
fn round_trip(
    dtype: kvs_dtype,
    (k_scale, v_scale): (f32, f32),
    channels: Option<(&[f32], &[f32])>,
    offsets: Option<(&[f32], &[f32])>,
    code: impl Fn(f32) -> u8,
    value: impl Fn(u8) -> f32,
) {
    let s = setup();
    let dtype = dtype as u32;
    let elems = s.pages * s.ps * s.hk * s.d;
    let (mut kc, mut vc) = (vec![0u8; elems], vec![0u8; elems]);
    let scales = kvs_kv_scales {
        k_channel_offsets: offsets.map_or(std::ptr::null(), |o| o.0.as_ptr()),
        v_channel_offsets: offsets.map_or(std::ptr::null(), |o| o.1.as_ptr()),
        ..scales(k_scale, v_scale, channels)
    };
    let row = s.hk * s.d;
    let (kch, vch) = (channels.map(|c| c.0), channels.map(|c| c.1));
    let (koff, voff) = (offsets.map(|c| c.0), offsets.map(|c| c.1));
    let ch = |c: Option<&[f32]>, x: usize| c.map_or(1.0, |c| c[x]);
    let off = |c: Option<&[f32]>, x: usize| c.map_or(0.0, |c| c[x]);
    let be = new_backend(2);
    let w = s.write_args(dtype, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
    let st = unsafe { kvs_backend::kvs_kv_write_scaled(be, &w, &scales, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    // Every slot holds the code nearest value / scale - offset.
    for (t, &slot) in s.slots.iter().enumerate() {
        for x in 0..row {
            let at = slot as usize * row + x;
            let k = s.key[t * row + x] / (k_scale * ch(kch, x)) - off(koff, x);
            let v = s.value[t * row + x] / (v_scale * ch(vch, x)) - off(voff, x);
            assert_eq!(kc[at], code(k));
            assert_eq!(vc[at], code(v));
        }
    }
    // Attention on the quantized pages with the scales = attention on their values in f32.
    let dequant = |c: &[u8], sc: f32, chs: Option<&[f32]>, offs: Option<&[f32]>| -> Vec<f32> {
        c.iter()
            .enumerate()
            .map(|(e, &b)| (value(b) + off(offs, e % row)) * sc * ch(chs, e % row))
            .collect()
    };
    let k32 = dequant(&kc, k_scale, kch, koff);
    let v32 = dequant(&vc, v_scale, vch, voff);
    let mut out = vec![0f32; 2 * s.h * s.d];
    let mut want = vec![0f32; 2 * s.h * s.d];
    let a = s.attn_args(dtype, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
    let st =
        unsafe { kvs_backend::kvs_attention_launch_scaled(be, &a, &scales, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    let a = s.attn_args(F32, k32.as_ptr().cast(), v32.as_ptr().cast(), &mut want);
    let st = unsafe { kvs_backend::kvs_attention_launch(be, &a, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * w.abs() + 1e-6, "{i}: {g} vs {w}");
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

/// A `kvs_kv_scales` over the given per-tensor and per-channel scales.
fn scales(k_scale: f32, v_scale: f32, channels: Option<(&[f32], &[f32])>) -> kvs_kv_scales {
    kvs_kv_scales {
        k_scale,
        v_scale,
        k_channel_scales: channels.map_or(std::ptr::null(), |c| c.0.as_ptr()),
        v_channel_scales: channels.map_or(std::ptr::null(), |c| c.1.as_ptr()),
        k_channel_offsets: std::ptr::null(),
        v_channel_offsets: std::ptr::null(),
    }
}

fn fp8<T: Fp8>(dtype: kvs_dtype) {
    let code = |x: f32| T::from_f32(x).to_bits();
    round_trip(dtype, (0.01, 0.02), None, None, code, |b| {
        T::from_bits(b).to_f32()
    });
}

#[test]
fn fp8_e4m3_pages_written_and_read_with_scales() {
    fp8::<Fp8E4M3>(kvs_dtype::Fp8E4m3);
}

#[test]
fn fp8_e5m2_pages_written_and_read_with_scales() {
    fp8::<Fp8E5M2>(kvs_dtype::Fp8E5m2);
}

/// int8 with per-channel scales: values in [-1, 1), each channel's scale around `1 / 127`,
/// different per channel, with per-tensor scales of 0.5 and 2 on top.
#[test]
fn int8_pages_written_and_read_with_channel_scales() {
    let n = setup().hk * setup().d;
    let kch: Vec<f32> = (0..n)
        .map(|i| 2.0 / 127.0 * (1.0 + i as f32 / n as f32))
        .collect();
    let vch: Vec<f32> = (0..n)
        .map(|i| 0.5 / 127.0 * (2.0 - i as f32 / n as f32))
        .collect();
    let code = |x: f32| x.round_ties_even().clamp(-128.0, 127.0) as i8 as u8;
    let value = |b: u8| b as i8 as f32;
    round_trip(
        kvs_dtype::Int8,
        (0.5, 2.0),
        Some((&kch, &vch)),
        None,
        code,
        value,
    );
}

/// int8 with per-channel scales and offsets (CANN's `(code + offset) * scale`): offsets of up to
/// +-60 codes, K's and V's different, so a value near an end of the range still fits; the codes
/// are `round(value / scale - offset)` and attention reads `(code + offset) * scale`.
#[test]
fn int8_pages_written_and_read_with_channel_offsets() {
    let n = setup().hk * setup().d;
    let kch: Vec<f32> = (0..n)
        .map(|i| 2.0 / 127.0 * (1.0 + i as f32 / n as f32))
        .collect();
    let vch: Vec<f32> = (0..n)
        .map(|i| 0.5 / 127.0 * (2.0 - i as f32 / n as f32))
        .collect();
    let koff: Vec<f32> = (0..n).map(|i| (i * 7 % 121) as f32 - 60.0).collect();
    let voff: Vec<f32> = (0..n).map(|i| 60.0 - (i * 5 % 97) as f32 + 0.5).collect();
    let code = |x: f32| x.round_ties_even().clamp(-128.0, 127.0) as i8 as u8;
    let value = |b: u8| b as i8 as f32;
    round_trip(
        kvs_dtype::Int8,
        (0.5, 2.0),
        Some((&kch, &vch)),
        Some((&koff, &voff)),
        code,
        value,
    );
}

#[test]
fn bad_scales_and_quantized_queries_are_refused_with_nothing_written() {
    let s = setup();
    let fp8 = kvs_dtype::Fp8E4m3 as u32;
    let int8 = kvs_dtype::Int8 as u32;
    let elems = s.pages * s.ps * s.hk * s.d;
    let (mut kc, mut vc) = (vec![7u8; elems], vec![7u8; elems]);
    let n = s.hk * s.d;
    let ones = vec![1f32; n];
    let mut last_zero = ones.clone();
    last_zero[n - 1] = 0.0;
    let mut nan_last = ones.clone();
    nan_last[n - 1] = f32::NAN;
    let be = new_backend(1);
    for (dtype, sc, field) in [
        (fp8, scales(0.0, 1.0, None), "k_scale"),
        (fp8, scales(-1.0, 1.0, None), "k_scale"),
        (fp8, scales(f32::NAN, 1.0, None), "k_scale"),
        (fp8, scales(1.0, f32::INFINITY, None), "v_scale"),
        // Channel scales are for int8 caches only, and an int8 cache needs them, every one
        // finite and > 0, K's and V's both.
        (
            fp8,
            scales(1.0, 1.0, Some((&ones, &ones))),
            "k_channel_scales",
        ),
        (int8, scales(1.0, 1.0, None), "k_channel_scales"),
        (
            int8,
            scales(1.0, 1.0, Some((&ones, &last_zero))),
            "v_channel_scales",
        ),
        (
            int8,
            kvs_kv_scales {
                v_channel_scales: std::ptr::null(),
                ..scales(1.0, 1.0, Some((&ones, &ones)))
            },
            "v_channel_scales",
        ),
        // Offsets: only with channel scales, every one finite.
        (
            int8,
            kvs_kv_scales {
                k_channel_offsets: ones.as_ptr(),
                ..scales(1.0, 1.0, None)
            },
            "k_channel_offsets",
        ),
        (
            fp8,
            kvs_kv_scales {
                v_channel_offsets: ones.as_ptr(),
                ..scales(1.0, 1.0, None)
            },
            "v_channel_offsets",
        ),
        (
            int8,
            kvs_kv_scales {
                v_channel_offsets: nan_last.as_ptr(),
                ..scales(1.0, 1.0, Some((&ones, &ones)))
            },
            "v_channel_offsets",
        ),
    ] {
        let w = s.write_args(dtype, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
        let st = unsafe { kvs_backend::kvs_kv_write_scaled(be, &w, &sc, std::ptr::null_mut()) };
        assert_eq!(st, kvs_status::AttnInvalidArgument, "{field}");
        assert!(last_error().contains(field), "{field}: {}", last_error());
        let mut out = vec![5f32; 2 * s.h * s.d];
        let a = s.attn_args(dtype, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
        let st =
            unsafe { kvs_backend::kvs_attention_launch_scaled(be, &a, &sc, std::ptr::null_mut()) };
        assert_eq!(st, kvs_status::AttnInvalidArgument, "{field}");
        assert!(last_error().contains(field), "{field}: {}", last_error());
        assert!(out.iter().all(|&x| x == 5.0));
    }
    assert!(kc.iter().chain(&vc).all(|&b| b == 7));
    // A soft cap is applied to scores a K offset shifts, which the kernels drop: refused with
    // K offsets (V offsets alone are fine).
    let koffsets = kvs_kv_scales {
        k_channel_offsets: ones.as_ptr(),
        ..scales(1.0, 1.0, Some((&ones, &ones)))
    };
    let mut out = vec![5f32; 2 * s.h * s.d];
    let mut a = s.attn_args(int8, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
    a.softcap = 30.0;
    let st = unsafe {
        kvs_backend::kvs_attention_launch_scaled(be, &a, &koffsets, std::ptr::null_mut())
    };
    assert_eq!(st, kvs_status::Unsupported, "{}", last_error());
    assert!(last_error().contains("softcap"), "{}", last_error());
    assert!(out.iter().all(|&x| x == 5.0));
    let voffsets = kvs_kv_scales {
        v_channel_offsets: ones.as_ptr(),
        ..scales(1.0, 1.0, Some((&ones, &ones)))
    };
    let st = unsafe {
        kvs_backend::kvs_attention_launch_scaled(be, &a, &voffsets, std::ptr::null_mut())
    };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    // A quantized query (or output, or new K/V) is a KV-cache format only.
    for dtype in [fp8, int8] {
        let mut out = vec![5f32; 2 * s.h * s.d];
        let mut a = s.attn_args(fp8, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
        a.query_dtype = dtype;
        let st = unsafe { kvs_backend::kvs_attention_launch(be, &a, std::ptr::null_mut()) };
        assert_eq!(st, kvs_status::AttnInvalidArgument);
        assert!(last_error().contains("query_dtype"), "{}", last_error());
        assert!(out.iter().all(|&x| x == 5.0));
        let mut w = s.write_args(fp8, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
        w.src_dtype = dtype;
        let st = unsafe { kvs_backend::kvs_kv_write(be, &w, std::ptr::null_mut()) };
        assert_eq!(st, kvs_status::AttnInvalidArgument);
        assert!(last_error().contains("src_dtype"), "{}", last_error());
    }
    assert!(kc.iter().chain(&vc).all(|&b| b == 7));
    unsafe { kvs_backend::kvs_backend_free(be) };
}

const PTH: u32 = kvs_dtype::Int8PerTokenHead as u32;

/// Bytes of the setup's caches of `dtype` (dense: a per-token-head row is `d + 4` bytes).
fn cache_bytes(s: &Setup, dtype: u32) -> usize {
    let l = s.layout(dtype);
    l.page_stride * s.pages
}

/// Writes the setup's K/V into int8 per-token-head caches with per-tensor scales 0.5 and 2,
/// returning the caches and the scales used.
fn per_token_head_pages(s: &Setup, be: *mut kvs_backend) -> (Vec<u8>, Vec<u8>, kvs_kv_scales) {
    let n = cache_bytes(s, PTH);
    let (mut kc, mut vc) = (vec![0u8; n], vec![0u8; n]);
    let sc = scales(0.5, 2.0, None);
    let w = s.write_args(PTH, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
    let st = unsafe { kvs_backend::kvs_kv_write_scaled(be, &w, &sc, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    (kc, vc, sc)
}

/// The scale stored after the `d` codes of the row at byte `at`.
fn row_scale(c: &[u8], at: usize, d: usize) -> f32 {
    f32::from_le_bytes(c[at + d..at + d + 4].try_into().unwrap())
}

/// int8 with a scale per (token, kv head) row (vLLM's `int8_per_token_head`), per-tensor scales
/// 0.5 and 2 on top: every row stores `max(max|x| / 127, 1e-6)` of its values divided by the
/// per-tensor scale after its codes, every code is `round(x / row scale)`, and the scaled
/// attention on those pages equals the plain one on an f32 cache of `code * row scale * scale`.
#[test]
fn int8_per_token_head_pages_written_and_read_with_row_scales() {
    let s = setup();
    let be = new_backend(2);
    let (kc, vc, sc) = per_token_head_pages(&s, be);
    let l = s.layout(PTH);
    let (d, hk) = (s.d, s.hk);
    let row = hk * d;
    let (mut k32, mut v32) = (
        vec![0f32; s.pages * s.ps * row],
        vec![0f32; s.pages * s.ps * row],
    );
    for (t, &slot) in s.slots.iter().enumerate() {
        for h in 0..hk {
            let at = (slot as usize / s.ps) * l.page_stride
                + (slot as usize % s.ps) * l.slot_stride
                + h * l.head_stride;
            for (c, src, tensor, dst) in [
                (&kc, &s.key, sc.k_scale, &mut k32),
                (&vc, &s.value, sc.v_scale, &mut v32),
            ] {
                let x: Vec<f32> = src[t * row + h * d..][..d]
                    .iter()
                    .map(|x| x / tensor)
                    .collect();
                let want = (x.iter().fold(0f32, |m, y| m.max(y.abs())) / 127.0).max(1e-6);
                let rs = row_scale(c, at, d);
                assert_eq!(rs, want, "token {t} head {h}");
                for i in 0..d {
                    let code = c[at + i] as i8;
                    assert_eq!(
                        code as f32,
                        (x[i] / rs).round_ties_even().clamp(-128.0, 127.0)
                    );
                    dst[slot as usize * row + h * d + i] = code as f32 * rs * tensor;
                }
            }
        }
    }
    let mut out = vec![0f32; 2 * s.h * s.d];
    let mut want = vec![0f32; 2 * s.h * s.d];
    let a = s.attn_args(PTH, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
    let st = unsafe { kvs_backend::kvs_attention_launch_scaled(be, &a, &sc, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    let a = s.attn_args(F32, k32.as_ptr().cast(), v32.as_ptr().cast(), &mut want);
    let st = unsafe { kvs_backend::kvs_attention_launch(be, &a, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * w.abs() + 1e-6, "{i}: {g} vs {w}");
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

/// Page copies move the rows' scales with their codes: every used page swapped out to the host
/// tier (the last page of each sequence as a sub-page copy of its filled slots), the device
/// caches overwritten, the pages swapped back in under other ids; attention on the new block
/// table equals attention before, bit for bit.
#[test]
fn int8_per_token_head_page_copies_carry_the_scales() {
    let s = setup();
    let be = new_backend(2);
    let (mut kc, mut vc, sc) = per_token_head_pages(&s, be);
    let mut before = vec![0f32; 2 * s.h * s.d];
    let a = s.attn_args(PTH, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut before);
    let st = unsafe { kvs_backend::kvs_attention_launch_scaled(be, &a, &sc, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    let n = cache_bytes(&s, PTH);
    let (mut hkc, mut hvc) = (vec![0u8; n], vec![0u8; n]);
    // (page, filled slots) of every used page, and its new id: the ids reversed.
    let mut used = Vec::new();
    for (q, &l) in s.ctx.iter().enumerate() {
        for j in 0..(l as usize).div_ceil(s.ps) {
            let filled = (l as usize - j * s.ps).min(s.ps) as u32;
            used.push((
                q * s.max_pages + j,
                s.table[q * s.max_pages + j] as u32,
                filled,
            ));
        }
    }
    let args = |kc: &mut [u8], vc: &mut [u8], hkc: &mut [u8], hvc: &mut [u8]| {
        kvshare::attn_args::kvs_kv_copy_args {
            key_cache: kc.as_mut_ptr().cast(),
            value_cache: vc.as_mut_ptr().cast(),
            cache: s.layout(PTH),
            host_key_cache: hkc.as_mut_ptr().cast(),
            host_value_cache: hvc.as_mut_ptr().cast(),
            num_host_pages: s.pages as u32,
        }
    };
    let copy = |kind, pairs: Vec<(u32, u32, u32)>, a: &kvshare::attn_args::kvs_kv_copy_args| {
        let list: Vec<kvshare::types::kvs_copy> = pairs
            .into_iter()
            .map(
                |(src_page, dst_page, num_tokens)| kvshare::types::kvs_copy {
                    src_page,
                    dst_page,
                    num_tokens,
                    kind: kind as u32,
                    group: 0,
                },
            )
            .collect();
        let st = unsafe {
            kvs_backend::kvs_kv_copy(be, a, list.as_ptr(), list.len(), std::ptr::null_mut())
        };
        assert_eq!(st, kvs_status::Ok, "{}", last_error());
    };
    let a = args(&mut kc, &mut vc, &mut hkc, &mut hvc);
    let out: Vec<_> = used.iter().map(|&(_, p, f)| (p, p, f)).collect();
    copy(kvshare::enums::kvs_copy_kind::DeviceToHost, out, &a);
    kc.fill(0x55);
    vc.fill(0x55);
    let last = s.pages as u32 - 1;
    let back: Vec<_> = used.iter().map(|&(_, p, f)| (p, last - p, f)).collect();
    copy(kvshare::enums::kvs_copy_kind::HostToDevice, back, &a);
    let mut table = s.table.clone();
    for &(at, p, _) in &used {
        table[at] = (last - p) as i32;
    }
    let mut after = vec![0f32; 2 * s.h * s.d];
    let mut a = s.attn_args(PTH, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut after);
    a.block_table = table.as_ptr();
    let st = unsafe { kvs_backend::kvs_attention_launch_scaled(be, &a, &sc, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    for (i, (x, y)) in before.iter().zip(&after).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{i}: {x} vs {y}");
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

/// Refusals of a per-token-head cache, each with nothing written: channel scales (the message
/// names both formats), a head stride that leaves no room for the row's scale (the int8
/// layout's `head_dim` bytes a row), and, with one kv head, a slot stride that leaves none.
#[test]
fn int8_per_token_head_refusals_write_nothing() {
    let s = setup();
    let be = new_backend(1);
    let n = cache_bytes(&s, PTH);
    let (mut kc, mut vc) = (vec![7u8; n], vec![7u8; n]);
    let ones = vec![1f32; s.hk * s.d];
    let channels = scales(1.0, 1.0, Some((&ones, &ones)));
    let plain = scales(1.0, 1.0, None);
    // The int8 layout's strides (`head_dim` a row) under the per-token-head dtype.
    let no_room = kvs_kv_layout {
        dtype: PTH,
        ..s.layout(kvs_dtype::Int8 as u32)
    };
    let mut one_head = s.layout(PTH);
    one_head.num_kv_heads = 1;
    one_head.slot_stride = s.d as _;
    for (sc, layout, field, also) in [
        (
            channels,
            s.layout(PTH),
            "k_channel_scales",
            "KVS_DTYPE_INT8_PER_TOKEN_HEAD",
        ),
        (plain, no_room, "cache_head_stride", "overlaps"),
        (plain, one_head, "cache_slot_stride", "overlaps"),
    ] {
        let mut w = s.write_args(PTH, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
        w.cache = layout;
        let st = unsafe { kvs_backend::kvs_kv_write_scaled(be, &w, &sc, std::ptr::null_mut()) };
        assert_eq!(st, kvs_status::AttnInvalidArgument, "{field}");
        let e = last_error();
        assert!(e.contains(field) && e.contains(also), "{field}: {e}");
        let mut out = vec![5f32; 2 * s.h * s.d];
        let mut a = s.attn_args(PTH, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
        a.cache = layout;
        let st =
            unsafe { kvs_backend::kvs_attention_launch_scaled(be, &a, &sc, std::ptr::null_mut()) };
        assert_eq!(st, kvs_status::AttnInvalidArgument, "{field}");
        assert!(last_error().contains(field), "{field}: {}", last_error());
        assert!(out.iter().all(|&x| x == 5.0));
    }
    assert!(kc.iter().chain(&vc).all(|&b| b == 7));
    // Channel scales refused with either message naming the int8 format too.
    let w = s.write_args(PTH, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
    let st = unsafe { kvs_backend::kvs_kv_write_scaled(be, &w, &channels, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::AttnInvalidArgument);
    assert!(last_error().contains("KVS_DTYPE_INT8 "), "{}", last_error());
    assert!(kc.iter().chain(&vc).all(|&b| b == 7));
    unsafe { kvs_backend::kvs_backend_free(be) };
}
