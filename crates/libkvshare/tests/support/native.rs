//! The native side of the tests: where this run's `libkvshare.so` is, how programs find it at
//! run time, and which compilers build them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// This crate's folder (`crates/libkvshare`: `tests/c`, `tests/cxx`, `cbindgen.toml`).
pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding the `libkvshare.so` cargo built for this run.
///
/// Cargo builds the library's `cdylib` crate type before integration tests, into
/// `target/<profile>/deps/`, the directory of this test executable (`cargo build` also copies it
/// one level up, to `target/<profile>/`, but `cargo test` alone does not, and that copy may be
/// stale). So look next to the executable first, then one level up; never fall back silently.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let deps = exe.parent().expect("test executable has a directory");
        let mut tried = Vec::new();
        for dir in [deps, deps.parent().unwrap_or(deps)] {
            let so = dir.join("libkvshare.so");
            if so.is_file() {
                return dir.to_path_buf();
            }
            tried.push(so.display().to_string());
        }
        panic!(
            "libkvshare.so not found (looked for {}). The tests need the cdylib that cargo \
             builds for integration tests; check that Cargo.toml keeps crate-type \"cdylib\".",
            tried.join(" and ")
        )
    })
}

/// The path of this run's `libkvshare.so` (in [`lib_dir`]).
pub fn libkvshare() -> PathBuf {
    lib_dir().join("libkvshare.so")
}

/// `LD_LIBRARY_PATH` for running programs against this run's library.
///
/// Cargo puts `target/<profile>` on `LD_LIBRARY_PATH` for tests, and `LD_LIBRARY_PATH` beats a
/// program's RUNPATH: a stale uplifted copy of the library there would be loaded instead of the
/// one built for this run. So the run's own directory goes first.
pub fn loader_path() -> String {
    let dir = lib_dir().display().to_string();
    match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{dir}:{old}"),
        _ => dir,
    }
}

/// The C compiler: `$CC`, else `cc`.
pub fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// The C++ compiler: `$CXX`, else `c++`.
pub fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// Warnings every C test program is built with (plus `-std=c11`).
pub const C_WARNINGS: &[&str] = &["-Wall", "-Wextra", "-Wpedantic", "-Werror"];
