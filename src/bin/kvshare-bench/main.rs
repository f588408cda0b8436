//! `kvshare-bench MODE`: benchmarks that print human lines and a final single-line JSON object.
//!
//! Modes: `manager` (cache-manager bookkeeping), `attention` (CPU paged attention).
//! Numbers are medians over repeats; each mode measures its own baseline in the same run and
//! reports ratios, because these machines are noisy.

mod attention;
mod manager;
mod timing;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("manager") => manager::run(&args[1..]),
        Some("attention") => attention::run(&args[1..]),
        Some("--help" | "-h") | None => {
            println!("usage: kvshare-bench <manager|attention> [--quick] [--help]");
            Ok(())
        }
        Some(other) => Err(format!("unknown mode `{other}` (try --help)")),
    };
    if let Err(e) = result {
        eprintln!("kvshare-bench: {e}");
        std::process::exit(2);
    }
}
