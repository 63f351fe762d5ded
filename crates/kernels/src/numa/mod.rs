//! Where the compute threads run and where the weights they read live (`--threads`,
//! `--cpu-affinity`, `--numa`).
//!
//! The binary reads the machine's topology ([`topology`]), makes a [`plan::Plan`] and
//! [`install`]s it once, before the weights load: the weight buffers are then bound to their
//! nodes before they are filled ([`place_rows`], [`place_on`]), and the compute pool
//! ([`pool::build`]) seats its threads by it. With one node (every machine but multi-socket servers and some
//! many-chiplet parts) the plan is one share and nothing is bound.

pub mod bind;
pub mod plan;
pub mod pool;
pub mod topology;

use plan::Plan;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

static INSTALLED: OnceLock<Plan> = OnceLock::new();

/// Makes `plan` the process's placement; the first plan installed stays (`Err` with it when
/// another was installed before).
pub fn install(plan: Plan) -> Result<&'static Plan, &'static Plan> {
    let fresh = INSTALLED.set(plan);
    let got = INSTALLED.get().expect("set above");
    match fresh {
        Err(other) if other != *got => Err(got),
        _ => Ok(got),
    }
}

/// The installed placement, if any.
pub fn installed() -> Option<&'static Plan> {
    INSTALLED.get()
}

/// The root under which the topology is read: `/`, or the tree `DEEPINFER_TOPOLOGY` names
/// (a copy of `sys/devices/system/{cpu,node}` describing another machine, to run this one
/// as if it were laid out so: the threads are seated and the rows dealt as there, and a bind
/// to a node this machine lacks is skipped with a warning).
pub fn sysfs_root() -> PathBuf {
    std::env::var_os("DEEPINFER_TOPOLOGY").map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

/// Binds a row-major buffer before it is filled (`len` bytes at `start`, 2 MiB-aligned)
/// by the installed plan: each node's share of its rows to that node's memory, in whole
/// huge pages. Does nothing on one node.
pub fn place_rows(start: *const u8, len: usize) {
    let Some(plan) = installed().filter(|p| p.shares.nodes() > 1) else {
        return;
    };
    let shares = &plan.shares;
    for n in 0..shares.nodes() {
        let r = shares.range(n, len);
        bind::prefer(start as usize + r.start, r.len(), shares.node_ids[n]);
    }
}

/// Binds `len` bytes at `start` to node `node` (an index into the plan's shares).
pub fn place_on(start: *const u8, len: usize, node: usize) {
    if let Some(plan) = installed().filter(|p| p.shares.nodes() > 1) {
        bind::prefer(start as usize, len, plan.shares.node_ids[node]);
    }
}

/// The node the next arena of small matrices goes to, the nodes in turn by their share of
/// the threads (`None` on one node).
pub fn next_home() -> Option<usize> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let shares = &installed().filter(|p| p.shares.nodes() > 1)?.shares;
    // Arena k goes to the node owning "row" k mod T of T (T threads): each node gets
    // arenas in proportion to its threads.
    let turn = NEXT.fetch_add(1, Ordering::Relaxed);
    let total: usize = (0..shares.nodes()).map(|n| shares.threads(n)).sum();
    Some(shares.owner(turn % total, total))
}

/// Interleaves a buffer over the installed plan's nodes, huge page by huge page: for memory
/// any thread may read (the streamed experts' cache, whose slots change hands).
pub fn place_interleaved(start: *const u8, len: usize) {
    if let Some(plan) = installed().filter(|p| p.shares.nodes() > 1) {
        bind::interleave(start as usize, len, &plan.shares.node_ids);
    }
}

#[cfg(test)]
mod tests;
