//! `kvs_pages_*` / `kvs_page_get_info`: page-level allocation and refcounts (vLLM's BlockPool,
//! ATB's KVCacheManager), for engines that keep their own block tables. Each call works on the
//! pool of one group (`group`, 0 in a cache of one group).

use super::cache::{cache, kvs_cache};
use super::enums::decode;
use super::enums::{kvs_page_state, kvs_status, kvs_tier};
use super::panic::guard;
use super::slice::{slice, slice_mut, try_out};

use crate::error::Error;
use kvshare_core::Tier;

/// What `kvs_page_get_info` reports about one page.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvs_page_info {
    /// Holders (sequences plus external acquires).
    pub refcount: u32,
    /// A `kvs_page_state` value.
    pub state: u32,
    /// Whether the page has a prefix-index entry (for any group of its pool).
    pub registered: bool,
}

impl kvs_cache {
    /// Allocates `num_pages` device pages of group `group`'s pool, all or nothing, each at
    /// refcount 1 held by the caller. Takes free pages first, then evicts least-recently-used
    /// cached pages. O(1) per page.
    ///
    /// **Ownership:** release each page with `kvs_pages_release` (same group).
    /// **Failure:** `KVS_STATUS_NO_SPACE` if free plus evictable pages are fewer than
    /// `num_pages`; `KVS_STATUS_BUFFER_TOO_SMALL` if `pages_len < num_pages`;
    /// `KVS_STATUS_INVALID_ARGUMENT` for a `group` not below the group count. Nothing is
    /// allocated and `pages_out` is untouched on error.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_pages_alloc(
        cache: *mut kvs_cache,
        group: usize,
        num_pages: usize,
        pages_out: *mut u32,
        pages_len: usize,
    ) -> kvs_status {
        // SAFETY: `cache` and `pages_out` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = slice_mut(pages_out, pages_len, "pages_out")?;
            if out.len() < num_pages {
                return Err(Error::Cache(kvshare_core::Error::BufferTooSmall {
                    what: "pages_out",
                    needed: num_pages,
                    capacity: out.len(),
                }));
            }
            let pages = c.lock()?.alloc_pages(group, num_pages)?;
            out[..pages.len()].copy_from_slice(&pages);
            Ok(())
        })
    }

    /// Adds one reference to each listed device page of group `group`'s pool (a page may appear
    /// several times). Pages must be in use or cached; acquiring a cached page makes it
    /// unevictable until released.
    ///
    /// **Failure:** `group` not below the group count, an out-of-range id, the padding page, or
    /// a free page: an error status naming the argument or page, and no refcount changes.
    /// `KVS_STATUS_REFCOUNT_OVERFLOW` when a page would pass `UINT32_MAX` references (counting
    /// each time it is listed): the count never wraps, and nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_pages_acquire(
        cache: *mut kvs_cache,
        group: usize,
        pages: *const u32,
        num_pages: usize,
    ) -> kvs_status {
        // SAFETY: `cache` and `pages` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let p = slice(pages, num_pages, "pages")?;
            Ok(c.lock()?.acquire_pages(group, p)?)
        })
    }

    /// Drops one caller-held reference from each listed device page of group `group`'s pool, in
    /// order. A page that reaches refcount 0 becomes cached (LRU tail) if registered in the
    /// prefix index, else free. Pass a request's pages last-first so its deepest pages are
    /// evicted first.
    ///
    /// **Failure:** releasing a page more times than the caller acquired it (double free) is
    /// `KVS_STATUS_REFCOUNT_UNDERFLOW`; a `group` not below the group count, out-of-range ids
    /// and the padding page are errors too. On any error no refcount changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_pages_release(
        cache: *mut kvs_cache,
        group: usize,
        pages: *const u32,
        num_pages: usize,
    ) -> kvs_status {
        // SAFETY: `cache` and `pages` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let p = slice(pages, num_pages, "pages")?;
            Ok(c.lock()?.release_pages(group, p)?)
        })
    }

    /// Reports the refcount, state and registration of page `page` of group `group`'s pool in
    /// `tier` (a `kvs_tier`).
    ///
    /// **Failure:** bad tier, `group` not below the group count, out-of-range id, a NULL or
    /// misaligned `info_out`; `*info_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_page_get_info(
        cache: *const kvs_cache,
        tier: u32,
        group: usize,
        page: u32,
        info_out: *mut kvs_page_info,
    ) -> kvs_status {
        // SAFETY: `cache` and `info_out` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let tier: Tier = decode::<kvs_tier>(tier, "tier")?.into();
            let out = try_out(info_out, "info_out")?;
            let (refcount, state, registered) = c.lock()?.page_info(tier, group, page)?;
            let state = kvs_page_state::from(state) as u32;
            *out = kvs_page_info {
                refcount,
                state,
                registered,
            };
            Ok(())
        })
    }
}
