//! `kvs_prefix_*`: the prefix index at page level.

use super::cache::{cache, kvs_cache};
use super::panic::guard;
use super::slice::{opt_out, slice, slice_mut};
use super::status::kvs_status;
use super::types::{extra_from_c, kvs_extra_keys};
use crate::core::Error;

impl kvs_cache {
    /// Registers the full pages of a token sequence in the prefix index: `pages[i]` (held by the
    /// caller) holds the KV of tokens `[i*page_size, (i+1)*page_size)`. Pages whose content is
    /// already cached in another page, already registered pages, and pages with a negative
    /// (placeholder) token — and all after it — are skipped. `extra` may be NULL. Writes the
    /// number of newly registered pages to `*registered_out` (optional).
    ///
    /// **Failure:** more pages than full token pages, a free, padding or out-of-range page, or
    /// prefix caching disabled: an error status and nothing registered.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_prefix_register(
        cache: *mut kvs_cache,
        tokens: *const i32,
        num_tokens: usize,
        pages: *const u32,
        num_pages: usize,
        extra: *const kvs_extra_keys,
        registered_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let p = slice(pages, num_pages, "pages")?;
            let x = extra_from_c(extra)?;
            let out = opt_out(registered_out, "registered_out")?;
            let n = c.lock()?.register(t, p, x.as_ref())?;
            if let Some(o) = out {
                *o = n;
            }
            Ok(())
        })
    }

    /// Finds the longest cached prefix of `tokens` (whole pages, at most `max_tokens` tokens;
    /// pass `SIZE_MAX` for no limit, or `num_tokens - 1` so the last token is recomputed for its
    /// logits). Matching is exact: each page's tokens and extra keys are compared, and earlier
    /// pages are tied in by a 128-bit xxh3 chain digest. Writes the page ids to `pages_out`,
    /// their count to `*num_pages_out` and the matched token count to `*matched_tokens_out`.
    /// With `acquire`, each returned page gets one caller-held reference (release it with
    /// `kvs_pages_release`) and the lookup counts in the hit-rate stats; without, the pages may be
    /// evicted by any later allocation.
    ///
    /// **Failure:** `KVS_STATUS_BUFFER_TOO_SMALL` if `pages_len` is below the match length; all
    /// outputs untouched and nothing acquired on error.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_prefix_match(
        cache: *mut kvs_cache,
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
        guard(|| {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let out = slice_mut(pages_out, pages_len, "pages_out")?;
            let n_out = opt_out(num_pages_out, "num_pages_out")?;
            let tok_out = opt_out(matched_tokens_out, "matched_tokens_out")?;
            let mut st = c.lock()?;
            let probe = st.match_prefix(t, x.as_ref(), max_tokens, false);
            if probe.pages.len() > out.len() {
                return Err(Error::BufferTooSmall {
                    what: "pages_out",
                    needed: probe.pages.len(),
                    capacity: out.len(),
                });
            }
            if acquire {
                st.acquire_match(&probe, t.len());
            }
            let m = probe;
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

    /// Drops every prefix-index entry (e.g. after a weight update or for `reset_prefix_cache`).
    /// Cached pages become free; pages in use stay with their holders. Works at any time.
    ///
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_prefix_clear(cache: *mut kvs_cache) -> kvs_status {
        guard(|| {
            self::cache(cache)?.lock()?.clear_index();
            Ok(())
        })
    }
}
