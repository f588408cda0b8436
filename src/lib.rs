//! kvshare: a paged, prefix-sharing KV-cache manager for LLM serving engines.
//!
//! The crate has three layers (see `README.md` and `../shared/design/ARCHITECTURE.md`):
//!
//! * [`core`]: safe Rust, no raw pointers: configuration, page pools with refcounts and O(1)
//!   free/LRU lists, the exact prefix index, sequences (block tables, copy-on-write, swap), stats
//!   and the invariant checker. [`core::Cache`] is the thread-safe object every adapter uses.
//! * [`attention`]: paged attention, KV write and page copy behind one backend trait (CPU today).
//! * [`ffi`]: the C ABI (`include/kvshare.h`): null/length checks, the panic boundary, status
//!   mapping and handle ownership, and nothing else.
//! * [`replay`]: the engine of `kvshare-replay` (trace replay, built-in workloads, reports).

pub mod attention;
pub mod core;
pub mod ffi;
pub mod replay;
