//! Mixture of experts (docs/MODEL.md §3.9): hash-routed (frozen token → experts table) or scored
//! top-k with a selection-only bias, renormalised weights × routed_scaling_factor, clamped
//! SwiGLU experts, plus the always-on shared expert.
//!
//! Tokens are grouped by expert, so each selected expert's `w1`/`w3`/`w2` stream through
//! the cores once per step whatever the batch; the gate and up products of every selected
//! expert (and the shared one) share one parallel pass, as do the down products. The
//! routing weight scales the hidden activation before `w2`, as DeepSeek's reference does.

mod weights;
pub use weights::{ImageRouting, MoeWeights, Routing, SharedExpert, TextRouting};

use super::expert_pass::{experts_per_pass, pass_experts, pass_order, PassRows, SharedBufs};
use super::swiglu::{Activation, ROWS_PER_TASK};
use super::tensor_parallel;
use super::workspace::Workspace;
use crate::config::{ModelConfig, ScoringFunc};
use crate::experts::ExpertError;
use crate::experts::ExpertWeights;
use crate::experts::RoutedExperts;
use crate::parallel::{self, announce, Collectives, MoeMessage, WidthPart};
use crate::profile::{scope, Op};
use deepinfer_kernels::topk::topk_into;
use deepinfer_kernels::vector::{axpy, exp_in_place};
use rayon::prelude::*;
use smallvec::SmallVec;

fn softplus(x: f32) -> f32 {
    // torch's softplus switches to the identity above 20 (beta = 1).
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Router scores for one token's logits, in place.
fn scores(func: ScoringFunc, s: &mut [f32]) {
    match func {
        ScoringFunc::SqrtSoftplus => s.iter_mut().for_each(|x| *x = softplus(*x).sqrt()),
        ScoringFunc::Sigmoid => s.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
        ScoringFunc::Softmax => {
            let mx = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            s.iter_mut().for_each(|x| *x -= mx);
            exp_in_place(s);
            let sum: f32 = s.iter().sum();
            s.iter_mut().for_each(|x| *x /= sum);
        }
    }
}

/// Routed experts and weights for every token into `ids`/`wts` (`k` per token).
pub fn route(
    w: &MoeWeights,
    c: &ModelConfig,
    x: &[f32],
    token_ids: &[u32],
    ids: &mut [usize],
    wts: &mut [f32],
    ws: &mut Workspace,
) {
    let t = token_ids.len();
    let (k, e) = (c.num_experts_per_tok, c.n_routed_experts);
    let mut logits = ws.take(t * e);
    let mut xd = ws.take(c.numerics.copy_len(x.len()));
    let xd_view = c.numerics.dense_view(x, &mut xd);
    w.gate.forward_dense(xd_view, t, &mut logits, c.numerics);
    ws.give(xd);
    let _p = scope(Op::Moe);
    let mut biased = ws.take(e);
    let mut chosen = ws.take_idx(e);
    for i in 0..t {
        let s = &mut logits[i * e..(i + 1) * e];
        scores(c.scoring_func, s);
        let image = w.routing.image.as_ref();
        match (
            image.filter(|im| im.ids.contains(&token_ids[i])),
            &w.routing.text,
        ) {
            (Some(im), _) => biased_topk(s, &im.bias, k, &mut biased, &mut chosen),
            (None, TextRouting::Scored(bias)) => biased_topk(s, bias, k, &mut biased, &mut chosen),
            (None, TextRouting::Hash(table)) => {
                let tok = token_ids[i] as usize;
                chosen.clear();
                chosen.extend(table[tok * k..(tok + 1) * k].iter().map(|&v| v as usize));
            }
        }
        // HF always renormalises; DeepSeek's reference skips it for softmax scoring, which
        // its configs express as norm_topk_prob = false.
        let sum: f32 = if c.norm_topk_prob {
            chosen.iter().map(|&j| s[j]).sum::<f32>() + 1e-20
        } else {
            1.0
        };
        for (slot, &j) in chosen.iter().enumerate() {
            ids[i * k + slot] = j;
            wts[i * k + slot] = s[j] / sum * c.routed_scaling_factor;
        }
    }
    ws.give(logits);
    ws.give(biased);
    ws.give_idx(chosen);
}

/// The `k` experts of highest score plus `bias` (the bias picks, it does not weigh).
fn biased_topk(s: &[f32], bias: &[f32], k: usize, biased: &mut [f32], chosen: &mut Vec<usize>) {
    for ((b, &v), &bb) in biased.iter_mut().zip(s).zip(bias) {
        *b = v + bb;
    }
    topk_into(biased, k, chosen);
}

/// The picks sorted by expert (stable: token order within an expert), as
/// `(offsets, order, xs)`: `order[r]` is the pick (token · k + slot) in row r of the
/// gathered batch, expert e owns rows `offsets[e]..offsets[e + 1]`, `xs` holds each row's
/// input.
fn group_by_expert(
    ids: &[usize],
    x: &[f32],
    k: usize,
    d: usize,
    n_exp: usize,
    ws: &mut Workspace,
) -> (Vec<usize>, Vec<usize>, Vec<f32>) {
    let mut offsets = ws.take_idx(n_exp + 1);
    let mut order = ws.take_idx(ids.len());
    let mut xs = ws.take(ids.len() * d);
    let _p = scope(Op::Moe);
    for &e in ids.iter() {
        offsets[e + 1] += 1;
    }
    for e in 0..n_exp {
        offsets[e + 1] += offsets[e];
    }
    let mut fill = ws.take_idx(n_exp);
    fill.copy_from_slice(&offsets[..n_exp]);
    for (pick, &e) in ids.iter().enumerate() {
        order[fill[e]] = pick;
        fill[e] += 1;
    }
    ws.give_idx(fill);
    xs.par_chunks_mut(d)
        .zip(order.par_iter())
        .with_min_len(ROWS_PER_TASK)
        .for_each(|(row, &pick)| row.copy_from_slice(&x[pick / k * d..(pick / k + 1) * d]));
    (offsets, order, xs)
}

/// The MoE output for `x: [T, D]` (normed FFN input) of tokens `token_ids`; `[T, D]`.
///
/// Split over ranks, this rank (0) sends the input and routing to the others, computes the
/// picks on its own experts and the shared expert, and receives the sum of everyone's.
pub fn moe(
    w: &MoeWeights,
    c: &ModelConfig,
    x: &[f32],
    token_ids: &[u32],
    ws: &mut Workspace,
) -> Result<Vec<f32>, ExpertError> {
    let t = token_ids.len();
    let (d, k) = (c.hidden_size, c.num_experts_per_tok);
    let mut ids = ws.take_idx(t * k);
    let mut wts = ws.take(t * k);
    route(w, c, x, token_ids, &mut ids, &mut wts, ws);
    // The router reads `x` as it is; every expert's `w1`/`w3` reads it as a projection input.
    let mut xq = ws.take(c.numerics.copy_len(x.len()));
    let x = c.numerics.projection_view(x, d, &mut xq);
    let (shared, shared_part) = match &w.shared {
        Some(SharedExpert::Whole(e)) => (Some(e), None),
        Some(SharedExpert::Part(p)) => (None, Some(p)),
        None => (None, None),
    };
    let held = LocalExperts {
        routed: &w.experts,
        shared,
        shared_part,
        comm: w.split.as_ref().map(|l| &*l.comm),
    };
    let Some(link) = &w.split else {
        let out = local_part(&held, c, x, &ids, &wts, ws);
        ws.give(xq);
        ws.give(wts);
        ws.give_idx(ids);
        return out;
    };
    let mut msg = MoeMessage::pack(x, &ids, &wts, d, k, ws.take(0));
    announce(&*link.comm, parallel::Op::Moe, link.layer, t, &mut msg.buf);
    ws.give(msg.buf);
    let out = local_part(&held, c, x, &ids, &wts, ws);
    ws.give(xq);
    ws.give(wts);
    ws.give_idx(ids);
    // The reduction runs even when this rank's part failed: the others are in it.
    let (mut sum, failed) = match out {
        Ok(sum) => (sum, None),
        Err(e) => (ws.take(t * d), Some(e)),
    };
    let failed_elsewhere = reduce_with_status(&*link.comm, &mut sum, false);
    match (failed, failed_elsewhere.is_empty()) {
        (Some(e), _) => {
            ws.give(sum);
            Err(e)
        }
        (None, false) => {
            ws.give(sum);
            Err(ExpertError::OtherRanks {
                ranks: failed_elsewhere,
            })
        }
        (None, true) => Ok(sum),
    }
}

/// The MoE's sum-reduction with one more float: a rank whose part failed (it sends zeros)
/// adds `2^(rank − 1)`, so on rank 0 the sum names the ranks that failed (every one of
/// them while they lie within 24 ranks of each other, f32's exact range).
pub(super) fn reduce_with_status(
    comm: &dyn Collectives,
    part: &mut Vec<f32>,
    failed: bool,
) -> Vec<usize> {
    let rank = comm.rank();
    part.push(if failed && rank > 0 {
        2f32.powi(rank as i32 - 1)
    } else {
        0.0
    });
    comm.reduce_sum(part);
    let bits = part.pop().unwrap_or(0.0) as u64;
    (0..64)
        .filter(|b| bits >> b & 1 == 1)
        .map(|b| b + 1)
        .collect()
}

/// The experts a rank computes a MoE with: the routed ones it holds and the shared expert,
/// whole or its part of the width.
pub(super) struct LocalExperts<'a> {
    pub(super) routed: &'a RoutedExperts,
    pub(super) shared: Option<&'a ExpertWeights>,
    pub(super) shared_part: Option<&'a WidthPart>,
    /// The ranks the model is split over: a width split rounds `w2`'s input among them.
    pub(super) comm: Option<&'a dyn Collectives>,
}

/// What this rank computes of a MoE: the picks `ids`/`wts` on the experts it holds, and the
/// shared expert; `[T, D]`.
pub(super) fn local_part(
    held: &LocalExperts,
    c: &ModelConfig,
    x: &[f32],
    ids: &[usize],
    wts: &[f32],
    ws: &mut Workspace,
) -> Result<Vec<f32>, ExpertError> {
    let LocalExperts {
        routed: experts,
        shared,
        shared_part,
        comm,
    } = *held;
    let t = ids.len() / c.num_experts_per_tok.max(1);
    let split = |what| comm.unwrap_or_else(|| panic!("{what} split by width without ranks"));
    // The shared part first: its rounding is collective, so it runs even where the routed
    // experts then fail (a streamed expert that cannot be read).
    let shared_inter = c.moe_intermediate_size * c.n_shared_experts;
    let s = shared_part.map(|p| {
        let split = (c, split("the shared expert"));
        tensor_parallel::width_part((p, shared_inter), x, t, None, split, ws)
    });
    let out = match experts {
        RoutedExperts::Sharded(parts) => {
            let split = split("routed experts");
            Ok(width_sum(parts, (c, split), x, (ids, wts), ws))
        }
        _ => routed_sum(experts, shared, c, x, ids, wts, ws),
    };
    match (out, s) {
        (Ok(mut out), Some(s)) => {
            out.iter_mut().zip(&s).for_each(|(o, v)| *o += v);
            ws.give(s);
            Ok(out)
        }
        (out, s) => {
            s.into_iter().for_each(|s| ws.give(s));
            out
        }
    }
}

/// The output of the picks `ids`/`wts` (`k` per token of `x: [T, D]`) that fall on the
/// experts held here, plus the shared expert's when given; `[T, D]`.
///
/// Experts go in passes: gate and up of every expert of the pass (and the shared expert)
/// in one parallel pass, the activation, then the down products in another. Resident, the
/// shared expert rides with the first pass; streamed, it computes first, while the reads
/// of the first pass are under way.
fn routed_sum(
    experts: &RoutedExperts,
    shared: Option<&ExpertWeights>,
    c: &ModelConfig,
    x: &[f32],
    ids: &[usize],
    wts: &[f32],
    ws: &mut Workspace,
) -> Result<Vec<f32>, ExpertError> {
    let d = c.hidden_size;
    let (k, n_exp) = (c.num_experts_per_tok, c.n_routed_experts);
    let t = ids.len() / k.max(1);
    let inter = c.moe_intermediate_size;
    let (offsets, order, xs) = group_by_expert(ids, x, k, d, n_exp, ws);
    let shared_inter = shared.map_or(0, |s| s.w1.out_dim());
    let (mut g, mut u) = (ws.take(t * k * inter), ws.take(t * k * inter));
    let (mut gs, mut us) = (ws.take(t * shared_inter), ws.take(t * shared_inter));
    let mut y = ws.take(t * k * d);
    let mut ys = ws.take(t * d);
    let active: SmallVec<[usize; 256]> = experts
        .held()
        .filter(|&e| offsets[e + 1] > offsets[e])
        .collect();
    let row_wts = row_weights(&order, wts, ws);
    let width = inter.max(shared_inter);
    let mut tmp = ws.take((t * k).max(t).div_ceil(ROWS_PER_TASK).max(1) * width);
    let mut ones = ws.take(t);
    ones.fill(1.0);
    let act = Activation::of(c);

    let per_pass = experts_per_pass(experts);
    let (first, rest) = pass_order(experts, &active);
    let streamed = matches!(experts, RoutedExperts::Streamed { .. });
    let mut sh = SharedBufs {
        gs: &mut gs,
        us: &mut us,
        ys: &mut ys,
        ones: &ones,
    };
    if let (true, Some(s)) = (streamed || active.is_empty(), shared) {
        sh.run(s, x, t, act, &mut tmp);
    }
    let groups: SmallVec<[&[usize]; 8]> = first
        .chunks(per_pass)
        .chain(rest.chunks(per_pass))
        .collect();
    let mut rows = PassRows {
        offsets: &offsets,
        xs: &xs,
        g: &mut g,
        u: &mut u,
        y: &mut y,
        row_wts: &row_wts,
        d,
        inter,
    };
    for (gi, group) in groups.iter().enumerate() {
        let pass = pass_experts(experts, group, groups.get(gi + 1).copied())?;
        // The shared expert rides with the first pass when it has not run yet.
        let ride = if gi == 0 && !streamed { shared } else { None };
        rows.run(
            group,
            &pass,
            ride.map(|s| (s, &mut sh, x, t)),
            act,
            &mut tmp,
        );
    }
    let rows = Rows {
        order: &order,
        y: &y,
        wts: &row_wts,
    };
    let out = sum_rows(rows, shared.map(|_| &ys[..]), c, ws);
    for v in [xs, g, u, gs, us, y, ys, row_wts, tmp, ones] {
        ws.give(v);
    }
    for v in [offsets, order] {
        ws.give_idx(v);
    }
    Ok(out)
}

/// Each gathered row's routing weight: `wts` in the rows' (expert) order.
fn row_weights(order: &[usize], wts: &[f32], ws: &mut Workspace) -> Vec<f32> {
    let mut row_wts = ws.take(order.len());
    for (w, &p) in row_wts.iter_mut().zip(order) {
        *w = wts[p];
    }
    row_wts
}

/// [`routed_sum`] over this rank's share of every expert's width: one expert after the
/// other, on its rows of the grouped picks.
fn width_sum(
    parts: &[WidthPart],
    (c, comm): (&ModelConfig, &dyn Collectives),
    x: &[f32],
    (ids, wts): (&[usize], &[f32]),
    ws: &mut Workspace,
) -> Vec<f32> {
    let (d, k) = (c.hidden_size, c.num_experts_per_tok);
    let (offsets, order, xs) = group_by_expert(ids, x, k, d, c.n_routed_experts, ws);
    let mut y = ws.take(order.len() * d);
    let row_wts = row_weights(&order, wts, ws);
    for (e, part) in parts.iter().enumerate() {
        let rows = offsets[e]..offsets[e + 1];
        if rows.is_empty() {
            continue;
        }
        let x = &xs[rows.start * d..rows.end * d];
        let wt = Some(&row_wts[rows.clone()]);
        let part = (part, c.moe_intermediate_size);
        let out = tensor_parallel::width_part(part, x, rows.len(), wt, (c, comm), ws);
        y[rows.start * d..rows.end * d].copy_from_slice(&out);
        ws.give(out);
    }
    let rows = Rows {
        order: &order,
        y: &y,
        wts: &row_wts,
    };
    let out = sum_rows(rows, None, c, ws);
    ws.give(xs);
    ws.give_idx(offsets);
    ws.give_idx(order);
    ws.give(y);
    ws.give(row_wts);
    out
}

/// The routed rows' outputs in row (expert) order, which pick each row is, and its weight.
#[derive(Clone, Copy)]
struct Rows<'a> {
    order: &'a [usize],
    y: &'a [f32],
    wts: &'a [f32],
}

/// Each token's output: its routed rows in row (expert) order, each scaled by its routing
/// weight where the numerics weights the experts' outputs (else the activation did), then the
/// shared expert's (`ys`, when there is one).
fn sum_rows(rows: Rows, ys: Option<&[f32]>, c: &ModelConfig, ws: &mut Workspace) -> Vec<f32> {
    let _p = scope(Op::Moe);
    let Rows { order, y, wts } = rows;
    let (k, d) = (c.num_experts_per_tok, c.hidden_size);
    let t = order.len() / k.max(1);
    let after = c.numerics.weights_after_down();
    let mut out = ws.take(t * d);
    // Each token's rows, in row (expert) order: `rows_of_token[tok · k ..]`.
    let mut rows_of_token = ws.take_idx(t * k);
    let mut fill = ws.take_idx(t);
    for (r, &pick) in order.iter().enumerate() {
        let tok = pick / k;
        rows_of_token[tok * k + fill[tok]] = r;
        fill[tok] += 1;
    }
    out.par_chunks_mut(d)
        .enumerate()
        .with_min_len(ROWS_PER_TASK / k.max(1))
        .for_each(|(tok, o)| {
            for &r in &rows_of_token[tok * k..(tok + 1) * k] {
                axpy(o, if after { wts[r] } else { 1.0 }, &y[r * d..(r + 1) * d]);
            }
            if let Some(ys) = ys {
                for (v, s) in o.iter_mut().zip(&ys[tok * d..(tok + 1) * d]) {
                    *v += s;
                }
            }
        });
    ws.give_idx(rows_of_token);
    ws.give_idx(fill);
    out
}
