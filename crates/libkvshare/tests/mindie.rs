//! Builds the MindIE adapter (integration/mindie) and its C++ test programs against the
//! project's compatibility headers and the freshly built `libkvshare.so`, then runs them: once with
//! `-std=c++17 -Wall -Wextra -Werror` (plus MindIE's own stricter warnings), through the
//! adapter's CMakeLists.txt when `cmake` is installed and with the compiler directly otherwise,
//! and once more under AddressSanitizer + UndefinedBehaviorSanitizer when the compiler supports
//! it.
//!
//! Needs a C++17 compiler: `$CXX`, else `c++`. `KVS_MINDIE_NO_ASAN=1` skips the sanitizer run.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use support::native::{cxx, libkvshare, loader_path, root};

const TESTS: &[&str] = &[
    "test_scenarios",
    "test_bad_input",
    "test_random",
    "test_fcfs",
    "test_hybrid",
    "test_fcfs_kv",
    "test_kv_pool",
];

const WARNINGS: &[&str] = &[
    "-std=c++17",
    "-Wall",
    "-Wextra",
    "-Werror",
    // A few of the warnings MindIE builds with, so the adapter also compiles in their tree.
    "-Woverloaded-virtual",
    "-Wold-style-cast",
    "-Wdelete-non-virtual-dtor",
];

/// `target/<profile>/`: two directories above this test executable (`target/<profile>/deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf()
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

/// Compiles the adapter, the factory and the compat `Sequence` code to objects, then links and
/// runs every test program. Compiles run in parallel.
fn build_and_run(variant: &str, extra: &[&str], env: &[(&str, &str)]) {
    let start = Instant::now();
    let m = root().join("integration/mindie");
    let out = profile_dir().join("mindie-cpp").join(variant);
    std::fs::create_dir_all(&out).unwrap();
    let lib = libkvshare();
    let mut flags: Vec<String> = WARNINGS.iter().map(|s| s.to_string()).collect();
    flags.extend(extra.iter().map(|s| s.to_string()));
    for inc in ["compat", "include", "src"] {
        flags.push(format!("-I{}", m.join(inc).display()));
    }
    flags.push(format!("-I{}", root().join("include").display()));

    let objects = [
        ("adapter", m.join("src/kvshare_block_manager.cpp")),
        ("hybrid", m.join("src/kvshare_hybrid_manager.cpp")),
        ("base", m.join("src/kvshare_manager_base.cpp")),
        ("factory", m.join("src/factory.cpp")),
        ("sequence_compat", m.join("compat/sequence_compat.cpp")),
    ];
    let compile: Vec<_> = objects
        .iter()
        .map(|(name, src)| {
            let obj = out.join(format!("{name}.o"));
            let mut c = Command::new(cxx());
            c.args(&flags).arg("-c").arg(src).arg("-o").arg(&obj);
            (name.to_string(), c, obj)
        })
        .collect();
    let objs: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = compile
            .into_iter()
            .map(|(name, mut c, obj)| {
                s.spawn(move || {
                    run(&mut c, &format!("compile {name} ({variant})"));
                    obj
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let rpath = format!("-Wl,-rpath,{}", lib.parent().unwrap().display());
    let exes: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = TESTS
            .iter()
            .map(|t| {
                let (flags, objs, lib, rpath, m, out) = (&flags, &objs, &lib, &rpath, &m, &out);
                s.spawn(move || {
                    let exe = out.join(t);
                    let mut c = Command::new(cxx());
                    c.args(flags)
                        .arg(m.join(format!("tests/{t}.cpp")))
                        .args(objs)
                        .arg(lib)
                        .arg(rpath)
                        .arg("-o")
                        .arg(&exe);
                    run(&mut c, &format!("build {t} ({variant})"));
                    exe
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let built = start.elapsed();
    for exe in &exes {
        let mut c = Command::new(exe);
        c.env("LD_LIBRARY_PATH", loader_path());
        for (k, v) in env {
            c.env(k, v);
        }
        let text = run(&mut c, &format!("{} ({variant})", exe.display()));
        print!("{text}");
    }
    println!(
        "mindie adapter [{variant}]: built in {:.1}s, ran {} programs in {:.1}s",
        built.as_secs_f64(),
        exes.len(),
        (start.elapsed() - built).as_secs_f64()
    );
}

/// Whether `cxx()` can build and run a program with AddressSanitizer here.
fn asan_works() -> bool {
    let dir = profile_dir().join("mindie-cpp/asan-probe");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.cpp");
    std::fs::write(
        &src,
        "#include <vector>\nint main() { std::vector<int> v(2); return v[1]; }\n",
    )
    .unwrap();
    let exe = dir.join("probe");
    let ok = Command::new(cxx())
        .args(["-fsanitize=address,undefined", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok && Command::new(&exe)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The programs built directly with the compiler, where cmake is missing; with cmake,
/// `mindie_adapter_cmake_build` builds and runs the same programs with the same warnings.
#[test]
fn mindie_adapter_cpp_tests() {
    if have_cmake() {
        println!("skipped: mindie_adapter_cmake_build builds and runs these programs");
        return;
    }
    build_and_run("plain", &["-O0", "-g"], &[]);
}

fn have_cmake() -> bool {
    Command::new("cmake").arg("--version").output().is_ok()
}

#[test]
fn mindie_adapter_cpp_tests_asan() {
    if std::env::var_os("KVS_MINDIE_NO_ASAN").is_some() {
        println!("skipped: KVS_MINDIE_NO_ASAN is set");
        return;
    }
    if !asan_works() {
        println!(
            "skipped: {} cannot build AddressSanitizer programs here",
            cxx()
        );
        return;
    }
    build_and_run(
        "asan",
        &[
            "-O1",
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer",
        ],
        &[
            ("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0"),
            ("UBSAN_OPTIONS", "print_stacktrace=1"),
        ],
    );
}

/// The user-facing CMake build (compat headers, tests, drop-in library), when cmake exists.
#[test]
fn mindie_adapter_cmake_build() {
    if !have_cmake() {
        println!("skipped: cmake is not installed (mindie_adapter_cpp_tests builds the adapter)");
        return;
    }
    let start = Instant::now();
    let build = profile_dir().join("mindie-cpp/cmake");
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(&build).unwrap();
    let lib = libkvshare();
    run(
        Command::new("cmake")
            .arg("-S")
            .arg(root().join("integration/mindie"))
            .arg("-B")
            .arg(&build)
            .arg(format!("-DKVSHARE_LIBRARY={}", lib.display()))
            .arg(format!("-DCMAKE_CXX_COMPILER={}", cxx()))
            .arg("-DCMAKE_BUILD_TYPE=Debug"),
        "cmake configure",
    );
    run(
        Command::new("cmake").arg("--build").arg(&build).arg("-j2"),
        "cmake build",
    );
    let text = run(
        Command::new("ctest")
            .arg("--output-on-failure")
            .env("LD_LIBRARY_PATH", loader_path())
            .current_dir(&build),
        "ctest",
    );
    print!("{text}");
    // The drop-in library exports MindIE's factory symbol.
    let so = build.join("libkvshare_mindie.so");
    assert!(so.exists(), "{} was not built", so.display());
    if let Ok(out) = Command::new("nm").arg("-DC").arg(&so).output() {
        let syms = String::from_utf8_lossy(&out.stdout);
        assert!(
            syms.lines().any(|l| l.contains(" T ")
                && l.contains("mindie_llm::BlockManagerFactory::CreateBlockSpaceManager")),
            "libkvshare_mindie.so does not export the factory"
        );
    }
    println!(
        "cmake build and ctest: {:.1}s",
        start.elapsed().as_secs_f64()
    );
}
