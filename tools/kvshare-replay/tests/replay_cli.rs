//! The `kvshare-replay` command: bad traces are refused with the line and the reason before
//! anything runs; `--json` prints one line with the totals; `--help` documents every option.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvshare-replay"))
}

fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvshare-replay-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run kvshare-replay")
}

fn refused(file: &str, line: usize, reason: &str) {
    let svg = tmp(&format!("{file}.svg"));
    let out = run(&[
        "--trace",
        &data(file),
        "--no-attention",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{file}: {err}");
    assert!(
        err.contains(&format!("{file}:line {line}: ")) && err.contains(reason),
        "{file}: expected line {line} and {reason:?} in:\n{err}"
    );
    assert!(err.contains("nothing was run"), "{err}");
    assert!(out.stdout.is_empty(), "no report for a refused trace");
    assert!(!svg.exists(), "no plot for a refused trace");
}

#[test]
fn bad_traces_are_refused_with_line_and_reason() {
    refused("bad_json.jsonl", 2, "not valid JSON");
    refused(
        "bad_negative_token.jsonl",
        3,
        "field `prompt`: element 1 is -2; token ids must be non-negative",
    );
    refused("bad_missing_field.jsonl", 1, "missing field `output`");
    refused(
        "bad_duplicate_id.jsonl",
        3,
        "duplicate id \"a\" (first used on line 1)",
    );
}

#[test]
fn missing_file_and_bad_flags_fail_cleanly() {
    let out = run(&["--trace", "/nonexistent/trace.jsonl", "--no-attention"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/trace.jsonl"));
    let out = run(&["--page-size", "zero"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--page-size: \"zero\" is not a valid number"));
    let out = run(&["--frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["--sweep", "colour"]);
    assert_eq!(out.status.code(), Some(2));
    for (flag, value, says) in [
        (
            "--trace-format",
            "csv",
            "is not native, mooncake, bailian, azure or burstgpt",
        ),
        ("--policy", "arc", "is not lru, lfu or s3fifo"),
        ("--schedule", "random", "is not fcfs or session-affinity"),
        ("--capacities", "10,x", "\"x\" is not a valid number"),
        (
            "--excerpt",
            "native",
            "is not mooncake, bailian, azure or burstgpt",
        ),
    ] {
        let out = run(&[flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(&["--excerpt", "mooncake"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --dump-trace FILE"));
}

/// A generated excerpt in each public format, written by `--excerpt`, replays through
/// `--trace-format` with every policy and schedule; a bad line of a public format is refused
/// with its line number before anything runs.
#[test]
fn public_formats_from_generated_excerpts() {
    for format in ["mooncake", "bailian", "azure", "burstgpt"] {
        let path = tmp(&format!("excerpt.{format}"));
        let out = run(&[
            "--excerpt",
            format,
            "--requests",
            "40",
            "--users",
            "4",
            "--dump-trace",
            path.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for (policy, schedule) in [("lru", "fcfs"), ("s3fifo", "session-affinity")] {
            let out = run(&[
                "--trace",
                path.to_str().unwrap(),
                "--trace-format",
                format,
                "--policy",
                policy,
                "--schedule",
                schedule,
                "--page-size",
                "64",
                "--device-pages",
                "3000",
                "--no-attention",
                "--json",
                "--svg",
                tmp(&format!("{format}.svg")).to_str().unwrap(),
            ]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{format}: {err}");
            assert!(err.contains(&format!("({format} format): ")), "{err}");
            let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let n = j["requests"].as_u64().unwrap();
            // BurstGPT's failed calls (no request tokens) are skipped and said so.
            if format == "burstgpt" && n < 40 {
                let note = format!("{} rows without prompt tokens skipped", 40 - n);
                assert!(err.contains(&note), "{err}");
            } else {
                assert_eq!(n, 40, "{format}");
            }
            assert_eq!(j["policy"], policy);
            assert_eq!(j["schedule"], schedule);
            assert!(
                j["reference"]["hit_tokens"].as_u64().unwrap() >= j["hit_tokens"].as_u64().unwrap()
            );
        }
    }
    let bad = tmp("bad.mooncake");
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1}\n",
    )
    .unwrap();
    let out = run(&[
        "--trace",
        bad.to_str().unwrap(),
        "--trace-format",
        "mooncake",
        "--no-attention",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("bad.mooncake:line 2: missing field `hash_ids`"),
        "{err}"
    );
    assert!(err.contains("nothing was run") && out.stdout.is_empty());
}

#[test]
fn capacity_sweep_prints_plots_and_reports_every_policy() {
    let svg = tmp("capacity.svg");
    let out = run(&[
        "--sweep",
        "capacity",
        "--users",
        "4",
        "--turns",
        "3",
        "--system-tokens",
        "128",
        "--capacities",
        "60,90,2000",
        "--no-attention",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("lru/offline") && err.contains("s3fifo/offline"),
        "{err}"
    );
    assert_eq!(
        err.lines()
            .filter(|l| l.trim_start().starts_with("60 ")
                || l.trim_start().starts_with("90 ")
                || l.trim_start().starts_with("2000 "))
            .count(),
        3,
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["sweep"], "Capacity");
    assert_eq!(j["runs"].as_array().unwrap().len(), 9);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("offline"));
    // A hybrid model has no offline reference: refused, naming why.
    let out = run(&["--sweep", "capacity", "--match-unit", "4", "--no-attention"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs a plain model with whole-page hits")
    );
}

#[test]
fn flag_forms_and_non_utf8_arguments() {
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    // `--flag=value` is the same as `--flag value`.
    let out = run(&["--page-size=zero"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--page-size: \"zero\" is not a valid number"));
    // A value attached to a flag that takes none is refused, not ignored.
    let out = run(&["--check=1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--check"), "{}", stderr(&out));
    // A non-UTF-8 argument is a usage error (exit 2), not a panic (exit 101).
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"/tmp/\xff.jsonl");
    let out = bin().arg("--trace").arg(bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--trace: ") && stderr(&out).contains("not valid UTF-8"));
    let out = bin().arg(bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn help_lists_every_option() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--trace",
        "--page-size",
        "--match-unit",
        "--device-pages",
        "--host-pages",
        "--concurrency",
        "--seed",
        "--no-attention",
        "--json",
        "--sweep",
        "--svg",
        "--help",
        "--trace-format",
        "--policy",
        "--schedule",
        "--capacities",
        "--no-reference",
        "--excerpt",
        "--requests",
        "--gap-ms",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn json_line_carries_the_totals_of_a_known_trace() {
    // tests/replay.rs computes these by hand: 2 requests, 19 prompt tokens, 8 hit; 6 pages
    // without reuse, 4 allocated; peaks 6 / 4 / 4.
    let svg = tmp("shared.svg");
    let out = run(&[
        "--trace",
        &data("replay_shared_system.jsonl"),
        "--page-size",
        "4",
        "--device-pages",
        "64",
        "--no-attention",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "stdout is the JSON line alone: {stdout}"
    );
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(j["requests"], 2);
    assert_eq!(j["prompt_tokens"], 19);
    assert_eq!(j["query_tokens"], 19);
    assert_eq!(j["hit_tokens"], 8);
    assert_eq!(j["no_reuse_pages"], 6);
    assert_eq!(j["kvshare_pages"], 4);
    assert_eq!(j["peak_pages"]["no_sharing"], 6);
    assert_eq!(j["peak_pages"]["kvshare"], 4);
    assert_eq!(j["peak_pages"]["ideal"], 4);
    assert_eq!(j["ideal_gap_steps"], 0);
    assert_eq!(j["evictions"], 0);
    assert_eq!(j["steps"], 4);
    let saving = j["saving_pct"].as_f64().unwrap();
    assert!((saving - 100.0 / 3.0).abs() < 1e-9);
    // The human report went to stderr, with the table and the plot path.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("turn  reqs"), "{err}");
    assert!(
        err.contains("kvshare == ideal at every one of the 4 steps"),
        "{err}"
    );
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.contains("ideal"));
    assert_eq!(
        j["svg"],
        std::fs::canonicalize(&svg).unwrap().to_str().unwrap()
    );
}

#[test]
fn default_table_prints_one_row_per_turn() {
    let svg = tmp("chat.svg");
    let out = run(&[
        "--no-attention",
        "--users",
        "3",
        "--turns",
        "4",
        "--system-tokens",
        "64",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 4, "{text}");
    assert!(text.contains("\n all "), "{text}");
    assert!(text.contains("plot: "), "{text}");
}

#[test]
fn page_size_sweep_reports_five_measured_runs() {
    let out = run(&[
        "--sweep",
        "page-size",
        "--no-attention",
        "--users",
        "2",
        "--turns",
        "3",
        "--system-tokens",
        "128",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = j["runs"].as_array().unwrap();
    let sizes: Vec<u64> = runs
        .iter()
        .map(|r| r["page_size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, vec![8, 16, 32, 64, 128]);
    for r in runs {
        assert_eq!(r["ideal_gap_steps"], 0);
        assert_eq!(r["requests"], 6);
        // Same device memory in tokens for every page size.
        assert_eq!(
            r["device_pages"].as_u64().unwrap() * r["page_size"].as_u64().unwrap(),
            14336
        );
    }
    // Finer pages share more of each history (the partial last page is recomputed).
    let hits: Vec<f64> = runs
        .iter()
        .map(|r| r["prefix_hit_pct"].as_f64().unwrap())
        .collect();
    assert!(hits.windows(2).all(|w| w[0] >= w[1]), "{hits:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with(|c: char| c == ' ' || c.is_ascii_digit()))
            .count(),
        5,
        "{err}"
    );
}

#[test]
fn page_size_sweep_with_a_match_unit_runs_each_larger_page_twice() {
    let out = run(&[
        "--sweep",
        "page-size",
        "--match-unit",
        "16",
        "--no-attention",
        "--users",
        "2",
        "--turns",
        "3",
        "--system-tokens",
        "120",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = j["runs"].as_array().unwrap();
    let shape: Vec<(u64, u64)> = runs
        .iter()
        .map(|r| {
            (
                r["page_size"].as_u64().unwrap(),
                r["match_unit"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (8, 8),
            (16, 16),
            (32, 32),
            (32, 16),
            (64, 64),
            (64, 16),
            (128, 128),
            (128, 16)
        ]
    );
    for pair in runs.windows(2) {
        let (whole, unit) = (&pair[0], &pair[1]);
        if whole["page_size"] != unit["page_size"] {
            continue;
        }
        // The same page, matched by 16 tokens: at least the whole-page hits, by partial copies.
        let hit = |r: &serde_json::Value| r["hit_tokens"].as_u64().unwrap();
        assert!(hit(unit) > hit(whole), "{unit} vs {whole}");
        assert!(unit["unit_hits"].as_u64().unwrap() > 0);
        assert_eq!(whole["unit_hits"], 0);
    }
    // A unit that does not divide the page is refused by the cache config.
    let out = run(&["--page-size", "16", "--match-unit", "5", "--no-attention"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("match_unit"));
}

#[test]
fn default_mode_runs_attention_and_verifies_it() {
    // Attention is on unless --no-attention: a small built-in run with every output row checked.
    let svg = tmp("attn.svg");
    let out = run(&[
        "--users",
        "2",
        "--turns",
        "2",
        "--system-tokens",
        "32",
        "--page-size",
        "8",
        "--layers",
        "1",
        "--kv-heads",
        "1",
        "--head-dim",
        "8",
        "--verify",
        "--check",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["attention"], true);
    assert!(j["model_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(j["ideal_gap_steps"], 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CPU attention backend"), "{err}");
    assert!(err.contains("checked against a dense reference"), "{err}");
}
