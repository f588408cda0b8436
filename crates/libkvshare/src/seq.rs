//! `kvs_seq_*`: sequences, one call per request per step (MindIE's BlockSpaceManager, vLLM's
//! KVCacheManager).

use super::cache::{cache, kvs_cache};
use super::enums::{kvs_status, kvs_tier};
use super::panic::guard;
use super::slice::{opt_out, slice, slice_mut, try_out};

use super::types::{extra_from_c, kvs_copy, kvs_extra_keys};
use crate::error::Error;
use kvshare_core::{PageCopy, SeqInfo, State};

/// A sequence's shape (`kvs_seq_begin`, `kvs_seq_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_seq_info {
    /// Tokens in the sequence (prompt plus appended).
    pub num_tokens: u64,
    /// Pages in its block table (may exceed what the tokens need by reserved lookahead slots).
    pub num_pages: u64,
    /// Prompt tokens found cached at `kvs_seq_begin`, at most `max_match_tokens`: the engine skips
    /// computing them. A multiple of the page size, unless `max_match_tokens` cut into a cached
    /// page (with `skip_cached_writes` that page is still shared and its slots hidden) or the hit
    /// ended inside a cached page at a `match_unit` boundary (its units are copied into the
    /// sequence's first new page: a partial copy queued for `kvs_cache_take_copies`).
    pub matched_tokens: u64,
    /// Pages newly allocated at `kvs_seq_begin` for tokens to compute (0 in `kvs_seq_get_info`).
    pub new_pages: u64,
    /// Prefix-hit pages promoted from the host tier at `kvs_seq_begin` (0 in `kvs_seq_get_info`);
    /// their copies are queued for `kvs_cache_take_copies`.
    pub promoted_pages: u64,
    /// A `kvs_tier` value: where the pages are (host while swapped out).
    pub tier: u32,
}

fn info_of(i: SeqInfo) -> kvs_seq_info {
    kvs_seq_info {
        num_tokens: i.num_tokens as u64,
        num_pages: i.num_pages as u64,
        matched_tokens: i.matched_tokens as u64,
        new_pages: 0,
        promoted_pages: 0,
        tier: kvs_tier::from(i.tier) as u32,
    }
}

/// Runs an operation that reports page copies into a caller buffer: the core checks the room
/// before changing anything, so on error nothing is written.
unsafe fn with_copies(
    cache: *mut kvs_cache,
    copies_out: *mut kvs_copy,
    copies_len: usize,
    num_copies_out: *mut usize,
    op: impl FnOnce(&mut State, &mut Vec<PageCopy>, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    let c = self::cache(cache)?;
    let out = slice_mut(copies_out, copies_len, "copies_out")?;
    let n_out = try_out(num_copies_out, "num_copies_out")?;
    let mut copies = Vec::new();
    op(&mut *c.lock()?, &mut copies, out.len())?;
    for (dst, src) in out.iter_mut().zip(&copies) {
        *dst = kvs_copy::from(*src);
    }
    *n_out = copies.len();
    Ok(())
}

/// Number of retention priorities: `kvs_seq_set_priority` takes 0 ..= `KVS_NUM_PRIORITIES - 1`.
pub const KVS_NUM_PRIORITIES: u32 = 4;
const _: () = assert!(KVS_NUM_PRIORITIES == kvshare_core::pool::PRIORITIES as u32);

impl kvs_cache {
    /// Starts sequence `seq_id` (chosen by the caller, unique among live sequences) with its
    /// prompt: matches the longest cached prefix (whole pages, at most `max_match_tokens` tokens:
    /// `SIZE_MAX` for no limit, `num_tokens - 1` to recompute the last token), shares those pages,
    /// and allocates pages for the rest; full new pages are registered for later prompts
    /// (at `kvs_cache_commit` with `defer_commit`). `extra` may be NULL. Writes what happened to
    /// `*info_out` (optional).
    ///
    /// An empty prompt (`num_tokens` 0; `tokens` may then be NULL) is valid: the sequence starts
    /// with no token and no page, matches nothing, and gets its pages from later appends (an
    /// engine that reserves a request's id before its prompt is known).
    ///
    /// **Failure:** `KVS_STATUS_SEQ_EXISTS`, `KVS_STATUS_NO_SPACE` (free + evictable pages too
    /// few), `KVS_STATUS_REFCOUNT_OVERFLOW` (a cached page to share already has `UINT32_MAX`
    /// holders), `KVS_STATUS_OUT_OF_MEMORY` (the prompt could not be copied): nothing changes
    /// and `*info_out` is untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_begin(
        cache: *mut kvs_cache,
        seq_id: u64,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_match_tokens: usize,
        info_out: *mut kvs_seq_info,
    ) -> kvs_status {
        guard(|| {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let out = opt_out(info_out, "info_out")?;
            let b = c.lock()?.begin(seq_id, t, x, max_match_tokens)?;
            if let Some(o) = out {
                *o = kvs_seq_info {
                    num_tokens: num_tokens as u64,
                    num_pages: b.num_pages as u64,
                    matched_tokens: b.matched_tokens as u64,
                    new_pages: b.new_pages as u64,
                    promoted_pages: b.promoted_pages as u64,
                    tier: kvs_tier::Device as u32,
                };
            }
            Ok(())
        })
    }

    /// Appends `num_tokens` tokens to a device-resident sequence and keeps `lookahead_slots`
    /// more slots allocated (speculative decoding). Pages that fill up are registered. Writing
    /// into a page shared with another sequence (after `kvs_seq_fork`) first moves this sequence
    /// to a private copy: the copy is written to `copies_out` (at most 1) and its count to
    /// `*num_copies_out`; execute it before the KV write.
    ///
    /// **Failure:** unknown sequence, swapped-out sequence (`KVS_STATUS_SEQ_WRONG_TIER`),
    /// `KVS_STATUS_NO_SPACE`, or `copies_len` too small: nothing changes, outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_append(
        cache: *mut kvs_cache,
        seq_id: u64,
        tokens: *const i32,
        num_tokens: usize,
        lookahead_slots: usize,
        copies_out: *mut kvs_copy,
        copies_len: usize,
        num_copies_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let t = slice(tokens, num_tokens, "tokens")?;
            with_copies(
                cache,
                copies_out,
                copies_len,
                num_copies_out,
                |st, v, cap| Ok(st.append(seq_id, t, lookahead_slots, v, cap)?),
            )
        })
    }

    /// `kvs_seq_append`, then the block table's tail in the same call: writes the sequence's
    /// page ids from index `first_page` on to `pages_out` and their count to `*num_pages_out`.
    /// With `first_page` = the page count before the call, that is the pages the append added
    /// (what an engine keeping its own block table needs; saves a `kvs_seq_pages` call).
    ///
    /// **Failure:** as `kvs_seq_append`; also `KVS_STATUS_INVALID_ARGUMENT` when `first_page`
    /// lies past the table the append would leave and `KVS_STATUS_BUFFER_TOO_SMALL` when
    /// `pages_len` cannot hold the tail: nothing changes, outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn kvs_seq_append_pages(
        cache: *mut kvs_cache,
        seq_id: u64,
        tokens: *const i32,
        num_tokens: usize,
        lookahead_slots: usize,
        copies_out: *mut kvs_copy,
        copies_len: usize,
        num_copies_out: *mut usize,
        first_page: usize,
        pages_out: *mut u32,
        pages_len: usize,
        num_pages_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let t = slice(tokens, num_tokens, "tokens")?;
            let out = slice_mut(pages_out, pages_len, "pages_out")?;
            let n_out = try_out(num_pages_out, "num_pages_out")?;
            with_copies(
                cache,
                copies_out,
                copies_len,
                num_copies_out,
                |st, v, cap| {
                    let tail =
                        st.append_pages(seq_id, t, lookahead_slots, v, cap, first_page, out.len())?;
                    out[..tail.len()].copy_from_slice(tail);
                    *n_out = tail.len();
                    Ok(())
                },
            )
        })
    }

    /// One decode step for a whole batch: appends `tokens[i]` to `seq_ids[i]`
    /// (`num_tokens == num_seqs`, ids distinct). All or nothing across the batch. Copy-on-write
    /// copies (at most one per sequence) go to `copies_out`, their count to `*num_copies_out`.
    ///
    /// **Failure:** as `kvs_seq_append`, for any sequence of the batch: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_append_batch(
        cache: *mut kvs_cache,
        seq_ids: *const u64,
        num_seqs: usize,
        tokens: *const i32,
        num_tokens: usize,
        copies_out: *mut kvs_copy,
        copies_len: usize,
        num_copies_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let ids = slice(seq_ids, num_seqs, "seq_ids")?;
            let t = slice(tokens, num_tokens, "tokens")?;
            with_copies(
                cache,
                copies_out,
                copies_len,
                num_copies_out,
                |st, v, cap| Ok(st.append_batch(ids, t, v, cap)?),
            )
        })
    }

    /// Creates sequence `child_id` sharing every page of `parent_id` (beam search, n > 1
    /// sampling). Later writes into a shared partial page copy it on write.
    ///
    /// **Failure:** unknown or swapped-out parent, existing child: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_fork(
        cache: *mut kvs_cache,
        parent_id: u64,
        child_id: u64,
    ) -> kvs_status {
        guard(|| Ok(self::cache(cache)?.lock()?.fork(parent_id, child_id)?))
    }

    /// Ends a sequence and releases its pages (last page first). Full registered pages stay
    /// cached for later prompts until evicted.
    ///
    /// **Failure:** `KVS_STATUS_SEQ_NOT_FOUND` (also for a second free of the same id).
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_free(cache: *mut kvs_cache, seq_id: u64) -> kvs_status {
        guard(|| Ok(self::cache(cache)?.lock()?.free(seq_id)?))
    }

    /// Swaps a sequence out to host pages: one device→host copy per page of its block table, in
    /// block-table order (`num_tokens` is the tokens held by that page), written to `copies_out`.
    /// With prefix caching, a full page whose content the host tier already holds (an earlier
    /// swap-out's, or a demotion's) is shared instead: no copy, no new host page
    /// (`kvs_seq_swap_out_need` counts what it takes). Execute the copies before the device pages
    /// are reused (i.e. before the next step's KV writes).
    ///
    /// **Failure:** `KVS_STATUS_NO_SPACE` on the host tier, unknown or already swapped-out
    /// sequence, `copies_len` below the number of copies: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_swap_out(
        cache: *mut kvs_cache,
        seq_id: u64,
        copies_out: *mut kvs_copy,
        copies_len: usize,
        num_copies_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            with_copies(
                cache,
                copies_out,
                copies_len,
                num_copies_out,
                |st, v, cap| Ok(st.swap_out(seq_id, v, cap)?),
            )
        })
    }

    /// Swaps a sequence back in: full pages whose content is still cached on the device are
    /// shared without a copy; every other page gets a new device page and a host→device copy in
    /// `copies_out`.
    ///
    /// **Failure:** `KVS_STATUS_NO_SPACE` on the device tier, unknown or device-resident
    /// sequence, `copies_len` too small: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_swap_in(
        cache: *mut kvs_cache,
        seq_id: u64,
        copies_out: *mut kvs_copy,
        copies_len: usize,
        num_copies_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            with_copies(
                cache,
                copies_out,
                copies_len,
                num_copies_out,
                |st, v, cap| Ok(st.swap_in(seq_id, v, cap)?),
            )
        })
    }

    /// Capacity check without the append: writes the device pages `kvs_seq_append(seq_id,
    /// num_tokens tokens, lookahead_slots)` would take now (new pages plus copy-on-write copies)
    /// to `*pages_needed_out`, and the number of copies it would report to `*num_copies_out`
    /// (optional). Compare with `device_pages_free + device_pages_cached` from `kvs_cache_stats`
    /// (MindIE's `CanAppendSlot`, vLLM's admission checks).
    ///
    /// **Failure:** unknown or swapped-out sequence, overflowing sizes; outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`; the answer holds
    /// until the cache changes.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_append_need(
        cache: *const kvs_cache,
        seq_id: u64,
        num_tokens: usize,
        lookahead_slots: usize,
        pages_needed_out: *mut usize,
        num_copies_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let c = self::cache(cache)?;
            let pages = try_out(pages_needed_out, "pages_needed_out")?;
            let copies = opt_out(num_copies_out, "num_copies_out")?;
            let need = c.lock()?.append_need(seq_id, num_tokens, lookahead_slots)?;
            *pages = need.pages;
            if let Some(o) = copies {
                *o = need.copies;
            }
            Ok(())
        })
    }

    /// Capacity check without the swap-in: writes the device pages `kvs_seq_swap_in(seq_id)`
    /// would take now (its pages minus those still cached on the device, which it shares) to
    /// `*pages_needed_out`, and the device pages it can have (free plus evictable, not counting
    /// the ones it would share) to `*pages_available_out` (optional). MindIE's `CanSwapIn`.
    ///
    /// **Failure:** unknown or device-resident sequence; outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`; the answer holds
    /// until the cache changes.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_swap_in_need(
        cache: *const kvs_cache,
        seq_id: u64,
        pages_needed_out: *mut usize,
        pages_available_out: *mut usize,
    ) -> kvs_status {
        write_need(cache, pages_needed_out, pages_available_out, |st| {
            Ok(st.swap_in_need(seq_id)?)
        })
    }

    /// Capacity check without the swap-out: writes the host pages `kvs_seq_swap_out(seq_id)`
    /// would take now (its pages minus the full pages whose content the host tier already holds,
    /// which it shares) to `*pages_needed_out`, and the host pages it can have (free plus
    /// evictable, not counting the ones it would share) to `*pages_available_out` (optional).
    /// MindIE's `CanSwapOut`.
    ///
    /// **Failure:** unknown or swapped-out sequence; outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`; the answer holds
    /// until the cache changes.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_swap_out_need(
        cache: *const kvs_cache,
        seq_id: u64,
        pages_needed_out: *mut usize,
        pages_available_out: *mut usize,
    ) -> kvs_status {
        write_need(cache, pages_needed_out, pages_available_out, |st| {
            Ok(st.swap_out_need(seq_id)?)
        })
    }

    /// Sets a sequence's retention priority, 0 ..= 3 (default 0; higher is kept longer): once its
    /// pages are unreferenced and cached, they are evicted only after every cached page of lower
    /// priority. A page shared by several sequences keeps the highest priority given to it.
    ///
    /// **Failure:** unknown or swapped-out sequence, priority above 3: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_set_priority(
        cache: *mut kvs_cache,
        seq_id: u64,
        priority: u32,
    ) -> kvs_status {
        guard(|| {
            let p = u8::try_from(priority)
                .map_err(|_| Error::arg("priority", format!("{priority} is not in 0..4")))?;
            Ok(self::cache(cache)?.lock()?.set_priority(seq_id, p)?)
        })
    }

    /// Writes a sequence's shape to `*info_out` (`new_pages` and `promoted_pages` are 0).
    ///
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_get_info(
        cache: *const kvs_cache,
        seq_id: u64,
        info_out: *mut kvs_seq_info,
    ) -> kvs_status {
        guard(|| {
            let c = self::cache(cache)?;
            let out = try_out(info_out, "info_out")?;
            *out = info_of(c.lock()?.seq_info(seq_id)?);
            Ok(())
        })
    }

    /// Copies a sequence's block table (page ids of its tier) to `pages_out` and the count to
    /// `*num_pages_out`.
    ///
    /// **Failure:** unknown sequence or `pages_len` too small: outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_pages(
        cache: *const kvs_cache,
        seq_id: u64,
        pages_out: *mut u32,
        pages_len: usize,
        num_pages_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let c = self::cache(cache)?;
            let out = slice_mut(pages_out, pages_len, "pages_out")?;
            let n_out = try_out(num_pages_out, "num_pages_out")?;
            let st = c.lock()?;
            let pages = st.seq_pages(seq_id)?;
            if pages.len() > out.len() {
                return Err(Error::Cache(kvshare_core::Error::BufferTooSmall {
                    what: "pages_out",
                    needed: pages.len(),
                    capacity: out.len(),
                }));
            }
            out[..pages.len()].copy_from_slice(pages);
            *n_out = pages.len();
            Ok(())
        })
    }
}

/// The body of `kvs_seq_swap_in_need` / `kvs_seq_swap_out_need`: checks the out-params, asks
/// `query` under the cache's lock for `(pages needed, pages available)`, and writes them only on
/// success (`pages_available_out` is optional).
///
/// # Safety
/// The exports' contract: `cache` is NULL or a live cache; each out-param is NULL or valid for a
/// write of one `usize` (checked for NULL and alignment by `try_out` / `opt_out`).
unsafe fn write_need(
    cache: *const kvs_cache,
    pages_needed_out: *mut usize,
    pages_available_out: *mut usize,
    query: impl FnOnce(&State) -> Result<(usize, usize), Error>,
) -> kvs_status {
    guard(|| {
        let c = self::cache(cache)?;
        let need = try_out(pages_needed_out, "pages_needed_out")?;
        let avail = opt_out(pages_available_out, "pages_available_out")?;
        let state = c.lock()?;
        let (n, a) = query(&state)?;
        *need = n;
        if let Some(o) = avail {
            *o = a;
        }
        Ok(())
    })
}
