//! The kvshare cache manager: paged KV pages with refcounts, an exact prefix index, sequences
//! with one block table per KV-cache group, copy-on-write, a host tier, pins, priorities and
//! events. Safe Rust, no raw pointers, no `extern`.
//!
//! [`Cache`] is the thread-safe entry point; [`State`] holds everything behind its lock. One
//! manager serves every model: a plain model is one full-attention group, a hybrid model
//! (sliding window, chunked local attention, Mamba / linear-attention state) several groups,
//! each with its kind's rules (`rules.rs`) behind one trait. The files split by concept:
//!
//! * [`config`]: geometry, options and the groups, with their validation;
//! * `rules.rs`: what each attention kind needs (hits, skipped tokens, table growth);
//! * [`pool`]: one tier's pages (with the intrusive lists of [`list`]); [`evict`]: which cached
//!   page an allocation evicts (retention priorities, leaves first, the eviction policies);
//!   [`prefix`]: the index;
//! * `state.rs`: the state and the helpers every operation shares (taking and releasing pages,
//!   demotion, index updates, queues, stats);
//! * `hit.rs`: prefix hits across tiers and groups; `begin.rs`: begins; `sequences.rs`: fork,
//!   free, release; `append.rs`: appends with copy-on-write; `swap.rs`: swaps between tiers;
//!   [`pages`]: the page API, pins, prefetch; `batch.rs`: block tables and slot mappings;
//!   `check.rs`: the invariant checker;
//! * [`pooltier`]: the pool tier, a store shared by engines behind device and host (what to
//!   look up, load and store; the engine side moves the bytes);
//! * [`copies`], [`events`], [`stats`]: what the cache reports.
#![forbid(unsafe_code)]

pub mod alloc;
mod append;
mod batch;
mod begin;
pub mod cache;
mod check;
pub mod config;
pub mod copies;
pub mod error;
pub mod events;
pub mod evict;
pub mod hashing;
mod hit;
pub mod list;
pub mod pages;
pub mod pool;
pub mod pooltier;
pub mod prefix;
mod rules;
pub mod seq;
mod sequences;
pub mod state;
pub mod stats;
mod swap;
pub mod tier;

pub use cache::Cache;
pub use config::{
    Config, DType, GroupKind, GroupSpec, StateMode, WindowRetention, MAX_GROUPS,
    MAX_RETENTION_BOUNDARIES, MAX_SEGMENT_PAGES,
};
pub use copies::{CopyKind, PageCopy};
pub use error::{Error, Result};
pub use events::{Event, EventKind};
pub use evict::EvictionPolicy;
pub use pages::Match;
pub use pool::PageState;
pub use pooltier::{
    PoolAnswer, PoolConfig, PoolKey, PoolLookup, PoolOp, PoolStats, PoolWork, Ranks, StorePolicy,
};
pub use prefix::{ExtraKeys, MmItem};
pub use seq::{AppendNeed, BeginInfo, SeqInfo};
pub use state::{State, NULL_PAGE};
pub use stats::{Counters, GroupCounters, GroupStats, Stats};
pub use tier::Tier;
