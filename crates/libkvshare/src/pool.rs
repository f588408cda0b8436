//! `kvs_pool_*`: the pool tier, a store shared by engines (Mooncake Store) behind the device
//! and host tiers. The library never talks to the store: it says what to look up, load and
//! store, and the engine side (a small runtime) moves the bytes and reports back.
//!
//! One round, per request: `kvs_pool_lookup` (the store keys after the local hit) → the
//! runtime's one batched existence query → `kvs_seq_begin_pooled` with the answer (the hits
//! become device pages that load) → `kvs_pool_take_work` → the runtime's loads →
//! `kvs_pool_done` per item → `kvs_seq_pool_loading` 0: the sequence runs, its match final in
//! `kvs_seq_get_info`. Stores come out of `kvs_pool_take_work` too, after `kvs_cache_commit`
//! (write-through) or a demotion.

use super::cache::{cache, kvs_cache, kvs_config, read_config};
use super::enums::{decode, kvs_pool_op, kvs_pool_store, kvs_status, kvs_tier};
use super::events::halves;
use super::handle;
use super::panic::guard;
use super::seq::kvs_seq_info;
use super::slice::{opt_out, slice, slice_mut, try_out, try_ref};
use super::types::{extra_from_c, kvs_extra_keys};

use crate::error::Error;
use kvshare_core::{Cache, PoolAnswer, PoolConfig, Ranks};

/// Bytes of `kvs_pool_key.key` and `kvs_pool_work.key`: the longest key (247 bytes with a
/// 128-byte namespace) and its NUL.
pub const KVS_POOL_KEY_MAX: usize = 256;
// The structs' key arrays are written `[u8; 256]`, a literal: cffi's `cdef` takes no macro as
// an array size. `key_to_c` builds them from `KVS_POOL_KEY_MAX`, so the two cannot differ.

/// The pool tier's settings (`kvs_cache_new_pooled`).
///
/// **Thread safety:** plain data; read during the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_pool_config {
    /// Deployment namespace, 1 to 128 bytes of `[A-Za-z0-9._-]`, not NUL-terminated.
    pub key_namespace: *const u8,
    /// Bytes of `key_namespace`.
    pub key_namespace_len: usize,
    /// The model and layout identity (model, revision, KV layout, quantisation): opaque, 1 to
    /// 4096 bytes. Engines share entries only when it is equal.
    pub identity: *const u8,
    /// Bytes of `identity`.
    pub identity_len: usize,
    /// Tensor-parallel rank (below `tp_size`).
    pub tp_rank: u32,
    /// Tensor-parallel size (1 or more).
    pub tp_size: u32,
    /// Pipeline-parallel rank.
    pub pp_rank: u32,
    /// Pipeline-parallel size.
    pub pp_size: u32,
    /// Prefill context-parallel rank.
    pub pcp_rank: u32,
    /// Prefill context-parallel size.
    pub pcp_size: u32,
    /// Decode context-parallel rank.
    pub dcp_rank: u32,
    /// Decode context-parallel size.
    pub dcp_size: u32,
    /// A `kvs_pool_store`: when pages are written.
    pub store: u32,
}

/// One key of a lookup (`kvs_pool_lookup`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_pool_key {
    /// Page position in the prompt.
    pub position: u64,
    /// The group.
    pub group: u32,
    /// Bytes of `key` before its NUL.
    pub key_len: u32,
    /// The store key, NUL-terminated.
    pub key: [u8; 256],
}

/// One transfer between the store and a page (`kvs_pool_take_work`), reported with
/// `kvs_pool_done`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_pool_work {
    /// What to report it under.
    pub ticket: u64,
    /// Low 64 bits of the page's chain digest `h_i` (also in the key).
    pub hash_lo: u64,
    /// High 64 bits of the chain digest.
    pub hash_hi: u64,
    /// A `kvs_pool_op`.
    pub op: u32,
    /// The group whose layers hold the KV.
    pub group: u32,
    /// A `kvs_tier`: the device for loads, the device or the host for stores.
    pub tier: u32,
    /// The page id in that tier of the group's pool.
    pub page: u32,
    /// Token ids of the page (`page_size` of them) in the caller's `tokens_out`.
    pub num_tokens: u32,
    /// Bytes of `key` before its NUL.
    pub key_len: u32,
    /// The store key, NUL-terminated.
    pub key: [u8; 256],
}

/// Pool-tier counters (`kvs_cache_pool_stats`), monotonically increasing but `pending` and
/// `queued`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvs_pool_stats {
    /// Lookups made.
    pub lookups: u64,
    /// Keys those lookups asked about.
    pub lookup_keys: u64,
    /// Keys the answers given to begins reported present.
    pub answered_hits: u64,
    /// Loads queued.
    pub loads: u64,
    /// Loads reported done.
    pub loads_ok: u64,
    /// Loads reported failed.
    pub loads_failed: u64,
    /// Prompt tokens served from the pool (loads settled before the first failure).
    pub hit_tokens: u64,
    /// Stores handed out.
    pub stores: u64,
    /// Stores reported done.
    pub stores_ok: u64,
    /// Stores reported failed.
    pub stores_failed: u64,
    /// Transfers not reported yet.
    pub pending: u64,
    /// Of those, not taken yet.
    pub queued: u64,
}

/// Copies `key` into a C key buffer. The core's keys always fit: `kvs1/` (5) + namespace
/// (128) + `/` + identity (32) + `/` + four ranks (43) + `/g` + group (2) + `/` + digest (32) =
/// 247 bytes.
fn key_to_c(key: &str) -> (u32, [u8; KVS_POOL_KEY_MAX]) {
    debug_assert!(
        key.len() < KVS_POOL_KEY_MAX,
        "pool key of {} bytes",
        key.len()
    );
    let mut out = [0u8; KVS_POOL_KEY_MAX];
    let n = key.len().min(KVS_POOL_KEY_MAX - 1);
    out[..n].copy_from_slice(&key.as_bytes()[..n]);
    (u32::try_from(n).expect("below KVS_POOL_KEY_MAX"), out)
}

impl kvs_pool_config {
    /// The core form; `InvalidConfig` for a namespace that is not UTF-8.
    ///
    /// # Safety
    /// `namespace` and `identity` NULL or valid for their lengths.
    unsafe fn core_config(&self) -> Result<PoolConfig, Error> {
        // SAFETY: the caller's contract.
        let (ns, id) = unsafe {
            (
                slice(
                    self.key_namespace,
                    self.key_namespace_len,
                    "pool.key_namespace",
                )?,
                slice(self.identity, self.identity_len, "pool.identity")?,
            )
        };
        let namespace = String::from_utf8(ns.to_vec()).map_err(|_| {
            Error::Cache(kvshare_core::Error::InvalidConfig {
                field: "pool",
                reason: "namespace is not UTF-8".into(),
            })
        })?;
        Ok(PoolConfig {
            namespace,
            identity: id.to_vec(),
            ranks: Ranks {
                tp: (self.tp_rank, self.tp_size),
                pp: (self.pp_rank, self.pp_size),
                pcp: (self.pcp_rank, self.pcp_size),
                dcp: (self.dcp_rank, self.dcp_size),
            },
            store: decode::<kvs_pool_store>(self.store, "pool.store")?.into(),
        })
    }
}

impl kvs_cache {
    /// `kvs_cache_new` with a pool tier (`pool`): full pages after a prompt's local hit can be
    /// looked up in and loaded from a store shared by engines, and pages written to it.
    ///
    /// **Ownership:** free the cache with `kvs_cache_free`. Everything is copied.
    /// **Failure:** as `kvs_cache_new`; also `KVS_STATUS_INVALID_CONFIG` naming `pool` (a
    /// namespace or identity of the wrong length or characters, a rank not below its size, a
    /// group other than full attention, prefix caching off, `KVS_POOL_STORE_ON_DEMOTION`
    /// without host pages and `demote_to_host`), `KVS_STATUS_NULL_ARGUMENT` for a NULL `pool`
    /// or a NULL namespace or identity with a length, `KVS_STATUS_INVALID_ARGUMENT` for an
    /// unknown `store`. `*cache_out` is untouched on error.
    /// **Thread safety:** safe from any thread.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_new_pooled(
        config: *const kvs_config,
        pool: *const kvs_pool_config,
        cache_out: *mut *mut kvs_cache,
    ) -> kvs_status {
        // SAFETY: every pointer is NULL or valid for the call (the export contract); the
        // helpers refuse NULL and misalignment.
        guard(|| unsafe {
            let mut cfg = read_config(config)?.to_core()?;
            cfg.pool = Some(try_ref(pool, "pool")?.core_config()?);
            let out = try_out(cache_out, "cache_out")?;
            let c = Cache::new(cfg)?;
            *out = handle::into_raw::<kvs_cache>(c);
            Ok(())
        })
    }

    /// The store keys of the full pages of a prompt after its local hit (device and host
    /// tiers; at most `max_match_tokens` tokens in all), position-major (every group of a
    /// position, then the next), written to `keys_out`; their count to `*num_keys_out` and the
    /// first position asked about to `*first_page_out`. No key: the local tiers hold every
    /// page the limit allows. Nothing is reserved: pass the store's answer to
    /// `kvs_seq_begin_pooled`.
    ///
    /// **Failure:** `KVS_STATUS_UNSUPPORTED` (no pool tier), `KVS_STATUS_BUFFER_TOO_SMALL`
    /// (more keys than `keys_len`), NULL or misaligned pointers: nothing changes (the lookup
    /// is not counted), outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn kvs_pool_lookup(
        cache: *mut kvs_cache,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_match_tokens: usize,
        keys_out: *mut kvs_pool_key,
        keys_len: usize,
        num_keys_out: *mut usize,
        first_page_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: every pointer is NULL or valid for the call (the export contract).
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let out = slice_mut(keys_out, keys_len, "keys_out")?;
            let n_out = try_out(num_keys_out, "num_keys_out")?;
            let first_out = try_out(first_page_out, "first_page_out")?;
            let look = c
                .lock()?
                .pool_lookup(t, x.as_ref(), max_match_tokens, out.len())?;
            for (dst, k) in out.iter_mut().zip(&look.keys) {
                let (len, bytes) = key_to_c(&k.key);
                *dst = kvs_pool_key {
                    position: k.position as u64,
                    group: k.group,
                    key_len: len,
                    key: bytes,
                };
            }
            *n_out = look.keys.len();
            *first_out = look.first_page;
            Ok(())
        })
    }

    /// `kvs_seq_begin` with the store's answer to a `kvs_pool_lookup` of the same prompt:
    /// `hits[i]` (0 or 1) says whether the store holds the lookup's key `i`; `first_page` is
    /// the lookup's. The run of positions from the local hit's end whose keys every group
    /// holds is matched too: those pages are loading (one `KVS_POOL_OP_LOAD` each for
    /// `kvs_pool_take_work`), held and unmatchable until reported with `kvs_pool_done`; the
    /// match ends at the first failed load. Run the sequence once `kvs_seq_pool_loading` is 0
    /// and read its final `matched_tokens` with `kvs_seq_get_info`. An answer that starts after
    /// the local hit's end loads nothing. `*info_out` as `kvs_seq_begin` (its `matched_tokens`
    /// counting the loading pages), `*pool_pages_out` the loading positions (both optional).
    ///
    /// **Failure:** as `kvs_seq_begin`; also `KVS_STATUS_UNSUPPORTED` (no pool tier),
    /// `KVS_STATUS_INVALID_ARGUMENT` (a hit byte other than 0 or 1, or `num_hits` not a whole
    /// number of positions): nothing changes, outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn kvs_seq_begin_pooled(
        cache: *mut kvs_cache,
        seq_id: u64,
        tokens: *const i32,
        num_tokens: usize,
        extra: *const kvs_extra_keys,
        max_match_tokens: usize,
        lookahead_slots: usize,
        first_page: usize,
        hits: *const u8,
        num_hits: usize,
        info_out: *mut kvs_seq_info,
        pool_pages_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: every pointer is NULL or valid for the call (the export contract).
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let t = slice(tokens, num_tokens, "tokens")?;
            let x = extra_from_c(extra)?;
            let raw = slice(hits, num_hits, "hits")?;
            let out = opt_out(info_out, "info_out")?;
            let pages_out = opt_out(pool_pages_out, "pool_pages_out")?;
            if let Some(i) = raw.iter().position(|&b| b > 1) {
                return Err(Error::arg(
                    "hits",
                    format!("entry {i} is {}, not 0 or 1", raw[i]),
                ));
            }
            let bits: Vec<bool> = raw.iter().map(|&b| b == 1).collect();
            let answer = PoolAnswer {
                first_page,
                hits: &bits,
            };
            let b = c.lock()?.begin_pooled(
                seq_id,
                t,
                x,
                max_match_tokens,
                lookahead_slots,
                Some(answer),
            )?;
            super::seq::write_begin_info(out, num_tokens, &b);
            if let Some(p) = pages_out {
                *p = b.pool_pages;
            }
            Ok(())
        })
    }

    /// Takes up to `work_len` queued transfers, oldest first, into `work_out`, and the token
    /// ids of item `i`'s page into `tokens_out[i * page_size ..]`; their count to
    /// `*num_work_out`. Loads may run at once (verify each entry's tokens and digest before
    /// reporting it done); a store reads its page as it is now (a demoted page after its
    /// demotion copy from `kvs_cache_take_copies` has run). Report each with `kvs_pool_done`.
    ///
    /// **Failure:** `KVS_STATUS_UNSUPPORTED` (no pool tier), `KVS_STATUS_BUFFER_TOO_SMALL`
    /// (`tokens_len` below `work_len * page_size`), NULL or misaligned pointers: nothing is
    /// taken, outputs untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_pool_take_work(
        cache: *mut kvs_cache,
        work_out: *mut kvs_pool_work,
        work_len: usize,
        tokens_out: *mut i32,
        tokens_len: usize,
        num_work_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: every pointer is NULL or valid for the call (the export contract).
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = slice_mut(work_out, work_len, "work_out")?;
            let toks = slice_mut(tokens_out, tokens_len, "tokens_out")?;
            let n_out = try_out(num_work_out, "num_work_out")?;
            let ps = c.config().page_size as usize;
            let needed = work_len.saturating_mul(ps);
            if toks.len() < needed {
                return Err(Error::Cache(kvshare_core::Error::BufferTooSmall {
                    what: "tokens_out",
                    needed,
                    capacity: toks.len(),
                }));
            }
            let mut s = c.lock()?;
            if s.pool_stats().is_none() {
                return Err(Error::Cache(kvshare_core::Error::Unsupported(
                    "the cache has no pool tier (kvs_cache_new_pooled)".into(),
                )));
            }
            let work = s.take_pool_work(out.len());
            drop(s);
            for (i, (dst, w)) in out.iter_mut().zip(&work).enumerate() {
                let (len, bytes) = key_to_c(&w.key);
                *dst = kvs_pool_work {
                    ticket: w.ticket,
                    hash_lo: halves(w.hash).0,
                    hash_hi: halves(w.hash).1,
                    op: kvs_pool_op::from(w.op) as u32,
                    group: w.group,
                    tier: kvs_tier::from(w.tier) as u32,
                    page: w.page,
                    num_tokens: c.config().page_size,
                    key_len: len,
                    key: bytes,
                };
                toks[i * ps..i * ps + w.tokens.len()].copy_from_slice(&w.tokens);
            }
            *n_out = work.len();
            Ok(())
        })
    }

    /// Reports transfer `ticket` (from `kvs_pool_take_work`) done (`ok`) or failed: its page
    /// reference is dropped; a sequence's last load settles it (its match ends at the first
    /// failed position, and the loaded pages before it become matchable).
    ///
    /// **Failure:** `KVS_STATUS_UNSUPPORTED` (no pool tier), `KVS_STATUS_INVALID_ARGUMENT` (a
    /// ticket never handed out by `kvs_pool_take_work`, or reported already): nothing changes.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_pool_done(
        cache: *mut kvs_cache,
        ticket: u64,
        ok: bool,
    ) -> kvs_status {
        // SAFETY: `cache` is NULL or valid for the call (the export contract).
        guard(|| unsafe {
            let c = self::cache(cache)?;
            c.lock()?.pool_done(ticket, ok)?;
            Ok(())
        })
    }

    /// Writes to `*loading_out` the loads of sequence `seq_id` not reported yet; run the
    /// sequence only at 0.
    ///
    /// **Failure:** `KVS_STATUS_SEQ_NOT_FOUND`, NULL or misaligned pointers: `*loading_out`
    /// untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_seq_pool_loading(
        cache: *const kvs_cache,
        seq_id: u64,
        loading_out: *mut usize,
    ) -> kvs_status {
        // SAFETY: every pointer is NULL or valid for the call (the export contract).
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = try_out(loading_out, "loading_out")?;
            *out = c.lock()?.pool_loading(seq_id)?;
            Ok(())
        })
    }

    /// Writes the pool tier's counters to `*stats_out`.
    ///
    /// **Failure:** `KVS_STATUS_UNSUPPORTED` (no pool tier), NULL or misaligned pointers:
    /// `*stats_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_cache_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cache_pool_stats(
        cache: *const kvs_cache,
        stats_out: *mut kvs_pool_stats,
    ) -> kvs_status {
        // SAFETY: every pointer is NULL or valid for the call (the export contract).
        guard(|| unsafe {
            let c = self::cache(cache)?;
            let out = try_out(stats_out, "stats_out")?;
            let st = c.lock()?.pool_stats().ok_or_else(|| {
                Error::Cache(kvshare_core::Error::Unsupported(
                    "the cache has no pool tier (kvs_cache_new_pooled)".into(),
                ))
            })?;
            *out = kvs_pool_stats {
                lookups: st.lookups,
                lookup_keys: st.lookup_keys,
                answered_hits: st.answered_hits,
                loads: st.loads,
                loads_ok: st.loads_ok,
                loads_failed: st.loads_failed,
                hit_tokens: st.hit_tokens,
                stores: st.stores,
                stores_ok: st.stores_ok,
                stores_failed: st.stores_failed,
                pending: st.pending,
                queued: st.queued,
            };
            Ok(())
        })
    }
}
