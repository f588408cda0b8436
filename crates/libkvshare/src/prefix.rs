//! `kvs_prefix_*`: the prefix index at page level: one group's index (register, match), the hit
//! every group can serve (find), and, across groups, pins, prefetch and clearing.

use super::cache::{cache, kvs_cache};
use super::enums::kvs_status;
use super::panic::guard;
use super::slice::{opt_out, slice, slice_mut, try_out};

use crate::error::Error;

use super::types::{extra_from_c, kvs_extra_keys};

impl kvs_cache {
    /// Registers the full pages of a token sequence in group `group`'s prefix index: `pages[i]`
    /// (a page of the group's pool held by the caller) holds the KV of tokens
    /// `[i*page_size, (i+1)*page_size)`. Pages whose content the group has already cached in
    /// another page, already registered pages, pages a sequence holds (the sequence registers
    /// them under its own tokens), and pages with a negative (placeholder) token — and all after
    /// it — are skipped. `extra` may be NULL. Writes the number of newly
    /// registered pages to `*registered_out` (optional).
    ///
    /// **Failure:** `group` not below the group count, more pages than full token pages, a
    /// free, padding or out-of-range page, or prefix caching disabled: an error status and
    /// nothing registered.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn kvs_prefix_register(
        cache: *mut kvs_cache,
        group: usize,
        tokens: *const i32,
        num_tokens: usize,
        pages: *const u32,
        num_pages: usize,
        extra: *const kvs_extra_keys,
        registered_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `tokens`, `pages`, `extra` and `registered_out` are NULL or valid for
        // the call (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let p = slice(pages, num_pages, "pages")?;
            let x = extra_from_c(extra)?;
            let out = opt_out(registered_out, "registered_out")?;
            let n = c.lock()?.register(group, t, p, x.as_ref())?;
            if let Some(o) = out {
                *o = n;
            }
            Ok(())
        })
    }

    /// Drops the prefix-index entries of device pages `pages` of group `group`'s pool, whichever
    /// group of that pool registered them (vLLM's `evict_blocks`: blocks a failed KV load left
    /// wrong must not be hit). A page with no entry is skipped. An unreferenced page becomes
    /// free; a held page stays with its holders and is freed, not cached, when they release it.
    /// A duplicate of a dropped page's content (another page holding the same tokens) takes its
    /// entry. Pages registered after a dropped one stay registered, found again once a page of
    /// the dropped content is registered. Emits `KVS_EVENT_KIND_REMOVED` for each entry dropped
    /// (with `enable_events`). Writes the number of entries dropped to `*removed_out`
    /// (optional).
    ///
    /// **Failure:** `group` not below the group count, an out-of-range or padding page: an
    /// error status and nothing dropped.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_prefix_unregister(
        cache: *mut kvs_cache,
        group: usize,
        pages: *const u32,
        num_pages: usize,
        removed_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `pages` and `removed_out` are NULL or valid for the call (the export
        // contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let p = slice(pages, num_pages, "pages")?;
            let out = opt_out(removed_out, "removed_out")?;
            let n = c.lock()?.unregister(group, p)?;
            if let Some(o) = out {
                *o = n;
            }
            Ok(())
        })
    }

    /// Finds the longest cached prefix of `tokens` in group `group`'s index (whole pages from the
    /// first on, at most `max_tokens` tokens; pass `SIZE_MAX` for no limit, or `num_tokens - 1`
    /// so the last token is recomputed for its logits; `kvs_prefix_find` gives the hit every
    /// group can serve). Matching is exact: each page's tokens and extra keys are compared, and
    /// earlier pages are tied in by a 128-bit xxh3 chain digest. Writes the page ids to
    /// `pages_out`, their count to `*num_pages_out` and the matched token count to
    /// `*matched_tokens_out`.
    /// With `acquire`, each returned page gets one caller-held reference (release it with
    /// `kvs_pages_release`), pages found only in the host tier are promoted to new device pages
    /// as far as device room allows (their copies are queued: `kvs_cache_take_copies`), and the
    /// lookup counts in the hit-rate stats. Without, it is a pure lookup of the device tier and
    /// the pages may be evicted by any later allocation.
    ///
    /// **Failure:** `KVS_STATUS_BUFFER_TOO_SMALL` if `pages_len` is below the match length;
    /// `KVS_STATUS_INVALID_ARGUMENT` for a `group` not below the group count;
    /// `KVS_STATUS_REFCOUNT_OVERFLOW` with `acquire` when a page already has `UINT32_MAX`
    /// holders: all outputs untouched and nothing acquired on error.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn kvs_prefix_match(
        cache: *mut kvs_cache,
        group: usize,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_tokens: usize,
        acquire: bool,
        pages_out: *mut u32,
        pages_len: usize,
        num_pages_out: *mut usize,
        matched_tokens_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `tokens`, `extra`, `pages_out`, `num_pages_out` and `matched_tokens_out`
        // are NULL or valid for the call (the export contract); the helpers refuse NULL and
        // misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let out = slice_mut(pages_out, pages_len, "pages_out")?;
            let n_out = opt_out(num_pages_out, "num_pages_out")?;
            let tok_out = opt_out(matched_tokens_out, "matched_tokens_out")?;
            let m = c
                .lock()?
                .match_prefix(group, t, x.as_ref(), max_tokens, acquire, out.len())?;
            out[..m.pages.len()].copy_from_slice(&m.pages);
            if let Some(o) = n_out {
                *o = m.pages.len();
            }
            if let Some(o) = tok_out {
                *o = m.tokens;
            }
            Ok(())
        })
    }

    /// The longest prefix hit of `tokens` every group can serve, at most `max_tokens` tokens
    /// (vLLM's `get_computed_blocks`: pass `num_tokens - 1`), in the device tier: what
    /// `kvs_seq_begin` would share (before the same-step rule of state groups). Read-only:
    /// nothing is held, promoted or counted, and the pages may be evicted by any later
    /// allocation. Writes the hit N to `*matched_tokens_out` and, when `pages_out` is not NULL,
    /// row `g` of `pages_out` (row-major `[num_groups, max_pages_per_group]`) gets group `g`'s
    /// `N / page_size` pages: its hit pages, `KVS_NULL_PAGE` at positions it no longer reads;
    /// entries after them are left as they were. `pages_out` may be NULL with `pages_len` 0
    /// (the hit length only). N is whole pages, plus, with `match_unit` below `page_size`, the
    /// whole units `kvs_seq_begin` would copy into the first new page from a cached page no
    /// sequence holds (device or host tier): an engine's scheduler learns the sub-page hit
    /// before it allocates. With an EAGLE group (`KVS_GROUP_EAGLE`) the hit has dropped its last
    /// page (vLLM's `drop_eagle_block`, in every group of the group's kind and page size); a
    /// `kvs_seq_begin` capped at it takes it, page for page.
    ///
    /// **Failure:** NULL `cache`, `tokens` with `num_tokens` above 0, `pages_out` with
    /// `pages_len` above 0 or `matched_tokens_out`; misaligned pointers, a `num_groups *
    /// max_pages_per_group` that overflows (`KVS_STATUS_INVALID_ARGUMENT`), with `pages_out`:
    /// `pages_len` below `num_groups * max_pages_per_group`, or a hit longer than
    /// `max_pages_per_group` pages (`KVS_STATUS_BUFFER_TOO_SMALL`). Nothing is written.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn kvs_prefix_find(
        cache: *const kvs_cache,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_tokens: usize,
        pages_out: *mut u32,
        pages_len: usize,
        max_pages_per_group: usize,
        matched_tokens_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `tokens`, `extra`, `pages_out` and `matched_tokens_out` are NULL or
        // valid for the call (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let pages = slice_mut(pages_out, pages_len, "pages_out")?;
            let out = try_out(matched_tokens_out, "matched_tokens_out")?;
            let mut st = c.lock()?;
            let rows = st.num_groups();
            let want = rows
                .checked_mul(max_pages_per_group)
                .ok_or_else(|| Error::arg("max_pages_per_group", "overflows size_t"))?;
            let with_pages = !pages_out.is_null();
            if with_pages && pages.len() < want {
                return Err(Error::buffer("pages_out", want, pages.len()));
            }
            let (hit, found) = st.find_hit(t, x.as_ref(), max_tokens);
            if with_pages {
                let n = found.first().map_or(0, Vec::len);
                if n > max_pages_per_group {
                    return Err(Error::buffer("pages_out", n, max_pages_per_group));
                }
                for (g, f) in found.iter().enumerate() {
                    pages[g * max_pages_per_group..][..n].copy_from_slice(f);
                }
            }
            *out = hit;
            Ok(())
        })
    }

    /// Pins the cached prefix of `tokens` every group can serve (whole pages; every group's pages
    /// of the hit, as `kvs_prefix_find` finds it with the host tier too; pages found in the host
    /// tier are promoted first, copies queued): its pages are never evicted until
    /// `kvs_prefix_unpin(pin_id)`. Use it for a system prompt shared by every request. Writes the
    /// pin id to `*pin_id_out` and the number of pages pinned, all groups together, to
    /// `*num_pages_out` (optional; 0 if nothing of it is cached yet — pin after the first request
    /// registered it).
    ///
    /// **Failure:** `KVS_STATUS_NO_SPACE` if host pages cannot be promoted,
    /// `KVS_STATUS_REFCOUNT_OVERFLOW` if a page already has `UINT32_MAX` holders; nothing
    /// changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_prefix_pin(
        cache: *mut kvs_cache,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        pin_id_out: *mut u64,
        num_pages_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `tokens`, `extra`, `pin_id_out` and `num_pages_out` are NULL or valid
        // for the call (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let id_out = super::slice::try_out(pin_id_out, "pin_id_out")?;
            let n_out = opt_out(num_pages_out, "num_pages_out")?;
            let (id, n) = c.lock()?.pin(t, x.as_ref())?;
            *id_out = id;
            if let Some(o) = n_out {
                *o = n;
            }
            Ok(())
        })
    }

    /// Releases a pin made by `kvs_prefix_pin`; its pages become evictable again unless held
    /// otherwise.
    ///
    /// **Failure:** unknown (or already released) pin id: `KVS_STATUS_INVALID_ARGUMENT`.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_prefix_unpin(cache: *mut kvs_cache, pin_id: u64) -> kvs_status {
        // SAFETY: `cache` is NULL or a live handle (the export contract); `cache()` refuses NULL.
        guard(|| Ok(unsafe { self::cache(cache) }?.lock()?.unpin(pin_id)?))
    }

    /// Prefetch hint for a queued request: starts promoting the host-tier pages of `tokens`'
    /// cached prefix (every group's, as `kvs_prefix_pin` finds them) back to device pages (kept
    /// as cached, unreferenced pages) using only free or evictable room, so the copies (queued:
    /// `kvs_cache_take_copies`) overlap with other work and the request's `kvs_seq_begin` later
    /// finds them on the device. Promotes all of them or none. Writes the number of pages
    /// promoted to `*promoted_out` (optional).
    ///
    /// **Failure:** NULL `cache`, bad `tokens` or `extra`, a misaligned `promoted_out`: nothing
    /// changes, `*promoted_out` untouched.
    ///
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_prefix_prefetch(
        cache: *mut kvs_cache,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        promoted_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `tokens`, `extra` and `promoted_out` are NULL or valid for the call (the
        // export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let out = opt_out(promoted_out, "promoted_out")?;
            let n = c.lock()?.prefetch(t, x.as_ref());
            if let Some(o) = out {
                *o = n;
            }
            Ok(())
        })
    }

    /// Drops every prefix-index entry of both tiers, every group (e.g. after a weight update or
    /// for `reset_prefix_cache`). Cached pages become free; pages in use or pinned stay with
    /// their holders. The freed pages join the free list's tail in eviction order (oldest
    /// first), behind the pages already free, so the order pages are handed out in is the one
    /// they would have been evicted in (vLLM's reset keeps its free queue the same way).
    /// Works at any time.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `cache`, `KVS_STATUS_POISONED` after a
    /// panic inside the library: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_prefix_clear(cache: *mut kvs_cache) -> kvs_status {
        // SAFETY: `cache` is NULL or valid for the call (the export contract); the helpers refuse
        // NULL and misalignment.
        guard(|| unsafe {
            self::cache(cache)?.lock()?.clear_index();
            Ok(())
        })
    }
}
