//! Device copies of the antiquant scales and offsets FIA reads for an int8 cache.
//!
//! kvshare's int8 format ([`ChannelScales`]) holds host `f32` arrays and a per-tensor scale per
//! cache; FIA's `keyAntiquantScale`/`valueAntiquantScale` (and the offsets) are **device**
//! tensors of the query's dtype (per-channel mode, `keyAntiquantMode = valueAntiquantMode = 0`).
//! A set is made on first use: each channel scale times its cache's per-tensor scale, every
//! value rounded once to the query's dtype (fp16 or bf16, to nearest), written with
//! `aclrtMalloc` + a synchronous `aclrtMemcpy` (no caller stream is used), then reused by every
//! launch with the same contents. An engine passes the same arrays for a layer at every step,
//! so the sets are one per layer (and dtype).
//!
//! Lifetime: as the causal mask and the workspaces, a set is never freed while the backend
//! lives (queued launches may still read it) and is freed when the backend is dropped, after
//! the caller synchronised its streams. At most [`MAX_SETS`] distinct sets are kept; a launch
//! that would need another is refused (`KVS_STATUS_UNSUPPORTED`), nothing launched.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use half::{bf16, f16};

use super::loader::Cann;
use super::plan::DEVICE_ALIGN;
use super::rt::check;
use super::sys::*;
use super::workspace::dev_alloc;
use crate::error::{Error, Result};
use crate::{ChannelScales, DType, KvScales};

/// Most distinct scale sets one backend keeps on the device.
pub(crate) const MAX_SETS: usize = 4096;

/// The device tensors' addresses of one set: scales of K and V, and their offsets when the
/// cache has them (each `num_kv_heads * head_dim` elements of the query's dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AntiquantSet {
    pub(crate) k_scale: usize,
    pub(crate) v_scale: usize,
    pub(crate) offsets: Option<(usize, usize)>,
}

/// The sets of one backend, by contents (the host bytes written to the device).
#[derive(Default)]
pub(crate) struct AntiquantSets {
    sets: Mutex<HashMap<Vec<u8>, (usize, AntiquantSet)>>,
}

/// The values of one set in the query's dtype, as the bytes the device gets: K scales, V scales,
/// then (when present) K offsets and V offsets, each part padded to [`DEVICE_ALIGN`] bytes.
/// Returns the bytes, the part stride in bytes and whether offsets are present.
fn host_bytes(
    dtype: DType,
    per_tensor: KvScales,
    ch: &ChannelScales<'_>,
    n: usize,
) -> Result<(Vec<u8>, usize, bool)> {
    let conv: fn(f32) -> u16 = match dtype {
        DType::F16 => |x| f16::from_f32(x).to_bits(),
        DType::BF16 => |x| bf16::from_f32(x).to_bits(),
        d => {
            return Err(Error::Unsupported(format!(
                "Ascend backend: antiquant scales for a {d:?} query (fp16 or bf16 only)"
            )))
        }
    };
    let stride = (n * 2).div_ceil(DEVICE_ALIGN) * DEVICE_ALIGN;
    let scaled = |c: &[f32], s: f32| -> Vec<f32> { c[..n].iter().map(|x| x * s).collect() };
    let mut parts = vec![scaled(ch.k, per_tensor.k), scaled(ch.v, per_tensor.v)];
    let offsets = ch.k_offsets.is_some() || ch.v_offsets.is_some();
    if offsets {
        // FIA takes both offsets or neither: a missing one is zeros.
        for o in [ch.k_offsets, ch.v_offsets] {
            parts.push(o.map_or_else(|| vec![0.0; n], |o| o[..n].to_vec()));
        }
    }
    let mut bytes = vec![0u8; stride * parts.len()];
    for (i, part) in parts.iter().enumerate() {
        for (j, &x) in part.iter().enumerate() {
            let at = i * stride + 2 * j;
            bytes[at..at + 2].copy_from_slice(&conv(x).to_le_bytes());
        }
    }
    // The key names the dtype too: equal bits of fp16 and bf16 are different numbers.
    bytes.push(dtype as u8);
    Ok((bytes, stride, offsets))
}

impl AntiquantSets {
    /// The device set for these scales under a `dtype` query, made on first use.
    pub(crate) fn get(
        &self,
        cann: &Cann,
        dtype: DType,
        per_tensor: KvScales,
        ch: &ChannelScales<'_>,
        n: usize,
    ) -> Result<AntiquantSet> {
        let (mut bytes, stride, offsets) = host_bytes(dtype, per_tensor, ch, n)?;
        let mut sets = self
            .sets
            .lock()
            .map_err(|_| Error::BackendFailure("antiquant scale lock poisoned".into()))?;
        if let Some(&(_, set)) = sets.get(&bytes) {
            return Ok(set);
        }
        if sets.len() >= MAX_SETS {
            return Err(Error::Unsupported(format!(
                "Ascend backend: more than {MAX_SETS} distinct int8 channel-scale sets on one \
                 backend (kept on the device until kvs_backend_free); an engine passes one set \
                 per layer"
            )));
        }
        let len = bytes.len() - 1; // without the dtype tag
        let addr = dev_alloc(cann, len as u64)?;
        // SAFETY: `addr` holds `len` bytes, `bytes` at least `len`.
        let code = unsafe {
            (cann.memcpy)(
                addr as *mut c_void,
                len,
                bytes.as_ptr().cast(),
                len,
                ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        if let Err(e) = check(cann, code, "aclrtMemcpy") {
            // SAFETY: allocated just above, never handed to a launch.
            unsafe { (cann.free)(addr as *mut c_void) };
            return Err(e);
        }
        let set = AntiquantSet {
            k_scale: addr,
            v_scale: addr + stride,
            offsets: offsets.then_some((addr + 2 * stride, addr + 3 * stride)),
        };
        bytes.shrink_to_fit();
        sets.insert(bytes, (addr, set));
        Ok(set)
    }

    /// Frees every set (the backend is being dropped; its streams were synchronised).
    pub(crate) fn free_all(&mut self, cann: &Cann) {
        if let Ok(sets) = self.sets.get_mut() {
            for (_, (addr, _)) in sets.drain() {
                // SAFETY: allocated by `dev_alloc`; the caller synchronised its streams before
                // freeing the backend (documented contract).
                unsafe { (cann.free)(addr as *mut c_void) };
            }
        }
    }

    /// How many sets are on the device.
    pub(crate) fn len(&self) -> usize {
        self.sets.lock().map_or(0, |s| s.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_fold_the_per_tensor_scale_and_pad_each_part() {
        let k = [0.5f32, 0.25, 2.0];
        let v = [1.0f32, 3.0, 0.125];
        let ko = [1.0f32, -2.5, 7.0];
        let ch = ChannelScales {
            k: &k,
            v: &v,
            k_offsets: Some(&ko),
            v_offsets: None,
        };
        let (b, stride, off) = host_bytes(DType::F16, KvScales::new(2.0, 0.5), &ch, 3).unwrap();
        assert_eq!((stride, off, b.len()), (32, true, 4 * 32 + 1));
        let at = |part: usize, j: usize| {
            let i = part * stride + 2 * j;
            f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
        };
        assert_eq!([at(0, 0), at(0, 1), at(0, 2)], [1.0, 0.5, 4.0]); // K times k_scale
        assert_eq!([at(1, 0), at(1, 1), at(1, 2)], [0.5, 1.5, 0.0625]); // V times v_scale
        assert_eq!([at(2, 0), at(2, 1), at(2, 2)], [1.0, -2.5, 7.0]); // offsets as they are
        assert_eq!([at(3, 0), at(3, 1), at(3, 2)], [0.0; 3]); // a missing offset is 0
        let sym = ChannelScales::symmetric(&k, &v);
        let (b16, _, off) = host_bytes(DType::BF16, KvScales::ONE, &sym, 3).unwrap();
        assert!(!off);
        assert_eq!(b16.len(), 2 * 32 + 1);
        assert_ne!(b16.last(), b.last(), "the dtype is part of the key");
        assert!(host_bytes(DType::F32, KvScales::ONE, &sym, 3).is_err());
    }
}
