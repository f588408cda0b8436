//! Runs `tests/c/ascend_*.c` against the `libkvshare.so` built for this run and the emulated
//! CANN runtime (built here), with `KVS_ASCEND_EMU_DIR` pointing at the emulator: the C
//! harness of `tests/c_harness.rs` runs the same programs without it, where they skip (there is
//! no CANN to load on these machines and that harness does not build the emulator).
//!
//! The header comes from cbindgen (the pinned dev-dependency) into `CARGO_TARGET_TMPDIR`, so
//! this test does not depend on the committed `include/kvshare.h` being regenerated yet.
//! Compiled with the harness's flags: `-std=c11 -Wall -Wextra -Wpedantic -Werror`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::native::{cc, crate_dir, lib_dir, loader_path, C_WARNINGS};

fn header_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ascend_c_include");
    std::fs::create_dir_all(&dir).unwrap();
    let config =
        cbindgen::Config::from_file(crate_dir().join("cbindgen.toml")).expect("cbindgen.toml");
    cbindgen::Builder::new()
        .with_crate(crate_dir())
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write_to_file(dir.join("kvshare.h"));
    dir
}

fn programs() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(crate_dir().join("tests/c"))
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            (n.starts_with("ascend_") && n.ends_with(".c")).then(|| n[..n.len() - 2].to_string())
        })
        .collect();
    v.sort();
    v
}

fn run(exe: &Path, emu: Option<&Path>) -> (bool, String) {
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", loader_path());
    match emu {
        Some(d) => cmd.env("KVS_ASCEND_EMU_DIR", d),
        None => cmd.env_remove("KVS_ASCEND_EMU_DIR"),
    };
    cmd.env_remove("KVS_ASCEND_LIB_DIR");
    let o = cmd.output().expect("run the program");
    (
        o.status.success(),
        format!(
            "--- stdout ---\n{}--- stderr ---\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn ascend_c_programs() {
    let progs = programs();
    assert!(!progs.is_empty(), "no tests/c/ascend_*.c");
    let emu = support::cann_emu::build(support::cann_emu::Variant::Full);
    let inc = header_dir();
    let lib = lib_dir();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ascend_c_bin");
    std::fs::create_dir_all(&out).unwrap();
    for name in progs {
        let exe = out.join(&name);
        let o = Command::new(cc())
            .arg("-std=c11")
            .args(C_WARNINGS)
            .args(["-g", "-O1"])
            .arg("-I")
            .arg(&inc)
            .arg(crate_dir().join("tests/c").join(format!("{name}.c")))
            .arg("-o")
            .arg(&exe)
            .arg(format!("-L{}", lib.display()))
            .arg("-lkvshare")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .args(["-lpthread", "-lm"])
            .output()
            .expect("run the C compiler");
        assert!(
            o.status.success(),
            "compiling {name}.c failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let (ok, text) = run(&exe, Some(&emu));
        assert!(ok, "{name} failed against the emulator:\n{text}");
        eprintln!("{name}:\n{text}");
        // Without the emulator (as under tests/c_harness.rs) it skips cleanly.
        let (ok, text) = run(&exe, None);
        assert!(
            ok && text.contains("skipped"),
            "{name} without KVS_ASCEND_EMU_DIR:\n{text}"
        );
    }
}
