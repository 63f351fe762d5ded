//! Tensor parallelism's steps (see [`crate::parallel`]): what every rank computes with its
//! parts, and rank 0's side of each exchange. The other ranks' side is in `worker.rs`.

use super::output_groups::grouped_output;
use super::swiglu::{activate, Activation, ROWS_PER_TASK};
use super::workspace::Workspace;
use crate::config::ModelConfig;
use crate::parallel::{
    announce, interleave, share, AttnPart, Collectives, HeadPart, LayerLink, Op, WidthPart,
};
use crate::profile;
use deepinfer_kernels::linear::Matmul;
use deepinfer_kernels::sub_matrix::SubMatrix;
use smallvec::SmallVec;

/// The product of a part's wanted rows: `[m, rows]`.
fn rows_job<'a>(p: &'a SubMatrix, x: &'a [f32], m: usize, y: &'a mut [f32]) -> Matmul<'a> {
    Matmul {
        w: &p.w,
        rows: p.rows.clone(),
        x,
        m,
        y,
        bf16_x: false,
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
pub(super) fn out_part(
    p: &AttnPart,
    c: &ModelConfig,
    o: &[f32],
    t: usize,
    ws: &mut Workspace,
) -> Vec<f32> {
    if p.groups.is_empty() {
        // More ranks than output groups: this one adds nothing.
        return ws.take(t * p.wo_b.w.rows);
    }
    let z = grouped_output(c, &p.wo_a.w, p.wo_a.rows.start, p.groups.clone(), o, t, ws);
    let padded = padded_input(&p.wo_b, &z, t, ws);
    let mut out = ws.take(t * p.wo_b.w.rows);
    profile::matmul(&p.wo_b.w, padded.as_deref().unwrap_or(&z), t, &mut out);
    if let Some(v) = padded {
        ws.give(v);
    }
    ws.give(z);
    out
}

/// This rank's share of an expert's width for `x: [T, D]`, each row's activation scaled by
/// its routing weight (`None`: 1, the shared expert); `[T, D]`, summed over ranks.
pub(super) fn width_part(
    p: &WidthPart,
    x: &[f32],
    t: usize,
    weights: Option<&[f32]>,
    c: &ModelConfig,
    ws: &mut Workspace,
) -> Vec<f32> {
    let width = p.width.len();
    if width == 0 {
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
    // A part of the width is not a whole block of `w2`'s input, so official numerics (which
    // rounds whole blocks) is refused on a split model before it gets here.
    let act = Activation::of(c);
    activate(&mut g, &u, weights.unwrap_or(&ones), width, act, &mut tmp);
    let padded = padded_input(&p.w2, &g, t, ws);
    let mut out = ws.take(t * p.w2.w.rows);
    profile::matmul(&p.w2.w, padded.as_deref().unwrap_or(&g), t, &mut out);
    for v in [g, u, ones, tmp].into_iter().chain(padded) {
        ws.give(v);
    }
    out
}

/// This rank's logits, of its vocabulary rows, for the normed rows `h: [M, D]`; `[M, V_r]`.
/// `exact`: `h` is exact in bf16 ([`crate::numerics::Numerics::dense_input`]).
pub(super) fn head_part(
    p: &HeadPart,
    h: &[f32],
    m: usize,
    exact: bool,
    ws: &mut Workspace,
) -> Vec<f32> {
    let mut out = ws.take(m * p.vocab.len());
    let mut jobs = [rows_job(&p.w, h, m, &mut out).with_bf16_x(exact)];
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
    let mut out = out_part(p, c, o, t, ws);
    link.comm.reduce_sum(&mut out);
    out
}

/// Rank 0: the logits `[M, V]` of the normed rows `h: [M, D]` into `logits`.
pub(super) fn split_head(
    comm: &dyn Collectives,
    p: &HeadPart,
    (vocab, exact): (usize, bool),
    h: &mut [f32],
    m: usize,
    logits: &mut [f32],
    ws: &mut Workspace,
) {
    announce(comm, Op::Head, usize::from(exact), m, h);
    let mine = head_part(p, h, m, exact, ws);
    let widths = widths(comm, vocab, 1);
    gather_rows(comm, &mine, &widths, m, logits, ws);
    ws.give(mine);
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
