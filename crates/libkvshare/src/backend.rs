//! `kvs_backend`: a compute backend's lifetime and what it reports (`kvs_backend_new`,
//! `kvs_backend_new_cpu_team`, `kvs_backend_free`, `kvs_backend_num_threads`,
//! `kvs_backend_describe`).
//!
//! A backend works on host memory ([`Backend`]: the CPU) or on device memory
//! ([`DeviceBackend`]: Ascend); `Launcher` holds either, and the launches of `attn.rs` branch
//! only on that memory kind, never on which backend it is. The only place that names a concrete
//! backend is `kvs_backend_new`, which builds it.

use super::enums::{kvs_backend_kind, kvs_status};
use std::ffi::{c_char, c_uint, c_void};

use super::enums::decode;
use super::handle::{self, Handle};
use super::panic::guard;
use super::slice::{slice_mut, try_out, try_ref};

use crate::error::{Error, Result};
use kvshare_attention::ascend::{AscendBackend, AscendOptions};
use kvshare_attention::cpu::CpuBackend;
use kvshare_attention::team::Team;
use kvshare_attention::{Backend, BackendInfo, DeviceBackend};

/// A compute backend (`KVS_BACKEND_KIND_CPU` or `KVS_BACKEND_KIND_ASCEND`) that launches paged
/// attention, KV writes and page copies.
///
/// **Ownership:** create with `kvs_backend_new`, free with `kvs_backend_free`.
/// **Thread safety:** a backend may be used from several threads at once; the CPU backend runs
/// one call at a time on its thread pool and queues the others (one made by
/// `kvs_backend_new_cpu_team` runs each call on the host's team instead).
///
/// **Methods:** `kvs_backend_new`, `kvs_backend_new_cpu_team`, `kvs_backend_free`, `kvs_backend_num_threads`,
/// `kvs_backend_describe`, `kvs_attention_launch`, `kvs_attention_launch_scaled`,
/// `kvs_kv_write`, `kvs_kv_write_scaled`, `kvs_kv_copy`.
pub struct kvs_backend {
    _private: [u8; 0],
}

impl Handle for kvs_backend {
    type Rust = BackendBox;
    const NAME: &'static str = "backend";
}

/// The Rust object behind a `kvs_backend*`.
pub(crate) struct BackendBox {
    pub(crate) launcher: Launcher,
    num_threads: usize,
}

impl BackendBox {
    /// A CPU backend (its own pool or the host's team).
    fn cpu(cpu: CpuBackend) -> Self {
        BackendBox {
            num_threads: cpu.num_threads(),
            launcher: Launcher::Host(Box::new(cpu)),
        }
    }
}

/// The most threads a CPU backend takes (`options.num_threads`, `team.num_threads`).
const MAX_THREADS: usize = 1024;

/// `n` threads asked for in `field` (0: the machine's available parallelism, resolved by the
/// backend), refused above [`MAX_THREADS`].
fn thread_count(n: u32, field: &'static str) -> Result<usize> {
    let n = n as usize;
    if n > MAX_THREADS {
        return Err(Error::arg(field, format!("{n} is more than {MAX_THREADS}")));
    }
    Ok(n)
}

/// A backend by the memory its launches take: the one distinction the C launches make.
pub(crate) enum Launcher {
    /// Tensor pointers are host memory, turned into slices ([`Backend`]).
    Host(Box<dyn Backend>),
    /// Tensor pointers are device addresses, never read on the host ([`DeviceBackend`]).
    Device(Box<dyn DeviceBackend>),
}

impl Launcher {
    /// What the backend reports, whichever memory it takes.
    fn info(&self) -> &dyn BackendInfo {
        match self {
            Launcher::Host(b) => &**b,
            Launcher::Device(b) => &**b,
        }
    }
}

/// Options of `kvs_backend_new`. Zero-initialise and set what you need.
///
/// **Thread safety:** plain data, read only during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_backend_options {
    /// CPU: threads of the persistent pool (the calling thread included); 0 = the machine's
    /// available parallelism. At most 1024.
    pub num_threads: u32,
    /// Ascend: device id (ignored by the CPU backend).
    pub device_id: i32,
    /// Ascend: directory holding the CANN libraries, or NULL for the loader's search path
    /// (ignored by the CPU backend). NUL-terminated; read only during the call.
    pub library_dir: *const c_char,
}

/// What a host thread team runs: `work(arg)`.
pub type kvs_cpu_work_fn = Option<unsafe extern "C" fn(arg: *mut c_void)>;

/// A host's parallel region: calls `work(arg)` on up to `num_threads` threads (the calling
/// thread among them) and returns only after every call has returned. kvshare passes a non-NULL
/// `work` and `flags = 0`. This is the signature of `GOMP_parallel`, the entry point GCC emits
/// for `#pragma omp parallel`, exported by libgomp and by LLVM's and Intel's OpenMP runtimes:
/// a program (or PyTorch, whose Linux wheels run their CPU ops on libgomp) can pass it as is.
pub type kvs_cpu_parallel_fn = Option<
    unsafe extern "C" fn(
        work: kvs_cpu_work_fn,
        arg: *mut c_void,
        num_threads: c_uint,
        flags: c_uint,
    ),
>;

/// The host's thread team for `kvs_backend_new_cpu_team`.
///
/// **Thread safety:** plain data, read only during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvs_cpu_team {
    /// The team's parallel region (see `kvs_cpu_parallel_fn`); not NULL.
    pub parallel: kvs_cpu_parallel_fn,
    /// Threads to ask `parallel` for (the work is planned for this many); 0 = the machine's
    /// available parallelism. At most 1024.
    pub num_threads: u32,
}

impl kvs_backend {
    /// Creates a backend of `kind` (a `kvs_backend_kind` value). `options` may be NULL (all
    /// defaults). The CPU backend starts its persistent worker threads here; no call spawns
    /// threads later.
    ///
    /// **Ownership:** on success `*backend_out` owns a new backend; free it with
    /// `kvs_backend_free`. **Failure:** `KVS_STATUS_BACKEND_UNAVAILABLE` for Ascend when a CANN
    /// library or symbol is missing or the device cannot be set (the message names the library,
    /// symbol or device), `KVS_STATUS_INVALID_ARGUMENT` for an unknown kind or out-of-range
    /// option; `*backend_out` is untouched on error.
    ///
    /// Ascend: loads CANN from `options->library_dir`, else `$ASCEND_HOME_PATH/lib64`, else the
    /// loader's search path; calls `aclInit(NULL)` (an already initialised ACL is fine) and
    /// `aclrtSetDevice(options->device_id)` on the calling thread. `num_threads` is ignored.
    /// **Thread safety:** safe from any thread.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_backend_new(
        kind: u32,
        options: *const kvs_backend_options,
        backend_out: *mut *mut kvs_backend,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: `try_out`/`try_ref` refuse NULL; a non-NULL pointer is a valid out location
            // / options struct by the export contract (ffi/mod.rs).
            let out = unsafe { try_out(backend_out, "backend_out")? };
            let opts = if options.is_null() {
                None
            } else {
                // SAFETY: as above, for `options`.
                Some(unsafe { try_ref(options, "options")? })
            };
            let num_threads =
                thread_count(opts.map_or(0, |o| o.num_threads), "options.num_threads")?;
            let obj = match decode::<kvs_backend_kind>(kind, "kind")? {
                kvs_backend_kind::Cpu => BackendBox::cpu(CpuBackend::new(num_threads)?),
                kvs_backend_kind::Ascend => ascend_new(opts)?,
            };
            *out = handle::into_raw::<kvs_backend>(obj);
            Ok(())
        })
    }

    /// Creates a CPU backend that runs its work on the host's thread team (`team->parallel`)
    /// instead of starting threads of its own: in a process whose other work runs on an OpenMP
    /// team (PyTorch, vLLM's CPU kernels), a second set of threads competes with that team's
    /// spinning threads for the cores. Everything else is as `kvs_backend_new` with
    /// `KVS_BACKEND_KIND_CPU` (kernel path, `KVSHARE_CPU_ISA`); `kvs_backend_describe` says
    /// `the host's team`.
    ///
    /// A launch calls `team->parallel` from the launching thread, once per phase that has more
    /// than one item (the work items, then the merges of sequences split across threads), and
    /// takes the items from a shared counter inside `work`, so results do not depend on how
    /// many threads the team really runs: items it left undone run on the launching thread
    /// after `parallel` returns. Launches from several threads at once each call `parallel`
    /// (no queue, unlike the own pool). `parallel` must not call `work` after it has returned;
    /// it must be callable from every thread that launches on this backend, for as long as the
    /// backend lives.
    ///
    /// **Ownership:** on success `*backend_out` owns a new backend; free it with
    /// `kvs_backend_free`. **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `team`,
    /// `team->parallel` or `backend_out`; `KVS_STATUS_INVALID_ARGUMENT` for more than 1024
    /// threads; `KVS_STATUS_BACKEND_UNAVAILABLE` when `KVSHARE_CPU_ISA` names a path this CPU
    /// lacks; `*backend_out` is untouched on error. **Thread safety:** safe from any thread.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_backend_new_cpu_team(
        team: *const kvs_cpu_team,
        backend_out: *mut *mut kvs_backend,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: `try_out`/`try_ref` refuse NULL; non-NULL pointers are a valid out location
            // and team struct by the export contract (ffi/mod.rs).
            let out = unsafe { try_out(backend_out, "backend_out")? };
            // SAFETY: as above, for `team`.
            let t = unsafe { try_ref(team, "team")? };
            let parallel = t.parallel.ok_or(Error::NullArgument("team.parallel"))?;
            let threads = thread_count(t.num_threads, "team.num_threads")?;
            // SAFETY: the caller keeps `kvs_cpu_parallel_fn`'s contract (documented above),
            // which is `Team::new`'s.
            let cpu = CpuBackend::on_team(unsafe { Team::new(parallel, threads) })?;
            *out = handle::into_raw::<kvs_backend>(BackendBox::cpu(cpu));
            Ok(())
        })
    }

    /// Frees a backend (its worker threads are joined). NULL is a no-op.
    ///
    /// Ascend: frees the backend's device workspaces, so every stream it launched on must be
    /// synchronised first (kvshare never synchronises a stream itself).
    ///
    /// **Ownership:** `backend` must come from `kvs_backend_new` and is invalid afterwards.
    /// **Thread safety:** no other call may be using `backend`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_backend_free(backend: *mut kvs_backend) {
        let _ = guard(|| {
            // SAFETY: `free` ignores NULL; a non-NULL handle came from `kvs_backend_new` as a
            // `BackendBox` (the `Handle` impl ties the two) and, by this function's contract, is
            // used by no other call.
            unsafe { handle::free(backend) };
            Ok(())
        });
    }

    /// Threads the backend computes on (CPU: pool size, the calling thread included).
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL argument; `*num_threads_out` is
    /// untouched on error. **Thread safety:** safe from any thread.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_backend_num_threads(
        backend: *const kvs_backend,
        num_threads_out: *mut u32,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: NULL is refused; a live handle from `kvs_backend_new` and a writable out
            // location otherwise (export contract).
            let b = unsafe { handle::borrow(backend)? };
            // SAFETY: as above, for `num_threads_out`.
            let out = unsafe { try_out(num_threads_out, "num_threads_out")? };
            *out = u32::try_from(b.num_threads).unwrap_or(u32::MAX); // at most 1024
            Ok(())
        })
    }

    /// Writes a one-line description of the backend into `buf` (NUL-terminated): its kind and,
    /// for Ascend, the device, the CANN libraries loaded and the op versions found and used
    /// (e.g. `aclnnFusedInferAttentionScore found: V2 (libopapi_transformer.so), V3 (...);
    /// using V3`), then the backend's own shape limits (`limits: head_dim <= 512, heads <= 4096,
    /// heads per kv head <= 64, ...` for Ascend; 1024 and 4096 for the CPU), for logs and support. `*len_out` gets the length without the NUL.
    /// `(NULL, 0)` only measures.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `backend` or `len_out` (or a NULL `buf`
    /// with `buf_len > 0`); `KVS_STATUS_BUFFER_TOO_SMALL` when `buf_len` is not more than the
    /// length (nothing is written). **Thread safety:** safe from any thread.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_backend_describe(
        backend: *const kvs_backend,
        buf: *mut c_char,
        buf_len: usize,
        len_out: *mut usize,
    ) -> kvs_status {
        guard(|| {
            // SAFETY: NULL is refused; a live handle and a writable out location otherwise
            // (export contract).
            let b = unsafe { handle::borrow(backend)? };
            // SAFETY: as above, for `len_out`.
            let out = unsafe { try_out(len_out, "len_out")? };
            let info = b.launcher.info();
            let text = format!("{}; {}", info.describe(), info.limits()).replace('\0', " ");
            if buf.is_null() && buf_len == 0 {
                *out = text.len();
                return Ok(());
            }
            // SAFETY: `slice_mut` refuses NULL with a length; `buf` holds `buf_len` writable
            // bytes that nothing else touches during the call (export contract).
            let dst = unsafe { slice_mut(buf.cast::<u8>(), buf_len, "buf")? };
            if dst.len() <= text.len() {
                return Err(Error::Cache(kvshare_core::Error::BufferTooSmall {
                    what: "buf",
                    needed: text.len() + 1,
                    capacity: dst.len(),
                }));
            }
            dst[..text.len()].copy_from_slice(text.as_bytes());
            dst[text.len()] = 0;
            *out = text.len();
            Ok(())
        })
    }
}

/// The Ascend backend from the options (`library_dir` read here, during the call).
fn ascend_new(opts: Option<&kvs_backend_options>) -> Result<BackendBox> {
    let library_dir = match opts.map(|o| o.library_dir) {
        Some(p) if !p.is_null() => {
            // SAFETY: non-NULL, and `kvs_backend_options.library_dir` is documented as a
            // NUL-terminated string valid during the call.
            let c = unsafe { std::ffi::CStr::from_ptr(p) };
            let s = c
                .to_str()
                .map_err(|_| Error::arg("options.library_dir", "is not valid UTF-8".to_string()))?;
            Some(std::path::PathBuf::from(s))
        }
        _ => None,
    };
    let asc = AscendBackend::new(&AscendOptions {
        device_id: opts.map_or(0, |o| o.device_id),
        library_dir,
    })?;
    Ok(BackendBox {
        num_threads: 0,
        launcher: Launcher::Device(Box::new(asc)),
    })
}
