//! The Ascend backend: paged attention, KV write and page copy launched on the caller's
//! `aclrtStream` through CANN loaded at run time (`dlopen`; no build-time dependency).
//!
//! * `antiquant`: device copies of an int8 cache's antiquant scales and offsets, by contents.
//! * `fia`: the launch builder of `aclnnFusedInferAttentionScore` (V2/V3/V4): the tensors,
//!   lists and arrays of one attention call, by the plan's layout (decode, TND, per sequence);
//! * [`loader`]: finds and loads `libascendcl.so`, `libnnopbase.so` and the op libraries, and
//!   resolves every symbol (FIA version preference: `loader::FIA_PREFERENCE`).
//! * [`plan`]: the CANN constraints, checked before any CANN call.
//! * [`rt`]: owned tensors / int arrays / tensor lists / executors (destroyed on every path) and
//!   the status mapping.
//! * [`workspace`]: per-stream grow-only workspaces.
//!
//! Memory: every tensor pointer of a launch is a **device** address (never read on the host);
//! `context_lens`, `query_start_loc` and the copy list are host arrays, validated by the shared
//! checks of [`crate`] before anything is launched. A launch enqueues work and
//! returns: kvshare never creates, synchronises or destroys a stream.
//!
//! Verified only against the emulated CANN runtime of `tests/cann_emu` and the documented API;
//! see `docs/ascend.md`.

mod antiquant;
mod fia;
pub mod loader;
pub mod plan;
pub mod rt;
pub mod sys;
pub mod workspace;

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use self::antiquant::{AntiquantSet, AntiquantSets};
use self::loader::Cann;
use self::plan::{acl_dtype, check_align, kv_layout, AttnPlan, KvLayout};
use self::rt::{check, Executor, IntArray, Tensor, View};
use self::sys::*;
use self::workspace::{dev_alloc, Workspaces};
use super::copy_runs::page_copy_runs;
use super::device::{
    DeviceAttn, DeviceAttnBatch, DeviceBackend, DeviceCopyBatch, DeviceKvWrite, DeviceKvWriteBatch,
};
use super::{
    AttnParams, AttnSpans, BackendInfo, ChannelScales, CopyKind, DType, KvWriteParams, SeqSpan,
};
use crate::error::{Error, Result};

/// Side of the square causal mask CANN's optimized causal modes (sparse 2/3) take.
pub(crate) const MASK_SIDE: usize = 2048;

/// Options of [`AscendBackend::new`].
#[derive(Debug, Clone, Default)]
pub struct AscendOptions {
    /// Device the backend binds to (`aclrtSetDevice`).
    pub device_id: i32,
    /// Directory holding the CANN libraries (else `$ASCEND_HOME_PATH/lib64`, else the loader's
    /// search path).
    pub library_dir: Option<PathBuf>,
}

/// The Ascend backend. **Thread safety:** `Send + Sync`; launches from several threads are
/// fine (each uses its stream's own workspace); a thread that has no current device is bound to
/// the backend's device on its first launch.
pub struct AscendBackend {
    cann: Arc<Cann>,
    device: i32,
    ws: Workspaces,
    /// The int8 `[2048, 2048]` causal mask on the device, made on the first prefill.
    mask: Mutex<Option<usize>>,
    /// Decode-window ramps `(address, half)`, grow-only: the last is the largest; older ones
    /// stay allocated (queued launches may still read them) until the backend is freed.
    ramps: Mutex<Vec<(usize, usize)>>,
    /// int8 caches' antiquant scales on the device, by contents.
    antiquant: AntiquantSets,
}

// SAFETY: the function table is immutable; device addresses are plain integers; mutable state
// is behind mutexes.
unsafe impl Send for AscendBackend {}
// SAFETY: as for `Send`: shared access reads the immutable table or goes through the mutexes.
unsafe impl Sync for AscendBackend {}

fn stream_ptr(stream: usize) -> AclrtStream {
    stream as AclrtStream
}

impl AscendBackend {
    /// Loads CANN, initialises ACL (an already initialised ACL is fine) and binds the calling
    /// thread to `options.device_id`.
    pub fn new(options: &AscendOptions) -> Result<Self> {
        let cann = loader::load(options.library_dir.as_deref())?;
        let unavailable = |e: Error| match e {
            Error::BackendFailure(m) | Error::BackendUnavailable(m) => Error::BackendUnavailable(m),
            Error::Invalid { reason, .. } => Error::BackendUnavailable(reason),
            e => e,
        };
        // SAFETY: documented signature; NULL config path is allowed.
        let code = unsafe { (cann.init)(std::ptr::null()) };
        if code != ACL_SUCCESS && code != ACL_ERROR_REPEAT_INITIALIZE {
            return Err(unavailable(rt::acl_error(&cann, code, "aclInit")));
        }
        if options.device_id < 0 {
            return Err(Error::arg(
                "options.device_id",
                format!("{} is negative", options.device_id),
            ));
        }
        // SAFETY: documented signature.
        let code = unsafe { (cann.set_device)(options.device_id) };
        check(&cann, code, "aclrtSetDevice").map_err(|e| {
            unavailable(match e {
                Error::BackendFailure(m) => {
                    Error::BackendFailure(format!("device {}: {m}", options.device_id))
                }
                e => e,
            })
        })?;
        Ok(AscendBackend {
            ws: Workspaces::new(cann.clone()),
            cann,
            device: options.device_id,
            mask: Mutex::new(None),
            ramps: Mutex::new(Vec::new()),
            antiquant: AntiquantSets::default(),
        })
    }

    /// The device id.
    pub fn device_id(&self) -> i32 {
        self.device
    }

    /// The FIA version in use (2, 3 or 4).
    pub fn fia_version(&self) -> u32 {
        self.cann.fia.get_ws.version()
    }

    /// Whether `aclnnScatterPaKvCache` was found.
    pub fn has_scatter(&self) -> bool {
        self.cann.scatter.is_some()
    }

    /// One line for logs and support: device, libraries, op versions found and used.
    pub fn describe(&self) -> String {
        let (streams, bytes, allocs) = self.ws.stats();
        format!(
            "ascend: device {}; {}; workspaces: {streams} stream(s), {bytes} bytes, {allocs} \
             allocation(s); int8 antiquant scale sets: {}",
            self.device,
            self.cann.inventory,
            self.antiquant.len()
        )
    }

    /// Binds the calling thread to the backend's device if it has none; refuses a thread bound
    /// to another device (kvshare never switches a caller's device behind its back).
    fn bind_thread(&self) -> Result<()> {
        let mut cur = -1i32;
        // SAFETY: out-pointer valid.
        let code = unsafe { (self.cann.get_device)(&mut cur) };
        if code == ACL_SUCCESS && cur == self.device {
            return Ok(());
        }
        if code == ACL_SUCCESS {
            return Err(Error::BackendFailure(format!(
                "this thread's current device is {cur}, the backend is bound to device {}; call \
                 aclrtSetDevice({}) on this thread first",
                self.device, self.device
            )));
        }
        // SAFETY: documented signature.
        let code = unsafe { (self.cann.set_device)(self.device) };
        check(&self.cann, code, "aclrtSetDevice")
    }

    /// The causal mask (made once: `aclrtMalloc` + a synchronous `aclrtMemcpy`, which uses no
    /// stream of the caller).
    fn mask(&self) -> Result<usize> {
        let mut m = self
            .mask
            .lock()
            .map_err(|_| Error::BackendFailure("mask lock poisoned".into()))?;
        if let Some(a) = *m {
            return Ok(a);
        }
        let n = MASK_SIDE * MASK_SIDE;
        let mut host = vec![0i8; n];
        for i in 0..MASK_SIDE {
            host[i * MASK_SIDE + i + 1..(i + 1) * MASK_SIDE].fill(1); // triu(ones, diagonal=1)
        }
        let addr = dev_alloc(&self.cann, n as u64)?;
        // SAFETY: both buffers hold n bytes.
        let code = unsafe {
            (self.cann.memcpy)(
                addr as *mut c_void,
                n,
                host.as_ptr().cast(),
                n,
                ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        if let Err(e) = check(&self.cann, code, "aclrtMemcpy") {
            // SAFETY: allocated just above, never handed to a launch.
            unsafe { (self.cann.free)(addr as *mut c_void) };
            return Err(e);
        }
        *m = Some(addr);
        Ok(addr)
    }

    /// A device ramp of at least `need` keys for decode-window masks: `half` int8 ones then
    /// `half` zeros (`half >= need`, a power of two), so bytes `half - m .. half - m + kv_s`
    /// are the mask `[1, 1, 1, kv_s]` hiding keys `0..m` for any `m, kv_s <= half`. Its contents
    /// never change, so one ramp serves every launch on every stream (made like the causal
    /// mask: `aclrtMalloc` + a synchronous `aclrtMemcpy`).
    fn ramp(&self, need: usize) -> Result<(usize, usize)> {
        let mut r = self
            .ramps
            .lock()
            .map_err(|_| Error::BackendFailure("mask lock poisoned".into()))?;
        if let Some(&(a, half)) = r.last() {
            if half >= need {
                return Ok((a, half));
            }
        }
        let half = need.max(MASK_SIDE).next_power_of_two();
        let n = 2 * half;
        let mut host = vec![0i8; n];
        host[..half].fill(1);
        let addr = dev_alloc(&self.cann, n as u64)?;
        // SAFETY: both buffers hold n bytes.
        let code = unsafe {
            (self.cann.memcpy)(
                addr as *mut c_void,
                n,
                host.as_ptr().cast(),
                n,
                ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        if let Err(e) = check(&self.cann, code, "aclrtMemcpy") {
            // SAFETY: allocated just above, never handed to a launch.
            unsafe { (self.cann.free)(addr as *mut c_void) };
            return Err(e);
        }
        r.push((addr, half));
        Ok((addr, half))
    }

    /// Runs GetWorkspaceSize's result: gets a workspace for the stream and executes.
    fn execute(
        &self,
        exec: Executor<'_>,
        ws_size: u64,
        run: AclnnExecute,
        stream: usize,
        call: &'static str,
    ) -> Result<()> {
        let (ws, _capacity) = self.ws.get(stream_ptr(stream), ws_size)?; // on error `exec` drops
        exec.run(run, ws, ws_size, stream_ptr(stream), call)
    }

    /// Paged attention: see [`plan`] for what CANN accepts.
    fn launch_attention(
        &self,
        p: &AttnParams,
        spans: &AttnSpans,
        seqs: &[SeqSpan],
        mem: &DeviceAttn,
        channels: Option<ChannelScales<'_>>,
        stream: usize,
    ) -> Result<()> {
        let plan = plan::plan_attention(p, seqs)?;
        check_align("query", mem.query)?;
        check_align("output", mem.output)?;
        check_align("key_cache", mem.key_cache)?;
        check_align("value_cache", mem.value_cache)?;
        check_align("block_table", mem.block_table)?;
        self.bind_thread()?;
        let antiquant = match (p.cache.dtype, channels) {
            (DType::Int8, Some(ch)) => Some(self.antiquant_set(p, &ch)?),
            // `DeviceAttnBatch::new` checked that an int8 cache has channel scales.
            (DType::Int8, None) => {
                return Err(Error::BackendFailure("int8 channel scales missing".into()))
            }
            _ => None,
        };
        // The launches of the per-sequence plans: `(sequence, span)` rows.
        let rows: Vec<(usize, SeqSpan)> = match plan {
            AttnPlan::PerToken => plan::token_rows(seqs),
            _ => seqs.iter().copied().enumerate().collect(),
        };
        let per_row = matches!(plan, AttnPlan::PerSeqBsnd | AttnPlan::PerToken);
        let needs_mask =
            matches!(plan, AttnPlan::Tnd(_)) || (per_row && rows.iter().any(|(_, s)| s.q_len > 1));
        let mask = if needs_mask { Some(self.mask()?) } else { None };
        let needs_ramp = per_row
            && rows.iter().any(|(_, s)| {
                matches!(
                    plan::window_launch(p.sliding_window, s),
                    plan::WindowLaunch::DecodeMask { .. }
                )
            });
        let ramp = if needs_ramp {
            Some(self.ramp(p.max_pages_per_seq * p.cache.page_size)?)
        } else {
            None
        };
        let f = fia::Fia {
            be: self,
            p,
            spans,
            mem,
            stream,
            mask,
            ramp,
            antiquant,
        };
        match plan {
            AttnPlan::Decode(kv) => f.decode(kv, seqs),
            AttnPlan::Tnd(kv) => f.tnd(kv, seqs),
            AttnPlan::PerSeqBsnd | AttnPlan::PerToken => {
                for (s, seq) in &rows {
                    if seq.q_len > 0 {
                        f.one_seq(*s, seq)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// The device antiquant tensors of an int8 cache's scales (see [`antiquant`]).
    fn antiquant_set(&self, p: &AttnParams, ch: &ChannelScales<'_>) -> Result<AntiquantSet> {
        let n = p.cache.num_kv_heads * p.cache.head_dim;
        self.antiquant
            .get(&self.cann, p.query_dtype, p.kv_scales, ch, n)
    }

    /// KV write through `aclnnScatterPaKvCache` ("Norm" cache mode).
    fn launch_kv_write(
        &self,
        p: &KvWriteParams,
        src_elems: usize,
        mem: &DeviceKvWrite,
        stream: usize,
    ) -> Result<()> {
        let Some(op) = self.cann.scatter else {
            return Err(Error::BackendUnavailable(
                "aclnnScatterPaKvCache is not in this CANN's op libraries (see \
                 kvs_backend_describe); write K/V with the engine's own op \
                 (torch_npu.npu_scatter_pa_kv_cache / _npu_reshape_and_cache, ATB \
                 ReshapeAndCacheOperation)"
                    .into(),
            ));
        };
        let c = &p.cache;
        if c.dtype.is_quantized() {
            return Err(Error::Unsupported(format!(
                "Ascend backend: kvs_kv_write into a {:?} cache: aclnnScatterPaKvCache copies \
                 elements and does not quantize, and kvshare composes no quantize op with it; \
                 the engine's own quantizing write fills an int8 cache (vLLM-Ascend C8: \
                 torch_npu.npu_quantize then npu_scatter_nd_update_; MindIE C8: \
                 aclnnDequantRopeQuantKvcache or its quant before ATB ReshapeAndCache); \
                 kvs_attention_launch_scaled then reads it",
                c.dtype
            )));
        }
        let dt = acl_dtype(c.dtype, "cache.dtype")?;
        plan::unscaled(&p.scales)?;
        if p.src_dtype != c.dtype {
            return Err(Error::Unsupported(format!(
                "Ascend backend: key/value dtype {:?} differs from the cache dtype {:?}; \
                 aclnnScatterPaKvCache does not convert",
                p.src_dtype, c.dtype
            )));
        }
        if kv_layout(c)? != KvLayout::BnBsH {
            return Err(Error::Unsupported(
                "Ascend backend: aclnnScatterPaKvCache \"Norm\" mode needs the dense [pages, \
                 page_size, kv_heads, head_dim] cache"
                    .into(),
            ));
        }
        let (t, h, d) = (p.num_tokens, c.num_kv_heads, c.head_dim);
        let dense_src =
            (p.src_strides.token == h * d || t == 1) && (p.src_strides.head == d || h == 1);
        if !dense_src {
            return Err(Error::Unsupported(format!(
                "Ascend backend: aclnnScatterPaKvCache needs contiguous key/value [num_tokens, \
                 kv_heads, head_dim] (strides {}, {}; dense is {}, {d})",
                p.src_strides.token,
                p.src_strides.head,
                h * d
            )));
        }
        for (f, a) in [
            ("key", mem.key),
            ("value", mem.value),
            ("key_cache", mem.key_cache),
            ("value_cache", mem.value_cache),
            ("slot_mapping", mem.slot_mapping),
        ] {
            check_align(f, a)?;
        }
        self.bind_thread()?;
        let cann = &*self.cann;
        let n = c.num_pages as i64;
        let (ps, h, d, t) = (c.page_size as i64, h as i64, d as i64, t as i64);
        let cache_view = |addr: usize| View {
            dims: vec![n, ps, h, d],
            strides: vec![ps * h * d, h * d, d, 1],
            offset: 0,
            storage: n * ps * h * d,
            dtype: dt,
            data: addr as *mut c_void,
        };
        let src_view = |addr: usize| View {
            dims: vec![t, h, d],
            strides: vec![h * d, d, 1],
            offset: 0,
            storage: src_elems as i64,
            dtype: dt,
            data: addr as *mut c_void,
        };
        let key = Tensor::new(cann, &src_view(mem.key))?;
        let value = Tensor::new(cann, &src_view(mem.value))?;
        let kc = Tensor::new(cann, &cache_view(mem.key_cache))?;
        let vc = Tensor::new(cann, &cache_view(mem.value_cache))?;
        let slots = Tensor::new(
            cann,
            &View {
                dims: vec![t],
                strides: vec![1],
                offset: 0,
                storage: t,
                dtype: if mem.slots_i64 { ACL_INT64 } else { ACL_INT32 },
                data: mem.slot_mapping as *mut c_void,
            },
        )?;
        let strides = IntArray::new(cann, &[1, 1])?;
        let offsets = IntArray::new(cann, &[0, 0])?;
        let mut cache_mode = *b"Norm\0";
        let mut scatter_mode = *b"None\0";
        let mut ws = 0u64;
        let mut exec = std::ptr::null_mut();
        const CALL: &str = "aclnnScatterPaKvCacheGetWorkspaceSize";
        // SAFETY: every pointer is a live object created above or NULL for an optional input;
        // the mode strings are NUL-terminated.
        let code = unsafe {
            (op.get_ws)(
                key.raw(),
                kc.raw_mut(),
                slots.raw(),
                value.raw(),
                vc.raw_mut(),
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                cache_mode.as_mut_ptr().cast(),
                scatter_mode.as_mut_ptr().cast(),
                strides.raw(),
                offsets.raw(),
                &mut ws,
                &mut exec,
            )
        };
        check(cann, code, CALL)?;
        let exec = Executor::new(cann, exec, CALL)?;
        self.execute(exec, ws, op.exec, stream, "aclnnScatterPaKvCache")
    }

    /// Page copies with `aclrtMemcpyAsync` on the stream, in order.
    fn launch_copies(&self, batch: &DeviceCopyBatch<'_>, stream: usize) -> Result<()> {
        let (lay, copies, mem) = (batch.params.cache, batch.copies, &batch.mem);
        let (dev_bytes, host_bytes) = (batch.device_bytes, batch.host_bytes);
        if copies.iter().all(|c| c.num_tokens == 0) {
            return Ok(());
        }
        self.bind_thread()?;
        for cp in copies {
            let n = cp.num_tokens as usize;
            if n == 0 {
                continue;
            }
            let (sp, dp) = (cp.src_page as usize, cp.dst_page as usize);
            let (kind, pairs) = match cp.kind {
                CopyKind::DeviceToDevice => (
                    ACL_MEMCPY_DEVICE_TO_DEVICE,
                    [
                        (mem.key_cache, mem.key_cache, dev_bytes),
                        (mem.value_cache, mem.value_cache, dev_bytes),
                    ],
                ),
                CopyKind::DeviceToHost => (
                    ACL_MEMCPY_DEVICE_TO_HOST,
                    [
                        (mem.key_cache, mem.host_key_cache, host_bytes),
                        (mem.value_cache, mem.host_value_cache, host_bytes),
                    ],
                ),
                CopyKind::HostToDevice => (
                    ACL_MEMCPY_HOST_TO_DEVICE,
                    [
                        (mem.host_key_cache, mem.key_cache, dev_bytes),
                        (mem.host_value_cache, mem.value_cache, dev_bytes),
                    ],
                ),
            };
            for (src, dst, dst_len) in pairs {
                for run in page_copy_runs(&lay, sp, dp, n) {
                    // SAFETY: the run lies inside both caches: `p.validate()` sized the layout
                    // spans, the caller's buffers hold at least those bytes (the C export's
                    // contract), and `page_copy_runs` stays within pages below each tier's page
                    // count and slots below `num_tokens <= page_size` (checked by the caller's
                    // `check_copies`). CANN copies asynchronously on the stream, which the caller
                    // keeps the buffers alive for.
                    let code = unsafe {
                        (self.cann.memcpy_async)(
                            (dst + run.dst) as *mut c_void,
                            dst_len - run.dst,
                            (src + run.src) as *const c_void,
                            run.len,
                            kind,
                            stream_ptr(stream),
                        )
                    };
                    check(&self.cann, code, "aclrtMemcpyAsync")?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for AscendBackend {
    fn drop(&mut self) {
        if let Ok(m) = self.mask.get_mut() {
            if let Some(a) = m.take() {
                // SAFETY: allocated by aclrtMalloc; the caller synchronised its streams before
                // freeing the backend (documented contract).
                unsafe { (self.cann.free)(a as *mut c_void) };
            }
        }
        if let Ok(r) = self.ramps.get_mut() {
            for (a, _) in r.drain(..) {
                // SAFETY: as the mask above.
                unsafe { (self.cann.free)(a as *mut c_void) };
            }
        }
        self.antiquant.free_all(&self.cann);
    }
}

impl BackendInfo for AscendBackend {
    fn name(&self) -> &'static str {
        "ascend"
    }
    fn describe(&self) -> String {
        AscendBackend::describe(self)
    }
    fn limits(&self) -> super::Limits {
        super::Limits {
            head_dim: plan::MAX_HEAD_DIM,
            group: plan::MAX_HEADS_PER_KV_HEAD,
            ..super::Limits::shared()
        }
    }
}

impl DeviceBackend for AscendBackend {
    fn check_address(&self, field: &'static str, addr: usize) -> Result<()> {
        check_align(field, addr)
    }
    fn attention(&self, b: DeviceAttnBatch<'_>, stream: usize) -> Result<()> {
        self.launch_attention(
            &b.params,
            &b.spans,
            &b.seqs,
            &b.mem,
            b.channel_scales,
            stream,
        )
    }
    fn kv_write(&self, b: DeviceKvWriteBatch, stream: usize) -> Result<()> {
        self.launch_kv_write(&b.params, b.src_elems, &b.mem, stream)
    }
    fn copy_pages(&self, b: DeviceCopyBatch<'_>, stream: usize) -> Result<()> {
        self.launch_copies(&b, stream)
    }
}
