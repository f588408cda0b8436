//! Library and ABI versions.

use std::ffi::c_char;

/// ABI version of `include/kvshare.h`. Bumped on any incompatible change to a signature, struct
/// layout or enum value; adapters refuse a library whose `kvs_abi_version()` differs from the
/// `KVS_ABI_VERSION` they were built with.
///
/// 2: the header no longer defines unprefixed macros (`ACL_*`, `ACLNN_*`, `MAX_*`, `PRIORITIES`,
/// ...; now `KVS_NUM_PRIORITIES`, `KVS_MAX_QUEUED_EVENTS`); new statuses
/// `KVS_STATUS_OUT_OF_MEMORY` and `KVS_STATUS_REFCOUNT_OVERFLOW`.
///
/// 3: `kvs_config.match_unit` (hits finer than a page) and `kvs_stats.unit_hits`,
/// `unit_hit_tokens` change both structs' layouts.
///
/// 4: one cache for one or many KV-cache groups: `kvs_config` ends with `vllm_free_order`,
/// `groups` and `num_groups`; a `group` argument on the per-group calls (`kvs_seq_pages`,
/// `kvs_cache_block_tables`, `kvs_cache_slot_mapping`, `kvs_pages_*`, `kvs_page_get_info`,
/// `kvs_prefix_register`, `kvs_prefix_match`, `kvs_cache_available`); `kvs_seq_begin` takes
/// `lookahead_slots`; `kvs_copy.group` and `kvs_event.group`; new `kvs_cache_group_info`,
/// `kvs_cache_group_stats`, `kvs_cache_new_step`, `kvs_seq_release_skipped`,
/// `kvs_seq_state_page`, `kvs_prefix_find`; the `kvs_hybrid_*` object and its types are gone.
pub const KVS_ABI_VERSION: u32 = 4;

/// The library version (`"MAJOR.MINOR.PATCH"`, matching `KVS_VERSION` in the header).
///
/// **Ownership:** static string; do not free. **Thread safety:** safe from any thread.
#[no_mangle]
pub extern "C" fn kvs_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The ABI version the library was built with; compare with `KVS_ABI_VERSION`.
///
/// **Thread safety:** safe from any thread.
#[no_mangle]
pub extern "C" fn kvs_abi_version() -> u32 {
    KVS_ABI_VERSION
}
