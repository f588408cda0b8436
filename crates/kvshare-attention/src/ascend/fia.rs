//! The launch builder of `aclnnFusedInferAttentionScore` (V2, V3 or V4, whichever
//! [`loader`](super::loader) resolved): one [`Fia`] per attention call turns the validated
//! params, the plan's layout and the device addresses into CANN tensors, tensor lists and int
//! arrays, gets the workspace size, and executes on the caller's stream. The plan itself
//! (which layout, which sparse mode, CANN's limits) is [`plan`](super::plan); the backend's
//! lifetime, device binding, mask and workspaces are the parent module's.

use std::ffi::{c_void, CStr};

use super::antiquant::AntiquantSet;
use super::loader::{Cann, FiaFn};
use super::plan::{acl_dtype, kv_acl_dtype, window_launch, KvLayout, WindowLaunch};
use super::rt::{check, opt, opt_arr, Executor, IntArray, Tensor, TensorList, View};
use super::sys::*;
use super::{AscendBackend, MASK_SIDE};
use crate::device::DeviceAttn;
use crate::error::{Error, Result};
use crate::{AttnParams, AttnSpans, SeqSpan};

/// `preTokens` / `nextTokens` as the FIA doc suggests (no band limit).
const NO_BAND: i64 = 2147483647;

/// One attention call's shared state.
pub(super) struct Fia<'a> {
    pub(super) be: &'a AscendBackend,
    pub(super) p: &'a AttnParams,
    pub(super) spans: &'a AttnSpans,
    pub(super) mem: &'a DeviceAttn,
    pub(super) stream: usize,
    pub(super) mask: Option<usize>,
    /// The decode-window ramp `(address, half)`: `half` bytes of 1 then `half` bytes of 0
    /// (see [`AscendBackend::ramp`]); present when a decode row needs a window mask.
    pub(super) ramp: Option<(usize, usize)>,
    /// An int8 cache's antiquant scales (and offsets) on the device.
    pub(super) antiquant: Option<AntiquantSet>,
}

/// Which `attenMask` a launch passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MaskArg {
    None,
    /// The int8 `[2048, 2048]` `triu(ones, 1)` of sparse modes 3 and 4.
    Causal,
    /// A decode window mask `[1, 1, 1, kv_s]` hiding keys `0..masked` (sparse mode 0).
    Decode {
        masked: usize,
        kv_s: usize,
    },
}

/// The tensors and numbers of one FIA launch.
struct FiaArgs<'c> {
    query: Tensor<'c>,
    out: Tensor<'c>,
    block_table: Tensor<'c>,
    act_q: Option<IntArray<'c>>,
    act_kv: IntArray<'c>,
    layout: &'static CStr,
    sparse_mode: i64,
    inner_precise: i64,
    mask: MaskArg,
    pre: i64,
    next: i64,
}

impl<'a> Fia<'a> {
    fn cann(&self) -> &'a Cann {
        &self.be.cann
    }

    /// The query's (and output's) dtype.
    fn dt(&self) -> i32 {
        // Checked by the plan.
        acl_dtype(self.p.query_dtype, "query_dtype").unwrap_or(ACL_FLOAT16)
    }

    /// The caches' dtype (fp16/bf16, or int8 with antiquant).
    fn kv_dt(&self) -> i32 {
        // Checked by the plan.
        kv_acl_dtype(self.p.cache.dtype).unwrap_or(ACL_FLOAT16)
    }

    /// One antiquant tensor (per-channel, `num_kv_heads * head_dim` of the query's dtype):
    /// `(1, N, D)` beside a BSND query (BnBsH cache), `(1, N, 1, D)` beside BNSD (BnNBsD).
    fn antiquant_tensor(&self, kv: KvLayout, addr: usize) -> Result<Tensor<'a>> {
        let (n, d) = (
            self.p.cache.num_kv_heads as i64,
            self.p.cache.head_dim as i64,
        );
        let (dims, strides) = match kv {
            KvLayout::BnBsH => (vec![1, n, d], vec![n * d, d, 1]),
            KvLayout::BnNBsD => (vec![1, n, 1, d], vec![n * d, d, d, 1]),
        };
        Tensor::new(
            self.cann(),
            &View {
                dims,
                strides,
                offset: 0,
                storage: n * d,
                dtype: self.dt(),
                data: addr as *mut c_void,
            },
        )
    }

    fn cache_list(&self, kv: KvLayout, addr: usize) -> Result<TensorList<'a>> {
        let c = &self.p.cache;
        let (n, ps, h, d) = (
            c.num_pages as i64,
            c.page_size as i64,
            c.num_kv_heads as i64,
            c.head_dim as i64,
        );
        let (dims, strides) = match kv {
            KvLayout::BnBsH => (vec![n, ps, h * d], vec![ps * h * d, h * d, 1]),
            KvLayout::BnNBsD => (vec![n, h, ps, d], vec![h * ps * d, ps * d, d, 1]),
        };
        let t = Tensor::new(
            self.cann(),
            &View {
                dims,
                strides,
                offset: 0,
                storage: self.spans.cache as i64,
                dtype: self.kv_dt(),
                data: addr as *mut c_void,
            },
        )?;
        TensorList::of_one(self.cann(), t)
    }

    /// A view of the query (`output = false`) or output buffer.
    fn qo(
        &self,
        output: bool,
        dims: Vec<i64>,
        strides: Vec<i64>,
        offset: i64,
    ) -> Result<Tensor<'a>> {
        let (addr, storage) = if output {
            (self.mem.output, self.spans.output)
        } else {
            (self.mem.query, self.spans.query)
        };
        Tensor::new(
            self.cann(),
            &View {
                dims,
                strides,
                offset,
                storage: storage as i64,
                dtype: self.dt(),
                data: addr as *mut c_void,
            },
        )
    }

    /// Block-table rows `[rows, max_pages]` from row `first`.
    fn block_table(&self, first: usize, rows: usize) -> Result<Tensor<'a>> {
        let s = self.p.block_table_stride as i64;
        Tensor::new(
            self.cann(),
            &View {
                dims: vec![rows as i64, self.p.max_pages_per_seq as i64],
                strides: vec![s, 1],
                offset: first as i64 * s,
                storage: self.spans.block_table as i64,
                dtype: ACL_INT32,
                data: self.mem.block_table as *mut c_void,
            },
        )
    }

    pub(super) fn decode(&self, kv: KvLayout, seqs: &[SeqSpan]) -> Result<()> {
        let (b, n, d) = (
            self.p.num_seqs as i64,
            self.p.num_heads as i64,
            self.p.cache.head_dim as i64,
        );
        let (qs, os) = (self.p.query_strides, self.p.output_strides);
        let (layout, qd, qst, ost): (&'static CStr, _, _, _) = match kv {
            // [B, 1, N, D]
            KvLayout::BnBsH => (
                c"BSND",
                vec![b, 1, n, d],
                vec![qs.token as i64, qs.token as i64, qs.head as i64, 1],
                vec![os.token as i64, os.token as i64, os.head as i64, 1],
            ),
            // [B, N, 1, D]
            KvLayout::BnNBsD => (
                c"BNSD",
                vec![b, n, 1, d],
                vec![qs.token as i64, qs.head as i64, d, 1],
                vec![os.token as i64, os.head as i64, d, 1],
            ),
        };
        let kv_lens: Vec<i64> = seqs.iter().map(|s| s.ctx_len as i64).collect();
        let args = FiaArgs {
            query: self.qo(false, qd.clone(), qst, 0)?,
            out: self.qo(true, qd, ost, 0)?,
            block_table: self.block_table(0, seqs.len())?,
            act_q: None,
            act_kv: IntArray::new(self.cann(), &kv_lens)?,
            layout,
            sparse_mode: 0,
            inner_precise: 1,
            mask: MaskArg::None,
            pre: NO_BAND,
            next: NO_BAND,
        };
        self.launch(kv, args)
    }

    pub(super) fn tnd(&self, kv: KvLayout, seqs: &[SeqSpan]) -> Result<()> {
        let (t, n, d) = (
            self.p.num_tokens as i64,
            self.p.num_heads as i64,
            self.p.cache.head_dim as i64,
        );
        let (qs, os) = (self.p.query_strides, self.p.output_strides);
        let q_ends: Vec<i64> = seqs.iter().map(|s| (s.q_start + s.q_len) as i64).collect();
        let kv_lens: Vec<i64> = seqs.iter().map(|s| s.ctx_len as i64).collect();
        let args = FiaArgs {
            query: self.qo(
                false,
                vec![t, n, d],
                vec![qs.token as i64, qs.head as i64, 1],
                0,
            )?,
            out: self.qo(
                true,
                vec![t, n, d],
                vec![os.token as i64, os.head as i64, 1],
                0,
            )?,
            block_table: self.block_table(0, seqs.len())?,
            act_q: Some(IntArray::new(self.cann(), &q_ends)?),
            act_kv: IntArray::new(self.cann(), &kv_lens)?,
            layout: c"TND",
            sparse_mode: 3,
            inner_precise: 0,
            mask: MaskArg::Causal,
            pre: NO_BAND,
            next: NO_BAND,
        };
        self.launch(kv, args)
    }

    pub(super) fn one_seq(&self, s: usize, seq: &SeqSpan) -> Result<()> {
        let (sl, n, d) = (
            seq.q_len as i64,
            self.p.num_heads as i64,
            self.p.cache.head_dim as i64,
        );
        let (qs, os) = (self.p.query_strides, self.p.output_strides);
        let q_tok = qs.token as i64;
        let o_tok = os.token as i64;
        // Query row i sits at position ctx - q + i: CANN's right-down causal mode (3), or its
        // right-down band (4) for a window; a decode row takes no sparse mode (see
        // `plan::window_launch`).
        let (sparse_mode, mask, pre, next) =
            match (window_launch(self.p.sliding_window, seq), seq.q_len > 1) {
                (WindowLaunch::Band { pre, next }, _) => (4, MaskArg::Causal, pre, next),
                (WindowLaunch::DecodeMask { masked }, _) => (
                    0,
                    MaskArg::Decode {
                        masked,
                        kv_s: self.p.max_pages_per_seq * self.p.cache.page_size,
                    },
                    NO_BAND,
                    NO_BAND,
                ),
                (WindowLaunch::None, true) => (3, MaskArg::Causal, NO_BAND, NO_BAND),
                (WindowLaunch::None, false) => (0, MaskArg::None, NO_BAND, NO_BAND),
            };
        let args = FiaArgs {
            query: self.qo(
                false,
                vec![1, sl, n, d],
                vec![sl * q_tok, q_tok, qs.head as i64, 1],
                seq.q_start as i64 * q_tok,
            )?,
            out: self.qo(
                true,
                vec![1, sl, n, d],
                vec![sl * o_tok, o_tok, os.head as i64, 1],
                seq.q_start as i64 * o_tok,
            )?,
            block_table: self.block_table(s, 1)?,
            act_q: None,
            act_kv: IntArray::new(self.cann(), &[seq.ctx_len as i64])?,
            layout: c"BSND",
            sparse_mode,
            inner_precise: if seq.q_len > 1 { 0 } else { 1 },
            mask,
            pre,
            next,
        };
        self.launch(KvLayout::BnBsH, args)
    }

    fn launch(&self, kv: KvLayout, a: FiaArgs<'a>) -> Result<()> {
        let cann = self.cann();
        let key = self.cache_list(kv, self.mem.key_cache)?;
        let value = self.cache_list(kv, self.mem.value_cache)?;
        let mask = match (a.mask, self.mask, self.ramp) {
            (MaskArg::None, _, _) => None,
            (MaskArg::Causal, Some(addr), _) => Some(Tensor::new(
                cann,
                &View {
                    dims: vec![MASK_SIDE as i64, MASK_SIDE as i64],
                    strides: vec![MASK_SIDE as i64, 1],
                    offset: 0,
                    storage: (MASK_SIDE * MASK_SIDE) as i64,
                    dtype: ACL_INT8,
                    data: addr as *mut c_void,
                },
            )?),
            // Row `masked` of the ramp: bytes `half - masked ..` are `masked` ones, then zeros.
            (MaskArg::Decode { masked, kv_s }, _, Some((addr, half)))
                if masked <= half && kv_s <= half =>
            {
                let k = kv_s as i64;
                Some(Tensor::new(
                    cann,
                    &View {
                        dims: vec![1, 1, 1, k],
                        strides: vec![k, k, k, 1],
                        offset: (half - masked) as i64,
                        storage: 2 * half as i64,
                        dtype: ACL_INT8,
                        data: addr as *mut c_void,
                    },
                )?)
            }
            _ => return Err(Error::BackendFailure("attention mask missing".into())),
        };
        // keyAntiquantScale, keyAntiquantOffset, valueAntiquantScale, valueAntiquantOffset
        // (per-channel: keyAntiquantMode = valueAntiquantMode = 0, the defaults passed below).
        let aq = match self.antiquant {
            None => None,
            Some(set) => Some((
                self.antiquant_tensor(kv, set.k_scale)?,
                self.antiquant_tensor(kv, set.v_scale)?,
                match set.offsets {
                    None => None,
                    Some((k, v)) => {
                        Some((self.antiquant_tensor(kv, k)?, self.antiquant_tensor(kv, v)?))
                    }
                },
            )),
        };
        let p = self.p;
        let c = &p.cache;
        let nul = std::ptr::null::<AclTensor>();
        let (ks, ko, vs, vo) = match &aq {
            None => (nul, nul, nul, nul),
            Some((k, v, off)) => (
                k.raw(),
                off.as_ref().map_or(nul, |o| o.0.raw()),
                v.raw(),
                off.as_ref().map_or(nul, |o| o.1.raw()),
            ),
        };
        let nula = std::ptr::null::<AclIntArray>();
        let layout = a.layout.as_ptr().cast_mut();
        let (nh, scale, nkv, sparse, ip, bs, pre, next) = (
            p.num_heads as i64,
            p.scale as f64,
            c.num_kv_heads as i64,
            a.sparse_mode,
            a.inner_precise,
            c.page_size as i64,
            a.pre,
            a.next,
        );
        let (q, k, v, m, aqa, akv, bt, o) = (
            a.query.raw(),
            key.raw(),
            value.raw(),
            opt(&mask),
            opt_arr(&a.act_q),
            a.act_kv.raw(),
            a.block_table.raw(),
            a.out.raw(),
        );
        let mut ws = 0u64;
        let mut exec = std::ptr::null_mut();
        let fia = self.be.cann.fia;
        // SAFETY: every tensor/array pointer is a live object created above or NULL for an
        // unused optional input; argument order follows the V2/V3/V4 headers (sys.rs); the
        // layout string is NUL-terminated and not written by CANN.
        let (code, call, run_call): (AclError, &'static str, &'static str) = unsafe {
            match fia.get_ws {
                FiaFn::V2(f) => (
                    f(
                        q, k, v, nul, m, aqa, akv, nul, nul, nul, nul, nul, nul, nul, bt, nul, nul,
                        ks, ko, vs, vo, nul, nul, nula, nh, scale, pre, next, layout, nkv, sparse,
                        ip, bs, 0, false, 0, 0, o, nul, &mut ws, &mut exec,
                    ),
                    "aclnnFusedInferAttentionScoreV2GetWorkspaceSize",
                    "aclnnFusedInferAttentionScoreV2",
                ),
                FiaFn::V3(f) => (
                    f(
                        q, k, v, nul, m, aqa, akv, nul, nul, nul, nul, nul, nul, nul, bt, nul, nul,
                        ks, ko, vs, vo, nul, nul, nula, nul, nul, nul, nh, scale, pre, next,
                        layout, nkv, sparse, ip, bs, 0, false, 0, 0, o, nul, &mut ws, &mut exec,
                    ),
                    "aclnnFusedInferAttentionScoreV3GetWorkspaceSize",
                    "aclnnFusedInferAttentionScoreV3",
                ),
                FiaFn::V4(f) => (
                    f(
                        q, k, v, nul, m, aqa, akv, nul, nul, nul, nul, nul, nul, nul, bt, nul, nul,
                        ks, ko, vs, vo, nul, nul, nula, nul, nul, nul, nul, nul, nh, scale, pre,
                        next, layout, nkv, sparse, ip, bs, 0, false, 0, 0, 0, o, nul, &mut ws,
                        &mut exec,
                    ),
                    "aclnnFusedInferAttentionScoreV4GetWorkspaceSize",
                    "aclnnFusedInferAttentionScoreV4",
                ),
            }
        };
        check(cann, code, call)?;
        let exec = Executor::new(cann, exec, call)?;
        self.be.execute(exec, ws, fia.exec, self.stream, run_call)
        // Tensors, lists and arrays drop here, after the launch (host descriptors only).
    }
}
