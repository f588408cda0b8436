//! The `kvshare-replay` command's comparisons: `--kv-dtype` (a page format against bf16 at one
//! byte budget) and `--engines` / `--pool-pages` / `--route` / `--compare-routes` (several
//! engines behind a router, with and without a shared pool): their JSON line, their tables and
//! the refusal of bad values naming the accepted ones.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvshare-replay"))
        .args(args)
        .output()
        .expect("run kvshare-replay")
}

fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

fn refused(args: &[&str], code: i32, words: &[&str]) {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    for w in words {
        assert!(err.contains(w), "{args:?}: expected {w:?} in {err}");
    }
    assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
}

const SMALL: [&str; 6] = ["--users", "4", "--turns", "4", "--system-tokens", "256"];

#[test]
fn kv_dtype_reports_both_formats_at_one_budget() {
    let budget = 200 * 32768u64; // 200 bf16 pages of the default geometry
    let b = budget.to_string();
    let mut args = SMALL.to_vec();
    args.extend(["--kv-dtype", "int8", "--kv-bytes", &b, "--json"]);
    let out = run(&args);
    let j = json(&out);
    assert_eq!(j["kv_budget_bytes"].as_u64(), Some(budget));
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["dtype"], "bf16");
    assert_eq!(runs[1]["dtype"], "int8");
    assert_eq!(runs[0]["page_bytes"].as_u64(), Some(32768));
    assert_eq!(runs[1]["page_bytes"].as_u64(), Some(16384));
    assert_eq!(runs[0]["device_pages"].as_u64(), Some(200));
    assert_eq!(runs[1]["device_pages"].as_u64(), Some(400));
    for r in runs {
        assert_eq!(r["kv_bytes"].as_u64(), Some(budget));
        let (q, h, c) = (
            r["query_tokens"].as_u64().unwrap(),
            r["hit_tokens"].as_u64().unwrap(),
            r["recomputed_tokens"].as_u64().unwrap(),
        );
        assert_eq!(h + c, q);
        assert!(r["peak_kv_bytes"].as_u64().unwrap() <= budget);
    }
    let human = String::from_utf8_lossy(&out.stderr);
    assert!(human.contains("device KV budget"), "{human}");
    assert!(
        human.lines().any(|l| l.starts_with("int8")),
        "a row per format: {human}"
    );
}

#[test]
fn kv_dtype_takes_a_trace_and_defaults_the_budget_to_the_device_pages_in_bf16() {
    let out = run(&[
        "--trace",
        &data("replay_eviction.jsonl"),
        "--device-pages",
        "64",
        "--kv-dtype",
        "fp8_e5m2",
        "--json",
    ]);
    let j = json(&out);
    assert_eq!(j["kv_budget_bytes"].as_u64(), Some(64 * 32768));
    assert_eq!(j["runs"][1]["device_pages"].as_u64(), Some(128));
}

#[test]
fn kv_dtype_refuses_bad_values_naming_the_accepted_ones() {
    refused(
        &["--kv-dtype", "fp4"],
        2,
        &[
            "--kv-dtype",
            "\"fp4\"",
            "f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8 or int8_per_token_head",
        ],
    );
    refused(&["--kv-bytes", "1000"], 2, &["--kv-bytes", "--kv-dtype"]);
    refused(
        &["--kv-dtype", "int8", "--kv-bytes", "0"],
        2,
        &["--kv-bytes", "below the minimum 1"],
    );
    refused(
        &["--kv-dtype", "int8", "--kv-bytes", "100"],
        1,
        &["--kv-bytes", "hold 0 bf16 pages"],
    );
    refused(
        &["--kv-dtype", "int8", "--sweep", "capacity"],
        2,
        &["--kv-dtype", "--sweep"],
    );
}

#[test]
fn engines_report_hits_per_tier_for_one_routing() {
    let mut args = SMALL.to_vec();
    args.extend([
        "--engines",
        "2",
        "--pool-pages",
        "500",
        "--route",
        "round-robin",
        "--json",
    ]);
    let j = json(&run(&args));
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(r["route"], "round-robin");
    assert_eq!(
        (r["engines"].as_u64(), r["pool_pages"].as_u64()),
        (Some(2), Some(500))
    );
    let n = |k: &str| r[k].as_u64().unwrap();
    assert_eq!(
        n("device_hit_tokens") + n("host_hit_tokens") + n("pool_hit_tokens"),
        n("hit_tokens")
    );
    assert_eq!(n("hit_tokens") + n("recomputed_tokens"), n("query_tokens"));
    assert!(n("pool_hit_tokens") > 0, "turns move between engines: {r}");
    assert!(n("pool_peak_entries") <= 500);
    assert_eq!(r["requests_per_engine"], serde_json::json!([8, 8]));
}

#[test]
fn compare_routes_runs_every_routing_without_and_with_the_pool_on_a_trace() {
    let out = run(&[
        "--trace",
        &data("replay_shared_system.jsonl"),
        "--page-size",
        "4",
        "--engines",
        "3",
        "--pool-pages",
        "64",
        "--compare-routes",
        "--json",
    ]);
    let j = json(&out);
    let runs = j["runs"].as_array().unwrap();
    let got: Vec<(String, u64)> = runs
        .iter()
        .map(|r| {
            (
                r["route"].as_str().unwrap().to_string(),
                r["pool_pages"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = ["round-robin", "session", "kv-aware"]
        .iter()
        .flat_map(|r| [(r.to_string(), 0), (r.to_string(), 64)])
        .collect();
    assert_eq!(got, want);
    for pair in runs.chunks(2) {
        assert_eq!(pair[0]["pool_hit_tokens"].as_u64(), Some(0));
        assert!(pair[1]["hit_tokens"].as_u64() >= pair[0]["hit_tokens"].as_u64());
    }
    let human = String::from_utf8_lossy(&out.stderr);
    assert!(
        human.contains("kv-aware") && human.contains("recomputed"),
        "{human}"
    );
}

#[test]
fn engines_refuse_bad_values_naming_the_accepted_ones() {
    refused(
        &["--route", "random"],
        2,
        &["--route", "\"random\"", "round-robin, session or kv-aware"],
    );
    refused(
        &["--engines", "0"],
        2,
        &["--engines", "below the minimum 1"],
    );
    refused(
        &["--compare-routes"],
        2,
        &["--compare-routes", "--pool-pages"],
    );
    refused(
        &["--engines", "2", "--window", "64"],
        2,
        &["--engines", "--window"],
    );
    refused(
        &["--pool-pages", "10", "--dtype", "int8"],
        1,
        &["pool tier takes f32, f16 and bf16 pages only"],
    );
}
