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

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Whether this thread is running a pass's `f` (further down its stack).
    static IN_PASS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on the current thread while another worker of the pool polls for work
/// (running any it finds) instead of sleeping, until `f` returns. Outside a pool, in a
/// pool of one, or inside another such pass, it just runs `f`. Allocates nothing.
///
/// The poller is the first job the pass queues, so the first worker to steal from this
/// one takes it before any of the pass's own jobs: it never holds a job `f` waits for
/// beneath it. A worker already inside a pass of its own does not poll (two passes in one
/// pool each polling on the other's worker would wait on each other).
pub fn with_workers_awake<R>(f: impl FnOnce() -> R) -> R {
    if rayon::current_thread_index().is_none() || rayon::current_num_threads() < 2 || IN_PASS.get()
    {
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
        // Popped by the pass's own thread (nobody stole it), or stolen by a worker
        // inside a pass of its own: nothing to keep awake, or not safely.
        if IN_PASS.get() {
            return;
        }
        while !done.load(Ordering::Acquire) {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::hint::spin_loop();
            }
        }
    };
    /// Marks this thread as inside a pass until `f` ends, however it ends.
    struct InPass;
    impl Drop for InPass {
        fn drop(&mut self) {
            IN_PASS.set(false);
        }
    }
    let run = OnCaller(move || {
        let _finish = Finish(done);
        IN_PASS.set(true);
        let _in_pass = InPass;
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

    #[test]
    fn two_passes_at_once_in_one_pool_both_finish() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .expect("pool");
            let pass = |seed: u64| {
                with_workers_awake(|| {
                    (0..50u64)
                        .map(|r| {
                            (0..2_000u64)
                                .into_par_iter()
                                .map(|i| (i ^ seed).wrapping_mul(r + 1))
                                .sum::<u64>()
                        })
                        .fold(0u64, u64::wrapping_add)
                })
            };
            // Many times over, so the two passes interleave in many ways.
            for _ in 0..500 {
                let got = pool.install(|| rayon::join(|| pass(1), || pass(2)));
                tx.send(got).expect("send");
            }
        });
        let want = |seed: u64| {
            (0..50u64)
                .map(|r| {
                    (0..2_000u64)
                        .map(|i| (i ^ seed).wrapping_mul(r + 1))
                        .sum::<u64>()
                })
                .fold(0u64, u64::wrapping_add)
        };
        for _ in 0..500 {
            let got = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("two concurrent passes deadlocked");
            assert_eq!(got, (want(1), want(2)));
        }
    }
}
