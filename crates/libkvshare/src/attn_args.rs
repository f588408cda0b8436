//! Reading the `#[repr(C)]` attention args: the plain params of [`kvshare_attention`] from their
//! numbers (0 strides made dense, enum values decoded), and their pointers as host slices (for a
//! host-memory backend) or checked device addresses (for a device-memory one), with the pointer
//! checks every launch shares (alignment, overlap, NULL). No export lives here; `attn.rs` calls
//! these in order and nothing is written before all of them pass.

use std::ffi::c_void;

use super::attn::kvs_kv_layout;
use super::backend::Launcher;
use super::enums::decode;
use super::slice::{slice, slice_mut};
use super::types::kvs_dtype;
use crate::error::{Error, Result};
use kvshare_attention::{Buf, BufMut, CacheLayout};
use kvshare_core::DType;

/// Attention errors name fields; the shared slice helpers report `InvalidArgument`.
pub(super) fn attn(e: Error) -> Error {
    match e {
        Error::Cache(kvshare_core::Error::InvalidArgument { field, reason }) => {
            Error::attn(field, reason)
        }
        e => e,
    }
}

pub(super) fn dtype(raw: u32, field: &'static str) -> Result<DType> {
    decode::<kvs_dtype>(raw, field)
        .map(DType::from)
        .map_err(attn)
}

pub(super) fn or_dense(stride: usize, dense: usize) -> usize {
    if stride == 0 {
        dense
    } else {
        stride
    }
}

pub(super) fn layout(c: &kvs_kv_layout, num_pages: u32) -> Result<CacheLayout> {
    let (ps, h, d) = (
        c.page_size as usize,
        c.num_kv_heads as usize,
        c.head_dim as usize,
    );
    Ok(CacheLayout {
        dtype: dtype(c.dtype, "cache.dtype")?,
        num_pages: num_pages as usize,
        page_size: ps,
        num_kv_heads: h,
        head_dim: d,
        page_stride: or_dense(c.page_stride, ps.saturating_mul(h).saturating_mul(d)),
        slot_stride: or_dense(c.slot_stride, h.saturating_mul(d)),
        head_stride: or_dense(c.head_stride, d),
    })
}

/// Refuses a misaligned pointer as an attention argument error that names the address and the
/// alignment. (`slice.rs` refuses it too, before any slice is made, but with the shorter shared
/// message; this check runs first so attention callers get the precise one.)
fn aligned<T>(ptr: *const T, name: &'static str) -> Result<()> {
    if !ptr.is_aligned() {
        return Err(Error::attn(
            name,
            format!(
                "pointer {ptr:p} is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        ));
    }
    Ok(())
}

/// The one check of a paged K/V cache pointer, shared by `kvs_attention_launch`, `kvs_kv_write`
/// and `kvs_kv_copy` so that a pointer one call refuses is refused by all: aligned to the cache's
/// element type, and a device cache (`device`) of a device-memory backend to what that backend
/// requires ([`DeviceBackend::check_address`]; CANN's 32 bytes). NULL is left to each call's own
/// NULL check.
pub(super) fn cache_ptr(
    launcher: &Launcher,
    ptr: *const c_void,
    dtype: DType,
    device: bool,
    name: &'static str,
) -> Result<()> {
    if ptr.is_null() {
        return Ok(());
    }
    let align = dtype.size_bytes();
    if !(ptr as usize).is_multiple_of(align) {
        return Err(Error::attn(
            name,
            format!("pointer {ptr:p} is not aligned to {align} bytes (its element size)"),
        ));
    }
    if let (true, Launcher::Device(be)) = (device, launcher) {
        be.check_address(name, ptr as usize)?;
    }
    Ok(())
}

/// [`slice`] with attention errors.
///
/// # Safety
/// As [`slice`].
pub(super) unsafe fn aslice<'a, T>(
    ptr: *const T,
    len: usize,
    name: &'static str,
) -> Result<&'a [T]> {
    aligned(ptr, name)?;
    slice(ptr, len, name).map_err(attn)
}

/// [`slice_mut`] with attention errors.
///
/// # Safety
/// As [`slice_mut`].
pub(super) unsafe fn aslice_mut<'a, T>(
    ptr: *mut T,
    len: usize,
    name: &'static str,
) -> Result<&'a mut [T]> {
    aligned(ptr.cast_const(), name)?;
    slice_mut(ptr, len, name).map_err(attn)
}

/// # Safety
/// Non-NULL `ptr` must be valid for `len` elements of `dtype` for `'a`.
pub(super) unsafe fn buf<'a>(
    ptr: *const c_void,
    dtype: DType,
    len: usize,
    name: &'static str,
) -> Result<Buf<'a>> {
    Ok(match dtype {
        DType::F32 => Buf::F32(aslice(ptr.cast(), len, name)?),
        DType::F16 => Buf::F16(aslice(ptr.cast(), len, name)?),
        DType::BF16 => Buf::BF16(aslice(ptr.cast(), len, name)?),
    })
}

/// # Safety
/// As [`buf`], and nothing else accesses the memory during `'a`.
pub(super) unsafe fn buf_mut<'a>(
    ptr: *mut c_void,
    dtype: DType,
    len: usize,
    name: &'static str,
) -> Result<BufMut<'a>> {
    Ok(match dtype {
        DType::F32 => BufMut::F32(aslice_mut(ptr.cast(), len, name)?),
        DType::F16 => BufMut::F16(aslice_mut(ptr.cast(), len, name)?),
        DType::BF16 => BufMut::BF16(aslice_mut(ptr.cast(), len, name)?),
    })
}

/// Refuses a written buffer that overlaps another buffer of the call (that would alias a
/// `&mut` slice).
pub(super) fn no_overlap(
    w: (&'static str, *const c_void, usize),
    others: &[(&'static str, *const c_void, usize)],
) -> Result<()> {
    let (a0, a1) = (w.1 as usize, w.1 as usize + w.2);
    for &(name, p, bytes) in others {
        let (b0, b1) = (p as usize, p as usize + bytes);
        if !p.is_null() && bytes > 0 && w.2 > 0 && a0 < b1 && b0 < a1 {
            return Err(Error::attn(w.0, format!("overlaps `{name}`")));
        }
    }
    Ok(())
}

/// A device address that must not be NULL (device memory is never read on the host, so the
/// address is all a device-memory backend gets).
pub(super) fn not_null<T>(p: *const T, name: &'static str) -> Result<usize> {
    if p.is_null() {
        Err(Error::NullArgument(name))
    } else {
        Ok(p as usize)
    }
}
