//! The MoE layer's weights, loaded by name: the gate and its routing, the routed experts as
//! the caller holds them, the shared expert.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{MlpKind, ModelConfig};
use crate::experts::{resident_experts, ExpertWeights, RoutedExperts};
use crate::linear::Linear;
use crate::parallel::{LayerLink, WidthPart};
use crate::v4::pass::LayerSpec;

/// The shared expert, whole or this rank's part of its width.
#[derive(Debug)]
pub enum SharedExpert {
    Whole(ExpertWeights),
    Part(WidthPart),
}

/// How a layer picks each token's experts. Image positions (V4.1's image token,
/// V4-Flash-Vision-Exp's five sentinels) pick by learned top-k with their own bias
/// (`gate.bias_vl`) on every layer, hash layers included.
#[derive(Debug)]
pub struct Routing {
    pub text: TextRouting,
    pub image: Option<ImageRouting>,
}

#[derive(Debug)]
pub enum TextRouting {
    /// Frozen token → experts table, `[vocab, k]`.
    Hash(Vec<u32>),
    /// Learned top-k with a selection-only bias.
    Scored(Vec<f32>),
}

/// The ids that mark image positions and the selection bias they route with.
#[derive(Debug)]
pub struct ImageRouting {
    pub ids: std::ops::Range<u32>,
    pub bias: Vec<f32>,
}

#[derive(Debug)]
pub struct MoeWeights {
    pub gate: Linear,
    pub routing: Routing,
    pub experts: RoutedExperts,
    pub shared: Option<SharedExpert>,
    /// Set when the layer's experts are split over ranks (this is rank 0).
    pub split: Option<LayerLink>,
}

impl MoeWeights {
    /// `experts`: the routed experts as the caller holds them (a main layer's share, resident
    /// or streamed); `None` loads them all resident here (the MTP block).
    pub(crate) fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        s: &LayerSpec,
        experts: Option<RoutedExperts>,
    ) -> Result<MoeWeights, CheckpointError> {
        let (p, d, e) = (s.prefix, c.hidden_size, c.n_routed_experts);
        let text = match s.mlp {
            MlpKind::Hash => {
                let ids = ck.tensor_i64(
                    &format!("{p}.ffn.gate.tid2eid"),
                    &[c.vocab_size, c.num_experts_per_tok],
                )?;
                let mut table = Vec::with_capacity(ids.len());
                for v in ids {
                    if v < 0 || v as usize >= e {
                        return Err(CheckpointError::InvalidValue {
                            name: format!("{p}.ffn.gate.tid2eid"),
                            reason: format!("expert id {v} outside 0..{e}"),
                        });
                    }
                    table.push(v as u32);
                }
                TextRouting::Hash(table)
            }
            MlpKind::Scored => TextRouting::Scored(ck.vector(&format!("{p}.ffn.gate.bias"), e)?),
        };
        let vl = format!("{p}.ffn.gate.bias_vl");
        let image = match c.image_ids() {
            Some(ids) if ck.contains(&vl) => Some(ImageRouting {
                ids,
                bias: ck.vector(&vl, e)?,
            }),
            _ => None,
        };
        let routing = Routing { text, image };
        let inter = c.moe_intermediate_size;
        let experts = match experts {
            Some(experts) => experts,
            None => resident_experts(ck, c, p, 0..e)?,
        };
        let part = match s.placement {
            Some(pl) => pl.shared_part(ck, c, p)?,
            None => None,
        };
        let shared = match (c.n_shared_experts, part) {
            (0, _) => None,
            (_, Some(part)) => Some(SharedExpert::Part(part)),
            (n, None) => Some(SharedExpert::Whole(ExpertWeights::load(
                ck,
                &format!("{p}.ffn.shared_experts"),
                d,
                inter * n,
            )?)),
        };
        Ok(MoeWeights {
            gate: Linear::load(ck, &format!("{p}.ffn.gate"), e, d)?,
            routing,
            experts,
            shared,
            split: s.placement.map(|pl| pl.link(s.index)),
        })
    }
}
