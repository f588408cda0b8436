//! KV-cache groups: a cache whose sequences hold one block table per group, for hybrid models
//! (sliding-window layers next to full-attention layers, chunked local attention).
//!
//! * [`spec`]: what a group is (kind, window, page bytes) and the cache's geometry.
//! * [`hybrid`]: the [`Hybrid`] cache: pools shared by groups of equal page bytes, one prefix
//!   index per group, and the sequence operations (begin, release of out-of-window pages,
//!   append, free).
//! * `hit.rs`: the longest hit across groups (vLLM's `HybridKVCacheCoordinator` fixed point).
//! * `tables.rs`: per-group block tables, slot mappings and stats.
//! * `state.rs`: the rules of state groups (Mamba / linear attention) per vLLM cache mode.
//! * `check.rs`: the invariant checker.
//!
//! A cache of one full-attention group is the existing [`super::Cache`]: that path is not
//! routed through here, so its behaviour is unchanged.

mod check;
mod hit;
pub mod hybrid;
pub mod spec;
mod state;
mod tables;

pub use hybrid::{GroupCounters, GroupEvent, Hybrid, HybridBegin, NULL_PAGE};
pub use spec::{GroupKind, GroupSpec, HybridConfig, StateMode, MAX_GROUPS};
pub use tables::GroupStats;
