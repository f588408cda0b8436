//! Splitting a page copy into contiguous byte runs: the one place that knows which token slots
//! and heads of a page lie next to each other for a [`CacheLayout`].
//!
//! Every backend copies a page (or the first `n` token slots of one) the same way: it asks
//! [`page_copy_runs`] for the runs and moves each run with its own primitive — the CPU backend
//! with `copy_from_slice`/`copy_within` on host bytes, the Ascend backend with one
//! `aclrtMemcpyAsync` per run. Fewer, longer runs are cheaper for both (one memcpy call, one
//! device command), so the split takes the longest runs the strides allow:
//!
//! * **slots dense** (`head_stride == head_dim`, `slot_stride == num_kv_heads * head_dim`, the
//!   vLLM/MindIE "BnBsH" layout): slots `[0, n)` of a page are one run;
//! * **heads major** (`slot_stride == head_dim`, CANN's "BnNBsD" layout): slots `[0, n)` of one
//!   head are one run, so one run per kv head;
//! * **anything else** the shared checks accept: one run per `(slot, head)` row of `head_dim`
//!   elements, slot-major.
//!
//! The runs are an iterator (no allocation per copy) over plain offsets; this module touches no
//! memory. Costs: O(1) per run, at most `n * num_kv_heads` runs.

use super::params::CacheLayout;

/// One contiguous run of a page copy: `len` bytes from byte offset `src` of the source cache to
/// byte offset `dst` of the destination cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRun {
    /// Byte offset in the source cache buffer.
    pub src: usize,
    /// Byte offset in the destination cache buffer.
    pub dst: usize,
    /// Bytes to copy.
    pub len: usize,
}

/// How a layout's slots and heads group into runs (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    /// One run of all `n` slots.
    SlotsDense,
    /// One run per kv head (`n` slots of that head).
    HeadsMajor,
    /// One run per `(slot, head)` row, slot-major.
    Rows,
}

/// The byte runs of one page copy, in increasing source offset within each head (built by
/// [`page_copy_runs`]).
#[derive(Debug, Clone)]
pub struct ByteRuns {
    layout: CacheLayout,
    split: Split,
    src_page: usize,
    dst_page: usize,
    num_tokens: usize,
    elem_bytes: usize,
    next: usize,
    count: usize,
}

/// The byte runs that copy token slots `[0, num_tokens)` of page `src_page` into the same slots of
/// page `dst_page`, every kv head, all `head_dim` elements (and each row's scale, for an int8
/// per-token-head cache: [`CacheLayout::row_len`]); offsets and lengths in bytes
/// (elements times `layout.dtype`'s size). Source and destination caches have the same per-page
/// layout (a host tier differs only in its page count), so one `layout` serves both.
///
/// * Whole page: `num_tokens = layout.page_size`.
/// * Partial page (a prefix hit that ends inside a page, a page still being filled):
///   `num_tokens = n` with `n < page_size` copies exactly slots `0..n`, nothing past them.
/// * `num_tokens = 0` yields no run.
///
/// Call it with numbers already checked ([`CacheLayout::validate`] and
/// [`CopyParams::check_copies`](super::CopyParams::check_copies): pages below their tier's page
/// count, `num_tokens <= page_size`); every offset then lies inside the validated buffer spans
/// and nothing overflows. It only computes offsets; the caller moves the bytes.
pub fn page_copy_runs(
    layout: &CacheLayout,
    src_page: usize,
    dst_page: usize,
    num_tokens: usize,
) -> ByteRuns {
    debug_assert!(num_tokens <= layout.page_size);
    let l = layout;
    // A row is `head_dim` elements and, for an int8 per-token-head cache, its scale after them
    // (`row_len`): the scale moves with its row.
    let row = l.row_len();
    let split = if l.head_stride == row && l.slot_stride == l.num_kv_heads * row {
        Split::SlotsDense
    } else if l.slot_stride == row {
        Split::HeadsMajor
    } else {
        Split::Rows
    };
    let count = match (num_tokens, split) {
        (0, _) => 0,
        (_, Split::SlotsDense) => 1,
        (_, Split::HeadsMajor) => l.num_kv_heads,
        (n, Split::Rows) => n * l.num_kv_heads,
    };
    ByteRuns {
        layout: *layout,
        split,
        src_page,
        dst_page,
        num_tokens,
        elem_bytes: layout.dtype.size_bytes(),
        next: 0,
        count,
    }
}

impl Iterator for ByteRuns {
    type Item = ByteRun;

    fn next(&mut self) -> Option<ByteRun> {
        if self.next == self.count {
            return None;
        }
        let i = self.next;
        self.next += 1;
        let l = &self.layout;
        let (slot, head, elems) = match self.split {
            Split::SlotsDense => (0, 0, self.num_tokens * l.slot_stride),
            Split::HeadsMajor => (0, i, self.num_tokens * l.row_len()),
            Split::Rows => (i / l.num_kv_heads, i % l.num_kv_heads, l.row_len()),
        };
        Some(ByteRun {
            src: l.offset(self.src_page, slot, head) * self.elem_bytes,
            dst: l.offset(self.dst_page, slot, head) * self.elem_bytes,
            len: elems * self.elem_bytes,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.count - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for ByteRuns {}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshare_core::DType;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The model: every byte of slots `[0, n)` of the source page, every head, every element,
    /// mapped to its byte in the destination page, element by element.
    fn model(l: &CacheLayout, sp: usize, dp: usize, n: usize) -> BTreeMap<usize, usize> {
        let esz = l.dtype.size_bytes();
        let mut m = BTreeMap::new();
        for s in 0..n {
            for h in 0..l.num_kv_heads {
                for e in 0..l.row_len() * esz {
                    m.insert(l.offset(sp, s, h) * esz + e, l.offset(dp, s, h) * esz + e);
                }
            }
        }
        m
    }

    /// A layout from a permutation of the three outer dimensions plus padding after each, so
    /// dense, heads-major and strided-with-gaps layouts all occur.
    fn layout(
        dtype: DType,
        page_size: usize,
        heads: usize,
        head_dim: usize,
        order: usize,
        pad: [usize; 3],
    ) -> CacheLayout {
        // Innermost-first order of (slot, head) below the page dimension.
        let heads_inner = order == 0;
        let row = head_dim + dtype.row_scale_bytes();
        let (head_stride, slot_stride) = if heads_inner {
            let hs = row + pad[0];
            (hs, heads * hs + pad[1])
        } else {
            let ss = row + pad[0];
            (page_size * ss + pad[1], ss)
        };
        let page_stride = if heads_inner {
            page_size * slot_stride + pad[2]
        } else {
            heads * head_stride + pad[2]
        };
        CacheLayout {
            dtype,
            num_pages: 4,
            page_size,
            num_kv_heads: heads,
            head_dim,
            page_stride,
            slot_stride,
            head_stride,
        }
    }

    proptest! {
        /// The runs cover exactly the model's bytes, each source byte landing on its model
        /// destination, no byte twice, and the run count is the fewest the split promises.
        #[test]
        fn runs_move_exactly_the_first_n_slots(
            dtype in prop_oneof![
                Just(DType::F32),
                Just(DType::F16),
                Just(DType::BF16),
                Just(DType::Int8PerTokenHead),
            ],
            page_size in 1usize..9,
            heads in 1usize..5,
            head_dim in 1usize..6,
            order in 0usize..2,
            pad in proptest::array::uniform3(prop_oneof![Just(0usize), 1usize..3]),
            sp in 0usize..4,
            dp in 0usize..4,
            n_frac in 0usize..=100,
        ) {
            let l = layout(dtype, page_size, heads, head_dim, order, pad);
            prop_assert!(l.validate().is_ok(), "{l:?}");
            let n = page_size * n_frac / 100;
            let want = model(&l, sp, dp, n);
            let mut got = BTreeMap::new();
            let runs: Vec<ByteRun> = page_copy_runs(&l, sp, dp, n).collect();
            prop_assert_eq!(runs.len(), page_copy_runs(&l, sp, dp, n).len());
            for r in &runs {
                prop_assert!(r.len > 0);
                for e in 0..r.len {
                    prop_assert!(got.insert(r.src + e, r.dst + e).is_none(), "byte twice");
                }
            }
            prop_assert_eq!(&got, &want);
            let row = l.row_len();
            let dense = l.head_stride == row && l.slot_stride == heads * row;
            if n > 0 && dense {
                prop_assert_eq!(runs.len(), 1);
            } else if n > 0 && l.slot_stride == row {
                prop_assert_eq!(runs.len(), heads);
            }
        }
    }

    #[test]
    fn whole_and_partial_pages_of_the_dense_layout() {
        let l = CacheLayout::dense(DType::F16, 8, 16, 2, 4);
        let whole: Vec<_> = page_copy_runs(&l, 1, 3, 16).collect();
        assert_eq!(
            whole,
            [ByteRun {
                src: 128 * 2,
                dst: 3 * 128 * 2,
                len: 128 * 2
            }]
        );
        let part: Vec<_> = page_copy_runs(&l, 1, 3, 5).collect();
        assert_eq!(part[0].len, 5 * 8 * 2);
        assert_eq!(page_copy_runs(&l, 1, 3, 0).count(), 0);
    }
}
