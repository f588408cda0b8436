//! The C ABI. Glue only: pointer and length checks, the panic boundary, status mapping and
//! handle ownership. All behaviour lives in [`crate::core`] and [`crate::attention`].
//!
//! One file per exported object (`cache.rs` ↔ `kvs_cache_*`, …) plus shared helpers.
#![deny(missing_docs)]
#![allow(non_camel_case_types)]

pub mod attn;
pub(crate) mod handle;
pub(crate) mod panic;
pub(crate) mod slice;
pub mod status;
pub mod types;
pub mod version;
