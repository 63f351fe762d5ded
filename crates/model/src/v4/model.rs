//! The whole model: embedding → 4-stream residual → blocks → hyper head → norm → lm_head.

use super::block::block_forward;
use super::hyper::hc_head;
use crate::batch::{ForwardBatch, Logits};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{AttnKind, ConfigError, ModelConfig, RopeParams};
use crate::weights::ModelWeights;
use deepinfer_kernels::norm::rms_norm_rows;
use deepinfer_kernels::rope::{Rope, YarnParams};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("config: {0}")]
    Config(#[from] ConfigError),
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("sequence {seq}: position {pos} at offset {offset} is not supported without a cache (whole prompts from position 0 only)")]
    UnsupportedPositions {
        seq: usize,
        offset: usize,
        pos: usize,
    },
    #[error("the batch has {tokens} tokens but {positions} positions")]
    PositionsLength { positions: usize, tokens: usize },
    #[error("logits row {row} is outside the batch of {tokens} tokens")]
    BadLogitsRow { row: usize, tokens: usize },
    #[error("a span [{start}, {start}+{len}) does not fit the batch of {tokens} tokens")]
    BadSpan {
        start: usize,
        len: usize,
        tokens: usize,
    },
}

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    rope_main: Rope,
    rope_compress: Rope,
}

fn rope_table(c: &ModelConfig, p: &RopeParams) -> Rope {
    let yarn = p.yarn.as_ref().map(|y| YarnParams {
        factor: y.factor,
        original_max_position_embeddings: y.original_max_position_embeddings,
        beta_fast: y.beta_fast,
        beta_slow: y.beta_slow,
    });
    Rope::new(c.qk_rope_head_dim, p.theta, yarn)
}

impl Model {
    pub fn new(config: ModelConfig, weights: ModelWeights) -> Self {
        let rope_main = rope_table(&config, &config.rope_main);
        let rope_compress = rope_table(&config, &config.rope_compress);
        Self {
            config,
            weights,
            rope_main,
            rope_compress,
        }
    }

    /// Loads `config.json` and the safetensors checkpoint in `dir` (either name layout).
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let ck = Checkpoint::open(dir)?;
        let weights = ModelWeights::load(&ck, &config)?;
        Ok(Self::new(config, weights))
    }

    fn rope_for(&self, layer: usize) -> &Rope {
        match self.config.layer_types[layer] {
            AttnKind::Sliding => &self.rope_main,
            _ => &self.rope_compress,
        }
    }

    /// Runs whole sequences and returns the logits of `batch.logits_rows`.
    pub fn forward(&self, batch: &ForwardBatch) -> Result<Logits, ModelError> {
        let (vocab, d) = (self.config.vocab_size, self.config.hidden_size);
        let n = batch.num_tokens();
        if batch.positions.len() != n {
            return Err(ModelError::PositionsLength { positions: batch.positions.len(), tokens: n });
        }
        if let Some(&id) = batch.token_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab });
        }
        if let Some(&row) = batch.logits_rows.iter().find(|&&r| r >= n) {
            return Err(ModelError::BadLogitsRow { row, tokens: n });
        }
        let mut hidden = vec![0.0f32; n * d];
        for (s, span) in batch.spans.iter().enumerate() {
            if span.start + span.len > n {
                return Err(ModelError::BadSpan {
                    start: span.start,
                    len: span.len,
                    tokens: n,
                });
            }
            for off in 0..span.len {
                let pos = batch.positions[span.start + off];
                if pos != off {
                    return Err(ModelError::UnsupportedPositions {
                        seq: s,
                        offset: off,
                        pos,
                    });
                }
            }
            let ids = &batch.token_ids[span.start..span.start + span.len];
            let h = self.sequence_hidden(ids, None);
            hidden[span.start * d..(span.start + span.len) * d].copy_from_slice(&h);
        }
        let rows: Vec<f32> = batch
            .logits_rows
            .iter()
            .flat_map(|&r| hidden[r * d..(r + 1) * d].iter().copied())
            .collect();
        let data = self.weights.head.forward(&rows, batch.logits_rows.len());
        Ok(Logits { vocab, data })
    }

    /// Final normed hidden states `[T, D]` of one whole sequence; with `trace`, also the
    /// residual streams `[T, hc, D]` after every layer (how a mismatch is located).
    pub fn sequence_hidden(&self, ids: &[u32], mut trace: Option<&mut Vec<Vec<f32>>>) -> Vec<f32> {
        let c = &self.config;
        let (d, hc, t) = (c.hidden_size, c.hc_mult, ids.len());
        let mut x = vec![0.0f32; t * hc * d];
        for (i, &id) in ids.iter().enumerate() {
            let e = &self.weights.embed[id as usize * d..(id as usize + 1) * d];
            for s in 0..hc {
                x[(i * hc + s) * d..(i * hc + s + 1) * d].copy_from_slice(e);
            }
        }
        for (l, lw) in self.weights.layers.iter().enumerate() {
            block_forward(lw, c, &mut x, ids, self.rope_for(l));
            if let Some(tr) = trace.as_deref_mut() {
                tr.push(x.clone());
            }
        }
        let w = &self.weights;
        let mut h = hc_head(&x, t, &w.hc_head_fn, &w.hc_head_base, w.hc_head_scale[0], c);
        rms_norm_rows(&mut h, &w.norm, c.rms_norm_eps);
        h
    }
}
