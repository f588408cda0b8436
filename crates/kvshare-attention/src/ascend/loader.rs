//! Run-time loading of CANN with `dlopen`: nothing links against CANN at build time.
//!
//! Order (the op libraries depend on the runtime's symbols; docs/ascend.md):
//! 1. `libascendcl.so`, then `libnnopbase.so`, both `RTLD_NOW | RTLD_GLOBAL` (the op libraries
//!    resolve runtime and tensor symbols from them). Both are required.
//! 2. The op libraries `libopapi.so`, `libopapi_transformer.so`, `libcust_opapi.so`, each
//!    optional, `RTLD_NOW | RTLD_LOCAL`. Every `aclnn*` symbol is looked up in that order and
//!    the first library that has it wins.
//!
//! Where: the explicit directory of the backend options when given (and only there, so tests
//! and users get exactly the libraries they point at); otherwise `$ASCEND_HOME_PATH/lib64`, and,
//! for `libcust_opapi.so`, also `$ASCEND_HOME_PATH/opp/vendors/*/op_api/lib`; otherwise the
//! dynamic loader's own search path (`LD_LIBRARY_PATH`, `ld.so.cache`).
//!
//! A loaded set is kept for the life of the process (CANN is not meant to be unloaded), one per
//! directory, in the process-wide registry [`load`]; a failed load closes what it opened and is
//! not cached, so a fixed installation can be retried.

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use std::sync::LazyLock;

use super::sys::*;
use crate::error::{Error, Result};

/// A `dlopen` handle (closed on drop only while a load is still failing; see [`Cann`]).
struct Lib {
    handle: *mut c_void,
    path: String,
}

// SAFETY: a dlopen handle is a process-wide token, usable and closable from any thread.
unsafe impl Send for Lib {}
// SAFETY: `Lib` is not changed after loading, and dlsym on a shared handle is thread-safe.
unsafe impl Sync for Lib {}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl Lib {
    fn open(path: &str, global: bool) -> std::result::Result<Lib, String> {
        let c = CString::new(path).map_err(|_| format!("{path}: path contains NUL"))?;
        let flags = libc::RTLD_NOW
            | if global {
                libc::RTLD_GLOBAL
            } else {
                libc::RTLD_LOCAL
            };
        // SAFETY: a valid C string; dlopen runs the library's constructors, which is the point.
        let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
        if handle.is_null() {
            return Err(dlerror_text());
        }
        Ok(Lib {
            handle,
            path: path.to_string(),
        })
    }

    fn sym(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: handle is a live dlopen handle; name is a C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    fn file_name(&self) -> &str {
        Path::new(&self.path)
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or(&self.path)
    }
}

/// Which `aclnnFusedInferAttentionScore` entry point the backend calls.
#[derive(Debug, Clone, Copy)]
pub enum FiaFn {
    /// `aclnnFusedInferAttentionScoreV2GetWorkspaceSize`.
    V2(FiaV2GetWs),
    /// `aclnnFusedInferAttentionScoreV3GetWorkspaceSize`.
    V3(FiaV3GetWs),
    /// `aclnnFusedInferAttentionScoreV4GetWorkspaceSize`.
    V4(FiaV4GetWs),
}

impl FiaFn {
    /// 2, 3 or 4.
    pub fn version(&self) -> u32 {
        match self {
            FiaFn::V2(_) => 2,
            FiaFn::V3(_) => 3,
            FiaFn::V4(_) => 4,
        }
    }
}

/// The order in which FIA versions are preferred (the first found is used). V3 first: it is what
/// torch_npu's op-plugin dispatches to on CANN >= 8.1.RC1, so it is the path vLLM-Ascend
/// exercises most; V4 (a superset: its extra inputs are passed as NULL/0) next, for a CANN that
/// no longer ships V3; V2 last, the oldest paged version (CANN < 8.1.RC1; MindIE's aclnn path).
/// `KVS_ASCEND_FIA_VERSION=2|3|4` forces one version (the validation script tries each).
pub(crate) const FIA_PREFERENCE: [u32; 3] = [3, 4, 2];

/// One resolved op: its two halves and the library that provided them.
#[derive(Debug, Clone, Copy)]
pub struct Op<F> {
    /// The GetWorkspaceSize half.
    pub get_ws: F,
    /// The execute half.
    pub exec: AclnnExecute,
}

/// The loaded CANN libraries and every function the backend calls.
pub struct Cann {
    pub init: AclInit,
    pub set_device: AclrtSetDevice,
    pub get_device: AclrtGetDevice,
    pub malloc: AclrtMalloc,
    pub free: AclrtFree,
    pub memcpy: AclrtMemcpy,
    pub memcpy_async: AclrtMemcpyAsync,
    pub recent_err_msg: Option<AclGetRecentErrMsg>,
    pub create_tensor: AclCreateTensor,
    pub create_int_array: AclCreateIntArray,
    pub create_tensor_list: AclCreateTensorList,
    pub destroy_tensor: AclDestroyTensor,
    pub destroy_int_array: AclDestroyIntArray,
    pub destroy_tensor_list: AclDestroyTensorList,
    pub destroy_executor: AclDestroyAclOpExecutor,
    /// The FIA version used (see `FIA_PREFERENCE`).
    pub fia: Op<FiaFn>,
    /// `aclnnScatterPaKvCache`, when present.
    pub scatter: Option<Op<ScatterPaKvCacheGetWs>>,
    /// Human-readable inventory: libraries loaded, op versions found and where.
    pub inventory: String,
    _libs: Vec<Lib>,
}

/// Where to look for the libraries.
fn search_dir(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(d) = explicit {
        return Some(d.to_path_buf());
    }
    std::env::var_os("ASCEND_HOME_PATH")
        .filter(|s| !s.is_empty())
        .map(|h| PathBuf::from(h).join("lib64"))
}

fn lib_path(dir: Option<&Path>, name: &str) -> String {
    match dir {
        Some(d) => d.join(name).to_string_lossy().into_owned(),
        None => name.to_string(),
    }
}

/// Custom op packages: `$ASCEND_HOME_PATH/opp/vendors/<name>/op_api/lib/libcust_opapi.so`.
fn vendor_cust_libs() -> Vec<String> {
    let Some(home) = std::env::var_os("ASCEND_HOME_PATH") else {
        return Vec::new();
    };
    let vendors = PathBuf::from(home).join("opp/vendors");
    let mut out: Vec<String> = std::fs::read_dir(vendors)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let p = e.ok()?.path().join("op_api/lib/libcust_opapi.so");
            p.is_file().then(|| p.to_string_lossy().into_owned())
        })
        .collect();
    out.sort();
    out
}

/// # Safety
/// `p` must be the address of a function whose C signature is `F`.
unsafe fn cast<F: Copy>(p: *mut c_void) -> F {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller guarantees `p` is the address of a function of type `F`, a function
    // pointer type of the size of a pointer, so its bits are that function pointer.
    unsafe { std::mem::transmute_copy(&p) }
}

fn env_fia_version() -> Result<Option<u32>> {
    match std::env::var("KVS_ASCEND_FIA_VERSION") {
        Err(_) => Ok(None),
        Ok(s) if s.is_empty() => Ok(None),
        Ok(s) => match s.trim().parse::<u32>() {
            Ok(v @ 2..=4) => Ok(Some(v)),
            _ => Err(Error::arg(
                "KVS_ASCEND_FIA_VERSION",
                format!("{s:?} is not 2, 3 or 4"),
            )),
        },
    }
}

fn load_uncached(dir: Option<&Path>, explicit: bool) -> Result<Cann> {
    let where_ = match dir {
        Some(d) => format!("in {}", d.display()),
        None => "on the loader's search path (ASCEND_HOME_PATH is not set)".to_string(),
    };
    let required = |name: &str| -> Result<Lib> {
        Lib::open(&lib_path(dir, name), true)
            .map_err(|e| Error::BackendUnavailable(format!("cannot load {name} {where_}: {e}")))
    };
    let acl = required("libascendcl.so")?;
    let nnop = required("libnnopbase.so")?;
    let mut ops = Vec::new();
    let mut missing_ops = Vec::new();
    for name in ["libopapi.so", "libopapi_transformer.so"] {
        match Lib::open(&lib_path(dir, name), false) {
            Ok(l) => ops.push(l),
            Err(e) => missing_ops.push(format!("{name}: {e}")),
        }
    }
    let mut cust = vec![lib_path(dir, "libcust_opapi.so")];
    if !explicit {
        cust.extend(vendor_cust_libs());
    }
    let mut cust_found = false;
    for p in cust {
        if let Ok(l) = Lib::open(&p, false) {
            ops.push(l);
            cust_found = true;
            break;
        }
    }
    if !cust_found {
        missing_ops.push("libcust_opapi.so: not present (optional)".into());
    }
    let searched = {
        let mut v: Vec<&str> = ops.iter().map(|l| l.file_name()).collect();
        if v.is_empty() {
            v.push("(no op library could be loaded)");
        }
        v.join(", ")
    };

    let need = |lib: &Lib, name: &str| -> Result<*mut c_void> {
        lib.sym(name).ok_or_else(|| {
            Error::BackendUnavailable(format!(
                "symbol {name} not found in {} ({})",
                lib.file_name(),
                lib.path
            ))
        })
    };
    // First op library (in search order) that exports `name`.
    let find_op = |name: &str| -> Option<(*mut c_void, &str)> {
        ops.iter()
            .find_map(|l| l.sym(name).map(|p| (p, l.file_name())))
    };

    // SAFETY (all `cast`s below): each symbol is the documented C function whose signature is
    // the target type (sys.rs copies the declarations from the CANN headers).
    let mut inventory = format!(
        "libascendcl.so: {}; libnnopbase.so: {}; op libraries: {}",
        acl.path, nnop.path, searched
    );
    if !missing_ops.is_empty() {
        inventory.push_str(&format!(" (not loaded: {})", missing_ops.join("; ")));
    }

    let mut fia_found: Vec<(u32, *mut c_void, *mut c_void, String)> = Vec::new();
    for v in [2u32, 3, 4] {
        let ws = format!("aclnnFusedInferAttentionScoreV{v}GetWorkspaceSize");
        let ex = format!("aclnnFusedInferAttentionScoreV{v}");
        if let (Some((w, lib)), Some((e, _))) = (find_op(&ws), find_op(&ex)) {
            fia_found.push((v, w, e, lib.to_string()));
        }
    }
    let forced = env_fia_version()?;
    let order: Vec<u32> = match forced {
        Some(v) => vec![v],
        None => FIA_PREFERENCE.to_vec(),
    };
    let chosen = order
        .iter()
        .find_map(|v| fia_found.iter().find(|f| f.0 == *v))
        .ok_or_else(|| {
            let what = match forced {
                Some(v) => format!(
                    "aclnnFusedInferAttentionScoreV{v}GetWorkspaceSize / aclnnFusedInferAttentionScoreV{v} \
                     (forced by KVS_ASCEND_FIA_VERSION)"
                ),
                None => "aclnnFusedInferAttentionScoreV3/V4/V2GetWorkspaceSize (and its execute \
                         function)"
                    .to_string(),
            };
            Error::BackendUnavailable(format!(
                "symbol {what} not found in {searched} {where_}"
            ))
        })?;
    // SAFETY: see above.
    let fia = unsafe {
        Op {
            get_ws: match chosen.0 {
                2 => FiaFn::V2(cast(chosen.1)),
                3 => FiaFn::V3(cast(chosen.1)),
                _ => FiaFn::V4(cast(chosen.1)),
            },
            exec: cast(chosen.2),
        }
    };
    let found: Vec<String> = fia_found
        .iter()
        .map(|f| format!("V{} ({})", f.0, f.3))
        .collect();
    inventory.push_str(&format!(
        "; aclnnFusedInferAttentionScore found: {}; using V{} (preference {})",
        found.join(", "),
        chosen.0,
        match forced {
            Some(_) => "forced by KVS_ASCEND_FIA_VERSION".to_string(),
            None => FIA_PREFERENCE
                .iter()
                .map(|v| format!("V{v}"))
                .collect::<Vec<_>>()
                .join(" > "),
        }
    ));
    let scatter = match (
        find_op("aclnnScatterPaKvCacheGetWorkspaceSize"),
        find_op("aclnnScatterPaKvCache"),
    ) {
        (Some((w, lib)), Some((e, _))) => {
            inventory.push_str(&format!("; aclnnScatterPaKvCache: {lib}"));
            // SAFETY: see above.
            Some(unsafe {
                Op {
                    get_ws: cast(w),
                    exec: cast(e),
                }
            })
        }
        _ => {
            inventory.push_str(
                "; aclnnScatterPaKvCache: absent (kvs_kv_write returns \
                 KVS_STATUS_BACKEND_UNAVAILABLE; write K/V with the engine's own op)",
            );
            None
        }
    };

    // SAFETY: see above.
    let cann = unsafe {
        Cann {
            init: cast(need(&acl, "aclInit")?),
            set_device: cast(need(&acl, "aclrtSetDevice")?),
            get_device: cast(need(&acl, "aclrtGetDevice")?),
            malloc: cast(need(&acl, "aclrtMalloc")?),
            free: cast(need(&acl, "aclrtFree")?),
            memcpy: cast(need(&acl, "aclrtMemcpy")?),
            memcpy_async: cast(need(&acl, "aclrtMemcpyAsync")?),
            recent_err_msg: acl.sym("aclGetRecentErrMsg").map(|p| cast(p)),
            create_tensor: cast(need(&nnop, "aclCreateTensor")?),
            create_int_array: cast(need(&nnop, "aclCreateIntArray")?),
            create_tensor_list: cast(need(&nnop, "aclCreateTensorList")?),
            destroy_tensor: cast(need(&nnop, "aclDestroyTensor")?),
            destroy_int_array: cast(need(&nnop, "aclDestroyIntArray")?),
            destroy_tensor_list: cast(need(&nnop, "aclDestroyTensorList")?),
            destroy_executor: cast(need(&nnop, "aclDestroyAclOpExecutor")?),
            fia,
            scatter,
            inventory,
            _libs: Vec::new(),
        }
    };
    let mut libs = vec![acl, nnop];
    libs.extend(ops);
    Ok(Cann {
        _libs: libs,
        ..cann
    })
}

impl Drop for Lib {
    fn drop(&mut self) {
        // Only reached when a load fails (a successful set lives in the registry forever).
        // SAFETY: a live handle from dlopen, closed once.
        unsafe { libc::dlclose(self.handle) };
    }
}

/// Libraries loaded so far, by directory (`None`: the loader's search path).
static LOADED: LazyLock<Mutex<HashMap<Option<PathBuf>, Arc<Cann>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Loads (once per directory and process) the CANN libraries; see the module docs for where.
pub fn load(explicit_dir: Option<&Path>) -> Result<Arc<Cann>> {
    let dir = search_dir(explicit_dir);
    let mut map = LOADED
        .lock()
        .map_err(|_| Error::BackendFailure("CANN loader registry poisoned".into()))?;
    if let Some(c) = map.get(&dir) {
        return Ok(c.clone());
    }
    let c = Arc::new(load_uncached(dir.as_deref(), explicit_dir.is_some())?);
    map.insert(dir, c.clone());
    Ok(c)
}
