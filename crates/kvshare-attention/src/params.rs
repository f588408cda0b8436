//! The numbers of attention, KV-write and page-copy launches (no memory) and their checks.
//!
//! Everything here is plain data, shared by every backend: the CPU backend checks these before
//! touching memory, and the Ascend backend will check the same numbers before building its
//! `aclTensor`s. Errors are [`Error::Invalid`] naming the field of the C struct.

use crate::error::{Error, Result};
use kvshare_core::DType;
pub use kvshare_core::{CopyKind, PageCopy};

/// Largest head dimension accepted.
pub(crate) const MAX_HEAD_DIM: usize = 1024;

/// Largest number of query heads (and kv heads) accepted.
pub(crate) const MAX_HEADS: usize = 4096;

/// Largest page size accepted by the attention launches. Not the cache manager's limit
/// (`core::config::MAX_PAGE_SIZE`, `KVS_MAX_PAGE_SIZE` in C: 1024): a larger page here lets the
/// benchmark express a contiguous cache as one page per sequence.
pub const MAX_ATTN_PAGE_SIZE: usize = 1 << 16;

/// Largest page count of one cache tier (fits `i32` block-table entries).
pub const MAX_PAGES: usize = (i32::MAX as usize) + 1;

/// Largest number of sequences or tokens in one launch.
pub(crate) const MAX_BATCH: usize = 1 << 24;

pub(crate) fn bad(field: &'static str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        field,
        reason: reason.into(),
    }
}

fn check_range(field: &'static str, v: usize, max: usize) -> Result<()> {
    if v == 0 || v > max {
        return Err(bad(field, format!("{v} is not in 1..={max}")));
    }
    Ok(())
}

/// Elements spanned by a tensor whose innermost dimension (`inner` elements) is contiguous and
/// whose outer dimensions are `(size, stride, stride's field name)`, after checking that the
/// strides describe non-overlapping memory (sorted by stride, each stride reaches past all
/// smaller dimensions). Sizes must be at least 1.
pub fn span(inner: usize, dims: &[(usize, usize, &'static str)]) -> Result<usize> {
    let mut sorted: Vec<_> = dims.iter().filter(|d| d.0 > 1).collect();
    sorted.sort_by_key(|d| d.1);
    let mut extent = inner;
    for &&(size, stride, field) in &sorted {
        if stride < extent {
            return Err(bad(
                field,
                format!("stride {stride} overlaps the inner {extent} elements of the layout"),
            ));
        }
        extent = (size - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(extent))
            .filter(|&x| x <= isize::MAX as usize / 4)
            .ok_or_else(|| bad(field, "tensor size overflows"))?;
        // `extent` is now max offset + 1 of everything sorted so far.
    }
    Ok(extent)
}

/// Elements of one `(slot, head)` row of `dtype` ([`CacheLayout::row_len`]).
fn row_len(dtype: DType, head_dim: usize) -> usize {
    head_dim + dtype.row_scale_bytes() / dtype.size_bytes()
}

/// Layout of one layer's K (or V) cache: `[num_pages, page_size, num_kv_heads, head_dim]` with
/// explicit outer strides (elements); `head_dim` contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLayout {
    /// Element type of K and V.
    pub dtype: DType,
    /// Pages in the cache.
    pub num_pages: usize,
    /// Token slots per page.
    pub page_size: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Elements between pages.
    pub page_stride: usize,
    /// Elements between token slots of a page.
    pub slot_stride: usize,
    /// Elements between kv heads of a slot.
    pub head_stride: usize,
}

impl CacheLayout {
    /// The dense `[num_pages, page_size, num_kv_heads, head_dim]` layout.
    pub fn dense(
        dtype: DType,
        num_pages: usize,
        page_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        CacheLayout {
            dtype,
            num_pages,
            page_size,
            num_kv_heads,
            head_dim,
            page_stride: page_size * num_kv_heads * row_len(dtype, head_dim),
            slot_stride: num_kv_heads * row_len(dtype, head_dim),
            head_stride: row_len(dtype, head_dim),
        }
    }

    /// Elements (bytes, for the 1-byte types) of one `(slot, head)` row: `head_dim`, plus the
    /// row's f32 scale (4 bytes) for an int8 per-token-head cache, whose strides must leave
    /// room for it.
    pub fn row_len(&self) -> usize {
        row_len(self.dtype, self.head_dim)
    }

    /// Checks sizes and strides; returns the elements one cache buffer must hold.
    pub fn validate(&self) -> Result<usize> {
        check_range("num_pages", self.num_pages, MAX_PAGES)?;
        check_range("page_size", self.page_size, MAX_ATTN_PAGE_SIZE)?;
        check_range("num_kv_heads", self.num_kv_heads, MAX_HEADS)?;
        check_range("head_dim", self.head_dim, MAX_HEAD_DIM)?;
        span(
            self.row_len(),
            &[
                (self.num_kv_heads, self.head_stride, "cache_head_stride"),
                (self.page_size, self.slot_stride, "cache_slot_stride"),
                (self.num_pages, self.page_stride, "cache_page_stride"),
            ],
        )
    }

    /// Element offset of `(page, slot, head, 0)`.
    #[inline]
    pub fn offset(&self, page: usize, slot: usize, head: usize) -> usize {
        page * self.page_stride + slot * self.slot_stride + head * self.head_stride
    }

    /// Whether this layout's elements and the same layout `delta` elements further share an
    /// element: whether a K cache and a V cache laid out alike, their starts `delta` elements
    /// apart, overlap. Exact for interleaved caches, not only for disjoint byte ranges: vLLM
    /// 0.32's CPU cache `[num_blocks, num_kv_heads, 2 * block_size, head_dim]` holds each
    /// `(block, head)`'s K rows and then its V rows, so its K and V views span nearly the same
    /// bytes and share none of them. Call on a validated layout ([`Self::validate`]).
    ///
    /// An element is `p * page_stride + s * slot_stride + h * head_stride + e` (`e` below
    /// [`Self::row_len`]), so the two share one exactly when `delta = Σ c_i * stride_i` with
    /// `|c_i| < size_i` (and `stride 1, size row_len` for `e`). Validated strides nest (each
    /// exceeds the reach `R` of all smaller ones), so at each stride from the largest down at most
    /// two coefficients leave a remainder the smaller ones can still reach (`|rest| <= R < stride`):
    /// the search visits at most 2^3 paths.
    pub fn shifted_overlaps(&self, delta: usize) -> bool {
        let mut dims = [
            (self.row_len(), 1usize),
            (self.num_kv_heads, self.head_stride),
            (self.page_size, self.slot_stride),
            (self.num_pages, self.page_stride),
        ];
        dims.sort_by_key(|&(_, stride)| stride);
        let Ok(delta) = i128::try_from(delta) else {
            return false;
        };
        let dims = dims.map(|(size, stride)| (size as i128, stride as i128));
        reachable(delta, &dims)
    }
}

/// Whether `delta` is `Σ c_i * stride_i` with `|c_i| < size_i` over `dims` (sorted by stride,
/// smallest first); [`CacheLayout::shifted_overlaps`].
fn reachable(delta: i128, dims: &[(i128, i128)]) -> bool {
    let Some((&(size, stride), inner)) = dims.split_last() else {
        return delta == 0;
    };
    if size <= 1 {
        return reachable(delta, inner);
    }
    // How far the smaller strides reach either way.
    let reach: i128 = inner.iter().map(|&(n, s)| (n - 1).max(0) * s).sum();
    // Coefficients c with |delta - c * stride| <= reach, within -(size - 1)..=size - 1.
    let lo =
        (delta - reach).div_euclid(stride) + i128::from((delta - reach).rem_euclid(stride) != 0);
    let hi = (delta + reach).div_euclid(stride);
    let (lo, hi) = (lo.max(-(size - 1)), hi.min(size - 1));
    (lo..=hi).any(|c| reachable(delta - c * stride, inner))
}

/// The per-tensor dequantization scales of one layer's K and V cache (vLLM's `k_scale` and
/// `v_scale`): a cache element stands for its stored value times the scale. The KV write divides
/// by it before rounding to the cache's type; attention multiplies by it inside the kernel (folded
/// into the query and the output, never applied to a copy of the cache). It applies to every cache
/// type; [`KvScales::ONE`] is an unscaled cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScales {
    /// Scale of the K cache; finite and > 0.
    pub k: f32,
    /// Scale of the V cache; finite and > 0.
    pub v: f32,
}

impl KvScales {
    /// An unscaled cache.
    pub const ONE: KvScales = KvScales { k: 1.0, v: 1.0 };

    /// The scales `k` of the K cache and `v` of the V cache (checked by [`Self::validate`]).
    pub fn new(k: f32, v: f32) -> Self {
        KvScales { k, v }
    }

    /// Checks both scales (finite and > 0).
    pub fn validate(&self) -> Result<()> {
        for (field, x) in [("k_scale", self.k), ("v_scale", self.v)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(bad(field, format!("{x} is not a finite number > 0")));
            }
        }
        Ok(())
    }

    /// Whether both are 1 (the cache holds the values themselves).
    pub fn is_one(&self) -> bool {
        *self == Self::ONE
    }
}

/// Refuses a quantized type where only f32, f16 and bf16 can be (queries, outputs, new K/V).
fn not_quantized(field: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_quantized() {
        return Err(bad(
            field,
            format!("{dtype:?} is a KV-cache format only; this tensor is f32, f16 or bf16"),
        ));
    }
    Ok(())
}

/// Strides (elements) of a `[num_tokens, num_heads, head_dim]` tensor; `head_dim` contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenStrides {
    /// Elements between tokens.
    pub token: usize,
    /// Elements between heads.
    pub head: usize,
}

impl TokenStrides {
    /// Dense strides for `num_heads` heads of `head_dim`.
    pub fn dense(num_heads: usize, head_dim: usize) -> Self {
        TokenStrides {
            token: num_heads * head_dim,
            head: head_dim,
        }
    }
}

/// Everything a paged-attention launch needs except memory: the numbers of
/// `kvs_attention_args`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    /// Sequences in the batch.
    pub num_seqs: usize,
    /// Query tokens in the batch (`num_seqs` for decode).
    pub num_tokens: usize,
    /// Query heads (a multiple of `cache.num_kv_heads`).
    pub num_heads: usize,
    /// Query element type.
    pub query_dtype: DType,
    /// Query strides.
    pub query_strides: TokenStrides,
    /// Output element type.
    pub output_dtype: DType,
    /// Output strides.
    pub output_strides: TokenStrides,
    /// K and V cache layout (gives `num_kv_heads`, `head_dim`).
    pub cache: CacheLayout,
    /// Columns of the block table.
    pub max_pages_per_seq: usize,
    /// Elements between block-table rows.
    pub block_table_stride: usize,
    /// Whether per-sequence query starts are given (prefill / mixed); otherwise decode.
    pub varlen: bool,
    /// Multiplier of `q·k` (usually `1/sqrt(head_dim)`); finite and > 0.
    pub scale: f32,
    /// Logit soft cap: `cap * tanh(s / cap)`; 0 disables it.
    pub softcap: f32,
    /// Sliding window: a token attends to the `sliding_window` most recent positions (itself
    /// included); 0 disables it.
    pub sliding_window: usize,
    /// Dequantization scales of the K and V cache.
    pub kv_scales: KvScales,
}

/// Elements each buffer of a validated launch must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnSpans {
    /// Query elements.
    pub query: usize,
    /// Output elements.
    pub output: usize,
    /// Elements of the K cache (and of the V cache).
    pub cache: usize,
    /// Block-table entries.
    pub block_table: usize,
    /// Context-length entries.
    pub context_lens: usize,
    /// Query-start entries (0 for decode).
    pub query_start_loc: usize,
}

impl AttnParams {
    /// Query heads per kv head.
    pub fn group(&self) -> usize {
        self.num_heads / self.cache.num_kv_heads
    }

    /// Checks every number (no memory is read) and returns the buffer sizes they imply.
    pub fn validate(&self) -> Result<AttnSpans> {
        check_range("num_seqs", self.num_seqs, MAX_BATCH)?;
        check_range("num_tokens", self.num_tokens, MAX_BATCH)?;
        check_range("num_heads", self.num_heads, MAX_HEADS)?;
        let cache = self.cache.validate()?;
        not_quantized("query_dtype", self.query_dtype)?;
        not_quantized("output_dtype", self.output_dtype)?;
        self.kv_scales.validate()?;
        if !self.num_heads.is_multiple_of(self.cache.num_kv_heads) {
            return Err(bad(
                "num_heads",
                format!(
                    "{} is not a multiple of num_kv_heads {}",
                    self.num_heads, self.cache.num_kv_heads
                ),
            ));
        }
        if !self.varlen && self.num_tokens != self.num_seqs {
            return Err(bad(
                "num_tokens",
                format!(
                    "decode (query_start_loc NULL) needs one token per sequence: {} tokens, {} sequences",
                    self.num_tokens, self.num_seqs
                ),
            ));
        }
        let d = self.cache.head_dim;
        let query = span(
            d,
            &[
                (self.num_heads, self.query_strides.head, "query_head_stride"),
                (
                    self.num_tokens,
                    self.query_strides.token,
                    "query_token_stride",
                ),
            ],
        )?;
        let output = span(
            d,
            &[
                (
                    self.num_heads,
                    self.output_strides.head,
                    "output_head_stride",
                ),
                (
                    self.num_tokens,
                    self.output_strides.token,
                    "output_token_stride",
                ),
            ],
        )?;
        check_range("max_pages_per_seq", self.max_pages_per_seq, MAX_PAGES)?;
        let block_table = span(
            self.max_pages_per_seq,
            &[(self.num_seqs, self.block_table_stride, "block_table_stride")],
        )?;
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(bad(
                "scale",
                format!("{} is not a finite number > 0", self.scale),
            ));
        }
        if !(self.softcap.is_finite() && self.softcap >= 0.0) {
            return Err(bad(
                "softcap",
                format!("{} is not a finite number >= 0 (0 = off)", self.softcap),
            ));
        }
        Ok(AttnSpans {
            query,
            output,
            cache,
            block_table,
            context_lens: self.num_seqs,
            query_start_loc: if self.varlen { self.num_seqs + 1 } else { 0 },
        })
    }
}

/// One sequence of a validated batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpan {
    /// First query token (row of the query tensor).
    pub q_start: usize,
    /// Query tokens.
    pub q_len: usize,
    /// KV tokens, query tokens included.
    pub ctx_len: usize,
}

/// Checks the host arrays of a launch against validated params: context lengths, query starts
/// and, when the block table is host-readable, every block-table entry a sequence uses (entries
/// past `ceil(ctx_len / page_size)` are padding and are not read). Returns the per-sequence
/// spans. Lengths of the slices must already match [`AttnSpans`].
pub fn check_host_arrays(
    p: &AttnParams,
    context_lens: &[i32],
    query_start_loc: Option<&[i32]>,
    block_table: Option<&[i32]>,
) -> Result<Vec<SeqSpan>> {
    let cap = p.max_pages_per_seq.saturating_mul(p.cache.page_size);
    let mut seqs = Vec::with_capacity(p.num_seqs);
    for (s, &ctx) in context_lens.iter().enumerate().take(p.num_seqs) {
        let (q_start, q_len) = match query_start_loc {
            None => (s, 1),
            Some(starts) => {
                let (a, b) = (starts[s], starts[s + 1]);
                if s == 0 && a != 0 {
                    return Err(bad(
                        "query_start_loc",
                        format!("query_start_loc[0] is {a}, not 0"),
                    ));
                }
                if b < a {
                    return Err(bad(
                        "query_start_loc",
                        format!("decreases at sequence {s}: {a} then {b}"),
                    ));
                }
                (a as usize, (b - a) as usize)
            }
        };
        if ctx < 0 || ctx as usize > cap {
            return Err(bad(
                "context_lens",
                format!(
                    "context_lens[{s}] = {ctx} is not in 0..={cap} (max_pages_per_seq * page_size)"
                ),
            ));
        }
        let ctx = ctx as usize;
        if q_len > ctx {
            return Err(bad(
                "context_lens",
                format!("context_lens[{s}] = {ctx} is smaller than its query length {q_len}"),
            ));
        }
        if let Some(table) = block_table {
            let row = &table[s * p.block_table_stride..][..ctx.div_ceil(p.cache.page_size)];
            if let Some((j, &page)) = row
                .iter()
                .enumerate()
                .find(|(_, &pg)| pg < 0 || pg as usize >= p.cache.num_pages)
            {
                return Err(bad(
                    "block_table",
                    format!(
                        "block_table[{s}][{j}] = {page} is not a page id in 0..{}",
                        p.cache.num_pages
                    ),
                ));
            }
        }
        seqs.push(SeqSpan {
            q_start,
            q_len,
            ctx_len: ctx,
        });
    }
    if let Some(starts) = query_start_loc {
        let last = starts[p.num_seqs];
        if last < 0 || last as usize != p.num_tokens {
            return Err(bad(
                "query_start_loc",
                format!(
                    "query_start_loc[num_seqs] = {last}, but num_tokens is {}",
                    p.num_tokens
                ),
            ));
        }
    }
    Ok(seqs)
}

/// Numbers of a KV write (`kvs_kv_write_args` without memory): scatter `[num_tokens,
/// num_kv_heads, head_dim]` K and V into the caches at `slot = page * page_size + offset`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvWriteParams {
    /// Tokens to write (entries of the slot mapping).
    pub num_tokens: usize,
    /// Element type of the new K and V (converted to the cache dtype when they differ).
    pub src_dtype: DType,
    /// Strides of the new K and V (heads and head_dim from `cache`).
    pub src_strides: TokenStrides,
    /// Destination caches.
    pub cache: CacheLayout,
    /// Scales of the destination caches: each new value is divided by its cache's scale, then
    /// rounded to the cache's type.
    pub scales: KvScales,
}

/// A slot mapping, int32 (vLLM-Ascend, MindIE) or int64 (vLLM). Negative slots are padding.
#[derive(Debug, Clone, Copy)]
pub enum SlotMapping<'a> {
    /// int32 slots.
    I32(&'a [i32]),
    /// int64 slots.
    I64(&'a [i64]),
}

impl SlotMapping<'_> {
    /// Entries.
    pub fn len(&self) -> usize {
        match self {
            SlotMapping::I32(s) => s.len(),
            SlotMapping::I64(s) => s.len(),
        }
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Slot `i` widened to i64.
    #[inline]
    pub fn get(&self, i: usize) -> i64 {
        match self {
            SlotMapping::I32(s) => s[i] as i64,
            SlotMapping::I64(s) => s[i],
        }
    }
}

impl KvWriteParams {
    /// Checks every number; returns `(elements of key/value, elements of each cache)`.
    pub fn validate(&self) -> Result<(usize, usize)> {
        check_range("num_tokens", self.num_tokens, MAX_BATCH)?;
        let cache = self.cache.validate()?;
        not_quantized("src_dtype", self.src_dtype)?;
        self.scales.validate()?;
        let src = span(
            self.cache.head_dim,
            &[
                (
                    self.cache.num_kv_heads,
                    self.src_strides.head,
                    "src_head_stride",
                ),
                (self.num_tokens, self.src_strides.token, "src_token_stride"),
            ],
        )?;
        Ok((src, cache))
    }
}

/// Checks every slot: below `num_pages * page_size`, or negative (padding).
pub fn check_slots(slots: &SlotMapping<'_>, cache: &CacheLayout) -> Result<()> {
    let limit = (cache.num_pages as i64).saturating_mul(cache.page_size as i64);
    for i in 0..slots.len() {
        let s = slots.get(i);
        if s >= limit {
            return Err(bad(
                "slot_mapping",
                format!("slot_mapping[{i}] = {s} is not below num_pages * page_size = {limit}"),
            ));
        }
    }
    Ok(())
}

/// Numbers of a page copy: the device caches' layout and the host caches' page count (host
/// caches have the same per-page layout and strides, with `num_host_pages` pages; 0 = none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyParams {
    /// Layout of the device K and V caches (and, with `num_host_pages`, the host ones).
    pub cache: CacheLayout,
    /// Pages of the host caches (0: no host caches).
    pub num_host_pages: usize,
}

impl CopyParams {
    /// Checks the numbers; returns `(device cache elements, host cache elements)`.
    pub fn validate(&self) -> Result<(usize, usize)> {
        let device = self.cache.validate()?;
        let host = if self.num_host_pages == 0 {
            0
        } else {
            CacheLayout {
                num_pages: self.num_host_pages,
                ..self.cache
            }
            .validate()
            .map_err(|e| match e {
                Error::Invalid {
                    field: "num_pages",
                    reason,
                } => bad("num_host_pages", reason),
                e => e,
            })?
        };
        Ok((device, host))
    }

    /// Checks every copy against the tiers' page counts and the page size.
    pub fn check_copies(&self, copies: &[PageCopy]) -> Result<()> {
        for (i, c) in copies.iter().enumerate() {
            let (src_n, dst_n) = match c.kind {
                CopyKind::DeviceToDevice => (self.cache.num_pages, self.cache.num_pages),
                CopyKind::DeviceToHost => (self.cache.num_pages, self.num_host_pages),
                CopyKind::HostToDevice => (self.num_host_pages, self.cache.num_pages),
            };
            if c.src_page as usize >= src_n {
                return Err(bad(
                    "copies",
                    format!(
                        "copies[{i}].src_page = {} is not below {src_n} ({:?})",
                        c.src_page, c.kind
                    ),
                ));
            }
            if c.dst_page as usize >= dst_n {
                return Err(bad(
                    "copies",
                    format!(
                        "copies[{i}].dst_page = {} is not below {dst_n} ({:?})",
                        c.dst_page, c.kind
                    ),
                ));
            }
            if c.num_tokens as usize > self.cache.page_size {
                return Err(bad(
                    "copies",
                    format!(
                        "copies[{i}].num_tokens = {} is more than page_size {}",
                        c.num_tokens, self.cache.page_size
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// Every element offset of `lay`, by enumeration.
    fn elements(lay: &CacheLayout) -> HashSet<usize> {
        let mut out = HashSet::new();
        for p in 0..lay.num_pages {
            for s in 0..lay.page_size {
                for h in 0..lay.num_kv_heads {
                    for e in 0..lay.row_len() {
                        out.insert(lay.offset(p, s, h) + e);
                    }
                }
            }
        }
        out
    }

    /// A layout whose outer dimensions nest in the order `order` (innermost first), each stride
    /// the reach of the inner ones plus `pad`.
    fn nested(dtype: DType, sizes: [usize; 4], order: [usize; 3], pad: [usize; 3]) -> CacheLayout {
        let [num_pages, page_size, num_kv_heads, head_dim] = sizes;
        let mut lay = CacheLayout::dense(dtype, num_pages, page_size, num_kv_heads, head_dim);
        let mut extent = lay.row_len();
        for (i, &dim) in order.iter().enumerate() {
            let stride = extent + pad[i];
            let size = [num_pages, page_size, num_kv_heads][dim];
            match dim {
                0 => lay.page_stride = stride,
                1 => lay.slot_stride = stride,
                _ => lay.head_stride = stride,
            }
            extent += (size - 1) * stride;
        }
        lay
    }

    #[test]
    fn vllm_cpu_fused_cache_halves_share_no_element() {
        // vLLM 0.32's CPU cache [blocks, heads, 2 * block_size, head_dim]: K is rows
        // 0..block_size of each (block, head), V the rows after them.
        let (blocks, heads, bs, d) = (3, 2, 4, 8);
        let lay = CacheLayout {
            page_stride: heads * 2 * bs * d,
            slot_stride: d,
            head_stride: 2 * bs * d,
            ..CacheLayout::dense(DType::BF16, blocks, bs, heads, d)
        };
        lay.validate().unwrap();
        assert!(!lay.shifted_overlaps(bs * d));
        // One element less or one row more than the K half: V's first row straddles K's
        // last, or V's last row lands on the next head's first K row.
        assert!(lay.shifted_overlaps(bs * d - 1));
        assert!(lay.shifted_overlaps(bs * d + d));
        assert!(lay.shifted_overlaps(0));
        assert!(lay.shifted_overlaps(d));
    }

    proptest! {
        #[test]
        fn shifted_overlaps_matches_enumeration(
            sizes in (1usize..4, 1usize..5, 1usize..4, 1usize..5),
            order in Just([0usize, 1, 2]).prop_shuffle(),
            pad in proptest::array::uniform3(prop_oneof![Just(0usize), 1usize..6]),
            rows in any::<bool>(),
            delta in 0usize..400,
        ) {
            let dtype = if rows { DType::Int8PerTokenHead } else { DType::F16 };
            let sizes = [sizes.0, sizes.1, sizes.2, sizes.3];
            let lay = nested(dtype, sizes, order, pad);
            prop_assert!(lay.validate().is_ok());
            let k = elements(&lay);
            let want = k.iter().any(|&e| k.contains(&(e + delta)));
            prop_assert_eq!(lay.shifted_overlaps(delta), want, "{:?} delta {}", lay, delta);
        }
    }
}
