//! The one copy channel: every KV movement the manager decides (copy-on-write, swap, demotion,
//! promotion, sub-page hits) is a [`PageCopy`] the engine (or a backend) executes. Copies that
//! several calls queue (demotions, promotions, unit hits) wait in the cache's queue until
//! `take_copies`; the others (copy-on-write, swaps) are returned by the call that made them.

/// Direction of a page copy. One type for the cache manager, which reports copies, and the
/// attention backends, which execute them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Copy-on-write (and sub-page hits) inside the device tier.
    DeviceToDevice,
    /// Swap out, demotion.
    DeviceToHost,
    /// Swap in, promotion.
    HostToDevice,
}

/// Copy token slots `0..num_tokens` of page `src_page` into page `dst_page`, in the tensors of
/// group `group`'s layers (the C `kvs_copy`, field for field). A state group's page holds one
/// state, copied whole (`num_tokens` is then the page size). 0 tokens moves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageCopy {
    /// Source page id (in the source tier of the group's pool).
    pub src_page: u32,
    /// Destination page id (in the destination tier of the group's pool).
    pub dst_page: u32,
    /// Slots to copy from the start of the page (`page_size` = the whole page).
    pub num_tokens: u32,
    /// Tiers of `src` and `dst`.
    pub kind: CopyKind,
    /// The group whose layers hold the KV (0 in a cache of one group).
    pub group: u32,
}

/// A page copy waiting in the queue for `take_copies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queued {
    pub copy: PageCopy,
    /// The copy holds a reference on its source page until `take_copies` hands it out: the
    /// source of a unit hit is a page nobody else may hold, and without the reference an
    /// allocation later in the same step could evict it and reuse it as the destination of a
    /// copy the engine runs first (an append's copy-on-write). Held, it is neither evicted nor
    /// demoted before the engine has the copy; after that, the copy runs before any copy
    /// returned by a later call and before the step's KV writes.
    pub holds_src: bool,
}
