//! The benchmarks that run in the vLLM virtualenv, with its Python: `$KVS_VLLM_PYTHON`, else
//! the one `scripts/setup-vllm-venv` prints (it builds the cached virtualenv when it is absent).
//! ARGS go to the script.
//!
//! * `kvshare-bench vllm [ARGS]`: the vLLM adapter benchmark, `integration/vllm_ascend/bench/
//!   bench_vllm.py` (vLLM 0.23.0's Scheduler with its own KVCacheManager and with kvshare's, in
//!   lockstep; `--quick`, `--repeats N`, ...); its last line is the single-line JSON object.
//! * `kvshare-bench vllm-e2e [ARGS]`: the real engine (vLLM's CPU build) generating a multi-turn
//!   workload with each manager, `integration/vllm_ascend/bench/engine_e2e.py bench`
//!   (`--quick`, `--repeats N`, `--convs N`, `--turns N`, `--json`, ...).
//!
//! Both point the Python binding at this build's `libkvshare.so` and header unless
//! `KVSHARE_LIB` / `KVSHARE_HEADER` are set.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

pub const USAGE: &str = "\
kvshare-bench vllm: the vLLM adapter against vLLM's own KVCacheManager, vLLM 0.23.0's Scheduler
with each in lockstep (integration/vllm_ascend/bench/bench_vllm.py).

USAGE:
    kvshare-bench vllm [SCRIPT ARGS]      e.g. --quick, --repeats N

Runs in the vLLM virtualenv: $KVS_VLLM_PYTHON, else the one scripts/setup-vllm-venv prints
(created on first use). The arguments go to the script; after `--` they go to it even when one
is --help (`kvshare-bench vllm -- --help` lists the script's own options).
    -h, --help            this text
";

pub const USAGE_E2E: &str = "\
kvshare-bench vllm-e2e: the real engine (vLLM's CPU build) generating a multi-turn workload with
each manager (integration/vllm_ascend/bench/engine_e2e.py bench).

USAGE:
    kvshare-bench vllm-e2e [SCRIPT ARGS]  e.g. --quick, --repeats N, --convs N, --turns N, --json

Runs in the vLLM virtualenv: $KVS_VLLM_PYTHON, else the one scripts/setup-vllm-venv prints
(created on first use). The arguments go to the script; after `--` they go to it even when one
is --help (`kvshare-bench vllm-e2e -- --help` lists the script's own options).
    -h, --help            this text
";

/// `kvshare-bench vllm`.
pub fn run(args: Vec<OsString>) -> Result<(), String> {
    match script_args(args) {
        Some(args) => run_script("bench_vllm.py", &[], &args),
        None => {
            print!("{USAGE}");
            Ok(())
        }
    }
}

/// `kvshare-bench vllm-e2e`.
pub fn run_e2e(args: Vec<OsString>) -> Result<(), String> {
    match script_args(args) {
        Some(args) => run_script("engine_e2e.py", &["bench"], &args),
        None => {
            print!("{USAGE_E2E}");
            Ok(())
        }
    }
}

/// The arguments for the script, as given (any bytes), less a first `--`; None when `-h` or
/// `--help` comes before any `--` (the mode's help, not the script's).
fn script_args(args: Vec<OsString>) -> Option<Vec<OsString>> {
    match args.iter().position(|a| a == "--") {
        _ if args
            .iter()
            .take_while(|a| *a != "--")
            .any(|a| a == "-h" || a == "--help") =>
        {
            None
        }
        Some(i) => Some(args[..i].iter().chain(&args[i + 1..]).cloned().collect()),
        None => Some(args),
    }
}

fn run_script(name: &str, lead: &[&str], args: &[OsString]) -> Result<(), String> {
    // The repository's root: this tool lives in `tools/kvshare-bench`.
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let script = root.join("integration/vllm_ascend/bench").join(name);
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
    let mut cmd = Command::new(&python);
    cmd.arg(&script).args(lead).args(args);
    // This build's library (cargo builds the cdylib with the benchmark) and header.
    let lib = root
        .join("target")
        .join(if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        })
        .join("libkvshare.so");
    if std::env::var_os("KVSHARE_LIB").is_none() && lib.is_file() {
        cmd.env("KVSHARE_LIB", &lib);
    }
    if std::env::var_os("KVSHARE_HEADER").is_none() {
        cmd.env("KVSHARE_HEADER", root.join("include/kvshare.h"));
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {python} (set KVS_VLLM_PYTHON): {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{name} failed ({status})"))
    }
}
