//! `kvs_cpu_huge_pages`: 2 MiB pages for a host KV cache the engine allocated
//! (`attention::cpu::huge_pages`).

use super::enums::{kvs_huge_pages_mode, kvs_status};
use std::ffi::c_void;

use super::enums::decode;
use super::panic::guard;
use super::slice::opt_out;

use crate::error::Error;
use kvshare_attention::cpu::huge_pages::{back_with_huge_pages, HugePages};

/// What `kvs_cpu_huge_pages` did.
///
/// **Thread safety:** plain data.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kvs_huge_pages_report {
    /// Bytes of the range in whole aligned 2 MiB pages: what was advised (0 when the range
    /// holds none).
    pub advised_bytes: usize,
    /// Bytes of the range backed by huge pages after the call (its PMD-mapped pages, by a walk
    /// of the range's page tables, `PAGEMAP_SCAN`, on Linux 6.7+; else `AnonHugePages` in
    /// `/proc/self/smaps`); less than `advised_bytes` when the kernel had none to give.
    pub huge_bytes: usize,
}

impl kvs_huge_pages_report {
    /// Asks Linux to back the host memory `[base, base + bytes)` (a KV cache the CPU backend
    /// reads) with 2 MiB transparent huge pages: the decode kernel reads 256 bytes of a kv head
    /// every slot, so on 4 KiB pages a long sequence misses the TLB at almost every read
    /// (decode up to 1.3x faster on huge pages, measured on Zen 4 in a VM). Needed where
    /// `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise`, the common default. Only the
    /// whole aligned 2 MiB pages inside the range are advised; memory outside it is untouched,
    /// and the contents never change. `report_out` is optional (NULL: not written).
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `base`; `KVS_STATUS_INVALID_ARGUMENT`
    /// for `bytes == 0`, a range that wraps around or is not wholly mapped in this process (a
    /// hole anywhere, even in a range holding no whole 2 MiB page), or a `mode` that is no
    /// `kvs_huge_pages_mode`; `KVS_STATUS_UNSUPPORTED` where any of the range is not anonymous
    /// memory (a file mapping, `/dev/shm` and memfd files included; private and shared
    /// anonymous memory are fine), where `/proc/self/maps` cannot be read to check that, or
    /// where the kernel has no transparent huge pages (or, for
    /// `KVS_HUGE_PAGES_MODE_COLLAPSE`, no `MADV_COLLAPSE`: the advice stays). All but the
    /// kernel's refusals are found before anything changes; `*report_out` is untouched on
    /// error. No huge page free is not a failure: `huge_bytes` says what the range got.
    /// **Thread safety:** safe from any thread; the engine may read and write the range
    /// meanwhile (but not map or unmap parts of it).
    #[no_mangle]
    pub unsafe extern "C" fn kvs_cpu_huge_pages(
        base: *const c_void,
        bytes: usize,
        mode: u32,
        report_out: *mut kvs_huge_pages_report,
    ) -> kvs_status {
        guard(|| {
            if base.is_null() {
                return Err(Error::NullArgument("base"));
            }
            let mode = match decode::<kvs_huge_pages_mode>(mode, "mode")? {
                kvs_huge_pages_mode::Advise => HugePages::Advise,
                kvs_huge_pages_mode::Collapse => HugePages::Collapse,
            };
            // Checked before the range is advised: a refused call changes nothing.
            // SAFETY: NULL or a writable `kvs_huge_pages_report` (export contract).
            let out = unsafe { opt_out(report_out, "report_out")? };
            // The address is only a number to madvise: nothing is read or written through it.
            let r = back_with_huge_pages(base as usize, bytes, mode)?;
            if let Some(out) = out {
                *out = kvs_huge_pages_report {
                    advised_bytes: r.advised_bytes,
                    huge_bytes: r.huge_bytes,
                };
            }
            Ok(())
        })
    }
}
