//! `kvs_hybrid_*`: a cache of KV-cache groups (hybrid models: sliding-window layers next to
//! full-attention layers, chunked local attention), and its per-group views.
//!
//! A separate object rather than groups inside `kvs_config`: a groups array in `kvs_config`
//! would change its layout for every caller of the one-group cache, and hybrid sequences take
//! different per-step calls (per-group tables, a release driven by the computed token count).
//! A one-group `kvs_cache` keeps exactly its old code path.

use super::enums::{kvs_event_kind, kvs_group_kind, kvs_state_mode, kvs_status};
use std::mem::offset_of;
use std::sync::{Mutex, MutexGuard};

use super::enums::decode;
use super::events::halves;
use super::handle::{self, Handle};

use super::panic::guard;
use super::slice::{opt_out, slice, slice_mut, try_out, try_ref};

use super::types::{extra_from_c, kvs_extra_keys};
use crate::error::Error;
use kvshare_core::groups::{GroupKind, GroupSpec, Hybrid, HybridConfig, StateMode};

/// Most groups a `kvs_hybrid` holds.
pub const KVS_MAX_GROUPS: usize = 32;
const _: () = assert!(KVS_MAX_GROUPS == kvshare_core::groups::MAX_GROUPS);

/// The null page of every pool of a `kvs_hybrid`: never allocated; block tables show it at
/// positions a group released or skipped (vLLM's `null_block`).
pub const KVS_NULL_PAGE: u32 = 0;
const _: () = assert!(KVS_NULL_PAGE == kvshare_core::groups::NULL_PAGE);

/// One KV-cache group.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvs_group {
    /// A `kvs_group_kind` value.
    pub kind: u32,
    /// Sliding window or chunk in tokens (at least 1; a chunk is a multiple of `page_size`); 0
    /// for full attention; for a state group its `kvs_state_mode`.
    pub window: u32,
    /// Bytes of one page of this group (all its layers, K and V). Groups with equal
    /// `page_bytes` share one page pool; each distinct value has its own pool.
    pub page_bytes: u64,
}

/// Geometry and options of a `kvs_hybrid`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_hybrid_config {
    /// Tokens per page, every group (1..=`KVS_MAX_PAGE_SIZE`).
    pub page_size: u32,
    /// Pages in each pool, the null page 0 included (at least 2).
    pub num_pages: u32,
    /// Register full pages and match prompts against them.
    pub enable_prefix_caching: bool,
    /// Queue a `kvs_group_event` per page stored in / removed from a group's index.
    pub enable_events: bool,
    /// The groups in the engine's order (the index is `group_idx`).
    pub groups: *const kvs_group,
    /// Number of `groups` (1..=`KVS_MAX_GROUPS`).
    pub num_groups: usize,
}

/// A group as the cache sees it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_group_info {
    /// A `kvs_group_kind` value.
    pub kind: u32,
    /// Window or chunk in tokens; 0 for full attention; a state group's `kvs_state_mode`.
    pub window: u32,
    /// Bytes of one page.
    pub page_bytes: u64,
    /// The group's pool (page ids index that pool's KV tensors).
    pub pool: u32,
    /// Pools of the cache.
    pub num_pools: u32,
}

/// What `kvs_hybrid_seq_begin` did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_hybrid_begin_info {
    /// The hit: tokens the engine may skip computing.
    pub matched_tokens: u64,
    /// Length of every group's block table.
    pub num_pages: u64,
    /// Pages taken fresh, all groups together.
    pub new_pages: u64,
}

/// A sequence's shape.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_hybrid_seq_info {
    /// Tokens appended so far.
    pub num_tokens: u64,
    /// Length of every group's block table (null entries included).
    pub num_pages: u64,
    /// Tokens matched at begin.
    pub matched_tokens: u64,
}

/// One group's share of a `kvs_hybrid` and its pool's totals.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_group_stats {
    /// The group's pool.
    pub pool: u64,
    /// Pages of that pool, the null page included.
    pub pool_pages_total: u64,
    /// Unreferenced pages of the pool, cached ones included (vLLM's `get_num_free_blocks`).
    pub pool_pages_free: u64,
    /// Referenced pages of the pool (all its groups).
    pub pool_pages_in_use: u64,
    /// Non-null entries of this group's tables over all sequences (a page shared by k
    /// sequences counts k times).
    pub pages_held: u64,
    /// Distinct pages this group's tables hold.
    pub pages_distinct: u64,
    /// Entries in this group's prefix index.
    pub pages_registered: u64,
    /// Cumulative: pages released out of this group's window.
    pub pages_released: u64,
    /// Cumulative: registered pages of this group evicted for reuse.
    pub evictions: u64,
    /// Cumulative: tokens matched by sequence begins (the same for every group).
    pub prefix_hit_tokens: u64,
    /// Cumulative: begins that looked up the index.
    pub prefix_queries: u64,
    /// Live sequences.
    pub num_seqs: u64,
    /// Events dropped because the queue was full (the same for every group).
    pub events_dropped: u64,
}

/// One index change of one group: vLLM's `BlockStored` / `BlockRemoved` with their
/// `group_idx`, `kv_cache_spec_kind` and `kv_cache_spec_sliding_window` fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_group_event {
    /// A `kvs_event_kind` value (Stored or Removed).
    pub kind: u32,
    /// The group whose index changed.
    pub group_idx: u32,
    /// The group's `kvs_group_kind`.
    pub group_kind: u32,
    /// The group's window or chunk (0 for full attention).
    pub window: u32,
    /// Low 64 bits of the page's chain digest (README, "Prefix keys").
    pub hash_lo: u64,
    /// High 64 bits.
    pub hash_hi: u64,
    /// Low 64 bits of the previous page's digest (Stored only; the root digest for a first page).
    pub parent_lo: u64,
    /// High 64 bits.
    pub parent_hi: u64,
    /// LoRA id of the sequence that stored it (Stored only).
    pub lora_id: u64,
    /// Tokens in the page (the page size).
    pub num_tokens: u32,
    /// Page id in the group's pool.
    pub page: u32,
}

/// A cache of KV-cache groups: one page pool per distinct `page_bytes` (shared by the groups
/// with those bytes, vLLM's single block pool), one prefix index per group, and per sequence
/// one block table per group. Sliding-window and chunked-local groups release the pages they
/// no longer read (`kvs_hybrid_seq_release_skipped`); registered ones stay matchable. State
/// groups (Mamba / linear attention, `kvs_state_mode`) keep the running state's page and cache
/// page-aligned checkpoints (see `src/ffi/hybrid_state.rs`'s calls).
///
/// **Ownership:** created by `kvs_hybrid_new`, freed by `kvs_hybrid_free`.
/// **Thread safety:** every function taking a `kvs_hybrid*` may be called from any thread at
/// once (one internal lock); `kvs_hybrid_free` must not race with any other call. A panic inside
/// the library poisons the object (later calls: `KVS_STATUS_POISONED`).
///
/// **Methods:** `kvs_hybrid_new`, `kvs_hybrid_free`, `kvs_hybrid_check`,
/// `kvs_hybrid_group_info`, `kvs_hybrid_match`, `kvs_hybrid_seq_begin`,
/// `kvs_hybrid_seq_release_skipped`, `kvs_hybrid_seq_append`, `kvs_hybrid_seq_append_need`,
/// `kvs_hybrid_seq_free`, `kvs_hybrid_seq_get_info`, `kvs_hybrid_seq_pages`,
/// `kvs_hybrid_block_tables`, `kvs_hybrid_slot_mapping`, `kvs_hybrid_stats`,
/// `kvs_hybrid_take_events`, `kvs_hybrid_new_step`, `kvs_hybrid_seq_state_page`.
pub struct kvs_hybrid {
    _private: [u8; 0],
}

impl Handle for kvs_hybrid {
    type Rust = Mutex<Hybrid>;
    const NAME: &'static str = "hybrid";
}

/// Locks the cache behind a handle.
///
/// # Safety
/// `h` must be NULL or a live handle from `kvs_hybrid_new`.
pub(super) unsafe fn lock<'a>(h: *const kvs_hybrid) -> Result<MutexGuard<'a, Hybrid>, Error> {
    handle::borrow(h)?
        .lock()
        .map_err(|_| Error::Cache(kvshare_core::Error::Poisoned))
}

const BOOLS: [(&str, usize); 2] = [
    (
        "enable_prefix_caching",
        offset_of!(kvs_hybrid_config, enable_prefix_caching),
    ),
    (
        "enable_events",
        offset_of!(kvs_hybrid_config, enable_events),
    ),
];

/// Reads a `kvs_hybrid_config` into the core's form, refusing bool bytes other than 0/1.
///
/// # Safety
/// When non-NULL, `ptr` must point to a readable `kvs_hybrid_config` whose `groups` are valid
/// for `num_groups`.
unsafe fn read_config(ptr: *const kvs_hybrid_config) -> Result<HybridConfig, Error> {
    if ptr.is_null() {
        return Err(Error::NullArgument("config"));
    }
    if !ptr.is_aligned() {
        return Err(Error::arg("config", "pointer is misaligned"));
    }
    for (field, offset) in BOOLS {
        // SAFETY: a field's offset inside the readable struct; its byte is initialised.
        let byte = ptr.cast::<u8>().add(offset).read();
        if byte > 1 {
            return Err(Error::Cache(kvshare_core::Error::InvalidConfig {
                field,
                reason: format!("byte value {byte} is not a bool (0 or 1)"),
            }));
        }
    }
    let c = try_ref(ptr, "config")?;
    if c.num_groups > KVS_MAX_GROUPS {
        return Err(Error::Cache(kvshare_core::Error::InvalidConfig {
            field: "num_groups",
            reason: format!("{} exceeds {KVS_MAX_GROUPS}", c.num_groups),
        }));
    }
    let raw = slice(c.groups, c.num_groups, "config.groups")?;
    let mut groups = Vec::with_capacity(raw.len());
    for (i, g) in raw.iter().enumerate() {
        let kind = match decode::<kvs_group_kind>(g.kind, "groups.kind") {
            Ok(kvs_group_kind::Full) if g.window == 0 => GroupKind::Full,
            Ok(kvs_group_kind::Full) => {
                return Err(Error::Cache(kvshare_core::Error::InvalidConfig {
                    field: "groups.window",
                    reason: format!("group {i}: full attention takes window 0, not {}", g.window),
                }))
            }
            Ok(kvs_group_kind::SlidingWindow) => GroupKind::SlidingWindow(g.window),
            Ok(kvs_group_kind::ChunkedLocal) => GroupKind::ChunkedLocal(g.window),
            Ok(kvs_group_kind::State) => {
                match decode::<kvs_state_mode>(g.window, "groups.window") {
                    Ok(kvs_state_mode::None) => GroupKind::State(StateMode::None),
                    Ok(kvs_state_mode::All) => GroupKind::State(StateMode::All),
                    Ok(kvs_state_mode::Align) => GroupKind::State(StateMode::Align),
                    Err(e) => {
                        return Err(Error::Cache(kvshare_core::Error::InvalidConfig {
                            field: "groups.window",
                            reason: format!("group {i}: {e}"),
                        }))
                    }
                }
            }
            Err(e) => {
                return Err(Error::Cache(kvshare_core::Error::InvalidConfig {
                    field: "groups.kind",
                    reason: format!("group {i}: {e}"),
                }))
            }
        };
        groups.push(GroupSpec {
            kind,
            page_bytes: g.page_bytes,
        });
    }
    Ok(HybridConfig {
        page_size: c.page_size,
        num_pages: c.num_pages,
        groups,
        enable_prefix_caching: c.enable_prefix_caching,
        enable_events: c.enable_events,
    })
}

fn kind_of(k: GroupKind) -> kvs_group_kind {
    match k {
        GroupKind::Full => kvs_group_kind::Full,
        GroupKind::SlidingWindow(_) => kvs_group_kind::SlidingWindow,
        GroupKind::ChunkedLocal(_) => kvs_group_kind::ChunkedLocal,
        GroupKind::State(_) => kvs_group_kind::State,
    }
}

/// `kvs_group_info.window`: the window or chunk, or a state group's `kvs_state_mode`.
fn window_of(k: GroupKind) -> u32 {
    match k {
        GroupKind::State(m) => kvs_state_mode::from(m) as u32,
        _ => k.window(),
    }
}

impl kvs_hybrid {
    /// Creates a cache of groups from `config` and writes its handle to `*hybrid_out`.
    ///
    /// **Ownership:** free it with `kvs_hybrid_free`; the config and its groups are copied.
    /// **Failure:** `KVS_STATUS_INVALID_CONFIG` names the bad field (a bool byte other than
    /// 0/1, `num_groups` outside 1..=`KVS_MAX_GROUPS`, an unknown kind, a window of 0 for a
    /// window kind or non-0 for full attention, a chunk that is not a multiple of `page_size`
    /// (`groups.window`), a state group whose mode is unknown, none with
    /// prefix caching on or all / align with it off, `page_bytes` 0, `num_pages` below 2);
    /// `KVS_STATUS_OUT_OF_MEMORY`; `*hybrid_out` is untouched on error.
    /// **Thread safety:** safe from any thread.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_new(
        config: *const kvs_hybrid_config,
        hybrid_out: *mut *mut kvs_hybrid,
    ) -> kvs_status {
        guard(|| {
            let cfg = read_config(config)?;
            let out = try_out(hybrid_out, "hybrid_out")?;
            let h = Hybrid::new(cfg)?;
            *out = handle::into_raw::<kvs_hybrid>(Mutex::new(h));
            Ok(())
        })
    }

    /// Frees a cache of groups and everything in it. NULL is a no-op.
    ///
    /// **Thread safety:** no other call may use `hybrid` during or after this one.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_free(hybrid: *mut kvs_hybrid) {
        let _ = guard(|| {
            handle::free(hybrid);
            Ok(())
        });
    }

    /// Runs the invariant checker (tables, refcounts, lists, indices of every group).
    ///
    /// **Failure:** `KVS_STATUS_INVARIANT_VIOLATION` with the first disagreement in
    /// `kvs_last_error_message()` (a bug in the library).
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[must_use]
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_check(hybrid: *const kvs_hybrid) -> kvs_status {
        guard(|| Ok(lock(hybrid)?.check()?))
    }

    /// Writes group `group`'s kind, window, page bytes and pool to `*info_out`.
    ///
    /// **Failure:** `group` not below the group count (`KVS_STATUS_INVALID_ARGUMENT`):
    /// `*info_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_group_info(
        hybrid: *const kvs_hybrid,
        group: usize,
        info_out: *mut kvs_group_info,
    ) -> kvs_status {
        guard(|| {
            let h = lock(hybrid)?;
            let out = try_out(info_out, "info_out")?;
            let pool = h.pool_of(group)?;
            let g = h.config().groups[group];
            *out = kvs_group_info {
                kind: kind_of(g.kind) as u32,
                window: window_of(g.kind),
                page_bytes: g.page_bytes,
                pool: u32::try_from(pool).map_err(|_| Error::arg("group", "pool id overflow"))?,
                num_pools: u32::try_from(h.num_pools())
                    .map_err(|_| Error::arg("group", "pool count overflow"))?,
            };
            Ok(())
        })
    }

    /// The longest prefix hit of `tokens` across all groups, at most `max_tokens` (vLLM's
    /// `get_computed_blocks`: pass `num_tokens - 1`). Read-only. Writes the hit N to
    /// `*matched_tokens_out` and, when `pages_out` is not NULL, row `g` of `pages_out`
    /// (row-major `[num_groups, max_pages_per_group]`) gets group `g`'s `N / page_size` pages:
    /// its hit pages, `KVS_NULL_PAGE` where it skips; entries after them are left as they were.
    ///
    /// **Failure:** NULL pointers, `pages_len` below `num_groups * max_pages_per_group`, a hit
    /// longer than `max_pages_per_group` pages with `pages_out` given (`KVS_STATUS_BUFFER_TOO_SMALL`):
    /// nothing is written.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_match(
        hybrid: *const kvs_hybrid,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_tokens: usize,
        pages_out: *mut u32,
        pages_len: usize,
        max_pages_per_group: usize,
        matched_tokens_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let mut h = lock(hybrid)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let pages = slice_mut(pages_out, pages_len, "pages_out")?;
            let out = try_out(matched_tokens_out, "matched_tokens_out")?;
            let rows = h.num_groups();
            let want = rows
                .checked_mul(max_pages_per_group)
                .ok_or_else(|| Error::arg("max_pages_per_group", "overflow"))?;
            if !pages_out.is_null() && pages.len() < want {
                return Err(Error::Cache(kvshare_core::Error::BufferTooSmall {
                    what: "pages_out",
                    needed: want,
                    capacity: pages.len(),
                }));
            }
            let (hit, found) = h.find(t, x.as_ref(), max_tokens);
            if !pages_out.is_null() {
                let n = hit / h.config().page_size as usize;
                if n > max_pages_per_group {
                    return Err(Error::Cache(kvshare_core::Error::BufferTooSmall {
                        what: "pages_out",
                        needed: n,
                        capacity: max_pages_per_group,
                    }));
                }
                for (g, f) in found.iter().enumerate() {
                    pages[g * max_pages_per_group..][..n].copy_from_slice(&f[..n]);
                }
            }
            *out = hit;
            Ok(())
        })
    }

    /// Starts sequence `seq_id` with its known tokens (vLLM: computed plus this step's
    /// scheduled tokens): the longest hit N (at most `max_match_tokens`, as `kvs_hybrid_match`),
    /// then per group `KVS_NULL_PAGE` where it skips at N, the hit pages, and fresh pages up to
    /// `num_tokens + lookahead_slots` slots (groups in order). Full pages are registered.
    ///
    /// A state group takes one page in modes none and align (at the table's end), a page per
    /// position after the hit in mode all.
    ///
    /// **Failure:** `KVS_STATUS_SEQ_EXISTS`, `KVS_STATUS_NO_SPACE` (a pool's free + evictable
    /// pages below the fresh pages plus the evictable hit pages, vLLM's admission check; or the
    /// hit ends at a state checkpoint registered since the last `kvs_hybrid_new_step`),
    /// `KVS_STATUS_INVALID_ARGUMENT` (lookahead slots with a state group in mode align),
    /// `KVS_STATUS_REFCOUNT_OVERFLOW`, `KVS_STATUS_OUT_OF_MEMORY`: nothing changes and
    /// `*info_out` (optional, may be NULL) is untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_seq_begin(
        hybrid: *mut kvs_hybrid,
        seq_id: u64,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_match_tokens: usize,
        lookahead_slots: usize,
        info_out: *mut kvs_hybrid_begin_info,
    ) -> kvs_status {
        guard(|| {
            let mut h = lock(hybrid)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let out = opt_out(info_out, "info_out")?;
            let b = h.begin(seq_id, t, x, max_match_tokens, lookahead_slots)?;
            if let Some(o) = out {
                *o = kvs_hybrid_begin_info {
                    matched_tokens: b.matched_tokens as u64,
                    num_pages: b.num_pages as u64,
                    new_pages: b.new_pages as u64,
                };
            }
            Ok(())
        })
    }

    /// vLLM's `remove_skipped_blocks(request, num_computed_tokens)`: every group replaces the
    /// positions it no longer reads once `num_computed_tokens` tokens have KV (sliding window
    /// W: the first `max(0, c - W + 1) / page_size` pages; chunked local C: the pages before
    /// `c / C * C`; a state group in mode all or align: the pages before `(c - 1) / page_size`,
    /// and in align also the previous step's state page once `c` moved past it; full attention
    /// and state mode none: none) by `KVS_NULL_PAGE`, from the last such position down
    /// to the first one already null, and returns those pages to their pool: registered ones to
    /// the back of the reuse queue (still matchable), the others to its front. vLLM calls it
    /// before its admission check and does not undo it when the allocation fails, hence a call
    /// of its own. `num_computed_tokens` past the table is capped to it. Writes the number of
    /// pages released to `*num_released_out` (optional).
    ///
    /// **Failure:** unknown sequence: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_seq_release_skipped(
        hybrid: *mut kvs_hybrid,
        seq_id: u64,
        num_computed_tokens: usize,
        num_released_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let mut h = lock(hybrid)?;
            let out = opt_out(num_released_out, "num_released_out")?;
            let n = h.release_skipped(seq_id, num_computed_tokens)?;
            if let Some(o) = out {
                *o = n;
            }
            Ok(())
        })
    }

    /// Appends `num_tokens` tokens and grows every group's table to the pages
    /// `len + lookahead_slots` slots need (groups in order; vLLM's `allocate_new_blocks`), then
    /// registers the pages that filled (vLLM's `cache_blocks`). A state group in mode align
    /// takes at most one page (the new last position, nulls before it) and keeps the previous
    /// step's state page (the new state is computed from it); when it grows, it first releases
    /// its state page of two steps ago, as vLLM's `allocate_slots` does at its start, and that
    /// page counts as available for the new one. The sequence's tokens are taken as computed
    /// for that release, so no `kvs_hybrid_seq_release_skipped` is needed between appends;
    /// the other groups' pages out of reach are released by that call only. In mode none its
    /// one page moves to the new last position.
    ///
    /// **Failure:** unknown sequence, `KVS_STATUS_NO_SPACE`, `KVS_STATUS_OUT_OF_MEMORY`,
    /// `KVS_STATUS_INVALID_ARGUMENT` (lookahead slots with a state group in mode align):
    /// nothing changes, nothing is released.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_seq_append(
        hybrid: *mut kvs_hybrid,
        seq_id: u64,
        tokens: *const i32,
        num_tokens: usize,
        lookahead_slots: usize,
    ) -> kvs_status {
        guard(|| {
            let mut h = lock(hybrid)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            Ok(h.append(seq_id, t, lookahead_slots)?)
        })
    }

    /// Pages `kvs_hybrid_seq_append` of `num_tokens` tokens with `lookahead_slots` would take
    /// now, all groups together, to `*pages_out`. Read-only.
    ///
    /// **Failure:** unknown sequence (`KVS_STATUS_SEQ_NOT_FOUND`), a `num_tokens` or
    /// `lookahead_slots` that overflows the sequence's token count, lookahead slots with a
    /// state group in mode align (`KVS_STATUS_INVALID_ARGUMENT` naming it), a NULL or
    /// misaligned `pages_out`: `*pages_out` untouched. A need larger than the pools is an
    /// answer, not a failure.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_seq_append_need(
        hybrid: *const kvs_hybrid,
        seq_id: u64,
        num_tokens: usize,
        lookahead_slots: usize,
        pages_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let h = lock(hybrid)?;
            let out = try_out(pages_out, "pages_out")?;
            *out = h.append_need(seq_id, num_tokens, lookahead_slots)?;
            Ok(())
        })
    }

    /// Ends a sequence: groups in order, each table from its last position (vLLM's
    /// `free`); registered pages stay matchable.
    ///
    /// **Failure:** unknown sequence: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_seq_free(
        hybrid: *mut kvs_hybrid,
        seq_id: u64,
    ) -> kvs_status {
        guard(|| Ok(lock(hybrid)?.free(seq_id)?))
    }

    /// Writes a sequence's token count, table length and matched tokens to `*info_out`.
    ///
    /// **Failure:** unknown sequence: `*info_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_seq_get_info(
        hybrid: *const kvs_hybrid,
        seq_id: u64,
        info_out: *mut kvs_hybrid_seq_info,
    ) -> kvs_status {
        guard(|| {
            let h = lock(hybrid)?;
            let out = try_out(info_out, "info_out")?;
            let (t, p, m) = h.seq_info(seq_id)?;
            *out = kvs_hybrid_seq_info {
                num_tokens: t as u64,
                num_pages: p as u64,
                matched_tokens: m as u64,
            };
            Ok(())
        })
    }

    /// Copies group `group`'s block table of a sequence (`KVS_NULL_PAGE` at released
    /// positions) to `pages_out` and its length to `*num_pages_out`.
    ///
    /// **Failure:** unknown sequence or group, `max_pages` below the table length
    /// (`KVS_STATUS_BUFFER_TOO_SMALL`): nothing is written.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_seq_pages(
        hybrid: *const kvs_hybrid,
        seq_id: u64,
        group: usize,
        pages_out: *mut u32,
        max_pages: usize,
        num_pages_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let h = lock(hybrid)?;
            let out = slice_mut(pages_out, max_pages, "pages_out")?;
            let n_out = try_out(num_pages_out, "num_pages_out")?;
            let t = h.seq_pages(seq_id, group)?;
            if t.len() > out.len() {
                return Err(Error::Cache(kvshare_core::Error::BufferTooSmall {
                    what: "pages_out",
                    needed: t.len(),
                    capacity: out.len(),
                }));
            }
            out[..t.len()].copy_from_slice(t);
            *n_out = t.len();
            Ok(())
        })
    }

    /// `kvs_cache_block_tables` for group `group`: row `i` of `table_out` gets sequence
    /// `seq_ids[i]`'s pages in that group (`KVS_NULL_PAGE` at released positions) followed by
    /// `pad_page`; `context_lens_out` (optional: NULL with length 0) its token counts.
    ///
    /// **Failure:** unknown sequence or group, a table longer than `max_pages_per_seq`, short
    /// buffers: nothing is written.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_block_tables(
        hybrid: *const kvs_hybrid,
        group: usize,
        seq_ids: *const u64,
        num_seqs: usize,
        max_pages_per_seq: usize,
        pad_page: i32,
        table_out: *mut i32,
        table_len: usize,
        context_lens_out: *mut i32,
        context_lens_len: usize,
    ) -> kvs_status {
        guard(|| {
            let h = lock(hybrid)?;
            let ids = slice(seq_ids, num_seqs, "seq_ids")?;
            let table = slice_mut(table_out, table_len, "table_out")?;
            let lens = slice_mut(context_lens_out, context_lens_len, "context_lens_out")?;
            Ok(h.block_tables(group, ids, max_pages_per_seq, pad_page, table, lens)?)
        })
    }

    /// `kvs_cache_slot_mapping` for group `group`: the slots (`page * page_size + offset`) of
    /// each sequence's last `query_lens[i]` tokens in that group, concatenated; -1 for a token
    /// at a released position and for the padding up to `slots_len`. Writes the sum of
    /// `query_lens` to `*num_slots_out` (optional).
    ///
    /// **Failure:** unknown sequence or group, a query length over the sequence length,
    /// `slots_len` too small: nothing is written.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_slot_mapping(
        hybrid: *const kvs_hybrid,
        group: usize,
        seq_ids: *const u64,
        query_lens: *const u32,
        num_seqs: usize,
        slots_out: *mut i64,
        slots_len: usize,
        num_slots_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let h = lock(hybrid)?;
            let ids = slice(seq_ids, num_seqs, "seq_ids")?;
            let q = slice(query_lens, num_seqs, "query_lens")?;
            let out = slice_mut(slots_out, slots_len, "slots_out")?;
            let n_out = opt_out(num_slots_out, "num_slots_out")?;
            let n = h.slot_mapping(group, ids, q, out)?;
            if let Some(o) = n_out {
                *o = n;
            }
            Ok(())
        })
    }

    /// Writes group `group`'s stats (and its pool's totals) to `*stats_out`.
    ///
    /// **Failure:** unknown group: `*stats_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_stats(
        hybrid: *const kvs_hybrid,
        group: usize,
        stats_out: *mut kvs_group_stats,
    ) -> kvs_status {
        guard(|| {
            let h = lock(hybrid)?;
            let out = try_out(stats_out, "stats_out")?;
            let s = h.stats(group)?;
            *out = kvs_group_stats {
                pool: u64::from(s.pool),
                pool_pages_total: s.pool_pages_total,
                pool_pages_free: s.pool_pages_free,
                pool_pages_in_use: s.pool_pages_in_use,
                pages_held: s.pages_held,
                pages_distinct: s.pages_distinct,
                pages_registered: s.pages_registered,
                pages_released: s.pages_released,
                evictions: s.evictions,
                prefix_hit_tokens: s.prefix_hit_tokens,
                prefix_queries: s.prefix_queries,
                num_seqs: s.num_seqs,
                events_dropped: h.events_dropped(),
            };
            Ok(())
        })
    }

    /// Drains up to `events_len` queued events, oldest first, into `events_out` and writes how
    /// many to `*num_events_out`; call again while it equals `events_len`. Empty unless the
    /// config enabled events.
    ///
    /// **Failure:** NULL pointers: nothing is taken.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_take_events(
        hybrid: *mut kvs_hybrid,
        events_out: *mut kvs_group_event,
        events_len: usize,
        num_events_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let mut h = lock(hybrid)?;
            let out = slice_mut(events_out, events_len, "events_out")?;
            let n_out = try_out(num_events_out, "num_events_out")?;
            let groups = h.config().groups.clone();
            let taken = h.take_events(out.len());
            for (dst, e) in out.iter_mut().zip(&taken) {
                let g = groups[e.group as usize];
                let (hash_lo, hash_hi) = halves(e.hash);
                let (parent_lo, parent_hi) = halves(e.parent);
                *dst = kvs_group_event {
                    kind: kvs_event_kind::from(e.kind) as u32,
                    group_idx: e.group,
                    group_kind: kind_of(g.kind) as u32,
                    window: g.kind.window(),
                    hash_lo,
                    hash_hi,
                    parent_lo,
                    parent_hi,
                    lora_id: e.lora_id,
                    num_tokens: e.num_tokens,
                    page: e.page,
                };
            }
            *n_out = taken.len();
            Ok(())
        })
    }
}
