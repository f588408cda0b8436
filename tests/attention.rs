//! Paged attention, KV write and page copy through the C exports, checked against a naive
//! reference written here: gather each sequence's K/V contiguously through the block table,
//! then plain softmax attention in f64.
//!
//! Tolerances (|got - ref| <= rtol * |ref| + rtol / 10), per output dtype:
//! - f32 `1e-4`: inputs are exact in both; the kernel accumulates in f32 (relative error about
//!   `1e-6` over a few hundred terms) and uses a polynomial `exp` (relative error about `2e-7`).
//! - f16 `2e-3`: the reference uses the same stored f16 inputs, so the only extra error is
//!   rounding the output to f16 (half an ulp, `2^-11 = 4.9e-4` relative): 4x margin.
//! - bf16 `2e-2`: as f16 with bf16's half ulp, `2^-8 = 3.9e-3` relative: 5x margin.

mod attention_common;

use attention_common::*;
use kvshare::ffi::attn::{
    kvs_attention_args, kvs_backend, kvs_kv_copy_args, kvs_kv_layout, kvs_kv_write_args,
};
use kvshare::ffi::status::kvs_status;
use kvshare::ffi::types::kvs_copy;

/// One attention test case.
#[derive(Clone)]
struct Case {
    dtype: u32,
    num_kv_heads: usize,
    group: usize,
    head_dim: usize,
    page_size: usize,
    ctx: Vec<usize>,
    /// Query lengths (prefill); `None` = decode.
    q: Option<Vec<usize>>,
    softcap: f32,
    window: usize,
    /// Cache stored `[pages, kv_heads, page_size, head_dim]` (CANN BnNBsD) instead of dense.
    heads_major: bool,
    /// Extra elements of padding in query/output token strides and block-table rows.
    pad: usize,
    seed: u64,
}

impl Case {
    fn decode(
        dtype: u32,
        group: usize,
        head_dim: usize,
        page_size: usize,
        ctx: Vec<usize>,
    ) -> Case {
        Case {
            dtype,
            num_kv_heads: 2,
            group,
            head_dim,
            page_size,
            ctx,
            q: None,
            softcap: 0.0,
            window: 0,
            heads_major: false,
            pad: 0,
            seed: 42,
        }
    }
}

/// Buffers of a built case.
struct Built {
    c: Case,
    h: usize,
    num_tokens: usize,
    max_pages: usize,
    bt_stride: usize,
    layout: kvs_kv_layout,
    q_ts: usize,
    query: Data,
    k: Data,
    v: Data,
    out: Data,
    block_table: Vec<i32>,
    ctx: Vec<i32>,
    qsl: Option<Vec<i32>>,
    scale: f32,
}

fn build(c: &Case) -> Built {
    let mut rng = Rng(c.seed | 1);
    let (ps, hk, d) = (c.page_size, c.num_kv_heads, c.head_dim);
    let h = hk * c.group;
    let n = c.ctx.len();
    let pages_of: Vec<usize> = c.ctx.iter().map(|&x| x.div_ceil(ps)).collect();
    // Sequence i > 0 shares its first full pages with sequence 0 (a common prefix).
    let shared: Vec<usize> = (0..n)
        .map(|i| {
            if i == 0 {
                0
            } else {
                (c.ctx[0].min(c.ctx[i]) / ps).div_ceil(2)
            }
        })
        .collect();
    let fresh: usize = (0..n).map(|i| pages_of[i] - shared[i]).sum();
    let num_pages = fresh + 3;
    let mut free: Vec<i32> = (0..num_pages as i32).collect();
    rng.shuffle(&mut free);
    let max_pages = pages_of.iter().copied().max().unwrap_or(0) + 1;
    let bt_stride = max_pages + c.pad;
    let mut block_table = vec![-1i32; n * bt_stride];
    for i in 0..n {
        for j in 0..pages_of[i] {
            block_table[i * bt_stride + j] = if j < shared[i] {
                block_table[j]
            } else {
                free.pop().expect("enough pages")
            };
        }
    }
    let layout = if c.heads_major {
        kvs_kv_layout {
            dtype: c.dtype,
            num_pages: num_pages as u32,
            page_size: ps as u32,
            num_kv_heads: hk as u32,
            head_dim: d as u32,
            page_stride: ps * hk * d,
            slot_stride: d,
            head_stride: ps * d,
        }
    } else {
        kvshare::ffi::attn::kvs_backend::kvs_kv_layout_dense(
            c.dtype,
            num_pages as u32,
            ps as u32,
            hk as u32,
            d as u32,
        )
    };
    let q_lens = c.q.clone().unwrap_or_else(|| vec![1; n]);
    let num_tokens: usize = q_lens.iter().sum();
    let q_ts = h * d + c.pad;
    let cache_len = num_pages * ps * hk * d;
    let qsl = c.q.as_ref().map(|q| {
        let mut v = vec![0i32];
        for &x in q {
            v.push(v.last().unwrap() + x as i32);
        }
        v
    });
    Built {
        c: c.clone(),
        h,
        num_tokens,
        max_pages,
        bt_stride,
        layout,
        q_ts,
        query: Data::random(c.dtype, num_tokens * q_ts, &mut rng),
        k: Data::random(c.dtype, cache_len, &mut rng),
        v: Data::random(c.dtype, cache_len, &mut rng),
        out: Data::filled(c.dtype, num_tokens * q_ts, 7.0),
        block_table,
        ctx: c.ctx.iter().map(|&x| x as i32).collect(),
        qsl,
        scale: 1.0 / (d as f32).sqrt(),
    }
}

impl Built {
    fn args(&mut self) -> kvs_attention_args {
        kvs_attention_args {
            num_seqs: self.ctx.len() as u32,
            num_tokens: self.num_tokens as u32,
            num_heads: self.h as u32,
            query: self.query.ptr(),
            query_dtype: self.c.dtype,
            query_token_stride: self.q_ts,
            query_head_stride: self.c.head_dim,
            output: self.out.ptr_mut(),
            output_dtype: self.c.dtype,
            output_token_stride: self.q_ts,
            output_head_stride: 0,
            key_cache: self.k.ptr(),
            value_cache: self.v.ptr(),
            cache: self.layout,
            block_table: self.block_table.as_ptr(),
            max_pages_per_seq: self.max_pages as u32,
            block_table_stride: self.bt_stride,
            context_lens: self.ctx.as_ptr(),
            query_start_loc: self.qsl.as_ref().map_or(std::ptr::null(), |q| q.as_ptr()),
            scale: self.scale,
            softcap: self.c.softcap,
            sliding_window: self.c.window as u32,
        }
    }

    fn cache_off(&self, page: usize, slot: usize, head: usize) -> usize {
        let l = &self.layout;
        page * l.page_stride + slot * l.slot_stride + head * l.head_stride
    }

    /// Naive reference output `[num_tokens, h, d]` (dense).
    fn reference(&self) -> Vec<f64> {
        let c = &self.c;
        let (d, hk, ps) = (c.head_dim, c.num_kv_heads, c.page_size);
        let mut out = vec![0f64; self.num_tokens * self.h * d];
        let mut tok = 0;
        for (s, &ctx) in c.ctx.iter().enumerate() {
            // Gather this sequence's K and V contiguously: [ctx][kv_head][d].
            let mut kk = vec![0f64; ctx * hk * d];
            let mut vv = vec![0f64; ctx * hk * d];
            for t in 0..ctx {
                let page = self.block_table[s * self.bt_stride + t / ps] as usize;
                for kh in 0..hk {
                    let off = self.cache_off(page, t % ps, kh);
                    for x in 0..d {
                        kk[(t * hk + kh) * d + x] = self.k.get(off + x);
                        vv[(t * hk + kh) * d + x] = self.v.get(off + x);
                    }
                }
            }
            let ql = c.q.as_ref().map_or(1, |q| q[s]);
            for i in 0..ql {
                let pos = ctx - ql + i;
                let first = if c.window > 0 {
                    (pos + 1).saturating_sub(c.window)
                } else {
                    0
                };
                for hh in 0..self.h {
                    let kh = hh / c.group;
                    let q: Vec<f64> = (0..d)
                        .map(|x| self.query.get(tok * self.q_ts + hh * d + x))
                        .collect();
                    let mut sc: Vec<f64> = (first..=pos)
                        .map(|j| {
                            let dot: f64 = (0..d).map(|x| q[x] * kk[(j * hk + kh) * d + x]).sum();
                            let s = dot * self.scale as f64;
                            if c.softcap > 0.0 {
                                c.softcap as f64 * (s / c.softcap as f64).tanh()
                            } else {
                                s
                            }
                        })
                        .collect();
                    let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    sc.iter_mut().for_each(|x| *x = (*x - m).exp());
                    let l: f64 = sc.iter().sum();
                    for x in 0..d {
                        let o: f64 = (first..=pos)
                            .zip(&sc)
                            .map(|(j, p)| p * vv[(j * hk + kh) * d + x])
                            .sum();
                        out[(tok * self.h + hh) * d + x] = o / l;
                    }
                }
                tok += 1;
            }
        }
        out
    }
}

fn rtol(dtype: u32) -> f64 {
    match dtype {
        F32 => 1e-4,
        F16 => 2e-3,
        _ => 2e-2,
    }
}

/// Runs a case on `backend` and compares every output element with the reference.
fn check_on(backend: *const kvs_backend, c: &Case) {
    let mut b = build(c);
    let args = b.args();
    let st = kvs_backend::kvs_attention_launch(backend, &args, std::ptr::null_mut());
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    let want = b.reference();
    let tol = rtol(c.dtype);
    let d = c.head_dim;
    for t in 0..b.num_tokens {
        for hh in 0..b.h {
            for x in 0..d {
                let got = b.out.get(t * b.q_ts + hh * d + x);
                let r = want[(t * b.h + hh) * d + x];
                assert!(
                    (got - r).abs() <= tol * r.abs() + tol / 10.0,
                    "dtype {} group {} d {d} ps {} token {t} head {hh} dim {x}: got {got}, want {r}",
                    c.dtype,
                    c.group,
                    c.page_size
                );
            }
        }
        // Padding between token rows is never written.
        for x in b.h * d..b.q_ts {
            assert_eq!(b.out.get(t * b.q_ts + x), 7.0);
        }
    }
}

fn check(c: &Case) {
    let be = new_backend(2);
    check_on(be, c);
    kvs_backend::kvs_backend_free(be);
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
            for d in [64, 128] {
                for ps in [16, 128] {
                    let mut c = Case::decode(dtype, group, d, ps, ragged(ps));
                    c.seed = (dtype as u64 + 1) * 1000 + group as u64 * 100 + d as u64 + ps as u64;
                    check_on(be, &c);
                }
            }
        }
    }
    kvs_backend::kvs_backend_free(be);
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
    kvs_backend::kvs_backend_free(be);
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
    // The 1300-token sequence is split into key chunks; the cut must not depend on threads.
    let c = Case {
        q: Some(vec![5, 1, 20, 1]),
        ..Case::decode(F16, 4, 64, 16, vec![40, 17, 20, 1300])
    };
    let mut outs = Vec::new();
    for threads in [1, 3] {
        let be = new_backend(threads);
        let mut n = 0u32;
        assert_eq!(
            kvs_backend::kvs_backend_num_threads(be, &mut n),
            kvs_status::Ok
        );
        assert_eq!(n, threads);
        let mut b = build(&c);
        let args = b.args();
        assert_eq!(
            kvs_backend::kvs_attention_launch(be, &args, std::ptr::null_mut()),
            kvs_status::Ok
        );
        outs.push(b.out);
        kvs_backend::kvs_backend_free(be);
    }
    assert_eq!(outs[0], outs[1], "work split must not change results");
}

/// Split-K: sequences long enough to be cut into key chunks (over 640 tokens: 3 and 2 parts), next to short
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
                let mut c = Case::decode(dtype, group, d, ps, vec![1300, 3, 700, ps + 1]);
                c.seed = 500 + i;
                check_on(be, &c);
            }
        }
    }
    let mut c = Case::decode(BF16, 4, 128, 16, vec![1300, 900]);
    c.q = Some(vec![9, 1]);
    check_on(be, &c);
    c.window = 700;
    check_on(be, &c);
    kvs_backend::kvs_backend_free(be);
}

/// Run in a child process by `every_cpu_path_matches_reference` with `KVSHARE_CPU_ISA` set
/// (a no-op otherwise): a path the machine runs is the one `kvs_backend_describe` names; one
/// it lacks (or an unknown name) makes `kvs_backend_new` fail with the reason.
#[test]
fn cpu_path_from_env() {
    use kvshare::attention::cpu::{Isa, ISA_ENV};
    let Ok(name) = std::env::var(ISA_ENV) else {
        return;
    };
    let mut b = std::ptr::null_mut();
    let st = kvs_backend::kvs_backend_new(0, std::ptr::null(), &mut b);
    match Isa::parse(&name).map(|i| i.check()) {
        Some(Ok(())) => {
            assert_eq!(st, kvs_status::Ok, "{}", last_error());
            let mut buf = vec![0u8; 512];
            let mut len = 0usize;
            let st = kvs_backend::kvs_backend_describe(b, buf.as_mut_ptr().cast(), 512, &mut len);
            assert_eq!(st, kvs_status::Ok);
            let text = String::from_utf8_lossy(&buf[..len]).into_owned();
            assert!(
                text.contains(&format!("kernel path {name} (forced by KVSHARE_CPU_ISA)")),
                "{text}"
            );
            kvs_backend::kvs_backend_free(b);
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
    use kvshare::attention::cpu::{Isa, ISA_ENV};
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
                ]);
            }
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
            3
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
    kvs_backend::kvs_backend_free(std::ptr::null_mut());
    let mut b = std::ptr::null_mut();
    assert_eq!(
        kvs_backend::kvs_backend_new(0, std::ptr::null(), &mut b),
        kvs_status::Ok
    );
    let mut n = 0u32;
    assert_eq!(
        kvs_backend::kvs_backend_num_threads(b, &mut n),
        kvs_status::Ok
    );
    assert!(n >= 1);
    kvs_backend::kvs_backend_free(b);

    let mut b = std::ptr::null_mut();
    assert_eq!(
        kvs_backend::kvs_backend_new(1, std::ptr::null(), &mut b),
        kvs_status::BackendUnavailable
    );
    assert!(last_error().contains("libascendcl.so"), "{}", last_error());
    assert!(b.is_null());
    assert_eq!(
        kvs_backend::kvs_backend_new(7, std::ptr::null(), &mut b),
        kvs_status::InvalidArgument
    );
    assert!(last_error().contains("kind"));
    assert_eq!(
        kvs_backend::kvs_backend_new(0, std::ptr::null(), std::ptr::null_mut()),
        kvs_status::NullArgument
    );
    assert!(last_error().contains("backend_out"));
    let opts = kvshare::ffi::attn::kvs_backend_options {
        num_threads: 5000,
        device_id: 0,
        library_dir: std::ptr::null(),
    };
    assert_eq!(
        kvs_backend::kvs_backend_new(0, &opts, &mut b),
        kvs_status::InvalidArgument
    );
    assert!(last_error().contains("num_threads"));
    assert!(b.is_null());
    assert_eq!(
        kvs_backend::kvs_backend_num_threads(std::ptr::null(), &mut n),
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
        kvs_backend::kvs_kv_write(be, &args, std::ptr::null_mut()),
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
    kvs_backend::kvs_backend_free(be);
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
        kvs_backend::kvs_kv_write(be, &args, std::ptr::null_mut()),
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
        kvs_backend::kvs_attention_launch(be, &args, std::ptr::null_mut()),
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
    kvs_backend::kvs_backend_free(be);
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
            }, // whole page D2D
            kvs_copy {
                src_page: 2,
                dst_page: 4,
                num_tokens: 3,
                kind: 0,
            }, // CoW: 3 slots
            kvs_copy {
                src_page: 0,
                dst_page: 2,
                num_tokens: ps as u32,
                kind: 1,
            }, // swap out
            kvs_copy {
                src_page: 1,
                dst_page: 0,
                num_tokens: 2,
                kind: 2,
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
        let st = kvs_backend::kvs_kv_copy(
            be,
            &args,
            copies.as_ptr(),
            copies.len(),
            std::ptr::null_mut(),
        );
        assert_eq!(st, kvs_status::Ok, "{}", last_error());
        kvs_backend::kvs_backend_free(be);

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
