//! K and V caches that interleave in one buffer without sharing an element (vLLM 0.32's CPU
//! cache `[num_blocks, num_kv_heads, 2 * block_size, head_dim]`: each block and head's K rows,
//! then its V rows): `kvs_kv_write` stores into them exactly what it stores into two separate
//! caches, and `kvs_attention_launch` reads them back to the same output.

// The `unsafe` blocks call the C ABI with buffers the test owns, sized as each call documents.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use kvshare::attn_args::{kvs_attention_args, kvs_kv_layout, kvs_kv_write_args};
use kvshare::backend::kvs_backend;
use kvshare::enums::kvs_status;
use proptest::prelude::*;
use support::attention::*;

/// One case: `pages` pages of `ps` slots, `hk` kv heads (`group` query heads each) of `d`
/// elements, `dtype`; `tokens` new tokens written at distinct slots.
#[derive(Debug, Clone)]
struct Fused {
    dtype: u32,
    pages: usize,
    ps: usize,
    hk: usize,
    group: usize,
    d: usize,
    seed: u64,
}

/// Writes the same tokens into split dense caches and into one fused buffer; returns both
/// (split K, split V, fused) after checking each call's status.
fn run(c: &Fused) {
    let (pages, ps, hk, d) = (c.pages, c.ps, c.hk, c.d);
    let mut rng = Rng(c.seed);
    let n = pages * ps * hk * d;
    // Every slot once, in a random order: the sequence below is those slots' positions.
    let mut slots: Vec<i64> = (0..(pages * ps) as i64).collect();
    rng.shuffle(&mut slots);
    let t = slots.len();
    let key = Data::random(c.dtype, t * hk * d, &mut rng);
    let value = Data::random(c.dtype, t * hk * d, &mut rng);
    let mut kc = Data::filled(c.dtype, n, 0.0);
    let mut vc = Data::filled(c.dtype, n, 0.0);
    let mut fused = Data::filled(c.dtype, 2 * n, 0.0);
    let dense =
        kvs_backend::kvs_kv_layout_dense(c.dtype, pages as u32, ps as u32, hk as u32, d as u32);
    let fused_layout = kvs_kv_layout {
        page_stride: hk * 2 * ps * d,
        slot_stride: d,
        head_stride: 2 * ps * d,
        ..dense
    };
    let be = new_backend(1);
    let write = |k: *mut std::ffi::c_void, v: *mut std::ffi::c_void, cache: kvs_kv_layout| {
        let a = kvs_kv_write_args {
            num_tokens: t as u32,
            key: key.ptr(),
            value: value.ptr(),
            src_dtype: c.dtype,
            src_token_stride: 0,
            src_head_stride: 0,
            key_cache: k,
            value_cache: v,
            cache,
            slot_mapping: slots.as_ptr().cast(),
            slot_mapping_type: 1,
        };
        let st = unsafe { kvs_backend::kvs_kv_write(be, &a, std::ptr::null_mut()) };
        assert_eq!(st, kvs_status::Ok, "{}", last_error());
    };
    write(kc.ptr_mut(), vc.ptr_mut(), dense);
    let fk = fused.ptr_mut();
    let fv = unsafe { fk.cast::<u8>().add(ps * d * elem_size(c.dtype)) }.cast();
    write(fk, fv, fused_layout);
    // Every element of both halves, where the fused layout puts it.
    for p in 0..pages {
        for s in 0..ps {
            for h in 0..hk {
                for e in 0..d {
                    let split = ((p * ps + s) * hk + h) * d + e;
                    let at = p * hk * 2 * ps * d + h * 2 * ps * d + s * d + e;
                    assert_eq!(fused.get(at), kc.get(split), "K {p} {s} {h} {e}");
                    assert_eq!(fused.get(at + ps * d), vc.get(split), "V {p} {s} {h} {e}");
                }
            }
        }
    }
    // One sequence over every page (the table in slot order), all its tokens as the query.
    let h = hk * c.group;
    let q = Data::random(c.dtype, t * h * d, &mut rng);
    let table: Vec<i32> = (0..pages as i32).collect();
    let ctx = [t as i32];
    let starts = [0, t as i32];
    let attend = |k: *const std::ffi::c_void, v, cache, out: &mut Data| {
        let a = kvs_attention_args {
            num_seqs: 1,
            num_tokens: t as u32,
            num_heads: h as u32,
            query: q.ptr(),
            query_dtype: c.dtype,
            query_token_stride: 0,
            query_head_stride: 0,
            output: out.ptr_mut(),
            output_dtype: F32,
            output_token_stride: 0,
            output_head_stride: 0,
            key_cache: k,
            value_cache: v,
            cache,
            block_table: table.as_ptr(),
            max_pages_per_seq: pages as u32,
            block_table_stride: 0,
            context_lens: ctx.as_ptr(),
            query_start_loc: starts.as_ptr(),
            scale: 0.3,
            softcap: 0.0,
            sliding_window: 0,
        };
        let st = unsafe { kvs_backend::kvs_attention_launch(be, &a, std::ptr::null_mut()) };
        assert_eq!(st, kvs_status::Ok, "{}", last_error());
    };
    let mut want = Data::filled(F32, t * h * d, 0.0);
    let mut got = Data::filled(F32, t * h * d, 0.0);
    attend(kc.ptr(), vc.ptr(), dense, &mut want);
    attend(fk.cast_const(), fv.cast_const(), fused_layout, &mut got);
    for i in 0..want.len() {
        let (w, g) = (want.get(i), got.get(i));
        assert!(
            (w - g).abs() <= 1e-5 * (1.0 + w.abs()),
            "output {i}: {g} != {w}"
        );
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

fn elem_size(dtype: u32) -> usize {
    if dtype == F32 {
        4
    } else {
        2
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn fused_caches_hold_and_attend_as_split_ones(
        dtype in prop_oneof![Just(F32), Just(F16), Just(BF16)],
        pages in 1usize..4,
        ps in 1usize..6,
        hk in 1usize..3,
        group in 1usize..3,
        d in prop_oneof![Just(4usize), Just(8), Just(16)],
        seed in any::<u64>(),
    ) {
        run(&Fused { dtype, pages, ps, hk, group, d, seed });
    }
}
