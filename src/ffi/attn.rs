//! `kvs_backend`: compute backends, paged attention, KV write and page copy.
//!
//! Glue only: each export reads its `#[repr(C)]` args, builds the plain Rust params of
//! [`crate::attention`], validates them there (the same checks the Ascend backend will use),
//! turns the pointers into slices whose lengths come from the validated shapes, and calls the
//! safe backend. Nothing is written unless every check passed.

// The exports take raw pointers by design (C callers); each one is checked by the `slice`/
// `handle` helpers before use, so the functions stay `extern "C" fn` rather than `unsafe`.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_char, c_void};

use super::enums::decode;
use super::handle::{self, Handle};
use super::panic::guard;
use super::slice::{slice, slice_mut, try_out, try_ref};
use super::status::kvs_status;
use super::types::{kvs_copy, kvs_copy_kind, kvs_dtype};
use crate::attention::ascend::plan::check_align;
use crate::attention::ascend::{
    AscendBackend, AscendOptions, DeviceAttn, DeviceCopy, DeviceKvWrite,
};
use crate::attention::cpu::CpuBackend;
use crate::attention::{
    check_host_arrays, AttnBatch, AttnBuffers, AttnParams, AttnSpans, Backend, Buf, BufMut,
    CacheLayout, CopyCaches, CopyKind, CopyParams, KvWrite, KvWriteParams, PageCopy, PageCopyBatch,
    SlotMapping, TokenStrides,
};
use crate::core::alloc::try_with_capacity;
use crate::core::{DType, Error, Result};

/// A compute backend (`KVS_BACKEND_KIND_CPU` or `KVS_BACKEND_KIND_ASCEND`) that launches paged
/// attention, KV writes and page copies.
///
/// **Ownership:** create with `kvs_backend_new`, free with `kvs_backend_free`.
/// **Thread safety:** a backend may be used from several threads at once; the CPU backend runs
/// one call at a time on its thread pool and queues the others.
///
/// **Methods:** `kvs_backend_new`, `kvs_backend_free`, `kvs_backend_num_threads`,
/// `kvs_attention_launch`, `kvs_kv_write`, `kvs_kv_copy`.
pub struct kvs_backend {
    _private: [u8; 0],
}

impl Handle for kvs_backend {
    type Rust = BackendBox;
    const NAME: &'static str = "backend";
}

/// The Rust object behind a `kvs_backend*`.
pub(crate) struct BackendBox {
    backend: Box<dyn Backend>,
    num_threads: usize,
}

/// Which backend `kvs_backend_new` creates.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_backend_kind {
    /// Host CPU, synchronous; streams are ignored.
    Cpu = 0,
    /// Huawei Ascend NPU through CANN, loaded at run time (`dlopen`): tensor pointers are device
    /// addresses and launches are enqueued on the caller's `aclrtStream` (see README, "Ascend").
    Ascend = 1,
}

/// Element type of a slot mapping (`kvs_kv_write_args.slot_mapping_type`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_index_type {
    /// `int32_t` (vLLM-Ascend, MindIE).
    Int32 = 0,
    /// `int64_t` (upstream vLLM).
    Int64 = 1,
}

/// Options of `kvs_backend_new`. Zero-initialise and set what you need.
///
/// **Thread safety:** plain data, read only during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_backend_options {
    /// CPU: threads of the persistent pool (the calling thread included); 0 = the machine's
    /// available parallelism. At most 1024.
    pub num_threads: u32,
    /// Ascend: device id (ignored by the CPU backend).
    pub device_id: i32,
    /// Ascend: directory holding the CANN libraries, or NULL for the loader's search path
    /// (ignored by the CPU backend). NUL-terminated; read only during the call.
    pub library_dir: *const c_char,
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

/// Attention errors name fields; the shared slice helpers report `InvalidArgument`.
fn attn(e: Error) -> Error {
    match e {
        Error::InvalidArgument { field, reason } => Error::AttnInvalid { field, reason },
        e => e,
    }
}

fn dtype(raw: u32, field: &'static str) -> Result<DType> {
    decode::<kvs_dtype>(raw, field)
        .map(DType::from)
        .map_err(attn)
}

fn or_dense(stride: usize, dense: usize) -> usize {
    if stride == 0 {
        dense
    } else {
        stride
    }
}

fn layout(c: &kvs_kv_layout, num_pages: u32) -> Result<CacheLayout> {
    let (ps, h, d) = (
        c.page_size as usize,
        c.num_kv_heads as usize,
        c.head_dim as usize,
    );
    Ok(CacheLayout {
        dtype: dtype(c.dtype, "cache.dtype")?,
        num_pages: num_pages as usize,
        page_size: ps,
        num_kv_heads: h,
        head_dim: d,
        page_stride: or_dense(c.page_stride, ps.saturating_mul(h).saturating_mul(d)),
        slot_stride: or_dense(c.slot_stride, h.saturating_mul(d)),
        head_stride: or_dense(c.head_stride, d),
    })
}

/// Refuses a misaligned pointer as an attention argument error that names the address and the
/// alignment. (`slice.rs` refuses it too, before any slice is made, but with the shorter shared
/// message; this check runs first so attention callers get the precise one.)
fn aligned<T>(ptr: *const T, name: &'static str) -> Result<()> {
    if !ptr.is_aligned() {
        return Err(Error::AttnInvalid {
            field: name,
            reason: format!(
                "pointer {ptr:p} is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        });
    }
    Ok(())
}

/// The one check of a paged K/V cache pointer, shared by `kvs_attention_launch`, `kvs_kv_write`
/// and `kvs_kv_copy` so that a pointer one call refuses is refused by all: aligned to the cache's
/// element type, and for device memory of the Ascend backend to CANN's 32 bytes. NULL is left to
/// each call's own NULL check.
fn cache_ptr(
    backend: &dyn Backend,
    ptr: *const c_void,
    dtype: DType,
    device: bool,
    name: &'static str,
) -> Result<()> {
    if ptr.is_null() {
        return Ok(());
    }
    let align = dtype.size_bytes();
    if !(ptr as usize).is_multiple_of(align) {
        return Err(Error::AttnInvalid {
            field: name,
            reason: format!("pointer {ptr:p} is not aligned to {align} bytes (its element size)"),
        });
    }
    if device && backend.ascend().is_some() {
        check_align(name, ptr as usize)?;
    }
    Ok(())
}

/// [`slice`] with attention errors.
///
/// # Safety
/// As [`slice`].
unsafe fn aslice<'a, T>(ptr: *const T, len: usize, name: &'static str) -> Result<&'a [T]> {
    aligned(ptr, name)?;
    slice(ptr, len, name).map_err(attn)
}

/// [`slice_mut`] with attention errors.
///
/// # Safety
/// As [`slice_mut`].
unsafe fn aslice_mut<'a, T>(ptr: *mut T, len: usize, name: &'static str) -> Result<&'a mut [T]> {
    aligned(ptr.cast_const(), name)?;
    slice_mut(ptr, len, name).map_err(attn)
}

/// # Safety
/// Non-NULL `ptr` must be valid for `len` elements of `dtype` for `'a`.
unsafe fn buf<'a>(
    ptr: *const c_void,
    dtype: DType,
    len: usize,
    name: &'static str,
) -> Result<Buf<'a>> {
    Ok(match dtype {
        DType::F32 => Buf::F32(aslice(ptr.cast(), len, name)?),
        DType::F16 => Buf::F16(aslice(ptr.cast(), len, name)?),
        DType::BF16 => Buf::BF16(aslice(ptr.cast(), len, name)?),
    })
}

/// # Safety
/// As [`buf`], and nothing else accesses the memory during `'a`.
unsafe fn buf_mut<'a>(
    ptr: *mut c_void,
    dtype: DType,
    len: usize,
    name: &'static str,
) -> Result<BufMut<'a>> {
    Ok(match dtype {
        DType::F32 => BufMut::F32(aslice_mut(ptr.cast(), len, name)?),
        DType::F16 => BufMut::F16(aslice_mut(ptr.cast(), len, name)?),
        DType::BF16 => BufMut::BF16(aslice_mut(ptr.cast(), len, name)?),
    })
}

/// Refuses a written buffer that overlaps another buffer of the call (that would alias a
/// `&mut` slice).
fn no_overlap(
    w: (&'static str, *const c_void, usize),
    others: &[(&'static str, *const c_void, usize)],
) -> Result<()> {
    let (a0, a1) = (w.1 as usize, w.1 as usize + w.2);
    for &(name, p, bytes) in others {
        let (b0, b1) = (p as usize, p as usize + bytes);
        if !p.is_null() && bytes > 0 && w.2 > 0 && a0 < b1 && b0 < a1 {
            return Err(Error::AttnInvalid {
                field: w.0,
                reason: format!("overlaps `{name}`"),
            });
        }
    }
    Ok(())
}

impl kvs_backend {
    /// Creates a backend of `kind` (a `kvs_backend_kind` value). `options` may be NULL (all
    /// defaults). The CPU backend starts its persistent worker threads here; no call spawns
    /// threads later.
    ///
    /// **Ownership:** on success `*backend_out` owns a new backend; free it with
    /// `kvs_backend_free`. **Failure:** `KVS_STATUS_BACKEND_UNAVAILABLE` for Ascend when a CANN
    /// library or symbol is missing or the device cannot be set (the message names the library,
    /// symbol or device), `KVS_STATUS_INVALID_ARGUMENT` for an unknown kind or out-of-range
    /// option; `*backend_out` is untouched on error.
    ///
    /// Ascend: loads CANN from `options->library_dir`, else `$ASCEND_HOME_PATH/lib64`, else the
    /// loader's search path; calls `aclInit(NULL)` (an already initialised ACL is fine) and
    /// `aclrtSetDevice(options->device_id)` on the calling thread. `num_threads` is ignored.
    /// **Thread safety:** safe from any thread.
    #[no_mangle]
    pub extern "C" fn kvs_backend_new(
        kind: u32,
        options: *const kvs_backend_options,
        backend_out: *mut *mut kvs_backend,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: caller contract: NULL or a valid options struct / out location.
            let out = unsafe { try_out(backend_out, "backend_out")? };
            let opts = if options.is_null() {
                None
            } else {
                Some(unsafe { try_ref(options, "options")? })
            };
            let num_threads = opts.map_or(0, |o| o.num_threads) as usize;
            if num_threads > 1024 {
                return Err(Error::arg(
                    "options.num_threads",
                    format!("{num_threads} is more than 1024"),
                ));
            }
            let obj = match decode::<kvs_backend_kind>(kind, "kind")? {
                kvs_backend_kind::Cpu => {
                    let cpu = CpuBackend::new(num_threads)?;
                    BackendBox {
                        num_threads: cpu.num_threads(),
                        backend: Box::new(cpu),
                    }
                }
                kvs_backend_kind::Ascend => ascend_new(opts)?,
            };
            *out = handle::into_raw::<kvs_backend>(obj);
            Ok(())
        })
    }

    /// Frees a backend (its worker threads are joined). NULL is a no-op.
    ///
    /// Ascend: frees the backend's device workspaces, so every stream it launched on must be
    /// synchronised first (kvshare never synchronises a stream itself).
    ///
    /// **Ownership:** `backend` must come from `kvs_backend_new` and is invalid afterwards.
    /// **Thread safety:** no other call may be using `backend`.
    #[no_mangle]
    pub extern "C" fn kvs_backend_free(backend: *mut kvs_backend) {
        let _ = guard(|| {
            // SAFETY: caller contract (from kvs_backend_new, not in use elsewhere).
            unsafe { handle::free(backend) };
            Ok(())
        });
    }

    /// Threads the backend computes on (CPU: pool size, the calling thread included).
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL argument; `*num_threads_out` is
    /// untouched on error. **Thread safety:** safe from any thread.
    #[no_mangle]
    pub extern "C" fn kvs_backend_num_threads(
        backend: *const kvs_backend,
        num_threads_out: *mut u32,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: caller contract.
            let b = unsafe { handle::borrow(backend)? };
            let out = unsafe { try_out(num_threads_out, "num_threads_out")? };
            *out = u32::try_from(b.num_threads).unwrap_or(u32::MAX); // at most 1024
            Ok(())
        })
    }

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
    pub extern "C" fn kvs_attention_launch(
        backend: *const kvs_backend,
        args: *const kvs_attention_args,
        stream: *mut c_void,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: caller contract for `backend` and `args`.
            let b = unsafe { handle::borrow(backend)? };
            let a = unsafe { try_ref(args, "args")? };
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
                cache_ptr(&*b.backend, p, cache.dtype, true, name)?;
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
            if let Some(asc) = b.backend.ascend() {
                return ascend_attention(asc, a, &params, &spans, stream);
            }
            // SAFETY: caller contract: each pointer is valid for the shape the args describe,
            // and `output` overlaps no input (checked above).
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
            b.backend.attention(AttnBatch::new(params, bufs)?)
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
    pub extern "C" fn kvs_kv_write(
        backend: *const kvs_backend,
        args: *const kvs_kv_write_args,
        stream: *mut c_void,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: caller contract for `backend` and `args`.
            let b = unsafe { handle::borrow(backend)? };
            let a = unsafe { try_ref(args, "args")? };
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
                cache_ptr(&*b.backend, p.cast_const(), cache.dtype, true, name)?;
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
            if let Some(asc) = b.backend.ascend() {
                return ascend_kv_write(asc, a, &params, src, slot_bytes == 8, stream);
            }
            // SAFETY: caller contract; the written caches overlap nothing else (checked above).
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
            b.backend.kv_write(write)
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
    pub extern "C" fn kvs_kv_copy(
        backend: *const kvs_backend,
        args: *const kvs_kv_copy_args,
        copies: *const kvs_copy,
        num_copies: usize,
        stream: *mut c_void,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: caller contract for `backend`, `args` and `copies`.
            let b = unsafe { handle::borrow(backend)? };
            let a = unsafe { try_ref(args, "args")? };
            let raw = unsafe { aslice(copies, num_copies, "copies")? };
            let mut list = try_with_capacity(raw.len(), "copies")?;
            for (i, c) in raw.iter().enumerate() {
                let kind: CopyKind = kvs_copy_kind::try_from(c.kind)
                    .map_err(|e| Error::AttnInvalid {
                        field: "copies",
                        reason: format!("copies[{i}].kind = {}", e.reason()),
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
                    &*b.backend,
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
            if let Some(asc) = b.backend.ascend() {
                return ascend_copy(asc, a, &params, &list, stream);
            }
            // SAFETY: caller contract; the four caches are pairwise disjoint (checked above).
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
            b.backend
                .copy_pages(PageCopyBatch::new(params, caches, &list)?)
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

// ---- Ascend (device memory) dispatch: everything below belongs to the Ascend backend ----

fn ascend_new(opts: Option<&kvs_backend_options>) -> Result<BackendBox> {
    let library_dir = match opts.map(|o| o.library_dir) {
        Some(p) if !p.is_null() => {
            // SAFETY: caller contract: a NUL-terminated string read during the call.
            let c = unsafe { std::ffi::CStr::from_ptr(p) };
            let s = c
                .to_str()
                .map_err(|_| Error::arg("options.library_dir", "is not valid UTF-8".to_string()))?;
            Some(std::path::PathBuf::from(s))
        }
        _ => None,
    };
    let asc = AscendBackend::new(&AscendOptions {
        device_id: opts.map_or(0, |o| o.device_id),
        library_dir,
    })?;
    Ok(BackendBox {
        num_threads: 0,
        backend: Box::new(asc),
    })
}

fn not_null<T>(p: *const T, name: &'static str) -> Result<usize> {
    if p.is_null() {
        Err(Error::NullArgument(name))
    } else {
        Ok(p as usize)
    }
}

/// Attention on device memory: the host arrays are read and checked here (the shared checks);
/// the block table is on the device and is not read.
fn ascend_attention(
    asc: &AscendBackend,
    a: &kvs_attention_args,
    params: &AttnParams,
    spans: &AttnSpans,
    stream: *mut c_void,
) -> Result<()> {
    let mem = DeviceAttn {
        query: not_null(a.query, "query")?,
        output: not_null(a.output.cast_const(), "output")?,
        key_cache: not_null(a.key_cache, "key_cache")?,
        value_cache: not_null(a.value_cache, "value_cache")?,
        block_table: not_null(a.block_table, "block_table")?,
    };
    // SAFETY: caller contract: host arrays of the validated lengths.
    let ctx = unsafe { aslice(a.context_lens, spans.context_lens, "context_lens")? };
    let qsl = if params.varlen {
        Some(unsafe { aslice(a.query_start_loc, spans.query_start_loc, "query_start_loc")? })
    } else {
        None
    };
    let seqs = check_host_arrays(params, ctx, qsl, None)?;
    asc.attention(params, spans, &seqs, &mem, stream as usize)
}

/// KV write on device memory (the slot mapping is on the device and is not read).
fn ascend_kv_write(
    asc: &AscendBackend,
    a: &kvs_kv_write_args,
    params: &KvWriteParams,
    src_elems: usize,
    slots_i64: bool,
    stream: *mut c_void,
) -> Result<()> {
    let mem = DeviceKvWrite {
        key: not_null(a.key, "key")?,
        value: not_null(a.value, "value")?,
        key_cache: not_null(a.key_cache.cast_const(), "key_cache")?,
        value_cache: not_null(a.value_cache.cast_const(), "value_cache")?,
        slot_mapping: not_null(a.slot_mapping, "slot_mapping")?,
        slots_i64,
    };
    asc.kv_write(params, src_elems, &mem, stream as usize)
}

/// Page copies: the copy list is a host array, checked here; caches are device memory and
/// page-locked host memory.
fn ascend_copy(
    asc: &AscendBackend,
    a: &kvs_kv_copy_args,
    params: &CopyParams,
    list: &[PageCopy],
    stream: *mut c_void,
) -> Result<()> {
    params.check_copies(list)?;
    let host = |p: *mut c_void, name| {
        if params.num_host_pages == 0 {
            Ok(0)
        } else {
            not_null(p.cast_const(), name)
        }
    };
    let mem = DeviceCopy {
        key_cache: not_null(a.key_cache.cast_const(), "key_cache")?,
        value_cache: not_null(a.value_cache.cast_const(), "value_cache")?,
        host_key_cache: host(a.host_key_cache, "host_key_cache")?,
        host_value_cache: host(a.host_value_cache, "host_value_cache")?,
    };
    asc.copy_pages(params, list, &mem, stream as usize)
}

impl kvs_backend {
    /// Writes a one-line description of the backend into `buf` (NUL-terminated): its kind and,
    /// for Ascend, the device, the CANN libraries loaded and the op versions found and used
    /// (e.g. `aclnnFusedInferAttentionScore found: V2 (libopapi_transformer.so), V3 (...);
    /// using V3`), then the backend's own shape limits (`limits: head_dim <= 512, heads <= 4096,
    /// heads per kv head <= 64, ...` for Ascend; 1024 and 4096 for the CPU), for logs and support. `*len_out` gets the length without the NUL.
    /// `(NULL, 0)` only measures.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `backend` or `len_out` (or a NULL `buf`
    /// with `buf_len > 0`); `KVS_STATUS_BUFFER_TOO_SMALL` when `buf_len` is not more than the
    /// length (nothing is written). **Thread safety:** safe from any thread.
    #[no_mangle]
    pub extern "C" fn kvs_backend_describe(
        backend: *const kvs_backend,
        buf: *mut c_char,
        buf_len: usize,
        len_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: caller contract.
            let b = unsafe { handle::borrow(backend)? };
            let out = unsafe { try_out(len_out, "len_out")? };
            let text =
                format!("{}; {}", b.backend.describe(), b.backend.limits()).replace('\0', " ");
            if buf.is_null() && buf_len == 0 {
                *out = text.len();
                return Ok(());
            }
            // SAFETY: caller contract: `buf` holds `buf_len` bytes.
            let dst = unsafe { slice_mut(buf.cast::<u8>(), buf_len, "buf")? };
            if dst.len() <= text.len() {
                return Err(Error::BufferTooSmall {
                    what: "buf",
                    needed: text.len() + 1,
                    capacity: dst.len(),
                });
            }
            dst[..text.len()].copy_from_slice(text.as_bytes());
            dst[text.len()] = 0;
            *out = text.len();
            Ok(())
        })
    }
}
