//! A host's thread team: the CPU backend's work run on threads the host already has, instead
//! of kvshare's own pool ([`super::pool`]).
//!
//! An engine whose model runs on an OpenMP team (PyTorch's CPU ops, vLLM's CPU kernels) keeps
//! those threads spinning for a while after each parallel region. A second set of threads
//! (kvshare's pool) then competes with them for the same cores: on a 2-vCPU machine inside
//! vLLM's CPU engine, kvshare's two-thread decode ran no faster than on one thread. Running the
//! work on the host's own team avoids that: the spinning threads pick it up at once.
//!
//! The host gives one function with the signature of libgomp's `GOMP_parallel` (which GCC emits
//! for `#pragma omp parallel`; LLVM's and Intel's OpenMP runtimes export it too): it runs
//! `work(arg)` on up to `num_threads` threads, the caller's among them, and returns when every
//! call has returned. [`Team::for_each`] hands item indices out from one atomic counter inside
//! `work`, so the result does not depend on how many threads the host actually used: the
//! caller runs whatever items are left after the region (all of them when the host ran `work`
//! nowhere), and a panic inside `work` is caught there and re-raised on the caller.

use std::any::Any;
use std::ffi::{c_uint, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What the host calls on each of its threads: `work(arg)`.
pub type WorkFn = unsafe extern "C" fn(arg: *mut c_void);

/// The host's parallel region (`GOMP_parallel`'s signature): calls `work(arg)` on up to
/// `num_threads` threads and returns after all have returned. kvshare passes a `Some` work and
/// `flags = 0`. (The C header's `kvs_cpu_parallel_fn` is this type.)
pub type ParallelFn = unsafe extern "C" fn(
    work: Option<WorkFn>,
    arg: *mut c_void,
    num_threads: c_uint,
    flags: c_uint,
);

/// A host's team of `threads` threads, reached through its [`ParallelFn`].
#[derive(Clone, Copy)]
pub struct Team {
    parallel: ParallelFn,
    threads: usize,
}

/// One [`Team::for_each`] call, shared by the team's threads through `work`'s `arg`.
struct Region<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    next: AtomicUsize,
    n: usize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Region<'_> {
    /// Runs items until none is left; a panic stops the region (no item starts after it) and
    /// is kept for the caller.
    fn run(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| (self.f)(i))) {
                self.next.store(self.n, Ordering::Relaxed);
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
                return;
            }
        }
    }
}

/// `work` as kvshare gives it to the host: `arg` is the [`Region`] of the running call.
unsafe extern "C" fn region_work(arg: *mut c_void) {
    // SAFETY: `for_each` passes a pointer to its live `Region` and keeps it alive until the
    // host's parallel call returns, which it does only after every `work` call returned.
    let region = unsafe { &*(arg as *const Region<'_>) };
    region.run();
}

impl Team {
    /// A team reached through `parallel`, of `threads` threads (0: the machine's available
    /// parallelism, as for kvshare's own pool).
    ///
    /// # Safety
    /// `parallel` must behave as [`ParallelFn`] says: call `work(arg)` on at most
    /// `num_threads` threads (any number, zero included), never after it has returned, and be
    /// callable from any thread that launches on this backend.
    pub unsafe fn new(parallel: ParallelFn, threads: usize) -> Team {
        Team {
            parallel,
            threads: super::pool::threads_or_all(threads),
        }
    }

    /// Threads that run work.
    pub fn num_threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i in 0..n` on the team and returns when all are done. A panic in
    /// `f` is re-raised here after the region has ended.
    pub fn for_each<F: Fn(usize) + Sync>(&self, n: usize, f: F) {
        if n == 0 {
            return;
        }
        if self.threads == 1 || n == 1 {
            (0..n).for_each(f);
            return;
        }
        let region = Region {
            f: &f,
            next: AtomicUsize::new(0),
            n,
            panic: Mutex::new(None),
        };
        let arg = &region as *const Region<'_> as *mut c_void;
        let threads = self.threads.min(n) as c_uint;
        // SAFETY: `new`'s contract; `region` outlives the call.
        unsafe { (self.parallel)(Some(region_work), arg, threads, 0) };
        // Whatever the host left undone (it may have run `work` on fewer threads, or none).
        region.run();
        if let Some(p) = region.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            resume_unwind(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A host team of scoped std threads: `work` on every requested thread.
    unsafe extern "C" fn std_threads(work: Option<WorkFn>, arg: *mut c_void, n: c_uint, _: c_uint) {
        let (work, arg) = (work.expect("kvshare passes work"), arg as usize);
        std::thread::scope(|s| {
            for _ in 1..n {
                // SAFETY: the region outlives the scope.
                s.spawn(move || unsafe { work(arg as *mut c_void) });
            }
            // SAFETY: as above; the caller is one of the team.
            unsafe { work(arg as *mut c_void) };
        });
    }

    /// A host that runs nothing.
    unsafe extern "C" fn no_threads(_: Option<WorkFn>, _: *mut c_void, _: c_uint, _: c_uint) {}

    static ONE_CALLS: AtomicU32 = AtomicU32::new(0);

    /// A host that runs `work` once, on the caller, and counts its calls.
    unsafe extern "C" fn one_thread(work: Option<WorkFn>, arg: *mut c_void, _: c_uint, _: c_uint) {
        ONE_CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the region is live during the call.
        unsafe { work.expect("kvshare passes work")(arg) };
    }

    fn counts(team: &Team, n: usize) -> Vec<u32> {
        let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
        team.for_each(n, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        hits.into_iter().map(AtomicU32::into_inner).collect()
    }

    #[test]
    fn every_item_runs_once_whatever_the_host_does() {
        for parallel in [std_threads as ParallelFn, no_threads, one_thread] {
            for threads in [1, 2, 3, 8] {
                // SAFETY: the test hosts keep ParallelFn's contract.
                let team = unsafe { Team::new(parallel, threads) };
                for n in [0, 1, 2, 7, 100] {
                    assert_eq!(counts(&team, n), vec![1; n], "threads {threads}, n {n}");
                }
            }
        }
    }

    #[test]
    fn the_host_is_called_once_per_call_with_work() {
        // SAFETY: as above.
        let team = unsafe { Team::new(one_thread, 4) };
        let before = ONE_CALLS.load(Ordering::Relaxed);
        counts(&team, 0);
        counts(&team, 1); // one item: run inline, no region
        counts(&team, 5);
        assert_eq!(ONE_CALLS.load(Ordering::Relaxed) - before, 1);
    }

    #[test]
    fn a_panic_in_an_item_reaches_the_caller_and_stops_the_region() {
        // SAFETY: as above.
        let team = unsafe { Team::new(std_threads, 4) };
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.for_each(200, |i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 3 {
                    panic!("item 3");
                }
                // Slow items: without the stop, the region would run for 200 x 10 ms / 3 (the
                // panic hook, a backtrace with RUST_BACKTRACE, takes far less).
                std::thread::sleep(std::time::Duration::from_millis(10));
            })
        }));
        let p = r.expect_err("the panic is re-raised");
        assert_eq!(p.downcast_ref::<&str>(), Some(&"item 3"));
        assert!(
            ran.load(Ordering::Relaxed) < 200,
            "items kept starting after the panic"
        );
        // The team is usable afterwards.
        assert_eq!(counts(&team, 9), vec![1; 9]);
    }
}
