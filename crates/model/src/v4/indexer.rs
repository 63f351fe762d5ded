//! The lightning indexer (spec §3.7): scores every visible compressed entry for a query with
//! `Σ_h w_h · relu(q_h · K)` and keeps the top-k. CSA layers attend only to those.

use crate::cache::{CacheView, Stream};
use crate::weights::IndexerWeights;
use deepinfer_kernels::linear::dot;
use deepinfer_kernels::rope::Rope;
use deepinfer_kernels::topk::topk_indices;

/// Projected indexer queries and head weights for the tokens of a batch.
pub struct IndexerQueries {
    heads: usize,
    head_dim: usize,
    /// `[N, heads, head_dim]`, rotated at each token's position.
    q: Vec<f32>,
    /// `[N, heads]`, scaled by `heads^-½`.
    weights: Vec<f32>,
}

impl IndexerQueries {
    /// `qr`: the attention's normed q-LoRA activations `[N, Q]`; `a`: the attention input.
    pub fn new(
        w: &IndexerWeights,
        qr: &[f32],
        a: &[f32],
        positions: &[usize],
        rope: &Rope,
        heads: usize,
    ) -> Self {
        let n = positions.len();
        let head_dim = w.wq_b.out_dim() / heads;
        let mut q = w.wq_b.forward(qr, n);
        for (i, row) in q.chunks_exact_mut(heads * head_dim).enumerate() {
            for h in row.chunks_exact_mut(head_dim) {
                rope.apply(h, positions[i], false);
            }
        }
        let mut weights = w.weights_proj.forward(a, n);
        let scale = (heads as f32).powf(-0.5);
        weights.iter_mut().for_each(|v| *v *= scale);
        Self {
            heads,
            head_dim,
            q,
            weights,
        }
    }

    /// Top-`k` of the first `visible` indexer keys of batch sequence `seq` for batch row `i`,
    /// best first, lower index on ties.
    #[allow(clippy::too_many_arguments)]
    pub fn select(
        &self,
        i: usize,
        cache: &dyn CacheView,
        seq: usize,
        layer: usize,
        visible: usize,
        k: usize,
    ) -> Vec<usize> {
        if visible <= k {
            return (0..visible).collect();
        }
        let hd = self.head_dim;
        let softmax_scale = (hd as f32).powf(-0.5);
        let q = &self.q[i * self.heads * hd..(i + 1) * self.heads * hd];
        let wts = &self.weights[i * self.heads..(i + 1) * self.heads];
        let scores: Vec<f32> = (0..visible)
            .map(|e| {
                let key = cache.entry(seq, layer, Stream::Indexer, e);
                let mut s = 0.0f32;
                for (h, wt) in wts.iter().enumerate() {
                    s += dot(&q[h * hd..(h + 1) * hd], key).max(0.0) * softmax_scale * wt;
                }
                s
            })
            .collect();
        topk_indices(&scores, k)
    }
}
