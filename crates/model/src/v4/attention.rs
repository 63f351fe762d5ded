//! V4 attention (spec §3.4–3.8): single-latent MQA where one normed vector per token is both
//! key and value, partial interleaved RoPE on the trailing dims, a learned sink logit per
//! head, a sliding window, plus compressed entries (all of them for HCA, the indexer's
//! top-k for CSA), and a grouped low-rank output projection.

use super::compressor::{absorb, project};
use super::indexer::IndexerQueries;
use super::model::BatchRows;
use crate::cache::{CacheView, Stream};
use crate::config::ModelConfig;
use crate::weights::{AttentionWeights, Linear};
use deepinfer_kernels::linear::dot;
use deepinfer_kernels::norm::{rms_norm_rows, rms_norm_unweighted};
use deepinfer_kernels::rope::Rope;
use rayon::prelude::*;

/// Attention of layer `layer` for every token of the batch; `a`: the normed sublayer input
/// `[N, D]`. Reads earlier positions from `cache` and leaves this batch's state in it.
pub fn attention(
    w: &AttentionWeights,
    c: &ModelConfig,
    layer: usize,
    a: &[f32],
    rows: &BatchRows,
    cache: &mut dyn CacheView,
    rope: &Rope,
) -> Vec<f32> {
    let n = rows.positions.len();
    let (h, hd) = (c.num_attention_heads, c.head_dim);
    let eps = c.rms_norm_eps;
    let positions = &rows.positions;

    let mut qr = w.wq_a.forward(a, n);
    rms_norm_rows(&mut qr, &w.q_norm, eps);
    let mut q = w.wq_b.forward(&qr, n);
    for (i, row) in q.chunks_exact_mut(h * hd).enumerate() {
        for head in row.chunks_exact_mut(hd) {
            rms_norm_unweighted(head, eps);
            rope.apply(head, positions[i], false);
        }
    }
    let mut kv = w.wkv.forward(a, n);
    rms_norm_rows(&mut kv, &w.kv_norm, eps);
    for (i, row) in kv.chunks_exact_mut(hd).enumerate() {
        rope.apply(row, positions[i], false);
    }

    // Compressed state first: entries closed by this batch's tokens are visible to them.
    let mut compressors = Vec::new();
    if let Some(cw) = &w.compressor {
        compressors.push((cw, Stream::Attn));
    }
    if let Some(iw) = &w.indexer {
        compressors.push((&iw.compressor, Stream::Indexer));
    }
    for (cw, stream) in compressors {
        let proj = project(cw, a, positions);
        let width = 2 * cw.wkv.out_dim();
        for (s, span) in rows.spans.iter().enumerate() {
            let chunk = &proj[span.start * width..(span.start + span.len) * width];
            absorb(
                cw,
                chunk,
                positions[span.start],
                cache,
                s,
                layer,
                stream,
                rope,
                eps,
            );
        }
    }
    let indexer = w
        .indexer
        .as_ref()
        .map(|iw| IndexerQueries::new(iw, &qr, a, positions, rope, c.index_n_heads));
    let ratio = w.compressor.as_ref().map_or(0, |cw| cw.ratio);

    let window = c.sliding_window;
    let ring = cache.window_slots();
    let scale = (hd as f32).powf(-0.5);
    let mut out = vec![0.0f32; n * h * hd];
    {
        let cache: &dyn CacheView = &*cache;
        out.par_chunks_mut(h * hd)
            .enumerate()
            .for_each(|(i, o_row)| {
                let (s, p0, start) = rows.row_seq[i];
                let p = positions[i];
                // The index set: the window (own token included) — this batch's rows for its own
                // chunk, the ring for earlier positions — then the visible compressed entries.
                let mut keys: Vec<&[f32]> = (p.saturating_sub(window - 1)..=p)
                    .map(|j| {
                        if j >= p0 {
                            &kv[(start + j - p0) * hd..(start + j - p0 + 1) * hd]
                        } else {
                            cache.window(s, layer, j % ring)
                        }
                    })
                    .collect();
                // Entry w is complete (and visible) once token (w+1)·m−1 has been seen.
                if let Some(visible) = (p + 1).checked_div(ratio) {
                    let chosen: Vec<usize> = match &indexer {
                        Some(iq) => iq.select(i, cache, s, layer, visible, c.index_topk),
                        None => (0..visible).collect(),
                    };
                    keys.extend(
                        chosen
                            .iter()
                            .map(|&e| cache.entry(s, layer, Stream::Attn, e)),
                    );
                }
                let mut scores = vec![0.0f32; keys.len()];
                for (hi, o) in o_row.chunks_exact_mut(hd).enumerate() {
                    let qh = &q[(i * h + hi) * hd..(i * h + hi + 1) * hd];
                    for (sc, k) in scores.iter_mut().zip(&keys) {
                        *sc = dot(qh, k) * scale;
                    }
                    sink_softmax_combine(&scores, &keys, w.sink[hi], o);
                    rope.apply(o, p, true);
                }
            });
    }
    // Only now overwrite the ring: earlier queries of a long chunk still read old slots.
    for (s, span) in rows.spans.iter().enumerate() {
        let p0 = positions[span.start];
        for j in span.len.saturating_sub(ring)..span.len {
            let row = &kv[(span.start + j) * hd..(span.start + j + 1) * hd];
            cache
                .window_mut(s, layer, (p0 + j) % ring)
                .copy_from_slice(row);
        }
    }
    grouped_output(&out, n, c.o_groups, &w.wo_a, &w.wo_b)
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
    let gin = wo_a.in_dim();
    let r = wo_a.out_dim() / groups;
    let mut z = vec![0.0f32; t * groups * r];
    for g in 0..groups {
        let xg: Vec<f32> = o
            .chunks_exact(groups * gin)
            .flat_map(|row| row[g * gin..(g + 1) * gin].iter().copied())
            .collect();
        let mut yg = vec![0.0f32; t * r];
        crate::profile::matmuls(&mut [deepinfer_kernels::linear::Matmul {
            w: &wo_a.w,
            rows: g * r..(g + 1) * r,
            x: &xg,
            m: t,
            y: &mut yg,
        }]);
        for i in 0..t {
            z[i * groups * r + g * r..i * groups * r + (g + 1) * r]
                .copy_from_slice(&yg[i * r..(i + 1) * r]);
        }
    }
    wo_b.forward(&z, t)
}
