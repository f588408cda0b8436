//! The committed `include/kvshare.h` must be exactly what the pinned cbindgen generates from the
//! sources, and its version macros must match `Cargo.toml` and the library.
//!
//! Regenerate with `KVS_BLESS=1 cargo test --test header`.

use std::ffi::CStr;
use std::path::Path;

fn generate() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(root)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).expect("utf-8 header")
}

#[test]
fn header_is_fresh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/kvshare.h");
    let generated = generate();
    if std::env::var_os("KVS_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/kvshare.h is stale: run `KVS_BLESS=1 cargo test --test header` and commit it"
    );
}

#[test]
fn version_macros_match_cargo_and_library() {
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/kvshare.h"))
            .unwrap();
    let v = env!("CARGO_PKG_VERSION");
    let parts: Vec<&str> = v.split('.').collect();
    for (name, want) in [
        ("MAJOR", parts[0]),
        ("MINOR", parts[1]),
        ("PATCH", parts[2]),
    ] {
        assert!(
            header.contains(&format!("#define KVS_VERSION_{name} {want}\n")),
            "KVS_VERSION_{name} != {want}"
        );
    }
    assert!(header.contains(&format!("#define KVS_VERSION \"{v}\"\n")));
    let lib = unsafe { CStr::from_ptr(kvshare::ffi::version::kvs_version()) };
    assert_eq!(lib.to_str().unwrap(), v);
    let abi = kvshare::ffi::version::kvs_abi_version();
    assert!(
        header.contains(&format!("#define KVS_ABI_VERSION {abi}\n")),
        "KVS_ABI_VERSION != {abi}"
    );
}
