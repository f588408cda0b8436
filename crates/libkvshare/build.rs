// Exposes the committed C header to dependent -sys crates (`DEP_KVSHARE_INCLUDE`).
fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    println!("cargo:include={}", dir.display());
    println!("cargo:rerun-if-changed=build.rs");
}
