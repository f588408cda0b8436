//! Soak: random programs of the C-ABI campaign's operation language (`fuzz/src/harness.rs`, the
//! same harness the coverage-guided fuzzer runs), each operation checked against the
//! independent model and `kvs_cache_check`.
//!
//! `KVS_SOAK_OPS` sets the number of operations (default 100,000, what CI runs);
//! `KVS_SOAK_SEED` the seed. The documented long run (docs/testing.md, "Fuzzing and soak"):
//! `KVS_SOAK_OPS=10000000 cargo test --release --test soak -- --nocapture`.

// The harness's `unsafe` blocks call the C ABI with the buffers it owns, sized as each call
// documents (the fuzz crate, outside this workspace, holds it to its own lints).
#[path = "../../../fuzz/src/harness.rs"]
#[allow(dead_code, clippy::undocumented_unsafe_blocks)]
mod harness;

use std::time::Instant;

/// xorshift64*: the bytes the programs are decoded from.
fn fill(state: &mut u64, buf: &mut [u8]) {
    for chunk in buf.chunks_mut(8) {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let v = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

#[test]
fn soak() {
    let target: u64 = std::env::var("KVS_SOAK_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let seed: u64 = std::env::var("KVS_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_cafe);
    let mut state = seed | 1;
    let mut buf = vec![0u8; 16 << 10];
    let (mut ops, mut programs) = (0u64, 0u64);
    let t = Instant::now();
    while ops < target {
        fill(&mut state, &mut buf);
        // Programs of 200 to 2,000 operations: long enough to fill the cache and evict.
        let len = 200 + (state % 1800) as usize;
        let done = harness::run(&buf, len) as u64;
        ops += done;
        programs += 1;
        assert!(done > 0, "program {programs} ran nothing");
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "soak: {ops} operations in {programs} programs, {secs:.1} s, {:.0} ops/s, seed {seed:#x}",
        ops as f64 / secs
    );
}

/// Every committed corpus input (fuzz/corpus/abi: seeds and what AFL++ kept) replays cleanly:
/// crashes the fuzzer finds are copied there once fixed.
#[test]
fn corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/abi");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("fuzz/corpus/abi") {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        harness::run(&data, 4096);
        n += 1;
    }
    assert!(n >= 10, "only {n} corpus inputs in {}", dir.display());
}
