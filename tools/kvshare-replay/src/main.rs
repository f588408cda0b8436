//! `kvshare-replay`, the project's main job (`cargo run --release`): replays multi-turn chat (the
//! source article's experiment) or a JSON Lines trace through the cache manager and the CPU
//! attention backend, and prints what prefix sharing saves, measured. The engine is the library
//! library `kvshare_replay`; this file is the command line around it.

mod cli;

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};

use kvshare_replay::cpu_model::CpuModel;
use kvshare_replay::model::{Geometry, Model, NoModel};
use kvshare_replay::report::{format_report, json_totals};
use kvshare_replay::sweep;
use kvshare_replay::trace::{parse_trace, to_jsonl, Request};
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::{replay, Progress, ReplayConfig};

use cli::{Args, Sweep};

fn workload(a: &Args) -> ChatWorkload {
    ChatWorkload {
        users: a.users,
        turns: a.turns,
        system_tokens: a.system_tokens,
        step_ms: a.step_ms,
        seed: a.seed,
        ..ChatWorkload::default()
    }
}

fn load_trace(path: &str) -> Result<Vec<Request>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    parse_trace(&text).map_err(|errs| {
        let mut s = format!(
            "{path}: refused, {} bad line{} (nothing was run):",
            errs.len(),
            if errs.len() == 1 { "" } else { "s" }
        );
        for e in errs.iter().take(20) {
            s.push_str(&format!("\n  {path}:{e}"));
        }
        if errs.len() > 20 {
            s.push_str(&format!("\n  … and {} more", errs.len() - 20));
        }
        s
    })
}

fn config(a: &Args) -> ReplayConfig {
    ReplayConfig {
        page_size: a.page_size,
        device_pages: a.device_pages(),
        host_pages: a.host_pages,
        concurrency: a.concurrency,
        step_ms: a.step_ms,
        geometry: Geometry {
            layers: a.layers,
            kv_heads: a.kv_heads,
            gqa: a.gqa,
            head_dim: a.head_dim,
            dtype: a.dtype,
        },
        check: a.check,
        skip_cached_writes: a.skip_cached_writes,
        demote_to_host: a.demote_to_host,
        match_unit: a.match_unit,
    }
}

/// The model for one run: the CPU attention backend, or none with `--no-attention`.
fn make_model(a: &Args, cfg: &ReplayConfig) -> Result<Box<dyn Model>, String> {
    if !a.attention {
        return Ok(Box::new(NoModel));
    }
    Ok(Box::new(CpuModel::new(
        cfg.geometry,
        cfg.page_size,
        cfg.device_pages,
        cfg.host_pages,
        a.threads,
        a.seed,
        a.verify,
    )?))
}

fn bar(total: u64, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} requests, {msg} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}

fn tick(pb: &ProgressBar, p: Progress) {
    if p.step.is_multiple_of(64) || p.done == p.total {
        pb.set_position(p.done as u64);
        pb.set_message(format!("step {}", p.step));
    }
}

fn write_svg(path: &str, svg: &str) -> Result<String, String> {
    let p = Path::new(path);
    if let Some(dir) = p.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
    }
    std::fs::write(p, svg).map_err(|e| format!("cannot write {path}: {e}"))?;
    Ok(std::fs::canonicalize(p)
        .map(|c| c.display().to_string())
        .unwrap_or_else(|_| path.to_string()))
}

/// `--window` / `--chunk`: the hybrid model and the full-attention model of the same size, in
/// one run, on the same requests and the same bytes of KV.
fn run_hybrid(a: &Args, reqs: &[kvshare_replay::Request], what: &str) -> Result<(), String> {
    use kvshare_core::GroupKind;
    use kvshare_core::StateMode;
    use kvshare_replay::hybrid::{format_hybrid, hybrid_kinds, replay_groups, HybridReplayConfig};
    let local = match (a.window, a.chunk, a.state.as_deref()) {
        (Some(w), _, _) => GroupKind::SlidingWindow(w),
        (_, Some(c), _) => GroupKind::ChunkedLocal(c),
        (_, _, Some("align")) => GroupKind::State(StateMode::Align),
        (_, _, Some(_)) => GroupKind::State(StateMode::All),
        _ => unreachable!("checked by the caller"),
    };
    let kinds = hybrid_kinds(local, a.full_every);
    let k = kinds.len() as u32;
    let pages = a.device_pages();
    let base = HybridReplayConfig {
        kinds: vec![GroupKind::Full],
        page_size: a.page_size,
        num_pages: pages + 1,
        concurrency: a.concurrency,
        step_ms: a.step_ms,
        check: a.check,
    };
    let hybrid = HybridReplayConfig {
        kinds,
        num_pages: pages
            .checked_mul(k)
            .and_then(|p| p.checked_add(1))
            .ok_or("--device-pages too large")?,
        ..base.clone()
    };
    println!(
        "kvshare-replay: {what}\nhybrid: {k} groups ({local:?} x {}, full x 1), {} pages of {} tokens per group page; full model: {} pages (same bytes)\n",
        k - 1,
        hybrid.num_pages - 1,
        a.page_size,
        pages
    );
    let full = replay_groups(reqs, &base)?;
    let hy = replay_groups(reqs, &hybrid)?;
    print!("{}", format_hybrid(&hy, &full, a.page_size));
    if a.json {
        println!(
            "{{\"hybrid_mean_model_pages\":{:.2},\"full_mean_model_pages\":{:.2},\"hybrid_peak_model_pages\":{:.2},\"full_peak_model_pages\":{:.2}}}",
            hy.mean_model_pages(),
            full.mean_model_pages(),
            hy.peak_model_pages(),
            full.peak_model_pages()
        );
    }
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    let (reqs, what) = match &a.trace {
        Some(path) => {
            let r = load_trace(path)?;
            let what = format!("trace {path}: {} requests", r.len());
            (r, what)
        }
        None => {
            let w = workload(a);
            (w.generate(), w.describe())
        }
    };
    if let Some(path) = &a.dump_trace {
        std::fs::write(path, to_jsonl(&reqs)).map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("wrote {} requests to {path}", reqs.len());
        return Ok(());
    }
    if a.window.is_some() || a.chunk.is_some() || a.state.is_some() {
        return run_hybrid(a, &reqs, &what);
    }
    let cfg = config(a);
    // With --json the human report goes to stderr and stdout carries the JSON line alone.
    let mut human: Box<dyn std::io::Write> = if a.json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let say = |h: &mut Box<dyn std::io::Write>, s: &str| {
        let _ = h.write_all(s.as_bytes());
        let _ = h.flush();
    };
    match &a.sweep {
        None => {
            let mut model = make_model(a, &cfg)?;
            let attention = model.describe();
            say(
                &mut human,
                &format!(
                    "kvshare-replay: {what}\ncache: {} device pages of {} tokens, match unit {} ({:.1} MiB of KV, {} KiB per page), {} host pages, concurrency {}, simulated step {} ms\nmodel: {attention}\n\n",
                    cfg.device_pages,
                    cfg.page_size,
                    cfg.unit(),
                    (cfg.device_pages as u64 * cfg.page_bytes()) as f64 / (1u64 << 20) as f64,
                    cfg.page_bytes() / 1024,
                    cfg.host_pages,
                    cfg.concurrency,
                    cfg.step_ms
                ),
            );
            let pb = bar(reqs.len() as u64, "replay");
            let out = replay(&reqs, &cfg, model.as_mut(), &mut |p| tick(&pb, p));
            pb.finish_and_clear();
            let out = out?;
            let title = format!(
                "kvshare-replay: device pages in use ({} requests, {}-token pages)",
                reqs.len(),
                cfg.page_size
            );
            let svg = kvshare_replay::svg::plot(&out.per_step, &title, cfg.device_pages);
            let svg_path = write_svg(&a.svg, &svg)?;
            say(
                &mut human,
                &format_report(&out, &cfg, a.attention, Some(&svg_path)),
            );
            if a.json {
                println!("{}", json_totals(&out, &cfg, a.attention, Some(&svg_path)));
            }
        }
        Some(which) => {
            let mut factory = |c: &ReplayConfig| make_model(a, c);
            let total_runs = match which {
                Sweep::ShareRatio => 5,
                Sweep::PageSize => {
                    sweep::page_size_configs(&cfg, cfg.device_pages as u64 * cfg.page_size as u64)
                        .len() as u64
                }
            };
            let pb = bar(total_runs, "sweep");
            pb.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:40}] run {pos}/{len}, {msg} ({elapsed})",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            let mut prog = |k: usize, p: Progress| {
                if p.step.is_multiple_of(64) || p.done == p.total {
                    pb.set_position(k as u64);
                    pb.set_message(format!("{}/{} requests", p.done, p.total));
                }
            };
            let (text, rows) = match which {
                Sweep::ShareRatio => {
                    let rows =
                        sweep::share_ratio(&cfg, 16, 1024, 64, a.seed, &mut factory, &mut prog);
                    pb.finish_and_clear();
                    let rows = rows?;
                    (
                        format!(
                            "kvshare-replay --sweep share-ratio: 16 concurrent requests of 1024 tokens (960 prompt + 64 output), the first share% of them common; {}-token pages, match unit {}\n\n{}",
                            cfg.page_size,
                            cfg.unit(),
                            sweep::format_share_ratio(&rows)
                        ),
                        rows,
                    )
                }
                Sweep::PageSize => {
                    let device_tokens = cfg.device_pages as u64 * cfg.page_size as u64;
                    let rows =
                        sweep::page_size(&cfg, &reqs, device_tokens, &mut factory, &mut prog);
                    pb.finish_and_clear();
                    let rows = rows?;
                    (
                        format!(
                            "kvshare-replay --sweep page-size: {what}; device memory {device_tokens} tokens for every page size\n\n{}",
                            sweep::format_page_size(&rows)
                        ),
                        rows,
                    )
                }
            };
            say(&mut human, &text);
            if a.json {
                let runs: Vec<_> = rows
                    .iter()
                    .map(|r| {
                        let mut v = json_totals(&r.out, &r.cfg, a.attention, None);
                        v["value"] = r.value.into();
                        v
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"sweep": format!("{which:?}"), "runs": runs})
                );
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let a = match cli::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kvshare-replay: {e}");
            return ExitCode::from(2);
        }
    };
    if a.help {
        print!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("kvshare-replay: {e}");
            ExitCode::FAILURE
        }
    }
}
