//! `kvs_attention_launch(_scaled)`, `kvs_kv_write(_scaled)`, `kvs_kv_copy`: the launches of a
//! `kvs_backend` (their `#[repr(C)]` args are declared in `attn_args.rs`).
//!
//! Glue only: each export reads its args into the plain params of [`kvshare_attention`]
//! (`attn_args.rs`), validates them there, checks every pointer, and then hands the launch to
//! the backend by the memory it takes: host slices whose lengths come from the validated shapes
//! for a host-memory [`Backend`](kvshare_attention::Backend), device addresses plus the checked
//! host arrays for a [`DeviceBackend`](kvshare_attention::DeviceBackend). Which backend it is
//! stays behind those two traits. Nothing is written unless every check passed.

use super::enums::{kvs_copy_kind, kvs_dtype, kvs_index_type, kvs_status};
use std::ffi::c_void;

use super::attn_args::{
    aslice, aslice_mut, attn, buf, buf_mut, cache_pair, cache_ptr, channel_scales, dtype,
    kvs_attention_args, kvs_kv_copy_args, kvs_kv_layout, kvs_kv_scales, kvs_kv_write_args, layout,
    no_overlap, not_null, or_dense, per_tensor, scales_ref, CachePair,
};
use super::backend::{kvs_backend, BackendBox, Launcher};
use super::enums::decode;
use super::handle;
use super::panic::guard;
use super::slice::try_ref;

use super::types::kvs_copy;
use crate::error::{Error, Result};
use kvshare_attention::device::{
    DeviceAttn, DeviceAttnBatch, DeviceCopy, DeviceCopyBatch, DeviceKvWrite, DeviceKvWriteBatch,
};
use kvshare_attention::{
    AttnBatch, AttnBuffers, AttnParams, CopyCaches, CopyKind, CopyParams, DType, KvCachesMut,
    KvScales, KvWrite, KvWriteParams, PageCopy, PageCopyBatch, SlotMapping, TokenStrides,
};
use kvshare_core::alloc::try_with_capacity;

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
    // SAFETY: the caller's contract above, which is what `borrow` and `try_ref` ask.
    Ok(unsafe { (handle::borrow(backend)?, try_ref(args, "args")?) })
}

/// The plain params of `kvs_attention_args` (0 strides made dense, enum values decoded), with
/// the caches' per-tensor scales; not yet validated.
fn attn_params(a: &kvs_attention_args, kv_scales: KvScales) -> Result<AttnParams> {
    let cache = layout(&a.cache, a.cache.num_pages)?;
    let (h, d) = (a.num_heads as usize, cache.head_dim);
    Ok(AttnParams {
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
        kv_scales,
    })
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
    /// (dtypes, page size, head ratio, layouts; docs/ascend.md) give
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
        // SAFETY: this export's contract is the scaled one's, with no scales.
        unsafe { Self::kvs_attention_launch_scaled(backend, args, std::ptr::null(), stream) }
    }

    /// As `kvs_attention_launch`, on caches with dequantization scales (`kvs_kv_scales`; NULL
    /// is an unscaled cache): a cache element stands for its stored value times its cache's
    /// per-tensor scale (vLLM's `k_scale`, `v_scale`) and, for a `KVS_DTYPE_INT8` cache, its
    /// channel's scale, for a `KVS_DTYPE_INT8_PER_TOKEN_HEAD` cache its row's scale (kept in the
    /// page after the row's codes). For the quantized caches (`KVS_DTYPE_FP8_E4M3`,
    /// `KVS_DTYPE_FP8_E5M2`, `KVS_DTYPE_INT8`, `KVS_DTYPE_INT8_PER_TOKEN_HEAD`) the kernel
    /// reads the pages as they are and folds the scales into the query and the output (a
    /// per-token-head row's K scale multiplies its position's score, its V scale that
    /// position's weight in the value sum); the per-tensor scales apply to any cache type.
    /// `kvs_attention_launch` is this call with NULL scales.
    ///
    /// The channel-scale and offset arrays are host memory on every backend. The Ascend backend
    /// takes an int8 cache under an fp16/bf16 query (FIA's per-channel antiquant arguments; it
    /// copies the scales to the device once per distinct set, see docs/ascend.md) and refuses
    /// fp8 caches and scales other than 1 on other caches with `KVS_STATUS_UNSUPPORTED`.
    ///
    /// **Failure:** as `kvs_attention_launch`, and `KVS_STATUS_ATTN_INVALID_ARGUMENT` naming
    /// `k_scale`, `v_scale`, `k_channel_scales` or `v_channel_scales` when a scale is not a
    /// finite number > 0, or channel scales are missing for an int8 cache or given for another
    /// (a per-token-head cache included); `cache_head_stride` (or the next stride) when a row
    /// leaves no room for a per-token-head scale. Nothing is written on error.
    /// **Thread safety:** as `kvs_attention_launch`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_attention_launch_scaled(
        backend: *const kvs_backend,
        args: *const kvs_attention_args,
        scales: *const kvs_kv_scales,
        stream: *mut c_void,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: as this export's contract (`launch_inputs`, `scales_ref`).
            let ((b, a), sc) = unsafe { (launch_inputs(backend, args)?, scales_ref(scales)?) };
            let params = attn_params(a, per_tensor(sc))?;
            let cache = params.cache;
            let spans = params.validate()?;
            // SAFETY: the channel arrays hold the validated num_kv_heads * head_dim floats.
            let channels = unsafe { channel_scales(sc, &cache)? };
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
                        // SAFETY: as above.
                        Some(unsafe {
                            aslice(a.query_start_loc, spans.query_start_loc, "query_start_loc")?
                        })
                    } else {
                        None
                    };
                    let batch = DeviceAttnBatch::new(params, mem, ctx, starts, channels)?;
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
                    channel_scales: channels,
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
        // SAFETY: this export's contract is the scaled one's, with no scales.
        unsafe { Self::kvs_kv_write_scaled(backend, args, std::ptr::null(), stream) }
    }

    /// As `kvs_kv_write`, into caches with dequantization scales (`kvs_kv_scales`, see
    /// `kvs_attention_launch_scaled`; NULL is an unscaled cache): each new key is divided by
    /// `k_scale` (and, into an int8 cache, by its channel's scale), each value likewise, then
    /// rounded to the cache's type: to nearest, ties to even; fp8 magnitudes past the largest
    /// finite value saturate to it and NaN stays NaN; int8 saturates to -128..=127 and stores
    /// NaN as 0. Into a `KVS_DTYPE_INT8_PER_TOKEN_HEAD` cache, each (token, kv head) row of the
    /// values divided by the per-tensor scale gets the scale `max(max|x| / 127, 1e-6)` (vLLM's;
    /// infinities and NaN left out of the maximum), stored after its codes, and its codes
    /// `x / row scale` as int8 above (vLLM rounds ties away from zero instead). `kvs_kv_write`
    /// is this call with NULL scales. CPU backend only for scales other than 1 and for
    /// quantized caches: the Ascend backend refuses them with `KVS_STATUS_UNSUPPORTED` (the
    /// engine's own quantizing op writes an int8 cache there).
    ///
    /// **Failure:** as `kvs_kv_write`, and `KVS_STATUS_ATTN_INVALID_ARGUMENT` as
    /// `kvs_attention_launch_scaled` for the scales. Nothing is written on error.
    /// **Thread safety:** as `kvs_kv_write`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_kv_write_scaled(
        backend: *const kvs_backend,
        args: *const kvs_kv_write_args,
        scales: *const kvs_kv_scales,
        stream: *mut c_void,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: as this export's contract (`launch_inputs`, `scales_ref`).
            let ((b, a), sc) = unsafe { (launch_inputs(backend, args)?, scales_ref(scales)?) };
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
                scales: per_tensor(sc),
            };
            let (src, cache_len) = params.validate()?;
            // SAFETY: the channel arrays hold the validated num_kv_heads * head_dim floats.
            let channels = unsafe { channel_scales(sc, &cache)? };
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
            let pair = cache_pair(a.key_cache, a.value_cache, &cache, cache_len)?;
            match pair {
                CachePair::Split => {
                    no_overlap(("key_cache", a.key_cache, cache_len * ce), &inputs)?;
                    no_overlap(("value_cache", a.value_cache, cache_len * ce), &inputs)?;
                }
                CachePair::Shared { lo, bytes, .. } => {
                    no_overlap(("key_cache", lo, bytes), &inputs)?;
                }
            }
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
            // (export contract); the written caches overlap no input (checked above), and are
            // either apart (two `&mut` slices) or one `&mut` slice over both (`cache_pair`), so
            // no slice aliases another.
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
                    match pair {
                        CachePair::Split => KvCachesMut::Split {
                            key: buf_mut(a.key_cache, cache.dtype, cache_len, "key_cache")?,
                            value: buf_mut(a.value_cache, cache.dtype, cache_len, "value_cache")?,
                        },
                        CachePair::Shared {
                            lo,
                            bytes,
                            key,
                            value,
                        } => KvCachesMut::Shared {
                            buf: buf_mut(lo, cache.dtype, bytes / ce, "key_cache")?,
                            key,
                            value,
                        },
                    },
                    channels,
                )?
            };
            Ok(host.kv_write(write)?)
        })
    }

    /// Performs page copies reported by the cache manager (copy-on-write of a partial page,
    /// swap out/in, demotion/promotion) on one layer's K and V caches, in array order; see
    /// `kvs_copy` and `kvs_kv_copy_args`. `(NULL, 0)` copies nothing. `stream` as in
    /// `kvs_attention_launch`. Call once per layer, with the copies whose `kvs_copy.group` is
    /// the layer's group (the backend does not read that field: it copies every entry given).
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
            // SAFETY: as above, for `copies`.
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
                    group: c.group,
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
    /// (a `kvs_dtype` value), strides filled in. Pure; nothing is checked here. A row of a
    /// `KVS_DTYPE_INT8_PER_TOKEN_HEAD` cache is `head_dim + 4` bytes (its codes, then its f32
    /// scale), so its head stride is `head_dim + 4`; an unknown `dtype` gets `head_dim`.
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
        let (ps, h) = (page_size as usize, num_kv_heads as usize);
        let scale_bytes =
            kvs_dtype::try_from(dtype).map_or(0, |t| DType::from(t).row_scale_bytes());
        let d = (head_dim as usize).saturating_add(scale_bytes);
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
