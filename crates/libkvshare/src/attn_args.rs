//! The `#[repr(C)]` launch args of `kvs_attention_launch`, `kvs_kv_write` and `kvs_kv_copy`, and
//! their readers: the plain params of [`kvshare_attention`] from their
//! numbers (0 strides made dense, enum values decoded), and their pointers as host slices (for a
//! host-memory backend) or checked device addresses (for a device-memory one), with the pointer
//! checks every launch shares (alignment, overlap, NULL). No export lives here; `attn.rs` calls
//! these in order and nothing is written before all of them pass.

use super::enums::kvs_dtype;
use std::ffi::c_void;

use super::backend::Launcher;
use super::enums::decode;
use super::slice::{slice, slice_mut};

use super::slice::try_ref;
use crate::error::{Error, Result};
use kvshare_attention::{check_channel_scales, Buf, BufMut, CacheLayout, ChannelScales, KvScales};
use kvshare_core::DType;

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
    /// V cache of the layer (written). It shares no element with `key_cache`; the two may
    /// interleave (vLLM 0.32's CPU cache `[num_blocks, num_kv_heads, 2 * block_size, head_dim]`
    /// holds each block and head's K rows, then its V rows: `value_cache = key_cache +
    /// block_size * head_dim` elements, both with that cache's strides).
    pub value_cache: *mut c_void,
    /// Layout of both caches.
    pub cache: kvs_kv_layout,
    /// `[num_tokens]` slots, `int32_t` or `int64_t` as `slot_mapping_type` says.
    pub slot_mapping: *const c_void,
    /// A `kvs_index_type` value.
    pub slot_mapping_type: u32,
}

/// The dequantization scales of one layer's K and V cache: a cache element stands for its stored
/// value times its cache's per-tensor scale and, for an int8 cache, times the scale of its
/// channel (kv head, head-dim index). Read by `kvs_attention_launch_scaled` and
/// `kvs_kv_write_scaled`.
///
/// - `k_scale`, `v_scale`: per-tensor scales (vLLM's `k_scale`, `v_scale`), finite and > 0; 1 for
///   an unscaled cache. They apply to every cache type.
/// - `k_channel_scales`, `v_channel_scales`: host float `[num_kv_heads, head_dim]` each (Ascend's
///   and MindIE's int8 KV), every one finite and > 0: required with a `KVS_DTYPE_INT8` cache,
///   NULL with any other.
/// - `k_channel_offsets`, `v_channel_offsets`: host float `[num_kv_heads, head_dim]` each, or
///   NULL for 0 (each independently; only with channel scales): an int8 code `c` of channel `i`
///   then stands for `(c + offset_i) * channel_scale_i * scale`, CANN's antiquant formula
///   (MindIE's "C8" int8 KV: `kv_cache_scale` and `kv_cache_offset` per channel). Every one
///   finite. A K offset shifts every score of a query row equally, which the softmax ignores;
///   `kvs_attention_launch_scaled` refuses a soft cap with K offsets (`KVS_STATUS_UNSUPPORTED`).
///
/// **Thread safety:** plain data; the arrays must not change during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_kv_scales {
    /// Scale of the K cache.
    pub k_scale: f32,
    /// Scale of the V cache.
    pub v_scale: f32,
    /// Per-channel scales of an int8 K cache, `[num_kv_heads, head_dim]`, or NULL.
    pub k_channel_scales: *const f32,
    /// Per-channel scales of an int8 V cache, `[num_kv_heads, head_dim]`, or NULL.
    pub v_channel_scales: *const f32,
    /// Per-channel offsets (in codes) of an int8 K cache, `[num_kv_heads, head_dim]`, or NULL.
    pub k_channel_offsets: *const f32,
    /// Per-channel offsets (in codes) of an int8 V cache, `[num_kv_heads, head_dim]`, or NULL.
    pub v_channel_offsets: *const f32,
}

/// The scales struct `s` points to, or `None` for NULL (an unscaled cache).
///
/// # Safety
/// A non-NULL `s` points to a `kvs_kv_scales` readable for `'a` (the export contract).
pub(super) unsafe fn scales_ref<'a>(s: *const kvs_kv_scales) -> Result<Option<&'a kvs_kv_scales>> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's contract; `try_ref` checks alignment.
    Ok(Some(unsafe { try_ref(s, "scales") }.map_err(attn)?))
}

/// The per-tensor scales of `s` (1 and 1 without it).
pub(super) fn per_tensor(s: Option<&kvs_kv_scales>) -> KvScales {
    s.map_or(KvScales::ONE, |s| KvScales::new(s.k_scale, s.v_scale))
}

/// The per-channel scales (and offsets) of `s` as host slices of `num_kv_heads * head_dim`
/// floats, checked against the cache (present exactly for an int8 cache, every scale finite and
/// positive, every offset finite; offsets only with scales). Call after the cache's numbers
/// are validated: they size the slices.
///
/// # Safety
/// Non-NULL channel pointers of `s` are valid for `num_kv_heads * head_dim` floats for `'a`
/// (the export contract).
pub(super) unsafe fn channel_scales<'a>(
    s: Option<&'a kvs_kv_scales>,
    cache: &CacheLayout,
) -> Result<Option<ChannelScales<'a>>> {
    let n = cache.num_kv_heads * cache.head_dim;
    let ch = match s.map(|s| (s.k_channel_scales, s.v_channel_scales)) {
        None => None,
        Some((k, v)) if k.is_null() && v.is_null() => None,
        Some((k, v)) if k.is_null() || v.is_null() => {
            let (null, other) = if k.is_null() {
                ("k_channel_scales", "v_channel_scales")
            } else {
                ("v_channel_scales", "k_channel_scales")
            };
            return Err(Error::attn(
                null,
                format!("is NULL while {other} is not: give both or neither"),
            ));
        }
        // SAFETY: non-NULL channel pointers hold `n` floats (the caller's contract); `aslice`
        // checks alignment.
        Some((k, v)) => Some(unsafe {
            ChannelScales {
                k: aslice(k, n, "k_channel_scales")?,
                v: aslice(v, n, "v_channel_scales")?,
                k_offsets: None,
                v_offsets: None,
            }
        }),
    };
    let offsets = s.map_or((std::ptr::null(), std::ptr::null()), |s| {
        (s.k_channel_offsets, s.v_channel_offsets)
    });
    let ch = if let Some(mut c) = ch {
        let opt = |p: *const f32, field| -> Result<Option<&'a [f32]>> {
            if p.is_null() {
                return Ok(None);
            }
            // SAFETY: a non-NULL offset pointer holds `n` floats (the caller's contract);
            // `aslice` checks alignment.
            Ok(Some(unsafe { aslice(p, n, field)? }))
        };
        c.k_offsets = opt(offsets.0, "k_channel_offsets")?;
        c.v_offsets = opt(offsets.1, "v_channel_offsets")?;
        Some(c)
    } else {
        for (p, field) in [
            (offsets.0, "k_channel_offsets"),
            (offsets.1, "v_channel_offsets"),
        ] {
            if !p.is_null() {
                return Err(Error::attn(
                    field,
                    "is given without channel scales (offsets are for int8 caches, with scales)",
                ));
            }
        }
        None
    };
    check_channel_scales(cache, ch)?;
    Ok(ch)
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
pub(super) fn attn(e: Error) -> Error {
    match e {
        Error::Cache(kvshare_core::Error::InvalidArgument { field, reason }) => {
            Error::attn(field, reason)
        }
        e => e,
    }
}

pub(super) fn dtype(raw: u32, field: &'static str) -> Result<DType> {
    decode::<kvs_dtype>(raw, field)
        .map(DType::from)
        .map_err(attn)
}

pub(super) fn or_dense(stride: usize, dense: usize) -> usize {
    if stride == 0 {
        dense
    } else {
        stride
    }
}

pub(super) fn layout(c: &kvs_kv_layout, num_pages: u32) -> Result<CacheLayout> {
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
        return Err(Error::attn(
            name,
            format!(
                "pointer {ptr:p} is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        ));
    }
    Ok(())
}

/// The one check of a paged K/V cache pointer, shared by `kvs_attention_launch`, `kvs_kv_write`
/// and `kvs_kv_copy` so that a pointer one call refuses is refused by all: aligned to the cache's
/// element type, and a device cache (`device`) of a device-memory backend to what that backend
/// requires ([`DeviceBackend::check_address`]; CANN's 32 bytes). NULL is left to each call's own
/// NULL check.
pub(super) fn cache_ptr(
    launcher: &Launcher,
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
        return Err(Error::attn(
            name,
            format!("pointer {ptr:p} is not aligned to {align} bytes (its element size)"),
        ));
    }
    if let (true, Launcher::Device(be)) = (device, launcher) {
        be.check_address(name, ptr as usize)?;
    }
    Ok(())
}

/// [`slice`] with attention errors.
///
/// # Safety
/// As [`slice`].
pub(super) unsafe fn aslice<'a, T>(
    ptr: *const T,
    len: usize,
    name: &'static str,
) -> Result<&'a [T]> {
    aligned(ptr, name)?;
    // SAFETY: the caller gives `slice`'s contract.
    unsafe { slice(ptr, len, name) }.map_err(attn)
}

/// [`slice_mut`] with attention errors.
///
/// # Safety
/// As [`slice_mut`].
pub(super) unsafe fn aslice_mut<'a, T>(
    ptr: *mut T,
    len: usize,
    name: &'static str,
) -> Result<&'a mut [T]> {
    aligned(ptr.cast_const(), name)?;
    // SAFETY: the caller gives `slice_mut`'s contract.
    unsafe { slice_mut(ptr, len, name) }.map_err(attn)
}

/// # Safety
/// Non-NULL `ptr` must be valid for `len` elements of `dtype` for `'a`.
pub(super) unsafe fn buf<'a>(
    ptr: *const c_void,
    dtype: DType,
    len: usize,
    name: &'static str,
) -> Result<Buf<'a>> {
    Ok(match dtype {
        // SAFETY: the caller guarantees `len` elements of `dtype` at a non-NULL `ptr`, the type
        // each arm reads.
        DType::F32 => Buf::F32(unsafe { aslice(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::F16 => Buf::F16(unsafe { aslice(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::BF16 => Buf::BF16(unsafe { aslice(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::Fp8E4M3 => Buf::Fp8E4M3(unsafe { aslice(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::Fp8E5M2 => Buf::Fp8E5M2(unsafe { aslice(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::Int8 => Buf::I8(unsafe { aslice(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::Int8PerTokenHead => Buf::I8Rows(unsafe { aslice(ptr.cast(), len, name) }?),
    })
}

/// # Safety
/// As [`buf`], and nothing else accesses the memory during `'a`.
pub(super) unsafe fn buf_mut<'a>(
    ptr: *mut c_void,
    dtype: DType,
    len: usize,
    name: &'static str,
) -> Result<BufMut<'a>> {
    Ok(match dtype {
        // SAFETY: as in `buf`, and the caller guarantees nothing else accesses the memory.
        DType::F32 => BufMut::F32(unsafe { aslice_mut(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::F16 => BufMut::F16(unsafe { aslice_mut(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::BF16 => BufMut::BF16(unsafe { aslice_mut(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::Fp8E4M3 => BufMut::Fp8E4M3(unsafe { aslice_mut(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::Fp8E5M2 => BufMut::Fp8E5M2(unsafe { aslice_mut(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::Int8 => BufMut::I8(unsafe { aslice_mut(ptr.cast(), len, name) }?),
        // SAFETY: as above.
        DType::Int8PerTokenHead => BufMut::I8Rows(unsafe { aslice_mut(ptr.cast(), len, name) }?),
    })
}

/// Refuses a written buffer that overlaps another buffer of the call (that would alias a
/// `&mut` slice).
pub(super) fn no_overlap(
    w: (&'static str, *const c_void, usize),
    others: &[(&'static str, *const c_void, usize)],
) -> Result<()> {
    let (a0, a1) = (w.1 as usize, w.1 as usize + w.2);
    for &(name, p, bytes) in others {
        let (b0, b1) = (p as usize, p as usize + bytes);
        if !p.is_null() && bytes > 0 && w.2 > 0 && a0 < b1 && b0 < a1 {
            return Err(Error::attn(w.0, format!("overlaps `{name}`")));
        }
    }
    Ok(())
}

/// Where a KV write's K and V caches lie relative to each other ([`cache_pair`]).
pub(super) enum CachePair {
    /// In disjoint byte ranges: two buffers.
    Split,
    /// In overlapping byte ranges without a shared element (interleaved, as vLLM 0.32's CPU
    /// cache): one buffer of `bytes` bytes at `lo`, K starting `key` and V `value` elements in.
    Shared {
        lo: *mut c_void,
        bytes: usize,
        key: usize,
        value: usize,
    },
}

/// How the K and V caches of a KV write (`cache_len` elements of `cache`'s layout each) lie:
/// apart, or interleaved without sharing an element ([`CacheLayout::shifted_overlaps`], exact
/// for strided layouts); refused as overlapping when they share one. NULL is left to the
/// call's own NULL check.
pub(super) fn cache_pair(
    key: *mut c_void,
    value: *mut c_void,
    cache: &CacheLayout,
    cache_len: usize,
) -> Result<CachePair> {
    let esz = cache.dtype.size_bytes();
    let bytes = cache_len * esz;
    let (k, v) = (key as usize, value as usize);
    if key.is_null()
        || value.is_null()
        || bytes == 0
        || k.saturating_add(bytes) <= v
        || v.saturating_add(bytes) <= k
    {
        return Ok(CachePair::Split);
    }
    let delta = k.abs_diff(v);
    if !delta.is_multiple_of(esz) || cache.shifted_overlaps(delta / esz) {
        return Err(Error::attn("value_cache", "overlaps `key_cache`"));
    }
    let lo = k.min(v);
    Ok(CachePair::Shared {
        lo: if k <= v { key } else { value },
        bytes: delta + bytes,
        key: (k - lo) / esz,
        value: (v - lo) / esz,
    })
}

/// A device address that must not be NULL (device memory is never read on the host, so the
/// address is all a device-memory backend gets).
pub(super) fn not_null<T>(p: *const T, name: &'static str) -> Result<usize> {
    if p.is_null() {
        Err(Error::NullArgument(name))
    } else {
        Ok(p as usize)
    }
}
