//! The cache manager core: safe Rust, no raw pointers, no `extern`.

pub mod config;
pub mod error;

pub use config::{Config, DType, Tier};
pub use error::{Error, Result};
