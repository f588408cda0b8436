//! `kvshare-bench MODE`: benchmarks that print human lines and a final single-line JSON object.
//!
//! Modes: `manager` (cache-manager bookkeeping), `attention` (CPU paged attention), `vllm` (the
//! vLLM adapter against vLLM's own KVCacheManager, through `bench_vllm.py`), `vllm-e2e` (the real
//! vLLM CPU engine generating a multi-turn workload with each manager, through `engine_e2e.py`).
//! Numbers are medians over repeats; each mode measures its own baseline in the same run and
//! reports ratios, because these machines are noisy.

mod attention;
mod attention_prefill;
mod attention_vllm;
mod manager;
mod timing;
mod vllm;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("manager") => manager::run(&args[1..]),
        Some("attention") => attention::run(&args[1..]),
        Some("vllm") => vllm::run(&args[1..]),
        Some("vllm-e2e") => vllm::run_e2e(&args[1..]),
        Some("--help" | "-h") | None => {
            println!("usage: kvshare-bench <manager|attention|vllm|vllm-e2e> [--quick] [--help]");
            Ok(())
        }
        Some(other) => Err(format!("unknown mode `{other}` (try --help)")),
    };
    if let Err(e) = result {
        eprintln!("kvshare-bench: {e}");
        std::process::exit(2);
    }
}
