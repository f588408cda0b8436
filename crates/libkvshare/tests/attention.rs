//! Paged attention, KV write and page copy through the C exports, checked against the naive f64
//! reference of `tests/support/attention.rs` (gather each sequence's K/V contiguously through
//! the block table, then plain softmax attention in f64).
//!
//! Tolerances (|got - ref| <= rtol * |ref| + rtol / 10), per output dtype:
//! - f32 `1e-4`: inputs are exact in both; the kernel accumulates in f32 (relative error about
//!   `1e-6` over a few hundred terms) and uses a polynomial `exp` (relative error about `2e-7`).
//! - f16 `2e-3`: the reference uses the same stored f16 inputs, so the only extra error is
//!   rounding the output to f16 (half an ulp, `2^-11 = 4.9e-4` relative): 4x margin.
//! - bf16 `2e-2`: as f16 with bf16's half ulp, `2^-8 = 3.9e-3` relative: 5x margin.

// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use kvshare::attn_args::{kvs_kv_copy_args, kvs_kv_write_args};
use kvshare::backend::{kvs_backend, kvs_cpu_parallel_fn, kvs_cpu_team, kvs_cpu_work_fn};
use kvshare::enums::kvs_status;
use kvshare::types::kvs_copy;
use support::attention::*;

/// Runs a case on `backend` and compares every output element with the reference.
fn check_on(backend: *const kvs_backend, c: &Case) {
    let mut b = build(c);
    let args = b.args();
    let st = unsafe { kvs_backend::kvs_attention_launch(backend, &args, std::ptr::null_mut()) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    let want = b.reference();
    let d = c.head_dim;
    b.assert_output(
        &want,
        &format!(
            "dtype {} group {} d {d} ps {}",
            c.dtype, c.group, c.page_size
        ),
    );
    // Padding between token rows is never written.
    for t in 0..b.num_tokens {
        for x in b.h * d..b.q_ts {
            assert_eq!(b.out.get(t * b.q_ts + x), 7.0);
        }
    }
}

fn check(c: &Case) {
    let be = new_backend(2);
    check_on(be, c);
    unsafe { kvs_backend::kvs_backend_free(be) };
}

fn ragged(ps: usize) -> Vec<usize> {
    // 1 token, exactly one page, one past a boundary, something in between; two whole pages
    // for small pages only (keeps the debug-build suite fast).
    let mut v = vec![1, ps, ps + 1, ps / 2 + 3];
    if ps <= 16 {
        v.push(2 * ps);
    }
    v
}

#[test]
fn decode_all_dtypes_ratios_dims_page_sizes() {
    let be = new_backend(2);
    for dtype in [F32, F16, BF16] {
        for group in [1, 4, 8] {
            // Head dim 256 on small pages only (keeps the debug-build suite fast; the split-K
            // test has it on both page sizes).
            for (d, ps) in [(64, 16), (64, 128), (128, 16), (128, 128), (256, 16)] {
                let mut c = Case::decode(dtype, group, d, ps, ragged(ps));
                c.seed = (dtype as u64 + 1) * 1000 + group as u64 * 100 + d as u64 + ps as u64;
                check_on(be, &c);
            }
        }
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

#[test]
fn prefill_and_chunked_prefill_causal() {
    let be = new_backend(2);
    let mut i = 0;
    for dtype in [F32, F16, BF16] {
        for group in [1, 4, 8] {
            let (d, ps) = [(64, 16), (128, 128), (64, 128)][i % 3];
            i += 1;
            // Full prefill, chunked prefill (cached prefix + new chunk), decode rows, and a
            // chunk that ends exactly on a page boundary.
            let ctx = vec![13, 2 * ps + 7, ps + 1, 1, 2 * ps];
            let q = vec![13, 9, 1, 1, ps / 2];
            let mut c = Case::decode(dtype, group, d, ps, ctx);
            c.q = Some(q);
            c.seed = i as u64;
            check_on(be, &c);
        }
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

/// The tiled prefill kernel (sequences with at least 8 query tokens; the plan sends them there)
/// next to decode rows in one launch: full prefill, a chunk after a cached prefix crossing pages,
/// ragged chunks (ending on a page boundary, exactly at the 8-token threshold, just below it),
/// over dtypes, GQA 1/4/8, head dims 64/128/256 and pages 16/128; and a soft cap with a window.
#[test]
fn tiled_prefill_cached_prefix_ragged_chunks() {
    let be = new_backend(2);
    let mut i = 0;
    for dtype in [F32, F16, BF16] {
        for group in [1, 4, 8] {
            for (d, ps) in [(64, 16), (128, 128), (256, 16)] {
                i += 1;
                let ctx = vec![40, 2 * ps + 28, 1, ps + 20, 8 + 3, 7 + 5];
                let q = vec![40, 23, 1, 20, 8, 7];
                let mut c = Case::decode(dtype, group, d, ps, ctx);
                c.q = Some(q);
                c.seed = 500 + i;
                if i % 9 == 0 {
                    (c.softcap, c.window) = (3.0, 19);
                }
                check_on(be, &c);
            }
        }
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

#[test]
fn larger_shape_reduced() {
    // The benchmark's geometry (head_dim 128, page 128, GQA 4, f16) with fewer, longer
    // sequences than the unit cases; kept small enough for a debug build.
    let mut c = Case::decode(F16, 4, 128, 128, vec![1000, 1024, 700]);
    c.num_kv_heads = 2;
    check(&c);
}

#[test]
fn strided_query_output_and_heads_major_cache() {
    for dtype in [F32, F16] {
        let mut c = Case::decode(dtype, 4, 64, 16, ragged(16));
        c.heads_major = true;
        c.pad = 5;
        check(&c);
        c.q = Some(vec![1, 10, 3, 11, 4]);
        check(&c);
    }
}

#[test]
fn softcap_and_sliding_window() {
    let mut c = Case::decode(F32, 2, 64, 16, vec![50, 33, 7]);
    // Logits are about 0.3 here, so a cap of 0.2 changes every score.
    c.softcap = 0.2;
    check(&c);
    c.softcap = 0.0;
    c.window = 20;
    check(&c);
    c.q = Some(vec![30, 10, 7]);
    check(&c);
}

#[test]
fn thread_counts_agree() {
    // The 2700-token sequence is split into key chunks; the cut must not depend on threads.
    let c = Case {
        q: Some(vec![5, 1, 20, 1]),
        ..Case::decode(F16, 4, 64, 16, vec![40, 17, 20, 2700])
    };
    let mut outs = Vec::new();
    for threads in [1, 3] {
        let be = new_backend(threads);
        assert_eq!(num_threads(be), threads);
        let mut b = build(&c);
        let args = b.args();
        assert_eq!(
            unsafe { kvs_backend::kvs_attention_launch(be, &args, std::ptr::null_mut()) },
            kvs_status::Ok
        );
        outs.push(b.out);
        unsafe { kvs_backend::kvs_backend_free(be) };
    }
    assert_eq!(outs[0], outs[1], "work split must not change results");
}

/// A host team of scoped std threads (`kvs_cpu_parallel_fn`): `work` on every requested
/// thread, the caller's among them; counts its regions.
unsafe extern "C" fn std_team(
    work: kvs_cpu_work_fn,
    arg: *mut std::ffi::c_void,
    n: std::ffi::c_uint,
    flags: std::ffi::c_uint,
) {
    assert_eq!(flags, 0);
    TEAM_REGIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (work, arg) = (work.expect("kvshare passes work"), arg as usize);
    std::thread::scope(|s| {
        for _ in 1..n {
            s.spawn(move || unsafe { work(arg as *mut std::ffi::c_void) });
        }
        unsafe { work(arg as *mut std::ffi::c_void) };
    });
}

static TEAM_REGIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A host team that runs nothing: kvshare must still do every item (on the caller).
unsafe extern "C" fn idle_team(
    _: kvs_cpu_work_fn,
    _: *mut std::ffi::c_void,
    _: std::ffi::c_uint,
    _: std::ffi::c_uint,
) {
}

fn team_backend(parallel: kvs_cpu_parallel_fn, num_threads: u32) -> *mut kvs_backend {
    let team = kvs_cpu_team {
        parallel,
        num_threads,
    };
    let mut b = std::ptr::null_mut();
    let st = unsafe { kvs_backend::kvs_backend_new_cpu_team(&team, &mut b) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    b
}

/// `kvs_backend_new_cpu_team`: the same work split as the own pool of as many threads, so the
/// same bits, whether the host runs `work` on every thread or on none; the team is really used;
/// describe says so; bad arguments are refused and leave the out pointer alone.
#[test]
fn host_team_runs_the_work_and_matches_the_own_pool() {
    let cases = [
        Case {
            q: Some(vec![5, 1, 20, 1]),
            ..Case::decode(F16, 4, 64, 16, vec![40, 17, 20, 2700])
        },
        Case::decode(F32, 8, 128, 128, vec![5000, 3, 2700, 129]),
        Case {
            q: Some(vec![9, 40]),
            ..Case::decode(BF16, 4, 128, 128, vec![2700, 40])
        },
    ];
    let pool = new_backend(3);
    let team = team_backend(Some(std_team), 3);
    let idle = team_backend(Some(idle_team), 3);
    let text = describe(team);
    assert!(text.contains("3 threads (the host's team"), "{text}");
    for c in &cases {
        let mut outs = Vec::new();
        for be in [pool, team, idle] {
            let before = TEAM_REGIONS.load(std::sync::atomic::Ordering::Relaxed);
            let mut b = build(c);
            let args = b.args();
            let st = unsafe { kvs_backend::kvs_attention_launch(be, &args, std::ptr::null_mut()) };
            assert_eq!(st, kvs_status::Ok, "{}", last_error());
            if be == team {
                let regions = TEAM_REGIONS.load(std::sync::atomic::Ordering::Relaxed) - before;
                assert!(
                    regions >= 1,
                    "the host's team was not asked to run the work"
                );
            }
            b.assert_output(&b.reference(), &format!("dtype {}", c.dtype));
            outs.push(b.out);
        }
        assert!(
            outs[0] == outs[1] && outs[0] == outs[2],
            "team and pool outputs differ"
        );
    }
    for be in [pool, team, idle] {
        unsafe { kvs_backend::kvs_backend_free(be) };
    }

    let mut b = std::ptr::null_mut();
    let bad = |team: *const kvs_cpu_team, out: *mut *mut kvs_backend| unsafe {
        kvs_backend::kvs_backend_new_cpu_team(team, out)
    };
    assert_eq!(bad(std::ptr::null(), &mut b), kvs_status::NullArgument);
    assert!(last_error().contains("team"), "{}", last_error());
    let no_fn = kvs_cpu_team {
        parallel: None,
        num_threads: 2,
    };
    assert_eq!(bad(&no_fn, &mut b), kvs_status::NullArgument);
    assert!(last_error().contains("team.parallel"), "{}", last_error());
    let too_many = kvs_cpu_team {
        parallel: Some(std_team),
        num_threads: 1025,
    };
    assert_eq!(bad(&too_many, &mut b), kvs_status::InvalidArgument);
    assert!(last_error().contains("num_threads"), "{}", last_error());
    assert!(b.is_null());
    let ok = kvs_cpu_team {
        parallel: Some(std_team),
        num_threads: 0,
    };
    assert_eq!(bad(&ok, std::ptr::null_mut()), kvs_status::NullArgument);
    assert!(last_error().contains("backend_out"), "{}", last_error());
    let be = team_backend(Some(std_team), 0);
    assert!(num_threads(be) >= 1);
    unsafe { kvs_backend::kvs_backend_free(be) };
}

/// Split-K: sequences long enough to be cut into key chunks (over 2560 tokens: 3 and 2 parts), next to short
/// ones, over every dtype, head dims 64/128/256 and pages 16/128, with shared and shuffled block
/// tables (see `build`); also a chunked prefill and a sliding window across chunk edges.
#[test]
fn decode_split_k_long_sequences() {
    let be = new_backend(2);
    let mut i = 0u64;
    for dtype in [F32, F16, BF16] {
        for d in [64, 128, 256] {
            for ps in [16, 128] {
                i += 1;
                let group = [1, 4, 8][i as usize % 3];
                let mut c = Case::decode(dtype, group, d, ps, vec![5000, 3, 2700, ps + 1]);
                c.seed = 500 + i;
                check_on(be, &c);
            }
        }
    }
    let mut c = Case::decode(BF16, 4, 128, 16, vec![2700, 900]);
    c.q = Some(vec![9, 1]);
    check_on(be, &c);
    c.window = 700;
    check_on(be, &c);
    // Prefill rows (the tiled kernel) are cut at 2048 keys: a chunk after 2700 cached tokens.
    for dtype in [F32, BF16] {
        let mut c = Case::decode(dtype, 4, 128, 128, vec![2700, 40]);
        c.q = Some(vec![9, 40]);
        check_on(be, &c);
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

/// Run in a child process by `every_cpu_path_matches_reference` with `KVSHARE_CPU_ISA` set
/// (a no-op otherwise): a path the machine runs is the one `kvs_backend_describe` names; one
/// it lacks (or an unknown name) makes `kvs_backend_new` fail with the reason.
#[test]
fn cpu_path_from_env() {
    use kvshare_attention::cpu::{Isa, ISA_ENV};
    let Ok(name) = std::env::var(ISA_ENV) else {
        return;
    };
    let mut b = std::ptr::null_mut();
    let st = unsafe { kvs_backend::kvs_backend_new(0, std::ptr::null(), &mut b) };
    match Isa::parse(&name).map(|i| i.check()) {
        Some(Ok(())) => {
            assert_eq!(st, kvs_status::Ok, "{}", last_error());
            let text = describe(b);
            assert!(
                text.contains(&format!("kernel path {name} (forced by KVSHARE_CPU_ISA)")),
                "{text}"
            );
            // The bf16 pairs are named where the path's kernels use them: all of `avx512`'s
            // with AVX512_BF16, the decode rows of `amx` (which run on `avx512`).
            let isa = Isa::parse(&name).expect("parsed above");
            let want = if isa.bf16_pairs() {
                Some("; bf16 scores and decode values by bf16 pairs")
            } else if isa.vector().bf16_pairs() {
                Some("; bf16 decode scores and values by bf16 pairs")
            } else {
                None
            };
            match want {
                Some(w) => assert!(text.contains(w), "{text}"),
                None => assert!(!text.contains("bf16 pairs"), "{text}"),
            }
            // `amx` names its prefill tiles (bf16 caches), the f16 ones only where CPUID has
            // AMX-FP16, and the vector path that takes the other caches.
            assert_eq!(
                text.contains("; bf16 prefill on AMX tiles (tdpbf16ps)"),
                isa == Isa::Amx,
                "{text}"
            );
            if isa == Isa::Amx {
                let f32_on = format!("f32 on {}", isa.vector().name());
                assert!(text.contains(&f32_on), "{text}");
            }
            assert_eq!(text.contains("tdpfp16ps"), isa.amx_fp16(), "{text}");
            unsafe { kvs_backend::kvs_backend_free(b) };
        }
        Some(Err(why)) => {
            assert_eq!(st, kvs_status::BackendUnavailable);
            assert!(b.is_null());
            assert!(last_error().contains(&why), "{}", last_error());
        }
        None => {
            assert_eq!(st, kvs_status::BackendUnavailable);
            assert!(
                last_error().contains("names no CPU path"),
                "{}",
                last_error()
            );
        }
    }
}

/// Every kernel path this machine has, forced through `KVSHARE_CPU_ISA` in a child run of
/// this test binary, against the f64 reference (the decode and split-K tests); paths it lacks
/// are printed with the reason and checked to be refused.
#[test]
fn every_cpu_path_matches_reference() {
    use kvshare_attention::cpu::{Isa, ISA_ENV};
    if std::env::var_os(ISA_ENV).is_some() {
        return; // a child run
    }
    let exe = std::env::current_exe().expect("test binary path");
    for (name, runs) in Isa::all()
        .iter()
        .map(|i| (i.name(), i.check()))
        .chain([("sse", Err("not a path".to_string()))])
    {
        let mut cmd = std::process::Command::new(&exe);
        cmd.env(ISA_ENV, name)
            .args(["--exact", "cpu_path_from_env"]);
        match &runs {
            // This process already ran every test on the best path.
            Ok(()) if name == Isa::best().name() => {
                println!("CPU path {name}: the default here, tested by this run")
            }
            Ok(()) => {
                println!("CPU path {name}: running the reference tests");
                cmd.args([
                    "decode_all_dtypes_ratios_dims_page_sizes",
                    "decode_split_k_long_sequences",
                    "tiled_prefill_cached_prefix_ragged_chunks",
                ]);
            }
            Err(why) if name == Isa::Avx512.name() => println!(
                "CPU path {name}: skipped here: {why} (run under an x86 emulator by \
                 integration/vllm_ascend/tests/test_ops_emulated.py)"
            ),
            Err(why) => println!("CPU path {name}: skipped: {why}"),
        }
        let out = cmd.output().expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "path {name}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = if runs.is_ok() && name != Isa::best().name() {
            4
        } else {
            1
        };
        assert!(
            text.contains(&format!("{want} passed")),
            "path {name}: expected {want} tests to run: {text}"
        );
    }
}

#[test]
fn backend_lifecycle() {
    unsafe { kvs_backend::kvs_backend_free(std::ptr::null_mut()) };
    let mut b = std::ptr::null_mut();
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_new(0, std::ptr::null(), &mut b) },
        kvs_status::Ok
    );
    assert!(num_threads(b) >= 1);
    unsafe { kvs_backend::kvs_backend_free(b) };

    let mut b = std::ptr::null_mut();
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_new(1, std::ptr::null(), &mut b) },
        kvs_status::BackendUnavailable
    );
    assert!(last_error().contains("libascendcl.so"), "{}", last_error());
    assert!(b.is_null());
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_new(7, std::ptr::null(), &mut b) },
        kvs_status::InvalidArgument
    );
    assert!(last_error().contains("kind"));
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_new(0, std::ptr::null(), std::ptr::null_mut()) },
        kvs_status::NullArgument
    );
    assert!(last_error().contains("backend_out"));
    let opts = kvshare::backend::kvs_backend_options {
        num_threads: 5000,
        device_id: 0,
        library_dir: std::ptr::null(),
    };
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_new(0, &opts, &mut b) },
        kvs_status::InvalidArgument
    );
    assert!(last_error().contains("num_threads"));
    assert!(b.is_null());
    let mut n = 0u32;
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_num_threads(std::ptr::null(), &mut n) },
        kvs_status::NullArgument
    );
}

// ---------------------------------------------------------------------------------------------
// KV write

fn write_case(slot_type: u32, src_dtype: u32, cache_dtype: u32) {
    let (pages, ps, hk, d, n) = (6usize, 4usize, 2usize, 8usize, 7usize);
    let mut rng = Rng(7 + slot_type as u64 * 10 + src_dtype as u64);
    let key = Data::random(src_dtype, n * hk * d, &mut rng);
    let value = Data::random(src_dtype, n * hk * d, &mut rng);
    let mut kc = Data::filled(cache_dtype, pages * ps * hk * d, 9.0);
    let mut vc = Data::filled(cache_dtype, pages * ps * hk * d, 9.0);
    // Last slot of page 5, page 0 slot 0, padding, page 0 slot 1, page 2 slot 1, padding,
    // page 3 slot 2.
    let slots: Vec<i64> = vec![23, 0, -1, 1, 9, -7, 14];
    let s32: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
    let be = new_backend(1);
    let args = kvs_kv_write_args {
        num_tokens: n as u32,
        key: key.ptr(),
        value: value.ptr(),
        src_dtype,
        src_token_stride: 0,
        src_head_stride: 0,
        key_cache: kc.ptr_mut(),
        value_cache: vc.ptr_mut(),
        cache: kvs_backend::kvs_kv_layout_dense(
            cache_dtype,
            pages as u32,
            ps as u32,
            hk as u32,
            d as u32,
        ),
        slot_mapping: if slot_type == 0 {
            s32.as_ptr().cast()
        } else {
            slots.as_ptr().cast()
        },
        slot_mapping_type: slot_type,
    };
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_write(be, &args, std::ptr::null_mut()) },
        kvs_status::Ok,
        "{}",
        last_error()
    );
    let mut want_k = Data::filled(cache_dtype, pages * ps * hk * d, 9.0);
    let mut want_v = want_k.clone();
    for (t, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        for x in 0..hk * d {
            want_k.set(s as usize * hk * d + x, key.get(t * hk * d + x));
            want_v.set(s as usize * hk * d + x, value.get(t * hk * d + x));
        }
    }
    assert_eq!(kc, want_k);
    assert_eq!(vc, want_v);
    unsafe { kvs_backend::kvs_backend_free(be) };
}

#[test]
fn kv_write_int32_and_int64_slots_skip_padding() {
    for slot_type in [0, 1] {
        for dtype in [F32, F16, BF16] {
            write_case(slot_type, dtype, dtype);
        }
    }
    // Conversion on write: f32 keys into f16 and bf16 caches.
    write_case(0, F32, F16);
    write_case(1, F32, BF16);
}

#[test]
fn kv_write_then_attention_matches_reference() {
    // Fill a heads-major cache through kvs_kv_write, then attend through it.
    let mut c = Case::decode(BF16, 4, 64, 16, vec![20, 35]);
    c.heads_major = true;
    let mut b = build(&c);
    let (hk, d) = (c.num_kv_heads, c.head_dim);
    let total: usize = c.ctx.iter().sum();
    let mut rng = Rng(3);
    let key = Data::random(c.dtype, total * hk * d, &mut rng);
    let value = Data::random(c.dtype, total * hk * d, &mut rng);
    let mut slots = Vec::new();
    for (s, &ctx) in c.ctx.iter().enumerate() {
        for t in 0..ctx {
            let page = b.block_table[s * b.bt_stride + t / c.page_size] as i64;
            slots.push(page * c.page_size as i64 + (t % c.page_size) as i64);
        }
    }
    // Shared pages are written twice with different data: the later write wins, and the
    // reference reads whatever the cache holds, so both agree either way.
    let be = new_backend(2);
    let args = kvs_kv_write_args {
        num_tokens: total as u32,
        key: key.ptr(),
        value: value.ptr(),
        src_dtype: c.dtype,
        src_token_stride: 0,
        src_head_stride: 0,
        key_cache: b.k.ptr_mut(),
        value_cache: b.v.ptr_mut(),
        cache: b.layout,
        slot_mapping: slots.as_ptr().cast(),
        slot_mapping_type: 1,
    };
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_write(be, &args, std::ptr::null_mut()) },
        kvs_status::Ok,
        "{}",
        last_error()
    );
    // Spot-check one written row: token 5 of sequence 1, kv head 1.
    let t = c.ctx[0] + 5;
    let page = b.block_table[b.bt_stride + 5 / c.page_size] as usize;
    let off = b.cache_off(page, 5 % c.page_size, 1);
    for x in 0..d {
        assert_eq!(b.k.get(off + x), key.get((t * hk + 1) * d + x));
    }
    let args = b.args();
    assert_eq!(
        unsafe { kvs_backend::kvs_attention_launch(be, &args, std::ptr::null_mut()) },
        kvs_status::Ok
    );
    let want = b.reference();
    for (i, w) in want.iter().enumerate() {
        let got = b.out.get(i);
        assert!(
            (got - w).abs() <= 2e-2 * w.abs() + 2e-3,
            "{i}: {got} vs {w}"
        );
    }
    unsafe { kvs_backend::kvs_backend_free(be) };
}

// ---------------------------------------------------------------------------------------------
// Page copy

#[test]
fn page_copy_whole_partial_and_between_tiers() {
    for heads_major in [false, true] {
        let (pages, host_pages, ps, hk, d) = (5usize, 3usize, 4usize, 2usize, 8usize);
        let mut rng = Rng(11);
        let mut layout =
            kvs_backend::kvs_kv_layout_dense(F16, pages as u32, ps as u32, hk as u32, d as u32);
        if heads_major {
            layout.slot_stride = d;
            layout.head_stride = ps * d;
        }
        let page_elems = ps * hk * d;
        let mut kc = Data::random(F16, pages * page_elems, &mut rng);
        let mut vc = Data::random(F16, pages * page_elems, &mut rng);
        let mut hkc = Data::random(F16, host_pages * page_elems, &mut rng);
        let mut hvc = Data::random(F16, host_pages * page_elems, &mut rng);
        let (k0, v0, hk0, hv0) = (kc.clone(), vc.clone(), hkc.clone(), hvc.clone());
        let copies = [
            kvs_copy {
                src_page: 1,
                dst_page: 3,
                num_tokens: ps as u32,
                kind: 0,
                group: 0,
            }, // whole page D2D
            kvs_copy {
                src_page: 2,
                dst_page: 4,
                num_tokens: 3,
                kind: 0,
                group: 0,
            }, // CoW: 3 slots
            kvs_copy {
                src_page: 0,
                dst_page: 2,
                num_tokens: ps as u32,
                kind: 1,
                group: 0,
            }, // swap out
            kvs_copy {
                src_page: 1,
                dst_page: 0,
                num_tokens: 2,
                kind: 2,
                group: 0,
            }, // partial swap in
        ];
        let args = kvs_kv_copy_args {
            key_cache: kc.ptr_mut(),
            value_cache: vc.ptr_mut(),
            cache: layout,
            host_key_cache: hkc.ptr_mut(),
            host_value_cache: hvc.ptr_mut(),
            num_host_pages: host_pages as u32,
        };
        let be = new_backend(1);
        let st = unsafe {
            kvs_backend::kvs_kv_copy(
                be,
                &args,
                copies.as_ptr(),
                copies.len(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(st, kvs_status::Ok, "{}", last_error());
        unsafe { kvs_backend::kvs_backend_free(be) };

        // Reference: apply the copies in order on per-(page, slot, head) rows.
        let off = |page: usize, slot: usize, head: usize| {
            page * layout.page_stride + slot * layout.slot_stride + head * layout.head_stride
        };
        let (mut wk, mut wv, mut whk, mut whv) = (k0, v0, hk0, hv0);
        for c in &copies {
            for slot in 0..c.num_tokens as usize {
                for head in 0..hk {
                    let (so, dof) = (
                        off(c.src_page as usize, slot, head),
                        off(c.dst_page as usize, slot, head),
                    );
                    for x in 0..d {
                        let (a, b) = match c.kind {
                            0 => (wk.get(so + x), wv.get(so + x)),
                            1 => (wk.get(so + x), wv.get(so + x)),
                            _ => (whk.get(so + x), whv.get(so + x)),
                        };
                        if c.kind == 1 {
                            whk.set(dof + x, a);
                            whv.set(dof + x, b);
                        } else {
                            wk.set(dof + x, a);
                            wv.set(dof + x, b);
                        }
                    }
                }
            }
        }
        assert_eq!(kc, wk, "device K (heads_major {heads_major})");
        assert_eq!(vc, wv, "device V");
        assert_eq!(hkc, whk, "host K");
        assert_eq!(hvc, whv, "host V");
    }
}
