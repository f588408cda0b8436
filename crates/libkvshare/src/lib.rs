//! The C ABI. Glue only: pointer and length checks, the panic boundary, status mapping and
//! handle ownership. All behaviour lives in [`kvshare_core`] and [`kvshare_attention`].
//!
//! One file per exported object (`cache.rs` ↔ `kvs_cache_*`, …) plus shared helpers.
//!
//! The `attention` feature (default; every shipped build has it) holds the exports over
//! [`kvshare_attention`]: `attn.rs`, `attn_args.rs`, `backend.rs` and `huge_pages.rs`. Without
//! it the crate is the cache exports alone, which is how the fuzz target (`fuzz/`) builds it.
//!
//! # Safety contract of every export
//! Pointer arguments are either NULL (refused with `KVS_STATUS_NULL_ARGUMENT` unless documented
//! as optional) or valid for the length given beside them, for the duration of the call; handles
//! come from their `*_new` function and are not yet freed. Each function's own doc states what it
//! reads and writes. This is the shared `# Safety` section of all `unsafe extern "C"` functions.
//!
//! One convention: every export that takes a pointer is `pub unsafe extern "C" fn` under this
//! contract (only pointer-free ones, e.g. `kvs_config_default`, `kvs_kv_layout_dense`,
//! `kvs_version`, are safe `extern "C" fn`). Inside, the unsafe helpers of `slice.rs` and
//! `handle.rs` refuse NULL and misalignment, and this contract covers the rest; where a length
//! comes from validated shapes rather than from the caller (`attn.rs`: the tensors' element
//! counts), or a pointer is read outside those helpers, a `SAFETY:` note says why it is sound.
#![deny(missing_docs)]
// Clippy's pedantic group is kept clean here; two of its lints do not fit glue code:
// product and layout names in docs (MindIE, LoRA, `BnNBsD`) are prose, and backticks would
// show in the generated header; shape letters (`h`, `d`, `n`) follow the attention docs.
#![warn(clippy::pedantic)]
#![allow(clippy::doc_markdown, clippy::many_single_char_names)]
// The exports share one `# Safety` section, the "Safety contract of every export" above (cbindgen
// copies docs into the header, where one contract reads better than a copy on every export).
#![allow(clippy::missing_safety_doc)]
#![allow(non_camel_case_types)]

#[cfg(feature = "attention")]
pub mod attn;
#[cfg(feature = "attention")]
pub mod attn_args;
#[cfg(feature = "attention")]
pub mod backend;
pub mod cache;
pub mod enums;
pub mod error;
pub mod events;
pub mod groups;
pub(crate) mod handle;
#[cfg(feature = "attention")]
pub mod huge_pages;
pub mod pages;
pub(crate) mod panic;
pub mod pool;
pub mod prefix;
pub mod seq;
pub(crate) mod slice;
pub mod status;
pub mod types;
pub mod version;
