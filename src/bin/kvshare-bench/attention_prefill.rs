//! `kvshare-bench attention --prefill`: full causal prefill (every token of every sequence is a
//! query) in f32 and bf16, kvshare per kernel path against torch's causal
//! `scaled_dot_product_attention` on the same logical Q/K/V (`attention_prefill.py`, with
//! `$KVS_TORCH_PYTHON`, else `$KVS_VLLM_PYTHON`, else `python3`), in tokens per second. Prefill
//! is compute-bound, so this is the figure tile/matrix units would move.

use std::process::Command;
use std::time::{Duration, Instant};

use half::bf16;
use kvshare::attention::cpu::{CpuBackend, Isa};
use kvshare::attention::{
    AttnBatch, AttnBuffers, AttnParams, Backend, Buf, BufMut, CacheLayout, DType, TokenStrides,
};

const SCRIPT: &str = include_str!("attention_prefill.py");

/// The shape: sequences, tokens each, kv heads, head dim, GQA group, page size, threads,
/// timed repeats.
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
}

fn best_of(iters: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<Duration, String> {
    f()?;
    let mut best = Duration::MAX;
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs both dtypes on every path in `paths`; returns the JSON array of results.
pub fn run(s: Shape, paths: &[Isa]) -> Result<String, String> {
    let (hk, d, ps) = (s.kv_heads, s.head_dim, s.page_size);
    let h = hk * s.group;
    if !s.ctx.is_multiple_of(ps) {
        return Err("--prefill needs --ctx a multiple of --page-size".into());
    }
    let pps = s.ctx / ps;
    let num_pages = s.seqs * pps;
    let tokens = s.seqs * s.ctx;
    println!(
        "\nattention prefill (causal): {} seqs x {} tokens, {} kv heads x {} dim, GQA {}, page {}",
        s.seqs, s.ctx, hk, d, s.group, ps
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
    let python = ["KVS_TORCH_PYTHON", "KVS_VLLM_PYTHON"]
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
        let mut out = vec![0f32; tokens * h * d];
        let ctx_lens = vec![s.ctx as i32; s.seqs];
        let qsl: Vec<i32> = (0..=s.seqs).map(|i| (i * s.ctx) as i32).collect();
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
        };
        let mut best = Vec::new();
        for &isa in paths {
            let backend = CpuBackend::with_isa(s.threads, isa).map_err(|e| e.to_string())?;
            let t = best_of(s.iters, || {
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
                    output: BufMut::F32(&mut out),
                };
                let batch = AttnBatch::new(params, bufs).map_err(|e| e.to_string())?;
                backend.attention(batch).map_err(|e| e.to_string())
            })?;
            best.push((isa, t.as_secs_f64()));
        }
        let torch = torch_prefill(&python, s, h, name, &k, &v, &perm, &q, &out);
        let mut paths_json = Vec::new();
        for &(isa, secs) in &best {
            let tps = tokens as f64 / secs;
            let vs = torch.as_ref().ok().map(|t| t.0 / (secs * 1e3));
            println!(
                "{name}: kvshare path {:<8} {:.1} ms = {:.0} tokens/s{}",
                isa.name(),
                secs * 1e3,
                tps,
                vs.map_or(String::new(), |r| format!(
                    "; torch SDPA time / kvshare time {r:.2}"
                ))
            );
            paths_json.push(format!(
                "\"{}\":{{\"ms\":{:.3},\"tokens_per_s\":{:.1},\"torch_over_kvshare\":{}}}",
                isa.name(),
                secs * 1e3,
                tps,
                vs.map_or("null".into(), |r| format!("{r:.3}"))
            ));
        }
        let torch_json = match &torch {
            Ok((ms, diff, version)) => {
                println!(
                    "{name}: torch {version} causal SDPA on the same Q/K/V: {ms:.1} ms = {:.0} \
tokens/s; max |torch - kvshare| {diff:.2e}",
                    tokens as f64 / (ms / 1e3)
                );
                format!("{{\"version\":\"{version}\",\"ms\":{ms:.3},\"max_abs_diff\":{diff:.3e}}}")
            }
            Err(why) => {
                println!("{name}: torch SDPA: skipped: {why}");
                "null".into()
            }
        };
        json.push(format!(
            "{{\"dtype\":\"{name}\",\"seqs\":{},\"ctx\":{},\"paths\":{{{}}},\"torch\":{}}}",
            s.seqs,
            s.ctx,
            paths_json.join(","),
            torch_json
        ));
    }
    Ok(format!("[{}]", json.join(",")))
}

/// (ms, max diff, torch version) of torch's SDPA, or why not.
#[allow(clippy::too_many_arguments)]
fn torch_prefill(
    python: &str,
    s: Shape,
    h: usize,
    dtype: &str,
    k: &[f32],
    v: &[f32],
    table: &[i32],
    q: &[f32],
    out: &[f32],
) -> Result<(f64, f64, String), String> {
    let ok = Command::new(python)
        .args(["-c", "import torch, numpy"])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|st| st.success())
        .unwrap_or(false);
    if !ok {
        return Err(format!(
            "torch is not importable by {python} (set KVS_TORCH_PYTHON)"
        ));
    }
    let dir = std::env::temp_dir().join(format!("kvshare-bench-prefill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = (|| {
        for (name, data) in [("k", k), ("v", v), ("q", q), ("out", out)] {
            std::fs::write(dir.join(format!("{name}.bin")), f32_bytes(data))
                .map_err(|e| e.to_string())?;
        }
        let t: Vec<u8> = table.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(dir.join("table.bin"), t).map_err(|e| e.to_string())?;
        let args = [
            s.seqs,
            s.ctx,
            s.kv_heads,
            s.head_dim,
            h,
            s.page_size,
            s.threads,
            s.iters,
        ];
        let res = Command::new(python)
            .args(["-c", SCRIPT])
            .arg(&dir)
            .args(args.iter().map(|n| n.to_string()))
            .arg(dtype)
            .output()
            .map_err(|e| e.to_string())?;
        if !res.status.success() {
            let err = String::from_utf8_lossy(&res.stderr);
            return Err(format!(
                "torch script failed: {}",
                err.lines().last().unwrap_or_default()
            ));
        }
        let text = String::from_utf8_lossy(&res.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("KVSBENCH "))
            .ok_or("no result line from the torch script")?;
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let num = |key: &str| v[key].as_f64().ok_or(format!("bad torch output: {line}"));
        Ok((
            num("ms")?,
            num("max_diff")?,
            v["version"].as_str().unwrap_or("?").to_string(),
        ))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
