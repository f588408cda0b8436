//! The CPU backend: synchronous, host memory, f32/f16/bf16 (and fp8 caches) with f32
//! accumulation.
//!
//! Attention runs on a persistent [`ThreadPool`] over the items of a plan (`cpu/plan.rs`): some query tokens
//! of one sequence against all its kv heads (so its K/V streams from memory) and a range of its
//! keys; long sequences are split into key chunks whose partial softmaxes are merged exactly
//! (split-K / flash-decoding), and the heads are divided only when the batch is still too small
//! to keep the threads busy. The query heads of one kv head (GQA/MQA) share each K/V read. See
//! `kernel` for the inner loop and `cpu/isa.rs` for the instruction-set paths.

use half::{bf16, f16};

use std::sync::OnceLock;

pub use isa::{amx_permission, cpu_flags, Isa, ISA_ENV};
use plan::Item;

use super::copy_runs::{page_copy_runs, ByteRun};
use super::pool::ThreadPool;
use super::team::Team;
use super::{
    AttnBatch, Backend, BackendInfo, Buf, BufMut, ChannelScales, CopyKind, KvCachesMut, KvScales,
    KvWrite, PageCopyBatch,
};
use crate::error::{Error, Result};
use kernel::{KvElem, RowScales, Rows, SeqKv};

pub mod huge_pages;
pub(crate) mod isa;
mod kernel;
mod plan;
#[cfg(test)]
mod quant_tests;
mod quantize;

/// The CPU backend.
pub struct CpuBackend {
    workers: Workers,
    isa: Isa,
    /// Whether `isa` came from `KVSHARE_CPU_ISA`.
    forced: bool,
    /// Query tokens from which a sequence runs the tiled (prefill) kernel.
    tiled_min: usize,
}

impl CpuBackend {
    /// A backend whose pool runs on `num_threads` threads (0: the machine's parallelism), on
    /// the best kernel path this CPU has, or the one `KVSHARE_CPU_ISA` forces (an error, not a
    /// fallback, when that path cannot run here; see [`Isa::from_env`]).
    pub fn new(num_threads: usize) -> Result<Self> {
        let forced = std::env::var_os(ISA_ENV).is_some_and(|v| !v.is_empty());
        let isa = Isa::from_env()?;
        let mut b = Self::with_isa(num_threads, isa)?;
        b.forced = forced;
        Ok(b)
    }

    /// As [`CpuBackend::new`] on the given path (the environment is not read); an error when
    /// this machine cannot run it.
    pub fn with_isa(num_threads: usize, isa: Isa) -> Result<Self> {
        isa.check()
            .map_err(|why| Error::BackendUnavailable(format!("CPU path {}: {why}", isa.name())))?;
        let pool = ThreadPool::new(num_threads)
            .map_err(|e| Error::BackendFailure(format!("cannot start CPU worker threads: {e}")))?;
        Ok(CpuBackend {
            workers: Workers::Pool(pool),
            isa,
            forced: false,
            tiled_min: plan::TILED_MIN_TOKENS,
        })
    }

    /// As [`CpuBackend::new`], its work run on the host's `team` instead of a pool of its own
    /// (no thread is started).
    pub fn on_team(team: Team) -> Result<Self> {
        let mut b = Self::new(1)?; // a pool of one thread is the caller alone: nothing starts
        b.workers = Workers::Team(team);
        Ok(b)
    }

    /// Whether prefill rows (sequences with at least 8 query tokens) run the tiled kernel (the
    /// default) or, when `false`, the decode kernel like every other row; the benchmark's
    /// same-run baseline.
    pub fn set_tiled_prefill(&mut self, on: bool) {
        self.tiled_min = if on {
            plan::TILED_MIN_TOKENS
        } else {
            usize::MAX
        };
    }

    /// Threads that run work.
    pub fn num_threads(&self) -> usize {
        self.workers.num_threads()
    }

    /// The kernel path that runs.
    pub fn isa(&self) -> Isa {
        self.isa
    }
}

/// Where a launch's work items run: kvshare's own pool, or the host's team.
enum Workers {
    Pool(ThreadPool),
    Team(Team),
}

impl Workers {
    fn num_threads(&self) -> usize {
        match self {
            Workers::Pool(p) => p.num_threads(),
            Workers::Team(t) => t.num_threads(),
        }
    }

    /// Runs `f(i)` for every `i in 0..n` and returns when all are done (a panic in `f` is
    /// re-raised here).
    fn for_each<F: Fn(usize) + Sync>(&self, n: usize, f: F) {
        match self {
            Workers::Pool(p) => p.for_each(n, f),
            Workers::Team(t) => t.for_each(n, f),
        }
    }
}

/// Output memory shared by the work items. Each `(token, head)` row is written by exactly one
/// item, and validation proved rows do not overlap.
struct OutRows {
    ptr: OutPtr,
    len: usize,
}

#[derive(Clone, Copy)]
enum OutPtr {
    F32(*mut f32),
    F16(*mut f16),
    BF16(*mut bf16),
}

// SAFETY: items write disjoint rows (see above); the pointer outlives the workers' call.
unsafe impl Sync for OutRows {}

impl OutRows {
    /// `None` for a quantized output (validation refuses one).
    fn new(out: BufMut<'_>) -> Option<Self> {
        Some(match out {
            BufMut::F32(s) => OutRows {
                len: s.len(),
                ptr: OutPtr::F32(s.as_mut_ptr()),
            },
            BufMut::F16(s) => OutRows {
                len: s.len(),
                ptr: OutPtr::F16(s.as_mut_ptr()),
            },
            BufMut::BF16(s) => OutRows {
                len: s.len(),
                ptr: OutPtr::BF16(s.as_mut_ptr()),
            },
            BufMut::Fp8E4M3(_) | BufMut::Fp8E5M2(_) | BufMut::I8(_) | BufMut::I8Rows(_) => {
                return None
            }
        })
    }

    /// Writes `src` at element offset `off`.
    ///
    /// # Safety
    /// No other thread reads or writes `off..off + src.len()` concurrently.
    unsafe fn write(&self, off: usize, src: &[f32]) {
        assert!(off + src.len() <= self.len, "output row out of bounds");
        // SAFETY: the assert keeps `off..off + src.len()` inside the `len` elements the pointer
        // was taken from (a `&mut` slice that outlives the work items, `OutRows::new`), and the
        // caller guarantees no other thread touches that range, so the slice made is unaliased.
        unsafe {
            match self.ptr {
                OutPtr::F32(p) => {
                    std::slice::from_raw_parts_mut(p.add(off), src.len()).copy_from_slice(src)
                }
                OutPtr::F16(p) => {
                    let dst = std::slice::from_raw_parts_mut(p.add(off), src.len());
                    half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src)
                }
                OutPtr::BF16(p) => {
                    let dst = std::slice::from_raw_parts_mut(p.add(off), src.len());
                    half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src)
                }
            }
        }
    }
}

/// An item's query rows, in kernel order (kv head, then query token, then the head's query
/// heads, so rows sharing a kv head are adjacent), restricted to the item's key range; and
/// the item's output accumulators.
#[derive(Default)]
struct ItemRows {
    q: Vec<f32>,
    lo: Vec<usize>,
    hi: Vec<usize>,
    kv_head: Vec<usize>,
    acc: Vec<f32>,
    /// The query rows as given, before the scale, when the query is bf16 and the backend's
    /// vector path can multiply bf16 pairs (`kernel/bf16dot.rs`); else empty.
    q_bf16: Vec<bf16>,
}

thread_local! {
    /// Each thread's [`ItemRows`], reused by every item it runs, in this launch and later ones
    /// (they keep the largest item's size: rows x head_dim floats, twice). Allocated per item,
    /// they were freed between items and glibc handed the memory back to the kernel each time
    /// (its trim threshold is 128 KiB; a 192-row prefill unit holds 2 x 96 KiB at d = 128), so
    /// every item page-faulted it in again: 7-12% of a prefill launch (measured on Zen 4 by
    /// raising glibc's thresholds; keeping these buffers won back 4-9% of it, the rest being
    /// smaller per-item allocations).
    static ITEM_ROWS: std::cell::RefCell<ItemRows> = std::cell::RefCell::new(ItemRows::default());
}

/// Fills `r` with item `it`'s rows (`acc` sized; its contents are the kernel's to set), each
/// query multiplied by the launch's scale with the K cache's scales folded in ([`Fold::query`]);
/// the bf16 query rows too when `pairs` (the kernels can use them).
fn item_rows(batch: &AttnBatch<'_>, it: &Item, r: &mut ItemRows, pairs: bool, fold: &Fold<'_>) {
    let p = batch.params();
    let (g, d) = (p.group(), p.cache.head_dim);
    let seq = &batch.seqs()[it.seq];
    let rows = it.hn * it.qn * g;
    for v in [&mut r.q, &mut r.acc] {
        v.clear();
        v.resize(rows * d, 0.0);
    }
    for v in [&mut r.lo, &mut r.hi, &mut r.kv_head] {
        v.clear();
        v.resize(rows, 0);
    }
    let raw = match &batch.bufs.query {
        Buf::BF16(s) if pairs => Some(*s),
        _ => None,
    };
    r.q_bf16.clear();
    if raw.is_some() {
        r.q_bf16.resize(rows * d, bf16::ZERO);
    }
    for kh in it.h0..it.h0 + it.hn {
        for qi in 0..it.qn {
            let tok = seq.q_start + it.q0 + qi;
            let (lo, hi) = plan::row_range(seq, it.q0 + qi, p.sliding_window);
            // Clamped into the item's range; a row that sees none of it gets an empty range.
            let (lo, hi) = (lo.clamp(it.k0, it.k1), hi.clamp(it.k0, it.k1));
            for gi in 0..g {
                let row = ((kh - it.h0) * it.qn + qi) * g + gi;
                let q = &mut r.q[row * d..(row + 1) * d];
                let off = tok * p.query_strides.token + (kh * g + gi) * p.query_strides.head;
                batch.bufs.query.read_f32(off, q);
                fold.query(kh, q);
                if let Some(s) = raw {
                    r.q_bf16[row * d..(row + 1) * d].copy_from_slice(&s[off..off + d]);
                }
                r.kv_head[row] = kh;
                r.lo[row] = lo;
                r.hi[row] = hi;
            }
        }
    }
}

/// The cache's scales folded out of the kernel. A K element of kv head `kh`, channel `i` is
/// `UNIT * k_scale * k_channel[kh][i]` times what the kernel reads (`KvElem::UNIT`; the channel
/// scale 1 without per-channel scales), so `q·k` is the kernel's product with the query's
/// channel `i` multiplied by `scale * UNIT * k_scale * k_channel[kh][i]` ([`Fold::query`]). A V
/// element likewise, and output channel `i` is linear in V's channel `i`, so it is multiplied
/// by `UNIT * v_scale * v_channel[kh][i]` as it is written ([`Fold::output`]). The kernel itself
/// never sees a scale, and no element is multiplied by one.
///
/// Channel offsets (int8, a code `c` standing for `c + offset`): a K offset adds
/// `sum_i q_i k_scale_i k_offset_i` to every score of a query row, the same for every position,
/// which the softmax cancels, so the kernels never see it (a soft cap, which would not cancel
/// it, is refused with offsets). A V offset adds `v_offset[kh][i]` to output channel `i` before
/// its scales, since the softmax weights sum to 1: it is added to the unnormalised state as
/// `v_offset * l` ([`Fold::value_offsets`]), so that partial states still merge exactly and a
/// row that sees no position stays 0.
#[derive(Clone, Copy)]
struct Fold<'a> {
    q: f32,
    out: f32,
    channels: Option<ChannelScales<'a>>,
}

impl<'a> Fold<'a> {
    fn of<T: KvElem>(scale: f32, s: KvScales, channels: Option<ChannelScales<'a>>) -> Self {
        Fold {
            q: scale * T::UNIT * s.k,
            out: T::UNIT * s.v,
            channels,
        }
    }

    /// Multiplies a query row of kv head `kh` by its K scales.
    fn query(&self, kh: usize, q: &mut [f32]) {
        match self.channels {
            None => q.iter_mut().for_each(|x| *x *= self.q),
            Some(c) => {
                let d = q.len();
                q.iter_mut()
                    .zip(&c.k[kh * d..])
                    .for_each(|(x, s)| *x *= self.q * s)
            }
        }
    }

    /// Adds the V channel offsets to unnormalised rows `acc` (`d` floats each) with softmax sums
    /// `l` and kv heads `kv_head`.
    fn value_offsets(&self, kv_head: &[usize], l: &[f32], acc: &mut [f32]) {
        let Some(off) = self.channels.and_then(|c| c.v_offsets) else {
            return;
        };
        let d = acc.len() / l.len().max(1);
        for (row, (&kh, &lr)) in kv_head.iter().zip(l).enumerate() {
            acc[row * d..(row + 1) * d]
                .iter_mut()
                .zip(&off[kh * d..(kh + 1) * d])
                .for_each(|(x, o)| *x += o * lr);
        }
    }

    /// Multiplies an output row of kv head `kh` by its V scales.
    fn output(&self, kh: usize, o: &mut [f32]) {
        match self.channels {
            None if self.out == 1.0 => {}
            None => o.iter_mut().for_each(|x| *x *= self.out),
            Some(c) => {
                let d = o.len();
                o.iter_mut()
                    .zip(&c.v[kh * d..])
                    .for_each(|(x, s)| *x *= self.out * s)
            }
        }
    }
}

/// Writes an item's `rows` output rows (`d` floats each, kernel order) to the output tensor,
/// each multiplied by its V scales ([`Fold::output`]).
fn write_rows(batch: &AttnBatch<'_>, it: &Item, acc: &mut [f32], out: &OutRows, fold: &Fold<'_>) {
    let p = batch.params();
    let (g, d) = (p.group(), p.cache.head_dim);
    let seq = &batch.seqs()[it.seq];
    for kh in it.h0..it.h0 + it.hn {
        for qi in 0..it.qn {
            let tok = seq.q_start + it.q0 + qi;
            for gi in 0..g {
                let row = ((kh - it.h0) * it.qn + qi) * g + gi;
                let h = kh * g + gi;
                fold.output(kh, &mut acc[row * d..(row + 1) * d]);
                // SAFETY: row (tok, h) belongs to this item (or split) only; the plan covers
                // every row once and validation proved output rows do not overlap.
                unsafe {
                    out.write(
                        tok * p.output_strides.token + h * p.output_strides.head,
                        &acc[row * d..(row + 1) * d],
                    )
                };
            }
        }
    }
}

/// The unnormalised state of one part of a split (see [`kernel::attend_partial`]).
struct Partial {
    acc: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

fn run_attention<T: KvElem>(
    be: &CpuBackend,
    batch: &AttnBatch<'_>,
    (k, v): (&[T], &[T]),
    row_scales: Option<RowScales<'_>>,
    out: &OutRows,
) {
    let p = batch.params();
    let d = p.cache.head_dim;
    let seqs = batch.seqs();
    let workers = &be.workers;
    let fold = Fold::of::<T>(p.scale, p.kv_scales, batch.bufs.channel_scales);
    let plan = plan::plan(
        seqs,
        p.group(),
        p.cache.num_kv_heads,
        p.cache.page_size,
        p.sliding_window,
        workers.num_threads(),
        be.tiled_min,
    );
    let partials: Vec<OnceLock<Partial>> = (0..plan.num_parts).map(|_| OnceLock::new()).collect();
    workers.for_each(plan.items.len(), |i| {
        let run = |r: &mut ItemRows| {
            let kv = (k, v, row_scales);
            run_item(be, batch, &plan.items[i], r, kv, out, &partials, &fold)
        };
        ITEM_ROWS.with_borrow_mut(run)
    });
    workers.for_each(plan.splits.len(), |i| {
        let split = &plan.splits[i];
        let parts: Vec<&Partial> = split
            .parts
            .clone()
            .map(|j| partials[j].get().expect("every part ran"))
            .collect();
        let n = parts[0].m.len();
        ITEM_ROWS.with_borrow_mut(|buf| {
            let acc = &mut buf.acc;
            acc.clear();
            acc.resize(n * d, 0.0);
            for r in 0..n {
                let rp: Vec<(&[f32], f32, f32)> = parts
                    .iter()
                    .map(|pt| (&pt.acc[r * d..(r + 1) * d], pt.m[r], pt.l[r]))
                    .collect();
                kernel::merge_partials(&rp, &mut acc[r * d..(r + 1) * d]);
            }
            write_rows(batch, &split.rows, acc, out, &fold);
        })
    });
}

/// Runs item `it` with the thread's buffers `r`: its unnormalised state into `partials` when
/// it is one part of a split, else its normalised rows into the output.
#[allow(clippy::too_many_arguments)]
fn run_item<T: KvElem>(
    be: &CpuBackend,
    batch: &AttnBatch<'_>,
    it: &Item,
    r: &mut ItemRows,
    (k, v, row_scales): (&[T], &[T], Option<RowScales<'_>>),
    out: &OutRows,
    partials: &[OnceLock<Partial>],
    fold: &Fold<'_>,
) {
    let p = batch.params();
    let d = p.cache.head_dim;
    let seq = batch.seqs()[it.seq];
    // The bf16 pair engines take one scale for the whole query: not per-channel ones.
    let pairs = be.isa.vector().bf16_pairs() && fold.channels.is_none();
    item_rows(batch, it, r, pairs, fold);
    let rows = Rows {
        q: &r.q,
        lo: &r.lo,
        hi: &r.hi,
        kv_head: &r.kv_head,
        q_bf16: (!r.q_bf16.is_empty()).then(|| (&r.q_bf16[..], fold.q)),
    };
    let pages = &batch.bufs.block_table[it.seq * p.block_table_stride..]
        [..seq.ctx_len.div_ceil(p.cache.page_size)];
    let kv = SeqKv {
        k,
        v,
        pages,
        layout: &p.cache,
        softcap: p.softcap,
        row_scales,
    };
    let n = r.lo.len();
    let (mut m, mut l) = (vec![0f32; n], vec![0f32; n]);
    if it.tiled {
        kernel::attend_partial_tiled(be.isa, &kv, &rows, &mut r.acc, &mut m, &mut l);
    } else {
        kernel::attend_partial(be.isa, &kv, &rows, &mut r.acc, &mut m, &mut l);
    }
    fold.value_offsets(&r.kv_head, &l, &mut r.acc);
    match it.part {
        None => {
            kernel::normalize(d, &l, &mut r.acc);
            write_rows(batch, it, &mut r.acc, out, fold);
        }
        Some(part) => {
            // Each part index belongs to exactly one item, so the cell is empty here. The
            // accumulators go with it until the merge; the thread's next item allocates anew.
            let acc = std::mem::take(&mut r.acc);
            let _ = partials[part].set(Partial { acc, m, l });
        }
    }
}

/// Writes `n = tmp.len()` new elements into the cache at `dof`: each divided by the cache's
/// `scale` (and its channel's, the `n` scales of `channel` for an int8 cache), less its
/// channel's offset (the `n` of `offset`, in codes), and rounded to the cache's type (to
/// nearest, ties to even; fp8 saturating, `fp8.rs`; int8 saturating to -128..=127, NaN stored
/// as 0: int8 has none; 8-bit codes in `isa`'s vector code, `quantize.rs`; an int8
/// per-token-head row divided by its own scale, [`row_scale`], stored after its codes), or
/// copied as they are when the types agree and the scale is 1.
fn write_elems(
    isa: Isa,
    src: &Buf<'_>,
    so: usize,
    dst: &mut BufMut<'_>,
    dof: usize,
    (scale, channel, offset): (f32, Option<&[f32]>, Option<&[f32]>),
    tmp: &mut [f32],
) {
    use half::slice::HalfFloatSliceExt;
    let n = tmp.len();
    let codes = quantize::Scaling {
        scale,
        channel,
        offset,
    };
    match (src, dst) {
        (Buf::F32(s), BufMut::F32(d)) if scale == 1.0 => {
            d[dof..dof + n].copy_from_slice(&s[so..so + n])
        }
        (Buf::F16(s), BufMut::F16(d)) if scale == 1.0 => {
            d[dof..dof + n].copy_from_slice(&s[so..so + n])
        }
        (Buf::BF16(s), BufMut::BF16(d)) if scale == 1.0 => {
            d[dof..dof + n].copy_from_slice(&s[so..so + n])
        }
        (src, dst) => {
            src.read_f32(so, tmp);
            match dst {
                BufMut::Fp8E4M3(d) => quantize::quantize(isa, &mut d[dof..dof + n], tmp, codes),
                BufMut::Fp8E5M2(d) => quantize::quantize(isa, &mut d[dof..dof + n], tmp, codes),
                BufMut::I8(d) => quantize::quantize(isa, &mut d[dof..dof + n], tmp, codes),
                BufMut::F32(d) => {
                    codes.apply(tmp);
                    d[dof..dof + n].copy_from_slice(tmp)
                }
                BufMut::F16(d) => {
                    codes.apply(tmp);
                    d[dof..dof + n].convert_from_f32_slice(tmp)
                }
                BufMut::BF16(d) => {
                    codes.apply(tmp);
                    d[dof..dof + n].convert_from_f32_slice(tmp)
                }
                BufMut::I8Rows(d) => {
                    // Channel scales and offsets are refused with this format: `apply` divides
                    // by the per-tensor scale only.
                    codes.apply(tmp);
                    let row = row_scale(isa, tmp);
                    let (c, sc) = d[dof..dof + n + 4].split_at_mut(n);
                    let by_row = quantize::Scaling {
                        scale: row,
                        channel: None,
                        offset: None,
                    };
                    quantize::quantize(isa, c, tmp, by_row);
                    for (c, b) in sc.iter_mut().zip(row.to_le_bytes()) {
                        *c = b as i8;
                    }
                }
            }
        }
    }
}

/// The scale of one `(token, kv head)` row `x` of an int8 per-token-head cache (the new values
/// divided by the per-tensor scale): `max(max|x| / 127, 1e-6)`, vLLM's `int8_per_token_head`
/// (infinities and NaN are left out of the maximum). The row's codes are `x / row_scale`
/// rounded as int8 codes are (nearest, ties to even, where vLLM rounds ties away from zero;
/// saturating; NaN to 0), stored before the scale's 4 little-endian bytes; a code `c` then stands
/// for `c * row_scale * scale`.
fn row_scale(isa: Isa, x: &[f32]) -> f32 {
    (quantize::finite_amax(isa, x) / 127.0).max(1e-6)
}

impl BackendInfo for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn describe(&self) -> String {
        format!(
            "cpu: kernel path {} ({}){}{}, {} threads{}; CPU flags: {}",
            self.isa.name(),
            if self.forced {
                "forced by KVSHARE_CPU_ISA"
            } else {
                "best available"
            },
            if self.isa.bf16_pairs() {
                "; bf16 scores and decode values by bf16 pairs (vdpbf16ps; decode probabilities \
                 rounded to bf16)"
            } else if self.isa.vector().bf16_pairs() {
                // `amx`: its decode rows run on `avx512`, which has the pairs.
                "; bf16 decode scores and values by bf16 pairs (vdpbf16ps on avx512; \
                 probabilities rounded to bf16)"
            } else {
                ""
            },
            match self.isa {
                Isa::Amx if self.isa.amx_fp16() => format!(
                    "; bf16 prefill on AMX tiles (tdpbf16ps), f16 by tdpfp16ps, f32 on {}",
                    self.isa.vector().name()
                ),
                Isa::Amx => format!(
                    "; bf16 prefill on AMX tiles (tdpbf16ps), f16 and f32 on {}",
                    self.isa.vector().name()
                ),
                _ => String::new(),
            },
            self.workers.num_threads(),
            match self.workers {
                Workers::Pool(_) => " (its own pool)",
                Workers::Team(_) => " (the host's team, kvs_backend_new_cpu_team)",
            },
            cpu_flags()
        )
    }
}

impl Backend for CpuBackend {
    fn attention(&self, mut batch: AttnBatch<'_>) -> Result<()> {
        let out = OutRows::new(std::mem::replace(
            &mut batch.bufs.output,
            BufMut::F32(&mut []),
        ))
        .ok_or_else(|| Error::BackendFailure("the output is a KV-cache format".into()))?;
        match (batch.bufs.key_cache, batch.bufs.value_cache) {
            (Buf::F32(k), Buf::F32(v)) => run_attention(self, &batch, (k, v), None, &out),
            (Buf::F16(k), Buf::F16(v)) => run_attention(self, &batch, (k, v), None, &out),
            (Buf::BF16(k), Buf::BF16(v)) => run_attention(self, &batch, (k, v), None, &out),
            (Buf::Fp8E4M3(k), Buf::Fp8E4M3(v)) => run_attention(self, &batch, (k, v), None, &out),
            (Buf::Fp8E5M2(k), Buf::Fp8E5M2(v)) => run_attention(self, &batch, (k, v), None, &out),
            (Buf::I8(k), Buf::I8(v)) => run_attention(self, &batch, (k, v), None, &out),
            (Buf::I8Rows(k), Buf::I8Rows(v)) => {
                // The kernels read the codes as int8 elements and each row's scale after them.
                let rs = Some(RowScales { k, v });
                run_attention(self, &batch, (k, v), rs, &out)
            }
            _ => {
                return Err(Error::BackendFailure(
                    "K and V caches differ in dtype".into(),
                ))
            }
        }
        Ok(())
    }

    fn kv_write(&self, mut w: KvWrite<'_>) -> Result<()> {
        let p = w.params;
        let lay = p.cache;
        let d = lay.head_dim;
        let mut tmp = vec![0f32; d];
        for t in 0..p.num_tokens {
            let slot = w.slots.get(t);
            if slot < 0 {
                continue;
            }
            let (page, off) = (slot as usize / lay.page_size, slot as usize % lay.page_size);
            for h in 0..lay.num_kv_heads {
                let so = t * p.src_strides.token + h * p.src_strides.head;
                let dof = lay.offset(page, off, h);
                fn of_head(x: &[f32], h: usize, d: usize) -> &[f32] {
                    &x[h * d..(h + 1) * d]
                }
                let head = |x| of_head(x, h, d);
                let c = w.channel_scales;
                let k = (
                    p.scales.k,
                    c.map(|c| head(c.k)),
                    c.and_then(|c| c.k_offsets).map(head),
                );
                let v = (
                    p.scales.v,
                    c.map(|c| head(c.v)),
                    c.and_then(|c| c.v_offsets).map(head),
                );
                match &mut w.caches {
                    KvCachesMut::Split { key, value } => {
                        write_elems(self.isa, &w.key, so, key, dof, k, &mut tmp);
                        write_elems(self.isa, &w.value, so, value, dof, v, &mut tmp);
                    }
                    KvCachesMut::Shared { buf, key, value } => {
                        write_elems(self.isa, &w.key, so, buf, *key + dof, k, &mut tmp);
                        write_elems(self.isa, &w.value, so, buf, *value + dof, v, &mut tmp);
                    }
                }
            }
        }
        Ok(())
    }

    fn copy_pages(&self, b: PageCopyBatch<'_>) -> Result<()> {
        let lay = b.params.cache;
        let c = b.caches;
        for cp in b.copies {
            let (sp, dp, n) = (
                cp.src_page as usize,
                cp.dst_page as usize,
                cp.num_tokens as usize,
            );
            for (dev, host) in [
                (&mut *c.key_cache, &mut *c.host_key_cache),
                (&mut *c.value_cache, &mut *c.host_value_cache),
            ] {
                for ByteRun { src, dst, len } in page_copy_runs(&lay, sp, dp, n) {
                    match cp.kind {
                        CopyKind::DeviceToDevice => dev.copy_within(src..src + len, dst),
                        CopyKind::DeviceToHost => {
                            host[dst..dst + len].copy_from_slice(&dev[src..src + len])
                        }
                        CopyKind::HostToDevice => {
                            dev[dst..dst + len].copy_from_slice(&host[src..src + len])
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
