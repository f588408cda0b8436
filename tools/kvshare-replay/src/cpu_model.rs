//! The model step on the CPU attention backend: a small transformer's KV traffic with
//! deterministic values. For each layer and each new token, Q, K and V are pseudo-random
//! functions of (seed, layer, token id, position), so a page's KV is the same whoever computes
//! it, exactly as sharing assumes. K and V are written through the cache manager's slot mapping
//! (`kv_write`), attention reads them through its block tables (`attention`), and the page copies
//! it reports (copy-on-write, swap, demotion, promotion) run on the backend (`copy_pages`).
//!
//! With `verify`, every attention output row is compared with a dense reference recomputed
//! from the token ids, so a page shared with the wrong request, a missed copy-on-write or a
//! stale page after eviction shows up as a wrong number.

use half::{bf16, f16};

use kvshare_attention::cpu::CpuBackend;
use kvshare_attention::{
    AttnBatch, AttnBuffers, AttnParams, Backend, Buf, BufMut, CacheLayout, CopyCaches, CopyParams,
    Fp8, Fp8E4M3, Fp8E5M2, KvCachesMut, KvScales, KvWrite, KvWriteParams, PageCopyBatch,
    SlotMapping, TokenStrides,
};
use kvshare_core::alloc::try_vec;
use kvshare_core::{DType, PageCopy};

use super::model::{Forward, Geometry, Model};
use super::rng::{mix, Rng};

/// One layer's K or V cache.
#[derive(Debug)]
enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    Fp8E4M3(Vec<Fp8E4M3>),
    Fp8E5M2(Vec<Fp8E5M2>),
}

/// Element types whose every bit pattern is a value and that have no padding.
trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for f16 {}
impl Plain for bf16 {}
impl Plain for Fp8E4M3 {}
impl Plain for Fp8E5M2 {}

fn bytes_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    let n = std::mem::size_of_val(v);
    // SAFETY: `T` is f32, f16, bf16 or an fp8 byte: no padding, any byte pattern is a valid value, and u8
    // has alignment 1; the slice borrows `v` mutably for its whole life.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), n) }
}

impl Store {
    /// `n` zeroes; an error (not an abort) when the memory cannot be had.
    fn new(dtype: DType, n: usize) -> Result<Store, String> {
        let what = "KV cache of the CPU model";
        Ok(match dtype {
            DType::F32 => Store::F32(try_vec(n, 0.0, what).map_err(|e| e.to_string())?),
            DType::F16 => Store::F16(try_vec(n, f16::ZERO, what).map_err(|e| e.to_string())?),
            DType::BF16 => Store::BF16(try_vec(n, bf16::ZERO, what).map_err(|e| e.to_string())?),
            DType::Fp8E4M3 => {
                Store::Fp8E4M3(try_vec(n, Fp8E4M3(0), what).map_err(|e| e.to_string())?)
            }
            DType::Fp8E5M2 => {
                Store::Fp8E5M2(try_vec(n, Fp8E5M2(0), what).map_err(|e| e.to_string())?)
            }
            DType::Int8 => {
                return Err(
                    "the CPU model runs f32, f16, bf16 and fp8 caches, not int8 (it has \
                            no per-channel scales)"
                        .into(),
                )
            }
            DType::Int8PerTokenHead => {
                return Err("the CPU model runs f32, f16, bf16 and fp8 caches, not \
                            int8_per_token_head (its reference rounds element by element)"
                    .into())
            }
        })
    }
    fn buf(&self) -> Buf<'_> {
        match self {
            Store::F32(v) => Buf::F32(v),
            Store::F16(v) => Buf::F16(v),
            Store::BF16(v) => Buf::BF16(v),
            Store::Fp8E4M3(v) => Buf::Fp8E4M3(v),
            Store::Fp8E5M2(v) => Buf::Fp8E5M2(v),
        }
    }
    fn buf_mut(&mut self) -> BufMut<'_> {
        match self {
            Store::F32(v) => BufMut::F32(v),
            Store::F16(v) => BufMut::F16(v),
            Store::BF16(v) => BufMut::BF16(v),
            Store::Fp8E4M3(v) => BufMut::Fp8E4M3(v),
            Store::Fp8E5M2(v) => BufMut::Fp8E5M2(v),
        }
    }
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Store::F32(v) => bytes_mut(v),
            Store::F16(v) => bytes_mut(v),
            Store::BF16(v) => bytes_mut(v),
            Store::Fp8E4M3(v) => bytes_mut(v),
            Store::Fp8E5M2(v) => bytes_mut(v),
        }
    }
}

/// Rounds `x` to what a cache of `dtype` stores.
fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::Fp8E4M3 => Fp8E4M3::from_f32(x).to_f32(),
        DType::Fp8E5M2 => Fp8E5M2::from_f32(x).to_f32(),
        DType::Int8 => x.round_ties_even().clamp(-128.0, 127.0),
        DType::Int8PerTokenHead => unreachable!("Store::new refuses int8_per_token_head"),
    }
}

/// Attention and KV write on [`CpuBackend`] for every step.
pub struct CpuModel {
    backend: CpuBackend,
    geo: Geometry,
    layout: CacheLayout,
    host_pages: usize,
    seed: u64,
    k: Vec<Store>,
    v: Vec<Store>,
    hk: Vec<Store>,
    hv: Vec<Store>,
    q: Vec<f32>,
    kn: Vec<f32>,
    vn: Vec<f32>,
    out: Vec<f32>,
    verify: bool,
    /// Output rows compared with the dense reference.
    pub verified_rows: u64,
    /// Sum of every output element (a cheap fingerprint of the run).
    pub checksum: f64,
}

impl std::fmt::Debug for CpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuModel")
            .field("geo", &self.geo)
            .field("layout", &self.layout)
            .field("host_pages", &self.host_pages)
            .finish()
    }
}

impl CpuModel {
    /// Caches for `device_pages` (and `host_pages`) pages of `page_size` tokens per layer, and a
    /// backend on `threads` threads (0: all cores).
    pub fn new(
        geo: Geometry,
        page_size: u32,
        device_pages: u32,
        host_pages: u32,
        threads: usize,
        seed: u64,
        verify: bool,
    ) -> Result<Self, String> {
        let layout = CacheLayout::dense(
            geo.dtype,
            device_pages as usize,
            page_size as usize,
            geo.kv_heads as usize,
            geo.head_dim as usize,
        );
        let n = layout.validate().map_err(|e| e.to_string())?;
        let host_n = n / device_pages as usize * host_pages as usize;
        let backend = CpuBackend::new(threads).map_err(|e| e.to_string())?;
        let layers = geo.layers as usize;
        let stores = |n: usize| -> Result<Vec<Store>, String> {
            (0..layers).map(|_| Store::new(geo.dtype, n)).collect()
        };
        let (hk, hv) = if host_pages > 0 {
            (stores(host_n)?, stores(host_n)?)
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(CpuModel {
            backend,
            geo,
            layout,
            host_pages: host_pages as usize,
            seed,
            k: stores(n)?,
            v: stores(n)?,
            hk,
            hv,
            q: Vec::new(),
            kn: Vec::new(),
            vn: Vec::new(),
            out: Vec::new(),
            verify,
            verified_rows: 0,
            checksum: 0.0,
        })
    }

    fn token_rng(&self, layer: usize, token: i32, pos: i32) -> Rng {
        Rng::new(mix(self.seed
            ^ mix(((layer as u64) << 56)
                ^ ((pos as u64) << 24)
                ^ token as u32 as u64)))
    }

    /// Q, K and V of one token in one layer: `q` gets heads × head_dim values, `k` and `v`
    /// kv_heads × head_dim.
    fn qkv(&self, layer: usize, token: i32, pos: i32, q: &mut [f32], k: &mut [f32], v: &mut [f32]) {
        let mut r = self.token_rng(layer, token, pos);
        for x in k.iter_mut() {
            *x = r.unit();
        }
        for x in v.iter_mut() {
            *x = r.unit();
        }
        for x in q.iter_mut() {
            *x = r.unit();
        }
    }

    fn check(&self, layer: usize, f: &Forward<'_>, scale: f32) -> Result<u64, String> {
        let (h, kvh, d) = (
            self.geo.heads() as usize,
            self.geo.kv_heads as usize,
            self.geo.head_dim as usize,
        );
        let g = h / kvh;
        let dt = self.geo.dtype;
        let mut rows = 0;
        let (mut q, mut k, mut v) = (vec![0f32; h * d], vec![0f32; kvh * d], vec![0f32; kvh * d]);
        for s in 0..f.num_seqs {
            let hist = &f.history[s];
            let ctx = f.context_lens[s] as usize;
            if hist.len() != ctx {
                return Err(format!(
                    "history of sequence {s} has {} tokens, context {ctx}",
                    hist.len()
                ));
            }
            let (a, b) = (f.query_start[s] as usize, f.query_start[s + 1] as usize);
            let mut keys = vec![0f32; ctx * kvh * d];
            let mut vals = vec![0f32; ctx * kvh * d];
            for (p, &t) in hist.iter().enumerate() {
                self.qkv(layer, t, p as i32, &mut q, &mut k, &mut v);
                for (dst, &x) in keys[p * kvh * d..][..kvh * d].iter_mut().zip(&k) {
                    *dst = round(dt, x);
                }
                for (dst, &x) in vals[p * kvh * d..][..kvh * d].iter_mut().zip(&v) {
                    *dst = round(dt, x);
                }
            }
            for (i, tok) in (a..b).enumerate() {
                let pos = ctx - (b - a) + i;
                self.qkv(layer, hist[pos], pos as i32, &mut q, &mut k, &mut v);
                for head in 0..h {
                    let kv = head / g;
                    let qh = &q[head * d..(head + 1) * d];
                    let scores: Vec<f32> = (0..=pos)
                        .map(|j| {
                            let kj = &keys[(j * kvh + kv) * d..][..d];
                            scale * qh.iter().zip(kj).map(|(x, y)| x * y).sum::<f32>()
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let w: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f32 = w.iter().sum();
                    let got = &self.out[(tok * h + head) * d..][..d];
                    for c in 0..d {
                        let want: f32 = (0..=pos)
                            .map(|j| w[j] * vals[(j * kvh + kv) * d + c])
                            .sum::<f32>()
                            / z;
                        if (want - got[c]).abs() > 2e-3 + 2e-3 * want.abs() {
                            return Err(format!(
                                "attention output differs from the dense reference: layer {layer}, sequence {s}, position {pos}, head {head}, element {c}: {} vs {want}",
                                got[c]
                            ));
                        }
                    }
                    rows += 1;
                }
            }
        }
        Ok(rows)
    }
}

impl Model for CpuModel {
    fn describe(&self) -> String {
        format!(
            "CPU attention backend ({} threads): {}, KV write + paged attention every step{}",
            self.backend.num_threads(),
            self.geo.describe(),
            if self.verify {
                ", every output row checked against a dense reference"
            } else {
                ""
            }
        )
    }

    fn wants_history(&self) -> bool {
        self.verify
    }

    fn copy_pages(&mut self, copies: &[PageCopy]) -> Result<(), String> {
        let copies: Vec<PageCopy> = copies
            .iter()
            .filter(|c| c.num_tokens > 0)
            .copied()
            .collect();
        if copies.is_empty() {
            return Ok(());
        }
        let params = CopyParams {
            cache: self.layout,
            num_host_pages: self.host_pages,
        };
        for l in 0..self.geo.layers as usize {
            let (mut ek, mut ev) = (Vec::<u8>::new(), Vec::<u8>::new());
            let (hk, hv): (&mut [u8], &mut [u8]) = if self.host_pages > 0 {
                (self.hk[l].bytes(), self.hv[l].bytes())
            } else {
                (&mut ek, &mut ev)
            };
            let caches = CopyCaches {
                key_cache: self.k[l].bytes(),
                value_cache: self.v[l].bytes(),
                host_key_cache: hk,
                host_value_cache: hv,
            };
            let b = PageCopyBatch::new(params, caches, &copies).map_err(|e| e.to_string())?;
            self.backend.copy_pages(b).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn forward(&mut self, f: &Forward<'_>) -> Result<(), String> {
        let t = f.num_tokens();
        if t == 0 {
            return Ok(());
        }
        let (h, kvh, d) = (
            self.geo.heads() as usize,
            self.geo.kv_heads as usize,
            self.geo.head_dim as usize,
        );
        let scale = 1.0 / (d as f32).sqrt();
        for l in 0..self.geo.layers as usize {
            let mut q = std::mem::take(&mut self.q);
            let mut kn = std::mem::take(&mut self.kn);
            let mut vn = std::mem::take(&mut self.vn);
            q.resize(t * h * d, 0.0);
            kn.resize(t * kvh * d, 0.0);
            vn.resize(t * kvh * d, 0.0);
            for i in 0..t {
                self.qkv(
                    l,
                    f.tokens[i],
                    f.positions[i],
                    &mut q[i * h * d..(i + 1) * h * d],
                    &mut kn[i * kvh * d..(i + 1) * kvh * d],
                    &mut vn[i * kvh * d..(i + 1) * kvh * d],
                );
            }
            let wp = KvWriteParams {
                num_tokens: t,
                src_dtype: DType::F32,
                src_strides: TokenStrides::dense(kvh, d),
                cache: self.layout,
                scales: KvScales::ONE,
            };
            let (kc, vc) = (&mut self.k[l], &mut self.v[l]);
            let w = KvWrite::new(
                wp,
                Buf::F32(&kn),
                Buf::F32(&vn),
                SlotMapping::I64(f.slots),
                KvCachesMut::Split {
                    key: kc.buf_mut(),
                    value: vc.buf_mut(),
                },
                None,
            )
            .map_err(|e| format!("kv_write: {e}"))?;
            self.backend
                .kv_write(w)
                .map_err(|e| format!("kv_write: {e}"))?;
            let ap = AttnParams {
                num_seqs: f.num_seqs,
                num_tokens: t,
                num_heads: h,
                query_dtype: DType::F32,
                query_strides: TokenStrides::dense(h, d),
                output_dtype: DType::F32,
                output_strides: TokenStrides::dense(h, d),
                cache: self.layout,
                max_pages_per_seq: f.max_pages,
                block_table_stride: f.max_pages,
                varlen: !f.decode,
                scale,
                softcap: 0.0,
                sliding_window: 0,
                kv_scales: KvScales::ONE,
            };
            self.out.resize(t * h * d, 0.0);
            let batch = AttnBatch::new(
                ap,
                AttnBuffers {
                    query: Buf::F32(&q),
                    key_cache: self.k[l].buf(),
                    value_cache: self.v[l].buf(),
                    block_table: f.block_table,
                    context_lens: f.context_lens,
                    query_start_loc: (!f.decode).then_some(f.query_start),
                    output: BufMut::F32(&mut self.out),
                    channel_scales: None,
                },
            )
            .map_err(|e| format!("attention: {e}"))?;
            self.backend
                .attention(batch)
                .map_err(|e| format!("attention: {e}"))?;
            self.checksum += self.out.iter().map(|&x| x as f64).sum::<f64>();
            (self.q, self.kn, self.vn) = (q, kn, vn);
            if self.verify {
                self.verified_rows += self.check(l, f, scale)?;
            }
        }
        Ok(())
    }
}
