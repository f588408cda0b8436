//! The PyTorch side of `kvshare-bench attention`: torch's SDPA on the same K/V stored
//! contiguously, run by `$KVS_TORCH_PYTHON`, timed and compared with kvshare's output.

use super::*;

pub(super) struct TorchResult {
    pub(super) version: String,
    pub(super) ms: f64,
    pub(super) max_diff: f64,
}

/// Python that times torch's SDPA on the dumped tensors (q `[seqs, heads, dim]`, K/V
/// `[seqs, ctx, kv_heads, dim]` made `[seqs, kv_heads, ctx, dim]` contiguous before timing) and
/// compares its output with kvshare's.
pub(super) const TORCH_SCRIPT: &str = r#"
import json, sys, time
import numpy as np, torch
d, seqs, ctx, hk, dim, h, iters, threads = sys.argv[1], *map(int, sys.argv[2:9])
dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[sys.argv[9]]
torch.set_num_threads(threads)
load = lambda n: torch.from_numpy(np.fromfile(f"{d}/{n}.bin", dtype=np.int16)).view(dt)
q = load("q").view(seqs, h, 1, dim)
k = load("k").view(seqs, ctx, hk, dim).permute(0, 2, 1, 3).contiguous()
v = load("v").view(seqs, ctx, hk, dim).permute(0, 2, 1, 3).contiguous()
ref = load("out").view(seqs, h, dim).float()
sdpa = torch.nn.functional.scaled_dot_product_attention
with torch.inference_mode():
    out = sdpa(q, k, v, enable_gqa=True)
    best = float("inf")
    for _ in range(iters):
        t = time.perf_counter()
        sdpa(q, k, v, enable_gqa=True)
        best = min(best, time.perf_counter() - t)
diff = (out.view(seqs, h, dim).float() - ref).abs().max().item()
print(json.dumps({"version": torch.__version__, "ms": best * 1e3, "max_diff": diff}))
"#;

/// Runs [`TORCH_SCRIPT`] with `$KVS_TORCH_PYTHON` (default `python3`) when torch imports there.
pub(super) fn torch_compare(
    o: &Opts,
    q: &[u16],
    k: &[u16],
    v: &[u16],
    out: &[u16],
    threads: usize,
) -> Result<TorchResult, String> {
    let python = std::env::var("KVS_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import torch, numpy"])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        return Err(format!(
            "torch is not importable by {python} (set KVS_TORCH_PYTHON)"
        ));
    }
    if !o.ctx.is_multiple_of(o.page_size) {
        return Err("--ctx must be a multiple of --page-size for the contiguous view".into());
    }
    let dir = std::env::temp_dir().join(format!("kvshare-bench-torch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = (|| {
        for (name, data) in [("q", q), ("k", k), ("v", v), ("out", out)] {
            std::fs::write(
                dir.join(format!("{name}.bin")),
                attention_vllm::bits_bytes(data),
            )
            .map_err(|e| e.to_string())?;
        }
        let h = o.kv_heads * o.group;
        let mut args: Vec<String> = [o.seqs, o.ctx, o.kv_heads, o.head_dim, h, o.iters, threads]
            .iter()
            .map(|n| n.to_string())
            .collect();
        args.push(dtype_name(o.dtype).to_string());
        let res = std::process::Command::new(&python)
            .args(["-c", TORCH_SCRIPT])
            .arg(&dir)
            .args(&args)
            .output()
            .map_err(|e| e.to_string())?;
        if !res.status.success() {
            return Err(format!(
                "torch script failed: {}",
                String::from_utf8_lossy(&res.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&res.stdout);
        let line = text.lines().last().unwrap_or_default();
        let field = |key: &str| -> Option<&str> {
            let at = line.find(&format!("\"{key}\": "))? + key.len() + 4;
            let rest = &line[at..];
            Some(rest[..rest.find([',', '}'])?].trim().trim_matches('"'))
        };
        let num = |key: &str| {
            field(key)
                .and_then(|s| s.parse::<f64>().ok())
                .ok_or(format!("bad torch output: {line}"))
        };
        Ok(TorchResult {
            version: field("version").unwrap_or("?").to_string(),
            ms: num("ms")?,
            max_diff: num("max_diff")?,
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
