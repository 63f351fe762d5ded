//! Keeping the compute pool's other workers awake through one forward pass.
//!
//! A decode step is a few hundred short parallel passes with serial work between them. A
//! rayon worker that finds nothing to do spins briefly and then sleeps; the next pass wakes
//! it, which on a virtual machine is an interrupt through the hypervisor, and on a busy
//! host the woken vCPU waits for a physical core. Measured on the development VM, a wake
//! after ~100 µs idle cost 20–150 µs, after 1 ms 40–260 µs, against 2 µs for a worker
//! that never slept — per pass, a few hundred times a token. llama.cpp's threads spin
//! through a whole graph for the same reason. So while a forward pass runs, the other
//! workers poll for work instead of sleeping: batch-1 decode steps on the bench-bf16
//! checkpoint took 7–11 % less time (medians of 15 steps each, alternating with and
//! without, in one process, three times).

use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` on the current thread while the pool's other worker polls for work (running
/// any it finds) instead of sleeping, until `f` returns. Outside a pool, or in a pool of
/// one, it just runs `f`. Allocates nothing.
pub fn with_workers_awake<R>(f: impl FnOnce() -> R) -> R {
    let Some(me) = rayon::current_thread_index() else {
        return f();
    };
    if rayon::current_num_threads() < 2 {
        return f();
    }
    let done = &AtomicBool::new(false);
    /// Ends the polling however `f` ends (a panic included), so the join never waits on
    /// a poller that cannot stop.
    struct Finish<'a>(&'a AtomicBool);
    impl Drop for Finish<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let poll = move || {
        // Nobody stole the poller before the pass ended (or this thread popped it
        // while waiting inside the pass): there is no other worker to keep awake.
        if rayon::current_thread_index() == Some(me) {
            return;
        }
        while !done.load(Ordering::Acquire) {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::hint::spin_loop();
            }
        }
    };
    let run = OnCaller(move || {
        let _finish = Finish(done);
        f()
    });
    let first = move || {
        let run = run; // the whole wrapper, not its field (closures capture fields)
        OnCaller((run.0)())
    };
    let (r, ()) = rayon::join(first, poll);
    r.0
}

/// The closure `rayon::join` runs as its first operation, and its result: inside a pool
/// (checked above) that operation always runs on the calling thread, so neither crosses
/// threads and neither need be `Send` (the forward pass holds `&mut dyn` state that is
/// not).
struct OnCaller<F>(F);

// SAFETY: `with_workers_awake` only builds an `OnCaller` when the current thread is a
// worker of a pool, as `join`'s first operation or its result, and rayon documents that
// operation to run on the calling thread in that case: each value is made, moved and
// consumed on the one thread.
unsafe impl<F> Send for OnCaller<F> {}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn runs_the_pass_with_the_pool_and_without() {
        assert_eq!(with_workers_awake(|| 7), 7);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let sum = pool.install(|| {
            with_workers_awake(|| (0..10_000u64).into_par_iter().map(|i| i * i).sum::<u64>())
        });
        assert_eq!(sum, (0..10_000u64).map(|i| i * i).sum::<u64>());
    }

    #[test]
    fn a_panicking_pass_still_ends_the_polling() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let r = pool.install(|| {
            std::panic::catch_unwind(|| with_workers_awake(|| panic!("inside the pass")))
        });
        assert!(r.is_err());
        // The pool still works: the poller stopped.
        assert_eq!(pool.install(|| with_workers_awake(|| 1 + 1)), 2);
    }
}
