//! fp8 caches through the C exports: `kvs_kv_write_scaled` stores each new value as the code
//! nearest `value / scale`, `kvs_attention_launch_scaled` on those pages gives what
//! `kvs_attention_launch` gives on an f32 cache holding the codes' values times the scales (the
//! kernel's accuracy against the f64 reference is `kvshare-attention`'s `cpu/quant_tests.rs`),
//! and bad scales or an fp8 query are refused with nothing written.

// The `unsafe` blocks of these tests call the C ABI with buffers the test owns, sized as each
// call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use std::ffi::c_void;

use kvshare::attn_args::{kvs_attention_args, kvs_kv_layout, kvs_kv_write_args};
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

fn round_trip<T: Fp8>(dtype: kvs_dtype) {
    let s = setup();
    let dtype = dtype as u32;
    let (k_scale, v_scale) = (0.01f32, 0.02f32);
    let elems = s.pages * s.ps * s.hk * s.d;
    let (mut kc, mut vc) = (vec![0u8; elems], vec![0u8; elems]);
    let be = new_backend(2);
    let w = s.write_args(dtype, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
    let st =
        unsafe { kvs_backend::kvs_kv_write_scaled(be, &w, k_scale, v_scale, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    // Every slot holds the code nearest value / scale.
    let row = s.hk * s.d;
    for (t, &slot) in s.slots.iter().enumerate() {
        for x in 0..row {
            let at = slot as usize * row + x;
            assert_eq!(kc[at], T::from_f32(s.key[t * row + x] / k_scale).to_bits());
            assert_eq!(
                vc[at],
                T::from_f32(s.value[t * row + x] / v_scale).to_bits()
            );
        }
    }
    // Attention on the fp8 pages with the scales = attention on their values in f32.
    let dequant = |c: &[u8], sc: f32| -> Vec<f32> {
        c.iter().map(|&b| T::from_bits(b).to_f32() * sc).collect()
    };
    let (k32, v32) = (dequant(&kc, k_scale), dequant(&vc, v_scale));
    let mut out = vec![0f32; 2 * s.h * s.d];
    let mut want = vec![0f32; 2 * s.h * s.d];
    let a = s.attn_args(dtype, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
    let st = unsafe {
        kvs_backend::kvs_attention_launch_scaled(be, &a, k_scale, v_scale, std::ptr::null_mut())
    };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    let a = s.attn_args(F32, k32.as_ptr().cast(), v32.as_ptr().cast(), &mut want);
    let st = unsafe { kvs_backend::kvs_attention_launch(be, &a, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * w.abs() + 1e-6, "{i}: {g} vs {w}");
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

#[test]
fn fp8_e4m3_pages_written_and_read_with_scales() {
    round_trip::<Fp8E4M3>(kvs_dtype::Fp8E4m3);
}

#[test]
fn fp8_e5m2_pages_written_and_read_with_scales() {
    round_trip::<Fp8E5M2>(kvs_dtype::Fp8E5m2);
}

#[test]
fn bad_scales_and_fp8_queries_are_refused_with_nothing_written() {
    let s = setup();
    let dtype = kvs_dtype::Fp8E4m3 as u32;
    let elems = s.pages * s.ps * s.hk * s.d;
    let (mut kc, mut vc) = (vec![7u8; elems], vec![7u8; elems]);
    let be = new_backend(1);
    for (k_scale, v_scale, field) in [
        (0.0, 1.0, "k_scale"),
        (-1.0, 1.0, "k_scale"),
        (f32::NAN, 1.0, "k_scale"),
        (1.0, f32::INFINITY, "v_scale"),
    ] {
        let w = s.write_args(dtype, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
        let st = unsafe {
            kvs_backend::kvs_kv_write_scaled(be, &w, k_scale, v_scale, std::ptr::null_mut())
        };
        assert_eq!(st, kvs_status::AttnInvalidArgument);
        assert!(last_error().contains(field), "{}", last_error());
        let mut out = vec![5f32; 2 * s.h * s.d];
        let a = s.attn_args(dtype, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
        let st = unsafe {
            kvs_backend::kvs_attention_launch_scaled(be, &a, k_scale, v_scale, std::ptr::null_mut())
        };
        assert_eq!(st, kvs_status::AttnInvalidArgument);
        assert!(last_error().contains(field), "{}", last_error());
        assert!(out.iter().all(|&x| x == 5.0));
    }
    assert!(kc.iter().chain(&vc).all(|&b| b == 7));
    // An fp8 query (or output, or new K/V) is a KV-cache format only.
    let mut out = vec![5f32; 2 * s.h * s.d];
    let mut a = s.attn_args(dtype, kc.as_ptr().cast(), vc.as_ptr().cast(), &mut out);
    a.query_dtype = dtype;
    let st = unsafe { kvs_backend::kvs_attention_launch(be, &a, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::AttnInvalidArgument);
    assert!(last_error().contains("query_dtype"), "{}", last_error());
    assert!(out.iter().all(|&x| x == 5.0));
    let mut w = s.write_args(dtype, kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast());
    w.src_dtype = dtype;
    let st = unsafe { kvs_backend::kvs_kv_write(be, &w, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::AttnInvalidArgument);
    assert!(last_error().contains("src_dtype"), "{}", last_error());
    assert!(kc.iter().chain(&vc).all(|&b| b == 7));
    unsafe { kvs_backend::kvs_backend_free(be) };
}
