//! Fallible allocation for everything whose size a caller chooses (config fields, list lengths).
//!
//! `vec![x; n]` and `Vec::with_capacity(n)` abort the whole process when the allocator refuses
//! (`memory allocation of … bytes failed`); a library must report that as a status instead. These
//! helpers reserve with `try_reserve_exact` and name the field or argument in
//! [`Error::OutOfMemory`]. Unlike `vec![0; n]` (which may get lazily zeroed pages from `calloc`),
//! [`try_vec`] writes every element: the cost is paid once, at creation, for memory the structure
//! touches anyway when it fills up.

use super::error::{Error, Result};

fn oom<T>(what: &'static str, len: usize) -> Error {
    Error::OutOfMemory {
        what,
        bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    }
}

/// An empty vector with room for exactly `len` elements.
pub fn try_with_capacity<T>(len: usize, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| oom::<T>(what, len))?;
    Ok(v)
}

/// `vec![value; len]`, failing with [`Error::OutOfMemory`] instead of aborting.
pub fn try_vec<T: Clone>(len: usize, value: T, what: &'static str) -> Result<Vec<T>> {
    let mut v = try_with_capacity(len, what)?;
    v.resize(len, value);
    Ok(v)
}

/// `src.to_vec()`, failing with [`Error::OutOfMemory`] instead of aborting.
pub fn try_copy<T: Clone>(src: &[T], what: &'static str) -> Result<Vec<T>> {
    let mut v = try_with_capacity(src.len(), what)?;
    v.extend_from_slice(src);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_is_an_error_not_an_abort() {
        // More than isize::MAX bytes: every allocator refuses, deterministically.
        let e = try_vec(usize::MAX / 4, 0u64, "num_device_pages").unwrap_err();
        assert!(matches!(
            e,
            Error::OutOfMemory {
                what: "num_device_pages",
                ..
            }
        ));
        assert_eq!(try_vec(3, 7u8, "x").unwrap(), vec![7, 7, 7]);
        assert_eq!(try_copy(&[1, 2], "x").unwrap(), vec![1, 2]);
    }
}
