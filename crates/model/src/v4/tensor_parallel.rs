//! Tensor parallelism's steps (see [`crate::parallel`]): what every rank computes with its
//! parts, and rank 0's side of each exchange. The other ranks' side is in `worker.rs`.

use super::output_groups::grouped_output;
use super::swiglu::{activate, Activation, ROWS_PER_TASK};
use super::workspace::Workspace;
use crate::config::ModelConfig;
use crate::numerics::Numerics;
use crate::parallel::{
    announce, interleave, share, AttnPart, Collectives, HeadPart, LayerLink, Op, WidthPart,
};
use crate::profile;
use deepinfer_kernels::linear::{Inputs, Matmul};
use deepinfer_kernels::quant::{amax, fp8_round_piece};
use deepinfer_kernels::sub_matrix::SubMatrix;
use smallvec::SmallVec;
use std::ops::Range;

/// The product of a part's wanted rows: `[m, rows]`.
fn rows_job<'a>(p: &'a SubMatrix, x: &'a [f32], m: usize, y: &'a mut [f32]) -> Matmul<'a> {
    Matmul {
        w: &p.w,
        rows: p.rows.clone(),
        x,
        m,
        y,
        inputs: Inputs::F32,
    }
}

/// `x: [m, width]` placed at the part's wanted columns of a zeroed `[m, w.cols]`; `None`
/// when the part has no other columns (a cut at block boundaries) and `x` serves as it is.
fn padded_input(p: &SubMatrix, x: &[f32], m: usize, ws: &mut Workspace) -> Option<Vec<f32>> {
    let (cols, width) = (p.w.cols, x.len() / m.max(1));
    if width == cols {
        return None;
    }
    let mut out = ws.take(m * cols);
    if width == 0 {
        return Some(out);
    }
    for (o, row) in out.chunks_exact_mut(cols).zip(x.chunks_exact(width)) {
        o[p.col_pad..p.col_pad + width].copy_from_slice(row);
    }
    Some(out)
}

/// This rank's heads' queries from the q-LoRA activations `qr: [T, q_lora]`, computed with
/// `also` (rank 0's other products of `qr`) in one parallel pass; `[T, heads · hd]`.
pub(super) fn q_part(
    p: &AttnPart,
    qr: &[f32],
    t: usize,
    also: Option<Matmul<'_>>,
    ws: &mut Workspace,
) -> Vec<f32> {
    let mut q = ws.take(t * p.wq_b.rows.len());
    {
        let mut jobs: SmallVec<[Matmul; 2]> = SmallVec::new();
        jobs.push(rows_job(&p.wq_b, qr, t, &mut q));
        jobs.extend(also);
        profile::matmuls(&mut jobs);
    }
    q
}

/// This rank's share of the output projections of the attention output `o: [T, H·hd]`:
/// its groups through `wo_a`, then its columns of `wo_b`; `[T, D]`, summed over ranks.
/// Every rank of `comm` calls it for the same step (the rounding of `wo_b`'s input is a
/// collective).
pub(super) fn out_part(
    p: &AttnPart,
    c: &ModelConfig,
    o: &[f32],
    t: usize,
    comm: &dyn Collectives,
    ws: &mut Workspace,
) -> Vec<f32> {
    let r = c.o_lora_rank;
    let cols = p.groups.start * r..p.groups.end * r;
    if p.groups.is_empty() {
        // More ranks than output groups: this one adds nothing but its part in the rounding.
        round_split_input(comm, c.numerics, &mut [], t, cols, c.o_groups * r, ws);
        return ws.take(t * p.wo_b.w.rows);
    }
    let mut z = grouped_output(c, &p.wo_a.w, p.wo_a.rows.start, p.groups.clone(), o, t, ws);
    round_split_input(comm, c.numerics, &mut z, t, cols, c.o_groups * r, ws);
    let padded = padded_input(&p.wo_b, &z, t, ws);
    let mut out = ws.take(t * p.wo_b.w.rows);
    profile::matmul(&p.wo_b.w, padded.as_deref().unwrap_or(&z), t, &mut out);
    if let Some(v) = padded {
        ws.give(v);
    }
    ws.give(z);
    out
}

/// This rank's share of an expert's width (`inter` wide in all) for `x: [T, D]`, each row's
/// activation scaled by its routing weight (`None`: 1, the shared expert); `[T, D]`, summed
/// over ranks. Every rank of `comm` calls it for the same rows (the rounding of `w2`'s
/// input is a collective).
pub(super) fn width_part(
    (p, inter): (&WidthPart, usize),
    x: &[f32],
    t: usize,
    weights: Option<&[f32]>,
    (c, comm): (&ModelConfig, &dyn Collectives),
    ws: &mut Workspace,
) -> Vec<f32> {
    let width = p.width.len();
    if width == 0 {
        round_split_input(comm, c.numerics, &mut [], t, p.width.clone(), inter, ws);
        return ws.take(t * p.w2.w.rows);
    }
    let (mut g, mut u) = (ws.take(t * width), ws.take(t * width));
    {
        let mut jobs = [rows_job(&p.w1, x, t, &mut g), rows_job(&p.w3, x, t, &mut u)];
        profile::matmuls(&mut jobs);
    }
    let mut ones = ws.take(t);
    ones.fill(1.0);
    let mut tmp = ws.take(t.div_ceil(ROWS_PER_TASK).max(1) * width);
    let act = Activation {
        round: false,
        ..Activation::of(c)
    };
    activate(&mut g, &u, weights.unwrap_or(&ones), width, act, &mut tmp);
    round_split_input(comm, c.numerics, &mut g, t, p.width.clone(), inter, ws);
    let padded = padded_input(&p.w2, &g, t, ws);
    let mut out = ws.take(t * p.w2.w.rows);
    profile::matmul(&p.w2.w, padded.as_deref().unwrap_or(&g), t, &mut out);
    for v in [g, u, ones, tmp].into_iter().chain(padded) {
        ws.give(v);
    }
    out
}

/// Rounds this rank's columns `cols` of `t` rows `width` wide (`x: [t, cols.len()]`) as
/// [`Numerics::projection_input`] rounds whole rows. A block the ranks' parts cut takes its
/// amax over all of them: each rank's per-block maxima are gathered to rank 0, and the
/// largest broadcast back (two collectives, only in official numerics).
fn round_split_input(
    comm: &dyn Collectives,
    numerics: Numerics,
    x: &mut [f32],
    t: usize,
    cols: Range<usize>,
    width: usize,
    ws: &mut Workspace,
) {
    let Some((block, floor)) = numerics.projection_blocks() else {
        return;
    };
    let (nb, w) = (width.div_ceil(block), cols.len());
    let mut amaxes = ws.take(t * nb);
    if w > 0 {
        for (row, a) in x.chunks_exact(w).zip(amaxes.chunks_exact_mut(nb)) {
            for (b, piece) in pieces(&cols, block) {
                a[b] = amax(&row[piece]);
            }
        }
    }
    let size = comm.size();
    let root = comm.rank() == 0;
    let mut all = ws.take(if root { size * t * nb } else { 0 });
    comm.gather_f32(&amaxes, &vec![t * nb; size], &mut all);
    if root && t * nb > 0 {
        for theirs in all.chunks_exact(t * nb).skip(1) {
            amaxes
                .iter_mut()
                .zip(theirs)
                .for_each(|(a, &b)| *a = a.max(b));
        }
    }
    comm.broadcast_f32(&mut amaxes);
    if w > 0 {
        for (row, a) in x.chunks_exact_mut(w).zip(amaxes.chunks_exact(nb)) {
            for (b, piece) in pieces(&cols, block) {
                fp8_round_piece(&mut row[piece], a[b], floor);
            }
        }
    }
    ws.give(all);
    ws.give(amaxes);
}

/// The blocks of `block` columns that `cols` overlaps: each block's index and the overlap's
/// columns counted from `cols.start`.
fn pieces(cols: &Range<usize>, block: usize) -> impl Iterator<Item = (usize, Range<usize>)> + '_ {
    (cols.start / block..cols.end.div_ceil(block)).map(move |b| {
        let lo = (b * block).max(cols.start);
        let hi = ((b + 1) * block).min(cols.end);
        (b, lo - cols.start..hi - cols.start)
    })
}

/// This rank's logits, of its vocabulary rows, for the normed rows `h: [M, D]`; `[M, V_r]`.
/// `inputs`: what rank 0's numerics say of `h` ([`crate::numerics::Numerics::inputs`]).
pub(super) fn head_part(
    p: &HeadPart,
    h: &[f32],
    m: usize,
    inputs: Inputs,
    ws: &mut Workspace,
) -> Vec<f32> {
    let mut out = ws.take(m * p.vocab.len());
    let mut jobs = [rows_job(&p.w, h, m, &mut out).with_inputs(inputs)];
    profile::matmuls(&mut jobs);
    out
}

/// Rank 0: every head's queries `[T, H·hd]` into `q`, from its own heads' (`mine`) and the
/// other ranks'.
pub(super) fn gather_q(
    link: &LayerLink,
    c: &ModelConfig,
    mine: &[f32],
    t: usize,
    q: &mut [f32],
    ws: &mut Workspace,
) {
    let comm = &*link.comm;
    let widths = widths(comm, c.num_attention_heads, c.head_dim);
    gather_rows(comm, mine, &widths, t, q, ws);
}

/// Rank 0: the attention block's output `[T, D]` from `o: [T, H·hd]`, summed over ranks.
pub(super) fn split_out(
    link: &LayerLink,
    p: &AttnPart,
    c: &ModelConfig,
    o: &mut [f32],
    t: usize,
    ws: &mut Workspace,
) -> Vec<f32> {
    announce(&*link.comm, Op::AttnOut, link.layer, t, o);
    let mut out = out_part(p, c, o, t, &*link.comm, ws);
    link.comm.reduce_sum(&mut out);
    out
}

/// Rank 0: the logits `[M, V]` of the normed rows `h: [M, D]` into `logits`.
pub(super) fn split_head(
    comm: &dyn Collectives,
    p: &HeadPart,
    (vocab, inputs): (usize, Inputs),
    h: &mut [f32],
    m: usize,
    logits: &mut [f32],
    ws: &mut Workspace,
) {
    announce(comm, Op::Head, inputs_word(inputs), m, h);
    let mine = head_part(p, h, m, inputs, ws);
    let widths = widths(comm, vocab, 1);
    gather_rows(comm, &mine, &widths, m, logits, ws);
    ws.give(mine);
}

/// The head's inputs as its message header carries them (the header's layer word).
const INPUTS: [Inputs; 3] = [Inputs::F32, Inputs::Bf16Exact, Inputs::VecDot];

fn inputs_word(inputs: Inputs) -> usize {
    INPUTS
        .iter()
        .position(|&i| i == inputs)
        .expect("every kind")
}

/// The head's inputs from its header word ([`inputs_word`]); a word no rank 0 sends is f32.
pub(super) fn inputs_of_word(word: usize) -> Inputs {
    INPUTS.get(word).copied().unwrap_or_default()
}

/// Each rank's share of `n` things `unit` floats wide.
fn widths(comm: &dyn Collectives, n: usize, unit: usize) -> SmallVec<[usize; 8]> {
    (0..comm.size())
        .map(|r| share(n, r, comm.size()).len() * unit)
        .collect()
}

/// Rank 0: every rank's `[rows, widths[r]]` part gathered into `out: [rows, Σ widths]`.
fn gather_rows(
    comm: &dyn Collectives,
    mine: &[f32],
    widths: &[usize],
    rows: usize,
    out: &mut [f32],
    ws: &mut Workspace,
) {
    let counts: SmallVec<[usize; 8]> = widths.iter().map(|w| w * rows).collect();
    let mut gathered = ws.take(counts.iter().sum());
    comm.gather_f32(mine, &counts, &mut gathered);
    interleave(&gathered, widths, rows, out);
    ws.give(gathered);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::threads::job;
    use crate::parallel::Group;

    /// Rows cut into ranks' parts and rounded on their ranks equal the whole rows rounded in
    /// one place: cuts inside a block, whose parts' amaxes lie binades apart, a rank with
    /// no columns, V4's 128-blocks and V4.1's 32-blocks.
    #[test]
    fn split_rounding_equals_rounding_the_whole_rows() {
        let (width, t) = (96, 2);
        let rows: Vec<f32> = (0..t * width)
            .map(|i| {
                let v = ((i * 37 % 101) as f32 - 50.0) / 7.0;
                // Small values beside large ones in a block: subnormal at the block's
                // scale, normal at the part's own (where the scale changes the rounding).
                if i % width >= 60 {
                    v * 64.0
                } else {
                    v / 64.0
                }
            })
            .collect();
        for numerics in [Numerics::Official, Numerics::OfficialV41] {
            let mut want = rows.clone();
            numerics.projection_input(&mut want, width);
            for cuts in [vec![0, 48, 96], vec![0, 40, 41, 96], vec![0, 0, 96]] {
                let size = cuts.len() - 1;
                let parts = job(size, |wire| {
                    let comm = Group::new(&wire, (0..size).collect());
                    let cols = cuts[comm.rank()]..cuts[comm.rank() + 1];
                    let mut x: Vec<f32> = rows
                        .chunks_exact(width)
                        .flat_map(|row| row[cols.clone()].to_vec())
                        .collect();
                    let mut ws = Workspace::default();
                    round_split_input(&comm, numerics, &mut x, t, cols, width, &mut ws);
                    x
                });
                for (r, part) in parts.iter().enumerate() {
                    let cols = cuts[r]..cuts[r + 1];
                    for (row, got) in part.chunks(cols.len().max(1)).enumerate() {
                        let want = &want[row * width + cols.start..row * width + cols.end];
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(got), bits(want), "{numerics:?} cuts {cuts:?} rank {r}");
                    }
                }
            }
        }
    }
}
