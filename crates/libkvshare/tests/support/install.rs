//! What the install tests share: the repository, scratch folders, commands run with their
//! output, the README's marked blocks, the installed library's ELF facts.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The test file that runs README block `name` (its marker names it).
fn marker_file(name: &str) -> &'static str {
    match name {
        "python" => "tests/install_python.rs",
        _ => "tests/install.rs",
    }
}

pub fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A fresh directory under cargo's per-test scratch space.
pub fn scratch(name: &str) -> PathBuf {
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
pub fn keep_toolchain_homes(cmd: &mut Command) -> &mut Command {
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
pub fn run(cmd: &mut Command, what: &str) -> String {
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
pub fn readme_block(name: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let marker = format!("<!-- {}: {name} -->", marker_file(name));
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

/// Runs a README block with bash (`-euo pipefail`) from the repository root, `HOME` = `home`,
/// in a user's environment: without `PKG_CONFIG_PATH`, and without the `LD_LIBRARY_PATH` cargo
/// gives test processes (it names `target/debug`, whose `libkvshare.so` would shadow the installed
/// one for the programs the block builds).
pub fn run_readme_block(name: &str, home: &Path) -> String {
    let block = readme_block(name);
    let mut cmd = Command::new("bash");
    cmd.arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(&block)
        .current_dir(root())
        .env("HOME", home)
        .env_remove("PKG_CONFIG_PATH")
        .env_remove("LD_LIBRARY_PATH");
    keep_toolchain_homes(&mut cmd);
    let out = run(&mut cmd, &format!("README block `{name}`:\n{block}"));
    print!("{out}");
    out
}

pub fn install(prefix: &Path, destdir: Option<&Path>) {
    let mut cmd = Command::new(root().join("scripts/install-c"));
    cmd.arg("--prefix").arg(prefix);
    if let Some(d) = destdir {
        cmd.env("DESTDIR", d);
    }
    run(&mut cmd, "scripts/install-c");
}

pub fn abi() -> u32 {
    kvshare::version::kvs_abi_version()
}

/// `readelf -d` lines of a kind (`SONAME`, `NEEDED`), the bracketed names.
pub fn dynamic(file: &Path, kind: &str) -> Vec<String> {
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
pub fn build_id(file: &Path) -> String {
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
pub fn check_hello_output(out: &str, runs: usize) {
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
