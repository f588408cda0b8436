//! The attention crate's error type. The C ABI maps each variant to one `kvs_status`; the
//! `Display` text becomes `kvs_last_error_message()`. Every variant is reported before anything
//! is written or launched, except [`Error::BackendFailure`] (a runtime call failed mid-launch).

/// Every failure of a backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Attention / KV-write / copy arguments contradict each other or the tensor layout.
    #[error("invalid attention argument `{field}`: {reason}")]
    Invalid {
        /// The offending field of the args struct.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A plain argument (not part of the attention args) is out of range.
    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument {
        /// The offending argument.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A required device pointer was NULL.
    #[error("argument `{0}` is NULL")]
    NullArgument(&'static str),
    /// The operation or combination of options is valid but not supported by this backend.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The requested backend cannot be used on this machine (library, symbol or device missing).
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// A backend runtime call failed (for Ascend: an ACL/aclnn status, with its message).
    #[error("backend failure: {0}")]
    BackendFailure(String),
}

/// Shorthand for results carrying [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Builds [`Error::InvalidArgument`].
    pub fn arg(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }
}
