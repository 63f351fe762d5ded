//! V4 attention (spec §3.4–3.8): single-latent MQA where one normed vector per token is both
//! key and value, partial interleaved RoPE on the trailing dims, a learned sink logit per
//! head, a sliding window, plus compressed entries (all of them for HCA, the indexer's
//! top-k for CSA), and a grouped low-rank output projection.

use super::compressor::compress;
use super::indexer::IndexerQueries;
use crate::config::ModelConfig;
use crate::weights::{AttentionWeights, Linear};
use deepinfer_kernels::linear::dot;
use deepinfer_kernels::norm::{rms_norm_rows, rms_norm_unweighted};
use deepinfer_kernels::rope::Rope;
use rayon::prelude::*;

/// Attention over one sequence whose tokens are exactly positions `0..t` (a whole prompt).
/// `a`: the normed sublayer input `[t, D]`; returns `[t, D]`.
pub fn attention(w: &AttentionWeights, c: &ModelConfig, a: &[f32], rope: &Rope) -> Vec<f32> {
    let d = c.hidden_size;
    let t = a.len() / d;
    let (h, hd) = (c.num_attention_heads, c.head_dim);
    let eps = c.rms_norm_eps;

    let mut qr = w.wq_a.forward(a, t);
    rms_norm_rows(&mut qr, &w.q_norm, eps);
    let mut q = w.wq_b.forward(&qr, t);
    for (i, row) in q.chunks_exact_mut(h * hd).enumerate() {
        for head in row.chunks_exact_mut(hd) {
            rms_norm_unweighted(head, eps);
            rope.apply(head, i, false);
        }
    }
    let mut kv = w.wkv.forward(a, t);
    rms_norm_rows(&mut kv, &w.kv_norm, eps);
    for (i, row) in kv.chunks_exact_mut(hd).enumerate() {
        rope.apply(row, i, false);
    }

    let entries = w
        .compressor
        .as_ref()
        .map(|cw| compress(cw, a, t, rope, eps))
        .unwrap_or_default();
    let ratio = w.compressor.as_ref().map_or(0, |cw| cw.ratio);
    let n_entries = entries.len() / hd;
    let indexer = w.indexer.as_ref().map(|iw| {
        let keys = compress(&iw.compressor, a, t, rope, eps);
        let positions: Vec<usize> = (0..t).collect();
        (
            IndexerQueries::new(iw, &qr, a, &positions, rope, c.index_n_heads),
            keys,
        )
    });

    let window = c.sliding_window;
    let scale = (hd as f32).powf(-0.5);
    let mut out = vec![0.0f32; t * h * hd];
    out.par_chunks_mut(h * hd)
        .enumerate()
        .for_each(|(i, o_row)| {
            // The index set: the window (own token included), then the visible compressed entries.
            let mut keys: Vec<&[f32]> = (i.saturating_sub(window - 1)..=i)
                .map(|j| &kv[j * hd..(j + 1) * hd])
                .collect();
            // Entry w is complete (and visible) once token (w+1)·m−1 has been seen.
            if let Some(complete) = (i + 1).checked_div(ratio) {
                let visible = complete.min(n_entries);
                let chosen: Vec<usize> = match &indexer {
                    Some((iq, ikeys)) => iq.select(i, ikeys, visible, c.index_topk),
                    None => (0..visible).collect(),
                };
                keys.extend(chosen.iter().map(|&e| &entries[e * hd..(e + 1) * hd]));
            }
            let mut scores = vec![0.0f32; keys.len()];
            for (hi, o) in o_row.chunks_exact_mut(hd).enumerate() {
                let qh = &q[(i * h + hi) * hd..(i * h + hi + 1) * hd];
                for (s, k) in scores.iter_mut().zip(&keys) {
                    *s = dot(qh, k) * scale;
                }
                sink_softmax_combine(&scores, &keys, w.sink[hi], o);
                rope.apply(o, i, true);
            }
        });
    grouped_output(&out, t, c.o_groups, &w.wo_a, &w.wo_b)
}

/// `o = Σ_j softmax_j · v_j` where the softmax denominator also holds `exp(sink)`: the sink
/// is a logit whose value vector is zero.
fn sink_softmax_combine(scores: &[f32], values: &[&[f32]], sink: f32, o: &mut [f32]) {
    let mx = scores.iter().cloned().fold(sink, f32::max);
    let mut denom = (sink - mx).exp();
    o.iter_mut().for_each(|v| *v = 0.0);
    for (s, v) in scores.iter().zip(values) {
        let p = (s - mx).exp();
        denom += p;
        for (a, b) in o.iter_mut().zip(v.iter()) {
            *a += p * b;
        }
    }
    let inv = 1.0 / denom;
    o.iter_mut().for_each(|v| *v *= inv);
}

/// Block-diagonal `wo_a` (group `g` of heads → `R` values) then dense `wo_b`.
fn grouped_output(o: &[f32], t: usize, groups: usize, wo_a: &Linear, wo_b: &Linear) -> Vec<f32> {
    let gin = wo_a.in_dim;
    let r = wo_a.out_dim / groups;
    let mut z = vec![0.0f32; t * groups * r];
    for g in 0..groups {
        let xg: Vec<f32> = o
            .chunks_exact(groups * gin)
            .flat_map(|row| row[g * gin..(g + 1) * gin].iter().copied())
            .collect();
        let wg = &wo_a.w[g * r * gin..(g + 1) * r * gin];
        let yg = deepinfer_kernels::linear::matmul_t(&xg, t, gin, wg, r);
        for i in 0..t {
            z[i * groups * r + g * r..i * groups * r + (g + 1) * r]
                .copy_from_slice(&yg[i * r..(i + 1) * r]);
        }
    }
    wo_b.forward(&z, t)
}
