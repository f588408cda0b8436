//! The Ascend backend end to end against the emulated CANN runtime (`tests/cann_emu`, built
//! here): every launch goes through the C exports with device memory from the emulator's
//! `aclrtMalloc`, runs when the stream is synchronised, and is compared with the CPU backend on
//! the same inputs (two independent implementations: the emulator's C kernels and kvshare's CPU
//! kernels). Each test also checks that every CANN object kvshare created was destroyed and that
//! the emulator saw no fault (bad block id, workspace freed in flight, double destroy...).
//!
//! Tolerances (the CPU backend accumulates in f32, the emulator in f64, both round the output
//! once): f16 `2e-3`, bf16 `2e-2` relative (as in tests/attention.rs).

// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use std::ffi::c_void;

use kvshare::attn_args::{kvs_attention_args, kvs_kv_copy_args, kvs_kv_layout, kvs_kv_write_args};
use kvshare::backend::kvs_backend;
use kvshare::enums::kvs_status;
use kvshare::types::kvs_copy;
use support::attention::{build, describe, new_backend, Built, Case, Data, Rng, BF16, F16, F32};
use support::cann_emu::*;

fn last_error() -> String {
    support::attention::last_error()
}

fn assert_close(dtype: u32, got: &Data, want: &Data, what: &str) {
    let rtol = if dtype == BF16 { 2e-2 } else { 2e-3 };
    assert_eq!(got.len(), want.len());
    for i in 0..got.len() {
        let (g, w) = (got.get(i), want.get(i));
        assert!(
            (g - w).abs() <= rtol * w.abs() + rtol / 10.0,
            "{what}: element {i}: ascend {g}, cpu {w}"
        );
    }
}

/// A decode case as these tests use it: two KV heads, seed 7.
fn decode(dtype: u32, group: usize, head_dim: usize, page_size: usize, ctx: Vec<usize>) -> Case {
    Case {
        seed: 7,
        ..Case::decode(dtype, group, head_dim, page_size, ctx)
    }
}

/// The CPU backend's output for a built case (what the Ascend output is compared with), into a
/// copy of the output buffer: `b.out` stays as built, so a device copy of it starts unwritten.
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
    assert_eq!(
        unsafe { kvs_backend::kvs_attention_launch(cpu, &a, std::ptr::null_mut()) },
        kvs_status::Ok,
        "{}",
        last_error()
    );
    unsafe { kvs_backend::kvs_backend_free(cpu) };
    out
}

/// Runs `c` on the emulator and on the CPU and compares; checks the launch only enqueued work
/// and kvshare never created or synchronised a stream. Returns the FIA GetWorkspaceSize calls.
fn check_case(emu: &Emu, c: &Case) -> i64 {
    emu.init_thread(0);
    let b = build(c);
    let want = cpu_output(&b);
    let be = backend(emu);
    let stream = emu.stream();
    let dev = upload(emu, &b);
    let before = dev.out.read();
    let (syncs, creates) = (
        emu.calls("aclrtSynchronizeStream"),
        emu.calls("aclrtCreateStream"),
    );
    let fia0: i64 = [2, 3, 4]
        .iter()
        .map(|v| {
            emu.calls(&format!(
                "aclnnFusedInferAttentionScoreV{v}GetWorkspaceSize"
            ))
        })
        .sum();
    assert_eq!(
        launch(be, &b, &dev, stream),
        kvs_status::Ok,
        "{}",
        last_error()
    );
    let fia: i64 = [2, 3, 4]
        .iter()
        .map(|v| {
            emu.calls(&format!(
                "aclnnFusedInferAttentionScoreV{v}GetWorkspaceSize"
            ))
        })
        .sum::<i64>()
        - fia0;
    assert_eq!(
        emu.calls("aclrtSynchronizeStream"),
        syncs,
        "kvshare synchronised a stream"
    );
    assert_eq!(
        emu.calls("aclrtCreateStream"),
        creates,
        "kvshare created a stream"
    );
    assert!(emu.counter("pending_tasks") > 0, "nothing was enqueued");
    assert_eq!(
        dev.out.read(),
        before,
        "output written before the stream ran"
    );
    emu.sync(stream);
    let got = data_from(c.dtype, &dev.out.read());
    assert_close(c.dtype, &got, &want, "attention");
    assert_eq!(emu.live_objects(), 0, "CANN objects leaked");
    assert_eq!(emu.faults(), 0, "emulator fault: {}", emu.last_fault());
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
    fia
}

#[test]
fn decode_gqa_page128_f16() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let n = check_case(emu, &decode(F16, 4, 64, 128, vec![5, 130, 257]));
    assert_eq!(n, 1, "decode is one launch");
}

#[test]
fn decode_page16_bf16_mqa() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut c = decode(BF16, 8, 32, 16, vec![1, 17, 40, 33]);
    c.num_kv_heads = 1;
    check_case(emu, &c);
}

#[test]
fn decode_strided_query_and_heads_major_cache() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut c = decode(F16, 2, 64, 128, vec![100, 3]);
    c.pad = 16; // token strides of query/output are not dense
    check_case(emu, &c);
    let mut c = decode(BF16, 2, 128, 128, vec![129, 7]);
    c.heads_major = true; // BnNBsD cache: BNSD query
    check_case(emu, &c);
}

#[test]
fn prefill_per_sequence_bsnd_f16() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut c = decode(F16, 4, 64, 128, vec![6, 140, 1, 300]);
    c.q = Some(vec![6, 20, 1, 0]); // full prefill, chunked prefill, decode row, empty
    let n = check_case(emu, &c);
    assert_eq!(n, 3, "one launch per sequence with query tokens");
}

#[test]
fn prefill_tnd_bf16() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    let mut c = decode(BF16, 2, 128, 128, vec![4, 150, 9]);
    c.q = Some(vec![4, 30, 1]);
    let n = check_case(emu, &c);
    assert_eq!(n, 1, "TND is one launch");
    c.heads_major = true;
    assert_eq!(check_case(emu, &c), 1);
}

#[test]
fn fia_versions_v2_and_custom_v4() {
    let _g = serial();
    let full = Emu::load(Variant::Full);
    full.init_thread(0);
    let be = backend(full);
    let d = describe(be);
    assert!(d.contains("V2 (libopapi_transformer.so)"), "{d}");
    assert!(d.contains("using V3"), "{d}");
    assert!(d.contains("aclnnScatterPaKvCache: libopapi.so"), "{d}");
    unsafe { kvs_backend::kvs_backend_free(be) };

    // A fresh emulator whose ACL nobody initialised yet: the backend calls aclInit itself.
    let v2 = Emu::load(Variant::V2Only);
    assert_eq!(v2.counter("inited"), 0);
    let be = backend(v2);
    assert_eq!(v2.counter("inited"), 1);
    let d = describe(be);
    assert!(d.contains("using V2"), "{d}");
    unsafe { kvs_backend::kvs_backend_free(be) };
    assert_eq!(check_case(v2, &decode(F16, 2, 64, 128, vec![9, 200])), 1);
    assert_eq!(v2.calls("aclnnFusedInferAttentionScoreV2"), 1);

    let v4 = Emu::load(Variant::V4Cust);
    v4.init_thread(0);
    let be = backend(v4);
    let d = describe(be);
    assert!(
        d.contains("V4 (libcust_opapi.so)") && d.contains("using V4"),
        "{d}"
    );
    unsafe { kvs_backend::kvs_backend_free(be) };
    let mut c = decode(F16, 2, 64, 128, vec![3, 129]);
    c.q = Some(vec![3, 2]);
    check_case(v4, &c);
    assert_eq!(v4.calls("aclnnFusedInferAttentionScoreV4"), 2);
}

fn expect_status(got: kvs_status, want: kvs_status, needle: &str) {
    let m = last_error();
    assert_eq!(got, want, "{m}");
    assert!(
        m.contains(needle),
        "message {m:?} does not mention {needle:?}"
    );
}

#[test]
fn refused_before_any_cann_call() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    let be = backend(emu);
    let stream = emu.stream();
    let ws = emu.calls("aclnnFusedInferAttentionScoreV3GetWorkspaceSize");
    let tensors = emu.calls("aclCreateTensor");
    let cases: Vec<(Case, &str)> = {
        let mut v = Vec::new();
        let mut c = decode(F16, 2, 64, 16, vec![20, 5]);
        c.q = Some(vec![4, 2]);
        v.push((c, "multiple of 128")); // prefill with page 16: CANN refuses
        v.push((decode(F16, 2, 64, 24, vec![20]), "multiple of 16"));
        v.push((decode(F32, 2, 64, 128, vec![20]), "f32"));
        let mut c = decode(F16, 2, 64, 128, vec![20]);
        c.softcap = 30.0;
        v.push((c, "softcap"));
        let mut c = decode(F16, 2, 72, 128, vec![20]);
        c.q = Some(vec![2]);
        v.push((c, "head_dim 72"));
        let mut c = decode(F16, 65, 64, 128, vec![20]);
        c.num_kv_heads = 1;
        v.push((c, "above CANN's limit 64"));
        v
    };
    for (c, needle) in cases {
        let b = build(&c);
        let dev = upload(emu, &b);
        expect_status(
            launch(be, &b, &dev, stream),
            kvs_status::Unsupported,
            needle,
        );
    }
    // Misaligned device pointer.
    let b = build(&decode(F16, 2, 64, 128, vec![20]));
    let dev = upload(emu, &b);
    let mut a = b.args_over(
        dev.q.ptr,
        dev.out.ptr,
        dev.k.ptr,
        dev.v.ptr,
        dev.bt.ptr.cast(),
    );
    a.query = unsafe { dev.q.ptr.cast::<u8>().add(2) }.cast();
    a.num_seqs = 1;
    expect_status(
        unsafe { kvs_backend::kvs_attention_launch(be, &a, stream) },
        kvs_status::AttnInvalidArgument,
        "query",
    );
    // A NULL device pointer, and shared validation (context length beyond the block table).
    let mut a = b.args_over(
        dev.q.ptr,
        dev.out.ptr,
        dev.k.ptr,
        dev.v.ptr,
        std::ptr::null(),
    );
    expect_status(
        unsafe { kvs_backend::kvs_attention_launch(be, &a, stream) },
        kvs_status::NullArgument,
        "block_table",
    );
    a.block_table = dev.bt.ptr.cast();
    let big = [100_000i32];
    a.context_lens = big.as_ptr();
    expect_status(
        unsafe { kvs_backend::kvs_attention_launch(be, &a, stream) },
        kvs_status::AttnInvalidArgument,
        "context_lens",
    );
    assert_eq!(
        emu.calls("aclnnFusedInferAttentionScoreV3GetWorkspaceSize"),
        ws
    );
    assert_eq!(emu.calls("aclCreateTensor"), tensors);
    assert_eq!(emu.counter("pending_tasks"), 0);
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
}

#[test]
fn missing_libraries_and_symbols() {
    let _g = serial();
    let (s, m) = backend_at(std::path::Path::new("/nonexistent/cann"), 0).unwrap_err();
    assert_eq!(s, kvs_status::BackendUnavailable);
    assert!(
        m.contains("libascendcl.so") && m.contains("/nonexistent/cann"),
        "{m}"
    );

    let dir = support::cann_emu::build(Variant::NoNnopbase);
    let (s, m) = backend_at(&dir, 0).unwrap_err();
    assert_eq!(s, kvs_status::BackendUnavailable);
    assert!(m.contains("libnnopbase.so"), "{m}");

    let dir = support::cann_emu::build(Variant::NoFia);
    let (s, m) = backend_at(&dir, 0).unwrap_err();
    assert_eq!(s, kvs_status::BackendUnavailable);
    assert!(m.contains("aclnnFusedInferAttentionScore"), "{m}");
    assert!(m.contains("libopapi.so, libopapi_transformer.so"), "{m}");

    // No ScatterPaKvCache: attention works, the KV write says which symbol is missing.
    let emu = Emu::load(Variant::NoScatter);
    emu.init_thread(0);
    let be = backend(emu);
    assert!(describe(be).contains("aclnnScatterPaKvCache: absent"));
    let w = WriteCase::new(F16, 4);
    let stream = emu.stream();
    let d = w.upload(emu);
    expect_status(
        w.launch(be, &d, stream, 0),
        kvs_status::BackendUnavailable,
        "aclnnScatterPaKvCache",
    );
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
    check_case(emu, &decode(F16, 2, 64, 128, vec![9]));
}

#[test]
fn device_binding() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    let (s, m) = backend_at(&emu.dir, 5).unwrap_err();
    assert_eq!(s, kvs_status::BackendUnavailable);
    assert!(
        m.contains("device 5") && m.contains("aclrtSetDevice"),
        "{m}"
    );

    let be = backend(emu) as usize;
    let c = decode(F16, 2, 64, 128, vec![9, 30]);
    let b = build(&c);
    let dev = upload(emu, &b);
    let stream = emu.stream() as usize;
    let (q, o, k, v, bt) = (
        dev.q.ptr as usize,
        dev.out.ptr as usize,
        dev.k.ptr as usize,
        dev.v.ptr as usize,
        dev.bt.ptr as usize,
    );
    let a = b.args_over(q as _, o as _, k as _, v as _, bt as _);
    let a_ptr = &a as *const kvs_attention_args as usize;
    std::thread::scope(|s| {
        // A thread with no current device is bound to the backend's device.
        s.spawn(|| {
            let st = unsafe {
                kvs_backend::kvs_attention_launch(
                    be as *const kvs_backend,
                    a_ptr as *const kvs_attention_args,
                    stream as *mut c_void,
                )
            };
            assert_eq!(st, kvs_status::Ok, "{}", last_error());
        });
    });
    std::thread::scope(|s| {
        // A thread bound to another device is refused, not switched.
        s.spawn(|| {
            assert_eq!(emu.set_device(1), 0);
            let st = unsafe {
                kvs_backend::kvs_attention_launch(
                    be as *const kvs_backend,
                    a_ptr as *const kvs_attention_args,
                    stream as *mut c_void,
                )
            };
            assert_eq!(st, kvs_status::BackendFailure);
            assert!(
                last_error().contains("current device is 1"),
                "{}",
                last_error()
            );
        });
    });
    emu.sync(stream as *mut c_void);
    assert_eq!(emu.faults(), 0, "{}", emu.last_fault());
    assert_eq!(emu.live_objects(), 0);
    unsafe { kvs_backend::kvs_backend_free(be as *mut kvs_backend) };
    emu.destroy_stream(stream as *mut c_void);
}

#[test]
fn injected_failures_leak_nothing() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    use kvs_status::*;
    let cases: &[(&str, i64, i32, kvs_status, &str)] = &[
        (
            "aclCreateTensor",
            1,
            0,
            BackendFailure,
            "aclCreateTensor returned NULL",
        ),
        (
            "aclCreateTensor",
            4,
            0,
            BackendFailure,
            "aclCreateTensor returned NULL",
        ),
        (
            "aclCreateTensorList",
            2,
            0,
            BackendFailure,
            "aclCreateTensorList returned NULL",
        ),
        (
            "aclCreateIntArray",
            1,
            0,
            BackendFailure,
            "aclCreateIntArray returned NULL",
        ),
        (
            "aclnnFusedInferAttentionScoreV3GetWorkspaceSize",
            1,
            161002,
            AttnInvalidArgument,
            "161002 ACLNN_ERR_PARAM_INVALID",
        ),
        (
            "aclnnFusedInferAttentionScoreV3GetWorkspaceSize",
            1,
            561003,
            BackendUnavailable,
            "kernel not found",
        ),
        (
            "aclnnFusedInferAttentionScoreV3GetWorkspaceSize",
            1,
            361001,
            BackendFailure,
            "361001",
        ),
        (
            "aclrtMalloc",
            1,
            207001,
            BackendFailure,
            "aclrtMalloc returned 207001",
        ),
        (
            "aclnnFusedInferAttentionScoreV3",
            1,
            361001,
            BackendFailure,
            "aclnnFusedInferAttentionScoreV3 returned 361001",
        ),
        ("aclrtGetDevice", 1, 107002, Ok, ""), // unbound-looking thread: rebinds, launch succeeds
    ];
    let mut prefill = decode(F16, 2, 64, 128, vec![40, 9]);
    prefill.q = Some(vec![3, 2]);
    for c in [decode(F16, 2, 64, 128, vec![40, 9]), prefill] {
        let b = build(&c);
        for &(f, nth, code, want, needle) in cases {
            let be = backend(emu);
            let stream = emu.stream(); // fresh: the workspace is allocated in the launch
            let dev = upload(emu, &b);
            let allocs = emu.counter("live_device_allocs");
            emu.fail(Some(f), nth, code);
            let st = launch(be, &b, &dev, stream);
            emu.fail(None, 0, 0);
            let m = last_error();
            assert_eq!(st, want, "{f}#{nth}: {m}");
            if want != Ok {
                assert!(m.contains(needle), "{f}#{nth}: {m:?} lacks {needle:?}");
                assert!(
                    m.contains("EZ9999: emu: injected failure"),
                    "{f}: no recent msg: {m}"
                );
            }
            emu.sync(stream);
            assert_eq!(emu.live_objects(), 0, "{f}#{nth}: CANN objects leaked");
            assert_eq!(emu.faults(), 0, "{f}#{nth}: {}", emu.last_fault());
            unsafe { kvs_backend::kvs_backend_free(be) };
            assert!(
                emu.counter("live_device_allocs") <= allocs,
                "{f}#{nth}: device memory leaked"
            );
            emu.destroy_stream(stream);
        }
    }
    // The causal mask upload fails: nothing is leaked and the next prefill makes it again.
    let mut c = decode(F16, 2, 64, 128, vec![40]);
    c.q = Some(vec![5]);
    let b = build(&c);
    let be = backend(emu);
    let stream = emu.stream();
    let dev = upload(emu, &b);
    let allocs = emu.counter("live_device_allocs");
    emu.fail(Some("aclrtMemcpy"), 1, 507899);
    expect_status(
        launch(be, &b, &dev, stream),
        BackendFailure,
        "aclrtMemcpy returned 507899",
    );
    assert_eq!(emu.counter("live_device_allocs"), allocs);
    assert_eq!(launch(be, &b, &dev, stream), Ok, "{}", last_error());
    emu.sync(stream);
    assert_eq!(emu.live_objects(), 0);
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
}

#[test]
fn workspaces_grow_per_stream_and_outlive_queued_work() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    emu.set_workspace_per_row(4096);
    let be = backend(emu);
    let (s1, s2) = (emu.stream(), emu.stream());
    let small = build(&decode(F16, 2, 64, 128, vec![9]));
    let big = build(&decode(F16, 4, 64, 128, vec![9, 8, 7, 6, 5, 4, 3, 2]));
    let (ds, db) = (upload(emu, &small), upload(emu, &big));
    // Small then big on s1 with no sync in between: the first workspace is outgrown while the
    // first launch still waits in the queue; it must stay allocated.
    assert_eq!(
        launch(be, &small, &ds, s1),
        kvs_status::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        launch(be, &big, &db, s1),
        kvs_status::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        launch(be, &small, &ds, s1),
        kvs_status::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        launch(be, &small, &ds, s2),
        kvs_status::Ok,
        "{}",
        last_error()
    );
    let d = describe(be);
    assert!(
        d.contains("workspaces: 2 stream(s)") && d.contains("3 allocation(s)"),
        "{d}"
    );
    emu.sync(s1);
    emu.sync(s2);
    assert_eq!(emu.faults(), 0, "{}", emu.last_fault());
    unsafe { kvs_backend::kvs_backend_free(be) }; // after the streams were synchronised
    assert_eq!(emu.faults(), 0, "{}", emu.last_fault());
    emu.set_workspace_per_row(256);
    emu.destroy_stream(s1);
    emu.destroy_stream(s2);
}

/// A KV write case: `t` new tokens of `[t, kv_heads, d]` into a `[6, 16, kv_heads, d]` cache.
struct WriteCase {
    dtype: u32,
    layout: kvs_kv_layout,
    key: Data,
    value: Data,
    kc: Data,
    vc: Data,
    slots: Vec<i64>,
}

impl WriteCase {
    fn new(dtype: u32, t: usize) -> WriteCase {
        let mut rng = Rng(11);
        let layout = kvs_backend::kvs_kv_layout_dense(dtype, 6, 16, 2, 32);
        let n = 6 * 16 * 2 * 32;
        let mut all: Vec<i64> = (0..96).collect();
        rng.shuffle(&mut all);
        WriteCase {
            dtype,
            layout,
            key: Data::random(dtype, t * 64, &mut rng),
            value: Data::random(dtype, t * 64, &mut rng),
            kc: Data::random(dtype, n, &mut rng),
            vc: Data::random(dtype, n, &mut rng),
            slots: all[..t].to_vec(),
        }
    }

    fn args(
        &self,
        k: *const c_void,
        v: *const c_void,
        kc: *mut c_void,
        vc: *mut c_void,
        slots: *const c_void,
        ty: u32,
    ) -> kvs_kv_write_args {
        kvs_kv_write_args {
            num_tokens: self.slots.len() as u32,
            key: k,
            value: v,
            src_dtype: self.dtype,
            src_token_stride: 0,
            src_head_stride: 0,
            key_cache: kc,
            value_cache: vc,
            cache: self.layout,
            slot_mapping: slots,
            slot_mapping_type: ty,
        }
    }

    fn slot_bytes(&self, ty: u32) -> Vec<u8> {
        if ty == 1 {
            bytes(&self.slots)
        } else {
            bytes(&self.slots.iter().map(|&s| s as i32).collect::<Vec<_>>())
        }
    }

    fn upload<'e>(&self, emu: &'e Emu) -> [DevBuf<'e>; 6] {
        [
            emu.upload(&data_bytes(&self.key)),
            emu.upload(&data_bytes(&self.value)),
            emu.upload(&data_bytes(&self.kc)),
            emu.upload(&data_bytes(&self.vc)),
            emu.upload(&self.slot_bytes(0)),
            emu.upload(&self.slot_bytes(1)),
        ]
    }

    fn launch(
        &self,
        be: *mut kvs_backend,
        d: &[DevBuf<'_>; 6],
        stream: *mut c_void,
        ty: u32,
    ) -> kvs_status {
        let a = self.args(
            d[0].ptr,
            d[1].ptr,
            d[2].ptr,
            d[3].ptr,
            d[4 + ty as usize].ptr,
            ty,
        );
        unsafe { kvs_backend::kvs_kv_write(be, &a, stream) }
    }

    fn cpu(&self) -> (Data, Data) {
        let cpu = new_backend(1);
        let (mut kc, mut vc) = (self.kc.clone(), self.vc.clone());
        let a = self.args(
            self.key.ptr(),
            self.value.ptr(),
            kc.ptr_mut(),
            vc.ptr_mut(),
            self.slots.as_ptr().cast(),
            1,
        );
        assert_eq!(
            unsafe { kvs_backend::kvs_kv_write(cpu, &a, std::ptr::null_mut()) },
            kvs_status::Ok
        );
        unsafe { kvs_backend::kvs_backend_free(cpu) };
        (kc, vc)
    }
}

#[test]
fn kv_write_scatter_matches_cpu() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    let be = backend(emu);
    let stream = emu.stream();
    for (dtype, ty) in [(F16, 0u32), (BF16, 1)] {
        let w = WriteCase::new(dtype, 21);
        let (want_k, want_v) = w.cpu();
        let d = w.upload(emu);
        assert_eq!(
            w.launch(be, &d, stream, ty),
            kvs_status::Ok,
            "{}",
            last_error()
        );
        assert_eq!(
            d[2].read(),
            data_bytes(&w.kc),
            "cache written before the stream ran"
        );
        emu.sync(stream);
        assert_eq!(d[2].read(), data_bytes(&want_k));
        assert_eq!(d[3].read(), data_bytes(&want_v));
        assert_eq!(emu.live_objects(), 0);
        assert_eq!(emu.faults(), 0, "{}", emu.last_fault());
    }
    // Refusals: dtype conversion, non-contiguous source, heads-major cache.
    let w = WriteCase::new(F16, 3);
    let d = w.upload(emu);
    let mut a = w.args(d[0].ptr, d[1].ptr, d[2].ptr, d[3].ptr, d[4].ptr, 0);
    a.src_dtype = BF16;
    expect_status(
        unsafe { kvs_backend::kvs_kv_write(be, &a, stream) },
        kvs_status::Unsupported,
        "does not convert",
    );
    a.src_dtype = F16;
    a.src_token_stride = 80;
    expect_status(
        unsafe { kvs_backend::kvs_kv_write(be, &a, stream) },
        kvs_status::Unsupported,
        "contiguous",
    );
    a.src_token_stride = 0;
    a.cache.slot_stride = 32;
    a.cache.head_stride = 16 * 32;
    expect_status(
        unsafe { kvs_backend::kvs_kv_write(be, &a, stream) },
        kvs_status::Unsupported,
        "Norm",
    );
    // Injected failures clean up.
    for (f, code) in [
        ("aclCreateTensor", 0),
        ("aclCreateIntArray", 0),
        ("aclnnScatterPaKvCacheGetWorkspaceSize", 161002),
        ("aclnnScatterPaKvCache", 361001),
    ] {
        emu.fail(Some(f), if code == 0 { 2 } else { 1 }, code);
        let st = w.launch(be, &d, stream, 0);
        emu.fail(None, 0, 0);
        assert_ne!(st, kvs_status::Ok, "{f}");
        emu.sync(stream);
        assert_eq!(emu.live_objects(), 0, "{f}: leaked");
    }
    assert_eq!(emu.faults(), 0, "{}", emu.last_fault());
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
}

#[test]
fn page_copies_on_the_stream() {
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    let be = backend(emu);
    let stream = emu.stream();
    for heads_major in [false, true] {
        let mut rng = Rng(5);
        let mut layout = kvs_backend::kvs_kv_layout_dense(F16, 6, 16, 2, 32);
        if heads_major {
            layout.slot_stride = 32;
            layout.head_stride = 16 * 32;
        }
        let (nd, nh) = (6 * 16 * 64, 4 * 16 * 64);
        let k = Data::random(F16, nd, &mut rng);
        let v = Data::random(F16, nd, &mut rng);
        let hk = Data::random(F16, nh, &mut rng);
        let hv = Data::random(F16, nh, &mut rng);
        let copies = [
            kvs_copy {
                src_page: 1,
                dst_page: 4,
                num_tokens: 5,
                kind: 0,
                group: 0,
            }, // CoW of a partial page
            kvs_copy {
                src_page: 2,
                dst_page: 3,
                num_tokens: 16,
                kind: 1,
                group: 0,
            }, // swap out
            kvs_copy {
                src_page: 0,
                dst_page: 5,
                num_tokens: 16,
                kind: 2,
                group: 0,
            }, // swap in
            kvs_copy {
                src_page: 3,
                dst_page: 0,
                num_tokens: 0,
                kind: 2,
                group: 0,
            }, // no-op
        ];
        // CPU on host copies.
        let cpu = new_backend(1);
        let (mut ck, mut cv, mut chk, mut chv) = (k.clone(), v.clone(), hk.clone(), hv.clone());
        let a = kvs_kv_copy_args {
            key_cache: ck.ptr_mut(),
            value_cache: cv.ptr_mut(),
            cache: layout,
            host_key_cache: chk.ptr_mut(),
            host_value_cache: chv.ptr_mut(),
            num_host_pages: 4,
        };
        assert_eq!(
            unsafe {
                kvs_backend::kvs_kv_copy(
                    cpu,
                    &a,
                    copies.as_ptr(),
                    copies.len(),
                    std::ptr::null_mut(),
                )
            },
            kvs_status::Ok
        );
        unsafe { kvs_backend::kvs_backend_free(cpu) };
        // Ascend: device caches, page-locked host caches.
        let (dk, dv) = (emu.upload(&data_bytes(&k)), emu.upload(&data_bytes(&v)));
        let (phk, phv) = (emu.alloc_host(nh * 2), emu.alloc_host(nh * 2));
        phk.write(&data_bytes(&hk));
        phv.write(&data_bytes(&hv));
        let a = kvs_kv_copy_args {
            key_cache: dk.ptr,
            value_cache: dv.ptr,
            cache: layout,
            host_key_cache: phk.ptr,
            host_value_cache: phv.ptr,
            num_host_pages: 4,
        };
        let n0 = emu.calls("aclrtMemcpyAsync");
        assert_eq!(
            unsafe { kvs_backend::kvs_kv_copy(be, &a, copies.as_ptr(), copies.len(), stream) },
            kvs_status::Ok,
            "{}",
            last_error()
        );
        let runs = if heads_major { 2 } else { 1 };
        assert_eq!(
            emu.calls("aclrtMemcpyAsync") - n0,
            3 * 2 * runs,
            "one async copy per run"
        );
        assert_eq!(
            phk.read(),
            data_bytes(&hk),
            "host cache written before the stream ran"
        );
        emu.sync(stream);
        assert_eq!(dk.read(), data_bytes(&ck));
        assert_eq!(dv.read(), data_bytes(&cv));
        assert_eq!(phk.read(), data_bytes(&chk));
        assert_eq!(phv.read(), data_bytes(&chv));
        // Pageable host memory is refused by aclrtMemcpyAsync: a mapped BACKEND_FAILURE.
        let mut plain = hk.clone();
        let mut a2 = a;
        a2.host_key_cache = plain.ptr_mut();
        let st = unsafe { kvs_backend::kvs_kv_copy(be, &a2, copies[1..2].as_ptr(), 1, stream) };
        expect_status(st, kvs_status::BackendFailure, "aclrtMallocHost");
        emu.sync(stream);
        assert_eq!(emu.faults(), 0, "{}", emu.last_fault());
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
}

#[test]
fn engine_loop_write_then_attend() {
    // The loop an engine runs: KV write of the new tokens, then attention over the pages, both
    // enqueued on one stream and synchronised once.
    let _g = serial();
    let emu = Emu::load(Variant::Full);
    emu.init_thread(0);
    let be = backend(emu);
    let stream = emu.stream();
    let mut c = decode(F16, 2, 64, 128, vec![130, 20]);
    c.q = Some(vec![130, 20]);
    let mut b = build(&c);
    // Slots of every token of both sequences, from the block table.
    let slots: Vec<i32> = (0..2)
        .flat_map(|s| (0..c.ctx[s]).map(move |p| (s, p)))
        .map(|(s, p)| b.block_table[s * b.bt_stride + p / 128] * 128 + (p % 128) as i32)
        .collect();
    let mut rng = Rng(3);
    let t = slots.len();
    let newk = Data::random(F16, t * 128, &mut rng);
    let newv = Data::random(F16, t * 128, &mut rng);
    // CPU: write then attend.
    let cpu = new_backend(1);
    let wa = kvs_kv_write_args {
        num_tokens: t as u32,
        key: newk.ptr(),
        value: newv.ptr(),
        src_dtype: F16,
        src_token_stride: 0,
        src_head_stride: 0,
        key_cache: b.k.ptr_mut(),
        value_cache: b.v.ptr_mut(),
        cache: b.layout,
        slot_mapping: slots.as_ptr().cast(),
        slot_mapping_type: 0,
    };
    let dev = upload(emu, &b); // caches as they were before the write
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_write(cpu, &wa, std::ptr::null_mut()) },
        kvs_status::Ok
    );
    unsafe { kvs_backend::kvs_backend_free(cpu) };
    let want = cpu_output(&b);
    // Ascend.
    let (dk, dv, ds) = (
        emu.upload(&data_bytes(&newk)),
        emu.upload(&data_bytes(&newv)),
        emu.upload(&bytes(&slots)),
    );
    let wd = kvs_kv_write_args {
        key: dk.ptr,
        value: dv.ptr,
        key_cache: dev.k.ptr,
        value_cache: dev.v.ptr,
        slot_mapping: ds.ptr,
        ..wa
    };
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_write(be, &wd, stream) },
        kvs_status::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        launch(be, &b, &dev, stream),
        kvs_status::Ok,
        "{}",
        last_error()
    );
    emu.sync(stream);
    assert_close(F16, &data_from(F16, &dev.out.read()), &want, "write+attend");
    assert_eq!(emu.live_objects(), 0);
    assert_eq!(emu.faults(), 0, "{}", emu.last_fault());
    unsafe { kvs_backend::kvs_backend_free(be) };
    emu.destroy_stream(stream);
}

#[test]
fn the_library_does_not_link_cann() {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let lib = [
        deps.join("libkvshare.so"),
        deps.parent().unwrap().join("libkvshare.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("libkvshare.so next to the test executable");
    let out = match std::process::Command::new("ldd").arg(&lib).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ldd not available ({e}); not checked");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ldd failed: {text}");
    for name in ["ascendcl", "nnopbase", "opapi"] {
        assert!(!text.contains(name), "libkvshare.so links {name}:\n{text}");
    }
}
