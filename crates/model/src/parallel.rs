//! One model split over several processes (ranks), expert parallel: rank 0 holds everything
//! with state (the caches, attention, the routers, the head) and drives every step; each
//! rank, rank 0 included, holds a contiguous share of every layer's routed experts. At a
//! layer's MoE, rank 0 sends the layer's normed input and routing to the others, every rank
//! computes the picks that fall on its experts, and one sum-reduction brings the output
//! back to rank 0.
//!
//! The transport sits behind [`Collectives`] (MPI in the engine crate), so the model knows
//! nothing of it and a single process, which has none, pays nothing.

use std::ops::Range;
use std::sync::Arc;

/// The collectives a split model needs; rank 0 is the root of each.
pub trait Collectives: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Rank 0's `buf` into every other rank's.
    fn broadcast_f32(&self, buf: &mut [f32]);
    fn broadcast_u64(&self, buf: &mut [u64]);
    /// Rank 0's `buf` becomes the sum over the ranks of theirs, in rank order; the other
    /// ranks' are left as they were.
    fn reduce_sum(&self, buf: &mut [f32]);
    /// Ends every rank's process after printing `why` with this rank's number: a rank that
    /// cannot go on must not leave the others waiting in a collective.
    fn abort(&self, why: &str) -> !;
}

/// The experts of `n` that rank `rank` of `size` holds: contiguous shares, the first
/// `n % size` ranks one more.
pub fn expert_range(n: usize, rank: usize, size: usize) -> Range<usize> {
    let size = size.max(1);
    let (base, extra) = (n / size, n % size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// What a split layer's MoE needs to reach the other ranks.
#[derive(Clone)]
pub struct ExpertSplit {
    pub comm: Arc<dyn Collectives>,
    /// The layer's index, which the other ranks' experts are kept under.
    pub layer: usize,
}

impl std::fmt::Debug for ExpertSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ExpertSplit(layer {}, {} ranks)",
            self.layer,
            self.comm.size()
        )
    }
}

/// What rank 0 asks of the others, as the first word of every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `[op, layer, tokens]`, then the payload of [`MoeMessage`].
    Moe = 1,
    /// The model is gone: the ranks leave their loop.
    Stop = 2,
}

impl Op {
    fn from_word(w: u64) -> Option<Self> {
        match w {
            1 => Some(Op::Moe),
            2 => Some(Op::Stop),
            _ => None,
        }
    }
}

/// A layer's MoE input as it travels: `x: [T, D]`, then each token's `k` routing weights
/// and `k` expert ids (as floats: exact, expert ids are far below 2^24), in one buffer.
pub struct MoeMessage {
    pub buf: Vec<f32>,
    pub tokens: usize,
    pub d: usize,
    pub k: usize,
}

impl MoeMessage {
    pub fn len_for(tokens: usize, d: usize, k: usize) -> usize {
        tokens * (d + 2 * k)
    }

    /// Packs rank 0's side.
    pub fn pack(x: &[f32], ids: &[usize], wts: &[f32], d: usize, k: usize, buf: Vec<f32>) -> Self {
        let tokens = ids.len() / k.max(1);
        let mut buf = buf;
        buf.clear();
        buf.extend_from_slice(x);
        buf.extend_from_slice(wts);
        buf.extend(ids.iter().map(|&e| e as f32));
        Self { buf, tokens, d, k }
    }

    pub fn x(&self) -> &[f32] {
        &self.buf[..self.tokens * self.d]
    }

    pub fn wts(&self) -> &[f32] {
        let at = self.tokens * self.d;
        &self.buf[at..at + self.tokens * self.k]
    }

    /// The expert ids, into `ids`.
    pub fn ids_into(&self, ids: &mut [usize]) {
        let at = self.tokens * (self.d + self.k);
        for (o, &v) in ids.iter_mut().zip(&self.buf[at..]) {
            *o = v as usize;
        }
    }
}

impl ExpertSplit {
    /// Rank 0: tells the other ranks this layer's MoE is next, and sends its input.
    pub fn send(&self, msg: &mut MoeMessage) {
        let mut header = [Op::Moe as u64, self.layer as u64, msg.tokens as u64];
        self.comm.broadcast_u64(&mut header);
        self.comm.broadcast_f32(&mut msg.buf);
    }
}

/// Rank 0's side of the split: the ranks are told to stop when the model goes.
pub struct SplitGuard {
    pub comm: Arc<dyn Collectives>,
}

impl Drop for SplitGuard {
    fn drop(&mut self) {
        let mut header = [Op::Stop as u64, 0, 0];
        self.comm.broadcast_u64(&mut header);
    }
}

impl std::fmt::Debug for SplitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SplitGuard({} ranks)", self.comm.size())
    }
}

/// A rank other than 0 waits for the next message: `Some((op, layer, tokens))`, or `None`
/// for a word it does not know (a bug on rank 0's side).
pub fn receive_header(comm: &dyn Collectives) -> Option<(Op, usize, usize)> {
    let mut header = [0u64; 3];
    comm.broadcast_u64(&mut header);
    Op::from_word(header[0]).map(|op| (op, header[1] as usize, header[2] as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_ranges_cover_every_expert_once() {
        for n in [1, 4, 6, 8, 256, 257] {
            for size in 1..=5 {
                let ranges: Vec<_> = (0..size).map(|r| expert_range(n, r, size)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[size - 1].end, n);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let (lo, hi) = (
                    ranges.iter().map(|r| r.len()).min().unwrap(),
                    ranges.iter().map(|r| r.len()).max().unwrap(),
                );
                assert!(hi - lo <= 1, "n {n} size {size}: {ranges:?}");
            }
        }
    }

    #[test]
    fn moe_message_round_trips() {
        let (d, k) = (3, 2);
        let x: Vec<f32> = (0..6).map(|v| v as f32 * 0.5).collect();
        let ids = [7usize, 1, 255, 0];
        let wts = [0.25f32, 0.75, 1.5, -2.0];
        let msg = MoeMessage::pack(&x, &ids, &wts, d, k, Vec::new());
        assert_eq!(msg.buf.len(), MoeMessage::len_for(2, d, k));
        assert_eq!(msg.x(), &x[..]);
        assert_eq!(msg.wts(), &wts[..]);
        let mut back = [0usize; 4];
        msg.ids_into(&mut back);
        assert_eq!(back, ids);
    }
}
