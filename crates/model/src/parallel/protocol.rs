//! What rank 0 and the other ranks say to each other: a header per operation, then its
//! data, in the same order on every rank.

use super::Collectives;
use std::sync::Arc;

/// The first word of every header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `[op, layer, tokens]`, then a [`MoeMessage`]; every rank sums its part into rank 0.
    Moe = 1,
    /// `[op, layer, tokens]`, then the q-LoRA activations `[T, q_lora]`; every rank's
    /// queries of its heads are gathered to rank 0.
    AttnQ = 2,
    /// `[op, layer, tokens]`, then the attention output `[T, H·hd]`; every rank's part of
    /// the output projections is summed into rank 0.
    AttnOut = 3,
    /// `[op, exact, rows]`, then the normed final hidden rows `[M, D]`; every rank's logits
    /// of its vocabulary are gathered to rank 0. `exact` (1 or 0): whether the rows are exact
    /// in bf16 (the target's head in official numerics; not the DSpark drafter's).
    Head = 4,
    /// Rank 0's model is gone: the ranks leave their loop.
    Stop = 5,
    /// `[op, 0, tokens]`, then a context-parallel step's plan (the engine's
    /// `dist::context`): every rank computes its range of one sequence's tokens.
    Context = 6,
}

impl Op {
    const ALL: [Op; 6] = [
        Op::Moe,
        Op::AttnQ,
        Op::AttnOut,
        Op::Head,
        Op::Stop,
        Op::Context,
    ];

    fn from_word(w: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|op| *op as u64 == w)
    }
}

/// Rank 0: announces `op` on `layer` for `tokens` rows.
pub fn send_header(comm: &dyn Collectives, op: Op, layer: usize, tokens: usize) {
    let mut header = [op as u64, layer as u64, tokens as u64];
    comm.broadcast_u64(&mut header);
}

/// Rank 0: announces `op` on `layer` for `tokens` rows and sends its data.
pub fn announce(comm: &dyn Collectives, op: Op, layer: usize, tokens: usize, data: &mut [f32]) {
    send_header(comm, op, layer, tokens);
    comm.broadcast_f32(data);
}

/// A rank other than 0 waits for the next header: `Ok((op, layer, tokens))`, or the word
/// it does not know (a bug on rank 0's side).
pub fn receive_header(comm: &dyn Collectives) -> Result<(Op, usize, usize), u64> {
    let mut header = [0u64; 3];
    comm.broadcast_u64(&mut header);
    let op = Op::from_word(header[0]).ok_or(header[0])?;
    Ok((op, header[1] as usize, header[2] as usize))
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

    /// Packs rank 0's side into `buf` (a reused buffer).
    pub fn pack(
        x: &[f32],
        ids: &[usize],
        wts: &[f32],
        d: usize,
        k: usize,
        mut buf: Vec<f32>,
    ) -> Self {
        let tokens = ids.len() / k.max(1);
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

/// Rows of ranks' parts, gathered one rank after the other (`[T, widths[r]]` each), into
/// `out: [T, Σ widths]` with each row's parts side by side.
pub fn interleave(gathered: &[f32], widths: &[usize], rows: usize, out: &mut [f32]) {
    let total: usize = widths.iter().sum();
    let mut at = 0;
    let mut col = 0;
    for &w in widths {
        for r in 0..rows {
            out[r * total + col..r * total + col + w]
                .copy_from_slice(&gathered[at + r * w..at + (r + 1) * w]);
        }
        at += rows * w;
        col += w;
    }
}

/// Rank 0's side of the split: the ranks are told to stop when the model goes.
pub struct SplitGuard {
    pub comm: Arc<dyn Collectives>,
}

impl Drop for SplitGuard {
    fn drop(&mut self) {
        send_header(&*self.comm, Op::Stop, 0, 0);
    }
}

impl std::fmt::Debug for SplitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SplitGuard({} ranks)", self.comm.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn interleave_puts_parts_side_by_side() {
        // Two rows; rank 0 has 2 columns, rank 1 none, rank 2 one.
        let gathered = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = [0.0; 6];
        interleave(&gathered, &[2, 0, 1], 2, &mut out);
        assert_eq!(out, [1.0, 2.0, 5.0, 3.0, 4.0, 6.0]);
    }

    #[test]
    fn every_op_round_trips_through_its_word() {
        for op in Op::ALL {
            assert_eq!(Op::from_word(op as u64), Some(op));
        }
        assert_eq!(Op::from_word(0), None);
    }
}
