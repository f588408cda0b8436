//! The version policy (CHANGELOG.md, "Versions"): one version, Cargo's `[workspace.package]`
//! version, that every other version derives from, and whose ABI part is the C ABI version.
//!
//! * before 1.0 the minor version is `KVS_ABI_VERSION`, after it the major version: an ABI
//!   break bumps it, so a version requirement (`kvshare~=0.4.0`, `find_package(kvshare 0.4)`)
//!   accepts exactly the builds with the ABI a program was built for;
//! * every crate of the workspace takes the workspace's version, and the workspace's
//!   dependencies on its own crates name it;
//! * both Python packages take it at build time (no version typed in them), and the plugin
//!   requires the binding of its release series; the repository's CMake projects ask for it;
//! * CHANGELOG.md has this version's section naming its ABI version, and the ABI history lists
//!   every ABI version up to this one;
//! * the documentation names the installed library by this ABI's SONAME only.
//!
//! The header's macros and `kvs_version()` are checked in `tests/header.rs`, pkg-config and
//! CMake in `tests/install.rs`, the built wheels' versions there too, and
//! `kvshare_vllm.__version__` in the plugin's `tests/test_startup.py`.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn version() -> (u32, u32, u32) {
    let v = env!("CARGO_PKG_VERSION");
    let core = v.split(['-', '+']).next().unwrap();
    let n: Vec<u32> = core
        .split('.')
        .map(|x| x.parse().unwrap_or_else(|_| panic!("version {v}")))
        .collect();
    assert_eq!(n.len(), 3, "version {v} is not MAJOR.MINOR.PATCH");
    (n[0], n[1], n[2])
}

#[test]
fn the_abi_version_is_the_minor_before_1_0_and_the_major_after() {
    let (major, minor, _) = version();
    let abi = kvshare::version::KVS_ABI_VERSION;
    let (part, value) = if major == 0 {
        ("minor", minor)
    } else {
        ("major", major)
    };
    assert_eq!(
        value,
        abi,
        "version {} has {part} {value}, but KVS_ABI_VERSION is {abi}: before 1.0 the minor \
         version is the C ABI version, after it the major (CHANGELOG.md, \"Versions\")",
        env!("CARGO_PKG_VERSION")
    );
}

/// The members of `[workspace] members` in the root Cargo.toml.
fn members() -> Vec<String> {
    let manifest = read("Cargo.toml");
    let start = manifest.find("members = [").expect("[workspace] members");
    let list = &manifest[start..start + manifest[start..].find(']').unwrap()];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn every_crate_takes_the_workspace_version() {
    let members = members();
    assert!(members.len() >= 5, "{members:?}");
    for m in &members {
        let text = read(&format!("{m}/Cargo.toml"));
        let package = &text[text.find("[package]").expect("[package]")..];
        let package = &package[..package[1..].find("\n[").map_or(package.len(), |i| i + 1)];
        assert!(
            package.contains("\nversion.workspace = true"),
            "{m}/Cargo.toml must take the workspace's version (version.workspace = true)"
        );
        assert!(
            !package.contains("\nversion ="),
            "{m}/Cargo.toml types a version"
        );
        // The oldest Rust that builds it, stated once (cargo refuses an older one by name).
        assert!(
            package.contains("\nrust-version.workspace = true"),
            "{m}/Cargo.toml must take the workspace's rust-version"
        );
    }
    // [workspace.dependencies] entries for the workspace's own crates name its version.
    let manifest = read("Cargo.toml");
    assert!(
        manifest.contains("\nrust-version = \"1."),
        "Cargo.toml's [workspace.package] must state rust-version"
    );
    let deps = &manifest[manifest.find("[workspace.dependencies]").unwrap()..];
    let mut own = 0;
    for line in deps.lines().filter(|l| l.contains("path = ")) {
        own += 1;
        assert!(
            line.contains(&format!("version = \"{}\"", env!("CARGO_PKG_VERSION"))),
            "Cargo.toml: {line}"
        );
    }
    assert!(own >= 3, "{deps}");
}

#[test]
fn python_packages_take_the_version_at_build_time() {
    for dir in ["integration/python", "integration/vllm_ascend"] {
        let pyproject = read(&format!("{dir}/pyproject.toml"));
        let project = &pyproject[pyproject.find("[project]").unwrap()..];
        assert!(
            project.contains("dynamic = [\"version\""),
            "{dir}/pyproject.toml: the version must be dynamic (set from Cargo.toml)"
        );
        assert!(
            !project.lines().any(|l| l.starts_with("version =")),
            "{dir}/pyproject.toml types a version"
        );
        let setup = read(&format!("{dir}/setup.py"));
        assert!(
            setup.contains("package_version(") && setup.contains("version=VERSION"),
            "{dir}/setup.py must take the version from integration/cargo_version.py"
        );
    }
    // No module of either package types a version either (kvshare_vllm.__version__ is written
    // by its build; the binding reports the library's kvs_version()).
    for dir in [
        "integration/python/kvshare",
        "integration/vllm_ascend/kvshare_vllm",
    ] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "py")
                && path.file_name().is_some_and(|n| n != "_build_info.py")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    !text
                        .lines()
                        .any(|l| l.trim_start().starts_with("__version__ =")),
                    "{} types __version__",
                    path.display()
                );
            }
        }
    }
    // The helper both setup.py files use reads the workspace version, and pins the plugin's
    // binding to the release series: the same ABI.
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sys; sys.path.insert(0, 'integration'); import cargo_version as c; \
             v = c.cargo_version(); print(v, c.release_series(v))",
        )
        .current_dir(root())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let (major, minor, patch) = version();
            let series = if major == 0 {
                format!("~={major}.{minor}.{patch}")
            } else {
                format!("~={major}.{minor}")
            };
            assert_eq!(
                String::from_utf8_lossy(&o.stdout).trim(),
                format!("{} {series}", env!("CARGO_PKG_VERSION"))
            );
        }
        Ok(o) => panic!("integration/cargo_version.py: {o:?}"),
        Err(e) => println!("skipped the helper's check: python3 is not installed ({e})"),
    }
}

/// The repository's own CMake projects ask for this release series (`find_package(kvshare X.Y)`
/// refuses an install of another C ABI, so they move with the version).
#[test]
fn cmake_projects_request_this_release_series() {
    let (major, minor, _) = version();
    let want = if major == 0 {
        format!("find_package(kvshare {major}.{minor} ")
    } else {
        format!("find_package(kvshare {major} ")
    };
    for file in [
        "examples/cmake/CMakeLists.txt",
        "integration/mindie/CMakeLists.txt",
    ] {
        let text = read(file);
        let calls: Vec<&str> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("find_package(kvshare "))
            .collect();
        assert!(!calls.is_empty(), "{file}: no find_package(kvshare ...)");
        for call in calls {
            assert!(call.trim_start().starts_with(&want), "{file}: {call}");
        }
    }
}

#[test]
fn changelog_records_this_version_and_every_abi_version() {
    let changelog = read("CHANGELOG.md");
    let v = env!("CARGO_PKG_VERSION");
    let abi = kvshare::version::KVS_ABI_VERSION;
    let heading = format!("\n## {v} ");
    let at = changelog
        .find(&heading)
        .unwrap_or_else(|| panic!("CHANGELOG.md has no section `## {v} ...`"));
    let section = &changelog[at + 1..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |i| i + 1)];
    assert!(
        section.contains(&format!("C ABI {abi}"))
            && section.contains(&format!("libkvshare.so.{abi}")),
        "CHANGELOG.md's {v} section must name C ABI {abi} and libkvshare.so.{abi}"
    );
    for a in 1..=abi {
        assert!(
            changelog.contains(&format!("\n### C ABI {a}")),
            "CHANGELOG.md's ABI history has no `### C ABI {a}`"
        );
    }
}

#[test]
fn the_documentation_names_this_abi_soname() {
    let abi = kvshare::version::KVS_ABI_VERSION;
    let want = format!("libkvshare.so.{abi}");
    // The integrations' pages (vllm.md, mindie.md) are in docs/ with the others.
    let mut docs = vec!["README.md".to_string()];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(format!("docs/{}", p.file_name().unwrap().to_string_lossy()));
        }
    }
    let mut wrong = Vec::new();
    for doc in &docs {
        let text = read(doc);
        for (i, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("libkvshare.so.") {
                let after = &rest[at + "libkvshare.so.".len()..];
                let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
                if !digits.is_empty() && format!("libkvshare.so.{digits}") != want {
                    wrong.push(format!("{doc}:{}: {}", i + 1, line.trim()));
                }
                rest = after;
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the installed library is {want} (KVS_ABI_VERSION {abi}); these lines name another:\n{}",
        wrong.join("\n")
    );
}
