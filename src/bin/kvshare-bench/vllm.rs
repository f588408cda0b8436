//! `kvshare-bench vllm [ARGS]`: the vLLM adapter benchmark, `integration/vllm_ascend/bench/
//! bench_vllm.py` (vLLM 0.23.0's Scheduler with its own KVCacheManager and with kvshare's, in
//! lockstep), run with the vLLM virtualenv's Python: `$KVS_VLLM_PYTHON`, else the one
//! `scripts/setup-vllm-venv` prints (it builds the cached virtualenv when it is absent). ARGS go
//! to the script (`--quick`, `--repeats N`, ...); its last line is the single-line JSON object.

use std::path::Path;
use std::process::Command;

pub fn run(args: &[String]) -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("integration/vllm_ascend/bench/bench_vllm.py");
    if !script.is_file() {
        return Err(format!("{} not found", script.display()));
    }
    let python = match std::env::var("KVS_VLLM_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            let setup = root.join("scripts/setup-vllm-venv");
            let out = Command::new(&setup)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", setup.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} failed ({}): {}",
                    setup.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            let venv = String::from_utf8_lossy(&out.stdout).trim().to_string();
            format!("{venv}/bin/python")
        }
    };
    let status = Command::new(&python)
        .arg(&script)
        .args(args)
        .status()
        .map_err(|e| format!("cannot run {python} (set KVS_VLLM_PYTHON): {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("bench_vllm.py failed ({status})"))
    }
}
