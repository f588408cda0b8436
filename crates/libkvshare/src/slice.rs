//! Checked conversions of C pointers into Rust references and slices.
//!
//! `(NULL, 0)` is an empty slice; `(NULL, n > 0)` is `KVS_STATUS_NULL_ARGUMENT`. Lengths whose
//! byte size overflows `isize` are `KVS_STATUS_INVALID_ARGUMENT`, never UB.

use crate::error::Error;

fn check_len<T>(len: usize, name: &'static str) -> Result<(), Error> {
    let size = std::mem::size_of::<T>().max(1);
    if len > isize::MAX as usize / size {
        return Err(Error::arg(name, format!("length {len} is too large")));
    }
    Ok(())
}

/// A shared slice from `(ptr, len)`.
///
/// # Safety
/// When non-NULL, `ptr` must point to `len` initialised `T`s that live and stay unchanged by
/// others for `'a` (the caller's contract, documented on each C function).
pub(crate) unsafe fn slice<'a, T>(
    ptr: *const T,
    len: usize,
    name: &'static str,
) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::NullArgument(name));
    }
    check_len::<T>(len, name)?;
    if !ptr.is_aligned() {
        return Err(Error::arg(name, "pointer is misaligned"));
    }
    // SAFETY: `ptr` is non-NULL and aligned (checked above), `len * size_of::<T>()` fits an
    // `isize` (`check_len`), and the caller guarantees `len` initialised `T`s for `'a`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A mutable slice from `(ptr, len)`.
///
/// # Safety
/// As [`slice`], and nobody else reads or writes the memory during `'a`.
pub(crate) unsafe fn slice_mut<'a, T>(
    ptr: *mut T,
    len: usize,
    name: &'static str,
) -> Result<&'a mut [T], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(Error::NullArgument(name));
    }
    check_len::<T>(len, name)?;
    if !ptr.is_aligned() {
        return Err(Error::arg(name, "pointer is misaligned"));
    }
    // SAFETY: as in `slice`, and the caller guarantees nobody else accesses them during `'a`.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// A shared reference from a pointer that must not be NULL.
///
/// # Safety
/// When non-NULL, `ptr` must point to a valid, initialised `T` for `'a`.
pub(crate) unsafe fn try_ref<'a, T>(ptr: *const T, name: &'static str) -> Result<&'a T, Error> {
    if ptr.is_null() {
        return Err(Error::NullArgument(name));
    }
    if !ptr.is_aligned() {
        return Err(Error::arg(name, "pointer is misaligned"));
    }
    // SAFETY: non-NULL and aligned (checked above); the caller guarantees a valid `T` for `'a`.
    Ok(unsafe { &*ptr })
}

/// An output location that must not be NULL; write it only after the work succeeded.
///
/// # Safety
/// When non-NULL, `ptr` must be valid for a write of `T` for `'a`.
pub(crate) unsafe fn try_out<'a, T>(ptr: *mut T, name: &'static str) -> Result<&'a mut T, Error> {
    if ptr.is_null() {
        return Err(Error::NullArgument(name));
    }
    if !ptr.is_aligned() {
        return Err(Error::arg(name, "pointer is misaligned"));
    }
    // SAFETY: non-NULL and aligned (checked above); the caller guarantees it is valid for a
    // write of `T` for `'a`.
    Ok(unsafe { &mut *ptr })
}

/// An optional output location: `None` for NULL.
///
/// # Safety
/// As [`try_out`] when non-NULL.
pub(crate) unsafe fn opt_out<'a, T>(
    ptr: *mut T,
    name: &'static str,
) -> Result<Option<&'a mut T>, Error> {
    if ptr.is_null() {
        Ok(None)
    } else {
        // SAFETY: `ptr` is non-NULL, and the caller gives `try_out`'s contract for it.
        unsafe { try_out(ptr, name) }.map(Some)
    }
}
