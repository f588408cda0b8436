//! Sliding-window attention on the Ascend backend, against the emulated CANN runtime
//! (`tests/cann_emu`), whose FIA implements the documented semantics on its own: the band of
//! `sparseMode` 4 between `preTokens` and `nextTokens` from the bottom-right corner, the
//! incremental branch (`Q_S == 1`) ignoring `sparseMode` / `preTokens` / `nextTokens` and taking an
//! explicit `(B, 1, 1, KV_S)` mask instead, TND refusing any sparse mode but 0 and 3.
//!
//! Each case is a sliding-window group's table as the cache leaves it: the pages the window
//! left (`window_released`: the cache's `kvs_seq_release_skipped`, vLLM's
//! `remove_skipped_blocks`) point at a page filled with NaN, so a launch that reads a released
//! position poisons its row. The output must equal the f64 reference over the intact table and
//! the CPU backend over the released one: decode, prefill, chunked prefill, windows 1 / 17 /
//! 128, GQA and MQA, fp16 and bf16, page 128 (and 16 for decode). Not run on Ascend hardware.

// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use kvshare::backend::kvs_backend;
use kvshare::enums::kvs_status;
use support::attention::{build, new_backend, window_released, Built, Case, Data, BF16, F16};
use support::cann_emu::*;

/// Points every released page of `b`'s table at a spare page filled with NaN; returns how many
/// table entries were released.
fn release(b: &mut Built) -> usize {
    let c = b.c.clone();
    let ps = c.page_size;
    let used = b.block_table.clone();
    let null = (0..b.layout.num_pages as i32)
        .find(|p| !used.contains(p))
        .expect("build leaves spare pages");
    for slot in 0..ps {
        for kh in 0..c.num_kv_heads {
            let off = b.cache_off(null as usize, slot, kh);
            for x in 0..c.head_dim {
                b.k.set(off + x, f64::NAN);
                b.v.set(off + x, f64::NAN);
            }
        }
    }
    let q_lens = c.q.clone().unwrap_or_else(|| vec![1; c.ctx.len()]);
    let mut released = 0;
    for (s, (&ctx, &q)) in c.ctx.iter().zip(&q_lens).enumerate() {
        for j in window_released(c.window as u32, ps as u32, ctx, ctx - q) {
            b.block_table[s * b.bt_stride + j] = null;
            released += 1;
        }
    }
    released
}

/// The CPU backend's output over `b` as it is (released table included).
fn cpu_output(b: &Built) -> Data {
    let cpu = new_backend(1);
    let mut out = b.out.clone();
    let a = b.args_over(
        b.query.ptr(),
        out.ptr_mut(),
        b.k.ptr(),
        b.v.ptr(),
        b.block_table.as_ptr(),
    );
    // SAFETY: a live CPU backend; `a` points at this case's host buffers.
    let st = unsafe { kvs_backend::kvs_attention_launch(cpu, &a, std::ptr::null_mut()) };
    unsafe { kvs_backend::kvs_backend_free(cpu) };
    assert_eq!(st, kvs_status::Ok, "{}", support::attention::last_error());
    out
}

/// Runs `c` (window > 0) on the emulator and checks it; returns (released entries, FIA calls).
fn check(emu: &Emu, c: &Case) -> (usize, i64) {
    emu.init_thread(0);
    let mut b = build(c);
    let want = b.reference();
    let released = release(&mut b);
    let cpu = cpu_output(&b);
    let be = backend(emu);
    let stream = emu.stream();
    let dev = upload(emu, &b);
    let fia0 = emu.calls("aclnnFusedInferAttentionScoreV3GetWorkspaceSize");
    let st = launch(be, &b, &dev, stream);
    assert_eq!(st, kvs_status::Ok, "{}", support::attention::last_error());
    emu.sync(stream);
    let what = format!(
        "dtype {} ps {} window {} ctx {:?} q {:?} group {} kv_heads {}",
        c.dtype, c.page_size, c.window, c.ctx, c.q, c.group, c.num_kv_heads
    );
    assert_eq!(
        emu.faults(),
        0,
        "{what}: emulator fault: {}",
        emu.last_fault()
    );
    b.out = data_from(c.dtype, &dev.out.read());
    b.assert_output(&want, &format!("{what} (ascend vs f64 reference)"));
    let mut cb = build(c);
    cb.out = cpu;
    cb.assert_output(&want, &format!("{what} (cpu vs f64 reference)"));
    let fia = emu.calls("aclnnFusedInferAttentionScoreV3GetWorkspaceSize") - fia0;
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
    assert_eq!(emu.live_objects(), 0, "{what}: CANN objects leaked");
    (released, fia)
}

fn case(dtype: u32, group: usize, kv_heads: usize, ps: usize, ctx: Vec<usize>) -> Case {
    Case {
        num_kv_heads: kv_heads,
        seed: 11,
        ..Case::decode(dtype, group, 128, ps, ctx)
    }
}

#[test]
fn decode_window_masks_the_released_pages() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut released = 0;
    for (dtype, ps) in [(F16, 128), (BF16, 128), (F16, 16)] {
        for window in [1, 17, 128] {
            let ctx = vec![window + 1, 3 * window + 5, 7, 330, window];
            let mut c = case(dtype, 4, 2, ps, ctx.clone());
            c.window = window;
            let (r, fia) = check(emu, &c);
            released += r;
            assert_eq!(fia, ctx.len() as i64, "one launch per windowed decode row");
        }
    }
    assert!(released > 20, "the cases release pages ({released})");
}

#[test]
fn prefill_and_chunked_prefill_use_the_band() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut released = 0;
    for dtype in [F16, BF16] {
        for window in [1, 17, 128] {
            // Full prefill, chunked prefill across the window edge, a decode row, an empty row.
            let mut c = case(dtype, 4, 2, 128, vec![200, 3 * window + 300, 400, 9]);
            c.window = window;
            c.q = Some(vec![200, 40, 1, 0]);
            let (r, fia) = check(emu, &c);
            released += r;
            assert_eq!(fia, 3, "one launch per sequence with query tokens");
            // MQA (8 query heads on one KV head), bf16 head_dim 128: the shape TND would take
            // without a window.
            let mut c = case(dtype, 8, 1, 128, vec![window + 2, 300]);
            c.window = window;
            c.q = Some(vec![2, 170]);
            released += check(emu, &c).0;
        }
    }
    assert!(released > 10, "the cases release pages ({released})");
}

#[test]
fn window_wider_than_every_context_is_full_attention() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut c = case(F16, 2, 2, 128, vec![50, 129]);
    c.window = 4096;
    assert_eq!(check(emu, &c).0, 0);
    c.q = Some(vec![50, 3]);
    assert_eq!(check(emu, &c).0, 0);
}

#[test]
fn heads_major_cache_with_a_window_is_refused_before_cann() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    let mut c = case(BF16, 2, 2, 128, vec![300]);
    c.window = 17;
    c.heads_major = true;
    let b = build(&c);
    let be = backend(emu);
    let stream = emu.stream();
    let dev = upload(emu, &b);
    let tensors = emu.calls("aclCreateTensor");
    assert_eq!(launch(be, &b, &dev, stream), kvs_status::Unsupported);
    assert!(support::attention::last_error().contains("BnNBsD"));
    assert_eq!(emu.calls("aclCreateTensor"), tensors);
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
}
