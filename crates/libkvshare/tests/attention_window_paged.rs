//! Sliding-window attention over a KV-cache group's paged KV: the block table of a
//! sliding-window group holds the null page at the positions the window left
//! (`kvs_seq_release_skipped(num_computed)`, vLLM's `remove_skipped_blocks`). The CPU backend,
//! launched with `sliding_window = W`, must give the f64 reference's output over the intact
//! table and read none of the released pages: they point at a page filled with NaN here, which
//! would poison any row that touched it. The released positions come from the cache itself
//! (`window_released`), so this also checks that the cache's window and the kernel's window are
//! the same window.

// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use kvshare::backend::kvs_backend;
use kvshare::enums::kvs_status;
use support::attention::*;

fn check_released(c: &Case) -> usize {
    let mut b = build(c);
    let want = b.reference();
    let ps = c.page_size;
    let q_lens = c.q.clone().unwrap_or_else(|| vec![1; c.ctx.len()]);
    let used: Vec<i32> = b.block_table.clone();
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
    let mut released = 0;
    for (s, (&ctx, &q)) in c.ctx.iter().zip(&q_lens).enumerate() {
        for j in window_released(c.window as u32, ps as u32, ctx, ctx - q) {
            b.block_table[s * b.bt_stride + j] = null;
            released += 1;
        }
    }
    let be = new_backend(2);
    let args = b.args();
    // SAFETY: `be` is a live backend from `new_backend`, freed right after; `args` points at
    // buffers the case built for exactly these shapes.
    let st = unsafe { kvs_backend::kvs_attention_launch(be, &args, std::ptr::null_mut()) };
    unsafe { kvs_backend::kvs_backend_free(be) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    b.assert_output(
        &want,
        &format!("dtype {} ps {} window {}", c.dtype, ps, c.window),
    );
    released
}

#[test]
fn decode_and_chunked_prefill_never_read_released_pages() {
    let mut total = 0;
    for dtype in [F32, F16, BF16] {
        for (ps, window) in [(16, 128), (16, 33), (16, 17), (128, 128), (16, 1)] {
            // Decode rows: contexts across the window edge.
            let mut c = Case::decode(dtype, 2, 64, ps, vec![window + 1, 3 * window + 5, 7, 330]);
            c.window = window;
            total += check_released(&c);
            // Chunked prefill: several query tokens per sequence, the first one's window
            // decides what was released.
            c.q = Some(vec![(window + 1).min(5), (3 * window + 5).min(40), 7, 130]);
            total += check_released(&c);
        }
    }
    assert!(total > 100, "the cases release pages ({total})");
}
