//! Plain C enums and structs shared by several exported objects (their conversions are in
//! `enums.rs`).

use super::enums::kvs_copy_kind;
use super::slice::{slice, try_ref};
use crate::error::Error;
use kvshare_core::alloc::{try_copy, try_with_capacity};
use kvshare_core::{ExtraKeys, MmItem, PageCopy};

/// One page copy the engine (or a backend's `kvs_kv_copy`) must execute before the next
/// attention launch that reads `dst`: token slots `[0, num_tokens)` of page `src` into page `dst`
/// for every layer of group `group`, K and V. `num_tokens == page_size` means the whole page (a
/// state group's page is always copied whole); it may be 0 for a reserved page that holds no
/// token yet (nothing to move).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvs_copy {
    /// Source page id, in the source tier of `kind` (of the group's pool).
    pub src_page: u32,
    /// Destination page id, in the destination tier of `kind` (of the group's pool).
    pub dst_page: u32,
    /// Slots to copy from the start of the page.
    pub num_tokens: u32,
    /// A `kvs_copy_kind` value.
    pub kind: u32,
    /// The group whose layers' KV tensors the page ids index (its index in
    /// `kvs_config.groups`; 0 in a cache of one group).
    pub group: u32,
}

impl From<PageCopy> for kvs_copy {
    fn from(c: PageCopy) -> Self {
        kvs_copy {
            src_page: c.src_page,
            dst_page: c.dst_page,
            num_tokens: c.num_tokens,
            kind: kvs_copy_kind::from(c.kind) as u32,
            group: c.group,
        }
    }
}

/// A multimodal item in a prompt: its placeholder tokens cover positions
/// `[offset, offset + length)`; `hash_lo`/`hash_hi` are the low and high 64 bits of a 128-bit
/// content hash the engine computed (e.g. of the image bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvs_mm_item {
    /// Low 64 bits of the content hash.
    pub hash_lo: u64,
    /// High 64 bits of the content hash.
    pub hash_hi: u64,
    /// First token position.
    pub offset: u32,
    /// Number of positions.
    pub length: u32,
}

/// Keys that are part of a page's identity besides its tokens. Pass NULL for "none".
/// Sequences with different `lora_id` or salt bytes never share pages; a multimodal item changes
/// the identity of the pages it overlaps (and, through the chain digest, of every later page),
/// so text pages before it are still shared.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_extra_keys {
    /// LoRA adapter id; 0 is the base model.
    pub lora_id: u64,
    /// Cache salt bytes (tenant isolation); may be NULL when `salt_len` is 0.
    pub salt: *const u8,
    /// Length of `salt` in bytes.
    pub salt_len: usize,
    /// Multimodal items; may be NULL when `num_mm_items` is 0.
    pub mm_items: *const kvs_mm_item,
    /// Number of `mm_items`.
    pub num_mm_items: usize,
}

/// Reads an optional `kvs_extra_keys` pointer into the core's owned form.
///
/// # Safety
/// A non-NULL `ptr` must point to a valid `kvs_extra_keys` whose arrays are valid for their
/// lengths.
pub(crate) unsafe fn extra_from_c(ptr: *const kvs_extra_keys) -> Result<Option<ExtraKeys>, Error> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller guarantees `ptr` points to a valid `kvs_extra_keys` whose arrays are
    // valid for their lengths; `try_ref` and `slice` refuse NULL and misalignment.
    let (x, salt, mm) = unsafe {
        let x = try_ref(ptr, "extra")?;
        let salt = slice(x.salt, x.salt_len, "extra.salt")?;
        let mm = slice(x.mm_items, x.num_mm_items, "extra.mm_items")?;
        (x, salt, mm)
    };
    let mut items = try_with_capacity(mm.len(), "extra.mm_items")?;
    items.extend(mm.iter().map(|m| MmItem {
        hash: u128::from(m.hash_hi) << 64 | u128::from(m.hash_lo),
        offset: m.offset,
        length: m.length,
    }));
    Ok(Some(ExtraKeys {
        lora_id: x.lora_id,
        salt: try_copy(salt, "extra.salt")?,
        mm: items,
    }))
}
