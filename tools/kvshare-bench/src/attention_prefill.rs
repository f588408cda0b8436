//! `kvshare-bench attention --prefill`: full causal prefill (every token of every sequence is a
//! query) or, with `--chunk N`, chunked prefill (the last N tokens of each sequence are the
//! queries, the rest a cached prefix) in f32 and bf16. Per kernel path, kvshare's tiled prefill kernel and, as the same-run
//! baseline, the decode kernel on the same rows; against torch's causal
//! `scaled_dot_product_attention` and vLLM's CPU kernel (`cpu_attention_with_kv_cache` with the
//! whole prompt as the query, as vLLM 0.23 calls it for prefill on x86) on the same logical
//! Q/K/V (`attention_prefill.py`, run as a server by `$KVS_VLLM_PYTHON`, else
//! `$KVS_TORCH_PYTHON`, else `python3`). Every round launches each side once in turn; each
//! side's best of N rounds is reported in tokens per second, with the ratios.

use std::time::Instant;

use half::bf16;
use kvshare_attention::cpu::{CpuBackend, Isa};
use kvshare_attention::{
    AttnBatch, AttnBuffers, AttnParams, Backend, Buf, BufMut, CacheLayout, DType, TokenStrides,
};

use super::attention_vllm::Server;

const SCRIPT: &str = include_str!("attention_prefill.py");

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
    for dtype in [DType::F32, DType::BF16] {
        let name = if dtype == DType::F32 { "f32" } else { "bf16" };
        // Values exact in bf16 either way, so torch's bf16 copy holds the same numbers.
        let mut gen =
            |n: usize| -> Vec<f32> { (0..n).map(|_| bf16::from_f32(rnd()).to_f32()).collect() };
        let k = gen(num_pages * ps * hk * d);
        let v = gen(num_pages * ps * hk * d);
        let q = gen(tokens * h * d);
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
            query_dtype: dtype,
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
        let launch = |backend: &CpuBackend, out: &mut [f32]| -> Result<(), String> {
            let (query, key_cache, value_cache) = if dtype == DType::F32 {
                (Buf::F32(&q), Buf::F32(&k), Buf::F32(&v))
            } else {
                (Buf::BF16(&qb), Buf::BF16(&kb), Buf::BF16(&vb))
            };
            let bufs = AttnBuffers {
                query,
                key_cache,
                value_cache,
                block_table: &perm,
                context_lens: &ctx_lens,
                query_start_loc: Some(&qsl),
                output: BufMut::F32(out),
                channel_scales: None,
            };
            let batch = AttnBatch::new(params, bufs).map_err(|e| e.to_string())?;
            backend.attention(batch).map_err(|e| e.to_string())
        };
        // (label, backend): per path the tiled kernel, then the decode kernel on the same rows.
        let mut sides = Vec::new();
        for &isa in paths {
            let tiled = CpuBackend::with_isa(s.threads, isa).map_err(|e| e.to_string())?;
            let mut decode = CpuBackend::with_isa(s.threads, isa).map_err(|e| e.to_string())?;
            decode.set_tiled_prefill(false);
            sides.push((format!("{} tiled", isa.name()), tiled));
            sides.push((format!("{} decode-kernel", isa.name()), decode));
        }
        let mut outs = vec![vec![0f32; tokens * h * d]; sides.len()];
        for ((_, b), o) in sides.iter().zip(outs.iter_mut()) {
            launch(b, o)?;
        }
        for (i, (label, _)) in sides.iter().enumerate().skip(1) {
            println!(
                "{name}: max |{label} - {}| {:.2e}",
                sides[0].0,
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
        let args: Vec<String> = [s.seqs, s.ctx, hk, d, h, ps, s.threads]
            .iter()
            .map(|n| n.to_string())
            .chain([name.to_string(), s.chunk.to_string()])
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
                    println!(
                        "{name}: vLLM {} cpu_attention_with_kv_cache (isa {}): max |vLLM - kvshare| {:.2e}",
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
            for (i, (_, b)) in sides.iter().enumerate() {
                let t = Instant::now();
                launch(b, &mut out)?;
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
        for (i, (label, _)) in sides.iter().enumerate() {
            let ms = best[i];
            let mut ratios = Vec::new();
            let mut text = Vec::new();
            if i % 2 == 0 {
                let r = best[i + 1] / ms;
                text.push(format!("decode-kernel time / tiled time {r:.2}"));
                ratios.push(format!("\"decode_kernel_over_tiled\":{r:.3}"));
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
