//! `kvs_cache_take_copies` / `kvs_cache_take_events`: draining the queues the cache fills while
//! it demotes, promotes and (un)registers pages.

use super::cache::{cache, kvs_cache};
use super::enums::{kvs_event_kind, kvs_status, kvs_tier};
use super::panic::guard;
use super::slice::{slice_mut, try_out};

use super::types::kvs_copy;
use kvshare_core::Event;

/// One prefix-index change of one group. Hashes are the chain digests `h_i` described in
/// docs/design.md ("Prefix keys"), as two 64-bit halves; a router recomputes them from token ids
/// alone.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_event {
    /// A `kvs_event_kind` value.
    pub kind: u32,
    /// A `kvs_tier` value: the tier whose index changed.
    pub tier: u32,
    /// Low 64 bits of the page's chain digest (0 for Cleared).
    pub hash_lo: u64,
    /// High 64 bits of the page's chain digest.
    pub hash_hi: u64,
    /// Low 64 bits of the previous page's digest (Stored only; the root digest for a first page).
    pub parent_lo: u64,
    /// High 64 bits of the previous page's digest.
    pub parent_hi: u64,
    /// LoRA id of the sequence that stored it (Stored only).
    pub lora_id: u64,
    /// Tokens in the page (the page size; 0 for Cleared).
    pub num_tokens: u32,
    /// Page id in `tier` (0 for Cleared), in the pool of `group`.
    pub page: u32,
    /// The group whose index changed (its index in `kvs_config.groups`; 0 in a cache of one
    /// group, and for Cleared, which clears every group of the tier). vLLM's `group_idx`; the
    /// group's kind and window are `kvs_cache_group_info`'s.
    pub group: u32,
}

impl From<Event> for kvs_event {
    fn from(e: Event) -> Self {
        kvs_event {
            kind: kvs_event_kind::from(e.kind) as u32,
            tier: kvs_tier::from(e.tier) as u32,
            hash_lo: halves(e.hash).0,
            hash_hi: halves(e.hash).1,
            parent_lo: halves(e.parent).0,
            parent_hi: halves(e.parent).1,
            lora_id: e.lora_id,
            num_tokens: e.num_tokens,
            page: e.page,
            group: e.group,
        }
    }
}

/// Most events a cache queues; further events are dropped (and counted in
/// `kvs_stats.events_dropped`) until `kvs_cache_take_events` drains some.
pub const KVS_MAX_QUEUED_EVENTS: usize = 1 << 20;
const _: () = assert!(KVS_MAX_QUEUED_EVENTS == kvshare_core::events::MAX_QUEUED_EVENTS);

/// A 128-bit digest as its (low, high) 64-bit halves.
#[allow(clippy::cast_possible_truncation)] // keeping the low half is the point
pub(super) fn halves(h: u128) -> (u64, u64) {
    (h as u64, (h >> 64) as u64)
}

impl kvs_cache {
    /// Drains up to `copies_len` queued page copies, oldest first: demotions of evicted cached
    /// pages to the host tier and promotions of host-tier hits back to the device. Writes how
    /// many were taken to `*num_copies_out`; call again while it equals `copies_len`. Execute them
    /// in order, each step, before the copies returned by that step's later calls and before its
    /// KV writes (a demotion reads a page that is about to be reused). Each copy names its group
    /// (`kvs_copy.group`): run it on that group's layers.
    ///
    /// **Failure:** NULL `cache` or `num_copies_out`, NULL `copies_out` with `copies_len` above
    /// 0, a misaligned or oversized buffer: nothing is taken.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`; with several
    /// threads scheduling on one cache, drain from the thread that launches the copies.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_take_copies(
        cache: *mut kvs_cache,
        copies_out: *mut kvs_copy,
        copies_len: usize,
        num_copies_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `copies_out` and `num_copies_out` are NULL or valid for the call (the
        // export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = slice_mut(copies_out, copies_len, "copies_out")?;
            let n_out = try_out(num_copies_out, "num_copies_out")?;
            let taken = c.lock()?.take_copies(out.len());
            for (dst, src) in out.iter_mut().zip(&taken) {
                *dst = kvs_copy::from(*src);
            }
            *n_out = taken.len();
            Ok(())
        })
    }

    /// Drains up to `events_len` queued index events, oldest first (needs `enable_events` in the
    /// config; otherwise none is ever queued). Writes how many were taken to `*num_events_out`;
    /// call again while it equals `events_len`. Applying them in order to an empty set of
    /// `(tier, group, hash)` reproduces exactly the registered pages.
    ///
    /// **Failure:** NULL `cache` or `num_events_out`, NULL `events_out` with `events_len` above
    /// 0, a misaligned or oversized buffer: nothing is taken.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_take_events(
        cache: *mut kvs_cache,
        events_out: *mut kvs_event,
        events_len: usize,
        num_events_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `events_out` and `num_events_out` are NULL or valid for the call (the
        // export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = slice_mut(events_out, events_len, "events_out")?;
            let n_out = try_out(num_events_out, "num_events_out")?;
            let taken = c.lock()?.take_events(out.len());
            for (dst, src) in out.iter_mut().zip(&taken) {
                *dst = kvs_event::from(*src);
            }
            *n_out = taken.len();
            Ok(())
        })
    }
}
