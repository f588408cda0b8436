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
use kvshare_replay::trace::{to_jsonl, Request};
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::{
    replay_source, FileSource, Outcome, Progress, ReplayConfig, RequestSource, TraceFormat,
    VecSource,
};

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

/// Opens the trace file, checking every line first.
fn open_trace(a: &Args, path: &str) -> Result<FileSource, String> {
    FileSource::open(path, a.trace_format).map_err(|errs| {
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

/// What the trace's reading noticed, as a sentence (empty when nothing).
fn notes(src: &FileSource) -> String {
    let n = &src.notes;
    let mut parts = Vec::new();
    if n.empty_prompts > 0 {
        parts.push(format!(
            "{} rows without prompt tokens skipped",
            n.empty_prompts
        ));
    }
    if n.reordered > 0 {
        parts.push(format!(
            "{} requests timed before their predecessor replayed at its time",
            n.reordered
        ));
    }
    if n.ids_mismatch > 0 {
        parts.push(format!(
            "{} requests whose hash_ids do not cover input_length exactly (uncovered tokens are their own)",
            n.ids_mismatch
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    }
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
        groups: Vec::new(),
        policy: a.policy,
        schedule: a.schedule,
        reference: a.reference,
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

/// A progress bar over `total` runs of several, each run's requests in its message
/// ([`tick_run`]).
fn runs_bar(total: u64, label: &str) -> ProgressBar {
    let pb = bar(total, label);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{bar:40}] run {pos}/{len}, {msg} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
}

/// Run `k`'s progress `p` on a [`runs_bar`].
fn tick_run(pb: &ProgressBar, k: usize, p: &Progress) {
    if p.step.is_multiple_of(64) || p.done == p.total {
        pb.set_position(k as u64);
        pb.set_message(format!("{}/{} requests", p.done, p.total));
    }
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

/// `--window` / `--chunk` / `--state`: the hybrid model and the full-attention model of the same
/// size, in one run, on the same requests and the same bytes of KV, through the same loop.
fn run_hybrid(
    a: &Args,
    src: &mut dyn RequestSource,
    what: &str,
    human: &mut dyn std::io::Write,
) -> Result<(), String> {
    use kvshare_core::{GroupKind, StateMode};
    use kvshare_replay::hybrid::{format_hybrid, hybrid_configs, hybrid_kinds};
    let local = match (a.window, a.chunk, a.state.as_deref()) {
        (Some(w), _, _) => GroupKind::SlidingWindow(w),
        (_, Some(c), _) => GroupKind::ChunkedLocal(c),
        (_, _, Some("align")) => GroupKind::State(StateMode::Align),
        (_, _, Some(_)) => GroupKind::State(StateMode::All),
        _ => unreachable!("checked by the caller"),
    };
    let kinds = hybrid_kinds(local, a.full_every);
    let k = kinds.len();
    let base = ReplayConfig {
        reference: false,
        ..config(a)
    };
    let (full, hybrid) = hybrid_configs(&base, kinds)?;
    let _ = write!(
        human,
        "kvshare-replay: {what}\nhybrid: {k} groups ({local:?} x {}, full x 1), {} pages of {} tokens per group page; full model: {} pages (same bytes); policy {}, schedule {}\n\n",
        k - 1,
        hybrid.device_pages - 1,
        a.page_size,
        full.device_pages - 1,
        a.policy.name(),
        a.schedule.name()
    );
    let pb = bar(src.len() as u64, "full");
    let f = replay_source(src, &full, &mut NoModel, &mut |p| tick(&pb, p));
    pb.finish_and_clear();
    let f = f?;
    src.rewind()?;
    let pb = bar(src.len() as u64, "hybrid");
    let hy = replay_source(src, &hybrid, &mut NoModel, &mut |p| tick(&pb, p));
    pb.finish_and_clear();
    let hy = hy?;
    let _ = human.write_all(format_report(&hy, &hybrid, false, None).as_bytes());
    let _ = writeln!(human);
    let _ = human.write_all(format_hybrid(&hy, &f).as_bytes());
    let _ = human.flush();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "hybrid": json_totals(&hy, &hybrid, false, None),
                "full": json_totals(&f, &full, false, None),
                "hybrid_mean_model_pages": hy.mean_model_pages(),
                "full_mean_model_pages": f.mean_model_pages(),
                "hybrid_peak_model_pages": hy.peak_model_pages(),
                "full_peak_model_pages": f.peak_model_pages(),
            })
        );
    }
    Ok(())
}

/// `--kv-dtype`: bf16 and the format at one device KV byte budget, side by side.
fn run_kv_dtype(
    a: &Args,
    dtype: kvshare_core::DType,
    src: &mut dyn RequestSource,
    what: &str,
    human: &mut dyn std::io::Write,
) -> Result<(), String> {
    use kvshare_replay::kvdtype;
    let base = config(a);
    let budget = match a.kv_bytes {
        Some(b) => b,
        None => {
            let mut bf16 = base.clone();
            bf16.geometry.dtype = kvdtype::BASELINE;
            base.device_pages as u64 * bf16.page_bytes()
        }
    };
    let pb = runs_bar(2, "kv-dtype");
    let runs = kvdtype::compare(src, &base, dtype, budget, &mut |k, p| tick_run(&pb, k, &p));
    pb.finish_and_clear();
    let runs = runs?;
    let _ = write!(
        human,
        "kvshare-replay --kv-dtype {}: {what}\n{}-token pages, {} layers x {} KV heads x head dim {}, concurrency {}, policy {}\n{}",
        kvshare_replay::model::dtype_name(dtype),
        a.page_size,
        a.layers,
        a.kv_heads,
        a.head_dim,
        a.concurrency,
        a.policy.name(),
        kvdtype::format_compare(&runs, budget)
    );
    let _ = human.flush();
    if a.json {
        println!("{}", kvdtype::json_compare(&runs, budget));
    }
    Ok(())
}

/// `--engines` / `--pool-pages` / `--compare-routes`: engines behind a router, per routing.
fn run_engines(
    a: &Args,
    src: &mut dyn RequestSource,
    what: &str,
    human: &mut dyn std::io::Write,
) -> Result<(), String> {
    use kvshare_replay::engines::{format_engines, json_engines, Engines, Route};
    let cfg = config(a);
    let sets: Vec<Engines> = if a.compare_routes {
        Route::ALL
            .into_iter()
            .flat_map(|route| {
                [0, a.pool_pages].map(|pool_pages| Engines {
                    engines: a.engines,
                    pool_pages,
                    route,
                })
            })
            .collect()
    } else {
        vec![Engines {
            engines: a.engines,
            pool_pages: a.pool_pages,
            route: a.route,
        }]
    };
    let pb = runs_bar(sets.len() as u64, "engines");
    let mut runs = Vec::with_capacity(sets.len());
    for (k, set) in sets.iter().enumerate() {
        if k > 0 {
            src.rewind()?;
        }
        let r = kvshare_replay::replay_engines(src, &cfg, set, &mut |p| tick_run(&pb, k, &p));
        runs.push(r.inspect_err(|_| pb.finish_and_clear())?);
    }
    pb.finish_and_clear();
    let _ = write!(
        human,
        "kvshare-replay --engines {}: {what}\neach engine: {} device pages of {} tokens, {} host pages, concurrency {}, policy {}; cache manager only; hits in prompt tokens\n\n{}",
        a.engines,
        cfg.device_pages,
        cfg.page_size,
        cfg.host_pages,
        cfg.concurrency,
        cfg.policy.name(),
        format_engines(&runs)
    );
    let _ = human.flush();
    if a.json {
        let rows: Vec<serde_json::Value> = runs.iter().map(json_engines).collect();
        println!("{}", serde_json::json!({ "runs": rows }));
    }
    Ok(())
}

/// One replay, its report, the plot and the JSON line.
fn run_one(
    a: &Args,
    src: &mut dyn RequestSource,
    what: &str,
    human: &mut dyn std::io::Write,
) -> Result<(), String> {
    let cfg = config(a);
    let mut model = make_model(a, &cfg)?;
    let attention = model.describe();
    let _ = write!(
        human,
        "kvshare-replay: {what}\ncache: {} device pages of {} tokens, match unit {} ({:.1} MiB of KV, {} KiB per page), {} host pages, concurrency {}, simulated step {} ms\nmodel: {attention}\n\n",
        cfg.device_pages,
        cfg.page_size,
        cfg.unit(),
        (cfg.device_pages as u64 * cfg.page_bytes()) as f64 / (1u64 << 20) as f64,
        cfg.page_bytes() / 1024,
        cfg.host_pages,
        cfg.concurrency,
        cfg.step_ms
    );
    let _ = human.flush();
    let pb = bar(src.len() as u64, "replay");
    let out = replay_source(src, &cfg, model.as_mut(), &mut |p| tick(&pb, p));
    pb.finish_and_clear();
    let out = out?;
    let title = format!(
        "kvshare-replay: device pages in use ({} requests, {}-token pages)",
        out.requests.len(),
        cfg.page_size
    );
    let svg = kvshare_replay::svg::plot(&out.per_step, &title, cfg.device_pages);
    let svg_path = write_svg(&a.svg, &svg)?;
    let _ = human.write_all(format_report(&out, &cfg, a.attention, Some(&svg_path)).as_bytes());
    let _ = human.flush();
    if a.json {
        println!("{}", json_totals(&out, &cfg, a.attention, Some(&svg_path)));
    }
    Ok(())
}

/// Device pages of the capacity sweep: `--capacities`, or six from the trace's longest request
/// plus two pages per running request to a device that never evicts (every distinct page of the
/// trace, plus the longest request per running request).
fn capacities(a: &Args, src: &mut dyn RequestSource) -> Result<Vec<u32>, String> {
    if let Some(c) = &a.capacities {
        return Ok(c.clone());
    }
    let ps = a.page_size as usize;
    let longest = src.sizes().longest.div_ceil(ps);
    let lo = longest + 2 * a.concurrency;
    let hi = sweep::distinct_pages(src, a.page_size)? + a.concurrency * longest;
    let clamp = |x: usize| x.min(kvshare_core::config::MAX_PAGES as usize) as u32;
    Ok(sweep::default_capacities(clamp(lo), clamp(hi.max(lo))))
}

fn run_sweep(
    a: &Args,
    which: &Sweep,
    src: &mut dyn RequestSource,
    what: &str,
    human: &mut dyn std::io::Write,
) -> Result<(), String> {
    let cfg = config(a);
    let mut factory = |c: &ReplayConfig| make_model(a, c);
    let caps = if *which == Sweep::Capacity {
        capacities(a, src)?
    } else {
        Vec::new()
    };
    let total_runs = match which {
        Sweep::ShareRatio => 5,
        Sweep::PageSize => {
            sweep::page_size_configs(&cfg, cfg.device_pages as u64 * cfg.page_size as u64).len()
                as u64
        }
        Sweep::Capacity => {
            (caps.len() * kvshare_core::EvictionPolicy::ALL.len()) as u64
                * if cfg.host_pages > 0 { 2 } else { 1 }
        }
    };
    let pb = runs_bar(total_runs, "sweep");
    let mut prog = |k: usize, p: Progress| tick_run(&pb, k, &p);
    let (text, runs): (String, Vec<serde_json::Value>) = match which {
        Sweep::ShareRatio => {
            let rows = sweep::share_ratio(&cfg, 16, 1024, 64, a.seed, &mut factory, &mut prog);
            pb.finish_and_clear();
            let rows = rows?;
            (
                format!(
                    "kvshare-replay --sweep share-ratio: 16 concurrent requests of 1024 tokens (960 prompt + 64 output), the first share% of them common; {}-token pages, match unit {}\n\n{}",
                    cfg.page_size,
                    cfg.unit(),
                    sweep::format_share_ratio(&rows)
                ),
                rows.iter().map(|r| row_json(a, &r.out, &r.cfg, r.value)).collect(),
            )
        }
        Sweep::PageSize => {
            let device_tokens = cfg.device_pages as u64 * cfg.page_size as u64;
            let rows = sweep::page_size(&cfg, src, device_tokens, &mut factory, &mut prog);
            pb.finish_and_clear();
            let rows = rows?;
            (
                format!(
                    "kvshare-replay --sweep page-size: {what}; device memory {device_tokens} tokens for every page size\n\n{}",
                    sweep::format_page_size(&rows)
                ),
                rows.iter().map(|r| row_json(a, &r.out, &r.cfg, r.value)).collect(),
            )
        }
        Sweep::Capacity => {
            let mut none = |_: &ReplayConfig| Ok(Box::new(NoModel) as Box<dyn Model>);
            let points = sweep::capacity(&cfg, src, &caps, &mut none, &mut prog);
            pb.finish_and_clear();
            let points = points?;
            let title = format!(
                "kvshare-replay: prefix hits against capacity ({} requests, {}-token pages)",
                src.len(),
                cfg.page_size
            );
            let svg_path = write_svg(&a.svg, &sweep::plot_capacity(&points, &title))?;
            let mut runs = Vec::new();
            for p in &points {
                for (policy, out) in &p.runs {
                    let c = ReplayConfig {
                        device_pages: p.device_pages,
                        host_pages: p.host_pages,
                        policy: *policy,
                        ..cfg.clone()
                    };
                    let mut v = row_json(a, out, &c, p.device_pages);
                    v["reference_hit_tokens"] = p.reference.hit_tokens.into();
                    v["under_pressure"] = p.under_pressure().into();
                    v["schedules_agree"] = p.schedules_agree().into();
                    runs.push(v);
                }
            }
            (
                format!(
                    "kvshare-replay --sweep capacity: {what}; {}-token pages, concurrency {}, schedule {}; prefix hits as % of prompt tokens; offline: Belady's rule on the same requests (an upper bound: see the docs)\n\n{}plot: {svg_path}\n",
                    cfg.page_size,
                    cfg.concurrency,
                    cfg.schedule.name(),
                    sweep::format_capacity(&points)
                ),
                runs,
            )
        }
    };
    let _ = human.write_all(text.as_bytes());
    let _ = human.flush();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"sweep": format!("{which:?}"), "runs": runs})
        );
    }
    Ok(())
}

fn row_json(a: &Args, out: &Outcome, cfg: &ReplayConfig, value: u32) -> serde_json::Value {
    let mut v = json_totals(out, cfg, a.attention, None);
    v["value"] = value.into();
    v
}

/// `--excerpt F --dump-trace FILE`: a generated excerpt in a public format.
fn write_excerpt(a: &Args, format: TraceFormat, path: &str) -> Result<(), String> {
    use kvshare_replay::formats::excerpt;
    let text = match format {
        TraceFormat::Mooncake => excerpt::mooncake(a.requests, a.users, a.gap_ms, 24_000, a.seed),
        TraceFormat::Bailian => excerpt::bailian(a.requests, a.users, a.gap_ms, a.seed),
        TraceFormat::Azure => excerpt::azure(a.requests, a.gap_ms, true, a.seed),
        TraceFormat::BurstGpt => excerpt::burstgpt(a.requests, a.gap_ms, true, a.seed),
        TraceFormat::Native => unreachable!("refused by the parser"),
    };
    std::fs::write(path, text).map_err(|e| format!("cannot write {path}: {e}"))?;
    println!(
        "wrote a generated {} excerpt of {} requests to {path}",
        format.name(),
        a.requests
    );
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    if let (Some(f), Some(path)) = (a.excerpt, &a.dump_trace) {
        return write_excerpt(a, f, path);
    }
    let generated: Vec<Request>;
    let mut file: FileSource;
    let mut mem: VecSource;
    let (src, what): (&mut dyn RequestSource, String) = match &a.trace {
        Some(path) => {
            file = open_trace(a, path)?;
            let what = format!(
                "trace {path} ({} format): {} requests{}",
                file.format().name(),
                file.len(),
                notes(&file)
            );
            (&mut file, what)
        }
        None => {
            let w = workload(a);
            generated = w.generate();
            mem = VecSource::new(&generated);
            (&mut mem, w.describe())
        }
    };
    if let Some(path) = &a.dump_trace {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("cannot write {path}: {e}"))?,
        );
        let mut n = 0;
        while let Some(r) = src.next_request()? {
            f.write_all(to_jsonl(std::slice::from_ref(&r)).as_bytes())
                .map_err(|e| format!("cannot write {path}: {e}"))?;
            n += 1;
        }
        f.flush().map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("wrote {n} requests to {path}");
        return Ok(());
    }
    // With --json the human report goes to stderr and stdout carries the JSON line alone.
    let mut human: Box<dyn std::io::Write> = if a.json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    if a.several_engines() {
        return run_engines(a, src, &what, human.as_mut());
    }
    if let Some(d) = a.kv_dtype {
        return run_kv_dtype(a, d, src, &what, human.as_mut());
    }
    if a.window.is_some() || a.chunk.is_some() || a.state.is_some() {
        return run_hybrid(a, src, &what, human.as_mut());
    }
    match &a.sweep {
        None => run_one(a, src, &what, human.as_mut()),
        Some(which) => run_sweep(a, which, src, &what, human.as_mut()),
    }
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
