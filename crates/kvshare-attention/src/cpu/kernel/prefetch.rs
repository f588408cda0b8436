//! Software prefetch for the decode kernel: the next K/V block, spread evenly over the
//! current block's work.
//!
//! The decode kernel reads each kv head's rows a slot stride apart (2 KiB for 8 heads x 128
//! f16), so a head's rows usually sit on different 4 KiB pages, where the hardware prefetchers
//! stop, and a core waits for DRAM at every row. While it computes block `b` (all kv heads of up
//! to 32 tokens), [`Ahead`] requests the cache lines of block `b + 1` (the rows of the heads
//! the item reads, K and V) a few at a time, in address order, at the rate the block consumes
//! them: the misses overlap the arithmetic, enough lines are in flight to cover the memory
//! latency, and never so many at once that the miss queues fill and stall the loads the
//! arithmetic waits for (a burst of whole rows per token did). A block (128 KiB of K and V
//! for 8 heads x 128 f16 x 32 tokens) is larger than L1, so these requests aim at L2 (`T1`).
//! Also requesting each V row into L1 just before use (`T0`) cost 7% on a KV in L3 and gained
//! nothing from DRAM (a single-thread A/B comparison), so it is not done.

/// Bytes per cache line.
const LINE: usize = 64;
/// The prefetch hint: a block is larger than L1, so its lines are asked for in L2 (`T1`; on
/// CPUs that treat all hints alike they land in L1 too).
#[cfg(target_arch = "x86_64")]
const FAR: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const FAR: i32 = 0;

/// Rows of the cache: `outer` groups `outer_stride` apart of `inner` rows `inner_stride` apart,
/// each `span` long (elements): a block's rows for a set of kv heads, token-major (the heads
/// of a token one span) or head-major (one head's tokens after another, as in a head-major
/// cache).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Rows {
    pub start: usize,
    pub outer: usize,
    pub outer_stride: usize,
    pub inner: usize,
    pub inner_stride: usize,
    pub span: usize,
}

impl Rows {
    /// The rows a block of `tokens` tokens starting at element `base` holds for kv heads
    /// `h0..h0 + heads`: one span per token when a token's heads do not reach the next token
    /// (token-major caches), else one row per head and token.
    pub(super) fn block(
        base: usize,
        tokens: usize,
        slot_stride: usize,
        h0: usize,
        heads: usize,
        head_stride: usize,
        d: usize,
    ) -> Self {
        let start = base + h0 * head_stride;
        let span = (heads.max(1) - 1) * head_stride + d;
        if span <= slot_stride {
            Rows {
                start,
                outer: tokens,
                outer_stride: slot_stride,
                inner: 1,
                inner_stride: 0,
                span,
            }
        } else {
            Rows {
                start,
                outer: heads,
                outer_stride: head_stride,
                inner: tokens,
                inner_stride: slot_stride,
                span: d,
            }
        }
    }
}

/// The cache lines of some rows of K and V (the same rows of each), requested a few at a time
/// in address order (row by row). The default requests nothing.
#[derive(Default)]
pub(super) struct Ahead {
    /// The next K and V lines to request (addresses; only ever prefetched, never read).
    kp: usize,
    vp: usize,
    /// Lines left in the current row.
    in_row: usize,
    /// When rows are evenly spaced a whole number of lines apart: lines per row, and the
    /// bytes from the line after a row's last to the next row's first. `None`: each row's
    /// lines are found from its address.
    even: Option<(usize, usize)>,
    /// Row 0's K and V addresses, the rows (in bytes), the current row, and the row count.
    k: usize,
    v: usize,
    rows: Rows,
    t: usize,
    count: usize,
    /// Line pairs (a K line and a V line) not requested yet (at most).
    left: usize,
}

impl Ahead {
    /// `rows` of `k` and of `v`; nothing when a row would leave either slice (a caller
    /// passing an odd layout loses the prefetch, never memory safety). Rows that follow each
    /// other without a gap are requested as one.
    pub(super) fn new<T>(k: &[T], v: &[T], rows: Rows) -> Self {
        let size = std::mem::size_of::<T>();
        let Rows {
            start,
            mut outer,
            mut outer_stride,
            mut inner,
            mut inner_stride,
            mut span,
        } = rows;
        let end = (|| {
            let last = (outer.checked_sub(1)?.checked_mul(outer_stride))?
                .checked_add(inner.checked_sub(1)?.checked_mul(inner_stride)?)?;
            start.checked_add(last)?.checked_add(span)
        })();
        match end {
            Some(end) if span > 0 && end <= k.len() && end <= v.len() => {
                // Merge rows that touch: inner rows into one, then outer ones.
                if inner_stride == span {
                    (span, inner, inner_stride) = (span * inner, 1, 0);
                }
                if inner == 1 && outer_stride == span {
                    (span, outer, outer_stride) = (span * outer, 1, 0);
                }
                if inner > 1 && outer == 1 {
                    (outer, outer_stride, inner, inner_stride) = (inner, inner_stride, 1, 0);
                }
                let (k, v) = (
                    k.as_ptr() as usize + start * size,
                    v.as_ptr() as usize + start * size,
                );
                let rows = Rows {
                    start: 0,
                    outer,
                    outer_stride: outer_stride * size,
                    inner,
                    inner_stride: inner_stride * size,
                    span: span * size,
                };
                // Rows evenly spaced a whole number of lines apart all start at the same place
                // in their line (a row not starting on a line ends one line further); others
                // get their lines counted row by row. `left` is the most there can be.
                let first = lines(k, v, rows.span);
                let even = if inner == 1 && rows.outer_stride.is_multiple_of(LINE) {
                    rows.outer_stride
                        .checked_sub(first * LINE)
                        .map(|gap| (first, gap))
                } else {
                    None
                };
                let count = outer * inner;
                Ahead {
                    kp: k & !(LINE - 1),
                    vp: v & !(LINE - 1),
                    in_row: first,
                    even,
                    k,
                    v,
                    rows,
                    t: 0,
                    count,
                    left: count
                        * if even.is_some() {
                            first
                        } else {
                            lines(LINE - 1, 0, rows.span)
                        },
                }
            }
            _ => Ahead::default(),
        }
    }

    /// Line pairs not requested yet (at most).
    pub(super) fn left(&self) -> usize {
        self.left
    }

    /// Requests up to `n` more line pairs (a K line and the V line at the same offset).
    #[inline(always)]
    pub(super) fn step(&mut self, n: usize) {
        self.step_with(n, |k, v| {
            prefetch::<FAR>(k);
            prefetch::<FAR>(v);
        });
    }

    /// [`Ahead::step`], handing each pair's addresses to `sink`.
    #[inline(always)]
    fn step_with(&mut self, n: usize, mut sink: impl FnMut(usize, usize)) {
        let mut n = n.min(self.left);
        self.left -= n;
        // The cursor in locals: a prefetch counts as a memory access to the compiler, so fields
        // of `self` updated around it were stored back on every line. Within a row the lines
        // are consecutive: one plain loop per run (unrolled by four in the avx2 build), the row
        // bookkeeping once per run rather than per line.
        let (mut kp, mut in_row) = (self.kp, self.in_row);
        let mut dv = self.vp.wrapping_sub(kp);
        while n > 0 {
            let m = n.min(in_row);
            for i in 0..m {
                let a = kp + i * LINE;
                sink(a, a.wrapping_add(dv));
            }
            (kp, in_row, n) = (kp + m * LINE, in_row - m, n - m);
            if in_row == 0 {
                self.t += 1;
                if self.t == self.count {
                    self.left = 0;
                    break;
                }
                (self.kp, self.vp) = (kp, kp.wrapping_add(dv));
                self.next_row_cold();
                (kp, in_row) = (self.kp, self.in_row);
                dv = self.vp.wrapping_sub(kp);
            }
        }
        (self.kp, self.vp, self.in_row) = (kp, kp.wrapping_add(dv), in_row);
    }

    /// [`Ahead::next_row`] out of line: it runs at most once per row (never when a block's rows
    /// merge into one run, as a dense token-major cache's do when an item reads every head;
    /// once per token or head row otherwise), and inlined, its state was loaded from the
    /// stack around every step.
    #[cold]
    #[inline(never)]
    fn next_row_cold(&mut self) {
        self.next_row()
    }

    /// Moves to the first line of row `t`.
    #[inline(always)]
    fn next_row(&mut self) {
        match self.even {
            Some((lines, gap)) => {
                self.kp += gap;
                self.vp += gap;
                self.in_row = lines;
            }
            None => {
                let r = &self.rows;
                let off = self.t / r.inner * r.outer_stride + self.t % r.inner * r.inner_stride;
                let (k, v) = (self.k + off, self.v + off);
                self.kp = k & !(LINE - 1);
                self.vp = v & !(LINE - 1);
                self.in_row = lines(k, v, r.span);
            }
        }
    }

    /// Requests the rest.
    pub(super) fn finish(&mut self) {
        self.step(usize::MAX);
    }
}

/// Lines a row of `bytes` starting at `k` (and at `v`) touches, the larger count.
#[inline(always)]
fn lines(k: usize, v: usize, bytes: usize) -> usize {
    ((k % LINE).max(v % LINE) + bytes).div_ceil(LINE)
}

/// Hints that the cache line at address `p` will be read soon. A prefetch never faults and
/// changes no memory, whatever the address; `Ahead` only passes lines of rows it checked.
#[inline(always)]
fn prefetch<const HINT: i32>(p: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults or writes, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<HINT>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The lines holding the bytes of `rows` rows of `span` elements (u16), `stride` apart
    /// from `start`, in the slice at `base`.
    fn lines_of(
        base: usize,
        start: usize,
        stride: usize,
        span: usize,
        rows: usize,
    ) -> BTreeSet<usize> {
        let mut want = BTreeSet::new();
        for t in 0..rows {
            let a = base + 2 * (start + t * stride);
            for byte in a..a + 2 * span {
                want.insert(byte & !(LINE - 1));
            }
        }
        want
    }

    proptest! {
        /// Every line of every row, of K and of V, is requested; at most one line per row more
        /// (K and V lines go in pairs at one offset, so the one starting later in its line
        /// sets where rows end); nothing once `left()` is 0; and rows outside either slice
        /// give no request at all.
        #[test]
        fn requests_exactly_the_rows_lines(
            skew_k in 0usize..32, skew_v in 0usize..32,
            start in 0usize..300, stride in 1usize..1200, span in 1usize..1200,
            rows in 0usize..40, chunk in 1usize..50, heads in 1usize..5, head_major: bool,
        ) {
            let len = 4 * (1200 * 40 + 7) + 2000;
            let kbuf = vec![0u16; len + 64];
            let vbuf = vec![0u16; len + 64];
            let (k, v) = (&kbuf[skew_k..skew_k + len], &vbuf[skew_v..skew_v + len]);
            let span = span.min(stride);
            // Token-major: `rows` rows of `span`; head-major: `heads` groups of them.
            let (outer, heads) = if head_major { (heads, heads) } else { (1, 1) };
            let set = Rows {
                start,
                outer,
                outer_stride: stride * rows + 7,
                inner: rows,
                inner_stride: stride,
                span,
            };
            let mut a = Ahead::new(k, v, set);
            let (mut got_k, mut got_v) = (Vec::new(), Vec::new());
            let mut calls = 0;
            while a.left() > 0 {
                a.step_with(chunk, |kl, vl| {
                    got_k.push(kl);
                    got_v.push(vl);
                });
                calls += 1;
                prop_assert!(calls <= 100_000);
            }
            a.step_with(5, |_, _| panic!("a request after left() reached 0"));
            let all = |base: usize| -> BTreeSet<usize> {
                (0..heads)
                    .flat_map(|h| lines_of(base, start + h * (stride * rows + 7), stride, span, rows))
                    .collect()
            };
            let (want_k, want_v) = (all(k.as_ptr() as usize), all(v.as_ptr() as usize));
            let (set_k, set_v): (BTreeSet<_>, BTreeSet<_>) =
                (got_k.iter().copied().collect(), got_v.iter().copied().collect());
            prop_assert!(want_k.is_subset(&set_k), "a K line was never requested");
            prop_assert!(want_v.is_subset(&set_v), "a V line was never requested");
            // One line per row more than the row's own at most.
            let own = |base: usize| -> usize {
                (0..heads * rows)
                    .map(|r| {
                        let at = start + r / rows * (stride * rows + 7) + r % rows * stride;
                        lines_of(base, at, stride, span, 1).len()
                    })
                    .sum()
            };
            prop_assert!(got_k.len() <= own(k.as_ptr() as usize) + heads * rows);
            prop_assert!(got_v.len() <= own(v.as_ptr() as usize) + heads * rows);
            prop_assert!(set_k.len() <= want_k.len() + heads * rows);
            // Outside the slices: nothing.
            let past = Rows { start: len - span + 1, outer: 1, inner: rows.max(1), ..set };
            let mut out = Ahead::new(k, v, past);
            prop_assert_eq!(out.left(), 0);
            out.step_with(usize::MAX, |_, _| panic!("a request outside the slices"));
        }
    }
}
