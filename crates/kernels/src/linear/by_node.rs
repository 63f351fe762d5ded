//! How a pass's tiles are dealt to the threads: in queues, one per node of the pool (one
//! on most machines; see `crate::numa`).
//!
//! Each tile goes to the node whose memory holds its weight rows (a whole small matrix's
//! node, or a large one's share of rows); a node's threads take its tiles first, then help
//! the other nodes with what is left, so a slow node never holds up the pass. Work stealing
//! over the tiles would move them to any thread, most of them across the socket link.
//!
//! Within a queue, threads claim contiguous runs of tiles, half of what is left over the
//! node's threads at a time ("guided" scheduling): each thread streams long runs of rows,
//! which its prefetches (whole calls of rows ahead) and the hardware's expect. This also
//! measured faster than rayon's adaptive splitting of the tile range on one node (decode
//! 3–6 % and prefill 5–9 % on the bench preset, decode 4–5 % on flash-slice; see
//! docs/PERFORMANCE.md). A tile's result does not depend on the thread that runs it, so the
//! dealing cannot change a bit of the output.

use super::Plan;
use crate::numa::plan::Shares;
use rayon::prelude::*;
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
    /// Buckets the tiles of `plans` by node (`shares`: the pool's nodes, `None` for one):
    /// the node holding the whole matrix, or the one owning the tile's first row of a matrix
    /// split by rows.
    pub(super) fn fill(&mut self, plans: &[Plan], shares: Option<&Shares>) {
        let Some(shares) = shares else {
            let tiles = plans.iter().map(|p| p.tiles()).sum();
            return self.fill_with(1, std::iter::repeat_n(0, tiles));
        };
        let owners = plans.iter().flat_map(|p| {
            let (w, nodes) = (p.w(), shares.nodes());
            let home = w.home().filter(|&h| h < nodes);
            (0..p.tiles())
                .map(move |t| home.unwrap_or_else(|| shares.owner(p.tile_row0(t), w.rows)))
        });
        self.fill_with(shares.nodes(), owners);
    }

    /// Buckets tiles `0..` by `owners` (tile `t`'s node is its `t`-th item) over `nodes`.
    fn fill_with(&mut self, nodes: usize, owners: impl Iterator<Item = usize> + Clone) {
        self.starts.clear();
        self.starts.resize(nodes + 1, 0);
        for n in owners.clone() {
            self.starts[n + 1] += 1;
        }
        for n in 0..nodes {
            self.starts[n + 1] += self.starts[n];
        }
        self.order.clear();
        self.order.resize(self.starts[nodes], 0);
        self.next.clear();
        self.next.extend((0..nodes).map(|_| AtomicUsize::new(0)));
        // The counters serve as fill cursors first (no allocation), then start at 0.
        for (c, &start) in self.next.iter_mut().zip(&self.starts) {
            *c.get_mut() = start;
        }
        for (t, n) in owners.enumerate() {
            let slot = self.next[n].get_mut();
            self.order[*slot] = t;
            *slot += 1;
        }
        for c in &mut self.next {
            *c.get_mut() = 0;
        }
    }

    /// Runs every tile once. One claiming loop per thread of the pool, spread by rayon's
    /// own fork tree (a hand-off costs log₂ of the threads in steals, where a broadcast
    /// queues a job on every thread one after the other); each loop starts at the bucket
    /// of the thread running it, whichever thread that turns out to be. One tile, or a pool
    /// of one thread, runs on the calling thread alone.
    pub(super) fn run(&self, one: &(impl Fn(usize) + Sync)) {
        #[cfg(test)]
        RUNS.fetch_add(1, Ordering::Relaxed);
        let nodes = self.next.len();
        let claim = |_| {
            let (home, threads) = crate::numa::pool::with_home(|h| {
                h.map_or((0, rayon::current_num_threads()), |(node, shares)| {
                    (node, shares.threads(node))
                })
            });
            for k in 0..nodes {
                let n = (home + k) % nodes;
                let bucket = &self.order[self.starts[n]..self.starts[n + 1]];
                while let Some(run) = claim_run(&self.next[n], bucket.len(), threads) {
                    bucket[run].iter().for_each(|&t| one(t));
                }
            }
        };
        match rayon::current_num_threads() {
            threads if threads > 1 && self.order.len() > 1 => {
                (0..threads).into_par_iter().for_each(claim)
            }
            _ => claim(0),
        }
    }
}

/// Claims the next run of a bucket of `len` tiles shared by about `threads` threads: half
/// of what is left over the threads, at least one tile.
fn claim_run(next: &AtomicUsize, len: usize, threads: usize) -> Option<std::ops::Range<usize>> {
    let mut cur = next.load(Ordering::Relaxed);
    loop {
        if cur >= len {
            return None;
        }
        let run = ((len - cur) / (2 * threads)).max(1);
        match next.compare_exchange_weak(cur, cur + run, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(cur..cur + run),
            Err(now) => cur = now,
        }
    }
}

/// Microseconds a parallel pass costs beyond its work in the current pool, by the path the
/// products take: `tiles` tiles of `tile_us` µs of spinning each, timed, less the time the
/// work itself takes when split evenly over the pool's threads. This is the hand-off and
/// join every product pays on top of its work (an empty pass would measure nothing: the
/// calling thread runs it all before another wakes). Run it inside
/// [`crate::awake::with_workers_awake`], as a forward pass is.
pub fn pass_cost(tiles: usize, tile_us: f64, reps: usize) -> f64 {
    let mut queues = NodeQueues::default();
    let nodes = crate::numa::pool::with_home(|h| h.map_or(1, |(_, s)| s.nodes()));
    let work = std::time::Duration::from_secs_f64(tile_us / 1e6);
    let one = |i: usize| {
        let t = std::time::Instant::now();
        while t.elapsed() < work {
            std::hint::black_box(i);
        }
    };
    let t = std::time::Instant::now();
    for _ in 0..reps {
        queues.fill_with(nodes, (0..tiles).map(|i| i * nodes / tiles));
        queues.run(&one);
    }
    let per_pass = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
    let threads = rayon::current_num_threads();
    per_pass - tiles.div_ceil(threads) as f64 * tile_us
}
