//! The C and C++ install (`scripts/install-c`), as a user meets it:
//!
//! * README.md's install blocks for C (pkg-config) and C++ (CMake) run verbatim, with `HOME` a
//!   fresh temporary directory: they install into `$HOME/.local` and build and run
//!   `examples/c/hello.c` shared and static;
//! * the installed tree: the files, the SONAME carrying `KVS_ABI_VERSION`, which library each
//!   program needs at run time, the `.pc` and CMake versions equal to `Cargo.toml`'s, no debug
//!   info, the main build's library (not a second build's), a `DESTDIR` install;
//! * `pkg-config --libs kvshare-static` links statically, and the tree still works once moved;
//! * `--uninstall` removes exactly what the install wrote;
//! * `find_package(kvshare X)` accepts exactly the compatible versions;
//! * the MindIE adapter's CMake finds the installed kvshare with `find_package`;
//! * the Python packages: the README's one command, wheels that install anywhere.
//!
//! The install uses the release build in cargo's target folder (about 2 minutes on a 2-core
//! machine the first time, then seconds). Parts that need `pkg-config` or `cmake` are skipped,
//! with the reason printed, when the tool is not installed (`.ci/run` installs both).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A fresh directory under cargo's per-test scratch space.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "install-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Cargo and rustup find their homes through `HOME` unless told: keep them when `HOME` moves.
fn keep_toolchain_homes(cmd: &mut Command) -> &mut Command {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    for (var, dir) in [("CARGO_HOME", ".cargo"), ("RUSTUP_HOME", ".rustup")] {
        match std::env::var_os(var) {
            Some(v) => cmd.env(var, v),
            None => match &home {
                Some(h) => cmd.env(var, h.join(dir)),
                None => cmd,
            },
        };
    }
    cmd
}

/// Runs `cmd`, panicking with its output unless it succeeds; returns stdout.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The fenced block that follows the `<!-- tests/install.rs: NAME -->` marker in README.md.
fn readme_block(name: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let marker = format!("<!-- tests/install.rs: {name} -->");
    let at = readme
        .find(&marker)
        .unwrap_or_else(|| panic!("README.md has no `{marker}`"));
    let mut lines = readme[at + marker.len()..].lines().skip(1);
    let fence = lines.next().unwrap_or_default();
    assert!(
        fence.starts_with("```"),
        "`{marker}` must be followed by a fenced block, found {fence:?}"
    );
    let mut block = String::new();
    for line in lines {
        if line.starts_with("```") {
            return block;
        }
        block.push_str(line);
        block.push('\n');
    }
    panic!("README.md: the block after `{marker}` is not closed");
}

/// Runs a README block with bash (`-euo pipefail`) from the repository root, `HOME` = `home`.
fn run_readme_block(name: &str, home: &Path) -> String {
    let block = readme_block(name);
    let mut cmd = Command::new("bash");
    cmd.arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(&block)
        .current_dir(root())
        .env("HOME", home)
        .env_remove("PKG_CONFIG_PATH");
    keep_toolchain_homes(&mut cmd);
    let out = run(&mut cmd, &format!("README block `{name}`:\n{block}"));
    print!("{out}");
    out
}

fn install(prefix: &Path, destdir: Option<&Path>) {
    let mut cmd = Command::new(root().join("scripts/install-c"));
    cmd.arg("--prefix").arg(prefix);
    if let Some(d) = destdir {
        cmd.env("DESTDIR", d);
    }
    run(&mut cmd, "scripts/install-c");
}

fn abi() -> u32 {
    kvshare::version::kvs_abi_version()
}

/// `readelf -d` lines of a kind (`SONAME`, `NEEDED`), the bracketed names.
fn dynamic(file: &Path, kind: &str) -> Vec<String> {
    let text = run(
        Command::new("readelf")
            .arg("-d")
            .arg(file)
            .env("LC_ALL", "C"),
        "readelf -d",
    );
    text.lines()
        .filter(|l| l.contains(&format!("({kind})")))
        .filter_map(|l| Some(l.split_once('[')?.1.trim_end_matches(']').to_string()))
        .collect()
}

/// The GNU build ID of an ELF file (kept by `strip --strip-debug`).
fn build_id(file: &Path) -> String {
    let notes = run(
        Command::new("readelf")
            .arg("-n")
            .arg(file)
            .env("LC_ALL", "C"),
        "readelf -n",
    );
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build ID:\n{notes}", file.display()))
        .to_string()
}

/// Every program the README blocks built says the second prompt found its pages cached.
fn check_hello_output(out: &str, runs: usize) {
    let want = format!(
        "kvshare {} (ABI {}): 8 of 9 prompt tokens found cached",
        env!("CARGO_PKG_VERSION"),
        abi()
    );
    assert_eq!(
        out.lines().filter(|l| *l == want).count(),
        runs,
        "expected {runs} lines {want:?} in:\n{out}"
    );
}

#[test]
fn readme_c_block_builds_with_pkg_config_shared_and_static() {
    if !have("pkg-config") {
        println!("skipped: pkg-config is not installed (apt-get install pkg-config)");
        return;
    }
    let home = scratch("readme-c");
    let out = run_readme_block("c", &home);
    check_hello_output(&out, 2);
    let soname = format!("libkvshare.so.{}", abi());
    assert_eq!(
        dynamic(&root().join("build/hello"), "NEEDED")
            .iter()
            .filter(|n| n.starts_with("libkvshare"))
            .collect::<Vec<_>>(),
        [&soname],
        "the shared build must need the library by its SONAME"
    );
    assert!(
        !dynamic(&root().join("build/hello-static"), "NEEDED")
            .iter()
            .any(|n| n.starts_with("libkvshare")),
        "the static build must not need libkvshare at run time"
    );
    // pkg-config reports Cargo.toml's version.
    let mut modversion = Command::new("pkg-config");
    modversion
        .args(["--modversion", "kvshare"])
        .env("PKG_CONFIG_PATH", home.join(".local/lib/pkgconfig"));
    assert_eq!(
        run(&mut modversion, "pkg-config --modversion").trim(),
        env!("CARGO_PKG_VERSION")
    );
}

#[test]
fn readme_cxx_block_builds_with_cmake_shared_and_static() {
    if !have("cmake") {
        println!("skipped: cmake is not installed (apt-get install cmake)");
        return;
    }
    let home = scratch("readme-cxx");
    // A CMake build directory remembers the kvshare_DIR it found first (a previous run's
    // $HOME): start from none, as a first-time user does.
    let _ = std::fs::remove_dir_all(root().join("build/hello-cmake"));
    let out = run_readme_block("cxx", &home);
    check_hello_output(&out, 2);
    let build = root().join("build/hello-cmake");
    let soname = format!("libkvshare.so.{}", abi());
    assert!(dynamic(&build.join("hello"), "NEEDED").contains(&soname));
    assert!(!dynamic(&build.join("hello_static"), "NEEDED")
        .iter()
        .any(|n| n.starts_with("libkvshare")));
}

#[test]
fn installed_tree_has_the_layout_soname_and_versions() {
    let prefix = scratch("tree").join("usr");
    install(&prefix, None);
    let lib = prefix.join("lib");
    let soname = format!("libkvshare.so.{}", abi());
    for f in [
        lib.join(&soname),
        lib.join("libkvshare.a"),
        prefix.join("include/kvshare/kvshare.h"),
        lib.join("pkgconfig/kvshare.pc"),
        lib.join("pkgconfig/kvshare-static.pc"),
        lib.join("cmake/kvshare/kvshareConfig.cmake"),
        lib.join("cmake/kvshare/kvshareConfigVersion.cmake"),
    ] {
        assert!(f.is_file(), "{} was not installed", f.display());
    }
    assert_eq!(
        std::fs::read_link(lib.join("libkvshare.so")).unwrap(),
        Path::new(&soname),
        "libkvshare.so must link to the SONAME file"
    );
    assert_eq!(
        dynamic(&lib.join(&soname), "SONAME"),
        std::slice::from_ref(&soname)
    );
    assert_eq!(
        std::fs::read(prefix.join("include/kvshare/kvshare.h")).unwrap(),
        std::fs::read(root().join("include/kvshare.h")).unwrap()
    );
    for module in ["kvshare", "kvshare-static"] {
        let pc = std::fs::read_to_string(lib.join(format!("pkgconfig/{module}.pc"))).unwrap();
        // Relocatable: the prefix is the .pc file's folder's grandparent, no absolute path.
        assert!(pc.contains("prefix=${pcfiledir}/../..\n"), "{pc}");
        assert!(!pc.contains(&prefix.display().to_string()), "{pc}");
        assert!(
            pc.contains(&format!("Version: {}\n", env!("CARGO_PKG_VERSION"))),
            "{pc}"
        );
        assert!(pc.contains(&format!("abi_version={}\n", abi())), "{pc}");
    }
    // Shipped without debug info or the archive's LLVM bitcode (the build keeps them).
    for file in [lib.join(&soname), lib.join("libkvshare.a")] {
        let sections = run(
            Command::new("readelf")
                .args(["-S", "-W"])
                .arg(&file)
                .env("LC_ALL", "C"),
            "readelf -S",
        );
        for section in [".debug_info", ".debug_line", ".llvmbc"] {
            assert!(
                !sections.contains(section),
                "{} keeps {section}",
                file.display()
            );
        }
    }
    // The library is the main build's (cargo's target folder), not a second build's.
    let built = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("release/libkvshare.so");
    assert_eq!(
        build_id(&lib.join(&soname)),
        build_id(&built),
        "the installed library is not {}",
        built.display()
    );
    let version =
        std::fs::read_to_string(lib.join("cmake/kvshare/kvshareConfigVersion.cmake")).unwrap();
    assert!(version.contains(&format!(
        "set(PACKAGE_VERSION \"{}\")",
        env!("CARGO_PKG_VERSION")
    )));
}

#[test]
fn destdir_stages_files_but_names_the_final_prefix() {
    let stage = scratch("destdir");
    let prefix = Path::new("/opt/kvshare-test-prefix");
    install(prefix, Some(&stage));
    let staged = stage.join("opt/kvshare-test-prefix");
    assert!(staged.join("include/kvshare/kvshare.h").is_file());
    let pc = std::fs::read_to_string(staged.join("lib/pkgconfig/kvshare.pc")).unwrap();
    assert!(pc.contains("prefix=${pcfiledir}/../..\n"), "{pc}");
    assert!(!pc.contains(&stage.display().to_string()), "{pc}");
    assert!(
        !prefix.exists(),
        "DESTDIR install wrote to the prefix itself"
    );
}

/// `pkg-config --libs kvshare-static` links libkvshare.a (the program needs no libkvshare at
/// run time), `kvshare` the shared library, and both still work after the installed tree moved
/// (the .pc files find the prefix from their own folder; so does the CMake package).
#[test]
fn pkg_config_links_static_and_shared_from_a_moved_tree() {
    if !have("pkg-config") {
        println!("skipped: pkg-config is not installed (apt-get install pkg-config)");
        return;
    }
    let dir = scratch("moved");
    let first = dir.join("first");
    install(&first, None);
    let moved = dir.join("elsewhere/prefix");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    std::fs::rename(&first, &moved).unwrap();
    let pkg_config = |args: &[&str]| {
        let out = run(
            Command::new("pkg-config")
                .args(args)
                .env("PKG_CONFIG_PATH", moved.join("lib/pkgconfig")),
            &format!("pkg-config {args:?}"),
        );
        out.split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let hello = root().join("examples/c/hello.c");
    let stat = dir.join("hello-static");
    run(
        Command::new("cc")
            .arg(&hello)
            .arg("-o")
            .arg(&stat)
            .args(pkg_config(&["--cflags", "--libs", "kvshare-static"])),
        "cc (pkg-config kvshare-static)",
    );
    assert!(
        !dynamic(&stat, "NEEDED")
            .iter()
            .any(|n| n.starts_with("libkvshare")),
        "pkg-config --libs kvshare-static must link libkvshare.a"
    );
    let shared = dir.join("hello-shared");
    let libdir = pkg_config(&["--variable=libdir", "kvshare"]).join(" ");
    run(
        Command::new("cc")
            .arg(&hello)
            .arg("-o")
            .arg(&shared)
            .args(pkg_config(&["--cflags", "--libs", "kvshare"]))
            .arg(format!("-Wl,-rpath,{libdir}")),
        "cc (pkg-config kvshare)",
    );
    assert!(dynamic(&shared, "NEEDED").contains(&format!("libkvshare.so.{}", abi())));
    let mut out = String::new();
    for program in [&stat, &shared] {
        out += &run(Command::new(program).env_remove("LD_LIBRARY_PATH"), "hello");
    }
    check_hello_output(&out, 2);
    assert_eq!(
        pkg_config(&["--variable=abi_version", "kvshare-static"]),
        [abi().to_string()]
    );
    if have("cmake") {
        let found = cmake_find(&moved, "").expect("find_package after the move");
        assert_eq!(
            found,
            format!("{} ABI {}", env!("CARGO_PKG_VERSION"), abi())
        );
    }
}

/// `--uninstall` removes every file the install wrote (under a non-default libdir too) and the
/// folders that held only them, leaves other packages' files, and says when there was nothing.
#[test]
fn uninstall_removes_exactly_what_install_wrote() {
    let prefix = scratch("uninstall").join("usr");
    let foreign = [
        prefix.join("lib64/pkgconfig/other.pc"),
        prefix.join("lib64/cmake/other/otherConfig.cmake"),
        prefix.join("include/other.h"),
        prefix.join("lib64/libkvshare.so.1"),
    ];
    for f in &foreign {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, "another package's file\n").unwrap();
    }
    let before = tree(&prefix);
    let script = root().join("scripts/install-c");
    run(
        Command::new(&script)
            .arg("--prefix")
            .arg(&prefix)
            .args(["--libdir", "lib64"]),
        "scripts/install-c --libdir lib64",
    );
    assert!(prefix.join("lib64/pkgconfig/kvshare.pc").is_file());
    let said = run(
        Command::new(&script).arg("--prefix").arg(&prefix).args([
            "--libdir",
            "lib64",
            "--uninstall",
        ]),
        "scripts/install-c --uninstall",
    );
    assert!(
        said.contains(&format!("kvshare (ABI {}) uninstalled", abi())),
        "{said}"
    );
    assert_eq!(tree(&prefix), before, "{said}");
    let out = Command::new(&script)
        .arg("--prefix")
        .arg(&prefix)
        .args(["--libdir", "lib64", "--uninstall"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing to uninstall"),
        "{out:?}"
    );
}

/// Every path under `dir` (folders with a trailing `/`), sorted.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.strip_prefix(dir).unwrap().display().to_string();
            if p.is_dir() && !p.is_symlink() {
                out.push(format!("{name}/"));
                todo.push(p);
            } else {
                out.push(name);
            }
        }
    }
    out.sort();
    out
}

/// `find_package(kvshare <request>)` in a project with no languages: Ok(found version) or Err.
fn cmake_find(prefix: &Path, request: &str) -> Result<String, String> {
    let src = scratch("find");
    std::fs::write(
        src.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.16)\nproject(find_kvshare LANGUAGES NONE)\n\
             find_package(kvshare {request} REQUIRED)\n\
             if(NOT TARGET kvshare::kvshare OR NOT TARGET kvshare::kvshare_static)\n\
             message(FATAL_ERROR \"targets missing\")\nendif()\n\
             message(STATUS \"FOUND ${{kvshare_VERSION}} ABI ${{kvshare_ABI_VERSION}}\")\n"
        ),
    )
    .unwrap();
    let out = Command::new("cmake")
        .arg("-S")
        .arg(&src)
        .arg("-B")
        .arg(src.join("build"))
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("-- FOUND "))
            .unwrap_or_else(|| panic!("no FOUND line in:\n{text}"));
        Ok(line.to_string())
    } else {
        Err(text)
    }
}

#[test]
fn cmake_version_file_accepts_exactly_the_compatible_requests() {
    if !have("cmake") {
        println!("skipped: cmake is not installed (apt-get install cmake)");
        return;
    }
    let prefix = scratch("cmake-version").join("usr");
    install(&prefix, None);
    let v = env!("CARGO_PKG_VERSION");
    let (major, minor, patch) = {
        let p: Vec<u32> = v.split('.').map(|x| x.parse().unwrap()).collect();
        (p[0], p[1], p[2])
    };
    let found = format!("{v} ABI {}", abi());
    // Semver: same major; while the major is 0, the same minor; never newer than installed.
    let accepted = [
        String::new(),
        format!("{major}.{minor}"),
        v.to_string(),
        format!("{v} EXACT"),
        format!("{major}.{minor}...{}.{}", major, minor + 1),
    ];
    let refused = [
        format!("{major}.{}", minor + 1),
        format!("{major}.{minor}.{}", patch + 1),
        format!("{}.0", major + 1),
        if major == 0 && minor > 0 {
            format!("0.{}", minor - 1)
        } else {
            format!("{}.0", major + 2)
        },
    ];
    for r in &accepted {
        assert_eq!(
            cmake_find(&prefix, r).as_deref(),
            Ok(found.as_str()),
            "find_package(kvshare {r}) must accept {v}"
        );
    }
    for r in &refused {
        assert!(
            cmake_find(&prefix, r).is_err(),
            "find_package(kvshare {r}) must refuse {v}"
        );
    }
}

#[test]
fn mindie_adapter_cmake_finds_installed_kvshare() {
    if !have("cmake") {
        println!("skipped: cmake is not installed (apt-get install cmake)");
        return;
    }
    let prefix = scratch("mindie").join("usr");
    install(&prefix, None);
    let build = scratch("mindie-build");
    let configure = run(
        Command::new("cmake")
            .arg("-S")
            .arg(root().join("integration/mindie"))
            .arg("-B")
            .arg(&build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
            .arg("-DBUILD_TESTING=OFF"),
        "cmake configure (MindIE adapter, installed kvshare)",
    );
    assert!(
        configure.contains(&format!(
            "kvshare {} (ABI {}) from {}",
            env!("CARGO_PKG_VERSION"),
            abi(),
            prefix.join("lib").display()
        )),
        "{configure}"
    );
    run(
        Command::new("cmake").arg("--build").arg(&build).args([
            "--target",
            "kvshare_mindie_adapter",
            "-j2",
        ]),
        "cmake build (MindIE adapter)",
    );
    let needed = dynamic(&build.join("libkvshare_mindie_adapter.so"), "NEEDED");
    assert!(
        needed.contains(&format!("libkvshare.so.{}", abi())),
        "{needed:?}"
    );
}

/// Whether `python3 -m venv` works here; `Err` says why not.
fn venv_available() -> Result<(), String> {
    let dir = scratch("venv-probe");
    match Command::new("python3")
        .args(["-m", "venv"])
        .arg(dir.join("v"))
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "python3 -m venv fails (apt-get install python3-venv): {}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!("python3 is not installed: {e}")),
    }
}

/// pip builds a local directory in place (setuptools' `build/` inside it): two builds of one
/// package at once collide ("File exists"), so the tests that run pip take turns.
fn pip_turn() -> std::sync::MutexGuard<'static, ()> {
    static PIP: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PIP.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A command with no kvshare override in its environment, cargo's homes kept.
fn python_cmd(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("KVSHARE_LIB")
        .env_remove("KVSHARE_HEADER")
        .env_remove("PYTHONPATH");
    keep_toolchain_homes(&mut cmd);
    cmd
}

/// `python -m kvshare` passed and found its library and header inside `site`.
fn check_smoke_output(out: &str, site_hint: &str) {
    let title = format!("kvshare {} (ABI {})", env!("CARGO_PKG_VERSION"), abi());
    assert!(
        out.lines().any(|l| l == title),
        "no line {title:?} in:\n{out}"
    );
    for file in ["kvshare/libkvshare.so", "kvshare/kvshare.h"] {
        assert!(
            out.lines()
                .any(|l| l.contains(site_hint) && l.trim_end().ends_with(file)),
            "the installed package must use its bundled {file}:\n{out}"
        );
    }
    assert!(out.contains("8 tokens found cached: ok"), "{out}");
}

#[test]
fn readme_python_block_installs_both_packages_from_the_checkout() {
    if let Err(why) = venv_available() {
        println!("skipped: {why}");
        return;
    }
    let _turn = pip_turn();
    let home = scratch("readme-python");
    let block = readme_block("python");
    let mut cmd = python_cmd(Path::new("bash"));
    cmd.args(["-euo", "pipefail", "-c"])
        .arg(&block)
        .current_dir(root())
        .env("HOME", &home);
    let out = run(&mut cmd, &format!("README block `python`:\n{block}"));
    print!("{out}");
    check_smoke_output(&out, &home.join(".venvs/kvshare").display().to_string());
}

#[test]
fn pip_wheels_install_into_a_fresh_venv_and_work_without_environment() {
    if let Err(why) = venv_available() {
        println!("skipped: {why}");
        return;
    }
    let _turn = pip_turn();
    let dir = scratch("wheel");
    let (build_venv, fresh, dist) = (dir.join("build-venv"), dir.join("fresh"), dir.join("dist"));
    for v in [&build_venv, &fresh] {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(v),
            "python3 -m venv",
        );
    }
    run(
        python_cmd(&build_venv.join("bin/pip"))
            .args(["wheel", "-q", "--no-deps", "-w"])
            .arg(&dist)
            .arg(root().join("integration/python"))
            .arg(root().join("integration/vllm_ascend"))
            .current_dir(&dir),
        "pip wheel",
    );
    let wheels: Vec<PathBuf> = std::fs::read_dir(&dist)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let v = env!("CARGO_PKG_VERSION");
    let find = |prefix: &str| {
        wheels
            .iter()
            .find(|w| w.file_name().unwrap().to_string_lossy().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix}* wheel in {wheels:?}"))
            .clone()
    };
    let binding = find(&format!("kvshare-{v}-py3-none-linux_"));
    let plugin = find(&format!("kvshare_vllm-{v}-cp3"));
    // The binding's wheel carries the library and the header; the plugin's its extension.
    let list = |wheel: &Path| {
        run(
            Command::new("python3")
                .args(["-m", "zipfile", "-l"])
                .arg(wheel),
            "python3 -m zipfile -l",
        )
    };
    let names = list(&binding);
    for f in ["kvshare/libkvshare.so ", "kvshare/kvshare.h "] {
        assert!(
            names.contains(f),
            "{} lacks {f}:\n{names}",
            binding.display()
        );
    }
    let names = list(&plugin);
    assert!(
        names.contains("kvshare_vllm/_fast.cpython-"),
        "{} lacks the compiled _fast:\n{names}",
        plugin.display()
    );
    run(
        python_cmd(&fresh.join("bin/pip"))
            .args(["install", "-q"])
            .arg(&binding)
            .arg(&plugin)
            .current_dir(&dir),
        "pip install (the wheels)",
    );
    let out = run(
        python_cmd(&fresh.join("bin/python"))
            .args(["-m", "kvshare"])
            .current_dir(&dir),
        "python -m kvshare",
    );
    print!("{out}");
    check_smoke_output(&out, &fresh.display().to_string());
    check_plugin_install(&fresh, &dir);
    check_stripped(&binding, &dir.join("unpacked"));
}

/// The plugin installed in `venv` (which has no vLLM): its compiled modules and no C sources,
/// both packages at this version, and importing it says which vLLM it needs.
fn check_plugin_install(venv: &Path, cwd: &Path) {
    let v = env!("CARGO_PKG_VERSION");
    let out = run(
        python_cmd(&venv.join("bin/python"))
            .args([
                "-c",
                "import importlib.metadata as m; \
                 print(m.version('kvshare'), m.version('kvshare-vllm')); \
                 print(*sorted(str(f) for f in m.files('kvshare-vllm')))",
            ])
            .current_dir(cwd),
        "importlib.metadata (kvshare-vllm)",
    );
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(format!("{v} {v}").as_str()), "{out}");
    let files = lines.next().unwrap_or_default();
    for native in [
        "kvshare_vllm/_fast.cpython-",
        "kvshare_vllm/_fast_groups.cpython-",
    ] {
        assert!(files.contains(native), "{native} not installed: {files}");
    }
    assert!(files.contains("kvshare_vllm/_build_info.py"), "{files}");
    assert!(
        !files
            .split(' ')
            .any(|f| f.ends_with(".c") || f.ends_with(".h")),
        "the plugin installs its C sources: {files}"
    );
    // No vLLM here: each way in names the supported version instead of a bare
    // ModuleNotFoundError.
    for code in [
        "import kvshare_vllm.manager",
        "from kvshare_vllm.plugin import register; register()",
    ] {
        let out = python_cmd(&venv.join("bin/python"))
            .args(["-c", code])
            .env("KVSHARE_VLLM", "1")
            .current_dir(cwd)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{code}: {out:?}");
        assert!(
            err.contains("UnsupportedVllmError")
                && err.contains("supports vLLM 0.23.0")
                && err.contains("has no vLLM"),
            "{code}: {err}"
        );
        assert!(!err.contains("ModuleNotFoundError"), "{code}: {err}");
    }
}

/// The binding's wheel carries its library without debug info.
fn check_stripped(wheel: &Path, scratch_dir: &Path) {
    run(
        Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(wheel)
            .arg(scratch_dir),
        "python3 -m zipfile -e",
    );
    let sections = run(
        Command::new("readelf")
            .args(["-S", "-W"])
            .arg(scratch_dir.join("kvshare/libkvshare.so"))
            .env("LC_ALL", "C"),
        "readelf -S",
    );
    assert!(
        !sections.contains(".debug_"),
        "{}: kvshare/libkvshare.so keeps debug info",
        wheel.display()
    );
}

/// `scripts/build-wheels`: the release files an index accepts. The binding's wheel is tagged
/// manylinux_2_17 (glibc 2.17 and newer; auditwheel has checked every binary's symbol
/// versions), small (its library stripped), described (license, summary, description); the
/// plugin's wheel is manylinux too and holds no C sources; both install into a fresh venv from
/// the files alone, and the binding works there. The binding's sdist builds its own wheel with
/// cargo, from the Rust sources it carries.
#[test]
fn release_wheels_are_manylinux_small_described_and_the_sdist_builds() {
    if let Err(why) = venv_available() {
        println!("skipped: {why}");
        return;
    }
    let _turn = pip_turn();
    let dir = scratch("release");
    let dist = dir.join("dist");
    let mut cmd = python_cmd(&root().join("scripts/build-wheels"));
    cmd.arg("--out").arg(&dist);
    let said = run(&mut cmd, "scripts/build-wheels");
    print!("{said}");
    let v = env!("CARGO_PKG_VERSION");
    let arch = std::env::consts::ARCH;
    let files: Vec<PathBuf> = std::fs::read_dir(&dist)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let find = |name: &str| {
        files
            .iter()
            .find(|f| f.file_name().unwrap().to_string_lossy().starts_with(name))
            .unwrap_or_else(|| panic!("no {name}* in {files:?}"))
            .clone()
    };
    let manylinux = format!("manylinux2014_{arch}.manylinux_2_17_{arch}.whl");
    let binding = find(&format!("kvshare-{v}-py3-none-{manylinux}"));
    let plugin = find(&format!("kvshare_vllm-{v}-cp3"));
    assert!(
        plugin.to_string_lossy().ends_with(&manylinux),
        "{}",
        plugin.display()
    );
    let sdist = find(&format!("kvshare-{v}.tar.gz"));
    find(&format!("kvshare_vllm-{v}.tar.gz"));
    let size = std::fs::metadata(&binding).unwrap().len();
    assert!(
        size < 3 << 20,
        "{}: {size} bytes (the stripped library is about 2.5 MB, 1.1 MB compressed)",
        binding.display()
    );
    check_stripped(&binding, &dir.join("unpacked"));
    for (wheel, summary) in [
        (&binding, "Summary: Python binding of libkvshare"),
        (&plugin, "Summary: vLLM / vLLM-Ascend plugin"),
    ] {
        let name = wheel.file_name().unwrap().to_string_lossy();
        let dist_info = format!("{}-{v}.dist-info", name.split('-').next().unwrap());
        let metadata = run(
            Command::new("python3")
                .args([
                    "-c",
                    "import sys, zipfile; \
                     print(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]).decode())",
                ])
                .arg(wheel)
                .arg(format!("{dist_info}/METADATA")),
            "the wheel's METADATA",
        );
        for field in [
            format!("Version: {v}\n"),
            "License-Expression: Apache-2.0\n".into(),
            "License-File: LICENSE\n".into(),
            "Description-Content-Type: text/markdown\n".into(),
            summary.to_string(),
        ] {
            assert!(
                metadata.contains(&field),
                "{name}: no {field:?} in\n{metadata}"
            );
        }
        if wheel == &plugin {
            let (major, minor, patch) = {
                let p: Vec<&str> = v.split('.').collect();
                (p[0], p[1], p[2])
            };
            let series = if major == "0" {
                format!("kvshare~={major}.{minor}.{patch}")
            } else {
                format!("kvshare~={major}.{minor}")
            };
            assert!(
                metadata.contains(&format!("Requires-Dist: {series}\n")),
                "{metadata}"
            );
        }
    }
    let fresh = dir.join("fresh");
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&fresh),
        "python3 -m venv",
    );
    run(
        python_cmd(&fresh.join("bin/pip"))
            .args(["install", "-q"])
            .arg(&binding)
            .arg(&plugin)
            .current_dir(&dir),
        "pip install (the release wheels)",
    );
    let out = run(
        python_cmd(&fresh.join("bin/python"))
            .args(["-m", "kvshare"])
            .current_dir(&dir),
        "python -m kvshare",
    );
    check_smoke_output(&out, &fresh.display().to_string());
    check_plugin_install(&fresh, &dir);

    // The sdist alone: pip builds the binding's wheel from it with cargo. Unpacked in one fixed
    // folder, so cargo's target folder there is reused from one run to the next.
    let unpack = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sdist-build");
    let _ = std::fs::remove_dir_all(unpack.join(format!("kvshare-{v}")));
    std::fs::create_dir_all(&unpack).unwrap();
    run(
        Command::new("tar")
            .arg("xzf")
            .arg(&sdist)
            .arg("-C")
            .arg(&unpack),
        "tar xzf (the sdist)",
    );
    run(
        python_cmd(&fresh.join("bin/pip"))
            .args(["wheel", "-q", "--no-deps", "-w"])
            .arg(dir.join("from-sdist"))
            .arg(unpack.join(format!("kvshare-{v}")))
            .env("CARGO_TARGET_DIR", unpack.join("target"))
            .current_dir(&dir),
        "pip wheel (the binding's sdist)",
    );
    let built: Vec<PathBuf> = std::fs::read_dir(dir.join("from-sdist"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        built.len() == 1
            && built[0]
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("kvshare-{v}-py3-none-linux_")),
        "{built:?}"
    );
    check_stripped(&built[0], &dir.join("unpacked-sdist-wheel"));
}
