//! The model's weights, gathered from a checkpoint by their official names and shapes.
//!
//! Matrices stay in their stored format ([`QMatrix`]: FP8 blocks, FP4 groups, BF16, F32) and
//! the kernels compute on them directly; only small vectors (norm gains, biases, sinks, `ape`)
//! are widened to f32.

use std::ops::Range;
use std::sync::Arc;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{AttnKind, MlpKind, ModelConfig};
use crate::experts::{ExpertPlan, ExpertSource, ExpertStore};
use crate::parallel::{AttnPart, Collectives, HeadPart, LayerLink, Placement, WidthPart};
use deepinfer_kernels::matrix::QMatrix;

/// A projection `y = x · Wᵀ` with `W: [out, in]`.
#[derive(Debug)]
pub struct Linear {
    pub w: QMatrix,
}

impl Linear {
    fn load(
        ck: &Checkpoint,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self, CheckpointError> {
        Ok(Self {
            w: ck.matrix(&format!("{name}.weight"), &[out_dim, in_dim])?,
        })
    }

    pub fn out_dim(&self) -> usize {
        self.w.rows
    }

    pub fn in_dim(&self) -> usize {
        self.w.cols
    }

    /// `x: [m, in]` → `[m, out]`.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; m * self.out_dim()];
        self.forward_into(x, m, &mut y);
        y
    }

    /// `x: [m, in]` → `y: [m, out]`.
    pub fn forward_into(&self, x: &[f32], m: usize, y: &mut [f32]) {
        crate::profile::matmul(&self.w, x, m, y);
    }
}

/// mHC parameters of one use site: `fn [(2+hc)·hc, hc·D]`, `base`, `scale [3]`.
#[derive(Debug)]
pub struct HyperWeights {
    pub fn_: Linear,
    pub base: Vec<f32>,
    pub scale: Vec<f32>,
}

#[derive(Debug)]
pub struct CompressorWeights {
    /// Window length `m` and whether windows overlap (CSA).
    pub ratio: usize,
    pub overlap: bool,
    /// Output width `c` of one entry.
    pub dim: usize,
    pub wkv: Linear,
    /// The gate logits' projection; V4.1's ratio-1 compressor pools single tokens and has
    /// none (its logits are zero: the pool is the token's own row).
    pub wgate: Option<Linear>,
    /// `[m, coff·c]`, added to the gate logits of slot `pos mod m` (zeros for V4.1, which
    /// has no `ape`).
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
    /// V4.1's indexer keys, made from each entry's latent before its RoPE (spec §8.5): the
    /// kv source's indexer owns them.
    pub keys: Option<IndexKeyWeights>,
}

/// `key = k_norm(wk · latent)`, then RoPE like the entry.
#[derive(Debug)]
pub struct IndexKeyWeights {
    pub wk: Linear,
    pub k_norm: Vec<f32>,
}

#[derive(Debug)]
pub struct IndexerWeights {
    pub wq_b: Linear,
    pub weights_proj: Linear,
    /// V4's indexer compresses its own keys; V4.1's reads the kv source's
    /// ([`CompressorWeights::keys`]).
    pub compressor: Option<CompressorWeights>,
}

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

/// The shared expert, whole or this rank's part of its width.
#[derive(Debug)]
pub enum SharedExpert {
    Whole(ExpertWeights),
    Part(WidthPart),
}

/// The vocabulary head, whole or this rank's rows of it.
#[derive(Debug)]
pub enum HeadWeights {
    Whole(Linear),
    Split {
        part: HeadPart,
        comm: Arc<dyn Collectives>,
    },
}

/// A SwiGLU expert: `w2 · (silu(min(w1·x, L)) ⊙ clamp(w3·x, ±L))`.
#[derive(Debug)]
pub struct ExpertWeights {
    pub w1: Linear,
    pub w2: Linear,
    pub w3: Linear,
}

#[derive(Debug)]
pub enum Routing {
    /// Frozen token → experts table, `[vocab, k]`.
    Hash(Vec<u32>),
    /// Learned top-k with a selection-only bias; V4.1 picks image positions (the image
    /// token's) with their own bias (`gate.bias_vl`).
    Scored {
        bias: Vec<f32>,
        image: Option<(u32, Vec<f32>)>,
    },
}

/// Where a layer's routed experts are: in memory, or read from disk through the model's
/// expert cache.
#[derive(Debug)]
pub enum RoutedExperts {
    /// The experts `first..first + experts.len()` (all of them in a single process).
    Resident {
        first: usize,
        experts: Vec<ExpertWeights>,
    },
    /// The experts the store holds, read through its cache.
    Streamed {
        store: Arc<ExpertStore>,
        layer: usize,
    },
    /// This rank's share of every expert's width (tensor parallel without expert
    /// parallelism), resident.
    Sharded(Vec<WidthPart>),
}

impl RoutedExperts {
    /// The ids of the experts held here.
    pub fn held(&self) -> Range<usize> {
        match self {
            RoutedExperts::Resident { first, experts } => *first..first + experts.len(),
            RoutedExperts::Streamed { store, .. } => store.experts(),
            RoutedExperts::Sharded(parts) => 0..parts.len(),
        }
    }
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

#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub hc_attn: HyperWeights,
    pub hc_ffn: HyperWeights,
    pub attn: AttentionWeights,
    pub ffn: MoeWeights,
    /// V4.1's n-gram memory on the layers that have it.
    pub engram: Option<crate::v4::engram::EngramWeights>,
}

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

/// The hyper head's weights: `fn [hc, hc·D]`, `base [hc]`, `scale [1]`.
#[derive(Debug)]
pub struct HcHead {
    pub fn_: Linear,
    pub base: Vec<f32>,
    pub scale: f32,
}

impl HcHead {
    pub(crate) fn load(ck: &Checkpoint, p: &str, c: &ModelConfig) -> Result<Self, CheckpointError> {
        let (hc, d) = (c.hc_mult, c.hidden_size);
        Ok(Self {
            fn_: Linear {
                w: ck.matrix(&format!("{p}fn"), &[hc, hc * d])?,
            },
            base: vec1(ck, &format!("{p}base"), hc)?,
            scale: vec1(ck, &format!("{p}scale"), 1)?[0],
        })
    }
}

fn vec1(ck: &Checkpoint, name: &str, n: usize) -> Result<Vec<f32>, CheckpointError> {
    ck.tensor_f32(name, &[n])
}

fn hyper(ck: &Checkpoint, p: &str, c: &ModelConfig) -> Result<HyperWeights, CheckpointError> {
    let hc = c.hc_mult;
    let mix = (2 + hc) * hc;
    Ok(HyperWeights {
        fn_: Linear {
            w: ck.matrix(&format!("{p}_fn"), &[mix, hc * c.hidden_size])?,
        },
        base: vec1(ck, &format!("{p}_base"), mix)?,
        scale: vec1(ck, &format!("{p}_scale"), 3)?,
    })
}

fn compressor(
    ck: &Checkpoint,
    p: &str,
    c: &ModelConfig,
    ratio: usize,
    overlap: bool,
    dim: usize,
) -> Result<CompressorWeights, CheckpointError> {
    let width = if overlap { 2 * dim } else { dim };
    Ok(CompressorWeights {
        ratio,
        overlap,
        dim,
        wkv: Linear::load(ck, &format!("{p}.wkv"), width, c.hidden_size)?,
        wgate: Some(Linear::load(
            ck,
            &format!("{p}.wgate"),
            width,
            c.hidden_size,
        )?),
        ape: ck.tensor_f32(&format!("{p}.ape"), &[ratio, width])?,
        norm: vec1(ck, &format!("{p}.norm.weight"), dim)?,
        keys: None,
    })
}

/// V4.1's compressor on a kv source (spec §8.3): no overlap, no `ape`, a gate only for
/// ratio 2, and the indexer's key projection when the layer indexes.
fn shared_compressor(
    ck: &Checkpoint,
    p: &str,
    c: &ModelConfig,
    ratio: usize,
    indexes: bool,
) -> Result<CompressorWeights, CheckpointError> {
    let (hd, d) = (c.head_dim, c.hidden_size);
    let keys = match indexes {
        true => Some(IndexKeyWeights {
            wk: Linear::load(ck, &format!("{p}.attn.indexer.wk"), c.index_head_dim, hd)?,
            k_norm: vec1(
                ck,
                &format!("{p}.attn.indexer.k_norm.weight"),
                c.index_head_dim,
            )?,
        }),
        false => None,
    };
    let comp = format!("{p}.attn.compressor");
    Ok(CompressorWeights {
        ratio,
        overlap: false,
        dim: hd,
        wkv: Linear::load(ck, &format!("{comp}.wkv"), hd, d)?,
        wgate: match ratio > 1 {
            true => Some(Linear::load(ck, &format!("{comp}.wgate"), hd, d)?),
            false => None,
        },
        ape: vec![0.0; ratio * hd],
        norm: vec1(ck, &format!("{comp}.norm.weight"), hd)?,
        keys,
    })
}

fn expert(
    ck: &Checkpoint,
    p: &str,
    d: usize,
    inter: usize,
) -> Result<ExpertWeights, CheckpointError> {
    Ok(ExpertWeights {
        w1: Linear::load(ck, &format!("{p}.w1"), inter, d)?,
        w2: Linear::load(ck, &format!("{p}.w2"), d, inter)?,
        w3: Linear::load(ck, &format!("{p}.w3"), inter, d)?,
    })
}

/// The MTP draft block (spec §7.1): the next token's embedding and the main model's final
/// streams projected into one set of streams, a full sliding-window decoder block, and its
/// own hyper head and norm in front of the (shared) head.
#[derive(Debug)]
pub struct MtpWeights {
    pub e_proj: Linear,
    pub h_proj: Linear,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    pub norm: Vec<f32>,
    pub hc_head: HcHead,
    pub block: LayerWeights,
    /// The checkpoint's own copy of the embedding when it differs from the main one
    /// (`mtp.0.emb.tok_emb.weight`); `None`: the main embedding is shared.
    pub embed: Option<QMatrix>,
    /// Likewise for the head (`mtp.0.head.weight`).
    pub head: Option<HeadWeights>,
}

/// Where a layer's weights come from and what kind of layer it is.
struct LayerSpec<'a> {
    prefix: &'a str,
    kind: AttnKind,
    mlp: MlpKind,
    ratio: usize,
    /// The ranks this layer is split over (a main layer of a split model, on rank 0).
    placement: Option<&'a Placement>,
    /// The layer's index (what the other ranks keep their parts under).
    index: usize,
}

/// An indexer's query projection and head weights (its compressor left to the caller).
fn indexer_queries(
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

fn attention(
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
        AttnKind::Shared => Some(shared_compressor(ck, p, c, s.ratio, index_source)?),
        AttnKind::Csa | AttnKind::Hca => Some(compressor(
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
            compressor: Some(compressor(
                ck,
                &format!("{p}.attn.indexer.compressor"),
                c,
                s.ratio,
                true,
                c.index_head_dim,
            )?),
            ..indexer_queries(ck, c, p)?
        }),
        AttnKind::Shared if index_source => Some(IndexerWeights {
            compressor: None,
            ..indexer_queries(ck, c, p)?
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
        q_norm: vec1(ck, &format!("{p}.attn.q_norm.weight"), c.q_lora_rank)?,
        wkv: Linear::load(ck, &format!("{p}.attn.wkv"), hd, d)?,
        kv_norm: vec1(ck, &kv_norm_name, hd)?,
        sink: vec1(ck, &format!("{p}.attn.attn_sink"), h)?,
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
                wo_b: Linear::load(ck, &format!("{p}.attn.wo_b"), d, c.o_groups * c.o_lora_rank)?,
            },
        },
        compressor: compressor_w,
        indexer,
    })
}

/// `experts`: the routed experts as the caller holds them (a main layer's share, resident
/// or streamed); `None` loads them all resident here (the MTP block).
fn moe_weights(
    ck: &Checkpoint,
    c: &ModelConfig,
    s: &LayerSpec,
    experts: Option<RoutedExperts>,
) -> Result<MoeWeights, CheckpointError> {
    let (p, d, e) = (s.prefix, c.hidden_size, c.n_routed_experts);
    let routing = match s.mlp {
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
            Routing::Hash(table)
        }
        MlpKind::Scored => Routing::Scored {
            bias: vec1(ck, &format!("{p}.ffn.gate.bias"), e)?,
            image: match c.v41.as_ref().and_then(|v| v.image_token_id) {
                Some(id) if ck.contains(&format!("{p}.ffn.gate.bias_vl")) => {
                    Some((id, vec1(ck, &format!("{p}.ffn.gate.bias_vl"), e)?))
                }
                _ => None,
            },
        },
    };
    let inter = c.moe_intermediate_size;
    let experts = match experts {
        Some(experts) => experts,
        None => resident_experts(ck, c, p, 0..e)?,
    };
    let shared = match (c.n_shared_experts, s.placement.filter(|pl| pl.tensor)) {
        (0, _) => None,
        (n, Some(pl)) => Some(SharedExpert::Part(WidthPart::load(
            ck,
            c,
            &format!("{p}.ffn.shared_experts"),
            inter * n,
            (pl.comm.rank(), pl.comm.size()),
        )?)),
        (n, None) => Some(SharedExpert::Whole(expert(
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

/// The experts `held` of the layer at `prefix`, loaded.
fn resident_experts(
    ck: &Checkpoint,
    c: &ModelConfig,
    prefix: &str,
    held: Range<usize>,
) -> Result<RoutedExperts, CheckpointError> {
    let (d, inter) = (c.hidden_size, c.moe_intermediate_size);
    Ok(RoutedExperts::Resident {
        first: held.start,
        experts: held
            .map(|i| expert(ck, &format!("{prefix}.ffn.experts.{i}"), d, inter))
            .collect::<Result<Vec<_>, _>>()?,
    })
}

/// What this process holds of every main layer's routed experts.
#[derive(Clone)]
enum Holding {
    /// These experts, whole (all of them in a single process).
    Whole(Range<usize>),
    /// Rank `.0` of `.1`'s share of every expert's width.
    Width(usize, usize),
}

impl Holding {
    fn of(placement: Option<&Placement>, c: &ModelConfig) -> Self {
        match placement {
            None => Holding::Whole(0..c.n_routed_experts),
            // Split by width only with the shared expert (tensor parallel), which the
            // width path leaves to its own part.
            Some(pl) if pl.experts_whole() => Holding::Whole(pl.share(c.n_routed_experts)),
            Some(pl) => Holding::Width(pl.comm.rank(), pl.comm.size()),
        }
    }
}

/// A main layer's routed experts as `holding` says: through `store` when they are streamed.
fn layer_experts(
    ck: &Checkpoint,
    c: &ModelConfig,
    layer: usize,
    store: Option<&Arc<ExpertStore>>,
    holding: &Holding,
) -> Result<RoutedExperts, CheckpointError> {
    let prefix = format!("layers.{layer}");
    match (store, holding) {
        (Some(store), _) => Ok(RoutedExperts::Streamed {
            store: Arc::clone(store),
            layer,
        }),
        (None, Holding::Whole(held)) => resident_experts(ck, c, &prefix, held.clone()),
        (None, &Holding::Width(rank, size)) => Ok(RoutedExperts::Sharded(
            (0..c.n_routed_experts)
                .map(|e| {
                    let p = format!("{prefix}.ffn.experts.{e}");
                    WidthPart::load(ck, c, &p, c.moe_intermediate_size, (rank, size))
                })
                .collect::<Result<_, _>>()?,
        )),
    }
}

/// The store the routed experts stream through, when the plan streams them.
fn expert_store(
    ck: &Checkpoint,
    c: &ModelConfig,
    plan: ExpertPlan,
    holding: &Holding,
) -> Result<Option<Arc<ExpertStore>>, CheckpointError> {
    let (ExpertPlan::Streamed { cache_bytes }, Holding::Whole(held)) = (plan, holding) else {
        return match plan {
            ExpertPlan::Resident => Ok(None),
            ExpertPlan::Streamed { .. } => Err(CheckpointError::InvalidValue {
                name: "expert cache".into(),
                reason: "experts split by width (tensor parallel without \
                         --enable-expert-parallel) stay resident; split them whole with \
                         --enable-expert-parallel to stream them"
                    .into(),
            }),
        };
    };
    Ok(Some(Arc::new(ExpertStore::new(
        ck,
        expert_sources(ck, c, held)?,
        held.clone(),
        cache_bytes,
        2 * c.num_experts_per_tok,
    )?)))
}

/// What a rank other than 0 of a split model holds: its share of every main layer's routed
/// experts and, tensor parallel, its parts of the dense projections; nothing else.
pub struct RankWeights {
    /// One per main layer.
    pub layers: Vec<RankLayer>,
    pub head: Option<HeadPart>,
    pub store: Option<Arc<ExpertStore>>,
}

/// A rank's part of one main layer.
pub struct RankLayer {
    pub experts: RoutedExperts,
    pub attn: Option<AttnPart>,
    pub shared: Option<WidthPart>,
}

impl RankWeights {
    /// This rank's part as `placement` splits the model.
    pub fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        plan: ExpertPlan,
        placement: &Placement,
    ) -> Result<Self, CheckpointError> {
        let (rank, size, tensor) = (
            placement.comm.rank(),
            placement.comm.size(),
            placement.tensor,
        );
        let holding = Holding::of(Some(placement), c);
        let store = expert_store(ck, c, plan, &holding)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = format!("layers.{l}");
            let shared = tensor && c.n_shared_experts > 0;
            layers.push(RankLayer {
                experts: layer_experts(ck, c, l, store.as_ref(), &holding)?,
                attn: tensor
                    .then(|| AttnPart::load(ck, c, &p, rank, size))
                    .transpose()?,
                shared: shared
                    .then(|| {
                        let inter = c.moe_intermediate_size * c.n_shared_experts;
                        let prefix = format!("{p}.ffn.shared_experts");
                        WidthPart::load(ck, c, &prefix, inter, (rank, size))
                    })
                    .transpose()?,
            });
        }
        let head = tensor
            .then(|| HeadPart::load(ck, c, rank, size))
            .transpose()?;
        Ok(Self {
            layers,
            head,
            store,
        })
    }
}

/// One decoder block: a main layer (`layers.N`) or the MTP block (`mtp.0`); `experts` as
/// [`moe_weights`] takes them.
fn layer(
    ck: &Checkpoint,
    c: &ModelConfig,
    s: &LayerSpec,
    experts: Option<RoutedExperts>,
) -> Result<LayerWeights, CheckpointError> {
    let (p, d) = (s.prefix, c.hidden_size);
    Ok(LayerWeights {
        attn_norm: vec1(ck, &format!("{p}.attn_norm.weight"), d)?,
        ffn_norm: vec1(ck, &format!("{p}.ffn_norm.weight"), d)?,
        hc_attn: hyper(ck, &format!("{p}.hc_attn"), c)?,
        hc_ffn: hyper(ck, &format!("{p}.hc_ffn"), c)?,
        attn: attention(ck, c, s)?,
        ffn: moe_weights(ck, c, s, experts)?,
        engram: match c.v41.as_ref().and_then(|v| v.engram_index(s.index)) {
            Some(k) if s.prefix.starts_with("layers.") => {
                Some(crate::v4::engram::EngramWeights::load(ck, c, p, k)?)
            }
            _ => None,
        },
    })
}

/// A drafter's decoder block under `prefix` (DSpark's `mtp.N` stages): window-only,
/// score-routed, at layer id `index`, with `c`'s expert counts.
pub(crate) fn draft_stage(
    ck: &Checkpoint,
    c: &ModelConfig,
    prefix: &str,
    index: usize,
) -> Result<LayerWeights, CheckpointError> {
    let spec = LayerSpec {
        prefix,
        kind: AttnKind::Sliding,
        mlp: MlpKind::Scored,
        ratio: 0,
        placement: None,
        index,
    };
    layer(ck, c, &spec, None)
}

/// The MTP block when the config announces one and the checkpoint carries it; `None`
/// otherwise (a checkpoint without `mtp.*` still serves, it just cannot draft).
fn mtp(ck: &Checkpoint, c: &ModelConfig) -> Result<Option<MtpWeights>, CheckpointError> {
    const P: &str = "mtp.0";
    // V4.1's `mtp.*` stages are DSpark's, another drafter.
    if c.num_nextn_predict_layers == 0
        || c.v41.is_some()
        || !ck.contains(&format!("{P}.e_proj.weight"))
    {
        return Ok(None);
    }
    let d = c.hidden_size;
    let spec = LayerSpec {
        prefix: P,
        kind: AttnKind::Sliding,
        mlp: MlpKind::Scored,
        ratio: 0,
        placement: None,
        index: c.num_hidden_layers,
    };
    // Some checkpoints carry copies of the embedding and head under the MTP's prefix; the
    // reference shares the main ones, so a copy is only kept when it differs.
    let differs = |name: &str, main: &str| -> Result<bool, CheckpointError> {
        if !ck.contains(name) || ck.same_stored_tensor(name, main)? {
            return Ok(false);
        }
        tracing::info!("{name} differs from {main}: the MTP block uses its own copy");
        Ok(true)
    };
    const EMBED: &str = "mtp.0.emb.tok_emb.weight";
    let embed = match differs(EMBED, "embed.weight")? {
        true => Some(ck.matrix(EMBED, &[c.vocab_size, d])?),
        false => None,
    };
    let head = match differs("mtp.0.head.weight", "head.weight")? {
        true => Some(HeadWeights::Whole(Linear::load(
            ck,
            "mtp.0.head",
            c.vocab_size,
            d,
        )?)),
        false => None,
    };
    Ok(Some(MtpWeights {
        e_proj: Linear::load(ck, &format!("{P}.e_proj"), d, d)?,
        h_proj: Linear::load(ck, &format!("{P}.h_proj"), d, d)?,
        enorm: vec1(ck, &format!("{P}.enorm.weight"), d)?,
        hnorm: vec1(ck, &format!("{P}.hnorm.weight"), d)?,
        norm: vec1(ck, &format!("{P}.norm.weight"), d)?,
        hc_head: HcHead::load(ck, &format!("{P}.hc_head_"), c)?,
        block: layer(ck, c, &spec, None)?,
        embed,
        head,
    }))
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
            layers.push(layer(ck, c, &spec, Some(experts))?);
            progress(l + 1, total);
        }
        let weights = Self {
            embed: ck.matrix("embed.weight", &[c.vocab_size, d])?,
            head: match placement.filter(|pl| pl.tensor) {
                Some(pl) => HeadWeights::Split {
                    part: HeadPart::load(ck, c, pl.comm.rank(), pl.comm.size())?,
                    comm: Arc::clone(&pl.comm),
                },
                None => HeadWeights::Whole(Linear::load(ck, "head", c.vocab_size, d)?),
            },
            norm: vec1(ck, "norm.weight", d)?,
            hc_head: match c.v41 {
                Some(_) => None,
                None => Some(HcHead::load(ck, "hc_head_", c)?),
            },
            layers,
            mtp: mtp(ck, c)?,
            expert_store,
        };
        progress(total, total);
        Ok(weights)
    }
}

/// Where the routed experts `held` of every main layer lie (`layer · held.len() + expert
/// − held.start`), checked as a load would check them.
fn expert_sources(
    ck: &Checkpoint,
    c: &ModelConfig,
    held: &Range<usize>,
) -> Result<Vec<ExpertSource>, CheckpointError> {
    let (d, inter) = (c.hidden_size, c.moe_intermediate_size);
    let mut out = Vec::with_capacity(c.num_hidden_layers * held.len());
    for l in 0..c.num_hidden_layers {
        for i in held.clone() {
            let p = format!("layers.{l}.ffn.experts.{i}");
            let part = |w: &str, shape: [usize; 2]| {
                let name = format!("{p}.{w}.weight");
                ck.matrix_source(&name, &shape)?
                    .ok_or_else(|| CheckpointError::InvalidValue {
                        name: name.clone(),
                        reason: "stored in a form that is converted at load (F16, FP4 scales \
                                 that are not per-row E8M0, or HF's stacked FP8 experts), so \
                                 it cannot be streamed; load it resident"
                            .into(),
                    })
            };
            out.push(ExpertSource {
                parts: [
                    part("w1", [inter, d])?,
                    part("w2", [d, inter])?,
                    part("w3", [inter, d])?,
                ],
            });
        }
    }
    Ok(out)
}
