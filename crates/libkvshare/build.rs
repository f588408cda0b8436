//! * Exposes the committed C header to dependent -sys crates (`DEP_KVSHARE_INCLUDE`).
//! * Gives `libkvshare.so` its SONAME, `libkvshare.so.<KVS_ABI_VERSION>` (read from
//!   `src/version.rs`), on ELF targets, so every build is the library `scripts/install-c`
//!   installs as it is, and a program linked against it needs exactly the ABI it was built for.
//!   A program linked against the build in `target/<profile>` records that SONAME; the link
//!   `target/<profile>/libkvshare.so.<ABI>` -> `libkvshare.so` (and the same in `deps/`), made
//!   here, is what the loader finds there, as in a C library's build tree.
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    println!(
        "cargo:include={}",
        manifest.join("..").join("..").join("include").display()
    );
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/version.rs");

    let elf = matches!(
        std::env::var("CARGO_CFG_TARGET_OS").as_deref(),
        Ok("linux" | "android" | "freebsd" | "netbsd" | "openbsd" | "dragonfly" | "illumos")
    );
    if !elf {
        return;
    }
    let version = std::fs::read_to_string(manifest.join("src/version.rs")).expect("src/version.rs");
    let abi: u32 = version
        .lines()
        .find_map(|l| l.strip_prefix("pub const KVS_ABI_VERSION: u32 = "))
        .and_then(|rest| rest.strip_suffix(';'))
        .and_then(|n| n.parse().ok())
        .expect("src/version.rs defines `pub const KVS_ABI_VERSION: u32 = N;`");
    let soname = format!("libkvshare.so.{abi}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");

    // OUT_DIR is <profile>/build/kvshare-<hash>/out: the library lands in <profile> and in
    // <profile>/deps. A layout that is not this one gets no link (nothing else depends on it).
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let Some(profile) = out.ancestors().nth(3) else {
        return;
    };
    if !profile.join("deps").is_dir()
        || out.parent().and_then(Path::parent) != Some(&profile.join("build"))
    {
        return;
    }
    for dir in [profile.to_path_buf(), profile.join("deps")] {
        link_soname(&dir, &soname);
    }
}

/// `dir/soname` -> `libkvshare.so`, replacing the links of other ABI versions (a program built
/// for one must not find a library of another under its SONAME).
#[cfg(unix)]
fn link_soname(dir: &Path, soname: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = name
            .strip_prefix("libkvshare.so.")
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        if ours
            && name != soname
            && std::fs::read_link(entry.path()).is_ok_and(|t| t == Path::new("libkvshare.so"))
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let link = dir.join(soname);
    if std::fs::read_link(&link).is_ok_and(|t| t == Path::new("libkvshare.so")) {
        return;
    }
    let _ = std::fs::remove_file(&link);
    if let Err(e) = std::os::unix::fs::symlink("libkvshare.so", &link) {
        println!(
            "cargo:warning=cannot link {} -> libkvshare.so: {e}",
            link.display()
        );
    }
}

#[cfg(not(unix))]
fn link_soname(_dir: &Path, _soname: &str) {}
