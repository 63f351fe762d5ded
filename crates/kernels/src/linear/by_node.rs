//! A pass's tiles dealt to the nodes of a pool that spans several (see `crate::numa`).
//!
//! Each tile goes to the node that owns its first weight row, whose memory holds those
//! rows; a node's threads take its tiles first, one at a time from a shared counter, then
//! help the other nodes with what is left, so a slow node never holds up the pass. Work
//! stealing as the one-node path does it would move tiles to any thread, most of them
//! across the socket link. A tile's result does not depend on the thread that runs it, so
//! the order cannot change a bit of the output.

use super::Plan;
use crate::numa::plan::Shares;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Passes run by node (tests check the path was taken).
#[cfg(test)]
pub(super) static RUNS: AtomicUsize = AtomicUsize::new(0);

/// The tiles of a call bucketed by node, and each bucket's next unclaimed tile; kept in
/// the call's reusable scratch, so a call allocates nothing once the buffers have grown.
#[derive(Default)]
pub(super) struct NodeQueues {
    /// Tile numbers, node 0's first.
    order: Vec<usize>,
    /// Where each node's tiles start in `order` (one more entry than nodes).
    starts: Vec<usize>,
    next: Vec<AtomicUsize>,
}

impl NodeQueues {
    /// Buckets the tiles of `plans` by the node owning each tile's first row.
    pub(super) fn fill(&mut self, plans: &[Plan], shares: &Shares) {
        let nodes = shares.nodes();
        let owner = |p: &Plan, t: usize| shares.owner(p.tile_row0(t), p.w().rows);
        self.starts.clear();
        self.starts.resize(nodes + 1, 0);
        for p in plans {
            for t in 0..p.tiles() {
                self.starts[owner(p, t) + 1] += 1;
            }
        }
        for n in 0..nodes {
            self.starts[n + 1] += self.starts[n];
        }
        let total = self.starts[nodes];
        self.order.clear();
        self.order.resize(total, 0);
        self.next.clear();
        self.next.extend((0..nodes).map(|_| AtomicUsize::new(0)));
        // The counters serve as fill cursors first (no allocation), then start at 0.
        for (c, &start) in self.next.iter_mut().zip(&self.starts) {
            *c.get_mut() = start;
        }
        for p in plans {
            for t in 0..p.tiles() {
                let slot = self.next[owner(p, t)].get_mut();
                self.order[*slot] = p.tiles_before + t;
                *slot += 1;
            }
        }
        for c in &mut self.next {
            *c.get_mut() = 0;
        }
    }

    /// Runs every tile once, on every thread of the current pool, each starting at its
    /// own node's bucket.
    pub(super) fn run(&self, one: &(impl Fn(usize) + Sync)) {
        #[cfg(test)]
        RUNS.fetch_add(1, Ordering::Relaxed);
        let nodes = self.next.len();
        rayon::broadcast(|_| {
            let home = crate::numa::pool::with_home(|h| h.map_or(0, |(node, _)| node));
            for k in 0..nodes {
                let n = (home + k) % nodes;
                let bucket = &self.order[self.starts[n]..self.starts[n + 1]];
                loop {
                    let i = self.next[n].fetch_add(1, Ordering::Relaxed);
                    let Some(&t) = bucket.get(i) else { break };
                    one(t);
                }
            }
        });
    }
}
