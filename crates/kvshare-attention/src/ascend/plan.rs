//! The CANN constraints, checked before any CANN call, and the launch plan they lead to.
//! Pure Rust (no CANN needed), so every rule is unit-tested.
//!
//! Rules (from CANN's `aclnnFusedInferAttentionScoreV2.md`, summarised in docs/ascend.md;
//! status `KVS_STATUS_UNSUPPORTED` unless noted):
//! * dtypes: query, output, K and V all fp16 or all bf16 (FIA's non-quantised path); or an int8
//!   cache (per-channel scales, optional offsets) under an fp16/bf16 query and output of one
//!   dtype, read through FIA's `keyAntiquantScale`/`valueAntiquantScale` (+ offsets), modes 0:
//!   decode launches only (`page_size` a multiple of 32), query lengths > 1 as
//!   [`AttnPlan::PerToken`]; fp8 caches are refused (no FIA on Atlas A2/A3 takes fp8 K/V).
//!   Per-tensor scales other than 1 only with an int8 cache (folded into the channel scales).
//! * no logit soft cap (FIA has none).
//! * sliding window `W` (see [`window_launch`]): FIA's band (`sparseMode` 4, `preTokens` W-1,
//!   `nextTokens` 0) for query lengths > 1; an explicit decode mask for query length 1 (FIA ignores
//!   `sparseMode`/`preTokens`/`nextTokens` when `Q_S == 1`). One BSND launch per sequence, a
//!   dense `BnBsH` cache (TND takes sparse mode 0 or 3 only; a BnNBsD cache needs BNSD/TND).
//! * cache layout dense `BnBsH` (`[pages, page_size, kv_heads*head_dim]`, kvshare's default
//!   `[pages, page_size, kv_heads, head_dim]`) with `kv_heads*head_dim <= 65535`, or dense
//!   `BnNBsD` (`[pages, kv_heads, page_size, head_dim]`), which CANN takes only with a BNSD or
//!   TND query.
//! * `num_heads / num_kv_heads <= 64`; `head_dim <= 512`.
//! * decode (every query length 1): `page_size` in 1..=512 and a multiple of 16 (fp16/bf16),
//!   `num_heads <= 256`, `num_seqs <= 65536`.
//! * prefill (some query length > 1): `page_size` a multiple of 128 in 128..=512, `head_dim` a
//!   multiple of 16.
//! * TND (one launch for a whole varlen batch, as vLLM-Ascend does) only where every document
//!   agrees: bf16 (the V4 doc says bf16 only), `head_dim` 128 or 192 (without rope), `page_size`
//!   128 or 512 (intersection of the V2 prefill rule and the V4 TND rule), at most 4096
//!   sequences, no sequence with 0 query tokens. Otherwise prefill runs one BSND launch per
//!   sequence (a BnNBsD cache then is refused: CANN would need a permuted BNSD query view).
//! * device pointers 32-byte aligned (`aclCreateTensor` doc): `KVS_STATUS_ATTN_INVALID_ARGUMENT`.

use crate::error::{Error, Result};
use crate::{AttnParams, CacheLayout, DType, KvScales, SeqSpan};

/// How the K/V caches are handed to CANN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// `[pages, page_size, kv_heads*head_dim]` (3-D).
    BnBsH,
    /// `[pages, kv_heads, page_size, head_dim]` (4-D).
    BnNBsD,
}

/// The launches of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnPlan {
    /// One launch, query `[B, 1, N, D]` "BSND" (BnBsH cache) or `[B, N, 1, D]` "BNSD" (BnNBsD),
    /// sparse mode 0, no mask.
    Decode(KvLayout),
    /// One launch, query `[T, N, D]` "TND", cumulative query ends, sparse mode 3 + mask.
    Tnd(KvLayout),
    /// One BSND launch per sequence with query tokens: `[1, S, N, D]`; sparse mode 3 + mask
    /// when `S > 1`, sparse mode 0 when `S == 1`; with a sliding window, [`window_launch`].
    PerSeqBsnd,
    /// An int8 cache with some query length > 1: FIA's paged path takes int8 K/V only in its
    /// incremental branch (`Q_S == 1`; with `Q_S > 1` paged K/V must be fp16/bf16 on Atlas
    /// A2/A3), so query token `i` of a sequence of `q` tokens over `ctx` keys is its own BSND
    /// decode launch over the first `ctx - q + i + 1` keys ([`token_rows`]), each as a
    /// `PerSeqBsnd` row of length 1: causal by construction, windowed by the decode mask.
    PerToken,
}

/// The rows `(sequence, span)` of a [`AttnPlan::PerToken`] launch: one span of query length 1
/// per query token, over the keys that token sees.
pub fn token_rows(seqs: &[SeqSpan]) -> Vec<(usize, SeqSpan)> {
    let mut rows = Vec::new();
    for (s, seq) in seqs.iter().enumerate() {
        for i in 0..seq.q_len {
            rows.push((
                s,
                SeqSpan {
                    q_start: seq.q_start + i,
                    q_len: 1,
                    ctx_len: seq.ctx_len - seq.q_len + i + 1,
                },
            ));
        }
    }
    rows
}

/// How one sequence's FIA launch applies a sliding window of `W` tokens (a query token at
/// position `p` sees positions `p-W+1..=p`, as the CPU backend's `sliding_window`).
///
/// CANN facts this follows (`sparse_mode参数说明.md` of ops-transformer, and the FIA / torch_npu
/// `npu_fused_infer_attention_score` docs; none run on hardware):
/// * `sparseMode` 4 is the band: it computes the part of `QK^T` between `preTokens` and
///   `nextTokens`, measured from the **bottom-right** corner, with the optimised 2048x2048
///   lower-triangular `attenMask` (the same int8 `triu(ones, 1)` as mode 3). Query row `i` of
///   `S_q` rows over `S_kv` keys has its diagonal at key `S_kv - S_q + i` and sees keys
///   `diag - preTokens ..= diag + nextTokens`. So `preTokens = W - 1`, `nextTokens = 0` is the
///   causal window of `W` keys, and with paging `S_kv` is `actualSeqLengthsKv` (the whole
///   context, released pages included: their positions are outside every row's band).
/// * `Q_S == 1` (decode) takes FIA's incremental branch, where `sparseMode`, `preTokens` and
///   `nextTokens` are ignored ("Q_S为1时该参数无效"): a band there would silently be full
///   attention. The window is an explicit `attenMask` `(B, 1, 1, KV_S)` (bool/int8, 1 = masked),
///   `KV_S >= maxBlockNumPerSeq * blockSize` with paging, with sparse mode 0.
/// * TND accepts only sparse mode 0 (no mask) or 3 (mask), so windowed prefill runs per
///   sequence in BSND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowLaunch {
    /// No window (or none needed): the launch as without one.
    None,
    /// Sparse mode 4 with the 2048x2048 mask.
    Band {
        /// `preTokens`.
        pre: i64,
        /// `nextTokens`.
        next: i64,
    },
    /// Sparse mode 0 with a decode mask hiding keys `0..masked`.
    DecodeMask {
        /// Keys before the window.
        masked: usize,
    },
}

/// The window launch of one sequence (`window` 0: none).
pub fn window_launch(window: usize, seq: &SeqSpan) -> WindowLaunch {
    if window == 0 || seq.q_len == 0 {
        return WindowLaunch::None;
    }
    if seq.q_len > 1 {
        return WindowLaunch::Band {
            pre: window as i64 - 1,
            next: 0,
        };
    }
    match seq.ctx_len.saturating_sub(window) {
        0 => WindowLaunch::None,
        masked => WindowLaunch::DecodeMask { masked },
    }
}

/// Largest `num_heads / num_kv_heads` CANN's FIA accepts (the CPU kernel has no such limit).
pub(crate) const MAX_HEADS_PER_KV_HEAD: usize = 64;
/// Largest head dim.
pub(crate) const MAX_HEAD_DIM: usize = 512;
/// Largest `kv_heads * head_dim` of a BnBsH cache.
pub(crate) const MAX_BNBSH_H: usize = 65535;
/// Most query heads of a decode launch.
pub(crate) const MAX_DECODE_HEADS: usize = 256;
/// Most sequences of a decode launch.
pub(crate) const MAX_DECODE_BATCH: usize = 65536;
/// Most entries of a TND `actualSeqLengths`.
pub(crate) const MAX_TND_SEQS: usize = 4096;
/// Alignment of every device pointer handed to `aclCreateTensor`.
pub(crate) const DEVICE_ALIGN: usize = 32;

fn unsupported(what: impl Into<String>) -> Error {
    Error::Unsupported(format!("Ascend backend: {}", what.into()))
}

/// The dtype CANN gets for a query, output or unquantized K/V (fp16 or bf16 only).
pub fn acl_dtype(d: DType, field: &str) -> Result<i32> {
    match d {
        DType::F16 => Ok(super::sys::ACL_FLOAT16),
        DType::BF16 => Ok(super::sys::ACL_BF16),
        DType::F32 => Err(unsupported(format!(
            "{field} is f32; CANN's paged attention and KV scatter take fp16 or bf16"
        ))),
        DType::Int8 => Err(unsupported(format!(
            "{field} is Int8; CANN takes an int8 cache only as FIA's antiquant K/V (decode \
             launches of kvs_attention_launch_scaled with channel scales), never as a query, \
             output or scatter source"
        ))),
        DType::Int8PerTokenHead => Err(unsupported(format!(
            "{field} is Int8PerTokenHead (KVS_DTYPE_INT8_PER_TOKEN_HEAD); CANN's operators \
             take no scale per (token, kv head) row kept inside the pages; this format runs on \
             the CPU backend only"
        ))),
        DType::Fp8E4M3 | DType::Fp8E5M2 => Err(fp8(d, field)),
    }
}

/// Why an fp8 cache is refused: what CANN lacks.
fn fp8(d: DType, field: &str) -> Error {
    unsupported(format!(
        "{field} is {d:?}: aclnnFusedInferAttentionScoreV2/V3/V4 on Atlas A2/A3 take int8 \
         antiquant K/V but no fp8 K/V (FLOAT8_E4M3FN K/V are documented for Ascend 950 only, \
         which these FIA versions do not support, and no FIA takes E5M2); fp8 caches run on \
         the CPU backend"
    ))
}

/// The dtype of the K/V caches of an attention launch: fp16/bf16, or int8 read through FIA's
/// per-channel antiquant arguments. fp8 is refused (the reason says what CANN lacks).
pub fn kv_acl_dtype(d: DType) -> Result<i32> {
    match d {
        DType::Int8 => Ok(super::sys::ACL_INT8),
        DType::Fp8E4M3 | DType::Fp8E5M2 => Err(fp8(d, "cache.dtype")),
        d => acl_dtype(d, "cache.dtype"),
    }
}

/// Refuses scaled caches: CANN's non-quantized calls take the cache's values as they are.
pub fn unscaled(s: &KvScales) -> Result<()> {
    if !s.is_one() {
        return Err(unsupported(format!(
            "k_scale {} / v_scale {}: CANN's non-quantized paged attention and KV scatter take \
             unscaled caches (scales of 1)",
            s.k, s.v
        )));
    }
    Ok(())
}

/// Which dense layout the cache is in (or why neither).
pub fn kv_layout(c: &CacheLayout) -> Result<KvLayout> {
    let (ps, h, d) = (c.page_size, c.num_kv_heads, c.head_dim);
    let page = ps * h * d;
    if c.page_stride == page && c.slot_stride == h * d && (c.head_stride == d || h == 1) {
        return Ok(KvLayout::BnBsH);
    }
    if c.page_stride == page && c.head_stride == ps * d && (c.slot_stride == d || ps == 1) {
        return Ok(KvLayout::BnNBsD);
    }
    Err(unsupported(format!(
        "cache strides (page {}, slot {}, head {}) are neither dense [pages, page_size, \
         kv_heads, head_dim] (CANN BnBsH: {page}, {}, {d}) nor dense [pages, kv_heads, \
         page_size, head_dim] (CANN BnNBsD: {page}, {d}, {})",
        c.page_stride,
        c.slot_stride,
        c.head_stride,
        h * d,
        ps * d
    )))
}

/// Checks the CANN constraints of an attention launch (already validated by
/// [`AttnParams::validate`] and `check_host_arrays`) and picks the launches.
pub fn plan_attention(p: &AttnParams, seqs: &[SeqSpan]) -> Result<AttnPlan> {
    let c = &p.cache;
    kv_acl_dtype(c.dtype)?;
    let quant = c.dtype == DType::Int8;
    if quant {
        // The per-tensor scales are multiplied into the channel scales (see `fia`).
        acl_dtype(p.query_dtype, "query_dtype")?;
        if p.output_dtype != p.query_dtype {
            return Err(unsupported(format!(
                "query ({:?}) and output ({:?}) dtypes differ; FIA's antiquant path writes the \
                 query's dtype",
                p.query_dtype, p.output_dtype
            )));
        }
    } else {
        unscaled(&p.kv_scales)?;
        if p.query_dtype != c.dtype || p.output_dtype != c.dtype {
            return Err(unsupported(format!(
                "query ({:?}), output ({:?}) and cache ({:?}) dtypes differ; CANN's \
                 non-quantised paged attention needs one dtype",
                p.query_dtype, p.output_dtype, c.dtype
            )));
        }
    }
    if p.softcap != 0.0 {
        return Err(unsupported(
            "softcap: aclnnFusedInferAttentionScore has no logit soft cap",
        ));
    }
    let kv = kv_layout(c)?;
    let window = p.sliding_window > 0;
    if window && kv == KvLayout::BnNBsD {
        return Err(unsupported(
            "sliding_window with a BnNBsD cache: a window runs one BSND launch per sequence \
             (TND takes no band), which CANN takes only with the dense [pages, page_size, \
             kv_heads, head_dim] layout",
        ));
    }
    let (h, d, ps) = (c.num_kv_heads, c.head_dim, c.page_size);
    if p.group() > MAX_HEADS_PER_KV_HEAD {
        return Err(unsupported(format!(
            "num_heads / num_kv_heads = {} / {h} = {} is above CANN's limit {MAX_HEADS_PER_KV_HEAD}",
            p.num_heads,
            p.group()
        )));
    }
    if d > MAX_HEAD_DIM {
        return Err(unsupported(format!(
            "head_dim {d} is above CANN's limit {MAX_HEAD_DIM}"
        )));
    }
    if kv == KvLayout::BnBsH && h * d > MAX_BNBSH_H {
        return Err(unsupported(format!(
            "num_kv_heads * head_dim = {} is above CANN's BnBsH limit {MAX_BNBSH_H}",
            h * d
        )));
    }
    let prefill = seqs.iter().any(|s| s.q_len > 1);
    if !prefill || quant {
        // An int8 cache runs every query row as a decode row (see `AttnPlan::PerToken`).
        let (align, what) = if quant {
            (32, "int8")
        } else {
            (16, "fp16/bf16")
        };
        if ps > 512 || ps % align != 0 {
            return Err(unsupported(format!(
                "page_size {ps}: CANN paged decode needs a page size in {align}..=512 that is a \
                 multiple of {align} for {what} K/V (128 recommended)"
            )));
        }
        if p.num_heads > MAX_DECODE_HEADS {
            return Err(unsupported(format!(
                "num_heads {} is above CANN's decode limit {MAX_DECODE_HEADS}",
                p.num_heads
            )));
        }
        if p.num_seqs > MAX_DECODE_BATCH {
            return Err(unsupported(format!(
                "num_seqs {} is above CANN's decode limit {MAX_DECODE_BATCH}",
                p.num_seqs
            )));
        }
        if prefill {
            if kv == KvLayout::BnNBsD {
                return Err(unsupported(
                    "query length > 1 with an int8 cache runs one BSND decode launch per query \
                     token, which CANN does not take with a BnNBsD cache; use the dense \
                     [pages, page_size, kv_heads, head_dim] layout",
                ));
            }
            return Ok(AttnPlan::PerToken);
        }
        // Every sequence has one query token at row s (decode, or varlen with all lengths 1).
        if !window
            && seqs
                .iter()
                .enumerate()
                .all(|(i, s)| s.q_len == 1 && s.q_start == i)
        {
            return Ok(AttnPlan::Decode(kv));
        }
        // Some sequence has 0 query tokens: launch the others one by one.
        if kv == KvLayout::BnNBsD {
            return Err(unsupported(
                "a varlen batch with empty sequences needs per-sequence BSND launches, which \
                 CANN does not take with a BnNBsD cache; use the dense [pages, page_size, \
                 kv_heads, head_dim] layout",
            ));
        }
        return Ok(AttnPlan::PerSeqBsnd);
    }
    if !(128..=512).contains(&ps) || ps % 128 != 0 {
        return Err(unsupported(format!(
            "page_size {ps}: CANN paged prefill (query length > 1) needs a page size that is a \
             multiple of 128 in 128..=512"
        )));
    }
    if d % 16 != 0 {
        return Err(unsupported(format!(
            "head_dim {d}: CANN paged prefill needs a multiple of 16 for fp16/bf16"
        )));
    }
    let tnd = !window
        && c.dtype == DType::BF16
        && (d == 128 || d == 192)
        && (ps == 128 || ps == 512)
        && p.num_seqs <= MAX_TND_SEQS
        && seqs.iter().all(|s| s.q_len > 0);
    if tnd {
        return Ok(AttnPlan::Tnd(kv));
    }
    if kv == KvLayout::BnNBsD {
        return Err(unsupported(
            "prefill with a BnNBsD cache needs the TND layout (bf16, head_dim 128 or 192, \
             page_size 128 or 512, <= 4096 sequences, no empty sequence); otherwise use the \
             dense [pages, page_size, kv_heads, head_dim] layout",
        ));
    }
    Ok(AttnPlan::PerSeqBsnd)
}

/// Refuses a device pointer that is not `DEVICE_ALIGN`-byte aligned.
pub fn check_align(field: &'static str, addr: usize) -> Result<()> {
    if !addr.is_multiple_of(DEVICE_ALIGN) {
        return Err(Error::Invalid {
            field,
            reason: format!(
                "device address {addr:#x} is not {DEVICE_ALIGN}-byte aligned (aclCreateTensor \
                 requires it)"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TokenStrides;

    fn params(dtype: DType, ps: usize, h: usize, g: usize, d: usize, varlen: bool) -> AttnParams {
        AttnParams {
            num_seqs: 2,
            num_tokens: 2,
            num_heads: h * g,
            query_dtype: dtype,
            query_strides: TokenStrides::dense(h * g, d),
            output_dtype: dtype,
            output_strides: TokenStrides::dense(h * g, d),
            cache: CacheLayout::dense(dtype, 8, ps, h, d),
            max_pages_per_seq: 4,
            block_table_stride: 4,
            varlen,
            scale: 0.1,
            softcap: 0.0,
            sliding_window: 0,
            kv_scales: KvScales::ONE,
        }
    }
    fn dec() -> Vec<SeqSpan> {
        vec![
            SeqSpan {
                q_start: 0,
                q_len: 1,
                ctx_len: 5,
            },
            SeqSpan {
                q_start: 1,
                q_len: 1,
                ctx_len: 9,
            },
        ]
    }
    fn pre() -> Vec<SeqSpan> {
        vec![
            SeqSpan {
                q_start: 0,
                q_len: 3,
                ctx_len: 5,
            },
            SeqSpan {
                q_start: 3,
                q_len: 1,
                ctx_len: 9,
            },
        ]
    }
    fn unsup(r: Result<AttnPlan>) -> String {
        match r {
            Err(Error::Unsupported(m)) => m,
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn decode_page_sizes() {
        for ps in [16, 128, 512] {
            let p = params(DType::F16, ps, 2, 4, 64, false);
            assert_eq!(
                plan_attention(&p, &dec()).unwrap(),
                AttnPlan::Decode(KvLayout::BnBsH)
            );
        }
        for ps in [8, 24, 1024] {
            let p = params(DType::F16, ps, 2, 4, 64, false);
            assert!(unsup(plan_attention(&p, &dec())).contains("page_size"));
        }
    }

    #[test]
    fn prefill_page_sizes_and_layouts() {
        let p = params(DType::F16, 16, 2, 4, 64, true);
        assert!(unsup(plan_attention(&p, &pre())).contains("multiple of 128"));
        let p = params(DType::F16, 128, 2, 4, 64, true);
        assert_eq!(plan_attention(&p, &pre()).unwrap(), AttnPlan::PerSeqBsnd);
        let p = params(DType::BF16, 128, 2, 4, 128, true);
        assert_eq!(
            plan_attention(&p, &pre()).unwrap(),
            AttnPlan::Tnd(KvLayout::BnBsH)
        );
        let p = params(DType::BF16, 256, 2, 4, 128, true);
        assert_eq!(plan_attention(&p, &pre()).unwrap(), AttnPlan::PerSeqBsnd);
        let p = params(DType::F16, 128, 2, 4, 72, true);
        assert!(unsup(plan_attention(&p, &pre())).contains("multiple of 16"));
    }

    #[test]
    fn refusals() {
        let p = params(DType::F32, 128, 2, 4, 64, false);
        assert!(unsup(plan_attention(&p, &dec())).contains("f32"));
        let mut p = params(DType::F16, 128, 1, 65, 64, false);
        assert!(unsup(plan_attention(&p, &dec())).contains("64"));
        p = params(DType::F16, 128, 2, 4, 64, false);
        p.softcap = 30.0;
        assert!(unsup(plan_attention(&p, &dec())).contains("softcap"));
        p.softcap = 0.0;
        p.sliding_window = 4;
        assert_eq!(plan_attention(&p, &dec()).unwrap(), AttnPlan::PerSeqBsnd);
        p.sliding_window = 0;
        p.output_dtype = DType::BF16;
        assert!(unsup(plan_attention(&p, &dec())).contains("differ"));
        let mut p = params(DType::F16, 128, 2, 4, 64, false);
        p.cache.page_stride += 8;
        assert!(unsup(plan_attention(&p, &dec())).contains("BnBsH"));
    }

    #[test]
    fn heads_major_cache() {
        let mut p = params(DType::BF16, 128, 2, 2, 128, false);
        p.cache.slot_stride = 128;
        p.cache.head_stride = 128 * 128;
        assert_eq!(
            plan_attention(&p, &dec()).unwrap(),
            AttnPlan::Decode(KvLayout::BnNBsD)
        );
        p.varlen = true;
        assert_eq!(
            plan_attention(&p, &pre()).unwrap(),
            AttnPlan::Tnd(KvLayout::BnNBsD)
        );
        p.cache.dtype = DType::F16;
        p.query_dtype = DType::F16;
        p.output_dtype = DType::F16;
        assert!(unsup(plan_attention(&p, &pre())).contains("TND"));
    }

    #[test]
    fn window_plans() {
        // Windowed decode and prefill: per sequence, never TND, never BnNBsD.
        let mut p = params(DType::BF16, 128, 2, 4, 128, true);
        p.sliding_window = 17;
        assert_eq!(plan_attention(&p, &pre()).unwrap(), AttnPlan::PerSeqBsnd);
        p.varlen = false;
        assert_eq!(plan_attention(&p, &dec()).unwrap(), AttnPlan::PerSeqBsnd);
        p.cache.slot_stride = 128;
        p.cache.head_stride = 128 * 128;
        assert!(unsup(plan_attention(&p, &dec())).contains("BnNBsD"));
        // Decode page sizes still follow the decode rule.
        let mut p = params(DType::F16, 16, 2, 4, 64, false);
        p.sliding_window = 3;
        assert_eq!(plan_attention(&p, &dec()).unwrap(), AttnPlan::PerSeqBsnd);
    }

    #[test]
    fn window_launch_rows_are_the_cpu_rows() {
        // The band / decode mask a launch gets, applied as CANN documents it (bottom-right
        // diagonal; keys diag-pre..=diag+next; decode mask hides 0..masked), gives each query
        // row exactly the keys of the window `AttnParams::sliding_window` defines.
        for w in [1usize, 2, 17, 128] {
            for ctx in 1..300usize {
                for q in [1usize, 2, 5, ctx.min(130)] {
                    if q > ctx {
                        continue;
                    }
                    let seq = SeqSpan {
                        q_start: 0,
                        q_len: q,
                        ctx_len: ctx,
                    };
                    for i in 0..q {
                        // `AttnParams::sliding_window`: the W most recent positions, itself
                        // included.
                        let pos = ctx - q + i;
                        let (lo, hi) = ((pos + 1).saturating_sub(w), pos + 1);
                        let diag = (ctx - q + i) as i64;
                        let (glo, ghi) = match window_launch(w, &seq) {
                            WindowLaunch::Band { pre, next } => {
                                assert!(q > 1);
                                ((diag - pre).max(0), (diag + next).min(ctx as i64 - 1) + 1)
                            }
                            WindowLaunch::DecodeMask { masked } => {
                                assert_eq!(q, 1);
                                (masked as i64, ctx as i64)
                            }
                            WindowLaunch::None => {
                                assert_eq!(q, 1);
                                (0, ctx as i64)
                            }
                        };
                        assert_eq!(
                            (glo as usize, ghi as usize),
                            (lo, hi),
                            "w {w} ctx {ctx} q {q} i {i}"
                        );
                    }
                }
            }
        }
        let s = SeqSpan {
            q_start: 0,
            q_len: 0,
            ctx_len: 5,
        };
        assert_eq!(window_launch(3, &s), WindowLaunch::None);
        assert_eq!(window_launch(0, &pre()[0]), WindowLaunch::None);
    }

    #[test]
    fn int8_cache_plans() {
        let mut p = params(DType::F16, 128, 2, 4, 64, false);
        p.cache.dtype = DType::Int8;
        p.kv_scales = KvScales::new(0.5, 2.0); // folded into the channel scales
        assert_eq!(
            plan_attention(&p, &dec()).unwrap(),
            AttnPlan::Decode(KvLayout::BnBsH)
        );
        // Query lengths > 1: one decode launch per query token, any page size decode takes.
        p.varlen = true;
        assert_eq!(plan_attention(&p, &pre()).unwrap(), AttnPlan::PerToken);
        for (ps, ok) in [(32, true), (16, false), (48, false), (512, true)] {
            let mut q = params(DType::F16, ps, 2, 4, 64, true);
            q.cache.dtype = DType::Int8;
            match plan_attention(&q, &pre()) {
                Ok(plan) => assert!(ok && plan == AttnPlan::PerToken, "page {ps}"),
                Err(e) => assert!(!ok && e.to_string().contains("multiple of 32"), "{e}"),
            }
        }
        p.output_dtype = DType::BF16;
        assert!(unsup(plan_attention(&p, &dec())).contains("differ"));
        p.output_dtype = DType::F32;
        p.query_dtype = DType::F32;
        assert!(unsup(plan_attention(&p, &dec())).contains("f32"));
        let mut p = params(DType::BF16, 128, 2, 2, 128, true);
        p.cache.dtype = DType::Int8;
        p.cache.slot_stride = 128;
        p.cache.head_stride = 128 * 128;
        assert_eq!(
            plan_attention(&p, &dec()).unwrap(),
            AttnPlan::Decode(KvLayout::BnNBsD)
        );
        assert!(unsup(plan_attention(&p, &pre())).contains("BnNBsD"));
        for d in [DType::Fp8E4M3, DType::Fp8E5M2] {
            let mut p = params(DType::F16, 128, 2, 4, 64, false);
            p.cache.dtype = d;
            assert!(unsup(plan_attention(&p, &dec())).contains("no fp8 K/V"));
        }
        // Scales other than 1 stay refused on an unquantized cache.
        let mut p = params(DType::F16, 128, 2, 4, 64, false);
        p.kv_scales = KvScales::new(0.5, 1.0);
        assert!(unsup(plan_attention(&p, &dec())).contains("k_scale"));
    }

    #[test]
    fn token_rows_see_the_causal_prefix() {
        let rows = token_rows(&pre());
        let want = [
            (0, 0, 3),
            (0, 1, 4),
            (0, 2, 5),
            (1, 3, 9), // a decode row stays as it is
        ];
        assert_eq!(rows.len(), want.len());
        for ((s, r), (ws, q, ctx)) in rows.iter().zip(want) {
            assert_eq!((*s, r.q_start, r.q_len, r.ctx_len), (ws, q, 1, ctx));
        }
    }

    #[test]
    fn alignment() {
        assert!(check_align("query", 64).is_ok());
        assert!(matches!(
            check_align("query", 66),
            Err(Error::Invalid { field: "query", .. })
        ));
    }
}
