//! The benchmark's 16-bit buffers, allocated on a 2 MiB boundary (and on huge pages when asked).

use super::*;

/// 16-bit words on a 2 MiB boundary: the K and V caches, as an engine's cache allocation is
/// (torch aligns to 64 bytes, mmap to a page; a `Vec<u16>` of this size comes from glibc's mmap
/// at 16 bytes past a page, which puts every 256-byte head row across five cache lines: 2 x
/// 32768 bf16 ran 1.3-1.5x slower so), and the query and output, so that their f32 views
/// (`--dtype f32`) are aligned.
pub(super) struct Words {
    ptr: std::ptr::NonNull<u16>,
    len: usize,
    layout: std::alloc::Layout,
}

impl Words {
    /// `n` words from `rnd`, and the bytes of them on 2 MiB pages: with `huge`, the fresh
    /// allocation is advised (`back_with_huge_pages`, the Rust side of `kvs_cpu_huge_pages`)
    /// before it is written, as an engine allocating its cache would do.
    pub(super) fn new(
        n: usize,
        huge: bool,
        rnd: &mut impl FnMut() -> u16,
    ) -> Result<(Words, usize), String> {
        let layout = std::alloc::Layout::from_size_align(n.max(1) * 2, HUGE_PAGE)
            .map_err(|e| e.to_string())?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) }.cast::<u16>();
        let ptr = std::ptr::NonNull::new(raw).ok_or(format!("cannot allocate {} bytes", n * 2))?;
        let advise = || {
            back_with_huge_pages(ptr.as_ptr() as usize, n * 2, HugePages::Advise)
                .map(|r| r.huge_bytes)
                .map_err(|e| format!("--huge-pages on: {e}"))
        };
        let buf = Words {
            ptr,
            len: n,
            layout,
        };
        if huge {
            advise()?;
        }
        for i in 0..n {
            // SAFETY: `i < n` elements allocated above; written before any read.
            unsafe { ptr.as_ptr().add(i).write(rnd()) };
        }
        // Advising again changes nothing and measures what the written pages got.
        let huge_bytes = if huge { advise()? } else { 0 };
        Ok((buf, huge_bytes))
    }
}

impl std::ops::Deref for Words {
    type Target = [u16];
    fn deref(&self) -> &[u16] {
        // SAFETY: `len` elements, all written in `new`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u16] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), self.layout) };
    }
}
