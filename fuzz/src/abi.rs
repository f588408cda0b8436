//! AFL++ target: one input is one program of the operation language in `harness.rs` (a cache
//! setup, then operations), run through the C ABI under the model and `kvs_cache_check`. A
//! disagreement panics, which AFL records as a crash. See fuzz/README.md.

mod harness;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        harness::run(data, 4096);
    });
}
