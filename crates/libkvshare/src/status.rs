//! Status codes, their strings, and the thread-local last-error message.

use super::enums::kvs_status;
use std::cell::RefCell;
use std::ffi::{c_char, CString};

#[cfg(feature = "attention")]
use kvshare_attention::Error as AttnError;
use kvshare_core::Error as CacheError;

use crate::error::Error;

/// Maps a crate error to its status code. The one place this mapping lives.
pub(crate) fn status_of(e: &Error) -> kvs_status {
    use kvs_status as S;
    match e {
        Error::NullArgument(_) => S::NullArgument,
        Error::Panic(_) => S::Panic,
        Error::Cache(e) => match e {
            CacheError::InvalidConfig { .. } => S::InvalidConfig,
            CacheError::InvalidArgument { .. } => S::InvalidArgument,
            CacheError::BufferTooSmall { .. } => S::BufferTooSmall,
            CacheError::NoSpace { .. } => S::NoSpace,
            CacheError::PageOutOfRange { .. } => S::PageOutOfRange,
            CacheError::PageNotAllocated { .. } => S::PageNotAllocated,
            CacheError::RefcountUnderflow { .. } => S::RefcountUnderflow,
            CacheError::PaddingPage { .. } => S::PaddingPage,
            CacheError::RefcountOverflow { .. } => S::RefcountOverflow,
            CacheError::OutOfMemory { .. } => S::OutOfMemory,
            CacheError::SeqNotFound(_) => S::SeqNotFound,
            CacheError::SeqExists(_) => S::SeqExists,
            CacheError::SeqWrongTier { .. } => S::SeqWrongTier,
            CacheError::InvariantViolation(_) => S::InvariantViolation,
            CacheError::Poisoned => S::Poisoned,
            CacheError::Unsupported(_) => S::Unsupported,
        },
        #[cfg(feature = "attention")]
        Error::Attn(e) => match e {
            AttnError::Invalid { .. } => S::AttnInvalidArgument,
            AttnError::InvalidArgument { .. } => S::InvalidArgument,
            AttnError::NullArgument(_) => S::NullArgument,
            AttnError::Unsupported(_) => S::Unsupported,
            AttnError::BackendUnavailable(_) => S::BackendUnavailable,
            AttnError::BackendFailure(_) => S::BackendFailure,
        },
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `e` as this thread's last error and returns its status.
pub(crate) fn fail(e: &Error) -> kvs_status {
    let text = e.to_string().replace('\0', " ");
    LAST_ERROR.with(|m| *m.borrow_mut() = CString::new(text).unwrap_or_default());
    status_of(e)
}

impl kvs_status {
    /// A static, NUL-terminated name for a status (`"KVS_STATUS_OK"`, …); `"KVS_STATUS_UNKNOWN"`
    /// for a number that is not a status.
    ///
    /// **Ownership:** the string is static; do not free it.
    /// **Thread safety:** safe from any thread.
    #[must_use]
    #[no_mangle]
    pub extern "C" fn kvs_status_str(status: u32) -> *const c_char {
        let s: &'static [u8] = match status {
            0 => b"KVS_STATUS_OK\0",
            1 => b"KVS_STATUS_PANIC\0",
            2 => b"KVS_STATUS_NULL_ARGUMENT\0",
            3 => b"KVS_STATUS_INVALID_ARGUMENT\0",
            4 => b"KVS_STATUS_BUFFER_TOO_SMALL\0",
            5 => b"KVS_STATUS_POISONED\0",
            6 => b"KVS_STATUS_UNSUPPORTED\0",
            7 => b"KVS_STATUS_OUT_OF_MEMORY\0",
            100 => b"KVS_STATUS_INVALID_CONFIG\0",
            200 => b"KVS_STATUS_NO_SPACE\0",
            201 => b"KVS_STATUS_PAGE_OUT_OF_RANGE\0",
            202 => b"KVS_STATUS_PAGE_NOT_ALLOCATED\0",
            203 => b"KVS_STATUS_REFCOUNT_UNDERFLOW\0",
            204 => b"KVS_STATUS_PADDING_PAGE\0",
            205 => b"KVS_STATUS_REFCOUNT_OVERFLOW\0",
            300 => b"KVS_STATUS_SEQ_NOT_FOUND\0",
            301 => b"KVS_STATUS_SEQ_EXISTS\0",
            302 => b"KVS_STATUS_SEQ_WRONG_TIER\0",
            400 => b"KVS_STATUS_INVARIANT_VIOLATION\0",
            500 => b"KVS_STATUS_BACKEND_UNAVAILABLE\0",
            501 => b"KVS_STATUS_ATTN_INVALID_ARGUMENT\0",
            502 => b"KVS_STATUS_BACKEND_FAILURE\0",
            _ => b"KVS_STATUS_UNKNOWN\0",
        };
        s.as_ptr().cast()
    }

    /// The human-readable message of the last failed `kvs_` call on this thread (it names the
    /// bad argument or field), or `""` if none failed yet.
    ///
    /// **Ownership:** owned by the library; valid until the next failing `kvs_` call on this
    /// thread. Copy it if you need it longer. Never NULL.
    /// **Thread safety:** thread-local; each thread sees its own last error.
    #[must_use]
    #[no_mangle]
    pub extern "C" fn kvs_last_error_message() -> *const c_char {
        LAST_ERROR.with(|m| m.borrow().as_ptr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn every_status_has_its_name() {
        use kvs_status as S;
        let all = [
            (S::Ok, "OK"),
            (S::Panic, "PANIC"),
            (S::NullArgument, "NULL_ARGUMENT"),
            (S::InvalidArgument, "INVALID_ARGUMENT"),
            (S::BufferTooSmall, "BUFFER_TOO_SMALL"),
            (S::Poisoned, "POISONED"),
            (S::Unsupported, "UNSUPPORTED"),
            (S::OutOfMemory, "OUT_OF_MEMORY"),
            (S::InvalidConfig, "INVALID_CONFIG"),
            (S::NoSpace, "NO_SPACE"),
            (S::PageOutOfRange, "PAGE_OUT_OF_RANGE"),
            (S::PageNotAllocated, "PAGE_NOT_ALLOCATED"),
            (S::RefcountUnderflow, "REFCOUNT_UNDERFLOW"),
            (S::PaddingPage, "PADDING_PAGE"),
            (S::RefcountOverflow, "REFCOUNT_OVERFLOW"),
            (S::SeqNotFound, "SEQ_NOT_FOUND"),
            (S::SeqExists, "SEQ_EXISTS"),
            (S::SeqWrongTier, "SEQ_WRONG_TIER"),
            (S::InvariantViolation, "INVARIANT_VIOLATION"),
            (S::BackendUnavailable, "BACKEND_UNAVAILABLE"),
            (S::AttnInvalidArgument, "ATTN_INVALID_ARGUMENT"),
            (S::BackendFailure, "BACKEND_FAILURE"),
        ];
        for (s, name) in all {
            // SAFETY: `kvs_status_str` returns a static NUL-terminated string for any value.
            let got = unsafe { CStr::from_ptr(kvs_status::kvs_status_str(s as u32)) };
            assert_eq!(got.to_str().unwrap(), format!("KVS_STATUS_{name}"));
        }
        // SAFETY: as above, a static string (the unknown one).
        let unknown = unsafe { CStr::from_ptr(kvs_status::kvs_status_str(9999)) };
        assert_eq!(unknown.to_str().unwrap(), "KVS_STATUS_UNKNOWN");
    }

    #[test]
    fn last_error_is_per_thread() {
        fail(&CacheError::SeqNotFound(7).into());
        // SAFETY: a NUL-terminated thread-local string, valid until this thread's next failure.
        let msg = unsafe { CStr::from_ptr(kvs_status::kvs_last_error_message()) };
        assert_eq!(msg.to_str().unwrap(), "sequence 7 not found");
        std::thread::spawn(|| {
            // SAFETY: a NUL-terminated thread-local string, valid until this thread's next failure.
            let msg = unsafe { CStr::from_ptr(kvs_status::kvs_last_error_message()) };
            assert_eq!(msg.to_str().unwrap(), "");
        })
        .join()
        .unwrap();
    }
}
