//! The whole model's weights: every main layer, the embedding, the head, the final collapse,
//! the MTP block and the expert store, loaded in order with progress.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::experts::{expert_store, layer_experts, ExpertPlan, ExpertStore, Holding};
use crate::parallel::Placement;
use crate::v4::block::LayerWeights;
use crate::v4::head::HeadWeights;
use crate::v4::hyper::HcHead;
use crate::v4::mtp::MtpWeights;
use crate::v4::pass::LayerSpec;
use deepinfer_kernels::matrix::QMatrix;
use std::sync::Arc;

#[derive(Debug)]
pub struct ModelWeights {
    /// `[vocab, D]`, rows looked up (and widened) per token.
    pub embed: QMatrix,
    pub head: HeadWeights,
    pub norm: Vec<f32>,
    /// V4's final stream collapse; V4.1 has none (its last FFN's `pre` collapses them).
    pub hc_head: Option<HcHead>,
    pub layers: Vec<LayerWeights>,
    /// The MTP draft block, when the checkpoint ships one.
    pub mtp: Option<MtpWeights>,
    /// The cache streamed layers read their experts through (`None`: all resident).
    pub expert_store: Option<Arc<ExpertStore>>,
}

impl ModelWeights {
    /// Loads every tensor the forward pass needs, checking each shape against `c`.
    pub fn load(ck: &Checkpoint, c: &ModelConfig) -> Result<Self, CheckpointError> {
        Self::load_with_progress(ck, c, ExpertPlan::Resident, None, |_, _| {})
    }

    /// Like [`Self::load`], calling `progress(done, total)` after each of the `total` steps
    /// (one per layer, then the embedding, head and MTP block): a real checkpoint takes
    /// minutes to load, and a progress bar tells an operator it is moving.
    ///
    /// `placement`: the model is split over ranks and this is rank 0, which loads its share
    /// of what is split (and everything else).
    pub fn load_with_progress(
        ck: &Checkpoint,
        c: &ModelConfig,
        plan: ExpertPlan,
        placement: Option<&Placement>,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self, CheckpointError> {
        if let Some((layer, tensor)) = ck.last_layer() {
            if layer >= c.num_hidden_layers {
                return Err(CheckpointError::ExtraLayers {
                    layer,
                    tensor: tensor.to_string(),
                    declared: c.num_hidden_layers,
                });
            }
        }
        let total = c.num_hidden_layers + 1;
        let d = c.hidden_size;
        let holding = Holding::of(placement, c);
        let expert_store = expert_store(ck, c, plan, &holding)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let prefix = format!("layers.{l}");
            let spec = LayerSpec {
                prefix: &prefix,
                kind: c.layer_types[l],
                mlp: c.mlp_layer_types[l],
                ratio: c.compress_ratio(l),
                placement,
                index: l,
            };
            let experts = layer_experts(ck, c, l, expert_store.as_ref(), &holding)?;
            layers.push(LayerWeights::load(ck, c, &spec, Some(experts))?);
            progress(l + 1, total);
        }
        let weights = Self {
            embed: ck.matrix("embed.weight", &[c.vocab_size, d])?,
            head: HeadWeights::load(ck, c, placement)?,
            norm: ck.vector("norm.weight", d)?,
            hc_head: match c.v41 {
                Some(_) => None,
                None => Some(HcHead::load(ck, "hc_head_", c)?),
            },
            layers,
            mtp: MtpWeights::load(ck, c)?,
            expert_store,
        };
        progress(total, total);
        Ok(weights)
    }
}
