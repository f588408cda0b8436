//! Every C enum crossing the boundary, declared, decoded and encoded in one place:
//!
//! - raw `uint32_t` from C → enum: one `TryFrom<u32>` per enum, failing with [`NotAnEnum`]; a
//!   call site turns that into its status with `decode` (naming the field) — a C field holds
//!   whatever number the caller stored, so a Rust enum is never read from it directly;
//! - enum ↔ core type: one `From` per direction that is used.

use crate::error::Error;
use kvshare_core::{
    CopyKind, DType, EventKind, EvictionPolicy, PageState, PoolOp, StateMode, StorePolicy, Tier,
};

/// Element type of a slot mapping (`kvs_kv_write_args.slot_mapping_type`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_index_type {
    /// `int32_t` (vLLM-Ascend, MindIE).
    Int32 = 0,
    /// `int64_t` (upstream vLLM).
    Int64 = 1,
}

/// Which backend `kvs_backend_new` creates.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_backend_kind {
    /// Host CPU, synchronous; streams are ignored.
    Cpu = 0,
    /// Huawei Ascend NPU through CANN, loaded at run time (`dlopen`): tensor pointers are device
    /// addresses and launches are enqueued on the caller's `aclrtStream` (see docs/ascend.md).
    Ascend = 1,
}

/// Kind of a `kvs_event`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_event_kind {
    /// A page was registered under `hash` in `tier` (vLLM's `BlockStored`).
    Stored = 0,
    /// The page registered under `hash` in `tier` left the index (vLLM's `BlockRemoved`).
    Removed = 1,
    /// Every entry of `tier` was dropped (vLLM's `AllBlocksCleared`).
    Cleared = 2,
}

/// What `kvs_cpu_huge_pages` asks of the kernel.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_huge_pages_mode {
    /// `madvise(MADV_HUGEPAGE)`: pages faulted in from now on come as 2 MiB pages. For a fresh
    /// allocation, before it is written.
    Advise = 0,
    /// Also `madvise(MADV_COLLAPSE)` (Linux 6.1+): the pages already there are copied into
    /// 2 MiB pages now, contents kept. For a cache already written (e.g. zeroed); takes about
    /// the time to copy the range once.
    Collapse = 1,
}

/// The attention of a group's layers (values of `kvs_group.kind`). Every kind but full
/// attention releases pages it no longer reads and shows `KVS_NULL_PAGE` at those positions,
/// so it needs `kvs_config.reserve_null_page`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_group_kind {
    /// Full attention (MLA too, with its own `page_bytes`): `window` must be 0.
    Full = 0,
    /// Sliding window of `window` tokens (vLLM `SlidingWindowSpec.sliding_window`).
    SlidingWindow = 1,
    /// Chunked local attention, chunks of `window` tokens (vLLM `attention_chunk_size`), a
    /// multiple of `page_size`: vLLM requires it too (its local-attention metadata asserts
    /// `attn_chunk_size % block_size == 0`), and a chunk starting inside a page would need that
    /// page's KV while the hit treats it as out of reach. Others are refused at
    /// `kvs_cache_new`.
    ChunkedLocal = 2,
    /// Mamba / linear-attention state: `window` is a `kvs_state_mode` (vLLM's
    /// `mamba_cache_mode`: none, all, align). A copy of a state page (copy-on-write, swap)
    /// moves the whole page. See `kvs_cache_new_step` and `kvs_seq_state_page`; a cache with a
    /// state group takes whole-page hits only (`match_unit` 0 or `page_size`).
    State = 3,
}

/// How a state group keeps and caches states (vLLM's `mamba_cache_mode`); the value of
/// `kvs_group.window` for a `KVS_GROUP_KIND_STATE` group.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_state_mode {
    /// `"none"`: one page per sequence, never cached (needs `enable_prefix_caching` false).
    None = 0,
    /// `"all"`: a state checkpoint per page of tokens, every full one cached; a sequence keeps
    /// the page of its last computed token (needs `enable_prefix_caching` true).
    All = 1,
    /// `"align"`: the running state in one page at the table's end, at most one new page per
    /// step, the previous step's page kept until the next release (by
    /// `kvs_seq_release_skipped`, or by the next `kvs_seq_append` that grows the table);
    /// checkpoints cached when a step ends on a page boundary (needs `enable_prefix_caching`
    /// true; no lookahead slots).
    Align = 2,
}

/// The order in which a tier's unreferenced cached pages of one retention priority are
/// evicted (`kvs_config.eviction_policy`). Every policy is O(1) or O(log n) per operation and
/// evicts a page only after the pages registered after it in its prefix chain (leaves first).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_eviction_policy {
    /// Least recently released first (the default, and the only policy `vllm_free_order`
    /// allows).
    Lru = 0,
    /// Least frequently used first, with dynamic aging (LFU-DA): a page's count grows with each
    /// hit and starts from the last evicted page's, so old popularity fades.
    Lfu = 1,
    /// S3-FIFO: pages used once pass through a small FIFO, pages hit again live in a main FIFO
    /// with a second chance, and evicted pages leave ghosts that admit a returning prefix
    /// straight to the main FIFO.
    S3Fifo = 2,
}

/// State of a page (`kvs_page_info.state`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_page_state {
    /// On the free list, no content.
    Free = 0,
    /// Refcount 0 but registered in the prefix index: reusable by a prefix hit, evictable.
    Cached = 1,
    /// Refcount > 0.
    InUse = 2,
    /// The reserved padding page.
    Padding = 3,
}

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
    /// 8-bit float E4M3 (OCP "fn": bias 7, no infinity, largest finite 448): KV caches only
    /// (one byte per element), each element its value times the layer's `k_scale`/`v_scale`.
    Fp8E4m3 = 3,
    /// 8-bit float E5M2 (bias 15, the upper byte of an IEEE half): KV caches only, as
    /// `KVS_DTYPE_FP8_E4M3`.
    Fp8E5m2 = 4,
    /// 8-bit signed integer: KV caches only, each element its value times its channel's scale
    /// (`kvs_kv_scales.k_channel_scales` / `v_channel_scales`) and the per-tensor one.
    Int8 = 5,
    /// 8-bit signed integer with a scale per (token, kv head) row, vLLM's
    /// `int8_per_token_head`: KV caches only. Each row of the K (and V) cache is `head_dim`
    /// codes followed by the row's f32 scale (4 bytes, little-endian, at byte `head_dim` of the
    /// row), so a row is `head_dim + 4` bytes and the cache strides (in bytes, one per element)
    /// must leave room for it (dense: `head_stride = head_dim + 4`). The KV write computes each
    /// row's scale (`max(max|x| / 127, 1e-6)` of the values divided by the per-tensor scale);
    /// a code stands for its value times its row's scale and the per-tensor `k_scale` /
    /// `v_scale`. Channel scales are refused with it. CPU backend only.
    Int8PerTokenHead = 6,
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

/// Direction of a page copy (values of `kvs_copy.kind`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_copy_kind {
    /// Inside the device tier (copy-on-write).
    DeviceToDevice = 0,
    /// Device page to host page (swap out, demotion).
    DeviceToHost = 1,
    /// Host page to device page (swap in, promotion).
    HostToDevice = 2,
}

/// What a `kvs_pool_work` asks the engine to do (values of `kvs_pool_work.op`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_pool_op {
    /// Read the store's entry `key` into device page `page` of group `group`, verified first.
    Load = 0,
    /// Write page `page` of tier `tier` of group `group` to the store under `key`.
    Store = 1,
}

/// When a cache writes pages to its pool tier (`kvs_pool_config.store`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_pool_store {
    /// Never: the cache only reads the pool.
    ReadOnly = 0,
    /// Every page registered in the device index, handed out at the next `kvs_cache_commit`.
    WriteThrough = 1,
    /// Every cached page demoted to the host tier (needs host pages and `demote_to_host`).
    OnDemotion = 2,
}

/// Result of every fallible `kvs_` function. Numbers are stable and never reused; each
/// subsystem owns a range (0–99 general, 100 config, 200 pages, 300 sequences, 400 checker,
/// 500 attention backends).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvs_status {
    /// Success.
    Ok = 0,
    /// A panic was caught inside the library; the cache it touched is poisoned.
    Panic = 1,
    /// A required pointer was NULL.
    NullArgument = 2,
    /// An argument is out of range or inconsistent.
    InvalidArgument = 3,
    /// An output buffer is too small; nothing was done.
    BufferTooSmall = 4,
    /// The cache was poisoned by an earlier panic.
    Poisoned = 5,
    /// Valid request the library does not support (yet).
    Unsupported = 6,
    /// An allocation sized by the caller failed (the message names the field or argument);
    /// nothing changed.
    OutOfMemory = 7,
    /// The configuration has a bad field (named in the message).
    InvalidConfig = 100,
    /// Not enough free or evictable pages in a tier.
    NoSpace = 200,
    /// A page id is out of range.
    PageOutOfRange = 201,
    /// A page is free (not held by anyone).
    PageNotAllocated = 202,
    /// A release would take a refcount below zero (double free).
    RefcountUnderflow = 203,
    /// The reserved padding page was used as a real page.
    PaddingPage = 204,
    /// An acquire would take a page's reference count past `UINT32_MAX`; nothing changed.
    RefcountOverflow = 205,
    /// No live sequence has the id.
    SeqNotFound = 300,
    /// A live sequence already has the id.
    SeqExists = 301,
    /// The sequence is in the wrong tier for the operation (e.g. swapped out).
    SeqWrongTier = 302,
    /// `kvs_cache_check` found a broken invariant.
    InvariantViolation = 400,
    /// The backend cannot be used here (library, symbol or device missing).
    BackendUnavailable = 500,
    /// Attention/KV-write/copy arguments are invalid (field named in the message).
    AttnInvalidArgument = 501,
    /// A backend runtime call failed.
    BackendFailure = 502,
}

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

try_from_raw!(kvs_dtype {
    F32,
    F16,
    Bf16,
    Fp8E4m3,
    Fp8E5m2,
    Int8,
    Int8PerTokenHead
});
try_from_raw!(kvs_tier { Device, Host });
try_from_raw!(kvs_group_kind {
    Full,
    SlidingWindow,
    ChunkedLocal,
    State,
});
try_from_raw!(kvs_state_mode { None, All, Align });
try_from_raw!(kvs_eviction_policy { Lru, Lfu, S3Fifo });
try_from_raw!(kvs_copy_kind {
    DeviceToDevice,
    DeviceToHost,
    HostToDevice
});
try_from_raw!(kvs_backend_kind { Cpu, Ascend });
try_from_raw!(kvs_index_type { Int32, Int64 });
try_from_raw!(kvs_huge_pages_mode { Advise, Collapse });
try_from_raw!(kvs_pool_store {
    ReadOnly,
    WriteThrough,
    OnDemotion
});

impl From<kvs_pool_store> for StorePolicy {
    fn from(p: kvs_pool_store) -> Self {
        match p {
            kvs_pool_store::ReadOnly => StorePolicy::ReadOnly,
            kvs_pool_store::WriteThrough => StorePolicy::WriteThrough,
            kvs_pool_store::OnDemotion => StorePolicy::OnDemotion,
        }
    }
}

impl From<PoolOp> for kvs_pool_op {
    fn from(o: PoolOp) -> Self {
        match o {
            PoolOp::Load => kvs_pool_op::Load,
            PoolOp::Store => kvs_pool_op::Store,
        }
    }
}

impl From<kvs_dtype> for DType {
    fn from(d: kvs_dtype) -> Self {
        match d {
            kvs_dtype::F32 => DType::F32,
            kvs_dtype::F16 => DType::F16,
            kvs_dtype::Bf16 => DType::BF16,
            kvs_dtype::Fp8E4m3 => DType::Fp8E4M3,
            kvs_dtype::Fp8E5m2 => DType::Fp8E5M2,
            kvs_dtype::Int8 => DType::Int8,
            kvs_dtype::Int8PerTokenHead => DType::Int8PerTokenHead,
        }
    }
}

impl From<DType> for kvs_dtype {
    fn from(d: DType) -> Self {
        match d {
            DType::F32 => kvs_dtype::F32,
            DType::F16 => kvs_dtype::F16,
            DType::BF16 => kvs_dtype::Bf16,
            DType::Fp8E4M3 => kvs_dtype::Fp8E4m3,
            DType::Fp8E5M2 => kvs_dtype::Fp8E5m2,
            DType::Int8 => kvs_dtype::Int8,
            DType::Int8PerTokenHead => kvs_dtype::Int8PerTokenHead,
        }
    }
}

impl From<kvs_eviction_policy> for EvictionPolicy {
    fn from(p: kvs_eviction_policy) -> Self {
        match p {
            kvs_eviction_policy::Lru => EvictionPolicy::Lru,
            kvs_eviction_policy::Lfu => EvictionPolicy::Lfu,
            kvs_eviction_policy::S3Fifo => EvictionPolicy::S3Fifo,
        }
    }
}

impl From<EvictionPolicy> for kvs_eviction_policy {
    fn from(p: EvictionPolicy) -> Self {
        match p {
            EvictionPolicy::Lru => kvs_eviction_policy::Lru,
            EvictionPolicy::Lfu => kvs_eviction_policy::Lfu,
            EvictionPolicy::S3Fifo => kvs_eviction_policy::S3Fifo,
        }
    }
}

impl From<kvs_state_mode> for StateMode {
    fn from(m: kvs_state_mode) -> Self {
        match m {
            kvs_state_mode::None => StateMode::None,
            kvs_state_mode::All => StateMode::All,
            kvs_state_mode::Align => StateMode::Align,
        }
    }
}

impl From<StateMode> for kvs_state_mode {
    fn from(m: StateMode) -> Self {
        match m {
            StateMode::None => kvs_state_mode::None,
            StateMode::All => kvs_state_mode::All,
            StateMode::Align => kvs_state_mode::Align,
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
        kvs_index_type,
        kvs_eviction_policy
    );

    #[test]
    fn every_enum_decodes_its_values_and_only_them() {
        use kvs_dtype::*;
        round_trip(
            &[F32, F16, Bf16, Fp8E4m3, Fp8E5m2, Int8, Int8PerTokenHead],
            "kvs_dtype",
        );
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
        round_trip(
            &[
                kvs_eviction_policy::Lru,
                kvs_eviction_policy::Lfu,
                kvs_eviction_policy::S3Fifo,
            ],
            "kvs_eviction_policy",
        );
    }

    #[test]
    fn core_round_trips() {
        for d in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Fp8E4M3,
            DType::Fp8E5M2,
            DType::Int8,
            DType::Int8PerTokenHead,
        ] {
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
