//! The lightning indexer (docs/MODEL.md §3.7): scores every visible compressed entry for a query with
//! `Σ_h w_h · relu(q_h · K)` and keeps the top-k. CSA layers attend only to those.
//!
//! V4.1's two-level variant (docs/MODEL.md §8.5): the candidate source also keeps, per query, the
//! best blocks of entries (a block scores its best entry; the newest block always stays), and
//! later index sources pick only among the entries of those blocks.

use super::compressor::CompressorWeights;
use crate::cache::{CacheView, Stream};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::linear::Linear;
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

/// Where a query's keys are and which of them it may pick.
pub struct Scope<'a> {
    pub seq: usize,
    /// The layer whose cache holds the keys (V4.1: the kv source).
    pub layer: usize,
    /// Keys `0..visible` exist for this query.
    pub visible: usize,
    /// Picks only inside these blocks of `block_size` keys (V4.1's later index sources).
    pub within: Option<(&'a [usize], usize)>,
}

impl IndexerQueries<'_> {
    /// Top-`k` of the keys `scope` allows for batch row `i`, best first, lower index on ties,
    /// into `picked`; every visible key when there are no more than `k`. `scores` (left
    /// holding every visible key's score when they were scored) and a key buffer: scratch.
    pub fn select(
        &self,
        i: usize,
        cache: &dyn CacheView,
        scope: &Scope,
        k: usize,
        (scores, key_buf): (&mut Vec<f32>, &mut Vec<f32>),
        picked: &mut Vec<usize>,
    ) {
        picked.clear();
        scores.clear();
        if scope.visible <= k {
            picked.extend(0..scope.visible);
            return;
        }
        self.score(i, cache, scope, scores, key_buf);
        let Some((blocks, size)) = scope.within else {
            topk_into(scores, k, picked);
            return;
        };
        // Outside the candidates nothing may be picked: score them below everything, pick,
        // and put the real scores back for whoever reads them next.
        key_buf.clear();
        key_buf.extend_from_slice(scores);
        scores.fill(f32::NEG_INFINITY);
        for &b in blocks {
            let r = (b * size).min(scope.visible)..((b + 1) * size).min(scope.visible);
            scores[r.clone()].copy_from_slice(&key_buf[r]);
        }
        topk_into(scores, k, picked);
        scores.copy_from_slice(&key_buf[..scope.visible]);
    }

    /// Every visible key's score for row `i`, into `scores`.
    fn score(
        &self,
        i: usize,
        cache: &dyn CacheView,
        scope: &Scope,
        scores: &mut Vec<f32>,
        key_buf: &mut Vec<f32>,
    ) {
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
        scores.extend((0..scope.visible).map(|e| {
            let rec = cache.entry(scope.seq, scope.layer, Stream::Indexer, e);
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
        crate::profile::cache_read(scope.visible * record::key_words(self.config) * 4);
    }
}

/// The candidate source's blocks for one query from its keys' `scores`: the `top` blocks of
/// `size` keys by their best key, the newest block (the one holding the last key) always
/// among them; into `out`, best first (`block_scores`: scratch).
pub fn candidate_blocks(
    scores: &[f32],
    size: usize,
    top: usize,
    block_scores: &mut Vec<f32>,
    out: &mut Vec<usize>,
) {
    block_scores.clear();
    block_scores.extend(
        scores
            .chunks(size)
            .map(|b| b.iter().copied().fold(f32::NEG_INFINITY, f32::max)),
    );
    if let Some(newest) = block_scores.last_mut() {
        *newest = f32::INFINITY;
    }
    topk_into(block_scores, top, out);
}

#[derive(Debug)]
pub struct IndexerWeights {
    pub wq_b: Linear,
    pub weights_proj: Linear,
    /// V4's indexer compresses its own keys; V4.1's reads the kv source's
    /// ([`CompressorWeights::keys`]).
    pub compressor: Option<CompressorWeights>,
}

impl IndexerWeights {
    /// An indexer's query projection and head weights (its compressor left to the caller).
    pub(crate) fn load_queries(
        ck: &Checkpoint,
        c: &ModelConfig,
        p: &str,
    ) -> Result<IndexerWeights, CheckpointError> {
        Ok(IndexerWeights {
            wq_b: Linear::load(
                ck,
                &format!("{p}.attn.indexer.wq_b"),
                c.index_n_heads * c.index_head_dim,
                c.q_lora_rank,
            )?,
            weights_proj: Linear::load(
                ck,
                &format!("{p}.attn.indexer.weights_proj"),
                c.index_n_heads,
                c.hidden_size,
            )?,
            compressor: None,
        })
    }
}
