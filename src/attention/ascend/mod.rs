//! The Ascend backend: paged attention, KV write and page copy launched on the caller's
//! `aclrtStream` through CANN loaded at run time (`dlopen`; no build-time dependency).
//!
//! * [`loader`]: finds and loads `libascendcl.so`, `libnnopbase.so` and the op libraries, and
//!   resolves every symbol (FIA version preference: [`loader::FIA_PREFERENCE`]).
//! * [`plan`]: the CANN constraints, checked before any CANN call.
//! * [`rt`]: owned tensors / int arrays / tensor lists / executors (destroyed on every path) and
//!   the status mapping.
//! * [`workspace`]: per-stream grow-only workspaces.
//!
//! Memory: every tensor pointer of a launch is a **device** address (never read on the host);
//! `context_lens`, `query_start_loc` and the copy list are host arrays, validated by the shared
//! checks of [`crate::attention`] before anything is launched. A launch enqueues work and
//! returns: kvshare never creates, synchronises or destroys a stream.
//!
//! Verified only against the emulated CANN runtime of `tests/cann_emu` and the documented API;
//! see `docs/ascend.md`.

pub mod loader;
pub mod plan;
pub mod rt;
pub mod sys;
pub mod workspace;

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use self::loader::{Cann, FiaFn};
use self::plan::{acl_dtype, check_align, kv_layout, AttnPlan, KvLayout};
use self::rt::{check, opt, opt_arr, Executor, IntArray, Tensor, TensorList, View};
use self::sys::*;
use self::workspace::{dev_alloc, Workspaces};
use super::copy_runs::page_copy_runs;
use super::{
    AttnBatch, AttnParams, AttnSpans, Backend, CopyKind, CopyParams, KvWrite, KvWriteParams,
    PageCopy, PageCopyBatch, SeqSpan,
};
use crate::core::{Error, Result};

/// Side of the square causal mask CANN's optimized causal modes (sparse 2/3) take.
pub(crate) const MASK_SIDE: usize = 2048;
/// `preTokens` / `nextTokens` as the FIA doc suggests (no band limit).
const NO_BAND: i64 = 2147483647;

/// Options of [`AscendBackend::new`].
#[derive(Debug, Clone, Default)]
pub struct AscendOptions {
    /// Device the backend binds to (`aclrtSetDevice`).
    pub device_id: i32,
    /// Directory holding the CANN libraries (else `$ASCEND_HOME_PATH/lib64`, else the loader's
    /// search path).
    pub library_dir: Option<PathBuf>,
}

/// The memory of one attention launch: device addresses (query, output, caches, block table).
#[derive(Debug, Clone, Copy)]
pub struct DeviceAttn {
    /// `[num_tokens, num_heads, head_dim]` query.
    pub query: usize,
    /// Output, same shape.
    pub output: usize,
    /// K cache.
    pub key_cache: usize,
    /// V cache.
    pub value_cache: usize,
    /// int32 block table.
    pub block_table: usize,
}

/// The memory of one KV write (device addresses).
#[derive(Debug, Clone, Copy)]
pub struct DeviceKvWrite {
    /// New keys `[num_tokens, kv_heads, head_dim]`.
    pub key: usize,
    /// New values.
    pub value: usize,
    /// K cache.
    pub key_cache: usize,
    /// V cache.
    pub value_cache: usize,
    /// Slot mapping `[num_tokens]`.
    pub slot_mapping: usize,
    /// Whether the slot mapping is int64 (else int32).
    pub slots_i64: bool,
}

/// The caches of one page copy: device K/V (device addresses) and host K/V (host addresses of
/// page-locked memory from `aclrtMallocHost`; 0 when there are no host pages).
#[derive(Debug, Clone, Copy)]
pub struct DeviceCopy {
    /// Device K cache.
    pub key_cache: usize,
    /// Device V cache.
    pub value_cache: usize,
    /// Host K cache.
    pub host_key_cache: usize,
    /// Host V cache.
    pub host_value_cache: usize,
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
}

// SAFETY: the function table is immutable; device addresses are plain integers; mutable state
// is behind mutexes.
unsafe impl Send for AscendBackend {}
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
            Error::AttnInvalid { reason, .. } => Error::BackendUnavailable(reason),
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
             allocation(s)",
            self.device, self.cann.inventory
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
    pub fn attention(
        &self,
        p: &AttnParams,
        spans: &AttnSpans,
        seqs: &[SeqSpan],
        mem: &DeviceAttn,
        stream: usize,
    ) -> Result<()> {
        let plan = plan::plan_attention(p, seqs)?;
        check_align("query", mem.query)?;
        check_align("output", mem.output)?;
        check_align("key_cache", mem.key_cache)?;
        check_align("value_cache", mem.value_cache)?;
        check_align("block_table", mem.block_table)?;
        self.bind_thread()?;
        let needs_mask = matches!(plan, AttnPlan::Tnd(_))
            || (plan == AttnPlan::PerSeqBsnd && seqs.iter().any(|s| s.q_len > 1));
        let mask = if needs_mask { Some(self.mask()?) } else { None };
        let f = Fia {
            be: self,
            p,
            spans,
            mem,
            stream,
            mask,
        };
        match plan {
            AttnPlan::Decode(kv) => f.decode(kv, seqs),
            AttnPlan::Tnd(kv) => f.tnd(kv, seqs),
            AttnPlan::PerSeqBsnd => {
                for (s, seq) in seqs.iter().enumerate() {
                    if seq.q_len > 0 {
                        f.one_seq(s, seq)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// KV write through `aclnnScatterPaKvCache` ("Norm" cache mode).
    pub fn kv_write(
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
        let dt = acl_dtype(c.dtype, "cache.dtype")?;
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
    pub fn copy_pages(
        &self,
        p: &CopyParams,
        copies: &[PageCopy],
        mem: &DeviceCopy,
        stream: usize,
    ) -> Result<()> {
        let lay = p.cache;
        let esz = lay.dtype.size_bytes();
        let (dev_bytes, host_bytes) = {
            let (d, h) = p.validate()?;
            (d * esz, h * esz)
        };
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
    }
}

/// The host-memory entry points of [`Backend`] are never used for this backend (the C exports
/// route device memory to [`AscendBackend`]'s own methods through [`Backend::ascend`]).
impl Backend for AscendBackend {
    fn name(&self) -> &'static str {
        "ascend"
    }
    fn attention(&self, _batch: AttnBatch<'_>) -> Result<()> {
        Err(host_memory())
    }
    fn kv_write(&self, _write: KvWrite<'_>) -> Result<()> {
        Err(host_memory())
    }
    fn copy_pages(&self, _batch: PageCopyBatch<'_>) -> Result<()> {
        Err(host_memory())
    }
    fn ascend(&self) -> Option<&AscendBackend> {
        Some(self)
    }
    fn describe(&self) -> String {
        AscendBackend::describe(self)
    }
    fn limits(&self) -> super::Limits {
        super::Limits {
            head_dim: plan::MAX_HEAD_DIM,
            group: plan::MAX_GROUP,
            ..super::Limits::shared()
        }
    }
}

fn host_memory() -> Error {
    Error::Unsupported("the Ascend backend takes device memory, not host buffers".into())
}

/// One attention call's shared state.
struct Fia<'a> {
    be: &'a AscendBackend,
    p: &'a AttnParams,
    spans: &'a AttnSpans,
    mem: &'a DeviceAttn,
    stream: usize,
    mask: Option<usize>,
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
}

impl<'a> Fia<'a> {
    fn cann(&self) -> &'a Cann {
        &self.be.cann
    }

    fn dt(&self) -> i32 {
        // Checked by the plan.
        acl_dtype(self.p.cache.dtype, "cache.dtype").unwrap_or(ACL_FLOAT16)
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
                dtype: self.dt(),
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

    fn decode(&self, kv: KvLayout, seqs: &[SeqSpan]) -> Result<()> {
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
        };
        self.launch(kv, args)
    }

    fn tnd(&self, kv: KvLayout, seqs: &[SeqSpan]) -> Result<()> {
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
        };
        self.launch(kv, args)
    }

    fn one_seq(&self, s: usize, seq: &SeqSpan) -> Result<()> {
        let (sl, n, d) = (
            seq.q_len as i64,
            self.p.num_heads as i64,
            self.p.cache.head_dim as i64,
        );
        let (qs, os) = (self.p.query_strides, self.p.output_strides);
        let q_tok = qs.token as i64;
        let o_tok = os.token as i64;
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
            // Query row i sits at position ctx - q + i: CANN's right-down causal mode.
            sparse_mode: if seq.q_len > 1 { 3 } else { 0 },
            inner_precise: if seq.q_len > 1 { 0 } else { 1 },
        };
        self.launch(KvLayout::BnBsH, args)
    }

    fn launch(&self, kv: KvLayout, a: FiaArgs<'a>) -> Result<()> {
        let cann = self.cann();
        let key = self.cache_list(kv, self.mem.key_cache)?;
        let value = self.cache_list(kv, self.mem.value_cache)?;
        let mask = match (a.sparse_mode, self.mask) {
            (3, Some(addr)) => Some(Tensor::new(
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
            (3, None) => return Err(Error::BackendFailure("causal mask missing".into())),
            _ => None,
        };
        let p = self.p;
        let c = &p.cache;
        let nul = std::ptr::null::<AclTensor>();
        let nula = std::ptr::null::<AclIntArray>();
        let layout = a.layout.as_ptr().cast_mut();
        let (nh, scale, nkv, sparse, ip, bs) = (
            p.num_heads as i64,
            p.scale as f64,
            c.num_kv_heads as i64,
            a.sparse_mode,
            a.inner_precise,
            c.page_size as i64,
        );
        let (q, k, v, m, aq, akv, bt, o) = (
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
                        q, k, v, nul, m, aq, akv, nul, nul, nul, nul, nul, nul, nul, bt, nul, nul,
                        nul, nul, nul, nul, nul, nul, nula, nh, scale, NO_BAND, NO_BAND, layout,
                        nkv, sparse, ip, bs, 0, false, 0, 0, o, nul, &mut ws, &mut exec,
                    ),
                    "aclnnFusedInferAttentionScoreV2GetWorkspaceSize",
                    "aclnnFusedInferAttentionScoreV2",
                ),
                FiaFn::V3(f) => (
                    f(
                        q, k, v, nul, m, aq, akv, nul, nul, nul, nul, nul, nul, nul, bt, nul, nul,
                        nul, nul, nul, nul, nul, nul, nula, nul, nul, nul, nh, scale, NO_BAND,
                        NO_BAND, layout, nkv, sparse, ip, bs, 0, false, 0, 0, o, nul, &mut ws,
                        &mut exec,
                    ),
                    "aclnnFusedInferAttentionScoreV3GetWorkspaceSize",
                    "aclnnFusedInferAttentionScoreV3",
                ),
                FiaFn::V4(f) => (
                    f(
                        q, k, v, nul, m, aq, akv, nul, nul, nul, nul, nul, nul, nul, bt, nul, nul,
                        nul, nul, nul, nul, nul, nul, nula, nul, nul, nul, nul, nul, nh, scale,
                        NO_BAND, NO_BAND, layout, nkv, sparse, ip, bs, 0, false, 0, 0, 0, o, nul,
                        &mut ws, &mut exec,
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
