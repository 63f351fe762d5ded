//! The compute threads, each seated where its plan says and knowing its node.

use super::plan::{Plan, Shares};
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// This thread's node (an index into its shares) and the pool's row shares; unset on
    /// threads outside a planned pool, which count as node 0 of one.
    static HOME: RefCell<Option<(usize, Arc<Shares>)>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's node and its pool's shares, when the pool spans several
/// nodes (`None` otherwise: nothing to place).
pub fn with_home<R>(f: impl FnOnce(Option<(usize, &Shares)>) -> R) -> R {
    HOME.with(|h| match &*h.borrow() {
        Some((node, shares)) if shares.nodes() > 1 => f(Some((*node, shares))),
        _ => f(None),
    })
}

/// A pool of `plan`'s threads, the calling thread the first of them (run the forward
/// passes inside it with `install`: their parallel loops then start from a worker's own
/// queue). Each thread is pinned as its seat says (a failure is logged, not fatal: the
/// thread still computes, only perhaps farther from its memory) and told its node.
pub fn build(plan: &Plan) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    let shares = Arc::new(plan.shares.clone());
    let seats = Arc::new(plan.seats.clone());
    let seat = {
        let (shares, seats) = (shares.clone(), seats.clone());
        move |i: usize| {
            let s = &seats[i];
            if !s.cpus.is_empty() {
                if let Err(e) = pin(&s.cpus) {
                    tracing::warn!("pinning compute thread {i} to CPUs {:?}: {e}", s.cpus);
                }
            }
            HOME.with(|h| *h.borrow_mut() = Some((s.node, shares.clone())));
        }
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(plan.seats.len())
        .thread_name(|i| format!("deepinfer-compute-{i}"))
        .use_current_thread()
        .start_handler(seat.clone())
        .build()?;
    // `use_current_thread` makes this thread worker 0 without running the start handler.
    seat(0);
    Ok(pool)
}

/// Seats the calling thread where compute thread `i` of the installed plan sits (if it is
/// pinned): the roof probes' threads, spawned by a compute thread, would otherwise all
/// inherit that one thread's cores.
pub fn sit_as(i: usize) {
    if let Some(plan) = super::installed() {
        let seat = &plan.seats[i % plan.seats.len()];
        if !seat.cpus.is_empty() {
            let _ = pin(&seat.cpus);
        }
    }
}

/// Pins the calling thread to `cpus`.
pub fn pin(cpus: &[usize]) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (the
        // cores are checked below its size) and sched_setaffinity reads it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
            for &c in cpus.iter().filter(|&&c| c < max) {
                libc::CPU_SET(c, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpus;
        Ok(())
    }
}
