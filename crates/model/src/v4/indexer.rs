//! The lightning indexer (spec §3.7): scores every visible compressed entry for a query with
//! `Σ_h w_h · relu(q_h · K)` and keeps the top-k. CSA layers attend only to those.

use crate::cache::{CacheView, Stream};
use crate::config::ModelConfig;
use crate::record;
use deepinfer_kernels::topk::topk_into;
use deepinfer_kernels::vector::dot;

/// Projected indexer queries and head weights for the tokens of a batch.
pub struct IndexerQueries<'a> {
    /// How the cache holds the keys ([`record`]).
    pub config: &'a ModelConfig,
    pub heads: usize,
    pub head_dim: usize,
    /// `[N, heads, head_dim]`, rotated at each token's position.
    pub q: &'a [f32],
    /// `[N, heads]`, scaled by `heads^-½`.
    pub weights: &'a [f32],
}

impl IndexerQueries<'_> {
    /// Top-`k` of the first `visible` indexer keys of batch sequence `seq` for batch row `i`,
    /// best first, lower index on ties, into `picked` (`scores` and a key buffer: scratch).
    #[allow(clippy::too_many_arguments)]
    pub fn select(
        &self,
        i: usize,
        cache: &dyn CacheView,
        seq: usize,
        layer: usize,
        visible: usize,
        k: usize,
        (scores, key_buf): (&mut Vec<f32>, &mut Vec<f32>),
        picked: &mut Vec<usize>,
    ) {
        picked.clear();
        if visible <= k {
            picked.extend(0..visible);
            return;
        }
        let hd = self.head_dim;
        let softmax_scale = (hd as f32).powf(-0.5);
        let q = &self.q[i * self.heads * hd..(i + 1) * self.heads * hd];
        let wts = &self.weights[i * self.heads..(i + 1) * self.heads];
        let packed = self.config.numerics.packs_cache();
        if packed && key_buf.len() < hd {
            key_buf.resize(hd, 0.0);
        }
        let len = hd.min(key_buf.len());
        let key_buf = &mut key_buf[..len];
        scores.clear();
        scores.extend((0..visible).map(|e| {
            let rec = cache.entry(seq, layer, Stream::Indexer, e);
            let key: &[f32] = if packed {
                record::load_key(self.config, rec, key_buf);
                key_buf
            } else {
                rec
            };
            let mut s = 0.0f32;
            for (h, wt) in wts.iter().enumerate() {
                s += dot(&q[h * hd..(h + 1) * hd], key).max(0.0) * softmax_scale * wt;
            }
            s
        }));
        crate::profile::cache_read(visible * record::key_words(self.config) * 4);
        topk_into(scores, k, picked);
    }
}
