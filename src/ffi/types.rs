//! Plain C enums and structs shared by several exported objects.

use crate::core::{DType, Error, Tier};

/// Element type of KV caches and attention tensors.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_dtype {
    /// 32-bit float.
    F32 = 0,
    /// IEEE half precision.
    F16 = 1,
    /// bfloat16.
    Bf16 = 2,
}

/// Decodes a raw `kvs_dtype` value coming from C (which may hold any number).
pub(crate) fn dtype_from_raw(raw: u32, field: &'static str) -> Result<DType, Error> {
    match raw {
        0 => Ok(DType::F32),
        1 => Ok(DType::F16),
        2 => Ok(DType::BF16),
        _ => Err(Error::arg(field, format!("{raw} is not a kvs_dtype"))),
    }
}

/// Which memory tier a page id refers to.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_tier {
    /// Device (accelerator) memory.
    Device = 0,
    /// Host memory.
    Host = 1,
}

impl From<Tier> for kvs_tier {
    fn from(t: Tier) -> Self {
        match t {
            Tier::Device => kvs_tier::Device,
            Tier::Host => kvs_tier::Host,
        }
    }
}

/// Decodes a raw `kvs_tier` value coming from C.
pub(crate) fn tier_from_raw(raw: u32, field: &'static str) -> Result<Tier, Error> {
    match raw {
        0 => Ok(Tier::Device),
        1 => Ok(Tier::Host),
        _ => Err(Error::arg(field, format!("{raw} is not a kvs_tier"))),
    }
}

/// Direction of a page copy reported by the cache manager (`kvs_copy.kind`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_copy_kind {
    /// Device page to device page (copy-on-write of a shared partial page).
    DeviceToDevice = 0,
    /// Device page to host page (swap out, demotion).
    DeviceToHost = 1,
    /// Host page to device page (swap in, promotion).
    HostToDevice = 2,
}

/// One page copy the cache manager asks the engine (or `kvs_kv_copy`) to perform: token slots
/// `[0, num_tokens)` of page `src_page` into page `dst_page` (`num_tokens == page_size` copies
/// the whole page), in the direction `kind` (a `kvs_copy_kind` value).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvs_copy {
    /// Source page id, in the source tier.
    pub src_page: u32,
    /// Destination page id, in the destination tier.
    pub dst_page: u32,
    /// Slots copied from the start of the page.
    pub num_tokens: u32,
    /// A `kvs_copy_kind` value.
    pub kind: u32,
}
