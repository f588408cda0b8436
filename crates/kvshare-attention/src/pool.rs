//! A small persistent thread pool: the CPU backend's workers, created once per backend.
//!
//! [`ThreadPool::for_each`] runs `f(0..n)` on the calling thread plus every worker, handing out
//! item indices from one atomic counter, and returns when all items are done. No thread is
//! spawned per call. Calls from several threads on one pool are serialized.
//!
//! The caller waits only for the workers that joined the job. A worker joins (under the lock)
//! when it wakes; once the caller has run out of items it withdraws the job, and a worker that
//! wakes after that finds nothing to do. A small launch therefore costs the caller's own work
//! plus a wake-up call. Waiting for every worker instead would make each launch pay a sleeping
//! thread's wake-up latency, which is 40-90 us on a 2-vCPU VM.
//!
//! Why not `rayon`: the crate needs exactly one primitive (a blocking parallel-for over indices)
//! and no extra dependency; this is about 150 lines of std.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// The job being run: borrowed from the `for_each` frame, which outlives every use (it
/// withdraws the job and waits until every worker that took it has checked out before
/// returning).
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    next: *const AtomicUsize,
    n: usize,
}

// SAFETY: the pointers are only dereferenced while `for_each` keeps their targets alive, and
// the closure is `Sync`.
unsafe impl Send for Job {}

struct State {
    job: Option<Job>,
    generation: u64,
    /// Workers that joined the current job and have not finished it.
    active: usize,
    /// First panic payload caught in a worker during the current generation.
    panic: Option<Box<dyn std::any::Any + Send>>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic never happens while the lock is held (closures run outside it), so poisoning
    // carries no broken invariant; recover the guard.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `num_threads`, or the machine's available parallelism for 0 (1 where it is unknown): how a
/// CPU backend's thread count is read, for its own pool and for a host's team alike.
pub fn threads_or_all(num_threads: usize) -> usize {
    if num_threads == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    } else {
        num_threads
    }
}

/// A fixed set of worker threads plus the caller.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `for_each` calls from different threads.
    launch: Mutex<()>,
}

impl ThreadPool {
    /// A pool that runs work on `num_threads` threads in total (the caller included), so
    /// `num_threads - 1` workers are spawned. `0` means the machine's available parallelism.
    pub fn new(num_threads: usize) -> std::io::Result<ThreadPool> {
        let total = threads_or_all(num_threads);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                job: None,
                generation: 0,
                active: 0,
                panic: None,
                shutdown: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::new(),
            launch: Mutex::new(()),
        };
        for i in 1..total {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("kvshare-cpu-{i}"))
                .spawn(move || worker(&shared))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Threads that run work (workers plus the caller).
    pub fn num_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every `i in 0..n`, in parallel, and returns when all are done. A panic
    /// in `f` is re-raised here after every thread has stopped using `f`.
    pub fn for_each<F: Fn(usize) + Sync>(&self, n: usize, f: F) {
        if n == 0 {
            return;
        }
        if self.workers.is_empty() || n == 1 {
            (0..n).for_each(f);
            return;
        }
        let _serial = lock(&self.launch);
        let next = AtomicUsize::new(0);
        let f_dyn: &(dyn Fn(usize) + Sync) = &f;
        // SAFETY: lifetime erasure: before this frame returns or unwinds, the job is withdrawn
        // and every worker that took it has checked out (see below); a worker takes the job
        // only under the lock while it is there. So no worker uses the pointers after `f` and
        // `next` are dropped.
        let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f_dyn) };
        let job = Job {
            f: f_static,
            next: &next,
            n,
        };
        {
            let mut st = lock(&self.shared.state);
            st.job = Some(job);
            st.generation = st.generation.wrapping_add(1);
            st.active = 0;
            st.panic = None;
            self.shared.work.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| run_items(&f, &next, n)));
        let worker_panic = {
            let mut st = lock(&self.shared.state);
            // Withdrawn: a worker that has not joined yet finds no job; wait for those that did.
            st.job = None;
            while st.active > 0 {
                st = self
                    .shared
                    .done
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            st.panic.take()
        };
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = worker_panic {
            resume_unwind(p);
        }
    }
}

fn run_items(f: &(dyn Fn(usize) + Sync), next: &AtomicUsize, n: usize) {
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            return;
        }
        f(i);
    }
}

fn worker(shared: &Shared) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = lock(&shared.state);
            while st.generation == seen && !st.shutdown {
                st = shared.work.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            if st.job.is_some() {
                st.active += 1; // joined: the caller waits for this worker from here on
            }
            st.job
        };
        let result = match job {
            // SAFETY: `for_each` keeps `f` and `next` alive until this worker checks out below.
            Some(job) => catch_unwind(AssertUnwindSafe(|| unsafe {
                run_items(&*job.f, &*job.next, job.n)
            })),
            // Withdrawn before this worker woke: the caller is not waiting for it.
            None => continue,
        };
        let mut st = lock(&shared.state);
        if let Err(p) = result {
            st.panic.get_or_insert(p);
        }
        st.active -= 1;
        if st.active == 0 {
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_item_once() {
        let pool = ThreadPool::new(3).unwrap();
        assert_eq!(pool.num_threads(), 3);
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_each(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn panic_is_reraised_and_pool_survives() {
        let pool = ThreadPool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.for_each(64, |i| {
                if i == 40 {
                    panic!("item 40");
                }
            })
        }));
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        pool.for_each(10, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
    }

    #[test]
    fn back_to_back_small_launches_run_each_item_once() {
        // Workers join some launches late or not at all (the caller may finish and withdraw
        // the job first); every item still runs exactly once, in every launch.
        let pool = ThreadPool::new(3).unwrap();
        for round in 0..20_000usize {
            let n = 1 + round % 5;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_each(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
        }
    }

    #[test]
    fn concurrent_callers_serialize() {
        let pool = Arc::new(ThreadPool::new(2).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let sum = AtomicUsize::new(0);
                        pool.for_each(33, |i| {
                            sum.fetch_add(i, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 33 * 32 / 2);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
