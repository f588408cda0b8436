//! `kvshare-bench attention --prefill`: full causal prefill (every token of every sequence is a
//! query) or, with `--chunk N`, chunked prefill (the last N tokens of each sequence are the
//! queries, the rest a cached prefix) in f32 and bf16. Per kernel path, kvshare's tiled prefill kernel and, as the same-run
//! baseline, the decode kernel on the same rows; against torch's causal
//! `scaled_dot_product_attention` and vLLM's CPU kernel (`cpu_attention_with_kv_cache` with the
//! whole prompt as the query, as vLLM 0.23 calls it for prefill on x86) on the same logical
//! Q/K/V (`attention_prefill.py`, run as a server by `$KVS_VLLM_PYTHON`, else
//! `$KVS_TORCH_PYTHON`, else `python3`). Every round launches each side once in turn; each
//! side's best of N rounds is reported in tokens per second, with the ratios.
//!
//! With a quantized `--dtype` (fp8_e4m3, fp8_e5m2, int8 with per-channel scales 2^-8) one run
//! replaces the two: the query bf16, per path kvshare's prefill on the quantized cache (tiled and
//! decode kernel) and on the same K/V, its values exactly, as bf16, in the same rounds; torch's
//! SDPA on those bf16 values; and for fp8, vLLM's kernel on its own fp8 cache holding the same
//! stored bytes (`kv_cache_dtype`, per-tensor scales 1; vLLM has no int8 CPU cache).

use std::time::Instant;

use half::bf16;
use kvshare_attention::cpu::{CpuBackend, Isa};
use kvshare_attention::{
    fp8, AttnBatch, AttnBuffers, AttnParams, Backend, Buf, BufMut, CacheLayout, ChannelScales,
    DType, Fp8, Fp8E4M3, Fp8E5M2, KvScales, TokenStrides,
};
use kvshare_replay::model::dtype_name;

use super::attention::row_scale;
use super::attention_vllm::Server;

/// The script, after the fp8 helpers it shares with the other one.
const SCRIPT: &str = concat!(
    include_str!("attention_fp8.py"),
    include_str!("attention_prefill.py")
);

/// The shape: sequences, tokens each, kv heads, head dim, GQA group, page size, threads,
/// timed rounds, query tokens per sequence (the last `chunk` of its `ctx`).
#[derive(Clone, Copy)]
pub struct Shape {
    pub seqs: usize,
    pub ctx: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub group: usize,
    pub page_size: usize,
    pub threads: usize,
    pub iters: usize,
    pub chunk: usize,
    /// `--dtype` when quantized (fp8_e4m3, fp8_e5m2, int8): the cache of the one run; `None`
    /// runs f32 and bf16.
    pub quantized: Option<DType>,
}

/// The per-channel scale of an int8 cache here: `2^-8`, so every code's value is exact in bf16.
const INT8_SCALE: f32 = 1.0 / 256.0;

/// One timed kvshare side: its label, backend, K/V type and what it is.
struct Side {
    label: String,
    backend: CpuBackend,
    kv: DType,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Tiled,
    DecodeKernel,
    /// The tiled kernel on the quantized values as bf16.
    Bf16Tiled,
}

/// The quantized cache's codes of `x` (one byte each; an int8 per-token-head row of `d` codes
/// followed by its scale's 4 bytes) and the values they stand for.
fn quantize(fmt: DType, d: usize, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    if fmt == DType::Int8PerTokenHead {
        let (mut codes, mut values) = (Vec::new(), Vec::new());
        for (r, row) in x.chunks(d).enumerate() {
            let s = row_scale(r);
            for &x in row {
                let c = (x / s).round_ties_even() as i8;
                codes.push(c as u8);
                values.push(c as f32 * s);
            }
            codes.extend(s.to_le_bytes());
        }
        return (codes, values);
    }
    x.iter()
        .map(|&x| match fmt {
            DType::Fp8E4M3 => {
                let c = Fp8E4M3::from_f32(x);
                (c.0, c.to_f32())
            }
            DType::Fp8E5M2 => {
                let c = Fp8E5M2::from_f32(x);
                (c.0, c.to_f32())
            }
            _ => {
                let c = (x / INT8_SCALE).round_ties_even() as i8;
                (c as u8, c as f32 * INT8_SCALE)
            }
        })
        .unzip()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}

/// Runs both dtypes on every path in `paths`; returns the JSON array of results.
pub fn run(s: Shape, paths: &[Isa]) -> Result<String, String> {
    let (hk, d, ps) = (s.kv_heads, s.head_dim, s.page_size);
    let h = hk * s.group;
    if !s.ctx.is_multiple_of(ps) {
        return Err("--prefill needs --ctx a multiple of --page-size".into());
    }
    if s.chunk == 0 || s.chunk > s.ctx {
        return Err(format!("--chunk: 1..={} (--ctx), not {}", s.ctx, s.chunk));
    }
    let pps = s.ctx / ps;
    let num_pages = s.seqs * pps;
    let tokens = s.seqs * s.chunk;
    println!(
        "\nattention prefill (causal): {} seqs x {} tokens, {} kv heads x {} dim, GQA {}, page {}{}",
        s.seqs,
        s.ctx,
        hk,
        d,
        s.group,
        ps,
        if s.chunk < s.ctx {
            format!(
                "; chunked: the last {} tokens of each are queries, {} cached before them",
                s.chunk,
                s.ctx - s.chunk
            )
        } else {
            String::new()
        }
    );
    let mut seed = 0x2545_f491u32;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    let mut perm: Vec<i32> = (0..num_pages as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, (rnd().abs() * 2.0 * (i + 1) as f32) as usize % (i + 1));
    }
    let python = ["KVS_VLLM_PYTHON", "KVS_TORCH_PYTHON"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|p| !p.is_empty()))
        .unwrap_or_else(|| "python3".into());
    let mut json = Vec::new();
    let runs = match s.quantized {
        Some(fmt) => vec![fmt],
        None => vec![DType::F32, DType::BF16],
    };
    for dtype in runs {
        let name = dtype_name(dtype);
        // Values exact in bf16 either way, so torch's bf16 copy holds the same numbers; a
        // quantized cache's K/V are its codes' values (exact in bf16).
        let mut gen =
            |n: usize| -> Vec<f32> { (0..n).map(|_| bf16::from_f32(rnd()).to_f32()).collect() };
        let k = gen(num_pages * ps * hk * d);
        let v = gen(num_pages * ps * hk * d);
        let q = gen(tokens * h * d);
        let ((kc, k), (vc, v)) = if dtype.is_quantized() {
            (quantize(dtype, d, &k), quantize(dtype, d, &v))
        } else {
            ((Vec::new(), k), (Vec::new(), v))
        };
        let channels = vec![INT8_SCALE; hk * d];
        let (kb, vb, qb): (Vec<bf16>, Vec<bf16>, Vec<bf16>) = (
            k.iter().map(|&x| bf16::from_f32(x)).collect(),
            v.iter().map(|&x| bf16::from_f32(x)).collect(),
            q.iter().map(|&x| bf16::from_f32(x)).collect(),
        );
        let ctx_lens = vec![s.ctx as i32; s.seqs];
        let qsl: Vec<i32> = (0..=s.seqs).map(|i| (i * s.chunk) as i32).collect();
        let params = AttnParams {
            num_seqs: s.seqs,
            num_tokens: tokens,
            num_heads: h,
            query_dtype: if dtype == DType::F32 {
                DType::F32
            } else {
                DType::BF16
            },
            query_strides: TokenStrides::dense(h, d),
            output_dtype: DType::F32,
            output_strides: TokenStrides::dense(h, d),
            cache: CacheLayout::dense(dtype, num_pages, ps, hk, d),
            max_pages_per_seq: pps,
            block_table_stride: pps,
            varlen: true,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: 0.0,
            sliding_window: 0,
            kv_scales: kvshare_attention::KvScales::ONE,
        };
        // `kv`: the cache's type (the query is f32 under f32 K/V, else bf16).
        let launch = |backend: &CpuBackend, kv: DType, out: &mut [f32]| -> Result<(), String> {
            let (query, key_cache, value_cache) = match kv {
                DType::F32 => (Buf::F32(&q), Buf::F32(&k), Buf::F32(&v)),
                DType::BF16 => (Buf::BF16(&qb), Buf::BF16(&kb), Buf::BF16(&vb)),
                DType::Fp8E4M3 => (
                    Buf::BF16(&qb),
                    Buf::Fp8E4M3(fp8::e4m3_slice(&kc)),
                    Buf::Fp8E4M3(fp8::e4m3_slice(&vc)),
                ),
                DType::Fp8E5M2 => (
                    Buf::BF16(&qb),
                    Buf::Fp8E5M2(fp8::e5m2_slice(&kc)),
                    Buf::Fp8E5M2(fp8::e5m2_slice(&vc)),
                ),
                // SAFETY: i8 and u8 have the same size, alignment and validity.
                DType::Int8PerTokenHead => (
                    Buf::BF16(&qb),
                    Buf::I8Rows(unsafe { kc.align_to::<i8>() }.1),
                    Buf::I8Rows(unsafe { vc.align_to::<i8>() }.1),
                ),
                // SAFETY: as above.
                _ => (
                    Buf::BF16(&qb),
                    Buf::I8(unsafe { kc.align_to::<i8>() }.1),
                    Buf::I8(unsafe { vc.align_to::<i8>() }.1),
                ),
            };
            let bufs = AttnBuffers {
                query,
                key_cache,
                value_cache,
                block_table: &perm,
                context_lens: &ctx_lens,
                query_start_loc: Some(&qsl),
                output: BufMut::F32(out),
                channel_scales: (kv == DType::Int8)
                    .then_some(ChannelScales::symmetric(&channels, &channels)),
            };
            let p = AttnParams {
                cache: CacheLayout::dense(kv, num_pages, ps, hk, d),
                kv_scales: KvScales::ONE,
                ..params
            };
            let batch = AttnBatch::new(p, bufs).map_err(|e| e.to_string())?;
            backend.attention(batch).map_err(|e| e.to_string())
        };
        // Per path the tiled kernel, then the decode kernel on the same rows; for a quantized
        // cache then the tiled kernel on its values as bf16.
        let mut sides = Vec::new();
        for &isa in paths {
            let backend = |tiled: bool| -> Result<CpuBackend, String> {
                let mut b = CpuBackend::with_isa(s.threads, isa).map_err(|e| e.to_string())?;
                b.set_tiled_prefill(tiled);
                Ok(b)
            };
            let side = |label: &str, tiled: bool, kv: DType, kind: Kind| -> Result<Side, String> {
                Ok(Side {
                    label: format!("{} {label}", isa.name()),
                    backend: backend(tiled)?,
                    kv,
                    kind,
                })
            };
            sides.push(side("tiled", true, dtype, Kind::Tiled)?);
            sides.push(side("decode-kernel", false, dtype, Kind::DecodeKernel)?);
            if dtype.is_quantized() {
                sides.push(side("bf16 tiled", true, DType::BF16, Kind::Bf16Tiled)?);
            }
        }
        let mut outs = vec![vec![0f32; tokens * h * d]; sides.len()];
        for (sd, o) in sides.iter().zip(outs.iter_mut()) {
            launch(&sd.backend, sd.kv, o)?;
        }
        for (i, sd) in sides.iter().enumerate().skip(1) {
            println!(
                "{name}: max |{} - {}| {:.2e}",
                sd.label,
                sides[0].label,
                max_diff(&outs[i], &outs[0])
            );
        }
        let files = [
            ("k", f32_bytes(&k)),
            ("v", f32_bytes(&v)),
            ("q", f32_bytes(&q)),
            ("out", f32_bytes(&outs[0])),
            ("table", perm.iter().flat_map(|x| x.to_le_bytes()).collect()),
        ];
        // The script's DTYPE is the query's and vLLM's model type; a quantized cache follows as
        // KV_CACHE_DTYPE.
        let script_dt = if dtype == DType::F32 { "f32" } else { "bf16" };
        let args: Vec<String> = [s.seqs, s.ctx, hk, d, h, ps, s.threads]
            .iter()
            .map(|n| n.to_string())
            .chain([script_dt.to_string(), s.chunk.to_string()])
            .chain(dtype.is_quantized().then(|| name.to_string()))
            .collect();
        let mut server = Server::start_script(&python, SCRIPT, "prefill", &files, &args, &[])
            .and_then(|(srv, line)| {
                serde_json::from_str::<serde_json::Value>(&line)
                    .map(|head| (srv, head))
                    .map_err(|e| format!("{e}: {line}"))
            });
        let mut others: Vec<&str> = Vec::new();
        match &server {
            Ok((_, head)) => {
                println!(
                    "{name}: torch {} causal SDPA: max |torch - kvshare| {:.2e}",
                    head["torch"].as_str().unwrap_or("?"),
                    head["torch_max_diff"].as_f64().unwrap_or(f64::NAN)
                );
                others.push("torch");
                if let Some(err) = head["vllm_error"].as_str() {
                    println!("{name}: vLLM kernel: skipped: {err}");
                } else {
                    let fp8 = match (head["same_bytes"].as_bool(), head["bound"].as_f64()) {
                        (Some(same), Some(b)) => {
                            let diff = head["vllm_max_diff"].as_f64().unwrap_or(f64::NAN);
                            let misread = head["misread_codes"]
                                .as_u64()
                                .zip(head["misread_max"].as_f64())
                                .map_or(String::new(), super::attention::misread_text);
                            format!(
                                " (its fp8 cache {} kvshare's stored bytes{misread}; bound {b:.2e}: {})",
                                if same { "holds" } else { "does NOT hold" },
                                if diff <= b { "within" } else { "EXCEEDED" }
                            )
                        }
                        _ => String::new(),
                    };
                    println!(
                        "{name}: vLLM {} cpu_attention_with_kv_cache (isa {}): max |vLLM - kvshare| {:.2e}{fp8}",
                        head["vllm"].as_str().unwrap_or("?"),
                        head["vllm_isa"].as_str().unwrap_or("?"),
                        head["vllm_max_diff"].as_f64().unwrap_or(f64::NAN)
                    );
                    others.push("vllm");
                }
            }
            Err(why) => println!("{name}: torch / vLLM: skipped: {why}"),
        }
        // Alternating rounds: every kvshare side, then torch, then vLLM; best of each.
        let mut best = vec![f64::INFINITY; sides.len() + others.len()];
        let mut out = vec![0f32; tokens * h * d];
        for _ in 0..s.iters {
            for (i, sd) in sides.iter().enumerate() {
                let t = Instant::now();
                launch(&sd.backend, sd.kv, &mut out)?;
                best[i] = best[i].min(t.elapsed().as_secs_f64() * 1e3);
            }
            if let Ok((srv, _)) = &mut server {
                for (j, what) in others.iter().enumerate() {
                    let ms = srv.time(what)?;
                    best[sides.len() + j] = best[sides.len() + j].min(ms);
                }
            }
        }
        let tps = |ms: f64| tokens as f64 / (ms / 1e3);
        let mut side_json = Vec::new();
        for (i, sd) in sides.iter().enumerate() {
            let (label, ms) = (&sd.label, best[i]);
            let mut ratios = Vec::new();
            let mut text = Vec::new();
            if sd.kind == Kind::Tiled {
                let r = best[i + 1] / ms;
                text.push(format!("decode-kernel time / tiled time {r:.2}"));
                ratios.push(format!("\"decode_kernel_over_tiled\":{r:.3}"));
                if dtype.is_quantized() {
                    let r = ms / best[i + 2];
                    text.push(format!("this time / bf16 tiled time {r:.3}"));
                    ratios.push(format!("\"over_bf16\":{r:.3}"));
                }
            }
            for (j, what) in others.iter().enumerate() {
                let r = best[sides.len() + j] / ms;
                text.push(format!("{what} time / this {r:.2}"));
                ratios.push(format!("\"{what}_over_this\":{r:.3}"));
            }
            println!(
                "{name}: kvshare {label:<22} {ms:8.1} ms = {:7.0} tokens/s; {}",
                tps(ms),
                text.join("; ")
            );
            side_json.push(format!(
                "\"{label}\":{{\"ms\":{ms:.3},\"tokens_per_s\":{:.1}{}{}}}",
                tps(ms),
                if ratios.is_empty() { "" } else { "," },
                ratios.join(",")
            ));
        }
        for (j, what) in others.iter().enumerate() {
            let ms = best[sides.len() + j];
            println!("{name}: {what:<30} {ms:8.1} ms = {:7.0} tokens/s", tps(ms));
            side_json.push(format!(
                "\"{what}\":{{\"ms\":{ms:.3},\"tokens_per_s\":{:.1}}}",
                tps(ms)
            ));
        }
        json.push(format!(
            "{{\"dtype\":\"{name}\",\"seqs\":{},\"ctx\":{},\"chunk\":{},\"sides\":{{{}}}}}",
            s.seqs,
            s.ctx,
            s.chunk,
            side_json.join(",")
        ));
    }
    Ok(format!("[{}]", json.join(",")))
}
