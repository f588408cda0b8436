//! `kvs_cache_*`: creating, inspecting and checking a cache, and the per-step batch builders.

use super::enums::decode;
use super::enums::{kvs_dtype, kvs_eviction_policy, kvs_status, kvs_tier};
use super::groups::{
    count, flags_of, groups_from_c, kind_of, kvs_group, kvs_group_info, kvs_group_stats, spec_of,
    window_of,
};
use super::handle::{self, Handle};
use super::panic::guard;
use super::slice::{slice, slice_mut, try_out, try_ref};

use crate::error::Error;
use kvshare_core::{Cache, Config, DType, EvictionPolicy, Tier, WindowRetention};

/// A KV-cache manager: page pools (device and host), refcounts, the prefix index and sequences,
/// for one KV-cache group (a plain model) or several (`kvs_config.groups`: sliding-window,
/// chunked-local and state layers next to full attention). Every capability works on every
/// group: host tier, fork and copy-on-write, pins, priorities, `match_unit`, deferred commit,
/// events.
///
/// **Ownership:** created by `kvs_cache_new`, freed by `kvs_cache_free`.
/// **Thread safety:** every function taking a `kvs_cache*` may be called from any number of
/// threads at once (a scheduler thread allocating while workers release): each call is one short
/// critical section under an internal lock, and sees and leaves the cache consistent.
/// `kvs_cache_free` must not race with any other call on the same cache. If a call panics inside
/// the library (a bug), the call returns `KVS_STATUS_PANIC` and the cache is poisoned: later calls
/// return `KVS_STATUS_POISONED`.
///
/// **Methods:** `kvs_cache_new`, `kvs_cache_free`, `kvs_cache_get_config`, `kvs_cache_stats`,
/// `kvs_cache_available`, `kvs_cache_check`, `kvs_cache_commit`, `kvs_cache_new_step`,
/// `kvs_cache_block_tables`, `kvs_cache_slot_mapping`; groups: `kvs_cache_group_info`,
/// `kvs_cache_group_stats`; pages: `kvs_pages_alloc`, `kvs_pages_acquire`, `kvs_pages_release`,
/// `kvs_page_get_info`; prefix index: `kvs_prefix_register`, `kvs_prefix_match`,
/// `kvs_prefix_find`, `kvs_prefix_unregister`, `kvs_prefix_clear`; sequences: `kvs_seq_begin`,
/// `kvs_seq_begin_computed`, `kvs_seq_append`, `kvs_seq_append_pages`, `kvs_seq_append_batch`,
/// `kvs_seq_fork`, `kvs_seq_free`, `kvs_seq_free_deferred`, `kvs_seq_release_skipped`,
/// `kvs_seq_set_computed`, `kvs_seq_swap_out`, `kvs_seq_swap_in`, `kvs_seq_get_info`,
/// `kvs_seq_pages`, `kvs_seq_state_page`, `kvs_seq_set_priority`, `kvs_seq_append_need`,
/// `kvs_seq_swap_in_need`, `kvs_seq_swap_out_need`; queues: `kvs_cache_take_copies`,
/// `kvs_cache_take_events`; retention: `kvs_prefix_pin`, `kvs_prefix_unpin`,
/// `kvs_prefix_prefetch`; pool tier: `kvs_cache_new_pooled`, `kvs_pool_lookup`,
/// `kvs_seq_begin_pooled`, `kvs_pool_take_work`, `kvs_pool_done`, `kvs_seq_pool_loading`,
/// `kvs_cache_pool_stats`.
pub struct kvs_cache {
    _private: [u8; 0],
}

impl Handle for kvs_cache {
    type Rust = Cache;
    const NAME: &'static str = "cache";
}

/// Borrows the cache behind a handle.
///
/// # Safety
/// `cache` must be NULL or a live handle from `kvs_cache_new`.
pub(crate) unsafe fn cache<'a>(cache: *const kvs_cache) -> Result<&'a Cache, Error> {
    // SAFETY: the caller guarantees NULL or a live handle from `kvs_cache_new`, which made it
    // by `into_raw::<kvs_cache>`.
    unsafe { handle::borrow(cache) }
}

/// The largest `kvs_config.page_size` the library accepts, in tokens per page: adapters read
/// this instead of typing the number again. (A literal, because cbindgen writes only literals;
/// a compile-time assertion ties it to the core's limit, which `kvs_cache_new` enforces.)
pub const KVS_MAX_PAGE_SIZE: u32 = 1024;
const _: () = assert!(KVS_MAX_PAGE_SIZE == kvshare_core::config::MAX_PAGE_SIZE);

/// `kvs_config.window_retention`: every full page of a sliding-window group is registered.
pub const KVS_WINDOW_RETENTION_DENSE: u16 = 0;
/// `kvs_config.window_retention`: a sliding-window group registers only the tails before a
/// sequence's retention boundaries (`kvs_seq_set_retention`), no segment tails.
pub const KVS_WINDOW_RETENTION_BOUNDARIES: u16 = 0xFFFF;
/// The largest segment of `kvs_config.window_retention`, in pages.
pub const KVS_MAX_SEGMENT_PAGES: u16 = 0xFFFE;
const _: () = assert!(KVS_MAX_SEGMENT_PAGES as u32 == kvshare_core::MAX_SEGMENT_PAGES);
/// The most retention boundaries `kvs_seq_set_retention` takes.
pub const KVS_MAX_RETENTION_BOUNDARIES: usize = 4;
const _: () = assert!(KVS_MAX_RETENTION_BOUNDARIES == kvshare_core::MAX_RETENTION_BOUNDARIES);

/// Geometry and options of a cache. Start from `kvs_config_default()` and set what you need.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvs_config {
    /// Tokens per page, every group (1..=`KVS_MAX_PAGE_SIZE`, 1024; CANN kernels want 16..=128
    /// and a multiple of 16).
    pub page_size: u32,
    /// Pages in the device tier of each pool, the padding page included. Page ids index the
    /// engine's KV tensors `[num_pages, page_size, kv_heads, head_dim]` per layer (those of the
    /// layer's group's pool).
    pub num_device_pages: u32,
    /// Pages in the host tier of each pool (0: no swapping).
    pub num_host_pages: u32,
    /// Transformer layers (for the byte size of a page of a group whose `page_bytes` is 0).
    pub num_layers: u32,
    /// KV heads per layer (for byte sizes).
    pub num_kv_heads: u32,
    /// Head dimension (for byte sizes).
    pub head_dim: u32,
    /// KV element type, a `kvs_dtype` value (for byte sizes).
    pub dtype: u32,
    /// Register full pages in the prefix index and match new prompts against it.
    pub enable_prefix_caching: bool,
    /// Reserve device page 0 of each pool as the padding/null page (`KVS_NULL_PAGE`, vLLM's
    /// `null_block`): never allocated, and an error wherever a real page is expected. Required
    /// by every group kind but full attention: their tables show it at released positions.
    pub reserve_null_page: bool,
    /// Pages that fill up become matchable only at the next `kvs_cache_commit` (MindIE's
    /// `MarkBlocksAsComputed`, called once the step that computes their KV was scheduled).
    /// Needs `enable_prefix_caching`.
    pub defer_commit: bool,
    /// A prompt shares every cached full page, even pages holding tokens past `max_match_tokens`
    /// that the engine recomputes for the last token's logits; `kvs_cache_slot_mapping` returns
    /// -1 for those already-cached slots so the recomputation never writes into a shared page.
    /// A page that fills with content already cached is switched to the cached copy (dedup).
    /// Default on. Turn it off when the engine builds its own slot mapping from the block table
    /// (vLLM): such pages are then allocated fresh and recomputed. Sharing past
    /// `max_match_tokens` applies to caches of one full-attention group only (a window must be
    /// computed from the first recomputed token).
    pub skip_cached_writes: bool,
    /// With host pages: a cached device page chosen for eviction is copied to a host page (the
    /// copy is queued for `kvs_cache_take_copies`) and stays matchable there; a later match that
    /// reaches it promotes it back. Default on.
    pub demote_to_host: bool,
    /// Queue a `kvs_event` for every page stored in or removed from a tier's prefix index and
    /// every clear, drained with `kvs_cache_take_events`. Default off (nothing is queued).
    pub enable_events: bool,
    /// Granularity of prefix hits in tokens: a divisor of `page_size`, or 0 (the default) for
    /// `page_size`, whole pages. Smaller, a prompt that goes on for whole units inside a cached
    /// page no sequence holds (one that may have filled this step could lack its KV when the
    /// copy runs) also takes them: its first new page receives them by a partial copy (`num_tokens`
    /// below `page_size`) queued for `kvs_cache_take_copies`, which the engine must execute
    /// before the step's KV writes; the copy holds its source page until taken. When a sequence
    /// ends (`kvs_seq_free`), the whole units of its last, never-full page stay matchable too
    /// (never published as a `kvs_event`, as no partial page is). Each tier's index then keeps
    /// `(page_size / match_unit - 1) * 8` bytes more per page, so that pages sharing a unit
    /// prefix never hide one another. Keep 0 unless the engine executes the copy list. With
    /// several groups each group's first new page receives its units (one copy per group); a
    /// state group keeps checkpoints at page boundaries only, so a cache with one refuses a
    /// `match_unit` below `page_size` (`KVS_STATUS_INVALID_CONFIG` naming `match_unit`).
    pub match_unit: u32,
    /// Keep pages as vLLM's block pool keeps them, for lockstep with vLLM's own manager: a page
    /// released with no cached content goes behind the cached pages (vLLM appends every freed
    /// block to its queue), except the pages a group releases out of its window, which go
    /// first; and a page filled with content already cached (two requests computed the same
    /// page) is kept as a duplicate that takes the cached page's place when that one is
    /// evicted. Default off: a page with no cached content is always reused before any cached
    /// page is evicted, which keeps more prefixes cached.
    pub vllm_free_order: bool,
    /// With `vllm_free_order`: every page released with no cached content goes to the front of
    /// the reuse order, the last released first, as newer vLLM releases' block pool (0.32)
    /// reuses uncached blocks before evicting any cached one. Default off: vLLM 0.23's order
    /// (only a window's releases and a sliding-window group's frees go first). Set without
    /// `vllm_free_order`: `KVS_STATUS_INVALID_CONFIG` naming `vllm_uncached_first`.
    pub vllm_uncached_first: bool,
    /// Which full pages of a sliding-window group are registered as prefix hits. 0 (the
    /// default, `KVS_WINDOW_RETENTION_DENSE`): every one. `KVS_WINDOW_RETENTION_BOUNDARIES`:
    /// only the tail a hit needs (`cdiv(window - 1, page_size)` pages) before each of a
    /// sequence's retention boundaries (`kvs_seq_set_retention`). 1..=`KVS_MAX_SEGMENT_PAGES`:
    /// those tails and the tail before every multiple of this many pages. vLLM 0.32's
    /// `prefix_cache_retention_interval` None, 0 and positive (in pages); other kinds register
    /// every full page.
    pub window_retention: u16,
    /// A `kvs_eviction_policy`: which unreferenced cached page of a tier goes first when a page
    /// is needed, within retention priorities. Default `KVS_EVICTION_POLICY_LRU`; any other
    /// policy with `vllm_free_order` is `KVS_STATUS_INVALID_CONFIG` naming `eviction_policy`.
    pub eviction_policy: u32,
    /// The KV-cache groups, in the engine's order: the index of a group here is the `group`
    /// argument of the calls that take one, and `kvs_copy.group` / `kvs_event.group`. NULL with
    /// `num_groups` 0 (the default): one full-attention group of this geometry. Copied by
    /// `kvs_cache_new`; `kvs_cache_get_config` writes NULL here (read each group with
    /// `kvs_cache_group_info`).
    pub groups: *const kvs_group,
    /// Number of `groups` (0..=`KVS_MAX_GROUPS`).
    pub num_groups: usize,
}

/// The `bool` fields of `kvs_config`, with their byte offsets.
const CONFIG_BOOLS: [(&str, usize); 8] = [
    (
        "enable_prefix_caching",
        std::mem::offset_of!(kvs_config, enable_prefix_caching),
    ),
    (
        "reserve_null_page",
        std::mem::offset_of!(kvs_config, reserve_null_page),
    ),
    (
        "defer_commit",
        std::mem::offset_of!(kvs_config, defer_commit),
    ),
    (
        "skip_cached_writes",
        std::mem::offset_of!(kvs_config, skip_cached_writes),
    ),
    (
        "demote_to_host",
        std::mem::offset_of!(kvs_config, demote_to_host),
    ),
    (
        "enable_events",
        std::mem::offset_of!(kvs_config, enable_events),
    ),
    (
        "vllm_free_order",
        std::mem::offset_of!(kvs_config, vllm_free_order),
    ),
    (
        "vllm_uncached_first",
        std::mem::offset_of!(kvs_config, vllm_uncached_first),
    ),
];

/// Reads a caller's `kvs_config`. A `bool` field holding a byte other than 0 or 1 (written by
/// `memset`, a `uint8_t` view, or a ctypes field of the wrong type) is `KVS_STATUS_INVALID_CONFIG`
/// naming the field: such a value is no Rust `bool`, so each field is read as a byte first and
/// the struct is borrowed only once every byte is a valid `bool`.
///
/// # Safety
/// When non-NULL, `ptr` must point to a readable `kvs_config`.
pub(crate) unsafe fn read_config<'a>(ptr: *const kvs_config) -> Result<&'a kvs_config, Error> {
    if ptr.is_null() {
        return Err(Error::NullArgument("config"));
    }
    if !ptr.is_aligned() {
        return Err(Error::arg("config", "pointer is misaligned"));
    }
    for (field, offset) in CONFIG_BOOLS {
        // SAFETY: `offset` is a field's offset inside the readable struct; bytes of a `bool`
        // field are initialised whatever value the caller stored.
        let byte = unsafe { ptr.cast::<u8>().add(offset).read() };
        if byte > 1 {
            return Err(Error::Cache(kvshare_core::Error::InvalidConfig {
                field,
                reason: format!("byte value {byte} is not a bool (0 or 1)"),
            }));
        }
    }
    // SAFETY: the caller guarantees a readable `kvs_config`, and every `bool` field holds 0 or
    // 1 (checked above), so it is a valid `kvs_config`.
    unsafe { try_ref(ptr, "config") }
}

impl kvs_config {
    /// The core's config, with the groups read from the caller's array.
    ///
    /// # Safety
    /// When non-NULL, `self.groups` must point to `self.num_groups` readable `kvs_group`s.
    pub(crate) unsafe fn to_core(self) -> Result<Config, Error> {
        let dtype: DType = kvs_dtype::try_from(self.dtype)
            .map_err(|e| {
                Error::Cache(kvshare_core::Error::InvalidConfig {
                    field: "dtype",
                    reason: e.reason(),
                })
            })?
            .into();
        let eviction_policy: EvictionPolicy = kvs_eviction_policy::try_from(self.eviction_policy)
            .map_err(|e| {
                Error::Cache(kvshare_core::Error::InvalidConfig {
                    field: "eviction_policy",
                    reason: e.reason(),
                })
            })?
            .into();
        // SAFETY: the caller guarantees `self.groups` NULL or readable for `self.num_groups`.
        let groups = unsafe { groups_from_c(self.groups, self.num_groups) }?;
        Ok(Config {
            page_size: self.page_size,
            num_device_pages: self.num_device_pages,
            num_host_pages: self.num_host_pages,
            num_layers: self.num_layers,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            dtype,
            enable_prefix_caching: self.enable_prefix_caching,
            reserve_null_page: self.reserve_null_page,
            defer_commit: self.defer_commit,
            skip_cached_writes: self.skip_cached_writes,
            demote_to_host: self.demote_to_host,
            enable_events: self.enable_events,
            match_unit: self.match_unit,
            vllm_free_order: self.vllm_free_order,
            vllm_uncached_first: self.vllm_uncached_first,
            window_retention: match self.window_retention {
                KVS_WINDOW_RETENTION_DENSE => WindowRetention::Dense,
                KVS_WINDOW_RETENTION_BOUNDARIES => WindowRetention::Sparse { segment_pages: 0 },
                k => WindowRetention::Sparse {
                    segment_pages: u32::from(k),
                },
            },
            eviction_policy,
            groups,
            pool: None,
        })
    }

    /// The C form of `c`, with `groups` NULL and `num_groups` as given.
    fn from_core(c: &Config, num_groups: usize) -> Self {
        kvs_config {
            page_size: c.page_size,
            num_device_pages: c.num_device_pages,
            num_host_pages: c.num_host_pages,
            num_layers: c.num_layers,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            dtype: kvs_dtype::from(c.dtype) as u32,
            enable_prefix_caching: c.enable_prefix_caching,
            reserve_null_page: c.reserve_null_page,
            defer_commit: c.defer_commit,
            skip_cached_writes: c.skip_cached_writes,
            demote_to_host: c.demote_to_host,
            enable_events: c.enable_events,
            match_unit: c.match_unit,
            vllm_free_order: c.vllm_free_order,
            vllm_uncached_first: c.vllm_uncached_first,
            window_retention: match c.window_retention {
                WindowRetention::Dense => KVS_WINDOW_RETENTION_DENSE,
                WindowRetention::Sparse { segment_pages: 0 } => KVS_WINDOW_RETENTION_BOUNDARIES,
                // At most `MAX_SEGMENT_PAGES` (`Config::validate`).
                WindowRetention::Sparse { segment_pages } => {
                    u16::try_from(segment_pages).unwrap_or(KVS_MAX_SEGMENT_PAGES)
                }
            },
            eviction_policy: kvs_eviction_policy::from(c.eviction_policy) as u32,
            groups: std::ptr::null(),
            num_groups,
        }
    }
}

/// Counters and pool figures, one consistent snapshot (`kvs_cache_stats`). Page figures are
/// totals over the cache's pools (one pool unless groups have different `page_bytes`); a
/// group's share is in `kvs_cache_group_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_stats {
    /// Device pages, padding page included.
    pub device_pages_total: u64,
    /// Device pages on the free list.
    pub device_pages_free: u64,
    /// Unreferenced device pages kept for prefix hits (evictable; count them as free capacity).
    pub device_pages_cached: u64,
    /// Device pages with refcount > 0.
    pub device_pages_in_use: u64,
    /// Device pages with refcount > 1.
    pub device_pages_shared: u64,
    /// Device pages held by a pin (`kvs_prefix_pin`).
    pub device_pages_pinned: u64,
    /// Host pages.
    pub host_pages_total: u64,
    /// Host pages free.
    pub host_pages_free: u64,
    /// Unreferenced host pages holding demoted or swapped-out content still indexed (evictable).
    pub host_pages_cached: u64,
    /// Host pages in use.
    pub host_pages_in_use: u64,
    /// Device pages registered in the prefix index.
    pub index_pages: u64,
    /// Host pages registered in the host tier's index.
    pub host_index_pages: u64,
    /// Live sequences.
    pub num_seqs: u64,
    /// Live sequences swapped out to host.
    pub num_seqs_swapped: u64,
    /// Tokens of device-resident sequences counted per sequence (what no sharing would store).
    pub logical_tokens: u64,
    /// Token slots of device pages in use (`device_pages_in_use * page_size`).
    pub physical_tokens: u64,
    /// Bytes of K and V of one page over all layers of group 0.
    pub page_bytes: u64,
    /// Page copies queued for `kvs_cache_take_copies`.
    pub pending_copies: u64,
    /// Events queued for `kvs_cache_take_events`.
    pub pending_events: u64,
    /// Prefix lookups made (matches and sequence begins).
    pub prefix_queries: u64,
    /// Tokens offered to prefix lookups.
    pub prefix_query_tokens: u64,
    /// Tokens found cached.
    pub prefix_hit_tokens: u64,
    /// Cached pages evicted to make room.
    pub evictions: u64,
    /// Copy-on-write copies reported.
    pub cow_copies: u64,
    /// Pages copied out by swap out (pages shared with content already on the host are not
    /// counted).
    pub swap_out_pages: u64,
    /// Pages copied in by swap in.
    pub swap_in_pages: u64,
    /// Pages inserted into the prefix index.
    pub pages_registered: u64,
    /// Times the prefix index was cleared.
    pub index_clears: u64,
    /// Cached device pages demoted to the host tier on eviction.
    pub demotions: u64,
    /// Host-tier pages promoted back to the device (hits, pins, prefetch).
    pub promotions: u64,
    /// Of those, promoted by `kvs_prefix_prefetch`.
    pub prefetched: u64,
    /// Cached host pages evicted.
    pub host_evictions: u64,
    /// Prefix-hit tokens served from the host tier.
    pub host_hit_tokens: u64,
    /// Events dropped because the queue was full (nobody drained it).
    pub events_dropped: u64,
    /// Pages that filled up with content already cached in another page and were switched to
    /// that page (the duplicate freed; `skip_cached_writes` mode only).
    pub dedup_pages: u64,
    /// Prefix hits that ended inside a cached page (`match_unit` below `page_size`): each
    /// queued one partial-page copy.
    pub unit_hits: u64,
    /// Tokens those hits copied (also counted in `prefix_hit_tokens`).
    pub unit_hit_tokens: u64,
}

impl kvs_cache {
    /// A valid default configuration: 16-token pages, 1024 device pages, no host pages, one
    /// layer of one 128-wide f16 KV head, prefix caching on, no padding page, no deferred
    /// commit, cached writes skipped, demotion to host pages on, events off, whole-page matching
    /// (`match_unit` 0), kvshare's reuse order (`vllm_free_order` off), dense window retention,
    /// one full-attention group (`groups` NULL, `num_groups` 0).
    ///
    /// **Thread safety:** safe from any thread.
    #[must_use]
    #[no_mangle]
    pub extern "C" fn kvs_config_default() -> kvs_config {
        kvs_config::from_core(&Config::default(), 0)
    }

    /// Creates a cache from `config` and writes its handle to `*cache_out`.
    ///
    /// **Ownership:** free the cache with `kvs_cache_free`. The config and its groups are
    /// copied.
    /// **Failure:** `KVS_STATUS_INVALID_CONFIG` names the bad field in `kvs_last_error_message()`
    /// (a `bool` field holding a byte other than 0 or 1 is one; so are `num_groups` above
    /// `KVS_MAX_GROUPS`, an unknown `groups.kind`, a `groups.window` of 0 for a window kind or
    /// not 0 for full attention, a chunk that is not a multiple of `page_size`, an unknown
    /// state mode, state mode none with prefix caching on or all / align with it off; a group
    /// other than full attention without `reserve_null_page` names `reserve_null_page`, and a
    /// state group with `match_unit` below `page_size` names `match_unit`);
    /// `KVS_STATUS_NULL_ARGUMENT` for a NULL `config`, `cache_out`, or `groups` with
    /// `num_groups` above 0; `KVS_STATUS_INVALID_ARGUMENT` for a misaligned `config`, `groups`
    /// or `cache_out`; `KVS_STATUS_OUT_OF_MEMORY` names the page-count field whose metadata
    /// could not be allocated (about 150 bytes per device page with prefix caching,
    /// `page_size * 4` of them token ids; per pool). `*cache_out` is untouched on error.
    /// **Thread safety:** safe from any thread.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_new(
        config: *const kvs_config,
        cache_out: *mut *mut kvs_cache,
    ) -> kvs_status {
        // SAFETY: `config` and `cache_out` are NULL or valid for the call (the export contract);
        // the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let cfg = read_config(config)?.to_core()?;
            let out = try_out(cache_out, "cache_out")?;
            let c = Cache::new(cfg)?;
            *out = handle::into_raw::<kvs_cache>(c);
            Ok(())
        })
    }

    /// Frees a cache and everything in it (sequences, pages, index). NULL is a no-op.
    ///
    /// **Thread safety:** no other call may use `cache` during or after this one.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_free(cache: *mut kvs_cache) {
        // SAFETY: `cache` is NULL or valid for the call (the export contract); the helpers refuse
        // NULL and misalignment.
        let _ = guard(|| unsafe {
            handle::free(cache);
            Ok(())
        });
    }

    /// Writes the cache's configuration to `*config_out`, with `groups` NULL and `num_groups`
    /// the cache's group count (1 for a cache configured without groups); read each group with
    /// `kvs_cache_group_info`.
    ///
    /// **Failure:** NULL `cache` or `config_out`, a misaligned `config_out`: `*config_out`
    /// untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_get_config(
        cache: *const kvs_cache,
        config_out: *mut kvs_config,
    ) -> kvs_status {
        // SAFETY: `cache` and `config_out` are NULL or valid for the call (the export contract);
        // the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let cfg = c.config();
            let out = try_out(config_out, "config_out")?;
            *out = kvs_config::from_core(cfg, cfg.groups.len().max(1));
            Ok(())
        })
    }

    /// Writes the pages an allocation for group `group` in `tier` (a `kvs_tier`) can take now to
    /// `*pages_out`: free plus evictable cached pages of the group's pool (with one pool,
    /// `*_pages_free + *_pages_cached` of `kvs_cache_stats` without the rest of the snapshot;
    /// O(1), an engine's "free blocks" read every step).
    ///
    /// **Failure:** bad tier, `group` not below the group count (`KVS_STATUS_INVALID_ARGUMENT`),
    /// NULL or misaligned `pages_out`: `*pages_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_available(
        cache: *const kvs_cache,
        tier: u32,
        group: usize,
        pages_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache` and `pages_out` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let tier: Tier = decode::<kvs_tier>(tier, "tier")?.into();
            let out = try_out(pages_out, "pages_out")?;
            *out = c.lock()?.available(tier, group)?;
            Ok(())
        })
    }

    /// Writes a consistent snapshot of pool figures and counters to `*stats_out`.
    ///
    /// **Failure:** NULL `cache` or `stats_out`, a misaligned `stats_out`: `*stats_out`
    /// untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_stats(
        cache: *const kvs_cache,
        stats_out: *mut kvs_stats,
    ) -> kvs_status {
        // SAFETY: `cache` and `stats_out` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = try_out(stats_out, "stats_out")?;
            let s = c.lock()?.stats();
            let k = s.counters;
            *out = kvs_stats {
                device_pages_total: s.device_pages_total,
                device_pages_free: s.device_pages_free,
                device_pages_cached: s.device_pages_cached,
                device_pages_in_use: s.device_pages_in_use,
                device_pages_shared: s.device_pages_shared,
                device_pages_pinned: s.device_pages_pinned,
                host_pages_total: s.host_pages_total,
                host_pages_free: s.host_pages_free,
                host_pages_cached: s.host_pages_cached,
                host_pages_in_use: s.host_pages_in_use,
                index_pages: s.index_pages,
                host_index_pages: s.host_index_pages,
                num_seqs: s.num_seqs,
                num_seqs_swapped: s.num_seqs_swapped,
                logical_tokens: s.logical_tokens,
                physical_tokens: s.physical_tokens,
                page_bytes: s.page_bytes,
                pending_copies: s.pending_copies,
                pending_events: s.pending_events,
                prefix_queries: k.prefix_queries,
                prefix_query_tokens: k.prefix_query_tokens,
                prefix_hit_tokens: k.prefix_hit_tokens,
                evictions: k.evictions,
                cow_copies: k.cow_copies,
                swap_out_pages: k.swap_out_pages,
                swap_in_pages: k.swap_in_pages,
                pages_registered: k.pages_registered,
                index_clears: k.index_clears,
                demotions: k.demotions,
                promotions: k.promotions,
                prefetched: k.prefetched,
                host_evictions: k.host_evictions,
                host_hit_tokens: k.host_hit_tokens,
                events_dropped: k.events_dropped,
                dedup_pages: k.dedup_pages,
                unit_hits: k.unit_hits,
                unit_hit_tokens: k.unit_hit_tokens,
            };
            Ok(())
        })
    }

    /// Verifies every internal invariant (refcounts equal holders, free + cached + in use =
    /// total, lists and indices agree with pages, every group's tables cover their sequence's
    /// tokens). O(pages + tokens): for tests and debugging, not every step.
    ///
    /// **Failure:** `KVS_STATUS_INVARIANT_VIOLATION` with the first violation in the message
    /// (a bug in kvshare: please report it).
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[must_use]
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_check(cache: *const kvs_cache) -> kvs_status {
        // SAFETY: `cache` is NULL or a live handle (the export contract); `cache()` refuses NULL.
        guard(|| Ok(unsafe { self::cache(cache) }?.lock()?.check()?))
    }

    /// Makes every page that filled up since the last commit matchable by later prompts. Call it
    /// once per scheduler step, after the step that computes those pages' KV is scheduled
    /// (MindIE's `MarkBlocksAsComputed`). A no-op unless the config has `defer_commit`.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `cache`, `KVS_STATUS_POISONED` after a
    /// panic inside the library: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_commit(cache: *mut kvs_cache) -> kvs_status {
        // SAFETY: `cache` is NULL or valid for the call (the export contract); the helpers refuse
        // NULL and misalignment.
        guard(|| unsafe {
            self::cache(cache)?.lock()?.commit();
            Ok(())
        })
    }

    /// Starts a scheduler step (vLLM's `KVCacheManager.new_step_starts`): state checkpoints
    /// registered before this call may now be hit. Until then a `kvs_seq_begin` whose hit ends
    /// at a state page registered in the current step fails with `KVS_STATUS_NO_SPACE` (vLLM
    /// does not schedule such a request in that step: the state is written by the step's own
    /// forward pass). Call it once at the start of every step; a cache without state groups
    /// ignores it.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `cache`, `KVS_STATUS_POISONED` after a
    /// panic inside the library: nothing changes. (A freed handle cannot be told from a live
    /// one: passing one is undefined behaviour, as for every call taking a handle.)
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_new_step(cache: *mut kvs_cache) -> kvs_status {
        // SAFETY: `cache` is NULL or valid for the call (the export contract); the helpers refuse
        // NULL and misalignment.
        guard(|| unsafe {
            self::cache(cache)?.lock()?.new_step();
            Ok(())
        })
    }

    /// Builds the padded block-table matrix of a batch in group `group`: row `i` of `table_out`
    /// (row-major `[num_seqs, max_pages_per_seq]`, `table_len >= num_seqs * max_pages_per_seq`)
    /// gets sequence `seq_ids[i]`'s page ids in that group (`KVS_NULL_PAGE` at positions the
    /// group released) followed by `pad_page`; `context_lens_out[i]` (optional: NULL with length
    /// 0) gets its token count.
    ///
    /// **Failure:** `group` not below the group count, unknown or swapped-out sequence, a
    /// sequence with more than `max_pages_per_seq` pages, or short buffers: an error status and
    /// nothing is written.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_block_tables(
        cache: *const kvs_cache,
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
        // SAFETY: `cache`, `seq_ids`, `table_out` and `context_lens_out` are NULL or valid for the
        // call (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let ids = slice(seq_ids, num_seqs, "seq_ids")?;
            let table = slice_mut(table_out, table_len, "table_out")?;
            let lens = slice_mut(context_lens_out, context_lens_len, "context_lens_out")?;
            Ok(c.lock()?
                .block_tables(group, ids, max_pages_per_seq, pad_page, table, lens)?)
        })
    }

    /// Builds the slot mapping of a batch in group `group`: for each sequence `seq_ids[i]`, the
    /// slots (`page * page_size + offset`, in the group's pool) of its last `query_lens[i]`
    /// tokens, concatenated into `slots_out`; remaining entries up to `slots_len` are set to -1
    /// (padding, skipped by the KV write). A token whose KV already sits in a shared cached page
    /// (`skip_cached_writes`) also gets -1, so recomputing it never overwrites shared KV, and so
    /// does a token at a position the group released. Writes the sum of `query_lens` to
    /// `*num_slots_out` (optional, may be NULL).
    ///
    /// **Failure:** `group` not below the group count, unknown or swapped-out sequence, a query
    /// length over the sequence length, `slots_len` below the sum of query lengths: an error
    /// status and nothing is written.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_slot_mapping(
        cache: *const kvs_cache,
        group: usize,
        seq_ids: *const u64,
        query_lens: *const u32,
        num_seqs: usize,
        slots_out: *mut i64,
        slots_len: usize,
        num_slots_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `seq_ids`, `query_lens`, `slots_out` and `num_slots_out` are NULL or
        // valid for the call (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let ids = slice(seq_ids, num_seqs, "seq_ids")?;
            let q = slice(query_lens, num_seqs, "query_lens")?;
            let out = slice_mut(slots_out, slots_len, "slots_out")?;
            let n_out = super::slice::opt_out(num_slots_out, "num_slots_out")?;
            let n = c.lock()?.slot_mapping(group, ids, q, out)?;
            if let Some(o) = n_out {
                *o = n;
            }
            Ok(())
        })
    }
}

impl kvs_cache {
    /// Writes group `group`'s kind, window, page bytes and pool, and the cache's pool and group
    /// counts, to `*info_out`. Every cache has group 0 (a cache configured without groups is one
    /// full-attention group).
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` (NULL `cache` or `info_out`),
    /// `KVS_STATUS_INVALID_ARGUMENT` (`group` not below the group count, a misaligned
    /// `info_out`): `*info_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_group_info(
        cache: *const kvs_cache,
        group: usize,
        info_out: *mut kvs_group_info,
    ) -> kvs_status {
        // SAFETY: `cache` and `info_out` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = try_out(info_out, "info_out")?;
            let st = c.lock()?;
            let pool = st.pool_of(group)?;
            let spec = spec_of(st.config(), group);
            *out = kvs_group_info {
                kind: kind_of(spec.kind) as u32,
                window: window_of(spec.kind),
                page_bytes: st.config().group_page_bytes(&spec),
                pool: count(pool, "group")?,
                num_pools: count(st.num_pools(), "group")?,
                num_groups: count(st.num_groups(), "group")?,
                flags: flags_of(&spec),
            };
            Ok(())
        })
    }

    /// Writes group `group`'s stats and its pool's totals to `*stats_out`, one consistent
    /// snapshot. O(pages held by sequences): for monitoring, not every step.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` (NULL `cache` or `stats_out`),
    /// `KVS_STATUS_INVALID_ARGUMENT` (`group` not below the group count, a misaligned
    /// `stats_out`): `*stats_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_group_stats(
        cache: *const kvs_cache,
        group: usize,
        stats_out: *mut kvs_group_stats,
    ) -> kvs_status {
        // SAFETY: `cache` and `stats_out` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = try_out(stats_out, "stats_out")?;
            let s = c.lock()?.group_stats(group)?;
            *out = kvs_group_stats {
                pool: u64::from(s.pool),
                page_bytes: s.page_bytes,
                pool_pages_total: s.pool_pages_total,
                pool_pages_free: s.pool_pages_free,
                pool_pages_in_use: s.pool_pages_in_use,
                pages_held: s.pages_held,
                pages_distinct: s.pages_distinct,
                pages_registered: s.pages_registered,
                host_pages_registered: s.host_pages_registered,
                pages_stored: s.counters.stored,
                evictions: s.counters.evictions,
                pages_released: s.counters.released,
            };
            Ok(())
        })
    }
}
