//! `kvs_attention_launch`, `kvs_kv_write`, `kvs_kv_copy`: the launches of a `kvs_backend`, and
//! the `#[repr(C)]` args they take.
//!
//! Glue only: each export reads its args into the plain params of [`kvshare_attention`]
//! (`attn_args.rs`), validates them there, checks every pointer, and then hands the launch to
//! the backend by the memory it takes: host slices whose lengths come from the validated shapes
//! for a host-memory [`Backend`](kvshare_attention::Backend), device addresses plus the checked
//! host arrays for a [`DeviceBackend`](kvshare_attention::DeviceBackend). Which backend it is
//! stays behind those two traits. Nothing is written unless every check passed.

use std::ffi::c_void;

use super::attn_args::{
    aslice, aslice_mut, attn, buf, buf_mut, cache_ptr, dtype, layout, no_overlap, not_null,
    or_dense,
};
use super::backend::{kvs_backend, BackendBox, Launcher};
use super::enums::decode;
use super::handle;
use super::panic::guard;
use super::slice::try_ref;
use super::status::kvs_status;
use super::types::{kvs_copy, kvs_copy_kind};
use crate::error::{Error, Result};
use kvshare_attention::device::{
    DeviceAttn, DeviceAttnBatch, DeviceCopy, DeviceCopyBatch, DeviceKvWrite, DeviceKvWriteBatch,
};
use kvshare_attention::{
    AttnBatch, AttnBuffers, AttnParams, CopyCaches, CopyKind, CopyParams, KvWrite, KvWriteParams,
    PageCopy, PageCopyBatch, SlotMapping, TokenStrides,
};
use kvshare_core::alloc::try_with_capacity;

/// Element type of a slot mapping (`kvs_kv_write_args.slot_mapping_type`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_index_type {
    /// `int32_t` (vLLM-Ascend, MindIE).
    Int32 = 0,
    /// `int64_t` (upstream vLLM).
    Int64 = 1,
}

/// Layout of one layer's K cache and V cache (they share it):
/// `[num_pages, page_size, num_kv_heads, head_dim]`, `head_dim` contiguous, outer strides in
/// **elements**. A stride of 0 means the dense value (`page_size*num_kv_heads*head_dim`,
/// `num_kv_heads*head_dim`, `head_dim`). Any non-overlapping strides are accepted, e.g. CANN's
/// `[num_pages, num_kv_heads, page_size, head_dim]` ("BnNBsD") is
/// `slot_stride = head_dim, head_stride = page_size*head_dim`.
///
/// **Thread safety:** plain data.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kvs_kv_layout {
    /// Element type: a `kvs_dtype` value.
    pub dtype: u32,
    /// Pages in the cache.
    pub num_pages: u32,
    /// Token slots per page.
    pub page_size: u32,
    /// KV heads.
    pub num_kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Elements between pages (0 = dense).
    pub page_stride: usize,
    /// Elements between the token slots of a page (0 = dense).
    pub slot_stride: usize,
    /// Elements between the kv heads of a slot (0 = dense).
    pub head_stride: usize,
}

/// Everything one paged-attention launch reads and writes (one layer).
///
/// Shapes (strides in **elements**; 0 = dense; `head_dim` is always contiguous):
/// - `query`, `output`: `[num_tokens, num_heads, head_dim]`; `output` must not overlap any input.
/// - `key_cache`, `value_cache`: see `kvs_kv_layout`.
/// - `block_table`: int32 `[num_seqs, max_pages_per_seq]`, row stride `block_table_stride`.
///   Only the first `ceil(context_lens[i] / page_size)` entries of row `i` are read, and each
///   must be a page id below `cache.num_pages`; the rest is padding.
/// - `context_lens`: host int32 `[num_seqs]`: KV tokens of each sequence, this step's query
///   tokens included (write them with `kvs_kv_write` first). At most
///   `max_pages_per_seq * page_size`.
/// - `query_start_loc`: host int32 `[num_seqs + 1]`, cumulative query starts (`[0]` is 0,
///   `[num_seqs]` is `num_tokens`), or NULL for decode (one query token per sequence,
///   `num_tokens == num_seqs`). Query token `i` of a sequence with context length `L` and
///   query length `q` sits at position `L - q + i` and attends to positions `0..=L - q + i`.
///
/// GQA/MQA: `num_heads` is a multiple of `cache.num_kv_heads`; query head `h` uses kv head
/// `h / (num_heads / num_kv_heads)`. Scores are `scale * q·k`, then `softcap * tanh(s / softcap)`
/// when `softcap > 0`; with `sliding_window > 0` a token sees only the `sliding_window` most
/// recent positions (itself included). Accumulation is in f32 whatever the dtypes.
///
/// **Thread safety:** plain data; the memory it points to must not change during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_attention_args {
    /// Sequences in the batch (>= 1).
    pub num_seqs: u32,
    /// Query tokens in the batch (>= 1).
    pub num_tokens: u32,
    /// Query heads.
    pub num_heads: u32,
    /// Query tensor `[num_tokens, num_heads, head_dim]`.
    pub query: *const c_void,
    /// Query element type: a `kvs_dtype` value.
    pub query_dtype: u32,
    /// Elements between query tokens (0 = `num_heads * head_dim`).
    pub query_token_stride: usize,
    /// Elements between query heads (0 = `head_dim`).
    pub query_head_stride: usize,
    /// Output tensor `[num_tokens, num_heads, head_dim]`, written on success only.
    pub output: *mut c_void,
    /// Output element type: a `kvs_dtype` value.
    pub output_dtype: u32,
    /// Elements between output tokens (0 = `num_heads * head_dim`).
    pub output_token_stride: usize,
    /// Elements between output heads (0 = `head_dim`).
    pub output_head_stride: usize,
    /// K cache of the layer.
    pub key_cache: *const c_void,
    /// V cache of the layer.
    pub value_cache: *const c_void,
    /// Layout of both caches.
    pub cache: kvs_kv_layout,
    /// int32 block table `[num_seqs, max_pages_per_seq]`.
    pub block_table: *const i32,
    /// Columns of the block table.
    pub max_pages_per_seq: u32,
    /// Elements between block-table rows (0 = `max_pages_per_seq`).
    pub block_table_stride: usize,
    /// Host int32 `[num_seqs]` context lengths.
    pub context_lens: *const i32,
    /// Host int32 `[num_seqs + 1]` cumulative query starts, or NULL for decode.
    pub query_start_loc: *const i32,
    /// Multiplier of `q·k`, finite and > 0 (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Logit soft cap; 0 = off.
    pub softcap: f32,
    /// Sliding window in tokens; 0 = off.
    pub sliding_window: u32,
}

/// Everything one KV write reads and writes (one layer): scatter `key`/`value`
/// `[num_tokens, cache.num_kv_heads, cache.head_dim]` into the caches at
/// `slot = page * page_size + offset` from `slot_mapping`; negative slots are padding and are
/// skipped. Slots must be unique (later ones win on CPU). The new K/V may have another dtype
/// than the cache; values are converted (round to nearest).
///
/// **Thread safety:** plain data; the memory it points to must not change during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_kv_write_args {
    /// Tokens to write (>= 1).
    pub num_tokens: u32,
    /// New keys `[num_tokens, num_kv_heads, head_dim]`.
    pub key: *const c_void,
    /// New values, same shape and strides as `key`.
    pub value: *const c_void,
    /// Element type of `key` and `value`: a `kvs_dtype` value.
    pub src_dtype: u32,
    /// Elements between tokens of `key`/`value` (0 = `num_kv_heads * head_dim`).
    pub src_token_stride: usize,
    /// Elements between heads of `key`/`value` (0 = `head_dim`).
    pub src_head_stride: usize,
    /// K cache of the layer (written).
    pub key_cache: *mut c_void,
    /// V cache of the layer (written; must not overlap `key_cache`).
    pub value_cache: *mut c_void,
    /// Layout of both caches.
    pub cache: kvs_kv_layout,
    /// `[num_tokens]` slots, `int32_t` or `int64_t` as `slot_mapping_type` says.
    pub slot_mapping: *const c_void,
    /// A `kvs_index_type` value.
    pub slot_mapping_type: u32,
}

/// The caches a page copy works on (one layer): device K/V caches laid out as `cache`, and
/// optional host K/V caches with the same per-page layout and strides and `num_host_pages`
/// pages (0 = no host caches; their pointers may then be NULL). The four buffers must not
/// overlap.
///
/// **Thread safety:** plain data.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_kv_copy_args {
    /// Device K cache.
    pub key_cache: *mut c_void,
    /// Device V cache.
    pub value_cache: *mut c_void,
    /// Layout of the device caches (and per page of the host caches).
    pub cache: kvs_kv_layout,
    /// Host K cache, or NULL when `num_host_pages` is 0.
    pub host_key_cache: *mut c_void,
    /// Host V cache, or NULL when `num_host_pages` is 0.
    pub host_value_cache: *mut c_void,
    /// Pages of each host cache.
    pub num_host_pages: u32,
}

/// The backend and the args struct every launch starts from, both refused when NULL.
///
/// # Safety
/// A non-NULL `backend` is a live handle from `kvs_backend_new`, and a non-NULL `args` a struct
/// readable for `'a` (the export contract, ffi/mod.rs): `borrow` and `try_ref` check the rest
/// (NULL, alignment).
unsafe fn launch_inputs<'a, A>(
    backend: *const kvs_backend,
    args: *const A,
) -> Result<(&'a BackendBox, &'a A)> {
    Ok((handle::borrow(backend)?, try_ref(args, "args")?))
}

impl kvs_backend {
    /// Launches paged attention (decode, prefill or chunked prefill, causal within each
    /// sequence) for one layer; see `kvs_attention_args` for shapes and semantics. `stream` is
    /// the backend's stream (`aclrtStream` for Ascend); the CPU backend ignores it (NULL is
    /// fine) and returns when the output is written.
    ///
    /// Ascend: `query`, `output`, the caches and `block_table` are device addresses (32-byte
    /// aligned); `context_lens` and `query_start_loc` stay host arrays. The launch is enqueued on
    /// `stream` (NULL: the default stream) and the call returns without waiting; CANN's limits
    /// (dtypes, page size, head ratio, layouts; README "Ascend") give
    /// `KVS_STATUS_UNSUPPORTED` before any launch, and a CANN failure gives
    /// `KVS_STATUS_BACKEND_FAILURE` with `aclGetRecentErrMsg()` in the message.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `backend`, `args` or required
    /// pointer; `KVS_STATUS_ATTN_INVALID_ARGUMENT` for any shape, stride, dtype, head ratio,
    /// length or block-table entry that is out of range or contradicts another (the message
    /// names the field). Nothing is written on error.
    /// **Thread safety:** safe from any thread; `output` must not be accessed by others
    /// during the call.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_attention_launch(
        backend: *const kvs_backend,
        args: *const kvs_attention_args,
        stream: *mut c_void,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: as this export's contract (`launch_inputs`).
            let (b, a) = unsafe { launch_inputs(backend, args)? };
            let cache = layout(&a.cache, a.cache.num_pages)?;
            let (h, d) = (a.num_heads as usize, cache.head_dim);
            let params = AttnParams {
                num_seqs: a.num_seqs as usize,
                num_tokens: a.num_tokens as usize,
                num_heads: h,
                query_dtype: dtype(a.query_dtype, "query_dtype")?,
                query_strides: TokenStrides {
                    token: or_dense(a.query_token_stride, h.saturating_mul(d)),
                    head: or_dense(a.query_head_stride, d),
                },
                output_dtype: dtype(a.output_dtype, "output_dtype")?,
                output_strides: TokenStrides {
                    token: or_dense(a.output_token_stride, h.saturating_mul(d)),
                    head: or_dense(a.output_head_stride, d),
                },
                cache,
                max_pages_per_seq: a.max_pages_per_seq as usize,
                block_table_stride: or_dense(a.block_table_stride, a.max_pages_per_seq as usize),
                varlen: !a.query_start_loc.is_null(),
                scale: a.scale,
                softcap: a.softcap,
                sliding_window: a.sliding_window as usize,
            };
            let spans = params.validate()?;
            for (name, p) in [("key_cache", a.key_cache), ("value_cache", a.value_cache)] {
                cache_ptr(&b.launcher, p, cache.dtype, true, name)?;
            }
            let (qe, oe, ce) = (
                params.query_dtype.size_bytes(),
                params.output_dtype.size_bytes(),
                cache.dtype.size_bytes(),
            );
            no_overlap(
                ("output", a.output, spans.output * oe),
                &[
                    ("query", a.query, spans.query * qe),
                    ("key_cache", a.key_cache, spans.cache * ce),
                    ("value_cache", a.value_cache, spans.cache * ce),
                    ("block_table", a.block_table.cast(), spans.block_table * 4),
                    (
                        "context_lens",
                        a.context_lens.cast(),
                        spans.context_lens * 4,
                    ),
                    (
                        "query_start_loc",
                        a.query_start_loc.cast(),
                        spans.query_start_loc * 4,
                    ),
                ],
            )?;
            let host = match &b.launcher {
                Launcher::Host(host) => host,
                Launcher::Device(device) => {
                    let mem = DeviceAttn {
                        query: not_null(a.query, "query")?,
                        output: not_null(a.output.cast_const(), "output")?,
                        key_cache: not_null(a.key_cache, "key_cache")?,
                        value_cache: not_null(a.value_cache, "value_cache")?,
                        block_table: not_null(a.block_table, "block_table")?,
                    };
                    // SAFETY: `context_lens` and `query_start_loc` stay host arrays on every
                    // backend; `aslice` refuses NULL and misalignment, and the lengths are the
                    // validated `spans` that `kvs_attention_args` documents them to hold.
                    let ctx =
                        unsafe { aslice(a.context_lens, spans.context_lens, "context_lens")? };
                    let starts = if params.varlen {
                        Some(unsafe {
                            aslice(a.query_start_loc, spans.query_start_loc, "query_start_loc")?
                        })
                    } else {
                        None
                    };
                    let batch = DeviceAttnBatch::new(params, mem, ctx, starts)?;
                    return Ok(device.attention(batch, stream as usize)?);
                }
            };
            // SAFETY: host memory: each pointer is non-NULL and aligned (checked by `buf`/
            // `aslice`) and valid for the element counts of the validated `spans`, which are the
            // shapes `kvs_attention_args` documents (export contract); `output`, the one `&mut`,
            // overlaps no input (checked above), so no slice aliases it.
            let bufs = unsafe {
                AttnBuffers {
                    query: buf(a.query, params.query_dtype, spans.query, "query")?,
                    key_cache: buf(a.key_cache, cache.dtype, spans.cache, "key_cache")?,
                    value_cache: buf(a.value_cache, cache.dtype, spans.cache, "value_cache")?,
                    block_table: aslice(a.block_table, spans.block_table, "block_table")?,
                    context_lens: aslice(a.context_lens, spans.context_lens, "context_lens")?,
                    query_start_loc: if params.varlen {
                        Some(aslice(
                            a.query_start_loc,
                            spans.query_start_loc,
                            "query_start_loc",
                        )?)
                    } else {
                        None
                    },
                    output: buf_mut(a.output, params.output_dtype, spans.output, "output")?,
                }
            };
            Ok(host.attention(AttnBatch::new(params, bufs)?)?)
        })
    }

    /// Scatters new K and V into one layer's paged caches by slot mapping (vLLM's
    /// `reshape_and_cache`, CANN's `aclnnScatterPaKvCache` "Norm" mode); see
    /// `kvs_kv_write_args`. `stream` as in `kvs_attention_launch`.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `backend`, `args` or required
    /// pointer; `KVS_STATUS_ATTN_INVALID_ARGUMENT` for a bad shape, stride, dtype, index type or
    /// a slot at or beyond `num_pages * page_size` (message names the field). Nothing is
    /// written on error.
    /// **Thread safety:** safe from any thread; the caches must not be accessed by others
    /// during the call.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_kv_write(
        backend: *const kvs_backend,
        args: *const kvs_kv_write_args,
        stream: *mut c_void,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: as this export's contract (`launch_inputs`).
            let (b, a) = unsafe { launch_inputs(backend, args)? };
            let cache = layout(&a.cache, a.cache.num_pages)?;
            let (h, d) = (cache.num_kv_heads, cache.head_dim);
            let params = KvWriteParams {
                num_tokens: a.num_tokens as usize,
                src_dtype: dtype(a.src_dtype, "src_dtype")?,
                src_strides: TokenStrides {
                    token: or_dense(a.src_token_stride, h.saturating_mul(d)),
                    head: or_dense(a.src_head_stride, d),
                },
                cache,
            };
            let (src, cache_len) = params.validate()?;
            for (name, p) in [("key_cache", a.key_cache), ("value_cache", a.value_cache)] {
                cache_ptr(&b.launcher, p.cast_const(), cache.dtype, true, name)?;
            }
            let n = params.num_tokens;
            let (se, ce) = (params.src_dtype.size_bytes(), cache.dtype.size_bytes());
            let slot_bytes = match decode(a.slot_mapping_type, "slot_mapping_type").map_err(attn)? {
                kvs_index_type::Int32 => 4,
                kvs_index_type::Int64 => 8,
            };
            let inputs = [
                ("key", a.key, src * se),
                ("value", a.value, src * se),
                ("slot_mapping", a.slot_mapping, n * slot_bytes),
            ];
            no_overlap(("key_cache", a.key_cache, cache_len * ce), &inputs)?;
            no_overlap(("value_cache", a.value_cache, cache_len * ce), &inputs)?;
            no_overlap(
                ("value_cache", a.value_cache, cache_len * ce),
                &[("key_cache", a.key_cache, cache_len * ce)],
            )?;
            let host = match &b.launcher {
                Launcher::Host(host) => host,
                Launcher::Device(device) => {
                    let mem = DeviceKvWrite {
                        key: not_null(a.key, "key")?,
                        value: not_null(a.value, "value")?,
                        key_cache: not_null(a.key_cache.cast_const(), "key_cache")?,
                        value_cache: not_null(a.value_cache.cast_const(), "value_cache")?,
                        slot_mapping: not_null(a.slot_mapping, "slot_mapping")?,
                        slots_i64: slot_bytes == 8,
                    };
                    let write = DeviceKvWriteBatch::new(params, mem)?;
                    return Ok(device.kv_write(write, stream as usize)?);
                }
            };
            // SAFETY: host memory: each pointer is non-NULL and aligned (checked by `buf`/
            // `aslice`) and valid for the validated element counts (`src`, `cache_len`,
            // `num_tokens` slots of the decoded index type), as `kvs_kv_write_args` documents
            // (export contract); the two written caches overlap each other and every input
            // nowhere (checked above), so the `&mut` slices alias nothing.
            let write = unsafe {
                let slots = if slot_bytes == 4 {
                    SlotMapping::I32(aslice(a.slot_mapping.cast(), n, "slot_mapping")?)
                } else {
                    SlotMapping::I64(aslice(a.slot_mapping.cast(), n, "slot_mapping")?)
                };
                KvWrite::new(
                    params,
                    buf(a.key, params.src_dtype, src, "key")?,
                    buf(a.value, params.src_dtype, src, "value")?,
                    slots,
                    buf_mut(a.key_cache, cache.dtype, cache_len, "key_cache")?,
                    buf_mut(a.value_cache, cache.dtype, cache_len, "value_cache")?,
                )?
            };
            Ok(host.kv_write(write)?)
        })
    }

    /// Performs page copies reported by the cache manager (copy-on-write of a partial page,
    /// swap out/in, demotion/promotion) on one layer's K and V caches, in array order; see
    /// `kvs_copy` and `kvs_kv_copy_args`. `(NULL, 0)` copies nothing. `stream` as in
    /// `kvs_attention_launch`. Call once per layer.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `backend`, `args`, required cache
    /// pointer or `copies` with `num_copies > 0`; `KVS_STATUS_ATTN_INVALID_ARGUMENT` for a bad
    /// layout, an unknown kind, a page id beyond its tier or `num_tokens` above `page_size`
    /// (0 is a valid no-op; the message names the field, e.g. `copies`), or a cache pointer
    /// that `kvs_kv_write` and `kvs_attention_launch` would refuse too (not aligned to the
    /// element size; on Ascend, a device cache not 32-byte aligned). Nothing is copied on
    /// error.
    /// **Thread safety:** safe from any thread; the caches must not be accessed by others
    /// during the call.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_kv_copy(
        backend: *const kvs_backend,
        args: *const kvs_kv_copy_args,
        copies: *const kvs_copy,
        num_copies: usize,
        stream: *mut c_void,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: as this export's contract (`launch_inputs`); `copies`: NULL is refused
            // with `num_copies > 0`, otherwise `num_copies` records readable for the call (the
            // copy list is host memory on every backend).
            let (b, a) = unsafe { launch_inputs(backend, args)? };
            let raw = unsafe { aslice(copies, num_copies, "copies")? };
            let mut list = try_with_capacity(raw.len(), "copies")?;
            for (i, c) in raw.iter().enumerate() {
                let kind: CopyKind = kvs_copy_kind::try_from(c.kind)
                    .map_err(|e| {
                        Error::attn("copies", format!("copies[{i}].kind = {}", e.reason()))
                    })?
                    .into();
                list.push(PageCopy {
                    src_page: c.src_page,
                    dst_page: c.dst_page,
                    num_tokens: c.num_tokens,
                    kind,
                });
            }
            let params = CopyParams {
                cache: layout(&a.cache, a.cache.num_pages)?,
                num_host_pages: a.num_host_pages as usize,
            };
            let (dev, host) = params.validate()?;
            let caches = [
                ("key_cache", a.key_cache, true),
                ("value_cache", a.value_cache, true),
                ("host_key_cache", a.host_key_cache, false),
                ("host_value_cache", a.host_value_cache, false),
            ];
            for (name, p, device) in caches {
                cache_ptr(
                    &b.launcher,
                    p.cast_const(),
                    params.cache.dtype,
                    device,
                    name,
                )?;
            }
            let esz = params.cache.dtype.size_bytes();
            let (dev, host) = (dev * esz, host * esz);
            let all = [
                ("key_cache", a.key_cache.cast_const(), dev),
                ("value_cache", a.value_cache.cast_const(), dev),
                ("host_key_cache", a.host_key_cache.cast_const(), host),
                ("host_value_cache", a.host_value_cache.cast_const(), host),
            ];
            for (i, w) in all.iter().enumerate() {
                no_overlap(*w, &all[i + 1..])?;
                no_overlap(
                    *w,
                    &[(
                        "copies",
                        copies.cast(),
                        num_copies * std::mem::size_of::<kvs_copy>(),
                    )],
                )?;
            }
            let host_backend = match &b.launcher {
                Launcher::Host(host) => host,
                Launcher::Device(device) => {
                    // 0 stands for NULL; the batch refuses it where a cache is needed.
                    let mem = DeviceCopy {
                        key_cache: a.key_cache as usize,
                        value_cache: a.value_cache as usize,
                        host_key_cache: a.host_key_cache as usize,
                        host_value_cache: a.host_value_cache as usize,
                    };
                    let batch = DeviceCopyBatch::new(params, &list, mem)?;
                    return Ok(device.copy_pages(batch, stream as usize)?);
                }
            };
            // SAFETY: host memory: each cache pointer is non-NULL and aligned (checked by
            // `aslice_mut`; host caches may be NULL only with 0 bytes) and valid for the
            // validated byte counts `dev`/`host` that `kvs_kv_copy_args` documents (export
            // contract); the four caches and the copy list are pairwise disjoint (checked
            // above), so the four `&mut` slices alias nothing.
            let caches = unsafe {
                CopyCaches {
                    key_cache: aslice_mut(a.key_cache.cast(), dev, "key_cache")?,
                    value_cache: aslice_mut(a.value_cache.cast(), dev, "value_cache")?,
                    host_key_cache: aslice_mut(a.host_key_cache.cast(), host, "host_key_cache")?,
                    host_value_cache: aslice_mut(
                        a.host_value_cache.cast(),
                        host,
                        "host_value_cache",
                    )?,
                }
            };
            Ok(host_backend.copy_pages(PageCopyBatch::new(params, caches, &list)?)?)
        })
    }

    /// The dense layout of a `[num_pages, page_size, num_kv_heads, head_dim]` cache of `dtype`
    /// (a `kvs_dtype` value), strides filled in. Pure; nothing is checked here.
    ///
    /// **Thread safety:** safe from any thread.
    #[must_use]
    #[no_mangle]
    pub extern "C" fn kvs_kv_layout_dense(
        dtype: u32,
        num_pages: u32,
        page_size: u32,
        num_kv_heads: u32,
        head_dim: u32,
    ) -> kvs_kv_layout {
        let (ps, h, d) = (page_size as usize, num_kv_heads as usize, head_dim as usize);
        kvs_kv_layout {
            dtype,
            num_pages,
            page_size,
            num_kv_heads,
            head_dim,
            page_stride: ps.saturating_mul(h).saturating_mul(d),
            slot_stride: h.saturating_mul(d),
            head_stride: d,
        }
    }
}
