//! `kvshare-bench vllm`: runs the vLLM adapter's benchmark script with `$KVS_VLLM_PYTHON`,
//! passing its arguments through and its failure back (the benchmark itself runs in CI's smoke
//! step and `scripts/test-python`'s environment, where vLLM is installed).

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvshare-bench"))
}

/// `kvshare-bench ARGS` with `python` as the vLLM venv's interpreter.
fn run_with(python: &std::path::Path, args: &[&str]) -> std::process::Output {
    bench()
        .args(args)
        .env("KVS_VLLM_PYTHON", python)
        .output()
        .unwrap()
}

/// A fresh folder for test `tag` holding `python`, an executable stand-in interpreter with
/// `script` as its text: (the folder, the stand-in).
fn stand_in(tag: &str, script: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("kvshare-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("python");
    std::fs::write(&fake, script).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (dir, fake)
}

#[test]
fn vllm_mode_runs_the_script_with_its_arguments() {
    // A stand-in interpreter: prints what it was given, fails when asked to.
    let (dir, fake) = stand_in(
        "cli",
        "#!/bin/sh\necho \"ran $*\"\nfor a in \"$@\"; do [ \"$a\" = --fail ] && exit 3; done\nexit 0\n",
    );
    // Each mode runs its script (after the mode's leading arguments) with the arguments given,
    // and reports the script's failure naming it.
    for (mode, script) in [
        ("vllm", "bench_vllm.py"),
        ("vllm-e2e", "engine_e2e.py bench"),
    ] {
        let out = run_with(&fake, &[mode, "--quick", "--repeats", "2"]);
        assert!(out.status.success(), "{out:?}");
        let said = String::from_utf8_lossy(&out.stdout);
        let want = format!("integration/vllm_ascend/bench/{script} --quick --repeats 2");
        assert!(said.contains(&want), "{said}");

        let out = run_with(&fake, &[mode, "--fail"]);
        assert_eq!(out.status.code(), Some(2));
        let file = script.split(' ').next().unwrap();
        assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("{file} failed")));
    }

    let out = run_with(&dir.join("missing"), &["vllm"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("set KVS_VLLM_PYTHON"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kvshare-bench attention` on one small shape with a stand-in for vLLM's Python that speaks
/// the side-by-side protocol: the K/V files are handed over with their dtype (the stand-in
/// reports it as its "isa"), the kernel build it names is printed, vLLM's log lines are
/// skipped, every round is one request, and the ratios come out in the JSON.
#[test]
fn attention_mode_side_by_side_protocol() {
    let (dir, fake) = stand_in(
        "attn",
        r#"#!/bin/sh
[ "$2" = "import vllm._custom_ops, numpy" ] && exit 0
for f in k v q out table; do [ -s "$3/$f.bin" ] || { echo "no $f" >&2; exit 1; }; done
for a in "$@"; do last=$a; done
echo "INFO a vLLM log line on stdout"
huge=0; [ "$THP_MEM_ALLOC_ENABLE" = 1 ] && huge=3145728
extra=; case $last in fp8*) extra=', "same_bytes": true, "bound": 0.75';; esac
echo "KVSBENCH {\"version\": \"fake\", \"build\": \"_C_FAKE\", \"isa\": \"$last\", \"max_diff\": 0.5, \"huge_bytes\": $huge$extra}"
while read line; do echo "KVSBENCH 2.5"; done
"#,
    );
    let args = [
        "attention",
        "--seqs",
        "3",
        "--ctx",
        "256",
        "--kv-heads",
        "2",
        "--head-dim",
        "64",
        "--page-size",
        "16",
        "--iters",
        "2",
    ];
    // Huge pages on (the default): vLLM's side is started with torch's THP switch on too.
    for (extra, dt, huge) in [
        (&[][..], "f16", true),
        (
            &["--dtype", "bf16", "--huge-pages", "off"][..],
            "bf16",
            false,
        ),
        (&["--dtype", "f32"][..], "f32", true),
    ] {
        let out = bench()
            .args(args)
            .args(extra)
            .env("KVS_VLLM_PYTHON", &fake)
            .env("KVS_TORCH_PYTHON", dir.join("missing"))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(said.contains(&format!("GQA 4, {dt} KV")), "{said}");
        assert!(
            said.contains(&format!(
                "vLLM fake cpu_attention_with_kv_cache (build _C_FAKE, isa {dt})"
            )),
            "{said}"
        );
        let want = format!(
            "\"vllm\":{{\"version\":\"fake\",\"build\":\"_C_FAKE\",\"isa\":\"{dt}\",\"ms\":2.500"
        );
        assert!(said.contains(&want), "{said}");
        assert!(said.contains("vLLM time / kvshare time"), "{said}");
        let json = said.lines().last().unwrap();
        let j: serde_json::Value = serde_json::from_str(json).expect("last line is JSON");
        assert_eq!(j["shapes"][0]["dtype"], dt, "{json}");
        assert_eq!(j["shapes"][0]["huge_pages"], huge, "{json}");
        assert_eq!(
            j["shapes"][0]["vllm"]["huge_mib"],
            if huge { 3 } else { 0 },
            "{json}"
        );
        assert!(!json.contains("\"vllm_over_kvshare\":null"), "{json}");
        // Every path's launches paired with the streaming reads around them: 7 at least.
        let paths = j["shapes"][0]["paths"].as_object().expect("paths");
        assert!(!paths.is_empty(), "{json}");
        for (name, p) in paths {
            let pf = &p["bw_fraction_paired"];
            assert_eq!(pf["launches"], 7, "{name}: {json}");
            let (lo, mid, hi) = (
                pf["min"].as_f64().unwrap(),
                pf["median"].as_f64().unwrap(),
                pf["max"].as_f64().unwrap(),
            );
            assert!(0.0 < lo && lo <= mid && mid <= hi, "{name}: {json}");
        }
        assert!(said
            .contains("paired with the streaming reads just before and after each launch: median"));
        // The launch cost: a tiny launch on the pool and on one thread, both timed.
        assert!(
            said.contains("launch cost (2 sequences x 16 tokens"),
            "{said}"
        );
        // What bounds decode: the same launch with one query head per kv head, timed beside it.
        assert!(said.contains("arithmetic check ("), "{said}");
        let ac = &j["shapes"][0]["arithmetic_check"];
        let (g1, gg, r) = (
            ac["gqa1_ms"].as_f64().unwrap(),
            ac["group_ms"].as_f64().unwrap(),
            ac["ratio"].as_f64().unwrap(),
        );
        // The JSON rounds both times to 0.001 ms and the ratio to 0.001: the exact times lie
        // within 0.0005 of the printed ones, so the ratio lies between the extremes those
        // allow (at 0.04 ms, about 2.5% either way), and is printed within 0.0005 of that.
        assert!(g1 > 0.0 && gg > 0.0005, "{json}");
        let (lo, hi) = ((g1 - 0.0005) / (gg + 0.0005), (g1 + 0.0005) / (gg - 0.0005));
        assert!(lo - 0.0005 <= r && r <= hi + 0.0005, "{json}");
        let lc = &j["launch_us"];
        assert!(lc["threads"].as_u64().unwrap() >= 1, "{json}");
        assert!(lc["pool"].as_f64().unwrap() > 0.0, "{json}");
        assert!(lc["one_thread"].as_f64().unwrap() > 0.0, "{json}");
    }
    // An fp8 cache: its codes handed over with vLLM's kv_cache_dtype as the last argument; what
    // the script says of the stored bytes and of the bound is printed and in the JSON. An int8
    // cache has no vLLM counterpart: said, and the rest runs.
    for fmt in ["fp8_e4m3", "fp8_e5m2"] {
        let out = bench()
            .args(args)
            .args(["--dtype", fmt])
            .env("KVS_VLLM_PYTHON", &fake)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(
            said.contains(&format!(
                "(build _C_FAKE, isa {fmt}) on the same KV in its own layout, kv_cache_dtype {fmt} \
(uint8, k_scale = v_scale = 1; the same stored bytes as kvshare's)"
            )),
            "{said}"
        );
        assert!(
            said.contains("max |vLLM - kvshare| 5.00e-1 (bound 7.50e-1: within)"),
            "{said}"
        );
        assert!(said.contains("vLLM time / kvshare time"), "{said}");
        let j: serde_json::Value = serde_json::from_str(said.lines().last().unwrap()).unwrap();
        let v = &j["shapes"][0]["vllm"];
        assert_eq!(v["kv_cache_dtype"], fmt, "{v}");
        assert_eq!(v["same_bytes"], true, "{v}");
        assert_eq!(v["bound"].as_f64(), Some(0.75), "{v}");
        assert!(
            j["shapes"][0]["quantized_against"]["paths"].is_object(),
            "{j}"
        );
    }
    for fmt in ["int8", "int8_per_token_head"] {
        let out = bench()
            .args(args)
            .args(["--dtype", fmt])
            .env("KVS_VLLM_PYTHON", &fake)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{fmt}: {out:?}");
        assert!(
            said.contains("vLLM side-by-side: not run: vLLM's CPU backend has no int8 KV cache"),
            "{said}"
        );
        assert!(said.contains("\"vllm\":null"), "{said}");
        // The same values as bf16 and f16 beside it, and the bytes each reads per token: an
        // int8 per-token-head row holds its 4-byte scale too.
        let j: serde_json::Value = serde_json::from_str(said.lines().last().unwrap()).unwrap();
        let q = &j["shapes"][0]["quantized_against"];
        assert!(q["paths"].is_object(), "{j}");
        let bpt = &q["bytes_per_token"];
        let row = if fmt == "int8" { 64 } else { 68 };
        assert_eq!(bpt[fmt].as_u64(), Some(2 * 2 * row), "{j}");
    }
    let out = bench().args(args).args(["--dtype", "f8"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--dtype: f16, bf16, f32, fp8_e4m3, fp8_e5m2, int8 or int8_per_token_head"));
    let out = bench()
        .args(args)
        .args(["--huge-pages", "maybe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--huge-pages: on or off"));

    // Without vLLM: the comparison is skipped with the reason, the rest still runs.
    let without_vllm = |extra: &[&str]| {
        bench()
            .args(args)
            .args(extra)
            .env("KVS_VLLM_PYTHON", dir.join("missing"))
            .env("KVS_TORCH_PYTHON", dir.join("missing"))
            .output()
            .unwrap()
    };
    let out = without_vllm(&[]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        said.contains("vLLM side-by-side: skipped: vllm._custom_ops is not importable"),
        "{said}"
    );
    assert!(said.contains("\"vllm\":null"), "{said}");
    // GQA 1 already: no arithmetic check to make.
    let out = without_vllm(&["--group", "1"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(said.contains("GQA 1, f16 KV"), "{said}");
    assert!(!said.contains("arithmetic check"), "{said}");
    assert!(said.contains("\"arithmetic_check\":null"), "{said}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kvshare-bench attention --prefill --chunk N`: chunked prefill (the last N tokens of each
/// sequence are the queries) with a stand-in for the torch / vLLM script that checks what it is
/// handed: N in its arguments and a query file of N tokens per sequence.
#[test]
fn prefill_chunk_hands_the_chunk_over() {
    // Arguments: -c SCRIPT DIR SEQS CTX KV_HEADS HEAD_DIM HEADS PAGE THREADS DTYPE CHUNK.
    let (dir, fake) = stand_in(
        "chunk",
        r#"#!/bin/sh
want=$(( $4 * ${12} * $8 * $7 * 4 ))
got=$(stat -c %s "$3/q.bin")
[ "$got" = "$want" ] || { echo "q.bin $got bytes, want $want" >&2; exit 1; }
echo "KVSBENCH {\"torch\": \"fake\", \"torch_max_diff\": 0.0, \"vllm\": \"fake\", \"vllm_isa\": \"chunk ${12} of $5\", \"vllm_max_diff\": 0.0}"
while read line; do echo "KVSBENCH 2.5"; done
"#,
    );
    let args = [
        "attention",
        "--prefill",
        "--seqs",
        "2",
        "--ctx",
        "64",
        "--kv-heads",
        "2",
        "--head-dim",
        "64",
        "--page-size",
        "16",
        "--iters",
        "1",
        "--threads",
        "1",
    ];
    let out = bench()
        .args(args)
        .args(["--chunk", "16"])
        .env("KVS_VLLM_PYTHON", &fake)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        said.contains("chunked: the last 16 tokens of each are queries, 48 cached before them"),
        "{said}"
    );
    assert!(said.contains("(isa chunk 16 of 64)"), "{said}");
    assert!(said.contains("vllm time / this"), "{said}");
    let j: serde_json::Value = serde_json::from_str(said.lines().last().unwrap()).unwrap();
    for r in j["results"].as_array().unwrap() {
        assert_eq!(
            (r["ctx"].as_u64(), r["chunk"].as_u64()),
            (Some(64), Some(16)),
            "{r}"
        );
        assert_eq!(r["sides"]["vllm"]["ms"].as_f64(), Some(2.5), "{r}");
    }
    let out = bench().args(args).args(["--chunk", "65"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let why = "--chunk: 1..=64 (--ctx), not 65";
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(why),
        "{out:?}"
    );
    let out = bench()
        .args(["attention", "--chunk", "16"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--chunk needs --prefill"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kv-write` writes with every format on every path the machine has (the bench itself refuses
/// a path that stores other codes than another), and reports each against the bf16 copy and
/// the plain loop in its JSON line; a bad option is an error, never a panic.
#[test]
fn kv_write_mode_reports_every_format_and_path() {
    let out = bench()
        .args([
            "kv-write",
            "--tokens",
            "48",
            "--heads",
            "2",
            "--head-dim",
            "40",
        ])
        .args(["--page-size", "16", "--iters", "2"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_str(said.lines().last().unwrap()).unwrap();
    assert_eq!(json["mode"], "kv-write");
    let rows = json["rows"].as_array().unwrap();
    for dt in [
        "bf16",
        "f16",
        "fp8_e4m3",
        "fp8_e5m2",
        "int8",
        "int8_per_token_head",
    ] {
        let of: Vec<_> = rows.iter().filter(|r| r["dtype"] == dt).collect();
        assert!(of.iter().any(|r| r["path"] == "portable"), "{dt}: {said}");
        for r in of {
            assert!(r["ns_per_token_head"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["vs_bf16_copy"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["speedup_vs_plain"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    for bad in [
        &["--dtype", "int4"][..],
        &["--tokens", "0"],
        &["--iters", "x"],
    ] {
        let out = bench().arg("kv-write").args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
}

/// `kvshare-bench attention --prefill --dtype fp8_e5m2|int8`: one run on the quantized cache
/// with the same values as bf16 beside it on every path; the stand-in script is handed the
/// cache's name after the chunk, and what it says of vLLM's fp8 cache is printed.
#[test]
fn prefill_quantized_cache_runs_beside_bf16() {
    let (dir, fake) = stand_in(
        "qprefill",
        r#"#!/bin/sh
[ "${11}" = bf16 ] || { echo "query type ${11}, want bf16" >&2; exit 1; }
echo "KVSBENCH {\"torch\": \"fake\", \"torch_max_diff\": 0.0, \"vllm\": \"fake\", \"vllm_isa\": \"cache ${13}\", \"vllm_max_diff\": 0.25, \"same_bytes\": true, \"misread_codes\": 6, \"misread_max\": 0.125, \"bound\": 0.5}"
while read line; do echo "KVSBENCH 2.5"; done
"#,
    );
    for fmt in ["fp8_e5m2", "int8", "int8_per_token_head"] {
        let out = bench()
            .args([
                "attention",
                "--prefill",
                "--dtype",
                fmt,
                "--seqs",
                "1",
                "--ctx",
                "32",
                "--kv-heads",
                "1",
                "--head-dim",
                "64",
                "--page-size",
                "16",
                "--iters",
                "1",
                "--threads",
                "1",
            ])
            .env("KVS_VLLM_PYTHON", &fake)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(said.contains(&format!("(isa cache {fmt})")), "{said}");
        assert!(
            said.contains(
                "(its fp8 cache holds kvshare's stored bytes; its kernel reads 6 finite codes as \
another value, at most 1.25e-1 off; bound 5.00e-1: within)"
            ),
            "{said}"
        );
        let j: serde_json::Value = serde_json::from_str(said.lines().last().unwrap()).unwrap();
        let r = &j["results"][0];
        assert_eq!(r["dtype"], fmt, "{r}");
        assert_eq!(j["results"].as_array().unwrap().len(), 1, "{j}");
        let sides = r["sides"].as_object().unwrap();
        for (label, side) in sides {
            if label.ends_with(" tiled") && !label.ends_with("bf16 tiled") {
                let isa = label.trim_end_matches(" tiled");
                // Both times are printed to 0.001 ms: the ratio lies between the extremes they
                // allow, and is printed to 0.001.
                let (a, b) = (
                    side["ms"].as_f64().unwrap(),
                    sides[&format!("{isa} bf16 tiled")]["ms"].as_f64().unwrap(),
                );
                let (lo, hi) = ((a - 0.0005) / (b + 0.0005), (a + 0.0005) / (b - 0.0005));
                let got = side["over_bf16"].as_f64().unwrap();
                assert!(lo - 0.0005 <= got && got <= hi + 0.0005, "{label}: {r}");
            }
        }
        assert!(sides.keys().any(|k| k.ends_with("bf16 tiled")), "{r}");
        assert!(said.contains("this time / bf16 tiled time"), "{said}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_mode_is_an_error() {
    let out = bench().arg("nonsense").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mode"));
}

/// `kvshare-bench MODE --help` (and `-h`) prints that mode's options and runs nothing: no
/// benchmark line, no JSON, no Python (the vLLM modes are given an interpreter that does not
/// exist).
#[test]
fn every_mode_has_its_help() {
    let missing = std::env::temp_dir().join("kvshare-bench-no-such-python");
    for mode in ["manager", "attention", "kv-write", "vllm", "vllm-e2e"] {
        for flag in ["--help", "-h"] {
            let out = bench()
                .args([mode, flag])
                .env("KVS_VLLM_PYTHON", &missing)
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{mode} {flag}: {out:?}");
            assert!(
                said.starts_with(&format!("kvshare-bench {mode}: ")),
                "{mode} {flag}: {said}"
            );
            assert!(
                said.contains(&format!("    kvshare-bench {mode} [")),
                "{mode} {flag}: {said}"
            );
            assert!(!said.contains('{'), "{mode} {flag} ran something: {said}");
        }
    }
    // The top-level help names every mode and how to reach its help.
    let out = bench().arg("--help").output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for mode in [
        "manager",
        "attention",
        "kv-write",
        "vllm",
        "vllm-e2e",
        "MODE --help",
    ] {
        assert!(said.contains(mode), "{said}");
    }
}

/// Arguments that are not UTF-8 are refused with a message and exit status 2, never a panic
/// (101); the vLLM modes hand them to the script as they are.
#[cfg(unix)]
#[test]
fn non_utf8_arguments_are_errors_not_panics() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let bad = OsStr::from_bytes(b"\xff");
    for (args, said) in [
        (vec![bad], "unknown mode"),
        (vec![OsStr::new("manager"), bad], "unexpected argument"),
        (
            vec![OsStr::new("attention"), OsStr::new("--dtype"), bad],
            "--dtype: \"\\xFF\" is not valid UTF-8",
        ),
        (
            vec![OsStr::new("attention"), OsStr::new("--seqs"), bad],
            "--seqs: \"\\xFF\" is not valid UTF-8",
        ),
    ] {
        let out = bench().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let (dir, fake) = stand_in(
        "utf8",
        "#!/bin/sh\nfor a in \"$@\"; do last=$a; done\nprintf '%s' \"$last\" | od -c\n",
    );
    let out = bench()
        .args([OsStr::new("vllm"), bad])
        .env("KVS_VLLM_PYTHON", &fake)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("377"),
        "{out:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Options are read as a parser reads them: `--flag=value`, an unknown option or a stray
/// value is an error naming it, a flag's missing value too; after `--` a vLLM mode's
/// arguments, `--help` included, go to its script.
#[test]
fn options_are_parsed_not_matched_by_hand() {
    for (args, said) in [
        (
            &["attention", "--dtype=f8"][..],
            "--dtype: f16, bf16, f32, fp8_e4m3, fp8_e5m2, int8 or int8_per_token_head, not \"f8\"",
        ),
        (&["attention", "--iters"][..], "--iters needs a value"),
        (
            &["attention", "--iters", "x"][..],
            "--iters: \"x\" is not a valid number",
        ),
        (&["attention", "--bogus"][..], "unknown option \"--bogus\""),
        (&["attention", "stray"][..], "unexpected argument \"stray\""),
        (&["manager", "--bogus"][..], "--bogus"),
        (&["manager", "--quick=1"][..], "--quick"),
        (&["--quick"][..], "the mode comes first"),
    ] {
        let out = bench().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(err.contains(said), "{args:?}: {err}");
    }
    let (dir, fake) = stand_in("dashdash", "#!/bin/sh\necho \"ran $*\"\n");
    let out = run_with(&fake, &["vllm", "--quick", "--", "--help"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("bench_vllm.py --quick --help"), "{said}");
    std::fs::remove_dir_all(&dir).unwrap();
}
