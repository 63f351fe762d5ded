//! One model split over several processes (ranks). Rank 0 holds everything with state (the
//! caches, the attention core, the routers, the mHC mixing) and drives every step; the
//! ranks split the weights:
//!
//! - **expert parallel**: every layer's routed experts, a contiguous share of the ids per
//!   rank (rank 0 included). At a layer's MoE, rank 0 sends the normed input and the
//!   routing, every rank computes the picks on its experts, and one sum-reduction brings
//!   the output back.
//! - **tensor parallel** (on top): the dense projections by heads — each rank computes the
//!   queries of its heads (gathered to rank 0, which runs the attention core), then the
//!   grouped output projection of its output groups and its columns of `wo_b` (summed
//!   into rank 0) — the shared expert by width (summed with the routed experts), and the
//!   vocabulary head by rows (gathered).
//!
//! The transport sits behind [`Collectives`] (MPI in the engine crate), so the model knows
//! nothing of it and a single process, which has none, pays nothing.

mod group;
mod parts;
mod protocol;
#[cfg(test)]
pub(crate) mod threads;

pub use group::{Grid, Group};
pub use parts::{AttnPart, HeadPart, WidthPart};
pub use protocol::{announce, interleave, receive_header, send_header, MoeMessage, Op, SplitGuard};

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The collectives a split model needs; rank 0 is the root of each.
pub trait Collectives: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Rank 0's `buf` into every other rank's.
    fn broadcast_f32(&self, buf: &mut [f32]);
    fn broadcast_u64(&self, buf: &mut [u64]);
    /// Rank 0's `buf` becomes the sum over the ranks of theirs; the other ranks' are left
    /// as they were.
    fn reduce_sum(&self, buf: &mut [f32]);
    /// Every rank's `part` into rank 0's `out`, one after the other in rank order
    /// (`counts[r]` floats from rank `r`; only rank 0 reads `counts` and `out`).
    fn gather_f32(&self, part: &[f32], counts: &[usize], out: &mut [f32]);
    /// `buf` to rank `to` alone, which receives it with [`Self::recv_f32`] of the same
    /// length (context parallelism's hand-over from one range to the next).
    fn send_f32(&self, to: usize, buf: &[f32]);
    /// What rank `from` sent with [`Self::send_f32`], into `buf`.
    fn recv_f32(&self, from: usize, buf: &mut [f32]);
    /// [`Self::send_f32`] of words (a [`Group`]'s broadcast of a step's header).
    fn send_u64(&self, to: usize, buf: &[u64]);
    fn recv_u64(&self, from: usize, buf: &mut [u64]);
    /// Ends every rank's process after printing `why` with this rank's number: a rank that
    /// cannot go on must not leave the others waiting in a collective.
    fn abort(&self, why: &str) -> !;
    /// What this rank's collectives have cost so far.
    fn stats(&self) -> CollectiveStats;
}

/// Counters of one rank's collectives.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CollectiveStats {
    pub calls: u64,
    /// Bytes this rank sent or received.
    pub bytes: u64,
    /// Time from entering a collective to its completion on this rank: the transfer, and
    /// waiting for the slowest rank to arrive.
    pub seconds: f64,
}

impl CollectiveStats {
    pub fn since(&self, earlier: &CollectiveStats) -> CollectiveStats {
        CollectiveStats {
            calls: self.calls - earlier.calls,
            bytes: self.bytes - earlier.bytes,
            seconds: self.seconds - earlier.seconds,
        }
    }
}

/// A [`Collectives`] implementation's counters behind [`Collectives::stats`].
#[derive(Debug, Default)]
pub struct Counters {
    calls: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
}

impl Counters {
    /// Runs one collective of `bytes` (its payload), counted.
    pub fn counted<R>(&self, bytes: usize, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        r
    }

    /// The payload of a gather on rank `rank`: what the root receives, or what one sends.
    pub fn gather_bytes(rank: usize, part: &[f32], out: &[f32]) -> usize {
        4 * if rank == 0 { out.len() } else { part.len() }
    }

    pub fn stats(&self) -> CollectiveStats {
        CollectiveStats {
            calls: self.calls.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

impl std::fmt::Debug for dyn Collectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {}", self.rank(), self.size())
    }
}

/// Rank `rank`'s share of `n` things split over `size` ranks: contiguous, the first
/// `n % size` ranks one more.
pub fn share(n: usize, rank: usize, size: usize) -> Range<usize> {
    let size = size.max(1);
    let (base, extra) = (n / size, n % size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// How the weights are split over the ranks of a job.
#[derive(Clone)]
pub struct Placement {
    pub comm: Arc<dyn Collectives>,
    /// The dense projections are split (tensor parallel).
    pub tensor: bool,
    /// The routed experts are split whole, a share of the ids per rank; else every expert
    /// is split by width (with `tensor`; without it, experts are split whole anyway).
    pub expert_parallel: bool,
}

impl Placement {
    /// This rank's share of `n`.
    pub fn share(&self, n: usize) -> Range<usize> {
        share(n, self.comm.rank(), self.comm.size())
    }

    /// Whether the routed experts are split whole (by id), not by width.
    pub fn experts_whole(&self) -> bool {
        self.expert_parallel || !self.tensor
    }

    /// The link a split layer uses to reach the other ranks.
    pub fn link(&self, layer: usize) -> LayerLink {
        LayerLink {
            comm: Arc::clone(&self.comm),
            layer,
        }
    }
}

/// What a split layer needs to reach the other ranks.
#[derive(Clone)]
pub struct LayerLink {
    pub comm: Arc<dyn Collectives>,
    /// The layer's index, which the other ranks keep their parts under.
    pub layer: usize,
}

impl std::fmt::Debug for LayerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LayerLink(layer {}, {:?})", self.layer, self.comm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything_once() {
        for n in [0, 1, 4, 6, 8, 256, 257] {
            for size in 1..=5 {
                let ranges: Vec<_> = (0..size).map(|r| share(n, r, size)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[size - 1].end, n);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let lens = ranges.iter().map(|r| r.len());
                assert!(lens.clone().max().unwrap() - lens.min().unwrap() <= 1);
            }
        }
    }
}
