//! Owned CANN objects (tensors, int arrays, tensor lists, executors) destroyed on every path,
//! and the one mapping from ACL / aclnn status codes to kvshare errors.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;

use super::loader::Cann;
use super::sys::*;
use crate::error::{Error, Result};

/// `aclGetRecentErrMsg()` text (empty when unavailable).
pub fn recent_msg(cann: &Cann) -> String {
    let Some(f) = cann.recent_err_msg else {
        return String::new();
    };
    // SAFETY: returns NULL or a NUL-terminated string owned by ACL; copied at once.
    unsafe {
        let p = f();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().trim().to_string()
        }
    }
}

/// Maps a failed ACL/aclnn call to a kvshare error (the one place this mapping lives):
///
/// | code | kvshare status |
/// |---|---|
/// | 161001 `ACLNN_ERR_PARAM_NULLPTR`, 161002 `ACLNN_ERR_PARAM_INVALID` | `ATTN_INVALID_ARGUMENT` (field = the CANN function) |
/// | 561003 kernel not found (op binary package missing) | `BACKEND_UNAVAILABLE` |
/// | anything else (361001 runtime error, 561xxx internal, ACL runtime codes) | `BACKEND_FAILURE` |
///
/// The message names the call, the code (and its name when documented) and
/// `aclGetRecentErrMsg()`.
pub fn acl_error(cann: &Cann, code: AclError, call: &'static str) -> Error {
    let name = status_name(code)
        .map(|n| format!(" {n}"))
        .unwrap_or_default();
    let msg = recent_msg(cann);
    let text = if msg.is_empty() {
        format!("{call} returned {code}{name}")
    } else {
        format!("{call} returned {code}{name}: {msg}")
    };
    match code {
        ACLNN_ERR_PARAM_NULLPTR | ACLNN_ERR_PARAM_INVALID => Error::Invalid {
            field: call,
            reason: format!("CANN refused the arguments: {text}"),
        },
        ACLNN_ERR_INNER_FIND_KERNEL_ERROR => Error::BackendUnavailable(format!(
            "{text} (kernel not found: is the CANN operator package installed?)"
        )),
        _ => Error::BackendFailure(text),
    }
}

/// `Ok` for `ACL_SUCCESS`, else [`acl_error`].
pub fn check(cann: &Cann, code: AclError, call: &'static str) -> Result<()> {
    if code == ACL_SUCCESS {
        Ok(())
    } else {
        Err(acl_error(cann, code, call))
    }
}

/// A strided view of device memory, described the way `aclCreateTensor` takes it: view dims and
/// strides in elements, an element offset, and a 1-D storage of `storage` elements starting at
/// `data`.
#[derive(Debug, Clone)]
pub struct View {
    /// View dims.
    pub dims: Vec<i64>,
    /// View strides (elements).
    pub strides: Vec<i64>,
    /// Offset of the view's first element in the storage (elements).
    pub offset: i64,
    /// Elements of the storage (the whole buffer the caller passed).
    pub storage: i64,
    /// `aclDataType`.
    pub dtype: c_int,
    /// Device address of the storage.
    pub data: *mut c_void,
}

/// An owned `aclTensor`.
pub struct Tensor<'c> {
    cann: &'c Cann,
    ptr: *mut AclTensor,
}

impl<'c> Tensor<'c> {
    /// `aclCreateTensor` for `v` (format ND).
    pub fn new(cann: &'c Cann, v: &View) -> Result<Self> {
        debug_assert_eq!(v.dims.len(), v.strides.len());
        let storage = [v.storage];
        // SAFETY: arrays valid for the given lengths; aclCreateTensor copies them.
        let ptr = unsafe {
            (cann.create_tensor)(
                v.dims.as_ptr(),
                v.dims.len() as u64,
                v.dtype,
                v.strides.as_ptr(),
                v.offset,
                ACL_FORMAT_ND,
                storage.as_ptr(),
                1,
                v.data,
            )
        };
        if ptr.is_null() {
            return Err(null_object(cann, "aclCreateTensor"));
        }
        Ok(Tensor { cann, ptr })
    }

    /// The raw pointer (still owned here).
    pub fn raw(&self) -> *const AclTensor {
        self.ptr
    }

    /// The raw pointer as a mutable ref argument (`keyCacheRef`).
    pub fn raw_mut(&self) -> *mut AclTensor {
        self.ptr
    }

    /// Gives up ownership (the tensor list that takes it destroys it).
    fn release(self) -> *mut AclTensor {
        let p = self.ptr;
        std::mem::forget(self);
        p
    }
}

impl Drop for Tensor<'_> {
    fn drop(&mut self) {
        // SAFETY: created by aclCreateTensor, destroyed once. A failure here cannot be reported
        // (drop runs on error paths too); CANN only fails it for NULL.
        unsafe { (self.cann.destroy_tensor)(self.ptr) };
    }
}

fn null_object(cann: &Cann, call: &'static str) -> Error {
    let msg = recent_msg(cann);
    Error::BackendFailure(if msg.is_empty() {
        format!("{call} returned NULL")
    } else {
        format!("{call} returned NULL: {msg}")
    })
}

/// Optional tensor as a raw argument.
pub fn opt(t: &Option<Tensor<'_>>) -> *const AclTensor {
    t.as_ref().map_or(ptr::null(), |t| t.raw())
}

/// An owned `aclIntArray` (host int64 values, copied by CANN).
pub struct IntArray<'c> {
    cann: &'c Cann,
    ptr: *mut AclIntArray,
}

impl<'c> IntArray<'c> {
    /// `aclCreateIntArray(values)`.
    pub fn new(cann: &'c Cann, values: &[i64]) -> Result<Self> {
        // SAFETY: valid for values.len(); CANN copies the values.
        let ptr = unsafe { (cann.create_int_array)(values.as_ptr(), values.len() as u64) };
        if ptr.is_null() {
            return Err(null_object(cann, "aclCreateIntArray"));
        }
        Ok(IntArray { cann, ptr })
    }

    /// The raw pointer (still owned here).
    pub fn raw(&self) -> *const AclIntArray {
        self.ptr
    }
}

impl Drop for IntArray<'_> {
    fn drop(&mut self) {
        // SAFETY: created by aclCreateIntArray, destroyed once.
        unsafe { (self.cann.destroy_int_array)(self.ptr) };
    }
}

/// Optional int array as a raw argument.
pub fn opt_arr(a: &Option<IntArray<'_>>) -> *const AclIntArray {
    a.as_ref().map_or(ptr::null(), |a| a.raw())
}

/// An owned one-element `aclTensorList` (it owns its tensor: `aclDestroyTensorList` destroys
/// the contained tensors, which must not be destroyed again).
pub struct TensorList<'c> {
    cann: &'c Cann,
    ptr: *mut AclTensorList,
}

impl<'c> TensorList<'c> {
    /// `aclCreateTensorList([t])`. On failure `t` is destroyed here.
    pub fn of_one(cann: &'c Cann, t: Tensor<'c>) -> Result<Self> {
        let one = [t.raw()];
        // SAFETY: a 1-element array of a live tensor.
        let ptr = unsafe { (cann.create_tensor_list)(one.as_ptr(), 1) };
        if ptr.is_null() {
            return Err(null_object(cann, "aclCreateTensorList")); // `t` drops: destroyed
        }
        t.release(); // owned by the list from now on
        Ok(TensorList { cann, ptr })
    }

    /// The raw pointer (still owned here).
    pub fn raw(&self) -> *const AclTensorList {
        self.ptr
    }
}

impl Drop for TensorList<'_> {
    fn drop(&mut self) {
        // SAFETY: created by aclCreateTensorList, destroyed once (with its tensors).
        unsafe { (self.cann.destroy_tensor_list)(self.ptr) };
    }
}

/// An executor from a successful GetWorkspaceSize, not yet run. Dropping it without
/// [`Executor::run`] destroys it (`aclDestroyAclOpExecutor`); running it hands it to the
/// execute function, which consumes a non-repeatable executor whether it succeeds or fails.
pub struct Executor<'c> {
    cann: &'c Cann,
    ptr: *mut AclOpExecutor,
}

impl<'c> Executor<'c> {
    /// Wraps the executor a GetWorkspaceSize call returned (NULL is refused).
    pub fn new(cann: &'c Cann, ptr: *mut AclOpExecutor, call: &'static str) -> Result<Self> {
        if ptr.is_null() {
            return Err(Error::BackendFailure(format!(
                "{call} succeeded but returned a NULL executor"
            )));
        }
        Ok(Executor { cann, ptr })
    }

    /// Runs it: `exec(workspace, size, executor, stream)`. `workspace` and `stream` are device
    /// handles passed through to CANN, never dereferenced here.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn run(
        self,
        exec: AclnnExecute,
        workspace: *mut c_void,
        size: u64,
        stream: AclrtStream,
        call: &'static str,
    ) -> Result<()> {
        let (cann, p) = (self.cann, self.ptr);
        std::mem::forget(self); // consumed by the execute call, on success and on failure
                                // SAFETY: a fresh executor from GetWorkspaceSize; workspace holds `size` device bytes.
        let code = unsafe { exec(workspace, size, p, stream) };
        check(cann, code, call)
    }
}

impl Drop for Executor<'_> {
    fn drop(&mut self) {
        // SAFETY: an executor that was never run; destroyed once.
        unsafe { (self.cann.destroy_executor)(self.ptr) };
    }
}
