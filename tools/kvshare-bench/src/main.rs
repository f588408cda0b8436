//! `kvshare-bench MODE`: benchmarks that print human lines and a final single-line JSON object.
//!
//! Modes: `manager` (cache-manager bookkeeping), `attention` (CPU paged attention), `kv-write`
//! (the CPU KV write per cache format), `vllm` (the vLLM adapter against vLLM's own
//! KVCacheManager, through `bench_vllm.py`), `vllm-e2e` (the real vLLM CPU engine generating a
//! multi-turn workload with each manager, through `engine_e2e.py`).
//! Numbers are medians over repeats; each mode measures its own baseline in the same run and
//! reports ratios, because these machines are noisy.
//!
//! Arguments are read with `lexopt`, as `kvshare-replay` reads its own
//! (`tools/kvshare-replay/src/cli.rs`): as `OsString`s, so a non-UTF-8 argument is an error
//! message rather than a panic; `--flag value` and `--flag=value`; `--help` for each mode.

mod attention;
mod attention_prefill;
mod attention_vllm;
mod kv_write;
mod manager;
mod timing;
mod vllm;

use std::ffi::OsString;
use std::process::ExitCode;

const USAGE: &str = "\
kvshare-bench: kvshare's benchmarks; each measures its baseline in the same run and reports
ratios against it, then prints one single-line JSON object.

USAGE:
    kvshare-bench MODE [OPTIONS]          (cargo run --release -p kvshare-bench -- MODE ...)
    kvshare-bench MODE --help             the mode's options

MODES:
    manager               the cache manager's bookkeeping against its floors
    attention             the CPU paged-attention kernel against memory bandwidth and vLLM's
    kv-write              the CPU KV write per cache format and path against the bf16 copy
    vllm                  the vLLM adapter against vLLM's own KVCacheManager (vLLM venv)
    vllm-e2e              the real vLLM CPU engine with each manager (vLLM venv)

    -h, --help            this text
";

/// `lexopt`'s error, pointing at `--help`.
fn see_help(e: lexopt::Error) -> String {
    format!("{e} (see --help)")
}

/// The value of `flag` as UTF-8 text.
fn value(p: &mut lexopt::Parser, flag: &str) -> Result<String, String> {
    p.value()
        .map_err(|_| format!("{flag} needs a value (see --help)"))?
        .into_string()
        .map_err(|v| format!("{flag}: {v:?} is not valid UTF-8"))
}

/// A number for `flag`.
fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

/// The mode and its arguments; `Ok(None)` for the top-level `--help` (or no arguments).
fn mode(
    args: impl IntoIterator<Item = OsString>,
) -> Result<Option<(String, Vec<OsString>)>, String> {
    use lexopt::Arg::{Long, Short, Value};
    let mut p = lexopt::Parser::from_args(args);
    match p.next().map_err(see_help)? {
        None | Some(Long("help") | Short('h')) => Ok(None),
        Some(Value(mode)) => {
            let mode = mode
                .into_string()
                .map_err(|m| format!("unknown mode {m:?} (see --help)"))?;
            let rest = p.raw_args().map_err(see_help)?.collect();
            Ok(Some((mode, rest)))
        }
        Some(other) => Err(format!(
            "{}: the mode comes first (see --help)",
            other.unexpected()
        )),
    }
}

fn main() -> ExitCode {
    let result = match mode(std::env::args_os().skip(1)) {
        Ok(None) => {
            print!("{USAGE}");
            Ok(())
        }
        Ok(Some((mode, args))) => match mode.as_str() {
            "manager" => manager::run(args),
            "attention" => attention::run(args),
            "kv-write" => kv_write::run(args),
            "vllm" => vllm::run(args),
            "vllm-e2e" => vllm::run_e2e(args),
            other => Err(format!("unknown mode {other:?} (see --help)")),
        },
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvshare-bench: {e}");
            ExitCode::from(2)
        }
    }
}
