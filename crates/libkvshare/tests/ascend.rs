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

use kvshare::attn_args::kvs_attention_args;
use kvshare::backend::kvs_backend;
use kvshare::enums::kvs_status;
use support::ascend::{assert_close, cpu_output, decode, expect_status, last_error, WriteCase};
use support::attention::{build, describe, Case, BF16, F16, F32};
use support::cann_emu::*;

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
