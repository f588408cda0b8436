//! Backends whose launches take **device memory**: the [`DeviceBackend`] trait and the
//! validated launches it receives ([`DeviceAttnBatch`], [`DeviceKvWriteBatch`],
//! [`DeviceCopyBatch`]).
//!
//! A host backend ([`Backend`](super::Backend)) gets slices; a device backend gets addresses it
//! never reads on the host (plain `usize`, so this layer stays free of raw pointers) plus the
//! host arrays that steer a launch (context lengths, query starts, the copy list), which are
//! checked here with the same shared checks as the host path. The C layer builds one of these
//! from its `#[repr(C)]` args without knowing which device backend it has; today that is
//! [`ascend::AscendBackend`](super::ascend::AscendBackend).
//!
//! As with the host batches, a batch exists only after validation: what a backend receives has
//! passed every check that needs no device.

use super::params::{
    check_host_arrays, AttnParams, AttnSpans, CopyParams, KvWriteParams, PageCopy, SeqSpan,
};
use super::{check_attn_scales, BackendInfo, ChannelScales, Result};
use crate::error::Error;

/// The device memory of one attention launch (query, output, caches, block table): device
/// addresses, none of them 0.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAttn {
    /// `[num_tokens, num_heads, head_dim]` query.
    pub query: usize,
    /// Output, same shape.
    pub output: usize,
    /// K cache.
    pub key_cache: usize,
    /// V cache.
    pub value_cache: usize,
    /// int32 block table.
    pub block_table: usize,
}

/// The device memory of one KV write: device addresses, none of them 0.
#[derive(Debug, Clone, Copy)]
pub struct DeviceKvWrite {
    /// New keys `[num_tokens, kv_heads, head_dim]`.
    pub key: usize,
    /// New values.
    pub value: usize,
    /// K cache.
    pub key_cache: usize,
    /// V cache.
    pub value_cache: usize,
    /// Slot mapping `[num_tokens]`.
    pub slot_mapping: usize,
    /// Whether the slot mapping is int64 (else int32).
    pub slots_i64: bool,
}

/// The caches of one page copy: device K/V (device addresses) and host K/V (host addresses of
/// page-locked memory, e.g. from `aclrtMallocHost`; 0 when there are no host pages).
#[derive(Debug, Clone, Copy)]
pub struct DeviceCopy {
    /// Device K cache.
    pub key_cache: usize,
    /// Device V cache.
    pub value_cache: usize,
    /// Host K cache.
    pub host_key_cache: usize,
    /// Host V cache.
    pub host_value_cache: usize,
}

/// A validated attention launch on device memory. Built only by [`DeviceAttnBatch::new`].
#[derive(Debug)]
pub struct DeviceAttnBatch<'a> {
    /// The validated params.
    pub params: AttnParams,
    /// Element counts of every tensor of the launch.
    pub spans: AttnSpans,
    /// Per-sequence spans, from the host arrays.
    pub seqs: Vec<SeqSpan>,
    /// The device addresses.
    pub mem: DeviceAttn,
    /// The per-channel scales of an int8 cache: **host** arrays, as on the CPU backend (a
    /// backend that needs them on the device makes its own copy).
    pub channel_scales: Option<ChannelScales<'a>>,
}

impl<'a> DeviceAttnBatch<'a> {
    /// Validates the params, the host arrays (`context_lens`, `query_start_loc`, of the
    /// lengths [`AttnParams::validate`] gives) and the channel scales (as
    /// [`AttnBatch::new`](super::AttnBatch::new) does). The block table is on the device and is
    /// not read. Nothing is launched.
    pub fn new(
        params: AttnParams,
        mem: DeviceAttn,
        context_lens: &[i32],
        query_start_loc: Option<&[i32]>,
        channel_scales: Option<ChannelScales<'a>>,
    ) -> Result<Self> {
        let spans = params.validate()?;
        check_attn_scales(&params, channel_scales)?;
        let seqs = check_host_arrays(&params, context_lens, query_start_loc, None)?;
        Ok(DeviceAttnBatch {
            params,
            spans,
            seqs,
            mem,
            channel_scales,
        })
    }
}

/// A validated KV write on device memory. Built only by [`DeviceKvWriteBatch::new`].
#[derive(Debug)]
pub struct DeviceKvWriteBatch {
    /// The validated params.
    pub params: KvWriteParams,
    /// Elements of the new `key` (and of `value`).
    pub src_elems: usize,
    /// The device addresses.
    pub mem: DeviceKvWrite,
}

impl DeviceKvWriteBatch {
    /// Validates the params (the slot mapping is on the device and is not read).
    pub fn new(params: KvWriteParams, mem: DeviceKvWrite) -> Result<Self> {
        let (src_elems, _cache) = params.validate()?;
        Ok(DeviceKvWriteBatch {
            params,
            src_elems,
            mem,
        })
    }
}

/// A validated page-copy list on device (and page-locked host) memory. Built only by
/// [`DeviceCopyBatch::new`].
#[derive(Debug)]
pub struct DeviceCopyBatch<'a> {
    /// The validated params.
    pub params: CopyParams,
    /// The copies, each checked against its tiers.
    pub copies: &'a [PageCopy],
    /// The caches' addresses.
    pub mem: DeviceCopy,
    /// Bytes of each device cache.
    pub device_bytes: usize,
    /// Bytes of each host cache (0: none).
    pub host_bytes: usize,
}

impl<'a> DeviceCopyBatch<'a> {
    /// Validates the params and every copy, then the addresses: 0 stands for NULL and is refused
    /// (naming the field) for the device caches, and for the host caches when
    /// `num_host_pages > 0`; without host pages the host addresses are ignored and set to 0.
    pub fn new(params: CopyParams, copies: &'a [PageCopy], mut mem: DeviceCopy) -> Result<Self> {
        let (device, host) = params.validate()?;
        params.check_copies(copies)?;
        if params.num_host_pages == 0 {
            mem.host_key_cache = 0;
            mem.host_value_cache = 0;
        }
        let with_host = params.num_host_pages > 0;
        for (field, addr, needed) in [
            ("key_cache", mem.key_cache, true),
            ("value_cache", mem.value_cache, true),
            ("host_key_cache", mem.host_key_cache, with_host),
            ("host_value_cache", mem.host_value_cache, with_host),
        ] {
            if needed && addr == 0 {
                return Err(Error::NullArgument(field));
            }
        }
        let esz = params.cache.dtype.size_bytes();
        Ok(DeviceCopyBatch {
            params,
            copies,
            mem,
            device_bytes: device * esz,
            host_bytes: host * esz,
        })
    }
}

/// A compute backend whose launches take device memory and enqueue on a caller's stream (an
/// opaque address; 0 is the device's default stream). Receives only validated batches; a
/// backend must not launch anything when it returns an error it could have detected before
/// starting (its own limits, alignment).
///
/// **Thread safety:** `Send + Sync`; launches may come from several threads.
pub trait DeviceBackend: BackendInfo {
    /// Checks that `addr`, a device address given for `field`, is one this backend's launches
    /// accept (alignment); the message names the field and the requirement.
    fn check_address(&self, field: &'static str, addr: usize) -> Result<()>;
    /// Paged attention; enqueues the writes of every query token's output rows.
    fn attention(&self, batch: DeviceAttnBatch<'_>, stream: usize) -> Result<()>;
    /// Scatters new K and V into the caches by slot.
    fn kv_write(&self, write: DeviceKvWriteBatch, stream: usize) -> Result<()>;
    /// Copies pages (or a prefix of a page's slots) in order, within and between tiers.
    fn copy_pages(&self, batch: DeviceCopyBatch<'_>, stream: usize) -> Result<()>;
}
