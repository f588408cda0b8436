//! Per-stream, grow-only device workspaces for the aclnn two-phase calls, and the backend's
//! other long-lived device buffer (the causal mask).
//!
//! Lifetime rule: a launch enqueued on a stream may still read its workspace after the launch
//! call returned. Work on one stream runs in order, so the next launch on the same stream can
//! reuse the same buffer; a larger request allocates a new buffer and *retires* the old one
//! instead of freeing it (work already queued may still use it). Retired and current buffers are
//! freed only when the backend is dropped, and the C API documents that the caller synchronises
//! its streams before `kvs_backend_free`. Nothing is ever freed with work in flight, and no
//! stream is ever synchronised by kvshare.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use super::loader::Cann;
use super::rt::check;
use super::sys::*;
use crate::error::{Error, Result};

/// A device allocation owned by the backend (address kept as an integer: it is never
/// dereferenced on the host).
#[derive(Debug, Clone, Copy)]
struct DevBuf {
    addr: usize,
    size: u64,
}

#[derive(Default)]
struct State {
    /// Current workspace of each stream (key: the `aclrtStream` address; 0 = default stream).
    current: HashMap<usize, DevBuf>,
    /// Outgrown workspaces, freed on drop.
    retired: Vec<DevBuf>,
    /// Counters for `describe`.
    allocations: u64,
}

/// The workspaces of one backend.
pub struct Workspaces {
    cann: Arc<Cann>,
    state: Mutex<State>,
}

/// Allocates `size` bytes of device memory (`ACL_MEM_MALLOC_HUGE_FIRST`).
pub fn dev_alloc(cann: &Cann, size: u64) -> Result<usize> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer valid.
    let code = unsafe { (cann.malloc)(&mut p, size as usize, ACL_MEM_MALLOC_HUGE_FIRST) };
    check(cann, code, "aclrtMalloc")?;
    if p.is_null() {
        return Err(Error::BackendFailure(format!(
            "aclrtMalloc({size}) returned NULL"
        )));
    }
    Ok(p as usize)
}

impl Workspaces {
    /// No buffers yet.
    pub fn new(cann: Arc<Cann>) -> Self {
        Workspaces {
            cann,
            state: Mutex::new(State::default()),
        }
    }

    /// A workspace of at least `need` bytes for `stream`: `(address, size)`; `(NULL, 0)` when
    /// `need` is 0.
    pub fn get(&self, stream: AclrtStream, need: u64) -> Result<(*mut c_void, u64)> {
        if need == 0 {
            return Ok((std::ptr::null_mut(), 0));
        }
        let mut st = self
            .state
            .lock()
            .map_err(|_| Error::BackendFailure("workspace lock poisoned".into()))?;
        let key = stream as usize;
        if let Some(b) = st.current.get(&key) {
            if b.size >= need {
                return Ok((b.addr as *mut c_void, b.size));
            }
        }
        // Grow: at least double, rounded up to 64 KiB, so a growing batch allocates rarely.
        let old = st.current.get(&key).map_or(0, |b| b.size);
        let size = need.max(old.saturating_mul(2)).div_ceil(1 << 16) << 16;
        let addr = dev_alloc(&self.cann, size)?;
        st.allocations += 1;
        if let Some(prev) = st.current.insert(key, DevBuf { addr, size }) {
            st.retired.push(prev); // queued work may still use it
        }
        Ok((addr as *mut c_void, size))
    }

    /// `(streams with a workspace, bytes held, allocations made)`.
    pub fn stats(&self) -> (usize, u64, u64) {
        match self.state.lock() {
            Ok(st) => (
                st.current.len(),
                st.current
                    .values()
                    .chain(st.retired.iter())
                    .map(|b| b.size)
                    .sum(),
                st.allocations,
            ),
            Err(_) => (0, 0, 0),
        }
    }
}

impl Drop for Workspaces {
    fn drop(&mut self) {
        let st = match self.state.get_mut() {
            Ok(s) => std::mem::take(s),
            Err(p) => std::mem::take(p.into_inner()),
        };
        for b in st.current.values().chain(st.retired.iter()) {
            // SAFETY: allocated by aclrtMalloc here, freed once; the caller synchronised its
            // streams before freeing the backend (documented contract).
            unsafe { (self.cann.free)(b.addr as *mut c_void) };
        }
    }
}
