//! Typed ownership of heap handles. Every `into_raw`/`from_raw` in the crate goes through here,
//! so a handle can only ever be turned back into the Rust type it was made from.

use crate::error::Error;

/// Ties an opaque C type to the Rust type it stands for. Implemented once per handle type.
pub(crate) trait Handle {
    /// The Rust object behind the C pointer.
    type Rust;
    /// Argument name used in errors ("cache", "backend").
    const NAME: &'static str;
}

/// Moves `value` to the heap and returns the opaque C pointer that owns it.
pub(crate) fn into_raw<C: Handle>(value: C::Rust) -> *mut C {
    Box::into_raw(Box::new(value)).cast()
}

/// Borrows the Rust object behind a handle.
///
/// # Safety
/// A non-NULL `ptr` must come from [`into_raw`] for the same `C` and not be freed yet.
pub(crate) unsafe fn borrow<'a, C: Handle>(ptr: *const C) -> Result<&'a C::Rust, Error> {
    if ptr.is_null() {
        return Err(Error::NullArgument(C::NAME));
    }
    // SAFETY: non-NULL, and the caller guarantees it came from `into_raw::<C>` (a `Box` of
    // `C::Rust`) and is not freed, so it points to a live `C::Rust`.
    Ok(unsafe { &*ptr.cast::<C::Rust>() })
}

/// Drops the object behind a handle; NULL is a no-op.
///
/// # Safety
/// A non-NULL `ptr` must come from [`into_raw`] for the same `C`, not be freed yet, and not be
/// in use by another thread.
pub(crate) unsafe fn free<C: Handle>(ptr: *mut C) {
    if !ptr.is_null() {
        // SAFETY: the caller guarantees `ptr` came from `into_raw::<C>` (a `Box` of `C::Rust`),
        // is not freed yet and no other thread uses it, so the box is ours to drop.
        drop(unsafe { Box::from_raw(ptr.cast::<C::Rust>()) });
    }
}
