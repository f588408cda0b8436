//! Builds the emulated CANN runtime (`tests/cann_emu/*.c`) into shared libraries with the real
//! names, one directory per variant under `CARGO_TARGET_TMPDIR`, and wraps its runtime and
//! `emu_*` control functions for the tests (loaded with `dlopen` by path, as kvshare does, so
//! the test and the backend share one emulator instance per directory).

use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use kvshare::backend::{kvs_backend, kvs_backend_options};
use kvshare::enums::kvs_status;

use super::attention::{last_error, Built, Data, F32};
use super::native::cc;

/// Which symbols each library of a variant exports.
#[derive(Clone, Copy, Debug)]
pub enum Variant {
    /// libopapi.so: ScatterPaKvCache; libopapi_transformer.so: FIA V2, V3, V4.
    Full,
    /// FIA V2 only (and ScatterPaKvCache).
    V2Only,
    /// FIA V4 only, in libcust_opapi.so; libopapi_transformer.so has no op.
    V4Cust,
    /// No aclnnScatterPaKvCache anywhere.
    NoScatter,
    /// No aclnnFusedInferAttentionScore* anywhere.
    NoFia,
    /// libnnopbase.so missing.
    NoNnopbase,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Full => "full",
            Variant::V2Only => "v2_only",
            Variant::V4Cust => "v4_cust",
            Variant::NoScatter => "no_scatter",
            Variant::NoFia => "no_fia",
            Variant::NoNnopbase => "no_nnopbase",
        }
    }

    /// `(library, -D flags)`; `None` flags = the library is not built.
    fn libs(self) -> Vec<(&'static str, Option<&'static [&'static str]>)> {
        const ALL_FIA: &[&str] = &["-DEMU_FIA_V2", "-DEMU_FIA_V3", "-DEMU_FIA_V4"];
        const SCATTER: &[&str] = &["-DEMU_SCATTER"];
        const NONE: &[&str] = &[];
        match self {
            Variant::Full => vec![
                ("libopapi.so", Some(SCATTER)),
                ("libopapi_transformer.so", Some(ALL_FIA)),
            ],
            Variant::V2Only => vec![
                ("libopapi.so", Some(SCATTER)),
                ("libopapi_transformer.so", Some(&["-DEMU_FIA_V2"])),
            ],
            Variant::V4Cust => vec![
                ("libopapi.so", Some(SCATTER)),
                ("libopapi_transformer.so", Some(NONE)),
                ("libcust_opapi.so", Some(&["-DEMU_FIA_V4"])),
            ],
            Variant::NoScatter => vec![
                ("libopapi.so", Some(NONE)),
                ("libopapi_transformer.so", Some(ALL_FIA)),
            ],
            Variant::NoFia => vec![
                ("libopapi.so", Some(SCATTER)),
                ("libopapi_transformer.so", Some(NONE)),
            ],
            Variant::NoNnopbase => vec![
                ("libopapi.so", Some(SCATTER)),
                ("libopapi_transformer.so", Some(ALL_FIA)),
            ],
        }
    }
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cann_emu")
}

fn compile(out: &Path, sources: &[&str], defines: &[&str]) {
    let tmp = out.with_extension("so.tmp");
    let mut cmd = Command::new(cc());
    cmd.args([
        "-std=c11",
        "-D_GNU_SOURCE",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wl,-z,defs",
        // Calls inside one library bind to that library, not to the first emulator loaded
        // RTLD_GLOBAL (several builds live in one test process).
        "-Wl,-Bsymbolic",
    ])
    .args(defines)
    .arg("-I")
    .arg(src_dir());
    for s in sources {
        cmd.arg(src_dir().join(s));
    }
    cmd.arg("-o").arg(&tmp).args(["-ldl", "-lm"]);
    let o = cmd.output().expect("run the C compiler");
    assert!(
        o.status.success(),
        "building {} failed:\n{}",
        out.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, out).unwrap();
}

/// Builds (once per test binary) the variant's libraries and returns their directory.
pub fn build(v: Variant) -> PathBuf {
    static BUILT: Mutex<Vec<(&'static str, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, d)) = built.iter().find(|(n, _)| *n == v.name()) {
        return d.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cann_emu")
        .join(env!("CARGO_CRATE_NAME"))
        .join(v.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    compile(
        &dir.join("libascendcl.so"),
        &["ascendcl.c", "kernels.c"],
        &[],
    );
    if !matches!(v, Variant::NoNnopbase) {
        compile(&dir.join("libnnopbase.so"), &["nnopbase.c"], &[]);
    }
    for (lib, flags) in v.libs() {
        if let Some(f) = flags {
            compile(&dir.join(lib), &["opapi.c"], f);
        }
    }
    built.push((v.name(), dir.clone()));
    dir
}

/// Tests share the emulator's counters: run them one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

type AclInit = unsafe extern "C" fn(*const c_char) -> c_int;
type SetDevice = unsafe extern "C" fn(i32) -> c_int;
type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_int) -> c_int;
type MallocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type Free = unsafe extern "C" fn(*mut c_void) -> c_int;
type Memcpy = unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int) -> c_int;
type StreamNew = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type StreamOp = unsafe extern "C" fn(*mut c_void) -> c_int;
type Fail = unsafe extern "C" fn(*const c_char, c_long, c_int);
type Counter = unsafe extern "C" fn(*const c_char) -> c_long;
type Text = unsafe extern "C" fn() -> *const c_char;
type Void = unsafe extern "C" fn();
type SetU64 = unsafe extern "C" fn(u64);
type SetInt = unsafe extern "C" fn(c_int);

/// The emulator of one directory: its runtime and control functions.
pub struct Emu {
    pub dir: PathBuf,
    acl_init: AclInit,
    set_device: SetDevice,
    malloc: Malloc,
    malloc_host: MallocHost,
    free: Free,
    free_host: Free,
    memcpy: Memcpy,
    create_stream: StreamNew,
    sync_stream: StreamOp,
    destroy_stream: StreamOp,
    fail: Fail,
    counter: Counter,
    last_fault: Text,
    clear_faults: Void,
    unset_thread_device: Void,
    set_ws_per_row: SetU64,
    set_device_count: SetInt,
    recent: Text,
}

/// The emulator's symbol `name` as a function pointer of type `F`.
///
/// # Safety
/// `h` is a live `dlopen` handle and `F` the C signature of `name` (a pointer-sized `fn`).
unsafe fn sym<F: Copy>(h: *mut c_void, name: &str) -> F {
    let c = CString::new(name).unwrap();
    // SAFETY: `h` is a live handle (the caller's contract) and `c` a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "emulator symbol {name} missing");
    // SAFETY: `p` is the non-NULL address of `name`, whose signature is `F` (the caller's
    // contract), so its bits are that function pointer.
    unsafe { std::mem::transmute_copy(&p) }
}

pub const H2D: c_int = 1;
pub const D2H: c_int = 2;

impl Emu {
    /// Builds the variant and loads its libascendcl.so (RTLD_GLOBAL, like kvshare).
    pub fn load(v: Variant) -> &'static Emu {
        static ALL: Mutex<Vec<(&'static str, &'static Emu)>> = Mutex::new(Vec::new());
        let mut all = ALL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, e)) = all.iter().find(|(n, _)| *n == v.name()) {
            return e;
        }
        let dir = build(v);
        let path = CString::new(dir.join("libascendcl.so").to_str().unwrap()).unwrap();
        // SAFETY: loading our own emulator; the symbols have the declared signatures.
        let e = unsafe {
            let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            assert!(!h.is_null(), "dlopen {}", dir.display());
            Emu {
                dir,
                acl_init: sym(h, "aclInit"),
                set_device: sym(h, "aclrtSetDevice"),
                malloc: sym(h, "aclrtMalloc"),
                malloc_host: sym(h, "aclrtMallocHost"),
                free: sym(h, "aclrtFree"),
                free_host: sym(h, "aclrtFreeHost"),
                memcpy: sym(h, "aclrtMemcpy"),
                create_stream: sym(h, "aclrtCreateStream"),
                sync_stream: sym(h, "aclrtSynchronizeStream"),
                destroy_stream: sym(h, "aclrtDestroyStream"),
                fail: sym(h, "emu_fail"),
                counter: sym(h, "emu_counter"),
                last_fault: sym(h, "emu_last_fault"),
                clear_faults: sym(h, "emu_clear_faults"),
                unset_thread_device: sym(h, "emu_unset_thread_device"),
                set_ws_per_row: sym(h, "emu_set_workspace_per_row"),
                set_device_count: sym(h, "emu_set_device_count"),
                recent: sym(h, "aclGetRecentErrMsg"),
            }
        };
        let e: &'static Emu = Box::leak(Box::new(e));
        all.push((v.name(), e));
        e
    }

    /// `aclInit` (0 or 100002) + `aclrtSetDevice(dev)` on this thread, as an engine does.
    pub fn init_thread(&self, dev: i32) {
        unsafe {
            let r = (self.acl_init)(std::ptr::null());
            assert!(r == 0 || r == 100002, "aclInit {r}");
            assert_eq!((self.set_device)(dev), 0);
        }
    }

    pub fn set_device(&self, dev: i32) -> i32 {
        unsafe { (self.set_device)(dev) }
    }

    pub fn unset_thread_device(&self) {
        unsafe { (self.unset_thread_device)() }
    }

    pub fn counter(&self, name: &str) -> i64 {
        let c = CString::new(name).unwrap();
        unsafe { (self.counter)(c.as_ptr()) }
    }

    pub fn calls(&self, f: &str) -> i64 {
        self.counter(&format!("calls:{f}"))
    }

    /// Live tensors + int arrays + tensor lists + executors.
    pub fn live_objects(&self) -> i64 {
        self.counter("live_tensors")
            + self.counter("live_int_arrays")
            + self.counter("live_tensor_lists")
            + self.counter("live_executors")
    }

    pub fn faults(&self) -> i64 {
        self.counter("faults")
    }

    pub fn last_fault(&self) -> String {
        unsafe { CStr::from_ptr((self.last_fault)()) }
            .to_string_lossy()
            .into_owned()
    }

    /// `aclGetRecentErrMsg()` of this thread.
    pub fn recent(&self) -> String {
        let p = unsafe { (self.recent)() };
        if p.is_null() {
            return String::new();
        }
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    pub fn clear_faults(&self) {
        unsafe { (self.clear_faults)() }
    }

    /// The `nth` next call of `f` fails with `code`; `None` clears.
    pub fn fail(&self, f: Option<&str>, nth: i64, code: i32) {
        match f {
            Some(f) => {
                let c = CString::new(f).unwrap();
                unsafe { (self.fail)(c.as_ptr(), nth as c_long, code) }
            }
            None => unsafe { (self.fail)(std::ptr::null(), 0, 0) },
        }
    }

    pub fn set_workspace_per_row(&self, n: u64) {
        unsafe { (self.set_ws_per_row)(n) }
    }

    pub fn set_device_count(&self, n: i32) {
        unsafe { (self.set_device_count)(n) }
    }

    /// Device memory of `bytes` bytes.
    pub fn alloc(&self, bytes: usize) -> DevBuf<'_> {
        let mut p = std::ptr::null_mut();
        assert_eq!(unsafe { (self.malloc)(&mut p, bytes.max(1), 0) }, 0);
        DevBuf {
            emu: self,
            ptr: p,
            bytes,
            host: false,
        }
    }

    /// Page-locked host memory (`aclrtMallocHost`).
    pub fn alloc_host(&self, bytes: usize) -> DevBuf<'_> {
        let mut p = std::ptr::null_mut();
        assert_eq!(unsafe { (self.malloc_host)(&mut p, bytes.max(1)) }, 0);
        DevBuf {
            emu: self,
            ptr: p,
            bytes,
            host: true,
        }
    }

    /// Device memory holding `data`.
    pub fn upload(&self, data: &[u8]) -> DevBuf<'_> {
        let b = self.alloc(data.len());
        b.write(data);
        b
    }

    pub fn stream(&self) -> *mut c_void {
        let mut s = std::ptr::null_mut();
        assert_eq!(unsafe { (self.create_stream)(&mut s) }, 0);
        s
    }

    pub fn sync(&self, s: *mut c_void) {
        assert_eq!(unsafe { (self.sync_stream)(s) }, 0);
    }

    pub fn destroy_stream(&self, s: *mut c_void) {
        assert_eq!(unsafe { (self.destroy_stream)(s) }, 0);
    }
}

/// A device (or page-locked host) allocation, freed on drop.
pub struct DevBuf<'e> {
    emu: &'e Emu,
    pub ptr: *mut c_void,
    pub bytes: usize,
    host: bool,
}

impl DevBuf<'_> {
    pub fn write(&self, data: &[u8]) {
        assert!(data.len() <= self.bytes);
        if self.host {
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.cast(), data.len()) };
        } else if !data.is_empty() {
            let r = unsafe {
                (self.emu.memcpy)(self.ptr, self.bytes, data.as_ptr().cast(), data.len(), H2D)
            };
            assert_eq!(
                r,
                0,
                "aclrtMemcpy H2D ({}): {}",
                self.emu.dir.display(),
                self.emu.recent()
            );
        }
    }

    pub fn read(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.bytes];
        if self.host {
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.cast(), v.as_mut_ptr(), self.bytes) };
        } else if self.bytes > 0 {
            let r = unsafe {
                (self.emu.memcpy)(v.as_mut_ptr().cast(), self.bytes, self.ptr, self.bytes, D2H)
            };
            assert_eq!(r, 0, "aclrtMemcpy D2H: {}", self.emu.recent());
        }
        v
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        let r = unsafe {
            if self.host {
                (self.emu.free_host)(self.ptr)
            } else {
                (self.emu.free)(self.ptr)
            }
        };
        assert_eq!(r, 0);
    }
}

/// Bytes of a slice of plain numbers.
pub fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(v);
    let mut out = vec![0u8; n];
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().cast::<u8>(), out.as_mut_ptr(), n) };
    out
}

// ---- The Ascend backend over an emulator (shared by ascend.rs and ascend_window.rs) ----

/// `KVS_BACKEND_ASCEND`.
pub const ASCEND: u32 = 1;

/// A backend on the emulator of `emu` (device 0 unless given).
pub fn backend_at(
    dir: &std::path::Path,
    device: i32,
) -> Result<*mut kvs_backend, (kvs_status, String)> {
    let d = CString::new(dir.to_str().unwrap()).unwrap();
    let opts = kvs_backend_options {
        num_threads: 0,
        device_id: device,
        library_dir: d.as_ptr(),
    };
    let mut b = std::ptr::null_mut();
    match unsafe { kvs_backend::kvs_backend_new(ASCEND, &opts, &mut b) } {
        kvs_status::Ok => Ok(b),
        s => Err((s, last_error())),
    }
}

pub fn backend(emu: &Emu) -> *mut kvs_backend {
    backend_at(&emu.dir, 0).unwrap_or_else(|(s, m)| panic!("kvs_backend_new: {s:?}: {m}"))
}

pub fn data_from(dtype: u32, b: &[u8]) -> Data {
    let mut d = Data::filled(dtype, b.len() / if dtype == F32 { 4 } else { 2 }, 0.0);
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), d.ptr_mut().cast::<u8>(), b.len()) };
    d
}

pub fn data_bytes(d: &Data) -> Vec<u8> {
    let n = d.len() * if matches!(d, Data::F32(_)) { 4 } else { 2 };
    let mut v = vec![0u8; n];
    unsafe { std::ptr::copy_nonoverlapping(d.ptr().cast::<u8>(), v.as_mut_ptr(), n) };
    v
}

/// Device copies of a case's inputs.
pub struct Dev<'e> {
    pub q: DevBuf<'e>,
    pub out: DevBuf<'e>,
    pub k: DevBuf<'e>,
    pub v: DevBuf<'e>,
    pub bt: DevBuf<'e>,
}

pub fn upload<'e>(emu: &'e Emu, b: &Built) -> Dev<'e> {
    Dev {
        q: emu.upload(&data_bytes(&b.query)),
        out: emu.upload(&data_bytes(&b.out)),
        k: emu.upload(&data_bytes(&b.k)),
        v: emu.upload(&data_bytes(&b.v)),
        bt: emu.upload(&bytes(&b.block_table)),
    }
}

pub fn launch(be: *mut kvs_backend, b: &Built, d: &Dev<'_>, stream: *mut c_void) -> kvs_status {
    let a = b.args_over(d.q.ptr, d.out.ptr, d.k.ptr, d.v.ptr, d.bt.ptr.cast());
    unsafe { kvs_backend::kvs_attention_launch(be, &a, stream) }
}
