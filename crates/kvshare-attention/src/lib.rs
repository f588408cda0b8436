//! Paged attention, KV write and page copy behind one backend trait.
//!
//! The backends' own code is safe Rust where it can be; the CPU kernels' SIMD and the Ascend
//! runtime's C calls are `unsafe`, each with the contract its caller keeps. It holds:
//!
//! * [`params`]: the argument types ([`CacheLayout`], [`AttnParams`], [`KvWriteParams`],
//!   [`CopyParams`]), plain numbers that mirror the `#[repr(C)]` structs of `ffi/attn.rs`;
//! * their validation: every shape, stride, dtype, head ratio and length is checked before a
//!   launch, and the data-dependent host arrays (context lengths, query starts, used block-table
//!   entries, slot mapping, copy pairs) are checked before anything is written. Errors are
//!   [`Error::Invalid`] naming the C field. The Ascend backend ([`ascend`]) reuses these
//!   checks on the same numbers; only the memory it launches on differs;
//! * the [`Backend`] trait (host memory) and the validated batch types it receives
//!   ([`AttnBatch`], [`KvWrite`], [`PageCopyBatch`]), which can only be built through
//!   validation; [`BackendInfo`], what every backend reports;
//! * [`device`]: the [`DeviceBackend`] trait for backends on device memory (Ascend) and its
//!   validated batches;
//! * [`copy_runs`]: a page copy split into contiguous byte runs per layout, shared by every
//!   backend;
//! * [`cpu`]: the CPU backend.
//!
//! # Layouts (all strides in elements, never bytes)
//!
//! * K and V cache of one layer: `[num_pages, page_size, num_kv_heads, head_dim]` as vLLM-Ascend
//!   and MindIE store it (CANN "BnBsH" viewed 4-D). The three outer strides are explicit
//!   (`page`, `slot`, `head`); `head_dim` is contiguous (stride 1). Any non-overlapping choice is
//!   accepted, so CANN's faster `[num_pages, num_kv_heads, page_size, head_dim]` ("BnNBsD") is the
//!   same struct with other strides. K and V share the layout.
//! * Query and output: `[num_tokens, num_heads, head_dim]` with explicit token and head strides,
//!   `head_dim` contiguous. Query head `h` reads kv head `h / (num_heads / num_kv_heads)`.
//! * Block table: int32 `[num_seqs, max_pages_per_seq]` with an explicit row stride.
//! * Context lengths: host int32 `[num_seqs]`, KV tokens of each sequence *including* this step's
//!   query tokens (already written with the KV write).
//! * Query starts (prefill, varlen): host int32 `[num_seqs + 1]`, cumulative, `starts[0] == 0`,
//!   `starts[num_seqs] == num_tokens`. Absent means decode: one query token per sequence.
//!   Query token `i` of a sequence with context length `L` and query length `q` sits at position
//!   `L - q + i` and attends causally to positions `0..=L - q + i`.

pub mod ascend;
pub mod copy_runs;
pub mod cpu;
pub mod device;
pub mod error;
pub mod fp8;
pub mod params;
pub mod pool;
pub mod team;

use half::{bf16, f16};

pub use device::DeviceBackend;
pub use error::{Error, Result};
pub use fp8::{Fp8, Fp8E4M3, Fp8E5M2};
pub use kvshare_core::DType;
use params::bad;
pub use params::{
    check_host_arrays, check_slots, span, AttnParams, AttnSpans, CacheLayout, CopyKind, CopyParams,
    KvScales, KvWriteParams, PageCopy, SeqSpan, SlotMapping, TokenStrides, MAX_ATTN_PAGE_SIZE,
    MAX_PAGES,
};

/// A host buffer of one of the supported element types.
#[derive(Debug, Clone, Copy)]
pub enum Buf<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    BF16(&'a [bf16]),
    /// fp8 E4M3 elements (a quantized cache).
    Fp8E4M3(&'a [Fp8E4M3]),
    /// fp8 E5M2 elements (a quantized cache).
    Fp8E5M2(&'a [Fp8E5M2]),
    /// int8 elements (a quantized cache with per-channel scales).
    I8(&'a [i8]),
    /// An int8 cache with a scale per (token, kv head) row ([`DType::Int8PerTokenHead`]): as
    /// bytes, each row `head_dim` codes then its f32 scale (4 bytes, little-endian).
    I8Rows(&'a [i8]),
}

/// A mutable host buffer of one of the supported element types.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// f16 elements.
    F16(&'a mut [f16]),
    /// bf16 elements.
    BF16(&'a mut [bf16]),
    /// fp8 E4M3 elements (a quantized cache).
    Fp8E4M3(&'a mut [Fp8E4M3]),
    /// fp8 E5M2 elements (a quantized cache).
    Fp8E5M2(&'a mut [Fp8E5M2]),
    /// int8 elements (a quantized cache with per-channel scales).
    I8(&'a mut [i8]),
    /// An int8 cache with a scale per (token, kv head) row ([`DType::Int8PerTokenHead`]): as
    /// bytes, each row `head_dim` codes then its f32 scale (4 bytes, little-endian).
    I8Rows(&'a mut [i8]),
}

impl Buf<'_> {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Buf::F32(_) => DType::F32,
            Buf::F16(_) => DType::F16,
            Buf::BF16(_) => DType::BF16,
            Buf::Fp8E4M3(_) => DType::Fp8E4M3,
            Buf::Fp8E5M2(_) => DType::Fp8E5M2,
            Buf::I8(_) => DType::Int8,
            Buf::I8Rows(_) => DType::Int8PerTokenHead,
        }
    }
    /// Length in elements.
    pub fn len(&self) -> usize {
        match self {
            Buf::F32(s) => s.len(),
            Buf::F16(s) => s.len(),
            Buf::BF16(s) => s.len(),
            Buf::Fp8E4M3(s) => s.len(),
            Buf::Fp8E5M2(s) => s.len(),
            Buf::I8(s) | Buf::I8Rows(s) => s.len(),
        }
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Converts `dst.len()` elements starting at `off` to f32 (an fp8 or int8 element to its
    /// value, before any scale; a per-token-head int8 cache's bytes as codes).
    pub fn read_f32(&self, off: usize, dst: &mut [f32]) {
        let n = dst.len();
        match self {
            Buf::F32(s) => dst.copy_from_slice(&s[off..off + n]),
            Buf::F16(s) => {
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(&s[off..off + n], dst)
            }
            Buf::BF16(s) => {
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(&s[off..off + n], dst)
            }
            Buf::Fp8E4M3(s) => dst
                .iter_mut()
                .zip(&s[off..off + n])
                .for_each(|(d, x)| *d = x.to_f32()),
            Buf::Fp8E5M2(s) => dst
                .iter_mut()
                .zip(&s[off..off + n])
                .for_each(|(d, x)| *d = x.to_f32()),
            Buf::I8(s) | Buf::I8Rows(s) => dst
                .iter_mut()
                .zip(&s[off..off + n])
                .for_each(|(d, &x)| *d = x as f32),
        }
    }
}

impl BufMut<'_> {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            BufMut::F32(_) => DType::F32,
            BufMut::F16(_) => DType::F16,
            BufMut::BF16(_) => DType::BF16,
            BufMut::Fp8E4M3(_) => DType::Fp8E4M3,
            BufMut::Fp8E5M2(_) => DType::Fp8E5M2,
            BufMut::I8(_) => DType::Int8,
            BufMut::I8Rows(_) => DType::Int8PerTokenHead,
        }
    }
    /// Length in elements.
    pub fn len(&self) -> usize {
        match self {
            BufMut::F32(s) => s.len(),
            BufMut::F16(s) => s.len(),
            BufMut::BF16(s) => s.len(),
            BufMut::Fp8E4M3(s) => s.len(),
            BufMut::Fp8E5M2(s) => s.len(),
            BufMut::I8(s) | BufMut::I8Rows(s) => s.len(),
        }
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A shared view.
    pub fn as_buf(&self) -> Buf<'_> {
        match self {
            BufMut::F32(s) => Buf::F32(s),
            BufMut::F16(s) => Buf::F16(s),
            BufMut::BF16(s) => Buf::BF16(s),
            BufMut::Fp8E4M3(s) => Buf::Fp8E4M3(s),
            BufMut::Fp8E5M2(s) => Buf::Fp8E5M2(s),
            BufMut::I8(s) => Buf::I8(s),
            BufMut::I8Rows(s) => Buf::I8Rows(s),
        }
    }
}

fn check_buf(
    field: &'static str,
    dtype: DType,
    len: usize,
    want_dtype: DType,
    want_len: usize,
) -> Result<()> {
    if dtype != want_dtype {
        return Err(bad(
            field,
            format!("buffer is {dtype:?}, the arguments say {want_dtype:?}"),
        ));
    }
    if len < want_len {
        return Err(bad(
            field,
            format!("buffer has {len} elements, the layout needs {want_len}"),
        ));
    }
    Ok(())
}

/// The per-channel scales of an int8 cache (Ascend's and MindIE's int8 KV): `[num_kv_heads,
/// head_dim]` floats each, and optionally per-channel offsets of the same shape: a code `c` of
/// channel `i` stands for `(c + offset_i) * scale_i` times the per-tensor [`KvScales`] (CANN's
/// antiquant formula; without offsets, `c * scale_i`). Required with an int8 cache, refused
/// with any other.
#[derive(Debug, Clone, Copy)]
pub struct ChannelScales<'a> {
    /// Scales of the K cache's channels.
    pub k: &'a [f32],
    /// Scales of the V cache's channels.
    pub v: &'a [f32],
    /// Offsets of the K cache's channels, in codes (`None`: 0, a symmetric cache).
    pub k_offsets: Option<&'a [f32]>,
    /// Offsets of the V cache's channels, in codes (`None`: 0).
    pub v_offsets: Option<&'a [f32]>,
}

impl<'a> ChannelScales<'a> {
    /// Symmetric per-channel scales (no offsets).
    pub fn symmetric(k: &'a [f32], v: &'a [f32]) -> Self {
        ChannelScales {
            k,
            v,
            k_offsets: None,
            v_offsets: None,
        }
    }
}

/// Checks that `x` has at least `n` entries and the first `n` pass `ok` (`what` names the
/// condition in the error).
fn check_per_channel(
    field: &'static str,
    x: &[f32],
    n: usize,
    ok: fn(f32) -> bool,
    what: &str,
) -> Result<()> {
    if x.len() < n {
        return Err(bad(
            field,
            format!(
                "has {} entries, needs num_kv_heads * head_dim = {n}",
                x.len()
            ),
        ));
    }
    match x[..n].iter().enumerate().find(|(_, y)| !ok(**y)) {
        Some((i, y)) => Err(bad(field, format!("[{i}] = {y} is not {what}"))),
        None => Ok(()),
    }
}

/// Checks channel scales against the cache: present exactly for an int8 cache, `num_kv_heads *
/// head_dim` of each, every scale finite and > 0, every offset finite.
pub fn check_channel_scales(cache: &CacheLayout, s: Option<ChannelScales<'_>>) -> Result<()> {
    match (cache.dtype, s) {
        (DType::Int8, None) => Err(bad(
            "k_channel_scales",
            "an int8 cache needs per-channel scales (num_kv_heads * head_dim each for K and V)",
        )),
        (DType::Int8, Some(s)) => {
            let n = cache.num_kv_heads * cache.head_dim;
            for (field, x) in [("k_channel_scales", s.k), ("v_channel_scales", s.v)] {
                let positive = |y: f32| y.is_finite() && y > 0.0;
                check_per_channel(field, x, n, positive, "a finite number > 0")?;
            }
            for (field, x) in [
                ("k_channel_offsets", s.k_offsets),
                ("v_channel_offsets", s.v_offsets),
            ] {
                if let Some(x) = x {
                    check_per_channel(field, x, n, f32::is_finite, "a finite number")?;
                }
            }
            Ok(())
        }
        (DType::Int8PerTokenHead, Some(_)) => Err(bad(
            "k_channel_scales",
            "per-channel scales (and offsets) are for KVS_DTYPE_INT8 caches; a \
             KVS_DTYPE_INT8_PER_TOKEN_HEAD cache keeps a scale per (token, kv head) row in its \
             pages, computed by the KV write: pass no channel scales",
        )),
        (_, Some(_)) => Err(bad(
            "k_channel_scales",
            format!(
                "per-channel scales are for int8 caches; this cache is {:?}",
                cache.dtype
            ),
        )),
        (_, None) => Ok(()),
    }
}

/// Checks an attention launch's channel scales ([`check_channel_scales`]) and refuses a soft
/// cap with K channel offsets, on every backend.
pub fn check_attn_scales(params: &AttnParams, s: Option<ChannelScales<'_>>) -> Result<()> {
    check_channel_scales(&params.cache, s)?;
    if params.softcap != 0.0 && s.is_some_and(|c| c.k_offsets.is_some()) {
        // A K offset adds the same amount to every score of a query row, which the softmax
        // ignores and the kernels therefore drop; a soft cap does not ignore it.
        return Err(Error::Unsupported(
            "softcap with int8 K channel offsets (the cap is applied to scores the offsets shift)"
                .into(),
        ));
    }
    Ok(())
}

/// The host memory of an attention launch (inputs and output).
#[derive(Debug)]
pub struct AttnBuffers<'a> {
    /// `[num_tokens, num_heads, head_dim]`.
    pub query: Buf<'a>,
    /// K cache of the layer.
    pub key_cache: Buf<'a>,
    /// V cache of the layer.
    pub value_cache: Buf<'a>,
    /// `[num_seqs, block_table_stride]`.
    pub block_table: &'a [i32],
    /// `[num_seqs]`.
    pub context_lens: &'a [i32],
    /// `[num_seqs + 1]` for varlen, `None` for decode.
    pub query_start_loc: Option<&'a [i32]>,
    /// `[num_tokens, num_heads, head_dim]`; must not overlap the inputs.
    pub output: BufMut<'a>,
    /// Per-channel scales: with an int8 cache only (and then required).
    pub channel_scales: Option<ChannelScales<'a>>,
}

/// A fully validated attention launch. Built only by [`AttnBatch::new`].
#[derive(Debug)]
pub struct AttnBatch<'a> {
    params: AttnParams,
    bufs: AttnBuffers<'a>,
    seqs: Vec<SeqSpan>,
}

impl<'a> AttnBatch<'a> {
    /// Validates params, buffer dtypes and lengths, and the host arrays. Nothing is written.
    pub fn new(params: AttnParams, bufs: AttnBuffers<'a>) -> Result<Self> {
        let spans = params.validate()?;
        check_buf(
            "query",
            bufs.query.dtype(),
            bufs.query.len(),
            params.query_dtype,
            spans.query,
        )?;
        check_buf(
            "key_cache",
            bufs.key_cache.dtype(),
            bufs.key_cache.len(),
            params.cache.dtype,
            spans.cache,
        )?;
        check_buf(
            "value_cache",
            bufs.value_cache.dtype(),
            bufs.value_cache.len(),
            params.cache.dtype,
            spans.cache,
        )?;
        check_buf(
            "output",
            bufs.output.dtype(),
            bufs.output.len(),
            params.output_dtype,
            spans.output,
        )?;
        let lens = |field, got: usize, want: usize| {
            if got < want {
                Err(bad(field, format!("has {got} entries, needs {want}")))
            } else {
                Ok(())
            }
        };
        lens("block_table", bufs.block_table.len(), spans.block_table)?;
        lens("context_lens", bufs.context_lens.len(), spans.context_lens)?;
        match (params.varlen, bufs.query_start_loc) {
            (true, Some(q)) => lens("query_start_loc", q.len(), spans.query_start_loc)?,
            (false, None) => {}
            _ => {
                return Err(bad(
                    "query_start_loc",
                    "presence disagrees with params.varlen",
                ))
            }
        }
        check_attn_scales(&params, bufs.channel_scales)?;
        let seqs = check_host_arrays(
            &params,
            bufs.context_lens,
            bufs.query_start_loc,
            Some(bufs.block_table),
        )?;
        Ok(AttnBatch { params, bufs, seqs })
    }

    /// The validated params.
    pub fn params(&self) -> &AttnParams {
        &self.params
    }

    /// Per-sequence spans.
    pub fn seqs(&self) -> &[SeqSpan] {
        &self.seqs
    }
}

/// A validated KV write. Built only by [`KvWrite::new`].
#[derive(Debug)]
pub struct KvWrite<'a> {
    params: KvWriteParams,
    key: Buf<'a>,
    value: Buf<'a>,
    slots: SlotMapping<'a>,
    caches: KvCachesMut<'a>,
    channel_scales: Option<ChannelScales<'a>>,
}

/// The K and V caches a KV write stores into, both laid out as its `cache` layout.
#[derive(Debug)]
pub enum KvCachesMut<'a> {
    /// Two buffers.
    Split {
        /// K cache.
        key: BufMut<'a>,
        /// V cache.
        value: BufMut<'a>,
    },
    /// One buffer holding both caches, K's first element at `key` and V's at `value` (element
    /// offsets): caches whose elements interleave without any shared, such as vLLM 0.32's CPU
    /// cache, whose every `(block, head)` holds its K rows and then its V rows
    /// ([`CacheLayout::shifted_overlaps`] decides; [`KvWrite::new`] refuses caches that share
    /// an element).
    Shared {
        /// The buffer both caches lie in.
        buf: BufMut<'a>,
        /// Offset of the K cache in `buf`.
        key: usize,
        /// Offset of the V cache in `buf`.
        value: usize,
    },
}

impl<'a> KvWrite<'a> {
    /// Validates numbers, buffers, the channel scales (with an int8 cache only, and then
    /// required) and every slot. Nothing is written.
    pub fn new(
        params: KvWriteParams,
        key: Buf<'a>,
        value: Buf<'a>,
        slots: SlotMapping<'a>,
        caches: KvCachesMut<'a>,
        channel_scales: Option<ChannelScales<'a>>,
    ) -> Result<Self> {
        let (src, cache) = params.validate()?;
        check_buf("key", key.dtype(), key.len(), params.src_dtype, src)?;
        check_buf("value", value.dtype(), value.len(), params.src_dtype, src)?;
        let want = params.cache.dtype;
        match &caches {
            KvCachesMut::Split { key, value } => {
                check_buf("key_cache", key.dtype(), key.len(), want, cache)?;
                check_buf("value_cache", value.dtype(), value.len(), want, cache)?;
            }
            KvCachesMut::Shared {
                buf,
                key: k,
                value: v,
            } => {
                for (field, at) in [("key_cache", *k), ("value_cache", *v)] {
                    let need = at
                        .checked_add(cache)
                        .ok_or_else(|| bad(field, "offset overflows"))?;
                    check_buf(field, buf.dtype(), buf.len(), want, need)?;
                }
                if params.cache.shifted_overlaps(k.abs_diff(*v)) {
                    return Err(bad("value_cache", "shares elements with `key_cache`"));
                }
            }
        }
        if slots.len() < params.num_tokens {
            return Err(bad(
                "slot_mapping",
                format!(
                    "has {} entries, needs num_tokens = {}",
                    slots.len(),
                    params.num_tokens
                ),
            ));
        }
        check_channel_scales(&params.cache, channel_scales)?;
        check_slots(&slots, &params.cache)?;
        Ok(KvWrite {
            params,
            key,
            value,
            slots,
            caches,
            channel_scales,
        })
    }
}

/// The four caches of a page copy, as bytes (a copy moves bytes; the dtype only sizes them).
#[derive(Debug)]
pub struct CopyCaches<'a> {
    /// Device K cache.
    pub key_cache: &'a mut [u8],
    /// Device V cache.
    pub value_cache: &'a mut [u8],
    /// Host K cache (empty when there are no host pages).
    pub host_key_cache: &'a mut [u8],
    /// Host V cache (empty when there are no host pages).
    pub host_value_cache: &'a mut [u8],
}

/// A validated page copy. Built only by [`PageCopyBatch::new`].
#[derive(Debug)]
pub struct PageCopyBatch<'a> {
    params: CopyParams,
    caches: CopyCaches<'a>,
    copies: &'a [PageCopy],
}

impl<'a> PageCopyBatch<'a> {
    /// Validates numbers, buffer sizes and every copy. Nothing is written.
    pub fn new(params: CopyParams, caches: CopyCaches<'a>, copies: &'a [PageCopy]) -> Result<Self> {
        let (device, host) = params.validate()?;
        let esz = params.cache.dtype.size_bytes();
        for (field, len, want) in [
            ("key_cache", caches.key_cache.len(), device),
            ("value_cache", caches.value_cache.len(), device),
            ("host_key_cache", caches.host_key_cache.len(), host),
            ("host_value_cache", caches.host_value_cache.len(), host),
        ] {
            if len < want * esz {
                return Err(bad(
                    field,
                    format!("buffer has {len} bytes, the layout needs {}", want * esz),
                ));
            }
        }
        params.check_copies(copies)?;
        Ok(PageCopyBatch {
            params,
            caches,
            copies,
        })
    }
}

/// The largest shapes a backend accepts, reported by `kvs_backend_describe` (CANN's kernels stop
/// earlier than the shared checks that the CPU backend applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest head dimension.
    pub head_dim: usize,
    /// Most query (and kv) heads.
    pub heads: usize,
    /// Largest `num_heads / num_kv_heads`.
    pub group: usize,
    /// Most sequences, or tokens, of one launch.
    pub batch: usize,
}

impl Limits {
    /// The checks every backend shares ([`params`]): the CPU backend's limits.
    pub fn shared() -> Self {
        Limits {
            head_dim: params::MAX_HEAD_DIM,
            heads: params::MAX_HEADS,
            group: params::MAX_HEADS,
            batch: params::MAX_BATCH,
        }
    }
}

impl std::fmt::Display for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "limits: head_dim <= {}, heads <= {}, heads per kv head <= {}, sequences or tokens \
             per launch <= {}",
            self.head_dim, self.heads, self.group, self.batch
        )
    }
}

/// What every backend reports, host or device memory alike (the C layer's
/// `kvs_backend_describe`).
pub trait BackendInfo: Send + Sync {
    /// Short name ("cpu", "ascend").
    fn name(&self) -> &'static str;
    /// One line for logs and support (`kvs_backend_describe` adds [`limits`](Self::limits)).
    fn describe(&self) -> String {
        self.name().to_string()
    }
    /// The largest shapes this backend accepts.
    fn limits(&self) -> Limits {
        Limits::shared()
    }
}

/// A compute backend on **host memory**: receives only validated batches of host slices; a
/// backend must not write anything when it returns an error it could have detected before
/// starting. (Backends on device memory implement [`DeviceBackend`] instead.)
///
/// **Thread safety:** backends are `Send + Sync`; calls on one backend may come from several
/// threads (the CPU backend serializes them on its pool).
pub trait Backend: BackendInfo {
    /// Paged attention; writes the output rows of every query token and head.
    fn attention(&self, batch: AttnBatch<'_>) -> Result<()>;
    /// Scatters new K and V into the caches by slot.
    fn kv_write(&self, write: KvWrite<'_>) -> Result<()>;
    /// Copies pages (or a prefix of a page's slots) in order, within and between tiers.
    fn copy_pages(&self, batch: PageCopyBatch<'_>) -> Result<()>;
}
