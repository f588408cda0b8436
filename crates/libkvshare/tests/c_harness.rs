//! The C harness: compiles every `tests/c/*.c` program against the cdylib that cargo built for
//! this test run, exactly as a serving engine would link it, and runs each one (exit code 0 is
//! success; on failure its output is printed).
//!
//! Variants (one `#[test]` per program and variant, so failures are named):
//! * `plain`: `cc -std=c11 -Wall -Wextra -Wpedantic -Werror -I include`;
//! * `asan_ubsan`: the same plus `-fsanitize=address,undefined` (UBSan made fatal, LeakSanitizer
//!   on) when the compiler supports it;
//! * `tsan`: `-fsanitize=thread`, for the multithreaded programs (`stress.c`);
//! * `valgrind`: the plain binary under `valgrind --error-exitcode=99 --leak-check=full`, only
//!   with `KVS_VALGRIND=1` (slow: about 25 s more on a 2-core machine, where the rest of this
//!   file takes about 17 s, mostly compiling the sanitizer builds).
//!
//! Programs not listed in [`programs!`] (e.g. `tests/c/attn_*.c`, written separately) are built
//! and run by `other_programs_*`, so a new file is never silently ignored. `bug_*.c` programs
//! are regression tests for library bugs this harness found.
//!
//! Also: the header compiles on its own as C11 and as C++17 (`header_*`).
//!
//! Environment: `CC` / `CXX` pick the compilers (default `cc` / `c++`); `KVS_VALGRIND=1` adds the
//! valgrind runs.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use support::native::{cc, crate_dir, cxx, lib_dir, loader_path, root, C_WARNINGS};

/// Seconds a program may run before it is killed (valgrind gets `VALGRIND_TIMEOUT`).
const TIMEOUT: Duration = Duration::from_secs(120);
const VALGRIND_TIMEOUT: Duration = Duration::from_secs(600);

/// Where compiled programs go.
fn out_dir(variant: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("c_harness")
        .join(variant);
    std::fs::create_dir_all(&d).expect("create output dir");
    d
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    AsanUbsan,
    Tsan,
    Valgrind,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plain | Variant::Valgrind => "plain",
            Variant::AsanUbsan => "asan_ubsan",
            Variant::Tsan => "tsan",
        }
    }

    /// Extra compiler flags (compile and link).
    fn flags(self) -> &'static [&'static str] {
        match self {
            Variant::Plain | Variant::Valgrind => &["-O1"],
            Variant::AsanUbsan => &[
                "-O1",
                "-fsanitize=address,undefined",
                "-fno-sanitize-recover=all",
                "-fno-omit-frame-pointer",
            ],
            Variant::Tsan => &["-O1", "-fsanitize=thread", "-fno-omit-frame-pointer"],
        }
    }

    /// Runtime options: every sanitizer report fails the program.
    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Variant::Plain | Variant::Valgrind => &[],
            Variant::AsanUbsan => &[
                (
                    "ASAN_OPTIONS",
                    "detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=86:\
                     strict_string_checks=1:detect_stack_use_after_return=1",
                ),
                ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
                ("LSAN_OPTIONS", "exitcode=87"),
            ],
            Variant::Tsan => &[],
        }
    }

    /// Runtime options that name files of the repository.
    fn env_owned(self) -> Vec<(String, String)> {
        match self {
            // The library itself is not instrumented: see tests/c/tsan.supp.
            Variant::Tsan => vec![(
                "TSAN_OPTIONS".into(),
                format!(
                    "halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions={}",
                    crate_dir().join("tests/c/tsan.supp").display()
                ),
            )],
            _ => Vec::new(),
        }
    }

    /// Whether this machine can run the variant; `Err` says why not.
    fn available(self) -> Result<(), String> {
        static ASAN: OnceLock<Result<(), String>> = OnceLock::new();
        static TSAN: OnceLock<Result<(), String>> = OnceLock::new();
        static VALGRIND: OnceLock<Result<(), String>> = OnceLock::new();
        match self {
            Variant::Plain => Ok(()),
            Variant::AsanUbsan => ASAN.get_or_init(|| probe(self)).clone(),
            Variant::Tsan => TSAN.get_or_init(|| probe(self)).clone(),
            Variant::Valgrind => VALGRIND
                .get_or_init(|| {
                    if std::env::var("KVS_VALGRIND").as_deref() != Ok("1") {
                        return Err("set KVS_VALGRIND=1 to run it".into());
                    }
                    match Command::new("valgrind").arg("--version").output() {
                        Ok(o) if o.status.success() => Ok(()),
                        _ => Err("KVS_VALGRIND=1 but valgrind is not installed".into()),
                    }
                })
                .clone(),
        }
    }
}

/// Compiles and runs a trivial program with the variant's flags: a compiler without the
/// sanitizer runtime fails here, and the variant is reported as unavailable.
fn probe(v: Variant) -> Result<(), String> {
    let dir = out_dir(&format!("probe_{}", v.name()));
    let src = dir.join("probe.c");
    std::fs::write(
        &src,
        "#include <stdlib.h>\nint main(void) { char *p = malloc(4); p[0] = 0; int r = p[0]; \
         free(p); return r; }\n",
    )
    .unwrap();
    let exe = dir.join("probe");
    let out = Command::new(cc())
        .args(v.flags())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cc()))?;
    if !out.status.success() {
        return Err(format!(
            "{} does not support {:?}: {}",
            cc(),
            v.flags(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe)
        .envs(v.env().iter().copied())
        .envs(v.env_owned())
        .output()
        .map_err(|e| format!("cannot run probe: {e}"))?;
    if !run.status.success() {
        return Err(format!(
            "{:?} probe does not run here: {}",
            v,
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    Ok(())
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd`, killing it after `timeout`; returns its output and wall time.
fn run_with_timeout(mut cmd: Command, timeout: Duration) -> (Output, Duration, bool) {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", show(&cmd)));
    // Drain the pipes on threads so a chatty program cannot block on a full pipe.
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut so, &mut v).ok();
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut se, &mut v).ok();
        v
    });
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            timed_out = true;
            break child.wait().expect("wait after kill");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    };
    (out, start.elapsed(), timed_out)
}

fn c_source(name: &str) -> PathBuf {
    crate_dir().join("tests/c").join(format!("{name}.c"))
}

/// Compiler flags a program needs beyond the variant's: `*_openmp_*.c` use OpenMP (libgomp).
fn program_flags(name: &str) -> &'static [&'static str] {
    if name.contains("_openmp_") {
        &["-fopenmp"]
    } else {
        &[]
    }
}

/// Compiles `tests/c/<name>.c` for `v` and returns the executable.
fn compile(name: &str, v: Variant) -> PathBuf {
    let src = c_source(name);
    assert!(src.is_file(), "{} does not exist", src.display());
    let lib = lib_dir();
    let exe = out_dir(v.name()).join(name);
    let mut cmd = Command::new(cc());
    cmd.arg("-std=c11")
        .args(C_WARNINGS)
        .arg("-g")
        .args(v.flags())
        .arg("-I")
        .arg(root().join("include"))
        .arg("-I")
        .arg(crate_dir().join("tests/c"))
        .args(program_flags(name))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib.display()))
        .arg("-lkvshare")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lpthread")
        .arg("-lm");
    let shown = show(&cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cc()));
    assert!(
        out.status.success(),
        "compiling {name}.c ({v:?}) failed:\n$ {shown}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Builds and runs one program in one variant; panics with its output unless it exits 0.
fn run_program(name: &str, v: Variant) {
    if let Err(why) = v.available() {
        eprintln!("{name} ({v:?}): not run: {why}");
        return;
    }
    let t0 = Instant::now();
    let exe = compile(name, v);
    let compiled = t0.elapsed();
    let mut cmd = if v == Variant::Valgrind {
        let mut c = Command::new("valgrind");
        c.args([
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect,possible",
            "--quiet",
        ])
        .arg(format!(
            "--suppressions={}",
            crate_dir().join("tests/c/valgrind.supp").display()
        ))
        .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    cmd.envs(v.env().iter().copied());
    cmd.envs(v.env_owned());
    cmd.env("LD_LIBRARY_PATH", loader_path());
    let shown = show(&cmd);
    let timeout = if v == Variant::Valgrind {
        VALGRIND_TIMEOUT
    } else {
        TIMEOUT
    };
    let (out, took, timed_out) = run_with_timeout(cmd, timeout);
    let text = format!(
        "--- stdout ---\n{}--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !timed_out,
        "{name} ({v:?}) did not finish within {timeout:?}:\n$ {shown}\n{text}"
    );
    assert!(
        out.status.success(),
        "{name} ({v:?}) failed with {}:\n$ {shown}\n{text}",
        out.status
    );
    eprintln!(
        "{name} ({v:?}): ok: compiled in {:.2}s, ran in {:.2}s",
        compiled.as_secs_f64(),
        took.as_secs_f64()
    );
}

/// One module per program, with one test per variant; `+ tsan` adds a ThreadSanitizer run.
macro_rules! programs {
    ($($name:ident $(+ $tsan:ident)?;)*) => {
        /// Programs that have their own tests; everything else in tests/c is run by
        /// `other_programs_*`.
        const KNOWN: &[&str] = &[$(stringify!($name)),*];
        $(
            mod $name {
                use super::*;
                #[test]
                fn plain() { run_program(stringify!($name), Variant::Plain) }
                #[test]
                fn asan_ubsan() { run_program(stringify!($name), Variant::AsanUbsan) }
                #[test]
                fn valgrind() { run_program(stringify!($name), Variant::Valgrind) }
                $(
                    #[test]
                    fn $tsan() { run_program(stringify!($name), Variant::Tsan) }
                )?
            }
        )*
    };
}

programs! {
    version;
    lifecycle;
    seed_scenario;
    bad_input;
    bad_input_pages;
    groups_bad_input;
    groups_bad_input_lengths;
    pool_bad_input;
    stress + tsan;
    // Regression programs for bugs the harness found (fixed).
    bug_defer_commit_stale_pending;
    bug_append_lookahead_overflow;
    bug_append_batch_cow_overcount;
    bug_config_bool_byte;
    bug_groups_chunked_only_hit;
    bug_groups_chunk_not_page_multiple;
    bug_groups_align_append_without_release;
    bug_huge_pages_contract;
    // The header next to declarations mirroring CANN's (no unprefixed macros).
    header_cann_names;
}

/// Every `tests/c/*.c` that is not in [`KNOWN`] (e.g. `attn_*.c`), sorted.
fn other_programs() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(crate_dir().join("tests/c"))
        .expect("tests/c")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "c").then(|| p.file_stem()?.to_str().map(String::from))?
        })
        // `ascend_*.c` need the emulated CANN runtime: tests/ascend_c.rs builds it and runs them.
        .filter(|n| !KNOWN.contains(&n.as_str()) && !n.starts_with("ascend_"))
        .collect();
    v.sort();
    v
}

fn run_others(v: Variant) {
    let others = other_programs();
    eprintln!("other programs: {others:?}");
    let mut failures = Vec::new();
    for name in &others {
        if let Err(e) = std::panic::catch_unwind(|| run_program(name, v)) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{name}: {msg}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn other_programs_plain() {
    run_others(Variant::Plain)
}

#[test]
fn other_programs_asan_ubsan() {
    run_others(Variant::AsanUbsan)
}

#[test]
fn other_programs_valgrind() {
    run_others(Variant::Valgrind)
}

#[test]
fn lib_dir_is_found() {
    let d = lib_dir();
    assert!(d.join("libkvshare.so").is_file());
}

// ---- the header on its own ----

fn compile_header(compiler: &str, args: &[&str], what: &str) {
    let mut cmd = Command::new(compiler);
    cmd.args(args)
        .arg("-I")
        .arg(root().join("include"))
        .arg("-fsyntax-only");
    let shown = show(&cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "include/kvshare.h does not compile on its own as {what}:\n$ {shown}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_c11() {
    let h = root().join("include/kvshare.h");
    let h = h.to_str().unwrap();
    compile_header(
        &cc(),
        &[
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-x",
            "c",
            h,
        ],
        "C11",
    );
}

#[test]
fn header_cxx17() {
    let cpp = crate_dir().join("tests/cxx/header_only.cpp");
    compile_header(
        &cxx(),
        &[
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            cpp.to_str().unwrap(),
        ],
        "C++17",
    );
}
