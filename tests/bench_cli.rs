//! `kvshare-bench vllm`: runs the vLLM adapter's benchmark script with `$KVS_VLLM_PYTHON`,
//! passing its arguments through and its failure back (the benchmark itself runs in CI's smoke
//! step and `scripts/test-python`'s environment, where vLLM is installed).

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvshare-bench"))
}

#[test]
fn vllm_mode_runs_the_script_with_its_arguments() {
    let dir = std::env::temp_dir().join(format!("kvshare-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("python");
    // A stand-in interpreter: prints what it was given, fails when asked to.
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"ran $*\"\nfor a in \"$@\"; do [ \"$a\" = --fail ] && exit 3; done\nexit 0\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = bench()
        .args(["vllm", "--quick", "--repeats", "2"])
        .env("KVS_VLLM_PYTHON", &fake)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("integration/vllm_ascend/bench/bench_vllm.py --quick --repeats 2"),
        "{said}"
    );

    let out = bench()
        .args(["vllm", "--fail"])
        .env("KVS_VLLM_PYTHON", &fake)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bench_vllm.py failed"));

    let out = bench()
        .args(["vllm"])
        .env("KVS_VLLM_PYTHON", dir.join("missing"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("set KVS_VLLM_PYTHON"));

    // vllm-e2e: the engine script's bench mode, with this build's library and header.
    let out = bench()
        .args(["vllm-e2e", "--quick"])
        .env("KVS_VLLM_PYTHON", &fake)
        .env_remove("KVSHARE_HEADER")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("integration/vllm_ascend/bench/engine_e2e.py bench --quick"),
        "{said}"
    );
    let out = bench()
        .args(["vllm-e2e", "--fail"])
        .env("KVS_VLLM_PYTHON", &fake)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine_e2e.py failed"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_mode_is_an_error() {
    let out = bench().arg("nonsense").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mode"));
}
