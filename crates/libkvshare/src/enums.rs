//! Every C enum crossing the boundary, decoded and encoded in one place (rustls-ffi's
//! `enums.rs`). The enums themselves are declared beside the object they belong to (so the
//! header keeps them there); this file owns only their conversions:
//!
//! - raw `uint32_t` from C → enum: one `TryFrom<u32>` per enum, failing with [`NotAnEnum`]; a
//!   call site turns that into its status with [`decode`] (naming the field) — a C field holds
//!   whatever number the caller stored, so a Rust enum is never read from it directly;
//! - enum ↔ core type: one `From` per direction that is used.

use crate::error::Error;
use kvshare_core::{CopyKind, DType, EventKind, PageState, Tier};

use super::attn::kvs_index_type;
use super::backend::kvs_backend_kind;
use super::events::kvs_event_kind;
use super::huge_pages::kvs_huge_pages_mode;
use super::hybrid::kvs_group_kind;
use super::hybrid_state::kvs_state_mode;
use super::pages::kvs_page_state;
use super::types::{kvs_copy_kind, kvs_dtype, kvs_tier};

/// A raw value that is none of a C enum's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAnEnum {
    /// The value the caller passed.
    pub raw: u32,
    /// The C enum's name, for the message.
    pub name: &'static str,
}

impl NotAnEnum {
    /// The message every refusal uses: `"7 is not a kvs_dtype"`.
    #[must_use]
    pub fn reason(self) -> String {
        format!("{} is not a {}", self.raw, self.name)
    }
}

/// Decodes the raw value of field `field`: `InvalidArgument` naming the field when it is none
/// of the enum's values.
pub(crate) fn decode<T: TryFrom<u32, Error = NotAnEnum>>(
    raw: u32,
    field: &'static str,
) -> Result<T, Error> {
    T::try_from(raw).map_err(|e| Error::arg(field, e.reason()))
}

/// One `TryFrom<u32>` per enum, listing each value once.
macro_rules! try_from_raw {
    ($ty:ident { $($variant:ident),+ $(,)? }) => {
        impl TryFrom<u32> for $ty {
            type Error = NotAnEnum;
            fn try_from(raw: u32) -> Result<Self, NotAnEnum> {
                $(if raw == $ty::$variant as u32 {
                    return Ok($ty::$variant);
                })+
                Err(NotAnEnum { raw, name: stringify!($ty) })
            }
        }
    };
}

try_from_raw!(kvs_dtype { F32, F16, Bf16 });
try_from_raw!(kvs_tier { Device, Host });
try_from_raw!(kvs_group_kind {
    Full,
    SlidingWindow,
    ChunkedLocal,
    State,
});
try_from_raw!(kvs_state_mode { None, All, Align });
try_from_raw!(kvs_copy_kind {
    DeviceToDevice,
    DeviceToHost,
    HostToDevice
});
try_from_raw!(kvs_backend_kind { Cpu, Ascend });
try_from_raw!(kvs_index_type { Int32, Int64 });
try_from_raw!(kvs_huge_pages_mode { Advise, Collapse });

impl From<kvs_dtype> for DType {
    fn from(d: kvs_dtype) -> Self {
        match d {
            kvs_dtype::F32 => DType::F32,
            kvs_dtype::F16 => DType::F16,
            kvs_dtype::Bf16 => DType::BF16,
        }
    }
}

impl From<DType> for kvs_dtype {
    fn from(d: DType) -> Self {
        match d {
            DType::F32 => kvs_dtype::F32,
            DType::F16 => kvs_dtype::F16,
            DType::BF16 => kvs_dtype::Bf16,
        }
    }
}

impl From<kvs_tier> for Tier {
    fn from(t: kvs_tier) -> Self {
        match t {
            kvs_tier::Device => Tier::Device,
            kvs_tier::Host => Tier::Host,
        }
    }
}

impl From<Tier> for kvs_tier {
    fn from(t: Tier) -> Self {
        match t {
            Tier::Device => kvs_tier::Device,
            Tier::Host => kvs_tier::Host,
        }
    }
}

impl From<kvs_copy_kind> for CopyKind {
    fn from(k: kvs_copy_kind) -> Self {
        match k {
            kvs_copy_kind::DeviceToDevice => CopyKind::DeviceToDevice,
            kvs_copy_kind::DeviceToHost => CopyKind::DeviceToHost,
            kvs_copy_kind::HostToDevice => CopyKind::HostToDevice,
        }
    }
}

impl From<CopyKind> for kvs_copy_kind {
    fn from(k: CopyKind) -> Self {
        match k {
            CopyKind::DeviceToDevice => kvs_copy_kind::DeviceToDevice,
            CopyKind::DeviceToHost => kvs_copy_kind::DeviceToHost,
            CopyKind::HostToDevice => kvs_copy_kind::HostToDevice,
        }
    }
}

impl From<PageState> for kvs_page_state {
    fn from(s: PageState) -> Self {
        match s {
            PageState::Free => kvs_page_state::Free,
            PageState::Cached => kvs_page_state::Cached,
            PageState::InUse => kvs_page_state::InUse,
            PageState::Padding => kvs_page_state::Padding,
        }
    }
}

impl From<EventKind> for kvs_event_kind {
    fn from(k: EventKind) -> Self {
        match k {
            EventKind::Stored => kvs_event_kind::Stored,
            EventKind::Removed => kvs_event_kind::Removed,
            EventKind::Cleared => kvs_event_kind::Cleared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every raw value decodes to the variant whose discriminant it is, and the first value
    /// past the last variant is refused with the enum's name.
    fn round_trip<T>(variants: &[T], name: &str)
    where
        T: TryFrom<u32, Error = NotAnEnum> + Copy + PartialEq + std::fmt::Debug,
        u32: From<T>,
    {
        for &v in variants {
            assert_eq!(T::try_from(u32::from(v)), Ok(v));
        }
        let past = u32::try_from(variants.len()).unwrap();
        let e = T::try_from(past).unwrap_err();
        assert_eq!((e.raw, e.name), (past, name));
        assert_eq!(T::try_from(u32::MAX).unwrap_err().raw, u32::MAX);
    }

    macro_rules! to_u32 {
        ($($ty:ident),+) => {$(impl From<$ty> for u32 {
            fn from(v: $ty) -> u32 { v as u32 }
        })+};
    }
    to_u32!(
        kvs_dtype,
        kvs_tier,
        kvs_copy_kind,
        kvs_backend_kind,
        kvs_index_type
    );

    #[test]
    fn every_enum_decodes_its_values_and_only_them() {
        use kvs_dtype::*;
        round_trip(&[F32, F16, Bf16], "kvs_dtype");
        round_trip(&[kvs_tier::Device, kvs_tier::Host], "kvs_tier");
        round_trip(
            &[
                kvs_copy_kind::DeviceToDevice,
                kvs_copy_kind::DeviceToHost,
                kvs_copy_kind::HostToDevice,
            ],
            "kvs_copy_kind",
        );
        round_trip(
            &[kvs_backend_kind::Cpu, kvs_backend_kind::Ascend],
            "kvs_backend_kind",
        );
        round_trip(
            &[kvs_index_type::Int32, kvs_index_type::Int64],
            "kvs_index_type",
        );
    }

    #[test]
    fn core_round_trips() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(DType::from(kvs_dtype::from(d)), d);
        }
        for t in [Tier::Device, Tier::Host] {
            assert_eq!(Tier::from(kvs_tier::from(t)), t);
        }
        for k in [
            CopyKind::DeviceToDevice,
            CopyKind::DeviceToHost,
            CopyKind::HostToDevice,
        ] {
            assert_eq!(CopyKind::from(kvs_copy_kind::from(k)), k);
        }
    }
}
