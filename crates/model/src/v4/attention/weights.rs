//! The attention's weights, loaded by name: projections, norms, sinks, and the compressor
//! and indexer the layer kind brings.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{AttnKind, Candidates, ModelConfig};
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
    /// What the pass does with them, decided at load.
    pub plan: AttnPlan,
}

/// What kind of attention a layer computes, decided once at load from the config's layer
/// kinds and (V4.1) its source topology, so that the pass branches on neither.
#[derive(Clone, Copy, Debug)]
pub struct AttnPlan {
    /// Tokens per compressed entry (0: a sliding layer).
    pub ratio: usize,
    /// The layer whose cache rows hold this layer's compressed entries and indexer keys
    /// (itself, or V4.1's kv source before it: docs/MODEL.md §8.4).
    pub kv_layer: usize,
    /// The compressed entries attended to are index picks (CSA, and every V4.1 compressed
    /// layer) rather than all of them (HCA).
    pub picks: bool,
    /// V4 normalises each query head (an RMS without gain); V4.1 does not (§8.2).
    pub q_head_norm: bool,
    /// V4.1's candidate blocks (§8.5) as this layer uses them.
    pub candidates: CandidateUse,
}

/// How a layer's index picks relate to V4.1's candidate blocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct CandidateUse {
    /// The model's candidate setting (`None`: V4, or V4.1 without candidates).
    pub config: Option<Candidates>,
    /// This layer chooses the blocks the index sources after it pick within.
    pub publishes: bool,
    /// This layer picks only within the blocks it is handed.
    pub within: bool,
}

impl AttnPlan {
    /// The plan of layer `layer` with `compressor` and, when it indexes, an indexer.
    fn of(
        c: &ModelConfig,
        layer: usize,
        compressor: Option<&CompressorWeights>,
        indexes: bool,
    ) -> Self {
        let v41 = c.v41.as_ref();
        let ratio = match v41 {
            Some(v) => v.compress_ratios.get(layer).copied().unwrap_or(0),
            None => compressor.map_or(0, |cw| cw.ratio),
        };
        let config = v41.and_then(|v| v.candidates);
        Self {
            ratio,
            kv_layer: v41.and_then(|v| v.kv_source(layer)).unwrap_or(layer),
            picks: indexes || (v41.is_some() && ratio > 0),
            q_head_norm: v41.is_none(),
            candidates: CandidateUse {
                config,
                publishes: config.is_some_and(|cd| cd.source_layer == layer),
                within: v41.is_some_and(|v| v.uses_candidates(layer)),
            },
        }
    }
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
        let (compressor_w, indexer) = Self::compressors(ck, c, s)?;
        let plan = AttnPlan::of(c, s.index, compressor_w.as_ref(), indexer.is_some());
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
            heads: HeadProjections::load(ck, c, s)?,
            compressor: compressor_w,
            indexer,
            plan,
        })
    }

    /// The layer's compressor and indexer, as its kind and (V4.1) its place among the kv and
    /// index sources say.
    fn compressors(
        ck: &Checkpoint,
        c: &ModelConfig,
        s: &LayerSpec,
    ) -> Result<(Option<CompressorWeights>, Option<IndexerWeights>), CheckpointError> {
        let (p, hd) = (s.prefix, c.head_dim);
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
        Ok((compressor_w, indexer))
    }
}

impl HeadProjections {
    /// Whole, or this rank's part when the layer is split by tensor parallelism.
    fn load(ck: &Checkpoint, c: &ModelConfig, s: &LayerSpec) -> Result<Self, CheckpointError> {
        let (p, d) = (s.prefix, c.hidden_size);
        let (h, hd) = (c.num_attention_heads, c.head_dim);
        if let Some(pl) = s.placement {
            if let Some(part) = pl.attn_part(ck, c, p)? {
                let link = pl.link(s.index);
                return Ok(HeadProjections::Split { part, link });
            }
        }
        Ok(HeadProjections::Whole {
            wq_b: Linear::load(ck, &format!("{p}.attn.wq_b"), h * hd, c.q_lora_rank)?,
            wo_a: Linear::load(
                ck,
                &format!("{p}.attn.wo_a"),
                c.o_groups * c.o_lora_rank,
                h * hd / c.o_groups,
            )?,
            wo_b: Linear::load(ck, &format!("{p}.attn.wo_b"), d, c.o_groups * c.o_lora_rank)?,
        })
    }
}
