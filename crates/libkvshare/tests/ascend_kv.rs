//! The Ascend backend's KV write and page copies end to end against the emulated CANN runtime
//! (`tests/cann_emu`, built here), compared with the CPU backend on the same inputs, and an
//! engine's loop of writes and launches; each test also checks that every CANN object kvshare
//! created was destroyed and that the emulator saw no fault (as `ascend.rs` does for launches).

// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use kvshare::attn_args::{kvs_kv_copy_args, kvs_kv_write_args};
use kvshare::backend::kvs_backend;
use kvshare::enums::kvs_status;
use kvshare::types::kvs_copy;
use support::ascend::{assert_close, cpu_output, decode, expect_status, last_error, WriteCase};
use support::attention::{build, new_backend, Data, Rng, BF16, F16};
use support::cann_emu::*;

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
