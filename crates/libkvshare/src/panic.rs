//! The panic boundary: every exported function runs its body inside [`guard`].
//!
//! A library must not write to its host's stderr, and Rust's default panic hook prints the
//! message (and maybe a backtrace) there before `catch_unwind` sees the panic. So the first
//! `guard` installs, once per process, a hook that checks whether the panicking thread is inside
//! a kvshare call: if so it only records the message and location for
//! `kvs_last_error_message()`; if not (the host's own Rust code panicking) it calls the hook that
//! was installed before, so the host's panics print exactly as they did. A host that installs its
//! own hook later replaces this one: kvshare's panics then go through the host's hook.

use super::enums::kvs_status;
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;

use super::status::fail;
use crate::error::Error;

thread_local! {
    /// Nesting depth of `guard` on this thread (> 0: inside a kvshare call).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// What the quiet hook recorded for the panic being caught on this thread.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn describe(info: &PanicHookInfo<'_>) -> String {
    let payload = info.payload();
    let msg = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    };
    match info.location() {
        Some(l) => format!("{msg} (at {}:{})", l.file(), l.line()),
        None => msg,
    }
}

fn install_quiet_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // `try_with`: the thread-locals may be gone while a thread exits.
            let inside = DEPTH.try_with(Cell::get).unwrap_or(0) > 0;
            if inside {
                let _ = CAUGHT.try_with(|c| *c.borrow_mut() = Some(describe(info)));
            } else {
                previous(info);
            }
        }));
    });
}

/// Marks this thread as inside a kvshare call for its lifetime (also when unwinding).
struct Inside;

impl Inside {
    fn enter() -> Self {
        DEPTH.with(|d| d.set(d.get() + 1));
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Runs `body`, mapping `Ok` to `KVS_STATUS_OK`, an error to its status (recording the message),
/// and a caught panic to `KVS_STATUS_PANIC` (its message and location go to
/// `kvs_last_error_message()`, nothing to stderr). Nothing unwinds across the C boundary.
pub(crate) fn guard<F: FnOnce() -> Result<(), Error>>(body: F) -> kvs_status {
    install_quiet_hook();
    let result = {
        let _inside = Inside::enter();
        catch_unwind(AssertUnwindSafe(body))
    };
    match result {
        Ok(Ok(())) => kvs_status::Ok,
        Ok(Err(e)) => fail(&e),
        Err(payload) => {
            let recorded = CAUGHT.with(|c| c.borrow_mut().take());
            let msg = recorded.unwrap_or_else(|| {
                if let Some(s) = payload.downcast_ref::<&str>() {
                    (*s).to_string()
                } else if let Some(s) = payload.downcast_ref::<String>() {
                    s.clone()
                } else {
                    "unknown panic payload".to_string()
                }
            });
            fail(&Error::Panic(msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn panics_become_status() {
        let s = guard(|| panic!("boom"));
        assert_eq!(s, kvs_status::Panic);
        // SAFETY: `kvs_last_error_message` returns a NUL-terminated string that stays valid on
        // this thread until its next failing call.
        let msg = unsafe { CStr::from_ptr(kvs_status::kvs_last_error_message()) };
        let msg = msg.to_str().unwrap();
        assert!(
            msg.starts_with(concat!("internal panic: boom (at ", file!(), ":")),
            "{msg}"
        );
        assert_eq!(
            guard(|| Err(Error::Cache(kvshare_core::Error::SeqExists(1)))),
            kvs_status::SeqExists
        );
        assert_eq!(guard(|| Ok(())), kvs_status::Ok);
    }

    const CHILD: &str = "KVS_PANIC_QUIET_CHILD";

    /// A panic caught at the boundary prints nothing to the host's stderr,
    /// while the host's own panics (outside kvshare calls) still reach the hook it had. Runs in
    /// a child process so that the real stderr is observed, with no other test sharing it.
    #[test]
    fn caught_panics_are_quiet_and_host_panics_are_not() {
        if std::env::var_os(CHILD).is_some() {
            assert_eq!(guard(|| panic!("kvshare-internal-boom")), kvs_status::Panic);
            let host = std::panic::catch_unwind(|| panic!("host-own-panic"));
            assert!(host.is_err());
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "panic::tests::caught_panics_are_quiet_and_host_panics_are_not",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child failed: {err}");
        assert!(!err.contains("kvshare-internal-boom"), "stderr: {err}");
        assert!(err.contains("host-own-panic"), "stderr: {err}");
    }
}
