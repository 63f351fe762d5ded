//! The attention's weights, loaded by name: projections, norms, sinks, and the compressor
//! and indexer the layer kind brings.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{AttnKind, ModelConfig};
use crate::linear::Linear;
use crate::parallel::{AttnPart, LayerLink};
use crate::v4::compressor::CompressorWeights;
use crate::v4::indexer::IndexerWeights;
use crate::v4::pass::LayerSpec;

#[derive(Debug)]
pub struct AttentionWeights {
    pub kind: AttnKind,
    pub wq_a: Linear,
    pub q_norm: Vec<f32>,
    pub wkv: Linear,
    pub kv_norm: Vec<f32>,
    pub sink: Vec<f32>,
    pub heads: HeadProjections,
    pub compressor: Option<CompressorWeights>,
    pub indexer: Option<IndexerWeights>,
}

/// The projections sized by the attention heads: the queries (`wq_b`), the grouped output
/// projection (`wo_a`) and the dense one (`wo_b`) — whole, or this rank's part of them.
#[derive(Debug)]
pub enum HeadProjections {
    Whole {
        wq_b: Linear,
        wo_a: Linear,
        wo_b: Linear,
    },
    Split {
        part: AttnPart,
        link: LayerLink,
    },
}

impl AttentionWeights {
    pub(crate) fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        s: &LayerSpec,
    ) -> Result<AttentionWeights, CheckpointError> {
        let (p, d) = (s.prefix, c.hidden_size);
        let (h, hd) = (c.num_attention_heads, c.head_dim);
        let v41 = c.v41.as_ref();
        let kv_source = v41.is_some_and(|v| v.kv_source(s.index) == Some(s.index));
        let index_source = v41.is_some_and(|v| v.index_source(s.index) == Some(s.index));
        let compressor_w = match s.kind {
            AttnKind::Sliding => None,
            AttnKind::Shared if !kv_source => None,
            AttnKind::Shared => Some(CompressorWeights::load_shared(
                ck,
                p,
                c,
                s.ratio,
                index_source,
            )?),
            AttnKind::Csa | AttnKind::Hca => Some(CompressorWeights::load(
                ck,
                &format!("{p}.attn.compressor"),
                c,
                s.ratio,
                s.kind == AttnKind::Csa,
                hd,
            )?),
        };
        let indexer = match s.kind {
            AttnKind::Csa => Some(IndexerWeights {
                compressor: Some(CompressorWeights::load(
                    ck,
                    &format!("{p}.attn.indexer.compressor"),
                    c,
                    s.ratio,
                    true,
                    c.index_head_dim,
                )?),
                ..IndexerWeights::load_queries(ck, c, p)?
            }),
            AttnKind::Shared if index_source => Some(IndexerWeights {
                compressor: None,
                ..IndexerWeights::load_queries(ck, c, p)?
            }),
            _ => None,
        };
        let kv_norm_name = if ck.contains(&format!("{p}.attn.kv_norm.weight"))
            || !ck.contains(&format!("{p}.attn.norm.weight"))
        {
            format!("{p}.attn.kv_norm.weight")
        } else {
            format!("{p}.attn.norm.weight")
        };
        Ok(AttentionWeights {
            kind: s.kind,
            wq_a: Linear::load(ck, &format!("{p}.attn.wq_a"), c.q_lora_rank, d)?,
            q_norm: ck.vector(&format!("{p}.attn.q_norm.weight"), c.q_lora_rank)?,
            wkv: Linear::load(ck, &format!("{p}.attn.wkv"), hd, d)?,
            kv_norm: ck.vector(&kv_norm_name, hd)?,
            sink: ck.vector(&format!("{p}.attn.attn_sink"), h)?,
            heads: match s.placement.filter(|pl| pl.tensor) {
                Some(pl) => HeadProjections::Split {
                    part: AttnPart::load(ck, c, p, pl.comm.rank(), pl.comm.size())?,
                    link: pl.link(s.index),
                },
                None => HeadProjections::Whole {
                    wq_b: Linear::load(ck, &format!("{p}.attn.wq_b"), h * hd, c.q_lora_rank)?,
                    wo_a: Linear::load(
                        ck,
                        &format!("{p}.attn.wo_a"),
                        c.o_groups * c.o_lora_rank,
                        h * hd / c.o_groups,
                    )?,
                    wo_b: Linear::load(
                        ck,
                        &format!("{p}.attn.wo_b"),
                        d,
                        c.o_groups * c.o_lora_rank,
                    )?,
                },
            },
            compressor: compressor_w,
            indexer,
        })
    }
}
