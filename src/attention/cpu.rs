//! The CPU backend: synchronous, host memory, f32/f16/bf16 with f32 accumulation.
//!
//! Attention runs on a persistent [`ThreadPool`] over work items `(sequence, block of query
//! tokens, kv heads)`: all kv heads of a sequence in one item (so its K/V streams from memory)
//! unless the batch is too small to keep the threads busy, then the heads are split. The query
//! heads of one kv head (GQA/MQA) share each K/V read. See [`super::kernel`] for the inner loop.

use half::{bf16, f16};

use super::kernel::{self, KvElem, Rows, SeqKv, MAX_GROUP};
use super::pool::ThreadPool;
use super::{AttnBatch, Backend, Buf, BufMut, CopyKind, KvWrite, PageCopyBatch};
use crate::core::{Error, Result};

/// The CPU backend.
pub struct CpuBackend {
    pool: ThreadPool,
}

impl CpuBackend {
    /// A backend whose pool runs on `num_threads` threads (0: the machine's parallelism).
    pub fn new(num_threads: usize) -> Result<Self> {
        let pool = ThreadPool::new(num_threads)
            .map_err(|e| Error::BackendFailure(format!("cannot start CPU worker threads: {e}")))?;
        Ok(CpuBackend { pool })
    }

    /// Threads that run work.
    pub fn num_threads(&self) -> usize {
        self.pool.num_threads()
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

// SAFETY: items write disjoint rows (see above); the pointer outlives the pool call.
unsafe impl Sync for OutRows {}

impl OutRows {
    fn new(out: BufMut<'_>) -> Self {
        match out {
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
        }
    }

    /// Writes `src` at element offset `off`.
    ///
    /// # Safety
    /// No other thread reads or writes `off..off + src.len()` concurrently.
    unsafe fn write(&self, off: usize, src: &[f32]) {
        assert!(off + src.len() <= self.len, "output row out of bounds");
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

/// One unit of parallel work: some query tokens of one sequence against a range of its kv
/// heads (all of them unless the batch is too small to keep every thread busy).
#[derive(Clone, Copy)]
struct Item {
    seq: usize,
    /// First query token of the item, relative to the sequence.
    q0: usize,
    /// Query tokens of the item.
    qn: usize,
    /// First kv head.
    h0: usize,
    /// Kv heads.
    hn: usize,
}

fn run_attention<T: KvElem>(
    pool: &ThreadPool,
    batch: &AttnBatch<'_>,
    k: &[T],
    v: &[T],
    out: &OutRows,
) {
    let p = batch.params();
    let g = p.group();
    let d = p.cache.head_dim;
    let hk = p.cache.num_kv_heads;
    // Query tokens per item: enough for 8 rows of one kv head (one register group).
    let qb = MAX_GROUP.div_ceil(g).max(1);
    let blocks: usize = batch.seqs().iter().map(|s| s.q_len.div_ceil(qb)).sum();
    // Split the kv heads only when there are too few items for the threads.
    let want = 4 * pool.num_threads();
    let splits = want.div_ceil(blocks.max(1)).clamp(1, hk);
    let hn = hk.div_ceil(splits);
    let mut items = Vec::new();
    for (s, seq) in batch.seqs().iter().enumerate() {
        for q0 in (0..seq.q_len).step_by(qb) {
            for h0 in (0..hk).step_by(hn) {
                items.push(Item {
                    seq: s,
                    q0,
                    qn: qb.min(seq.q_len - q0),
                    h0,
                    hn: hn.min(hk - h0),
                });
            }
        }
    }
    // Longest items first (prefill rows late in a long sequence see the most keys).
    let seqs = batch.seqs();
    items.sort_by_key(|it| std::cmp::Reverse(seqs[it.seq].ctx_len - seqs[it.seq].q_len + it.q0));
    let query = batch.bufs.query;
    pool.for_each(items.len(), |i| {
        let it = items[i];
        let seq = seqs[it.seq];
        let rows = it.hn * it.qn * g;
        let mut q = vec![0f32; rows * d];
        let mut lo = vec![0usize; rows];
        let mut hi = vec![0usize; rows];
        let mut kv_head = vec![0usize; rows];
        // Row order: kv head, then query token, then the head's query heads, so that the rows
        // sharing a kv head are adjacent.
        let row_of = |kh: usize, qi: usize, gi: usize| ((kh - it.h0) * it.qn + qi) * g + gi;
        for kh in it.h0..it.h0 + it.hn {
            for qi in 0..it.qn {
                let tok = seq.q_start + it.q0 + qi;
                let pos = seq.ctx_len - seq.q_len + it.q0 + qi;
                for gi in 0..g {
                    let r = row_of(kh, qi, gi);
                    let row = &mut q[r * d..(r + 1) * d];
                    let h = kh * g + gi;
                    query.read_f32(tok * p.query_strides.token + h * p.query_strides.head, row);
                    row.iter_mut().for_each(|x| *x *= p.scale);
                    kv_head[r] = kh;
                    hi[r] = pos + 1;
                    lo[r] = if p.sliding_window > 0 {
                        (pos + 1).saturating_sub(p.sliding_window)
                    } else {
                        0
                    };
                }
            }
        }
        let pages = &batch.bufs.block_table[it.seq * p.block_table_stride..]
            [..seq.ctx_len.div_ceil(p.cache.page_size)];
        let kv = SeqKv {
            k,
            v,
            pages,
            layout: &p.cache,
            softcap: p.softcap,
        };
        let mut acc = vec![0f32; rows * d];
        kernel::attend(
            &kv,
            &Rows {
                q: &q,
                lo: &lo,
                hi: &hi,
                kv_head: &kv_head,
            },
            &mut acc,
        );
        for kh in it.h0..it.h0 + it.hn {
            for qi in 0..it.qn {
                let tok = seq.q_start + it.q0 + qi;
                for gi in 0..g {
                    let r = row_of(kh, qi, gi);
                    let h = kh * g + gi;
                    // SAFETY: row (tok, h) belongs to this item only; rows do not overlap.
                    unsafe {
                        out.write(
                            tok * p.output_strides.token + h * p.output_strides.head,
                            &acc[r * d..(r + 1) * d],
                        )
                    };
                }
            }
        }
    });
}

/// Copies `n` elements, converting through f32 when the dtypes differ.
fn copy_elems(src: &Buf<'_>, so: usize, dst: &mut BufMut<'_>, dof: usize, tmp: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let n = tmp.len();
    match (src, dst) {
        (Buf::F32(s), BufMut::F32(d)) => d[dof..dof + n].copy_from_slice(&s[so..so + n]),
        (Buf::F16(s), BufMut::F16(d)) => d[dof..dof + n].copy_from_slice(&s[so..so + n]),
        (Buf::BF16(s), BufMut::BF16(d)) => d[dof..dof + n].copy_from_slice(&s[so..so + n]),
        (src, dst) => {
            src.read_f32(so, tmp);
            match dst {
                BufMut::F32(d) => d[dof..dof + n].copy_from_slice(tmp),
                BufMut::F16(d) => d[dof..dof + n].convert_from_f32_slice(tmp),
                BufMut::BF16(d) => d[dof..dof + n].convert_from_f32_slice(tmp),
            }
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn attention(&self, mut batch: AttnBatch<'_>) -> Result<()> {
        let out = OutRows::new(std::mem::replace(
            &mut batch.bufs.output,
            BufMut::F32(&mut []),
        ));
        match (batch.bufs.key_cache, batch.bufs.value_cache) {
            (Buf::F32(k), Buf::F32(v)) => run_attention(&self.pool, &batch, k, v, &out),
            (Buf::F16(k), Buf::F16(v)) => run_attention(&self.pool, &batch, k, v, &out),
            (Buf::BF16(k), Buf::BF16(v)) => run_attention(&self.pool, &batch, k, v, &out),
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
                copy_elems(&w.key, so, &mut w.key_cache, dof, &mut tmp);
                copy_elems(&w.value, so, &mut w.value_cache, dof, &mut tmp);
            }
        }
        Ok(())
    }

    fn copy_pages(&self, b: PageCopyBatch<'_>) -> Result<()> {
        let lay = b.params.cache;
        let esz = lay.dtype.size_bytes();
        let row = lay.head_dim * esz;
        // Slots [0, n) of a page are one contiguous run when heads and slots are dense.
        let dense =
            lay.head_stride == lay.head_dim && lay.slot_stride == lay.num_kv_heads * lay.head_dim;
        let c = b.caches;
        for cp in b.copies {
            let n = cp.num_tokens as usize;
            let (sp, dp) = (cp.src_page as usize, cp.dst_page as usize);
            for (dev, host) in [
                (&mut *c.key_cache, &mut *c.host_key_cache),
                (&mut *c.value_cache, &mut *c.host_value_cache),
            ] {
                let runs: Vec<(usize, usize, usize)> = if dense {
                    vec![(
                        lay.offset(sp, 0, 0) * esz,
                        lay.offset(dp, 0, 0) * esz,
                        n * lay.slot_stride * esz,
                    )]
                } else {
                    (0..n)
                        .flat_map(|s| (0..lay.num_kv_heads).map(move |h| (s, h)))
                        .map(|(s, h)| (lay.offset(sp, s, h) * esz, lay.offset(dp, s, h) * esz, row))
                        .collect()
                };
                for (so, dof, len) in runs {
                    match cp.kind {
                        CopyKind::DeviceToDevice => dev.copy_within(so..so + len, dof),
                        CopyKind::DeviceToHost => {
                            host[dof..dof + len].copy_from_slice(&dev[so..so + len])
                        }
                        CopyKind::HostToDevice => {
                            dev[dof..dof + len].copy_from_slice(&host[so..so + len])
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
