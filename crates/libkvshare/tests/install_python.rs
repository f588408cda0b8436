//! The Python packages as a user installs them: the README's one command for the binding and
//! the vLLM plugin from the checkout, and the release wheels (`scripts/build-wheels`) in a fresh
//! virtualenv. Skipped, with the reason printed, where `python3 -m venv` does not work.

#[path = "support/install.rs"]
mod install_support;

use install_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    // A module an earlier build left in each package's build folder (a checkout that built a
    // version which had it): the wheels must not carry it.
    let lib_dirs = run(
        Command::new("python3").args([
            "-c",
            "import sys, sysconfig; print(f'lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}')",
        ]),
        "python3 (the build folder's name)",
    );
    let mut stale = Vec::new();
    for (pkg, module) in [("python", "kvshare"), ("vllm_ascend", "kvshare_vllm")] {
        for lib in ["lib", lib_dirs.trim()] {
            let d = root()
                .join("integration")
                .join(pkg)
                .join("build")
                .join(lib)
                .join(module);
            std::fs::create_dir_all(&d).unwrap();
            let f = d.join("_left_by_an_earlier_build.py");
            std::fs::write(&f, "raise ImportError('left by an earlier build')\n").unwrap();
            stale.push(f);
        }
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
    for f in &stale {
        let _ = std::fs::remove_file(f);
    }
    for w in [&binding, &plugin] {
        let names = list(w);
        assert!(
            !names.contains("_left_by_an_earlier_build"),
            "{} carries a module an earlier build left in build/:\n{names}",
            w.display()
        );
    }
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
    let native = "kvshare_vllm/_fast.cpython-";
    assert!(files.contains(native), "{native} not installed: {files}");
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
    // folder, so cargo's target folder there is reused from one run to the next. What is checked
    // is that the sdist builds and packs a stripped wheel, not its speed: the release profile is
    // unoptimised here (a full optimised build costs minutes on two cores; the wheels above are).
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
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
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
