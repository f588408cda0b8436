//! `kvshare-bench`: benchmarks, one subcommand each (`kvshare-bench attention ...`).

mod attention;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("attention") => attention::run(&args[1..]),
        _ => Err("usage: kvshare-bench attention [--help]".to_string()),
    };
    if let Err(e) = result {
        eprintln!("kvshare-bench: {e}");
        std::process::exit(1);
    }
}
