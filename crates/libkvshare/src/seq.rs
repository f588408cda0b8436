//! `kvs_seq_*`: sequences, one call per request per step (MindIE's BlockSpaceManager, vLLM's
//! KVCacheManager).

use super::cache::{cache, kvs_cache};
use super::enums::{kvs_status, kvs_tier};
use super::panic::guard;
use super::slice::{opt_out, slice, slice_mut, try_out};

use super::types::{extra_from_c, kvs_copy, kvs_extra_keys};
use crate::error::Error;
use kvshare_core::{BeginInfo, PageCopy, SeqInfo, State};

/// A sequence's shape (`kvs_seq_begin`, `kvs_seq_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_seq_info {
    /// Tokens in the sequence (prompt plus appended).
    pub num_tokens: u64,
    /// Positions in each group's block table (may exceed what the tokens need by reserved
    /// lookahead slots; released positions count).
    pub num_pages: u64,
    /// Prompt tokens found cached at `kvs_seq_begin`, at most `max_match_tokens`: the engine skips
    /// computing them. A multiple of the page size, unless `max_match_tokens` cut into a cached
    /// page (with `skip_cached_writes` that page is still shared and its slots hidden) or the hit
    /// ended inside a cached page at a `match_unit` boundary (its units are copied into the
    /// sequence's first new page: a partial copy queued for `kvs_cache_take_copies`).
    pub matched_tokens: u64,
    /// Pages newly allocated at `kvs_seq_begin` for tokens to compute, all groups together (0 in
    /// `kvs_seq_get_info`).
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
///
/// # Safety
/// The exports' contract: `cache` is NULL or a live cache; `copies_out` NULL or valid for
/// `copies_len` writes of `kvs_copy`; `num_copies_out` NULL or valid for a write of one `usize`.
unsafe fn with_copies(
    cache: *mut kvs_cache,
    copies_out: *mut kvs_copy,
    copies_len: usize,
    num_copies_out: *mut usize,
    op: impl FnOnce(&mut State, &mut Vec<PageCopy>, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    // SAFETY: the caller's contract above, which is what `cache`, `slice_mut` and `try_out` ask.
    let (c, out, n_out) = unsafe {
        (
            self::cache(cache)?,
            slice_mut(copies_out, copies_len, "copies_out")?,
            try_out(num_copies_out, "num_copies_out")?,
        )
    };
    let mut copies = Vec::new();
    op(&mut *c.lock()?, &mut copies, out.len())?;
    for (dst, src) in out.iter_mut().zip(&copies) {
        *dst = kvs_copy::from(*src);
    }
    *n_out = copies.len();
    Ok(())
}

/// A begin's `kvs_seq_info` (device-resident), when the caller asked for it.
pub(crate) fn write_begin_info(out: Option<&mut kvs_seq_info>, num_tokens: usize, b: &BeginInfo) {
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
}

/// Number of retention priorities: `kvs_seq_set_priority` takes 0 ..= `KVS_NUM_PRIORITIES - 1`.
pub const KVS_NUM_PRIORITIES: u32 = 4;
const _: () = assert!(KVS_NUM_PRIORITIES == kvshare_core::pool::PRIORITIES as u32);

impl kvs_cache {
    /// Starts sequence `seq_id` (chosen by the caller, unique among live sequences) with its
    /// prompt (vLLM: its computed plus this step's scheduled tokens): matches the longest cached
    /// prefix every group can serve (whole pages, at most `max_match_tokens` tokens: `SIZE_MAX`
    /// for no limit, `num_tokens - 1` to recompute the last token; with `match_unit`, a hit may
    /// go on inside a page), shares those pages, and allocates pages for the rest and
    /// `lookahead_slots` more slots (speculative decoding); full new pages are registered for
    /// later prompts (at `kvs_cache_commit` with `defer_commit`). `extra` may be NULL. Writes
    /// what happened to `*info_out` (optional).
    ///
    /// With an EAGLE group (`KVS_GROUP_EAGLE`) the begin does not drop a page itself: find the
    /// hit with `kvs_prefix_find` (which drops it) and pass it as `max_match_tokens`, as vLLM's
    /// `allocate_slots` takes the blocks `get_computed_blocks` found.
    ///
    /// Each group's table gets `KVS_NULL_PAGE` where the group no longer reads at the hit
    /// (`kvs_prefix_find` shows the hit), the hit's pages, and fresh pages; a state group takes
    /// one page in modes none and align (at the table's end), a page per position after the hit
    /// in mode all. Hit pages found in the host tier are promoted (copies queued for
    /// `kvs_cache_take_copies`).
    ///
    /// An empty prompt (`num_tokens` 0; `tokens` may then be NULL) is valid: the sequence starts
    /// with no token and no page, matches nothing, and gets its pages from later appends (an
    /// engine that reserves a request's id before its prompt is known).
    ///
    /// **Failure:** `KVS_STATUS_SEQ_EXISTS`, `KVS_STATUS_NO_SPACE` (a pool's free + evictable
    /// pages below the fresh pages, promotions and evictable hit pages, vLLM's admission check;
    /// or the hit ends at a state checkpoint registered since the last `kvs_cache_new_step`),
    /// `KVS_STATUS_INVALID_ARGUMENT` (`num_tokens + lookahead_slots` overflows, or lookahead
    /// slots with a state group in mode align), `KVS_STATUS_REFCOUNT_OVERFLOW` (a cached page to
    /// share already has `UINT32_MAX` holders), `KVS_STATUS_OUT_OF_MEMORY` (the prompt could not
    /// be copied): nothing changes and `*info_out` is untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn kvs_seq_begin(
        cache: *mut kvs_cache,
        seq_id: u64,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_match_tokens: usize,
        lookahead_slots: usize,
        info_out: *mut kvs_seq_info,
    ) -> kvs_status {
        // SAFETY: the export contract is `kvs_seq_begin_computed`'s, which checks every argument;
        // no token computed elsewhere is its `kvs_seq_begin`.
        unsafe {
            Self::kvs_seq_begin_computed(
                cache,
                seq_id,
                tokens,
                num_tokens,
                extra,
                max_match_tokens,
                lookahead_slots,
                0,
                info_out,
            )
        }
    }

    /// `kvs_seq_begin` of a sequence whose first `computed_tokens` tokens have KV once the call
    /// returns, the hit's and those the engine writes from elsewhere (vLLM's KV connectors load
    /// the tokens after the hit into the sequence's slots; `tokens` may stop at the hit and
    /// `lookahead_slots` hold the loaded ones). Each group's table gets `KVS_NULL_PAGE` wherever
    /// the group no longer reads at `computed_tokens`: a sliding window or a chunk takes no page
    /// for the positions it drops (vLLM's `allocate_new_computed_blocks`), and the admission
    /// check counts only the pages that remain. `computed_tokens` at most the hit is
    /// `kvs_seq_begin`; a group whose window leaves a unit hit's page (`match_unit`) behind
    /// takes no copy of it.
    ///
    /// **Failure:** as `kvs_seq_begin`; also `KVS_STATUS_INVALID_ARGUMENT` for
    /// `computed_tokens` past `num_tokens + lookahead_slots`, or nonzero on a cache with a
    /// state group: nothing changes and `*info_out` is untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn kvs_seq_begin_computed(
        cache: *mut kvs_cache,
        seq_id: u64,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_match_tokens: usize,
        lookahead_slots: usize,
        computed_tokens: usize,
        info_out: *mut kvs_seq_info,
    ) -> kvs_status {
        // SAFETY: `cache`, `tokens`, `extra` and `info_out` are NULL or valid for the call (the
        // export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let out = opt_out(info_out, "info_out")?;
            let b = c.lock()?.begin_computed(
                seq_id,
                t,
                x,
                max_match_tokens,
                lookahead_slots,
                computed_tokens,
            )?;
            write_begin_info(out, num_tokens, &b);
            Ok(())
        })
    }

    /// Appends `num_tokens` tokens to a device-resident sequence and grows every group's table to
    /// the pages `num_tokens + lookahead_slots` more slots need (speculative decoding; groups in
    /// order, vLLM's `allocate_new_blocks`). Pages that fill up are registered. Writing into a
    /// page shared with another sequence (after `kvs_seq_fork`) first moves this sequence to a
    /// private copy: the copy is written to `copies_out` (at most one per group) and the count to
    /// `*num_copies_out`; execute them before the KV write.
    ///
    /// A state group in mode align takes at most one page (the new last position, nulls before
    /// it) and keeps the previous step's state page (the new state is computed from it); when it
    /// grows, it first releases its state page of two steps ago, as vLLM's `allocate_slots` does
    /// at its start, and that page counts as available for the new one. In mode none its one
    /// page moves to the new last position. Pages other groups no longer read are released by
    /// `kvs_seq_release_skipped` only.
    ///
    /// **Failure:** unknown sequence, swapped-out sequence (`KVS_STATUS_SEQ_WRONG_TIER`),
    /// `KVS_STATUS_NO_SPACE`, `copies_len` too small, `KVS_STATUS_INVALID_ARGUMENT` (an
    /// overflowing token count, or lookahead slots with a state group in mode align): nothing
    /// changes, nothing is released, outputs untouched.
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
        // SAFETY: `cache`, `tokens`, `copies_out` and `num_copies_out` are NULL or valid for the
        // call (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
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
        // SAFETY: `cache`, `tokens`, `copies_out`, `num_copies_out`, `pages_out` and
        // `num_pages_out` are NULL or valid for the call (the export contract); the helpers refuse
        // NULL and misalignment.
        guard(|| unsafe {
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
    /// copies (at most one per sequence and group) go to `copies_out`, their count to
    /// `*num_copies_out`.
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
        // SAFETY: `cache`, `seq_ids`, `tokens`, `copies_out` and `num_copies_out` are NULL or valid
        // for the call (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
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

    /// Creates sequence `child_id` sharing every page of `parent_id` in every group (beam search,
    /// n > 1 sampling). Later writes into a shared partial page copy it on write (a state
    /// group's running state is copied whole).
    ///
    /// **Failure:** unknown or swapped-out parent, existing child: nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_fork(
        cache: *mut kvs_cache,
        parent_id: u64,
        child_id: u64,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: `cache` is NULL or a live handle (the export contract); `cache()` refuses
            // NULL.
            Ok(unsafe { self::cache(cache) }?
                .lock()?
                .fork(parent_id, child_id)?)
        })
    }

    /// Ends a sequence and releases its pages: groups in order, each table from its last
    /// position (vLLM's `free`). Full registered pages stay cached for later prompts until
    /// evicted.
    ///
    /// **Failure:** `KVS_STATUS_SEQ_NOT_FOUND` (also for a second free of the same id).
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_free(cache: *mut kvs_cache, seq_id: u64) -> kvs_status {
        // SAFETY: `cache` is NULL or a live handle (the export contract); `cache()` refuses NULL.
        guard(|| Ok(unsafe { self::cache(cache) }?.lock()?.free(seq_id)?))
    }

    /// Ends a sequence as vLLM 0.32's scheduler ends a request whose free it deferred
    /// (`pop_blocks_for_free`, then `block_pool.free_blocks` of that list reversed): its
    /// pages are released as one list, from the last group's last position to the first
    /// group's first, and each pool places the pages this frees in one go: with
    /// `vllm_uncached_first`, those with cached content to the back of the reuse order in list
    /// order, the others to its front keeping theirs; otherwise each where `kvs_seq_free` sends
    /// a full-attention group's page. No group kind's own free rule applies. On a cache of one
    /// full-attention group this is `kvs_seq_free`; everything else is as there.
    ///
    /// **Failure:** `KVS_STATUS_SEQ_NOT_FOUND` (also for a second free of the same id).
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_free_deferred(
        cache: *mut kvs_cache,
        seq_id: u64,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: `cache` is NULL or a live handle (the export contract); `cache()` refuses
            // NULL.
            Ok(unsafe { self::cache(cache) }?
                .lock()?
                .free_deferred(seq_id)?)
        })
    }

    /// vLLM's `remove_skipped_blocks(request, num_computed_tokens)`: every group replaces the
    /// positions it no longer reads once `num_computed_tokens` tokens have KV (sliding window
    /// W: the first `max(0, c - W + 1) / page_size` pages; chunked local C: the pages before
    /// `c / C * C`; a state group in mode all or align: the pages before `(c - 1) / page_size`,
    /// and in align also the previous step's state page once `c` moved past it; full attention
    /// and state mode none: none) by `KVS_NULL_PAGE`, from the last such position down to the
    /// first one already null, and returns those pages to their pool: pages with cached content
    /// to the back of the reuse order (still matchable), the others to its front. vLLM calls it
    /// before its admission check and does not undo it when the allocation fails, hence a call
    /// of its own. `num_computed_tokens` past the table is capped to it. Writes the number of
    /// pages released to `*num_released_out` (optional). A cache of one full-attention group
    /// releases nothing.
    ///
    /// **Failure:** unknown sequence (`KVS_STATUS_SEQ_NOT_FOUND`), swapped-out sequence
    /// (`KVS_STATUS_SEQ_WRONG_TIER`), a misaligned `num_released_out`: nothing changes,
    /// `*num_released_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_release_skipped(
        cache: *mut kvs_cache,
        seq_id: u64,
        num_computed_tokens: usize,
        num_released_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache` and `num_released_out` are NULL or valid for the call (the export
        // contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = opt_out(num_released_out, "num_released_out")?;
            let n = c.lock()?.release_skipped(seq_id, num_computed_tokens)?;
            if let Some(o) = out {
                *o = n;
            }
            Ok(())
        })
    }

    /// Tells the cache that the KV of the sequence's first `num_computed_tokens` tokens is
    /// written. A sequence's tokens count as computed until this is called for it; from then on
    /// only its full pages within its first `num_computed_tokens` tokens become prefix hits (at
    /// the next `kvs_cache_commit` with `defer_commit`), are stored to the pool tier, or are
    /// shared by content when it is swapped: the content of its other pages is not final. For an
    /// engine that gives kvshare a whole prompt and computes it a chunk per step (MindIE's
    /// chunked prefill), so that no other request reads KV not written yet. Pages registered
    /// before stay registered.
    ///
    /// **Failure:** unknown sequence (`KVS_STATUS_SEQ_NOT_FOUND`), `num_computed_tokens` above
    /// the tokens the sequence holds (`KVS_STATUS_INVALID_ARGUMENT`): nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_set_computed(
        cache: *mut kvs_cache,
        seq_id: u64,
        num_computed_tokens: usize,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: `cache` is NULL or a live handle (the export contract); `cache()` refuses
            // NULL.
            Ok(unsafe { self::cache(cache) }?
                .lock()?
                .set_computed(seq_id, num_computed_tokens)?)
        })
    }

    /// Sets the sequence's retention boundaries: `num_boundaries` (at most
    /// `KVS_MAX_RETENTION_BOUNDARIES`) token positions a later lookup can end at. With
    /// `kvs_config.window_retention` other than `KVS_WINDOW_RETENTION_DENSE`, a sliding-window
    /// group registers only the tail of pages before each boundary (and before each segment's
    /// end); the full pages the sequence offered already that the new boundaries retain are
    /// registered by this call, so it can follow `kvs_seq_begin` at once. Pages registered
    /// before stay registered. vLLM 0.32 retains the tail before a prompt's last token
    /// (`num_prompt_tokens - 1`) and before a lookup's shared-prefix boundary when there is one.
    ///
    /// **Failure:** unknown sequence (`KVS_STATUS_SEQ_NOT_FOUND`), a swapped-out sequence
    /// (`KVS_STATUS_SEQ_WRONG_TIER`), a cache with dense window retention, more than
    /// `KVS_MAX_RETENTION_BOUNDARIES` boundaries, `boundaries` NULL with `num_boundaries` not 0
    /// (`KVS_STATUS_INVALID_ARGUMENT` / `KVS_STATUS_NULL_ARGUMENT`): nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_set_retention(
        cache: *mut kvs_cache,
        seq_id: u64,
        boundaries: *const usize,
        num_boundaries: usize,
    ) -> kvs_status {
        // SAFETY: `cache` is NULL or a live handle, `boundaries` readable for `num_boundaries`
        // values (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let b = slice(boundaries, num_boundaries, "boundaries")?;
            Ok(c.lock()?.set_retention(seq_id, b)?)
        })
    }

    /// Swaps a sequence out to host pages: one device→host copy per live page of each group's
    /// block table, groups in order, each in block-table order (`num_tokens` is the tokens held
    /// by that page; a state page's whole page), written to `copies_out`. Released positions
    /// stay released (a swapped-out table shows `UINT32_MAX` there).
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
        // SAFETY: `cache`, `copies_out` and `num_copies_out` are NULL or valid for the call (the
        // export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
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
    /// shared without a copy; every other live page of every group gets a new device page and a
    /// host→device copy in `copies_out`.
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
        // SAFETY: `cache`, `copies_out` and `num_copies_out` are NULL or valid for the call (the
        // export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
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
    /// num_tokens tokens, lookahead_slots)` would take now, all groups together (new pages plus
    /// copy-on-write copies, less the state pages an align group would release first) to
    /// `*pages_needed_out`, and the number of copies it would report to `*num_copies_out`
    /// (optional). Compare with `device_pages_free + device_pages_cached` from `kvs_cache_stats`
    /// (MindIE's `CanAppendSlot`, vLLM's admission checks). A need larger than the pools is an
    /// answer, not a failure.
    ///
    /// **Failure:** unknown or swapped-out sequence, overflowing sizes, lookahead slots with a
    /// state group in mode align (`KVS_STATUS_INVALID_ARGUMENT` naming the argument), a NULL or
    /// misaligned `pages_needed_out`; outputs untouched.
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
        // SAFETY: `cache`, `pages_needed_out` and `num_copies_out` are NULL or valid for the call
        // (the export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
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
    /// would take now (its live pages minus those still cached on the device, which it shares;
    /// all groups together) to `*pages_needed_out`, and the device pages it can have (free plus
    /// evictable, not counting the ones it would share; with several pools, each pool's room
    /// counted up to what the swap takes there, so the swap fits exactly when the first figure is
    /// at most the second) to `*pages_available_out` (optional). MindIE's `CanSwapIn`.
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
        // SAFETY: `cache`, `pages_needed_out` and `pages_available_out` are NULL or valid for the
        // call (the export contract), which is `write_need`'s contract.
        unsafe {
            write_need(cache, pages_needed_out, pages_available_out, |st| {
                Ok(st.swap_in_need(seq_id)?)
            })
        }
    }

    /// Capacity check without the swap-out: writes the host pages `kvs_seq_swap_out(seq_id)`
    /// would take now (its live pages minus the full pages whose content the host tier already
    /// holds, which it shares; all groups together) to `*pages_needed_out`, and the host pages it
    /// can have (free plus evictable, not counting the ones it would share; per pool as for
    /// `kvs_seq_swap_in_need`) to `*pages_available_out` (optional). MindIE's `CanSwapOut`.
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
        // SAFETY: `cache`, `pages_needed_out` and `pages_available_out` are NULL or valid for the
        // call (the export contract), which is `write_need`'s contract.
        unsafe {
            write_need(cache, pages_needed_out, pages_available_out, |st| {
                Ok(st.swap_out_need(seq_id)?)
            })
        }
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
        // SAFETY: `cache` is NULL or valid for the call (the export contract); the helpers refuse
        // NULL and misalignment.
        guard(|| unsafe {
            let p = u8::try_from(priority)
                .map_err(|_| Error::arg("priority", format!("{priority} is not in 0..4")))?;
            Ok(self::cache(cache)?.lock()?.set_priority(seq_id, p)?)
        })
    }

    /// Writes a sequence's shape to `*info_out` (`new_pages` and `promoted_pages` are 0).
    ///
    /// **Failure:** unknown sequence (`KVS_STATUS_SEQ_NOT_FOUND`), a NULL or misaligned
    /// `info_out`: `*info_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_get_info(
        cache: *const kvs_cache,
        seq_id: u64,
        info_out: *mut kvs_seq_info,
    ) -> kvs_status {
        // SAFETY: `cache` and `info_out` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = try_out(info_out, "info_out")?;
            *out = info_of(c.lock()?.seq_info(seq_id)?);
            Ok(())
        })
    }

    /// Copies a sequence's block table in group `group` (page ids of its tier, in the group's
    /// pool; `KVS_NULL_PAGE` at positions the group released, `UINT32_MAX` there while swapped
    /// out) to `pages_out` and its length to `*num_pages_out`.
    ///
    /// **Failure:** `group` not below the group count, unknown sequence, or `pages_len` too
    /// small (`KVS_STATUS_BUFFER_TOO_SMALL`): outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_pages(
        cache: *const kvs_cache,
        group: usize,
        seq_id: u64,
        pages_out: *mut u32,
        pages_len: usize,
        num_pages_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: `cache`, `pages_out` and `num_pages_out` are NULL or valid for the call (the
        // export contract); the helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = slice_mut(pages_out, pages_len, "pages_out")?;
            let n_out = try_out(num_pages_out, "num_pages_out")?;
            let st = c.lock()?;
            let pages = st.seq_pages(seq_id, group)?;
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

    /// Writes the page holding sequence `seq_id`'s running state in state group `group` (the
    /// last non-null entry of its block table) to `*page_out`. In mode none that is the group's
    /// only page (vLLM's block table for the group is `[page]`).
    ///
    /// **Failure:** NULL `page_out` (`KVS_STATUS_NULL_ARGUMENT`); `group` not below the group
    /// count or not a state group, a sequence with no state page yet (no token nor reserved
    /// slot): `KVS_STATUS_INVALID_ARGUMENT`; unknown sequence: `KVS_STATUS_SEQ_NOT_FOUND`; swapped-out
    /// sequence: `KVS_STATUS_SEQ_WRONG_TIER`. `*page_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_state_page(
        cache: *const kvs_cache,
        seq_id: u64,
        group: usize,
        page_out: *mut u32,
    ) -> kvs_status {
        // SAFETY: `cache` and `page_out` are NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = try_out(page_out, "page_out")?;
            *out = c.lock()?.state_page(seq_id, group)?;
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
    // SAFETY: the caller's contract above, which is what `cache`, `try_out` and `opt_out` ask.
    guard(|| unsafe {
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
