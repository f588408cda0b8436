//! The Ascend backend on int8 caches (per-channel scales, optional offsets) against the emulated
//! CANN (`tests/cann_emu`): `kvs_attention_launch_scaled` passes the scales as FIA's
//! `keyAntiquantScale`/`valueAntiquantScale` (+ offsets), the emulator's kernel dequantizes
//! `scale * (code + offset)` in f64, and the output is compared with the CPU backend's on the
//! same cache bytes. The refusals (missing scales, fp8 caches, the quantizing write) launch
//! nothing and leave the output unwritten; the emulator's live objects and device allocations
//! go back to where they were once the backend is freed.
//!
//! Tolerance: the standard one of tests/ascend.rs (f16 `2e-3`, bf16 `2e-2` relative, plus a
//! tenth of it absolute). The device gets each scale times its per-tensor scale, and each
//! offset, rounded once to the query's dtype (FIA's per-channel antiquant tensors have the
//! query's dtype); the cases use scales and offsets that dtype holds exactly (a few mantissa
//! bits, per-tensor scales that are powers of two), so the two backends dequantize to the same
//! values and differ only by their accumulation.

// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use std::ffi::c_void;

use kvshare::attn_args::kvs_kv_scales;
use kvshare::backend::kvs_backend;
use kvshare::enums::kvs_status;
use support::ascend::{assert_close, cpu_output_scaled, decode, expect_status, last_error};
use support::attention::{build, Built, Case, Rng, BF16, F16};
use support::cann_emu::*;

const INT8: u32 = 5;
const FP8_E4M3: u32 = 3;

/// An int8 version of a built case: random codes for K and V, per-channel scales (and
/// offsets) exact in bf16, per-tensor scales `k_scale`, `v_scale`.
struct Quant {
    b: Built,
    k: Vec<i8>,
    v: Vec<i8>,
    ks: Vec<f32>,
    vs: Vec<f32>,
    ko: Vec<f32>,
    vo: Vec<f32>,
    offsets: bool,
    k_scale: f32,
    v_scale: f32,
}

impl Quant {
    fn new(c: &Case, offsets: bool) -> Quant {
        let mut b = build(c);
        b.layout.dtype = INT8;
        let mut rng = Rng(c.seed ^ 0x9e37);
        let n = b.k.len();
        let mut codes = |n: usize| -> Vec<i8> {
            (0..n)
                .map(|_| (rng.below(256) as i32 - 128) as i8)
                .collect()
        };
        let (k, v) = (codes(n), codes(n));
        let ch = c.num_kv_heads * c.head_dim;
        // (1 + m/8) * 2^-e: four significant bits, exact in bf16 and f16; channels differ so a
        // scale applied to the wrong channel (or K's to V) shows.
        let scale =
            |rng: &mut Rng| (1.0 + rng.below(8) as f32 / 8.0) / (1 << (6 + rng.below(3))) as f32;
        let ks = (0..ch).map(|_| scale(&mut rng)).collect();
        let vs = (0..ch).map(|_| scale(&mut rng)).collect();
        let off = |rng: &mut Rng| (rng.below(129) as f32 - 64.0) / 2.0; // halves in -32..=32
        let ko = (0..ch).map(|_| off(&mut rng)).collect();
        let vo = (0..ch).map(|_| off(&mut rng)).collect();
        Quant {
            b,
            k,
            v,
            ks,
            vs,
            ko,
            vo,
            offsets,
            k_scale: 0.5,
            v_scale: 2.0,
        }
    }

    fn scales(&self) -> kvs_kv_scales {
        let opt = |o: &Vec<f32>| {
            if self.offsets {
                o.as_ptr()
            } else {
                std::ptr::null()
            }
        };
        kvs_kv_scales {
            k_scale: self.k_scale,
            v_scale: self.v_scale,
            k_channel_scales: self.ks.as_ptr(),
            v_channel_scales: self.vs.as_ptr(),
            k_channel_offsets: opt(&self.ko),
            v_channel_offsets: opt(&self.vo),
        }
    }
}

struct QDev<'e> {
    q: DevBuf<'e>,
    out: DevBuf<'e>,
    k: DevBuf<'e>,
    v: DevBuf<'e>,
    bt: DevBuf<'e>,
}

fn upload_q<'e>(emu: &'e Emu, q: &Quant) -> QDev<'e> {
    QDev {
        q: emu.upload(&data_bytes(&q.b.query)),
        out: emu.upload(&data_bytes(&q.b.out)),
        k: emu.upload(&bytes(&q.k)),
        v: emu.upload(&bytes(&q.v)),
        bt: emu.upload(&bytes(&q.b.block_table)),
    }
}

fn launch_q(
    be: *mut kvs_backend,
    q: &Quant,
    d: &QDev<'_>,
    sc: *const kvs_kv_scales,
    stream: *mut c_void,
) -> kvs_status {
    let a =
        q.b.args_over(d.q.ptr, d.out.ptr, d.k.ptr, d.v.ptr, d.bt.ptr.cast());
    unsafe { kvs_backend::kvs_attention_launch_scaled(be, &a, sc, stream) }
}

fn fia_calls(emu: &Emu) -> i64 {
    [2, 3, 4]
        .iter()
        .map(|v| {
            emu.calls(&format!(
                "aclnnFusedInferAttentionScoreV{v}GetWorkspaceSize"
            ))
        })
        .sum()
}

/// Runs an int8 case on the emulator and the CPU, compares, and checks that nothing leaked.
/// Returns the FIA launches.
fn check_quant(emu: &Emu, c: &Case, offsets: bool) -> i64 {
    emu.init_thread(0);
    let q = Quant::new(c, offsets);
    let sc = q.scales();
    let want = cpu_output_scaled(&q.b, q.k.as_ptr().cast(), q.v.as_ptr().cast(), &sc);
    let allocs = emu.counter("live_device_allocs");
    let be = backend(emu);
    let stream = emu.stream();
    let dev = upload_q(emu, &q);
    let fia0 = fia_calls(emu);
    assert_eq!(
        launch_q(be, &q, &dev, &sc, stream),
        kvs_status::Ok,
        "{}",
        last_error()
    );
    // The same scales again reuse the device copy made by the first launch.
    let sets = emu.counter("live_device_allocs");
    assert_eq!(
        launch_q(be, &q, &dev, &sc, stream),
        kvs_status::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        emu.counter("live_device_allocs"),
        sets,
        "scales copied twice"
    );
    let fia = (fia_calls(emu) - fia0) / 2;
    emu.sync(stream);
    let got = data_from(c.dtype, &dev.out.read());
    assert_close(c.dtype, &got, &want, "int8 attention");
    assert_eq!(emu.live_objects(), 0, "CANN objects leaked");
    assert_eq!(emu.faults(), 0, "emulator fault: {}", emu.last_fault());
    drop(dev);
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
    assert_eq!(
        emu.counter("live_device_allocs"),
        allocs,
        "device memory leaked"
    );
    fia
}

#[test]
fn int8_decode_per_channel_f16_and_bf16() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    for offsets in [false, true] {
        let n = check_quant(emu, &decode(F16, 4, 64, 128, vec![5, 130, 257]), offsets);
        assert_eq!(n, 1, "decode is one launch");
        let mut c = decode(BF16, 2, 128, 32, vec![1, 40, 97]);
        c.num_kv_heads = 1;
        check_quant(emu, &c, offsets);
    }
}

#[test]
fn int8_decode_heads_major_strided_and_windowed() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut c = decode(BF16, 2, 128, 128, vec![129, 7]);
    c.heads_major = true; // BnNBsD cache: BNSD query, (1, N, 1, D) antiquant tensors
    check_quant(emu, &c, true);
    let mut c = decode(F16, 2, 64, 64, vec![100, 3]);
    c.pad = 16;
    check_quant(emu, &c, false);
    let mut c = decode(F16, 2, 64, 64, vec![100, 3, 70]);
    c.window = 33; // per-sequence launches with decode masks
    assert_eq!(check_quant(emu, &c, true), 3);
}

#[test]
fn int8_prefill_runs_one_decode_launch_per_query_token() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut c = decode(F16, 4, 64, 32, vec![6, 70, 1, 40]);
    c.q = Some(vec![6, 5, 1, 0]); // full prefill, chunked prefill, decode row, empty
    assert_eq!(check_quant(emu, &c, true), 12);
    let mut c = decode(BF16, 2, 128, 128, vec![9, 150]);
    c.q = Some(vec![3, 4]);
    c.window = 5;
    assert_eq!(check_quant(emu, &c, false), 7);
}

#[test]
fn quantized_refusals_launch_nothing() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    let allocs = emu.counter("live_device_allocs");
    let be = backend(emu);
    let stream = emu.stream();
    let ws = fia_calls(emu);
    let tensors = emu.calls("aclCreateTensor");
    let q = Quant::new(&decode(F16, 2, 64, 128, vec![20, 3]), true);
    let dev = upload_q(emu, &q);
    let before = dev.out.read();
    // No channel scales for an int8 cache: the shared check names the field.
    let mut sc = q.scales();
    sc.k_channel_scales = std::ptr::null();
    sc.v_channel_scales = std::ptr::null();
    sc.k_channel_offsets = std::ptr::null();
    sc.v_channel_offsets = std::ptr::null();
    expect_status(
        launch_q(be, &q, &dev, &sc, stream),
        kvs_status::AttnInvalidArgument,
        "k_channel_scales",
    );
    let mut sc = q.scales();
    sc.v_channel_scales = std::ptr::null();
    expect_status(
        launch_q(be, &q, &dev, &sc, stream),
        kvs_status::AttnInvalidArgument,
        "v_channel_scales",
    );
    // Unscaled launch of an int8 cache.
    let a = q.b.args_over(
        dev.q.ptr,
        dev.out.ptr,
        dev.k.ptr,
        dev.v.ptr,
        dev.bt.ptr.cast(),
    );
    expect_status(
        unsafe { kvs_backend::kvs_attention_launch(be, &a, stream) },
        kvs_status::AttnInvalidArgument,
        "k_channel_scales",
    );
    // int8 pages must be 32-aligned for CANN's paged decode.
    let q16 = Quant::new(&decode(F16, 2, 64, 16, vec![20]), false);
    let dev16 = upload_q(emu, &q16);
    expect_status(
        launch_q(be, &q16, &dev16, &q16.scales(), stream),
        kvs_status::Unsupported,
        "multiple of 32",
    );
    // fp8 caches: CANN's FIA on Atlas A2/A3 takes no fp8 K/V.
    let mut f = Quant::new(&decode(F16, 2, 64, 128, vec![20]), false);
    f.b.layout.dtype = FP8_E4M3;
    let sf = kvs_kv_scales {
        k_scale: 0.5,
        v_scale: 1.0,
        k_channel_scales: std::ptr::null(),
        v_channel_scales: std::ptr::null(),
        k_channel_offsets: std::ptr::null(),
        v_channel_offsets: std::ptr::null(),
    };
    let devf = upload_q(emu, &f);
    expect_status(
        launch_q(be, &f, &devf, &sf, stream),
        kvs_status::Unsupported,
        "no fp8 K/V",
    );
    // Per-tensor scales on an fp16 cache stay refused.
    let c = decode(F16, 2, 64, 128, vec![20]);
    let b = build(&c);
    let d = upload(emu, &b);
    let a = b.args_over(d.q.ptr, d.out.ptr, d.k.ptr, d.v.ptr, d.bt.ptr.cast());
    expect_status(
        unsafe { kvs_backend::kvs_attention_launch_scaled(be, &a, &sf, stream) },
        kvs_status::Unsupported,
        "k_scale",
    );
    assert_eq!(fia_calls(emu), ws, "a refused call reached FIA");
    assert_eq!(emu.calls("aclCreateTensor"), tensors);
    assert_eq!(emu.counter("pending_tasks"), 0);
    assert_eq!(dev.out.read(), before, "a refused call wrote the output");
    drop((dev, dev16, devf, d));
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
    assert_eq!(emu.counter("live_device_allocs"), allocs);
}

#[test]
fn quantizing_kv_write_is_refused_naming_the_engines_op() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    let be = backend(emu);
    let stream = emu.stream();
    let w = support::ascend::WriteCase::new(F16, 4);
    let d = w.upload(emu);
    let (ks, vs) = (vec![0.25f32; 64], vec![0.5f32; 64]);
    let sc = kvs_kv_scales {
        k_scale: 1.0,
        v_scale: 1.0,
        k_channel_scales: ks.as_ptr(),
        v_channel_scales: vs.as_ptr(),
        k_channel_offsets: std::ptr::null(),
        v_channel_offsets: std::ptr::null(),
    };
    let mut a = w.args(d[0].ptr, d[1].ptr, d[2].ptr, d[3].ptr, d[4].ptr, 0);
    a.cache.dtype = INT8;
    let before = (d[2].read(), d[3].read());
    let scatters = emu.calls("aclnnScatterPaKvCacheGetWorkspaceSize");
    expect_status(
        unsafe { kvs_backend::kvs_kv_write_scaled(be, &a, &sc, stream) },
        kvs_status::Unsupported,
        "npu_quantize",
    );
    assert_eq!(emu.calls("aclnnScatterPaKvCacheGetWorkspaceSize"), scatters);
    assert_eq!((d[2].read(), d[3].read()), before);
    drop(d);
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
}
