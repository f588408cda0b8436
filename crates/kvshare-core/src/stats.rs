//! Counters and the stats snapshot.

/// Event counters, monotonically increasing over the cache's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Prefix lookups (matches and sequence begins with prefix caching on).
    pub prefix_queries: u64,
    /// Tokens offered to those lookups.
    pub prefix_query_tokens: u64,
    /// Tokens found cached.
    pub prefix_hit_tokens: u64,
    /// Cached pages evicted to satisfy an allocation.
    pub evictions: u64,
    /// Copy-on-write copies reported.
    pub cow_copies: u64,
    /// Pages copied device → host by swap out (pages shared with content already on the host
    /// are not counted).
    pub swap_out_pages: u64,
    /// Pages moved host → device by swap in (copies; prefix hits are not counted).
    pub swap_in_pages: u64,
    /// Pages inserted into the prefix index.
    pub pages_registered: u64,
    /// Times the prefix index was cleared.
    pub index_clears: u64,
    /// Cached device pages copied to the host tier on eviction.
    pub demotions: u64,
    /// Host-tier pages copied back to the device on a prefix hit, pin or prefetch.
    pub promotions: u64,
    /// Of those, promoted by prefetch hints.
    pub prefetched: u64,
    /// Cached host pages evicted.
    pub host_evictions: u64,
    /// Prefix-hit tokens served from the host tier (promoted).
    pub host_hit_tokens: u64,
    /// Events dropped because nobody drained the queue.
    pub events_dropped: u64,
    /// Pages that filled up with content already cached elsewhere and were switched to the
    /// cached copy (duplicate freed; `skip_cached_writes` mode).
    pub dedup_pages: u64,
    /// Prefix hits that ended inside a cached page (`match_unit` below the page size): each
    /// queued one partial-page copy.
    pub unit_hits: u64,
    /// Tokens those hits copied (also counted in `prefix_hit_tokens`).
    pub unit_hit_tokens: u64,
}

/// Cumulative counters of one group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCounters {
    /// Pages registered in the group's device index.
    pub stored: u64,
    /// Registered device pages of the group evicted for reuse.
    pub evictions: u64,
    /// Pages released because they fell out of the group's window (or state).
    pub released: u64,
}

/// One group's share of the cache (and its pool's totals), a consistent snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// The group's pool.
    pub pool: u32,
    /// Bytes of one page of the group.
    pub page_bytes: u64,
    /// Device pages of that pool, the padding page included.
    pub pool_pages_total: u64,
    /// Unreferenced device pages of the pool, cached ones included (vLLM's
    /// `get_num_free_blocks`).
    pub pool_pages_free: u64,
    /// Referenced device pages of the pool (all its groups).
    pub pool_pages_in_use: u64,
    /// Non-null entries of this group's device tables over all sequences (a page shared by k
    /// sequences counts k times).
    pub pages_held: u64,
    /// Distinct pages this group's device tables hold.
    pub pages_distinct: u64,
    /// Entries of this group's device index.
    pub pages_registered: u64,
    /// Entries of this group's host index.
    pub host_pages_registered: u64,
    /// Cumulative counters.
    pub counters: GroupCounters,
}

/// A consistent snapshot of the cache, taken under its lock. Page figures are totals over the
/// cache's pools (one pool unless groups have different page bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Device pages, padding page included.
    pub device_pages_total: u64,
    /// Device pages on the free list.
    pub device_pages_free: u64,
    /// Unreferenced device pages kept for prefix hits (evictable).
    pub device_pages_cached: u64,
    /// Device pages with refcount > 0.
    pub device_pages_in_use: u64,
    /// Device pages with refcount > 1.
    pub device_pages_shared: u64,
    /// Device pages held by a pin.
    pub device_pages_pinned: u64,
    /// Host pages.
    pub host_pages_total: u64,
    /// Host pages on the free list.
    pub host_pages_free: u64,
    /// Unreferenced host pages holding demoted or swapped-out content still indexed (evictable).
    pub host_pages_cached: u64,
    /// Host pages with refcount > 0.
    pub host_pages_in_use: u64,
    /// Device pages registered in the prefix index (in use or cached).
    pub index_pages: u64,
    /// Host pages registered in the host tier's index.
    pub host_index_pages: u64,
    /// Live sequences (both tiers).
    pub num_seqs: u64,
    /// Sequences currently swapped out to host.
    pub num_seqs_swapped: u64,
    /// Tokens of device-resident sequences, as if each held its own copy.
    pub logical_tokens: u64,
    /// Token slots of device pages in use (`device_pages_in_use * page_size`).
    pub physical_tokens: u64,
    /// Bytes of K+V per page over all layers of group 0.
    pub page_bytes: u64,
    /// Queued page copies waiting for `take_copies`.
    pub pending_copies: u64,
    /// Queued events waiting for `take_events`.
    pub pending_events: u64,
    /// Event counters.
    pub counters: Counters,
}
