//! Test support shared by the integration tests: one definition of each helper that the
//! harnesses used to copy between them. Each test file says `mod support;` and uses the parts it
//! needs (unused parts are fine: every test file is its own crate).
//!
//! - [`native`]: finding this run's `libkvshare.so` (one rule), the loader path that puts it
//!   first, the C/C++ compilers and the warning flags. Replaced three library-finding rules
//!   (`c_harness.rs`, `ascend_c.rs`, `mindie.rs`, plus a fourth inline in `ascend.rs`) and four
//!   copies of the loader-path prepend and the compiler helpers.
//! - [`attention`]: the deterministic RNG, typed host buffers, a CPU backend, the attention case
//!   builder and the f64 reference. Replaced the case builders of `attention.rs` and `ascend.rs`
//!   (formerly `tests/attention_common`).
//! - [`cann_emu`]: the emulated CANN runtime built from `tests/cann_emu` (formerly
//!   `tests/ascend_common`).
#![allow(dead_code)]

pub mod attention;
pub mod cann_emu;
pub mod native;
