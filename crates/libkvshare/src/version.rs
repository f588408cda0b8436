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
pub const KVS_ABI_VERSION: u32 = 3;

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
