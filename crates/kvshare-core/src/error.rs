//! The cache manager's error type. The C ABI maps each variant to one stable `kvs_status`; the
//! `Display` text becomes `kvs_last_error_message()`.

use super::tier::Tier;

/// Every failure of a cache operation. Each variant leaves the cache unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A configuration field is out of range or contradicts another field.
    #[error("invalid config: field `{field}`: {reason}")]
    InvalidConfig {
        /// The offending field, as named in `kvs_config`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An argument is out of range or inconsistent with another one.
    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument {
        /// The offending argument.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A caller-provided output buffer cannot hold the result.
    #[error("output buffer `{what}` too small: {needed} entries needed, capacity {capacity}")]
    BufferTooSmall {
        /// The buffer argument.
        what: &'static str,
        /// Entries the result needs.
        needed: usize,
        /// Entries the caller provided.
        capacity: usize,
    },
    /// Not enough free (or evictable) pages in a tier.
    #[error("out of {tier} pages: {needed} needed, {available} free or evictable")]
    NoSpace {
        /// The tier that ran out.
        tier: Tier,
        /// Pages the operation needs.
        needed: usize,
        /// Pages that could be had (free plus evictable cached).
        available: usize,
    },
    /// A page id is not below the number of pages of its tier.
    #[error("{tier} page id {page} out of range (tier has {num_pages} pages)")]
    PageOutOfRange {
        /// The tier.
        tier: Tier,
        /// The bad id.
        page: u32,
        /// Pages in the tier.
        num_pages: u32,
    },
    /// The page is free: it has no holder, so it cannot be acquired or registered.
    #[error("{tier} page {page} is not allocated")]
    PageNotAllocated {
        /// The tier.
        tier: Tier,
        /// The page.
        page: u32,
    },
    /// A release would take a reference count below zero (double free).
    #[error("refcount underflow: page {page} released more times than it was acquired")]
    RefcountUnderflow {
        /// The page.
        page: u32,
    },
    /// An acquire would take a page's 32-bit reference count past `u32::MAX` (it never wraps).
    #[error("refcount overflow: page {page} already holds {refcount} references; {adding} more would exceed {max}", max = u32::MAX)]
    RefcountOverflow {
        /// The page.
        page: u32,
        /// Its reference count now.
        refcount: u32,
        /// References the call would add to it.
        adding: u64,
    },
    /// An allocation sized by the caller (a config field, a list length) failed.
    #[error("out of memory: `{what}` needs {bytes} bytes, which could not be allocated")]
    OutOfMemory {
        /// The config field or argument that sized the allocation.
        what: &'static str,
        /// Bytes requested.
        bytes: u64,
    },
    /// The reserved padding (null) page was passed where a real page is needed.
    #[error("page {page} is the reserved padding page")]
    PaddingPage {
        /// The page.
        page: u32,
    },
    /// No live sequence has this id.
    #[error("sequence {0} not found")]
    SeqNotFound(u64),
    /// A live sequence already has this id.
    #[error("sequence {0} already exists")]
    SeqExists(u64),
    /// The operation needs the sequence in another tier (e.g. append while swapped out).
    #[error("sequence {seq} is in the {tier} tier; this operation needs it in the {needed} tier")]
    SeqWrongTier {
        /// The sequence.
        seq: u64,
        /// Where it is.
        tier: Tier,
        /// Where it must be.
        needed: Tier,
    },
    /// `check` found a broken internal invariant (a bug in kvshare).
    #[error("invariant violated: {0}")]
    InvariantViolation(String),
    /// An earlier call panicked while holding this cache; its state can no longer be trusted.
    #[error("cache is poisoned by an earlier panic; free it and create a new one")]
    Poisoned,
    /// The operation is valid but not available with this cache's configuration.
    #[error("unsupported: {0}")]
    Unsupported(String),
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
