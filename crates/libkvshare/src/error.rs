//! The C ABI's error type: the core's and the backends' errors, and the boundary's own (a NULL
//! pointer, a bad length, a caught panic). `crate::status::status_of` maps each to one
//! `kvs_status`, in one place; the `Display` text becomes `kvs_last_error_message()`.

#[cfg(feature = "attention")]
use kvshare_attention::Error as AttnError;
use kvshare_core::Error as CacheError;

/// Every failure an export reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A cache operation failed (the cache is unchanged).
    Cache(CacheError),
    /// A backend refused its arguments or failed.
    #[cfg(feature = "attention")]
    Attn(AttnError),
    /// A required pointer argument was NULL (with a non-zero length, where it has one).
    NullArgument(&'static str),
    /// A caught panic, with its message and location.
    Panic(String),
}

/// Shorthand for results carrying [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An argument is out of range or inconsistent with another one.
    pub fn arg(field: &'static str, reason: impl Into<String>) -> Self {
        Error::Cache(CacheError::arg(field, reason))
    }

    /// A config field is out of range.
    pub fn config(field: &'static str, reason: impl Into<String>) -> Self {
        Error::Cache(CacheError::InvalidConfig {
            field,
            reason: reason.into(),
        })
    }

    /// Attention / KV-write / copy arguments contradict each other or the tensor layout.
    #[cfg(feature = "attention")]
    pub fn attn(field: &'static str, reason: impl Into<String>) -> Self {
        Error::Attn(AttnError::Invalid {
            field,
            reason: reason.into(),
        })
    }

    /// A caller's output buffer cannot hold the result.
    #[must_use]
    pub fn buffer(what: &'static str, needed: usize, capacity: usize) -> Self {
        Error::Cache(CacheError::BufferTooSmall {
            what,
            needed,
            capacity,
        })
    }
}

impl From<CacheError> for Error {
    fn from(e: CacheError) -> Self {
        Error::Cache(e)
    }
}

#[cfg(feature = "attention")]
impl From<AttnError> for Error {
    fn from(e: AttnError) -> Self {
        match e {
            // One NULL-argument status, whichever layer found the pointer.
            AttnError::NullArgument(f) => Error::NullArgument(f),
            e => Error::Attn(e),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Cache(e) => e.fmt(f),
            #[cfg(feature = "attention")]
            Error::Attn(e) => e.fmt(f),
            Error::NullArgument(a) => write!(f, "argument `{a}` is NULL"),
            Error::Panic(m) => write!(f, "internal panic: {m}"),
        }
    }
}

impl std::error::Error for Error {}
