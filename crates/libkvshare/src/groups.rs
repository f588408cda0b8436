//! `kvs_group`: the KV-cache groups of a cache (`kvs_config.groups`), how they are read from C,
//! and what the calls about one group write (`kvs_group_info`, `kvs_group_stats`; the calls,
//! `kvs_cache_group_info` and `kvs_cache_group_stats`, are the cache's, in `cache.rs`).
//!
//! A group is a set of layers sharing an attention kind, and so one block table per sequence: a
//! plain model is one full-attention group (the default: `groups` NULL, `num_groups` 0), a
//! hybrid model several (sliding window next to full attention, chunked local attention,
//! Mamba / linear-attention state). Every call taking a `group` argument indexes them in
//! `kvs_config.groups` order.

use super::enums::{kvs_group_kind, kvs_state_mode};
use super::slice::slice;

use crate::error::Error;
use kvshare_core::{Config, GroupKind, GroupSpec};

/// Most groups one cache holds (`kvs_config.num_groups`).
pub const KVS_MAX_GROUPS: usize = 32;
const _: () = assert!(KVS_MAX_GROUPS == kvshare_core::MAX_GROUPS);

/// The null page of every pool when `kvs_config.reserve_null_page` is on: never allocated;
/// device block tables show it at positions a group no longer reads (vLLM's `null_block`).
pub const KVS_NULL_PAGE: u32 = 0;
const _: () = assert!(KVS_NULL_PAGE == kvshare_core::NULL_PAGE);

/// One KV-cache group (an entry of `kvs_config.groups`).
///
/// **Methods:** `kvs_cache_group_info`, `kvs_cache_group_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvs_group {
    /// A `kvs_group_kind` value.
    pub kind: u32,
    /// Sliding window or chunk in tokens (at least 1; a chunk is a multiple of `page_size`); 0
    /// for full attention; for a state group its `kvs_state_mode`.
    pub window: u32,
    /// Bytes of one page of this group (all its layers, K and V); 0 for the bytes the cache's
    /// geometry gives (`2 * num_layers * page_size * num_kv_heads * head_dim * dtype size`).
    /// Groups with equal bytes share one page pool; each distinct value has its own pool of
    /// `num_device_pages` device and `num_host_pages` host pages, and page ids are per pool.
    pub page_bytes: u64,
    /// `KVS_GROUP_*` flags: `KVS_GROUP_EAGLE` or 0. Other bits: `KVS_STATUS_INVALID_CONFIG`
    /// naming `groups.flags`.
    pub flags: u32,
}

/// `kvs_group.flags`: an EAGLE / MTP group (vLLM's `is_eagle_group`, or every group when the
/// engine runs EAGLE with no group marked). The draft model recomputes the last page of a hit
/// for its hidden states, so `kvs_prefix_find`'s hit ends one page earlier, and a sliding
/// window finds its tail one page longer before dropping it (vLLM's `drop_eagle_block`);
/// groups of one kind and page size drop together when any of them is EAGLE's.
/// `kvs_seq_begin` does not drop: cap it at the hit `kvs_prefix_find` found. A pool tier's
/// pages after the hit load as vLLM loads a KV connector's tokens beside EAGLE (no drop).
/// Full-attention and sliding-window groups only, without `match_unit` below `page_size`
/// (`KVS_STATUS_INVALID_CONFIG` otherwise).
pub const KVS_GROUP_EAGLE: u32 = 1;

/// A group as the cache sees it (`kvs_cache_group_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_group_info {
    /// A `kvs_group_kind` value.
    pub kind: u32,
    /// Window or chunk in tokens; 0 for full attention; a state group's `kvs_state_mode`.
    pub window: u32,
    /// Bytes of one page (the geometry's when the config gave 0).
    pub page_bytes: u64,
    /// The group's pool: its page ids index that pool's KV tensors.
    pub pool: u32,
    /// Pools of the cache (one per distinct `page_bytes`).
    pub num_pools: u32,
    /// Groups of the cache (1 for a cache configured without groups).
    pub num_groups: u32,
    /// The group's `KVS_GROUP_*` flags as configured.
    pub flags: u32,
}

/// One group's share of the cache and its pool's totals, one consistent snapshot
/// (`kvs_cache_group_stats`). Cache-wide figures (sequences, hits, events) are in `kvs_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_group_stats {
    /// The group's pool.
    pub pool: u64,
    /// Bytes of one page of the group.
    pub page_bytes: u64,
    /// Device pages of that pool, the null page included.
    pub pool_pages_total: u64,
    /// Unreferenced device pages of the pool, cached ones included (vLLM's
    /// `get_num_free_blocks`).
    pub pool_pages_free: u64,
    /// Referenced device pages of the pool (all its groups).
    pub pool_pages_in_use: u64,
    /// Non-null entries of this group's device block tables over all sequences (a page shared
    /// by k sequences counts k times).
    pub pages_held: u64,
    /// Distinct pages this group's device block tables hold.
    pub pages_distinct: u64,
    /// Entries of this group's device prefix index.
    pub pages_registered: u64,
    /// Entries of this group's host prefix index.
    pub host_pages_registered: u64,
    /// Cumulative: pages registered in this group's device index.
    pub pages_stored: u64,
    /// Cumulative: registered device pages of this group evicted for reuse.
    pub evictions: u64,
    /// Cumulative: pages released because the group no longer reads them
    /// (`kvs_seq_release_skipped`, and an align state group's appends).
    pub pages_released: u64,
}

/// Reads `kvs_config.groups`: at most `KVS_MAX_GROUPS` (checked before the array is read), each
/// kind and window decoded; `InvalidConfig` names the field and the group.
///
/// # Safety
/// When non-NULL, `groups` must point to `num_groups` readable `kvs_group`s.
pub(crate) unsafe fn groups_from_c(
    groups: *const kvs_group,
    num_groups: usize,
) -> Result<Vec<GroupSpec>, Error> {
    if num_groups > KVS_MAX_GROUPS {
        return Err(Error::config(
            "num_groups",
            format!("{num_groups} is more than {KVS_MAX_GROUPS}"),
        ));
    }
    // SAFETY: the caller guarantees `groups` NULL or readable for `num_groups` `kvs_group`s.
    let raw = unsafe { slice(groups, num_groups, "config.groups") }?;
    raw.iter()
        .enumerate()
        .map(|(i, g)| group_from_c(i, g))
        .collect()
}

fn group_from_c(i: usize, g: &kvs_group) -> Result<GroupSpec, Error> {
    let bad_window =
        |reason: String| Error::config("groups.window", format!("group {i}: {reason}"));
    let kind = match kvs_group_kind::try_from(g.kind) {
        Ok(kvs_group_kind::Full) if g.window == 0 => GroupKind::Full,
        Ok(kvs_group_kind::Full) => {
            return Err(bad_window(format!(
                "full attention takes window 0, not {}",
                g.window
            )))
        }
        Ok(kvs_group_kind::SlidingWindow) => GroupKind::SlidingWindow(g.window),
        Ok(kvs_group_kind::ChunkedLocal) => GroupKind::ChunkedLocal(g.window),
        Ok(kvs_group_kind::State) => match kvs_state_mode::try_from(g.window) {
            Ok(m) => GroupKind::State(m.into()),
            Err(e) => return Err(bad_window(e.reason())),
        },
        Err(e) => {
            return Err(Error::config(
                "groups.kind",
                format!("group {i}: {}", e.reason()),
            ))
        }
    };
    if g.flags & !KVS_GROUP_EAGLE != 0 {
        return Err(Error::config(
            "groups.flags",
            format!("group {i}: unknown bits {:#x}", g.flags & !KVS_GROUP_EAGLE),
        ));
    }
    Ok(GroupSpec {
        kind,
        page_bytes: g.page_bytes,
        eagle: g.flags & KVS_GROUP_EAGLE != 0,
    })
}

/// `kvs_group.flags` of a group.
pub(crate) fn flags_of(spec: &GroupSpec) -> u32 {
    if spec.eagle {
        KVS_GROUP_EAGLE
    } else {
        0
    }
}

/// `kvs_group.kind` of a group.
pub(crate) fn kind_of(k: GroupKind) -> kvs_group_kind {
    match k {
        GroupKind::Full => kvs_group_kind::Full,
        GroupKind::SlidingWindow(_) => kvs_group_kind::SlidingWindow,
        GroupKind::ChunkedLocal(_) => kvs_group_kind::ChunkedLocal,
        GroupKind::State(_) => kvs_group_kind::State,
    }
}

/// `kvs_group.window` of a group: the window or chunk, or a state group's `kvs_state_mode`.
pub(crate) fn window_of(k: GroupKind) -> u32 {
    match k {
        GroupKind::State(m) => kvs_state_mode::from(m) as u32,
        _ => k.window(),
    }
}

/// The group spec of `group` (already checked to exist).
pub(crate) fn spec_of(cfg: &Config, group: usize) -> GroupSpec {
    cfg.group_specs()[group]
}

/// A count the core bounds (pools, groups: at most `KVS_MAX_GROUPS`) as a C `uint32_t`.
pub(crate) fn count(n: usize, what: &'static str) -> Result<u32, Error> {
    u32::try_from(n).map_err(|_| Error::arg(what, format!("{n} does not fit uint32_t")))
}
