//! Test support shared by this crate's integration tests: one definition of each helper. Each
//! test file says `mod support;` and uses the parts it needs (unused parts are fine: every test
//! file is its own crate).
//!
//! - [`native`]: finding this run's `libkvshare.so` (one rule), the loader path that puts it
//!   first, the C/C++ compilers and the warning flags.
//! - [`attention`]: the deterministic RNG, typed host buffers, a CPU backend, the attention case
//!   builder and the f64 reference.
//! - [`cann_emu`]: the emulated CANN runtime built from `tests/cann_emu`.
#![allow(dead_code)]
// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

pub mod ascend;
pub mod attention;
pub mod cann_emu;
pub mod native;
