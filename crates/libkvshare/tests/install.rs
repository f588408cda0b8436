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
//! * the MindIE adapter's CMake finds the installed kvshare with `find_package`.
//!
//! The Python packages are `tests/install_python.rs`'s.
//!
//! The install uses the release build in cargo's target folder (about 2 minutes on a 2-core
//! machine the first time, then seconds). Parts that need `pkg-config` or `cmake` are skipped,
//! with the reason printed, when the tool is not installed (`.ci/run` installs both).

#[path = "support/install.rs"]
mod install_support;

use install_support::*;
use std::path::Path;
use std::process::Command;

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
