//! The cache manager core: safe Rust, no raw pointers, no `extern`.
//!
//! [`Cache`] is the thread-safe entry point; [`State`] holds everything behind its lock. The
//! files split by concept: [`config`], page [`pool`] (with the intrusive lists of [`list`]),
//! [`prefix`] index, sequences ([`seq`]; swapping between tiers in `seq/swap.rs`, the per-step
//! block-table and slot-mapping builders in `batch.rs`), [`stats`], and the invariant
//! [`check`]er.

pub mod alloc;
mod batch;
pub mod cache;
pub mod check;
pub mod config;
pub mod error;
pub mod events;
pub mod groups;
pub mod hashing;
pub mod list;
pub mod pages;
pub mod pool;
pub mod prefix;
pub mod seq;
pub mod state;
pub mod stats;

pub use cache::Cache;
pub use config::{Config, DType, Tier};
pub use error::{Error, Result};
pub use events::{Event, EventKind};
pub use pool::PageState;
pub use prefix::{ExtraKeys, MmItem};
pub use seq::{AppendNeed, BeginInfo, CopyKind, PageCopy, SeqInfo};
pub use state::{Match, State};
pub use stats::{Counters, Stats};
