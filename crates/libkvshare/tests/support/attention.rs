//! Helpers shared by the attention tests (`attention.rs`, `attention_errors.rs`, `ascend.rs`): a
//! deterministic RNG, typed host buffers, a CPU backend, the attention case builder ([`build`])
//! and the naive f64 reference ([`Built::reference`]): gather each sequence's K/V contiguously
//! through the block table, then plain softmax attention in f64; and the positions a
//! sliding-window group's table releases ([`window_released`]), asked of the cache.

use std::ffi::{c_void, CStr};

use half::{bf16, f16};
use kvshare::attn_args::{kvs_attention_args, kvs_kv_layout};
use kvshare::backend::kvs_backend;
use kvshare::cache::{kvs_cache, kvs_config};
use kvshare::enums::{kvs_group_kind, kvs_status};
use kvshare::groups::{kvs_group, KVS_NULL_PAGE};

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const BF16: u32 = 2;

/// Relative tolerance of an output dtype against the f64 reference:
/// |got - ref| <= rtol * |ref| + rtol / 10.
pub fn rtol(dtype: u32) -> f64 {
    match dtype {
        F32 => 1e-4,
        F16 => 2e-3,
        _ => 2e-2,
    }
}

/// xorshift64*: deterministic, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// A host buffer of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Data {
    pub fn filled(dtype: u32, n: usize, v: f64) -> Data {
        match dtype {
            F32 => Data::F32(vec![v as f32; n]),
            F16 => Data::F16(vec![f16::from_f64(v); n]),
            _ => Data::BF16(vec![bf16::from_f64(v); n]),
        }
    }
    pub fn random(dtype: u32, n: usize, rng: &mut Rng) -> Data {
        let mut d = Data::filled(dtype, n, 0.0);
        for i in 0..n {
            d.set(i, rng.unit());
        }
        d
    }
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Data::F32(v) => v[i] as f64,
            Data::F16(v) => v[i].to_f64(),
            Data::BF16(v) => v[i].to_f64(),
        }
    }
    pub fn set(&mut self, i: usize, x: f64) {
        match self {
            Data::F32(v) => v[i] = x as f32,
            Data::F16(v) => v[i] = f16::from_f64(x),
            Data::BF16(v) => v[i] = bf16::from_f64(x),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
        }
    }
    pub fn ptr(&self) -> *const c_void {
        match self {
            Data::F32(v) => v.as_ptr().cast(),
            Data::F16(v) => v.as_ptr().cast(),
            Data::BF16(v) => v.as_ptr().cast(),
        }
    }
    pub fn ptr_mut(&mut self) -> *mut c_void {
        match self {
            Data::F32(v) => v.as_mut_ptr().cast(),
            Data::F16(v) => v.as_mut_ptr().cast(),
            Data::BF16(v) => v.as_mut_ptr().cast(),
        }
    }
}

pub fn new_backend(num_threads: u32) -> *mut kvs_backend {
    let opts = kvshare::backend::kvs_backend_options {
        num_threads,
        device_id: 0,
        library_dir: std::ptr::null(),
    };
    let mut b = std::ptr::null_mut();
    let st = unsafe { kvs_backend::kvs_backend_new(0, &opts, &mut b) };
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    assert!(!b.is_null());
    b
}

/// The block-table positions a sliding-window group of `window` tokens has released once
/// `computed` of a sequence's `num_tokens` tokens have KV (vLLM's `remove_skipped_blocks`), asked
/// of a cache of that one group through the C ABI (`kvs_seq_begin`, `kvs_seq_release_skipped`,
/// `kvs_seq_pages`): a kernel test that leaves these positions unreadable checks that the
/// cache's window and the kernel's are the same window.
pub fn window_released(
    window: u32,
    page_size: u32,
    num_tokens: usize,
    computed: usize,
) -> Vec<usize> {
    let group = kvs_group {
        kind: kvs_group_kind::SlidingWindow as u32,
        window,
        page_bytes: 0,
        flags: 0,
    };
    let num_pages = num_tokens.div_ceil(page_size as usize);
    let cfg = kvs_config {
        page_size,
        num_device_pages: u32::try_from(num_pages).unwrap() + 1,
        enable_prefix_caching: false,
        reserve_null_page: true,
        groups: &group,
        num_groups: 1,
        ..kvs_cache::kvs_config_default()
    };
    let tokens: Vec<i32> = (0..num_tokens as i32).collect();
    let mut pages = vec![u32::MAX; num_pages];
    let mut n = 0;
    // SAFETY: every pointer is to a live local of the length given beside it; the cache is
    // created, used and freed here.
    unsafe {
        let mut c = std::ptr::null_mut();
        assert_eq!(
            kvs_cache::kvs_cache_new(&cfg, &mut c),
            kvs_status::Ok,
            "{}",
            last_error()
        );
        let ok = [
            kvs_cache::kvs_seq_begin(
                c,
                1,
                tokens.as_ptr(),
                num_tokens,
                std::ptr::null(),
                0,
                0,
                std::ptr::null_mut(),
            ),
            kvs_cache::kvs_seq_release_skipped(c, 1, computed, std::ptr::null_mut()),
            kvs_cache::kvs_seq_pages(c, 0, 1, pages.as_mut_ptr(), pages.len(), &mut n),
            kvs_cache::kvs_cache_check(c),
        ];
        kvs_cache::kvs_cache_free(c);
        assert_eq!(ok, [kvs_status::Ok; 4], "{}", last_error());
    }
    assert_eq!(n, num_pages);
    (0..n).filter(|&j| pages[j] == KVS_NULL_PAGE).collect()
}

/// `kvs_backend_describe` of `b`, whole (its length asked for first).
pub fn describe(b: *mut kvs_backend) -> String {
    let mut n = 0usize;
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_describe(b, std::ptr::null_mut(), 0, &mut n) },
        kvs_status::Ok
    );
    let mut buf = vec![0u8; n + 1];
    let mut m = 0usize;
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_describe(b, buf.as_mut_ptr().cast(), buf.len(), &mut m) },
        kvs_status::Ok
    );
    assert_eq!(m, n);
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

/// `kvs_backend_num_threads` of `b`.
pub fn num_threads(b: *mut kvs_backend) -> u32 {
    let mut n = 0u32;
    assert_eq!(
        unsafe { kvs_backend::kvs_backend_num_threads(b, &mut n) },
        kvs_status::Ok
    );
    n
}

pub fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(kvs_status::kvs_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// One attention test case.
#[derive(Clone)]
pub struct Case {
    pub dtype: u32,
    pub num_kv_heads: usize,
    pub group: usize,
    pub head_dim: usize,
    pub page_size: usize,
    pub ctx: Vec<usize>,
    /// Query lengths (prefill); `None` = decode.
    pub q: Option<Vec<usize>>,
    pub softcap: f32,
    pub window: usize,
    /// Cache stored `[pages, kv_heads, page_size, head_dim]` (CANN BnNBsD) instead of dense.
    pub heads_major: bool,
    /// Extra elements of padding in query/output token strides and block-table rows.
    pub pad: usize,
    pub seed: u64,
}

impl Case {
    pub fn decode(
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
pub struct Built {
    pub c: Case,
    pub h: usize,
    pub num_tokens: usize,
    pub max_pages: usize,
    pub bt_stride: usize,
    pub layout: kvs_kv_layout,
    pub q_ts: usize,
    pub query: Data,
    pub k: Data,
    pub v: Data,
    pub out: Data,
    pub block_table: Vec<i32>,
    pub ctx: Vec<i32>,
    pub qsl: Option<Vec<i32>>,
    pub scale: f32,
}

pub fn build(c: &Case) -> Built {
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
        kvs_backend::kvs_kv_layout_dense(c.dtype, num_pages as u32, ps as u32, hk as u32, d as u32)
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
    /// Args over this case's host buffers (for the CPU backend).
    pub fn args(&mut self) -> kvs_attention_args {
        let out = self.out.ptr_mut();
        self.args_over(
            self.query.ptr(),
            out,
            self.k.ptr(),
            self.v.ptr(),
            self.block_table.as_ptr(),
        )
    }

    /// Args over the given memory: host buffers for the CPU, device addresses for Ascend.
    pub fn args_over(
        &self,
        query: *const c_void,
        output: *mut c_void,
        key_cache: *const c_void,
        value_cache: *const c_void,
        block_table: *const i32,
    ) -> kvs_attention_args {
        kvs_attention_args {
            num_seqs: self.ctx.len() as u32,
            num_tokens: self.num_tokens as u32,
            num_heads: self.h as u32,
            query,
            query_dtype: self.c.dtype,
            query_token_stride: self.q_ts,
            query_head_stride: self.c.head_dim,
            output,
            output_dtype: self.c.dtype,
            output_token_stride: self.q_ts,
            output_head_stride: 0,
            key_cache,
            value_cache,
            cache: self.layout,
            block_table,
            max_pages_per_seq: self.max_pages as u32,
            block_table_stride: self.bt_stride,
            context_lens: self.ctx.as_ptr(),
            query_start_loc: self.qsl.as_ref().map_or(std::ptr::null(), |q| q.as_ptr()),
            scale: self.scale,
            softcap: self.c.softcap,
            sliding_window: self.c.window as u32,
        }
    }

    pub fn cache_off(&self, page: usize, slot: usize, head: usize) -> usize {
        let l = &self.layout;
        page * l.page_stride + slot * l.slot_stride + head * l.head_stride
    }

    /// Asserts every output element equals `want` (the reference, `[num_tokens, h, d]`) within
    /// `rtol` of the case's dtype; `what` names the case in the failure message.
    pub fn assert_output(&self, want: &[f64], what: &str) {
        let tol = rtol(self.c.dtype);
        let d = self.c.head_dim;
        for t in 0..self.num_tokens {
            for hh in 0..self.h {
                for x in 0..d {
                    let got = self.out.get(t * self.q_ts + hh * d + x);
                    let r = want[(t * self.h + hh) * d + x];
                    assert!(
                        (got - r).abs() <= tol * r.abs() + tol / 10.0,
                        "{what} token {t} head {hh} dim {x}: got {got}, want {r}",
                    );
                }
            }
        }
    }

    /// Naive reference output `[num_tokens, h, d]` (dense).
    pub fn reference(&self) -> Vec<f64> {
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
